// SPDX-License-Identifier: GPL-2.0

//! Rate-limited messages. Upstream counterpart: none yet (C's
//! `pr_warn_ratelimited`).

use super::raw;
use core::ffi::CStr;

/// `pr_warn_ratelimited()` of `msg` (for messages a user can trigger in a loop).
pub(crate) fn warn_ratelimited(msg: &CStr) {
    // SAFETY: `msg` is a NUL-terminated string valid for the call.
    unsafe { raw::peermem_warn_ratelimited(msg.to_bytes_with_nul().as_ptr().cast()) };
}
