//! The express path: a work request between two QPs of this process executed by the posting
//! thread, straight against the responder's memory and receive queue, with both completions
//! written at once: no packet, no ACK, no timer.
//!
//! It runs only where it is indistinguishable from the packet path: an RC or UC WRITE, WRITE
//! with immediate, SEND, SEND with immediate, READ or atomic that will succeed, with nothing
//! else in flight on the requester (so completions keep their order), the responder's lock
//! free and its inbox empty (so requests keep theirs), and no fault rule, simulation or packet
//! trace on the fabric (they need packets). Every check is made before anything is changed;
//! any request that would fail, wait for a receive (RNR), or touch memory that may fault
//! (on-demand paging) goes the packet path, which gives it its exact error, NAK and events.
//! What the express path changes is what the packet path would have left behind: the PSNs and
//! MSN of both QPs, the responder's saved READ/atomic results, COMM_EST, the receive and send
//! completions in that order.

use std::sync::Arc;

use super::{
    Driver,
    packet::Kind,
    packets_for, psn_add, raises_qp_errors,
    responder::{self, Arrival, Replay},
};
use crate::{
    mem::MemRegion,
    objects::{keys::KeyTable, pd::PdInner},
    qp::{QpInner, QpShared, queue::Hidden},
    types::{AccessFlags, QpState, QpType, SendFlags, Sge, WcOpcode, WrOpcode},
};

/// A piece of a message's source: bytes of the WQE (inline) or of a registered region.
#[derive(Clone, Copy)]
enum Src<'a> {
    Bytes(&'a [u8]),
    Mem(&'a MemRegion, usize, usize),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::Bytes(b) => b.len(),
            Src::Mem(_, _, n) => *n,
        }
    }
}

/// A destination range: `(region, offset, length)`.
type Dst<'a> = (&'a MemRegion, usize, usize);

/// A list of the few SGEs a WR has, kept on the stack up to four.
struct List<T> {
    head: [Option<T>; 4],
    more: Vec<T>,
}

impl<T: Copy> List<T> {
    fn new() -> List<T> {
        List { head: [None; 4], more: Vec::new() }
    }

    fn one(t: T) -> List<T> {
        let mut l = List::new();
        l.push(t);
        l
    }

    fn push(&mut self, t: T) {
        match self.head.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(t),
            None => self.more.push(t),
        }
    }

    fn iter(&self) -> impl Iterator<Item = T> + '_ {
        self.head.iter().flatten().copied().chain(self.more.iter().copied())
    }
}

/// Executes the WQE at `idx` (the next to send) if the express path can; whether it did.
pub(crate) fn execute(qp: &Arc<QpShared>, g: &mut QpInner, idx: u32, drv: &Driver<'_>) -> bool {
    let f = drv.fabric;
    if !matches!(qp.qp_type, QpType::RC | QpType::UC) || g.sq.in_flight() != 0 || !f.express() {
        return false;
    }
    let wqe = g.sq.ring.at(idx);
    let kind = match wqe.opcode {
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => Kind::Write,
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM => Kind::Send,
        WrOpcode::RDMA_READ => Kind::ReadRequest,
        WrOpcode::ATOMIC_FETCH_AND_ADD => Kind::FetchAdd,
        WrOpcode::ATOMIC_CMP_AND_SWP => Kind::CompareSwap,
        _ => return false,
    };
    if wqe.hidden != Hidden::None || wqe.length > g.port.max_msg_sz {
        return false;
    }
    let Some((dev, port)) = g.dest else { return false };
    let dqpn = g.attr.dest_qp_num;
    if f.remote_node(dqpn).is_some()
        || !f.port_up(qp.device_index(), g.attr.port_num)
        || !f.port_up(dev, port)
    {
        return false;
    }
    let Some(dst) = g.route.resolve(f, dev, dqpn) else { return false };
    if Arc::ptr_eq(&dst, qp) {
        return false;
    }
    let Some(mut dg) = dst.inner.try_lock() else { return false };
    let imm = matches!(wqe.opcode, WrOpcode::RDMA_WRITE_WITH_IMM | WrOpcode::SEND_WITH_IMM)
        .then_some(wqe.imm);
    let (psn, len) = (g.req.psn, wqe.length);
    let npkts = if matches!(kind, Kind::FetchAdd | Kind::CompareSwap) {
        1
    } else {
        packets_for(len, g.mtu)
    };
    // The responder takes the request as the packet path's would, in order.
    let takes = matches!(dg.state, QpState::RTS | QpState::SQD | QpState::SQE)
        || dg.state == QpState::RTR && (dg.resp.comm_est || !raises_qp_errors(&dst));
    if !takes
        || dst.qp_type != qp.qp_type
        || port != dg.attr.port_num
        || dst.xrcd.is_some()
        || dg.resp.forwarded.is_some()
        || (qp.qp_type == QpType::RC && dg.resp.epsn != psn)
        || !dst.inbox.lock().is_empty()
        || responder::refuses(&dg, kind, len, wqe.remote_addr, 0)
    {
        return false;
    }
    let receives = kind == Kind::Send || imm.is_some();
    if receives && dst.srq.as_ref().is_some_and(|s| s.tm.is_some()) {
        return false;
    }
    let arrival = Arrival {
        len,
        imm,
        inv: None,
        src_lid: g.port.lid,
        solicited: wqe.flags.contains(SendFlags::SOLICITED) && receives,
    };
    let same_keys = Arc::ptr_eq(&qp.ctx.device, &dst.ctx.device);
    let lkeys = qp.ctx.device.keys.read_recursive();
    let rkeys_guard = (!same_keys).then(|| dst.ctx.device.keys.read_recursive());
    let rkeys: &KeyTable = rkeys_guard.as_deref().unwrap_or(&lkeys);
    match kind {
        Kind::Write | Kind::Send => {
            let Some(src) = sources(&lkeys, &qp.pd, g, idx) else { return false };
            let target = if kind == Kind::Write {
                let Some(t) = remote(rkeys, &dst.pd, (wqe.rkey, wqe.remote_addr, len), false)
                else {
                    return false;
                };
                t.map(|(region, off)| (region, off, len as usize))
            } else {
                None
            };
            if receives {
                let pd = responder::recv_pd(&dst, &dg);
                let place = |sges: &[Sge]| {
                    let dsts = if kind == Kind::Send {
                        scatter_list(rkeys, &pd, sges, len)?
                    } else {
                        List::new()
                    };
                    copy(&src, target.into_iter().chain(dsts.iter()));
                    Some(())
                };
                let Some(wr_id) = take_recv(&dst, &mut dg, place) else { return false };
                let opcode =
                    if kind == Kind::Send { WcOpcode::RECV } else { WcOpcode::RECV_RDMA_WITH_IMM };
                responder::complete_arrival(&dst, &mut dg, &arrival, opcode, wr_id);
            } else {
                copy(&src, target.into_iter());
            }
        }
        Kind::ReadRequest => {
            let Some(source) = remote(rkeys, &dst.pd, (wqe.rkey, wqe.remote_addr, len), true)
            else {
                return false;
            };
            let Some(dsts) = local_writable(&lkeys, &qp.pd, &wqe.sges, len) else { return false };
            if let Some((region, off)) = source {
                copy(&List::one(Src::Mem(region, off, len as usize)), dsts.iter());
            }
            responder::remember(&mut dg, Replay::read(psn, npkts, wqe.remote_addr, wqe.rkey, len));
        }
        _ => {
            let Some(Some((region, off))) =
                remote_atomic(rkeys, &dst.pd, wqe.rkey, wqe.remote_addr)
            else {
                return false;
            };
            let Some(dsts) = local_writable(&lkeys, &qp.pd, &wqe.sges, 8) else { return false };
            let op = if kind == Kind::CompareSwap {
                region.compare_swap(off, wqe.compare_add, wqe.swap)
            } else {
                region.fetch_add(off, wqe.compare_add)
            };
            let Ok(orig) = op else { return false };
            let word = orig.to_ne_bytes();
            copy(&List::one(Src::Bytes(&word)), dsts.iter());
            responder::remember(&mut dg, Replay::Atomic { psn, orig });
        }
    }
    drop(rkeys_guard);
    drop(lkeys);
    // The responder's side of the exchange (a QP in RTR that would raise COMM_EST now never
    // gets here: see `takes`).
    dg.resp.nak_seq_sent = false;
    responder::advance_past(&mut dg, psn, npkts);
    drop(dg);
    // The requester's.
    let wqe = g.sq.ring.at_mut(idx);
    wqe.first_psn = psn;
    wqe.last_psn = psn_add(psn, npkts - 1);
    g.req.psn = psn_add(psn, npkts);
    g.sq.next = idx.wrapping_add(1);
    if g.sq.ring.at(idx).is_read_or_atomic() {
        g.req.rd_atomic_in_flight += 1;
    }
    super::completer::complete_ok(qp, g);
    true
}

/// The source of the SEND/WRITE at `idx`: its inline bytes, or its SGEs as the packet path's
/// requester resolves them (lkey of the QP's PD, range inside the MR); `None` where that
/// fails or the memory may fault.
fn sources<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    g: &'k QpInner,
    idx: u32,
) -> Option<List<Src<'k>>> {
    let wqe = g.sq.ring.at(idx);
    if wqe.flags.contains(SendFlags::INLINE) {
        return Some(List::one(Src::Bytes(&wqe.inline)));
    }
    let mut out = List::new();
    for sge in wqe.sges.iter().filter(|s| s.length > 0) {
        let mr = keys.mr(sge.lkey)?;
        if !Arc::ptr_eq(&mr.pd, pd) || mr.region.on_demand() {
            return None;
        }
        let off = mr.offset_of(sge.addr, sge.length as u64)?;
        out.push(Src::Mem(&mr.region, off, sge.length as usize));
    }
    Some(out)
}

/// The memory an rkey names for `(rkey, va, len)`, as the responder resolves it, for a WRITE
/// (`read`: false) or a READ; `Some(None)` for a zero-length access. `None` for anything the
/// packet path must handle: a bad key, a memory window, memory that may fault.
fn remote<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    (rkey, va, len): (u32, u64, u32),
    read: bool,
) -> Option<Option<(&'k MemRegion, usize)>> {
    if len == 0 {
        return Some(None);
    }
    let access = if read { AccessFlags::REMOTE_READ } else { AccessFlags::REMOTE_WRITE };
    let mr = keys.mr(rkey)?;
    if mr.rkey != rkey
        || !Arc::ptr_eq(&mr.pd, pd)
        || !mr.access.contains(access)
        || mr.region.on_demand()
    {
        return None;
    }
    let off = mr.offset_of(va, len as u64)?;
    Some(Some((&mr.region, off)))
}

/// The 8-byte target of an atomic, which must be aligned in memory (the packet path refuses
/// it otherwise).
fn remote_atomic<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    rkey: u32,
    va: u64,
) -> Option<Option<(&'k MemRegion, usize)>> {
    let mr = keys.mr(rkey)?;
    if mr.rkey != rkey
        || !Arc::ptr_eq(&mr.pd, pd)
        || !mr.access.contains(AccessFlags::REMOTE_ATOMIC)
        || mr.region.on_demand()
    {
        return None;
    }
    let off = mr.offset_of(va, 8)?;
    (mr.region.host_addr().wrapping_add(off as u64) % 8 == 0).then_some(Some((&mr.region, off)))
}

/// Local SGEs a READ response or an atomic result of `len` bytes lands in, all of which must
/// be writable MRs of the QP's PD (every SGE is checked, as the packet path's requester does)
/// and hold `len` bytes.
fn local_writable<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    sges: &[Sge],
    len: u32,
) -> Option<List<Dst<'k>>> {
    let room: u64 = sges.iter().map(|s| s.length as u64).sum();
    if room < len as u64 {
        return None;
    }
    let mut out = List::new();
    for sge in sges.iter().filter(|s| s.length > 0) {
        let mr = keys.mr(sge.lkey)?;
        if !Arc::ptr_eq(&mr.pd, pd)
            || !mr.access.contains(AccessFlags::LOCAL_WRITE)
            || mr.region.on_demand()
        {
            return None;
        }
        let off = mr.offset_of(sge.addr, sge.length as u64)?;
        out.push((&*mr.region, off, sge.length as usize));
    }
    Some(out)
}

/// A receive WQE's SGEs that take a message of `len` bytes, as the packet path's scatter
/// checks them: room for the message, and every SGE the data reaches writable in `pd`.
fn scatter_list<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    sges: &[Sge],
    len: u32,
) -> Option<List<Dst<'k>>> {
    let room: u64 = sges.iter().map(|s| s.length as u64).sum();
    if len as u64 > room {
        return None;
    }
    let mut out = List::new();
    let mut left = len as u64;
    for sge in sges.iter().filter(|s| s.length > 0) {
        if left == 0 {
            break;
        }
        let mr = keys.mr(sge.lkey)?;
        if !Arc::ptr_eq(&mr.pd, pd)
            || !mr.access.contains(AccessFlags::LOCAL_WRITE)
            || mr.region.on_demand()
        {
            return None;
        }
        let off = mr.offset_of(sge.addr, sge.length as u64)?;
        let take = left.min(sge.length as u64);
        out.push((&*mr.region, off, take as usize));
        left -= take;
    }
    Some(out)
}

/// Takes the responder's next receive WQE (from its SRQ if it has one) if `place` succeeds
/// with its SGEs; the WQE's `wr_id`.
fn take_recv(
    dst: &Arc<QpShared>,
    dg: &mut QpInner,
    place: impl FnOnce(&[Sge]) -> Option<()>,
) -> Option<u64> {
    if let Some(srq) = &dst.srq {
        return srq.pop_with(|w| place(&w.sges).map(|()| w.wr_id));
    }
    if dg.rq.len() == 0 {
        return None;
    }
    let tail = dg.rq.tail;
    let w = dg.rq.ring.at(tail);
    place(&w.sges)?;
    let wr_id = w.wr_id;
    dg.rq.tail = tail.wrapping_add(1);
    Some(wr_id)
}

/// Copies the sources, in order, into consecutive destination ranges (stopping where either
/// ends). Every range was checked and none may fault, so no copy fails.
fn copy<'a>(src: &List<Src<'_>>, mut dst: impl Iterator<Item = Dst<'a>>) {
    let mut cur = dst.next();
    for piece in src.iter() {
        let mut done = 0usize;
        while done < piece.len() {
            let Some((region, off, room)) = cur else { return };
            let n = room.min(piece.len() - done);
            let ok = match piece {
                Src::Bytes(b) => region.write(off, &b[done..done + n]),
                Src::Mem(r, o, _) => MemRegion::copy(r, o + done, region, off, n),
            };
            debug_assert!(ok.is_ok(), "a checked, non-faulting copy failed");
            done += n;
            cur = if n == room { dst.next() } else { Some((region, off + n, room - n)) };
        }
    }
}
