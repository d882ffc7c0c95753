//! The host fabric against hostile peers: other users, and processes of the same user that
//! send what no node of ours would. Each test shows the victim process unharmed (no crash, no
//! byte of memory it did not offer) and the message dropped and counted.
//!
//! Some peers must be other processes: `cat` run as another user (when the tests run as
//! root), or this test binary run again as [`hostile_child`].

use std::{
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::{net::UnixDatagram, process::CommandExt},
    },
    path::PathBuf,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use super::host::{FIRST, LAST, RING, SHARED, frame, sock_name};
use crate::{
    ipc::ring::{self, Ring},
    mem::MemRegion,
    packet::{Kind, MemRef, Packet, Payload, WIRE_KINDS},
    wire::Encoded,
    *,
};

const QKEY: u32 = 0x1234;
/// The slot the hostile peers claim.
const LIAR: u8 = 200;
/// The victims' QPs: a few WRs of one SGE.
const CAP: QpCap =
    QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };

/// A process on a host fabric with a UD QP that has a receive posted over a registered buffer.
struct Victim {
    dir: PathBuf,
    fabric: Fabric,
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

impl Victim {
    fn new(tag: &str) -> Victim {
        let dir =
            std::env::temp_dir().join(format!("rdma-emu-hostile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let host = Some(dir.to_str().unwrap().to_owned());
        let fabric = Fabric::new(FabricConfig { host, ..Default::default() });
        let ctx = fabric.devices()[0].open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None, 0).unwrap();
        let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::UD, &cq, CAP)).unwrap();
        ready(&qp);
        let v = Victim { dir, fabric, qp, cq, mr };
        for i in 0..2 {
            v.post_recv(i);
        }
        v
    }

    fn post_recv(&self, i: u64) {
        let sge = Sge { addr: self.mr.addr() + 1024 * i, length: 1024, lkey: self.mr.lkey() };
        self.qp.post_recv(&RecvWr { wr_id: i, sg_list: &[sge] }).unwrap();
    }

    fn sock(&self) -> PathBuf {
        self.dir.join(sock_name((self.qp.qp_num() >> 16) as u8))
    }

    fn drops(&self) -> HostDrops {
        self.fabric.host_drops().expect("joined")
    }

    /// Waits (a bounded guard, not a timing assertion) until `done` holds for the drops.
    fn until(&self, done: impl Fn(HostDrops) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(self.drops()) {
            assert!(Instant::now() < deadline, "gave up waiting: {:?}", self.drops());
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The next completion, if one comes within a second.
    fn completion(&self) -> Option<Wc> {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if let Some(wc) = self.cq.poll_one() {
                return Some(wc);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// A UD SEND of `b` to our QP, framed.
    fn bytes(&self, b: &[u8]) -> Vec<u8> {
        let pkt = self.send(Payload::Bytes(b.into()));
        framed(&pkt, &Encoded::packet(&pkt))
    }

    /// A UD SEND to our QP.
    fn send(&self, payload: Payload) -> Packet {
        let mut p = Packet::new(Kind::Send);
        p.transport = crate::QpType::UD;
        (p.dst_qpn, p.qkey, p.src_qpn) = (self.qp.qp_num(), QKEY, u32::from(LIAR) << 16 | 1);
        p.len = payload.pieces().map(|p| p.len() as u32).sum();
        p.payload = payload;
        p
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Takes a UD QP from RESET to RTS.
fn ready(qp: &Qp) {
    use QpAttrMask as M;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: QKEY, ..Default::default() };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::RTS, ..Default::default() }, M::STATE | M::SQ_PSN)
        .unwrap();
}

/// `pkt` as one datagram (or ring record) from the slot [`LIAR`].
fn framed(pkt: &Packet, e: &Encoded<'_>) -> Vec<u8> {
    let mut body = vec![0; e.len()];
    e.copy_to(0, &mut body).unwrap();
    frame(LIAR, FIRST | LAST, body.len() as u32, 0, pkt.dst_qpn, &body)
}

/// A message whose payload is to be read from process `pid` at `addr` (`len` bytes).
fn pulled(v: &Victim, pid: u32, addr: u64, len: usize) -> Vec<u8> {
    let region = Arc::new(MemRegion::owned(len));
    let pkt = v.send(Payload::One(MemRef { region, offset: 0, len }));
    let mut d = framed(&pkt, &Encoded::pulled(&pkt, std::process::id()));
    // The message ends with the process, the count of ranges, and each range's address,
    // length and shared memory: name whatever process and address we like.
    let n = d.len();
    d[n - 28..n - 24].copy_from_slice(&pid.to_le_bytes());
    d[n - 20..n - 12].copy_from_slice(&addr.to_le_bytes());
    d
}

fn am_root() -> bool {
    // A file only root may create tells without calling geteuid (unsafe here).
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

#[test]
fn test_a_process_of_another_user_is_not_heard() {
    if !am_root() {
        eprintln!("skipped: needs root to run a process as another user");
        return;
    }
    let v = Victim::new("foreign");
    let d = v.bytes(b"from uid 65534");
    let file = v.dir.with_extension("frame");
    std::fs::write(&file, &d).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    // The socket is reached by a descriptor opened for the other user, as it would be had the
    // directory let them in; the kernel names the sender whatever it sends.
    let sock = UnixDatagram::unbound().unwrap();
    sock.connect(v.sock()).unwrap();
    let status = Command::new("cat")
        .arg(&file)
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::from(OwnedFd::from(sock)))
        .status()
        .unwrap();
    assert!(status.success());
    v.until(|d| d.foreign == 1);
    assert_eq!(v.completion().map(|wc| wc.wr_id), None, "the other user's SEND was dropped");
    // The same datagram from this user lands: the one above was refused for its sender alone.
    let sock = UnixDatagram::unbound().unwrap();
    sock.send_to(&d, v.sock()).unwrap();
    let wc = v.completion().expect("delivered");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::SUCCESS, 40 + 14));
    let mut got = [0u8; 14];
    v.mr.read(40, &mut got).unwrap();
    assert_eq!(&got, b"from uid 65534");
    let _ = std::fs::remove_file(file);
}

#[test]
fn test_a_directory_another_user_made_first_keeps_us_out() {
    if !am_root() {
        eprintln!("skipped: needs root to make a directory of another user");
        return;
    }
    // A shared place like /tmp, where another user made our `rdma-emu-<uid>` before we did.
    let shared = std::env::temp_dir().join(format!("rdma-emu-hostile-pre-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&shared);
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
        .unwrap();
    let theirs = shared.join("rdma-emu-0");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let host = Some(theirs.join("default").to_str().unwrap().to_owned());
    let fabric = Fabric::new(FabricConfig { host, ..Default::default() });
    let ctx = fabric.devices()[0].open().unwrap();
    let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(4, None, 0).unwrap());
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let e = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap)).unwrap_err();
    assert_eq!(e.errno(), Errno::EACCES);
    assert!(!theirs.join("default").exists(), "nothing of ours was made in their directory");
    assert_eq!(fabric.host_drops(), None);
    std::fs::remove_dir_all(&shared).unwrap();
}

/// Runs as the hostile process of [`test_a_payload_is_read_only_from_the_process_that_sent_it`]
/// when that test starts this binary again; does nothing otherwise.
#[test]
fn hostile_child() {
    let Ok(args) = std::env::var("RDMA_EMU_HOSTILE_CHILD") else { return };
    let a: Vec<u64> = args.split(',').map(|x| x.parse().unwrap()).collect();
    // The victim's socket is our standard input.
    let (sock, victim_pid, secret, v_qpn) = (0, a[0] as u32, a[1], a[2] as u32);
    // Our own buffer, which we may well let the victim read; and its secret, which we may not.
    let mine = b"legit: my own memory".to_vec();
    let me = std::process::id();
    let send = |payload| {
        let mut p = Packet::new(Kind::Send);
        p.transport = crate::QpType::UD;
        (p.dst_qpn, p.qkey, p.src_qpn) = (v_qpn, QKEY, u32::from(LIAR) << 16 | 1);
        p.len = mine.len() as u32;
        p.payload = payload;
        p
    };
    let ring = Ring::create(1 << 16, false).unwrap();
    for (pid, addr) in [(me, mine.as_ptr() as u64), (victim_pid, secret)] {
        let region = Arc::new(MemRegion::owned(mine.len()));
        let pkt = send(Payload::One(MemRef { region, offset: 0, len: mine.len() }));
        let mut d = framed(&pkt, &Encoded::pulled(&pkt, std::process::id()));
        let n = d.len();
        d[n - 28..n - 24].copy_from_slice(&pid.to_le_bytes());
        d[n - 20..n - 12].copy_from_slice(&addr.to_le_bytes());
        let w = ring.write(d.len(), |b| {
            b.copy_from_slice(&d);
            true
        });
        assert_eq!(w, ring::Written::Done);
    }
    crate::sys::send_with_fd(sock, &frame(LIAR, RING, 0, 0, 0, &[]), ring.fd()).unwrap();
    // Stay alive while the victim reads: it must not think us gone.
    std::thread::sleep(Duration::from_secs(5));
    drop(mine);
}

#[test]
fn test_a_payload_is_read_only_from_the_process_that_sent_it() {
    let v = Victim::new("deputy");
    // Memory the victim never registered, at an address the peer learnt somehow.
    let secret = b"the victim's secret, not offered".to_vec();
    let sock = UnixDatagram::unbound().unwrap();
    sock.connect(v.sock()).unwrap();
    let args = format!("{},{},{}", std::process::id(), secret.as_ptr() as u64, v.qp.qp_num());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "fabric::hostile_tests::hostile_child", "--nocapture"])
        .env("RDMA_EMU_HOSTILE_CHILD", args)
        .stdin(Stdio::from(OwnedFd::from(sock)))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    v.until(|d| d.pulls == 1);
    // The peer's own memory came across; the secret it named in our process did not.
    let wc = v.completion().expect("the honest message");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::SUCCESS, 40 + 20));
    let mut got = [0u8; 20];
    v.mr.read(1024 * wc.wr_id as usize + 40, &mut got).unwrap();
    assert_eq!(&got, b"legit: my own memory");
    assert_eq!(v.completion().map(|wc| wc.wr_id), None, "nothing else arrived");
    let mut all = vec![0u8; 4096];
    v.mr.read(0, &mut all).unwrap();
    assert!(!all.windows(12).any(|w| w == &secret[..12]), "the secret never reached the MR");
    let _ = child.kill();
    let _ = child.wait();
}

/// Shared memory offered by a peer is mapped only when its file can never fault a read of it
/// (sealed against shrinking) and is the size the peer says.
#[test]
fn test_shared_memory_that_could_fault_its_reader_is_refused() {
    let v = Victim::new("shared");
    let sock = UnixDatagram::unbound().unwrap();
    sock.connect(v.sock()).unwrap();
    let ring = Ring::create(1 << 16, false).unwrap();
    crate::sys::send_with_fd(sock.as_raw_fd(), &frame(LIAR, RING, 0, 0, 0, &[]), ring.fd())
        .unwrap();
    let offer = |fd: &OwnedFd, len: u64| {
        let mut body = [0u8; 20];
        body[..4].copy_from_slice(&1u32.to_le_bytes());
        body[4..12].copy_from_slice(&0x10_0000u64.to_le_bytes());
        body[12..].copy_from_slice(&len.to_le_bytes());
        let d = frame(LIAR, SHARED, 0, 0, 0, &body);
        crate::sys::send_with_fd(sock.as_raw_fd(), &d, fd.as_raw_fd()).unwrap();
    };
    let unsealed = crate::sys::memfd_unsealed(c"hostile", 1 << 16).unwrap();
    offer(&unsealed, 1 << 16);
    v.until(|d| d.rings == 1);
    let sealed = crate::sys::memfd(c"hostile", 1 << 16).unwrap();
    offer(&sealed, 1 << 20);
    v.until(|d| d.rings == 2);
    // The same file offered as what it is is taken (it is no drop), before what follows.
    offer(&sealed, 1 << 16);
    let d = v.bytes(b"still up");
    sock.send(&d).unwrap();
    let wc = v.completion().expect("the victim lives on and still takes messages");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::SUCCESS, 40 + 8));
    assert_eq!(v.drops().rings, 2);
}

#[test]
fn test_a_ring_that_its_writer_could_shrink_is_refused() {
    let v = Victim::new("shrink");
    // A well-formed ring in a file its writer can still cut short under the reader.
    let good = Ring::create(1 << 16, false).unwrap();
    let bytes = std::fs::read(format!("/proc/self/fd/{}", good.fd())).unwrap();
    let bad = crate::sys::memfd_unsealed(c"hostile", bytes.len()).unwrap();
    let path = format!("/proc/self/fd/{}", bad.as_raw_fd());
    std::fs::write(&path, &bytes).unwrap();
    let sock = UnixDatagram::unbound().unwrap();
    sock.connect(v.sock()).unwrap();
    crate::sys::send_with_fd(sock.as_raw_fd(), &frame(LIAR, RING, 0, 0, 0, &[]), bad.as_raw_fd())
        .unwrap();
    // Once the victim has had its look (it refused the ring, or mapped it and said whether it
    // may read us), cut the file to nothing under its mapping and make it read again.
    let deadline = Instant::now() + Duration::from_secs(10);
    let looked = || {
        let header = std::fs::read(&path).unwrap_or_default();
        header.get(40) == Some(&1) || v.drops().rings == 1
    };
    while !looked() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    std::fs::File::options().write(true).open(&path).unwrap().set_len(0).unwrap();
    let d = v.bytes(b"still up");
    sock.send(&d).unwrap();
    let wc = v.completion().expect("the victim lives on and still takes messages");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::SUCCESS, 40 + 8));
    assert_eq!(v.drops().rings, 1);
}

#[test]
fn test_a_pulled_payload_that_comes_without_a_ring_is_refused() {
    let v = Victim::new("datagram-pull");
    let secret = b"not for the datagram".to_vec();
    let d = pulled(&v, std::process::id(), secret.as_ptr() as u64, secret.len());
    UnixDatagram::unbound().unwrap().send_to(&d, v.sock()).unwrap();
    v.until(|d| d.pulls == 1);
    assert_eq!(v.completion().map(|wc| wc.wr_id), None);
}

/// A deterministic generator (splitmix64) for the storms below and the wire port's, so a
/// failing run replays.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A word a hostile peer would try: 0, 1, a boundary, or random.
    fn word(&mut self) -> u32 {
        [0, 1, 0x7fff_ffff, u32::MAX, 1 << 20, 64 * 1024, self.next() as u32][self.below(7)]
    }
}

/// The RC QP of [`Victim::with_rc`]: connected to a QP of the hostile slot.
const LIAR_QPN: u32 = (LIAR as u32) << 16 | 2;

impl Victim {
    /// A victim that also has an RC QP connected to [`LIAR_QPN`], with an MR a peer may write,
    /// and the lock of the hostile slot, held as its node would hold it (returned with them:
    /// let go, the victim's watcher finds the slot's node dead and moves the QP to ERR, even
    /// between the connect's RTR and RTS, which then fails).
    fn with_rc(tag: &str) -> (Victim, Qp, Mr, std::fs::File) {
        let v = Victim::new(tag);
        let lock = std::fs::File::create(v.dir.join(super::host::lock_name(LIAR))).unwrap();
        lock.lock().unwrap();
        let rc = crate::engine::testkit::side(&v.fabric.devices()[0]);
        let ep = v.qp.endpoint(0);
        let liar = Endpoint { qpn: LIAR_QPN, lid: ep.lid, gid: ep.gid, psn: 100 };
        rc.qp.connect(0, &liar, &RcParams::default()).unwrap();
        (v, rc.qp, rc.mr, lock)
    }

    /// Valid frames to mangle: UD SENDs of many sizes to the UD QP, and requests of every
    /// kind to the RC QP `rc` (WRITEs and atomics naming `mr`).
    fn seeds(&self, rng: &mut Rng, rc: u32, mr: &Mr) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for len in [0, 1, 40, 1000, 1024, 3000] {
            out.push(self.bytes(&vec![0xab; len]));
        }
        let kinds = WIRE_KINDS.into_iter().chain([Kind::XrcDeliver, Kind::XrcResult]);
        for kind in kinds {
            for _ in 0..3 {
                let mut p = Packet::new(kind);
                p.transport = crate::QpType::RC;
                (p.dst_qpn, p.src_qpn) = (rc, LIAR_QPN);
                p.psn = [0, 1, 100, rng.next() as u32 & 0xff_ffff][rng.below(4)];
                p.npkts = rng.word().max(1);
                (p.va, p.rkey) = (mr.addr() + rng.below(5000) as u64, mr.rkey());
                let payload = vec![0xcd; [0, 8, 100, 5000][rng.below(4)]];
                p.len = payload.len() as u32;
                p.payload = Payload::Bytes(payload.into());
                out.push(framed(&p, &Encoded::packet(&p)));
            }
        }
        out
    }
}

/// `seed` as a hostile peer would break it: cut short, grown, bytes flipped, header or body
/// words replaced with boundary values, the sending slot or flags changed, or pure noise.
fn mangle(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut d = seed.to_vec();
    match rng.below(8) {
        0 => d.truncate(rng.below(d.len() + 1)),
        1 => d.extend((0..rng.below(4096)).map(|_| rng.next() as u8)),
        2 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(d.len().max(1));
                if let Some(b) = d.get_mut(i) {
                    *b ^= 1 << rng.below(8);
                }
            }
        }
        3 => {
            // total, offset or destination QPN of the frame header.
            let at = 8 + 4 * rng.below(3);
            let w = rng.word();
            d[at..at + 4].copy_from_slice(&w.to_le_bytes());
        }
        4 if d.len() >= 24 => {
            let at = 20 + rng.below(d.len() - 23);
            let w = rng.word();
            d[at..at + 4].copy_from_slice(&w.to_le_bytes());
        }
        5 => d[4] = rng.next() as u8, // another slot: ours, another node's, or none
        6 => d[5] = rng.next() as u8, // fragment and ring flags
        _ => d = (0..rng.below(2048)).map(|_| rng.next() as u8).collect(),
    }
    d
}

/// After a storm, the victim takes a well-formed message and its memory outside what it
/// offered is untouched.
fn still_serves(v: &Victim, rc_mr: &Mr) {
    let sock = UnixDatagram::unbound().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let wc = 'serve: loop {
        // The storm's well-formed SENDs may have used the receives, or (one too long for its
        // buffer) put the UD QP in ERR, as rxe does: start it over. Datagrams of the storm
        // still queued ahead of ours may do so again: a receive one takes is posted again,
        // and an error starts over.
        let reset = QpAttr { qp_state: QpState::RESET, ..Default::default() };
        v.qp.modify(&reset, QpAttrMask::STATE).unwrap();
        ready(&v.qp);
        while v.cq.poll_one().is_some() {}
        v.post_recv(0);
        v.post_recv(1);
        sock.send_to(&v.bytes(b"after the storm"), v.sock()).unwrap();
        let again = Instant::now() + Duration::from_secs(1);
        while Instant::now() < again {
            match v.cq.poll_one() {
                Some(wc) if wc.status == WcStatus::SUCCESS && wc.byte_len == 40 + 15 => {
                    break 'serve wc;
                }
                Some(wc) if wc.status == WcStatus::SUCCESS => v.post_recv(wc.wr_id),
                Some(_) => continue 'serve,
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        assert!(Instant::now() < deadline, "no completion: {:?}", v.drops());
    };
    let mut got = [0u8; 15];
    v.mr.read(1024 * wc.wr_id as usize + 40, &mut got).unwrap();
    assert_eq!(&got, b"after the storm");
    // The UD buffer beyond its two receives was never offered to anyone.
    let mut rest = vec![0u8; 2048];
    v.mr.read(2048, &mut rest).unwrap();
    assert!(rest.iter().all(|&b| b == 0), "bytes no receive offered were written");
    // The RC MR is the peer's to write; it is still there and readable.
    let mut word = [0u8; 8];
    rc_mr.read(0, &mut word).unwrap();
}

#[test]
fn test_a_storm_of_mangled_datagrams_is_dropped_and_counted() {
    let (v, rc, rc_mr, _liar) = Victim::with_rc("storm");
    let mut rng = Rng(0x5eed);
    let seeds = v.seeds(&mut rng, rc.qp_num(), &rc_mr);
    let sock = UnixDatagram::unbound().unwrap();
    for i in 0..4000 {
        let seed = &seeds[rng.below(seeds.len())];
        let d = mangle(&mut rng, seed);
        // Replays too: every tenth datagram goes twice.
        for _ in 0..1 + usize::from(i % 10 == 0) {
            // A full socket buffer only slows the storm down.
            while sock.send_to(&d, v.sock()).is_err() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    v.until(|d| d.malformed > 0);
    still_serves(&v, &rc_mr);
    drop(rc);
}

#[test]
fn test_a_ring_of_mangled_records_and_corrupted_indices_is_dropped() {
    let (v, rc, rc_mr, _liar) = Victim::with_rc("ring-storm");
    let mut rng = Rng(0xbad_5eed);
    let seeds = v.seeds(&mut rng, rc.qp_num(), &rc_mr);
    let ring = Ring::create(1 << 16, false).unwrap();
    let sock = UnixDatagram::unbound().unwrap();
    sock.connect(v.sock()).unwrap();
    crate::sys::send_with_fd(sock.as_raw_fd(), &frame(LIAR, RING, 0, 0, 0, &[]), ring.fd())
        .unwrap();
    let bell = frame(LIAR, super::host::BELL, 0, 0, 0, &[]);
    for _ in 0..50 {
        for _ in 0..20 {
            let i = rng.below(seeds.len());
            let rec = mangle(&mut rng, &seeds[i]);
            let len = rec.len().min(ring.max_record());
            let _ = ring.write(len, |b| {
                b.copy_from_slice(&rec[..len]);
                true
            });
        }
        let _ = sock.send(&bell);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Then the indices themselves: the reader must not trust them.
    let path = format!("/proc/self/fd/{}", ring.fd());
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    let (tail, head) = (ring::TAIL_AT as u64, ring::HEAD_AT as u64);
    for (at, value) in [(tail, u64::MAX - 7), (head, 1 << 40), (tail, 3)] {
        std::os::unix::fs::FileExt::write_all_at(&file, &value.to_le_bytes(), at).unwrap();
        let _ = sock.send(&bell);
    }
    // The corrupted tail breaks the ring, which the victim drops: only then has it taken in
    // the storm's last well-formed records, which would otherwise take the receives (or put
    // the QP in ERR) that the message after the storm needs.
    let node = v.fabric.0.node.get().expect("joined");
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.rings_settled() != 0 {
        assert!(Instant::now() < deadline, "the broken ring was kept: {:?}", v.drops());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(v.drops().malformed > 0);
    still_serves(&v, &rc_mr);
    drop(rc);
}
