// SPDX-License-Identifier: GPL-2.0

//! The driver: peermem's two peer-memory clients, what they do for each
//! callback of the core, for the GPU driver's free callback and for an
//! address-space change. It stands on the abstractions in `crate::kapi`
//! and holds no raw code: its only `unsafe` blocks call their `unsafe fn`s,
//! each saying how the obligation is met.
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
//! (from `acquire` to `release`), and, for a pin with a free callback
//! (`nv_mem`), the callback's, kept in a registry under an id that is the
//! callback's `data` ([`crate::kapi::cbref`]). Whoever removes it from the
//! registry owns it: the free callback, on entry, or the put after it
//! returned 0. Removal is atomic, so this holds whatever the driver's put
//! returns and whenever its callback runs.
//!
//! An `nv_mem` registration holds two pins (docs/architecture.md, "The keeper"):
//! the **watch pin** (`nvidia_p2p_get_pages`, with the free callback; in
//! `gpu::WatchPin`), which only tells peermem that the memory is being
//! freed, and the **keeper** (`nvidia_p2p_get_pages_persistent`), the
//! phase's table, which is what gets mapped and what keeps the memory
//! until the revocation finished. Without a keeper (the driver refuses
//! persistent pins by design) the phase holds the pin with the callback.
//! `nv_mem_nc` and the PFN source hold one persistent pin or nothing.
//!
//! The phase ([`Phase`], the keeper's table) lives under the
//! registration's own lock:
//!
//! ```text
//!  acquire: New --watch pin, keeper--> Pinned --get_pages (ticket)--> Pinned --dma_map--> Mapping --> Mapped
//!                                                                       ^     (map failed) |          |
//!                                                                       +------------------+-dma_unmap-+
//!  put_pages/release:  Pinned --> Unpinning --put returned--> Unpinned    (then the watch pin's put)
//!  free callback:  the watch pin goes to the driver (Held -> Gone), gpu_freed is marked and the
//!                  revocation queued to a work item; the keeper keeps the memory meanwhile
//!                  (without a keeper: Pinned | Mapped --> Freed, invalidating in the callback)
//!  revocation (work item: GPU free or address change): Pinned | Mapped, revoked
//!                  (then: invalidate through the core, unmap, give the keeper back)
//! ```
//!
//! A pin with a free callback is given back only in the process that made
//! it (NVIDIA's driver ignores a put from anywhere else:
//! [`crate::kapi::nvidia_p2p`]). A revocation's work item therefore leaves
//! the watch pin to the registration's release; a release in another
//! process, or unload, leaves it to its free callback, whose registry
//! entry keeps the registration until then (docs/module.md, "Which
//! process gives a pin back").
//!
//! # Address-space changes
//!
//! An `nv_mem` registration also watches its range in the address
//! space of the process that registered it ([`crate::kapi::mmu_notifier::AddressWatch`],
//! an mmu interval notifier). When the process unmaps or moves the range, the
//! addresses no longer mean the pinned GPU memory: a work item marks the
//! registration `revoked`, invalidates it through the core like a free
//! does, then unmaps it and gives the keeper back itself (with
//! `PEER_MEM_INVALIDATE_UNMAPS` the core no longer does). The watch is
//! started in `acquire` before the pin and stopped in `release` (or when
//! `acquire` declines, or when the watch-pin cache drops a parked
//! registration) before the last reference that is not the notifier's
//! goes; the work item holds its own reference.
//!
//! # Locking
//!
//! NVIDIA's driver takes its resource-manager (RM) lock inside
//! `nvidia_p2p_get_pages*`, `nvidia_p2p_dma_map_pages` and
//! `nvidia_p2p_put_pages*`, and calls free callbacks with it held (gpusim's
//! `rm_lock` emulates it). The free callback takes the registration lock,
//! so the registration lock is never held across any of those calls:
//! `acquire` pins before it locks (a callback that comes first finds the
//! watch pin `Pinning` and marks `gpu_freed`), `dma_map` maps in
//! `Mapping`, outside the lock (the table is its own then; every other
//! path waits for the phase to end), and the puts are made outside the
//! lock. Nor is it held while calling the core's invalidate (the core
//! waits there for the umem's mapping lock, held across
//! `get_pages`/`dma_map`, which take this lock). With a keeper the free
//! callback waits for nothing and never calls the core: the revocation
//! runs in a work item. Only `nvidia_p2p_dma_unmap_pages` runs under the
//! registration lock (the driver takes no RM lock there). What remains is
//! the fallback without a keeper: OFED's core holds the umem's mapping lock
//! across `dma_map`, hence across `nvidia_p2p_dma_map_pages`, and that
//! callback must invalidate through the core, which takes that lock. See
//! `docs/architecture.md`, "Locking".

use crate::kapi::device::DmaDevice;
use crate::kapi::mmu_notifier::{AddressChange, Unmapping};
use crate::kapi::nvidia_p2p::FreeCallback;
use crate::kapi::peer_mem::{ClientSlot, Invalidation, PeerMemoryClient, Ticket};
use crate::kapi::scatterlist::SgView;
use crate::kapi::work::Deferred;
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};

mod checks;
pub(crate) mod events;
pub(crate) mod inject;
pub(crate) mod params;
pub(crate) mod range;
mod registration;
mod source;
pub(crate) mod stats;
pub(crate) mod wcache;

pub(crate) use registration::{Registration, WATCH_CACHE};
use stats::{Stats, STATS, STATS_NC};

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

/// The invalidating client, `nv_mem`.
pub(crate) struct NvMem;

/// The non-invalidating client, `nv_mem_nc`.
pub(crate) struct NvMemNc;

/// The callbacks both clients share; `KIND` says whose counters and pins.
macro_rules! peer_client {
    ($client:ty, $kind:expr, $invalidation:expr) => {
        impl PeerMemoryClient for $client {
            type Registration = Registration;
            const INVALIDATION: Invalidation = $invalidation;

            fn slot() -> &'static ClientSlot {
                static SLOT: ClientSlot = ClientSlot::new();
                &SLOT
            }

            fn acquire(addr: u64, size: u64) -> Option<Arc<Registration>> {
                registration::acquire($kind, addr, size)
            }

            fn get_pages(
                reg: ArcBorrow<'_, Registration>,
                addr: u64,
                size: u64,
                read_only: bool,
                ticket: Ticket,
            ) -> Result {
                registration::get_pages(&reg, addr, size, read_only, ticket)
            }

            fn dma_map(
                reg: ArcBorrow<'_, Registration>,
                dev: Option<&DmaDevice<'_>>,
            ) -> Result<SgView> {
                registration::dma_map(&reg, dev)
            }

            fn dma_unmap(reg: ArcBorrow<'_, Registration>, sgl: usize) {
                registration::dma_unmap(&reg, sgl)
            }

            fn put_pages(reg: ArcBorrow<'_, Registration>) {
                registration::put_pages(&reg)
            }

            fn page_size(reg: ArcBorrow<'_, Registration>) -> u64 {
                registration::page_size(&reg)
            }

            fn release(reg: Arc<Registration>) {
                registration::release(reg)
            }
        }
    };
}

peer_client!(NvMem, Kind::Invalidating, Invalidation::Unmaps);
peer_client!(NvMemNc, Kind::Persistent, Invalidation::None);

impl FreeCallback for Registration {
    fn freed(this: Arc<Self>) {
        registration::gpu_freed(this)
    }

    fn freed_after_put() {
        registration::gpu_freed_after_put()
    }
}

impl Deferred for Registration {
    fn run(this: Arc<Self>) {
        registration::revoke_after_free(this)
    }
}

impl AddressChange for Registration {
    fn changed(this: Arc<Self>) {
        registration::address_changed(this)
    }

    fn unmapping(this: &Self, how: Unmapping) {
        registration::address_unmapping(this, how.into())
    }
}
