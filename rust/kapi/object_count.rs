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

/// Membership in the count of live objects, which module unload waits to
/// drop to zero (see [`wait_for_objects`]).
///
/// # Invariants
///
/// Each `ObjectCount` has added one to the C glue's count, which its drop removes.
pub(crate) struct ObjectCount(());

impl ObjectCount {
    /// Counts one more live object.
    pub(crate) fn new() -> Self {
        // SAFETY: FFI call without preconditions.
        unsafe { raw::peermem_objects_inc() };
        // INVARIANT: counted just above.
        Self(())
    }
}

impl Drop for ObjectCount {
    fn drop(&mut self) {
        // SAFETY: this object was counted (type invariant).
        unsafe { raw::peermem_objects_dec() };
    }
}

/// Sleeps until no [`ObjectCount`] exists.
pub(crate) fn wait_for_objects() {
    // SAFETY: FFI call without preconditions; it may sleep (module exit does).
    unsafe { raw::peermem_objects_wait() };
}
