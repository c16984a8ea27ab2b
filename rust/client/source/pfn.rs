// SPDX-License-Identifier: GPL-2.0

//! The PFN-map page source: memory registrations on PFN-mapped memory
//! (a driver's `mmap` through `remap_pfn_range`, `VM_PFNMAP`) that is RAM
//! the kernel does not manage (reserved at boot) or a PCI device's memory
//! BAR the RDMA device reaches peer-to-peer, served by the
//! invalidating client `nv_mem` when the GPU source declined the range and
//! the `pfnmap` parameter is on. See docs/module.md, "PFN-mapped memory".
//!
//! A PFN registration is a registration like a GPU one (same phases,
//! same address watch, same revocation through the core), with
//! [`Source::Pfn`](super::Source::Pfn): its "pin" is the list of physical
//! runs read under the mmap lock, and nothing is given back at
//! `put_pages`. The registration (`super::super::registration`) makes the
//! object and starts and stops its watch; this module says whether the
//! source serves a range ([`serves`], [`new_watch`], [`probe`]), reads
//! and checks its runs ([`resolve`], [`check_access`]) and maps them
//! ([`dma_map`]), counting and reporting; the walk, what memory is served
//! and how a BAR is mapped are [`super::pfnwalk`]'s. `acquire` (under
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

use super::super::range::{coalesce_extents, GpuRange, SegmentLimits};
use super::super::stats::{Stats, STATS_PFN, STATS_PFN_BAR, STATS_PFN_WALK};
use super::super::Kind;
use super::pfnwalk::{self, PfnMapping, PfnRuns, Refusal, Unresolved, Walk};
use crate::kapi::device::PciDev;
use crate::kapi::mmu_notifier::{AddressChange, AddressWatch};
use crate::kapi::pfnmap;
use crate::kapi::print::warn_ratelimited;
use crate::kapi::scatterlist::SgTable;
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::prelude::*;

/// The page size of a PFN registration (the CPU's).
pub(in crate::client) const PAGE_SIZE: u64 = pfnmap::PAGE_SIZE;

/// Set once a PFN range was declined because there is no address watch.
static NO_WATCH_REPORTED: AtomicBool = AtomicBool::new(false);

/// Whether `acquire` of `kind` looks at a range the GPU source declined:
/// only the invalidating client can revoke, so only it serves this
/// source, and only with the `pfnmap` parameter on.
pub(in crate::client) fn serves(kind: Kind) -> bool {
    kind == Kind::Invalidating && pfnmap::param_enabled()
}

/// The address watch of a PFN registration, *blocking*
/// ([`AddressWatch::set_blocking`]), not started. `None`: no watch
/// (logged once), or out of memory (counted, logged): the range is not
/// served.
pub(in crate::client) fn new_watch<T: AddressChange>() -> Option<AddressWatch<T>> {
    let watch = match AddressWatch::new() {
        Ok(Some(w)) => w,
        Ok(None) => {
            if !NO_WATCH_REPORTED.swap(true, Ordering::Relaxed) {
                pr_warn!("pfnmap=Y but no address watch (mmu_notifier=N, or a kernel caller): PFN-mapped memory is not served without one (reported once)\n");
            }
            return None;
        }
        Err(_) => {
            report_oom();
            return None;
        }
    };
    watch.set_blocking();
    Some(watch)
}

/// Out of memory in `acquire`: counted, logged; the range is not served.
pub(in crate::client) fn report_oom() {
    STATS_PFN.errors.inc();
    warn_ratelimited(c"out of memory in acquire (PFN-map source); the range is not served");
}

/// The span `(start, len)` the watch of `range` covers: its pages.
pub(in crate::client) fn watched_span(range: &GpuRange) -> (u64, u64) {
    let (start, end) = span(range);
    (start, end - start)
}

/// The watch of the range could not start (error `e`): counted, logged,
/// the range is declined.
pub(in crate::client) fn report_watch_failed(start: u64, len: u64, e: Error) {
    let stats = &STATS_PFN;
    stats.errors.inc();
    stats.registrations_declined.inc();
    pr_err!(
        "cannot watch {:#x}+{:#x} for address-space changes (error {}); PFN-mapped memory is not served without a watch\n",
        start,
        len,
        e.to_errno()
    );
}

/// `acquire`, once the watch is armed: only a look at the range's
/// mappings and first page, since `acquire` runs under the core's global
/// client lock (the walk of every page waits for `get_pages`, which runs
/// under this umem's own lock: issue 21, finding 3). `false`: not served
/// (counted declined, logged if it is PFN-mapped memory this source
/// refuses).
pub(in crate::client) fn probe(range: &GpuRange) -> bool {
    let stats = &STATS_PFN;
    let (start, end) = span(range);
    match PfnRuns::probe(start, end - start) {
        Ok(()) => true,
        Err(Unresolved::Refused(why, _at)) => {
            stats.registrations_declined.inc();
            report_refusal(why);
            false
        }
        Err(Unresolved::Failed(e)) => {
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
            false
        }
    }
}

/// The page-aligned span `[start, end)` of `range`.
fn span(range: &GpuRange) -> (u64, u64) {
    let ps = pfnmap::PAGE_SIZE;
    // No overflow: `GpuRange` guarantees that the 64 KiB-aligned end fits.
    (range.addr() & !(ps - 1), (range.end() + ps - 1) & !(ps - 1))
}

// The message of a range over the limit names it.
const _: () = assert!(pfnwalk::MAX_RUNS == 262_144);

/// `get_pages` of a PFN registration `acquire` claimed: walks the range
/// (every page's PFN, classified per physical run; yields between pages,
/// stops for a fatal signal, at most [`pfnwalk::MAX_RUNS`] runs) and
/// hands the runs to `install`, with a check whether the range changed
/// since the walk began (`watch`'s `mmu_interval_read_retry`), to call
/// under the lock the address-change path takes; `install` says whether
/// it stored them. Runs under the umem's own lock, not the core's global
/// one. `EFAULT`: not served (logged, counted declined) or changed
/// meanwhile (retry); `ENOMEM` (also: too many runs, logged); `EINTR`
/// (fatal signal).
pub(in crate::client) fn resolve<T: AddressChange>(
    watch: Option<&AddressWatch<T>>,
    range: &GpuRange,
    install: impl FnOnce(PfnRuns, &dyn Fn() -> bool) -> bool,
) -> Result {
    let stats = &STATS_PFN;
    let walk_stats = &STATS_PFN_WALK;
    let (start, end) = span(range);
    let Some(w) = watch else {
        return Err(EFAULT);
    };
    let Some(seq) = w.read_begin() else {
        return Err(EFAULT);
    };
    let mut walk = Walk::new(super::super::inject::DELAY_PFN_WALK_MS.ms());
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
    if !install(runs, &|| w.read_retry(seq)) {
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

/// What a PFN registration gave back at `put_pages`/`release`: nothing
/// was held, it is only counted.
pub(in crate::client) struct Released {
    bytes: u64,
}

impl Released {
    /// What giving `runs` back counts.
    pub(super) fn of(runs: &PfnRuns) -> Self {
        Self {
            bytes: runs.bytes(),
        }
    }

    /// Counts it in `stats` (the PFN source's).
    pub(in crate::client) fn count(self, stats: &Stats) {
        stats.page_tables_unpinned.inc();
        stats.pages_unpinned.add(self.bytes / pfnmap::PAGE_SIZE);
        stats.bytes_unpinned.add(self.bytes);
    }
}
