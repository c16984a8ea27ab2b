// SPDX-License-Identifier: GPL-2.0

//! A misc character device whose open files are objects of a driver type
//! (`open`, `release`, `read`, `poll`, `mmap`), the user buffer a `read`
//! fills, the `mmap` target, and the wait queue a blocking `read` and
//! `poll` wait on. Upstream counterpart: `kernel::miscdevice`
//! (`MiscDevice`, `MiscDeviceRegistration`; 6.13, changing since), which
//! 6.12 lacks; the C glue (`rust/miscdev.c`) holds the file operations and
//! calls the trampolines here.

use super::mm::SharedPage;
use super::{c_char, c_void, raw};
use core::ffi::CStr;
use core::marker::PhantomData;
use core::ptr::NonNull;
use kernel::error::{code, to_result, Error, Result};
use kernel::sync::{Arc, ArcBorrow};

/// What a device's open files are and do. Each open file is one `Arc<Self>`.
pub(crate) trait MiscDevice: Send + Sync + Sized + 'static {
    /// A file is being opened (in the opener's context).
    fn open() -> Result<Arc<Self>>;

    /// The file's last close; `this` is the file's reference.
    fn release(this: Arc<Self>);

    /// `read()`: write whole records to `out`; the bytes written, or
    /// `EAGAIN` if nothing is there yet (the caller then waits on
    /// [`MiscDevice::wait_queue`] until [`MiscDevice::readable`], unless the
    /// file is non-blocking). Must not sleep except in `out`'s copies.
    fn read(&self, out: &mut UserWriter) -> Result<usize>;

    /// Whether `read` has something to return (or fails at once); `poll()`
    /// reports `EPOLLIN | EPOLLRDNORM` then. Must not sleep.
    fn readable(&self) -> bool;

    /// The wait queue woken whenever `readable` may have become true.
    fn wait_queue(&self) -> &WaitQueue;

    /// `mmap()` (in the mapper's context, the mm's lock held for writing).
    fn mmap(&self, vma: &Vma) -> Result;
}

/// A registered misc device `/dev/<name>` for files `T`; dropping it
/// removes the device node (open files keep working, and keep the module
/// loaded: the file operations hold a module reference).
///
/// # Invariants
///
/// `dev` was returned by `peermem_misc_register` with `T`'s trampolines
/// and is deregistered only by `drop`.
pub(crate) struct MiscDeviceRegistration<T: MiscDevice> {
    dev: NonNull<raw::peermem_miscdev>,
    _files: PhantomData<fn() -> Arc<T>>,
}

// SAFETY: the C device may be deregistered from any thread.
unsafe impl<T: MiscDevice> Send for MiscDeviceRegistration<T> {}
// SAFETY: no method takes `&self`.
unsafe impl<T: MiscDevice> Sync for MiscDeviceRegistration<T> {}

/// The C callbacks of `T`'s files.
struct VTable<T>(PhantomData<T>);

impl<T: MiscDevice> VTable<T> {
    const OPS: raw::peermem_misc_ops = raw::peermem_misc_ops {
        open: Some(open::<T>),
        release: Some(release::<T>),
        read: Some(read::<T>),
        readable: Some(readable::<T>),
        waitq: Some(waitq::<T>),
        mmap: Some(mmap::<T>),
    };
}

impl<T: MiscDevice> MiscDeviceRegistration<T> {
    /// Registers `/dev/<name>` (a dynamic minor, mode 0666, owner root).
    /// The misc core's error (`EBUSY`: the name is taken) or `ENOMEM`.
    pub(crate) fn register(name: &'static CStr) -> Result<Self> {
        let ops: &'static raw::peermem_misc_ops = &VTable::<T>::OPS;
        // SAFETY: `name` and `ops` are static; the trampolines are this
        // module's code, which stays loaded while a file is open (the file
        // operations hold a module reference) or the device is registered.
        let p =
            unsafe { raw::peermem_misc_register(name.to_bytes_with_nul().as_ptr().cast(), ops) };
        let v = p as isize;
        if (-4095..0).contains(&v) {
            return Err(Error::from_errno(v as i32));
        }
        let dev = NonNull::new(p).ok_or(code::ENOMEM)?;
        // INVARIANT: registered with `T`'s trampolines just above.
        Ok(Self {
            dev,
            _files: PhantomData,
        })
    }
}

impl<T: MiscDevice> Drop for MiscDeviceRegistration<T> {
    fn drop(&mut self) {
        // SAFETY: registered (type invariant), deregistered once, here.
        unsafe { raw::peermem_misc_deregister(self.dev.as_ptr()) };
    }
}

/// `open`: a new file object, as a raw `Arc`, or an `ERR_PTR`.
extern "C" fn open<T: MiscDevice>() -> *const c_void {
    match T::open() {
        Ok(obj) => Arc::into_raw(obj).cast(),
        Err(e) => e.to_errno() as isize as *const c_void,
    }
}

/// `release`: the file's reference goes back to `T`.
///
/// # Safety
///
/// `obj` came from `open::<T>`; called once, after every other callback
/// for the file returned.
unsafe extern "C" fn release<T: MiscDevice>(obj: *const c_void) {
    // SAFETY: from `Arc::into_raw` in `open::<T>`; ours now (once).
    T::release(unsafe { Arc::from_raw(obj.cast::<T>()) });
}

/// Borrows the file object of a callback.
///
/// # Safety
///
/// `obj` came from `open::<T>` and `release::<T>` has not run for it.
unsafe fn borrow<'a, T: MiscDevice>(obj: *const c_void) -> ArcBorrow<'a, T> {
    // SAFETY: the file holds the reference from `open` until `release`
    // (the caller's guarantee), longer than this callback.
    unsafe { ArcBorrow::from_raw(obj.cast::<T>()) }
}

/// `read`: bytes copied, or `-errno`.
///
/// # Safety
///
/// As [`borrow`]; `buf` is the user pointer of the `read()` call, `len` its length.
unsafe extern "C" fn read<T: MiscDevice>(
    obj: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> isize {
    // SAFETY: the caller's guarantee.
    let this = unsafe { borrow::<T>(obj) };
    // INVARIANT: the user buffer of this read() call.
    let mut out = UserWriter { buf, len, pos: 0 };
    match T::read(&this, &mut out) {
        Ok(n) => n as isize,
        Err(e) => e.to_errno() as isize,
    }
}

/// `readable`.
///
/// # Safety
///
/// As [`borrow`].
unsafe extern "C" fn readable<T: MiscDevice>(obj: *const c_void) -> bool {
    // SAFETY: the caller's guarantee.
    let this = unsafe { borrow::<T>(obj) };
    T::readable(&this)
}

/// `waitq`: valid as long as the file object.
///
/// # Safety
///
/// As [`borrow`].
unsafe extern "C" fn waitq<T: MiscDevice>(
    obj: *const c_void,
) -> *mut kernel::bindings::wait_queue_head {
    // SAFETY: the caller's guarantee.
    let this = unsafe { borrow::<T>(obj) };
    T::wait_queue(&this).wq.as_ptr()
}

/// `mmap`: 0 or `-errno`.
///
/// # Safety
///
/// As [`borrow`]; `vma` is the area being mapped, under the mm's write lock.
unsafe extern "C" fn mmap<T: MiscDevice>(
    obj: *const c_void,
    vma: *mut kernel::bindings::vm_area_struct,
) -> super::c_int {
    // SAFETY: the caller's guarantee.
    let this = unsafe { borrow::<T>(obj) };
    // INVARIANT: the area of this mmap() call, valid for the call.
    match T::mmap(&this, &Vma(vma)) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// The user buffer of one `read()` call, filled from its start.
///
/// # Invariants
///
/// `buf` is the call's user pointer and `len` its length; `pos <= len`
/// bytes were written.
pub(crate) struct UserWriter {
    buf: *mut c_char,
    len: usize,
    pos: usize,
}

impl UserWriter {
    /// The length the caller asked for.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes still free.
    pub(crate) fn remaining(&self) -> usize {
        self.len - self.pos
    }

    /// Appends `data`: `EINVAL` if it does not fit, `EFAULT` if the user
    /// memory is not writable (then nothing is counted as written).
    pub(crate) fn write(&mut self, data: &[u8]) -> Result {
        if data.len() > self.remaining() {
            return Err(code::EINVAL);
        }
        let to = self.buf.wrapping_add(self.pos);
        // SAFETY: `to` is a user address (checked by copy_to_user itself),
        // `data` is valid for `data.len()` bytes.
        let left = unsafe { raw::peermem_copy_to_user(to, data.as_ptr().cast(), data.len()) };
        if left != 0 {
            return Err(code::EFAULT);
        }
        self.pos += data.len();
        Ok(())
    }
}

/// The area of one `mmap()` call.
///
/// # Invariants
///
/// Points to the `vm_area_struct` being mapped, under its mm's write lock,
/// for as long as the `Vma` lives (only the trampoline makes one).
pub(crate) struct Vma(*mut kernel::bindings::vm_area_struct);

impl Vma {
    /// Maps `page` here read-only: the area must be one page at offset 0
    /// (`EINVAL`) and not writable (`EPERM`); it can never be made
    /// writable, is not inherited by `fork()` (not even after
    /// `madvise(MADV_DOFORK)`, which fails with `EINVAL`), and
    /// `get_user_pages` does not reach it (`/proc/<pid>/mem` reads fail).
    pub(crate) fn map_page_read_only(&self, page: &SharedPage) -> Result {
        // SAFETY: a live area under the mm's write lock (type invariant);
        // `page` is a page from `peermem_page_zalloc` (its invariant),
        // which the mapping takes its own reference to.
        to_result(unsafe { raw::peermem_vma_map_page(self.0, page.as_ptr()) })
    }
}

/// A wait queue (the C glue's `wait_queue_head`), freed on drop.
///
/// # Invariants
///
/// `wq` is from `peermem_waitq_alloc`, freed only by `drop`.
pub(crate) struct WaitQueue {
    wq: NonNull<kernel::bindings::wait_queue_head>,
}

// SAFETY: a wait queue is used from any thread (it has its own lock).
unsafe impl Send for WaitQueue {}
// SAFETY: as above.
unsafe impl Sync for WaitQueue {}

impl WaitQueue {
    /// A new wait queue; `ENOMEM` if it cannot be allocated.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: FFI call without preconditions.
        let wq = unsafe { raw::peermem_waitq_alloc() };
        // INVARIANT: from `peermem_waitq_alloc`.
        NonNull::new(wq).map(|wq| Self { wq }).ok_or(code::ENOMEM)
    }

    /// Wakes every waiter (for reading). Any context.
    pub(crate) fn wake(&self) {
        // SAFETY: live (type invariant).
        unsafe { raw::peermem_waitq_wake(self.wq.as_ptr()) };
    }
}

impl Drop for WaitQueue {
    fn drop(&mut self) {
        // SAFETY: live, and nobody waits on it any more: a waiter is a
        // callback of a file whose object owns this queue, and the object
        // is dropped only after the file's release.
        unsafe { raw::peermem_waitq_free(self.wq.as_ptr()) };
    }
}
