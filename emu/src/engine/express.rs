//! The express path: a work request between two QPs of this process executed by the posting
//! thread, straight against the responder's memory and receive queue, with both completions
//! written at once: no packet, no ACK, no timer.
//!
//! It runs only where it is indistinguishable from the packet path: an RC, UC or XRC WRITE,
//! WRITE with immediate, SEND, SEND with immediate, READ or atomic that will succeed (an XRC
//! one into an XRC SRQ of this process, which decides its PD and CQ), with nothing else in
//! flight on the requester (so completions keep their order), the responder's lock
//! free and its inbox empty (so requests keep theirs), and no fault rule, simulation or packet
//! trace on the fabric (they need packets). Every check is made before anything is changed;
//! any request that would fail, wait for a receive (RNR), or touch memory that may fault
//! (on-demand paging) goes the packet path, which gives it its exact error, NAK and events;
//! so does one whose copy faults (memory unmapped after its registration: see `guarded`),
//! before anything but the bytes copied so far has changed.
//! What the express path changes is what the packet path would have left behind: the PSNs and
//! MSN of both QPs, the responder's saved READ/atomic results, COMM_EST, the receive and send
//! completions in that order.

use std::sync::Arc;

use super::{
    Driver, completer, packets_for, psn_add, raises_qp_errors,
    responder::{self, Arrival},
};
use crate::packet::Kind;
use crate::qp::transport::{Lane, Replay};
use crate::{
    fabric::FabricInner,
    mem::{MemFault, MemRegion, Span},
    objects::{keys::KeyTable, pd::PdInner, srq::SrqInner},
    qp::{QpInner, QpShared, SendWr, queue::Hidden},
    types::{AccessFlags, QpState, QpType, SendFlags, Sge, WcOpcode, WrOpcode},
};

/// A piece of a message's source: bytes of the WQE (inline) or of a registered region.
#[derive(Clone, Copy)]
pub(super) enum Src<'a> {
    Bytes(&'a [u8]),
    Mem(&'a MemRegion, usize, usize),
    /// Bytes of a region that a key's check proved (see [`source`]).
    Span(Span<'a>),
}

impl Src<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Src::Bytes(b) => b.len(),
            Src::Mem(_, _, n) => *n,
            Src::Span(s) => s.len(),
        }
    }
}

/// A destination range: `(region, offset, length)`.
type Dst<'a> = (&'a MemRegion, usize, usize);

/// What the express path needs of a send WR: taken from the application's WR when it
/// runs at the post, or from its WQE when it runs from the send queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) opcode: WrOpcode,
    pub(crate) flags: SendFlags,
    pub(crate) sges: &'a [Sge],
    pub(crate) inline: &'a [u8],
    pub(crate) imm: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) length: u32,
    /// An XRC initiator's: the XRC SRQ the request goes to.
    pub(crate) xrc_srqn: u32,
}

impl<'a> Request<'a> {
    /// The application's WR, already checked by the post, of `length` bytes.
    pub(crate) fn of_wr(wr: &SendWr<'a>, length: u32) -> Request<'a> {
        Request {
            opcode: wr.opcode,
            flags: wr.send_flags,
            sges: wr.sg_list,
            inline: wr.inline_data,
            imm: wr.imm_data,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            length,
            xrc_srqn: wr.xrc_remote_srqn,
        }
    }
}

/// Executes the WR at the post, the send queue being empty: its completion goes straight to
/// the send CQ and it never occupies a WQE. Whether it ran.
pub(crate) fn post(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wr: &SendWr<'_>,
    length: u32,
    f: &FabricInner,
) -> bool {
    // A peer in another process (see `Lane::prove`) is not executed against from here.
    if g.lane_across || g.sq.head != g.sq.tail || g.req.rnr_until.is_some() {
        return false;
    }
    let req = Request::of_wr(wr, length);
    if execute(qp, g, &req, f).is_none() {
        return false;
    }
    completer::send_done(qp, wr.wr_id, wr.opcode, wr.send_flags, length);
    completer::progressed(g);
    true
}

/// Executes the WQE at `idx` (the next to send) if the express path can; whether it did.
pub(crate) fn from_queue(qp: &Arc<QpShared>, g: &mut QpInner, idx: u32, drv: &Driver<'_>) -> bool {
    if g.lane_across || g.sq.in_flight() != 0 {
        return false;
    }
    let wqe = g.sq.ring.at_mut(idx);
    if wqe.hidden != Hidden::None {
        return false;
    }
    // Lend the WQE's lists to the request (moved, not copied) while `g` is in use.
    let (sges, inline) = (std::mem::take(&mut wqe.sges), std::mem::take(&mut wqe.inline));
    let req = Request {
        opcode: wqe.opcode,
        flags: wqe.flags,
        sges: &sges,
        inline: &inline,
        imm: wqe.imm,
        remote_addr: wqe.remote_addr,
        rkey: wqe.rkey,
        compare_add: wqe.compare_add,
        swap: wqe.swap,
        length: wqe.length,
        xrc_srqn: wqe.xrc_srqn,
    };
    let ran = execute(qp, g, &req, drv.fabric);
    let wqe = g.sq.ring.at_mut(idx);
    (wqe.sges, wqe.inline) = (sges, inline);
    let Some((psn, npkts)) = ran else { return false };
    wqe.first_psn = psn;
    wqe.last_psn = psn_add(psn, npkts - 1);
    g.sq.next = idx.wrapping_add(1);
    if g.sq.ring.at(idx).is_read_or_atomic() {
        g.req.rd_atomic_in_flight += 1;
    }
    completer::complete_ok(qp, g);
    true
}

/// Executes `wqe` if the express path can, taking its PSNs: the first and how many.
fn execute(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wqe: &Request<'_>,
    f: &FabricInner,
) -> Option<(u32, u32)> {
    // (A peer in another process, `g.lane_across`, its callers have turned away.)
    let xrc = qp.qp_type == QpType::XRC_SEND;
    if !(xrc || matches!(qp.qp_type, QpType::RC | QpType::UC))
        || g.state != QpState::RTS
        || !f.express()
    {
        return None;
    }
    let lane = match lane_of(g, xrc).take() {
        Some(lane) => lane,
        None => Lane::prove(qp, g, f)?,
    };
    // A peer destroyed is forgotten (its number may come back as another QP's).
    let dst = lane.peer()?;
    let ran = run(qp, g, wqe, f, (dst, lane.dest));
    *lane_of(g, xrc) = Some(lane);
    ran
}

/// Where the QP keeps its lane: an XRC initiator's apart (see `QpInner::xrc_lane`).
fn lane_of(g: &mut QpInner, xrc: bool) -> &mut Option<Lane> {
    if xrc { &mut g.xrc_lane } else { &mut g.lane }
}

/// The XRC SRQ of the target QP `dst` (locked as `dg`) that a request names, as its
/// responder finds it (`responder::handle`): kept from the last request (moved out, no
/// reference count per request), else looked up in the target's domain; none if the domain
/// has no such SRQ here (the packet path NAKs it, or hands it to the SRQ's process).
fn xrc_srq(dst: &QpShared, dg: &mut QpInner, srqn: u32) -> Option<Arc<SrqInner>> {
    match dg.resp.xrc.take() {
        Some(srq) if srq.num == srqn && srq.life.is_alive() => Some(srq),
        _ => dst.xrcd.as_ref()?.srq(srqn),
    }
}

/// [`execute`] on the QP's lane.
fn run(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wqe: &Request<'_>,
    f: &FabricInner,
    (dst, (dev, port)): (&Arc<QpShared>, (u32, u8)),
) -> Option<(u32, u32)> {
    let kind = match wqe.opcode {
        WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM => Kind::Write,
        WrOpcode::SEND | WrOpcode::SEND_WITH_IMM => Kind::Send,
        // UC carries no READ or atomic: the packet path fails them.
        _ if qp.qp_type == QpType::UC => return None,
        WrOpcode::RDMA_READ => Kind::ReadRequest,
        WrOpcode::ATOMIC_FETCH_AND_ADD => Kind::FetchAdd,
        WrOpcode::ATOMIC_CMP_AND_SWP => Kind::CompareSwap,
        _ => return None,
    };
    let rd_atomic = !matches!(kind, Kind::Write | Kind::Send);
    if wqe.length > g.port.max_msg_sz || (rd_atomic && g.attr.max_rd_atomic == 0) {
        return None;
    }
    if !f.ports_up((qp.device_index(), g.attr.port_num), (dev, port)) {
        return None;
    }
    let mut dg = dst.inner.try_lock()?;
    let imm = matches!(wqe.opcode, WrOpcode::RDMA_WRITE_WITH_IMM | WrOpcode::SEND_WITH_IMM)
        .then_some(wqe.imm);
    let (psn, len) = (g.req.psn, wqe.length);
    let npkts = if matches!(kind, Kind::FetchAdd | Kind::CompareSwap) {
        1
    } else {
        packets_for(len, g.mtu)
    };
    if !takes(dst, &dg, qp.qp_type, psn, port)
        || responder::refuses(&dg, kind, len, wqe.remote_addr, 0)
    {
        return None;
    }
    // XRC: the SRQ the request names decides the PD of its memory accesses and takes its
    // receive (the target QP keeps it, as its responder does).
    let xrc = match dst.xrcd {
        Some(_) => Some(xrc_srq(dst, &mut dg, wqe.xrc_srqn)?),
        None => None,
    };
    let receives = kind == Kind::Send || imm.is_some();
    if receives && xrc.as_ref().or(dst.srq.as_ref()).is_some_and(|s| s.tm.is_some()) {
        return None;
    }
    let key_pd = xrc.as_ref().map_or(&dst.pd, |s| &s.pd);
    let arrival = Arrival {
        len,
        imm,
        inv: None,
        src_lid: g.port.lid,
        solicited: wqe.flags.contains(SendFlags::SOLICITED) && receives,
    };
    let lkeys = qp.ctx.device.keys.read();
    // The peer's keys, under the same read (the QPs are in one fabric).
    let rkeys: &KeyTable = dst.ctx.device.keys.under(&lkeys)?;
    let mut received = None;
    match kind {
        Kind::Write | Kind::Send => {
            // The common one-piece source is checked and found at once.
            let one = single(&lkeys, &qp.pd, wqe);
            let inline = wqe.flags.contains(SendFlags::INLINE);
            if one.is_none()
                && !inline
                && !wqe.sges.iter().all(|s| local_ok(&lkeys, &qp.pd, s, false))
            {
                return None;
            }
            let target = if kind == Kind::Write {
                let t = remote(
                    rkeys,
                    key_pd,
                    (wqe.rkey, wqe.remote_addr, len),
                    AccessFlags::REMOTE_WRITE,
                )?;
                t.map(|(region, off)| (region, off, len as usize))
            } else {
                None
            };
            let src = || sources(&lkeys, wqe);
            if receives {
                let pd = xrc.as_ref().map_or_else(|| responder::own_recv_pd(dst), |s| &s.pd);
                let send = kind == Kind::Send;
                let place = move |sges: &[Sge]| {
                    if send && !reaches(rkeys, pd, sges, len) {
                        return None;
                    }
                    let sges = if send { sges } else { &[] };
                    let mut into = target.into_iter().chain(ranges(rkeys, sges, len));
                    let copied = match (one, sges.len() <= 1) {
                        // The common one-piece message into one range, without the iterators
                        // (the range holds it all: `reaches` or the rkey's check said so).
                        (Some(piece), true) => into
                            .next()
                            .is_none_or(|(region, off, n)| copy_piece(piece, 0, region, off, n)),
                        _ => copy(src(), into),
                    };
                    copied.then_some(())
                };
                let wr_id = match &xrc {
                    Some(srq) => take_shared_recv(srq, place)?,
                    None => take_recv(dst, &mut dg, place)?,
                };
                let opcode = if send { WcOpcode::RECV } else { WcOpcode::RECV_RDMA_WITH_IMM };
                received = Some((opcode, wr_id));
            } else if let Some((region, off, n)) = target {
                let copied = match one {
                    // The common one-piece WRITE, without the iterators.
                    Some(piece) => copy_piece(piece, 0, region, off, n),
                    None => copy(src(), target.into_iter()),
                };
                if !copied {
                    return None;
                }
            }
        }
        Kind::ReadRequest => {
            let source =
                remote(rkeys, key_pd, (wqe.rkey, wqe.remote_addr, len), AccessFlags::REMOTE_READ)?;
            // The packet path's requester checks every SGE of a READ, and its completer that
            // they hold the response.
            let room: u64 = wqe.sges.iter().map(|s| s.length as u64).sum();
            if room < len as u64 || !wqe.sges.iter().all(|s| local_ok(&lkeys, &qp.pd, s, true)) {
                return None;
            }
            if let Some((region, off)) = source {
                let src = std::iter::once(Src::Mem(region, off, len as usize));
                if !copy(src, ranges(&lkeys, wqe.sges, len)) {
                    return None;
                }
            }
            responder::remember(&mut dg, Replay::read(psn, npkts, wqe.remote_addr, wqe.rkey, len));
        }
        _ => {
            let op = (kind == Kind::CompareSwap, wqe.compare_add, wqe.swap);
            let target = (key_pd, wqe.rkey, wqe.remote_addr);
            let orig = atomic((&lkeys, &qp.pd, wqe.sges), (rkeys, target), op)?;
            responder::remember(&mut dg, Replay::Atomic { psn, orig });
        }
    }
    drop(lkeys);
    if xrc.is_some() {
        // (Where its receive completion goes: see `responder::recv_cq`.)
        dg.resp.xrc = xrc;
    }
    if let Some((opcode, wr_id)) = received {
        responder::complete_arrival(dst, &mut dg, &arrival, opcode, wr_id);
    }
    // The responder's side of the exchange (a QP in RTR that would raise COMM_EST now never
    // gets here: see `takes`).
    dg.resp.nak_seq_sent = false;
    responder::advance_past(&mut dg, psn, npkts);
    drop(dg);
    // The requester's.
    g.req.psn = psn_add(psn, npkts);
    Some((psn, npkts))
}

/// Whether the peer QP (`dst`, locked as `dg`) takes a request of `qp_type` at `psn` to its
/// port `port` now, as the packet path's responder would, in order (a QP in RTR that would
/// raise COMM_EST does not: the packet path raises it).
pub(super) fn takes(dst: &QpShared, dg: &QpInner, qp_type: QpType, psn: u32, port: u8) -> bool {
    let state = matches!(dg.state, QpState::RTS | QpState::SQD | QpState::SQE)
        || dg.state == QpState::RTR && (dg.resp.comm_est || !raises_qp_errors(dst));
    state
        && port == dg.attr.port_num
        && dg.resp.forwarded.is_none()
        && (qp_type == QpType::UC || dg.resp.epsn == psn)
        && dst.inbox.is_empty()
}

/// Whether `sge` is usable here as the packet path checks it: an empty SGE always; else as
/// [`local_span`] finds it.
pub(super) fn local_ok(keys: &KeyTable, pd: &Arc<PdInner>, sge: &Sge, write: bool) -> bool {
    sge.length == 0 || local_span(keys, pd, sge, write).is_some()
}

/// The memory of `sge` if its lkey names an MR of `pd` (writable when `write`) whose range
/// holds it, over memory that cannot fault.
#[inline(always)]
pub(super) fn local_span<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    sge: &Sge,
    write: bool,
) -> Option<Span<'k>> {
    let access = if write { AccessFlags::LOCAL_WRITE } else { AccessFlags::empty() };
    keys.span(sge.lkey, pd, access, sge.addr, sge.length as u64)
}

/// The source of one SGE (not empty) as [`local_span`] finds it.
pub(super) fn source<'k>(keys: &'k KeyTable, pd: &Arc<PdInner>, sge: &Sge) -> Option<Src<'k>> {
    local_span(keys, pd, sge, false).map(Src::Span)
}

/// Whether a message of `len` bytes can be scattered into `sges` as the packet path's scatter
/// checks it: room for it, and every SGE the data reaches writable in `pd`.
pub(super) fn reaches(keys: &KeyTable, pd: &Arc<PdInner>, sges: &[Sge], len: u32) -> bool {
    let room: u64 = sges.iter().map(|s| s.length as u64).sum();
    let mut left = len as u64;
    room >= left
        && sges.iter().filter(|s| s.length > 0).all(|s| {
            let ok = left == 0 || local_ok(keys, pd, s, true);
            left -= left.min(s.length as u64);
            ok
        })
}

/// Where a message lands in a scatter list that [`scatter`] checked.
pub(super) enum Scatter<'k> {
    /// The common case: one SGE that holds it all, found at once (the message's bytes).
    One(Span<'k>),
    /// Any other list, walked again by [`ranges`] to copy.
    List,
}

/// Where a message of `len` bytes lands in `sges`, if they take it as the packet path's scatter
/// checks them (see [`reaches`]).
#[inline(always)]
pub(super) fn scatter<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    sges: &[Sge],
    len: u32,
) -> Option<Scatter<'k>> {
    match sges {
        [s] if len > 0 && s.length >= len => local_span(keys, pd, s, true)
            .and_then(|span| span.part(0, len as usize))
            .map(Scatter::One),
        _ => reaches(keys, pd, sges, len).then_some(Scatter::List),
    }
}

impl Scatter<'_> {
    /// Copies `piece` (`len` bytes) into the list it was found in.
    #[inline(always)]
    pub(super) fn fill(self, keys: &KeyTable, sges: &[Sge], piece: Src<'_>, len: u32) -> bool {
        match self {
            Scatter::One(span) => copy_into(piece, span),
            Scatter::List => copy(std::iter::once(piece), ranges(keys, sges, len)),
        }
    }
}

/// The memory of checked SGEs, in order, up to `len` bytes.
pub(super) fn ranges<'k>(
    keys: &'k KeyTable,
    sges: &'k [Sge],
    len: u32,
) -> impl Iterator<Item = Dst<'k>> {
    let mut left = len as usize;
    sges.iter().filter(|s| s.length > 0).map_while(move |s| {
        if left == 0 {
            return None;
        }
        let mr = keys.mr(s.lkey)?;
        let off = mr.offset_of(s.addr, s.length as u64)?;
        let take = left.min(s.length as usize);
        left -= take;
        Some((&*mr.region, off, take))
    })
}

/// The source of a checked SEND/WRITE if it is one piece.
/// `None` also where the one SGE fails [`local_ok`].
fn single<'k>(keys: &'k KeyTable, pd: &Arc<PdInner>, wqe: &Request<'k>) -> Option<Src<'k>> {
    if wqe.flags.contains(SendFlags::INLINE) {
        return Some(Src::Bytes(wqe.inline));
    }
    let [sge] = wqe.sges else { return None };
    source(keys, pd, sge)
}

/// The source of a checked SEND/WRITE: its inline bytes, or its SGEs' memory.
pub(super) fn sources<'k>(keys: &'k KeyTable, wqe: &Request<'k>) -> impl Iterator<Item = Src<'k>> {
    let inline = wqe.flags.contains(SendFlags::INLINE);
    let sges = if inline { &[][..] } else { wqe.sges };
    inline
        .then_some(Src::Bytes(wqe.inline))
        .into_iter()
        .chain(ranges(keys, sges, wqe.length).map(|(r, o, n)| Src::Mem(r, o, n)))
}

/// The memory an rkey names for `(rkey, va, len)` with `access`, as the responder checks it;
/// `Some(None)` for a zero-length access. `None` for anything the packet path must handle: a
/// bad key, a memory window, memory that may fault.
pub(super) fn remote<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    key: (u32, u64, u32),
    access: AccessFlags,
) -> Option<Option<(&'k MemRegion, usize)>> {
    if key.2 == 0 {
        return Some(None);
    }
    keys.range(key.0, pd, access, key.1, u64::from(key.2)).map(Some)
}

/// Takes the responder's next receive WQE (from its SRQ if it has one) if `place` succeeds
/// with its SGEs; the WQE's `wr_id`. (Out of line: inlined into the lane's SENDs, it grew the
/// post's one function that holds every opcode's lane, and every count with it: instructions
/// per WRITE + poll 509 -> 519, per SEND hop 869 -> 906.)
///
/// The SRQ's way is a function of its own: with one call of `place` here, the compiler
/// inlines it into the receive queue's way (called from both ways, it made it a function of
/// its own, a call with its registers saved and restored).
#[inline(never)]
pub(super) fn take_recv(
    dst: &Arc<QpShared>,
    _dg: &mut QpInner,
    place: impl FnOnce(&[Sge]) -> Option<()>,
) -> Option<u64> {
    if let Some(srq) = &dst.srq {
        return take_shared_recv(srq, place);
    }
    // `_dg`: the peer's lock is held, which makes this thread its queue's one consumer.
    dst.rq.take_with(|w| place(&w.sges).map(|()| w.wr_id))
}

/// [`take_recv`] from an SRQ.
#[inline(never)]
fn take_shared_recv(srq: &Arc<SrqInner>, place: impl FnOnce(&[Sge]) -> Option<()>) -> Option<u64> {
    srq.pop_with(|w| place(&w.sges).map(|()| w.wr_id))
}

/// Copies the sources, in order, into consecutive destination ranges (stopping where either
/// ends). Every range was checked; false if memory went away under its MR (the copy faulted).
pub(super) fn copy<'a, 'b>(
    src: impl Iterator<Item = Src<'a>>,
    mut dst: impl Iterator<Item = Dst<'b>>,
) -> bool {
    let mut cur = dst.next();
    for piece in src {
        let mut done = 0usize;
        while done < piece.len() {
            let Some((region, off, room)) = cur else { return true };
            let n = room.min(piece.len() - done);
            if !copy_piece(piece, done, region, off, n) {
                return false;
            }
            done += n;
            cur = if n == room { dst.next() } else { Some((region, off + n, room - n)) };
        }
    }
    true
}

/// Carries out an atomic, `(compare_swap, compare_add, swap)`, on the word `(pd, rkey, va)`
/// names in `rkeys`, its original value written into the result buffer `sges` (checked in
/// `lkeys` for `pd`, before the word is touched): that value, or `None` for anything the packet
/// path must handle (a bad key, a misaligned word, memory that may fault).
pub(super) fn atomic(
    (lkeys, pd, sges): (&KeyTable, &Arc<PdInner>, &[Sge]),
    (rkeys, (dst_pd, rkey, va)): (&KeyTable, (&Arc<PdInner>, u32, u64)),
    (compare_swap, compare_add, swap): (bool, u64, u64),
) -> Option<u64> {
    let Some(Some((region, off))) =
        remote(rkeys, dst_pd, (rkey, va, 8), AccessFlags::REMOTE_ATOMIC)
    else {
        return None;
    };
    // An atomic must be aligned in memory (the packet path refuses it otherwise).
    let aligned = region.host_addr().wrapping_add(off as u64) % 8 == 0;
    let into = scatter(lkeys, pd, sges, 8)?;
    if !aligned {
        return None;
    }
    let op = if compare_swap {
        region.compare_swap(off, compare_add, swap)
    } else {
        region.fetch_add(off, compare_add)
    };
    let orig = op.ok()?;
    into.fill(lkeys, sges, Src::Bytes(&orig.to_ne_bytes()), 8).then_some(orig)
}

/// Copies all of `piece` into `dst` (of its length); false if its memory went away after its
/// registration.
pub(super) fn read_piece(piece: Src<'_>, dst: &mut [u8]) -> bool {
    match piece {
        Src::Bytes(b) => {
            dst.copy_from_slice(b);
            true
        }
        Src::Mem(region, off, _) => region.read(off, dst).is_ok(),
        Src::Span(s) => s.read(dst).is_ok(),
    }
}

/// Copies `n` bytes of `piece` from `at` to `region` at `off` (checked ranges); false if the
/// memory of either went away after its registration (the packet path then reports it).
#[inline(always)]
pub(super) fn copy_piece(
    piece: Src<'_>,
    at: usize,
    region: &MemRegion,
    off: usize,
    n: usize,
) -> bool {
    match piece {
        Src::Bytes(b) => region.write(off, &b[at..at + n]),
        Src::Mem(r, o, _) => MemRegion::copy(r, o + at, region, off, n),
        Src::Span(s) => match s.part(at, n) {
            Some(s) => region.put(off, s),
            None => return false,
        },
    }
    .is_ok()
}

/// Copies all of `piece` into `dst`, of its length; false if the memory of either went away
/// after its registration.
#[inline(always)]
pub(super) fn copy_into(piece: Src<'_>, dst: Span<'_>) -> bool {
    match piece {
        Src::Bytes(b) => dst.write(b),
        Src::Mem(r, o, n) if n == dst.len() => r.get(o, dst),
        Src::Mem(..) => Err(MemFault::OutOfBounds),
        Src::Span(s) => dst.copy_from(s),
    }
    .is_ok()
}

/// [`remote`]'s memory as a [`Span`].
#[inline(always)]
pub(super) fn remote_span<'k>(
    keys: &'k KeyTable,
    pd: &Arc<PdInner>,
    (rkey, va, len): (u32, u64, u32),
    access: AccessFlags,
) -> Option<Option<Span<'k>>> {
    if len == 0 {
        return Some(None);
    }
    keys.span(rkey, pd, access, va, u64::from(len)).map(Some)
}

#[cfg(test)]
mod test {
    use crate::{engine::testkit, *};

    /// An XRC initiator's SEND and WRITE run on the express path (on a lane of their own,
    /// not the RC/UC lane's), the SEND's receive taken off the XRC SRQ it names and completed
    /// on that SRQ's CQ; a request naming no SRQ of the domain goes the packet path, whose
    /// target NAKs it. (That the SRQ's PD checks the keys, `tests/express.rs` shows: its
    /// domain has SRQs on two PDs.)
    #[test]
    fn xrc_requests_run_at_the_post_into_the_srq_they_name() {
        let f = Fabric::new(FabricConfig { devices: 2, ..Default::default() });
        let devs = f.devices();
        let a = testkit::side_of(&devs[0], QpType::XRC_SEND);
        let ctx = devs[1].open().unwrap();
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(16, None, 0).unwrap());
        let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
        let xrcd = ctx.open_xrcd(None, xrcd_oflags::CREAT).unwrap();
        let attr = SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 };
        let srq = xrcd.create_srq(&pd, &cq, &attr).unwrap();
        let tgt = xrcd.create_recv_qp().unwrap();
        a.qp.connect(1, &tgt.endpoint(2), &RcParams::default()).unwrap();
        tgt.connect(2, &a.qp.endpoint(1), &RcParams::default()).unwrap();
        let srqn = srq.srq_num().unwrap();
        a.mr.write(0, b"xrc-bytes").unwrap();
        let src = [Sge { addr: a.mr.addr(), length: 9, lkey: a.mr.lkey() }];
        let into = [Sge { addr: mr.addr() + 100, length: 64, lkey: mr.lkey() }];
        srq.post_recv(&RecvWr { wr_id: 7, sg_list: &into }).unwrap();

        a.qp.post_send(&SendWr::send(1, &src).to_srq(srqn).signaled()).unwrap();
        let lanes = |qp: &Qp| {
            let g = qp.0.inner.lock();
            (g.lane.is_some(), g.xrc_lane.is_some())
        };
        assert_eq!(lanes(&a.qp), (false, true), "ran on the XRC initiator's own lane");
        let wc = cq.poll_one().expect("completed at the post");
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len, wc.qp_num),
            (7, WcStatus::SUCCESS, 9, tgt.qp_num())
        );
        assert_eq!(a.cq.poll_one().map(|w| (w.wr_id, w.status)), Some((1, WcStatus::SUCCESS)));
        let wr = SendWr::write(2, &src, mr.addr() + 200, mr.rkey()).to_srq(srqn).signaled();
        a.qp.post_send(&wr).unwrap();
        assert_eq!(a.cq.poll_one().map(|w| (w.wr_id, w.status)), Some((2, WcStatus::SUCCESS)));
        let mut got = [0u8; 9];
        for at in [100, 200] {
            mr.read(at, &mut got).unwrap();
            assert_eq!(&got, b"xrc-bytes");
        }

        let wr = SendWr::write(3, &src, mr.addr(), mr.rkey()).to_srq(srqn ^ 0x40).signaled();
        a.qp.post_send(&wr).unwrap();
        let wc = loop {
            if let Some(wc) = a.cq.poll_one() {
                break wc;
            }
        };
        assert_eq!((wc.wr_id, wc.status), (3, WcStatus::REM_ACCESS_ERR));
    }
}
