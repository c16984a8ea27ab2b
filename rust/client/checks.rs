// SPDX-License-Identifier: GPL-2.0

//! Checks of what the GPU driver hands out, and the scatter-gather table
//! made from a checked DMA mapping (contiguous pages coalesced within the
//! DMA device's segment limits).

use super::range::{
    coalesce, count_segments, CoalesceError, GpuRange, SegmentLimits, GPU_PAGE_SIZE,
};
use crate::kapi::nvidia_p2p::{
    page_table_layout, version_compatible, FreeCallback, MappedTable, PageTable,
    DMA_MAPPING_VERSION, PAGE_SIZE_64KB, PAGE_TABLE_VERSION_V1, PAGE_TABLE_VERSION_V2,
};
use crate::kapi::scatterlist::SgTable;
use kernel::prelude::*;

/// Why a page table is not usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TableRefusal {
    /// Its version is not one peermem reads (see [`page_table_layout`]).
    Version(u32),
    /// Anything else, said in words.
    Other(&'static str),
}

/// Logs why the page table for `addr`+`len` was declined, on one line.
pub(super) fn report_refusal(why: TableRefusal, addr: u64, len: u64) {
    match why {
        TableRefusal::Version(v) => pr_err!(
            "the GPU driver's page table for {:#x}+{:#x} has version {:#010x}, which this peermem cannot read (it reads {:#010x} with later minors, drivers 550-575, and major {:#x}, drivers 580 and later); declining the range: update peermem to a release that supports this NVIDIA driver, or run a driver of those branches\n",
            addr,
            len,
            v,
            PAGE_TABLE_VERSION_V1,
            PAGE_TABLE_VERSION_V2 >> 16
        ),
        TableRefusal::Other(why) => pr_err!(
            "the GPU driver's page table for {:#x}+{:#x} is unusable: {}; declining the range (update peermem or the driver)\n",
            addr,
            len,
            why
        ),
    }
}

/// Whether peermem reads page tables of `version` (the page-table majors
/// 1, minor 2 on, and 2, any minor).
pub(super) fn check_table_version(version: u32) -> core::result::Result<(), TableRefusal> {
    match page_table_layout(version) {
        Some(_) => Ok(()),
        None => Err(TableRefusal::Version(version)),
    }
}

/// Why a page table is not usable for `range`.
pub(super) fn check_page_table<T: FreeCallback>(
    pt: &PageTable<T>,
    range: &GpuRange,
) -> core::result::Result<(), TableRefusal> {
    check_table_version(pt.version())?;
    check_table_shape(pt).map_err(TableRefusal::Other)?;
    if pt.entries() != range.page_count() {
        return Err(TableRefusal::Other(
            "its page count does not match the range",
        ));
    }
    Ok(())
}

fn check_table_shape<T: FreeCallback>(pt: &PageTable<T>) -> core::result::Result<(), &'static str> {
    if pt.page_size_type() != PAGE_SIZE_64KB {
        return Err("its pages are not 64 KiB");
    }
    if !pt.pages_present() {
        return Err("it lacks page entries");
    }
    Ok(())
}

pub(super) fn check_dma_mapping<T: FreeCallback>(
    m: &MappedTable<T>,
) -> core::result::Result<(), &'static str> {
    let pt = m.table();
    if !version_compatible(m.version(), DMA_MAPPING_VERSION) {
        return Err("its version is incompatible with the one peermem is built for");
    }
    if m.page_size_type() != pt.page_size_type() {
        return Err("its page size differs from the page table's");
    }
    if m.entries() != pt.entries() || m.addresses().count() != pt.entries() as usize {
        return Err("its address count differs from the page table's");
    }
    Ok(())
}

/// Segment limits for a PCI DMA device: its own (`dma_get_max_seg_size`,
/// `dma_get_seg_boundary`), as `ib_umem_get` honours them for host memory.
fn pci_limits(
    max_seg_size: u32,
    seg_boundary: u64,
) -> core::result::Result<SegmentLimits, CoalesceError> {
    SegmentLimits::new(GPU_PAGE_SIZE, max_seg_size, seg_boundary)
}

/// The entries for the DMA addresses of `m`: contiguous pages coalesced
/// within the device's segment limits.
pub(super) fn map_pci<T: FreeCallback>(
    m: &MappedTable<T>,
    max_seg_size: u32,
    seg_boundary: u64,
) -> Result<SgTable> {
    let limits = match pci_limits(max_seg_size, seg_boundary) {
        Ok(l) => l,
        Err(_) => {
            pr_err!(
                "the DMA device's segment limits (max {:#x} bytes, boundary mask {:#x}) cannot hold a 64 KiB GPU page; refusing the mapping\n",
                max_seg_size,
                seg_boundary
            );
            return Err(EINVAL);
        }
    };
    let n = count_segments(m.addresses(), &limits).map_err(|_| {
        pr_err!("the GPU driver's DMA addresses are not 64 KiB aligned; refusing the mapping\n");
        EINVAL
    })?;
    let mut sgt = SgTable::new(n as u32)?;
    let mut cur = sgt.cursor();
    for seg in coalesce(m.addresses(), limits) {
        cur.set_dma(seg.addr, seg.len)?;
    }
    Ok(sgt)
}

#[cfg(peermem_kunit)]
#[::kernel::macros::kunit_tests(peermem_client)]
mod tests {
    use super::super::stats::{STATS, STATS_NC};
    use super::super::Kind;
    use super::*;

    const P: u64 = GPU_PAGE_SIZE;

    /// Pages of an allocation made of `runs` physically contiguous runs of
    /// `run_pages` pages each, runs far apart (what gpusim's contiguity knob makes).
    fn alloc_pages(runs: u64, run_pages: u64) -> impl Iterator<Item = u64> + Clone {
        (0..runs * run_pages)
            .map(move |i| 0x1_0000_0000 * (1 + i / run_pages) + (i % run_pages) * P)
    }

    #[test]
    fn pci_entries_coalesce_contiguous_runs() -> Result {
        // A device with a large segment limit (mlx5: 2 GiB, 4 GiB boundary).
        let l = pci_limits(0x8000_0000, 0xffff_ffff)?;
        // 16 contiguous pages: one entry.
        assert_eq!(count_segments(alloc_pages(1, 16), &l), Ok(1));
        // 64 KiB contiguity: one entry per page, nothing to merge.
        assert_eq!(count_segments(alloc_pages(16, 1), &l), Ok(16));
        // 256 KiB runs (far apart, but each run below 4 GiB boundaries
        // of its own): 4 entries of 4 pages.
        assert_eq!(count_segments(alloc_pages(4, 4), &l), Ok(4));
        let mut n = 0;
        for s in coalesce(alloc_pages(4, 4), l) {
            assert_eq!(u64::from(s.len), 4 * P);
            assert_eq!(s.addr, 0x1_0000_0000 * (n + 1));
            n += 1;
        }
        assert_eq!(n, 4);
        Ok(())
    }

    #[test]
    fn pci_entry_length_fits_the_scatterlist() -> Result {
        // A device without limits (max segment u32::MAX, no boundary):
        // 65536 contiguous pages (4 GiB) need 2 entries of at most 4 GiB - 64 KiB.
        let l = pci_limits(u32::MAX, u64::MAX)?;
        assert_eq!(count_segments((0..65536u64).map(|i| i * P), &l), Ok(2));
        Ok(())
    }

    #[test]
    fn pci_entries_honour_the_device_limits() -> Result {
        // The PCI core's defaults (64 KiB segments, 4 GiB boundary): no merging.
        let l = pci_limits(0x10000, 0xffff_ffff)?;
        assert_eq!(count_segments(alloc_pages(1, 16), &l), Ok(16));
        // An RDMA adapter that raised its limit (mlx5: 2 GiB): one entry.
        let l = pci_limits(0x8000_0000, 0xffff_ffff)?;
        assert_eq!(count_segments(alloc_pages(1, 16), &l), Ok(1));
        // A run straddling the 4 GiB boundary splits there.
        let pages = (0..8u64).map(|i| 0xffff_0000 - 2 * P + i * P);
        assert_eq!(count_segments(pages, &l), Ok(2));
        // Limits below one GPU page cannot map it.
        assert!(pci_limits(0x8000, u64::MAX).is_err());
        Ok(())
    }

    #[test]
    fn p2p_versions_follow_nvidias_rule() {
        for want in [PAGE_TABLE_VERSION_V1, PAGE_TABLE_VERSION_V2] {
            assert!(version_compatible(want, want));
            // A newer minor is fine, an older one or another major is not.
            assert!(version_compatible(want + 1, want));
            assert!(!version_compatible(want + 0x1_0000, want));
            assert!(!version_compatible(want - 0x1_0000, want));
            assert!(!version_compatible(0, want));
        }
        assert!(!version_compatible(
            PAGE_TABLE_VERSION_V1 - 1,
            PAGE_TABLE_VERSION_V1
        ));
        // The two majors do not accept each other's tables.
        assert!(!version_compatible(
            PAGE_TABLE_VERSION_V2,
            PAGE_TABLE_VERSION_V1
        ));
        assert!(!version_compatible(
            PAGE_TABLE_VERSION_V1,
            PAGE_TABLE_VERSION_V2
        ));
        let dma = DMA_MAPPING_VERSION;
        assert!(version_compatible(dma, dma));
        assert!(!version_compatible(PAGE_TABLE_VERSION_V1, dma));
    }

    #[test]
    fn page_tables_of_both_majors_are_accepted() {
        // What the drivers hand out: 550-575 (v1.2), 580-595 (v2.0).
        assert_eq!(PAGE_TABLE_VERSION_V1, 0x0001_0002);
        assert_eq!(PAGE_TABLE_VERSION_V2, 0x0002_0000);
        for v in [
            0x0001_0002,
            0x0001_0003,
            0x0001_ffff,
            0x0002_0000,
            0x0002_0001,
            0x0002_ffff,
        ] {
            assert_eq!(check_table_version(v), Ok(()));
        }
        // An older v1 minor, majors 0 and 3 on: refused, naming the version seen.
        for v in [
            0x0001_0001,
            0x0001_0000,
            0,
            0x0000_0002,
            0x0003_0000,
            0xffff_0002,
        ] {
            assert_eq!(check_table_version(v), Err(TableRefusal::Version(v)));
        }
    }

    #[test]
    fn kinds_have_their_own_counters() {
        assert!(!core::ptr::eq(
            Kind::Invalidating.stats(),
            Kind::Persistent.stats()
        ));
        assert!(core::ptr::eq(Kind::Invalidating.stats(), &STATS));
        assert!(core::ptr::eq(Kind::Persistent.stats(), &STATS_NC));
    }
}
