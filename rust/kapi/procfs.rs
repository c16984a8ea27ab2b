// SPDX-License-Identifier: GPL-2.0

//! A read-only file in `/proc` whose text a Rust function writes at each
//! read (`proc_create_single_data` and a `seq_file`): how peermem shows
//! counters to users who cannot read debugfs. The kernel functions are
//! exported and the same on every supported kernel, so they are called
//! directly (`include/peermem_proc.h`). Upstream counterpart: none in the
//! kernel crate.

use super::raw;
use super::{c_int, c_void};
use core::ffi::CStr;
use core::fmt;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};
use kernel::error::{code, Result};

/// What a [`ProcFile`] shows.
pub(crate) trait ProcShow {
    /// Writes the file's whole text. Called for every read, possibly in
    /// several readers at once; it must not sleep for long or take a lock
    /// that the file's removal is called under.
    fn show(out: &mut ProcText<'_>) -> fmt::Result;
}

/// The text of one read of a [`ProcFile`], written with `write!`.
///
/// # Invariants
///
/// `0` is the `seq_file` of the read in progress, valid for `'a`.
pub(crate) struct ProcText<'a>(NonNull<raw::seq_file>, PhantomData<&'a mut raw::seq_file>);

impl fmt::Write for ProcText<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // SAFETY: the `seq_file` is the one of the read in progress (type
        // invariant); `s` is valid for `s.len()` bytes. A text longer than
        // the buffer is not an error here: `seq_file` notes the overflow
        // and calls `show` again with a larger buffer.
        unsafe { raw::seq_write(self.0.as_ptr(), s.as_ptr().cast::<c_void>(), s.len()) };
        Ok(())
    }
}

/// The `show` callback of the file: `T::show`.
///
/// # Safety
///
/// Called by the kernel's `seq_file` code with the `seq_file` of a read of
/// a file [`ProcFile::<T>::create`] made.
unsafe extern "C" fn show<T: ProcShow>(m: *mut raw::seq_file, _v: *mut c_void) -> c_int {
    let Some(m) = NonNull::new(m) else {
        return 0;
    };
    // INVARIANT: `m` is the seq_file of this read, valid during the call.
    let mut out = ProcText(m, PhantomData);
    // A formatting error only truncates the text the reader gets.
    let _ = T::show(&mut out);
    0
}

/// A file `/proc/<name>`, mode 0444, showing `T`; removed on drop, which
/// waits for reads in progress.
///
/// # Invariants
///
/// `entry` is the entry `proc_create_single_data` returned, not removed yet.
pub(crate) struct ProcFile<T: ProcShow> {
    entry: NonNull<raw::proc_dir_entry>,
    _show: PhantomData<T>,
}

// SAFETY: the entry is only removed (once, in `drop`), which the kernel
// allows from any thread.
unsafe impl<T: ProcShow> Send for ProcFile<T> {}
// SAFETY: a shared `ProcFile` gives access to nothing.
unsafe impl<T: ProcShow> Sync for ProcFile<T> {}

impl<T: ProcShow> ProcFile<T> {
    /// Creates `/proc/<name>` (`name` may name a directory of `/proc`
    /// first, as in `driver/peermem`). `ENOMEM` if the kernel could not
    /// make it (out of memory, or the name is taken).
    pub(crate) fn create(name: &'static CStr) -> Result<Self> {
        // SAFETY: `name` is a static C string; `show::<T>` is code of this
        // module, which stays loaded until the entry is removed (`drop`,
        // which waits for reads in progress); no private data.
        let entry = unsafe {
            raw::proc_create_single_data(
                name.to_bytes_with_nul().as_ptr().cast(),
                0o444,
                ptr::null_mut(),
                Some(show::<T>),
                ptr::null_mut(),
            )
        };
        // INVARIANT: the entry the kernel made.
        NonNull::new(entry)
            .map(|entry| Self {
                entry,
                _show: PhantomData,
            })
            .ok_or(code::ENOMEM)
    }
}

impl<T: ProcShow> Drop for ProcFile<T> {
    fn drop(&mut self) {
        // SAFETY: the entry exists (type invariant) and is removed once;
        // `proc_remove` waits until no read is in `show` any more.
        unsafe { raw::proc_remove(self.entry.as_ptr()) };
    }
}
