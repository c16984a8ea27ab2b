// SPDX-License-Identifier: GPL-2.0

//! The locking primitives peermem uses, in one place.
//!
//! The kernel crate's lock API moves between releases; everything else in
//! peermem names only [`Lock`], [`new_lock!`], [`CondVar`] and
//! [`new_condvar!`], so a kernel whose API differs needs a change here
//! only. They map to the kernel's sleeping `Mutex` (lockdep-tracked, one
//! lock class per call site of `new_lock!`) and `CondVar` (same API on
//! 6.12 and 7.x: `wait(&mut guard)`, `notify_all()`).

/// A sleeping lock protecting a `T` (the kernel's `Mutex`).
pub(crate) type Lock<T> = kernel::sync::Mutex<T>;

/// A held [`Lock`] (7.x calls it `MutexGuard`; 6.12 has only the long name).
pub(crate) type LockGuard<'a, T> =
    kernel::sync::lock::Guard<'a, T, kernel::sync::lock::mutex::MutexBackend>;

/// An initializer for a [`Lock`] holding `$value`, named `$name` for lockdep.
macro_rules! new_lock {
    ($value:expr, $name:literal) => {
        ::kernel::new_mutex!($value, $name)
    };
}
pub(crate) use new_lock;

/// A condition variable to wait on under a [`Lock`] (the kernel's `CondVar`).
pub(crate) type CondVar = kernel::sync::CondVar;

/// An initializer for a [`CondVar`] named `$name`.
macro_rules! new_condvar {
    ($name:literal) => {
        ::kernel::new_condvar!($name)
    };
}
pub(crate) use new_condvar;
