//! The QP's verbs that set the engine going: `ibv_post_send` (the express lane first, then
//! the lane to another process, then the requester's queue), `ibv_post_recv`, and what
//! entering a state does for `ibv_modify_qp` (its checks and attributes are the QP's own, in
//! `qp`). Here, above the QP, so that the QP's module names nothing of the engine.

use std::sync::Arc;

use super::{Driver, enter_error, leaving::Posted, requester::Operands};
use crate::{
    error::{Errno, Error, Result},
    objects::recv_queue::RecvWr,
    qp::{
        Qp, QpAttr, QpInner, QpShared, SendWr, set_state,
        transport::{Requester, Responder},
    },
    sync::lock::lock_lent,
    types::{QpAttrMask, QpState},
};

impl Qp {
    /// `ibv_post_send` of one WR.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        self.post_send_list(std::slice::from_ref(wr)).map_err(|(_, e)| e)
    }

    /// `ibv_post_send` of a list: on failure, the index of the first WR not posted (`bad_wr`)
    /// and why. WRs before it were posted.
    pub fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, Error)> {
        self.post_list(wrs, Operands::Checked)
    }

    /// The post of a batch of WRs built with the `ibv_wr_*` calls (`ibv_wr_complete`): as
    /// [`Qp::post_send_list`], except that
    /// - a batch the send queue has no room for is refused whole (`ENOMEM`), as the providers'
    ///   builders refuse a WR they find no slot for, and the batch with it;
    /// - an atomic's operands are not checked at the post, as the builders check none: one whose
    ///   result buffer holds less than 8 bytes, or (rxe) whose word is misaligned, goes out and
    ///   fails as it runs (see `Operands::AsBuilt`).
    ///
    /// A WR refused for another reason leaves the ones before it posted.
    pub fn post_send_built(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_list(wrs, Operands::AsBuilt).map_err(|(_, e)| e)
    }

    // One body for both entries: with a copy in each, the compiler left the express lane's
    // helpers out of line in both (42 instructions more a WRITE).
    #[inline(never)]
    fn post_list(&self, wrs: &[SendWr<'_>], operands: Operands) -> Result<(), (usize, Error)> {
        let qp = &self.0;
        let f = &qp.ctx.fabric;
        let mut res = Ok(());
        let mut queued = false;
        if let Some(wr) = wrs.first() {
            qp.lane_hint.prefetch(wr.opcode);
        }
        let mut g = qp.inner.lock();
        if operands == Operands::AsBuilt && (g.sq.room() as usize) < wrs.len() {
            return Err((0, Error::new(Errno::ENOMEM, "no room in the send queue for the batch")));
        }
        // The failed WR's index is worked out from what is left (a count kept beside the
        // iterator cost a register, spilled, for every WR).
        let mut rest = wrs;
        while let [wr, tail @ ..] = rest {
            rest = tail;
            if super::lane::post(qp, &mut g, wr, f) {
                continue;
            }
            if g.lane_across {
                match super::leaving::post(qp, &mut g, wr, f) {
                    Posted::Sent => continue,
                    Posted::SentServiceDue => {
                        queued = true;
                        continue;
                    }
                    Posted::Not => {}
                }
            }
            match super::requester::post(qp, &mut g, wr, f, operands) {
                Ok(q) => queued |= q,
                Err(e) => {
                    res = Err((wrs.len() - rest.len() - 1, e));
                    break;
                }
            }
        }
        // WRs that ran on the express path at the post left nothing to do.
        if queued {
            let mut drv = Driver::new(f);
            drv.service_posted(qp, &mut g);
            drop(g);
            drv.finish();
        }
        res
    }

    /// `ibv_modify_qp` (`EOPNOTSUPP` on an RSS QP, as mlx5).
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.0.life.check()?;
        self.not_rss()?;
        let qp = &self.0;
        let mut drv = Driver::new(&qp.ctx.fabric);
        {
            let mut g = lock_lent(&qp.inner);
            let (cur, next) = self.modify_attrs(&mut g, attr, mask)?;
            transition(qp, &mut g, cur, next, &mut drv);
            qp.ctx.fabric.export_qp(qp, &g);
        }
        drv.finish();
        Ok(())
    }

    /// `ibv_post_recv` of one WR.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        super::responder::post_recv(&self.0, wr)
    }

    /// `ibv_post_recv` of a list; see [`Qp::post_send_list`] for the failure index.
    ///
    /// Posting takes no lock the QP's data path takes (see `qp::recv_ring`): a message that
    /// found no receive was answered with an RNR NAK and comes again, so a receive posted
    /// leaves nothing to service.
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, Error)> {
        for (i, wr) in wrs.iter().enumerate() {
            super::responder::post_recv(&self.0, wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }
}

/// Side effects of entering `next` from `cur`.
fn transition(
    qp: &Arc<QpShared>,
    g: &mut QpInner,
    cur: QpState,
    next: QpState,
    drv: &mut Driver<'_>,
) {
    if cur == next && next != QpState::SQD {
        return;
    }
    match next {
        QpState::RESET => {
            set_state(qp, g, QpState::RESET);
            g.sq.clear();
            qp.rq.clear();
            g.req = Requester::default();
            g.resp = Responder::default();
            g.attr = QpAttr { cap: qp.cap, port_num: g.attr.port_num, ..Default::default() };
            qp.inbox.clear();
            if qp.ctx.device.profile.reset_cleans_cqs() {
                qp.send_cq.remove_qp(qp.qpn);
                qp.recv_cq.remove_qp(qp.qpn);
            }
        }
        QpState::ERR => enter_error(qp, g),
        QpState::SQD => {
            set_state(qp, g, QpState::SQD);
            drv.service(qp, g);
        }
        _ => {
            set_state(qp, g, next);
            // The connecting transitions take up the options asked for, as far as the device
            // offers them (mlx5's firmware answers each with the negotiated set).
            if g.ece_wanted != 0 && matches!(next, QpState::INIT | QpState::RTR | QpState::RTS) {
                g.ece = g.ece_wanted & qp.ctx.device.attr.ece_options;
            }
            // Work queued while the QP could not send (e.g. posted in SQD) goes out now.
            drv.service(qp, g);
        }
    }
}
