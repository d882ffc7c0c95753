//! Memory registration charged to the process's locked-memory limit as the kernel charges it
//! (`ib_umem_get`): the pages an MR over application memory spans count against
//! `RLIMIT_MEMLOCK` unless the process has `CAP_IPC_LOCK`, and a registration that would go
//! past the limit fails with `ENOMEM`. The count is the process's, as the kernel's
//! `mm->pinned_vm` is (every fabric of the process adds to it); each registration is charged
//! whole, overlapping ones twice, as the kernel charges them. On-demand paging, device memory
//! and dma-buf MRs pin nothing; the Rust API's MRs over memory the emulator allocates
//! ([`Pd::reg_mr`](crate::Pd::reg_mr)) are not application memory and are not charged.
//! `RDMA_EMU_MEMLOCK=off` ([`FabricConfig::memlock`](crate::FabricConfig::memlock)) turns
//! the accounting off.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Pages charged by live registrations of this process.
static PINNED_PAGES: AtomicU64 = AtomicU64::new(0);

/// The pages one registration holds charged; given back when dropped (at deregistration).
#[derive(Debug, Default)]
pub(crate) struct Charge(u64);

impl Charge {
    /// Charges the pages `addr..addr+len` spans.
    pub(crate) fn take(addr: u64, len: usize) -> Result<Charge> {
        if len == 0 {
            return Ok(Charge(0));
        }
        let page = crate::sys::page_size();
        let end = addr.saturating_add(len as u64).div_ceil(page);
        let pages = end - addr / page;
        let now = PINNED_PAGES.fetch_add(pages, Ordering::AcqRel) + pages;
        let over = crate::sys::memlock_limit().is_some_and(|bytes| now > bytes / page);
        if over && !crate::sys::can_lock_memory() {
            PINNED_PAGES.fetch_sub(pages, Ordering::AcqRel);
            return Err(Error::MEMLOCK);
        }
        Ok(Charge(pages))
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        PINNED_PAGES.fetch_sub(self.0, Ordering::AcqRel);
    }
}
