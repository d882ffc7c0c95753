//! The device's key space: one table of lkeys/rkeys naming memory regions and memory windows
//! (as rxe's pools share the key format `index << 8 | key`).

use std::sync::Arc;

use super::{
    mr::{MrInner, offset_in},
    mw::MwShared,
    pd::PdInner,
};
use crate::{
    error::{Errno, Error, Result},
    mem::{MemRegion, Span},
    sync::{Guarded, GuardedRead, GuardedWrite, ReadMostly},
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
#[derive(Default)]
pub(crate) struct KeyTable {
    slots: Vec<Slot>,
    /// Free slot indices, reused last-freed-first (deterministic).
    free: Vec<u32>,
}

/// A key index's tag, what it names, and for an MR what a work request checks of it.
#[derive(Default)]
struct Slot {
    tag: u8,
    entry: Option<KeyEntry>,
    check: Option<MrCheck>,
}

impl Slot {
    fn fill(&mut self, entry: KeyEntry) {
        self.check = MrCheck::of(&entry);
        self.entry = Some(entry);
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
        let used = self.slots.iter().filter(|s| s.entry.is_some()).count();
        f.debug_struct("KeyTable").field("used", &used).field("free", &self.free.len()).finish()
    }
}

const MAX_INDEX: u32 = (1 << 24) - 1;

impl KeyTable {
    /// Reserves a key for an object that `fill` builds.
    pub(crate) fn insert(&mut self, fill: impl FnOnce(u32) -> KeyEntry) -> Result<u32> {
        if self.slots.is_empty() {
            // Index 0, never handed out (key 0 is never valid): a slot that stays empty, so
            // that a key's index is its slot's, without a subtraction and its check per
            // lookup.
            self.slots.push(Slot::default());
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                if i > MAX_INDEX {
                    return Err(Error::new(Errno::ENOMEM, "key space exhausted"));
                }
                self.slots.push(Slot::default());
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.tag = slot.tag.wrapping_add(1);
        let key = index << 8 | slot.tag as u32;
        slot.fill(fill(key));
        Ok(key)
    }

    #[inline]
    fn slot(&self, key: u32) -> Option<&Slot> {
        self.slots.get((key >> 8) as usize)
    }

    /// The memory region `key` names (index and tag).
    pub(crate) fn mr(&self, key: u32) -> Option<&Arc<MrInner>> {
        match self.slot(key)? {
            Slot { tag, entry: Some(KeyEntry::Mr(mr)), .. } if *tag == key as u8 => Some(mr),
            _ => None,
        }
    }

    /// The memory of `[va, va + len)` and its offset there, if `key` names an MR of `pd` (as
    /// its rkey if `remote`) that grants `access`, whose range holds it, over memory that
    /// cannot fault: what the express path asks of a key (anything else goes the packet
    /// path's way, which tells the errors apart).
    #[inline]
    pub(crate) fn range(
        &self,
        key: (u32, bool),
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
        key: (u32, bool),
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
        (key, remote): (u32, bool),
        pd: &Arc<PdInner>,
        access: AccessFlags,
        va: u64,
        len: u64,
    ) -> Option<(&MrCheck, usize)> {
        let slot = self.slot(key)?;
        let c = slot.check.as_ref()?;
        // An MR's rkey is 0 or its lkey, the slot's index and tag: as an rkey, the key is
        // the MR's if it is the rkey, and only then.
        let fits = if remote { c.rkey == key } else { slot.tag == key as u8 }
            && c.pd == Arc::as_ptr(pd) as usize
            && c.access.contains(access)
            && c.plain;
        fits.then_some(())?;
        Some((c, offset_in(c.iova, c.len, va, len)?))
    }

    /// The memory window at `key`'s index; the caller compares the window's current rkey.
    pub(crate) fn mw(&self, key: u32) -> Option<&Arc<MwShared>> {
        match self.slot(key)? {
            Slot { entry: Some(KeyEntry::Mw(mw)), .. } => Some(mw),
            _ => None,
        }
    }

    /// Replaces the object behind a key handed out by `insert`.
    pub(crate) fn replace(&mut self, key: u32, entry: KeyEntry) {
        self.slots[(key >> 8) as usize].fill(entry);
    }

    /// Frees a key handed out by `insert` (a stale key frees nothing).
    pub(crate) fn remove(&mut self, key: u32) {
        if let Some(Slot { tag, entry: Some(_), .. }) = self.slot(key)
            && *tag == key as u8
        {
            let index = key >> 8;
            let slot = &mut self.slots[index as usize];
            (slot.entry, slot.check) = (None, None);
            self.free.push(index);
        }
    }
}
