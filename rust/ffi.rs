// SPDX-License-Identifier: GPL-2.0

//! The only module that touches raw bindings.
//!
//! `ffi_generated.rs` is written by `scripts/bindgen.sh` during the build
//! from `include/peermem_ffi.h` (our ABI headers and the prototypes of the
//! C glue in `rust/helpers.c`). This module wraps what the rest of the
//! crate needs in safe functions and types; nothing else declares `extern`
//! functions or calls into C directly.

use crate::stats::{Counter, Stats};
use core::ffi::{c_void, CStr};
use core::ptr;
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::error::{code, to_result, Error, Result};

#[allow(
    clippy::all,
    dead_code,
    improper_ctypes,
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    unreachable_pub,
    unsafe_op_in_unsafe_fn
)]
#[allow(
    clippy::undocumented_unsafe_blocks,
    clippy::ptr_as_ptr,
    clippy::ref_as_ptr
)]
mod raw {
    include!("ffi_generated.rs");
}

/// Bytes in the ABI's client name array, NUL included.
pub(crate) const PEER_NAME_CAPACITY: usize = raw::IB_PEER_MEMORY_NAME_MAX as usize;

/// peermem's version (`PEERMEM_VERSION` in `include/peermem_ffi.h`).
pub(crate) const VERSION: &str = {
    let Ok(v) = CStr::from_bytes_with_nul(raw::PEERMEM_VERSION) else {
        panic!("PEERMEM_VERSION is a C string");
    };
    let Ok(v) = core::str::from_utf8(v.to_bytes()) else {
        panic!("PEERMEM_VERSION is ASCII");
    };
    v
};

// The version doubles as the peer-memory client's version string, which
// leaves its last two bytes to the NUL and the extended-client marker.
const _: () = assert!(VERSION.len() <= raw::IB_PEER_MEMORY_VER_MAX as usize - 2);

/// `EOVERFLOW`, which the kernel crate of 6.12 does not name.
pub(crate) fn eoverflow() -> Error {
    Error::from_errno(-(kernel::bindings::EOVERFLOW as i32))
}

/// The `peer_name` module parameter, unchecked (see `params`).
pub(crate) fn param_peer_name() -> &'static [u8] {
    // SAFETY: FFI call without preconditions.
    let name = unsafe { raw::peermem_param_peer_name() };
    // SAFETY: per `peermem_ffi.h` `name` points to a buffer of
    // `IB_PEER_MEMORY_NAME_MAX` bytes that the module loader filled before
    // init and that nothing changes until the module unloads, which ends
    // every use of this reference.
    let buf = unsafe { core::slice::from_raw_parts(name.cast::<u8>(), PEER_NAME_CAPACITY) };
    // The loader always leaves a NUL in it; without one, take the whole buffer
    // (the check in `params` then refuses it as too long).
    let len = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    &buf[..len]
}

/// The `enable_invalidate` module parameter.
pub(crate) fn param_enable_invalidate() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_enable_invalidate() }
}

/// Whether the debugfs directory exists (there is only one).
static DEBUGFS_LIVE: AtomicBool = AtomicBool::new(false);

/// `/sys/kernel/debug/peermem/`, one read-only file per counter; removed on drop.
///
/// # Invariants
///
/// While a `Debugfs` exists, the C glue's directory exists and
/// `DEBUGFS_LIVE` is true; there is at most one `Debugfs`.
pub(crate) struct Debugfs(());

impl Debugfs {
    /// Creates the directory with a file for each of the counters in `stats`.
    ///
    /// `EBUSY` if it exists already; the C glue's error (e.g. `ENODEV`
    /// without debugfs) if it cannot be created.
    pub(crate) fn create(stats: &'static Stats) -> Result<Self> {
        if DEBUGFS_LIVE.swap(true, Ordering::AcqRel) {
            return Err(code::EBUSY);
        }
        // SAFETY: `DEBUGFS_LIVE` was false, so no directory exists: this is
        // the single create call `peermem_ffi.h` asks for. `read_counter`
        // is code of this module, valid until the directory is removed.
        let ret = unsafe { raw::peermem_debugfs_create(Some(read_counter)) };
        if let Err(e) = to_result(ret) {
            DEBUGFS_LIVE.store(false, Ordering::Release);
            return Err(e);
        }
        stats.for_each(|name, counter| {
            // SAFETY: `name` is a `'static` C string and `counter` a
            // `&'static Counter`, the type `read_counter` expects: both
            // outlive the directory.
            unsafe {
                raw::peermem_debugfs_add_counter(
                    name.to_bytes_with_nul().as_ptr().cast(),
                    ptr::from_ref::<Counter>(counter).cast::<c_void>(),
                )
            };
        });
        // INVARIANT: the directory was created and `DEBUGFS_LIVE` is true.
        Ok(Self(()))
    }
}

impl Drop for Debugfs {
    fn drop(&mut self) {
        // SAFETY: the directory exists (type invariant); after this call no
        // counter read runs or can start.
        unsafe { raw::peermem_debugfs_remove() };
        DEBUGFS_LIVE.store(false, Ordering::Release);
    }
}

/// Called by the C glue when a counter file is read.
///
/// # Safety
///
/// `counter` must be a pointer passed to `peermem_debugfs_add_counter` by
/// `Debugfs::create`, i.e. to a `'static` `Counter`.
unsafe extern "C" fn read_counter(counter: *const c_void) -> u64 {
    // SAFETY: by the function's safety requirements.
    unsafe { &*counter.cast::<Counter>() }.get()
}
