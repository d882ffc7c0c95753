//! The host fabric: fabrics joined under one name reach each other through sockets, exactly as
//! two processes do (each fabric is its own node), and fabrics under other names never do.

mod common;
use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use common::{raw::*, *};
use rdma_emu::*;

/// A fresh host fabric directory for one test, removed when dropped.
struct HostDir(PathBuf);

impl HostDir {
    fn new() -> HostDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rdma-emu-host-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        HostDir(dir)
    }

    fn fabric(&self, profile: Profile) -> Fabric {
        self.fabric_with(FabricConfig { profile, ..Default::default() })
    }

    fn fabric_with(&self, cfg: FabricConfig) -> Fabric {
        let host = Some(self.0.to_str().unwrap().to_owned());
        Fabric::new(FabricConfig { devices: 2, host, ..cfg })
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two fabrics on one host fabric, each with a node on its `emu0` (as two processes that both
/// open the first device), connected.
fn host_pair(dir: &HostDir, profile: Profile, p: &RcParams) -> (Fabric, Node, Fabric, Node) {
    host_pair_sized(dir, profile, p, 1 << 20)
}

/// `host_pair` with MRs of `mr_len` bytes.
fn host_pair_sized(
    dir: &HostDir,
    profile: Profile,
    p: &RcParams,
    mr_len: usize,
) -> (Fabric, Node, Fabric, Node) {
    let (fa, fb) = (dir.fabric(profile), dir.fabric(profile));
    let a = node_on(&fa.devices()[0], mr_len);
    let b = node_on(&fb.devices()[0], mr_len);
    connect(&a.qp, &b.qp, p, p);
    (fa, a, fb, b)
}

/// Two full-profile nodes with 8 MiB MRs, connected.
fn big_pair(dir: &HostDir) -> (Fabric, Node, Fabric, Node) {
    host_pair_sized(dir, Profile::Full, &RcParams::default(), 8 << 20)
}

/// `big_pair` whose messages stream through the ring unless it cannot hold them whole (by
/// default those of 16 KiB or more are read from the sender's memory instead).
fn streamed_pair(dir: &HostDir) -> (Fabric, Node, Fabric, Node) {
    let cfg = || FabricConfig { host_pull_min: usize::MAX, ..Default::default() };
    let (fa, fb) = (dir.fabric_with(cfg()), dir.fabric_with(cfg()));
    let a = node_on(&fa.devices()[0], 8 << 20);
    let b = node_on(&fb.devices()[0], 8 << 20);
    let p = RcParams::default();
    connect(&a.qp, &b.qp, &p, &p);
    (fa, a, fb, b)
}

#[test]
fn every_rc_operation_crosses_between_fabrics() {
    let dir = HostDir::new();
    for profile in [Profile::Full, Profile::Rxe] {
        let (_fa, a, _fb, b) = host_pair(&dir, profile, &RcParams::default());
        assert_ne!(a.qp.qp_num() >> 16, b.qp.qp_num() >> 16, "each node numbers its own QPs");

        a.mr.write(0, b"over the host fabric").unwrap();
        post_recv(&b.qp, 9, &[sge(&b.mr, 0, 64)]);
        a.qp.post_send(&SendWr::send(1, &[sge(&a.mr, 0, 20)]).with_imm(7).signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
        let r = wait1(&b.cq);
        assert_eq!((r.wr_id, r.status, r.byte_len, r.imm_data), (9, WcStatus::SUCCESS, 20, 7));
        let mut got = [0u8; 20];
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"over the host fabric");

        // Larger than one datagram both ways: a WRITE, then a READ of it back.
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        a.mr.write(0, &big).unwrap();
        let w_sg = [sge(&a.mr, 0, big.len())];
        let w = SendWr::write(2, &w_sg, b.mr.addr() + 4096, b.mr.rkey());
        a.qp.post_send(&w.signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
        let mut back = vec![0u8; big.len()];
        b.mr.read(4096, &mut back).unwrap();
        assert!(back == big, "the WRITE landed intact");
        let rd_sg = [sge(&a.mr, 500_000, big.len())];
        let rd = SendWr::read(3, &rd_sg, b.mr.addr() + 4096, b.mr.rkey());
        a.qp.post_send(&rd.signaled()).unwrap();
        let c = wait1(&a.cq);
        assert_eq!(
            (c.status, c.opcode, c.byte_len),
            (WcStatus::SUCCESS, WcOpcode::RDMA_READ, 300_000)
        );
        a.mr.read(500_000, &mut back).unwrap();
        assert!(back == big, "the READ brought it back");

        // Atomics: the target's old value comes back, the target's memory changes.
        b.mr.write(8, &40u64.to_ne_bytes()).unwrap();
        let fa_sg = [sge(&a.mr, 0, 8)];
        let fa = SendWr::fetch_add(4, &fa_sg, b.mr.addr() + 8, b.mr.rkey(), 2);
        a.qp.post_send(&fa.signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
        let cs_sg = [sge(&a.mr, 16, 8)];
        let cs = SendWr::cmp_swap(5, &cs_sg, b.mr.addr() + 8, b.mr.rkey(), 42, 99);
        a.qp.post_send(&cs.signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
        let mut v = [0u8; 8];
        a.mr.read(0, &mut v).unwrap();
        assert_eq!(u64::from_ne_bytes(v), 40);
        a.mr.read(16, &mut v).unwrap();
        assert_eq!(u64::from_ne_bytes(v), 42);
        b.mr.read(8, &mut v).unwrap();
        assert_eq!(u64::from_ne_bytes(v), 99);

        // A bad rkey is refused by the target, as in-process.
        let bad_sg = [sge(&a.mr, 0, 8)];
        let bad = SendWr::write(6, &bad_sg, b.mr.addr(), b.mr.rkey() ^ 0x100);
        a.qp.post_send(&bad.signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    }
}

/// What a run of SENDs and WRITEs between two fabrics leaves, with the express path on or off
/// (taken in straight from their ring records, or as packets): every completion, each side's
/// QP numbers left out (they differ from run to run), and the bytes that landed.
fn requests_transcript(dir: &HostDir, qp_type: QpType, express: bool) -> Vec<String> {
    let cfg = || FabricConfig { express, ..Default::default() };
    let (fa, fb) = (dir.fabric_with(cfg()), dir.fabric_with(cfg()));
    let node = |f: &Fabric| match qp_type {
        QpType::UC => uc_node(&f.devices()[0]),
        _ => node_on(&f.devices()[0], 1 << 16),
    };
    let (a, b) = (node(&fa), node(&fb));
    // No ACK timeout: what an ACK leaves to do is done when it comes, or never.
    let params = RcParams { timeout: 0, ..Default::default() };
    connect(&a.qp, &b.qp, &params, &params);
    a.mr.write(0, &pattern(1, 8192)).unwrap();
    let mut out = Vec::new();
    let note = |out: &mut Vec<String>, side: &str, w: Wc| {
        out.push(format!(
            "{side} {} {:?} {:?} {} {} {:?} {}",
            w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags, w.slid
        ));
    };
    let mut got = vec![0u8; 16384];
    let send = |wr: SendWr<'_>| a.qp.post_send(&wr.signaled()).unwrap();
    // With immediate, into a larger buffer; then three packets' worth; then the next PSN.
    post_recv(&b.qp, 10, &[sge(&b.mr, 0, 64)]);
    send(SendWr::send(1, &[sge(&a.mr, 0, 20)]).with_imm(7));
    post_recv(&b.qp, 11, &[sge(&b.mr, 100, 1000), sge(&b.mr, 2000, 4000)]);
    send(SendWr::send(2, &[sge(&a.mr, 64, 3000)]));
    post_recv(&b.qp, 12, &[sge(&b.mr, 7000, 8)]);
    send(SendWr::send(3, &[sge(&a.mr, 4000, 8)]));
    for _ in 0..3 {
        note(&mut out, "send", wait1(&a.cq));
        note(&mut out, "recv", wait1(&b.cq));
    }
    // Inline, asking for the solicited event, with immediate (the receive's flags say so).
    let inline = pattern(2, 12);
    post_recv(&b.qp, 30, &[sge(&b.mr, 7300, 16)]);
    send(SendWr {
        send_flags: SendFlags::INLINE | SendFlags::SOLICITED,
        inline_data: &inline,
        ..SendWr::send(31, &[]).with_imm(31)
    });
    note(&mut out, "send", wait1(&a.cq));
    note(&mut out, "recv", wait1(&b.cq));
    let mut landed = [0u8; 12];
    b.mr.read(7300, &mut landed).unwrap();
    assert_eq!(landed[..], inline[..], "{qp_type:?}: the inline bytes");
    // WRITEs of one packet and of three, then a SEND behind them.
    let (at, rkey) = (b.mr.addr(), b.mr.rkey());
    send(SendWr::write(6, &[sge(&a.mr, 100, 8)], at + 9000, rkey));
    send(SendWr::write(7, &[sge(&a.mr, 200, 3000)], at + 10000, rkey));
    post_recv(&b.qp, 15, &[sge(&b.mr, 13100, 8)]);
    send(SendWr::send(8, &[sge(&a.mr, 300, 8)]));
    for _ in 0..3 {
        note(&mut out, "send", wait1(&a.cq));
    }
    note(&mut out, "recv", wait1(&b.cq));
    // WRITEs with immediate, of one packet, of three and of none: each consumes a receive
    // (whose buffer stays untouched) and completes it with the length written.
    post_recv(&b.qp, 16, &[sge(&b.mr, 13200, 8)]);
    send(SendWr::write(9, &[sge(&a.mr, 400, 8)], at + 14000, rkey).with_imm(9));
    post_recv(&b.qp, 17, &[sge(&b.mr, 13300, 8)]);
    send(SendWr::write(10, &[sge(&a.mr, 500, 3000)], at + 4000, rkey).with_imm(10));
    post_recv(&b.qp, 18, &[]);
    send(SendWr::write(11, &[], at + 14100, rkey).with_imm(11));
    for _ in 0..3 {
        note(&mut out, "send", wait1(&a.cq));
        note(&mut out, "recv", wait1(&b.cq));
    }
    // A bind posted behind a WRITE runs once the WRITE is complete (acknowledged, on RC).
    let bindable = a.pd.reg_mr(4096, ALL_ACCESS | AccessFlags::MW_BIND).unwrap();
    let mw = a.pd.alloc_mw(MwType::TYPE_2).unwrap();
    let info = MwBindInfo {
        mr: Some(&bindable),
        addr: bindable.addr(),
        length: 64,
        access: AccessFlags::REMOTE_WRITE,
    };
    let bind = MwBind { mw: &mw, rkey: mw.rkey().wrapping_add(1), info, mw_rkey: None };
    let write_sg = [sge(&a.mr, 700, 8)];
    let pair = [
        SendWr::write(20, &write_sg, at + 14300, rkey).signaled(),
        SendWr::bind_mw(21, bind).signaled(),
    ];
    a.qp.post_send_list(&pair).unwrap();
    // (A SEND behind them, so that the WRITE has landed, on UC too, once it is received.)
    post_recv(&b.qp, 22, &[sge(&b.mr, 13400, 8)]);
    send(SendWr::send(22, &[sge(&a.mr, 800, 8)]));
    for _ in 0..3 {
        note(&mut out, "send", wait1(&a.cq));
    }
    note(&mut out, "recv", wait1(&b.cq));
    if qp_type == QpType::RC {
        // No receive posted: RNR, and taken once one is.
        send(SendWr::write(12, &[sge(&a.mr, 600, 8)], at + 14200, rkey).with_imm(12));
        std::thread::sleep(std::time::Duration::from_millis(2));
        post_recv(&b.qp, 19, &[]);
        note(&mut out, "send", wait1(&a.cq));
        note(&mut out, "recv", wait1(&b.cq));
        // A SEND likewise.
        send(SendWr::send(4, &[sge(&a.mr, 5000, 16)]));
        std::thread::sleep(std::time::Duration::from_millis(2));
        post_recv(&b.qp, 13, &[sge(&b.mr, 7100, 16)]);
        note(&mut out, "send", wait1(&a.cq));
        note(&mut out, "recv", wait1(&b.cq));
    }
    b.mr.read(0, &mut got).unwrap();
    let sent = pattern(1, 8192);
    let landed = [
        (0, 0, 20),
        (100, 64, 1000),
        (2000, 1064, 2000),
        (7000, 4000, 8),
        (9000, 100, 8),
        (10000, 200, 3000),
        (13100, 300, 8),
        (14000, 400, 8),
        (4000, 500, 3000),
        (14300, 700, 8),
        (13400, 800, 8),
    ];
    for (at, from, len) in landed {
        assert_eq!(got[at..at + len], sent[from..from + len], "{qp_type:?} at {at}");
    }
    if qp_type == QpType::RC {
        assert_eq!(got[14200..14208], sent[600..608], "after its RNR");
    }
    // Every byte, digested: nothing landed anywhere else either.
    let digest = got
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    out.push(format!("{digest:x}"));
    if qp_type == QpType::UC {
        // A WRITE with immediate its responder refuses (a bad rkey) is dropped and leaves the
        // receive posted for the next message (class E, as rxe).
        post_recv(&b.qp, 23, &[sge(&b.mr, 13500, 8)]);
        send(SendWr::write(23, &[sge(&a.mr, 900, 8)], at + 14400, rkey ^ 0x100).with_imm(23));
        note(&mut out, "send", wait1(&a.cq));
        send(SendWr::send(24, &[sge(&a.mr, 1000, 8)]));
        note(&mut out, "send", wait1(&a.cq));
        let r = wait1(&b.cq);
        assert_eq!((r.wr_id, r.opcode), (23, WcOpcode::RECV), "the receive kept for the SEND");
        note(&mut out, "recv", r);
        let mut landed = [0u8; 8];
        b.mr.read(13500, &mut landed).unwrap();
        assert_eq!(landed[..], sent[1000..1008]);
        // So is one the QP does not enable (no REMOTE_WRITE), before it takes a receive; the
        // QP goes on (as rxe).
        let enabled = b.qp.query().unwrap().qp_access_flags;
        let access = |qp_access_flags| QpAttr {
            qp_state: QpState::RTS,
            qp_access_flags,
            ..Default::default()
        };
        let mask = QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS;
        b.qp.modify(&access(AccessFlags::empty()), mask).unwrap();
        post_recv(&b.qp, 25, &[sge(&b.mr, 13600, 8)]);
        send(SendWr::write(25, &[sge(&a.mr, 900, 8)], at + 14400, rkey).with_imm(25));
        note(&mut out, "send", wait1(&a.cq));
        send(SendWr::send(26, &[sge(&a.mr, 1100, 8)]));
        note(&mut out, "send", wait1(&a.cq));
        let r = wait1(&b.cq);
        assert_eq!((r.wr_id, r.opcode), (25, WcOpcode::RECV), "the receive kept for the SEND");
        note(&mut out, "recv", r);
        b.mr.read(13600, &mut landed).unwrap();
        assert_eq!(landed[..], sent[1100..1108]);
        b.qp.modify(&access(enabled), mask).unwrap();
    }
    // Longer than its receive: the receive fails (and the QP with it), as does an RC SEND.
    post_recv(&b.qp, 14, &[sge(&b.mr, 7200, 4)]);
    send(SendWr::send(5, &[sge(&a.mr, 0, 8)]));
    note(&mut out, "send", wait1(&a.cq));
    note(&mut out, "recv", wait1(&b.cq));
    out
}

#[test]
fn sends_and_writes_taken_in_from_their_records_complete_as_packets_complete() {
    let dir = HostDir::new();
    for qp_type in [QpType::RC, QpType::UC] {
        let taken = requests_transcript(&dir, qp_type, true);
        let packets = requests_transcript(&dir, qp_type, false);
        assert_eq!(taken, packets, "{qp_type:?}");
        let first = format!("recv 10 SUCCESS RECV 20 7 {:?} ", WcFlags::WITH_IMM);
        assert!(taken.iter().any(|l| l.starts_with(&first)), "{qp_type:?} {taken:#?}");
        let last = taken.last().unwrap();
        assert!(last.starts_with("recv 14 LOC_LEN_ERR"), "{qp_type:?} {last}");
        assert!(taken.iter().any(|l| l.starts_with("send 21 SUCCESS BIND_MW")), "{qp_type:?}");
    }
}

/// How a run of READs and atomics ends: a READ the responder refuses (a bad rkey), or an
/// atomic whose response its requester cannot place (a bad lkey).
#[derive(Debug, Clone, Copy)]
enum ReadEnding {
    BadRkey,
    BadLkey,
}

/// What a run of READs and atomics between two fabrics leaves, with the express path on or
/// off (taken in straight from their ring records, or as packets): every completion, and the
/// bytes read. One is outstanding at a time (`max_rd_atomic` 1): each waits for the one
/// before to be answered, with no ACK timeout to send it otherwise.
fn reads_transcript(dir: &HostDir, express: bool, ending: ReadEnding) -> Vec<String> {
    let cfg = || FabricConfig { express, ..Default::default() };
    let (fa, fb) = (dir.fabric_with(cfg()), dir.fabric_with(cfg()));
    let (a, b) = (node_on(&fa.devices()[0], 1 << 16), node_on(&fb.devices()[0], 1 << 16));
    let params = RcParams { timeout: 0, max_rd_atomic: 1, ..Default::default() };
    connect(&a.qp, &b.qp, &params, &params);
    b.mr.write(0, &pattern(2, 8192)).unwrap();
    let (at, rkey) = (b.mr.addr(), b.mr.rkey());
    let mut out = Vec::new();
    let note = |out: &mut Vec<String>, w: Wc| {
        out.push(format!("{} {:?} {:?} {}", w.wr_id, w.status, w.opcode, w.byte_len));
    };
    // Of one packet, of the most that goes the short way (1 KiB, two SGEs), of none, of
    // three packets; then a WRITE and a READ of what it wrote; a FETCH_ADD on a word of it, a
    // CMP_SWP that finds what that left and one that does not, and a READ of the word.
    let (one, two) = ([sge(&a.mr, 0, 8)], [sge(&a.mr, 100, 24), sge(&a.mr, 200, 1000)]);
    let three = [sge(&a.mr, 2000, 3000)];
    let (src, back) = ([sge(&a.mr, 5000, 16)], [sge(&a.mr, 5100, 16)]);
    let word = at + 7008;
    let found = u64::from_ne_bytes(pattern(3, 16)[8..].try_into().unwrap());
    let olds: Vec<[Sge; 1]> = (0..4).map(|k| [sge(&a.mr, 5200 + 8 * k, 8)]).collect();
    let wrs = [
        SendWr::read(1, &one, at + 100, rkey),
        SendWr::read(2, &two, at + 1000, rkey),
        SendWr::read(3, &[], at, rkey),
        SendWr::read(4, &three, at + 3000, rkey),
        SendWr::write(5, &src, at + 7000, rkey),
        SendWr::read(6, &back, at + 7000, rkey),
        SendWr::fetch_add(7, &olds[0], word, rkey, 5),
        SendWr::cmp_swap(8, &olds[1], word, rkey, found.wrapping_add(5), 99),
        SendWr::cmp_swap(9, &olds[2], word, rkey, 1, 2),
        SendWr::read(10, &olds[3], word, rkey),
    ];
    a.mr.write(5000, &pattern(3, 16)).unwrap();
    a.qp.post_send_list(&wrs.map(SendWr::signaled)).unwrap();
    for w in wait_n(&a.cq, 10) {
        note(&mut out, w);
    }
    let bad = match ending {
        ReadEnding::BadRkey => SendWr::read(11, &one, at, rkey ^ 0x100),
        ReadEnding::BadLkey => {
            let sg = [Sge { lkey: a.mr.lkey() ^ 0x100, ..one[0] }];
            a.qp.post_send(&SendWr::fetch_add(11, &sg, word, rkey, 1).signaled()).unwrap();
            note(&mut out, wait1(&a.cq));
            SendWr::read(12, &one, at, rkey)
        }
    };
    a.qp.post_send(&bad.signaled()).unwrap();
    note(&mut out, wait1(&a.cq));
    let mut got = vec![0u8; 8192];
    a.mr.read(0, &mut got).unwrap();
    let sent = pattern(2, 8192);
    for (to, from, len) in [(0, 100, 8), (100, 1000, 24), (200, 1024, 1000), (2000, 3000, 3000)] {
        assert_eq!(got[to..to + len], sent[from..from + len], "{ending:?} at {to}");
    }
    assert_eq!(got[5100..5116], pattern(3, 16), "{ending:?}: the READ after the WRITE");
    let words: Vec<u64> =
        got[5200..5232].chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    let added = found.wrapping_add(5);
    assert_eq!(words, [found, added, 99, 99], "{ending:?}: what the atomics found");
    let digest = got
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    out.push(format!("{digest:x}"));
    out
}

#[test]
fn reads_and_atomics_taken_in_from_their_records_complete_as_packets_complete() {
    let dir = HostDir::new();
    for (ending, last) in
        [(ReadEnding::BadRkey, "11 REM_ACCESS_ERR"), (ReadEnding::BadLkey, "12 WR_FLUSH_ERR")]
    {
        let taken = reads_transcript(&dir, true, ending);
        let packets = reads_transcript(&dir, false, ending);
        assert_eq!(taken, packets, "{ending:?}");
        let ok = taken.iter().take(10).all(|l| l.contains(" SUCCESS "));
        assert!(ok, "{ending:?} {taken:#?}");
        assert!(taken[taken.len() - 2].starts_with(last), "{ending:?} {taken:#?}");
    }
}

/// A pattern that differs per message and per byte.
fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + seed) % 251) as u8).collect()
}

/// Sizes that take every way between processes: copied out of one ring record, placed from
/// one record (a SEND or WRITE of one piece written whole into it below 16 KiB), held in
/// several records until whole, and read from the sender's memory (by default from 16 KiB on
/// where it is shared, else from 64 KiB on; streamed, beyond what the 2 MiB ring holds whole),
/// each at its edges.
const SIZES: [usize; 14] = [
    1, 2047, 2048, 4096, 16_383, 16_384, 65_535, 65_536, 100_000, 262_100, 262_200, 700_000,
    1_400_000, 3_000_000,
];

#[test]
fn messages_of_every_size_cross_intact() {
    let dir = HostDir::new();
    for (_fa, a, _fb, b) in [big_pair(&dir), streamed_pair(&dir)] {
        every_size_crosses_intact(&a, &b);
    }
}

fn every_size_crosses_intact(a: &Node, b: &Node) {
    for (i, &len) in SIZES.iter().enumerate() {
        // A WRITE from two SGEs.
        let data = pattern(i, len);
        a.mr.write(0, &data).unwrap();
        let half = len / 2;
        let sg = [sge(&a.mr, 0, half), sge(&a.mr, half, len - half)];
        let w = SendWr::write(1, &sg, b.mr.addr() + 64, b.mr.rkey());
        a.qp.post_send(&w.signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS, "WRITE of {len}");
        let mut got = vec![0u8; len];
        b.mr.read(64, &mut got).unwrap();
        assert!(got == data, "WRITE of {len} bytes landed intact");

        // A SEND the other way, into a receive at an offset.
        let data = pattern(i + 100, len);
        b.mr.write(4 << 20, &data).unwrap();
        post_recv(&a.qp, 7, &[sge(&a.mr, 8, len)]);
        b.qp.post_send(&SendWr::send(2, &[sge(&b.mr, 4 << 20, len)]).signaled()).unwrap();
        assert_eq!(wait1(&b.cq).status, WcStatus::SUCCESS);
        let r = wait1(&a.cq);
        assert_eq!((r.status, r.byte_len), (WcStatus::SUCCESS, len as u32), "SEND of {len}");
        let mut got = vec![0u8; len];
        a.mr.read(8, &mut got).unwrap();
        assert!(got == data, "SEND of {len} bytes landed intact");

        // A READ of it back (the response in records, or read from the target's memory when
        // the ring cannot hold it whole).
        let sg = [sge(&b.mr, 1 << 20, len)];
        let rd = SendWr::read(3, &sg, a.mr.addr() + 8, a.mr.rkey());
        b.qp.post_send(&rd.signaled()).unwrap();
        assert_eq!(wait1(&b.cq).status, WcStatus::SUCCESS, "READ of {len}");
        let mut got = vec![0u8; len];
        b.mr.read(1 << 20, &mut got).unwrap();
        assert!(got == data, "READ of {len} bytes came back intact");
    }
}

#[test]
fn more_reads_in_flight_than_the_ring_holds_all_come_back_intact() {
    // Sixteen 300 KB READs outstanding at once: their responses, which the target's reader
    // sends without waiting, outgrow the 2 MiB ring, and the rest are read by the requester
    // straight from the target's memory. Every byte comes back, from the right place.
    let dir = HostDir::new();
    let (fa, a, _fb, b) = streamed_pair(&dir);
    const LEN: usize = 300_000;
    const N: usize = 16;
    for k in 0..N {
        b.mr.write(k * LEN, &pattern(k, LEN)).unwrap();
    }
    let sgs: Vec<[Sge; 1]> = (0..N).map(|k| [sge(&a.mr, k * LEN, LEN)]).collect();
    let wrs: Vec<SendWr<'_>> = (0..N)
        .map(|k| SendWr::read(k as u64, &sgs[k], b.mr.addr() + (k * LEN) as u64, b.mr.rkey()))
        .map(SendWr::signaled)
        .collect();
    a.qp.post_send_list(&wrs).unwrap();
    let done = wait_n(&a.cq, N);
    assert!(done.iter().all(|c| c.status == WcStatus::SUCCESS), "{done:?}");
    for k in 0..N {
        let mut got = vec![0u8; LEN];
        a.mr.read(k * LEN, &mut got).unwrap();
        assert!(got == pattern(k, LEN), "READ {k} came back intact");
    }
    assert_eq!(fa.host_drops(), Some(HostDrops::default()), "nothing refused");
}

#[test]
fn many_large_writes_in_flight_keep_their_order_and_bytes() {
    // More in flight than the ring holds: senders wait for room or leave the rest to the
    // flusher; every message still lands, in order (the last one wins each slot).
    let dir = HostDir::new();
    let (_fa, a, _fb, b) = streamed_pair(&dir);
    let len = 600_000;
    for round in 0..3 {
        for k in 0..12 {
            a.mr.write(k * len % (6 << 20), &pattern(round * 100 + k, len)).unwrap();
        }
        for k in 0..12 {
            let sg = [sge(&a.mr, k * len % (6 << 20), len)];
            let at = b.mr.addr() + (k % 4 * len) as u64;
            let w = SendWr::write(k as u64, &sg, at, b.mr.rkey());
            a.qp.post_send(&w.signaled()).unwrap();
        }
        let wcs = wait_n(&a.cq, 12);
        assert!(wcs.iter().all(|c| c.status == WcStatus::SUCCESS));
        let ids: Vec<u64> = wcs.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, (0..12).collect::<Vec<u64>>(), "completions in order");
        for slot in 0..4 {
            let mut got = vec![0u8; len];
            b.mr.read(slot * len, &mut got).unwrap();
            assert!(got == pattern(round * 100 + 8 + slot, len), "slot {slot} has the last WRITE");
        }
    }
}

#[test]
fn large_writes_with_immediate_land_intact_and_wait_for_their_receives() {
    // Multi-record WRITEs (landed as they arrive) with immediate: the first before any receive
    // is posted (RNR NAKed whole, and sent again until one is), then a stream of them.
    let dir = HostDir::new();
    let (_fa, a, _fb, b) = streamed_pair(&dir);
    let len = 1 << 20;
    a.mr.write(0, &pattern(1, len)).unwrap();
    let sg = [sge(&a.mr, 0, len)];
    let w = SendWr::write(0, &sg, b.mr.addr(), b.mr.rkey()).signaled().with_imm(0xabcd);
    a.qp.post_send(&w).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(a.cq.poll_one().is_none(), "waits for a receive");
    b.qp.post_recv(&RecvWr { wr_id: 100, sg_list: &[] }).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let wc = wait1(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm_data, wc.byte_len),
        (100, WcOpcode::RECV_RDMA_WITH_IMM, 0xabcd, len as u32)
    );
    let mut got = vec![0u8; len];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == pattern(1, len));
    for k in 0..6 {
        b.qp.post_recv(&RecvWr { wr_id: k, sg_list: &[] }).unwrap();
    }
    for k in 0..6usize {
        a.mr.write(k * len, &pattern(10 + k, len)).unwrap();
    }
    for k in 0..6usize {
        let sg = [sge(&a.mr, k * len, len)];
        let at = b.mr.addr() + (k * len) as u64;
        let w = SendWr::write(k as u64, &sg, at, b.mr.rkey()).signaled().with_imm(k as u32);
        a.qp.post_send(&w).unwrap();
    }
    assert!(wait_n(&a.cq, 6).iter().all(|c| c.status == WcStatus::SUCCESS));
    let wcs = wait_n(&b.cq, 6);
    let imms: Vec<u32> = wcs.iter().map(|c| c.imm_data).collect();
    assert_eq!(imms, (0..6).collect::<Vec<u32>>(), "receives complete in order");
    for k in 0..6usize {
        b.mr.read(k * len, &mut got).unwrap();
        assert!(got == pattern(10 + k, len), "message {k}");
    }
}

#[test]
fn large_sends_land_intact_in_their_receives() {
    // Multi-record SENDs (landed as they arrive) into receives of two SGEs each, in order.
    let dir = HostDir::new();
    let (_fa, a, _fb, b) = streamed_pair(&dir);
    let len = 1 << 20;
    for k in 0..4usize {
        // Each receive: half a MiB at the start of its slot, the rest 4 KiB further on.
        let at = k * 2 * len;
        let sg = [sge(&b.mr, at, len / 2), sge(&b.mr, at + len / 2 + 4096, len)];
        b.qp.post_recv(&RecvWr { wr_id: k as u64, sg_list: &sg }).unwrap();
    }
    for k in 0..4usize {
        a.mr.write(k * len, &pattern(20 + k, len)).unwrap();
        let sg = [sge(&a.mr, k * len, len)];
        a.qp.post_send(&SendWr::send(k as u64, &sg).signaled()).unwrap();
    }
    assert!(wait_n(&a.cq, 4).iter().all(|c| c.status == WcStatus::SUCCESS));
    let wcs = wait_n(&b.cq, 4);
    for (k, wc) in wcs.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (k as u64, WcStatus::SUCCESS, len as u32));
        let (mut first, mut rest) = (vec![0u8; len / 2], vec![0u8; len / 2]);
        b.mr.read(k * 2 * len, &mut first).unwrap();
        b.mr.read(k * 2 * len + len / 2 + 4096, &mut rest).unwrap();
        let want = pattern(20 + k, len);
        assert!(first == want[..len / 2] && rest == want[len / 2..], "message {k}");
    }
}

#[test]
fn uc_writes_larger_than_the_ring_are_copied_across_intact() {
    // UC completes at the sender when the message leaves, so its payload may never be read
    // late from the sender's memory: it goes through the ring, however large.
    let dir = HostDir::new();
    let (fa, fb) = (dir.fabric(Profile::Full), dir.fabric(Profile::Full));
    let (a, b) = (node_on(&fa.devices()[0], 8 << 20), node_on(&fb.devices()[0], 8 << 20));
    let qa = new_qp(&a.pd, &a.cq, QpType::UC, 16, true);
    let qb = new_qp(&b.pd, &b.cq, QpType::UC, 16, true);
    connect(&qa, &qb, &RcParams::default(), &RcParams::default());
    let data = pattern(5, 3_000_000);
    a.mr.write(0, &data).unwrap();
    post_recv(&qb, 2, &[]);
    let sg = [sge(&a.mr, 0, data.len())];
    qa.post_send(&SendWr::write(1, &sg, b.mr.addr(), b.mr.rkey()).with_imm(9)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    // The sender may reuse its buffer at once: the target still gets what was sent (its
    // receive completes once the data is placed).
    a.mr.write(0, &vec![0xee; data.len()]).unwrap();
    let wc = wait1(&b.cq);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (2, WcStatus::SUCCESS, data.len() as u32));
    let mut got = vec![0u8; data.len()];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == data, "the UC WRITE landed as it was sent");
}

#[test]
fn a_peer_that_closed_its_qp_and_left_leaves_the_survivors_sends_to_the_retry_timer() {
    let dir = HostDir::new();
    for profile in [Profile::Full, Profile::Rxe] {
        let p = RcParams { rnr_retry: 7, timeout: 10, retry_cnt: 2, ..Default::default() };
        let (_fa, a, fb, b) = host_pair(&dir, profile, &p);
        // The survivor's SEND finds no receive and is retried forever (rnr_retry 7), and
        // its own receive waits for a message that will never come.
        post_recv(&a.qp, 41, &[sge(&a.mr, 0, 64)]);
        a.qp.post_send(&SendWr::send(42, &[sge(&a.mr, 0, 8)]).signaled()).unwrap();
        // The peer destroys its QP, then its process goes: as on a wire, what the survivor
        // retransmits is lost, and the ACK timeout (not the RNR loop) runs out of retries.
        drop((b, fb));
        let wcs = wait_n(&a.cq, 2);
        let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(42, WcStatus::RETRY_EXC_ERR), (41, WcStatus::WR_FLUSH_ERR)]);
        assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
        // An error completion, not an affiliated asynchronous error.
        a.ctx.set_async_nonblocking(true).unwrap();
        assert!(a.ctx.get_async_event().is_err());
    }
}

fn endpoint_text(e: &Endpoint) -> String {
    let gid: String = e.gid.0.iter().map(|b| format!("{b:02x}")).collect();
    format!("{} {} {} {gid}", e.qpn, e.lid, e.psn)
}

fn endpoint_parse(s: &str) -> Endpoint {
    let f: Vec<&str> = s.split_whitespace().collect();
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16).unwrap();
    }
    Endpoint {
        qpn: f[0].parse().unwrap(),
        lid: f[1].parse().unwrap(),
        psn: f[2].parse().unwrap(),
        gid: Gid(gid),
    }
}

/// This test binary started again as the process of test `name`, with `var` set to `spec`;
/// the child (stdin and stdout piped) and the lines it prints.
fn peer_process(
    name: &str,
    var: &str,
    spec: &str,
) -> (std::process::Child, impl Iterator<Item = String>) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(var, spec)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines().map(Result::unwrap);
    (child, lines)
}

/// In a peer process started with `var` set to "fabric directory;endpoint": its fabric and a
/// node that `make` puts on its device, connected to that endpoint. `None` unless a test
/// started this binary so.
fn peer_node(var: &str, make: impl FnOnce(&Device) -> Node) -> Option<(Fabric, Node)> {
    let spec = std::env::var(var).ok()?;
    let (dir, theirs) = spec.split_once(';').unwrap();
    let host = Some(dir.to_owned());
    let fabric = Fabric::new(FabricConfig { devices: 1, host, ..Default::default() });
    let n = make(&fabric.devices()[0]);
    n.qp.connect(0, &endpoint_parse(theirs), &RcParams::default()).unwrap();
    Some((fabric, n))
}

/// The next endpoint a peer process prints (after a marker: the test harness may have begun
/// the line).
fn next_endpoint(lines: &mut impl Iterator<Item = String>) -> Endpoint {
    loop {
        let l = lines.next().expect("the peer process ended early");
        if let Some((_, e)) = l.split_once("endpoint: ") {
            return endpoint_parse(e);
        }
    }
}

/// The other process of `a_killed_peer_breaks_its_connections_but_not_the_ones_it_closed`:
/// does nothing unless that test started this binary as its child.
#[test]
fn peer_process_for_the_kill_test() {
    use std::io::Write;
    let Ok(spec) = std::env::var("RDMA_EMU_TEST_PEER") else { return };
    let parts: Vec<&str> = spec.split(';').collect();
    let host = Some(parts[0].to_owned());
    let fabric = Fabric::new(FabricConfig {
        devices: 1,
        profile: Profile::Full,
        host,
        ..Default::default()
    });
    let nodes: Vec<Node> = (0..2).map(|_| node_on(&fabric.devices()[0], 4096)).collect();
    let mut out = std::io::stdout().lock();
    for (n, theirs) in nodes.iter().zip(&parts[1..]) {
        n.qp.connect(0, &endpoint_parse(theirs), &RcParams::default()).unwrap();
        // After a marker: the test harness may have begun the line.
        writeln!(out, "endpoint: {}", endpoint_text(&n.qp.endpoint(0))).unwrap();
    }
    out.flush().unwrap();
    // Closes only once the test's QPs are connected (it writes a line): a close that reached
    // a QP not yet connected would not be a close of its peer.
    std::io::stdin().read_line(&mut String::new()).unwrap();
    let mut nodes = nodes.into_iter();
    let closed = nodes.next().unwrap();
    closed.qp.destroy().unwrap();
    writeln!(out, "closed").unwrap();
    out.flush().unwrap();
    // Killed here, with the second QP still open.
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn a_killed_peer_breaks_its_connections_but_not_the_ones_it_closed() {
    use std::io::Write;
    let dir = HostDir::new();
    let fa = dir.fabric(Profile::Full);
    let (parted, broken) = (node_on(&fa.devices()[0], 4096), node_on(&fa.devices()[0], 4096));
    let spec = format!(
        "{};{};{}",
        dir.0.display(),
        endpoint_text(&parted.qp.endpoint(0)),
        endpoint_text(&broken.qp.endpoint(0))
    );
    let (mut child, mut lines) =
        peer_process("peer_process_for_the_kill_test", "RDMA_EMU_TEST_PEER", &spec);
    for n in [&parted, &broken] {
        n.qp.connect(0, &next_endpoint(&mut lines), &RcParams::default()).unwrap();
        post_recv(&n.qp, 7, &[sge(&n.mr, 0, 64)]);
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(lines.any(|l| l == "closed"), "the peer process ended early");
    // Work sent to the closed QP is lost on the wire: the retry timer ends it, not the kill.
    parted.qp.post_send(&SendWr::send(8, &[sge(&parted.mr, 0, 8)]).signaled()).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    // Only receives posted on both; the connection whose peer was still open is broken.
    let wc = wait1(&broken.cq);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WR_FLUSH_ERR));
    assert_eq!(broken.qp.query().unwrap().qp_state, QpState::ERR);
    broken.ctx.set_async_nonblocking(true).unwrap();
    let ev = broken.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::QP_FATAL);
    broken.ctx.ack_async_event(&ev);
    // The death was handled for both QPs at once (one node): the parted one kept its receive,
    // and its SEND ran out of retries as it would have had the peer process lived on.
    let wc = wait1(&parted.cq);
    assert_eq!((wc.wr_id, wc.status), (8, WcStatus::RETRY_EXC_ERR));
    let wc = wait1(&parted.cq);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WR_FLUSH_ERR));
    assert_empty(&parted.cq);
}

/// A UC QP with 64 KiB of memory.
fn uc_node(dev: &Device) -> Node {
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None, 0).unwrap();
    let mr = pd.reg_mr(1 << 16, ALL_ACCESS).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::UC, &cq, cap(64))).unwrap();
    Node { ctx, pd, cq, qp, mr }
}

/// The other process of `an_exit_does_not_wait_for_a_stopped_peer`: a UC QP connected to the
/// endpoint the test gives; does nothing unless that test started this binary as its child.
#[test]
fn peer_process_for_the_stop_test() {
    use std::io::Write;
    let Some((_fabric, n)) = peer_node("RDMA_EMU_TEST_STOPPED", uc_node) else { return };
    let mut out = std::io::stdout().lock();
    writeln!(out, "endpoint: {}", endpoint_text(&n.qp.endpoint(0))).unwrap();
    out.flush().unwrap();
    // Stopped here, then killed.
    std::thread::sleep(std::time::Duration::from_secs(60));
}

/// A process whose peer is stopped (SIGSTOP, a debugger) exits without waiting for it: what
/// it queued for the peer is left behind once the peer is seen taking nothing, long before
/// the flush's own limit (which the old flush waited out, long enough for perftest's pending
/// SIGALRM to fire during teardown).
#[test]
fn an_exit_does_not_wait_for_a_stopped_peer() {
    let dir = HostDir::new();
    let fa = dir.fabric(Profile::Full);
    let a = uc_node(&fa.devices()[0]);
    let spec = format!("{};{}", dir.0.display(), endpoint_text(&a.qp.endpoint(0)));
    let (mut child, mut lines) =
        peer_process("peer_process_for_the_stop_test", "RDMA_EMU_TEST_STOPPED", &spec);
    a.qp.connect(0, &next_endpoint(&mut lines), &RcParams::default()).unwrap();
    // SAFETY: signals a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
    until_stopped(child.id());
    // More than the ring to it holds: UC SENDs complete as they leave, the rest queues.
    let sg = [sge(&a.mr, 0, 1 << 16)];
    for i in 0..96 {
        a.qp.post_send(&SendWr::send(i, &sg).signaled()).unwrap();
        assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    }
    let flushed = fa.flush(std::time::Duration::from_secs(60));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(flushed, Flushed::LeftStalled(1));
}

/// Waits (a bounded guard) until process `pid` is stopped: a signal takes effect
/// asynchronously.
fn until_stopped(pid: u32) {
    let stat = format!("/proc/{pid}/stat");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
        assert!(std::time::Instant::now() < deadline, "the peer never stopped");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The other process of `a_stopped_peer_keeps_its_connections`: an RC QP connected to the
/// endpoint the test gives; puts a text at byte 32 of its MR, prints its endpoint and MR, and
/// once a SEND arrives, the first 16 bytes of its MR; ends when its input does. Does nothing
/// unless that test started this binary.
#[test]
fn peer_process_for_the_debugger_test() {
    use std::io::Write;
    let Some((_fabric, n)) = peer_node("RDMA_EMU_TEST_DEBUGGED", |d| node_on(d, 4096)) else {
        return;
    };
    n.mr.write(32, b"read me, stopped").unwrap();
    post_recv(&n.qp, 5, &[]);
    let mut out = std::io::stdout().lock();
    writeln!(out, "mr: {} {}", n.mr.addr(), n.mr.rkey()).unwrap();
    writeln!(out, "endpoint: {}", endpoint_text(&n.qp.endpoint(0))).unwrap();
    out.flush().unwrap();
    // The test's SEND comes after its WRITE: once it is here, so is the WRITE's data.
    let wc = wait1(&n.cq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::SUCCESS));
    let mut got = [0u8; 16];
    n.mr.read(0, &mut got).unwrap();
    writeln!(out, "holds: {}", String::from_utf8_lossy(&got)).unwrap();
    let mut more = [0u8; 1024];
    n.mr.read(1024, &mut more).unwrap();
    writeln!(out, "sum: {}", more.iter().map(|&b| u64::from(b)).sum::<u64>()).unwrap();
    out.flush().unwrap();
    // Alive until the test has its completions: the refused WRITE behind the SEND is still
    // to be answered (a process that ended first would leave it to retry exhaustion).
    std::io::stdin().read_line(&mut String::new()).unwrap();
}

/// A process stopped at a breakpoint (here SIGSTOP) for far longer than its peers' retry
/// budget keeps its connections, and its peers' RDMA WRITEs and READs go on while it is
/// stopped, as its HCA would carry them out: the WRITE's bytes are in its memory when it
/// continues, the READ brings what its memory holds. A SEND (it needs the stopped process's
/// receive queue) waits, is taken in once it continues, and completes (divergences #16).
#[test]
fn a_stopped_peer_keeps_its_connections() {
    let dir = HostDir::new();
    let fa = dir.fabric(Profile::Full);
    let a = node_on(&fa.devices()[0], 4096);
    let spec = format!("{};{}", dir.0.display(), endpoint_text(&a.qp.endpoint(0)));
    let (mut child, mut lines) =
        peer_process("peer_process_for_the_debugger_test", "RDMA_EMU_TEST_DEBUGGED", &spec);
    let mr = loop {
        let l = lines.next().expect("the peer process ended early");
        if let Some((_, m)) = l.split_once("mr: ") {
            let (addr, rkey) = m.split_once(' ').unwrap();
            break (addr.parse::<u64>().unwrap(), rkey.parse::<u32>().unwrap());
        }
    };
    // About 17 ms per timeout and two retries: without the stop's allowance the WRITE would
    // fail in ~50 ms, and that is also what the peer has to answer once it continues (ample
    // even under ThreadSanitizer, which a budget of 2 ms was not).
    let p = RcParams { timeout: 12, retry_cnt: 2, ..Default::default() };
    a.qp.connect(0, &next_endpoint(&mut lines), &p).unwrap();
    // SAFETY: signals a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
    until_stopped(child.id());
    // Gathered from two pieces of memory.
    a.mr.write(0, b"while yo").unwrap();
    a.mr.write(256, b"u slept.").unwrap();
    let w_sg = [sge(&a.mr, 0, 8), sge(&a.mr, 256, 8)];
    a.qp.post_send(&SendWr::write(1, &w_sg, mr.0, mr.1).signaled()).unwrap();
    let wc = wait1(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::SUCCESS));
    // A stream of them, posted at once: each waits in the ring until carried out.
    let bytes: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 251) as u8).collect();
    a.mr.write(1024, &bytes).unwrap();
    for i in 0..64u64 {
        let piece = [sge(&a.mr, 1024 + 16 * i as usize, 16)];
        let wr = SendWr::write(100 + i, &piece, mr.0 + 1024 + 16 * i, mr.1).signaled();
        a.qp.post_send(&wr).unwrap();
    }
    let done = wait_n(&a.cq, 64);
    assert!(
        done.iter()
            .enumerate()
            .all(|(i, w)| w.wr_id == 100 + i as u64 && w.status == WcStatus::SUCCESS)
    );
    let r_sg = [sge(&a.mr, 64, 16)];
    a.qp.post_send(&SendWr::read(2, &r_sg, mr.0 + 32, mr.1).signaled()).unwrap();
    let wc = wait1(&a.cq);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (2, WcStatus::SUCCESS, 16));
    let mut got = [0u8; 16];
    a.mr.read(64, &mut got).unwrap();
    assert_eq!(&got, b"read me, stopped");
    until_stopped(child.id());
    a.qp.post_send(&SendWr::send(3, &[]).signaled()).unwrap();
    // A WRITE its responder would refuse is not carried out: it waits, and fails once the
    // peer continues, as it would have.
    a.qp.post_send(&SendWr::write(4, &w_sg, mr.0, mr.1 ^ 0x100).signaled()).unwrap();
    // Eight times the retry budget passes with the peer stopped.
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert_empty(&a.cq);
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::RTS);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGCONT) }, 0);
    let wc = wait1(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::SUCCESS));
    let wc = wait1(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::REM_ACCESS_ERR));
    drop(child.stdin.take());
    let held = lines.find_map(|l| l.split_once("holds: ").map(|(_, h)| h.to_owned()));
    assert_eq!(held.as_deref(), Some("while you slept."));
    let sum = lines.find_map(|l| l.split_once("sum: ").map(|(_, s)| s.parse::<u64>().unwrap()));
    assert_eq!(sum, Some(bytes.iter().map(|&b| u64::from(b)).sum()));
    child.wait().unwrap();
}

/// The other process of `a_survivor_keeps_no_descriptor_or_ring_of_peers_stopped_and_killed`:
/// connects to the endpoint the test gives, SENDs [`ROUND_MESSAGES`] once told to, says
/// "sent", and waits to be killed. Does nothing unless that test started this binary.
#[test]
fn peer_process_for_the_round_test() {
    use std::io::Write;
    let Some((_fabric, n)) = peer_node("RDMA_EMU_TEST_ROUND", |d| node_on(d, 4096)) else { return };
    let mut out = std::io::stdout().lock();
    writeln!(out, "endpoint: {}", endpoint_text(&n.qp.endpoint(0))).unwrap();
    out.flush().unwrap();
    std::io::stdin().read_line(&mut String::new()).unwrap();
    for i in 0..ROUND_MESSAGES {
        n.mr.write(0, &i.to_le_bytes()).unwrap();
        n.qp.post_send(&SendWr::send(i, &[sge(&n.mr, 0, 8)]).signaled()).unwrap();
        assert_eq!(wait1(&n.cq).status, WcStatus::SUCCESS);
    }
    writeln!(out, "sent").unwrap();
    out.flush().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(60));
}

const ROUND_MESSAGES: u64 = 1000;

/// Descriptors of this process, and mappings of memory files (rings) in it.
fn open_files() -> (usize, usize) {
    let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    (fds, maps.lines().filter(|l| l.contains("/memfd:")).count())
}

/// A long-lived process whose peers come, talk, are stopped and continued mid-transfer, and
/// are killed, round after round: every message arrives, and its descriptors, ring mappings
/// and the fabric's directory do not grow with the rounds. (The survivor is a process of its
/// own: the other tests of this binary would move its counts.)
#[test]
fn a_survivor_keeps_no_descriptor_or_ring_of_peers_stopped_and_killed() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "survivor_process_for_the_round_test", "--nocapture", "--test-threads=1"])
        .env("RDMA_EMU_TEST_SURVIVOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("survivor ok"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The process of `a_survivor_keeps_no_descriptor_or_ring_of_peers_stopped_and_killed`.
#[test]
fn survivor_process_for_the_round_test() {
    use std::io::Write;
    if std::env::var_os("RDMA_EMU_TEST_SURVIVOR").is_none() {
        return;
    }
    let dir = HostDir::new();
    let f = dir.fabric(Profile::Full);
    let s = node_on(&f.devices()[0], 4096);
    let mut seen = Vec::new();
    for round in 0..8 {
        let qp = s.pd.create_qp(&QpInitAttr::new(QpType::RC, &s.cq, cap(1024))).unwrap();
        // Receives are taken from INIT on (`connect` moves it on from there).
        let init = QpAttr { qp_state: QpState::INIT, port_num: 1, ..Default::default() };
        let mask = QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX;
        qp.modify(&init, mask | QpAttrMask::ACCESS_FLAGS).unwrap();
        for i in 0..ROUND_MESSAGES {
            post_recv(&qp, i, &[sge(&s.mr, 8 * (i as usize % 512), 8)]);
        }
        let spec = format!("{};{}", dir.0.display(), endpoint_text(&qp.endpoint(0)));
        let (mut child, mut lines) =
            peer_process("peer_process_for_the_round_test", "RDMA_EMU_TEST_ROUND", &spec);
        qp.connect(0, &next_endpoint(&mut lines), &RcParams::default()).unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(
                b"go
",
            )
            .unwrap();
        let pid = child.id() as i32;
        if round % 2 == 1 {
            // Stopped mid-transfer: the connection lives on (see also
            // `a_stopped_peer_keeps_its_connections`).
            std::thread::sleep(std::time::Duration::from_millis(2));
            // SAFETY: signals a child process this test started and still owns.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
            std::thread::sleep(std::time::Duration::from_millis(20));
            // SAFETY: as above.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        }
        if round == 6 {
            // Killed while stopped, mid-transfer: what arrived completes, the rest of the
            // receives are flushed once the peer is seen gone.
            std::thread::sleep(std::time::Duration::from_millis(2));
            // SAFETY: as above.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
            child.kill().unwrap();
            child.wait().unwrap();
            let got = wait_n(&s.cq, ROUND_MESSAGES as usize);
            let ok = got.iter().take_while(|w| w.status == WcStatus::SUCCESS).count();
            assert!(
                got[ok..].iter().all(|w| w.status == WcStatus::WR_FLUSH_ERR),
                "round {round}: {:?}",
                &got[ok..]
            );
        } else {
            let got = wait_n(&s.cq, ROUND_MESSAGES as usize);
            assert!(got.iter().all(|w| w.status == WcStatus::SUCCESS), "round {round}: {got:?}");
            assert!(lines.any(|l| l == "sent"), "the peer process ended early");
            child.kill().unwrap();
            child.wait().unwrap();
        }
        qp.destroy().unwrap();
        let now = (open_files(), std::fs::read_dir(&dir.0).unwrap().count());
        println!("round {round}: {now:?}");
        seen.push(now);
    }
    // A dead peer's ring is let go of when the node notices, not at once: each round's count
    // may hold one or two. They must come back to the fewest seen, not climb with the rounds.
    let least = seen.iter().min().copied().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = (open_files(), std::fs::read_dir(&dir.0).unwrap().count());
        if now <= least {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "descriptors, memfd mappings and directory entries stay at {now:?}, above {least:?}: \
             {seen:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    println!("survivor ok");
}

#[test]
fn a_peer_that_is_gone_ends_in_retry_exceeded_not_a_hang() {
    let dir = HostDir::new();
    let (fa, fb) = (dir.fabric(Profile::Full), dir.fabric(Profile::Full));
    let a = node_on(&fa.devices()[0], 4096);
    let b = node_on(&fb.devices()[0], 4096);
    let p = RcParams { timeout: 8, retry_cnt: 2, ..Default::default() };
    // Connected to a QP number in b's node that no QP holds: nothing answers, and b lives on,
    // so only the retry timer can end it.
    let mut ghost = b.qp.endpoint(0);
    ghost.qpn += 100;
    a.qp.connect(0, &ghost, &p).unwrap();
    a.mr.write(0, b"lost").unwrap();
    let w_sg = [sge(&a.mr, 0, 4)];
    let w = SendWr::write(1, &w_sg, 0x1000, 0x1234);
    a.qp.post_send(&w.signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::RETRY_EXC_ERR);
    // A node that goes away frees its slot for the next one; its socket is gone with it. The
    // node goes with the fabric's last reference, which its reader thread may be holding for
    // a moment: the slot is free soon after, not necessarily at once.
    drop((b, fb));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let fc = dir.fabric(Profile::Full);
        let c = node_on(&fc.devices()[0], 4096);
        if c.qp.qp_num() >> 16 == 2 {
            break; // the lowest free slot (1 is taken by the survivor)
        }
        assert!(std::time::Instant::now() < deadline, "slot 2 was never freed");
        drop((c, fc));
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Between processes a QP's ACK deadline outlives the requests it was set for (a ping-pong
/// reads the clock once per timeout, not per request: `requester::lazy_deadline`). Requests
/// that complete, posted at once or after the kept deadline passed idle, never time out; once
/// the peer QP is destroyed, the next request, posted while the kept deadline is pending or
/// after it passed, ends in RETRY_EXC_ERR and the QP in ERR.
#[test]
fn a_deadline_kept_past_its_requests_times_out_only_what_goes_unanswered() {
    for wait_out in [false, true] {
        let dir = HostDir::new();
        let (fa, fb) = (dir.fabric(Profile::Full), dir.fabric(Profile::Full));
        let a = node_on(&fa.devices()[0], 4096);
        let b = node_on(&fb.devices()[0], 4096);
        // An ACK timeout of ~4 ms and the most retries: a request that completes has ~33 ms
        // to, on a loaded machine under a sanitizer too.
        let p = RcParams { timeout: 10, retry_cnt: 7, ..Default::default() };
        connect(&a.qp, &b.qp, &p, &p);
        let w_sg = [sge(&a.mr, 0, 8)];
        let write = |i: u64| SendWr::write(i, &w_sg, b.mr.addr(), b.mr.rkey()).signaled();
        for i in 0..40u64 {
            a.mr.write(0, &i.to_le_bytes()).unwrap();
            a.qp.post_send(&write(i)).unwrap();
            let wc = wait1(&a.cq);
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::SUCCESS));
            let mut got = [0u8; 8];
            b.mr.read(0, &mut got).unwrap();
            assert_eq!(u64::from_le_bytes(got), i);
            if i % 8 == 7 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        b.qp.destroy().unwrap();
        if wait_out {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        a.qp.post_send(&write(99)).unwrap();
        let wc = wait1(&a.cq);
        assert_eq!((wc.wr_id, wc.status), (99, WcStatus::RETRY_EXC_ERR), "wait_out {wait_out}");
        assert_eq!(a.qp.query().unwrap().qp_state, QpState::ERR);
        assert_empty(&a.cq);
    }
}

#[test]
fn fabrics_under_different_names_never_meet() {
    let (d1, d2) = (HostDir::new(), HostDir::new());
    let p = RcParams { timeout: 8, retry_cnt: 1, ..Default::default() };
    let (f1, f2) = (d1.fabric(Profile::Full), d2.fabric(Profile::Full));
    let a = node_on(&f1.devices()[0], 4096);
    // Both fabrics number from the same slot: skip one QPN so that b's number is not a's
    // own (which would be a loopback connection, not a leak).
    let _skip = node_on(&f2.devices()[0], 4096);
    let b = node_on(&f2.devices()[0], 4096);
    assert_ne!(a.qp.qp_num(), b.qp.qp_num());
    connect(&a.qp, &b.qp, &p, &p);
    a.mr.write(0, b"leak").unwrap();
    let w_sg = [sge(&a.mr, 0, 4)];
    let w = SendWr::write(1, &w_sg, b.mr.addr(), b.mr.rkey());
    a.qp.post_send(&w.signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::RETRY_EXC_ERR);
    let mut got = [0u8; 4];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(got, [0; 4]);
}

#[test]
fn ud_datagrams_cross_between_fabrics() {
    let dir = HostDir::new();
    let (fa, fb) = (dir.fabric(Profile::Rxe), dir.fabric(Profile::Rxe));
    let (a, b) = (node_on(&fa.devices()[0], 4096), node_on(&fb.devices()[0], 4096));
    let ud = |n: &Node| ud_qp(n, 5, 8);
    let (qa, qb) = (ud(&a), ud(&b));
    let ep = qb.endpoint(0);
    let attr =
        AhAttr { is_global: true, dgid: ep.gid, port_num: 1, hop_limit: 1, ..Default::default() };
    let ah = a.pd.create_ah(&attr).unwrap();
    qb.post_recv(&RecvWr { wr_id: 3, sg_list: &[sge(&b.mr, 0, 100)] }).unwrap();
    a.mr.write(0, b"dgram").unwrap();
    qa.post_send(&SendWr::send_ud(1, &[sge(&a.mr, 0, 5)], &ah, ep.qpn, 5)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let r = wait1(&b.cq);
    assert_eq!((r.status, r.byte_len, r.src_qp), (WcStatus::SUCCESS, 45, qa.qp_num()));
    let mut got = [0u8; 5];
    b.mr.read(40, &mut got).unwrap();
    assert_eq!(&got, b"dgram");
}

/// Datagrams between two fabrics of one host fabric (as between two processes) leave the same
/// completions, receive buffers and QP states whether they are sent and taken in at once (the
/// express path, the default) or as packets: to the right Q_Key, a wrong one and the sender's
/// own, with immediate data and solicited, inline, through a global address handle or not
/// (InfiniBand ports), with no receive posted, and into a receive too short (which fails the
/// receiver). A good datagram after each case (one sender's datagrams arrive in order) shows
/// that the case was taken in.
#[test]
fn ud_datagrams_between_fabrics_are_the_same_on_both_paths() {
    const QKEY: u32 = 5;
    const MARK: u32 = 0x600d;
    let run = |profile: Profile, express: bool| -> Vec<String> {
        let dir = HostDir::new();
        let cfg = FabricConfig { profile, express, ..Default::default() };
        let (fa, fb) = (dir.fabric_with(cfg.clone()), dir.fabric_with(cfg));
        let (a, b) = (node_on(&fa.devices()[0], 4096), node_on(&fb.devices()[0], 4096));
        let (qa, qb) = (ud_qp(&a, QKEY, 16), ud_qp(&b, QKEY, 16));
        let ep = qb.endpoint(0);
        let roce = b.ctx.query_port(1).unwrap().link_layer == LinkLayer::ETHERNET;
        let ah = |is_global: bool| {
            let attr = AhAttr {
                is_global: is_global || roce,
                dgid: ep.gid,
                dlid: ep.lid,
                port_num: 1,
                hop_limit: 3,
                traffic_class: 8,
                ..Default::default()
            };
            a.pd.create_ah(&attr).unwrap()
        };
        let (plain, global) = (ah(false), ah(true));
        a.mr.write(0, b"0123456789abcdef").unwrap();
        let sg = [sge(&a.mr, 0, 16)];
        let mut seen = Vec::new();
        let mut next = 0u64;
        let mut recv = |len: usize| {
            next += 1;
            let at = 128 * (next as usize % 24);
            qb.post_recv(&RecvWr { wr_id: next, sg_list: &[sge(&b.mr, at, len)] }).unwrap();
        };
        let send = |wr: SendWr<'_>, seen: &mut Vec<String>| {
            qa.post_send(&wr.signaled()).unwrap();
            let s = wait1(&a.cq);
            seen.push(format!("send {:?} {:?} {}", s.status, s.opcode, s.byte_len));
        };
        let good = || SendWr::send_ud(0, &sg, &plain, ep.qpn, QKEY);
        fn flagged(wr: SendWr<'_>, f: SendFlags) -> SendWr<'_> {
            SendWr { send_flags: wr.send_flags | f, ..wr }
        }
        let cases: Vec<(&str, SendWr<'_>, Option<usize>)> = vec![
            ("good", good(), Some(100)),
            ("imm, solicited", flagged(good().with_imm(0xabc), SendFlags::SOLICITED), Some(100)),
            (
                "inline",
                SendWr { inline_data: b"inline", ..flagged(good(), SendFlags::INLINE) },
                Some(100),
            ),
            ("global", SendWr::send_ud(0, &sg, &global, ep.qpn, QKEY), Some(100)),
            ("wrong qkey", SendWr::send_ud(0, &sg, &plain, ep.qpn, QKEY + 1), Some(100)),
            ("own qkey", SendWr::send_ud(0, &sg, &plain, ep.qpn, 0x8000_0000), Some(100)),
            ("no receive", good(), None),
            ("too short", good(), Some(40 + 8)),
        ];
        for (what, wr, room) in cases {
            if let Some(len) = room {
                recv(len);
            }
            send(wr, &mut seen);
            // The good datagram after it (marked by its immediate), into a receive of its own
            // (or the case's, if the case's datagram was dropped): its completion, or a
            // receive's flush once the QP failed, comes after the case's.
            recv(100);
            send(good().with_imm(MARK), &mut seen);
            seen.push(what.to_string());
            loop {
                let w = wait1(&b.cq);
                let from_a = w.src_qp == qa.qp_num();
                seen.push(format!(
                    "recv {} {:?} {:?} {} {:x} {:?} {} {}",
                    w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags, from_a, w.sl
                ));
                if w.imm_data == MARK || w.status == WcStatus::WR_FLUSH_ERR {
                    break;
                }
            }
            seen.push(format!("{:?}", qb.query().unwrap().qp_state));
        }
        let mut mem = vec![0u8; 4096];
        b.mr.read(0, &mut mem).unwrap();
        seen.push(format!("{mem:?}"));
        seen
    };
    for profile in [Profile::Rxe, Profile::Full] {
        assert_eq!(run(profile, true), run(profile, false), "{profile:?}");
    }
}

#[test]
fn multicast_reaches_the_members_in_every_process() {
    let dir = HostDir::new();
    let (fa, fb) = (dir.fabric(Profile::Full), dir.fabric(Profile::Full));
    let (a, b) = (node_on(&fa.devices()[0], 4096), node_on(&fb.devices()[0], 4096));
    let c = node_on(&fa.devices()[1], 4096);
    let ud = |n: &Node| ud_qp(n, 5, 8);
    let (qa, qb, qc) = (ud(&a), ud(&b), ud(&c));
    let mut mgid = Gid::ZERO;
    mgid.0[0] = 0xff;
    mgid.0[15] = 9;
    qb.attach_mcast(&mgid, 0xc001).unwrap();
    qc.attach_mcast(&mgid, 0xc001).unwrap();
    let group =
        AhAttr { is_global: true, dgid: mgid, dlid: 0xc001, port_num: 1, ..Default::default() };
    let ah = a.pd.create_ah(&group).unwrap();
    for (q, n) in [(&qb, &b), (&qc, &c)] {
        for i in 0..2 {
            q.post_recv(&RecvWr { wr_id: i, sg_list: &[sge(&n.mr, 128 * i as usize, 100)] })
                .unwrap();
        }
    }
    a.mr.write(0, b"to the group").unwrap();
    qa.post_send(&SendWr::send_ud(1, &[sge(&a.mr, 0, 12)], &ah, 0xff_ffff, 5)).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    // The member in this process and the one in the other each get one copy.
    for n in [&b, &c] {
        let r = wait1(&n.cq);
        assert_eq!((r.wr_id, r.byte_len, r.src_qp), (0, 52, qa.qp_num()));
        let mut got = [0u8; 12];
        n.mr.read(40, &mut got).unwrap();
        assert_eq!(&got, b"to the group");
    }
    // Once the remote member leaves, it gets no copy: the next thing it receives is a
    // datagram sent to it alone after the group's (one peer's datagrams arrive in order).
    qb.detach_mcast(&mgid, 0xc001).unwrap();
    qa.post_send(&SendWr::send_ud(2, &[sge(&a.mr, 0, 12)], &ah, 0xff_ffff, 5)).unwrap();
    let ep = qb.endpoint(0);
    let direct =
        AhAttr { is_global: true, dgid: ep.gid, dlid: ep.lid, port_num: 1, ..Default::default() };
    let ah_b = a.pd.create_ah(&direct).unwrap();
    a.mr.write(16, b"just for b").unwrap();
    qa.post_send(&SendWr::send_ud(3, &[sge(&a.mr, 16, 10)], &ah_b, ep.qpn, 5)).unwrap();
    assert_eq!(wait_n(&a.cq, 2).len(), 2);
    assert_eq!(wait1(&c.cq).byte_len, 52, "the local member still gets the group's");
    let r = wait1(&b.cq);
    assert_eq!(r.byte_len, 50, "b's next datagram is the one sent to it alone");
    assert_empty(&b.cq);
}

/// A process's view of the XRC domain behind one file: a context on the second device, the
/// domain opened from the file, and memory for receives.
struct XrcSide {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    xrcd: Xrcd,
    mr: Mr,
}

fn xrc_side(f: &Fabric, file: FileId) -> XrcSide {
    let ctx = f.devices()[1].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, 0).unwrap();
    let xrcd = ctx.open_xrcd(Some(file), xrcd_oflags::CREAT).unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    XrcSide { ctx, pd, cq, xrcd, mr }
}

fn xrc_srq(s: &XrcSide, xrcd: &Xrcd) -> (Srq, u32) {
    let srq = xrcd.create_srq(&s.pd, &s.cq, &SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 });
    let srq = srq.unwrap();
    let n = srq.srq_num().unwrap();
    (srq, n)
}

#[test]
fn an_xrc_domain_opened_from_one_file_spans_processes() {
    let dir = HostDir::new();
    let (fa, fb, fc) =
        (dir.fabric(Profile::Full), dir.fabric(Profile::Full), dir.fabric(Profile::Full));
    let file: FileId = (0xfd00, 4242);
    let a = node_on(&fa.devices()[0], 4096);
    // The target QP lives in "process" b, the SRQ in "process" c; both opened the file.
    let (b, c) = (xrc_side(&fb, file), xrc_side(&fc, file));
    let (srq_c, n_c) = xrc_srq(&c, &c.xrcd);
    let (srq_b, n_b) = xrc_srq(&b, &b.xrcd);
    let p = RcParams { rnr_retry: 7, min_rnr_timer: 1, ..RcParams::default() };
    let pair = || {
        let ini = new_qp(&a.pd, &a.cq, QpType::XRC_SEND, 16, false);
        let tgt = b.xrcd.create_recv_qp().unwrap();
        connect(&ini, &tgt, &p, &p);
        (ini, tgt)
    };
    let (ini, tgt) = pair();
    // c shares the domain but cannot open b's target QP: not emulated, and says so.
    assert_eq!(c.xrcd.open_qp(tgt.qp_num()).unwrap_err().errno(), Errno::EOPNOTSUPP);
    let recv = |s: &Srq, side: &XrcSide, id: u64, len: usize| {
        let sg = [sge(&side.mr, 64 * id as usize, len)];
        s.post_recv(&RecvWr { wr_id: id, sg_list: &sg }).unwrap();
    };

    // No receive posted yet: RNR NAKs until there is one, then the SEND lands in c's SRQ with
    // b's target QP number, and a SEND behind it to b's own SRQ follows in order.
    a.mr.write(0, b"across!!").unwrap();
    let sg = [sge(&a.mr, 0, 8)];
    let send = |id, srqn, imm| SendWr::send(id, &sg).with_imm(imm).to_srq(srqn);
    ini.post_send(&send(1, n_c, 11).signaled()).unwrap();
    ini.post_send(&send(2, n_b, 22).signaled()).unwrap();
    recv(&srq_b, &b, 1, 64);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_empty(&b.cq); // the second SEND waits behind the first
    recv(&srq_c, &c, 1, 64);
    let r = wait1(&c.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len, r.imm_data), (1, WcStatus::SUCCESS, 8, 11));
    assert_eq!((r.qp_num, r.opcode), (tgt.qp_num(), WcOpcode::RECV));
    assert!(r.wc_flags.contains(WcFlags::WITH_IMM));
    let mut got = [0u8; 8];
    c.mr.read(64, &mut got).unwrap();
    assert_eq!(&got, b"across!!");
    let r = wait1(&b.cq);
    assert_eq!((r.wr_id, r.status, r.imm_data, r.qp_num), (1, WcStatus::SUCCESS, 22, tgt.qp_num()));
    let s: Vec<_> = wait_n(&a.cq, 2).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(s, vec![(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]);

    // A receive too small: LOC_LEN_ERR in c, an invalid request for the sender, and the target
    // QP in b goes to ERR.
    recv(&srq_c, &c, 2, 4);
    ini.post_send(&send(3, n_c, 0).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_INV_REQ_ERR);
    let r = wait1(&c.cq);
    assert_eq!((r.wr_id, r.status, r.qp_num), (2, WcStatus::LOC_LEN_ERR, tgt.qp_num()));
    assert_eq!(tgt.state(), QpState::ERR);

    // An SRQ of c outside the file's domain is not the target's to reach.
    let private = c.ctx.open_xrcd(None, xrcd_oflags::CREAT).unwrap();
    let (srq_p, n_p) = xrc_srq(&c, &private);
    recv(&srq_p, &c, 3, 64);
    let (ini, tgt) = pair();
    ini.post_send(&send(4, n_p, 0).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR);
    assert_eq!(tgt.state(), QpState::ERR);
    assert_empty(&c.cq);
}

#[test]
fn xrc_rdma_and_atomics_reach_the_memory_of_the_srqs_process() {
    let dir = HostDir::new();
    let (fa, fb, fc) =
        (dir.fabric(Profile::Full), dir.fabric(Profile::Full), dir.fabric(Profile::Full));
    let file: FileId = (0xfd00, 4343);
    let a = node_on(&fa.devices()[0], 1 << 20);
    // The target QP lives in "process" b; the SRQ, and so the PD that keys are checked
    // against, in "process" c.
    let (b, c) = (xrc_side(&fb, file), xrc_side(&fc, file));
    let (srq_c, n_c) = xrc_srq(&c, &c.xrcd);
    let big = c.pd.reg_mr(1 << 20, ALL_ACCESS).unwrap();
    let ini = new_qp(&a.pd, &a.cq, QpType::XRC_SEND, 16, false);
    let tgt = b.xrcd.create_recv_qp().unwrap();
    connect(&ini, &tgt, &RcParams::default(), &RcParams::default());
    let to_c = |wr: SendWr<'_>| ini.post_send(&wr.to_srq(n_c).signaled()).unwrap();
    let status = || wait1(&a.cq).status;

    // A WRITE larger than a ring record, and a READ of it back into other memory.
    const LEN: usize = 300_000;
    let data = pattern(7, LEN);
    a.mr.write(0, &data).unwrap();
    to_c(SendWr::write(1, &[sge(&a.mr, 0, LEN)], big.addr() + 100, big.rkey()));
    assert_eq!(status(), WcStatus::SUCCESS);
    let mut got = vec![0u8; LEN];
    big.read(100, &mut got).unwrap();
    assert!(got == data, "the WRITE landed in c's memory");
    to_c(SendWr::read(2, &[sge(&a.mr, 500_000, LEN)], big.addr() + 100, big.rkey()));
    assert_eq!(status(), WcStatus::SUCCESS);
    a.mr.read(500_000, &mut got).unwrap();
    assert!(got == data, "the READ brought c's memory back");

    // WRITE with immediate: the data lands and a receive of c's SRQ completes.
    let sg = [sge(&c.mr, 0, 64)];
    srq_c.post_recv(&RecvWr { wr_id: 9, sg_list: &sg }).unwrap();
    to_c(SendWr::write(3, &[sge(&a.mr, 0, 32)], big.addr(), big.rkey()).with_imm(0xabc));
    assert_eq!(status(), WcStatus::SUCCESS);
    let r = wait1(&c.cq);
    assert_eq!((r.wr_id, r.opcode, r.byte_len), (9, WcOpcode::RECV_RDMA_WITH_IMM, 32));
    assert_eq!((r.imm_data, r.qp_num), (0xabc, tgt.qp_num()));
    big.read(0, &mut got[..32]).unwrap();
    assert_eq!(got[..32], data[..32]);

    // Atomics execute once, in c's memory, and bring back what they found.
    big.write_u64(4096, 40).unwrap();
    to_c(SendWr::fetch_add(4, &[sge(&a.mr, 600_000, 8)], big.addr() + 4096, big.rkey(), 2));
    assert_eq!(status(), WcStatus::SUCCESS);
    assert_eq!((a.mr.read_u64(600_000).unwrap(), big.read_u64(4096).unwrap()), (40, 42));
    let sg = [sge(&a.mr, 600_008, 8)];
    to_c(SendWr::cmp_swap(5, &sg, big.addr() + 4096, big.rkey(), 42, 7));
    assert_eq!(status(), WcStatus::SUCCESS);
    assert_eq!((a.mr.read_u64(600_008).unwrap(), big.read_u64(4096).unwrap()), (42, 7));
    a.mr.write_u64(600_016, 0x1122_3344_5566_7788).unwrap();
    let sg = [sge(&a.mr, 600_016, 8)];
    to_c(SendWr::atomic_write(6, &sg, big.addr() + 4104, big.rkey()));
    assert_eq!(status(), WcStatus::SUCCESS);
    assert_eq!(big.read_u64(4104).unwrap(), 0x1122_3344_5566_7788);

    // A READ response lost on the way: the requester asks again, and the target QP reads
    // again through c.
    fb.set_faults(FaultRule::parse("drop:op=read-resp,nth=1").unwrap());
    to_c(SendWr::read(8, &[sge(&a.mr, 700_000, 8)], big.addr() + 4104, big.rkey()));
    assert_eq!(status(), WcStatus::SUCCESS);
    assert_eq!(a.mr.read_u64(700_000).unwrap(), 0x1122_3344_5566_7788);
    assert_eq!(fb.fault_hits(), vec![1]);

    // The rkey of memory in the target QP's own process is not in the SRQ's PD: a remote
    // access error, and the target QP fails.
    let bm = b.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    to_c(SendWr::write(7, &[sge(&a.mr, 0, 8)], bm.addr(), bm.rkey()));
    assert_eq!(status(), WcStatus::REM_ACCESS_ERR);
    assert_eq!(tgt.state(), QpState::ERR);
    assert_empty(&c.cq);
}

#[test]
fn ethernet_frames_reach_the_raw_qps_of_every_process_by_their_own_steering() {
    let dir = HostDir::new();
    let eth =
        || dir.fabric_with(FabricConfig { link_layer: LinkLayer::ETHERNET, ..Default::default() });
    let (fa, fb) = (eth(), eth());
    let a = raw_node(&fa.devices()[0], 0);
    let [b, b_low] = std::array::from_fn(|_| raw_node(&fb.devices()[0], 0));
    let a_sniff = raw_node(&fa.devices()[1], 0);
    for r in [&a, &b, &b_low, &a_sniff] {
        for i in 0..4 {
            post_recv(&r.qp, i, &[sge(&r.n.mr, 2048 * i as usize, 2048)]);
        }
    }
    let _fb = b.qp.create_flow(&mac_rule(MAC_B, 1)).unwrap();
    let _fb_low = b_low.qp.create_flow(&mac_rule(MAC_B, 2)).unwrap();
    let sniffer = FlowAttr { flow_type: FlowType::SNIFFER, specs: vec![], ..mac_rule(MAC_B, 0) };
    let _fs = a_sniff.qp.create_flow(&sniffer).unwrap();
    let count = |r: &Raw| std::iter::from_fn(|| r.n.cq.poll_one()).count();

    // To the other process, whole; its better priority traps it there, and the sniffer in
    // the sender's own process sees it too.
    let frame = ipv4_frame(MAC_B, [10, 0, 0, 1], 1000, [10, 0, 0, 2], 80);
    send(&a, &frame);
    let wc = wait1(&b.n.cq);
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (0, WcStatus::SUCCESS, WcOpcode::RECV));
    assert_eq!(wc.byte_len as usize, frame.len());
    assert!(wc.wc_flags.contains(WcFlags::IP_CSUM_OK), "checksums filled in by the sender");
    let mut got = vec![0u8; frame.len()];
    b.n.mr.read(0, &mut got).unwrap();
    assert_eq!((&got[..24], &got[54..]), (&frame[..24], &frame[54..]));
    assert_eq!(wait1(&a_sniff.n.cq).byte_len as usize, frame.len());

    // A frame no rule of the other process matches is dropped there.
    send(&a, &ipv4_frame(MAC_A, [10, 0, 0, 1], 1000, [10, 0, 0, 2], 80));
    assert_eq!(wait1(&a_sniff.n.cq).byte_len as usize, frame.len());

    // Back the other way: the other process's frame reaches a rule in this one, never the
    // QP that sent it.
    let _fa = a.qp.create_flow(&mac_rule(MAC_A, 0)).unwrap();
    let back = ipv4_frame(MAC_A, [10, 0, 0, 2], 80, [10, 0, 0, 1], 1000);
    send(&b_low, &back);
    let wc = wait1(&a.n.cq);
    assert_eq!((wc.wr_id, wc.byte_len as usize), (0, back.len()));
    assert_eq!(wait1(&a_sniff.n.cq).byte_len as usize, back.len());
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!([count(&a), count(&b), count(&b_low), count(&a_sniff)], [0, 0, 0, 0]);
}

/// A node numbers its QPs within its slot (`slot << 16 | n`): the device reports that many as
/// `max_qp` on a host fabric, and exactly that many can be created (in one process, the
/// profile's figure stands).
#[test]
fn max_qp_on_a_host_fabric_is_what_a_node_can_create() {
    let dir = HostDir::new();
    let f = dir.fabric(Profile::Rxe);
    let dev = &f.devices()[0];
    let max = dev.attr().max_qp;
    assert_eq!(max, 65_535);
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1, None, 0).unwrap();
    let qps: Vec<Qp> = (0..max).map(|_| new_qp(&pd, &cq, QpType::UD, 1, false)).collect();
    let attr = QpInitAttr {
        qp_type: QpType::UD,
        send_cq: &cq,
        recv_cq: &cq,
        cap: cap(1),
        sq_sig_all: false,
        srq: None,
        max_tso_header: 0,
        create_flags: QpCreateFlags::empty(),
    };
    assert_eq!(pd.create_qp(&attr).unwrap_err().errno(), Errno::ENOMEM);
    drop(qps);
    let alone =
        Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    assert_eq!(alone.devices()[0].attr().max_qp, 1_048_560);
}

/// Tag matching's rendezvous between processes: the receiving node's QP reads the sender's
/// buffer across the host fabric into the tag's, and its FIN comes back.
#[test]
fn a_tag_matching_rendezvous_reads_across_processes() {
    let dir = HostDir::new();
    let (fa, fb) = (dir.fabric(Profile::Full), dir.fabric(Profile::Full));
    let a = node_on(&fa.devices()[0], 1 << 16);
    let b = node_on(&fb.devices()[0], 1 << 16);
    let tm_cq = b.ctx.create_cq(8, None, 0).unwrap();
    let attr = SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 };
    let srq = b.pd.create_srq_tm(&attr, 4, &tm_cq).unwrap();
    let qp = b
        .pd
        .create_qp(&QpInitAttr { srq: Some(&srq), ..QpInitAttr::new(QpType::RC, &b.cq, cap(8)) })
        .unwrap();
    connect(&a.qp, &qp, &RcParams::default(), &RcParams::default());
    let sg = [sge(&b.mr, 0, 8192)];
    let add = SrqOpKind::AddTag { tag: 0x77, mask: u64::MAX, recv_wr_id: 5, sg_list: &sg };
    srq.post_ops(&[SrqOp { wr_id: 1, kind: add, signaled: false, sync: None }]).unwrap();
    let data = pattern(3, 8192);
    a.mr.write(16384, &data).unwrap();
    post_recv(&a.qp, 90, &[sge(&a.mr, 32768, 64)]);
    let mut m = vec![tmh::RNDV, 0, 0, 0, 0, 0, 0, 4];
    m.extend_from_slice(&0x77u64.to_be_bytes());
    m.extend_from_slice(&(a.mr.addr() + 16384).to_be_bytes());
    m.extend_from_slice(&a.mr.rkey().to_be_bytes());
    m.extend_from_slice(&8192u32.to_be_bytes());
    a.mr.write(0, &m).unwrap();
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, m.len())]).signaled()).unwrap();
    let matched = wait1(&b.cq);
    assert_eq!((matched.wr_id, matched.wc_flags), (5, WcFlags::TM_MATCH));
    let landed = wait1(&b.cq);
    assert_eq!((landed.wr_id, landed.status, landed.byte_len), (5, WcStatus::SUCCESS, 8192));
    assert_eq!(landed.wc_flags, WcFlags::TM_DATA_VALID);
    let mut got = vec![0u8; 8192];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == data, "the rendezvous READ brought the sender's bytes");
    let mut ids: Vec<u64> = wait_n(&a.cq, 2).iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, [2, 90], "the SEND completed and the FIN arrived");
    let mut fin = [0u8; 1];
    a.mr.read(32768, &mut fin).unwrap();
    assert_eq!(fin[0], tmh::FIN);
}

/// A port pulled host-wide stays down for processes that join the fabric afterwards (as on a
/// host whose cable was pulled before they started), and comes up for all when plugged back.
#[test]
fn a_port_pulled_host_wide_is_down_for_processes_that_join_later() {
    let dir = HostDir::new();
    let state = |f: &Fabric| f.devices()[0].query_port(1).unwrap().state;
    let fa = dir.fabric(Profile::Full);
    let _ca = fa.devices()[0].open().unwrap();
    assert_eq!(fa.devices()[0].set_port_state_host_wide(1, PortState::DOWN).unwrap(), 0);
    assert_eq!(state(&fa), PortState::DOWN);

    let fb = dir.fabric(Profile::Full);
    let cb = fb.devices()[0].open().unwrap();
    assert_eq!(state(&fb), PortState::DOWN, "a process that joins later finds the port pulled");
    assert_eq!(fb.devices()[0].query_port(1).unwrap().phys_state, 3, "Disabled");
    assert_eq!(state(&fa), PortState::DOWN);
    assert_eq!(fb.devices()[1].query_port(1).unwrap().state, PortState::ACTIVE, "other devices");

    assert_eq!(fa.devices()[0].set_port_state_host_wide(1, PortState::ACTIVE).unwrap(), 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while state(&fb) != PortState::ACTIVE {
        assert!(std::time::Instant::now() < deadline, "the plug never reached the other fabric");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let ev = cb.get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::PORT_ACTIVE, "the plug is an event where it was down");
    let fc = dir.fabric(Profile::Full);
    let _cc = fc.devices()[0].open().unwrap();
    assert_eq!(state(&fc), PortState::ACTIVE, "plugged back, it is up for later processes too");
}
