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

use super::{
    host::{FIRST, LAST, RING, frame, sock_name},
    ring::Ring,
    wire::Encoded,
};
use crate::{
    engine::packet::{Kind, MemRef, Packet, Payload},
    mem::MemRegion,
    *,
};

const QKEY: u32 = 0x1234;
/// The slot the hostile peers claim.
const LIAR: u8 = 200;

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
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_qp(&QpInitAttr::new(QpType::UD, &cq, cap)).unwrap();
        use QpAttrMask as M;
        let init =
            QpAttr { qp_state: QpState::INIT, port_num: 1, qkey: QKEY, ..Default::default() };
        qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
        qp.modify(&QpAttr { qp_state: QpState::RTR, ..Default::default() }, M::STATE).unwrap();
        qp.modify(&QpAttr { qp_state: QpState::RTS, ..Default::default() }, M::STATE | M::SQ_PSN)
            .unwrap();
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
    let mut d = framed(&pkt, &Encoded::pulled(&pkt));
    // The message ends with the process, the count of ranges, and each range's address and
    // length: name whatever process and address we like.
    let n = d.len();
    d[n - 24..n - 20].copy_from_slice(&pid.to_le_bytes());
    d[n - 16..n - 8].copy_from_slice(&addr.to_le_bytes());
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
    let ring = Ring::create(1 << 16).unwrap();
    for (pid, addr) in [(me, mine.as_ptr() as u64), (victim_pid, secret)] {
        let region = Arc::new(MemRegion::owned(mine.len()));
        let pkt = send(Payload::One(MemRef { region, offset: 0, len: mine.len() }));
        let mut d = framed(&pkt, &Encoded::pulled(&pkt));
        let n = d.len();
        d[n - 24..n - 20].copy_from_slice(&pid.to_le_bytes());
        d[n - 16..n - 8].copy_from_slice(&addr.to_le_bytes());
        let w = ring.write(d.len(), |b| {
            b.copy_from_slice(&d);
            true
        });
        assert_eq!(w, super::ring::Written::Done);
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

#[test]
fn test_a_ring_that_its_writer_could_shrink_is_refused() {
    let v = Victim::new("shrink");
    // A well-formed ring in a file its writer can still cut short under the reader.
    let good = Ring::create(1 << 16).unwrap();
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
