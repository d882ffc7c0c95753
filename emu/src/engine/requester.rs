//! The requester (after `rxe_req.c`): turns send WQEs into request packets, assigns PSNs,
//! honours fences and the `max_rd_atomic` limit, and owns the retry timers.

use std::sync::Arc;

use super::{
    Driver, completer, packets_for, psn_add, psn_diff, raw,
    sgl::{self, SglError},
};
use crate::packet::{Kind, Packet, Payload};
use crate::{
    error::{Errno, Error, Result, einval},
    objects::mw,
    qp::{
        QpInner, QpShared, SendWr,
        queue::{SendWqe, UdTarget},
    },
    types::{
        EventType, FlushLevel, FlushType, Grh, QpState, QpType, SendFlags, WcStatus, WrOpcode,
    },
};

/// The destination QPN of datagrams sent to a multicast group.
pub(crate) const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// What the post checks of an atomic's operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operands {
    /// `ibv_post_send`'s: a result buffer of at least 8 bytes, and (rxe) an aligned word.
    Checked,
    /// Those of a request built with the `ibv_wr_*` calls, whose builders check neither (rxe's
    /// and mlx5's): it goes out and fails as it runs, `LOC_PROT_ERR` for a result that does
    /// not fit (the remote word changed all the same), `REM_INV_REQ_ERR` for a misaligned word.
    AsBuilt,
}

/// Validates `wr` the way rxe's provider and kernel do and queues it, or runs it at once on
/// the express path; whether it was queued (and the QP needs servicing).
pub(crate) fn post(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    wr: &SendWr<'_>,
    f: &crate::fabric::FabricInner,
    operands: Operands,
) -> Result<bool> {
    if let Some(length) = express_length(qp, g, wr) {
        if super::express::post(qp, g, wr, length, f) {
            return Ok(false);
        }
        // Every check below passes for it (see `express_length`): queued as it is.
        return queue(g, wr, length, None).map(|()| true);
    }
    if qp.qp_type == QpType::XRC_RECV || qp.rss.is_some() {
        return Err(einval("an XRC target or RSS QP has no send queue"));
    }
    // rxe refuses a post below RTS; mlx5 (rdma-core 40 on) one before the QP reached RTS
    // since its last RESET (IBA C10-22, C10-25, C10-29): to ERR from INIT, say.
    let refused = match qp.ctx.device.profile {
        crate::Profile::Rxe => matches!(g.state, QpState::RESET | QpState::INIT | QpState::RTR),
        crate::Profile::Full => !g.sq_open,
    };
    if refused {
        return Err(einval("QP is not ready to send (state below RTS)"));
    }
    let cap = &qp.cap;
    if wr.sg_list.len() > cap.max_send_sge as usize {
        return Err(einval("num_sge above max_send_sge"));
    }
    match wr.opcode {
        WrOpcode::SEND
        | WrOpcode::SEND_WITH_IMM
        | WrOpcode::RDMA_WRITE
        | WrOpcode::RDMA_WRITE_WITH_IMM
        | WrOpcode::RDMA_READ
        | WrOpcode::ATOMIC_CMP_AND_SWP
        | WrOpcode::ATOMIC_FETCH_AND_ADD => {}
        WrOpcode::BIND_MW | WrOpcode::LOCAL_INV | WrOpcode::SEND_WITH_INV => {
            if !qp.ctx.device.attr.has_memory_windows() {
                return Err(Error::new(Errno::EOPNOTSUPP, "the device has no memory windows"));
            }
            if qp.qp_type == QpType::UD && wr.opcode == WrOpcode::BIND_MW {
                // rxe's provider refuses a bind on UD at the post; a LOCAL_INV or a SEND with
                // invalidate it takes and fails (see `carries`).
                return Err(einval("a window is bound through a connected QP"));
            }
            if wr.opcode == WrOpcode::BIND_MW && wr.bind.is_none() {
                return Err(einval("a BIND_MW request names no window"));
            }
        }
        // rxe (6.1) takes it and fails it at execution (`build`).
        WrOpcode::ATOMIC_WRITE => {}
        WrOpcode::TSO if qp.ctx.device.attr.max_tso == 0 => {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no TSO"));
        }
        WrOpcode::TSO => {
            let ok = wr.tso.is_some_and(|t| {
                !t.hdr.is_empty() && t.hdr.len() as u32 <= qp.max_tso_header && t.mss > 0
            });
            if !ok {
                return Err(einval(
                    "TSO needs a raw packet QP with max_tso_header, a header and an MSS",
                ));
            }
        }
        WrOpcode::FLUSH if !qp.ctx.device.attr.flush => {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no RDMA FLUSH"));
        }
        WrOpcode::FLUSH => {
            let ok = wr.flush.is_some_and(|f| {
                !f.placement.is_empty()
                    && FlushType::all().contains(f.placement)
                    && matches!(f.level, FlushLevel::RANGE | FlushLevel::MR)
            });
            if !ok {
                return Err(einval("a FLUSH needs a placement type and a selectivity level"));
            }
        }
        _ => return Err(einval("invalid opcode")),
    }
    if qp.qp_type == QpType::RAW_PACKET && !matches!(wr.opcode, WrOpcode::SEND | WrOpcode::TSO) {
        return Err(einval("a raw packet QP sends SEND and TSO only"));
    }
    let ud = if qp.qp_type == QpType::UD {
        match &wr.ud {
            Some(u) => Some(ud_target(qp, g, u)?),
            // Built with the `ibv_wr_*` calls but no `ibv_wr_set_ud_addr`: rxe's builder takes
            // it, and it fails as it runs (a local QP operation error; the QP to ERR).
            None if operands == Operands::AsBuilt => Some(((u32::MAX, 0), 0, 0, None, true)),
            None => return Err(einval("a UD send needs an address handle")),
        }
    } else {
        None
    };
    let inline = wr.send_flags.contains(SendFlags::INLINE);
    let length: u64 = if let Some(f) = wr.flush.filter(|_| wr.opcode == WrOpcode::FLUSH) {
        // A FLUSH carries no data: its length is the range it covers.
        f.len as u64
    } else if inline {
        wr.inline_data.len() as u64
    } else {
        wr.sg_list.iter().map(|s| s.length as u64).sum()
    };
    let misaligned = misaligned(qp, wr);
    if is_atomic(wr) && operands == Operands::Checked && (length < 8 || misaligned) {
        return Err(einval("atomic needs 8 bytes at an 8-byte aligned remote address"));
    }
    if wr.opcode == WrOpcode::ATOMIC_WRITE
        && qp.ctx.device.attr.atomic_write
        && (length != 8 || misaligned)
    {
        return Err(einval("an atomic write is 8 bytes to an 8-byte aligned remote address"));
    }
    // An ATOMIC WRITE's 8 bytes may travel in the WQE (as `ibv_wr_atomic_write` gives them),
    // like an atomic's operands, whatever `max_inline_data` is.
    if inline && wr.opcode != WrOpcode::ATOMIC_WRITE {
        if length > cap.max_inline_data as u64 {
            return Err(einval("inline data above max_inline_data"));
        }
        if !carries_inline(wr.opcode) {
            return Err(einval("IBV_SEND_INLINE is only valid for SEND and RDMA WRITE"));
        }
    }
    if length > u32::MAX as u64 {
        return Err(einval("message longer than 4 GiB"));
    }
    if qp.qp_type == QpType::RAW_PACKET && wr.opcode == WrOpcode::SEND && length < raw::MIN_FRAME {
        return Err(einval("a raw frame is at least 18 bytes"));
    }
    if wr.opcode == WrOpcode::TSO && length > qp.ctx.device.attr.max_tso as u64 {
        return Err(einval("TSO payload above max_tso"));
    }
    // (The connected express path runs RC and UC only: a UD request skips it.)
    match &ud {
        Some(dest) if super::datagram::post(qp, g, wr, dest, length as u32, f) => {
            return Ok(false);
        }
        None if super::express::post(qp, g, wr, length as u32, f) => return Ok(false),
        _ => {}
    }
    queue(g, wr, length as u32, ud).map(|()| true)
}

/// Where a UD request goes, as the post captures it from its address handle (`EINVAL` for a
/// destroyed one).
fn ud_target(qp: &QpShared, g: &QpInner, u: &crate::qp::UdDest<'_>) -> Result<UdTarget> {
    u.ah.check()?;
    let a = &u.ah.0.attr;
    let sgid = qp
        .ctx
        .device
        .port(g.attr.port_num)
        .ok()
        .and_then(|p| p.gids.iter().find(|e| e.index == a.sgid_index as u32).map(|e| e.gid))
        .unwrap_or_default();
    let dest = u.ah.0.dest.unwrap_or((u32::MAX, 0));
    let grh = Grh {
        sgid,
        dgid: a.dgid,
        traffic_class: a.traffic_class,
        // rxe sends IPv6 with flow label 0 whatever the AH says; mlx5 sends the AH's.
        flow_label: match qp.ctx.device.profile {
            crate::Profile::Rxe => 0,
            crate::Profile::Full => a.flow_label & 0xf_ffff,
        },
        hop_limit: a.hop_limit,
    };
    // An AH of another PD is taken by the post: rxe fails the WR when it runs (a local
    // QP operation error); mlx5 copies the AH's address into the WQE and sends.
    let foreign = !Arc::ptr_eq(&u.ah.0.pd, &qp.pd) && qp.ctx.device.profile == crate::Profile::Rxe;
    Ok((dest, u.remote_qpn, u.remote_qkey, a.is_global.then_some(grh), foreign))
}

/// Queues `wr`, checked, of `length` bytes (to `ud` on a UD QP) at the head of the send
/// queue; `ENOMEM` if the queue is full.
pub(super) fn queue(
    g: &mut QpInner,
    wr: &SendWr<'_>,
    length: u32,
    ud: Option<UdTarget>,
) -> Result<()> {
    let inline = wr.send_flags.contains(SendFlags::INLINE);
    let sq = &mut g.sq;
    if sq.full() {
        return Err(Error::new(Errno::ENOMEM, "send queue is full"));
    }
    let head = sq.head;
    let wqe = sq.ring.at_mut(head);
    wqe.wr_id = wr.wr_id;
    wqe.opcode = wr.opcode;
    wqe.flags = wr.send_flags;
    wqe.sges.clear();
    wqe.inline.clear();
    match (inline, wr.sg_list) {
        (true, _) => crate::mem::append_bytes(&mut wqe.inline, wr.inline_data),
        // The commonest list: one SGE, stored without a call to `memcpy`.
        (false, [sge]) => wqe.sges.push(*sge),
        (false, list) => wqe.sges.extend_from_slice(list),
    }
    wqe.imm = wr.imm_data;
    wqe.remote_addr = wr.remote_addr;
    wqe.rkey = wr.rkey;
    wqe.compare_add = wr.compare_add;
    wqe.swap = wr.swap;
    wqe.length = length;
    wqe.status = WcStatus::SUCCESS;
    // Only a UD QP's requests have one (the slots of another stay `None`): stored always, the
    // address took ~20 instructions per request of every other QP.
    if ud.is_some() || wqe.ud.is_some() {
        wqe.ud = ud;
    }
    wqe.bind = wr.bind.map(|b| b.args()).unwrap_or_default();
    if let Some(b) = wr.bind {
        // The window's rkey is the posted bind's from now on (what `ibv_mw.rkey` holds).
        b.mw.set_rkey(b.rkey);
    }
    wqe.inv_rkey = wr.invalidate_rkey;
    wqe.xrc_srqn = wr.xrc_remote_srqn;
    wqe.hidden = crate::qp::queue::Hidden::None;
    wqe.feth = wr
        .flush
        .filter(|_| wr.opcode == WrOpcode::FLUSH)
        .map_or(0, |f| f.placement.bits() | f.level.0 << 4);
    wqe.tso_hdr.clear();
    if let Some(t) = wr.tso.filter(|_| wr.opcode == WrOpcode::TSO) {
        wqe.tso_hdr.extend_from_slice(t.hdr);
        wqe.mss = t.mss;
    }
    sq.head = head.wrapping_add(1);
    Ok(())
}

/// The length of `wr` if it is the common request that every check of [`post`] passes and
/// the express path may run at once: a SEND, WRITE (with or without immediate), READ or atomic
/// (of 8 bytes or more, aligned where rxe requires it) on an RC or UC QP in RTS, its SGEs
/// within `max_send_sge`, inline data (SEND and WRITE only) within `max_inline_data`.
pub(super) fn express_length(qp: &QpShared, g: &QpInner, wr: &SendWr<'_>) -> Option<u32> {
    let atomic = is_atomic(wr);
    let common = matches!(qp.qp_type, QpType::RC | QpType::UC)
        && g.state == QpState::RTS
        && (atomic || carries_inline(wr.opcode) || wr.opcode == WrOpcode::RDMA_READ)
        && wr.sg_list.len() <= qp.cap.max_send_sge as usize;
    if !common {
        return None;
    }
    if wr.send_flags.contains(SendFlags::INLINE) {
        let len = wr.inline_data.len();
        let ok = carries_inline(wr.opcode) && len <= qp.cap.max_inline_data as usize;
        return ok.then_some(len as u32);
    }
    let length: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
    // What `post` refuses of an atomic.
    if atomic && (length < 8 || misaligned(qp, wr)) {
        return None;
    }
    u32::try_from(length).ok()
}

/// Whether `IBV_SEND_INLINE` is valid for `op` (SEND and RDMA WRITE, with or without
/// immediate).
fn carries_inline(op: WrOpcode) -> bool {
    matches!(
        op,
        WrOpcode::SEND
            | WrOpcode::SEND_WITH_IMM
            | WrOpcode::RDMA_WRITE
            | WrOpcode::RDMA_WRITE_WITH_IMM
    )
}

fn is_atomic(wr: &SendWr<'_>) -> bool {
    matches!(wr.opcode, WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD)
}

/// Whether an atomic's remote address is refused at the post: rxe's provider refuses a
/// misaligned one there; mlx5 (the full profile) takes it and the responder refuses it (an
/// invalid request: REM_INV_REQ_ERR).
fn misaligned(qp: &QpShared, wr: &SendWr<'_>) -> bool {
    wr.remote_addr & 7 != 0 && qp.ctx.device.profile == crate::Profile::Rxe
}

/// Queues the rendezvous of a matched tag as an mlx5 HCA runs it: an RDMA READ of `read`
/// (va, rkey, length) from the sender into the tag's `sges`, then the FIN, a SEND of the 16
/// bytes `fin` (a TMH with opcode FIN). `false` when the QP cannot send or its send queue has
/// no room for both: the caller hands the rendezvous to software.
pub(crate) fn queue_rndv(
    g: &mut QpInner,
    read: (u64, u32, u32),
    sges: &[crate::types::Sge],
    done: crate::qp::queue::Hidden,
    fin: [u8; 16],
) -> bool {
    use crate::qp::queue::Hidden;
    let sq = &mut g.sq;
    // In the room the QP keeps for them (the application's WQEs stay within `depth`).
    if g.state != QpState::RTS || sq.hidden() + 2 > sq.reserve {
        return false;
    }
    for (opcode, hidden) in [(WrOpcode::RDMA_READ, done), (WrOpcode::SEND, Hidden::Fin)] {
        let head = sq.head;
        let wqe = sq.ring.at_mut(head);
        let is_read = opcode == WrOpcode::RDMA_READ;
        wqe.wr_id = 0;
        wqe.opcode = opcode;
        wqe.flags = if is_read { SendFlags::empty() } else { SendFlags::INLINE };
        wqe.sges.clear();
        wqe.inline.clear();
        if is_read {
            wqe.sges.extend_from_slice(sges);
        } else {
            wqe.inline.extend_from_slice(&fin);
        }
        (wqe.imm, wqe.compare_add, wqe.swap, wqe.inv_rkey, wqe.xrc_srqn, wqe.feth) =
            (0, 0, 0, 0, 0, 0);
        (wqe.remote_addr, wqe.rkey) = if is_read { (read.0, read.1) } else { (0, 0) };
        wqe.length = if is_read { read.2 } else { fin.len() as u32 };
        wqe.status = WcStatus::SUCCESS;
        wqe.ud = None;
        wqe.bind = Default::default();
        wqe.tso_hdr.clear();
        wqe.hidden = hidden;
        sq.head = head.wrapping_add(1);
    }
    true
}

/// The most PSNs a requester keeps unacknowledged over a wire port (rxe's
/// `RXE_MAX_UNACKED_PSNS`).
const MAX_UNACKED_PSNS: i32 = 128;

/// Sends every WQE the state, the fence and the `max_rd_atomic` window allow; returns whether
/// it sent anything.
pub(crate) fn run(qp: &Arc<QpShared>, g: &mut QpInner, drv: &mut Driver<'_>) -> bool {
    match g.state {
        QpState::RTS => {}
        QpState::ERR => {
            completer::flush_send_queue(qp, g);
            return false;
        }
        QpState::SQD => {
            if g.sq.in_flight() == 0 && !g.req.drained_reported {
                g.req.drained_reported = true;
                if g.attr.en_sqd_async_notify != 0 {
                    qp.raise(EventType::SQ_DRAINED);
                }
            }
            return false;
        }
        _ => return false,
    }
    g.req.drained_reported = false;
    if g.req.rnr_until.is_some() {
        return false;
    }
    let mut sent = false;
    while g.sq.next != g.sq.head {
        let idx = g.sq.next;
        if let Some((at, status)) = g.req.failed
            && at == idx
        {
            // Nothing after it goes; it fails once every earlier WQE has completed.
            if idx == g.sq.tail {
                g.req.failed = None;
                completer::fail_wqe(qp, g, idx, status);
            }
            return sent;
        }
        let wqe = g.sq.ring.at(idx);
        if !carries(qp.qp_type, wqe.opcode) {
            // An opcode the transport lacks (a READ on UC, a WRITE on UD) is taken by the post,
            // as rxe and hardware take it, and fails here: a local QP operation error. (Only
            // UC and UD lack any, and their WRs leave nothing in flight.)
            completer::fail_wqe(qp, g, idx, WcStatus::LOC_QP_OP_ERR);
            return sent;
        }
        if wqe.is_local() {
            // Local operations run once every earlier WR has completed (a stronger order than
            // the fence IBA asks for), so a window changes exactly between two messages.
            if g.sq.in_flight() > 0 {
                break;
            }
            g.sq.next = idx.wrapping_add(1);
            match local_op(qp, g, idx) {
                Ok(()) => completer::complete_ok(qp, g),
                Err(status) => {
                    completer::fail_wqe(qp, g, idx, status);
                    return sent;
                }
            }
            continue;
        }
        if qp.qp_type == QpType::RAW_PACKET {
            // A frame needs no acknowledgement: the WR is complete once it left.
            match raw::transmit(qp, g, idx, drv) {
                Ok(()) => {
                    g.sq.next = idx.wrapping_add(1);
                    sent = true;
                    completer::complete_ok(qp, g);
                }
                Err(status) => {
                    completer::fail_wqe(qp, g, idx, status);
                    return sent;
                }
            }
            continue;
        }
        if waits(g, wqe) {
            break;
        }
        let rd_atomic = wqe.is_read_or_atomic();
        if g.wire_grh.is_some() && g.sq.in_flight() > 0 && qp.qp_type.is_reliable() {
            // Over a wire, at most MAX_UNACKED_PSNS PSNs beyond the oldest unacknowledged one
            // (rxe's limit), so that a burst does not overflow the receiver's socket.
            let end = psn_add(g.req.psn, packets_for(wqe.length, g.mtu));
            if psn_diff(end, g.sq.ring.at(g.sq.tail).first_psn) > MAX_UNACKED_PSNS {
                break;
            }
        }
        if super::express::from_queue(qp, g, idx, drv) {
            continue;
        }
        if g.req.carrying && super::absent_peer::carry_out_unsent(qp, g, idx, drv) {
            continue;
        }
        if g.lane_across && super::leaving::send(qp, g, idx, drv) {
            sent = true;
            continue;
        }
        if g.lane_across
            && qp.qp_type == QpType::UC
            && super::absent_peer::carry_out_ahead(qp, g, idx, drv)
        {
            continue;
        }
        match build(qp, g, idx) {
            Ok(pkt) => {
                g.sq.next = idx.wrapping_add(1);
                if rd_atomic {
                    g.req.rd_atomic_in_flight += 1;
                }
                sent = true;
                if pkt.dst_qpn == MULTICAST_QPN {
                    // A datagram to a multicast group: one copy to every attached QP here,
                    // and one to every other process on the host fabric, which hands it to
                    // the members it has.
                    qp.ctx.fabric.multicast_to_other_nodes(&pkt);
                    super::fan_out(&qp.ctx.fabric, &pkt, drv);
                } else {
                    super::absent_peer::note_unsent(qp, g, drv);
                    if matches!(qp.qp_type, QpType::RC | QpType::UC) {
                        super::absent_peer::send_placing(qp, g, idx, pkt, drv);
                    } else {
                        drv.send(&mut g.route, pkt);
                    }
                }
                if !qp.qp_type.is_reliable() {
                    // Unreliable: the WR is complete once its message is on the wire.
                    completer::complete_ok(qp, g);
                }
            }
            Err(status) if qp.qp_type == QpType::UD && status == WcStatus::LOC_LEN_ERR => {
                // A UD send that cannot go (longer than the MTU) fails alone with a local
                // length error; the QP keeps running. (A protection error fails the QP.)
                g.sq.next = idx.wrapping_add(1);
                completer::complete_err(qp, g, status);
            }
            Err(status) => {
                fail_in_turn(qp, g, idx, status);
                return sent;
            }
        }
    }
    sent
}

/// Whether `wqe`, the next to send, waits for READs and atomics in flight: fenced behind
/// them, or one more than the responder takes.
pub(super) fn waits(g: &QpInner, wqe: &SendWqe) -> bool {
    let in_flight = g.req.rd_atomic_in_flight;
    wqe.flags.contains(SendFlags::FENCE) && in_flight > 0
        || wqe.is_read_or_atomic() && in_flight >= u32::from(g.attr.max_rd_atomic)
}

/// Fails the WQE at `idx`, which cannot be sent, in its turn: at once if no earlier WQE is
/// outstanding, else once they have completed (as rxe's completer reaches an errored WQE in
/// order), so that their completions come first and none is lost.
fn fail_in_turn(qp: &Arc<QpShared>, g: &mut QpInner, idx: u32, status: WcStatus) {
    if idx == g.sq.tail {
        completer::fail_wqe(qp, g, idx, status);
    } else {
        g.req.failed = Some((idx, status));
    }
}

/// Whether a QP of `ty` carries requests of `op`: UC no READ, atomics or SEND with invalidate,
/// UD nothing but SEND
/// (binds, which `post` refuses on UD, do not get here).
fn carries(ty: QpType, op: WrOpcode) -> bool {
    let rdma = matches!(
        op,
        WrOpcode::RDMA_WRITE
            | WrOpcode::RDMA_WRITE_WITH_IMM
            | WrOpcode::RDMA_READ
            | WrOpcode::ATOMIC_CMP_AND_SWP
            | WrOpcode::ATOMIC_FETCH_AND_ADD
    );
    let read_atomic = rdma && !matches!(op, WrOpcode::RDMA_WRITE | WrOpcode::RDMA_WRITE_WITH_IMM)
        || op == WrOpcode::ATOMIC_WRITE
        || op == WrOpcode::FLUSH;
    match ty {
        QpType::UD => matches!(op, WrOpcode::SEND | WrOpcode::SEND_WITH_IMM),
        QpType::UC => !read_atomic && op != WrOpcode::SEND_WITH_INV,
        _ => true,
    }
}

/// Executes the bind or local invalidation of the WQE at `idx` (rxe_do_local_ops).
fn local_op(qp: &QpShared, g: &QpInner, idx: u32) -> Result<(), WcStatus> {
    let wqe = g.sq.ring.at(idx);
    let keys = qp.ctx.device.keys.read();
    if wqe.opcode == WrOpcode::BIND_MW {
        mw::bind(&keys, &qp.pd, qp.qpn, &wqe.bind).map_err(|()| WcStatus::MW_BIND_ERR)
    } else {
        mw::invalidate(&keys, wqe.inv_rkey, Some(qp.qpn)).map_err(|()| WcStatus::LOC_QP_OP_ERR)
    }
}

/// Builds the request packet for the WQE at `idx` and assigns its PSNs.
pub(super) fn build(qp: &QpShared, g: &mut QpInner, idx: u32) -> Result<Packet, WcStatus> {
    let mtu = g.mtu;
    let wqe = g.sq.ring.at(idx);
    if wqe.length > g.port.max_msg_sz || (wqe.ud.is_some() && wqe.length > g.port.mtu) {
        return Err(WcStatus::LOC_LEN_ERR);
    }
    if wqe.ud.as_ref().is_some_and(|u| u.4) {
        return Err(WcStatus::LOC_QP_OP_ERR);
    }
    let (kind, imm) = match wqe.opcode {
        WrOpcode::SEND => (Kind::Send, None),
        WrOpcode::SEND_WITH_IMM => (Kind::Send, Some(wqe.imm)),
        WrOpcode::SEND_WITH_INV => (Kind::Send, None),
        WrOpcode::RDMA_WRITE => (Kind::Write, None),
        WrOpcode::RDMA_WRITE_WITH_IMM => (Kind::Write, Some(wqe.imm)),
        WrOpcode::RDMA_READ => (Kind::ReadRequest, None),
        WrOpcode::ATOMIC_CMP_AND_SWP => (Kind::CompareSwap, None),
        WrOpcode::ATOMIC_FETCH_AND_ADD => (Kind::FetchAdd, None),
        WrOpcode::ATOMIC_WRITE if qp.ctx.device.attr.atomic_write => (Kind::AtomicWrite, None),
        WrOpcode::FLUSH if qp.ctx.device.attr.flush => (Kind::Flush, None),
        _ => return Err(WcStatus::LOC_QP_OP_ERR),
    };
    let mut pkt = Packet::new(kind);
    pkt.transport = qp.qp_type;
    pkt.mtu = mtu;
    pkt.imm = imm;
    pkt.inv = (wqe.opcode == WrOpcode::SEND_WITH_INV).then_some(wqe.inv_rkey);
    pkt.xrc_srqn = wqe.xrc_srqn;
    pkt.len = wqe.length;
    match kind {
        Kind::Send | Kind::Write | Kind::AtomicWrite => {
            pkt.payload = if wqe.flags.contains(SendFlags::INLINE) {
                Payload::Bytes(wqe.inline.clone().into())
            } else {
                sgl::resolve(qp, &wqe.sges, false).map_err(|e| match e {
                    SglError::Protection => WcStatus::LOC_PROT_ERR,
                    SglError::TooLong => WcStatus::LOC_LEN_ERR,
                })?
            };
            pkt.npkts = packets_for(wqe.length, mtu);
            pkt.solicited =
                wqe.flags.contains(SendFlags::SOLICITED) && (kind == Kind::Send || imm.is_some());
        }
        Kind::Flush => pkt.feth = wqe.feth,
        Kind::ReadRequest => {
            // A READ touches its local buffers only when the response arrives (rxe, and a
            // NIC's DMA): with a bad lkey the request still goes, the responder's answer comes
            // back as data, and placing it fails then (LOC_PROT_ERR), unless the responder
            // refused first (a bad rkey: REM_ACCESS_ERR).
            pkt.payload = sgl::resolve(qp, &wqe.sges, true).unwrap_or(Payload::Remote);
            pkt.npkts = packets_for(wqe.length, mtu);
        }
        _ => {
            pkt.len = 8;
            pkt.swap_add = if kind == Kind::CompareSwap { wqe.swap } else { wqe.compare_add };
            pkt.compare = wqe.compare_add;
        }
    }
    if kind != Kind::Send {
        pkt.va = wqe.remote_addr;
        pkt.rkey = wqe.rkey;
    }
    pkt.src_dev = qp.device_index();
    pkt.src_qpn = qp.qpn;
    pkt.src_lid = g.port.lid;
    pkt.src_port = g.attr.port_num;
    match g.sq.ring.at(idx).ud {
        Some((dest, qpn, qkey, grh, _)) => {
            (pkt.dst_dev, pkt.dst_port) = dest;
            pkt.dst_qpn = qpn;
            // A Q_Key with the high bit set means "use the QP's own" (IBA 10.2.5).
            pkt.qkey = if qkey & 0x8000_0000 != 0 { g.attr.qkey } else { qkey };
            pkt.grh = grh.map(Box::new);
            pkt.npkts = 1;
        }
        None => {
            (pkt.dst_dev, pkt.dst_port) = g.dest.unwrap_or((u32::MAX, 0));
            pkt.dst_qpn = g.attr.dest_qp_num;
            pkt.grh = g.wire_grh.map(Box::new);
        }
    }
    pkt.psn = g.req.psn;
    let npkts = pkt.npkts;
    let wqe = g.sq.ring.at_mut(idx);
    wqe.first_psn = pkt.psn;
    wqe.last_psn = psn_add(pkt.psn, npkts - 1);
    g.req.psn = psn_add(pkt.psn, npkts);
    Ok(pkt)
}

/// Arms the timer for whatever deadline the QP now has (called once the fabric is quiet).
pub(crate) fn arm_timers(qp: &Arc<QpShared>, g: &mut QpInner, drv: &mut Driver<'_>) {
    if !matches!(g.state, QpState::RTS | QpState::SQD) {
        g.req.clear_timers();
        return;
    }
    if g.sq.in_flight() == 0 {
        if !lazy_deadline(g) {
            g.req.retrans_at = None;
        }
    } else if g.req.retrans_at.is_none()
        && let Some(t) = super::ack_timeout_ns(g.attr.timeout)
    {
        let at = drv.now() + carry_out_timeout(g, t);
        retrans_after(qp, g, at);
    }
    let deadline = match (g.req.rnr_until, g.req.retrans_at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if let Some(d) = deadline
        && g.req.armed.is_none_or(|a| d < a)
    {
        g.req.armed = Some(d);
        qp.ctx.fabric.timer.arm(d, qp);
    }
}

/// Sets the deadline of the oldest unacknowledged request, noting what had arrived for the QP
/// by then (see [`on_timer`]).
fn retrans_after(qp: &QpShared, g: &mut QpInner, at: u64) {
    g.req.retrans_at = Some(at);
    g.req.heard_at = qp.heard.load(std::sync::atomic::Ordering::Relaxed);
    g.req.progressed_since = false;
}

/// Whether the QP's ACK deadline outlives the completion of the requests it was set for, so
/// that a ping-pong reads the clock once per ACK timeout rather than once per request (a clock
/// read cost a cross-process round trip ~5%): for a QP whose peer is in another process on the
/// host fabric. A deadline that passes after a request completed, or after anything arrived
/// for the QP (`QpShared::heard`), is no timeout: it moves on by a timeout (see [`on_timer`]).
/// A request then times out between one and two ACK timeouts after it was sent, never sooner
/// (rxe's timer, left running too, may fire sooner: it is not restarted by a send).
pub(crate) fn lazy_deadline(g: &QpInner) -> bool {
    g.lane_across && g.wire_grh.is_none()
}

/// How soon a QP that carried out requests for its stopped peer looks for more (see
/// `absent_peer`), if its ACK timeout is longer.
const CARRY_OUT_AGAIN_NS: u64 = 1_000_000;

/// The wait before the next look at what is outstanding: the ACK timeout, or less while the
/// QP carries out its requests for a stopped peer.
fn carry_out_timeout(g: &QpInner, timeout: u64) -> u64 {
    if g.req.carrying { timeout.min(CARRY_OUT_AGAIN_NS) } else { timeout }
}

/// A timer deadline passed: end an RNR wait, or retransmit after an ACK timeout.
pub(crate) fn on_timer(qp: &Arc<QpShared>, g: &mut QpInner, drv: &mut Driver<'_>) {
    g.req.armed = None;
    if !matches!(g.state, QpState::RTS | QpState::SQD) {
        return;
    }
    let now = drv.now();
    if g.req.rnr_until.is_some_and(|t| now >= t) {
        g.req.rnr_until = None;
    }
    if g.req.retrans_at.is_some_and(|t| now >= t) {
        g.req.retrans_at = None;
        let timeout = super::ack_timeout_ns(g.attr.timeout).unwrap_or(0);
        // Another process is still delivering to this QP (a large response moves as one
        // message of many datagrams): on a wire each of its packets would have restarted the
        // timer, so this is not a timeout yet. Nor while the peer's process has not taken in
        // what it was sent (its threads not scheduled on a loaded machine, or the process
        // stopped by a debugger or SIGSTOP): a NIC would go on answering for it; what was
        // sent waits in the ring and is answered once it is taken in, and the wait spends
        // none of the retry budget, so the peer then has the whole budget to catch up.
        let delivering = qp.heard.load(std::sync::atomic::Ordering::Relaxed) != g.req.heard_at;
        let on_host = g.wire_grh.is_none();
        if g.sq.in_flight() == 0 && lazy_deadline(g) {
            // A deadline that outlived its requests: nothing is awaited.
            g.req.carrying = false;
        } else if delivering || g.req.progressed_since {
            retrans_after(qp, g, now + timeout);
        } else if on_host && g.sq.in_flight() > 0 && drv.fabric.peer_behind(g.attr.dest_qp_num) {
            // What it can, this side carries out itself for a peer that is stopped; while
            // it does, it looks again soon for more.
            g.req.carrying = super::absent_peer::carry_out(qp, g, drv);
            g.req.retry_left = g.attr.retry_cnt;
            retrans_after(qp, g, now + carry_out_timeout(g, timeout));
        } else if on_host && g.req.carrying {
            // The early look after carrying out found the peer running again: no timeout yet.
            g.req.carrying = false;
            retrans_after(qp, g, now + timeout);
        } else if g.sq.in_flight() > 0 {
            completer::retry(qp, g);
        }
    }
}

#[cfg(test)]
mod test {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::{SendWr, Sge, engine::testkit::unanswered_pair};

    /// An ACK deadline that passed while messages went on reaching the QP (a response held in
    /// records until whole, which the completer sees only then) is no timeout: the deadline
    /// moves and no retry is spent. One that passed in silence retries.
    #[test]
    fn test_a_deadline_passed_while_arrivals_came_is_no_timeout() {
        // The peer takes nothing: the WRITE stays unacknowledged.
        let (_f, a, b) = unanswered_pair();
        let s = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() }];
        a.qp.post_send(&SendWr::write(0, &s, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
        let qp = &a.qp.0;
        let fabric = qp.ctx.fabric.clone();
        // The deadline passes, with an arrival since it was set or without; the retries left
        // before and after, and whether a deadline is set after.
        let expire = |arrived: bool| {
            let mut g = qp.inner.lock();
            let mut drv = Driver::new(&fabric);
            // Nothing is delivered to the peer inline (a resend stays in its inbox).
            drv.enter(Arc::as_ptr(&b.qp.0));
            assert_eq!(g.sq.in_flight(), 1);
            assert!(g.req.retrans_at.is_some(), "the WRITE's deadline is set");
            g.req.retrans_at = Some(0);
            if arrived {
                qp.heard.fetch_add(1, Relaxed);
            }
            let before = g.req.retry_left;
            on_timer(qp, &mut g, &mut drv);
            let after = (g.req.retry_left, g.req.retrans_at.is_some_and(|t| t > 0));
            drop(g);
            drv.ready.clear();
            drv.check_timers.clear();
            (before, after)
        };
        let (before, (after, again)) = expire(true);
        assert_eq!((after, again), (before, true), "heard from: waits on, no retry spent");
        let (before, (after, _)) = expire(false);
        assert_eq!(after + 1, before, "silence: a retry");
    }

    /// A deadline that outlives its requests (a peer in another process: `lazy_deadline`)
    /// stays set as a request completes; passing after that completion, with another request
    /// outstanding, it moves on by a timeout and spends no retry; passing with nothing
    /// completed since it was set, it retries, as any deadline.
    #[test]
    fn test_a_deadline_kept_past_a_completion_is_no_timeout_until_silence() {
        let (_f, a, b) = unanswered_pair();
        let s = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() }];
        a.qp.post_send(&SendWr::write(0, &s, b.mr.addr(), b.mr.rkey()).signaled()).unwrap();
        let qp = &a.qp.0;
        let fabric = qp.ctx.fabric.clone();
        let mut g = qp.inner.lock();
        let mut drv = Driver::new(&fabric);
        drv.enter(Arc::as_ptr(&b.qp.0));
        g.lane_across = true; // as if the peer were another process's
        let set = g.req.retrans_at.expect("the WRITE's deadline is set");
        // An earlier request's completion: the deadline stays, and is no timeout now.
        crate::engine::completer::progressed(&mut g);
        assert_eq!(g.req.retrans_at, Some(set), "the deadline outlives the completion");
        let before = g.req.retry_left;
        g.req.retrans_at = Some(0);
        on_timer(qp, &mut g, &mut drv);
        assert_eq!(g.req.retry_left, before, "a completion came since: no retry spent");
        assert!(g.req.retrans_at.is_some_and(|t| t > 0), "the deadline moved on");
        // Nothing since: a retry.
        g.req.retrans_at = Some(0);
        on_timer(qp, &mut g, &mut drv);
        assert_eq!(g.req.retry_left + 1, before, "silence: a retry");
        g.lane_across = false;
        drop(g);
        drv.ready.clear();
        drv.check_timers.clear();
    }
}
