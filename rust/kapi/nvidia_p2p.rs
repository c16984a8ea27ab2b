// SPDX-License-Identifier: GPL-2.0

//! The NVIDIA P2P interface (`nvidia_p2p_*`, `include/nv_p2p_abi.h`): GPU
//! pages pinned as a page table, that table mapped for a PCI device, and
//! the free callback the driver calls when the GPU memory is freed under a
//! non-persistent pin. Upstream counterpart: none (NVIDIA's `nv-p2p.h`).
//!
//! Ownership follows the driver's rules: a [`PageTable`] is valid until it
//! is put back or its free callback returned. Its owner reads it only where
//! the callback cannot run (under the lock the callback takes), turns it
//! into a [`PendingPut`] (which reads nothing) before giving it back, and
//! gives it to the driver in the callback. A table mapped for a device is a
//! [`MappedTable`]: the mapping and its table in one value, so an unmap
//! always gets the right table.
//!
//! A non-persistent pin can be given back only by the process that made
//! it: NVIDIA's driver looks such a table up among the pins of the calling
//! process (`RmP2PPutPages` → `RmP2PGetInfoWithoutToken`, by
//! `current->tgid`), and from anywhere else `nvidia_p2p_put_pages` returns
//! 0 and unpins nothing (nv-p2p.c `nv_p2p_put_pages` turns the lookup's
//! `NV_ERR_OBJECT_NOT_FOUND` into success). So [`PageTable::begin_put`]
//! refuses to begin such a put anywhere else: the table stays its owner's,
//! with its free callback's reference, until the pinning process puts it
//! or the driver calls the callback (the memory is freed, or the pinning
//! process's GPU objects go at its exit).

use super::cbref::{self, CallbackRef};
use super::device::PciDev;
use super::task::ThreadGroup;
use super::{c_void, raw, result_of};
use core::ptr::{self, NonNull};
use kernel::error::{code, Error, Result};
use kernel::sync::Arc;
use kernel::{pr_err, pr_warn};

/// GPU page size of the interface (`NVIDIA_P2P_PAGE_SIZE_64KB`).
pub(crate) const PAGE_SIZE_64KB: u32 = raw::nvidia_p2p_page_size_type_NVIDIA_P2P_PAGE_SIZE_64KB;
/// The oldest page-table version of the v1 layout peermem reads (drivers 550-575).
pub(crate) const PAGE_TABLE_VERSION_V1: u32 = raw::NVIDIA_P2P_PAGE_TABLE_VERSION_V1;
/// The oldest page-table version of the v2 layout peermem reads (drivers from 580 on).
pub(crate) const PAGE_TABLE_VERSION_V2: u32 = raw::NVIDIA_P2P_PAGE_TABLE_VERSION_V2;
/// The `flags` bit of a v2 table saying its pages are CPU-cacheable
/// (coherent) GPU memory.
pub(crate) const PAGE_TABLE_FLAGS_CPU_CACHEABLE: u32 =
    raw::NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE;
/// The DMA-mapping version this module is built against.
pub(crate) const DMA_MAPPING_VERSION: u32 = raw::NVIDIA_P2P_DMA_MAPPING_VERSION;

/// Whether a structure of version `have` is usable by code built against
/// `want` (`NVIDIA_P2P_VERSION_COMPATIBLE`): same major, minor at least ours.
pub(crate) fn version_compatible(have: u32, want: u32) -> bool {
    let major = |v: u32| (v & raw::NVIDIA_P2P_MAJOR_VERSION_MASK) >> 16;
    let minor = |v: u32| v & raw::NVIDIA_P2P_MINOR_VERSION_MASK;
    major(have) == major(want) && minor(have) >= minor(want)
}

/// A page-table layout peermem reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Major 1, minor at least 2 (drivers 550-575): no `flags`.
    V1,
    /// Major 2 (drivers from 580 on): the v1 fields, then `flags`.
    V2,
}

/// The layout of a page table of version `version`, or `None` if peermem
/// does not know it (another major, or a major-1 minor below 2). NVIDIA's
/// rule ([`version_compatible`]) against each version peermem reads.
pub(crate) fn page_table_layout(version: u32) -> Option<Layout> {
    if version_compatible(version, PAGE_TABLE_VERSION_V2) {
        Some(Layout::V2)
    } else if version_compatible(version, PAGE_TABLE_VERSION_V1) {
        Some(Layout::V1)
    } else {
        None
    }
}

/// The v2 page table (`nv_p2p_abi.h`, `PEERMEM_NV_P2P_PAGE_TABLE_MAJOR`
/// 2): the v1 table (which has no tail padding) followed by `flags`.
#[repr(C)]
struct PageTableV2 {
    v1: raw::nvidia_p2p_page_table,
    flags: u32,
}

// The header's numbers, which tests/host/abi checks against NVIDIA's 580+ layout.
const _: () = assert!(
    core::mem::offset_of!(PageTableV2, flags)
        == raw::NVIDIA_P2P_PAGE_TABLE_V2_FLAGS_OFFSET as usize
);
const _: () =
    assert!(core::mem::size_of::<PageTableV2>() == raw::NVIDIA_P2P_PAGE_TABLE_V2_SIZE as usize);

/// The `flags` of the page table at `ptr`: `None` unless its version says
/// it has the v2 layout. A v1 table ends where `flags` would be, so it is
/// read only after the version.
///
/// # Safety
///
/// `ptr` points to a page table the driver handed out and has not freed.
unsafe fn table_flags(ptr: NonNull<raw::nvidia_p2p_page_table>) -> Option<u32> {
    // SAFETY: a live table (the caller's guarantee); `version` is at
    // offset 0 in every layout.
    let version = unsafe { ptr.as_ref() }.version;
    match page_table_layout(version)? {
        Layout::V1 => None,
        Layout::V2 => {
            let v2 = ptr.cast::<PageTableV2>();
            // SAFETY: the driver allocates a table of major 2 with the v2
            // layout (NVIDIA_P2P_PAGE_TABLE_V2_SIZE bytes, `flags` at
            // NVIDIA_P2P_PAGE_TABLE_V2_FLAGS_OFFSET, as NVIDIA's nv-p2p.h from
            // 580.65.06 on declares; checked by tests/host/abi), so `flags`
            // is inside the live allocation; its offset is a multiple of 4
            // in a table aligned for pointers.
            Some(unsafe { ptr::addr_of!((*v2.as_ptr()).flags).read() })
        }
    }
}

/// What the GPU driver's free callback of a non-persistent pin calls.
pub(crate) trait FreeCallback: Send + Sync + Sized + 'static {
    /// The memory behind the pin `this` was given for is being freed;
    /// `this` is the callback's reference. The page table (and a mapping of
    /// it) is valid until this returns, and the driver's afterwards.
    fn freed(this: Arc<Self>);

    /// A free callback came after the put of its page table took the
    /// callback's reference (the driver answered a put while the callback
    /// was pending): there is nothing of the pin's left to act on.
    fn freed_after_put();
}

/// The free callback given to `nvidia_p2p_get_pages`: `data` is the id of
/// the callback's reference in the registry (see [`cbref`]). It takes the
/// reference out first; if it is gone, a put took it.
///
/// # Safety
///
/// Called by the GPU driver with the `data` of a pin made by [`get_pages`]
/// for a `T`. Any value is safe in practice: it is only looked up.
unsafe extern "C" fn free_callback<T: FreeCallback>(data: *mut c_void) {
    // SAFETY: the ids `get_pages::<T>` hands out as `data` name entries of
    // `Arc<T>` references; a made-up id finds no entry.
    match unsafe { cbref::take::<T>(data as usize as u64) } {
        Some(this) => T::freed(this),
        None => T::freed_after_put(),
    }
}

/// A page table pinned with `nvidia_p2p_get_pages*`, whose free callback
/// (if not persistent) holds a reference to a `T`.
///
/// # Invariants
///
/// `ptr` is a page table the driver handed out for `[va, va + len)` and
/// did not free: it stays valid until it is put back or, for a
/// non-persistent one, until its free callback returns; the owner makes
/// sure neither happened while it holds the `PageTable` (it makes a
/// [`PendingPut`] first, or gives the table to the driver in the
/// callback). `callback` names the free callback's reference (`None` for a
/// persistent pin). `pinner` is the process that called the driver's pin.
pub(crate) struct PageTable<T: FreeCallback> {
    ptr: NonNull<raw::nvidia_p2p_page_table>,
    va: u64,
    callback: Option<CallbackRef<T>>,
    pinner: ThreadGroup,
}

// SAFETY: the page table is the driver's object, usable from any thread;
// `callback` is an id.
unsafe impl<T: FreeCallback> Send for PageTable<T> {}

/// Pins `[va, va + len)` (64 KiB aligned) of the calling process, which is
/// then the only one that can give a non-persistent pin back.
///
/// With `callback`, a non-persistent pin whose free callback gets that
/// reference (through the registry; if the pin fails, it is dropped);
/// without, a persistent pin (`nvidia_p2p_get_pages_persistent`).
pub(crate) fn get_pages<T: FreeCallback>(
    va: u64,
    len: u64,
    callback: Option<Arc<T>>,
) -> Result<PageTable<T>> {
    let mut pt: *mut raw::nvidia_p2p_page_table = ptr::null_mut();
    let (ret, callback) = match callback {
        Some(obj) => {
            let cref = CallbackRef::insert(obj)?;
            // SAFETY: `pt` is a valid out pointer; `free_callback::<T>`
            // stays valid until the callback ran or the pages were put (its
            // entry keeps a `T` alive, and module unload waits for those:
            // `object_count`); `data` is an id, never dereferenced.
            let ret = unsafe {
                raw::nvidia_p2p_get_pages(
                    0,
                    0,
                    va,
                    len,
                    &mut pt,
                    Some(free_callback::<T>),
                    cref.id() as usize as *mut c_void,
                )
            };
            (ret, Some(cref))
        }
        None => {
            // SAFETY: `pt` is a valid out pointer.
            let ret = unsafe { raw::nvidia_p2p_get_pages_persistent(va, len, &mut pt, 0) };
            (ret, None)
        }
    };
    // The pin failed: the driver never calls the callback, its reference is ours again.
    let back = |e: Error| {
        drop(callback.as_ref().and_then(CallbackRef::take));
        e
    };
    if let Err(e) = result_of(ret) {
        return Err(back(e));
    }
    match NonNull::new(pt) {
        // INVARIANT: the driver handed out `pt` for this range.
        Some(ptr) => Ok(PageTable {
            ptr,
            va,
            callback,
            pinner: ThreadGroup::current(),
        }),
        None => {
            pr_err!("nvidia_p2p_get_pages returned success but no page table; the GPU driver is broken\n");
            // No page table to put back or to call a callback for.
            Err(back(code::EIO))
        }
    }
}

impl<T: FreeCallback> PageTable<T> {
    fn table(&self) -> &raw::nvidia_p2p_page_table {
        // SAFETY: valid while `self` exists (type invariant).
        unsafe { self.ptr.as_ref() }
    }

    /// The structure's version.
    pub(crate) fn version(&self) -> u32 {
        self.table().version
    }

    /// The page size, an `nvidia_p2p_page_size_type` value.
    pub(crate) fn page_size_type(&self) -> u32 {
        self.table().page_size
    }

    /// The table's `flags` (`NVIDIA_P2P_PAGE_TABLE_FLAGS_*`) if its version
    /// has them (v2, drivers from 580 on); `None` for a v1 table or an
    /// unknown version.
    pub(crate) fn flags(&self) -> Option<u32> {
        // SAFETY: valid while `self` exists (type invariant).
        unsafe { table_flags(self.ptr) }
    }

    /// Number of pages.
    pub(crate) fn entries(&self) -> u32 {
        self.table().entries
    }

    /// Whether every page pointer is there.
    pub(crate) fn pages_present(&self) -> bool {
        let t = self.table();
        if t.pages.is_null() {
            return false;
        }
        (0..t.entries as usize).all(|i| {
            // SAFETY: `pages` has `entries` elements (the driver's promise).
            !unsafe { *t.pages.add(i) }.is_null()
        })
    }

    /// Whether this pin is persistent (no free callback).
    pub(crate) fn is_persistent(&self) -> bool {
        self.callback.is_none()
    }

    /// The process that made the pin.
    pub(crate) fn pinner(&self) -> ThreadGroup {
        self.pinner
    }

    /// Whether the caller can give this pin back: any caller for a
    /// persistent pin (the driver finds it through the table itself), only
    /// the pinning process for one with a free callback (see the module
    /// documentation).
    pub(crate) fn puttable_here(&self) -> bool {
        self.is_persistent() || self.pinner.is_current()
    }

    /// Starts giving the table back: what is left is only its address, the
    /// driver's key for `nvidia_p2p_put_pages*`. From then on the free
    /// callback may run and the driver free the table; nothing reads it.
    /// `Err(self)` where the driver would ignore the put
    /// ([`PageTable::puttable_here`]): the table stays the caller's.
    pub(crate) fn begin_put(self) -> core::result::Result<PendingPut<T>, Self> {
        if !self.puttable_here() {
            return Err(self);
        }
        let mut this = core::mem::ManuallyDrop::new(self);
        Ok(PendingPut {
            ptr: this.ptr,
            va: this.va,
            callback: this.callback.take(),
        })
    }

    /// Maps the table for DMA by `pdev` (`nvidia_p2p_dma_map_pages`). On
    /// failure the table comes back with the error.
    pub(crate) fn dma_map(
        self,
        pdev: &PciDev,
    ) -> core::result::Result<MappedTable<T>, (Self, Error)> {
        let mut m: *mut raw::nvidia_p2p_dma_mapping = ptr::null_mut();
        // SAFETY: `pdev` is live, `self` is a live page table (type
        // invariants), `m` a valid out pointer.
        let ret = unsafe {
            raw::nvidia_p2p_dma_map_pages(pdev.as_raw().cast(), self.ptr.as_ptr(), &mut m)
        };
        if let Err(e) = result_of(ret) {
            return Err((self, e));
        }
        match NonNull::new(m) {
            // INVARIANT: just mapped for `pdev`.
            Some(ptr) => Ok(MappedTable {
                mapping: DmaMapping {
                    ptr,
                    pdev: pdev.clone_handle(),
                },
                table: self,
            }),
            None => Err((self, code::EIO)),
        }
    }

    /// From inside its free callback: the page table is the driver's from
    /// now on (it frees it when the callback returns); not touched again.
    pub(crate) fn give_to_driver(self) {
        core::mem::forget(self);
    }
}

impl<T: FreeCallback> Drop for PageTable<T> {
    fn drop(&mut self) {
        // Every owner gives the table back explicitly; reaching this is a
        // bug of the owner that leaks a pin.
        pr_err!("BUG: a pinned page table at {:#x} was dropped without being put back; its GPU memory stays pinned\n", self.va);
    }
}

/// A page table being given back ([`PageTable::begin_put`]): its address
/// and range, which the driver's put looks up, and nothing that reads it.
///
/// # Invariants
///
/// `ptr` was a page table the driver handed out for `va`, not put yet; it
/// may have been freed since (its free callback ran), so it is never
/// dereferenced. `callback` as in [`PageTable`].
pub(crate) struct PendingPut<T: FreeCallback> {
    ptr: NonNull<raw::nvidia_p2p_page_table>,
    va: u64,
    callback: Option<CallbackRef<T>>,
}

// SAFETY: an address and an id.
unsafe impl<T: FreeCallback> Send for PendingPut<T> {}

impl<T: FreeCallback> PendingPut<T> {
    /// Whether this pin is persistent (no free callback).
    pub(crate) fn is_persistent(&self) -> bool {
        self.callback.is_none()
    }

    /// Unpins the pages (`nvidia_p2p_put_pages*`). The page table is gone
    /// afterwards whatever the result; the name of the callback's reference
    /// (`None`: persistent) comes back for the caller to decide about (see
    /// [`CallbackRef::take`]).
    pub(crate) fn put(self) -> (Result, Option<CallbackRef<T>>) {
        let mut this = core::mem::ManuallyDrop::new(self);
        let callback = this.callback.take();
        let ret = if callback.is_none() {
            // SAFETY: a persistent pin of this range, not put before (type
            // invariant); a persistent table has no free callback, and the
            // driver only looks the address up.
            unsafe { raw::nvidia_p2p_put_pages_persistent(this.va, this.ptr.as_ptr(), 0) }
        } else {
            // SAFETY: a pin of this range, not put before, put by the
            // process that made it (`begin_put` checked it, and a
            // `PendingPut` is used at once, in the same call chain). The
            // driver looks the address up among the calling process's live
            // tables without reading it: if the free callback ran (or
            // runs), it finds none and returns 0 (550) or an error, and
            // frees nothing twice.
            unsafe { raw::nvidia_p2p_put_pages(0, 0, this.va, this.ptr.as_ptr()) }
        };
        (result_of(ret), callback)
    }
}

impl<T: FreeCallback> Drop for PendingPut<T> {
    fn drop(&mut self) {
        // `put` consumes it; reaching this is a bug of the owner that leaks a pin.
        pr_err!("BUG: a page table at {:#x} being put back was dropped instead; its GPU memory stays pinned\n", self.va);
    }
}

/// A DMA mapping of a page table for a PCI device.
///
/// # Invariants
///
/// `ptr` is a mapping the driver made of its [`MappedTable`]'s page table
/// for `pdev`, not unmapped or given back; valid while that table is.
struct DmaMapping {
    ptr: NonNull<raw::nvidia_p2p_dma_mapping>,
    pdev: PciDev,
}

impl DmaMapping {
    fn mapping(&self) -> &raw::nvidia_p2p_dma_mapping {
        // SAFETY: valid (type invariant).
        unsafe { self.ptr.as_ref() }
    }
}

/// A page table and its DMA mapping for one PCI device
/// ([`PageTable::dma_map`]).
///
/// # Invariants
///
/// `mapping` maps `table`. Fields drop in declaration order: the mapping
/// (which reports a leak) before the table.
pub(crate) struct MappedTable<T: FreeCallback> {
    mapping: DmaMapping,
    table: PageTable<T>,
}

// SAFETY: the driver's objects, usable from any thread; see `PageTable`.
unsafe impl<T: FreeCallback> Send for MappedTable<T> {}

impl<T: FreeCallback> MappedTable<T> {
    /// The mapped page table.
    pub(crate) fn table(&self) -> &PageTable<T> {
        &self.table
    }

    /// The mapping structure's version.
    pub(crate) fn version(&self) -> u32 {
        self.mapping.mapping().version
    }

    /// The mapping's page size, an `nvidia_p2p_page_size_type` value.
    pub(crate) fn page_size_type(&self) -> u32 {
        self.mapping.mapping().page_size_type
    }

    /// Number of DMA addresses.
    pub(crate) fn entries(&self) -> u32 {
        self.mapping.mapping().entries
    }

    /// The DMA address of each page, in order (none if the array is missing).
    pub(crate) fn addresses(&self) -> impl Iterator<Item = u64> + '_ {
        let m = self.mapping.mapping();
        let n = if m.dma_addresses.is_null() {
            0
        } else {
            m.entries as usize
        };
        (0..n).map(move |i| {
            // SAFETY: `dma_addresses` has `entries` elements (the driver's promise).
            unsafe { *m.dma_addresses.add(i) }
        })
    }

    /// Unmaps (`nvidia_p2p_dma_unmap_pages`); the table stays pinned and
    /// comes back, with the driver's answer.
    pub(crate) fn unmap(self) -> (PageTable<T>, Result) {
        let MappedTable { mapping, table } = self;
        let mapping = core::mem::ManuallyDrop::new(mapping);
        // SAFETY: a live mapping of the live `table` for `pdev` (type invariants).
        let ret = unsafe {
            raw::nvidia_p2p_dma_unmap_pages(
                mapping.pdev.as_raw().cast(),
                table.ptr.as_ptr(),
                mapping.ptr.as_ptr(),
            )
        };
        (table, result_of(ret))
    }

    /// Gives the mapping and the table to the driver, which frees both
    /// when the free callback returns (`nvidia_p2p_free_dma_mapping`).
    ///
    /// # Safety
    ///
    /// Called from the free callback of this page table, before it returns.
    pub(crate) unsafe fn give_to_driver(self) {
        let MappedTable { mapping, table } = self;
        let mapping = core::mem::ManuallyDrop::new(mapping);
        // SAFETY: a live mapping, inside its page table's free callback
        // (the caller's guarantee).
        let ret = unsafe { raw::nvidia_p2p_free_dma_mapping(mapping.ptr.as_ptr()) };
        if ret != 0 {
            pr_warn!("nvidia_p2p_free_dma_mapping failed ({}) in the free callback; the GPU driver frees the mapping with its page table anyway\n", ret);
        }
        table.give_to_driver();
    }
}

impl Drop for DmaMapping {
    fn drop(&mut self) {
        pr_err!("BUG: a DMA mapping was dropped without being unmapped\n");
    }
}

#[cfg(peermem_kunit)]
#[::kernel::macros::kunit_tests(peermem_kapi_nvidia_p2p)]
mod tests {
    use super::*;
    use kernel::alloc::{flags::GFP_KERNEL, KBox};

    fn v1_table(version: u32) -> raw::nvidia_p2p_page_table {
        raw::nvidia_p2p_page_table {
            version,
            page_size: PAGE_SIZE_64KB,
            pages: ptr::null_mut(),
            entries: 0,
            gpu_uuid: ptr::null_mut(),
        }
    }

    #[test]
    fn layouts_by_version() {
        assert_eq!(page_table_layout(0x0001_0002), Some(Layout::V1));
        assert_eq!(page_table_layout(0x0001_0003), Some(Layout::V1));
        assert_eq!(page_table_layout(0x0001_0001), None);
        assert_eq!(page_table_layout(0x0002_0000), Some(Layout::V2));
        assert_eq!(page_table_layout(0x0002_0007), Some(Layout::V2));
        assert_eq!(page_table_layout(0x0003_0000), None);
        assert_eq!(page_table_layout(0), None);
    }

    #[test]
    fn flags_are_read_from_v2_tables_only() -> Result {
        // Each table in an allocation of exactly its layout's size (as the
        // driver makes them): reading `flags` of a v1 table would read past
        // its 32 bytes, which KASAN reports.
        let v1 = KBox::new(v1_table(PAGE_TABLE_VERSION_V1), GFP_KERNEL)?;
        assert_eq!(core::mem::size_of_val(&*v1), 32);
        // SAFETY: a live table.
        assert_eq!(unsafe { table_flags(NonNull::from(&*v1)) }, None);
        for flags in [0, PAGE_TABLE_FLAGS_CPU_CACHEABLE, 0x8000_0001] {
            let v2 = KBox::new(
                PageTableV2 {
                    v1: v1_table(PAGE_TABLE_VERSION_V2),
                    flags,
                },
                GFP_KERNEL,
            )?;
            let p = NonNull::from(&*v2).cast::<raw::nvidia_p2p_page_table>();
            // SAFETY: a live table.
            assert_eq!(unsafe { table_flags(p) }, Some(flags));
        }
        // An unknown major: nothing past the version is read.
        let v3 = KBox::new(v1_table(0x0003_0000), GFP_KERNEL)?;
        // SAFETY: a live table.
        assert_eq!(unsafe { table_flags(NonNull::from(&*v3)) }, None);
        Ok(())
    }
}
