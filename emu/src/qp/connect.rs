//! Connecting RC QPs: the RESET -> INIT -> RTR -> RTS sequence every RDMA program writes, with
//! the address vector chosen the way the port needs it (GRH on RoCE, LID on InfiniBand).

use super::{Qp, QpAttr};
use crate::{
    error::Result,
    types::{AccessFlags, AhAttr, Gid, LinkLayer, Mtu, QpAttrMask as M, QpState},
};

/// What a peer must learn about a QP to connect to it (what programs exchange over TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub qpn: u32,
    pub lid: u16,
    pub gid: Gid,
    /// First PSN the QP will send.
    pub psn: u32,
}

/// Connection parameters, with the values the rdma-core examples use as defaults.
#[derive(Debug, Clone, Copy)]
pub struct RcParams {
    pub access: AccessFlags,
    pub path_mtu: Mtu,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    /// GID index used as the source on RoCE.
    pub sgid_index: u8,
    /// The local port (1-based).
    pub port_num: u8,
}

impl Default for RcParams {
    fn default() -> Self {
        RcParams {
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            path_mtu: Mtu::MTU_1024,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            sgid_index: 0,
            port_num: 1,
        }
    }
}

impl Qp {
    /// This QP's endpoint on port 1, sending from `psn`.
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        self.endpoint_on(1, psn).expect("port 1 exists")
    }

    /// This QP's endpoint on `port`, sending from `psn`.
    pub fn endpoint_on(&self, port: u8, psn: u32) -> Result<Endpoint> {
        let dev = &self.0.ctx.device;
        let port = dev.port(port)?;
        let lid = port.attr.lock().lid;
        let gid = port.gids.first().map(|e| e.gid).unwrap_or_default();
        Ok(Endpoint { qpn: self.0.qpn, lid, gid, psn })
    }

    /// Moves a RESET RC, UC or XRC QP to RTS, connected to `remote`; `local_psn` is this side's
    /// first send PSN (the one its `endpoint` advertised). UC takes only the attributes its
    /// transitions allow (no RDMA-read, RNR or retry settings).
    pub fn connect(&self, local_psn: u32, remote: &Endpoint, p: &RcParams) -> Result<()> {
        let rc = self.qp_type().is_reliable();
        let link = self.0.ctx.device.port(p.port_num)?.attr.lock().link_layer;
        let init = QpAttr {
            qp_state: QpState::INIT,
            pkey_index: 0,
            port_num: p.port_num,
            qp_access_flags: p.access,
            ..Default::default()
        };
        self.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
        let roce = link == LinkLayer::ETHERNET;
        let ah_attr = AhAttr {
            is_global: roce,
            dgid: remote.gid,
            sgid_index: p.sgid_index,
            hop_limit: 64,
            dlid: remote.lid,
            port_num: p.port_num,
            ..Default::default()
        };
        let rtr = QpAttr {
            qp_state: QpState::RTR,
            path_mtu: p.path_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: p.max_dest_rd_atomic,
            min_rnr_timer: p.min_rnr_timer,
            ah_attr,
            ..Default::default()
        };
        let rtr_mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        let rtr_rc = M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
        self.modify(&rtr, if rc { rtr_mask | rtr_rc } else { rtr_mask })?;
        let rts = QpAttr {
            qp_state: QpState::RTS,
            sq_psn: local_psn,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
            max_rd_atomic: p.max_rd_atomic,
            ..Default::default()
        };
        let rts_rc = M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        self.modify(&rts, if rc { M::STATE | M::SQ_PSN | rts_rc } else { M::STATE | M::SQ_PSN })
    }
}
