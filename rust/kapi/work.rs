// SPDX-License-Identifier: GPL-2.0

//! peermem's work queue, and a call deferred to it for an owner that holds
//! the work item. Upstream counterpart: `kernel::workqueue` (its
//! `impl_has_work!` items must be embedded in the owner and changed across
//! 6.12..7.x; this one is a pinned box the owner holds, over the kernel's
//! `work_struct` and `queue_work_on`).

use super::raw;
use core::marker::PhantomData;
use core::pin::Pin;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use kernel::alloc::{flags::GFP_KERNEL, KBox};
use kernel::bindings;
use kernel::error::{code, Result};
use kernel::prelude::*;
use kernel::sync::Arc;
use kernel::types::Opaque;

/// peermem's work queue: made by [`setup_queue`], destroyed by
/// [`teardown_queue`]; null outside.
static QUEUE: AtomicPtr<bindings::workqueue_struct> = AtomicPtr::new(ptr::null_mut());

/// Makes peermem's work queue (once, at load, before any work item is
/// queued); `ENOMEM` if it cannot.
///
/// `WQ_MEM_RECLAIM`: a blocking PFN invalidation (munmap, an exporter's
/// zap, which reclaim can cause) waits for its work item holding the mmap
/// lock; a rescuer thread runs it when no new worker can be made.
pub(super) fn setup_queue() -> Result {
    let flags = bindings::wq_flags_WQ_UNBOUND | bindings::wq_flags_WQ_MEM_RECLAIM;
    // SAFETY: FFI call; the name is a static C string.
    let wq = unsafe {
        raw::peermem_alloc_workqueue(c"peermem".to_bytes_with_nul().as_ptr().cast(), flags)
    };
    if wq.is_null() {
        return Err(code::ENOMEM);
    }
    QUEUE.store(wq, Ordering::Release);
    Ok(())
}

/// Runs every queued work item and destroys the work queue (at unload,
/// when no work item can be queued anew).
pub(super) fn teardown_queue() {
    let wq = QUEUE.swap(ptr::null_mut(), Ordering::AcqRel);
    if !wq.is_null() {
        // SAFETY: made by `setup_queue`, and nothing queues on it any more
        // (the caller's duty, see `Watches`' drop).
        unsafe { bindings::destroy_workqueue(wq) };
    }
}

/// Initializes the work item at `work` to call `func`.
///
/// # Safety
///
/// `work` points to a `work_struct` that is not queued and stays at this
/// address while it may be.
pub(super) unsafe fn init(work: *mut bindings::work_struct, func: bindings::work_func_t) {
    // SAFETY: by the function's safety requirements.
    unsafe { raw::peermem_init_work(work, func) };
}

/// Queues `work` on peermem's work queue; never sleeps, never allocates.
///
/// # Safety
///
/// `work` was initialized with [`init`], is not pending, and stays alive
/// until its function has begun; the queue exists (between
/// [`setup_queue`] and [`teardown_queue`]).
pub(super) unsafe fn queue(work: *mut bindings::work_struct) {
    let wq = QUEUE.load(Ordering::Acquire);
    // SAFETY: by the function's safety requirements.
    unsafe { bindings::queue_work_on(bindings::wq_misc_consts_WORK_CPU_UNBOUND as i32, wq, work) };
}

/// What a deferred call of an owner does.
pub(crate) trait Deferred: Send + Sync + Sized + 'static {
    /// Runs in a work item (process context, no lock held); `this` is the
    /// reference given to [`WorkItem::queue`].
    fn run(this: Arc<Self>);
}

/// The kernel's work item and the reference its call consumes.
#[pin_data]
struct Call {
    #[pin]
    work: Opaque<bindings::work_struct>,
    /// The call's reference (an `Arc::into_raw` of the owner), set when queued.
    this: AtomicPtr<super::c_void>,
}

/// The work function: calls `T::run` with the reference `queue` stored.
///
/// # Safety
///
/// Called by the kernel for the `work` field of a [`Call`] of a
/// [`WorkItem<T>`], once per [`WorkItem::queue`].
unsafe extern "C" fn run<T: Deferred>(work: *mut bindings::work_struct) {
    let call = work
        .cast::<u8>()
        .wrapping_sub(core::mem::offset_of!(Call, work))
        .cast::<Call>();
    // SAFETY: `work` is the `work` field of a live `Call` (the function's
    // safety requirements): the owner, which holds it, is kept alive by
    // the reference stored in `this`.
    let this = unsafe { (*call).this.load(Ordering::Acquire) };
    // SAFETY: from `Arc::into_raw` in `WorkItem::<T>::queue`; ours now.
    // This may free the `Call` (allowed in a work function); it is not
    // touched afterwards.
    T::run(unsafe { Arc::from_raw(this.cast::<T>()) });
}

/// A work item that calls [`Deferred::run`] of a `T`, at most once in its life.
///
/// # Invariants
///
/// `call.work` was initialized to call `run::<T>`. While queued and not yet
/// run, the queued call holds a reference to the owner, which owns this
/// item: so the item cannot be dropped before its call began.
pub(crate) struct WorkItem<T: Deferred> {
    call: Pin<KBox<Call>>,
    /// Set by the first [`WorkItem::queue`]: an item is queued once in its life.
    queued: AtomicBool,
    _owner: PhantomData<fn(Arc<T>)>,
}

// SAFETY: the kernel's work item is used from any thread; `queue` is atomic.
unsafe impl<T: Deferred> Send for WorkItem<T> {}
// SAFETY: as above: the only shared operation, `queue`, queues the item
// only for the caller that set `queued` first.
unsafe impl<T: Deferred> Sync for WorkItem<T> {}

impl<T: Deferred> WorkItem<T> {
    /// A new, unqueued work item; `ENOMEM`.
    pub(crate) fn new() -> Result<Self> {
        let call = KBox::pin_init(
            pin_init!(Call {
                // SAFETY: a new `work_struct`, pinned in the box; `run::<T>`
                // stays valid while the module is loaded, and the work
                // queue runs every queued item before unload.
                work <- Opaque::ffi_init(|w| unsafe { init(w, Some(run::<T>)) }),
                this: AtomicPtr::new(ptr::null_mut()),
            }),
            GFP_KERNEL,
        )?;
        // INVARIANT: initialized with `run::<T>` just above.
        Ok(Self {
            call,
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
        self.call
            .this
            .store(Arc::into_raw(this).cast_mut().cast(), Ordering::Release);
        // SAFETY: initialized (type invariant), never queued before, so not
        // pending; kept alive by the reference just stored until the call
        // began; the queue exists (the caller's guarantee).
        unsafe { queue(self.call.work.get()) };
        true
    }
}
