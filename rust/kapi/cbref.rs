// SPDX-License-Identifier: GPL-2.0

//! References handed to C callbacks by id rather than by pointer: a
//! registry (a red-black tree under a static spinlock,
//! `kapi::global_lock`) maps never-reused ids to `Arc<T>` references. Upstream counterpart:
//! `kernel::xarray::XArray` (6.14), which 6.12 lacks; an xarray with
//! ever-growing ids costs every registration a path of fresh nodes and
//! their RCU frees (issue 26), the tree one small allocation (made before
//! the lock is taken) freed at once.
//!
//! Whoever takes an entry out of the registry owns its reference. Removal
//! is atomic, so exactly one of several racing parties (a GPU driver's free
//! callback, and the code that put the pages back) gets it, and a late
//! callback with an id whose entry is gone finds nothing: ids are never
//! reused, so it can never find another object's entry.

use super::global_lock::{CbrefsLock, EventsLocked};
use core::marker::PhantomData;
use core::sync::atomic::{AtomicU64, Ordering};
use kernel::alloc::flags::GFP_KERNEL;
use kernel::error::Result;
use kernel::rbtree::{RBTree, RBTreeNodeReservation};
use kernel::sync::Arc;

/// id -> the reference (an `Arc::into_raw` pointer, as an address); `None`
/// until the first insert (`RBTree::new` is not `const`).
static CBREFS: EventsLocked<Option<RBTree<u64, usize>>, CbrefsLock> = EventsLocked::new(None);

/// The last id handed out (ids start at 1).
static LAST_ID: AtomicU64 = AtomicU64::new(0);

/// The name of one reference to a `T` in the registry.
///
/// # Invariants
///
/// `id` is a (non-zero) id that [`CallbackRef::insert`] handed out for a
/// reference to a `T` from `Arc::into_raw`; its entry may have been taken since.
pub(crate) struct CallbackRef<T> {
    id: u64,
    _type: PhantomData<fn() -> Arc<T>>,
}

impl<T: Send + Sync> CallbackRef<T> {
    /// Puts `obj` in the registry; `ENOMEM` if it cannot, `EOVERFLOW` if
    /// ids are exhausted (only where `unsigned long` is 32 bits, after 4 G).
    pub(crate) fn insert(obj: Arc<T>) -> Result<Self> {
        let node = RBTreeNodeReservation::new(GFP_KERNEL)?;
        let id = LAST_ID.fetch_add(1, Ordering::Relaxed) + 1;
        if id > super::c_ulong::MAX as u64 {
            return Err(super::eoverflow());
        }
        let node = node.into_node(id, Arc::into_raw(obj) as usize);
        // Ids are never reused, so nothing is replaced.
        CBREFS.lock().get_or_insert_with(RBTree::new).insert(node);
        // INVARIANT: `id` names the entry holding a reference to a `T`.
        Ok(Self {
            id,
            _type: PhantomData,
        })
    }

    /// The id, for a C callback's `data` (it fits an `unsigned long`).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Takes the reference out of the registry: `None` if someone took it already.
    pub(crate) fn take(&self) -> Option<Arc<T>> {
        // SAFETY: `self.id` names an entry for a reference to a `T` (type invariant).
        unsafe { take::<T>(self.id) }
    }
}

/// Removes entry `id` from the registry and returns its reference, if any.
///
/// # Safety
///
/// If an entry `id` exists, it holds a reference to a `T` (it was put there
/// by [`CallbackRef::<T>::insert`]).
pub(crate) unsafe fn take<T>(id: u64) -> Option<Arc<T>> {
    if id == 0 || id > super::c_ulong::MAX as u64 {
        return None;
    }
    let ptr = CBREFS.lock().as_mut()?.remove(&id)?;
    // SAFETY: the entry's value is a reference to a `T` from `Arc::into_raw`
    // (the caller's guarantee); the removal was under the lock, so it is
    // ours alone.
    Some(unsafe { Arc::from_raw(ptr as *const T) })
}

/// How many references are still in the registry (0 once every object
/// that has one is gone: each entry holds one).
pub(crate) fn left() -> u64 {
    CBREFS
        .lock()
        .as_ref()
        .map_or(0, |tree| tree.iter().count() as u64)
}
