//! The device's key space: one table of lkeys/rkeys naming memory regions and memory windows
//! (as rxe's pools share the key format `index << 8 | key`).

use std::sync::Arc;

use super::{mr::MrInner, mw::MwShared};
use crate::{
    error::{Errno, Error, Result},
    sync::{ReadGuard, ReadMostly, WriteGuard},
};

/// A device's key table behind a lock whose readers (every work request) each take a shard
/// of their own, so that threads posting at once do not pass a lock word between their
/// cores; registering and deregistering, rare by comparison, wait for every shard.
#[derive(Debug, Default)]
pub(crate) struct Keys(ReadMostly<KeyTable>);

impl Keys {
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, KeyTable> {
        self.0.read()
    }

    /// The table if no writer holds or waits for this thread's shard. For a second table
    /// read while one is held: blocking there could deadlock against a thread holding the
    /// two in the other order while writers wait on both.
    #[inline]
    pub(crate) fn try_read(&self) -> Option<ReadGuard<'_, KeyTable>> {
        self.0.try_read()
    }

    pub(crate) fn write(&self) -> WriteGuard<'_, KeyTable> {
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
    slots: Vec<(u8, Option<KeyEntry>)>,
    /// Free slot indices, reused last-freed-first (deterministic).
    free: Vec<u32>,
}

/// Counts only: an entry's MR leads back to its device, whose table this is, so printing the
/// entries would recurse without end.
impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.slots.iter().filter(|s| s.1.is_some()).count();
        f.debug_struct("KeyTable").field("used", &used).field("free", &self.free.len()).finish()
    }
}

/// Index 0 is never handed out, so key 0 is never valid.
const FIRST_INDEX: u32 = 1;
const MAX_INDEX: u32 = (1 << 24) - 1;

impl KeyTable {
    /// Reserves a key for an object that `fill` builds.
    pub(crate) fn insert(&mut self, fill: impl FnOnce(u32) -> KeyEntry) -> Result<u32> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32 + FIRST_INDEX;
                if i > MAX_INDEX {
                    return Err(Error::new(Errno::ENOMEM, "key space exhausted"));
                }
                self.slots.push((0, None));
                i
            }
        };
        let slot = &mut self.slots[(index - FIRST_INDEX) as usize];
        slot.0 = slot.0.wrapping_add(1);
        let key = index << 8 | slot.0 as u32;
        slot.1 = Some(fill(key));
        Ok(key)
    }

    fn slot(&self, key: u32) -> Option<&(u8, Option<KeyEntry>)> {
        let index = (key >> 8).checked_sub(FIRST_INDEX)?;
        self.slots.get(index as usize)
    }

    /// The memory region `key` names (index and tag).
    pub(crate) fn mr(&self, key: u32) -> Option<&Arc<MrInner>> {
        match self.slot(key)? {
            (tag, Some(KeyEntry::Mr(mr))) if *tag == key as u8 => Some(mr),
            _ => None,
        }
    }

    /// The memory window at `key`'s index; the caller compares the window's current rkey.
    pub(crate) fn mw(&self, key: u32) -> Option<&Arc<MwShared>> {
        match self.slot(key)? {
            (_, Some(KeyEntry::Mw(mw))) => Some(mw),
            _ => None,
        }
    }

    /// Replaces the object behind a key handed out by `insert`.
    pub(crate) fn replace(&mut self, key: u32, entry: KeyEntry) {
        let index = (key >> 8) - FIRST_INDEX;
        self.slots[index as usize].1 = Some(entry);
    }

    /// Frees a key handed out by `insert` (a stale key frees nothing).
    pub(crate) fn remove(&mut self, key: u32) {
        if let Some((tag, Some(_))) = self.slot(key)
            && *tag == key as u8
        {
            let index = (key >> 8) - FIRST_INDEX;
            self.slots[index as usize].1 = None;
            self.free.push(index + FIRST_INDEX);
        }
    }
}
