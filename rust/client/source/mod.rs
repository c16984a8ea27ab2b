// SPDX-License-Identifier: GPL-2.0

//! Page sources: where a registration's memory comes from, and what
//! differs between them. The registration's state machine
//! (`super::registration`) holds a source's pages in its phase and moves
//! them through this interface; the sources know nothing of the
//! registration (they are generic over the owner `T` of a page table's
//! free callback) and take none of its locks.
//!
//! - [`gpu`]: GPU memory, pinned through `nvidia_p2p_get_pages*` (a page
//!   table, with a free callback and, for `nv_mem`, a keeper pin).
//! - [`pfn`]: PFN-mapped memory the kernel does not manage, resolved to
//!   physical runs by a walk of the range ([`pfnwalk`]); nothing is held.
//!
//! [`Source`] names a registration's source (its counters, its page size);
//! [`Pages`] are the pages a registration holds, [`Mapped`] those pages
//! mapped for the DMA device. Each has one `impl` whose arms delegate to
//! the two modules. What only the GPU source has (the free callback, the
//! keeper, the watch pin) is the state machine's own business: it matches
//! [`Pages::Gpu`] there and calls [`gpu`]'s helpers.

pub(super) mod gpu;
pub(super) mod pfn;
pub(super) mod pfnwalk;

use super::stats::{Stats, STATS_PFN};
use super::Kind;
use crate::kapi::device::PciDev;
use crate::kapi::nvidia_p2p::{FreeCallback, MappedTable, PageTable};
use crate::kapi::scatterlist::SgTable;
use kernel::prelude::*;
use pfnwalk::{PfnMapping, PfnRuns};

/// Where a registration's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// GPU memory, pinned through `nvidia_p2p_get_pages*` ([`gpu`]).
    Gpu,
    /// PFN-mapped RAM the kernel does not manage, or a PCI BAR ([`pfn`]):
    /// no reference held; its blocking address watch revokes it.
    Pfn,
}

impl Source {
    /// The counters of a registration of this source claimed by `kind`:
    /// the client's for GPU memory, the PFN source's own for PFN-mapped
    /// memory.
    pub(super) fn stats(self, kind: Kind) -> &'static Stats {
        match self {
            Source::Gpu => kind.stats(),
            Source::Pfn => &STATS_PFN,
        }
    }

    /// `get_page_size`.
    pub(super) fn page_size(self) -> u64 {
        match self {
            Source::Gpu => gpu::PAGE_SIZE,
            Source::Pfn => pfn::PAGE_SIZE,
        }
    }
}

/// The memory a registration holds (its `Pinned` phase).
pub(super) enum Pages<T: FreeCallback> {
    /// A pinned GPU page table.
    Gpu(PageTable<T>),
    /// The physical runs of a PFN-mapped range (nothing to give back).
    Pfn(PfnRuns),
}

/// The memory a registration holds, mapped for the DMA device (its
/// `Mapped` phase).
pub(super) enum Mapped<T: FreeCallback> {
    /// A GPU page table and its DMA mapping.
    Gpu(MappedTable<T>),
    /// A PFN range's runs and their DMA mapping.
    Pfn(PfnMapping),
}

/// What giving pages back ([`Pages::give_back`]) leaves to do.
pub(super) enum GiveBack<T: FreeCallback> {
    /// A GPU page table: the caller puts it back, outside its lock
    /// (`nvidia_p2p_put_pages*` takes the GPU driver's lock, under which
    /// the driver calls free callbacks), deciding about the callback's
    /// reference.
    Put(PageTable<T>),
    /// Nothing was held (PFN source): only counted, by
    /// [`pfn::Released::count`].
    Nothing(pfn::Released),
}

/// A mapping made by [`Pages::dma_map`]: the core's table, what it maps,
/// and the number of pages (entries before coalescing).
pub(super) type MapResult<T> = core::result::Result<(SgTable, Mapped<T>, u32), (Pages<T>, Error)>;

impl<T: FreeCallback> Pages<T> {
    /// `get_pages`: may a umem that is read-only (`read_only`: the device
    /// only reads) or writable use these pages? `EACCES` for a writable
    /// umem on a read-only PFN mapping; GPU memory is always writable.
    pub(super) fn check_access(&self, read_only: bool) -> Result {
        match self {
            Pages::Gpu(_) => Ok(()),
            Pages::Pfn(runs) => pfn::check_access(runs, read_only),
        }
    }

    /// `dma_map`: maps the pages for `pdev` (outside the registration
    /// lock) and fills the core's table within the device's segment
    /// limits. On failure the pages come back unmapped, with the error
    /// (logged here).
    pub(super) fn dma_map(
        self,
        pdev: &PciDev,
        max_seg_size: u32,
        seg_boundary: u64,
        read_only: bool,
    ) -> MapResult<T> {
        match self {
            Pages::Gpu(pt) => gpu::dma_map(pt, pdev, max_seg_size, seg_boundary)
                .map(|(sgt, m)| {
                    let n = m.table().entries();
                    (sgt, Mapped::Gpu(m), n)
                })
                .map_err(|(pt, e)| (Pages::Gpu(pt), e)),
            Pages::Pfn(runs) => pfn::dma_map(runs, pdev, max_seg_size, seg_boundary, !read_only)
                .map(|(sgt, m, n)| (sgt, Mapped::Pfn(m), n))
                .map_err(|(runs, e)| (Pages::Pfn(runs), e)),
        }
    }

    /// `put_pages`/`release`: what giving these pages back takes.
    pub(super) fn give_back(self) -> GiveBack<T> {
        match self {
            Pages::Gpu(pt) => GiveBack::Put(pt),
            Pages::Pfn(runs) => GiveBack::Nothing(pfn::Released::of(&runs)),
        }
    }
}

impl<T: FreeCallback> Mapped<T> {
    /// Undoes the mapping (under the registration lock: neither source's
    /// unmap takes a lock of the GPU driver); the pages stay held.
    pub(super) fn unmap(self, stats: &Stats) -> Pages<T> {
        match self {
            Mapped::Gpu(m) => Pages::Gpu(gpu::unmap(stats, m)),
            Mapped::Pfn(m) => {
                stats.dma_unmaps.inc();
                Pages::Pfn(m.unmap())
            }
        }
    }
}
