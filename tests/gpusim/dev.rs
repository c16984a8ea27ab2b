// SPDX-License-Identifier: GPL-2.0

//! `/dev/gpusim`: the user-space side. `GPUSIM_IOC_ALLOC` allocates and maps
//! device memory into the caller (the ioctl issues the mmap itself, at a
//! 64 KiB aligned address); `GPUSIM_IOC_FREE` and releasing the file free
//! it. The layouts are those of `gpusim_uapi.h`.
//!
//! The mapping's life (vm_operations in `gpusim_glue.c`): munmap or exit
//! detach the allocation from its address (it stays allocated, pins stay
//! valid, get_pages on the old address fails); mremap of the whole
//! mapping moves it (get_pages follows); anything that would split it
//! (partial munmap/mprotect/mremap) fails with EINVAL; fork does not copy
//! it (VM_DONTCOPY).

use crate::abi::GPU_PAGE;
use crate::glue;
use crate::knobs::{self, *};
use crate::state::{self, Alloc};
use core::mem::{size_of, ManuallyDrop};
use kernel::bindings;
use kernel::ffi::{c_int, c_void};
use kernel::fs::File;
use kernel::ioctl::{_IOW, _IOWR};
use kernel::miscdevice::{MiscDevice, MiscDeviceRegistration};
use kernel::mm::virt::VmaNew;
use kernel::prelude::*;
use kernel::sync::atomic::{Atomic, Relaxed};
use kernel::sync::Arc;
use kernel::transmute::{AsBytes, FromBytes};
use kernel::uaccess::{UserPtr, UserSlice};

/// `struct gpusim_alloc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GpusimAlloc {
    size: u64,
    addr: u64,
    handle: u64,
    flags: u32,
    chunk_bytes: u32,
}

/// `struct gpusim_free`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GpusimFree {
    handle: u64,
}

/// `struct gpusim_info`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GpusimInfo {
    handle: u64,
    addr: u64,
    size: u64,
    chunk_bytes: u32,
    pins: u32,
}

// SAFETY: Plain integers with no padding (sizes asserted below): every bit
// pattern is valid and no byte is uninitialized.
unsafe impl FromBytes for GpusimAlloc {}
// SAFETY: As above.
unsafe impl AsBytes for GpusimAlloc {}
// SAFETY: As above.
unsafe impl FromBytes for GpusimFree {}
// SAFETY: As above.
unsafe impl FromBytes for GpusimInfo {}
// SAFETY: As above.
unsafe impl AsBytes for GpusimInfo {}

const _: () = {
    assert!(size_of::<GpusimAlloc>() == 32);
    assert!(size_of::<GpusimFree>() == 8);
    assert!(size_of::<GpusimInfo>() == 32);
};

const MAGIC: u32 = b'G' as u32;
const IOC_ALLOC: u32 = _IOWR::<GpusimAlloc>(MAGIC, 0x01);
const IOC_FREE: u32 = _IOW::<GpusimFree>(MAGIC, 0x02);
const IOC_INFO: u32 = _IOWR::<GpusimInfo>(MAGIC, 0x03);

/// Distinguishes open files (allocations belong to one).
static NEXT_FILE_ID: Atomic<u64> = Atomic::new(1);

/// Per-open-file state of `/dev/gpusim`.
pub(crate) struct GpuSimFile {
    id: u64,
}

#[vtable]
impl MiscDevice for GpuSimFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        let id = NEXT_FILE_ID.fetch_add(1, Relaxed);
        Ok(KBox::new(Self { id }, GFP_KERNEL)?)
    }

    fn release(me: KBox<Self>, _file: &File) {
        state::release_file(me.id);
    }

    fn mmap(me: &GpuSimFile, _file: &File, vma: &VmaNew) -> Result {
        let raw = vma.as_ptr();
        // SAFETY: `raw` is the vma under construction we were called for.
        let handle = unsafe { (*raw).vm_pgoff } as u64;
        let (start, end) = (vma.start(), vma.end());
        let alloc = state::mmap_claim(me.id, handle, raw as usize, start, end - start)?;
        // SAFETY: `raw` is the vma under construction of this mmap call.
        unsafe { install(&alloc, raw) }
    }

    fn ioctl(me: &GpuSimFile, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        let uptr = UserPtr::from_addr(arg);
        match cmd {
            IOC_ALLOC => me.ioctl_alloc(file, uptr),
            IOC_FREE => {
                let req: GpusimFree = UserSlice::new(uptr, size_of::<GpusimFree>())
                    .reader()
                    .read()?;
                state::free(me.id, req.handle)?;
                Ok(0)
            }
            IOC_INFO => {
                let (r, mut w) = UserSlice::new(uptr, size_of::<GpusimInfo>()).reader_writer();
                let mut req: GpusimInfo = { r }.read()?;
                let (va, size, chunk, pins) = state::info(me.id, req.handle)?;
                req.addr = va as u64;
                req.size = size as u64;
                req.chunk_bytes = chunk as u32;
                req.pins = pins as u32;
                w.write(&req)?;
                Ok(0)
            }
            _ => Err(ENOTTY),
        }
    }
}

impl GpuSimFile {
    fn ioctl_alloc(&self, file: &File, uptr: UserPtr) -> Result<isize> {
        let (r, mut w) = UserSlice::new(uptr, size_of::<GpusimAlloc>()).reader_writer();
        let mut req: GpusimAlloc = { r }.read()?;
        if let Err(e) = E_ALLOC.enter() {
            return Err(Error::from_errno(e));
        }
        if req.size == 0 || req.flags != 0 || req.addr % GPU_PAGE != 0 {
            return Err(EINVAL);
        }
        if req.size > MAX_ALLOC_BYTES.load(Relaxed) || req.size > isize::MAX as u64 {
            return Err(ENOMEM);
        }
        let size = req.size.next_multiple_of(GPU_PAGE) as usize;
        let (handle, chunk) = state::alloc(self.id, size)?;
        // SAFETY: `file` is this open file, referenced for the whole ioctl;
        // no gpusim lock is held.
        let va = match unsafe {
            glue::map_user(file.as_ptr(), req.addr as usize, size, handle as usize)
        } {
            Ok(va) => va,
            Err(e) => {
                let _ = state::free(self.id, handle);
                return Err(e);
            }
        };
        req.addr = va as u64;
        req.handle = handle;
        req.chunk_bytes = chunk as u32;
        if let Err(e) = w.write(&req) {
            // The caller cannot learn the handle: undo everything.
            let _ = state::free(self.id, handle);
            // SAFETY: Unmapping a range of the current process that this
            // ioctl just mapped; no gpusim lock is held.
            unsafe { bindings::vm_munmap(va as usize, size) };
            return Err(e);
        }
        Ok(0)
    }
}

/// Installs claimed allocation `alloc` into `raw`, the vma it was claimed
/// for.
///
/// # Safety
///
/// `raw` must be the vma under construction of the running mmap call.
unsafe fn install(alloc: &Arc<Alloc>, raw: *mut bindings::vm_area_struct) -> Result {
    let private = Arc::into_raw(alloc.clone()).cast_mut().cast::<c_void>();
    // SAFETY: `raw` is being mmap()ed (the caller's contract); `private`
    // holds a reference that the vma's close callback
    // (`gpusim_rs_vma_close`) releases.
    let r = unsafe {
        glue::vma_install(
            raw,
            private,
            &alloc.chunk_phys,
            alloc.chunk_bytes,
            alloc.size,
        )
    };
    match r {
        Ok(()) => {
            LIVE_VMAS.add(1, Relaxed);
            Ok(())
        }
        Err(e) => {
            // SAFETY: Installing failed, so the vma did not take the
            // reference: take it back.
            drop(unsafe { Arc::from_raw(private.cast::<Alloc>()) });
            state::mmap_unclaim(alloc, raw as usize);
            Err(e)
        }
    }
}

/// The file ids of `/dev/gpusim_mmap`'s files have this bit.
pub(crate) const MMAPDEV_FILE: u64 = 1 << 62;

/// `/dev/gpusim_mmap` was opened: its file id.
#[no_mangle]
extern "C" fn gpusim_rs_mmapdev_open() -> u64 {
    NEXT_FILE_ID.fetch_add(1, Relaxed) | MMAPDEV_FILE
}

/// A file of `/dev/gpusim_mmap` is being released: its memory is freed, as
/// `/dev/gpusim`'s.
#[no_mangle]
extern "C" fn gpusim_rs_mmapdev_release(id: u64) {
    state::release_file(id);
}

/// An mmap of `/dev/gpusim_mmap`: allocates the mapping's length of
/// emulated GPU memory (a multiple of 64 KiB, at offset 0, at the 64 KiB
/// aligned address the device's `get_unmapped_area` chose) and maps it, as
/// `GPUSIM_IOC_ALLOC` does. An allocation whose mapping failed stays, not
/// mapped, until the file is released.
///
/// # Safety
///
/// `vma` must be the vma under construction of the running mmap call of
/// the file `id` was given to.
#[no_mangle]
unsafe extern "C" fn gpusim_rs_mmapdev_mmap(id: u64, vma: *mut bindings::vm_area_struct) -> c_int {
    // SAFETY: `vma` is undergoing its initial setup for this whole call
    // (the caller's contract).
    let v = unsafe { VmaNew::from_raw(vma) };
    // SAFETY: As above: `vma` is valid.
    let pgoff = unsafe { (*vma).vm_pgoff };
    let (start, len) = (v.start(), v.end() - v.start());
    let r = (|| {
        if let Err(e) = E_ALLOC.enter() {
            return Err(Error::from_errno(e));
        }
        if pgoff != 0 || start as u64 % GPU_PAGE != 0 || len as u64 % GPU_PAGE != 0 {
            return Err(EINVAL);
        }
        if len as u64 > MAX_ALLOC_BYTES.load(Relaxed) {
            return Err(ENOMEM);
        }
        let (handle, _) = state::alloc(id, len)?;
        let alloc = state::mmap_claim(id, handle, vma as usize, start, len)?;
        // SAFETY: `vma` is the vma under construction (the caller's contract).
        unsafe { install(&alloc, vma) }
    })();
    match r {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// A vma of gpusim memory was duplicated (mremap's copy): it holds its own
/// reference on the allocation.
///
/// # Safety
///
/// `private` must be the `vm_private_data` of a gpusim vma.
#[no_mangle]
unsafe extern "C" fn gpusim_rs_vma_open(private: *mut c_void) {
    // SAFETY: `private` came from `Arc::into_raw` in `mmap` and is kept
    // alive by the vma being copied.
    let a = ManuallyDrop::new(unsafe { Arc::from_raw(private.cast::<Alloc>()) });
    let _ = Arc::into_raw(Arc::clone(&a));
    LIVE_VMAS.add(1, Relaxed);
}

/// A vma of gpusim memory is being removed (munmap, exit, the old vma of a
/// mremap): release its reference; detach the allocation if it was this
/// vma that mapped it.
///
/// # Safety
///
/// `private` must be the `vm_private_data` of the gpusim vma `vma`.
#[no_mangle]
unsafe extern "C" fn gpusim_rs_vma_close(private: *mut c_void, vma: *mut bindings::vm_area_struct) {
    // SAFETY: This vma owns one reference (taken in `mmap` or
    // `gpusim_rs_vma_open`), given back here exactly once.
    let a = unsafe { Arc::from_raw(private.cast::<Alloc>()) };
    state::vma_closed(&a, vma as usize);
    knobs::dec(&LIVE_VMAS, 1);
    drop(a);
}

/// mremap moved the mapping to `vma` at `start`.
///
/// # Safety
///
/// `private` must be the `vm_private_data` of the gpusim vma `vma`.
#[no_mangle]
unsafe extern "C" fn gpusim_rs_vma_moved(
    private: *mut c_void,
    vma: *mut bindings::vm_area_struct,
    start: usize,
) {
    // SAFETY: The vma holds a reference; we only borrow it.
    let a = ManuallyDrop::new(unsafe { Arc::from_raw(private.cast::<Alloc>()) });
    state::vma_moved(&a, vma as usize, start);
}
