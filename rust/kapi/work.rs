// SPDX-License-Identifier: GPL-2.0

//! A call deferred to peermem's work queue, for an owner that embeds the
//! work item (C glue `peermem_work_*` in `rust/helpers.c`). Upstream
//! counterpart: `kernel::workqueue` (its `impl_has_work!` items need
//! pinned embedding and changed across 6.12..7.x; this one is a pointer).

use super::raw;
use core::marker::PhantomData;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::error::{code, Result};
use kernel::sync::Arc;

/// What a deferred call of an owner does.
pub(crate) trait Deferred: Send + Sync + Sized + 'static {
    /// Runs in a work item (process context, no lock held); `this` is the
    /// reference given to [`WorkItem::queue`].
    fn run(this: Arc<Self>);
}

/// The work function: `r` is the reference `queue` stored.
///
/// # Safety
///
/// Called by the C glue once per successful `peermem_work_queue`, with the
/// pointer given there: an `Arc::into_raw` of a `T`.
unsafe extern "C" fn run<T: Deferred>(r: *const super::c_void) {
    // SAFETY: from `Arc::into_raw` in `WorkItem::<T>::queue`; ours now.
    T::run(unsafe { Arc::from_raw(r.cast::<T>()) });
}

/// A work item that calls [`Deferred::run`] of a `T`, at most once in its life.
///
/// # Invariants
///
/// `ptr` came from `peermem_work_alloc` with `run::<T>` and is freed only
/// by `drop`. While queued and not yet run, the queued call holds a
/// reference to the owner, which owns this item: so the item cannot be
/// dropped before its call began.
pub(crate) struct WorkItem<T: Deferred> {
    ptr: NonNull<raw::peermem_work>,
    /// Set by the first [`WorkItem::queue`]: an item is queued once in its life.
    queued: AtomicBool,
    _owner: PhantomData<fn(Arc<T>)>,
}

// SAFETY: the C object is used from any thread; `queue` is atomic.
unsafe impl<T: Deferred> Send for WorkItem<T> {}
// SAFETY: as above: the only shared operation, `queue`, queues the C item
// only for the caller that set `queued` first.
unsafe impl<T: Deferred> Sync for WorkItem<T> {}

impl<T: Deferred> WorkItem<T> {
    /// A new, unqueued work item; `ENOMEM`.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: FFI call; `run::<T>` stays valid while the module is
        // loaded, and the work queue runs every queued item before unload.
        let p = unsafe { raw::peermem_work_alloc(Some(run::<T>)) };
        let ptr = NonNull::new(p).ok_or(code::ENOMEM)?;
        // INVARIANT: from `peermem_work_alloc` with `run::<T>`.
        Ok(Self {
            ptr,
            queued: AtomicBool::new(false),
            _owner: PhantomData,
        })
    }

    /// Queues the call of `T::run(this)`; never sleeps, never allocates.
    /// `false` if this item was queued before (then `this` is dropped here).
    ///
    /// # Safety
    ///
    /// `this` owns this work item (or keeps it alive otherwise) until the
    /// call ran; and peermem's work queue is not torn down before this
    /// returns (it is torn down at unload, after the peer-memory core
    /// released every registration: the caller queues only for a
    /// registration the core has not released, under a lock `release`
    /// takes).
    pub(crate) unsafe fn queue(&self, this: Arc<T>) -> bool {
        if self.queued.swap(true, Ordering::AcqRel) {
            return false;
        }
        // SAFETY: a live item (type invariant), never queued before, so not
        // pending; the queue exists (the caller's guarantee); the pointer is
        // a reference the call will consume.
        unsafe { raw::peermem_work_queue(self.ptr.as_ptr(), Arc::into_raw(this).cast()) };
        true
    }
}

impl<T: Deferred> Drop for WorkItem<T> {
    fn drop(&mut self) {
        // SAFETY: a live item (type invariant), not used after this: never
        // queued, or its call began (it held a reference to the owner,
        // which is dropping this item, so that reference is gone).
        unsafe { raw::peermem_work_free(self.ptr.as_ptr()) };
    }
}
