// SPDX-License-Identifier: GPL-2.0

//! The peer-memory clients: what peermem does for each callback of the core
//! and for the GPU driver's free callback. Safe Rust; the raw side is in
//! `ffi`.
//!
//! # Two clients
//!
//! peermem registers two clients, as nvidia-peermem does ([`Kind`]): the
//! invalidating `nv_mem` (`PEER_MEM_INVALIDATE_UNMAPS`; pins with a free
//! callback, revokes on GPU free and on address changes), which the core
//! asks first for memory registrations, and the non-invalidating
//! `nv_mem_nc` (persistent pins, `nvidia_p2p_get_pages_persistent`), the
//! only one the core asks for umems that cannot be invalidated (queue
//! buffers, doorbell pages) and the fallback for MRs `nv_mem` declines.
//! Both share this code; a registration knows its kind, and each kind has
//! its own counters.
//!
//! # One registration
//!
//! Each range the core offers and peermem claims is one [`Registration`],
//! reference counted (`Arc`). References: the core's `client_context`
//! (from `acquire` to `release`), and, for a non-persistent pin (`nv_mem`), the free
//! callback's, kept in a registry under an id that is the callback's
//! `data` ([`ffi::CallbackRef`]). Whoever removes it from the registry
//! owns it: the free callback, on entry, or `unpin` after a put that
//! returned 0. Removal is atomic, so this holds whatever the driver's put
//! returns and whenever its callback runs.
//!
//! Its state ([`Phase`]) lives under its own lock:
//!
//! ```text
//!  acquire: New --pin--> Pinned --get_pages (ticket)--> Pinned --dma_map--> Mapped
//!                                                         ^                  |
//!                                                         +----dma_unmap-----+
//!  put_pages/release:  Pinned --> Unpinning --put returned 0, reference taken--> Unpinned
//!                                     |   (refused, or the callback took the reference)
//!                                     |            --> CallbackPending --free callback--> Freed
//!                                     | free callback meanwhile: noted, then --> Freed
//!  free callback:  Pinned | Mapped --> Freed   (then: invalidate, free the DMA mapping)
//!  address change: Pinned | Mapped, revoked (then: invalidate, unmap, unpin as put_pages does)
//! ```
//!
//! # Address-space changes
//!
//! An `nv_mem` registration also watches its range in the address
//! space of the process that registered it ([`ffi::AddressWatch`], an mmu
//! interval notifier). When the process unmaps or moves the range, the
//! addresses no longer mean the pinned GPU memory: a work item marks the
//! registration `revoked`, invalidates it through the core like a free
//! does, then unmaps and unpins it itself (with `PEER_MEM_INVALIDATE_UNMAPS`
//! the core no longer does). The watch is started in `acquire` before the
//! pin and stopped in `release` (or when `acquire` declines) before the
//! core's reference goes; the work item holds its own reference.
//!
//! # Locking
//!
//! The registration lock is held across `nvidia_p2p_get_pages` (in
//! `acquire`: an early free callback waits until the object is complete)
//! and across `nvidia_p2p_dma_map_pages`/`_dma_unmap_pages` (so the page
//! table cannot be freed under them). It is never held while calling the
//! core's invalidate (the core waits there for the umem's mapping lock,
//! held across `get_pages`/`dma_map`, which take this lock) nor across
//! `nvidia_p2p_put_pages` (the GPU driver may call the free callback, which
//! takes this lock, with a driver lock held that `put_pages` needs). See
//! `docs/module.md`.

use crate::ffi::{
    self, AddressWatch, DmaDevice, DmaMapping, ObjectCount, PageTable, SgTable, SgView,
};
use crate::inject;
use crate::range::{coalesce, count_segments, GpuRange, SegmentLimits, GPU_PAGE_SIZE};
use crate::stats::{Stats, STATS, STATS_NC};
use crate::sync::{new_condvar, new_lock, CondVar, Lock};
use kernel::prelude::*;
use kernel::sync::Arc;

/// Which of peermem's two peer-memory clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `nv_mem`: invalidating (`PEER_MEM_INVALIDATE_UNMAPS`), pins with a
    /// free callback and watches the address range.
    Invalidating,
    /// `nv_mem_nc`: non-invalidating, pins persistently
    /// (`nvidia_p2p_get_pages_persistent`): no free callback, no watch.
    Persistent,
}

impl Kind {
    /// The client's counters.
    pub(crate) fn stats(self) -> &'static Stats {
        match self {
            Kind::Invalidating => &STATS,
            Kind::Persistent => &STATS_NC,
        }
    }
}

/// Where a registration is in its life (see the module documentation).
enum Phase {
    /// Being built by `acquire`, which holds the lock; or its pin failed.
    New,
    /// The GPU pages are pinned.
    Pinned(PageTable),
    /// Pinned and mapped for the core's (PCI) DMA device.
    Mapped(PageTable, DmaMapping),
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
    /// The core's `core_context` from `get_pages`: names the mapping when invalidating.
    ticket: Option<u64>,
    /// Our copy of the table `dma_map` filled. Freed by `dma_unmap`, or with
    /// the registration: after an invalidation the core may still be
    /// restoring entries it trimmed (a deregistration racing the free), and
    /// only its `dma_unmap` or `release` says it is done with them.
    sgt: Option<SgTable>,
    /// The process unmapped or moved the range: the registration is dead
    /// (invalidated, unpinned), and `get_pages`/`dma_map` fail.
    revoked: bool,
    /// Calls of the core's invalidate for this registration's ticket that
    /// are running (free callback, address change). `release` waits for
    /// none: until it returns the core keeps its client registered, which
    /// the call needs (module unload would free it).
    invalidating: u32,
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
    range: GpuRange,
    /// The address-space watch (non-persistent pins in a user process).
    watch: Option<AddressWatch>,
    #[pin]
    inner: Lock<Inner>,
    /// Signalled when `inner.invalidating` drops to 0.
    #[pin]
    invalidated: CondVar,
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

/// Why a page table or a DMA mapping is not usable.
fn check_page_table(pt: &PageTable, range: &GpuRange) -> core::result::Result<(), &'static str> {
    if !ffi::p2p_version_compatible(pt.version(), ffi::P2P_PAGE_TABLE_VERSION) {
        return Err("its version is incompatible with the one peermem is built for");
    }
    if pt.page_size_type() != ffi::P2P_PAGE_SIZE_64KB {
        return Err("its pages are not 64 KiB");
    }
    if pt.entries() != range.page_count() {
        return Err("its page count does not match the range");
    }
    if !pt.pages_present() {
        return Err("it lacks page entries");
    }
    Ok(())
}

fn check_dma_mapping(m: &DmaMapping, pt: &PageTable) -> core::result::Result<(), &'static str> {
    if !ffi::p2p_version_compatible(m.version(), ffi::P2P_DMA_MAPPING_VERSION) {
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

fn count_unpinned(stats: &Stats, pages: u32) {
    stats.page_tables_unpinned.inc();
    stats.pages_unpinned.add(u64::from(pages));
    stats.bytes_unpinned.add(u64::from(pages) * GPU_PAGE_SIZE);
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
        ffi::warn_ratelimited(
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
    let reg = match Arc::pin_init(
        pin_init!(Registration {
            kind,
            range,
            watch,
            inner <- new_lock!(
                Inner {
                    phase: Phase::New,
                    ticket: None,
                    sgt: None,
                    revoked: false,
                    invalidating: 0,
                },
                "peermem_registration"
            ),
            invalidated <- new_condvar!("peermem_registration_invalidated"),
            _live: Live::new(stats),
        }),
        GFP_KERNEL,
    ) {
        Ok(reg) => reg,
        Err(_) => {
            oom();
            return None;
        }
    };
    // Before the pin: an unmap from here on revokes the registration.
    if let Some(w) = &reg.watch {
        // SAFETY: every path that gives up a reference to `reg` stops the
        // watch first: the decline paths below and `release` call
        // `stop_watch` before the core's reference (the last one the
        // notifier does not hold itself) goes.
        if let Err(e) = unsafe { w.start(&reg, range.addr(), range.len()) } {
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

    // Held across the pin: a free callback arriving at once waits for a
    // complete object.
    let mut g = reg.inner.lock();
    let callback = (!persistent).then(|| reg.clone());
    let pt = match ffi::p2p_get_pages(range.aligned_start(), range.aligned_len(), callback, stats) {
        Ok(pt) => pt,
        Err(e) => {
            // Not GPU memory (EINVAL), or the driver could not pin it:
            // either way not ours, nothing held.
            drop(g);
            reg.stop_watch();
            stats.registrations_declined.inc();
            if e != EINVAL {
                stats.errors.inc();
                ffi::warn_ratelimited(c"nvidia_p2p_get_pages failed with an error other than EINVAL; treating the range as not GPU memory");
            }
            return None;
        }
    };
    stats.page_tables_pinned.inc();
    stats.pages_pinned.add(u64::from(pt.entries()));
    stats
        .bytes_pinned
        .add(u64::from(pt.entries()) * GPU_PAGE_SIZE);
    if let Err(why) = check_page_table(&pt, &range) {
        stats.errors.inc();
        stats.registrations_declined.inc();
        pr_err!(
            "the GPU driver's page table for {:#x}+{:#x} is unusable: {}; declining the range (update peermem or the driver)\n",
            range.addr(),
            range.len(),
            why
        );
        g.phase = Phase::Pinned(pt);
        drop(g);
        reg.stop_watch();
        reg.unpin();
        return None;
    }
    // INVARIANT: pinned for the aligned range, the callback holds `callback`.
    g.phase = Phase::Pinned(pt);
    drop(g);
    stats.registrations_acquired.inc();
    Some(reg)
}

/// Why `get_pages`/`dma_map` fail on a revoked registration.
fn revoked_error() -> Error {
    ffi::warn_ratelimited(c"the process unmapped or moved the GPU memory's address range while it was being registered; the registration fails with EFAULT");
    EFAULT
}

/// `get_pages`: the pages were pinned in `acquire`; check the range and
/// remember the core's ticket for invalidations.
pub(crate) fn get_pages(reg: &Registration, addr: u64, size: u64, ticket: u64) -> Result {
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
    let mut g = reg.inner.lock();
    if g.revoked {
        return Err(revoked_error());
    }
    match g.phase {
        Phase::Pinned(_) if g.ticket.is_none() => {
            g.ticket = Some(ticket);
            Ok(())
        }
        Phase::Freed => {
            reg.stats().errors.inc();
            ffi::warn_ratelimited(c"the GPU memory was freed while it was being registered; the registration fails with EFAULT");
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

/// Segment limits for a PCI DMA device: its own (`dma_get_max_seg_size`,
/// `dma_get_seg_boundary`), as `ib_umem_get` honours them for host memory.
fn pci_limits(
    max_seg_size: u32,
    seg_boundary: u64,
) -> core::result::Result<SegmentLimits, crate::range::CoalesceError> {
    SegmentLimits::new(GPU_PAGE_SIZE, max_seg_size, seg_boundary)
}

/// The entries for the DMA addresses of `m`: contiguous pages coalesced
/// within the device's segment limits.
fn map_pci(m: &DmaMapping, max_seg_size: u32, seg_boundary: u64) -> Result<SgTable> {
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
    let pt = match core::mem::replace(&mut g.phase, Phase::New) {
        Phase::Pinned(pt) if g.ticket.is_some() => pt,
        other => {
            let freed = matches!(other, Phase::Freed);
            g.phase = other;
            stats.errors.inc();
            if freed {
                ffi::warn_ratelimited(c"the GPU memory was freed while it was being registered; the registration fails with EFAULT");
                return Err(EFAULT);
            }
            pr_err!("dma_map without get_pages, or twice; refusing (a peer-memory core bug)\n");
            return Err(EINVAL);
        }
    };
    let mapped = match dev {
        None => {
            ffi::report_no_dma_device();
            Err(EINVAL)
        }
        Some(DmaDevice::Pci {
            pdev,
            max_seg_size,
            seg_boundary,
        }) => match DmaMapping::map(pdev, &pt) {
            Err(e) => {
                ffi::warn_ratelimited(
                    c"nvidia_p2p_dma_map_pages failed; the registration fails with its error",
                );
                Err(e)
            }
            Ok(m) => {
                let checked = check_dma_mapping(&m, &pt).map_err(|why| {
                    pr_err!(
                        "the GPU driver's DMA mapping is unusable: {}; refusing it\n",
                        why
                    );
                    EINVAL
                });
                match checked.and_then(|()| map_pci(&m, *max_seg_size, *seg_boundary)) {
                    Ok(sgt) => Ok((sgt, m)),
                    Err(e) => {
                        if let Err(ue) = m.unmap(&pt) {
                            pr_err!("nvidia_p2p_dma_unmap_pages failed ({}) undoing a refused mapping\n", ue.to_errno());
                        }
                        Err(e)
                    }
                }
            }
        },
        Some(DmaDevice::Other(dev)) => {
            dev.report();
            Err(EINVAL)
        }
    };
    match mapped {
        Ok((sgt, mapping)) => {
            stats.dma_maps.inc();
            stats.sg_entries_uncoalesced.add(u64::from(pt.entries()));
            stats.sg_entries_coalesced.add(u64::from(sgt.nents()));
            let view = sgt.view();
            g.sgt = Some(sgt);
            g.phase = Phase::Mapped(pt, mapping);
            Ok(view)
        }
        Err(e) => {
            stats.errors.inc();
            g.phase = Phase::Pinned(pt);
            Err(e)
        }
    }
}

/// Undoes a mapping (registration lock held by the caller); the page table stays pinned.
fn unmap_locked(stats: &Stats, pt: &PageTable, mapping: DmaMapping) {
    if let Err(e) = mapping.unmap(pt) {
        stats.errors.inc();
        pr_err!("nvidia_p2p_dma_unmap_pages failed ({})\n", e.to_errno());
    }
    stats.dma_unmaps.inc();
}

/// `dma_unmap`: undo `dma_map` (if the free callback did not already) and
/// free our table. `sgl` identifies the table the core hands back.
pub(crate) fn dma_unmap(reg: &Registration, sgl: usize) {
    let mut g = reg.inner.lock();
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
    reg.unpin();
}

/// `get_page_size`.
pub(crate) fn page_size(_reg: &Registration) -> u64 {
    // Every page table peermem keeps has 64 KiB pages (`check_page_table`).
    GPU_PAGE_SIZE
}

/// `release`: the core is done with the registration; `reg` is its reference.
pub(crate) fn release(reg: Arc<Registration>) {
    // The notifier takes references until stopped: before the core's goes.
    reg.stop_watch();
    // A free callback or an address change may still be inside the core's
    // invalidate with this registration's ticket (it found nothing to do:
    // the core tore the mapping down first). The core must stay registered
    // until that call returned, and it does while we are in release.
    {
        let mut g = reg.inner.lock();
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
    let (ticket, mapping) = {
        let mut g = reg.inner.lock();
        match core::mem::replace(&mut g.phase, Phase::Freed) {
            Phase::Pinned(pt) => {
                count_unpinned(stats, pt.entries());
                pt.give_to_driver();
                (g.begin_invalidate(), None)
            }
            Phase::Mapped(pt, mapping) => {
                count_unpinned(stats, pt.entries());
                pt.give_to_driver();
                (g.begin_invalidate(), Some(mapping))
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
                // New cannot be seen (acquire holds the lock until Pinned,
                // and a failed pin has no callback); Freed/Unpinned hold no
                // registry entry, so no callback gets here for them.
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
        if ffi::core_invalidate(ticket).is_some() {
            stats.invalidations_gpu_free.inc();
        }
        reg.end_invalidate();
    }
    if let Some(mapping) = mapping {
        // The driver unmaps it with the page table once this returns.
        mapping.free_in_callback();
        stats.dma_unmaps.inc();
    }
    inject::DELAY_FREE_CALLBACK_MS.delay();
    drop(reg);
}

/// The process unmapped or moved the registered range (from the address
/// watch's work item, no lock held; `reg` is the work item's reference).
/// Revokes the registration: the core invalidates the device's mapping (the
/// next RDMA completes in error), then peermem unmaps and unpins the GPU
/// pages, which the core no longer does after an invalidation. Nothing to
/// do if the memory was freed or given back meanwhile.
pub(crate) fn address_changed(reg: Arc<Registration>) {
    let ticket = {
        let mut g = reg.inner.lock();
        if g.revoked || !matches!(g.phase, Phase::Pinned(_) | Phase::Mapped(..)) {
            return;
        }
        g.revoked = true;
        g.begin_invalidate()
    };
    reg.stats().address_changes.inc();
    // Without a ticket the core has not called get_pages yet; it will fail.
    if let Some(ticket) = ticket {
        if ffi::core_invalidate(ticket).is_some() {
            reg.stats().invalidations_mmu_notifier.inc();
        }
        reg.end_invalidate();
    }
    inject::DELAY_ADDRESS_CHANGE_MS.delay();
    // The table itself stays until dma_unmap or the registration goes.
    reg.inner.lock().unmap(reg.stats());
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
            Phase::Mapped(pt, mapping) => {
                unmap_locked(stats, &pt, mapping);
                self.phase = Phase::Pinned(pt);
            }
            other => self.phase = other,
        }
    }

    /// The ticket to invalidate, if the core gave one; counts the call as
    /// running until [`Registration::end_invalidate`].
    fn begin_invalidate(&mut self) -> Option<u64> {
        if self.ticket.is_some() {
            self.invalidating += 1;
        }
        self.ticket
    }
}

impl Registration {
    /// The counters of the client that claimed this registration.
    fn stats(&self) -> &'static Stats {
        self.kind.stats()
    }

    /// The core's invalidate returned (after [`Inner::begin_invalidate`] gave a ticket).
    fn end_invalidate(&self) {
        let mut g = self.inner.lock();
        g.invalidating -= 1;
        if g.invalidating == 0 {
            self.invalidated.notify_all();
        }
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
        // Under the lock, while the free callback cannot run: read what is
        // needed of the table and make it a pending put. Once the lock is
        // dropped the callback may run and the driver free the table.
        let (pending, pages) = {
            let mut g = self.inner.lock();
            let pt = match core::mem::replace(
                &mut g.phase,
                Phase::Unpinning {
                    callback_ran: false,
                },
            ) {
                Phase::Pinned(pt) => pt,
                Phase::Mapped(pt, mapping) => {
                    self.stats().errors.inc();
                    pr_err!("put_pages or release before dma_unmap; unmapping first (a peer-memory core bug)\n");
                    unmap_locked(self.stats(), &pt, mapping);
                    pt
                }
                other => {
                    g.phase = other;
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

#[cfg(peermem_kunit)]
#[::kernel::macros::kunit_tests(peermem_client)]
mod tests {
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
    fn kinds_have_their_own_counters() {
        assert!(!core::ptr::eq(
            Kind::Invalidating.stats(),
            Kind::Persistent.stats()
        ));
        assert!(core::ptr::eq(Kind::Invalidating.stats(), &STATS));
        assert!(core::ptr::eq(Kind::Persistent.stats(), &STATS_NC));
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
        let want = ffi::P2P_PAGE_TABLE_VERSION;
        assert!(ffi::p2p_version_compatible(want, want));
        // A newer minor is fine, an older one or another major is not.
        assert!(ffi::p2p_version_compatible(want + 1, want));
        assert!(!ffi::p2p_version_compatible(want - 1, want));
        assert!(!ffi::p2p_version_compatible(want + 0x1_0000, want));
        assert!(!ffi::p2p_version_compatible(want - 0x1_0000, want));
        assert!(!ffi::p2p_version_compatible(0, want));
        let dma = ffi::P2P_DMA_MAPPING_VERSION;
        assert!(ffi::p2p_version_compatible(dma, dma));
        assert!(!ffi::p2p_version_compatible(want, dma));
    }
}
