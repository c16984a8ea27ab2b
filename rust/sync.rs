// SPDX-License-Identifier: GPL-2.0

//! The locking primitives peermem uses, in one place.
//!
//! The kernel crate's lock API moves between releases; everything else in
//! peermem names only [`Lock`] and [`new_lock!`], so a kernel whose API
//! differs needs a change here only. Both map to the kernel's sleeping
//! `Mutex` (lockdep-tracked, one lock class per call site of `new_lock!`).

/// A sleeping lock protecting a `T` (the kernel's `Mutex`).
pub(crate) type Lock<T> = kernel::sync::Mutex<T>;

/// An initializer for a [`Lock`] holding `$value`, named `$name` for lockdep.
macro_rules! new_lock {
    ($value:expr, $name:literal) => {
        ::kernel::new_mutex!($value, $name)
    };
}
pub(crate) use new_lock;
