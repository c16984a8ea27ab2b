// SPDX-License-Identifier: GPL-2.0

//! PFN-mapped user memory: the calling process's mappings under its mmap
//! lock and the PFNs behind them (`follow_pfnmap_start/end`, 6.12+), and
//! what the kernel says a PFN is (the zero page, outside the memory map,
//! `ZONE_DEVICE`, reserved or managed RAM). Upstream counterpart:
//! `kernel::mm::MmWithUser` and `VmaRef` (6.14; no PFN walk); exported
//! functions are called directly, static inline ones and macros through
//! the C glue (`rust/pfnmap_glue.c`), which also holds the `pfnmap` and
//! `pfnmap_ram_only` parameters.
//!
//! Nothing here keeps the memory alive: PFN-mapped memory has no page
//! references to take. Whoever uses a PFN watches the range
//! ([`super::mmu_notifier::AddressWatch`]) and stops using it when the
//! range changes.

use super::{c_ulong, raw};
use core::marker::PhantomData;
use core::ptr::NonNull;
use kernel::error::{code, Result};

/// Whether the `pfnmap` module parameter is on.
pub(crate) fn param_enabled() -> bool {
    // SAFETY: a `bool` the module loader sets before init and nothing
    // writes afterwards (a read-only parameter).
    unsafe { core::ptr::addr_of!(raw::peermem_pfnmap_on).read() }
}

/// Whether the `pfnmap_ram_only` module parameter is on.
pub(crate) fn param_ram_only() -> bool {
    // SAFETY: as in `param_enabled`.
    unsafe { core::ptr::addr_of!(raw::peermem_pfnmap_ram_only).read() }
}

/// The CPU page size (`PAGE_SIZE`).
pub(crate) const PAGE_SIZE: u64 = kernel::page::PAGE_SIZE as u64;

/// What a page is by its struct page alone (no lookup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageKind {
    /// The shared zero page (`is_zero_pfn`).
    Zero,
    /// Outside the memory map (`!pfn_valid`): no struct page.
    NoMemmap,
    /// `ZONE_DEVICE`: memory a driver published (P2PDMA, DAX).
    Device,
    /// In the memory map, `PageReserved`: RAM the kernel does not manage,
    /// or a hole in the memory map.
    Reserved,
    /// RAM the page allocator manages.
    Managed,
}

impl PageKind {
    /// What the page at `pfn` is.
    pub(crate) fn of(pfn: usize) -> Self {
        // SAFETY: FFI call without preconditions (any PFN).
        if unsafe { raw::peermem_is_zero_pfn(pfn as c_ulong) } {
            return Self::Zero;
        }
        // SAFETY: as above; a struct page of the memory map, or NULL.
        let Some(page) = NonNull::new(unsafe { raw::peermem_pfn_page(pfn as c_ulong) }) else {
            return Self::NoMemmap;
        };
        // SAFETY: a struct page of the memory map, which is never freed
        // (its flags may change, which the caller's watch covers).
        if unsafe { raw::peermem_page_zone_device(page.as_ptr()) } {
            return Self::Device;
        }
        // SAFETY: as above.
        if unsafe { raw::peermem_page_reserved(page.as_ptr()) } {
            Self::Reserved
        } else {
            Self::Managed
        }
    }
}

/// The physical address of page frame `pfn` (`PFN_PHYS`).
pub(crate) fn pfn_phys(pfn: usize) -> u64 {
    (pfn as u64) << kernel::page::PAGE_SHIFT
}

/// The calling process's address space, read-locked (`mmap_read_lock`).
///
/// # Invariants
///
/// `mm` is the `mm_struct` of the task that made this (alive while the
/// task runs), read-locked by it until `drop`; it never leaves that task
/// (`!Send`).
pub(crate) struct MmReadGuard {
    mm: NonNull<kernel::bindings::mm_struct>,
    _not_send: PhantomData<*mut ()>,
}

impl MmReadGuard {
    /// Read-locks the caller's address space: `EINVAL` in a kernel thread
    /// or a task without one, `EINTR` if a fatal signal came while it
    /// waited for the lock.
    pub(crate) fn lock_current() -> Result<Self> {
        let mm = super::mm::current_user_mm().ok_or(code::EINVAL)?;
        // SAFETY: the caller's own mm, alive while it runs.
        if unsafe { raw::peermem_mmap_read_lock_killable(mm.as_ptr()) } != 0 {
            return Err(code::EINTR);
        }
        // INVARIANT: the caller's mm, locked above.
        Ok(Self {
            mm,
            _not_send: PhantomData,
        })
    }

    /// The mapping holding `addr`, if any (`vma_lookup`).
    pub(crate) fn vma(&self, addr: u64) -> Option<Vma<'_>> {
        let end = addr.checked_add(1)?;
        // SAFETY: our mm, read-locked (type invariant).
        let vma = unsafe {
            raw::find_vma_intersection(self.mm.as_ptr(), addr as c_ulong, end as c_ulong)
        };
        // INVARIANT: a mapping of the locked mm, valid while the lock,
        // borrowed by the result, is held.
        NonNull::new(vma).map(|vma| Vma {
            vma,
            _lock: PhantomData,
        })
    }
}

impl Drop for MmReadGuard {
    fn drop(&mut self) {
        // SAFETY: locked by us (type invariant), unlocked once.
        unsafe { raw::peermem_mmap_read_unlock(self.mm.as_ptr()) };
    }
}

/// A mapping of the calling process, valid while its mmap lock is held.
///
/// # Invariants
///
/// `vma` is a live `vm_area_struct` of the mm [`MmReadGuard`] `'a` holds
/// read-locked.
pub(crate) struct Vma<'a> {
    vma: NonNull<kernel::bindings::vm_area_struct>,
    _lock: PhantomData<&'a MmReadGuard>,
}

impl Vma<'_> {
    fn flags(&self) -> u64 {
        // SAFETY: a live mapping (type invariant).
        unsafe { raw::peermem_vma_flags(self.vma.as_ptr()) as u64 }
    }

    fn has(&self, flag: raw::peermem_pfn_const) -> bool {
        self.flags() & u64::from(flag) != 0
    }

    /// Whether it maps PFNs without struct pages behind them (`VM_PFNMAP`).
    pub(crate) fn is_pfnmap(&self) -> bool {
        self.has(raw::peermem_pfn_const_PEERMEM_VM_PFNMAP)
    }

    /// Whether it is copy on write (`is_cow_mapping`: private and may be
    /// written), so it may get anonymous copies of its pages.
    pub(crate) fn is_cow(&self) -> bool {
        self.has(raw::peermem_pfn_const_PEERMEM_VM_MAYWRITE)
            && !self.has(raw::peermem_pfn_const_PEERMEM_VM_SHARED)
    }

    /// Whether it is mapped writable (`VM_WRITE`).
    pub(crate) fn is_writable(&self) -> bool {
        self.has(raw::peermem_pfn_const_PEERMEM_VM_WRITE)
    }

    /// The first address past it.
    pub(crate) fn end(&self) -> u64 {
        // SAFETY: a live mapping (type invariant).
        unsafe { raw::peermem_vma_end(self.vma.as_ptr()) as u64 }
    }

    /// The PFN mapped at `addr` and whether its page-table entry is
    /// writable (`follow_pfnmap_start/end`); `None` if nothing is mapped
    /// there (or `addr` is not in this mapping, or it is no PFN map).
    pub(crate) fn follow_pfn(&self, addr: u64) -> Option<(usize, bool)> {
        // SAFETY: plain data; all zeroes is a valid (input) value.
        let mut args: raw::follow_pfnmap_args = unsafe { core::mem::zeroed() };
        args.vma = self.vma.as_ptr();
        args.address = addr as c_ulong;
        // SAFETY: a live mapping whose mmap lock is held (type invariant);
        // `args` is a local.
        if unsafe { raw::follow_pfnmap_start(&mut args) } != 0 {
            return None;
        }
        let found = (args.pfn as usize, args.writable);
        // SAFETY: after a successful `follow_pfnmap_start` on `args`.
        unsafe { raw::follow_pfnmap_end(&mut args) };
        Some(found)
    }
}
