// SPDX-License-Identifier: GPL-2.0

//! Objects module unload waits for. Upstream counterpart: none (the
//! kernel's module reference count refuses an unload instead of waiting).
//!
//! An object whose last reference may be dropped by code the module does
//! not control the timing of (a GPU driver's free callback) holds an
//! [`ObjectCount`]; module exit calls [`wait_for_objects`]. The count must
//! be the last thing such an object drops (make it its last field: fields
//! drop in declaration order), since unload may proceed as soon as it does.

use super::raw;
use core::sync::atomic::{AtomicI32, Ordering};
use kernel::prelude::*;

/// The live objects; the kernel's `wake_up_var()` wakes the waiter on it.
static OBJECTS: AtomicI32 = AtomicI32::new(0);

/// Membership in the count of live objects, which module unload waits to
/// drop to zero (see [`wait_for_objects`]).
///
/// # Invariants
///
/// Each `ObjectCount` has added one to `OBJECTS`, which its drop removes.
pub(crate) struct ObjectCount(());

impl ObjectCount {
    /// Counts one more live object.
    pub(crate) fn new() -> Self {
        OBJECTS.fetch_add(1, Ordering::Relaxed);
        // INVARIANT: counted just above.
        Self(())
    }
}

impl Drop for ObjectCount {
    fn drop(&mut self) {
        // Full ordering, as `atomic_dec_and_test()`: what the object did
        // happens before the waiter sees zero.
        if OBJECTS.fetch_sub(1, Ordering::SeqCst) == 1 {
            // SAFETY: FFI call on the address of a static; never sleeps.
            unsafe { kernel::bindings::wake_up_var(OBJECTS.as_ptr().cast()) };
        }
    }
}

/// Sleeps until no [`ObjectCount`] exists; every 10 s says how many are left.
pub(crate) fn wait_for_objects() {
    // SAFETY: FFI call on the address of a static, which `ObjectCount`'s
    // drop wakes through `wake_up_var()`; it may sleep (module exit does).
    while !unsafe { raw::peermem_wait_var_zero(OBJECTS.as_ptr(), 10) } {
        pr_info!(
            "unloading: waiting for {} registration object(s) still referenced by GPU free callbacks in flight\n",
            OBJECTS.load(Ordering::Relaxed)
        );
    }
}
