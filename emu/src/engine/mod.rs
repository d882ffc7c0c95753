//! The transport engine: requester, responder and completer, shaped after the kernel's rxe
//! (`rxe_req.c`, `rxe_resp.c`, `rxe_comp.c`).
//!
//! # Design rules
//! * The engine is plain functions of (QP state, packet, `now`). It never reads a clock, never
//!   sleeps and never spawns: the driver passes `now` in (see [`Driver::now`]).
//! * Each QP is serviced under its own lock. Packets for another QP go into that QP's inbox (a
//!   leaf lock), so no thread ever holds two QP locks and delivery stays FIFO per QP pair.
//! * The inline driver ([`Driver`]) runs every QP that received packets until the fabric is
//!   quiet, inside the verb that started the work (`post_send`, `post_recv`, `modify`). The
//!   timer thread (`fabric::timer`) is the same driver started by a deadline.

pub(crate) mod absent_peer;
pub(crate) mod arriving;
pub(crate) mod completer;
pub(crate) mod datagram;
pub(crate) mod express;
pub(crate) mod flow;
pub(crate) mod landing;
pub(crate) mod lane;
pub(crate) mod leaving;
pub(crate) mod raw;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod sgl;
#[cfg(test)]
pub(crate) mod testkit;
mod verbs;
pub(crate) mod xrc;

use std::sync::Arc;

// Sequence arithmetic, with the packets it numbers.
use crate::packet::{Kind, Packet};
pub(crate) use crate::packet::{PSN_MASK, packets_for, psn_add, psn_diff};
use crate::qp::transport::Route;
use crate::{
    fabric::FabricInner,
    profile::Profile,
    qp::{QpInner, QpShared},
    types::{QpState, Wc, WcFlags, WcOpcode, WcStatus},
};

/// RNR NAK timer codes to nanoseconds (IBA Table 45).
const RNR_TIMER_US: [u64; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

pub(crate) fn rnr_delay_ns(code: u8) -> u64 {
    RNR_TIMER_US[(code & 0x1f) as usize] * 1000
}

/// Local ACK timeout: 4.096 us * 2^timeout; `None` for 0 (no retransmission timer).
pub(crate) fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    (timeout != 0).then(|| 4096u64 << timeout.min(31))
}

/// Runs QPs until no packet is left in flight, then arms the timers work still needs.
///
/// A packet goes into its destination's inbox. If this driver is not already inside another
/// delivery and the destination's lock is free (`try_lock`, so no lock-order deadlock is
/// possible), the destination is serviced at once, while the sender's lock is still held;
/// replies to the sender land in its inbox and the sender's own `step` loop drains them. Any
/// destination that was busy is serviced in `finish`.
#[derive(Debug)]
pub(crate) struct Driver<'f> {
    fabric: &'f FabricInner,
    /// QPs that were handed packets and must still be serviced. (Rarely more than one or
    /// two, held in place: a driver is made per verb call, and across processes per message.)
    ready: QpList,
    /// QPs whose last service left work that needs a timer.
    check_timers: QpList,
    /// The QPs this driver is servicing right now (outermost first): their `step` loops will
    /// drain what is delivered to them.
    active: [*const QpShared; 2],
    depth: usize,
    now: Option<u64>,
}

/// A few QPs, held in place up to four (no allocation per work request).
pub(crate) type QpList = smallvec::SmallVec<[Arc<QpShared>; 4]>;

impl<'f> Driver<'f> {
    pub(crate) fn new(fabric: &'f FabricInner) -> Driver<'f> {
        Driver {
            fabric,
            ready: QpList::new(),
            check_timers: QpList::new(),
            active: [std::ptr::null(); 2],
            depth: 0,
            now: None,
        }
    }

    /// The time, read once per drive (the engine sees a consistent instant).
    pub(crate) fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(|| self.fabric.now())
    }

    /// Hands `pkt` to its destination QP, found through `route` (the sender's cache). A packet
    /// with no live destination is lost, as on a wire; the sender's timers take care of it.
    ///
    /// On the way, the packet is written to the packet trace and meets the fault rules.
    pub(crate) fn send(&mut self, route: &mut Route, pkt: Packet) {
        use crate::fabric::{faults::Verdict, timer::Job};
        let f = self.fabric;
        // A raw frame is traced once when sent (`raw::send_frame`), not per receiver.
        let trace = if pkt.kind == Kind::Raw { None } else { f.pcap.as_ref() };
        if !f.faulted() {
            if let Some(pcap) = trace {
                pcap.record(f, &pkt, self.now(), false);
            }
            return self.transmit(route, pkt);
        }
        let now = self.now();
        let verdict = f.faults.judge(&pkt, now);
        if let Some(pcap) = trace {
            pcap.record(f, &pkt, now, verdict == Verdict::Corrupt);
            if verdict == Verdict::Duplicate {
                pcap.record(f, &pkt, now, false);
            }
        }
        match verdict {
            Verdict::Pass => {
                let held = f.faults.release_after(&pkt);
                self.transmit(route, pkt);
                for h in held {
                    self.transmit(&mut Route::default(), h);
                }
            }
            // A damaged packet fails the receiver's ICRC check: dropped there.
            Verdict::Drop | Verdict::Corrupt => {}
            Verdict::Delay(ns) => f.timer.schedule(now + ns, Job::Packet(Box::new(pkt))),
            Verdict::Duplicate => {
                self.transmit(route, pkt.clone());
                self.transmit(route, pkt);
            }
            Verdict::Reorder(ns) => {
                let (flow, psn) = ((pkt.src_dev, pkt.src_qpn, pkt.dst_qpn), pkt.psn);
                f.faults.hold(pkt);
                f.timer.schedule(now + ns, Job::Unhold { flow, psn });
            }
        }
    }

    /// The positive ACK of the request `req` (through `psn`, with `msn`) when its requester is
    /// in another process and nothing must see the ACK as a packet (fault rules, a packet
    /// trace): sent in its short form, no packet built. Whether it was (if not, the caller
    /// sends it as a packet, which meets the same end where this declined: a port down).
    pub(crate) fn ack_across(&self, req: &Packet, psn: u32, msn: u32) -> bool {
        let (src, dst) =
            ((req.dst_dev, req.dst_port, req.dst_qpn), (req.src_dev, req.src_port, req.src_qpn));
        let Some(node) = ack_route(self.fabric, src, dst) else { return false };
        node.send_ack(&crate::wire::Ack { src, dst, psn, msn });
        true
    }

    /// Whether a fault rule makes the responder treat the SEND `pkt` as finding no receive.
    pub(crate) fn forced_rnr(&mut self, pkt: &Packet) -> bool {
        self.fabric.faulted() && {
            let now = self.now();
            self.fabric.faults.force_rnr(pkt, now)
        }
    }

    /// Puts `pkt` on the wire to its destination.
    pub(crate) fn transmit(&mut self, route: &mut Route, pkt: Packet) {
        // A packet leaving or reaching a port that is down is lost on the wire.
        let f = self.fabric;
        if !f.port_up(pkt.src_dev, pkt.src_port) || !f.port_up(pkt.dst_dev, pkt.dst_port) {
            return;
        }
        if pkt.dst_dev == crate::types::WIRE_DEV {
            if let Some(wire) = f.wire.get() {
                wire.send(&pkt);
            }
            return;
        }
        if let Some(node) = self.fabric.remote_node(pkt.dst_qpn) {
            node.send(&pkt);
            return;
        }
        let Some(dst) = route.resolve(self.fabric, pkt.dst_dev, pkt.dst_qpn) else { return };
        dst.inbox.push(pkt);
        let ptr = Arc::as_ptr(&dst);
        if self.active[..self.depth].contains(&ptr) {
            return; // its step loop is running below us and drains the inbox
        }
        if self.depth == 1
            && let Some(mut g) = dst.inner.try_lock()
        {
            self.service(&dst, &mut g);
            return;
        }
        self.ready.push(dst);
    }

    pub(crate) fn enter(&mut self, qp: *const QpShared) {
        self.active[self.depth] = qp;
        self.depth += 1;
    }

    /// Records whether `qp` (just serviced) still needs a timer.
    fn note_timer(&mut self, qp: &Arc<QpShared>, needed: bool) {
        let pos = self.check_timers.iter().position(|q| Arc::ptr_eq(q, qp));
        match (needed, pos) {
            (true, None) => self.check_timers.push(qp.clone()),
            (false, Some(i)) => {
                self.check_timers.swap_remove(i);
            }
            _ => {}
        }
    }

    /// Services `qp`, which the caller has locked (`g`). Call `finish` afterwards, without
    /// the lock, for whatever could not be serviced inline.
    pub(crate) fn service(&mut self, qp: &Arc<QpShared>, g: &mut QpInner) {
        self.enter(Arc::as_ptr(qp));
        step(qp, g, self);
        self.depth -= 1;
    }

    /// Services `qp`, locked by the caller (`g`), after a post queued work on it: a lone WQE
    /// to another process goes out the short way at once (`leaving::at_post`); anything else
    /// as [`Driver::service_and_arm`].
    pub(crate) fn service_posted(&mut self, qp: &Arc<QpShared>, g: &mut QpInner) {
        if !leaving::at_post(qp, g, self) {
            self.service_and_arm(qp, g);
        }
    }

    /// [`Driver::service`], and if what is left is only this QP's timers to arm (the
    /// commonest case after a post that queued work), arms them under the caller's lock
    /// rather than in [`Driver::finish`], which would take the lock again.
    pub(crate) fn service_and_arm(&mut self, qp: &Arc<QpShared>, g: &mut QpInner) {
        self.service(qp, g);
        if self.depth == 0
            && self.ready.is_empty()
            && let [only] = self.check_timers.as_slice()
            && Arc::ptr_eq(only, qp)
        {
            self.check_timers.clear();
            requester::arm_timers(qp, g, self);
        }
    }

    /// Services `qp` with `pkt` first: a packet that came while nothing waited in the QP's
    /// inbox (looked at under its lock, `g`) is handled at once, not queued and taken back.
    pub(crate) fn service_arrival(&mut self, qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet) {
        self.enter(Arc::as_ptr(qp));
        handle(qp, g, pkt, self);
        step(qp, g, self);
        self.depth -= 1;
    }

    /// Whether nothing is left for it to run and it holds no memory: a driver that need not
    /// be finished, nor dropped.
    pub(crate) fn idle(&self) -> bool {
        self.ready.is_empty()
            && self.check_timers.is_empty()
            && !self.ready.spilled()
            && !self.check_timers.spilled()
    }

    /// Services every QP that has packets until none has, then arms timers.
    pub(crate) fn finish(mut self) {
        // (Most drivers end with nothing left: no call.)
        if !self.ready.is_empty() || !self.check_timers.is_empty() {
            self.run_out();
        }
        // Run out, its lists are empty: unless one spilled to the heap, there is nothing to
        // drop (the drop glue of the two lists cost ~60 instructions a work request).
        if !self.ready.spilled() && !self.check_timers.spilled() {
            std::mem::forget(self);
        }
    }

    /// [`Driver::finish`], where the driver is (a driver moved is a copy of its lists).
    #[inline(never)]
    pub(crate) fn run_out(&mut self) {
        while let Some(qp) = self.ready.pop() {
            let mut g = qp.inner.lock();
            self.service(&qp, &mut g);
        }
        while let Some(qp) = self.check_timers.pop() {
            let mut g = qp.inner.lock();
            requester::arm_timers(&qp, &mut g, self);
        }
    }
}

impl Drop for Driver<'_> {
    /// Finishing is what makes progress; a driver is never dropped with work pending.
    fn drop(&mut self) {
        if !self.ready.is_empty() || !self.check_timers.is_empty() {
            self.depth = 0;
            self.run_out();
        }
    }
}

/// The node an ACK from our QP `src` to the requester `dst` (each `(device, port, QPN)`) goes
/// to in its short form: the requester's, when it is another process's and nothing must see
/// the ACK as a packet (fault rules, a packet trace), the two ports up (a port down loses the
/// packet, which the caller's packet path then does).
pub(crate) fn ack_route(
    f: &FabricInner,
    src: (u32, u8, u32),
    dst: (u32, u8, u32),
) -> Option<&crate::fabric::host::Node> {
    if !f.express() || dst.0 == crate::types::WIRE_DEV {
        return None;
    }
    let node = f.remote_node(dst.2)?;
    (f.port_up(src.0, src.1) && f.port_up(dst.0, dst.1)).then_some(node)
}

/// Hands a copy of the multicast datagram `pkt` to every QP of this fabric attached to its
/// group (the MGID in its GRH).
pub(crate) fn fan_out(fabric: &FabricInner, pkt: &Packet, drv: &mut Driver<'_>) {
    let mgid = pkt.grh.as_ref().map(|g| g.dgid.0).unwrap_or_default();
    for (m, port) in fabric.mcast_members(&mgid) {
        let mut copy = pkt.clone();
        copy.dst_dev = m.device_index();
        copy.dst_port = port;
        copy.dst_qpn = m.qpn;
        drv.send(&mut Route::default(), copy);
    }
}

impl Route {
    fn resolve(&mut self, fabric: &FabricInner, dev: u32, qpn: u32) -> Option<Arc<QpShared>> {
        if self.dev == dev
            && self.qpn == qpn
            && let Some(qp) = self.qp.upgrade()
            && qp.life.is_alive()
        {
            return Some(qp);
        }
        let qp = fabric.lookup_qp(dev, qpn)?;
        *self = Route { dev, qpn, qp: Arc::downgrade(&qp) };
        Some(qp)
    }
}

/// Processes the QP's inbox in order and lets the requester send, until neither has work.
pub(crate) fn step(qp: &Arc<QpShared>, g: &mut QpInner, drv: &mut Driver<'_>) {
    loop {
        qp.inbox.take_into(&mut g.batch);
        let had = !g.batch.is_empty();
        while let Some(pkt) = g.batch.pop_front() {
            handle(qp, g, pkt, drv);
        }
        let sent = requester::run(qp, g, drv);
        if !had && !sent {
            break;
        }
    }
    let waiting = g.sq.in_flight() > 0 || g.req.rnr_until.is_some();
    drv.note_timer(qp, waiting && matches!(g.state, QpState::RTS | QpState::SQD));
}

/// One packet taken from the QP's inbox (or that found it empty): to its responder or its
/// requester's completer.
#[inline]
fn handle(qp: &Arc<QpShared>, g: &mut QpInner, pkt: Packet, drv: &mut Driver<'_>) {
    if pkt.kind.is_request() || pkt.kind == Kind::XrcResult {
        responder::receive(qp, g, pkt, drv);
    } else {
        completer::receive(qp, g, pkt, drv);
    }
}

/// A packet that came in through a wire port: on its way to its QP it meets the fault rules
/// and the packet trace as if this fabric had sent it, so that losses can be made on either
/// side of a wire.
pub(crate) fn arrive(fabric: &FabricInner, pkt: Packet) {
    let mut drv = Driver::new(fabric);
    drv.send(&mut Route::default(), pkt);
    drv.finish();
}

/// A packet arrives now, late: one a fault delayed, or the ACK a dead peer's process held
/// back (see the host fabric's peer watcher).
pub(crate) fn deliver_late(fabric: &FabricInner, pkt: Packet) {
    let mut drv = Driver::new(fabric);
    drv.transmit(&mut Route::default(), pkt);
    drv.finish();
}

/// A deadline armed by this QP passed: retry after RNR back-off or retransmit on timeout.
pub(crate) fn on_timer(qp: &Arc<QpShared>) {
    let mut drv = Driver::new(&qp.ctx.fabric);
    {
        let mut g = crate::sync::lock::lock_lent(&qp.inner);
        requester::on_timer(qp, &mut g, &mut drv);
        drv.service(qp, &mut g);
    }
    drv.finish();
}

/// Moves the QP to ERR and flushes both queues (IBA 10.3.1: every outstanding WR completes
/// with `IBV_WC_WR_FLUSH_ERR`).
pub(crate) fn enter_error(qp: &Arc<QpShared>, g: &mut QpInner) {
    let was = g.state;
    // Before the flush: a receive posted meanwhile is then seen by one of the two sides.
    crate::qp::set_state(qp, g, QpState::ERR);
    qp.ctx.fabric.export_qp(qp, g);
    // IBA 11.6.3: a QP on an SRQ reports that no further WQE will be taken for it.
    if qp.srq.is_some() && was != QpState::ERR && raises_qp_errors(qp) {
        qp.raise(crate::types::EventType::QP_LAST_WQE_REACHED);
    }
    g.req.clear_timers();
    completer::flush_send_queue(qp, g);
    responder::flush_recv_queue(qp, g);
}

/// Whether affiliated async errors of IBA 11.6.3 (`QP_REQ_ERR`, `QP_ACCESS_ERR`, `QP_FATAL`)
/// are raised. rxe raises none of them, so the rxe profile does not either.
pub(crate) fn raises_qp_errors(qp: &QpShared) -> bool {
    qp.ctx.device.profile == Profile::Full
}

/// A completion with only the fields every completion has.
pub(crate) fn wc(qp: &QpShared, wr_id: u64, status: WcStatus) -> Wc {
    Wc { wr_id, status, qp_num: qp.qpn, ..Default::default() }
}

/// A successful completion's opcode-specific fields.
pub(crate) fn wc_ok(
    qp: &QpShared,
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    flags: WcFlags,
) -> Wc {
    Wc { opcode, byte_len, wc_flags: flags, ..wc(qp, wr_id, WcStatus::SUCCESS) }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_psn_arithmetic_wraps_at_24_bits() {
        assert_eq!(psn_add(PSN_MASK, 1), 0);
        assert_eq!(psn_diff(0, PSN_MASK), 1);
        assert_eq!(psn_diff(PSN_MASK, 0), -1);
        assert_eq!(psn_diff(5, 3), 2);
        assert_eq!(psn_diff(0x40_0000, 0), 0x40_0000);
    }

    #[test]
    fn test_packets_and_timers() {
        assert_eq!(packets_for(0, 1024), 1);
        assert_eq!(packets_for(1024, 1024), 1);
        assert_eq!(packets_for(1025, 1024), 2);
        assert_eq!(packets_for(1 << 31, 256), 1 << 23);
        assert_eq!(packets_for(u32::MAX, 4096), (1 << 20));
        assert_eq!(packets_for(4097, 4096), 2);
        assert_eq!(rnr_delay_ns(1), 10_000);
        assert_eq!(rnr_delay_ns(0), 655_360_000);
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8192));
        assert_eq!(ack_timeout_ns(14), Some(4096 << 14));
    }
}
