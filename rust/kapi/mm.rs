// SPDX-License-Identifier: GPL-2.0

//! Address spaces as keys ([`MmRef`]) and a page shared read-only with user
//! space ([`SharedPage`]). Upstream counterparts: `kernel::mm::MmWithUser`
//! / `mmgrab` (6.14), `kernel::page::Page` (whose API differs between
//! 6.12 and 7.x); `rust/miscdev.c` wraps the static inline `mmgrab`,
//! `mmdrop` and `virt_to_page` and the macros of `current_uid`.

use super::{c_ulong, raw};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use kernel::error::{code, Result};

/// A counted reference to an address space's `mm_struct` (`mmgrab`: it
/// keeps the struct, not the address space). While it lives no other
/// address space can have the same `mm_struct`, so two `MmRef`s are the
/// same address space exactly when their [`MmRef::key`]s are equal.
///
/// # Invariants
///
/// `mm` holds a reference from `mmgrab`, dropped only by `drop`.
pub(crate) struct MmRef {
    mm: NonNull<kernel::bindings::mm_struct>,
}

// SAFETY: the reference may be dropped from any thread (mmdrop).
unsafe impl Send for MmRef {}
// SAFETY: `&MmRef` only compares pointers.
unsafe impl Sync for MmRef {}

impl MmRef {
    /// The caller's address space; `None` in a kernel thread.
    pub(crate) fn current() -> Option<Self> {
        let mm = current_user_mm()?;
        // SAFETY: the caller's own mm, live while it runs.
        unsafe { raw::peermem_mmgrab(mm.as_ptr()) };
        // INVARIANT: a reference from `mmgrab`.
        Some(Self { mm })
    }

    /// A key for the address space: two live `MmRef`s have the same key
    /// exactly when they are the same address space (the `mm_struct`'s
    /// address, which no other address space can have while this
    /// reference lives). Only a key: nothing is reached through it.
    pub(crate) fn key(&self) -> usize {
        self.mm.as_ptr() as usize
    }

    /// Whether the caller runs in this address space.
    pub(crate) fn is_current(&self) -> bool {
        current_user_mm() == Some(self.mm)
    }
}

impl Drop for MmRef {
    fn drop(&mut self) {
        // SAFETY: our reference (type invariant), dropped once.
        unsafe { raw::peermem_mmdrop(self.mm.as_ptr()) };
    }
}

/// The caller's own user address space: `None` in a kernel thread (which
/// may have borrowed one that is not its own) or a task without one. Valid
/// while the caller runs.
pub(crate) fn current_user_mm() -> Option<NonNull<kernel::bindings::mm_struct>> {
    // SAFETY: FFI calls without preconditions (they read the caller's own
    // task; C reads `current`, whose Rust layout cannot be trusted).
    let (kthread, mm) = unsafe { (raw::peermem_current_kthread(), raw::peermem_current_mm()) };
    NonNull::new(mm).filter(|_| !kthread)
}

/// The caller's address space as a key (its `mm_struct`'s address; 0 in
/// a kernel thread), as [`MmRef::key`] gives it. Unique among the address
/// spaces alive, or kept alive by an `mmgrab` (an [`MmRef`], a started
/// [`super::mmu_notifier::AddressWatch`]), at the time of the call.
pub(crate) fn current_key() -> usize {
    current_user_mm().map_or(0, |mm| mm.as_ptr() as usize)
}

/// The caller's real user id, as the initial user namespace sees it (the
/// overflow uid if it has no mapping there): a key for per-user limits.
pub(crate) fn current_uid() -> u32 {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_current_uid() }
}

/// A zeroed kernel page that user space may map read-only
/// ([`super::miscdev::Vma::map_page_read_only`]); the kernel writes it
/// with atomic stores. Mappings hold their own reference to the page, so
/// dropping this (our reference) while it is mapped is fine.
///
/// # Invariants
///
/// `addr` is the kernel address of a page from `get_zeroed_page`,
/// freed only by `drop`; written only through the atomic stores below.
pub(crate) struct SharedPage {
    addr: NonNull<u8>,
}

// SAFETY: the page is written only with atomics; any thread may free it.
unsafe impl Send for SharedPage {}
// SAFETY: as above.
unsafe impl Sync for SharedPage {}

/// Bytes in a [`SharedPage`].
pub(crate) const SHARED_PAGE_SIZE: usize = 4096;

impl SharedPage {
    /// A zeroed page, charged to the caller's memory cgroup; `ENOMEM` if none.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: FFI call without preconditions.
        let addr = unsafe { raw::peermem_get_zeroed_page(kernel::bindings::GFP_KERNEL_ACCOUNT) };
        // INVARIANT: from `get_zeroed_page`.
        NonNull::new(addr as *mut u8)
            .map(|addr| Self { addr })
            .ok_or(code::ENOMEM)
    }

    /// The page's kernel address (for the C glue).
    pub(crate) fn as_ptr(&self) -> *mut super::c_void {
        self.addr.as_ptr().cast()
    }

    /// Stores `v` at byte `offset` (a multiple of 8 inside the page) with
    /// release ordering: what this CPU wrote before is visible to a reader
    /// whose acquire load sees `v`.
    pub(crate) fn store_u64_release(&self, offset: usize, v: u64) {
        assert!(offset % 8 == 0 && offset + 8 <= SHARED_PAGE_SIZE);
        // SAFETY: inside the live page (type invariant, checked above),
        // 8-byte aligned (the page is page-aligned); every access to the
        // page is atomic (type invariant; user space only reads).
        let a = unsafe { AtomicU64::from_ptr(self.addr.as_ptr().add(offset).cast::<u64>()) };
        a.store(v, Ordering::Release);
    }

    /// Stores `v` at byte `offset` (a multiple of 4 inside the page).
    pub(crate) fn store_u32(&self, offset: usize, v: u32) {
        assert!(offset % 4 == 0 && offset + 4 <= SHARED_PAGE_SIZE);
        // SAFETY: as in `store_u64_release`, 4-byte aligned.
        let a = unsafe { AtomicU32::from_ptr(self.addr.as_ptr().add(offset).cast::<u32>()) };
        a.store(v, Ordering::Release);
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: ours (type invariant), freed once; mappings keep theirs.
        unsafe { kernel::bindings::free_pages(self.addr.as_ptr() as c_ulong, 0) };
    }
}
