// SPDX-License-Identifier: GPL-2.0

//! Declarations of the C helpers in `gpusim_glue.c` (same module), plus the
//! thin safe wrappers gpusim uses.

use kernel::bindings;
use kernel::ffi::{c_int, c_ulong, c_void};
use kernel::prelude::*;

// Only pointers to these kernel structures cross the boundary, never the
// structures themselves, so their bindgen shapes do not matter.
#[allow(improper_ctypes)]
extern "C" {
    fn gpusim_vma_install(
        vma: *mut bindings::vm_area_struct,
        private: *mut c_void,
        chunk_phys: *const u64,
        nchunks: usize,
        chunk_bytes: usize,
        size: usize,
    ) -> c_int;
    fn gpusim_map_user(
        file: *mut bindings::file,
        hint: c_ulong,
        size: c_ulong,
        pgoff: c_ulong,
    ) -> c_ulong;
    fn gpusim_max_chunk_bytes() -> usize;
    fn gpusim_chunk_alloc(bytes: usize, phys: *mut u64) -> *mut c_void;
    fn gpusim_chunk_free(virt: *mut c_void, bytes: usize);
    fn gpusim_phys_to_virt(phys: u64) -> *mut c_void;
    fn gpusim_pci_dma_peer_ok(pdev: *mut bindings::pci_dev) -> bool;
    fn gpusim_dma_map(pdev: *mut bindings::pci_dev, phys: u64, len: usize, dma: *mut u64) -> c_int;
    fn gpusim_dma_unmap(pdev: *mut bindings::pci_dev, dma: u64, len: usize);
    fn gpusim_mm_get_current() -> *mut bindings::mm_struct;
    fn gpusim_mm_put(mm: *mut bindings::mm_struct);
    fn gpusim_current_mm_id() -> usize;
    fn gpusim_current_tgid() -> c_int;
    fn gpusim_mmapdev_register() -> c_int;
    fn gpusim_mmapdev_deregister();
}

/// `/dev/gpusim_mmap` (`gpusim_glue.c`), registered while this lives.
///
/// # Invariants
///
/// The device is registered.
pub(crate) struct MmapDev(());

impl MmapDev {
    /// Registers the device.
    pub(crate) fn register() -> Result<Self> {
        // SAFETY: FFI call without preconditions; the device is static.
        kernel::error::to_result(unsafe { gpusim_mmapdev_register() })?;
        // INVARIANT: registered just now.
        Ok(Self(()))
    }
}

impl Drop for MmapDev {
    fn drop(&mut self) {
        // SAFETY: By the type invariant the device is registered.
        unsafe { gpusim_mmapdev_deregister() };
    }
}

/// The calling process as NVIDIA's driver identifies it (`current->tgid`).
pub(crate) fn current_tgid() -> c_int {
    // SAFETY: FFI call without preconditions.
    unsafe { gpusim_current_tgid() }
}

/// Identity of the calling task's address space; `EINVAL` for a kernel
/// thread. Read in C (see `gpusim_mm_get_current`).
pub(crate) fn current_mm_id() -> Result<usize> {
    // SAFETY: FFI call without preconditions.
    match unsafe { gpusim_current_mm_id() } {
        0 => Err(EINVAL),
        id => Ok(id),
    }
}

/// A reference (`mmgrab`) to the address space of the task that made it:
/// keeps its identity from being reused by another process.
///
/// # Invariants
///
/// `0` is an `mm_struct` this object holds an `mmgrab` reference to.
pub(crate) struct MmRef(core::ptr::NonNull<bindings::mm_struct>);

// SAFETY: an mm reference may be held and dropped from any thread.
unsafe impl Send for MmRef {}
// SAFETY: only the pointer value is read through `&self`.
unsafe impl Sync for MmRef {}

impl MmRef {
    /// The calling task's address space; `EINVAL` for a kernel thread.
    pub(crate) fn current() -> Result<Self> {
        // SAFETY: FFI call without preconditions.
        let mm = unsafe { gpusim_mm_get_current() };
        // INVARIANT: a non-NULL result carries the reference.
        core::ptr::NonNull::new(mm).map(Self).ok_or(EINVAL)
    }

    /// Its identity, comparable with [`current_mm_id`].
    pub(crate) fn id(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl Drop for MmRef {
    fn drop(&mut self) {
        // SAFETY: the reference this object holds (type invariant).
        unsafe { gpusim_mm_put(self.0.as_ptr()) };
    }
}

/// Converts a C `0 / -errno` return into a `Result`.
fn to_result(ret: c_int) -> Result {
    if ret == 0 {
        Ok(())
    } else {
        Err(Error::from_errno(ret))
    }
}

/// Largest physically contiguous chunk the page allocator can return.
pub(crate) fn max_chunk_bytes() -> usize {
    // SAFETY: Pure function of compile-time constants.
    unsafe { gpusim_max_chunk_bytes() }
}

/// A physically contiguous, zeroed piece of host RAM from the page
/// allocator.
///
/// # Invariants
///
/// `virt` was returned by `gpusim_chunk_alloc(bytes)` and not freed yet;
/// `phys` is its physical address.
pub(crate) struct Chunk {
    virt: *mut c_void,
    bytes: usize,
    pub(crate) phys: u64,
}

// SAFETY: A `Chunk` owns its pages; nothing about them is tied to a thread.
unsafe impl Send for Chunk {}
// SAFETY: `&Chunk` only exposes the immutable physical address.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// Allocates `bytes` (a multiple of 64 KiB, at most `max_chunk_bytes()`).
    pub(crate) fn alloc(bytes: usize) -> Result<Self> {
        let mut phys = 0u64;
        // SAFETY: `phys` is a valid out-pointer; the helper checks `bytes`.
        let virt = unsafe { gpusim_chunk_alloc(bytes, &mut phys) };
        if virt.is_null() {
            return Err(ENOMEM);
        }
        // INVARIANT: `virt` was just returned by `gpusim_chunk_alloc(bytes)`.
        Ok(Self { virt, bytes, phys })
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: By the type invariant `virt`/`bytes` came from
        // `gpusim_chunk_alloc` and are freed exactly once, here.
        unsafe { gpusim_chunk_free(self.virt, self.bytes) };
    }
}

/// Kernel virtual address of gpusim memory at host physical `phys`.
#[allow(dead_code)]
pub(crate) fn phys_to_virt(phys: u64) -> *mut c_void {
    // SAFETY: Address arithmetic only; gpusim memory is in the linear map.
    unsafe { gpusim_phys_to_virt(phys) }
}

/// Installs the chunks into a vma being mmap()ed.
///
/// # Safety
///
/// `vma` must be a vma under construction in an `f_op->mmap` call, and
/// `private` must stay valid until the vma's `close` callback consumes it.
pub(crate) unsafe fn vma_install(
    vma: *mut bindings::vm_area_struct,
    private: *mut c_void,
    chunk_phys: &[u64],
    chunk_bytes: usize,
    size: usize,
) -> Result {
    // SAFETY: Guaranteed by the caller; the slice is valid for its length.
    to_result(unsafe {
        gpusim_vma_install(
            vma,
            private,
            chunk_phys.as_ptr(),
            chunk_phys.len(),
            chunk_bytes,
            size,
        )
    })
}

/// Maps `size` bytes of `file` at page offset `pgoff` into the current
/// process (see `gpusim_map_user`). Returns the address.
///
/// # Safety
///
/// `file` must be a valid, referenced file; no gpusim lock may be held.
pub(crate) unsafe fn map_user(
    file: *mut bindings::file,
    hint: usize,
    size: usize,
    pgoff: usize,
) -> Result<usize> {
    // SAFETY: Guaranteed by the caller.
    let ret = unsafe { gpusim_map_user(file, hint as c_ulong, size as c_ulong, pgoff as c_ulong) };
    // IS_ERR_VALUE: the top 4095 values are negative errnos.
    if ret as usize >= (-4095isize) as usize {
        Err(Error::from_errno(ret as isize as c_int))
    } else {
        Ok(ret as usize)
    }
}

/// Whether `pdev` is a PCI device of this system with a DMA mask. Any
/// pointer value is fine (NULL, `to_pci_dev(NULL)`, a made-up one): the C
/// side compares it with the PCI bus's devices before dereferencing it.
pub(crate) fn pci_dma_peer_ok(pdev: *mut bindings::pci_dev) -> bool {
    // SAFETY: `gpusim_pci_dma_peer_ok` accepts any pointer value and only
    // dereferences one that is a device on the PCI bus, under a reference.
    unsafe { gpusim_pci_dma_peer_ok(pdev) }
}

/// Maps `len` bytes of RAM at `phys` for DMA by `pdev`.
///
/// # Safety
///
/// `pdev` must point to a live `struct pci_dev` with a DMA mask, and the
/// memory must stay allocated until [`dma_unmap`].
pub(crate) unsafe fn dma_map(pdev: *mut bindings::pci_dev, phys: u64, len: usize) -> Result<u64> {
    let mut dma = 0u64;
    // SAFETY: Guaranteed by the caller; `dma` is a valid out-pointer.
    to_result(unsafe { gpusim_dma_map(pdev, phys, len, &mut dma) })?;
    Ok(dma)
}

/// Undoes [`dma_map`].
///
/// # Safety
///
/// `dma`/`len` must come from a successful [`dma_map`] on the same `pdev`
/// that was not unmapped yet.
pub(crate) unsafe fn dma_unmap(pdev: *mut bindings::pci_dev, dma: u64, len: usize) {
    // SAFETY: Guaranteed by the caller.
    unsafe { gpusim_dma_unmap(pdev, dma, len) }
}
