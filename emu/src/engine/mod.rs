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

pub(crate) mod completer;
pub(crate) mod packet;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod sgl;

use std::sync::Arc;

use self::packet::Packet;
use crate::{
    fabric::FabricInner,
    profile::Profile,
    qp::{QpInner, QpShared},
    types::{LinkLayer, QpState, Wc, WcFlags, WcOpcode, WcStatus},
};

/// PSNs are 24 bits.
pub(crate) const PSN_MASK: u32 = 0x00ff_ffff;

/// `a - b` in PSN space, as a signed distance (IBA 9.7.1: modulo 2^24, half the space ahead).
pub(crate) fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b)) << 8) as i32 >> 8
}

pub(crate) fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// Number of packets (PSNs) a message of `len` bytes occupies at `mtu`.
pub(crate) fn packets_for(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu).max(1)
}

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
#[derive(Debug)]
pub(crate) struct Driver<'f> {
    fabric: &'f FabricInner,
    /// QPs that were handed packets and must be serviced.
    ready: Vec<Arc<QpShared>>,
    /// QPs that may need a timer once the fabric is quiet.
    check_timers: Vec<Arc<QpShared>>,
    now: Option<u64>,
}

impl<'f> Driver<'f> {
    pub(crate) fn new(fabric: &'f FabricInner) -> Driver<'f> {
        Driver { fabric, ready: Vec::new(), check_timers: Vec::new(), now: None }
    }

    /// The time, read once per drive (the engine sees a consistent instant).
    pub(crate) fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(|| self.fabric.now())
    }

    /// Hands `pkt` to its destination QP. A packet with no live destination is lost, as on a
    /// wire; the sender's timers take care of it.
    pub(crate) fn send(&mut self, pkt: Packet) {
        if let Some(dst) = self.fabric.lookup_qp(pkt.dst_dev, pkt.dst_qpn) {
            dst.inbox.lock().push_back(pkt);
            self.ready.push(dst);
        }
    }

    pub(crate) fn needs_timer(&mut self, qp: &Arc<QpShared>) {
        if !self.check_timers.iter().any(|q| Arc::ptr_eq(q, qp)) {
            self.check_timers.push(qp.clone());
        }
    }

    /// Services every QP that has packets until none has, then arms timers.
    pub(crate) fn finish(mut self) {
        while let Some(qp) = self.ready.pop() {
            let mut g = qp.inner.lock();
            step(&qp, &mut g, &mut self);
        }
        let qps = std::mem::take(&mut self.check_timers);
        for qp in qps {
            let mut g = qp.inner.lock();
            requester::arm_timers(&qp, &mut g, &mut self);
        }
    }
}

/// Processes the QP's inbox in order, then lets the requester send what it can.
pub(crate) fn step(qp: &Arc<QpShared>, g: &mut QpInner, drv: &mut Driver<'_>) {
    loop {
        let batch = std::mem::take(&mut *qp.inbox.lock());
        if batch.is_empty() {
            break;
        }
        for pkt in batch {
            if pkt.kind.is_request() {
                responder::receive(qp, g, pkt, drv);
            } else {
                completer::receive(qp, g, pkt, drv);
            }
        }
    }
    requester::run(qp, g, drv);
}

/// A deadline armed by this QP passed: retry after RNR back-off or retransmit on timeout.
pub(crate) fn on_timer(qp: &Arc<QpShared>) {
    let mut drv = Driver::new(&qp.ctx.fabric);
    {
        let mut g = qp.inner.lock();
        requester::on_timer(qp, &mut g, &mut drv);
        step(qp, &mut g, &mut drv);
    }
    drv.finish();
}

/// Moves the QP to ERR and flushes both queues (IBA 10.3.1: every outstanding WR completes
/// with `IBV_WC_WR_FLUSH_ERR`).
pub(crate) fn enter_error(qp: &Arc<QpShared>, g: &mut QpInner) {
    g.state = QpState::ERR;
    g.req.clear_timers();
    completer::flush_send_queue(qp, g);
    responder::flush_recv_queue(qp, g);
}

/// Whether the port speaks RoCE (every packet carries a GRH, so receive completions have
/// `IBV_WC_GRH`, as rxe reports).
pub(crate) fn is_roce(qp: &QpShared) -> bool {
    qp.ctx.device.port(1).map(|p| p.attr.lock().link_layer == LinkLayer::ETHERNET).unwrap_or(false)
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
        assert_eq!(rnr_delay_ns(1), 10_000);
        assert_eq!(rnr_delay_ns(0), 655_360_000);
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8192));
        assert_eq!(ack_timeout_ns(14), Some(4096 << 14));
    }
}
