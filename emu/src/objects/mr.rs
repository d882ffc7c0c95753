//! Memory regions and the device's key space.

use std::sync::{
    Arc,
    atomic::{AtomicU32, Ordering},
};

use crate::sync::{Mutex, RwLock};

use super::{
    Lifecycle,
    device::{DeviceInner, ResourceCounts},
    dm::DmInner,
    keys::{KeyEntry, KeyTable},
    pd::{Pd, PdInner},
    pinned::Charge,
};
use crate::{
    error::{Errno, Error, Result, einval},
    mem::{MemRegion, RawMemory},
    profile::Profile,
    shared_mem::Lease,
    types::AccessFlags,
};

/// The registration an lkey/rkey names: immutable, replaced as a whole by `rereg`.
#[derive(Debug)]
pub(crate) struct MrInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) region: Arc<MemRegion>,
    /// Address of the first byte in the MR's own address space (what SGEs and RETHs use).
    pub(crate) iova: u64,
    pub(crate) access: AccessFlags,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    /// Memory windows bound to the registration (shared by its `rereg` successors): an MR
    /// with windows bound cannot be deregistered.
    pub(crate) windows: Arc<AtomicU32>,
}

impl MrInner {
    /// Offset into the region of `[va, va+len)`, if the range lies inside the MR.
    pub(crate) fn offset_of(&self, va: u64, len: u64) -> Option<usize> {
        offset_in(self.iova, self.region.len() as u64, va, len)
    }
}

/// Offset of `[va, va+len)` in an MR that starts at `iova` and spans `size` bytes, if the
/// range lies inside it.
#[inline]
pub(crate) fn offset_in(iova: u64, size: u64, va: u64, len: u64) -> Option<usize> {
    let off = va.checked_sub(iova)?;
    (off.checked_add(len)? <= size).then_some(off as usize)
}

#[derive(Debug)]
pub(crate) struct MrShared {
    dev: Arc<DeviceInner>,
    key: u32,
    cur: RwLock<Arc<MrInner>>,
    life: Lifecycle,
    /// The device memory the MR lies in (`ibv_reg_dm_mr`), kept busy while it lives.
    dm: Option<Arc<DmInner>>,
    /// The locked-memory pages its application memory holds charged.
    charge: Mutex<Charge>,
    /// The shared memory its application memory was moved into (see `crate::shared_mem`),
    /// given back with the registration.
    lease: Mutex<Option<Lease>>,
}

impl MrShared {
    /// Frees the key (under the key table's lock, `keys`) and the references.
    fn teardown(&self, keys: &mut KeyTable) {
        let cur = self.cur.read().clone();
        cur.pd.ctx.fabric.withdraw_mr(self.dev.id.index, cur.rkey);
        keys.remove(self.key);
        drop(std::mem::take(&mut *self.charge.lock()));
        drop(self.lease.lock().take());
        self.cur.read().pd.life.put();
        if let Some(dm) = &self.dm {
            dm.life.put();
        }
        ResourceCounts::give(&self.dev.counts.mr);
    }
}

impl Drop for MrShared {
    fn drop(&mut self) {
        if self.life.destroy().is_ok() {
            self.teardown(&mut self.dev.keys.write());
        }
    }
}

/// What `rereg` changes: each field set is one `IBV_REREG_MR_CHANGE_*` flag. Changing nothing
/// is refused (`EINVAL`), as the kernel refuses `flags == 0`.
#[derive(Debug, Default)]
pub struct Rereg<'a> {
    /// `IBV_REREG_MR_CHANGE_PD`.
    pub pd: Option<&'a Pd>,
    /// `IBV_REREG_MR_CHANGE_ACCESS`.
    pub access: Option<AccessFlags>,
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`: new memory and the iova of its first byte.
    pub translation: Option<(RawMemory, u64)>,
}

impl<'a> Rereg<'a> {
    /// Only the access flags.
    pub fn access(access: AccessFlags) -> Rereg<'a> {
        Rereg { access: Some(access), ..Rereg::default() }
    }

    /// Only the PD.
    pub fn pd(pd: &'a Pd) -> Rereg<'a> {
        Rereg { pd: Some(pd), ..Rereg::default() }
    }
}

/// A registered memory region (`struct ibv_mr`). Deregistered by [`Mr::dereg`], or when the
/// last handle is dropped.
#[derive(Clone, Debug)]
pub struct Mr(pub(crate) Arc<MrShared>);

/// Access flags `ibv_reg_mr` accepts (bits 0..7 and relaxed ordering), as the kernel's
/// `IB_ACCESS_SUPPORTED` in Linux 6.1; the full profile also takes the FLUSH rights (a later
/// kernel's, with a device that does RDMA FLUSH).
fn supported_access(profile: Profile) -> u32 {
    let flush = AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT;
    let base = 0xff | AccessFlags::RELAXED_ORDERING.bits();
    if profile == Profile::Full { base | flush.bits() } else { base }
}

fn check_access(profile: Profile, access: AccessFlags) -> Result<()> {
    if access.bits() & !supported_access(profile) != 0 {
        return Err(einval("unsupported access flags"));
    }
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(einval("remote write or atomic access needs local write"));
    }
    if access.contains(AccessFlags::ON_DEMAND) && profile == Profile::Rxe {
        // Linux 6.1's rxe has no on-demand paging.
        return Err(einval("on-demand paging is not supported"));
    }
    Ok(())
}

/// rxe hands out an rkey only to MRs with a remote access right (others report rkey 0); on
/// mlx5, which the full profile follows, the rkey is the lkey whatever the access, so an rkey
/// saved at registration stays valid when `rereg` grants remote access later.
fn rkey_for(profile: Profile, key: u32, access: AccessFlags) -> u32 {
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if profile == Profile::Full || access.intersects(remote) { key } else { 0 }
}

/// The iova of an MR's first byte: 0 for a zero-based MR in the full profile (mlx5 honours
/// `IBV_ACCESS_ZERO_BASED`; rxe ignores it).
fn effective_iova(profile: Profile, access: AccessFlags, iova: u64) -> u64 {
    if access.contains(AccessFlags::ZERO_BASED) && profile == Profile::Full { 0 } else { iova }
}

/// Checks the range `len` bytes at `iova` an MR would cover. Pinning no pages fails in the
/// kernel; a device memory MR (`device_memory`) of length 0 only has its bounds checked (small
/// allocations with fractional sizes produce them).
fn check_range(len: usize, iova: u64, device_memory: bool) -> Result<()> {
    if len == 0 && !device_memory {
        return Err(einval("zero-length memory region"));
    }
    if iova.checked_add((len as u64).saturating_sub(1)).is_none() {
        return Err(einval("iova range overflows"));
    }
    Ok(())
}

/// The kernel pins an MR's pages for writing when any of these rights lets the device or a
/// window write them (`ib_access_writable`).
fn writable(access: AccessFlags) -> bool {
    access.intersects(
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND,
    )
}

/// `ibv_advise_mr` (see [`Pd::advise_mr`]): every SGE must name an on-demand MR of `pd`
/// (`ENOENT`) and lie inside it (`EFAULT`); then its pages are faulted in, which with `flush`
/// (`IBV_ADVISE_MR_FLAG_FLUSH`) must succeed before the call returns (`EFAULT`), and without it
/// is a hint whose failure nobody sees, as the device's asynchronous prefetch.
pub(crate) fn advise(
    pd: &Pd,
    advice: crate::Advice,
    flush: bool,
    sg_list: &[crate::Sge],
) -> Result<()> {
    use crate::Advice;
    pd.0.life.check()?;
    if !matches!(advice, Advice::PREFETCH | Advice::PREFETCH_WRITE | Advice::PREFETCH_NO_FAULT) {
        return Err(Error::new(Errno::EOPNOTSUPP, "unknown advice"));
    }
    if sg_list.is_empty() {
        return Err(einval("no SGE to advise"));
    }
    let write = advice == Advice::PREFETCH_WRITE;
    let mut ranges = Vec::with_capacity(sg_list.len());
    {
        let keys = pd.0.ctx.device.keys.read();
        for sge in sg_list {
            let mr = keys.mr(sge.lkey).filter(|mr| {
                mr.lkey == sge.lkey
                    && Arc::ptr_eq(&mr.pd, &pd.0)
                    && mr.access.contains(AccessFlags::ON_DEMAND)
                    && (!write || mr.access.contains(AccessFlags::LOCAL_WRITE))
            });
            let Some(mr) = mr else {
                return Err(Error::new(Errno::ENOENT, "no on-demand MR of this PD has the lkey"));
            };
            let Some(off) = mr.offset_of(sge.addr, sge.length as u64) else {
                return Err(Error::new(Errno::EFAULT, "the range is outside the MR"));
            };
            ranges.push(mr.region.host_addr().wrapping_add(off as u64));
        }
    }
    if advice == Advice::PREFETCH_NO_FAULT {
        return Ok(());
    }
    for (addr, sge) in ranges.into_iter().zip(sg_list) {
        let brought = sge.length == 0 || crate::sys::fault_in(addr, sge.length as usize, write);
        if flush && !brought {
            return Err(Error::new(Errno::EFAULT, "the pages cannot be brought in"));
        }
    }
    Ok(())
}

/// Checks that application memory lent to an MR can be pinned with `access`: `EFAULT` for an
/// unmapped range, or a read-only one given a writable right, as the kernel's pinning fails.
/// Pages the application unmaps after this check are its own fault, as with a NIC: the first
/// access the emulator makes to them ends the process with `SIGSEGV`.
fn pin(region: &MemRegion, access: AccessFlags) -> Result<()> {
    if crate::sys::fault_in(region.host_addr(), region.len(), writable(access)) {
        Ok(())
    } else {
        Err(Error::new(Errno::EFAULT, "the memory cannot be pinned (unmapped or read-only)"))
    }
}

/// Pins the application memory of `region` for `access` and, where the fabric's peers take
/// it so, moves it into shared memory (`share`); the locked-memory charge and the lease.
///
/// Memory that may move is first brought in for reading only: a page the application never
/// touched is then the kernel's one page of zeros, which the move leaves out, where pinning it
/// for writing allocated and cleared a page, which the move then looked through and freed
/// (64 MiB never touched, registered: see docs/benchmarks.md, session 108). The pages that
/// moved are writable (the move takes only private writable memory) and stay so; the rest is
/// pinned for writing after, as any MR's.
fn pin_and_share(
    fabric: &crate::fabric::FabricInner,
    region: &mut MemRegion,
    access: AccessFlags,
) -> Result<(Charge, Option<Lease>)> {
    if !may_share(fabric, region, access) || !writable(access) {
        pin(region, access)?;
        let charge = charged_to(fabric, region)?;
        return Ok((charge, share(fabric, region, access)));
    }
    pin(region, AccessFlags::empty())?;
    let charge = charged_to(fabric, region)?;
    let lease = share(fabric, region, access);
    let (addr, end) = (region.host_addr(), region.host_addr() + region.len() as u64);
    let (moved_from, moved_to) = match &lease {
        Some(lease) => {
            let (base, len) = lease.shared().range();
            (base.clamp(addr, end), (base + len as u64).clamp(addr, end))
        }
        None => (end, end),
    };
    // What did not move: the whole region, or the parts of pages at its ends.
    for (from, to) in [(addr, moved_from), (moved_to, end)] {
        if from < to && !crate::sys::fault_in(from, (to - from) as usize, true) {
            return Err(Error::new(
                Errno::EFAULT,
                "the memory cannot be pinned (unmapped or read-only)",
            ));
        }
    }
    Ok((charge, lease))
}

/// Whether `share` would try to move `region` (a fabric that shares MRs, and enough bytes).
fn may_share(fabric: &crate::fabric::FabricInner, region: &MemRegion, access: AccessFlags) -> bool {
    use crate::shared_mem::{MIN_BYTES, MIN_READ_ONLY_BYTES};
    let min =
        if access.contains(AccessFlags::REMOTE_WRITE) { MIN_BYTES } else { MIN_READ_ONLY_BYTES };
    fabric.share_mr && region.len() >= min
}

/// Moves the application memory of `region` into shared memory where the fabric's peers
/// read it, and write it if `access` lets them (see `crate::shared_mem`); what the MR then
/// holds.
fn share(
    fabric: &crate::fabric::FabricInner,
    region: &mut MemRegion,
    access: AccessFlags,
) -> Option<Lease> {
    if !may_share(fabric, region, access) {
        return None;
    }
    let (addr, len) = region.movable();
    let lease = crate::shared_mem::adopt(addr, len)?;
    region.set_shared(lease.shared().clone());
    Some(lease)
}

/// The locked-memory charge of registering `region` on `fabric` (see `pinned`).
fn charged_to(fabric: &crate::fabric::FabricInner, region: &MemRegion) -> Result<Charge> {
    if !fabric.memlock {
        return Ok(Charge::default());
    }
    Charge::take(region.host_addr(), region.len())
}

impl Mr {
    fn register(
        pd: &Pd,
        region: MemRegion,
        iova: u64,
        access: AccessFlags,
        dm: Option<Arc<DmInner>>,
        app_memory: bool,
    ) -> Result<Mr> {
        check_access(pd.0.ctx.device.profile, access)?;
        check_range(region.len(), iova, dm.is_some())?;
        // On-demand paging pins nothing: pages are faulted in as the device touches them.
        let on_demand = access.contains(AccessFlags::ON_DEMAND);
        let region = if on_demand && dm.is_none() { region.into_on_demand() } else { region };
        let mut region = region;
        let (charge, lease) = if app_memory && !on_demand {
            pin_and_share(&pd.0.ctx.fabric, &mut region, access)?
        } else {
            // The emulator's own buffers (an rsocket's ring and send buffer) are shared as an
            // application's are: a peer then writes into the ring and pulls from the send
            // buffer through its view, one `memcpy`, not `process_vm_readv`/`writev`.
            if region.owned_for_peers()
                && !on_demand
                && let Some(lease) = share(&pd.0.ctx.fabric, &mut region, access)
            {
                region.keep_lease(lease);
            }
            (Charge::default(), None)
        };
        let dev = pd.0.ctx.device.clone();
        let iova = effective_iova(dev.profile, access, iova);
        ResourceCounts::take(&dev.counts.mr, dev.attr.max_mr, "too many memory regions")?;
        if let Err(e) = pd.0.life.get() {
            ResourceCounts::give(&dev.counts.mr);
            return Err(e);
        }
        if let Some(dm) = &dm
            && let Err(e) = dm.life.get()
        {
            pd.0.life.put();
            ResourceCounts::give(&dev.counts.mr);
            return Err(e);
        }
        let region = Arc::new(region);
        let profile = dev.profile;
        let mut made = None;
        let inserted = dev.keys.insert(|key| {
            let mr = Arc::new(MrInner {
                pd: pd.0.clone(),
                region,
                iova,
                access,
                lkey: key,
                rkey: rkey_for(profile, key, access),
                windows: Arc::default(),
            });
            made = Some(mr.clone());
            KeyEntry::Mr(mr)
        });
        let key = match inserted {
            Ok(k) => k,
            Err(e) => {
                pd.0.life.put();
                if let Some(dm) = &dm {
                    dm.life.put();
                }
                ResourceCounts::give(&dev.counts.mr);
                return Err(e);
            }
        };
        let made = made.expect("filled by insert");
        pd.0.ctx.fabric.export_mr(dev.id.index, &made);
        let cur = RwLock::new(made);
        let (charge, lease) = (Mutex::new(charge), Mutex::new(lease));
        let life = Lifecycle::default();
        Ok(Mr(Arc::new(MrShared { dev, key, cur, life, dm, charge, lease })))
    }

    pub(crate) fn register_owned(pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr> {
        Mr::register_storage(pd, MemRegion::owned(len), access)
    }

    /// [`Mr::register_owned`] over memory that peers in other processes reach (see
    /// `MemRegion::owned_for`).
    pub(crate) fn register_owned_for_peers(pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr> {
        Mr::register_storage(pd, MemRegion::owned_for(len), access)
    }

    /// Registers the emulator's own storage `region`, its iova its host address.
    fn register_storage(pd: &Pd, region: MemRegion, access: AccessFlags) -> Result<Mr> {
        let iova = region.host_addr();
        Mr::register(pd, region, iova, access, None, false)
    }

    /// An MR over `part` of the device memory `dm`, zero-based.
    pub(crate) fn register_dm(
        pd: &Pd,
        part: MemRegion,
        dm: Arc<DmInner>,
        access: AccessFlags,
    ) -> Result<Mr> {
        Mr::register(pd, part, 0, access, Some(dm), false)
    }

    /// `ibv_reg_dmabuf_mr`: an MR over bytes `offset..offset+len` of the dma-buf (or memfd)
    /// `fd`, mapped for as long as the MR lives. As the kernel: `EOPNOTSUPP` in the rxe profile
    /// (rxe has no dma-buf registration), `EINVAL` when `offset` and `iova` differ within a
    /// page, for bad access flags, a range past the end of the file or a file that cannot be
    /// mapped; `EBADF` for a descriptor that is not open.
    pub(crate) fn register_dmabuf(
        pd: &Pd,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        use std::os::fd::AsRawFd;
        if pd.0.ctx.device.profile == Profile::Rxe {
            return Err(Error::new(Errno::EOPNOTSUPP, "rxe registers no dma-buf memory"));
        }
        let page = crate::sys::page_size();
        if offset % page != iova % page {
            return Err(einval("offset and iova differ within a page"));
        }
        check_access(Profile::Full, access)?;
        let region = MemRegion::mapped(fd.as_raw_fd(), offset, len, writable(access))
            .map_err(|e| Error::new(Errno(e), "the dma-buf range cannot be mapped"))?;
        Mr::register(pd, region, iova, access, None, false)
    }

    /// Implicit on-demand paging (`ibv_reg_mr(pd, NULL, SIZE_MAX, access)`): one MR over the
    /// whole address space, iova 0, each address its own; `EINVAL` without `ON_DEMAND` (and in
    /// the rxe profile, which has no ODP).
    pub(crate) fn register_implicit(pd: &Pd, access: AccessFlags) -> Result<Mr> {
        if !access.contains(AccessFlags::ON_DEMAND) {
            return Err(einval("an MR over the whole address space needs on-demand paging"));
        }
        Mr::register(pd, MemRegion::whole_address_space(), 0, access, None, false)
    }

    pub(crate) fn register_raw(
        pd: &Pd,
        mem: RawMemory,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        Mr::register(pd, mem.0, iova, access, None, true)
    }

    pub(crate) fn snapshot(&self) -> Arc<MrInner> {
        self.0.cur.read().clone()
    }

    /// The local key (`ibv_mr.lkey`).
    pub fn lkey(&self) -> u32 {
        self.0.key
    }

    /// The remote key (`ibv_mr.rkey`): the lkey, except in the rxe profile for an MR without a
    /// remote access right (0, as rxe reports).
    pub fn rkey(&self) -> u32 {
        self.snapshot().rkey
    }

    /// The address SGEs and remote peers use for the first byte (the iova).
    pub fn addr(&self) -> u64 {
        self.snapshot().iova
    }

    /// Length in bytes.
    pub fn length(&self) -> usize {
        self.snapshot().region.len()
    }

    /// Access flags.
    pub fn access(&self) -> AccessFlags {
        self.snapshot().access
    }

    /// The PD the MR is registered in.
    pub fn pd(&self) -> Pd {
        Pd(self.snapshot().pd.clone())
    }

    /// Copies `data` into the region at byte `offset` (local CPU access, not an RDMA access).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.snapshot().region.write(offset, data).map_err(|_| einval("outside the region"))
    }

    /// Copies bytes from the region at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.snapshot().region.read(offset, out).map_err(|_| einval("outside the region"))
    }

    /// Reads the native-endian 64-bit word at `offset` (what atomics operate on).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Writes a native-endian 64-bit word at `offset`.
    pub fn write_u64(&self, offset: usize, v: u64) -> Result<()> {
        self.write(offset, &v.to_ne_bytes())
    }

    /// `ibv_rereg_mr`: changes the PD, the access flags and/or the memory (the translation)
    /// in one step; the keys stay the same, as when mlx5 can update an MR in place. The rxe
    /// profile has no rereg (rdma-core answers `EOPNOTSUPP`); device memory MRs and MRs with
    /// windows bound cannot take new memory (`EINVAL`).
    pub fn rereg(&self, what: Rereg<'_>) -> Result<()> {
        self.0.life.check()?;
        if self.0.dev.profile == Profile::Rxe {
            return Err(Error::new(Errno::EOPNOTSUPP, "rxe does not support rereg_mr"));
        }
        let old = self.snapshot();
        if what.pd.is_none() && what.access.is_none() && what.translation.is_none() {
            return Err(einval("rereg changes nothing"));
        }
        let access = what.access.unwrap_or(old.access);
        check_access(self.0.dev.profile, access)?;
        let (mut charge, mut lease) = (None, None);
        let (region, iova) = match what.translation {
            Some(_) if self.0.dm.is_some() => return Err(einval("a device memory MR")),
            Some(_) if old.windows.load(Ordering::Acquire) > 0 => {
                return Err(einval("memory windows are bound to the MR"));
            }
            Some((mut mem, iova)) => {
                check_range(mem.0.len(), iova, false)?;
                let pd = what.pd.map_or(&old.pd, |p| &p.0);
                let (c, l) = pin_and_share(&pd.ctx.fabric, &mut mem.0, access)?;
                (charge, lease) = (Some(c), Some(l));
                (Arc::new(mem.0), effective_iova(self.0.dev.profile, access, iova))
            }
            None => {
                // New rights over the same pages: a writable right pins them for writing.
                if writable(access) && !writable(old.access) && self.0.dm.is_none() {
                    pin(&old.region, access)?;
                }
                (old.region.clone(), old.iova)
            }
        };
        let pd = match what.pd {
            Some(p) => {
                if !Arc::ptr_eq(&p.0.ctx.device, &self.0.dev) {
                    return Err(einval("PD belongs to another device"));
                }
                p.0.life.get()?;
                old.pd.life.put();
                p.0.clone()
            }
            None => old.pd.clone(),
        };
        let new = Arc::new(MrInner {
            pd,
            region,
            iova,
            access,
            lkey: old.lkey,
            rkey: rkey_for(self.0.dev.profile, old.lkey, access),
            windows: old.windows.clone(),
        });
        let mut keys = self.0.dev.keys.write();
        // Peers acting for this process while it is stopped see the new registration only
        // once none can be acting on the old one.
        let fabric = &new.pd.ctx.fabric;
        fabric.withdraw_mr(self.0.dev.id.index, old.rkey);
        fabric.export_mr(self.0.dev.id.index, &new);
        keys.replace(self.0.key, KeyEntry::Mr(new.clone()));
        *self.0.cur.write() = new;
        if let Some(c) = charge {
            // The old pages are given back as the new ones stay charged.
            *self.0.charge.lock() = c;
        }
        if let Some(l) = lease {
            // The old memory moves back (unless another MR holds it).
            *self.0.lease.lock() = l;
        }
        Ok(())
    }

    /// `ibv_dereg_mr`. After it returns no RDMA operation reads or writes the memory. An MR
    /// with memory windows bound to it stays registered (`EINVAL`, as rxe; IBA 10.6.7.2.6).
    pub fn dereg(&self) -> Result<()> {
        // Under the key table's write lock no bind can take a window onto the MR.
        let mut keys = self.0.dev.keys.write();
        self.0.life.check()?;
        if self.snapshot().windows.load(Ordering::Acquire) > 0 {
            return Err(einval("memory windows are bound to the MR"));
        }
        self.0.life.destroy()?;
        self.0.teardown(&mut keys);
        Ok(())
    }
}
