// SPDX-License-Identifier: GPL-2.0

//! Long loops in process context: yielding the CPU and stopping for a
//! fatal signal. Upstream counterparts: `kernel::task::Task::
//! signal_pending` (none for fatal signals), none for `cond_resched`
//! (static inline functions and macros: the C glue in
//! `rust/pfnmap_glue.c` calls them).

use super::raw;

/// Whether the caller has a fatal signal pending (it is being killed).
pub(crate) fn fatal_signal_pending() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_fatal_signal_pending() }
}

/// Lets another task run if one should (`cond_resched`); process
/// context, no spinlock held (the kernel warns otherwise).
pub(crate) fn cond_resched() {
    // SAFETY: FFI call; callers are in process context and hold no
    // spinlock (above).
    unsafe { raw::peermem_cond_resched() };
}
