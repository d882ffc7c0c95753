//! Device memory (`ibv_alloc_dm`): memory on the device itself, which the application reaches
//! by copies (`ibv_memcpy_to_dm` / `ibv_memcpy_from_dm`) and RDMA reaches through zero-based
//! MRs (`ibv_reg_dm_mr`). The device has `max_dm_size` bytes of it in all; the full profile
//! offers it, rxe none. The rules are those of mlx5's MEMIC, the one device memory rdma-core
//! exposes through these verbs: copies of whole 4-byte words inside the allocation.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use super::{
    Lifecycle,
    context::{Context, ContextInner},
    mr::Mr,
    pd::Pd,
};
use crate::{
    error::{Errno, Error, Result, einval},
    mem::MemRegion,
    types::AccessFlags,
};

/// Copies to and from device memory move whole 4-byte words (a MEMIC rule).
const WORD: u64 = 4;
/// The largest alignment an allocation may ask for (`log_align_req`): a page.
const MAX_LOG_ALIGN: u32 = 12;

#[derive(Debug)]
pub(crate) struct DmInner {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) region: Arc<MemRegion>,
    /// Dependents: MRs over the memory.
    pub(crate) life: Lifecycle,
}

impl Drop for DmInner {
    fn drop(&mut self) {
        let used = &self.ctx.device.dm_used;
        used.fetch_sub(self.region.len() as u64, Ordering::AcqRel);
    }
}

/// An allocation of device memory (`struct ibv_dm`). Freed by [`Dm::free`]; the memory goes
/// back to the device once the last handle (and the last MR over it) is gone.
#[derive(Clone, Debug)]
pub struct Dm(pub(crate) Arc<DmInner>);

/// Takes `len` bytes of the device's `max` unless that would overrun it.
fn take(used: &AtomicU64, len: u64, max: u64) -> Result<()> {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        u.checked_add(len).filter(|&n| n <= max)
    })
    .map(|_| ())
    .map_err(|_| Error::new(Errno::ENOMEM, "the device memory is used up"))
}

impl Dm {
    pub(crate) fn alloc(ctx: &Context, length: u64, log_align_req: u32) -> Result<Dm> {
        let dev = &ctx.0.device;
        let max = dev.attr.max_dm_size;
        if max == 0 {
            return Err(Error::new(Errno::EOPNOTSUPP, "the device has no device memory"));
        }
        if length == 0 || length > max {
            return Err(einval("device memory length out of range"));
        }
        if log_align_req > MAX_LOG_ALIGN {
            return Err(einval("device memory alignment above a page"));
        }
        take(&dev.dm_used, length, max)?;
        let region = Arc::new(MemRegion::owned(length as usize));
        Ok(Dm(Arc::new(DmInner { ctx: ctx.0.clone(), region, life: Lifecycle::default() })))
    }

    /// Length in bytes.
    pub fn length(&self) -> u64 {
        self.0.region.len() as u64
    }

    /// Checks a copy of `len` bytes at `offset`: `EFAULT` past the end, `EINVAL` when either is
    /// not a multiple of 4 (in that order, as mlx5), `EINVAL` once freed.
    fn check_copy(&self, offset: u64, len: usize) -> Result<usize> {
        self.0.life.check()?;
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.length() => {}
            _ => return Err(Error::new(Errno::EFAULT, "copy past the end of device memory")),
        }
        if !offset.is_multiple_of(WORD) || !(len as u64).is_multiple_of(WORD) {
            return Err(einval("device memory is copied in whole 4-byte words"));
        }
        Ok(offset as usize)
    }

    /// `ibv_memcpy_to_dm`: copies `data` to `offset`.
    pub fn copy_to(&self, offset: u64, data: &[u8]) -> Result<()> {
        let off = self.check_copy(offset, data.len())?;
        self.0.region.write(off, data).map_err(|_| einval("checked"))
    }

    /// `ibv_memcpy_from_dm`: copies `out.len()` bytes at `offset` into `out`.
    pub fn copy_from(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let off = self.check_copy(offset, out.len())?;
        self.0.region.read(off, out).map_err(|_| einval("checked"))
    }

    /// `ibv_reg_dm_mr`: an MR over `length` bytes at `offset`, always zero-based (its first
    /// byte is address 0, as `IBV_ACCESS_ZERO_BASED`, which `access` must hold, says).
    /// `EINVAL` for a range outside the allocation or access beyond local/remote read, write
    /// and atomic; the allocation cannot be freed while the MR lives (`EBUSY`).
    pub fn reg_mr(&self, pd: &Pd, offset: u64, length: usize, access: AccessFlags) -> Result<Mr> {
        self.0.life.check()?;
        let allowed = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::ZERO_BASED;
        if !access.contains(AccessFlags::ZERO_BASED) || !allowed.contains(access) {
            return Err(einval("device memory MRs are zero-based, with data access only"));
        }
        if !Arc::ptr_eq(&pd.0.ctx.device, &self.0.ctx.device) {
            return Err(einval("PD of another device"));
        }
        let off = usize::try_from(offset).map_err(|_| einval("offset out of range"))?;
        let part = MemRegion::part(&self.0.region, off, length)
            .ok_or_else(|| einval("MR range outside the device memory"))?;
        Mr::register_dm(pd, part, self.0.clone(), access)
    }

    /// `ibv_free_dm`: `EBUSY` while MRs use the memory, `EINVAL` once freed.
    pub fn free(&self) -> Result<()> {
        self.0.life.destroy()
    }

    /// The context the memory was allocated in.
    pub fn context(&self) -> Context {
        Context(self.0.ctx.clone())
    }
}
