//! Thread domains and parent domains (full profile, as mlx5): the `alloc_td` / `dealloc_td` /
//! `alloc_parent_domain` slots. A parent domain stands for its PD wherever a PD goes (QPs,
//! SRQs, MRs, AHs, windows; CQs through `IBV_CQ_INIT_ATTR_MASK_PD`); with allocators, the queue
//! buffers and doorbell records of the QPs, CQs and SRQs made through it come from the
//! application's `alloc` and go back through its `free`, sized and typed as mlx5 asks for them.

use core::ffi::{c_int, c_void};
use std::{
    ptr,
    sync::atomic::{AtomicU32, Ordering},
};

use crate::{
    abi::*,
    boundary::{ffi, set_errno},
    objects::*,
};

/// `ibv_parent_domain_init_attr.alloc`.
pub(crate) type AllocFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void;
/// `ibv_parent_domain_init_attr.free`.
pub(crate) type FreeFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64);

const IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: u32 = 1;
const IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: u32 = 2;
/// `IBV_ALLOCATOR_USE_DEFAULT`: the allocator leaves this buffer to the provider.
const USE_DEFAULT: *mut c_void = usize::MAX as *mut c_void;

/// mlx5's resource types (`MLX5DV_RES_TYPE_*`: the driver id 1 above the type).
pub(crate) mod res_type {
    pub(crate) const QP: u64 = 1 << 32 | 1;
    pub(crate) const DBR: u64 = 1 << 32 | 3;
    pub(crate) const SRQ: u64 = 1 << 32 | 4;
    pub(crate) const CQ: u64 = 1 << 32 | 5;
}

/// What a parent domain adds to its PD.
pub(crate) struct ParentDomain {
    /// The PD it stands for (a live `ShimPd` while the domain lives: it holds a use of it).
    protection: *const ShimPd,
    /// Its thread domain, or NULL (a live `ShimTd` while the domain lives, likewise).
    td: *const ShimTd,
    alloc: Option<AllocFn>,
    free: Option<FreeFn>,
    pd_context: *mut c_void,
}

impl ParentDomain {
    /// Gives back the uses the domain holds of its PD and thread domain (it is being freed).
    pub(crate) fn release(&self) {
        // SAFETY: both are live while the domain holds its uses (dealloc is EBUSY until then).
        unsafe {
            (*self.protection).users.fetch_sub(1, Ordering::AcqRel);
            if let Some(td) = self.td.as_ref() {
                td.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// A thread domain (`struct ibv_td`): the application's promise that one thread uses the
/// objects of the parent domains over it. The emulator is thread-safe anyway, so it changes
/// nothing but the accounting.
#[repr(C)]
pub(crate) struct ShimTd {
    pub(crate) td: ibv_td,
    /// Parent domains over it: while any is left, deallocating it is `EBUSY`.
    users: AtomicU32,
}

impl Owned for ShimTd {
    const RANK: u8 = 7;
    fn context(&self) -> *mut ibv_context {
        self.td.context
    }
    fn handle(&self) -> u32 {
        0
    }
    fn close(&self) {}
}

/// The `alloc_td` slot: `ibv_alloc_td(context, init_attr)`; `EINVAL` for a `comp_mask` bit.
pub(crate) unsafe extern "C" fn alloc_td(
    c: *mut ibv_context,
    attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    ffi!(ptr::null_mut(), {
        // SAFETY: NULL or a live context; `attr` NULL or readable.
        let (Some(_), Some(a)) = (unsafe { ctx(c) }, unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if a.comp_mask != 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        leak(ShimTd { td: ibv_td { context: c }, users: AtomicU32::new(0) }).cast()
    })
}

/// The `dealloc_td` slot: `ibv_dealloc_td(td)`; `EBUSY` while a parent domain uses it.
pub(crate) unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: NULL or an object of this library (checked by `destroy`).
        unsafe {
            destroy(td, |s: &ShimTd| {
                if s.users.load(Ordering::Acquire) > 0 {
                    return Err(rdma_emu::Error::new(
                        rdma_emu::Errno::EBUSY,
                        "a parent domain uses it",
                    ));
                }
                Ok(())
            })
        }
    })
}

/// The `alloc_parent_domain` slot: `ibv_alloc_parent_domain(context, attr)`. `EINVAL` for a
/// missing or foreign PD (or a parent domain as the PD), a thread domain of another context,
/// or an unknown `comp_mask` bit.
pub(crate) unsafe extern "C" fn alloc_parent_domain(
    c: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    ffi!(ptr::null_mut(), {
        let fail = || {
            set_errno(libc::EINVAL);
            ptr::null_mut()
        };
        // SAFETY: NULL or a live context; `attr` NULL or readable.
        let (Some(s), Some(a)) = (unsafe { ctx(c) }, unsafe { attr.as_ref() }) else {
            return fail();
        };
        let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
        if a.comp_mask & !known != 0 {
            return fail();
        }
        // SAFETY: NULL or live objects of this library (checked against the registry).
        let (Some(pd), td) =
            (unsafe { checked::<_, ShimPd>(a.pd) }, unsafe { obj::<_, ShimTd>(a.td) })
        else {
            return fail();
        };
        let same_file = |other| same_file(other, s);
        if pd.parent.is_some()
            || !same_file(pd.pd.context)
            || (!a.td.is_null() && !td.is_some_and(|t| same_file(t.td.context)))
        {
            return fail();
        }
        let allocators = a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0;
        let parent = ParentDomain {
            protection: pd,
            td: td.map_or(ptr::null(), |t| t as *const ShimTd),
            alloc: a.alloc.filter(|_| allocators),
            free: a.free.filter(|_| allocators),
            pd_context: if a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0 {
                a.pd_context
            } else {
                ptr::null_mut()
            },
        };
        pd.users.fetch_add(1, Ordering::AcqRel);
        if let Some(t) = td {
            t.users.fetch_add(1, Ordering::AcqRel);
        }
        let mut domain =
            ShimPd::new(ibv_pd { context: pd.pd.context, handle: pd.pd.handle }, pd.emu.clone());
        domain.parent = Some(parent);
        leak(domain).cast()
    })
}

/// A QP's, CQ's or SRQ's share of the parent domain it was made through: a use of the domain,
/// and the buffers its allocator gave, freed through it when the object goes.
pub(crate) struct ParentUse {
    domain: *const ShimPd,
    bufs: Vec<(*mut c_void, u64)>,
}

impl ParentUse {
    /// Takes a use of `domain` (NULL, or a PD that is no parent domain: `None`) and asks its
    /// allocator for each `(size, alignment, resource type)` of `bufs` (all or none: a NULL
    /// from the allocator frees what it gave and fails with `ENOMEM`). `IBV_ALLOCATOR_USE_DEFAULT`
    /// leaves a buffer to the emulator.
    ///
    /// # Safety
    /// `domain` is NULL or a live PD of this library.
    pub(crate) unsafe fn take(
        domain: *mut ibv_pd,
        bufs: &[(usize, usize, u64)],
    ) -> Result<Option<ParentUse>, c_int> {
        // SAFETY: the caller's contract.
        let Some(d) = (unsafe { obj::<_, ShimPd>(domain) }) else { return Ok(None) };
        let Some(p) = &d.parent else { return Ok(None) };
        d.users.fetch_add(1, Ordering::AcqRel);
        let mut taken = ParentUse { domain: d, bufs: Vec::new() };
        if let (Some(alloc), Some(_)) = (p.alloc, p.free) {
            for &(size, align, ty) in bufs {
                // SAFETY: the application's allocator, called as its contract says.
                let b = unsafe { alloc(domain, p.pd_context, size, align, ty) };
                if b.is_null() {
                    return Err(libc::ENOMEM); // `taken` frees the others as it drops
                }
                if b != USE_DEFAULT {
                    taken.bufs.push((b, ty));
                }
            }
        }
        Ok(Some(taken))
    }
}

impl Drop for ParentUse {
    fn drop(&mut self) {
        // SAFETY: the domain lives while a use of it is held (its dealloc is EBUSY).
        let d = unsafe { &*self.domain };
        if let Some(free) = d.parent.as_ref().and_then(|p| p.free) {
            let ctx = d.parent.as_ref().map_or(ptr::null_mut(), |p| p.pd_context);
            for &(b, ty) in &self.bufs {
                // SAFETY: a buffer this allocator gave, freed once, through its own free.
                unsafe { free(self.domain as *mut ibv_pd, ctx, b, ty) };
            }
        }
        d.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether `c` is a live context over the same objects as `s` (one command file).
pub(crate) fn same_file(c: *mut ibv_context, s: &ShimContext) -> bool {
    // SAFETY: NULL or any pointer: `ctx` checks it against the registry.
    unsafe { ctx(c) }.is_some_and(|o| std::sync::Arc::ptr_eq(&o.ufile, &s.ufile))
}

/// The queue buffer mlx5 allocates for `depth` entries of `stride` bytes: a power-of-two
/// number of them.
pub(crate) fn ring_bytes(depth: u32, stride: usize) -> usize {
    (depth.max(1) as usize).next_power_of_two() * stride
}

/// mlx5's queue buffers are page-aligned, its doorbell records 8 bytes.
pub(crate) const PAGE: usize = 4096;
pub(crate) const DBR: (usize, usize, u64) = (8, 8, res_type::DBR);
