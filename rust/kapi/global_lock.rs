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

/// A `T` guarded by the C glue's event spinlock (`peermem_events_lock`).
/// Every `EventsLocked` shares that one lock: never hold two guards at
/// once (the second would spin forever). Never sleep holding one.
///
/// # Invariants
///
/// `data` is accessed only through an [`EventsGuard`], which holds the lock.
pub(crate) struct EventsLocked<T> {
    data: UnsafeCell<T>,
}

// SAFETY: access to `data` is serialized by the lock (type invariant), so
// sharing the `static` among threads only moves `T` between them.
unsafe impl<T: Send> Sync for EventsLocked<T> {}

impl<T> EventsLocked<T> {
    /// A `T` under the lock (usable in a `static`).
    pub(crate) const fn new(data: T) -> Self {
        Self {
            data: UnsafeCell::new(data),
        }
    }

    /// Spins until the lock is ours. Any context that may spin (not an
    /// interrupt: the lock does not disable them).
    pub(crate) fn lock(&self) -> EventsGuard<'_, T> {
        // SAFETY: FFI call without preconditions.
        unsafe { raw::peermem_events_lock() };
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
/// The C glue's event lock is held by this thread while the guard lives.
pub(crate) struct EventsGuard<'a, T> {
    owner: &'a EventsLocked<T>,
    /// Not `Send`: the lock is released by the thread that took it.
    _not_send: PhantomData<*mut ()>,
}

impl<T> Deref for EventsGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the lock is held (type invariant): no other reference.
        unsafe { &*self.owner.data.get() }
    }
}

impl<T> DerefMut for EventsGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the lock is held (type invariant), and `&mut self` is unique.
        unsafe { &mut *self.owner.data.get() }
    }
}

impl<T> Drop for EventsGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: held by this thread (type invariant), released once.
        unsafe { raw::peermem_events_unlock() };
    }
}
