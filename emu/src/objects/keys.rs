//! The device's key space: one table of lkeys/rkeys naming memory regions and memory windows
//! (as rxe's pools share the key format `index << 8 | key`).

use std::{
    cell::UnsafeCell,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
};

use super::{
    mr::{MrInner, offset_in},
    mw::MwShared,
    pd::PdInner,
};
use crate::{
    error::{Errno, Error, Result},
    mem::{MemRegion, Span},
    sync::{Guarded, GuardedRead, GuardedWrite, Mutex, ReadMostly},
    types::AccessFlags,
};

/// A device's key table behind its fabric's key lock, whose readers (every work request) each
/// take a word of their own, so that threads posting at once do not pass a lock word between
/// their cores; registering and deregistering, rare by comparison, wait for every reader. The
/// fabric's devices share the lock (not the tables): a work request between two of them reads
/// the second table under its read of the first ([`Keys::under`]).
#[derive(Debug)]
pub(crate) struct Keys(Guarded<KeyTable>);

impl Keys {
    /// An empty table behind `lock`, the fabric's.
    pub(crate) fn new(lock: Arc<ReadMostly<()>>) -> Keys {
        Keys(Guarded::new(lock, KeyTable::default()))
    }

    #[inline(always)]
    pub(crate) fn read(&self) -> GuardedRead<'_, KeyTable> {
        self.0.read()
    }

    /// This table under `held`, a read of another device's, if the two share a lock (they do
    /// in one fabric).
    #[inline]
    pub(crate) fn under<'g>(&'g self, held: &'g GuardedRead<'_, KeyTable>) -> Option<&'g KeyTable> {
        self.0.under(held)
    }

    pub(crate) fn write(&self) -> GuardedWrite<'_, KeyTable> {
        self.0.write()
    }

    /// Hands out a key for an object that `fill` builds. Under a read of the key lock, as work
    /// requests read it: a registration does not wait for them nor stop the process's other
    /// threads (a write issues a process-wide barrier, see `sync::barrier`). Only when every
    /// slot is taken does the table grow, under the write (it doubles: a few times in all).
    pub(crate) fn insert(&self, fill: impl FnOnce(u32) -> KeyEntry) -> Result<u32> {
        loop {
            {
                let keys = self.read();
                if let Some(key) = keys.take_key() {
                    keys.publish(key, fill(key));
                    return Ok(key);
                }
            }
            self.write().grow()?;
        }
    }
}

/// What a key index names.
#[derive(Debug, Clone)]
pub(crate) enum KeyEntry {
    Mr(Arc<MrInner>),
    Mw(Arc<MwShared>),
}

/// Keys are `index << 8 | tag`; the tag changes each time a slot is reused, so a stale key
/// never names a newer object (as rxe's 8-bit key part does). A memory window changes its own
/// tag with every bind, so windows are found by index and match their current rkey themselves.
///
/// Keys are handed out while work requests read the table ([`Keys::insert`]); they are taken
/// back, and slots moved, only under the key lock's write ([`KeyTable::remove`],
/// [`KeyTable::grow`]), which no reader shares.
pub(crate) struct KeyTable {
    /// Never moved but under the write; index 0 is never handed out (key 0 is never valid),
    /// so that a key's index is its slot's, without a subtraction and its check per lookup.
    slots: Box<[Slot]>,
    alloc: Mutex<Alloc>,
}

/// The keys `insert` may hand out: taken under a read, given back under the write.
#[derive(Default)]
struct Alloc {
    /// The keys last handed out at freed indices, reused last-freed-first (deterministic), each
    /// under the next tag.
    free: Vec<u32>,
    /// The lowest index never handed out.
    next: u32,
}

/// `Slot::state` of a slot that names nothing (and of slot 0's): never a key handed out (its
/// index is above `MAX_INDEX`).
const NOTHING: u32 = u32::MAX;
/// `Slot::state` of a slot that names a memory window (not a key handed out either).
const HOLDS_MW: u32 = u32::MAX - 1;

/// A key index's state, what it names, and for an MR what a work request checks of it.
struct Slot {
    /// What the slot names: an MR (its lkey, the key handed out), a window ([`HOLDS_MW`]) or
    /// [`NOTHING`]. Stored (release) once the fields below are written; loaded (acquire) by a
    /// reader before it looks at them. A key names an MR if it is its slot's state: one
    /// compare.
    state: AtomicU32,
    entry: UnsafeCell<Option<KeyEntry>>,
    /// `Some` while the slot holds an MR.
    check: UnsafeCell<Option<MrCheck>>,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            state: AtomicU32::new(NOTHING),
            entry: Default::default(),
            check: Default::default(),
        }
    }
}

// SAFETY: `entry` and `check` are written only (a) through `&mut Slot` (the key lock's write:
// no reader), or (b) by the one thread that took the slot's key from `Alloc` while `state`
// says the slot names nothing, which readers check (acquire) before they look at either; the
// `state` that says it names something is stored (release) after them, and nothing writes
// them again until a `&mut` does. Readers take shared references only.
#[allow(unsafe_code)]
unsafe impl Sync for Slot {}

impl Slot {
    /// Fills the slot with `entry`, handed out as `key`.
    ///
    /// # Safety
    /// No other thread reads or writes `entry` or `check` meanwhile (see `Slot`'s `Sync`).
    #[allow(unsafe_code)]
    unsafe fn fill(&self, key: u32, entry: KeyEntry) {
        let state = match entry {
            KeyEntry::Mr(_) => key,
            KeyEntry::Mw(_) => HOLDS_MW,
        };
        // SAFETY: the caller's promise: nobody else reaches the two fields now.
        unsafe {
            *self.check.get() = MrCheck::of(&entry);
            *self.entry.get() = Some(entry);
        }
        self.state.store(state, Ordering::Release);
    }

    /// The slot, if its state is `state` (acquire): its fields then stay as they are for as
    /// long as the table is borrowed (only a `&mut` changes them). Never for [`NOTHING`]: a
    /// slot is found by a key's index, and a table has no slot at that state's.
    #[inline(always)]
    fn holding(&self, state: u32) -> Option<&Slot> {
        (self.state.load(Ordering::Acquire) == state).then_some(self)
    }

    /// What the slot names, once [`Slot::holding`] said it names something.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn entry(&self) -> Option<&KeyEntry> {
        // SAFETY: written before the state its caller loaded, and not again while the table
        // is borrowed (see `Slot`'s `Sync`).
        unsafe { (*self.entry.get()).as_ref() }
    }

    /// The check of the MR the slot holds, once [`Slot::holding`] said it holds one.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn mr_check(&self) -> &MrCheck {
        // SAFETY: as in `entry`; and `fill` stores `Some` for an MR (`MrCheck::of`) before
        // the state that says it holds one.
        unsafe { (*self.check.get()).as_ref().unwrap_unchecked() }
    }
}

/// What the express path checks of an MR, copied into its slot when the slot is filled: a
/// work request's key then reads the slot alone, where it followed the slot to the MR and the
/// MR to its memory, each load waiting for the one before (see [`KeyTable::range`]).
struct MrCheck {
    /// The MR's PD, by address: compared, never followed.
    pd: usize,
    rkey: u32,
    access: AccessFlags,
    /// The memory cannot fault (it is not on demand).
    plain: bool,
    iova: u64,
    len: u64,
    region: Arc<MemRegion>,
}

impl MrCheck {
    fn of(entry: &KeyEntry) -> Option<MrCheck> {
        let KeyEntry::Mr(mr) = entry else { return None };
        Some(MrCheck {
            pd: Arc::as_ptr(&mr.pd) as usize,
            rkey: mr.rkey,
            access: mr.access,
            plain: !mr.region.on_demand(),
            iova: mr.iova,
            len: mr.region.len() as u64,
            region: mr.region.clone(),
        })
    }
}

/// Counts only: an entry's MR leads back to its device, whose table this is, so printing the
/// entries would recurse without end.
impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.slots.iter().filter(|s| s.state.load(Ordering::Relaxed) != NOTHING).count();
        let free = self.alloc.lock().free.len();
        f.debug_struct("KeyTable").field("used", &used).field("free", &free).finish()
    }
}

/// The highest index handed out: a table never has a slot at [`NOTHING`]'s and
/// [`HOLDS_MW`]'s index, so that neither is ever a key's.
const MAX_INDEX: u32 = (1 << 24) - 2;

/// The accesses only an rkey asks for.
const REMOTE: AccessFlags =
    AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE).union(AccessFlags::REMOTE_ATOMIC);

/// Slots a table starts with: the registrations of most programs, without a write.
const FIRST_SLOTS: usize = 64;

impl Default for KeyTable {
    fn default() -> Self {
        let slots = (0..FIRST_SLOTS).map(|_| Slot::default()).collect();
        KeyTable { slots, alloc: Mutex::new(Alloc { free: Vec::new(), next: 1 }) }
    }
}

impl KeyTable {
    /// A key to hand out, if a slot is left: its index's slot names nothing, and only the
    /// caller fills it (see `Slot`'s `Sync`). A freed index comes back under its next tag, so
    /// that a stale key never names the newer object.
    fn take_key(&self) -> Option<u32> {
        let mut alloc = self.alloc.lock();
        if let Some(last) = alloc.free.pop() {
            return Some(last & !0xff | (last as u8).wrapping_add(1) as u32);
        }
        let i = alloc.next;
        ((i as usize) < self.slots.len()).then(|| {
            alloc.next += 1;
            i << 8 | 1
        })
    }

    /// Fills the slot of `key`, taken by [`KeyTable::take_key`], with `entry`.
    #[allow(unsafe_code)]
    fn publish(&self, key: u32, entry: KeyEntry) {
        // SAFETY: the key's index is this thread's alone since `take_key`, and its slot names
        // nothing: no reader looks at its fields (see `Slot`'s `Sync`).
        unsafe { self.slots[(key >> 8) as usize].fill(key, entry) };
    }

    /// Doubles the slots (under the write: they move), up to the key space's end, unless a
    /// slot is free again (another registration grew the table first, or a key was freed).
    fn grow(&mut self) -> Result<()> {
        let len = self.slots.len();
        let alloc = self.alloc.get_mut();
        if !alloc.free.is_empty() || (alloc.next as usize) < len {
            return Ok(());
        }
        if len > MAX_INDEX as usize {
            return Err(Error::new(Errno::ENOMEM, "key space exhausted"));
        }
        let more = (len * 2).min(MAX_INDEX as usize + 1) - len;
        let mut slots = std::mem::take(&mut self.slots).into_vec();
        slots.extend((0..more).map(|_| Slot::default()));
        self.slots = slots.into_boxed_slice();
        Ok(())
    }

    #[inline]
    fn slot(&self, key: u32) -> Option<&Slot> {
        self.slots.get((key >> 8) as usize)
    }

    /// The memory region `key` names (index and tag).
    pub(crate) fn mr(&self, key: u32) -> Option<&Arc<MrInner>> {
        match self.slot(key)?.holding(key)?.entry()? {
            KeyEntry::Mr(mr) => Some(mr),
            KeyEntry::Mw(_) => None,
        }
    }

    /// The memory of `[va, va + len)` and its offset there, if `key` names an MR of `pd` (as
    /// its lkey, or as its rkey where `access` asks a remote access) that grants `access`,
    /// whose range holds it, over memory that cannot fault: what the express path asks of a
    /// key (anything else goes the packet path's way, which tells the errors apart).
    #[inline]
    pub(crate) fn range(
        &self,
        key: u32,
        pd: &Arc<PdInner>,
        access: AccessFlags,
        va: u64,
        len: u64,
    ) -> Option<(&MemRegion, usize)> {
        let (c, off) = self.check(key, pd, access, va, len)?;
        Some((&*c.region, off))
    }

    /// [`KeyTable::range`]'s bytes as a [`Span`], which copies without checking them again.
    #[inline]
    #[allow(unsafe_code)] // the check below is the span's proof
    pub(crate) fn span(
        &self,
        key: u32,
        pd: &Arc<PdInner>,
        access: AccessFlags,
        va: u64,
        len: u64,
    ) -> Option<Span<'_>> {
        let (c, off) = self.check(key, pd, access, va, len)?;
        // SAFETY: `offset_in` proved `off + len` at most `c.len`, the region's length
        // (`MrCheck::of`), and `c.plain` that the region is not on demand.
        Some(unsafe { c.region.span_unchecked(off, len as usize) })
    }

    /// [`KeyTable::range`]'s check: the MR's and the offset.
    #[inline(always)]
    fn check(
        &self,
        key: u32,
        pd: &Arc<PdInner>,
        access: AccessFlags,
        va: u64,
        len: u64,
    ) -> Option<(&MrCheck, usize)> {
        let c = self.slot(key)?.holding(key)?.mr_check();
        // An MR's rkey is its lkey where it grants remote access, else 0 (`mr::rkey_for`): a
        // key used as an rkey, with the remote access asked for, is the MR's rkey once the
        // access is granted.
        debug_assert!(c.rkey == key || !access.intersects(REMOTE));
        let fits = c.pd == Arc::as_ptr(pd) as usize && c.access.contains(access) && c.plain;
        fits.then_some(())?;
        Some((c, offset_in(c.iova, c.len, va, len)?))
    }

    /// The memory window at `key`'s index; the caller compares the window's current rkey.
    pub(crate) fn mw(&self, key: u32) -> Option<&Arc<MwShared>> {
        match self.slot(key)?.holding(HOLDS_MW)?.entry()? {
            KeyEntry::Mw(mw) => Some(mw),
            KeyEntry::Mr(_) => None,
        }
    }

    /// Replaces the object behind a key handed out by `insert`.
    #[allow(unsafe_code)]
    pub(crate) fn replace(&mut self, key: u32, entry: KeyEntry) {
        let slot = &self.slots[(key >> 8) as usize];
        // SAFETY: under the write (`&mut self`): no reader.
        unsafe { slot.fill(key, entry) };
    }

    /// Frees a key handed out by `insert` (a stale key frees nothing).
    pub(crate) fn remove(&mut self, key: u32) {
        let Some(slot) = self.slots.get_mut((key >> 8) as usize) else { return };
        let named = match slot.entry.get_mut() {
            Some(KeyEntry::Mr(mr)) => mr.lkey,
            Some(KeyEntry::Mw(mw)) => mw.key,
            None => return,
        };
        if named != key {
            return;
        }
        *slot.state.get_mut() = NOTHING;
        (*slot.entry.get_mut(), *slot.check.get_mut()) = (None, None);
        self.alloc.get_mut().free.push(key);
    }
}

#[cfg(test)]
mod test {
    use std::collections::HashSet;

    use crate::{engine::testkit, sync::barrier::test::heavy_in, *};

    /// While its table has room, a registration takes a key under a read of the key lock, as
    /// work requests do: it issues no process-wide barrier (which stops every other running
    /// thread of the process). The table doubles under the write (one barrier each time); a
    /// deregistration still takes the write, which waits for any copy into the memory.
    #[test]
    fn a_registration_stops_no_other_thread_but_when_the_table_doubles() {
        let f = Fabric::new(FabricConfig::default());
        let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
        let mut mrs = Vec::new();
        let barriers = heavy_in(|| {
            for _ in 0..300 {
                mrs.push(pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap());
            }
        });
        // 64 slots at first (index 0 is never handed out), then 128, 256 and 512.
        assert_eq!(barriers, 3);
        assert_eq!(mrs.iter().map(|m| m.lkey()).collect::<HashSet<_>>().len(), 300);
        let last = mrs.pop().unwrap();
        assert_eq!(heavy_in(|| last.dereg().unwrap()), 1);
    }

    /// A key freed comes back under its next tag: the stale key names nothing, the new one its
    /// own memory.
    #[test]
    fn a_freed_key_comes_back_under_its_next_tag_and_the_stale_one_fails() {
        let (_f, a, b) = testkit::pair();
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let pd = b.qp.pd();
        let old = pd.reg_mr(64, all).unwrap();
        let stale = old.rkey();
        old.dereg().unwrap();
        let new = pd.reg_mr(64, all).unwrap();
        assert_eq!(new.rkey() >> 8, stale >> 8, "the index freed last is taken first");
        assert_eq!(new.rkey() as u8, (stale as u8).wrapping_add(1));
        let src = [Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() }];
        a.mr.write(0, &7u64.to_le_bytes()).unwrap();
        let wr = SendWr::write(1, &src, new.addr(), new.rkey()).signaled();
        a.qp.post_send(&wr).unwrap();
        assert_eq!(a.cq.poll_one().unwrap().status, WcStatus::SUCCESS);
        let mut got = [0; 8];
        new.read(0, &mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), 7);
        let wr = SendWr::write(2, &src, new.addr(), stale).signaled();
        a.qp.post_send(&wr).unwrap();
        assert_eq!(a.cq.poll_one().unwrap().status, WcStatus::REM_ACCESS_ERR);
    }

    /// Work requests on one thread while another registers (the table doubling meanwhile),
    /// writes through each new key on a pair of its own and deregisters: every request lands
    /// where its keys say. The registering thread waits at checkpoints for the writer to have
    /// completed a request more, so the two interleave however the threads are scheduled.
    #[test]
    fn work_requests_go_on_while_another_thread_registers_and_deregisters() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let (f, a, b) = testkit::pair();
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let done = std::sync::Arc::new(AtomicU64::new(0));
        let writer = {
            let (qp, cq, src, dst) = (a.qp.clone(), a.cq, a.mr, b.mr.clone());
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || {
                let sge = [Sge { addr: src.addr(), length: 8, lkey: src.lkey() }];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    src.write(0, &n.to_le_bytes()).unwrap();
                    qp.post_send(&SendWr::write(n, &sge, dst.addr(), dst.rkey()).signaled())
                        .unwrap();
                    let wc = loop {
                        if let Some(wc) = cq.poll_one() {
                            break wc;
                        }
                    };
                    assert_eq!((wc.wr_id, wc.status), (n, WcStatus::SUCCESS));
                    let mut got = [0; 8];
                    dst.read(0, &mut got).unwrap();
                    assert_eq!(u64::from_le_bytes(got), n);
                    done.store(n, Ordering::Release);
                }
                n
            })
        };
        let mut seen = 0;
        let mut wait_for_the_writer = || {
            while done.load(Ordering::Acquire) == seen {
                // A writer that failed has printed why; waiting for it would hang.
                assert!(!writer.is_finished(), "the writing thread stopped");
                std::thread::yield_now();
            }
            seen = done.load(Ordering::Acquire);
        };
        let devs = f.devices();
        let (c, d) = (testkit::side(&devs[0]), testkit::side(&devs[1]));
        c.qp.connect(300, &d.qp.endpoint(400), &RcParams::default()).unwrap();
        d.qp.connect(400, &c.qp.endpoint(300), &RcParams::default()).unwrap();
        let (pd, src) = (d.qp.pd(), [Sge { addr: c.mr.addr(), length: 8, lkey: c.mr.lkey() }]);
        let mut held = Vec::new();
        let checkpoints = (0..3000u64).step_by(250).count() as u64;
        for i in 0..3000u64 {
            if i % 250 == 0 {
                wait_for_the_writer();
            }
            let mr = pd.reg_mr(64, all).unwrap();
            c.mr.write(0, &i.to_le_bytes()).unwrap();
            c.qp.post_send(&SendWr::write(i, &src, mr.addr(), mr.rkey()).signaled()).unwrap();
            let wc = loop {
                if let Some(wc) = c.cq.poll_one() {
                    break wc;
                }
            };
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::SUCCESS));
            let mut got = [0; 8];
            mr.read(0, &mut got).unwrap();
            assert_eq!(u64::from_le_bytes(got), i);
            if i % 3 == 0 {
                mr.dereg().unwrap();
            } else {
                held.push(mr);
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(writer.join().unwrap() >= checkpoints);
    }
}
