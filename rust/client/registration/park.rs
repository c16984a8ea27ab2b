// SPDX-License-Identifier: GPL-2.0

//! The registration in the watch-pin cache (`super::super::wcache`): which
//! registrations may be parked at `release` and how, how `acquire` takes
//! one back, how one is dropped, and the one `static` cache
//! ([`WATCH_CACHE`], with `impl Parkable for Registration`).

use super::super::source::{gpu, Source};
use super::super::wcache::{self, Parkable, WatchCache};
use super::super::{inject, Kind};
use super::{Inner, Phase, Registration, WatchPin};
use crate::kapi::mm;
use crate::kapi::nvidia_p2p::PageTable;
use kernel::sync::Arc;

impl Registration {
    /// Whether this registration may go to the watch-pin cache at
    /// `release` (then `put_pages` leaves its watch pin).
    pub(super) fn may_park(&self) -> bool {
        self.kind == Kind::Invalidating
            && self.source == Source::Gpu
            && self.watch.is_some()
            && wcache::enabled()
    }
}

/// The GPU memory a parked `reg`'s watch pin covers, hence the BAR1 it
/// holds (for the cache's bound): one GPU page.
fn parked_bytes(reg: &Registration) -> u64 {
    gpu::watch_range(&reg.range).aligned_len()
}

/// Whether `reg` (its lock held: `g`) can be parked: given back whole by
/// the core (`Unpinned`: the keeper put), not freed, revoked or moved, its
/// watch pin held, its address watch not fired, and released from its own
/// address space (not by the process's exit, whose address space is gone:
/// its key could never match again).
fn parkable(reg: &Registration, g: &Inner) -> bool {
    let fired = reg.watch.as_ref().is_none_or(|w| w.has_fired());
    !fired
        && !g.gpu_freed
        && !g.revoked
        && g.invalidating == 0
        && g.ticket.is_none()
        && matches!(g.phase, Phase::Unpinned)
        && g.watch_pin.held_here()
        && mm::current_key() == reg.mm_key
}

/// [`parkable`], taking the lock (before the cache makes room for it).
fn may_be_parked(reg: &Registration) -> bool {
    parkable(reg, &reg.inner.lock())
}

/// Parks `reg` in the watch-pin cache if it can be reused ([`parkable`]).
/// `false`: not parked (the caller puts the watch pin).
fn park(reg: &Arc<Registration>) -> bool {
    let mut g = reg.inner.lock();
    if !parkable(reg, &g) {
        return false;
    }
    // Under this lock, so that a free callback that comes next sees the
    // mark and queues the work item that drops the entry.
    if !WATCH_CACHE.insert(
        reg,
        reg.mm_key,
        reg.range.addr(),
        reg.range.len(),
        parked_bytes(reg),
    ) {
        return false;
    }
    g.parked = true;
    // Nothing of the core's is left: its table went with dma_unmap.
    g.sgt = None;
    drop(g);
    reg.stats().watch_cache_parked.inc();
    true
}

/// A registration the watch-pin cache gave back ([`WatchCache::take`]): made `New` again with its
/// watch pin taken out for [`finish_acquire`](super::finish_acquire) (`WatchPin::Pinning`, as a
/// fresh `acquire` holds it), or `None` if it cannot be reused (its memory
/// was freed or its range unmapped meanwhile: the caller drops it).
pub(super) fn unpark(reg: &Registration) -> Option<PageTable<Registration>> {
    let mut g = reg.inner.lock();
    g.parked = false;
    // Before the watch's fired mark is read: an unmap from here on is
    // reported as for a registration being made.
    reg.events.reset();
    if reg.watch.as_ref().is_none_or(|w| w.has_fired())
        || g.gpu_freed
        || !matches!(g.phase, Phase::Unpinned)
    {
        return None;
    }
    let WatchPin::Held(pt) = core::mem::replace(&mut g.watch_pin, WatchPin::Pinning) else {
        return None;
    };
    // `ticket` and `sgt` were cleared before it was parked (`parkable`, `park`).
    g.phase = Phase::New;
    g.keeper = false;
    g.read_only = false;
    Some(pt)
}

/// Drops a registration taken out of the watch-pin cache: stops its
/// address watch and puts its watch pin (unless the free callback took
/// it). No lock held; sleeps.
pub(super) fn drop_parked(reg: Arc<Registration>) {
    // Out of the table, still marked: a free callback now queues the work
    // item, which finds nothing to take out (unload removes the flush file
    // before its own drain, so the work queue outlives this window).
    inject::DELAY_DROP_PARKED_MS.delay();
    reg.inner.lock().parked = false;
    reg.stats().watch_cache_evicted.inc();
    drop_unparked(reg);
}

/// `release`'s end for a registration not parked: its watch pin put
/// (where the caller can: otherwise left to its callback).
fn drop_unparked(reg: Arc<Registration>) {
    reg.stop_watch();
    reg.unpin_watch();
    reg.leave_to_callback();
}

/// The watch-pin cache of `nv_mem` registrations (`super::wcache`).
pub(crate) static WATCH_CACHE: WatchCache<Registration> = WatchCache::new();

impl Parkable for Registration {
    fn cache() -> &'static WatchCache<Self> {
        &WATCH_CACHE
    }
    fn may_be_parked(this: &Arc<Self>) -> bool {
        may_be_parked(this)
    }
    fn parked_bytes(this: &Arc<Self>) -> u64 {
        parked_bytes(this)
    }
    fn park(this: &Arc<Self>) -> bool {
        park(this)
    }
    fn drop_parked(this: Arc<Self>) {
        drop_parked(this)
    }
    fn drop_unparked(this: Arc<Self>) {
        drop_unparked(this)
    }
}
