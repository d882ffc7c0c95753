//! Work requests as the application posts them.

use crate::{
    objects::mw::MwBind,
    types::{FlushLevel, FlushType, SendFlags, Sge, WrOpcode},
};

/// A send work request (`struct ibv_send_wr`, one element of the list).
#[derive(Debug, Clone, Copy, Default)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub send_flags: SendFlags,
    /// Gather list. Every element is checked against its MR when the WR executes.
    pub sg_list: &'a [Sge],
    /// With `SendFlags::INLINE`: the bytes to send, copied at post time (the C shim gathers
    /// the application's SGEs into it; no lkey is needed).
    pub inline_data: &'a [u8],
    /// Immediate data for `*_WITH_IMM`, as the application wrote it (network order in C).
    pub imm_data: u32,
    /// RDMA and atomic target address and key.
    pub remote_addr: u64,
    pub rkey: u32,
    /// `compare_add` for both atomics; `swap` for compare-and-swap.
    pub compare_add: u64,
    pub swap: u64,
    /// UD: where the message goes.
    pub ud: Option<UdDest<'a>>,
    /// `IBV_WR_BIND_MW`: the window, its new rkey and where it goes.
    pub bind: Option<MwBind<'a>>,
    /// `IBV_WR_LOCAL_INV` / `IBV_WR_SEND_WITH_INV`: the rkey to invalidate.
    pub invalidate_rkey: u32,
    /// XRC_SEND QPs: the number of the XRC SRQ the request goes to (`qp_type.xrc.remote_srqn`).
    pub xrc_remote_srqn: u32,
    /// `IBV_WR_TSO` (raw packet QPs): the headers and segment size.
    pub tso: Option<Tso<'a>>,
    /// `IBV_WR_FLUSH`: what it covers beyond `remote_addr`/`rkey`.
    pub flush: Option<Flush>,
}

/// An RDMA FLUSH (`ibv_wr_flush`): `len` bytes from `remote_addr` (with
/// [`FlushLevel::RANGE`]; [`FlushLevel::MR`] covers the whole MR the rkey names) made globally
/// visible and/or persistent at the responder.
#[derive(Debug, Clone, Copy)]
pub struct Flush {
    pub len: u32,
    pub placement: FlushType,
    pub level: FlushLevel,
}

/// TCP segmentation offload (`wr.tso` of `struct ibv_send_wr`): `hdr` (Ethernet, IP and TCP
/// headers) goes in front of every `mss` bytes of the payload, with lengths, IPv4 id, TCP
/// sequence number and checksums fixed up per segment.
#[derive(Debug, Clone, Copy)]
pub struct Tso<'a> {
    pub hdr: &'a [u8],
    pub mss: u16,
}

/// The destination of a UD send (`wr.ud` of `struct ibv_send_wr`).
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    pub ah: &'a crate::Ah,
    pub remote_qpn: u32,
    /// With the high bit set, the QP's own Q_Key is used instead (IBA 10.2.5).
    pub remote_qkey: u32,
}

impl<'a> SendWr<'a> {
    /// A SEND of `sg_list`.
    pub fn send(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        SendWr { wr_id, opcode: WrOpcode::SEND, sg_list, ..Default::default() }
    }

    /// An RDMA WRITE of `sg_list` to `remote_addr` under `rkey`.
    pub fn write(wr_id: u64, sg_list: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::RDMA_WRITE,
            sg_list,
            remote_addr,
            rkey,
            ..Default::default()
        }
    }

    /// An ATOMIC WRITE of the 8 bytes `sg_list` gathers to the 8-byte aligned `remote_addr`
    /// under `rkey`: the target sees all of them or none (full profile).
    pub fn atomic_write(wr_id: u64, sg_list: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        SendWr {
            opcode: WrOpcode::ATOMIC_WRITE,
            ..SendWr::write(wr_id, sg_list, remote_addr, rkey)
        }
    }

    /// An RDMA FLUSH of `len` bytes at `remote_addr` under `rkey` (full profile; RC).
    pub fn flush(
        wr_id: u64,
        remote_addr: u64,
        rkey: u32,
        len: u32,
        placement: FlushType,
        level: FlushLevel,
    ) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::FLUSH,
            remote_addr,
            rkey,
            flush: Some(Flush { len, placement, level }),
            ..Default::default()
        }
    }

    /// A TSO send of `sg_list` as segments of `mss` bytes behind `hdr` (raw packet QPs).
    pub fn tso(wr_id: u64, sg_list: &'a [Sge], hdr: &'a [u8], mss: u16) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::TSO,
            sg_list,
            tso: Some(Tso { hdr, mss }),
            ..Default::default()
        }
    }

    /// An RDMA READ from `remote_addr` under `rkey` into `sg_list`.
    pub fn read(wr_id: u64, sg_list: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::RDMA_READ,
            sg_list,
            remote_addr,
            rkey,
            ..Default::default()
        }
    }

    /// An atomic fetch-and-add of `add` at `remote_addr`; the old value lands in `sg_list`.
    pub fn fetch_add(
        wr_id: u64,
        sg_list: &'a [Sge],
        remote_addr: u64,
        rkey: u32,
        add: u64,
    ) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::ATOMIC_FETCH_AND_ADD,
            sg_list,
            remote_addr,
            rkey,
            compare_add: add,
            ..Default::default()
        }
    }

    /// An atomic compare-and-swap at `remote_addr`; the old value lands in `sg_list`.
    pub fn cmp_swap(
        wr_id: u64,
        sg_list: &'a [Sge],
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    ) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::ATOMIC_CMP_AND_SWP,
            sg_list,
            remote_addr,
            rkey,
            compare_add: compare,
            swap,
            ..Default::default()
        }
    }

    /// A UD SEND of `sg_list` to `remote_qpn` behind `ah`.
    pub fn send_ud(
        wr_id: u64,
        sg_list: &'a [Sge],
        ah: &'a crate::Ah,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::SEND,
            sg_list,
            ud: Some(UdDest { ah, remote_qpn, remote_qkey }),
            ..Default::default()
        }
    }

    /// An `IBV_WR_BIND_MW` (type 2 windows; type 1 windows are bound by
    /// [`Qp::bind_mw`](crate::Qp::bind_mw)).
    pub fn bind_mw(wr_id: u64, bind: MwBind<'a>) -> Self {
        SendWr { wr_id, opcode: WrOpcode::BIND_MW, bind: Some(bind), ..Default::default() }
    }

    /// An `IBV_WR_LOCAL_INV` of the type 2 window `rkey`.
    pub fn local_inv(wr_id: u64, rkey: u32) -> Self {
        SendWr { wr_id, opcode: WrOpcode::LOCAL_INV, invalidate_rkey: rkey, ..Default::default() }
    }

    /// An `IBV_WR_SEND_WITH_INV`: a SEND that invalidates the responder's window `rkey`.
    pub fn send_inv(wr_id: u64, sg_list: &'a [Sge], rkey: u32) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::SEND_WITH_INV,
            sg_list,
            invalidate_rkey: rkey,
            ..Default::default()
        }
    }

    /// Sets the XRC SRQ number an XRC_SEND QP's request goes to.
    pub fn to_srq(mut self, srqn: u32) -> Self {
        self.xrc_remote_srqn = srqn;
        self
    }

    /// Adds `IBV_SEND_SIGNALED`.
    pub fn signaled(mut self) -> Self {
        self.send_flags |= SendFlags::SIGNALED;
        self
    }

    /// Sets the opcode's `_WITH_IMM` variant's immediate data and opcode.
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.imm_data = imm;
        self.opcode = match self.opcode {
            WrOpcode::SEND => WrOpcode::SEND_WITH_IMM,
            WrOpcode::RDMA_WRITE => WrOpcode::RDMA_WRITE_WITH_IMM,
            other => other,
        };
        self
    }
}
