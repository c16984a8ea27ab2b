// SPDX-License-Identifier: GPL-2.0

//! Data in a `static` under a spinlock of the C glue. A Rust `static`
//! cannot hold the kernel crate's `SpinLock` (it needs pinned
//! initialisation at run time); the revocation event queues must be found
//! from the GPU driver's free callback and an mmu notifier, which cannot
//! sleep or allocate, so they live in a `static` under this lock.
//! Upstream counterpart: `kernel::sync::global_lock!` (6.16), which 6.12 lacks.

use super::raw;
use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};

/// One of the C glue's static spinlocks.
pub(crate) trait GlobalLock {
    /// Spins until the lock is ours.
    fn lock();
    /// Releases the lock this thread holds.
    ///
    /// # Safety
    ///
    /// This thread holds the lock.
    unsafe fn unlock();
}

/// The event lock (`peermem_events_spinlock`, a `DEFINE_SPINLOCK` in
/// `rust/miscdev.c`): the event queues, the watch cache.
pub(crate) struct EventsLock;

impl GlobalLock for EventsLock {
    fn lock() {
        // SAFETY: a spinlock initialised at compile time (DEFINE_SPINLOCK),
        // accessed only through the kernel's lock functions.
        unsafe { kernel::bindings::spin_lock(&raw mut raw::peermem_events_spinlock) };
    }
    unsafe fn unlock() {
        // SAFETY: held by this thread (the caller's guarantee).
        unsafe { kernel::bindings::spin_unlock(&raw mut raw::peermem_events_spinlock) };
    }
}

/// The callback-reference registry's lock (`peermem_cbrefs_lock`).
pub(crate) struct CbrefsLock;

impl GlobalLock for CbrefsLock {
    fn lock() {
        // SAFETY: FFI call without preconditions.
        unsafe { raw::peermem_cbrefs_lock() };
    }
    unsafe fn unlock() {
        // SAFETY: held by this thread (the caller's guarantee).
        unsafe { raw::peermem_cbrefs_unlock() };
    }
}

/// A `T` guarded by one of the C glue's spinlocks, `L` (by default the
/// event spinlock, `peermem_events_spinlock`). Every `EventsLocked` with the
/// same `L` shares that one lock: never hold two guards of it at once (the
/// second would spin forever). Never sleep holding one.
///
/// # Invariants
///
/// `data` is accessed only through an [`EventsGuard`], which holds the lock.
pub(crate) struct EventsLocked<T, L: GlobalLock = EventsLock> {
    data: UnsafeCell<T>,
    _lock: PhantomData<L>,
}

// SAFETY: access to `data` is serialized by the lock (type invariant), so
// sharing the `static` among threads only moves `T` between them.
unsafe impl<T: Send, L: GlobalLock> Sync for EventsLocked<T, L> {}

impl<T, L: GlobalLock> EventsLocked<T, L> {
    /// A `T` under the lock (usable in a `static`).
    pub(crate) const fn new(data: T) -> Self {
        Self {
            data: UnsafeCell::new(data),
            _lock: PhantomData,
        }
    }

    /// Spins until the lock is ours. Any context that may spin (not an
    /// interrupt: the lock does not disable them).
    pub(crate) fn lock(&self) -> EventsGuard<'_, T, L> {
        L::lock();
        // INVARIANT: the lock is held until the guard drops.
        EventsGuard {
            owner: self,
            _not_send: PhantomData,
        }
    }
}

/// The held lock of an [`EventsLocked`].
///
/// # Invariants
///
/// The lock `L` is held by this thread while the guard lives.
pub(crate) struct EventsGuard<'a, T, L: GlobalLock = EventsLock> {
    owner: &'a EventsLocked<T, L>,
    /// Not `Send`: the lock is released by the thread that took it.
    _not_send: PhantomData<*mut ()>,
}

impl<T, L: GlobalLock> Deref for EventsGuard<'_, T, L> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the lock is held (type invariant): no other reference.
        unsafe { &*self.owner.data.get() }
    }
}

impl<T, L: GlobalLock> DerefMut for EventsGuard<'_, T, L> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the lock is held (type invariant), and `&mut self` is unique.
        unsafe { &mut *self.owner.data.get() }
    }
}

impl<T, L: GlobalLock> Drop for EventsGuard<'_, T, L> {
    fn drop(&mut self) {
        // SAFETY: held by this thread (type invariant), released once.
        unsafe { L::unlock() };
    }
}
