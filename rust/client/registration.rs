// SPDX-License-Identifier: GPL-2.0

//! One registration: its states, and what each of the core's callbacks
//! does to it (see the module documentation of `crate::client`). Its time
//! in the watch-pin cache is in [`park`], its revocation (the GPU driver's
//! free callback, the address watch) in [`revoke`].

mod park;
mod revoke;

use super::events;
use super::range::GpuRange;
use super::source::gpu::{self, Keeper};
use super::source::pfnwalk::PfnRuns;
use super::source::{pfn, GiveBack, Source};
use super::stats::{Stats, STATS_PFN};
use super::{inject, Kind};
use crate::kapi::device::DmaDevice;
use crate::kapi::mm;
use crate::kapi::mmu_notifier::AddressWatch;
use crate::kapi::nvidia_p2p::PageTable;
use crate::kapi::object_count::ObjectCount;
use crate::kapi::peer_mem::Ticket;
use crate::kapi::print::warn_ratelimited;
use crate::kapi::scatterlist::{SgTable, SgView};
use crate::kapi::sync::{new_condvar, new_lock, CondVar, Lock, LockGuard};
use crate::kapi::task::ThreadGroup;
use crate::kapi::work::WorkItem;
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;
pub(crate) use park::WATCH_CACHE;
use park::{drop_parked, unpark};
pub(crate) use revoke::{
    address_changed, address_unmapping, gpu_freed, gpu_freed_after_put, revoke_after_free,
};

/// The memory a registration holds (`Phase::Pinned`), from its source
/// (`super::source`).
type Pages = super::source::Pages<Registration>;

/// The memory a registration holds, mapped for the DMA device (`Phase::Mapped`).
type Mapped = super::source::Mapped<Registration>;

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

/// `nv_mem`'s watch pin beside a keeper (see [`gpu::WatchPin`]).
type WatchPin = gpu::WatchPin<Registration>;

/// What the lock protects.
struct Inner {
    phase: Phase,
    /// `nv_mem` with a keeper: the watch pin (see [`WatchPin`]).
    watch_pin: WatchPin,
    /// The phase's pin is a keeper (persistent, beside `watch_pin`).
    keeper: bool,
    /// The GPU driver's free callback ran for the watch pin: the memory is
    /// being freed. `get_pages`/`dma_map` fail with EFAULT from now on.
    gpu_freed: bool,
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
    /// In the watch-pin cache (`super::wcache`): deregistered, the keeper
    /// put, the watch pin and the address watch kept. A free callback
    /// then queues the work item that drops the entry.
    parked: bool,
    /// The registration ended holding a pin with a free callback that
    /// only another process could give back (counted in
    /// `pins_left_to_callback`): the callback's registry entry keeps this
    /// object until the driver calls it ([`Registration::leave_to_callback`]).
    left_to_callback: bool,
}

/// One range claimed in `acquire`.
///
/// # Invariants
///
/// While `inner.phase` is `Pinned` or `Mapped`, the page table is pinned
/// for `range.aligned_start()..range.aligned_end()`; for `nv_mem` it is
/// either the keeper (persistent, `inner.keeper`), with the pin carrying
/// the free callback in `inner.watch_pin`, or (no keeper) that pin itself.
/// While a pin with a free callback is held (`WatchPin::Held`, or the
/// phase's without a keeper), the callback's registry entry holds a
/// reference to this object. `revoke_work` is `Some` for `nv_mem`'s GPU
/// registrations.
#[pin_data]
pub(crate) struct Registration {
    /// The client that claimed the range.
    kind: Kind,
    /// Where the memory comes from (set at creation).
    source: Source,
    range: GpuRange,
    /// The registering address space as a key ([`mm::current_key`]), for
    /// the watch-pin cache.
    mm_key: usize,
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
    /// `nv_mem` GPU registrations: the work item the free callback queues
    /// the revocation to ([`revoke_after_free`]).
    revoke_work: Option<WorkItem<Registration>>,
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

/// A new registration in `New` (counted in its source's or client's
/// `objects_created`); `ENOMEM`.
fn new(
    kind: Kind,
    source: Source,
    range: GpuRange,
    watch: Option<AddressWatch<Registration>>,
) -> Result<Arc<Registration>> {
    let stats = source.stats(kind);
    let gpu_watched = kind == Kind::Invalidating && source == Source::Gpu;
    let revoke_work = if gpu_watched {
        Some(WorkItem::new()?)
    } else {
        None
    };
    Arc::pin_init(
        pin_init!(Registration {
            kind,
            source,
            range,
            mm_key: mm::current_key(),
            watch,
            inner <- new_lock!(
                Inner {
                    phase: Phase::New,
                    watch_pin: if gpu_watched {
                        WatchPin::Pinning
                    } else {
                        WatchPin::None
                    },
                    keeper: false,
                    gpu_freed: false,
                    ticket: None,
                    sgt: None,
                    revoked: false,
                    invalidating: 0,
                    read_only: false,
                    parked: false,
                    left_to_callback: false,
                },
                "peermem_registration"
            ),
            invalidated <- new_condvar!("peermem_registration_invalidated"),
            mapping_done <- new_condvar!("peermem_registration_mapping_done"),
            events: events::Tag::current(),
            revoke_work,
            _live: Live::new(stats),
        }),
        GFP_KERNEL,
    )
}

/// `acquire` of client `kind`: is `[addr, addr + size)` memory of the GPU
/// driver? If so pin it for the whole registration (`nv_mem`: the pin with
/// the free callback, or the one the watch-pin cache kept, then the
/// keeper; [`Kind::Persistent`]: one persistent pin) and return the
/// registration.
pub(crate) fn acquire(kind: Kind, addr: u64, size: u64) -> Option<Arc<Registration>> {
    let stats = kind.stats();
    let Ok(range) = GpuRange::new(addr, size) else {
        stats.registrations_declined.inc();
        return None;
    };
    let persistent = kind == Kind::Persistent;
    // `nv_mem`: a range this process registered before may still have its
    // watch pin and address watch (the watch-pin cache).
    if !persistent {
        if let Some(reg) = WATCH_CACHE.take(addr, size) {
            if let Some(pt) = unpark(&reg) {
                stats.watch_cache_hits.inc();
                return finish_acquire(reg, pt, false);
            }
            drop_parked(reg);
        }
    }
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
        // notifier does not hold itself) goes, unless the watch-pin cache
        // takes the registration, whose reference then stands in for the
        // core's until `drop_parked` stops the watch.
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
    // comes before the table is stored below finds `WatchPin::Pinning`
    // (or, for a persistent pin, nothing comes) and marks `gpu_freed`: the
    // driver frees the table when the callback returns.
    let pin = || {
        if persistent {
            gpu::pin(&range, None)
        } else {
            gpu::pin_watch(&range, reg.clone())
        }
    };
    let mut pinned = pin();
    if matches!(pinned, Err(e) if e != EINVAL) && WATCH_CACHE.drain_mine() != 0 {
        // This process's cached watch pins hold BAR1 space: given back
        // (here, in the process that pinned them), one more try.
        pinned = pin();
    }
    let pt = match pinned {
        Ok(pt) => pt,
        Err(e) => {
            // Not GPU memory (EINVAL), or the driver could not pin it:
            // either way not ours, nothing held.
            reg.stop_watch();
            stats.registrations_declined.inc();
            if e != EINVAL {
                gpu::report_pin_failed(stats);
                return None;
            }
            drop(reg);
            // Not GPU memory: PFN-mapped memory, if that source is on.
            return acquire_pfn(kind, range);
        }
    };
    stats.page_tables_pinned.inc();
    finish_acquire(reg, pt, persistent)
}

/// The rest of `acquire` once the watch pin (`pt`, the first GPU page
/// with the free callback; for [`Kind::Persistent`] the persistent pin of
/// the range) is taken: the keeper, and the checks under the lock.
fn finish_acquire(
    reg: Arc<Registration>,
    pt: PageTable<Registration>,
    persistent: bool,
) -> Option<Arc<Registration>> {
    let stats = reg.kind.stats();
    let range = reg.range;
    // `nv_mem`: the keeper, a persistent pin of the same range, taken after
    // the watch pin (so a free from here on calls the watch's callback),
    // still outside every lock of peermem and of the core's umem
    // (`acquire` runs under the core's client list mutex only).
    // `Gone` (the memory is being freed): declined below.
    // `Unsupported` (the driver refuses persistent pins by design): one
    // pin. `NoRoom` (BAR1 full): this process's cached watch pins are
    // given back and the keeper tried once more; then, like any other
    // failure, the range is declined below.
    let mut keeper_failed = None;
    let mut unsupported = false;
    let keeper = if persistent {
        None
    } else {
        let mut k = gpu::pin_keeper(stats, &range);
        if matches!(k, Keeper::NoRoom) && WATCH_CACHE.drain_mine() != 0 {
            k = gpu::pin_keeper(stats, &range);
        }
        match k {
            Keeper::Pinned(k) => Some(k),
            Keeper::Gone => {
                keeper_failed = Some(EINVAL);
                None
            }
            Keeper::Unsupported => {
                unsupported = true;
                None
            }
            Keeper::NoRoom => {
                keeper_failed = Some(ENOMEM);
                None
            }
            Keeper::Failed(e) => {
                keeper_failed = Some(e);
                None
            }
        }
    };
    // Without a keeper the one pin must cover the whole range: the watch
    // pin (one page) is traded for such a pin, with the free callback.
    let pt = if unsupported {
        match repin_whole(&reg, pt) {
            Some(whole) => whole,
            None => {
                reg.stop_watch();
                stats.registrations_declined.inc();
                warn_ratelimited(
                    c"the GPU memory was freed while it was being registered; declining the range",
                );
                return None;
            }
        }
    } else {
        pt
    };
    inject::DELAY_ACQUIRE_MS.delay();
    let mut g = reg.inner.lock();
    if g.gpu_freed || !matches!(g.phase, Phase::New) {
        // The memory was freed right after the pin; the watch's table is
        // the driver's (it may be gone already), not read.
        g.watch_pin = WatchPin::Gone;
        drop(g);
        pt.give_to_driver();
        gpu::count_unpinned(stats, 0);
        if let Some(k) = keeper {
            gpu::put_keeper_now(stats, k, 0);
        }
        reg.stop_watch();
        stats.registrations_declined.inc();
        warn_ratelimited(
            c"the GPU memory was freed while it was being registered; declining the range",
        );
        return None;
    }
    // From here until the lock is dropped the callback cannot run: the
    // tables can be read.
    gpu::count_pinned(stats, range.page_count());
    let checked = gpu::check_pins(&range, &pt, keeper.as_ref());
    // INVARIANT (below): pinned for the aligned range, the callback holds
    // `callback` (in the phase's table, or in the watch pin's).
    match keeper {
        Some(k) => {
            g.phase = Phase::Pinned(Pages::Gpu(k));
            g.watch_pin = WatchPin::Held(pt);
            g.keeper = true;
        }
        None => {
            g.phase = Phase::Pinned(Pages::Gpu(pt));
            g.watch_pin = WatchPin::None;
        }
    }
    if g.revoked {
        // The range was unmapped or moved during the pin (the address
        // watch's work item found `New` and left this mark; the watch does
        // not fire again): what the pin found is no longer what the
        // address means. Claimed all the same, unpinned, so that
        // `get_pages` fails with EFAULT (declined, the core would ask
        // `nv_mem_nc`, whose persistent pin nothing watches: issue 22).
        drop(g);
        reg.stop_watch();
        reg.unpin();
        stats.registrations_stale.inc();
        stats.registrations_acquired.inc();
        return Some(reg);
    }
    if let Some(e) = keeper_failed {
        // No keeper and no reason to register with one pin (`EINVAL`: the
        // memory went between the two pins): the watch pin (now the
        // phase's) is put back as `put_pages` does, racing its callback,
        // here in the pinning process.
        drop(g);
        reg.stop_watch();
        reg.unpin();
        stats.registrations_declined.inc();
        if e == EINVAL {
            warn_ratelimited(
                c"the GPU memory was freed while it was being registered; declining the range",
            );
        } else {
            gpu::report_keeper_failed(stats, &range, e);
        }
        return None;
    }
    if let Err(why) = checked {
        stats.registrations_declined.inc();
        gpu::report_refused(stats, &range, why);
        drop(g);
        reg.stop_watch();
        reg.unpin();
        return None;
    }
    // The table's version and flags for debugfs.
    let Phase::Pinned(Pages::Gpu(ref mapped_pt)) = g.phase else {
        // Stored just above, under the same lock.
        return None;
    };
    gpu::record_pin(stats, mapped_pt);
    drop(g);
    stats.registrations_acquired.inc();
    Some(reg)
}

/// `finish_acquire` without a keeper: gives the watch pin `watch` back
/// (here, in the pinning process) and pins the whole range with the free
/// callback instead, the registration's one pin. `None` if the memory was
/// freed meanwhile or the pin failed (then nothing is held). No lock held.
fn repin_whole(
    reg: &Arc<Registration>,
    watch: PageTable<Registration>,
) -> Option<PageTable<Registration>> {
    {
        let mut g = reg.inner.lock();
        if g.gpu_freed {
            // Its callback ran: the table is the driver's.
            g.watch_pin = WatchPin::Gone;
            drop(g);
            watch.give_to_driver();
            gpu::count_unpinned(reg.stats(), 0);
            return None;
        }
        // INVARIANT: pinned, its callback's reference in the registry.
        g.watch_pin = WatchPin::Held(watch);
    }
    reg.unpin_watch();
    {
        let mut g = reg.inner.lock();
        if g.gpu_freed || !matches!(g.watch_pin, WatchPin::Gone) {
            return None;
        }
        // A free callback from here on finds the registration being
        // pinned: it marks `gpu_freed`, and `finish_acquire` declines.
        g.watch_pin = WatchPin::Pinning;
    }
    match gpu::pin(&reg.range, Some(reg.clone())) {
        Ok(whole) => {
            reg.stats().page_tables_pinned.inc();
            Some(whole)
        }
        Err(e) => {
            reg.inner.lock().watch_pin = WatchPin::Gone;
            if e != EINVAL {
                gpu::report_pin_failed(reg.stats());
            }
            None
        }
    }
}

/// `acquire` for a range the GPU source declined: claims it for the PFN
/// source (`super::source::pfn`) if the source serves `kind` and the
/// range is PFN-mapped RAM the kernel does not manage, or one PCI
/// device's memory BAR. Its watch is a blocking one, armed before the
/// range is looked at; `get_pages` reads the runs.
fn acquire_pfn(kind: Kind, range: GpuRange) -> Option<Arc<Registration>> {
    if !pfn::serves(kind) {
        return None;
    }
    let watch = pfn::new_watch()?;
    let Ok(reg) = new(kind, Source::Pfn, range, Some(watch)) else {
        pfn::report_oom();
        return None;
    };
    let w = reg.watch.as_ref()?;
    let (start, len) = pfn::watched_span(&range);
    // Armed before the page tables are read.
    // SAFETY: every path that gives up a reference to `reg` stops the watch
    // first: the decline path below, and `release` before the core's
    // reference goes.
    if let Err(e) = unsafe { w.start(reg.as_arc_borrow(), start, len) } {
        pfn::report_watch_failed(start, len, e);
        return None;
    }
    if !pfn::probe(&range) {
        reg.stop_watch();
        return None;
    }
    // The watch is armed, nothing read yet (`acquire`'s window, as the GPU
    // source's after its pins).
    inject::DELAY_ACQUIRE_MS.delay();
    STATS_PFN.registrations_acquired.inc();
    Some(reg)
}

/// Why `get_pages`/`dma_map` fail after a free callback.
fn freed_error(reg: &Registration) -> Error {
    gpu::freed_error(reg.stats())
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
        pfn::resolve(reg.watch.as_ref(), &reg.range, |runs, stale| {
            // The runs are read, not yet stored (no lock held).
            inject::DELAY_GET_PAGES_INNER_MS.delay();
            reg.install_pfn(runs, stale)
        })?;
    }
    let mut g = reg.inner.lock();
    if g.gpu_freed {
        return Err(freed_error(reg));
    }
    if g.revoked {
        return Err(revoked_error());
    }
    match g.phase {
        Phase::Pinned(ref pages) if g.ticket.is_none() => {
            pages.check_access(read_only)?;
            g.read_only = read_only;
            g.ticket = Some(ticket);
            // Revocation events: from now on a revocation is reported (and
            // one that fired before, whose work item is still to come and
            // will revoke the MR through the core, is reported now).
            reg.events.arm(reg.kind, reg.range.addr(), reg.range.len());
            drop(g);
            if reg.source == Source::Gpu {
                // Inside get_pages, armed, the lock dropped.
                inject::DELAY_GET_PAGES_INNER_MS.delay();
            }
            Ok(())
        }
        Phase::Freed => Err(freed_error(reg)),
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
    if g.gpu_freed {
        return Err(freed_error(reg));
    }
    if g.revoked {
        return Err(revoked_error());
    }
    if !matches!(g.phase, Phase::Pinned(_)) || g.ticket.is_none() {
        if matches!(g.phase, Phase::Freed) {
            return Err(freed_error(reg));
        }
        stats.errors.inc();
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
    inject::DELAY_MAPPING_MS.delay();
    let result = pt.dma_map(pdev, max_seg_size, seg_boundary, read_only);
    // Nothing changed meanwhile but `gpu_freed`: every other path waited
    // (an address change marks the registration revoked only after this
    // phase ends); the free callback of a registration with a keeper does
    // not wait (the keeper keeps what was mapped) and queued the
    // revocation, which waits for this phase to end.
    let mut g = reg.inner.lock();
    let result = match result {
        Ok((_, mapped, _)) if g.gpu_freed => {
            // Never live on memory being freed: undone under the lock
            // (`nvidia_p2p_dma_unmap_pages` takes no RM lock).
            warn_ratelimited(c"the GPU memory was freed while it was being registered; the registration fails with EFAULT");
            // Counted as made, so that the unmap balances it.
            stats.dma_maps.inc();
            Err((mapped.unmap(stats), EFAULT))
        }
        other => other,
    };
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

/// Set once `dma_map` was called without a DMA device (see [`report_no_dma_device`]).
static NO_DMA_DEVICE_REPORTED: AtomicBool = AtomicBool::new(false);

/// Logs, once per load, that the core asked for a mapping without a DMA device.
fn report_no_dma_device() {
    if !NO_DMA_DEVICE_REPORTED.swap(true, Ordering::Relaxed) {
        pr_err!("dma_map without a DMA device (NULL): the RDMA driver or the peer-memory core gives peermem no PCI device to map GPU memory for, and GPU peer-to-peer DMA needs one (a hardware RDMA adapter); every such registration on GPU memory fails with EINVAL (reported once)\n");
    }
}

/// `dma_unmap`: undo `dma_map` (if the free callback did not already) and
/// free our table. `sgl` identifies the table the core hands back.
pub(crate) fn dma_unmap(reg: &Registration, sgl: usize) {
    inject::DELAY_DMA_UNMAP_MS.delay();
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
    inject::DELAY_PUT_PAGES_MS.delay();
    reg.events.disarm();
    if reg.may_park() {
        // The watch pin stays until `release` parks the registration or
        // puts it.
        reg.unpin_phase();
    } else {
        reg.unpin();
    }
}

/// `get_page_size`.
pub(crate) fn page_size(reg: &Registration) -> u64 {
    reg.source.page_size()
}

/// `release`: the core is done with the registration; `reg` is its reference.
pub(crate) fn release(reg: Arc<Registration>) {
    reg.events.disarm();
    let may_park = reg.may_park();
    // The notifier takes references until stopped: before the core's goes
    // (a registration that may be parked keeps it: the cache's reference
    // replaces the core's, or it is stopped at the end).
    if !may_park {
        reg.stop_watch();
    }
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
    if may_park {
        reg.unpin_phase();
    } else {
        reg.unpin();
        reg.leave_to_callback();
    }
    reg.stats().registrations_released.inc();
    // The core frees its client once every release returned: no call of its
    // invalidate for this registration may still be running now.
    if reg.inner.lock().invalidating != 0 {
        reg.stats().errors.inc();
        pr_err!("BUG: release returns while the core's invalidate runs for the registration; the core may free its client under that call. Please report this peermem bug\n");
    }
    if may_park {
        WATCH_CACHE.park_or_drop(reg);
    }
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
                self.phase = Phase::Pinned(mapped.unmap(stats));
            }
            other => self.phase = other,
        }
    }
}

impl Registration {
    /// The counters of the client that claimed this registration (of the
    /// PFN source for its registrations).
    fn stats(&self) -> &'static Stats {
        self.source.stats(self.kind)
    }

    /// Whether `get_pages` still has to read this PFN registration's runs
    /// (`New`, and not revoked: then it fails without reading them).
    fn pfn_unresolved(&self) -> bool {
        let g = self.inner.lock();
        !g.revoked && matches!(g.phase, Phase::New)
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

    /// PFN source (`pfn::resolve`, from `get_pages`): stores the runs it
    /// resolved (`New` → `Pinned`) unless the range changed meanwhile:
    /// `stale()` (the watch's `mmu_interval_read_retry`) is checked under
    /// the lock the address-change path takes, as is `revoked`. `false`:
    /// not stored, the runs are dropped.
    fn install_pfn(&self, runs: PfnRuns, stale: impl FnOnce() -> bool) -> bool {
        let mut g = self.inner.lock();
        if g.revoked || stale() || !matches!(g.phase, Phase::New) {
            return false;
        }
        // INVARIANT: the runs of the range, watched by the blocking watch.
        g.phase = Phase::Pinned(Pages::Pfn(runs));
        true
    }

    /// Stops the address-space watch, if any (see [`AddressWatch::start`]).
    fn stop_watch(&self) {
        if let Some(w) = &self.watch {
            w.stop();
        }
    }

    /// Gives the page table back to the driver if it is still pinned
    /// (unmapping first if needed), outside the lock; after a put that
    /// returned 0 takes the free callback's reference out of the registry,
    /// unless the callback took it first.
    fn unpin(&self) {
        // The keeper first (if it is still pinned and nobody is putting it
        // already): the watch pin alone keeps nothing mapped. The watch pin
        // goes whatever the phase: an address change's work item gives the
        // keeper back but cannot put the watch pin (not the pinning
        // process), which the registration's release then does.
        self.unpin_phase();
        self.unpin_watch();
    }

    /// [`Registration::unpin`] without the watch pin: `true` if the
    /// phase's pin was given back now (then the watch pin may go too).
    fn unpin_phase(&self) -> bool {
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
                    mapped.unmap(self.stats())
                }
                other => {
                    g.phase = other;
                    return false;
                }
            };
            let pt = match pt.give_back() {
                GiveBack::Put(pt) => pt,
                GiveBack::Nothing(released) => {
                    // No reference was taken: nothing to give back.
                    g.phase = Phase::Unpinned;
                    drop(g);
                    released.count(self.stats());
                    return false;
                }
            };
            // The registration's pages, as `count_pinned` counted them
            // (the table may be the one-page watch pin of a declined range).
            let pages = self.range.page_count();
            match pt.begin_put() {
                Ok(pending) => (pending, pages),
                Err(pt) => {
                    // A pin with a free callback (no keeper), and not the
                    // pinning process (an address change's work item, a
                    // release elsewhere): the driver would ignore the put.
                    // It stays pinned, unmapped, for the release in the
                    // pinning process or the free callback.
                    g.phase = Phase::Pinned(Pages::Gpu(pt));
                    return false;
                }
            }
        };
        let persistent = pending.is_persistent();
        let keeper = persistent && self.kind == Kind::Invalidating;
        // With a keeper the window that matters is the watch pin's put
        // (its callback may run meanwhile): the delay is there.
        if !keeper {
            inject::DELAY_UNPIN_MS.delay();
        }
        let (res, callback_ref) = pending.put();
        let taken = {
            let mut g = self.inner.lock();
            let ran = matches!(g.phase, Phase::Unpinning { callback_ran: true });
            let taken = gpu::take_after_put(&res, &callback_ref);
            g.phase = if ran {
                Phase::Freed
            } else if persistent || taken.is_some() {
                Phase::Unpinned
            } else {
                Phase::CallbackPending
            };
            taken
        };
        if keeper {
            gpu::count_keeper_unpinned(self.stats(), pages);
        } else {
            gpu::count_unpinned(self.stats(), pages);
        }
        match res {
            Ok(()) => {}
            Err(e) if !persistent => gpu::report_watched_put_error(self.stats(), &self.range, e),
            Err(e) => gpu::report_persistent_put_error(self.stats(), &self.range, e),
        }
        // Last, outside the lock (the caller holds a reference too).
        drop(taken);
        true
    }

    /// Gives the watch pin back if it is still held (registrations with a
    /// keeper), outside the lock, deciding about the free callback's
    /// reference as [`Registration::unpin`] does.
    fn unpin_watch(&self) {
        let Some(pending) = self.inner.lock().watch_pin.begin_put() else {
            return;
        };
        inject::DELAY_UNPIN_MS.delay();
        let (res, callback_ref) = pending.put();
        let taken = self.inner.lock().watch_pin.end_put(&res, &callback_ref);
        self.stats().page_tables_unpinned.inc();
        if let Err(e) = res {
            gpu::report_watched_put_error(self.stats(), &self.range, e);
        }
        drop(taken);
    }

    /// The end of a registration (its release, or its cache entry dropped)
    /// that could not give back a pin with a free callback because the
    /// caller is not the process that pinned it: the pin stays with the
    /// GPU driver, whose free callback comes when that process frees the
    /// memory or exits, and the callback's registry entry keeps this
    /// object until then (module unload waits for it). Counted and logged.
    fn leave_to_callback(&self) {
        let pinner = {
            let mut g = self.inner.lock();
            let pinner = match (&g.phase, &g.watch_pin) {
                (_, WatchPin::Held(pt)) if !pt.puttable_here() => pt.pinner(),
                (Phase::Pinned(Pages::Gpu(pt)), _) if !pt.puttable_here() => pt.pinner(),
                _ => return,
            };
            if core::mem::replace(&mut g.left_to_callback, true) {
                return;
            }
            pinner
        };
        self.stats().pins_left_to_callback.inc();
        static REPORTED: AtomicBool = AtomicBool::new(false);
        if !REPORTED.swap(true, Ordering::Relaxed) {
            pr_warn!(
                "a GPU pin of {:#x}+{:#x} made by process {} ends in process {}, where NVIDIA's driver ignores a put: it stays pinned until process {} frees the memory or exits (counted in pins_left_to_callback; unloading peermem waits for it)\n",
                self.range.aligned_start(),
                self.range.aligned_len(),
                pinner.pid(),
                ThreadGroup::current().pid(),
                pinner.pid()
            );
        } else {
            warn_ratelimited(c"another GPU pin ends outside the process that made it; it stays pinned until that process frees the memory or exits (pins_left_to_callback)");
        }
    }
}
