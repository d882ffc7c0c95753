//! What a node lets its peers do for it while it cannot: the memory regions it registered for
//! remote access and the RC and UC QPs that may be written or read through them, in a shared
//! file that its peers map read-only.
//!
//! A process stopped by SIGSTOP or a debugger takes in nothing (its reader thread is frozen);
//! a NIC would go on answering for it. So a peer that finds the process stopped carries out an
//! RDMA WRITE or READ of its own itself ([`place`]): it checks the request against these tables
//! as the responder would (the QP's state, its peer, its access; the rkey's region, PD, rights
//! and range), then writes or reads the stopped process's memory with process_vm_writev/readv,
//! and marks the request's ring record carried out, so that the stopped process only accounts
//! for it (its PSN) once it continues.
//!
//! Entries are written by this process only, each under a sequence count that is odd while it
//! changes; a reader that finds the count odd or moved takes the entry as absent. Before this
//! process lets memory go (deregistering an MR), it withdraws the entry and waits until no
//! peer is inside a request that may have found it: a peer raises the gate of its ring to us
//! before it looks ([`Ring::set_gate`]), and looks only while it is raised.
#![allow(unsafe_code)]

use std::{
    io,
    os::fd::{AsRawFd, OwnedFd, RawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering, fence},
};

use crate::sync::Mutex;
use rustc_hash::FxHashMap;

use super::ring::Ring;
use crate::{
    mem::PeerProcess,
    sys::FileMapping,
    types::{AccessFlags, QpState, QpType},
};

const MAGIC: u64 = u64::from_le_bytes(*b"REMUEXP1");
const HEADER: usize = 4096;
/// One entry per QP number of a node (its low 16 bits).
const QP_SLOTS: usize = 1 << 16;
const QP_WORDS: usize = 4;
/// MRs are found by their key, in this many slots (a few probed per key): an MR that finds
/// none free is not offered (its requests wait for the process, as before).
const MR_SLOTS: usize = 1 << 14;
const MR_WORDS: usize = 8;
const MR_PROBES: usize = 8;
const QP_AT: usize = HEADER;
const MR_AT: usize = QP_AT + QP_SLOTS * QP_WORDS * 8;
/// The file's size: its pages are allocated only as entries are written.
const BYTES: usize = MR_AT + MR_SLOTS * MR_WORDS * 8;

/// What a peer may know of one of our QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpExport {
    pub(crate) qpn: u32,
    pub(crate) dest_qpn: u32,
    pub(crate) dev: u32,
    pub(crate) state: QpState,
    pub(crate) qp_type: QpType,
    pub(crate) access: AccessFlags,
    /// The PD, as a number only this process gives it (its address).
    pub(crate) pd: u64,
}

/// What a peer may know of one of our MRs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MrExport {
    pub(crate) dev: u32,
    pub(crate) rkey: u32,
    pub(crate) access: AccessFlags,
    pub(crate) pd: u64,
    pub(crate) iova: u64,
    pub(crate) len: u64,
    /// Where its first byte lies in this process.
    pub(crate) host: u64,
    /// The name of the shared memory its pages were moved into (0: none; see
    /// `crate::shared_mem`): a peer that has a view of it writes there.
    pub(crate) shared: u32,
}

impl MrExport {
    /// The address in the owner's process of `[va, va + len)`, if it lies in the MR.
    fn host_of(&self, va: u64, len: u64) -> Option<u64> {
        let off = va.checked_sub(self.iova)?;
        (off.checked_add(len)? <= self.len).then(|| self.host.wrapping_add(off))
    }
}

/// A shared mapping of an exports file.
#[derive(Debug)]
struct Mapping {
    base: NonNull<u8>,
    _file: FileMapping,
}

// SAFETY: the mapping lives as long as the value and is only accessed through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// The file's `BYTES` (the caller checked or set its size), writable if `write`.
    fn map(fd: RawFd, write: bool) -> io::Result<Mapping> {
        let (file, base) =
            FileMapping::map(fd, 0, BYTES, write).map_err(io::Error::from_raw_os_error)?;
        let base = NonNull::new(base).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(Mapping { base, _file: file })
    }

    /// The 8-byte word at byte offset `at` (8-aligned, below `BYTES`).
    fn word(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at.is_multiple_of(8) && at < BYTES);
        // SAFETY: inside the page-aligned mapping, which outlives `&self`; shared words are
        // only ever accessed atomically.
        unsafe { &*self.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// Reads the `N` words of the entry at `at` if no write was under way meanwhile.
    fn read<const N: usize>(&self, at: usize) -> Option<[u64; N]> {
        let seq = self.word(at).load(Ordering::SeqCst);
        if !seq.is_multiple_of(2) {
            return None;
        }
        let mut w = [0u64; N];
        for (i, v) in w.iter_mut().enumerate().skip(1) {
            *v = self.word(at + 8 * i).load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        (self.word(at).load(Ordering::Relaxed) == seq).then_some(w)
    }

    /// Writes the words of the entry at `at` (the first is its sequence count).
    fn write(&self, at: usize, words: &[u64]) {
        let seq = self.word(at);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s | 1, Ordering::SeqCst);
        fence(Ordering::Release);
        for (i, v) in words.iter().enumerate().skip(1) {
            self.word(at + 8 * i).store(*v, Ordering::Relaxed);
        }
        seq.store((s | 1) + 1, Ordering::SeqCst);
    }
}

fn qp_at(qpn: u32) -> usize {
    QP_AT + (qpn as usize & (QP_SLOTS - 1)) * QP_WORDS * 8
}

fn mr_at(slot: usize) -> usize {
    MR_AT + slot * MR_WORDS * 8
}

/// The slots an MR of `(dev, rkey)` may take, in the order they are tried.
fn mr_slots(dev: u32, rkey: u32) -> impl Iterator<Item = usize> {
    let first = ((rkey >> 8) as usize).wrapping_add(dev as usize * 7919);
    (0..MR_PROBES).map(move |i| (first + i) & (MR_SLOTS - 1))
}

fn state_code(s: QpState) -> u64 {
    s.0 as u64
}

/// This node's exports, written as its objects change.
#[derive(Debug)]
pub(crate) struct Exports {
    map: Mapping,
    fd: OwnedFd,
    /// Which MR slots are taken, by whom; held while any entry is written.
    slots: Mutex<MrSlots>,
}

#[derive(Debug)]
struct MrSlots {
    /// The slot each offered MR takes, by `(dev, rkey)`.
    by_key: FxHashMap<(u32, u32), usize>,
    used: Box<[bool]>,
}

impl Exports {
    pub(crate) fn create() -> io::Result<Exports> {
        let fd = crate::sys::memfd_unsealed(c"rdma-emu-exports", BYTES)?;
        let map = Mapping::map(fd.as_raw_fd(), true)?;
        map.word(0).store(MAGIC, Ordering::Release);
        // No one may change its size (a peer's mapping would fault) or map it writable from
        // now on: a peer reads it, only we write it, through the mapping made above.
        let seals = crate::sys::RING_SEALS | libc::F_SEAL_FUTURE_WRITE;
        // SAFETY: F_ADD_SEALS on a descriptor we own takes an int.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let slots = MrSlots { by_key: FxHashMap::default(), used: vec![false; MR_SLOTS].into() };
        Ok(Exports { map, fd, slots: Mutex::new(slots) })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Offers the QP as it now is.
    pub(crate) fn set_qp(&self, q: &QpExport) {
        let _serial = self.slots.lock();
        let code = state_code(q.state) | (q.qp_type.0 as u64) << 8 | (q.access.bits() as u64) << 16;
        let words = [
            0,
            u64::from(q.qpn) | u64::from(q.dest_qpn) << 32,
            code | u64::from(q.dev) << 32,
            q.pd,
        ];
        self.map.write(qp_at(q.qpn), &words);
    }

    /// Withdraws QP `qpn` (destroyed).
    pub(crate) fn clear_qp(&self, qpn: u32) {
        let _serial = self.slots.lock();
        self.map.write(qp_at(qpn), &[0; QP_WORDS]);
    }

    /// Offers the MR (replacing what was offered under its key); whether a slot was free.
    pub(crate) fn set_mr(&self, m: &MrExport) -> bool {
        let mut mrs = self.slots.lock();
        let slot = match mrs.by_key.get(&(m.dev, m.rkey)) {
            Some(&s) => s,
            None => {
                let Some(s) = mr_slots(m.dev, m.rkey).find(|&s| !mrs.used[s]) else {
                    return false;
                };
                mrs.used[s] = true;
                mrs.by_key.insert((m.dev, m.rkey), s);
                s
            }
        };
        let words = [
            0,
            u64::from(m.rkey) | u64::from(m.dev) << 32,
            u64::from(m.access.bits()),
            m.pd,
            m.iova,
            m.len,
            m.host,
            u64::from(m.shared),
        ];
        self.map.write(mr_at(slot), &words);
        true
    }

    /// Withdraws the MR of `(dev, rkey)`; whether it was offered (then, before its memory
    /// may go, [`wait_for_peers`]).
    pub(crate) fn clear_mr(&self, dev: u32, rkey: u32) -> bool {
        let mut mrs = self.slots.lock();
        let Some(slot) = mrs.by_key.remove(&(dev, rkey)) else { return false };
        mrs.used[slot] = false;
        self.map.write(mr_at(slot), &[0; MR_WORDS]);
        true
    }
}

/// Waits until no peer that may have found an entry withdrawn before is still inside a
/// request (`rings`: those our peers write to us, whose gates they raise while they act).
/// A peer that exits meanwhile is not waited for.
pub(crate) fn wait_for_peers(rings: &[std::sync::Arc<Ring>]) {
    // The entry's count was stored (sequentially consistent) before each gate is loaded; a
    // peer raises its gate before it loads the count: one of us sees the other.
    for r in rings {
        while r.gate_up() && !r.abandoned() {
            std::thread::yield_now();
        }
    }
}

/// A peer's exports, mapped read-only.
#[derive(Debug)]
pub(crate) struct PeerExports {
    map: Mapping,
    _fd: OwnedFd,
}

impl PeerExports {
    /// The exports file a peer passed us: sealed against changes of size, the size this
    /// module makes, and marked as one.
    pub(crate) fn open(fd: OwnedFd) -> io::Result<PeerExports> {
        let invalid = |why| io::Error::new(io::ErrorKind::InvalidData, why);
        let seals = crate::sys::seals(fd.as_raw_fd()).map_err(|_| invalid("not a sealed file"))?;
        if seals & crate::sys::RING_SEALS != crate::sys::RING_SEALS {
            return Err(invalid("not sealed against shrinking and growing"));
        }
        if std::fs::File::from(fd.try_clone()?).metadata()?.len() != BYTES as u64 {
            return Err(invalid("not the size of an exports file"));
        }
        let map = Mapping::map(fd.as_raw_fd(), false)?;
        if map.word(0).load(Ordering::Acquire) != MAGIC {
            return Err(invalid("not an rdma-emu exports file"));
        }
        Ok(PeerExports { map, _fd: fd })
    }

    /// The QP numbered `qpn`, as its process last offered it.
    pub(crate) fn qp(&self, qpn: u32) -> Option<QpExport> {
        let [_, nums, code, pd] = self.map.read::<QP_WORDS>(qp_at(qpn))?;
        if nums as u32 != qpn || qpn == 0 {
            return None;
        }
        Some(QpExport {
            qpn,
            dest_qpn: (nums >> 32) as u32,
            dev: (code >> 32) as u32,
            state: QpState(code as u8 as u32),
            qp_type: QpType((code >> 8) as u8 as u32),
            access: AccessFlags::from_bits_truncate((code >> 16) as u16 as u32),
            pd,
        })
    }

    /// The MR that `rkey` names on device `dev`, as its process last offered it.
    pub(crate) fn mr(&self, dev: u32, rkey: u32) -> Option<MrExport> {
        mr_slots(dev, rkey).find_map(|slot| {
            let [_, key, access, pd, iova, len, host, shared] =
                self.map.read::<MR_WORDS>(mr_at(slot))?;
            (key == u64::from(rkey) | u64::from(dev) << 32 && rkey != 0).then_some(MrExport {
                dev,
                rkey,
                access: AccessFlags::from_bits_truncate(access as u32),
                pd,
                iova,
                len,
                host,
                shared: shared as u32,
            })
        })
    }
}

/// A request a peer carries out for a stopped process.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    /// The stopped process's QP, on its device.
    pub(crate) dst: (u32, u32),
    /// Our QP, which sent it, and its type (the peer's must be the same).
    pub(crate) src_qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) rkey: u32,
    pub(crate) va: u64,
    pub(crate) op: Op<'a>,
}

/// What a carried-out request does.
#[derive(Debug)]
pub(crate) enum Op<'a> {
    /// An RDMA WRITE of these bytes of ours, in order (address, length).
    Write(&'a [(u64, usize)]),
    /// An RDMA READ of this many bytes, into the buffer.
    Read(&'a mut Vec<u8>, usize),
}

impl Op<'_> {
    fn len(&self) -> u64 {
        match self {
            Op::Write(src) => src.iter().map(|(_, n)| *n as u64).sum(),
            Op::Read(_, n) => *n as u64,
        }
    }
}

/// How [`place`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Not carried out: nothing of the peer's changed, but for a write that failed partway
    /// (then the responder, carrying out the request itself later, writes it all again).
    No,
    /// Carried out, through our view of the peer's memory where it applied.
    Yes,
    /// Memory of the peer's that it moved into the shared memory of this name, of which we
    /// have no view to write through: carried out by system calls, or, if only views were
    /// to be used, not carried out.
    Unviewed(u32),
}

/// Carries out `req` in `to`'s process as its responder would have, if its exports allow it,
/// and, if `views_only`, if it is a write into memory we have a view of.
/// `gate` is our ring to that process: raised for as long as we may touch its memory.
pub(crate) fn place(
    exports: &PeerExports,
    to: &PeerProcess,
    gate: &Ring,
    req: Request<'_>,
    views_only: bool,
) -> Placed {
    gate.set_gate(true);
    let done = place_gated(exports, to, req, views_only);
    gate.set_gate(false);
    done
}

fn place_gated(
    exports: &PeerExports,
    to: &PeerProcess,
    req: Request<'_>,
    views_only: bool,
) -> Placed {
    let (dev, qpn) = req.dst;
    let need = match req.op {
        Op::Write(_) => AccessFlags::REMOTE_WRITE,
        Op::Read(..) => AccessFlags::REMOTE_READ,
    };
    let Some(qp) = exports.qp(qpn) else { return Placed::No };
    let takes = matches!(qp.state, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE);
    if !takes
        || qp.dev != dev
        || qp.qp_type != req.qp_type
        || !matches!(qp.qp_type, QpType::RC | QpType::UC)
        || qp.dest_qpn != req.src_qpn
        || !qp.access.contains(need)
    {
        return Placed::No;
    }
    let len = req.op.len();
    let (host, shared) = if len == 0 {
        (0, 0)
    } else {
        let Some(mr) = exports.mr(dev, req.rkey) else { return Placed::No };
        if mr.pd != qp.pd || !mr.access.contains(need) {
            return Placed::No;
        }
        let Some(host) = mr.host_of(req.va, len) else { return Placed::No };
        (host, mr.shared)
    };
    let done = match req.op {
        Op::Read(..) if views_only => false,
        _ if len == 0 => true,
        // Through our view of the memory if we have one; else (unless only a view would do)
        // by system calls, after which a view of memory the peer shares is worth asking for.
        Op::Write(src) => {
            if shared != 0 && to.write_through_view(shared, host, src, !views_only) {
                return Placed::Yes;
            }
            if !views_only && to.push(host, src).is_err() {
                return Placed::No;
            }
            return match (shared, views_only) {
                (0, true) => Placed::No,
                (0, false) => Placed::Yes,
                _ => Placed::Unviewed(shared),
            };
        }
        // Through our view of the memory for the part it holds; without one, a view of
        // memory the peer shares is worth asking for.
        Op::Read(into, n) => {
            into.resize(n, 0);
            let view = (shared != 0).then(|| to.view(shared)).flatten();
            if to.read_into(view.as_deref(), host, into).is_err() {
                return Placed::No;
            }
            return if shared != 0 && view.is_none() {
                Placed::Unviewed(shared)
            } else {
                Placed::Yes
            };
        }
    };
    if done { Placed::Yes } else { Placed::No }
}

#[cfg(test)]
mod test {
    use std::sync::Arc;

    use super::*;

    fn me() -> PeerProcess {
        PeerProcess::open(std::process::id()).unwrap()
    }

    fn peer_view(e: &Exports) -> PeerExports {
        let fd = std::fs::File::open(format!("/proc/self/fd/{}", e.fd())).unwrap();
        PeerExports::open(fd.into()).unwrap()
    }

    fn qp(qpn: u32, state: QpState) -> QpExport {
        QpExport {
            qpn,
            dest_qpn: 0x20007,
            dev: 0,
            state,
            qp_type: QpType::RC,
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            pd: 77,
        }
    }

    fn mr(buf: &[u8], rkey: u32, access: AccessFlags) -> MrExport {
        MrExport {
            dev: 0,
            rkey,
            access,
            pd: 77,
            iova: 0x1000,
            len: buf.len() as u64,
            host: buf.as_ptr() as u64,
            shared: 0,
        }
    }

    #[test]
    fn test_a_peer_sees_what_is_offered_and_nothing_once_withdrawn() {
        let e = Exports::create().unwrap();
        let p = peer_view(&e);
        assert_eq!(p.qp(0x10005), None);
        e.set_qp(&qp(0x10005, QpState::RTS));
        assert_eq!(p.qp(0x10005), Some(qp(0x10005, QpState::RTS)));
        // Another QP number in the same slot is not this one.
        assert_eq!(p.qp(0x20005), None);
        e.clear_qp(0x10005);
        assert_eq!(p.qp(0x10005), None);
        let buf = vec![0u8; 64];
        let all = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        // Keys that collide on their slot each find one.
        let keys: Vec<u32> = (0..MR_PROBES as u32).map(|i| 0x500 | i).collect();
        for &k in &keys {
            assert!(e.set_mr(&mr(&buf, k, all)));
        }
        assert!(!e.set_mr(&mr(&buf, 0x5ff, all)), "no slot left among its probes");
        for &k in &keys {
            assert_eq!(p.mr(0, k), Some(mr(&buf, k, all)));
            assert_eq!(p.mr(1, k), None, "another device's key");
        }
        assert!(e.clear_mr(0, keys[3]));
        assert!(!e.clear_mr(0, keys[3]));
        assert_eq!(p.mr(0, keys[3]), None);
        assert_eq!(p.mr(0, keys[4]), Some(mr(&buf, keys[4], all)));
    }

    #[test]
    fn test_a_peer_cannot_write_the_exports_nor_pass_a_file_that_could_change_size() {
        let e = Exports::create().unwrap();
        let path = format!("/proc/self/fd/{}", e.fd());
        let rw = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        // SAFETY: an attempt at a new writable shared mapping of a file we own.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_WRITE,
                libc::MAP_SHARED,
                rw.as_raw_fd(),
                0,
            )
        };
        assert_eq!(
            (p, io::Error::last_os_error().raw_os_error()),
            (libc::MAP_FAILED, Some(libc::EPERM))
        );
        let unsealed = crate::sys::memfd_unsealed(c"unsealed", BYTES).unwrap();
        assert!(PeerExports::open(unsealed).unwrap_err().to_string().contains("sealed"));
        let small = crate::sys::memfd(c"small", 4096).unwrap();
        assert!(PeerExports::open(small).unwrap_err().to_string().contains("size"));
    }

    #[test]
    fn test_a_request_is_carried_out_only_as_the_responder_would_take_it() {
        let e = Exports::create().unwrap();
        let p = peer_view(&e);
        let gate = Ring::create(4096, false).unwrap();
        let target = vec![0u8; 256];
        let src = [7u8; 16];
        let (me, all) = (me(), AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ);
        e.set_qp(&qp(0x10001, QpState::RTS));
        e.set_mr(&mr(&target, 0x700, all));
        e.set_mr(&mr(&target, 0x801, AccessFlags::REMOTE_READ));
        let from = [(src.as_ptr() as u64, 16)];
        let write = |rkey, va, dst: (u32, u32), src_qpn| Request {
            qp_type: QpType::RC,
            dst,
            src_qpn,
            rkey,
            va,
            op: Op::Write(&from),
        };
        let ok = ((0, 0x10001), 0x20007);
        assert_eq!(place(&p, &me, &gate, write(0x700, 0x1010, ok.0, ok.1), false), Placed::Yes);
        assert_eq!(&target[16..32], &[7; 16]);
        assert!(!gate.gate_up(), "the gate is lowered again");
        // Each of these the responder would refuse: nothing is written.
        let refused = [
            write(0x700, 0x1000 + 250, ok.0, ok.1),   // past the MR's end
            write(0x701, 0x1000, ok.0, ok.1),         // no such key
            write(0x801, 0x1000, ok.0, ok.1),         // no remote write on the MR
            write(0x700, 0x1000, (1, 0x10001), ok.1), // another device's QP
            write(0x700, 0x1000, ok.0, 0x20008),      // not the QP's peer
            write(0x700, 0x1000, (0, 0x10002), ok.1), // no such QP
        ];
        for r in refused {
            assert_eq!(place(&p, &me, &gate, r, false), Placed::No);
        }
        e.set_qp(&qp(0x10001, QpState::ERR));
        assert_eq!(place(&p, &me, &gate, write(0x700, 0x1000, ok.0, ok.1), false), Placed::No);
        assert_eq!(&target[..16], &[0; 16]);
        e.set_qp(&qp(0x10001, QpState::RTS));
        let mut got = Vec::new();
        let read = Request {
            qp_type: QpType::RC,
            dst: ok.0,
            src_qpn: ok.1,
            rkey: 0x801,
            va: 0x1010,
            op: Op::Read(&mut got, 8),
        };
        assert_eq!(place(&p, &me, &gate, read, false), Placed::Yes);
        assert_eq!(got, [7; 8]);
        // A UC QP is offered too, and takes only a UC QP's WRITEs; an RC QP only an RC's.
        e.set_qp(&QpExport { qpn: 0x10003, qp_type: QpType::UC, ..qp(0x10003, QpState::RTS) });
        let uc = |dst| Request { qp_type: QpType::UC, ..write(0x700, 0x1020, dst, ok.1) };
        assert_eq!(place(&p, &me, &gate, uc(ok.0), false), Placed::No, "a UC WRITE to an RC QP");
        assert_eq!(
            place(&p, &me, &gate, write(0x700, 0x1020, (0, 0x10003), ok.1), false),
            Placed::No
        );
        assert_eq!(&target[32..40], &[0; 8]);
        assert_eq!(place(&p, &me, &gate, uc((0, 0x10003)), false), Placed::Yes);
        assert_eq!(&target[32..40], &[7; 8]);
    }

    #[test]
    fn test_withdrawing_an_mr_waits_for_a_peer_inside_a_request() {
        let e = Arc::new(Exports::create().unwrap());
        let ring = Arc::new(Ring::create(4096, false).unwrap());
        let reader = Arc::new(Ring::open(ring_fd(&ring), Some(Arc::new(me()))).unwrap());
        let buf = vec![0u8; 8];
        e.set_mr(&mr(&buf, 0x900, AccessFlags::REMOTE_WRITE));
        ring.set_gate(true);
        assert!(e.clear_mr(0, 0x900));
        let r2 = reader.clone();
        let t = std::thread::spawn(move || wait_for_peers(&[r2]));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "withdrawn while a peer may still write");
        ring.set_gate(false);
        t.join().unwrap();
    }

    fn ring_fd(r: &Ring) -> OwnedFd {
        // SAFETY: the ring's descriptor is open for as long as `r`, which outlives the call.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(r.fd()) }.try_clone_to_owned().unwrap()
    }
}
