// SPDX-License-Identifier: GPL-2.0

//! Sleeping. Upstream counterpart: `kernel::time::delay::fsleep` (6.15).

use super::raw;

/// Sleeps `ms` milliseconds (`msleep`); process context only.
pub(crate) fn msleep(ms: u32) {
    // SAFETY: FFI call without preconditions; callers are in process context.
    unsafe { raw::msleep(ms) };
}
