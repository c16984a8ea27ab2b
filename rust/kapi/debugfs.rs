// SPDX-License-Identifier: GPL-2.0

//! A debugfs directory of read-only `u64` files and writable `u32` files,
//! each backed by a `'static` atomic. Upstream counterpart:
//! `kernel::debugfs` (6.18), which 6.12 lacks; the files are made here over
//! the kernel's exported debugfs functions, with `file_operations` built
//! here.

use super::raw;
use core::ffi::CStr;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use kernel::bindings;
use kernel::error::{code, from_err_ptr, Result};
use kernel::types::Opaque;

/// The directory's name: the module's (`KBUILD_MODNAME`).
#[cfg(not(peermem_dropin))]
const NAME: &CStr = c"peermem";
#[cfg(peermem_dropin)]
const NAME: &CStr = c"nvidia_peermem";

/// `s` as the kernel's `const char *`.
fn cstr(s: &CStr) -> *const super::c_char {
    s.to_bytes_with_nul().as_ptr().cast()
}

/// The directory while a [`Debugfs`] exists, else null.
static DIR: AtomicPtr<bindings::dentry> = AtomicPtr::new(ptr::null_mut());

// `struct module` ends in an array bindgen models as a struct without
// fields; only the address is taken.
#[allow(improper_ctypes)]
extern "C" {
    /// This module (`THIS_MODULE`), made by the kernel's module loader.
    static __this_module: Opaque<bindings::module>;
}

/// A `file_operations` in a `static` (it holds raw pointers).
#[repr(transparent)]
struct Fops(bindings::file_operations);

// SAFETY: only read, by the kernel, which shares it between files.
unsafe impl Sync for Fops {}

/// `DEFINE_DEBUGFS_ATTRIBUTE(.., read_u64, NULL, "%llu\n")`: a counter file.
static COUNTER_FOPS: Fops = Fops(bindings::file_operations {
    // SAFETY: only the address of the module, which the loader made.
    owner: unsafe { __this_module.get() },
    open: Some(open_counter),
    release: Some(raw::simple_attr_release),
    read: Some(raw::debugfs_attr_read),
    write: Some(raw::debugfs_attr_write),
    // SAFETY: all other operations absent (null, `None`, zero).
    ..unsafe { core::mem::zeroed() }
});

/// An action file: `simple_open`, then each `write()` to the file's action.
static ACTION_FOPS: Fops = Fops(bindings::file_operations {
    // SAFETY: as for `COUNTER_FOPS`.
    owner: unsafe { __this_module.get() },
    open: Some(raw::simple_open),
    write: Some(write_action),
    llseek: Some(raw::noop_llseek),
    // SAFETY: all other operations absent (null, `None`, zero).
    ..unsafe { core::mem::zeroed() }
});

/// The module's directory, `/sys/kernel/debug/<module>/`; removed (with
/// everything in it) on drop.
///
/// # Invariants
///
/// While a `Debugfs` exists, `DIR` is its directory; there is at most one
/// `Debugfs`.
pub(crate) struct Debugfs(ptr::NonNull<bindings::dentry>);

// SAFETY: a dentry of debugfs is used from any thread; the methods only
// hand it to debugfs's functions, which lock what they change.
unsafe impl Send for Debugfs {}
// SAFETY: as above.
unsafe impl Sync for Debugfs {}

/// A subdirectory of the [`Debugfs`] directory, valid while it is.
///
/// # Invariants
///
/// `0` is a directory made under the live top directory.
pub(crate) struct Subdir<'a>(
    ptr::NonNull<bindings::dentry>,
    core::marker::PhantomData<&'a Debugfs>,
);

impl Debugfs {
    /// Creates the directory. `EBUSY` if it exists already; debugfs's
    /// error (e.g. `ENODEV` without debugfs) if it cannot be created.
    pub(crate) fn create() -> Result<Self> {
        if !DIR.load(Ordering::Acquire).is_null() {
            return Err(code::EBUSY);
        }
        // SAFETY: FFI call; `NAME` is a static C string.
        let dir = unsafe { raw::debugfs_create_dir(cstr(NAME), ptr::null_mut()) };
        let dir = ptr::NonNull::new(from_err_ptr(dir)?).ok_or(code::ENOMEM)?;
        if DIR
            .compare_exchange(
                ptr::null_mut(),
                dir.as_ptr(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // SAFETY: made just above, and nothing else has it.
            unsafe { raw::debugfs_remove(dir.as_ptr()) };
            return Err(code::EBUSY);
        }
        // INVARIANT: `DIR` is the directory, and was null before.
        Ok(Self(dir))
    }

    /// A subdirectory `name`; `None` if it cannot be made (out of memory).
    pub(crate) fn subdir(&self, name: &'static CStr) -> Option<Subdir<'_>> {
        // SAFETY: the directory exists (type invariant); `name` is a static C string.
        let dir = unsafe { raw::debugfs_create_dir(cstr(name), self.0.as_ptr()) };
        // INVARIANT: made under the live directory.
        ptr::NonNull::new(from_err_ptr(dir).ok()?).map(|d| Subdir(d, core::marker::PhantomData))
    }

    /// A read-only file `name` in `dir` (`None`: the top directory) showing `value`.
    pub(crate) fn add_u64(
        &self,
        dir: Option<&Subdir<'_>>,
        name: &'static CStr,
        value: &'static AtomicU64,
    ) {
        let dir = dir.map_or(self.0.as_ptr(), |d| d.0.as_ptr());
        // SAFETY: `dir` is the top directory or one made under it, removed
        // with it; `name` is a `'static` C string and `value` a `&'static
        // AtomicU64`, the type `read_u64` expects: both outlive the
        // directory. debugfs hands `value` back to `open_counter`; the
        // file is read-only, so the cast away from const is never written
        // through. The fops take debugfs's file reference around each read.
        unsafe {
            raw::debugfs_create_file_unsafe(
                cstr(name),
                0o444,
                dir,
                ptr::from_ref::<AtomicU64>(value).cast_mut().cast(),
                &COUNTER_FOPS.0,
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
        unsafe { raw::debugfs_create_u32(cstr(name), 0o600, self.0.as_ptr(), value.as_ptr()) };
    }

    /// A root-only write-only file `name` in the top directory: writing 1
    /// runs `A::run` (process context, no lock held); other values fail
    /// with `EINVAL`.
    pub(crate) fn add_action<A: Action>(&self, name: &'static CStr) {
        let run: fn() = A::run;
        // SAFETY: `name` is a `'static` C string; `run` is a function of
        // this module, valid until the directory is removed (drop), which
        // waits for writers inside the call (debugfs's file proxy).
        unsafe {
            raw::peermem_debugfs_create_file(
                cstr(name),
                0o200,
                self.0.as_ptr(),
                run as *mut super::c_void,
                &ACTION_FOPS.0,
            )
        };
    }

    /// A read-only file `name` in the top directory showing `value` in hex (`0x%08x`).
    pub(crate) fn add_hex(&self, name: &'static CStr, value: &'static AtomicU32) {
        // SAFETY: `name` is a `'static` C string and `value` a `'static`
        // `u32`, both outliving the directory; the file only reads it,
        // whole (a `u32` load, as an atomic relaxed load).
        unsafe { raw::debugfs_create_x32(cstr(name), 0o444, self.0.as_ptr(), value.as_ptr()) };
    }
}

impl Drop for Debugfs {
    fn drop(&mut self) {
        // SAFETY: the directory exists (type invariant). This removes the
        // subdirectories too, and waits for readers and writers inside a
        // file operation: after it no file read runs or can start.
        unsafe { raw::debugfs_remove(self.0.as_ptr()) };
        DIR.store(ptr::null_mut(), Ordering::Release);
    }
}

/// What writing 1 to an action file ([`Debugfs::add_action`]) does.
pub(crate) trait Action {
    /// Process context, no lock held; may sleep.
    fn run();
}

/// The `write` of an action file: each write is a whole value ("1" or
/// "1\n", as `kstrtouint` with base 0 reads it), wherever the file
/// position is; 1 runs the file's action, anything else fails with
/// `EINVAL` (`ERANGE` past `u32`, `EFAULT` if `buf` cannot be read).
///
/// # Safety
///
/// Called by the kernel for a file of `ACTION_FOPS` opened with
/// `simple_open`: its private data is the `fn()` `add_action` gave; `buf`
/// is the user's buffer of `len` bytes.
unsafe extern "C" fn write_action(
    file: *mut bindings::file,
    buf: *const super::c_char,
    len: usize,
    _ppos: *mut bindings::loff_t,
) -> isize {
    // Short values only ("1\n" with room for a sign and leading zeros).
    if len >= 16 {
        return code::EINVAL.to_errno() as isize;
    }
    let mut value = 0;
    // SAFETY: `buf` is a user pointer of `len` bytes (the function's safety
    // requirements); `kstrtouint_from_user` copies them (at most 34: `len`
    // is less) and fails with `EFAULT` if it cannot; `value` is writable.
    let ret = unsafe { bindings::kstrtouint_from_user(buf.cast(), len, 0, &mut value) };
    if ret != 0 {
        return ret as isize;
    }
    if value != 1 {
        return code::EINVAL.to_errno() as isize;
    }
    // SAFETY: the file's private data is the `fn()` of `add_action` (the
    // function's safety requirements).
    let run = unsafe { core::mem::transmute::<*mut super::c_void, fn()>((*file).private_data) };
    run();
    len as isize
}

/// The `open` of a counter file: `simple_attr_open` with `read_u64`.
///
/// # Safety
///
/// Called by the kernel for a file of `COUNTER_FOPS`.
unsafe extern "C" fn open_counter(
    inode: *mut bindings::inode,
    file: *mut bindings::file,
) -> super::c_int {
    // SAFETY: the kernel's `inode` and `file` of this open; the format is
    // a static C string with one `%llu`, as `read_u64` gives a `u64`.
    unsafe { raw::simple_attr_open(inode, file, Some(read_u64), None, cstr(c"%llu\n")) }
}

/// Reads a counter file's value.
///
/// # Safety
///
/// `value` must be a pointer passed to `debugfs_create_file_unsafe` by
/// [`Debugfs::add_u64`], i.e. to a `'static` `AtomicU64`.
unsafe extern "C" fn read_u64(value: *mut super::c_void, val: *mut u64) -> super::c_int {
    // SAFETY: by the function's safety requirements; `val` is the
    // kernel's, writable.
    unsafe { *val = (*value.cast::<AtomicU64>()).load(Ordering::Relaxed) };
    0
}
