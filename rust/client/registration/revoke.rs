// SPDX-License-Identifier: GPL-2.0

//! The ends of a registration that do not come from the core: the GPU
//! driver's free callback (with a keeper: the revocation it queues), and
//! the address watch's notifier and work item when the process unmaps or
//! moves the range. Each revokes the registration through the core's
//! invalidate and gives its pins back.

use super::super::events;
use super::super::inject;
use super::super::source::gpu::{self, WatchFreed};
use super::super::stats::STATS;
use super::park::{drop_parked, WATCH_CACHE};
use super::{Inner, Mapped, Pages, Phase, Registration};
use crate::kapi::peer_mem::Ticket;
use kernel::prelude::*;
use kernel::sync::Arc;

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
///
/// With a keeper (the normal case) it waits for nothing that waits for the
/// driver and never calls the core: it gives the watch pin's table to the
/// driver, marks the registration, and queues the revocation
/// ([`revoke_after_free`]); the keeper keeps the memory until that ran.
pub(crate) fn gpu_freed(reg: Arc<Registration>) {
    let stats = reg.stats();
    stats.free_callbacks.inc();
    let mut g = reg.inner.lock();
    if core::mem::replace(&mut g.left_to_callback, false) {
        stats.pins_left_freed.inc();
    }
    match g.watch_pin.freed(stats) {
        WatchFreed::Unkept => {
            // No keeper: the pin with this callback is the phase's.
            drop(g);
            gpu_freed_unkept(reg);
            return;
        }
        // The memory is being freed: `acquire`, if still pinning, sees
        // the mark and declines; `get_pages`/`dma_map` fail with EFAULT
        // from now on; a live registration is revoked (below).
        WatchFreed::Freed => g.gpu_freed = true,
        WatchFreed::Nothing => {}
    }
    // The keeper is pinned (maybe being mapped) and nothing revoked it
    // yet: queue the revocation. Under the lock, so that `release` (which
    // takes it before the keeper goes) cannot have returned, and unload
    // cannot have torn the work queue down, before the item is queued.
    let live = matches!(
        g.phase,
        Phase::Pinned(_) | Phase::Mapped(_) | Phase::Mapping
    ) && !g.revoked;
    if g.gpu_freed && g.parked {
        // In the watch-pin cache: the work item takes it out.
        if let Some(work) = &reg.revoke_work {
            // SAFETY: `reg` owns the item; the registration lock is held
            // and it is marked parked. Every path that takes an entry out
            // of the cache clears the mark under this lock: at unload the
            // drain does so before it returns, and the work queue is torn
            // down after that; this work item (`revoke`) clears it in the
            // same critical section as it takes the entry out; hits end
            // before unload begins.
            unsafe { work.queue(reg.clone()) };
        }
    }
    if g.gpu_freed && live {
        revoke_event(&reg, events::Cause::GpuFree);
        if let Some(work) = &reg.revoke_work {
            // SAFETY: `reg` owns the item; the registration lock is held
            // and the keeper is pinned, so the core has not released the
            // registration (release unpins under this lock first) and the
            // work queue, torn down at unload after every release, exists.
            if unsafe { work.queue(reg.clone()) } {
                stats.revocations_deferred.inc();
            }
        }
    }
    drop(g);
    inject::DELAY_FREE_CALLBACK_MS.delay();
    drop(reg);
}

/// The revocation a free callback queued: from a work item, no lock held,
/// after the callback returned (the driver may have freed the watch pin's
/// table; the keeper keeps the memory). The core revokes the device's
/// access, then peermem unmaps and gives the keeper back.
pub(crate) fn revoke_after_free(reg: Arc<Registration>) {
    revoke(reg, Revocation::GpuFree);
}

/// What revokes a registration.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Revocation {
    /// The GPU memory was freed (work item queued by the free callback).
    GpuFree,
    /// The process unmapped or moved the range (the address watch's work item).
    AddressChange,
}

/// Revokes `reg` (a work item's reference; no lock held): marks it
/// `revoked` if it is still pinned, calls the core's invalidate with the
/// ticket, if any (the core revokes the device's access synchronously:
/// the next RDMA completes in error), then unmaps the PCI mapping (the
/// core's table stays until `dma_unmap`/`release`) and gives the pages
/// back, which the core no longer does after an invalidation. Nothing to
/// do if the memory was freed, revoked or given back meanwhile.
fn revoke(reg: Arc<Registration>, why: Revocation) {
    let stats = reg.stats();
    // A parked registration whose memory was freed or range unmapped:
    // out of the cache (a registration that took it meanwhile sees the
    // mark and pins afresh). Taken out of the table and unmarked in one
    // critical section, so that no free callback queues this work item
    // again once it is out of the table (at unload the drain has returned
    // and the work queue is being torn down).
    let unparked = {
        let mut g = reg.inner.lock();
        if !g.parked {
            None
        } else if why == Revocation::AddressChange {
            // Its range was unmapped or moved: the watch's fired mark keeps
            // any registration from reusing it. It stays in the table: its
            // watch pin can be given back only by the process that pinned
            // it (this is a work item), which does so when it next meets
            // the entry (a registration of the range, the cache making room
            // or a flush in that process), or the driver calls its free
            // callback (the memory is freed, or that process exits).
            return;
        } else {
            g.parked = false;
            Some(WATCH_CACHE.remove(&reg))
        }
    };
    if let Some(taken) = unparked {
        if let Some(parked) = taken {
            // The window between taking the entry out and putting its pin
            // (a free callback in it must not queue this work item again).
            inject::DELAY_ADDRESS_CHANGE_MS.delay();
            drop_parked(parked);
        }
        return;
    }
    let ticket = {
        let mut g = reg.lock_settled();
        if g.revoked {
            return;
        }
        match g.phase {
            // `acquire` is pinning with the lock dropped (PFN source:
            // `get_pages` is reading the runs): it finds the mark when it
            // takes the lock and declines the range (fails). Only an
            // address change gets here.
            Phase::New => {
                g.revoked = true;
                drop(g);
                stats.address_changes.inc();
                return;
            }
            Phase::Pinned(_) | Phase::Mapped(..) => {}
            _ => return,
        }
        g.revoked = true;
        g.begin_invalidate()
    };
    if why == Revocation::AddressChange {
        stats.address_changes.inc();
    }
    // Without a ticket the core has not called get_pages yet; it will fail.
    if let Some(ticket) = ticket {
        if why == Revocation::GpuFree {
            inject::DELAY_INVALIDATE_MS.delay();
        }
        // SAFETY: counted in `invalidating`, which `release` waits on
        // before it clears the ticket, so the core has not released the
        // registration and does not until `end_invalidate`; no lock held.
        if unsafe { ticket.invalidate() }.is_some() {
            match why {
                Revocation::GpuFree => stats.invalidations_gpu_free.inc(),
                Revocation::AddressChange => stats.invalidations_mmu_notifier.inc(),
            }
        }
        reg.end_invalidate();
    }
    inject::DELAY_ADDRESS_CHANGE_MS.delay();
    // The table itself stays until dma_unmap or the registration goes.
    reg.lock_settled().unmap(stats);
    reg.unpin();
}

/// The free callback of a registration without a keeper (the driver
/// refused the persistent pin): the pin with the callback is the phase's,
/// so the callback must revoke before it returns, and wait for a mapping
/// in progress (docs/architecture.md, "Locking": this is the wait that can
/// deadlock with the driver's lock).
fn gpu_freed_unkept(reg: Arc<Registration>) {
    let stats = reg.stats();
    let (ticket, mapped) = {
        // Waits while `dma_map` maps the table: it is `dma_map`'s then, and
        // must stay valid until the driver's map call returned. (A free
        // racing a registration of the same memory on NVIDIA's driver: the
        // map call may wait for the driver's lock this callback runs under.
        // No client can avoid that: docs/architecture.md, "Locking".)
        let mut g = reg.lock_settled();
        match core::mem::replace(&mut g.phase, Phase::Freed) {
            Phase::New => {
                // The memory was freed right after the pin, before `acquire`
                // stored the table: it sees `Freed` and declines.
                (None, None)
            }
            Phase::Pinned(Pages::Gpu(pt)) => {
                gpu::count_unpinned(stats, pt.entries());
                pt.give_to_driver();
                revoke_event(&reg, events::Cause::GpuFree);
                (g.begin_invalidate(), None)
            }
            Phase::Mapped(Mapped::Gpu(mapped)) => {
                gpu::count_unpinned(stats, mapped.table().entries());
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
    revoke(reg, Revocation::AddressChange);
}

impl Inner {
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
    /// The core's invalidate returned (after [`Inner::begin_invalidate`] gave a ticket).
    fn end_invalidate(&self) {
        let mut g = self.inner.lock();
        g.invalidating -= 1;
        if g.invalidating == 0 {
            self.invalidated.notify_all();
        }
    }
}
