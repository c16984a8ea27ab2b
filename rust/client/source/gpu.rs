// SPDX-License-Identifier: GPL-2.0

//! The GPU page source: memory of NVIDIA's driver, pinned through
//! `nvidia_p2p_get_pages*` (a page table of 64 KiB pages; `nv_mem`'s pin
//! carries a free callback, `nv_mem_nc`'s is persistent, and `nv_mem`
//! also takes a persistent keeper pin of the same range: docs/module.md,
//! "The keeper"), mapped with `nvidia_p2p_dma_map_pages`.
//!
//! What the pins and the mapping need from the driver, with their
//! counters and messages. Generic over the owner `T` of the free
//! callback: which pin holds what, and what a free callback does, is the
//! registration's state machine (`super::super::registration`). None of
//! these functions is called with the registration lock held, except
//! [`unmap`] (`nvidia_p2p_dma_unmap_pages` takes no lock of the driver's)
//! and those that only count or log.

use super::super::checks::{
    check_dma_mapping, check_page_table, map_pci, report_refusal, TableRefusal,
};
use super::super::range::{GpuRange, GPU_PAGE_SIZE};
use super::super::stats::{Stats, LAST_PIN};
use crate::kapi::cbref::CallbackRef;
use crate::kapi::device::PciDev;
use crate::kapi::nvidia_p2p::{
    self, FreeCallback, MappedTable, PageTable, PendingPut, PAGE_TABLE_FLAGS_CPU_CACHEABLE,
};
use crate::kapi::print::warn_ratelimited;
use crate::kapi::scatterlist::SgTable;
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;

/// The page size of every page table peermem keeps (`check_page_table`).
pub(in crate::client) const PAGE_SIZE: u64 = GPU_PAGE_SIZE;

/// Pins the range's GPU memory, with a free callback that gets
/// `callback` (`None`: persistently). `EINVAL`: not GPU memory.
pub(in crate::client) fn pin<T: FreeCallback>(
    range: &GpuRange,
    callback: Option<Arc<T>>,
) -> Result<PageTable<T>> {
    nvidia_p2p::get_pages(range.aligned_start(), range.aligned_len(), callback)
}

/// The range `nv_mem`'s watch pin covers: the first GPU page of `range`.
///
/// The driver calls a pin's free callback when the allocation it lies in
/// goes, whatever part of it the pin covers (NVIDIA's
/// `CliDelThirdPartyP2PVidmemInfo` calls the callback of every mapping of
/// the freed memory, third_party_p2p.c), and a pinned range always lies in
/// one allocation (`CliGetThirdPartyP2PVidmemInfoFromAddress`): so one
/// page watches the whole range, and holds one page of BAR1, not the
/// range's (docs/architecture.md, "The keeper").
pub(in crate::client) fn watch_range(range: &GpuRange) -> GpuRange {
    GpuRange::new(range.aligned_start(), PAGE_SIZE).unwrap_or(*range)
}

/// `nv_mem`'s watch pin: [`watch_range`] pinned with the free callback
/// that gets `callback`. `EINVAL`: not GPU memory.
pub(in crate::client) fn pin_watch<T: FreeCallback>(
    range: &GpuRange,
    callback: Arc<T>,
) -> Result<PageTable<T>> {
    pin(&watch_range(range), Some(callback))
}

/// The pin failed with an error other than `EINVAL` (counted in
/// `stats.errors`, logged); the range is declined all the same.
pub(in crate::client) fn report_pin_failed(stats: &Stats) {
    stats.errors.inc();
    warn_ratelimited(c"nvidia_p2p_get_pages failed with an error other than EINVAL; treating the range as not GPU memory");
}

/// What [`pin_keeper`] got.
pub(in crate::client) enum Keeper<T: FreeCallback> {
    /// The keeper is pinned.
    Pinned(PageTable<T>),
    /// `EINVAL`: the address no longer resolves, the memory is being freed
    /// (its callback comes, or came).
    Gone,
    /// `ENOTSUPP`: the driver refuses persistent pins of this memory by
    /// design (NVIDIA's `RmP2PGetPagesPersistent` answers
    /// `NV_ERR_NOT_SUPPORTED` with confidential computing, or under MIG
    /// without an internal P2P object; counted, reported): the registration
    /// falls back to one pin.
    Unsupported,
    /// `ENOMEM`: no room for the pin (on a GPU whose BAR1 is mapped
    /// dynamically, the aperture is full: `NV_ERR_INSUFFICIENT_RESOURCES`).
    NoRoom,
    /// Any other error: the registration is declined (counted, reported).
    Failed(Error),
}

/// `nv_mem`'s keeper: a persistent pin of the same range, taken after the
/// watch pin (so a free from here on calls the watch's callback), outside
/// every lock of peermem and of the core's umem.
pub(in crate::client) fn pin_keeper<T: FreeCallback>(stats: &Stats, range: &GpuRange) -> Keeper<T> {
    match nvidia_p2p::get_pages::<T>(range.aligned_start(), range.aligned_len(), None) {
        Ok(k) => {
            stats.keeper_pins.inc();
            Keeper::Pinned(k)
        }
        Err(e) if e == EINVAL => Keeper::Gone,
        Err(e) if e == ENOMEM => Keeper::NoRoom,
        Err(e) if e == ENOTSUPP => {
            stats.keeper_pins_refused.inc();
            report_keeper_unsupported();
            Keeper::Unsupported
        }
        Err(e) => Keeper::Failed(e),
    }
}

/// Says, once per load and then rate-limited, that the GPU driver refuses
/// persistent pins (`nv_mem`'s keeper), and what that means.
fn report_keeper_unsupported() {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    if !REPORTED.swap(true, Ordering::Relaxed) {
        pr_warn!(
            "the GPU driver does not support persistent pins of this memory (confidential computing or MIG); such registrations fall back to one pin, and a GPU free racing their registration can deadlock with the driver's lock (counted in keeper_pins_refused; docs/architecture.md, \"Locking\")\n"
        );
    } else {
        warn_ratelimited(c"the GPU driver refused a keeper pin as not supported again (keeper_pins_refused); this registration falls back to one pin");
    }
}

/// The keeper could not be pinned for a reason other than the driver's
/// design (`e`): the range is declined, counted in `stats.errors`. For
/// `ENOMEM` after the caller's cached pins were given back, the message
/// says what is full.
pub(in crate::client) fn report_keeper_failed(stats: &Stats, range: &GpuRange, e: Error) {
    stats.errors.inc();
    stats.keeper_pins_failed.inc();
    if e == ENOMEM {
        pr_warn!(
            "cannot pin {:#x}+{:#x} of GPU memory a second time: the GPU driver is out of room for pins (its BAR1 aperture is full; nvidia-smi -q shows BAR1 Memory Usage); declining the registration (deregister or free GPU memory registered for RDMA, or use a GPU with a larger BAR1)\n",
            range.aligned_start(),
            range.aligned_len()
        );
    } else {
        pr_warn!(
            "the GPU driver failed to pin {:#x}+{:#x} persistently (error {}); declining the registration\n",
            range.aligned_start(),
            range.aligned_len(),
            e.to_errno()
        );
    }
}

/// Checks what the pins hold: with a keeper, the watch pin `pt` covers
/// [`watch_range`] and the keeper the range; without, `pt` covers the
/// range; one entry per page (the keeper's addresses may differ from the
/// watch's: each RM client has its own BAR1 mapping of the memory). A
/// refusal is reported by [`report_refused`].
pub(in crate::client) fn check_pins<T: FreeCallback>(
    range: &GpuRange,
    pt: &PageTable<T>,
    keeper: Option<&PageTable<T>>,
) -> core::result::Result<(), TableRefusal> {
    match keeper {
        Some(k) => {
            check_page_table(pt, &watch_range(range)).and_then(|()| check_page_table(k, range))
        }
        None => check_page_table(pt, range),
    }
}

/// Counts (in `stats.errors`) and logs why [`check_pins`] refused the
/// range's pins.
pub(in crate::client) fn report_refused(stats: &Stats, range: &GpuRange, why: TableRefusal) {
    stats.errors.inc();
    report_refusal(why, range.addr(), range.len());
}

/// Counts a registration's pages just pinned (those of the range: a
/// page pinned by both the watch pin and the keeper counts once).
pub(in crate::client) fn count_pinned(stats: &Stats, pages: u32) {
    stats.pages_pinned.add(u64::from(pages));
    stats.bytes_pinned.add(u64::from(pages) * GPU_PAGE_SIZE);
}

/// Records the mapped table's version and flags (v2 tables only) for
/// debugfs; a CPU-cacheable (coherent) table is mapped like any other
/// (docs/module.md), only counted.
pub(in crate::client) fn record_pin<T: FreeCallback>(stats: &Stats, pt: &PageTable<T>) {
    let flags = pt.flags();
    LAST_PIN.record(pt.version(), flags.unwrap_or(0));
    if flags.is_some_and(|f| f & PAGE_TABLE_FLAGS_CPU_CACHEABLE != 0) {
        stats.page_tables_cpu_cacheable.inc();
    }
}

/// Counts a table given back (`pages` of it; 0 when the driver freed it
/// before it was read).
pub(in crate::client) fn count_unpinned(stats: &Stats, pages: u32) {
    stats.page_tables_unpinned.inc();
    count_pages_unpinned(stats, pages);
}

/// Counts a keeper given back (`pages` of it: the pages are counted with
/// the keeper, the watch pin's table alone when it goes).
pub(in crate::client) fn count_keeper_unpinned(stats: &Stats, pages: u32) {
    stats.keeper_unpins.inc();
    count_pages_unpinned(stats, pages);
}

fn count_pages_unpinned(stats: &Stats, pages: u32) {
    stats.pages_unpinned.add(u64::from(pages));
    stats.bytes_unpinned.add(u64::from(pages) * GPU_PAGE_SIZE);
}

/// Puts a keeper back at once (`acquire` giving up), counting `pages`.
pub(in crate::client) fn put_keeper_now<T: FreeCallback>(
    stats: &Stats,
    k: PageTable<T>,
    pages: u32,
) {
    // A keeper is persistent: any process can put it.
    let res = match k.begin_put() {
        Ok(pending) => pending.put().0,
        Err(k) => {
            k.give_to_driver();
            Err(EINVAL)
        }
    };
    count_keeper_unpinned(stats, pages);
    if let Err(e) = res {
        stats.errors.inc();
        pr_err!(
            "nvidia_p2p_put_pages_persistent failed ({}) for a keeper pin; the GPU driver may keep the memory pinned\n",
            e.to_errno()
        );
    }
}

/// A refused `nvidia_p2p_put_pages_persistent` (the phase's pin of
/// `nv_mem_nc`, or a keeper): counted and logged.
pub(in crate::client) fn report_persistent_put_error(stats: &Stats, range: &GpuRange, e: Error) {
    stats.errors.inc();
    pr_err!(
        "nvidia_p2p_put_pages_persistent failed ({}) for {:#x}+{:#x}; the GPU driver may keep the memory pinned\n",
        e.to_errno(),
        range.aligned_start(),
        range.aligned_len()
    );
}

/// A refused `nvidia_p2p_put_pages` of a pin with a free callback. The
/// driver refuses a put while the memory is being freed (`EINVAL`): the
/// callback is pending and returns its reference. Any other refusal
/// leaves the pin with the driver until the memory is freed, when the
/// callback comes all the same: counted and logged.
pub(in crate::client) fn report_watched_put_error(stats: &Stats, range: &GpuRange, e: Error) {
    if e == EINVAL {
        return;
    }
    stats.errors.inc();
    pr_warn!(
        "nvidia_p2p_put_pages failed ({}) for {:#x}+{:#x}; the GPU driver keeps the pages pinned until the memory is freed\n",
        e.to_errno(),
        range.aligned_start(),
        range.aligned_len()
    );
}

/// The free callback's reference after a put: after a put that returned 0
/// it is whoever's removes it first (the callback may still come, whatever
/// the driver promises), so the put path takes it if it is still there;
/// after a refused put it stays for the callback.
pub(in crate::client) fn take_after_put<T: Send + Sync>(
    res: &Result,
    callback_ref: &Option<CallbackRef<T>>,
) -> Option<Arc<T>> {
    match (res, callback_ref) {
        (Ok(()), Some(cref)) => cref.take(),
        _ => None,
    }
}

/// `nv_mem`'s watch pin (non-persistent, with the free callback) when the
/// phase holds a keeper (a persistent pin of the same range, the one that
/// is mapped): docs/architecture.md, "The keeper". The watch only tells peermem
/// that the memory is being freed; the keeper keeps it until peermem
/// revoked the registration, so the free callback never waits. Kept under
/// the registration lock; its methods are called with it held.
pub(in crate::client) enum WatchPin<T: FreeCallback> {
    /// No watch pin beside the phase's: `nv_mem_nc`, the PFN source, or
    /// `nv_mem` without a keeper (the driver refused it: the phase holds
    /// the pin with the callback, as before the keeper).
    None,
    /// `acquire` is pinning (the table is its local); a free callback
    /// now only marks `gpu_freed`, and `acquire` declines.
    Pinning,
    /// Pinned; the free callback's registry entry holds a reference.
    Held(PageTable<T>),
    /// `unpin_watch` is putting it back, outside the lock;
    /// `callback_ran`: the free callback ran meanwhile.
    Putting { callback_ran: bool },
    /// Given back: put (and the callback's reference taken), or taken by
    /// the free callback.
    Gone,
    /// Put (or the put was refused) and the callback's reference left in
    /// the registry: the callback comes and only returns its reference.
    CallbackPending,
}

/// What the free callback found in the watch pin ([`WatchPin::freed`]).
pub(in crate::client) enum WatchFreed {
    /// No watch pin: the pin with this callback is the phase's (no keeper).
    Unkept,
    /// The memory is being freed: the watch pin was taken or is being put
    /// (or `acquire` is pinning); the registration must be marked.
    Freed,
    /// Nothing more to do: the callback of a pin already put, or one for a
    /// pin peermem no longer holds (a driver bug: counted, logged).
    Nothing,
}

impl<T: FreeCallback> WatchPin<T> {
    /// The free callback: the watch pin is the callback's now (`Gone`); a
    /// held table goes to the driver (counted unpinned); a put in progress
    /// learns that the callback ran.
    pub(in crate::client) fn freed(&mut self, stats: &Stats) -> WatchFreed {
        match core::mem::replace(self, WatchPin::Gone) {
            WatchPin::None => WatchFreed::Unkept,
            // `acquire` holds the table still: it sees the mark and declines.
            WatchPin::Pinning => WatchFreed::Freed,
            WatchPin::Held(pt) => {
                pt.give_to_driver();
                stats.page_tables_unpinned.inc();
                WatchFreed::Freed
            }
            WatchPin::Putting { .. } => {
                // `unpin_watch` is giving the table back right now; it sees this.
                *self = WatchPin::Putting { callback_ran: true };
                WatchFreed::Freed
            }
            // The put was refused, or the callback took its reference before
            // `unpin_watch` looked: this is that callback, nothing else to do.
            WatchPin::CallbackPending => WatchFreed::Nothing,
            WatchPin::Gone => {
                stats.errors.inc();
                pr_err!("free callback for a page table peermem no longer holds; ignoring it (a GPU driver bug)\n");
                WatchFreed::Nothing
            }
        }
    }

    /// `unpin_watch`: the put of a held watch pin begins (`Putting`), to
    /// be made outside the lock; `None` if none is held, or if the caller
    /// is not the process that pinned it (the driver would ignore the put
    /// there: the pin stays `Held`, its callback's reference in the
    /// registry).
    pub(in crate::client) fn begin_put(&mut self) -> Option<PendingPut<T>> {
        match core::mem::replace(
            self,
            WatchPin::Putting {
                callback_ran: false,
            },
        ) {
            WatchPin::Held(pt) => match pt.begin_put() {
                Ok(pending) => Some(pending),
                Err(pt) => {
                    *self = WatchPin::Held(pt);
                    None
                }
            },
            other => {
                *self = other;
                None
            }
        }
    }

    /// Whether a watch pin is held that the caller can put.
    pub(in crate::client) fn held_here(&self) -> bool {
        matches!(self, WatchPin::Held(pt) if pt.puttable_here())
    }

    /// The put [`WatchPin::begin_put`] began returned `res`: the watch pin
    /// is `Gone`, or `CallbackPending` if the callback's reference stays in
    /// the registry for it ([`take_after_put`]). Returns the reference the
    /// put took, to drop outside the lock.
    pub(in crate::client) fn end_put(
        &mut self,
        res: &Result,
        callback_ref: &Option<CallbackRef<T>>,
    ) -> Option<Arc<T>> {
        let ran = matches!(self, WatchPin::Putting { callback_ran: true });
        let taken = take_after_put(res, callback_ref);
        *self = if ran || taken.is_some() {
            WatchPin::Gone
        } else {
            WatchPin::CallbackPending
        };
        taken
    }
}

/// Why `get_pages`/`dma_map` fail after a free callback (counted in
/// `stats.errors`, logged).
pub(in crate::client) fn freed_error(stats: &Stats) -> Error {
    stats.errors.inc();
    warn_ratelimited(c"the GPU memory was freed while it was being registered; the registration fails with EFAULT");
    EFAULT
}

/// `dma_map` of a GPU page table (outside the registration lock: the
/// driver's map call takes its lock, under which it calls free callbacks).
pub(super) fn dma_map<T: FreeCallback>(
    pt: PageTable<T>,
    pdev: &PciDev,
    max_seg_size: u32,
    seg_boundary: u64,
) -> core::result::Result<(SgTable, MappedTable<T>), (PageTable<T>, Error)> {
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

/// Undoes a table's DMA mapping (may run under the registration lock:
/// `nvidia_p2p_dma_unmap_pages` takes no lock of the driver's); the table
/// stays pinned.
pub(super) fn unmap<T: FreeCallback>(stats: &Stats, mapped: MappedTable<T>) -> PageTable<T> {
    let (pt, res) = mapped.unmap();
    if let Err(e) = res {
        stats.errors.inc();
        pr_err!("nvidia_p2p_dma_unmap_pages failed ({})\n", e.to_errno());
    }
    stats.dma_unmaps.inc();
    pt
}
