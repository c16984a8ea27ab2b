// SPDX-License-Identifier: GPL-2.0

//! Watches on an address range of a process (an mmu interval notifier per
//! watch, in the C glue): when the range is unmapped or moved, a work item
//! tells the watch's owner. Upstream counterpart: none yet (C's
//! `mmu_interval_notifier`).

use super::raw;
use core::marker::PhantomData;
use core::ptr::NonNull;
use kernel::error::{to_result, Error, Result};
use kernel::sync::{Arc, ArcBorrow};

/// What a watch's owner does when its range changes meaning.
pub(crate) trait AddressChange: Send + Sync + Sized + 'static {
    /// The watched range was unmapped or moved (from a work item, process
    /// context, no lock held); `this` is the work item's reference.
    fn changed(this: Arc<Self>);

    /// The watched range is being unmapped (`how`), from the notifier
    /// itself, before the work item that calls [`AddressChange::changed`]
    /// is queued: possibly in a context that must not sleep, so this must
    /// neither sleep nor allocate. Once per watch. Default: nothing.
    fn unmapping(_this: &Self, _how: Unmapping) {}
}

/// How a watched range stopped meaning what it meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unmapping {
    /// `munmap`, `mmap(MAP_FIXED)` over it, any other unmap.
    Unmapped,
    /// The unmapping thread is in `mremap` (the range moved).
    Moved,
    /// The address space is being torn down (blocking watches only).
    Exiting,
    /// `mprotect` changed the range's protection (blocking watches only).
    Protected,
    /// Any other invalidation: the driver that mapped the range zapped it
    /// (`unmap_mapping_range`; blocking watches only).
    Zapped,
}

/// The work queue and callbacks of the [`AddressWatch`]es of owners `T`;
/// dropping it (at unload, when every watch is stopped) runs the work
/// items still queued. One per module.
///
/// # Invariants
///
/// The C glue's callbacks are the trampolines for `T`.
pub(crate) struct Watches<T: AddressChange>(PhantomData<T>);

impl<T: AddressChange> Watches<T> {
    /// Sets up the watches' work queue; `ENOMEM` if it cannot.
    pub(crate) fn setup() -> Result<Self> {
        // SAFETY: both functions stay valid until `drop`, which runs the
        // queued work items before the module can go.
        to_result(unsafe { raw::peermem_watch_setup(Some(hold::<T>), Some(changed::<T>)) })?;
        // SAFETY: as above; set before any watch starts (none can exist
        // before `setup`, which the owner calls first).
        unsafe { raw::peermem_watch_set_fired(Some(fired::<T>)) };
        // INVARIANT: set up with `T`'s trampolines.
        Ok(Self(PhantomData))
    }

    /// Whether owners get watches (the `mmu_notifier` parameter is on and
    /// the kernel has MMU notifiers).
    pub(crate) fn available() -> bool {
        // SAFETY: FFI call without preconditions.
        unsafe { raw::peermem_watch_available() }
    }
}

impl<T: AddressChange> Drop for Watches<T> {
    fn drop(&mut self) {
        // SAFETY: called once, at unload, when every watch was stopped (the
        // owner's duty, see `AddressWatch::start`), so no work item can be
        // queued anew.
        unsafe { raw::peermem_watch_teardown() };
    }
}

/// The notifier's `hold`: a new reference to the owner it watches.
///
/// # Safety
///
/// Called by the C glue with the `owner` given to `peermem_watch_start`,
/// while the watch is started: the owner is alive then (see
/// [`AddressWatch::start`]).
unsafe extern "C" fn hold<T: AddressChange>(owner: *const super::c_void) -> *const super::c_void {
    // SAFETY: `owner` points to a live `T` inside an `Arc` (by the
    // function's safety requirements), for the duration of this call.
    let borrowed = unsafe { ArcBorrow::from_raw(owner.cast::<T>()) };
    Arc::into_raw(Arc::from(borrowed)).cast()
}

/// The notifier fired for the watch of `owner` (see [`AddressChange::unmapping`]).
///
/// # Safety
///
/// As for [`hold`]: `owner` is the watch's owner, alive while the notifier runs.
unsafe extern "C" fn fired<T: AddressChange>(owner: *const super::c_void, how: super::c_uint) {
    // SAFETY: `owner` points to a live `T` inside an `Arc` (by the
    // function's safety requirements), for the duration of this call.
    let borrowed = unsafe { ArcBorrow::<T>::from_raw(owner.cast::<T>()) };
    let how = match how {
        raw::peermem_watch_how_PEERMEM_WATCH_MOVED => Unmapping::Moved,
        raw::peermem_watch_how_PEERMEM_WATCH_EXITING => Unmapping::Exiting,
        raw::peermem_watch_how_PEERMEM_WATCH_PROTECTED => Unmapping::Protected,
        raw::peermem_watch_how_PEERMEM_WATCH_ZAPPED => Unmapping::Zapped,
        _ => Unmapping::Unmapped,
    };
    T::unmapping(&borrowed, how);
}

/// The work item: the watched range changed; `r` is the reference `hold` took.
///
/// # Safety
///
/// Called by the C glue once per `hold`, with what it returned.
unsafe extern "C" fn changed<T: AddressChange>(r: *const super::c_void) {
    // SAFETY: `r` came from `Arc::into_raw` in `hold::<T>`; it is ours now.
    T::changed(unsafe { Arc::from_raw(r.cast::<T>()) });
}

/// A sequence number of a watch's range, from [`AddressWatch::read_begin`].
#[derive(Clone, Copy)]
pub(crate) struct ReadSeq(super::c_ulong);

/// A watch on a range in the address space of the process that made it,
/// for an owner `T` (usually the owner holds the watch as a field).
///
/// # Invariants
///
/// `ptr` was returned by `peermem_watch_alloc` and is freed only by `drop`.
pub(crate) struct AddressWatch<T: AddressChange> {
    ptr: NonNull<raw::peermem_watch>,
    _owner: PhantomData<fn(Arc<T>)>,
}

// SAFETY: the C object is used from any thread.
unsafe impl<T: AddressChange> Send for AddressWatch<T> {}
// SAFETY: the C side serializes `peermem_watch_start` and
// `peermem_watch_stop` of one watch with the watch's own mutex, so `start`
// and `stop` through `&self` may run concurrently (a `stop` that finds the
// watch not started returns at once; one that finds it started returns
// once the notifier is removed, also when another `stop` removes it).
unsafe impl<T: AddressChange> Sync for AddressWatch<T> {}

impl<T: AddressChange> AddressWatch<T> {
    /// A watch for the calling process, not started yet. `Ok(None)` if
    /// there is nothing to watch: the `mmu_notifier` parameter is off, the
    /// kernel has no MMU notifiers, or the caller has no user address space.
    pub(crate) fn new() -> Result<Option<Self>> {
        // SAFETY: FFI call without preconditions.
        let p = unsafe { raw::peermem_watch_alloc() };
        let v = p as isize;
        if (-4095..0).contains(&v) {
            return Err(Error::from_errno(v as i32));
        }
        // INVARIANT: from `peermem_watch_alloc`.
        Ok(NonNull::new(p).map(|ptr| Self {
            ptr,
            _owner: PhantomData,
        }))
    }

    /// Watches `[start, start + len)` of the calling process for `owner`:
    /// until [`AddressWatch::stop`] returns, the notifier may take new
    /// references to `owner` from the pointer it keeps. `EBUSY` if the
    /// watch is started already.
    ///
    /// # Safety
    ///
    /// `owner` stays alive until [`AddressWatch::stop`] has returned: the
    /// caller calls `stop` before the last reference to `owner` can go (for
    /// a watch that is a field of `owner`, before the reference it gives up
    /// last). And the watch lives as long as a work item it queued, which
    /// holds a reference to `owner`: it is a field of `owner` (or `owner`
    /// keeps it alive otherwise).
    pub(crate) unsafe fn start(&self, owner: ArcBorrow<'_, T>, start: u64, len: u64) -> Result {
        let p: *const T = &*owner;
        // SAFETY: `self.ptr` is a live watch (type invariant); `p` is the
        // pointer `Arc::into_raw` would give for `owner`, valid until `stop`
        // (the caller's obligation).
        to_result(unsafe { raw::peermem_watch_start(self.ptr.as_ptr(), p.cast(), start, len) })
    }

    /// Makes this a blocking watch (for memory the owner holds no
    /// reference on: the PFN-map source). Call before [`AddressWatch::start`].
    /// A blocking watch fires on every invalidation of its range, also at
    /// process exit, and the kernel's invalidation waits until
    /// [`AddressChange::changed`] has returned (it still runs in the work
    /// item; see `peermem_watch_invalidate_blocking` in `rust/helpers.c`).
    pub(crate) fn set_blocking(&self) {
        // SAFETY: a live watch (type invariant).
        unsafe { raw::peermem_watch_set_blocking(self.ptr.as_ptr()) };
    }

    /// `mmu_interval_read_begin`: the sequence to check with
    /// [`AddressWatch::read_retry`] after reading the range's page tables.
    /// `None` if the watch is not started.
    pub(crate) fn read_begin(&self) -> Option<ReadSeq> {
        let mut seq = 0;
        // SAFETY: a live watch (type invariant); `seq` is writable.
        unsafe { raw::peermem_watch_read_begin(self.ptr.as_ptr(), &mut seq) }
            .then_some(ReadSeq(seq))
    }

    /// `mmu_interval_read_retry`: whether the range was invalidated since
    /// `seq` was read (then what was read may be stale).
    pub(crate) fn read_retry(&self, seq: ReadSeq) -> bool {
        // SAFETY: a live watch (type invariant), started since `seq` came
        // from `read_begin` (the C side only compares sequence numbers).
        unsafe { raw::peermem_watch_read_retry(self.ptr.as_ptr(), seq.0) }
    }

    /// Whether the watch has fired (once per watch: the range was
    /// unmapped or moved, and [`AddressChange::changed`] is queued or ran).
    /// Set in the notifier, before the unmapping call returns to the process.
    pub(crate) fn has_fired(&self) -> bool {
        // SAFETY: a live watch (type invariant).
        unsafe { raw::peermem_watch_has_fired(self.ptr.as_ptr()) }
    }

    /// Stops watching: when it returns, the notifier takes no new
    /// reference. Idempotent; sleeps.
    pub(crate) fn stop(&self) {
        // SAFETY: a live watch (type invariant).
        unsafe { raw::peermem_watch_stop(self.ptr.as_ptr()) };
    }
}

impl<T: AddressChange> Drop for AddressWatch<T> {
    fn drop(&mut self) {
        // SAFETY: a live watch, not used after this. Its work item, if it
        // was queued, has run: it holds a reference to the owner, and an
        // owner drops its watch only when its last reference is gone.
        unsafe { raw::peermem_watch_free(self.ptr.as_ptr()) };
    }
}
