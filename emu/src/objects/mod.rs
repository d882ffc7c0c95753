//! The control-path objects: devices, contexts, PDs, MRs, CQs, completion channels, async events.
//!
//! Every object lives behind an `Arc` and keeps a [`Lifecycle`]: a use count of the objects that
//! depend on it (an MR on its PD, a QP on its CQs) and a "destroyed" mark. Destroying an object
//! that others still use fails with `EBUSY`, as the kernel's `usecnt` makes it fail; using a
//! destroyed object fails with `EINVAL`.

pub(crate) mod ah;
pub(crate) mod channel;
pub(crate) mod context;
pub(crate) mod cq;
mod cq_ring;
pub(crate) mod device;
pub(crate) mod dm;
pub(crate) mod event;
pub(crate) mod keys;
pub(crate) mod mr;
pub(crate) mod mw;
pub(crate) mod pd;
pub(crate) mod pinned;
pub(crate) mod recv_queue;
pub(crate) mod sgl;
pub(crate) mod srq;
pub(crate) mod wq;
pub(crate) mod xrcd;

use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Result, ebusy, einval};

/// Use count of dependents, or `DEAD` once destroyed.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle(AtomicU32);

const DEAD: u32 = u32::MAX;

impl Lifecycle {
    /// Records a new dependent; fails if the object was destroyed.
    pub(crate) fn get(&self) -> Result<()> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c != DEAD).then(|| c + 1))
            .map(|_| ())
            .map_err(|_| einval("object was destroyed"))
    }

    /// Drops a dependent recorded by `get`.
    pub(crate) fn put(&self) {
        let prev = self.0.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev != 0 && prev != DEAD, "unbalanced Lifecycle::put");
    }

    /// Marks the object destroyed if nothing depends on it.
    pub(crate) fn destroy(&self) -> Result<()> {
        match self.0.compare_exchange(0, DEAD, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(()),
            Err(DEAD) => Err(einval("object was already destroyed")),
            Err(_) => Err(ebusy("object is still in use")),
        }
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.0.load(Ordering::Acquire) != DEAD
    }

    /// Fails with `EINVAL` if the object was destroyed.
    pub(crate) fn check(&self) -> Result<()> {
        if self.is_alive() { Ok(()) } else { Err(einval("object was destroyed")) }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_lifecycle_busy_then_destroyed() {
        let l = Lifecycle::default();
        l.get().unwrap();
        assert_eq!(l.destroy().unwrap_err().errno(), crate::Errno::EBUSY);
        l.put();
        l.destroy().unwrap();
        assert_eq!(l.destroy().unwrap_err().errno(), crate::Errno::EINVAL);
        assert_eq!(l.get().unwrap_err().errno(), crate::Errno::EINVAL);
    }
}
