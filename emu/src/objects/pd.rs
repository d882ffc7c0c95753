//! Protection domains.

use std::sync::Arc;

use super::{
    Lifecycle,
    context::{Context, ContextInner},
    device::ResourceCounts,
    mr::Mr,
};
use crate::{error::Result, mem::RawMemory, types::AccessFlags};

#[derive(Debug)]
pub(crate) struct PdInner {
    pub(crate) ctx: Arc<ContextInner>,
    /// Dependents: MRs and QPs.
    pub(crate) life: Lifecycle,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        ResourceCounts::give(&self.ctx.device.counts.pd);
    }
}

/// A protection domain (`struct ibv_pd`).
#[derive(Clone, Debug)]
pub struct Pd(pub(crate) Arc<PdInner>);

impl Pd {
    /// The context the PD belongs to.
    pub fn context(&self) -> Context {
        Context(self.0.ctx.clone())
    }

    /// `ibv_dealloc_pd`: fails with `EBUSY` while MRs or QPs use the PD.
    pub fn dealloc(&self) -> Result<()> {
        self.0.life.destroy()
    }

    /// Registers a new zeroed buffer of `len` bytes owned by the MR (`ibv_reg_mr` on memory the
    /// emulator allocates, so that no unsafe code is needed). Use [`Mr::addr`] for SGEs.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        Mr::register_owned(self, len, access)
    }

    /// `ibv_reg_mr` / `ibv_reg_mr_iova2` over memory the caller owns: `iova` is the address
    /// SGEs and remote peers use for its first byte.
    pub fn reg_mr_raw(&self, mem: RawMemory, iova: u64, access: AccessFlags) -> Result<Mr> {
        Mr::register_raw(self, mem, iova, access)
    }

    /// `ibv_reg_dmabuf_mr`: an MR over bytes `offset..offset+len` of the dma-buf or memfd
    /// `fd` (mapped shared while the MR lives, so the file's other users see what remote
    /// peers write); `iova` is its first byte's address. See [`Mr`] for the errors.
    pub fn reg_dmabuf_mr(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        Mr::register_dmabuf(self, fd, offset, len, iova, access)
    }

    /// `ibv_reg_mr(pd, NULL, SIZE_MAX, access)` with `ON_DEMAND`: implicit on-demand paging,
    /// one MR whose keys reach any address of the process (full profile).
    pub fn reg_mr_implicit_odp(&self, access: AccessFlags) -> Result<Mr> {
        Mr::register_implicit(self, access)
    }

    /// `ibv_advise_mr(pd, advice, flags, sg_list)`: prefetches the pages of on-demand MRs.
    /// See [`Advice`](crate::Advice) for what each advice does; `EOPNOTSUPP` for an unknown
    /// advice, `EINVAL` for unknown flags or no SGE, `ENOENT` for an lkey that names no
    /// on-demand MR of this PD (or, for `PREFETCH_WRITE`, one without local write),
    /// `EFAULT` for a range outside its MR or (with `flush`) pages that cannot be brought in.
    pub fn advise_mr(
        &self,
        advice: crate::Advice,
        flush: bool,
        sg_list: &[crate::Sge],
    ) -> Result<()> {
        super::mr::advise(self, advice, flush, sg_list)
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_TM` (full profile): a tag-matching SRQ for up to
    /// `max_tags` tags whose list operations complete on `cq`; see [`Srq::post_ops`](super::srq::Srq::post_ops).
    pub fn create_srq_tm(
        &self,
        init: &super::srq::SrqAttr,
        max_tags: u32,
        cq: &super::cq::Cq,
    ) -> Result<super::srq::Srq> {
        super::srq::Srq::create_tm(self, init, max_tags, cq)
    }

    /// `ibv_alloc_mw`: a window of `mw_type` (1 or 2) in this PD, not bound yet.
    pub fn alloc_mw(&self, mw_type: crate::MwType) -> Result<super::mw::Mw> {
        super::mw::Mw::alloc(self, mw_type)
    }

    /// `ibv_create_ah`.
    pub fn create_ah(&self, attr: &crate::AhAttr) -> Result<super::ah::Ah> {
        super::ah::Ah::create(self, attr)
    }

    /// `ibv_create_srq`: `attr.max_wr` and `attr.max_sge` are what the application asks for;
    /// [`Srq::query`](crate::Srq::query) reports what was granted.
    pub fn create_srq(&self, attr: &super::srq::SrqAttr) -> Result<super::srq::Srq> {
        super::srq::Srq::create(self, attr)
    }

    /// `ibv_create_wq` (`IBV_WQT_RQ`); see [`Wq`](crate::Wq).
    pub fn create_wq(&self, init: &super::wq::WqInitAttr<'_>) -> Result<super::wq::Wq> {
        super::wq::Wq::create(self, init)
    }

    /// Whether two handles name the same PD.
    pub fn same(&self, other: &Pd) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
