// SPDX-License-Identifier: GPL-2.0

//! A misc character device whose open files are objects of a driver type
//! (`open`, `release`, `read`, `poll`, `mmap`), the user buffer a `read`
//! fills, the `mmap` target, and the wait queue a blocking `read` and
//! `poll` wait on. Upstream counterpart: `kernel::miscdevice`
//! (`MiscDevice`, `MiscDeviceRegistration`; 6.13, changing since), which
//! 6.12 lacks: the `file_operations` are built here, as the kernel crate
//! builds them, over `misc_register` and the kernel's wait-queue
//! functions; C (`rust/miscdev.c`) only wraps `poll_wait`,
//! `vm_flags_mod` and `virt_to_page`, static inline functions and macros.

use super::mm::SharedPage;
use super::{c_char, c_int, c_uint, c_ulong, c_void, raw};
use core::ffi::CStr;
use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::ptr::NonNull;
use kernel::alloc::flags::{GFP_KERNEL, GFP_KERNEL_ACCOUNT};
use kernel::alloc::KBox;
use kernel::bindings;
use kernel::error::{code, to_result, Error, Result};
use kernel::sync::{Arc, ArcBorrow};
use kernel::types::Opaque;

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
/// `misc` is from `KBox::into_raw`, registered with `misc_register` with
/// [`FileOps::<T>::FOPS`], deregistered and freed only by `drop`.
pub(crate) struct MiscDeviceRegistration<T: MiscDevice> {
    misc: NonNull<raw::miscdevice>,
    _files: PhantomData<fn() -> Arc<T>>,
}

// SAFETY: the device may be deregistered from any thread.
unsafe impl<T: MiscDevice> Send for MiscDeviceRegistration<T> {}
// SAFETY: no method takes `&self`.
unsafe impl<T: MiscDevice> Sync for MiscDeviceRegistration<T> {}

// Only the address is taken: the struct's layout never crosses the boundary.
#[allow(improper_ctypes)]
extern "C" {
    /// This module (`THIS_MODULE`): the owner of the file operations, so an
    /// open file holds a module reference. modpost defines it.
    static __this_module: Opaque<bindings::module>;
}

/// `poll()`'s readable mask (`include/uapi/linux/eventpoll.h`; bindgen
/// cannot evaluate the header's `(__force __poll_t)` casts).
const EPOLLIN: bindings::__poll_t = 0x0001;
const EPOLLRDNORM: bindings::__poll_t = 0x0040;

/// The file operations of `T`'s files.
struct FileOps<T>(PhantomData<T>);

impl<T: MiscDevice> FileOps<T> {
    /// A constant without interior mutability, so `&FOPS` is `'static`:
    /// open files point to it after the device is gone.
    const FOPS: bindings::file_operations = bindings::file_operations {
        owner: {
            let m: *const Opaque<bindings::module> = &raw const __this_module;
            m.cast_mut().cast()
        },
        open: Some(open::<T>),
        release: Some(release::<T>),
        read: Some(read::<T>),
        poll: Some(poll::<T>),
        mmap: Some(mmap::<T>),
        // SAFETY: all zeroes is a valid `file_operations` (null pointers,
        // `None` callbacks, zero flags): the fields not set are unused.
        ..unsafe { MaybeUninit::zeroed().assume_init() }
    };
}

impl<T: MiscDevice> MiscDeviceRegistration<T> {
    /// Registers `/dev/<name>` (a dynamic minor, mode 0666, owner root).
    /// The misc core's error (`EBUSY`: the name is taken) or `ENOMEM`.
    pub(crate) fn register(name: &'static CStr) -> Result<Self> {
        let fops: &'static bindings::file_operations = &FileOps::<T>::FOPS;
        // SAFETY: all zeroes is a valid `miscdevice` (null pointers, an
        // empty list head the misc core initialises).
        let mut misc: raw::miscdevice = unsafe { MaybeUninit::zeroed().assume_init() };
        misc.minor = raw::MISC_DYNAMIC_MINOR as c_int;
        misc.name = name.to_bytes_with_nul().as_ptr().cast();
        misc.fops = fops;
        misc.mode = 0o666;
        let misc = KBox::into_raw(KBox::new(misc, GFP_KERNEL)?);
        // SAFETY: `misc` is a live, filled miscdevice that stays at its
        // address until `drop`; `name` and `fops` are static; the callbacks
        // are this module's code, which stays loaded while a file is open
        // (`fops.owner`) or the device is registered.
        let ret = unsafe { raw::misc_register(misc) };
        if ret != 0 {
            // SAFETY: from `KBox::into_raw` above, not registered.
            drop(unsafe { KBox::from_raw(misc) });
            return Err(Error::from_errno(ret));
        }
        // INVARIANT: registered with `T`'s file operations just above.
        Ok(Self {
            // SAFETY: from `KBox::into_raw`, never null.
            misc: unsafe { NonNull::new_unchecked(misc) },
            _files: PhantomData,
        })
    }
}

impl<T: MiscDevice> Drop for MiscDeviceRegistration<T> {
    fn drop(&mut self) {
        // SAFETY: registered (type invariant), deregistered once, here; the
        // misc core no longer refers to it after `misc_deregister`.
        unsafe {
            raw::misc_deregister(self.misc.as_ptr());
            drop(KBox::from_raw(self.misc.as_ptr()));
        }
    }
}

/// Borrows the object of an open file of `T`.
///
/// # Safety
///
/// `file` is an open file of a [`MiscDeviceRegistration<T>`] whose `open`
/// succeeded and whose `release` has not run.
unsafe fn borrow<'a, T: MiscDevice>(file: *mut bindings::file) -> ArcBorrow<'a, T> {
    // SAFETY: `open::<T>` left the reference from `Arc::into_raw` in
    // `private_data`, which the file holds until `release` (the caller's
    // guarantee), longer than this callback.
    unsafe { ArcBorrow::from_raw((*file).private_data.cast::<T>()) }
}

/// `open`: a new file object, as a raw `Arc` in `private_data`.
///
/// # Safety
///
/// Called by the VFS (`misc_open`) for a new file of `T`'s device.
unsafe extern "C" fn open<T: MiscDevice>(
    inode: *mut bindings::inode,
    file: *mut bindings::file,
) -> c_int {
    let obj = match T::open() {
        Ok(obj) => obj,
        Err(e) => return e.to_errno(),
    };
    // SAFETY: the new file, ours until `open` returns. `misc_open` left
    // the miscdevice in `private_data`; the file's object replaces it.
    unsafe { (*file).private_data = Arc::into_raw(obj).cast_mut().cast() };
    // No file position: read() consumes records, pread() is refused.
    // SAFETY: the inode and file of this open.
    unsafe { bindings::stream_open(inode, file) }
}

/// `release`: the file's reference goes back to `T`.
///
/// # Safety
///
/// Called by the VFS once, on the last close of a file `open::<T>` opened,
/// after every other callback for the file returned.
unsafe extern "C" fn release<T: MiscDevice>(
    _inode: *mut bindings::inode,
    file: *mut bindings::file,
) -> c_int {
    // SAFETY: from `Arc::into_raw` in `open::<T>`; ours now (once).
    T::release(unsafe { Arc::from_raw((*file).private_data.cast::<T>()) });
    0
}

/// `read`: bytes copied, or `-errno`; waits (interruptibly) for a record
/// unless the file is non-blocking.
///
/// # Safety
///
/// Called by the VFS for a file `open::<T>` opened; `buf` is the user
/// pointer of the `read()` call, `len` its length.
unsafe extern "C" fn read<T: MiscDevice>(
    file: *mut bindings::file,
    buf: *mut c_char,
    len: usize,
    _ppos: *mut bindings::loff_t,
) -> isize {
    // SAFETY: the caller's guarantee.
    let this = unsafe { borrow::<T>(file) };
    loop {
        // INVARIANT: the user buffer of this read() call.
        let mut out = UserWriter { buf, len, pos: 0 };
        let err = match T::read(&this, &mut out) {
            Ok(n) => return n as isize,
            Err(e) => e,
        };
        // SAFETY: a live file (the caller's guarantee); fcntl() may change
        // its flags at any time, so they are read again on every pass.
        let flags = unsafe { (*file).f_flags };
        if err != code::EAGAIN || flags & bindings::O_NONBLOCK != 0 {
            return err.to_errno() as isize;
        }
        if let Err(e) = T::wait_queue(&this).wait_interruptible(|| T::readable(&this)) {
            return e.to_errno() as isize;
        }
    }
}

/// `poll`: readable or not, after registering the file's wait queue.
///
/// # Safety
///
/// Called by the VFS for a file `open::<T>` opened, with its poll table.
unsafe extern "C" fn poll<T: MiscDevice>(
    file: *mut bindings::file,
    pt: *mut bindings::poll_table_struct,
) -> bindings::__poll_t {
    // SAFETY: the caller's guarantee.
    let this = unsafe { borrow::<T>(file) };
    // SAFETY: the file and poll table of this call; the wait queue lives as
    // long as the file's object, which lives until the file's release, and
    // the poll core removes its entries before the file can be released.
    unsafe { raw::peermem_poll_wait(file, T::wait_queue(&this).as_ptr(), pt) };
    if T::readable(&this) {
        EPOLLIN | EPOLLRDNORM
    } else {
        0
    }
}

/// `mmap`: 0 or `-errno`.
///
/// # Safety
///
/// Called by the VFS for a file `open::<T>` opened; `vma` is the area
/// being mapped, under the mm's write lock.
unsafe extern "C" fn mmap<T: MiscDevice>(
    file: *mut bindings::file,
    vma: *mut bindings::vm_area_struct,
) -> c_int {
    // SAFETY: the caller's guarantee.
    let this = unsafe { borrow::<T>(file) };
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
        let left = unsafe {
            bindings::copy_to_user(to.cast(), data.as_ptr().cast(), data.len() as c_ulong)
        };
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
    // The VM_* constants are `u32` on 6.12 and `vm_flags_t` from 6.13 on.
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn map_page_read_only(&self, page: &SharedPage) -> Result {
        let vma = self.0;
        // SAFETY: a live area under the mm's write lock (type invariant);
        // `vm_flags` is the union's member for reading the flags.
        let (start, end, pgoff, flags) = unsafe {
            let range = &(*vma).__bindgen_anon_1.__bindgen_anon_1;
            (
                range.vm_start,
                range.vm_end,
                (*vma).vm_pgoff,
                (*vma).__bindgen_anon_2.vm_flags,
            )
        };
        if end - start != bindings::PAGE_SIZE as c_ulong || pgoff != 0 {
            return Err(code::EINVAL);
        }
        if flags & bindings::VM_WRITE as bindings::vm_flags_t != 0 {
            return Err(code::EPERM);
        }
        // The page is the opener's alone. VM_DONTCOPY: fork() does not
        // copy the mapping; VM_IO: madvise(MADV_DOFORK) cannot clear that
        // (6.12 refuses it only on VM_IO), and get_user_pages refuses the
        // area, so neither /proc/pid/mem nor process_vm_readv reaches the
        // page (the lockless pin_user_pages_fast still can, for the process
        // itself: the PTE is an ordinary page's). VM_DONTEXPAND: mremap
        // cannot grow it. Without VM_MAYWRITE, mprotect(PROT_WRITE) fails.
        let set = bindings::VM_IO | bindings::VM_DONTCOPY | bindings::VM_DONTEXPAND;
        let set = (set | bindings::VM_DONTDUMP) as c_ulong;
        // SAFETY: as above; the flags are the mm's to change under its
        // write lock. `page` is a page from `get_zeroed_page` (its
        // invariant), which the mapping takes its own reference to.
        to_result(unsafe {
            raw::peermem_vm_flags_mod(vma, set, bindings::VM_MAYWRITE as c_ulong);
            bindings::vm_insert_page(vma, start, raw::peermem_virt_to_page(page.as_ptr()))
        })
    }
}

/// The lockdep class of every [`WaitQueue`]'s lock (what the
/// `init_waitqueue_head` macro makes for its call site).
struct WaitQueueClass(Opaque<bindings::lock_class_key>);

// SAFETY: lockdep uses the key only by its address.
unsafe impl Sync for WaitQueueClass {}

static WAITQ_CLASS: WaitQueueClass = WaitQueueClass(Opaque::uninit());

/// A wait queue (a `wait_queue_head` of its own allocation, charged to
/// the caller's memory cgroup), freed on drop.
///
/// # Invariants
///
/// `wq` was initialised by `__init_waitqueue_head` and is not moved.
pub(crate) struct WaitQueue {
    wq: KBox<Opaque<bindings::wait_queue_head>>,
}

// SAFETY: a wait queue is used from any thread (it has its own lock).
unsafe impl Send for WaitQueue {}
// SAFETY: as above.
unsafe impl Sync for WaitQueue {}

impl WaitQueue {
    /// A new wait queue; `ENOMEM` if it cannot be allocated.
    pub(crate) fn new() -> Result<Self> {
        let wq = KBox::new(Opaque::uninit(), GFP_KERNEL_ACCOUNT)?;
        // SAFETY: `wq` is allocated and stays at its address (boxed);
        // the name and the lockdep class key are static.
        unsafe {
            bindings::__init_waitqueue_head(
                wq.get(),
                c"wq".to_bytes_with_nul().as_ptr().cast(),
                WAITQ_CLASS.0.get(),
            )
        };
        // INVARIANT: initialised just above; the box never moves it.
        Ok(Self { wq })
    }

    /// The C wait queue head, for `poll_wait`.
    fn as_ptr(&self) -> *mut bindings::wait_queue_head {
        self.wq.get()
    }

    /// Wakes every waiter for reading (`wake_up_interruptible_poll(wq,
    /// EPOLLIN | EPOLLRDNORM)`). Any context.
    pub(crate) fn wake(&self) {
        let key = (EPOLLIN | EPOLLRDNORM) as usize as *mut c_void;
        // SAFETY: initialised (type invariant).
        unsafe {
            bindings::__wake_up(
                self.as_ptr(),
                bindings::TASK_INTERRUPTIBLE as c_uint,
                1,
                key,
            )
        };
    }

    /// Sleeps (interruptibly) until `cond` holds, as
    /// `wait_event_interruptible(wq, cond)`: `Ok` once it holds,
    /// `ERESTARTSYS` if a signal came first. `cond` runs in the
    /// `TASK_INTERRUPTIBLE` state: it may take a spinlock, not sleep.
    pub(crate) fn wait_interruptible(&self, cond: impl Fn() -> bool) -> Result {
        if cond() {
            return Ok(());
        }
        let mut entry = MaybeUninit::<bindings::wait_queue_entry>::uninit();
        let entry = entry.as_mut_ptr();
        // SAFETY: `entry` is this frame's and does not move while queued:
        // it is only used through this pointer, and the loop below leaves
        // it off the queue (finish_wait, or prepare_to_wait_event removes
        // it when it reports a signal).
        unsafe { bindings::init_wait_entry(entry, 0) };
        loop {
            // SAFETY: as above; the queue is initialised (type invariant).
            let int = unsafe {
                bindings::prepare_to_wait_event(
                    self.as_ptr(),
                    entry,
                    bindings::TASK_INTERRUPTIBLE as c_int,
                )
            };
            if cond() {
                break;
            }
            if int != 0 {
                return Err(Error::from_errno(int as c_int));
            }
            // SAFETY: FFI call; queued on the wait queue, so a wake-up ends it.
            unsafe { bindings::schedule() };
            if cond() {
                break;
            }
        }
        // SAFETY: `entry` was queued by prepare_to_wait_event on this queue.
        unsafe { bindings::finish_wait(self.as_ptr(), entry) };
        Ok(())
    }
}
