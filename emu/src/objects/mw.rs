//! Memory windows (`ibv_alloc_mw`): remote access to a part of an MR under an rkey of their
//! own, bound and invalidated by posted work requests (after `rxe_mw.c`, IBA 10.6.7).
//!
//! A type 1 window is bound by `ibv_bind_mw` (turned into a BIND_MW work request, as rxe does)
//! and stays valid until rebound or deallocated; a type 2 window is bound by an
//! `IBV_WR_BIND_MW` request to the one QP that bound it, and returns to the free state by
//! `IBV_WR_LOCAL_INV` or a remote SEND_WITH_INV.

use std::sync::{
    Arc,
    atomic::{AtomicU32, Ordering},
};

use crate::sync::Mutex;

use super::{
    Lifecycle,
    device::{DeviceInner, ResourceCounts},
    keys::{KeyEntry, KeyTable},
    mr::{Mr, MrInner},
    pd::{Pd, PdInner},
};
use crate::{
    error::{Result, einval},
    mem::MemRegion,
    types::{AccessFlags, MwType},
};

/// Access bits a bind may carry (the access bits of `ibv_reg_mr`, as rxe's later
/// `RXE_ACCESS_SUPPORTED_MW`); only the remote rights and `ZERO_BASED` mean anything here.
const SUPPORTED_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::MW_BIND)
    .union(AccessFlags::ZERO_BASED);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Type 1 from allocation on (with no range until bound); type 2 while bound.
    Valid,
    /// Type 2 before a bind and after an invalidation.
    Free,
}

/// What the window currently grants.
#[derive(Debug)]
struct Binding {
    /// The rkey the device answers to: the allocation's index with the tag of the last bind.
    rkey: u32,
    state: State,
    mr: Option<Arc<MrInner>>,
    /// Start of the window in the MR's address space, and its length.
    addr: u64,
    length: u64,
    access: AccessFlags,
    /// Type 2: the QP the window is bound to (only it may use the window).
    qpn: u32,
}

impl Binding {
    fn unbind(&mut self) {
        if let Some(mr) = self.mr.take() {
            mr.windows.fetch_sub(1, Ordering::AcqRel);
        }
        (self.addr, self.length, self.access, self.qpn) = (0, 0, AccessFlags::empty(), 0);
    }
}

#[derive(Debug)]
pub(crate) struct MwShared {
    dev: Arc<DeviceInner>,
    pub(crate) pd: Arc<PdInner>,
    mw_type: MwType,
    /// The key the slot was allocated with (freed at dealloc).
    pub(super) key: u32,
    /// The rkey the application holds (`ibv_mw.rkey`): for type 1 it moves at post time, as
    /// the provider updates it when it posts the bind.
    posted_rkey: AtomicU32,
    binding: Mutex<Binding>,
    life: Lifecycle,
}

impl MwShared {
    fn teardown(&self) {
        self.dev.keys.write().remove(self.key);
        self.binding.lock().unbind();
        self.pd.life.put();
        ResourceCounts::give(&self.dev.counts.mw);
    }
}

/// The application's side of a window: dropping the last handle deallocates it (the key
/// table's reference alone does not keep it alive).
#[derive(Debug)]
pub(crate) struct MwHandle(Arc<MwShared>);

impl Drop for MwHandle {
    fn drop(&mut self) {
        if self.0.life.destroy().is_ok() {
            self.0.teardown();
        }
    }
}

impl std::ops::Deref for MwHandle {
    type Target = MwShared;
    fn deref(&self) -> &MwShared {
        &self.0
    }
}

/// A memory window (`struct ibv_mw`). Cheap to clone; all clones are the same window.
#[derive(Clone, Debug)]
pub struct Mw(pub(crate) Arc<MwHandle>);

/// Where a bind puts the window (`struct ibv_mw_bind_info`). A zero `length` (with no MR)
/// unbinds a type 1 window.
#[derive(Debug, Clone, Copy)]
pub struct MwBindInfo<'a> {
    pub mr: Option<&'a Mr>,
    pub addr: u64,
    pub length: u64,
    /// Remote access rights, optionally `ZERO_BASED` (type 2 only).
    pub access: AccessFlags,
}

/// A BIND_MW work request's arguments (`wr.bind_mw` of `struct ibv_send_wr`).
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    pub mw: &'a Mw,
    /// The rkey the window takes: its index with a new 8-bit tag (`ibv_inc_rkey`).
    pub rkey: u32,
    pub info: MwBindInfo<'a>,
    /// The window's rkey as the application held it when it built the request
    /// (`ibv_wr_bind_mw` takes it then, as rxe's builder does); `None`: as it holds it at the
    /// post ([`Mw::rkey`]). A bind naming a window by an rkey it no longer has fails.
    pub mw_rkey: Option<u32>,
}

/// A bind as the send queue keeps it: keys, looked up again when the WR executes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BindArgs {
    pub(crate) mw_rkey: u32,
    pub(crate) new_rkey: u32,
    pub(crate) mr_lkey: u32,
    pub(crate) addr: u64,
    pub(crate) length: u64,
    pub(crate) access: AccessFlags,
}

impl<'a> MwBind<'a> {
    pub(crate) fn args(&self) -> BindArgs {
        BindArgs {
            mw_rkey: self.mw_rkey.unwrap_or_else(|| self.mw.0.posted_rkey.load(Ordering::Acquire)),
            new_rkey: self.rkey,
            mr_lkey: self.info.mr.map_or(0, |m| m.lkey()),
            addr: self.info.addr,
            length: self.info.length,
            access: self.info.access,
        }
    }
}

impl Mw {
    pub(crate) fn alloc(pd: &Pd, mw_type: MwType) -> Result<Mw> {
        if mw_type != MwType::TYPE_1 && mw_type != MwType::TYPE_2 {
            return Err(einval("unknown memory window type"));
        }
        let dev = pd.0.ctx.device.clone();
        if dev.attr.max_mw == 0 {
            return Err(crate::Error::new(
                crate::Errno::EOPNOTSUPP,
                "the device has no memory windows",
            ));
        }
        ResourceCounts::take(&dev.counts.mw, dev.attr.max_mw, "too many memory windows")?;
        if let Err(e) = pd.0.life.get() {
            ResourceCounts::give(&dev.counts.mw);
            return Err(e);
        }
        let mut made = None;
        let inserted = dev.keys.insert(|key| {
            let mw = Arc::new(MwShared {
                dev: dev.clone(),
                pd: pd.0.clone(),
                mw_type,
                key,
                posted_rkey: AtomicU32::new(key),
                binding: Mutex::new(Binding {
                    rkey: key,
                    state: if mw_type == MwType::TYPE_1 { State::Valid } else { State::Free },
                    mr: None,
                    addr: 0,
                    length: 0,
                    access: AccessFlags::empty(),
                    qpn: 0,
                }),
                life: Lifecycle::default(),
            });
            made = Some(mw.clone());
            KeyEntry::Mw(mw)
        });
        if let Err(e) = inserted {
            pd.0.life.put();
            ResourceCounts::give(&dev.counts.mw);
            return Err(e);
        }
        Ok(Mw(Arc::new(MwHandle(made.expect("filled by insert")))))
    }

    /// The rkey the application uses (`ibv_mw.rkey`): the one the last posted bind gives the
    /// window (a bind that then fails leaves it to the application to undo, as in rdma-core).
    pub fn rkey(&self) -> u32 {
        self.0.posted_rkey.load(Ordering::Acquire)
    }

    /// Sets the rkey the application holds (`ibv_mw.rkey`), as a provider does after posting
    /// a bind, or an application after a type 2 bind or a failed bind.
    pub fn set_rkey(&self, rkey: u32) {
        self.0.posted_rkey.store(rkey, Ordering::Release);
    }

    pub fn mw_type(&self) -> MwType {
        self.0.mw_type
    }

    pub fn pd(&self) -> Pd {
        Pd(self.0.pd.clone())
    }

    /// Whether the window currently grants remote access (bound, with a non-empty range).
    pub fn is_bound(&self) -> bool {
        let b = self.0.binding.lock();
        b.state == State::Valid && b.length > 0
    }

    /// Whether two handles name the same window.
    pub fn same(&self, other: &Mw) -> bool {
        Arc::ptr_eq(&self.0.0, &other.0.0)
    }

    /// `ibv_dealloc_mw`: the window stops granting access at once, bound or not.
    pub fn dealloc(&self) -> Result<()> {
        self.0.life.destroy()?;
        self.0.teardown();
        Ok(())
    }
}

/// Executes a bind for `qp` (its PD `pd`, number `qpn`); `Err` is a `IBV_WC_MW_BIND_ERR`
/// (rxe_bind_mw and rxe_check_bind_mw, IBA 10.6.7.2).
pub(crate) fn bind(keys: &KeyTable, pd: &Arc<PdInner>, qpn: u32, a: &BindArgs) -> Result<(), ()> {
    let mw = keys.mw(a.mw_rkey).ok_or(())?;
    let mr = if a.length > 0 { Some(keys.mr(a.mr_lkey).ok_or(())?.clone()) } else { None };
    if !SUPPORTED_ACCESS.contains(a.access) {
        return Err(());
    }
    let mut b = mw.binding.lock();
    if b.rkey != a.mw_rkey {
        return Err(());
    }
    match mw.mw_type {
        MwType::TYPE_1 => {
            // o10-36.2.2: a type 1 window is never zero based. The full profile also holds
            // the binding QP to the window's PD, as hardware does (rxe does not check it).
            if b.state != State::Valid
                || a.access.contains(AccessFlags::ZERO_BASED)
                || (mw.dev.profile == crate::Profile::Full && !Arc::ptr_eq(pd, &mw.pd))
            {
                return Err(());
            }
        }
        _ => {
            // o10-37.2.30, C10-72, o10-37.2.40.
            if b.state != State::Free || !Arc::ptr_eq(pd, &mw.pd) || mr.is_none() {
                return Err(());
            }
        }
    }
    if let Some(mr) = &mr {
        // C10-73, C10-74, C10-75; and the MR must be of the window's PD (no window may open
        // another protection domain's memory).
        let remote_write = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        // A zero-based window still starts at `addr` of the MR; only its rkey's addresses
        // count from 0.
        let in_range = mr.offset_of(a.addr, a.length).is_some();
        if mr.access.contains(AccessFlags::ZERO_BASED)
            || !mr.access.contains(AccessFlags::MW_BIND)
            || (a.access.intersects(remote_write) && !mr.access.contains(AccessFlags::LOCAL_WRITE))
            || !in_range
            || !Arc::ptr_eq(&mr.pd, &mw.pd)
        {
            return Err(());
        }
    }
    b.unbind();
    b.rkey = (b.rkey & !0xff) | (a.new_rkey & 0xff);
    b.state = State::Valid;
    if let Some(mr) = mr {
        mr.windows.fetch_add(1, Ordering::AcqRel);
        b.mr = Some(mr);
        (b.addr, b.length, b.access) = (a.addr, a.length, a.access);
        if mw.mw_type == MwType::TYPE_2 {
            b.qpn = qpn;
        }
    }
    Ok(())
}

/// Invalidates the type 2 window `rkey` names (LOCAL_INV, or SEND_WITH_INV at the
/// responder) for the QP `by_qpn`; `Err` when it names no bound type 2 window (o10-37.2.26)
/// or, in the full profile, one bound to another QP (only the QP a window is bound to may
/// invalidate it; rxe does not check). Memory regions registered from user space cannot be
/// invalidated (rxe: only fast-registration MRs).
pub(crate) fn invalidate(keys: &KeyTable, rkey: u32, by_qpn: Option<u32>) -> Result<(), ()> {
    let mw = keys.mw(rkey).ok_or(())?;
    let mut b = mw.binding.lock();
    if b.rkey != rkey || mw.mw_type != MwType::TYPE_2 || b.state != State::Valid {
        return Err(());
    }
    if mw.dev.profile == crate::Profile::Full && by_qpn.is_some_and(|q| q != b.qpn) {
        return Err(());
    }
    b.unbind();
    b.state = State::Free;
    Ok(())
}

/// Resolves a remote access through the window `rkey` names, for the QP `qpn` of PD `pd`:
/// the MR memory and offset of `[va, va+len)`, if the window is valid, bound to this QP
/// (type 2), grants `access`, and holds the whole range.
pub(crate) fn resolve(
    keys: &KeyTable,
    pd: &Arc<PdInner>,
    qpn: u32,
    rkey: u32,
    va: u64,
    len: u64,
    access: AccessFlags,
) -> Option<(Arc<MemRegion>, usize)> {
    let mw = keys.mw(rkey)?;
    let b = mw.binding.lock();
    if b.rkey != rkey
        || b.state != State::Valid
        || !Arc::ptr_eq(pd, &mw.pd)
        || (mw.mw_type == MwType::TYPE_2 && b.qpn != qpn)
        || !b.access.contains(access)
    {
        return None;
    }
    let off = if b.access.contains(AccessFlags::ZERO_BASED) { va } else { va.checked_sub(b.addr)? };
    if off.checked_add(len)? > b.length {
        return None;
    }
    let mr = b.mr.as_ref()?;
    let at = mr.offset_of(b.addr + off, len)?;
    Some((mr.region.clone(), at))
}
