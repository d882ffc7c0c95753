//! The objects handed to C: each embeds its `ibv_*` struct first (`#[repr(C)]`), so the
//! pointer C holds is also the pointer to the whole object, and keeps the emulator handle.

use std::{
    any::TypeId,
    collections::HashMap,
    mem::offset_of,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

use rdma_emu::sync::{RwLock, RwLockWriteGuard};

use crate::abi::*;

#[repr(C)]
pub(crate) struct ShimDevice {
    pub(crate) dev: ibv_device,
    pub(crate) emu: rdma_emu::Device,
}

// SAFETY: the device is immutable after creation (its C struct holds only NULL `_ops` pointers
// and strings), and rdma_emu::Device is Send + Sync.
unsafe impl Send for ShimDevice {}
// SAFETY: as above.
unsafe impl Sync for ShimDevice {}

#[repr(C)]
pub(crate) struct ShimContext {
    /// `vctx.context` is the `ibv_context` C sees; `verbs_context` precedes it.
    pub(crate) vctx: verbs_context,
    /// The objects this context shares with those imported from its command fd, and the
    /// emulator context behind them all.
    pub(crate) ufile: std::sync::Arc<crate::verbs::import::Ufile>,
    /// `vctx.context.cmd_fd`, closed with the context.
    pub(crate) _cmd_fd: std::os::fd::OwnedFd,
}

impl ShimContext {
    /// The emulator context.
    pub(crate) fn emu(&self) -> &rdma_emu::Context {
        &self.ufile.emu
    }
}

#[repr(C)]
pub(crate) struct ShimPd {
    pub(crate) pd: ibv_pd,
    /// The protection domain (a parent domain's is its PD's).
    pub(crate) emu: rdma_emu::Pd,
    /// Set for a parent domain (`ibv_alloc_parent_domain`).
    pub(crate) parent: Option<crate::verbs::parent::ParentDomain>,
    /// Parent domains over this PD, or QPs, CQs and SRQs made through this parent domain:
    /// while any is left, deallocating it is `EBUSY`.
    pub(crate) users: std::sync::atomic::AtomicU32,
}

impl ShimPd {
    pub(crate) fn new(pd: ibv_pd, emu: rdma_emu::Pd) -> ShimPd {
        ShimPd { pd, emu, parent: None, users: Default::default() }
    }
}

#[repr(C)]
pub(crate) struct ShimMr {
    pub(crate) mr: ibv_mr,
    pub(crate) emu: rdma_emu::Mr,
    pub(crate) kind: MrKind,
}

/// libibverbs' `enum ibv_mr_type`: only registered memory can be re-registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MrKind {
    Registered,
    DeviceMemory,
    Imported,
    DmaBuf,
}

#[repr(C)]
pub(crate) struct ShimDm {
    pub(crate) dm: ibv_dm,
    pub(crate) emu: rdma_emu::Dm,
}

#[repr(C)]
pub(crate) struct ShimChannel {
    pub(crate) ch: ibv_comp_channel,
    pub(crate) emu: rdma_emu::CompChannel,
}

#[repr(C)]
pub(crate) struct ShimSrq {
    pub(crate) srq: ibv_srq,
    pub(crate) emu: rdma_emu::Srq,
    /// Made through a parent domain: as for QPs.
    pub(crate) parent_use: Option<crate::verbs::parent::ParentUse>,
}

#[repr(C)]
pub(crate) struct ShimXrcd {
    pub(crate) xrcd: ibv_xrcd,
    pub(crate) emu: rdma_emu::Xrcd,
}

#[repr(C)]
pub(crate) struct ShimMw {
    pub(crate) mw: ibv_mw,
    pub(crate) emu: rdma_emu::Mw,
}

#[repr(C)]
pub(crate) struct ShimAh {
    pub(crate) ah: ibv_ah,
    pub(crate) emu: rdma_emu::Ah,
}

/// Every CQ is an `ibv_cq_ex` (which starts with `ibv_cq`), so both APIs work on it.
#[repr(C)]
pub(crate) struct ShimCq {
    pub(crate) cq: ibv_cq_ex,
    pub(crate) emu: rdma_emu::Cq,
    /// The completion `start_poll`/`next_poll` made current, for the `read_*` functions. Only
    /// the thread inside a start/end poll pair touches it (the verbs contract).
    pub(crate) cur: std::cell::Cell<rdma_emu::Wc>,
    /// Made through a parent domain (`IBV_CQ_INIT_ATTR_MASK_PD`): as for QPs.
    pub(crate) parent_use: Option<crate::verbs::parent::ParentUse>,
}

/// Every QP is an `ibv_qp_ex` (which starts with `ibv_qp`).
#[repr(C)]
pub(crate) struct ShimQp {
    pub(crate) qp: ibv_qp_ex,
    /// The slot later rdma-core releases add after rdma-core 44's `ibv_qp_ex` (`wr_flush`),
    /// right behind it, so that programs built against their headers find it.
    pub(crate) wr_flush: Option<crate::verbs::wr::WrFlush>,
    pub(crate) emu: rdma_emu::Qp,
    /// Created through `ibv_create_qp_ex` with send ops: `ibv_qp_to_qp_ex` returns it.
    pub(crate) extended: bool,
    /// The `ibv_wr_*` batch being built between `wr_start` and `wr_complete`.
    pub(crate) batch: rdma_emu::sync::Mutex<crate::verbs::wr::Batch>,
    /// Made through a parent domain: its use of it and the buffers its allocator gave.
    pub(crate) parent_use: Option<crate::verbs::parent::ParentUse>,
}

// `wr_flush` sits where rdma-core 45's `struct ibv_qp_ex` has it.
const _: () = assert!(offset_of!(ShimQp, wr_flush) == size_of::<ibv_qp_ex>());

/// An object handed to C that belongs to its context's objects (the kernel's uverbs file):
/// when the last context over them closes, it is destroyed as the kernel destroys a closed
/// file's objects, and its struct is freed.
pub(crate) trait Owned: 'static {
    /// Its turn when a context closes: lower first, so that what uses an object goes before
    /// it (flows and windows, QPs, AHs and tables, WQs and SRQs, MRs, CQs and device memory,
    /// channels and XRC domains, PDs).
    const RANK: u8;
    /// The context it was made through (its C struct's `context`).
    fn context(&self) -> *mut ibv_context;
    /// Its kernel handle as its C struct now says (0: an object without one, never checked).
    fn handle(&self) -> u32;
    /// Destroys the emulator object. A failure (already destroyed through another struct,
    /// or still used by another context's object, which keeps it alive) is nothing to report.
    fn close(&self);
    /// Whether its memory is kept a while after it is destroyed ([`retire`]).
    const RETIRED_LATE: bool = false;
}

/// How many destroyed objects of the kinds kept a while after destruction stay allocated:
/// the oldest is freed when one more comes.
const RETIRED: usize = 256;

/// Destroyed objects still allocated: their addresses and how to free each.
type Retired = std::collections::VecDeque<(usize, unsafe fn(usize))>;

/// Keeps the destroyed (and no longer registered) object at `p` allocated until [`RETIRED`]
/// more have come, then frees it. A verb of another thread that found it live just before
/// it was destroyed reads a destroyed object (its emulator handle says so: the verb fails),
/// not freed memory: the verbs contract forbids destroying an object while using it, but
/// Open MPI's openib sometimes destroys an address handle while its other thread posts a UD
/// send with it, which rdma-core's providers survive (they copy plain fields) and a freed
/// emulator handle would not.
fn retire<S: 'static>(p: usize) {
    /// Frees the `Box<S>` at `p`.
    unsafe fn drop_box<S>(p: usize) {
        // SAFETY: `p` came from `Box::into_raw` and was retired once: this is its only drop.
        drop(unsafe { Box::from_raw(p as *mut S) });
    }
    static LIST: std::sync::Mutex<Retired> = std::sync::Mutex::new(Retired::new());
    let oldest = {
        let mut list = LIST.lock().unwrap_or_else(|e| e.into_inner());
        list.push_back((p, drop_box::<S>));
        if list.len() > RETIRED { list.pop_front() } else { None }
    };
    if let Some((q, drop)) = oldest {
        // SAFETY: retired RETIRED objects ago, out of the registry since: nothing holds it.
        unsafe { drop(q) };
    }
}

/// What the registry knows of a live object.
struct Entry {
    ty: TypeId,
    /// The [`Ufile`](crate::verbs::import::Ufile) it belongs to (0: none, as devices and
    /// contexts).
    owner: usize,
    /// The handle the object was given (0: none to check).
    handle: u32,
    rank: u8,
    teardown: Option<unsafe fn(usize)>,
}

/// Every object handed to C and not destroyed yet, with its type, so that a destroyed, foreign
/// or mistyped pointer passed to an exported verb gets `EINVAL` instead of a use-after-free.
/// (Inline verbs such as `ibv_post_send` read the object before calling us; for those the
/// application's pointer must be valid, as with every provider.)
fn live() -> &'static Live {
    LIVE.get_or_init(|| {
        // SAFETY: the handlers are functions of this library, which stays loaded (it is
        // libibverbs); they take and let go of the table's locks on the forking thread.
        unsafe { libc::pthread_atfork(Some(hold_for_fork), Some(let_go), Some(let_go)) };
        Live::default()
    })
}

static LIVE: OnceLock<Live> = OnceLock::new();

std::thread_local! {
    /// The shards' write locks, held by the thread that forks from just before the fork until
    /// it returns, in the parent and in the child.
    static HELD_FOR_FORK: std::cell::RefCell<Vec<RwLockWriteGuard<'static, Table>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Before a fork: takes every shard's write lock, so that the child's table is whole and
/// unlocked. A thread that held one at the fork (making or destroying an object) would have
/// left it held for ever in the child, whose next object of that shard would wait for it.
extern "C" fn hold_for_fork() {
    if let Some(live) = LIVE.get() {
        HELD_FOR_FORK.with(|h| h.borrow_mut().extend(live.shards.iter().map(|s| s.write())));
    }
}

/// After a fork, in the parent and in the child: lets go of what [`hold_for_fork`] took.
extern "C" fn let_go() {
    HELD_FOR_FORK.with(|h| h.borrow_mut().clear());
}

/// The registry's table, in shards by address. A verb finds the objects the data path names
/// in [`HITS`] without a lock; the rest (and a first use) look up their shard under its read
/// lock. Creating and destroying an object write its shard alone: one uncontended lock, where
/// a table that every reader could read without a locked instruction (`ReadMostly`, which this
/// was) made each write wait for a process-wide barrier (`membarrier(2)`, ~7 us when another
/// thread of the process runs, and an interruption of that thread), some twenty a connection
/// through librdmacm. Keyed by FxHash (rustc-hash): SipHash's defence against chosen keys buys
/// nothing for addresses the allocator picked.
#[derive(Default)]
struct Live {
    shards: [RwLock<Table>; SHARDS],
}

/// An object taken out of the registry to be torn down: its rank, address and teardown.
type Teardown = (u8, usize, unsafe fn(usize));

/// Shards of [`Live`] (a power of two).
const SHARDS: usize = 16;

/// Fibonacci hashing of an object's address into `slots` (a power of two): objects a few
/// hundred bytes apart spread.
fn spread(p: usize, slots: usize) -> usize {
    (p >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - slots.ilog2())
}

/// Lookups that found a live object of a kind the data path asks for (see [`hot_tag`]), by
/// address: the address with the kind's tag in its top bits. Filled under the read lock of the
/// object's shard of [`Live`], and the object's entry emptied under that shard's write lock as
/// the object leaves the table, so an entry names an object live since it was filled. Shared
/// by all threads and written only on a miss: steady traffic reads it. A static of its own,
/// not in [`Live`]: a hit then reads no `OnceLock`'s state first.
static HITS: Hits = Hits([const { AtomicUsize::new(0) }; HIT_SLOTS]);

/// Slots of [`HITS`] (a power of two).
const HIT_SLOTS: usize = 256;

struct Hits([AtomicUsize; HIT_SLOTS]);

impl Hits {
    fn slot(&self, p: usize) -> &AtomicUsize {
        &self.0[spread(p, HIT_SLOTS)]
    }

    /// Forgets `p` (call under the write lock of its shard, as it leaves the table): a lookup
    /// that remembered it did so under the read lock, so before, and none finds it after.
    /// Another object's hit in the slot stays.
    fn forget(&self, p: usize) {
        let slot = self.slot(p);
        if slot.load(Ordering::Relaxed) & (ADDRESSES - 1) == p {
            slot.store(0, Ordering::Relaxed);
        }
    }
}

/// Where x86-64 user addresses end (2^57, with 5-level paging): [`HITS`]' tags go above.
const ADDRESSES: usize = 1 << 57;

/// The tag of the kinds every work request names (QPs, CQs, SRQs, WQs, address handles), for
/// the top bits of `p` (x86-64 user addresses stay below 2^57); `None` for the rest, and for
/// an address reaching those bits, which are looked up in the table every time.
#[inline(always)]
fn hot_tag<S: 'static>(p: usize) -> Option<usize> {
    if p >= ADDRESSES {
        return None;
    }
    let ty = TypeId::of::<S>();
    let tag = if ty == TypeId::of::<ShimQp>() {
        1
    } else if ty == TypeId::of::<ShimCq>() {
        2
    } else if ty == TypeId::of::<ShimSrq>() {
        3
    } else if ty == TypeId::of::<ShimAh>() {
        4
    } else if ty == TypeId::of::<crate::verbs::wq::ShimWq>() {
        5
    } else {
        #[cfg(test)]
        if ty == TypeId::of::<test::Hot>() {
            return Some(6 << 60);
        }
        return None;
    };
    Some(tag << 60)
}

type Table = HashMap<usize, Entry, rustc_hash::FxBuildHasher>;

impl Live {
    fn shard(&self, p: usize) -> &RwLock<Table> {
        &self.shards[spread(p, SHARDS)]
    }

    /// The entry of `p`: its type, handle and owner.
    fn get(&self, p: usize) -> Option<(TypeId, u32, usize)> {
        self.shard(p).read().get(&p).map(|e| (e.ty, e.handle, e.owner))
    }

    fn insert(&self, p: usize, e: Entry) {
        // Nothing to forget: a hit at this address was forgotten as its object left.
        self.shard(p).write().insert(p, e);
    }

    fn remove(&self, p: usize) {
        let mut shard = self.shard(p).write();
        shard.remove(&p);
        HITS.forget(p);
    }

    /// Takes out every object of the ufile at `owner` that has a teardown.
    fn take_owned(&self, owner: usize) -> Vec<Teardown> {
        let mut taken = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.write();
            for (p, e) in shard.extract_if(|_, e| e.owner == owner && e.teardown.is_some()) {
                HITS.forget(p);
                taken.extend(e.teardown.map(|t| (e.rank, p, t)));
            }
        }
        taken
    }

    /// Whether `p` is a live `S` that [`HITS`] remembers. `ibv_post_send` and `ibv_poll_cq`
    /// ask this of the same two or three objects millions of times; a hash lookup under the
    /// lock cost about 80 instructions a time, a hit about 10. A hit is never NULL (an
    /// object's address, tagged).
    #[inline(always)]
    fn hit<S: 'static>(p: usize) -> bool {
        hot_tag::<S>(p).is_some_and(|tag| HITS.slot(p).load(Ordering::Acquire) == p | tag)
    }

    /// Whether `p` is a live `S`, looked up in the table (and remembered in [`HITS`] if it is
    /// of a kind the data path asks for).
    #[cold]
    fn look_up<S: 'static>(&self, p: usize) -> bool {
        let (ty, tag) = (TypeId::of::<S>(), hot_tag::<S>(p));
        let shard = self.shard(p).read();
        let found = shard.get(&p).map(|e| e.ty) == Some(ty);
        if found && let Some(tag) = tag {
            // Under the read lock: a destroy forgets it after (see `remove`).
            HITS.slot(p).store(p | tag, Ordering::Release);
        }
        drop(shard);
        found
    }
}

/// Records an object handed to C that no context owns (a device, a context).
pub(crate) fn register<S: 'static>(p: *const S) {
    let e = Entry { ty: TypeId::of::<S>(), owner: 0, handle: 0, rank: 0, teardown: None };
    live().insert(p as usize, e);
}

/// Recovers the object behind a C pointer, if it is a live object of type `S`.
///
/// # Safety
/// If `p` names a live object of type `S` (as the registry says), the object is not freed while
/// the returned reference is used: C must not destroy an object while using it (the verbs
/// contract).
#[inline(always)]
pub(crate) unsafe fn obj<'a, C, S: 'static>(p: *mut C) -> Option<&'a S> {
    if Live::hit::<S>(p as usize) {
        // SAFETY: a hit is the address of a live S (as below), never NULL: a slot holds 0
        // or the tagged address of an object the table listed, and no object is at 0. (Said,
        // so that callers matching on the `Option` do not test it again.)
        unsafe { std::hint::assert_unchecked(!p.is_null()) };
        // SAFETY: as below.
        return Some(unsafe { &*(p as *const S) });
    }
    // SAFETY: the caller's promise.
    unsafe { obj_looked_up(p) }
}

/// [`obj`] past its remembered hits.
///
/// # Safety
/// As [`obj`].
#[cold]
#[inline(never)]
unsafe fn obj_looked_up<'a, C, S: 'static>(p: *mut C) -> Option<&'a S> {
    if !live().look_up::<S>(p as usize) {
        return None;
    }
    // SAFETY: the registry holds only pointers of live, boxed S objects; every S here is
    // #[repr(C)] with its C struct first, so the C pointer is the object's address.
    unsafe { (p as *const S).as_ref() }
}

/// [`obj`] for an argument that may be NULL: `Ok(None)` for NULL, `Err(())` for a pointer that
/// names no live `S` (the kernel fails such a command with `EINVAL`; taking it for NULL would
/// make the object without what the application asked for).
///
/// # Safety
/// As [`obj`].
pub(crate) unsafe fn optional<'a, C, S: 'static>(p: *mut C) -> Result<Option<&'a S>, ()> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise.
    unsafe { obj(p) }.map(Some).ok_or(())
}

/// [`obj`] for a verb that the kernel runs on the object's handle: `None` also when the
/// application changed the C struct's `handle`, or its `context` to one over other objects (the
/// kernel looks the handle up in the context's command file and finds nothing; the object
/// stays alive). Objects without a handle (0) pass on their pointer alone.
///
/// # Safety
/// As [`obj`].
pub(crate) unsafe fn checked<'a, C, S: Owned>(p: *mut C) -> Option<&'a S> {
    let (ty, handle, owner) = live().get(p as usize)?;
    if ty != TypeId::of::<S>() {
        return None;
    }
    // SAFETY: the registry lists a live S at `p` (see `obj`).
    let s = unsafe { (p as *const S).as_ref() }?;
    if handle == 0 {
        return Some(s);
    }
    // SAFETY: NULL or any pointer: `ctx` checks it against the registry.
    let file = unsafe { ctx(s.context()) }.map(|c| Arc::as_ptr(&c.ufile) as usize);
    (s.handle() == handle && file == Some(owner)).then_some(s)
}

/// [`checked`] as the kernel answers a lookup: `EINVAL` for a pointer that is no live `S` of
/// this library, `ENOENT` for one whose handle or context no longer names it (the kernel finds
/// no object under the handle in that command file, whatever the command).
///
/// # Safety
/// As [`obj`].
pub(crate) unsafe fn lookup<'a, C, S: Owned>(p: *mut C) -> Result<&'a S, core::ffi::c_int> {
    // SAFETY: forwarded contract.
    match unsafe { (obj::<C, S>(p), checked::<C, S>(p)) } {
        (_, Some(s)) => Ok(s),
        (Some(_), None) => Err(libc::ENOENT),
        (None, None) => Err(libc::EINVAL),
    }
}

/// A new handle in the command file of context `c` (0 if `c` is not a live context).
pub(crate) fn new_handle(c: *mut ibv_context) -> u32 {
    // SAFETY: NULL or any pointer: `ctx` checks it against the registry.
    unsafe { ctx(c) }.map_or(0, |s| s.ufile.new_handle())
}

/// Recovers the context object from `struct ibv_context *`.
///
/// # Safety
/// As [`obj`]: `p` is NULL or a context this library opened and has not closed.
pub(crate) unsafe fn ctx<'a>(p: *mut ibv_context) -> Option<&'a ShimContext> {
    if p.is_null() {
        return None;
    }
    let off = offset_of!(ShimContext, vctx) + offset_of!(verbs_context, context);
    let base = (p as usize).wrapping_sub(off) as *mut ShimContext;
    // SAFETY: checked against the registry inside `obj`.
    unsafe { obj::<ShimContext, ShimContext>(base) }
}

/// Boxes an object of a context, records it as live and owned by the context's objects, and
/// returns the pointer C will hold.
pub(crate) fn leak<S: Owned>(s: S) -> *mut S {
    // SAFETY: the object's context is NULL or one of ours.
    let owner = unsafe { ctx(s.context()) }.map_or(0, |c| Arc::as_ptr(&c.ufile) as usize);
    let handle = s.handle();
    let p = Box::into_raw(Box::new(s));
    let rank = S::RANK;
    let e = Entry { ty: TypeId::of::<S>(), owner, handle, rank, teardown: Some(teardown::<S>) };
    live().insert(p as usize, e);
    p
}

/// Boxes an object no context owns (a context, a CM channel or id), records it as live, and
/// returns the pointer C will hold.
pub(crate) fn leak_unowned<S: 'static>(s: S) -> *mut S {
    let p = Box::into_raw(Box::new(s));
    register(p);
    p
}

/// Destroys and frees the object at `p`, which the registry no longer lists.
///
/// # Safety
/// `p` came from `leak::<S>` and nothing uses it any more.
unsafe fn teardown<S: Owned>(p: usize) {
    if S::RETIRED_LATE {
        // SAFETY: by the caller's contract `p` is a live Box<S> allocation.
        unsafe { &*(p as *const S) }.close();
        return retire::<S>(p);
    }
    // SAFETY: by the caller's contract `p` is a live Box<S> allocation, ours alone now.
    let s = unsafe { Box::from_raw(p as *mut S) };
    s.close();
}

/// Destroys every object of the ufile at `owner` (its last context has closed), in their
/// ranks' order, and frees their structs: their pointers are refused from now on.
pub(crate) fn close_owned(owner: usize) {
    let mut taken = live().take_owned(owner);
    taken.sort_by_key(|&(rank, p, _)| (rank, p));
    for (_, p, teardown) in taken {
        // SAFETY: taken off the registry just now, so nothing else frees it; C does not use
        // the objects of a closed context (the verbs contract).
        unsafe { teardown(p) };
    }
}

/// Forgets and frees an object created by [`leak`] or [`leak_unowned`].
///
/// # Safety
/// `p` came from `leak::<S>` or `leak_unowned` and is not used afterwards.
pub(crate) unsafe fn free<S: 'static>(p: *const S) {
    live().remove(p as usize);
    // SAFETY: by the caller's contract `p` is a live Box<S> allocation.
    drop(unsafe { Box::from_raw(p as *mut S) });
}

/// The body of every `ibv_destroy_*` / `ibv_dealloc_*` / `ibv_dereg_mr`: recover the object
/// (`EINVAL` for NULL, destroyed or foreign pointers), destroy it in the emulator, and free it
/// once that succeeded; the emulator's errno otherwise (e.g. `EBUSY`), also left in `errno` as
/// the failed kernel command leaves it under libibverbs.
///
/// # Safety
/// As [`obj`]: C does not use `p` again after a successful destroy.
pub(crate) unsafe fn destroy<C, S: Owned>(
    p: *mut C,
    f: impl FnOnce(&S) -> rdma_emu::Result<()>,
) -> core::ffi::c_int {
    // SAFETY: forwarded contract.
    let Some(s) = (unsafe { obj::<C, S>(p) }) else {
        crate::boundary::set_errno(libc::EINVAL);
        return libc::EINVAL;
    };
    // SAFETY: as above.
    if unsafe { checked::<C, S>(p) }.is_none() {
        // The kernel's destroy finds no object under the handle in that command file.
        crate::boundary::set_errno(libc::ENOENT);
        return libc::ENOENT;
    }
    match f(s) {
        Ok(()) if S::RETIRED_LATE => {
            live().remove(s as *const S as usize);
            retire::<S>(s as *const S as usize);
            0
        }
        Ok(()) => {
            // SAFETY: destroyed in the emulator; C does not use the pointer again.
            unsafe { free(s as *const S) };
            0
        }
        Err(e) => {
            crate::boundary::set_errno(e.errno().raw());
            e.errno().raw()
        }
    }
}

/// Initialises a pthread mutex and condition variable embedded in a C object.
pub(crate) fn init_sync(m: *mut libc::pthread_mutex_t, c: *mut libc::pthread_cond_t) {
    // SAFETY: both point into an object we own and have not shared yet.
    unsafe {
        libc::pthread_mutex_init(m, std::ptr::null());
        if !c.is_null() {
            libc::pthread_cond_init(c, std::ptr::null());
        }
    }
}

/// Implements [`Owned`] for a struct whose C struct is its field `$c` (reached by `$($path)*`
/// for its `context`), destroyed by `emu.$close()`.
macro_rules! owned {
    ($t:ty, $rank:expr, |$s:ident| $ctx:expr, $close:ident) => {
        owned!($t, $rank, |$s| $ctx, $close, 0);
    };
    ($t:ty, $rank:expr, |$s:ident| $ctx:expr, $close:ident, $handle:expr) => {
        owned!($t, $rank, |$s| $ctx, $close, $handle, false);
    };
    ($t:ty, $rank:expr, |$s:ident| $ctx:expr, $close:ident, $handle:expr, $late:expr) => {
        impl Owned for $t {
            const RANK: u8 = $rank;
            const RETIRED_LATE: bool = $late;
            fn context(&self) -> *mut ibv_context {
                let $s = self;
                $ctx
            }
            fn handle(&self) -> u32 {
                let $s = self;
                let _ = $s;
                $handle
            }
            fn close(&self) {
                let _ = self.emu.$close();
            }
        }
    };
}
pub(crate) use owned;

// The objects the kernel knows by handle are checked by it; the rest by pointer alone.
owned!(ShimMw, 0, |s| s.mw.context, dealloc, s.mw.handle);
owned!(ShimQp, 1, |s| s.qp.qp_base.context, destroy, s.qp.qp_base.handle);
// An address handle is kept a while after it is destroyed (see `retire`).
owned!(ShimAh, 2, |s| s.ah.context, destroy, s.ah.handle, true);
owned!(ShimSrq, 3, |s| s.srq.context, destroy, s.srq.handle);
owned!(ShimMr, 4, |s| s.mr.context, dereg, s.mr.handle);
owned!(ShimCq, 5, |s| s.cq.context, destroy, s.cq.handle);
owned!(ShimDm, 5, |s| s.dm.context, free, s.dm.handle);
owned!(ShimChannel, 6, |s| s.ch.context, destroy);
owned!(ShimXrcd, 6, |s| s.xrcd.context, close);
impl Owned for ShimPd {
    const RANK: u8 = 7;
    fn context(&self) -> *mut ibv_context {
        self.pd.context
    }
    fn handle(&self) -> u32 {
        self.pd.handle
    }
    fn close(&self) {
        // A parent domain shares its PD's emulator object, which the PD's own close frees.
        if self.parent.is_none() {
            let _ = self.emu.dealloc();
        }
    }
}

#[cfg(test)]
mod test {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{RETIRED, free, leak_unowned, live, obj, retire};

    struct Thing(u32);
    struct Other;
    /// A kind looked up as often as a QP (one with a tag: see `hot_tag`).
    pub(super) struct Hot(pub(super) u32);

    /// A remembered lookup never outlives the object: once freed (or when asked for another
    /// type) the pointer is refused, even right after it was accepted; and a new object at
    /// its address is found for what it is.
    #[test]
    fn test_a_remembered_lookup_ends_with_its_object() {
        let p = leak_unowned(Hot(7));
        for _ in 0..3 {
            // SAFETY: `p` is live (the registry says so before the reference is made).
            assert_eq!(unsafe { obj::<Hot, Hot>(p) }.map(|t| t.0), Some(7));
            // SAFETY: asked as another type: refused before any reference is made.
            assert!(unsafe { obj::<Hot, Thing>(p) }.is_none());
        }
        // SAFETY: `p` came from `leak_unowned` and is not used after this but to be refused.
        unsafe { free(p) };
        // SAFETY: refused by the registry, so never dereferenced.
        assert!(unsafe { obj::<Hot, Hot>(p) }.is_none());
        // The allocator hands the same memory out again (most of the time): as a Thing, it
        // is no Hot.
        let t = leak_unowned(Thing(9));
        // SAFETY: refused whatever `t` is (it is a Thing), so never dereferenced as a Hot.
        assert!(unsafe { obj::<Thing, Hot>(t) }.is_none());
        // SAFETY: live.
        assert_eq!(unsafe { obj::<Thing, Thing>(t) }.map(|t| t.0), Some(9));
        // SAFETY: `t` came from `leak_unowned`.
        unsafe { free(t) };
    }

    /// As above, for a kind looked up in the table every time.
    #[test]
    fn test_a_lookup_of_a_cold_kind_ends_with_its_object() {
        let p = leak_unowned(Thing(7));
        for _ in 0..3 {
            // SAFETY: `p` is live (the registry says so before the reference is made).
            assert_eq!(unsafe { obj::<Thing, Thing>(p) }.map(|t| t.0), Some(7));
            // SAFETY: asked as another type: refused before any reference is made.
            assert!(unsafe { obj::<Thing, Other>(p) }.is_none());
        }
        // SAFETY: `p` came from `leak_unowned` and is not used after this but to be refused.
        unsafe { free(p) };
        // SAFETY: refused by the registry, so never dereferenced.
        assert!(unsafe { obj::<Thing, Thing>(p) }.is_none());
        let q = leak_unowned(Thing(8));
        // SAFETY: live.
        assert_eq!(unsafe { obj::<Thing, Thing>(q) }.map(|t| t.0), Some(8));
        // SAFETY: `q` came from `leak_unowned`.
        unsafe { free(q) };
    }

    /// Threads that make, look up and destroy objects at once (each write its shard alone)
    /// each find their own live objects, and none of them once destroyed, whatever the others
    /// do to the shards and the remembered hits meanwhile.
    #[test]
    fn test_threads_making_and_destroying_objects_at_once_see_only_live_ones() {
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                std::thread::spawn(move || {
                    // Freed only at the end: a freed address that the allocator handed out
                    // again would be found live, as the object now there.
                    let mut gone = Vec::new();
                    for round in 0..200u32 {
                        let v = t << 16 | round;
                        let made: Vec<_> = (0..8).map(|i| leak_unowned(Hot(v + i))).collect();
                        for (i, &p) in made.iter().enumerate() {
                            for _ in 0..2 {
                                // SAFETY: live (the registry says so before the reference).
                                let got = unsafe { obj::<Hot, Hot>(p) }.map(|h| h.0);
                                assert_eq!(got, Some(v + i as u32));
                            }
                        }
                        for p in made {
                            live().remove(p as usize);
                            // SAFETY: refused by the registry, so never dereferenced.
                            assert!(unsafe { obj::<Hot, Hot>(p) }.is_none());
                            gone.push(p as usize);
                        }
                    }
                    for p in gone {
                        // SAFETY: from `leak_unowned`, out of the registry: freed once, here.
                        drop(unsafe { Box::from_raw(p as *mut Hot) });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    /// A child made by `fork` while another thread held a shard's lock (making or destroying an
    /// object: here, held on purpose for a while) makes, finds and destroys objects in every
    /// shard: the fork waits for the lock, which is then let go in the child as in the parent.
    /// (Without that, the child waited for ever on a lock whose holder it does not have.)
    #[test]
    fn test_a_child_forked_while_another_thread_holds_a_shard_makes_its_own() {
        let (held, go) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let shard = live().shards[0].write();
            held.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(shard);
        });
        go.recv().unwrap();
        // SAFETY: the child uses the registry and plain Rust on its own thread, then leaves
        // with _exit (or is ended by its alarm if it hangs).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe { libc::alarm(5) };
            // Enough objects, all live at once (a freed one's address comes again), that
            // every shard has some.
            let made: Vec<_> = (0..256u32).map(|i| leak_unowned(Thing(i))).collect();
            let ok = made.iter().enumerate().all(|(i, &p)| {
                // SAFETY: live until freed below.
                unsafe { obj::<Thing, Thing>(p) }.map(|t| t.0) == Some(i as u32)
            });
            for p in made {
                // SAFETY: from `leak_unowned`, used no more.
                unsafe { free(p) };
            }
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child hung (killed by its alarm) or found a wrong object: status {status:#x}"
        );
        holder.join().unwrap();
    }

    /// Counts its drops.
    struct Counted(u32, &'static AtomicUsize);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A retired object is refused at once, but its memory still holds it (a verb that found
    /// it live just before reads it whole) until RETIRED more objects were retired; then it is
    /// freed, the oldest first.
    #[test]
    fn test_a_retired_object_stays_readable_until_enough_others_follow() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        let first = leak_unowned(Counted(41, &DROPS));
        live().remove(first as usize);
        retire::<Counted>(first as usize);
        // SAFETY: refused by the registry, so never dereferenced.
        assert!(unsafe { obj::<Counted, Counted>(first) }.is_none());
        // SAFETY: retired, not freed: still a valid Counted (what a racing verb would read).
        assert_eq!(unsafe { (*first).0 }, 41);
        let before = DROPS.load(Ordering::SeqCst);
        for i in 0..RETIRED {
            let p = leak_unowned(Counted(i as u32, &DROPS));
            live().remove(p as usize);
            retire::<Counted>(p as usize);
        }
        // Other tests may retire objects meanwhile: at least the first is gone now.
        assert!(DROPS.load(Ordering::SeqCst) > before, "the oldest retired object was freed");
    }
}
