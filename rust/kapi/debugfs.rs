// SPDX-License-Identifier: GPL-2.0

//! A debugfs directory of read-only `u64` files and writable `u32` files,
//! each backed by a `'static` atomic. Upstream counterpart:
//! `kernel::debugfs` (6.18), which 6.12 lacks; the C glue makes the files.

use super::raw;
use core::ffi::CStr;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use kernel::error::{code, to_result, Result};

/// Whether the directory exists (there is only one).
static LIVE: AtomicBool = AtomicBool::new(false);

/// The module's directory, `/sys/kernel/debug/<module>/`; removed (with
/// everything in it) on drop.
///
/// # Invariants
///
/// While a `Debugfs` exists, the C glue's directory exists and `LIVE` is
/// true; there is at most one `Debugfs`.
pub(crate) struct Debugfs(());

/// A subdirectory of the [`Debugfs`] directory, valid while it is.
///
/// # Invariants
///
/// `0` is a directory the glue made under the live top directory.
pub(crate) struct Subdir<'a>(
    ptr::NonNull<core::ffi::c_void>,
    core::marker::PhantomData<&'a Debugfs>,
);

impl Debugfs {
    /// Creates the directory. `EBUSY` if it exists already; the C glue's
    /// error (e.g. `ENODEV` without debugfs) if it cannot be created.
    pub(crate) fn create() -> Result<Self> {
        if LIVE.swap(true, Ordering::AcqRel) {
            return Err(code::EBUSY);
        }
        // SAFETY: `LIVE` was false, so no directory exists: this is the
        // single create call `peermem_ffi.h` asks for. `read_u64` is code
        // of this module, valid until the directory is removed.
        let ret = unsafe { raw::peermem_debugfs_create(Some(read_u64)) };
        if let Err(e) = to_result(ret) {
            LIVE.store(false, Ordering::Release);
            return Err(e);
        }
        // INVARIANT: the directory was created and `LIVE` is true.
        Ok(Self(()))
    }

    /// A subdirectory `name`; `None` if it cannot be made (out of memory).
    pub(crate) fn subdir(&self, name: &'static CStr) -> Option<Subdir<'_>> {
        // SAFETY: the directory exists (type invariant); `name` is a static C string.
        let dir = unsafe { raw::peermem_debugfs_subdir(name.to_bytes_with_nul().as_ptr().cast()) };
        // INVARIANT: made under the live directory.
        ptr::NonNull::new(dir.cast()).map(|d| Subdir(d, core::marker::PhantomData))
    }

    /// A read-only file `name` in `dir` (`None`: the top directory) showing `value`.
    pub(crate) fn add_u64(
        &self,
        dir: Option<&Subdir<'_>>,
        name: &'static CStr,
        value: &'static AtomicU64,
    ) {
        let dir = dir.map_or(ptr::null_mut(), |d| d.0.as_ptr().cast());
        // SAFETY: `dir` is null (the top directory) or a directory the glue
        // made under it, removed with it; `name` is a `'static` C string
        // and `value` a `&'static AtomicU64`, the type `read_u64` expects:
        // both outlive the directory.
        unsafe {
            raw::peermem_debugfs_add_counter(
                dir,
                name.to_bytes_with_nul().as_ptr().cast(),
                ptr::from_ref::<AtomicU64>(value).cast(),
            )
        };
    }

    /// A root-only read-write file `name` in the top directory holding `value`.
    // Only the rig builds' knobs have such files.
    #[cfg_attr(not(peermem_rig), allow(dead_code))]
    pub(crate) fn add_u32(&self, name: &'static CStr, value: &'static AtomicU32) {
        // SAFETY: `name` is a `'static` C string and `value` a `'static`
        // `u32`, both outliving the directory; the file reads and writes
        // it whole (atomically).
        unsafe {
            raw::peermem_debugfs_add_knob(name.to_bytes_with_nul().as_ptr().cast(), value.as_ptr())
        };
    }
}

impl Debugfs {
    /// A root-only write-only file `name` in the top directory: writing 1
    /// runs `A::run` (process context, no lock held); other values fail
    /// with `EINVAL`.
    pub(crate) fn add_action<A: Action>(&self, name: &'static CStr) {
        // SAFETY: `name` is a `'static` C string; `write_action::<A>` is a
        // function of this module, valid until the directory is removed
        // (drop), which waits for writers inside the call.
        unsafe {
            raw::peermem_debugfs_add_action(
                name.to_bytes_with_nul().as_ptr().cast(),
                Some(write_action::<A>),
            )
        };
    }

    /// A read-only file `name` in the top directory showing `value` in hex (`0x%08x`).
    pub(crate) fn add_hex(&self, name: &'static CStr, value: &'static AtomicU32) {
        // SAFETY: `name` is a `'static` C string and `value` a `'static`
        // `u32`, both outliving the directory; the file only reads it,
        // whole (a `u32` load, as an atomic relaxed load).
        unsafe {
            raw::peermem_debugfs_add_hex(name.to_bytes_with_nul().as_ptr().cast(), value.as_ptr())
        };
    }
}

impl Drop for Debugfs {
    fn drop(&mut self) {
        // SAFETY: the directory exists (type invariant); after this call no
        // file read runs or can start.
        unsafe { raw::peermem_debugfs_remove() };
        LIVE.store(false, Ordering::Release);
    }
}

/// What writing 1 to an action file ([`Debugfs::add_action`]) does.
pub(crate) trait Action {
    /// Process context, no lock held; may sleep.
    fn run();
}

/// A `write()` of `len` bytes at `buf` to an action file of `A`: each
/// write is a whole value ("1" or "1\n", as `kstrtouint` with base 0 reads
/// it), wherever the file position is; 1 runs `A::run`, anything else fails
/// with `EINVAL` (`ERANGE` past `u32`, `EFAULT` if `buf` cannot be read).
///
/// # Safety
///
/// Called by the C glue's `write` file operation: `buf` is the user's
/// buffer of `len` bytes.
unsafe extern "C" fn write_action<A: Action>(buf: *const super::c_char, len: usize) -> isize {
    // Short values only ("1\n" with room for a sign and leading zeros).
    if len >= 16 {
        return code::EINVAL.to_errno() as isize;
    }
    let mut value = 0;
    // SAFETY: `buf` is a user pointer of `len` bytes (the function's safety
    // requirements); `kstrtouint_from_user` copies them (at most 34: `len`
    // is less) and fails with `EFAULT` if it cannot; `value` is writable.
    let ret = unsafe { kernel::bindings::kstrtouint_from_user(buf.cast(), len, 0, &mut value) };
    if ret != 0 {
        return ret as isize;
    }
    if value != 1 {
        return code::EINVAL.to_errno() as isize;
    }
    A::run();
    len as isize
}

/// Called by the C glue when a `u64` file is read.
///
/// # Safety
///
/// `value` must be a pointer passed to `peermem_debugfs_add_counter` by
/// [`Debugfs::add_u64`], i.e. to a `'static` `AtomicU64`.
unsafe extern "C" fn read_u64(value: *const super::c_void) -> u64 {
    // SAFETY: by the function's safety requirements.
    unsafe { &*value.cast::<AtomicU64>() }.load(Ordering::Relaxed)
}
