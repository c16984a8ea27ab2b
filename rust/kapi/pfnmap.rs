// SPDX-License-Identifier: GPL-2.0

//! PFN-mapped user memory: reading the PFNs behind a range of the calling
//! process (`follow_pfnmap_start/end` under the mmap lock, 6.12+) and
//! mapping them for a device's DMA (`dma_map_resource`, or a PCI BAR's bus
//! addresses when `pci_p2pdma_distance` says the device reaches it through
//! a switch). Upstream counterpart: none (C's `follow_pfnmap_*`,
//! `dma_map_resource`, `pci_p2pdma_*`); the C glue is `rust/pfnmap_glue.c`.
//!
//! Nothing here keeps the memory alive: PFN-mapped memory has no page
//! references to take. Whoever uses [`PfnRuns`] watches the range
//! ([`super::mmu_notifier::AddressWatch`]) and stops using it when the
//! range changes.

use super::device::PciDev;
use super::{raw, result_of};
use core::mem::ManuallyDrop;
use core::ptr::NonNull;
use kernel::error::{code, Error};

/// Whether the `pfnmap` module parameter is on.
pub(crate) fn param_enabled() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_pfnmap() }
}

/// The CPU page size (`PAGE_SIZE`).
pub(crate) const PAGE_SIZE: u64 = kernel::page::PAGE_SIZE as u64;

/// Why a range is not served (the C glue's `enum peermem_pfn_refusal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// An address with no mapping.
    NoMapping,
    /// A mapping that is not `VM_PFNMAP` (ordinary memory, which the core
    /// pins itself, or a mixed map).
    NotPfnmap,
    /// A copy-on-write mapping (private and writable).
    CopyOnWrite,
    /// No page-table entry yet (a driver that maps on fault).
    NotPresent,
    /// RAM the page allocator manages (not reserved): whoever mapped it may
    /// free it to the allocator; peermem cannot tell.
    ManagedRam,
    /// Device memory that is no PCI device's memory BAR (other MMIO, a
    /// firmware hole): not served, see docs/module.md.
    NotRam,
    /// The shared zero page.
    ZeroPage,
    /// A PCI BAR, and the `pfnmap_ram_only` parameter is on.
    BarRamOnly,
    /// RAM and a BAR, or two BARs, in one range.
    Mixed,
}

impl Refusal {
    fn from_raw(why: u32) -> Self {
        match why {
            raw::peermem_pfn_refusal_PEERMEM_PFN_NO_VMA => Self::NoMapping,
            raw::peermem_pfn_refusal_PEERMEM_PFN_NOT_PFNMAP => Self::NotPfnmap,
            raw::peermem_pfn_refusal_PEERMEM_PFN_PRIVATE => Self::CopyOnWrite,
            raw::peermem_pfn_refusal_PEERMEM_PFN_NOT_PRESENT => Self::NotPresent,
            raw::peermem_pfn_refusal_PEERMEM_PFN_MANAGED_RAM => Self::ManagedRam,
            raw::peermem_pfn_refusal_PEERMEM_PFN_ZERO_PAGE => Self::ZeroPage,
            raw::peermem_pfn_refusal_PEERMEM_PFN_BAR_RAM_ONLY => Self::BarRamOnly,
            raw::peermem_pfn_refusal_PEERMEM_PFN_MIXED => Self::Mixed,
            _ => Self::NotRam,
        }
    }

    /// What to tell the user (a kernel-log line).
    pub(crate) fn message(self) -> &'static core::ffi::CStr {
        match self {
            Self::NoMapping => c"pfnmap: an address of the range is not mapped; not served",
            Self::NotPfnmap => c"pfnmap: the range is not entirely a VM_PFNMAP mapping; not served",
            Self::CopyOnWrite => c"pfnmap: the PFN mapping is private and writable (copy on write); not served: map it MAP_SHARED",
            Self::NotPresent => c"pfnmap: a page of the PFN mapping is not mapped yet (the driver maps on fault); not served: touch every page first",
            Self::ManagedRam => c"pfnmap: the PFN mapping maps RAM the page allocator manages (not reserved), which its driver may free behind the mapping; not served",
            Self::NotRam => c"pfnmap: the PFN mapping maps device memory that is no PCI device's memory BAR, which peermem does not serve (docs/module.md, PFN-mapped memory); not served",
            Self::ZeroPage => c"pfnmap: the PFN mapping maps the shared zero page; not served",
            Self::BarRamOnly => c"pfnmap: the PFN mapping maps a PCI BAR and pfnmap_ram_only=Y; not served: load peermem with pfnmap_ram_only=N to serve BARs the RDMA device reaches peer-to-peer",
            Self::Mixed => c"pfnmap: the range maps RAM and a PCI BAR, or two BARs; not served: register each part on its own",
        }
    }
}

/// What [`PfnRuns::resolve`] found when it did not resolve the range.
pub(crate) enum Unresolved {
    /// Not memory this source serves: why, and the first address refused.
    Refused(Refusal, u64),
    /// An error (`EINVAL`, `ENOMEM`, `EINTR`).
    Failed(Error),
}

/// One run of physically contiguous memory (page aligned).
pub(crate) type Run = raw::peermem_pfn_run;

/// What one [`PfnRuns::resolve`] did (pages read, lookups in the firmware's
/// resource map, stopped for a fatal signal or over the run limit), and
/// its test knob (`delay_ms`: sleep that long every
/// `PEERMEM_PFN_WALK_BATCH` pages, 16 MiB).
pub(crate) type Walk = raw::peermem_pfn_walk;

/// The most runs one range may have (an array of 4 MiB; docs/module.md,
/// "PFN-mapped memory", Limits).
pub(crate) const MAX_RUNS: u32 = raw::PEERMEM_PFN_MAX_RUNS;

/// A [`Walk`] with the delay knob at `delay_ms` and nothing done yet.
pub(crate) fn new_walk(delay_ms: u32) -> Walk {
    Walk {
        delay_ms,
        probe: false,
        pages: 0,
        lookups: 0,
        killed: false,
        over_limit: false,
    }
}

/// The PCI device and memory BAR a range's runs lie in.
///
/// # Invariants
///
/// `dev` holds a reference on a `struct pci_dev` (taken by
/// `peermem_pfn_resolve`), given back on drop; `index` is one of its BARs.
struct Bar {
    dev: NonNull<kernel::bindings::pci_dev>,
    index: i32,
}

impl Drop for Bar {
    fn drop(&mut self) {
        // SAFETY: the reference is ours (type invariant), given back once.
        unsafe { raw::peermem_pfn_put_dev(self.dev.as_ptr()) };
    }
}

/// The physical runs behind a user range, in address order.
///
/// # Invariants
///
/// `ptr` points to `n > 0` runs allocated by `peermem_pfn_resolve`, freed
/// on drop; they are RAM (`bar` is `None`) or all in `bar`.
pub(crate) struct PfnRuns {
    ptr: NonNull<Run>,
    n: u32,
    writable: bool,
    bar: Option<Bar>,
}

// SAFETY: plain memory owned by this object, and a device reference,
// which may be given back from any thread.
unsafe impl Send for PfnRuns {}
// SAFETY: only read through `&self`.
unsafe impl Sync for PfnRuns {}

impl PfnRuns {
    /// Reads the PFNs of `[start, start + len)` (page aligned) of the
    /// calling process under its mmap lock: the whole range must be
    /// `VM_PFNMAP` mappings that are not copy-on-write, of RAM the kernel
    /// does not manage or (unless `pfnmap_ram_only`) of one PCI device's
    /// memory BAR. What it returns is valid only as long as nothing
    /// invalidated the range since (the caller's watch says).
    /// `walk` gets what the walk did.
    pub(crate) fn resolve(
        start: u64,
        len: u64,
        walk: &mut Walk,
    ) -> core::result::Result<Self, Unresolved> {
        let mut runs: *mut Run = core::ptr::null_mut();
        let mut dev: *mut kernel::bindings::pci_dev = core::ptr::null_mut();
        let (mut n, mut writable, mut why, mut at, mut index) = (0u32, false, 0u32, 0u64, 0i32);
        // SAFETY: every out-pointer is a local or `walk`.
        let ret = unsafe {
            raw::peermem_pfn_resolve(
                start,
                len,
                walk,
                &mut runs,
                &mut n,
                &mut writable,
                &mut why,
                &mut at,
                &mut dev,
                &mut index,
            )
        };
        // INVARIANT: a device from `peermem_pfn_resolve` comes with a
        // reference, owned from here on (dropped on every path below).
        let bar = NonNull::new(dev).map(|dev| Bar { dev, index });
        result_of(ret).map_err(Unresolved::Failed)?;
        if why != 0 {
            return Err(Unresolved::Refused(Refusal::from_raw(why), at));
        }
        match NonNull::new(runs) {
            // INVARIANT: from `peermem_pfn_resolve`, `n` runs, all in `bar`
            // if there is one.
            Some(ptr) if n > 0 => Ok(Self {
                ptr,
                n,
                writable,
                bar,
            }),
            _ => Err(Unresolved::Failed(code::EINVAL)),
        }
    }

    /// The checks of [`PfnRuns::resolve`] on every mapping of the range,
    /// but on its first page only (cheap whatever the range's length):
    /// `Ok` if the range looks like this source's memory.
    pub(crate) fn probe(start: u64, len: u64) -> core::result::Result<(), Unresolved> {
        let mut walk = new_walk(0);
        walk.probe = true;
        Self::resolve(start, len, &mut walk).map(drop)
    }

    /// Whether the runs are a PCI device's BAR (not RAM).
    pub(crate) fn is_bar(&self) -> bool {
        self.bar.is_some()
    }

    /// The runs.
    pub(crate) fn runs(&self) -> &[Run] {
        // SAFETY: `n` initialised runs at `ptr`, alive while `self` is.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.n as usize) }
    }

    /// Whether every page is mapped writable (mapping and page-table entry).
    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// Bytes in all runs.
    pub(crate) fn bytes(&self) -> u64 {
        self.runs().iter().map(|r| r.len).sum()
    }

    /// Maps every run for `dev`'s DMA (device writes allowed if
    /// `device_writes`): RAM with `dma_map_resource`; a BAR only if `dev`
    /// reaches it peer-to-peer (else `EOPNOTSUPP`), by bus address through
    /// a switch or with `dma_map_resource` through a host bridge. On
    /// failure the runs come back.
    pub(crate) fn dma_map(
        self,
        dev: &PciDev,
        device_writes: bool,
    ) -> core::result::Result<PfnMapping, (Self, Error)> {
        let mut dma: *mut u64 = core::ptr::null_mut();
        let mut how = 0u32;
        let (bar_dev, bar) = match &self.bar {
            Some(b) => (b.dev.as_ptr(), b.index),
            None => (core::ptr::null_mut(), 0),
        };
        // SAFETY: `dev` is a live PCI device (its invariant); the runs are
        // valid and `bar_dev` is NULL or referenced (type invariants);
        // `dma` and `how` are locals.
        let ret = unsafe {
            raw::peermem_pfn_dma_map(
                dev.as_raw(),
                self.ptr.as_ptr(),
                self.n,
                device_writes,
                bar_dev,
                bar,
                &mut dma,
                &mut how,
            )
        };
        if let Err(e) = result_of(ret) {
            return Err((self, e));
        }
        let Some(dma) = NonNull::new(dma) else {
            return Err((self, code::EINVAL));
        };
        // INVARIANT: every run mapped for `dev` as `how` says, addresses
        // at `dma`.
        Ok(PfnMapping {
            runs: ManuallyDrop::new(self),
            dma,
            dev: dev.clone_handle(),
            device_writes,
            how,
        })
    }
}

impl Drop for PfnRuns {
    fn drop(&mut self) {
        // SAFETY: from `peermem_pfn_resolve` (type invariant), freed once.
        // `bar`, dropped after this, gives the device back.
        unsafe { raw::peermem_pfn_free(self.ptr.as_ptr().cast()) };
    }
}

/// [`PfnRuns`] mapped for a device's DMA; unmapped on drop.
///
/// # Invariants
///
/// Each run of `runs` is mapped for `dev` as `how` says (`dma_map_resource`,
/// or a BAR's bus address, which holds nothing) at the bus address at the
/// same index of the array `dma` (from `peermem_pfn_dma_map`), until
/// `unmap` or `drop`, which also free the runs once.
pub(crate) struct PfnMapping {
    runs: ManuallyDrop<PfnRuns>,
    dma: NonNull<u64>,
    dev: PciDev,
    device_writes: bool,
    how: u32,
}

// SAFETY: plain memory and a device handle, usable from any thread.
unsafe impl Send for PfnMapping {}
// SAFETY: only read through `&self`.
unsafe impl Sync for PfnMapping {}

impl PfnMapping {
    /// The bus address and length of every run, in order.
    pub(crate) fn extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let runs = self.runs.runs();
        // SAFETY: one address per run (type invariant), alive with `self`.
        let dma = unsafe { core::slice::from_raw_parts(self.dma.as_ptr(), runs.len()) };
        runs.iter().zip(dma.iter()).map(|(r, &d)| (d, r.len))
    }

    /// Whether the device reaches the memory by the BAR's bus addresses
    /// (through a PCIe switch, not through the IOMMU).
    pub(crate) fn by_bus_addr(&self) -> bool {
        self.how == raw::peermem_p2p_how_PEERMEM_P2P_BUS_ADDR
    }

    /// Whether the memory is a PCI device's BAR.
    pub(crate) fn is_bar(&self) -> bool {
        self.runs.is_bar()
    }

    /// Unmaps every run and frees the address array (once: `unmap` and
    /// `drop` each call it on a mapping that is not used afterwards).
    fn unmap_dma(&mut self) {
        // SAFETY: the runs were mapped for `dev` at `dma` with these
        // arguments (type invariant), and are not unmapped yet.
        unsafe {
            raw::peermem_pfn_dma_unmap(
                self.dev.as_raw(),
                self.runs.ptr.as_ptr(),
                self.runs.n,
                self.device_writes,
                self.how,
                self.dma.as_ptr(),
            )
        };
    }

    /// Undoes the mapping; the runs come back.
    pub(crate) fn unmap(self) -> PfnRuns {
        let mut this = ManuallyDrop::new(self);
        this.unmap_dma();
        // SAFETY: `this` is never used or dropped again, so the runs are
        // taken out once.
        unsafe { ManuallyDrop::take(&mut this.runs) }
    }
}

impl Drop for PfnMapping {
    fn drop(&mut self) {
        self.unmap_dma();
        // SAFETY: dropped once, here; `self` is not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.runs) };
    }
}
