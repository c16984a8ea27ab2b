// SPDX-License-Identifier: GPL-2.0

//! The PFN-map page source: memory registrations on PFN-mapped memory
//! (a driver's `mmap` through `remap_pfn_range`, `VM_PFNMAP`) that is RAM
//! the kernel does not manage (reserved at boot) or a PCI device's memory
//! BAR the RDMA device reaches peer-to-peer, served by the
//! invalidating client `nv_mem` when the GPU source declined the range and
//! the `pfnmap` parameter is on. See docs/module.md, "PFN-mapped memory".
//!
//! A PFN registration is a [`Registration`] like a GPU one (same phases,
//! same address watch, same revocation through the core), with
//! [`Source::Pfn`]: its "pin" is the list of physical runs read under the
//! mmap lock, and nothing is given back at `put_pages`. `acquire` (under
//! the core's global client lock) only looks at the range's mappings and
//! first page; `get_pages` (under the umem's own lock) walks every page
//! ([`resolve`]). No reference on
//! the memory is held, so the registration must never outlive what the
//! address maps: its watch is a *blocking* one
//! ([`AddressWatch::set_blocking`]), started before the PFNs are read and
//! checked after (`mmu_interval_read_begin`/`retry`); any invalidation of
//! the range (munmap, mremap, `MAP_FIXED`, the driver's
//! `unmap_mapping_range`, mprotect, process exit; not the soft-dirty reset,
//! which changes nothing there) revokes the registration through the core
//! before the kernel goes on changing the mapping.

use super::range::{coalesce_extents, GpuRange, SegmentLimits};
use super::registration::{self, install_pfn, Source};
use super::stats::{Stats, STATS_PFN, STATS_PFN_BAR, STATS_PFN_WALK};
use super::{Kind, Registration};
use crate::kapi::device::PciDev;
use crate::kapi::mmu_notifier::AddressWatch;
use crate::kapi::pfnmap::{self, PfnMapping, PfnRuns, Refusal, Unresolved};
use crate::kapi::print::warn_ratelimited;
use crate::kapi::scatterlist::SgTable;
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;

/// Set once a PFN range was declined because there is no address watch.
static NO_WATCH_REPORTED: AtomicBool = AtomicBool::new(false);

/// `acquire` for a range the GPU source declined: claims it if it is
/// PFN-mapped RAM the kernel does not manage, or one PCI device's memory
/// BAR, and the source is enabled.
pub(super) fn acquire(kind: Kind, range: GpuRange) -> Option<Arc<Registration>> {
    // Only the invalidating client can revoke; only it serves this source.
    if kind != Kind::Invalidating || !pfnmap::param_enabled() {
        return None;
    }
    let stats = &STATS_PFN;
    let (start, end) = span(&range);
    let watch = match AddressWatch::new() {
        Ok(Some(w)) => w,
        Ok(None) => {
            if !NO_WATCH_REPORTED.swap(true, Ordering::Relaxed) {
                pr_warn!("pfnmap=Y but no address watch (mmu_notifier=N, or a kernel caller): PFN-mapped memory is not served without one (reported once)\n");
            }
            return None;
        }
        Err(_) => {
            stats.errors.inc();
            warn_ratelimited(c"out of memory in acquire (PFN-map source); the range is not served");
            return None;
        }
    };
    watch.set_blocking();
    let Ok(reg) = registration::new(kind, Source::Pfn, range, Some(watch)) else {
        stats.errors.inc();
        warn_ratelimited(c"out of memory in acquire (PFN-map source); the range is not served");
        return None;
    };
    let w = reg.watch()?;
    // Armed before the page tables are read.
    // SAFETY: every path that gives up a reference to `reg` stops the watch
    // first: the decline paths below, and `release` (registration.rs)
    // before the core's reference goes.
    if let Err(e) = unsafe { w.start(reg.as_arc_borrow(), start, end - start) } {
        stats.errors.inc();
        stats.registrations_declined.inc();
        pr_err!(
            "cannot watch {:#x}+{:#x} for address-space changes (error {}); PFN-mapped memory is not served without a watch\n",
            start,
            end - start,
            e.to_errno()
        );
        return None;
    }
    // Only a look at the range here: `acquire` runs under the core's global
    // client lock, so the walk of every page waits for `get_pages`, which
    // runs under this umem's own lock (issue 21, finding 3).
    match PfnRuns::probe(start, end - start) {
        Ok(()) => {}
        Err(Unresolved::Refused(why, _at)) => {
            reg.stop_watch();
            stats.registrations_declined.inc();
            report_refusal(why);
            return None;
        }
        Err(Unresolved::Failed(e)) => {
            reg.stop_watch();
            stats.registrations_declined.inc();
            if e != EINTR {
                stats.errors.inc();
                pr_warn!(
                    "reading the PFNs of {:#x}+{:#x} failed ({}); the range is not served\n",
                    start,
                    end - start,
                    e.to_errno()
                );
            }
            return None;
        }
    }
    stats.registrations_acquired.inc();
    Some(reg)
}

/// The page-aligned span `[start, end)` of `range`.
fn span(range: &GpuRange) -> (u64, u64) {
    let ps = pfnmap::PAGE_SIZE;
    // No overflow: `GpuRange` guarantees that the 64 KiB-aligned end fits.
    (range.addr() & !(ps - 1), (range.end() + ps - 1) & !(ps - 1))
}

// The message of a range over the limit names it.
const _: () = assert!(pfnmap::MAX_RUNS == 262_144);

/// `get_pages` of a PFN registration `acquire` claimed: walks the range
/// (every page's PFN, classified per physical run; yields between pages,
/// stops for a fatal signal, at most [`pfnmap::MAX_RUNS`] runs) and
/// stores the runs in `reg`, unless the range changed meanwhile. Runs
/// under the umem's own lock, not the core's global one. `EFAULT`: not
/// served (logged, counted declined) or changed meanwhile (retry);
/// `ENOMEM` (also: too many runs, logged); `EINTR` (fatal signal).
pub(super) fn resolve(reg: &Registration, range: &GpuRange) -> Result {
    let stats = &STATS_PFN;
    let walk_stats = &STATS_PFN_WALK;
    let (start, end) = span(range);
    let Some(w) = reg.watch() else {
        return Err(EFAULT);
    };
    let Some(seq) = w.read_begin() else {
        return Err(EFAULT);
    };
    let mut walk = pfnmap::new_walk(super::inject::DELAY_PFN_WALK_MS.ms());
    walk_stats.walks_started.inc();
    let resolved = PfnRuns::resolve(start, end - start, &mut walk);
    walk_stats.walk_pages.add(walk.pages);
    walk_stats.walk_resource_lookups.add(walk.lookups);
    walk_stats.walks_ended.inc();
    let runs = match resolved {
        Ok(runs) => runs,
        Err(Unresolved::Refused(why, _at)) => {
            stats.registrations_declined.inc();
            report_refusal(why);
            return Err(EFAULT);
        }
        Err(Unresolved::Failed(e)) => {
            if walk.killed {
                walk_stats.walks_killed.inc();
            } else if walk.over_limit {
                walk_stats.walks_over_limit.inc();
                stats.errors.inc();
                warn_ratelimited(c"pfnmap: the range has more than 262144 physically contiguous pieces (its run list would pass 4 MiB); the registration fails with ENOMEM: register it in smaller parts, or map the memory in larger contiguous pieces");
            } else if e != EINTR {
                stats.errors.inc();
                pr_warn!(
                    "reading the PFNs of {:#x}+{:#x} failed ({}); the registration fails\n",
                    start,
                    end - start,
                    e.to_errno()
                );
            }
            return Err(e);
        }
    };
    let bytes = runs.bytes();
    if !install_pfn(reg, runs, || w.read_retry(seq)) {
        // The range changed while it was read: what was read may be stale.
        warn_ratelimited(c"a PFN-mapped range changed while it was being registered; the registration fails with EFAULT (retry it)");
        return Err(EFAULT);
    }
    let ps = pfnmap::PAGE_SIZE;
    stats.page_tables_pinned.inc();
    stats.pages_pinned.add(bytes / ps);
    stats.bytes_pinned.add(bytes);
    Ok(())
}

/// Logs why a PFN-mapped range is refused (rate-limited); silent for a
/// range that is not PFN-mapped at all (not this source's memory).
fn report_refusal(why: Refusal) {
    if !matches!(why, Refusal::NoMapping | Refusal::NotPfnmap) {
        warn_ratelimited(why.message());
    }
}

/// `get_pages`: a writable umem needs every page mapped writable.
pub(super) fn check_access(runs: &PfnRuns, read_only: bool) -> Result {
    if read_only || runs.writable() {
        return Ok(());
    }
    STATS_PFN.errors.inc();
    warn_ratelimited(c"a writable registration of a read-only PFN mapping is refused with EACCES; register it without write access or map it writable");
    Err(EACCES)
}

/// `dma_map` of a PFN registration's runs for `pdev`: `dma_map_resource`
/// per run (a PCI BAR: its bus addresses, if `pdev` reaches it through a
/// switch; `EOPNOTSUPP` if it cannot reach it), then the pages' bus addresses coalesced into as few entries as
/// the device's segment limits allow. Returns the table, the mapping and
/// the number of pages (entries before coalescing).
pub(super) fn dma_map(
    runs: PfnRuns,
    pdev: &PciDev,
    max_seg_size: u32,
    seg_boundary: u64,
    device_writes: bool,
) -> core::result::Result<(SgTable, PfnMapping, u32), (PfnRuns, Error)> {
    let ps = pfnmap::PAGE_SIZE;
    let Ok(limits) = SegmentLimits::new(ps, max_seg_size, seg_boundary) else {
        pr_err!(
            "the DMA device's segment limits (max {:#x}, boundary {:#x}) are below a page; PFN-mapped memory cannot be mapped for it\n",
            max_seg_size,
            seg_boundary
        );
        return Err((runs, EINVAL));
    };
    let pages = runs.bytes() / ps;
    let m = match runs.dma_map(pdev, device_writes) {
        Ok(m) => m,
        Err((runs, e)) if e == crate::kapi::eopnotsupp() => {
            STATS_PFN_BAR.bar_maps_refused.inc();
            warn_ratelimited(c"pfnmap: the RDMA device cannot reach this PCI BAR peer-to-peer (pci_p2pdma_distance: not below one PCIe switch, an ACS redirect on the way, or a host bridge the kernel does not allow; the pci lines before this say which); the registration fails with EOPNOTSUPP");
            return Err((runs, e));
        }
        Err((runs, e)) => {
            warn_ratelimited(
                c"dma_map_resource failed for PFN-mapped memory; the registration fails with EIO",
            );
            return Err((runs, e));
        }
    };
    if m.is_bar() {
        if m.by_bus_addr() {
            STATS_PFN_BAR.bar_maps_bus_addr.inc();
        } else {
            STATS_PFN_BAR.bar_maps_host_bridge.inc();
        }
    }
    // Per run, not per page: a range of one run may be a TiB.
    let fill = |m: &PfnMapping| -> Result<SgTable> {
        let mut n = 0u32;
        for seg in coalesce_extents(m.extents(), limits) {
            seg.ok_or(EINVAL)?;
            n = n.checked_add(1).ok_or(EINVAL)?;
        }
        let mut sgt = SgTable::new(n)?;
        let mut cur = sgt.cursor();
        for seg in coalesce_extents(m.extents(), limits) {
            let seg = seg.ok_or(EINVAL)?;
            cur.set_dma(seg.addr, seg.len)?;
        }
        Ok(sgt)
    };
    match fill(&m) {
        // At most 2^40 / 4 KiB pages (`MAX_RANGE_LEN`): fits.
        Ok(sgt) => Ok((sgt, m, pages as u32)),
        Err(e) => Err((m.unmap(), e)),
    }
}

/// `put_pages`/`release` of a PFN registration: nothing to give back,
/// only counted.
pub(super) fn count_released(stats: &Stats, runs: &PfnRuns) {
    let bytes = runs.bytes();
    stats.page_tables_unpinned.inc();
    stats.pages_unpinned.add(bytes / pfnmap::PAGE_SIZE);
    stats.bytes_unpinned.add(bytes);
}
