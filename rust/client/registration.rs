// SPDX-License-Identifier: GPL-2.0

//! One registration: its states, and what each callback does to it (see
//! the module documentation of `crate::client`).

use super::checks::{check_dma_mapping, check_page_table, map_pci, report_refusal};
use super::events;
use super::range::{GpuRange, GPU_PAGE_SIZE};
use super::stats::{Stats, LAST_PIN, STATS, STATS_PFN};
use super::{inject, Kind};
use crate::kapi::device::DmaDevice;
use crate::kapi::mmu_notifier::AddressWatch;
use crate::kapi::nvidia_p2p::{self, MappedTable, PageTable, PAGE_TABLE_FLAGS_CPU_CACHEABLE};
use crate::kapi::object_count::ObjectCount;
use crate::kapi::peer_mem::Ticket;
use crate::kapi::pfnmap::{PfnMapping, PfnRuns};
use crate::kapi::print::warn_ratelimited;
use crate::kapi::scatterlist::{SgTable, SgView};
use crate::kapi::sync::{new_condvar, new_lock, CondVar, Lock, LockGuard};
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;

/// A page table pinned for a registration (its free callback holds one).
type Table = PageTable<Registration>;

/// Where a registration's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// GPU memory, pinned through `nvidia_p2p_get_pages*`.
    Gpu,
    /// PFN-mapped RAM the kernel does not manage (`super::pfnmap`): no
    /// reference held; its blocking address watch revokes it.
    Pfn,
}

/// The memory a registration holds (`Phase::Pinned`).
pub(super) enum Pages {
    /// A pinned GPU page table.
    Gpu(Table),
    /// The physical runs of a PFN-mapped range (nothing to give back).
    Pfn(PfnRuns),
}

/// The memory a registration holds, mapped for the DMA device (`Phase::Mapped`).
enum Mapped {
    Gpu(MappedTable<Registration>),
    Pfn(PfnMapping),
}

/// Where a registration is in its life (see the module documentation).
enum Phase {
    /// Being built by `acquire` (not pinned yet), or its pin failed; PFN
    /// source: until `get_pages` read the runs.
    New,
    /// The GPU pages are pinned (PFN source: the runs are resolved).
    Pinned(Pages),
    /// `dma_map` is mapping the table for the DMA device, outside the lock
    /// (`nvidia_p2p_dma_map_pages` takes the GPU driver's lock, under which
    /// the driver calls free callbacks). The table is `dma_map`'s until it
    /// ends this phase: everyone else waits for that (`mapping_done`).
    Mapping,
    /// Pinned and mapped for the core's (PCI) DMA device.
    Mapped(Mapped),
    /// `put_pages`/`release` is giving the page table back, outside the
    /// lock; `callback_ran`: a free callback ran meanwhile.
    Unpinning { callback_ran: bool },
    /// The GPU memory was freed: the free callback took the page table.
    Freed,
    /// The page table was given back (`nvidia_p2p_put_pages*`).
    Unpinned,
    /// The page table went back (or the put was refused: the driver is
    /// freeing the memory, or keeps the pin until it does) and the free
    /// callback's reference was not taken by `unpin`: the callback has it
    /// or will, comes, and only returns its reference.
    CallbackPending,
}

/// What the lock protects.
struct Inner {
    phase: Phase,
    /// The core's ticket from `get_pages`: names the mapping when
    /// invalidating. Cleared by `release`: no invalidation may start after.
    ticket: Option<Ticket>,
    /// Our copy of the table `dma_map` filled. Freed by `dma_unmap`, or with
    /// the registration: after an invalidation the core may still be
    /// restoring entries it trimmed (a deregistration racing the free), and
    /// only its `dma_unmap` or `release` says it is done with them.
    sgt: Option<SgTable>,
    /// The process unmapped or moved the range: the registration is dead
    /// (invalidated, unpinned), and `get_pages`/`dma_map` fail. Set in
    /// `New` (during the pin in `acquire`): `acquire` declines the range.
    revoked: bool,
    /// Calls of the core's invalidate for this registration's ticket that
    /// are running (free callback, address change). `release` waits for
    /// none: until it returns the core keeps its client registered, which
    /// the call needs (module unload would free it).
    invalidating: u32,
    /// `get_pages` said the umem is read-only (the device only reads).
    read_only: bool,
}

/// One range claimed in `acquire`.
///
/// # Invariants
///
/// While `inner.phase` is `Pinned` or `Mapped`, the page table is pinned
/// for `range.aligned_start()..range.aligned_end()`, and (`nv_mem`: not
/// persistent) the free callback's registry entry holds a reference to
/// this object.
#[pin_data]
pub(crate) struct Registration {
    /// The client that claimed the range.
    kind: Kind,
    /// Where the memory comes from (set at creation).
    source: Source,
    range: GpuRange,
    /// The address-space watch (non-persistent pins in a user process).
    watch: Option<AddressWatch<Registration>>,
    #[pin]
    inner: Lock<Inner>,
    /// Signalled when `inner.invalidating` drops to 0.
    #[pin]
    invalidated: CondVar,
    /// Signalled when `dma_map` ends `Phase::Mapping`.
    #[pin]
    mapping_done: CondVar,
    /// Revocation events: the registering address space, reported once.
    events: events::Tag,
    /// Last: fields drop in declaration order, and module unload waits
    /// until this count drops; everything before (the watch's and
    /// `inner`'s drops: module code) must have run by then.
    _live: Live,
}

/// Counts a registration object as alive, for the statistics of its
/// client and for module unload (which waits until none is left).
struct Live(#[allow(dead_code)] ObjectCount, &'static Stats);

impl Live {
    fn new(stats: &'static Stats) -> Self {
        stats.objects_created.inc();
        Self(ObjectCount::new(), stats)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // Before the `ObjectCount` drops: unload may proceed after that.
        self.1.objects_freed.inc();
    }
}

fn count_unpinned(stats: &Stats, pages: u32) {
    stats.page_tables_unpinned.inc();
    stats.pages_unpinned.add(u64::from(pages));
    stats.bytes_unpinned.add(u64::from(pages) * GPU_PAGE_SIZE);
}

/// A new registration in `New` (counted in its source's or client's
/// `objects_created`); `ENOMEM`.
pub(super) fn new(
    kind: Kind,
    source: Source,
    range: GpuRange,
    watch: Option<AddressWatch<Registration>>,
) -> Result<Arc<Registration>> {
    let stats = if source == Source::Pfn {
        &STATS_PFN
    } else {
        kind.stats()
    };
    Arc::pin_init(
        pin_init!(Registration {
            kind,
            source,
            range,
            watch,
            inner <- new_lock!(
                Inner {
                    phase: Phase::New,
                    ticket: None,
                    sgt: None,
                    revoked: false,
                    invalidating: 0,
                    read_only: false,
                },
                "peermem_registration"
            ),
            invalidated <- new_condvar!("peermem_registration_invalidated"),
            mapping_done <- new_condvar!("peermem_registration_mapping_done"),
            events: events::Tag::current(),
            _live: Live::new(stats),
        }),
        GFP_KERNEL,
    )
}

/// `acquire` of client `kind`: is `[addr, addr + size)` memory of the GPU
/// driver? If so pin it (once, for the whole registration; persistently
/// for [`Kind::Persistent`]) and return the registration.
pub(crate) fn acquire(kind: Kind, addr: u64, size: u64) -> Option<Arc<Registration>> {
    let stats = kind.stats();
    let Ok(range) = GpuRange::new(addr, size) else {
        stats.registrations_declined.inc();
        return None;
    };
    let persistent = kind == Kind::Persistent;
    let oom = || {
        stats.errors.inc();
        warn_ratelimited(
            c"out of memory in acquire; the registration falls back to the next peer-memory client",
        );
    };
    let watch = if persistent {
        None
    } else {
        match AddressWatch::new() {
            Ok(w) => w,
            Err(_) => {
                oom();
                return None;
            }
        }
    };
    let Ok(reg) = new(kind, Source::Gpu, range, watch) else {
        oom();
        return None;
    };
    // Before the pin: an unmap from here on revokes the registration.
    if let Some(w) = &reg.watch {
        // SAFETY: every path that gives up a reference to `reg` stops the
        // watch first: the decline paths below and `release` call
        // `stop_watch` before the core's reference (the last one the
        // notifier does not hold itself) goes.
        if let Err(e) = unsafe { w.start(reg.as_arc_borrow(), range.addr(), range.len()) } {
            stats.errors.inc();
            stats.registrations_declined.inc();
            pr_err!(
                "cannot watch {:#x}+{:#x} for address-space changes (error {}); declining the range (or load peermem with mmu_notifier=0)\n",
                range.addr(),
                range.len(),
                e.to_errno()
            );
            return None;
        }
    }

    // Not held across the pin: NVIDIA's driver takes its resource-manager
    // lock inside `nvidia_p2p_get_pages` and calls free callbacks with it
    // held, and the callback takes the registration lock. A callback that
    // comes before the table is stored below finds `New` and leaves
    // `Freed`: the driver frees the table when the callback returns.
    let callback = (!persistent).then(|| reg.clone());
    let pt = match nvidia_p2p::get_pages(range.aligned_start(), range.aligned_len(), callback) {
        Ok(pt) => pt,
        Err(e) => {
            // Not GPU memory (EINVAL), or the driver could not pin it:
            // either way not ours, nothing held.
            reg.stop_watch();
            stats.registrations_declined.inc();
            if e != EINVAL {
                stats.errors.inc();
                warn_ratelimited(c"nvidia_p2p_get_pages failed with an error other than EINVAL; treating the range as not GPU memory");
                return None;
            }
            drop(reg);
            // Not GPU memory: PFN-mapped memory, if that source is on.
            return super::pfnmap::acquire(kind, range);
        }
    };
    stats.page_tables_pinned.inc();
    inject::DELAY_ACQUIRE_MS.delay();
    let mut g = reg.inner.lock();
    if !matches!(g.phase, Phase::New) {
        // `Freed`: the memory was freed right after the pin; the table is
        // the driver's (it may be gone already), not read.
        drop(g);
        pt.give_to_driver();
        count_unpinned(stats, 0);
        reg.stop_watch();
        stats.registrations_declined.inc();
        warn_ratelimited(
            c"the GPU memory was freed while it was being registered; declining the range",
        );
        return None;
    }
    // From here until the lock is dropped the callback cannot run: the
    // table can be read.
    stats.pages_pinned.add(u64::from(pt.entries()));
    stats
        .bytes_pinned
        .add(u64::from(pt.entries()) * GPU_PAGE_SIZE);
    if g.revoked {
        // The range was unmapped or moved during the pin (the address
        // watch's work item found `New` and left this mark; the watch does
        // not fire again): what the pin found is no longer what the
        // address means. Declined, so the registration fails with EFAULT.
        g.phase = Phase::Pinned(Pages::Gpu(pt));
        drop(g);
        reg.stop_watch();
        reg.unpin();
        stats.registrations_declined.inc();
        return None;
    }
    if let Err(why) = check_page_table(&pt, &range) {
        stats.errors.inc();
        stats.registrations_declined.inc();
        report_refusal(why, range.addr(), range.len());
        g.phase = Phase::Pinned(Pages::Gpu(pt));
        drop(g);
        reg.stop_watch();
        reg.unpin();
        return None;
    }
    // The table's version and flags (v2 tables only) for debugfs; a
    // CPU-cacheable (coherent) table is mapped like any other (docs/module.md).
    let flags = pt.flags();
    LAST_PIN.record(pt.version(), flags.unwrap_or(0));
    if flags.is_some_and(|f| f & PAGE_TABLE_FLAGS_CPU_CACHEABLE != 0) {
        stats.page_tables_cpu_cacheable.inc();
    }
    // INVARIANT: pinned for the aligned range, the callback holds `callback`.
    g.phase = Phase::Pinned(Pages::Gpu(pt));
    drop(g);
    stats.registrations_acquired.inc();
    Some(reg)
}

/// Why `get_pages`/`dma_map` fail on a revoked registration.
fn revoked_error() -> Error {
    warn_ratelimited(c"the process unmapped or moved the GPU memory's address range while it was being registered; the registration fails with EFAULT");
    EFAULT
}

/// `get_pages`: the pages were pinned in `acquire`; check the range and
/// remember the core's ticket for invalidations.
/// `read_only`: the umem is read-only (the core's `force`), so the device
/// will only read.
pub(crate) fn get_pages(
    reg: &Registration,
    addr: u64,
    size: u64,
    read_only: bool,
    ticket: Ticket,
) -> Result {
    inject::DELAY_GET_PAGES_MS.delay();
    if addr != reg.range.addr() || size != reg.range.len() {
        reg.stats().errors.inc();
        pr_err!(
            "get_pages for {:#x}+{:#x} on a registration acquired for {:#x}+{:#x}; refusing (a peer-memory core bug)\n",
            addr,
            size,
            reg.range.addr(),
            reg.range.len()
        );
        return Err(EINVAL);
    }
    // PFN source: `acquire` only looked at the range; its walk is here,
    // under the umem's own lock rather than the core's global one.
    if reg.source == Source::Pfn && reg.pfn_unresolved() {
        super::pfnmap::resolve(reg, &reg.range)?;
    }
    let mut g = reg.inner.lock();
    if g.revoked {
        return Err(revoked_error());
    }
    match g.phase {
        Phase::Pinned(ref pages) if g.ticket.is_none() => {
            if let Pages::Pfn(runs) = pages {
                super::pfnmap::check_access(runs, read_only)?;
            }
            g.read_only = read_only;
            g.ticket = Some(ticket);
            // Revocation events: from now on a revocation is reported (and
            // one that fired before, whose work item is still to come and
            // will revoke the MR through the core, is reported now).
            reg.events.arm(reg.kind, reg.range.addr(), reg.range.len());
            Ok(())
        }
        Phase::Freed => {
            reg.stats().errors.inc();
            warn_ratelimited(c"the GPU memory was freed while it was being registered; the registration fails with EFAULT");
            Err(EFAULT)
        }
        _ => {
            reg.stats().errors.inc();
            pr_err!(
                "get_pages called twice or after put_pages; refusing (a peer-memory core bug)\n"
            );
            Err(EINVAL)
        }
    }
}

/// `dma_map`: map the pinned pages for `dev` and return the table for the core.
///
/// `dev` is the device the core maps for (the RDMA adapter's PCI device);
/// `None` (a NULL device) is refused with `EINVAL`: GPU memory has no
/// CPU pages to hand out instead (a real GPU's BAR has none), so there is
/// nothing to map without a device.
pub(crate) fn dma_map(reg: &Registration, dev: Option<&DmaDevice<'_>>) -> Result<SgView> {
    inject::DELAY_DMA_MAP_MS.delay();
    let stats = reg.stats();
    let mut g = reg.inner.lock();
    if g.revoked {
        return Err(revoked_error());
    }
    if !matches!(g.phase, Phase::Pinned(_)) || g.ticket.is_none() {
        stats.errors.inc();
        if matches!(g.phase, Phase::Freed) {
            warn_ratelimited(c"the GPU memory was freed while it was being registered; the registration fails with EFAULT");
            return Err(EFAULT);
        }
        pr_err!("dma_map without get_pages, or twice; refusing (a peer-memory core bug)\n");
        return Err(EINVAL);
    }
    let (pdev, max_seg_size, seg_boundary) = match dev {
        Some(DmaDevice::Pci {
            pdev,
            max_seg_size,
            seg_boundary,
        }) => (pdev, *max_seg_size, *seg_boundary),
        None => {
            stats.errors.inc();
            report_no_dma_device();
            return Err(EINVAL);
        }
        Some(DmaDevice::Other(dev)) => {
            stats.errors.inc();
            dev.report();
            return Err(EINVAL);
        }
    };
    let Phase::Pinned(pt) = core::mem::replace(&mut g.phase, Phase::Mapping) else {
        // Checked above, under the same lock.
        return Err(EINVAL);
    };
    // Mapped outside the lock: `nvidia_p2p_dma_map_pages` takes the GPU
    // driver's lock, under which the driver calls the free callback, which
    // takes this lock. While `Mapping` the table is ours alone: the free
    // callback, an address change and every other callback wait for the
    // phase to end (`lock_settled`).
    let read_only = g.read_only;
    drop(g);
    let result = match pt {
        Pages::Gpu(pt) => dma_map_gpu(pt, pdev, max_seg_size, seg_boundary)
            .map(|(sgt, m)| {
                let n = m.table().entries();
                (sgt, Mapped::Gpu(m), n)
            })
            .map_err(|(pt, e)| (Pages::Gpu(pt), e)),
        Pages::Pfn(runs) => {
            super::pfnmap::dma_map(runs, pdev, max_seg_size, seg_boundary, !read_only)
                .map(|(sgt, m, n)| (sgt, Mapped::Pfn(m), n))
                .map_err(|(runs, e)| (Pages::Pfn(runs), e))
        }
    };
    // Nothing changed meanwhile: every other path waited (an address
    // change marks the registration revoked only after this phase ends).
    let mut g = reg.inner.lock();
    let out = match result {
        Ok((sgt, mapped, uncoalesced)) => {
            stats.dma_maps.inc();
            stats.sg_entries_uncoalesced.add(u64::from(uncoalesced));
            stats.sg_entries_coalesced.add(u64::from(sgt.nents()));
            let view = sgt.view();
            g.sgt = Some(sgt);
            g.phase = Phase::Mapped(mapped);
            Ok(view)
        }
        Err((pt, e)) => {
            stats.errors.inc();
            g.phase = Phase::Pinned(pt);
            Err(e)
        }
    };
    drop(g);
    reg.mapping_done.notify_all();
    out
}

/// `dma_map` of a GPU page table (outside the registration lock).
fn dma_map_gpu(
    pt: Table,
    pdev: &crate::kapi::device::PciDev,
    max_seg_size: u32,
    seg_boundary: u64,
) -> core::result::Result<(SgTable, MappedTable<Registration>), (Table, Error)> {
    match pt.dma_map(pdev) {
        Err((pt, e)) => {
            warn_ratelimited(
                c"nvidia_p2p_dma_map_pages failed; the registration fails with its error",
            );
            Err((pt, e))
        }
        Ok(m) => {
            let checked = check_dma_mapping(&m).map_err(|why| {
                pr_err!(
                    "the GPU driver's DMA mapping is unusable: {}; refusing it\n",
                    why
                );
                EINVAL
            });
            match checked.and_then(|()| map_pci(&m, max_seg_size, seg_boundary)) {
                Ok(sgt) => Ok((sgt, m)),
                Err(e) => {
                    let (pt, res) = m.unmap();
                    if let Err(ue) = res {
                        pr_err!(
                            "nvidia_p2p_dma_unmap_pages failed ({}) undoing a refused mapping\n",
                            ue.to_errno()
                        );
                    }
                    Err((pt, e))
                }
            }
        }
    }
}

/// Set once `dma_map` was called without a DMA device (see [`report_no_dma_device`]).
static NO_DMA_DEVICE_REPORTED: AtomicBool = AtomicBool::new(false);

/// Logs, once per load, that the core asked for a mapping without a DMA device.
fn report_no_dma_device() {
    if !NO_DMA_DEVICE_REPORTED.swap(true, Ordering::Relaxed) {
        pr_err!("dma_map without a DMA device (NULL): the RDMA driver or the peer-memory core gives peermem no PCI device to map GPU memory for, and GPU peer-to-peer DMA needs one (a hardware RDMA adapter); every such registration on GPU memory fails with EINVAL (reported once)\n");
    }
}

/// Undoes a mapping (registration lock held by the caller); the page table stays pinned.
fn unmap_locked(stats: &Stats, mapped: Mapped) -> Pages {
    let mapped = match mapped {
        Mapped::Gpu(m) => m,
        Mapped::Pfn(m) => {
            stats.dma_unmaps.inc();
            return Pages::Pfn(m.unmap());
        }
    };
    let (pt, res) = mapped.unmap();
    if let Err(e) = res {
        stats.errors.inc();
        pr_err!("nvidia_p2p_dma_unmap_pages failed ({})\n", e.to_errno());
    }
    stats.dma_unmaps.inc();
    Pages::Gpu(pt)
}

/// `dma_unmap`: undo `dma_map` (if the free callback did not already) and
/// free our table. `sgl` identifies the table the core hands back.
pub(crate) fn dma_unmap(reg: &Registration, sgl: usize) {
    let mut g = reg.lock_settled();
    // Freed: the free callback gave the mapping back already.
    g.unmap(reg.stats());
    if let Some(sgt) = g.sgt.take() {
        if sgl != 0 && sgl != sgt.sgl_addr() {
            reg.stats().errors.inc();
            pr_err!("dma_unmap got a table peermem did not fill; freeing peermem's own\n");
        }
    }
}

/// `put_pages`: unpin (unless the GPU memory was freed meanwhile).
pub(crate) fn put_pages(reg: &Registration) {
    reg.events.disarm();
    reg.unpin();
}

/// `get_page_size`.
pub(crate) fn page_size(reg: &Registration) -> u64 {
    match reg.source {
        // Every page table peermem keeps has 64 KiB pages (`check_page_table`).
        Source::Gpu => GPU_PAGE_SIZE,
        Source::Pfn => crate::kapi::pfnmap::PAGE_SIZE,
    }
}

/// `release`: the core is done with the registration; `reg` is its reference.
pub(crate) fn release(reg: Arc<Registration>) {
    reg.events.disarm();
    // The notifier takes references until stopped: before the core's goes.
    reg.stop_watch();
    // A free callback or an address change may still be inside the core's
    // invalidate with this registration's ticket (it found nothing to do:
    // the core tore the mapping down first). The core must stay registered
    // until that call returned, and it does while we are in release.
    {
        let mut g = reg.lock_settled();
        while g.invalidating != 0 {
            reg.invalidated.wait(&mut g);
        }
        // In the same critical section: no call of the core's invalidate
        // for this registration may start any more (a free callback or an
        // address change from now on finds no ticket). The core frees its
        // client once every release returned.
        g.ticket = None;
        // An address change invalidated through the core and its work item
        // has not undone the mapping yet (after an invalidation the core
        // never calls dma_unmap): undo it here, a legitimate race.
        if g.revoked {
            g.unmap(reg.stats());
        }
    }
    inject::DELAY_RELEASE_MS.delay();
    // Pinned still if the core gave up before get_pages or after it failed.
    reg.unpin();
    reg.stats().registrations_released.inc();
    // The core frees its client once every release returned: no call of its
    // invalidate for this registration may still be running now.
    if reg.inner.lock().invalidating != 0 {
        reg.stats().errors.inc();
        pr_err!("BUG: release returns while the core's invalidate runs for the registration; the core may free its client under that call. Please report this peermem bug\n");
    }
}

/// The GPU driver's free callback for a pin whose put returned 0 before it
/// ran (the 550 driver does that for a put while the callback is pending):
/// `unpin` took the callback's reference, the registration may be gone.
/// Counted for `nv_mem`, whose pins alone have a free callback.
pub(crate) fn gpu_freed_after_put() {
    STATS.free_callbacks.inc();
    STATS.free_callbacks_after_put.inc();
}

/// The GPU driver's free callback: the memory behind `reg` is being freed.
/// `reg` is the callback's own reference, taken from the registry.
pub(crate) fn gpu_freed(reg: Arc<Registration>) {
    let stats = reg.stats();
    stats.free_callbacks.inc();
    let (ticket, mapped) = {
        // Waits while `dma_map` maps the table: it is `dma_map`'s then, and
        // must stay valid until the driver's map call returned. (A free
        // racing a registration of the same memory on NVIDIA's driver: the
        // map call may wait for the driver's lock this callback runs under.
        // No client can avoid that: docs/module.md, "Locking".)
        let mut g = reg.lock_settled();
        match core::mem::replace(&mut g.phase, Phase::Freed) {
            Phase::New => {
                // The memory was freed right after the pin, before `acquire`
                // stored the table: it sees `Freed` and declines.
                (None, None)
            }
            Phase::Pinned(Pages::Gpu(pt)) => {
                count_unpinned(stats, pt.entries());
                pt.give_to_driver();
                revoke_event(&reg, events::Cause::GpuFree);
                (g.begin_invalidate(), None)
            }
            Phase::Mapped(Mapped::Gpu(mapped)) => {
                count_unpinned(stats, mapped.table().entries());
                revoke_event(&reg, events::Cause::GpuFree);
                // Given to the driver after the core's invalidate, below:
                // the table is valid until this callback returns.
                (g.begin_invalidate(), Some(mapped))
            }
            Phase::Unpinning { .. } => {
                // put_pages is giving the table back right now; it will see this.
                g.phase = Phase::Unpinning { callback_ran: true };
                (None, None)
            }
            // The put was refused, or the callback took its reference
            // before `unpin` looked: this is that callback.
            Phase::CallbackPending => (None, None),
            other => {
                // Freed/Unpinned hold no registry entry, so no callback
                // gets here for them (Mapping was waited out above); PFN
                // registrations have no free callback.
                g.phase = other;
                stats.errors.inc();
                pr_err!("free callback for a page table peermem no longer holds; ignoring it (a GPU driver bug)\n");
                (None, None)
            }
        }
    };
    // No lock held: the core waits for the umem's mapping lock, and with
    // PEER_MEM_INVALIDATE_UNMAPS it never calls dma_unmap/put_pages for the
    // mapping afterwards.
    if let Some(ticket) = ticket {
        inject::DELAY_INVALIDATE_MS.delay();
        // SAFETY: `begin_invalidate` counted this call in `invalidating`;
        // `release` waits until none runs and clears the ticket in the
        // same critical section, so the core has not released the
        // registration and does not until `end_invalidate`. No lock held.
        if unsafe { ticket.invalidate() }.is_some() {
            stats.invalidations_gpu_free.inc();
        }
        reg.end_invalidate();
    }
    if let Some(mapped) = mapped {
        // SAFETY: this is the free callback of the pin whose table this is
        // (the registry entry that led here names this registration, which
        // holds one pin), and it has not returned.
        unsafe { mapped.give_to_driver() };
        stats.dma_unmaps.inc();
    }
    inject::DELAY_FREE_CALLBACK_MS.delay();
    drop(reg);
}

/// Revocation events: `reg` is being revoked for `cause` (before the
/// core's invalidate; allocates nothing, takes only the event spinlock).
fn revoke_event(reg: &Registration, cause: events::Cause) {
    reg.events
        .revoked(reg.kind, reg.range.addr(), reg.range.len(), cause);
}

/// The address watch's notifier is firing for `reg` (may not sleep): the
/// work item that revokes it follows ([`address_changed`]).
pub(crate) fn address_unmapping(reg: &Registration, cause: events::Cause) {
    revoke_event(reg, cause);
}

/// The process unmapped or moved the registered range (from the address
/// watch's work item, no lock held; `reg` is the work item's reference).
/// Revokes the registration: the core invalidates the device's mapping (the
/// next RDMA completes in error), then peermem unmaps and unpins the GPU
/// pages, which the core no longer does after an invalidation. Nothing to
/// do if the memory was freed or given back meanwhile.
pub(crate) fn address_changed(reg: Arc<Registration>) {
    inject::DELAY_ADDRESS_WORK_MS.delay();
    let ticket = {
        let mut g = reg.lock_settled();
        if g.revoked {
            return;
        }
        match g.phase {
            // `acquire` is pinning with the lock dropped (PFN source:
            // `get_pages` is reading the runs): it finds the mark when it
            // takes the lock and declines the range (fails).
            Phase::New => {
                g.revoked = true;
                drop(g);
                reg.stats().address_changes.inc();
                return;
            }
            Phase::Pinned(_) | Phase::Mapped(..) => {}
            _ => return,
        }
        g.revoked = true;
        g.begin_invalidate()
    };
    reg.stats().address_changes.inc();
    // Without a ticket the core has not called get_pages yet; it will fail.
    if let Some(ticket) = ticket {
        // SAFETY: as in `gpu_freed`: counted in `invalidating`, which
        // `release` waits on; no lock held.
        if unsafe { ticket.invalidate() }.is_some() {
            reg.stats().invalidations_mmu_notifier.inc();
        }
        reg.end_invalidate();
    }
    inject::DELAY_ADDRESS_CHANGE_MS.delay();
    // The table itself stays until dma_unmap or the registration goes.
    reg.lock_settled().unmap(reg.stats());
    reg.unpin();
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last reference is gone; what `Inner` owns goes after this.
        inject::DELAY_TEARDOWN_MS.delay();
    }
}

impl Inner {
    /// `Mapped → Pinned`, undoing the mapping; any other phase stays.
    fn unmap(&mut self, stats: &Stats) {
        match core::mem::replace(&mut self.phase, Phase::New) {
            Phase::Mapped(mapped) => {
                self.phase = Phase::Pinned(unmap_locked(stats, mapped));
            }
            other => self.phase = other,
        }
    }

    /// The ticket to invalidate, if the core gave one; counts the call as
    /// running until [`Registration::end_invalidate`].
    fn begin_invalidate(&mut self) -> Option<Ticket> {
        if self.ticket.is_some() {
            self.invalidating += 1;
        }
        self.ticket
    }
}

impl Registration {
    /// The counters of the client that claimed this registration (of the
    /// PFN source for its registrations).
    fn stats(&self) -> &'static Stats {
        match self.source {
            Source::Gpu => self.kind.stats(),
            Source::Pfn => &STATS_PFN,
        }
    }

    /// Whether `get_pages` still has to read this PFN registration's runs
    /// (`New`, and not revoked: then it fails without reading them).
    fn pfn_unresolved(&self) -> bool {
        let g = self.inner.lock();
        !g.revoked && matches!(g.phase, Phase::New)
    }

    /// The address watch (started by `acquire`).
    pub(super) fn watch(&self) -> Option<&AddressWatch<Registration>> {
        self.watch.as_ref()
    }

    /// The core's invalidate returned (after [`Inner::begin_invalidate`] gave a ticket).
    fn end_invalidate(&self) {
        let mut g = self.inner.lock();
        g.invalidating -= 1;
        if g.invalidating == 0 {
            self.invalidated.notify_all();
        }
    }

    /// Locks the registration once no `dma_map` is mapping its table
    /// outside the lock (`Phase::Mapping`).
    fn lock_settled(&self) -> LockGuard<'_, Inner> {
        let mut g = self.inner.lock();
        while matches!(g.phase, Phase::Mapping) {
            self.mapping_done.wait(&mut g);
        }
        g
    }

    /// Stops the address-space watch, if any (see [`AddressWatch::start`]).
    pub(super) fn stop_watch(&self) {
        if let Some(w) = &self.watch {
            w.stop();
        }
    }

    /// Gives the page table back to the driver if it is still pinned
    /// (unmapping first if needed), outside the lock; after a put that
    /// returned 0 takes the free callback's reference out of the registry,
    /// unless the callback took it first.
    fn unpin(&self) {
        // Under the lock, while the free callback cannot run: read what is
        // needed of the table and make it a pending put. Once the lock is
        // dropped the callback may run and the driver free the table.
        let (pending, pages) = {
            let mut g = self.lock_settled();
            let pt = match core::mem::replace(
                &mut g.phase,
                Phase::Unpinning {
                    callback_ran: false,
                },
            ) {
                Phase::Pinned(pt) => pt,
                Phase::Mapped(mapped) => {
                    self.stats().errors.inc();
                    pr_err!("put_pages or release before dma_unmap; unmapping first (a peer-memory core bug)\n");
                    unmap_locked(self.stats(), mapped)
                }
                other => {
                    g.phase = other;
                    return;
                }
            };
            let pt = match pt {
                Pages::Gpu(pt) => pt,
                Pages::Pfn(runs) => {
                    // No reference was taken: nothing to give back.
                    g.phase = Phase::Unpinned;
                    drop(g);
                    super::pfnmap::count_released(self.stats(), &runs);
                    return;
                }
            };
            let pages = pt.entries();
            (pt.begin_put(), pages)
        };
        inject::DELAY_UNPIN_MS.delay();
        let persistent = pending.is_persistent();
        let (res, callback_ref) = pending.put();
        let taken = {
            let mut g = self.inner.lock();
            let ran = matches!(g.phase, Phase::Unpinning { callback_ran: true });
            // After a put that returned 0 the reference is whoever's removes
            // it first (the callback may still come, whatever the driver
            // promises); after a refused put it stays for the callback.
            let taken = match (&res, &callback_ref) {
                (Ok(()), Some(cref)) => cref.take(),
                _ => None,
            };
            g.phase = if ran {
                Phase::Freed
            } else if persistent || taken.is_some() {
                Phase::Unpinned
            } else {
                Phase::CallbackPending
            };
            taken
        };
        count_unpinned(self.stats(), pages);
        match res {
            Ok(()) => {}
            Err(e) if !persistent => {
                // The driver refuses a put while the memory is being freed:
                // the free callback is pending and returns its reference.
                // Any other refusal leaves the pin with the driver until the
                // memory is freed, when the callback comes all the same.
                if e != EINVAL {
                    self.stats().errors.inc();
                    pr_warn!(
                        "nvidia_p2p_put_pages failed ({}) for {:#x}+{:#x}; the GPU driver keeps the pages pinned until the memory is freed\n",
                        e.to_errno(),
                        self.range.aligned_start(),
                        self.range.aligned_len()
                    );
                }
            }
            Err(e) => {
                self.stats().errors.inc();
                pr_err!(
                    "nvidia_p2p_put_pages_persistent failed ({}) for {:#x}+{:#x}; the GPU driver may keep the memory pinned\n",
                    e.to_errno(),
                    self.range.aligned_start(),
                    self.range.aligned_len()
                );
            }
        }
        // Last, outside the lock (the caller holds a reference too).
        drop(taken);
    }
}

/// PFN source (`super::pfnmap::resolve`, from `get_pages`): stores the runs it resolved in
/// `reg` (`New` → `Pinned`) unless the range changed meanwhile: `stale()`
/// (the watch's `mmu_interval_read_retry`) is checked under the lock the
/// address-change path takes, as is `revoked`. `false`: not stored, the
/// runs are dropped.
pub(super) fn install_pfn(reg: &Registration, runs: PfnRuns, stale: impl FnOnce() -> bool) -> bool {
    let mut g = reg.inner.lock();
    if g.revoked || stale() || !matches!(g.phase, Phase::New) {
        return false;
    }
    // INVARIANT: the runs of the range, watched by the blocking watch.
    g.phase = Phase::Pinned(Pages::Pfn(runs));
    true
}
