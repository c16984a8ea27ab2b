// SPDX-License-Identifier: GPL-2.0

//! Event counters, one set per peer-memory client: the invalidating client
//! (`nv_mem`) in `/sys/kernel/debug/peermem/`, the non-invalidating one
//! (`nv_mem_nc`) in `/sys/kernel/debug/peermem/nc/`.
//!
//! Every counter only ever goes up; "live" quantities are differences
//! (e.g. `pages_pinned - pages_unpinned`), so a reader never sees a torn
//! pair of updates as a negative number. Code that does something calls
//! e.g. `STATS.pages_pinned.add(n)`; the debugfs files are created from
//! the list below, so a new counter needs no other change.

use crate::kapi::procfs::{ProcShow, ProcText};
use core::ffi::CStr;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// One monotonic event counter.
///
/// Relaxed atomics: a counter orders nothing, it is only read for
/// statistics. `core`'s atomics keep this independent of the kernel
/// crate's atomic API, which differs between the kernels peermem supports.
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// A counter at zero.
    pub(crate) const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Adds `n` events (wrapping at `u64::MAX`, which no real count reaches).
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one event.
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    /// The current value.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// The value, for the debugfs file that shows it.
    pub(crate) fn atomic(&self) -> &AtomicU64 {
        &self.0
    }
}

/// Turns an identifier into a `&'static CStr` at compile time.
macro_rules! c_name {
    ($field:ident) => {{
        const NAME: &CStr =
            match CStr::from_bytes_with_nul(concat!(stringify!($field), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => panic!("counter names are plain identifiers"),
            };
        NAME
    }};
}

macro_rules! define_stats {
    ($(#[doc = $sdoc:literal])+ $name:ident {
        $($(#[doc = $doc:literal])+ $field:ident,)+
    }) => {
        $(#[doc = $sdoc])+
        pub(crate) struct $name {
            $($(#[doc = $doc])+ pub(crate) $field: Counter,)+
        }

        impl $name {
            /// All counters at zero.
            pub(crate) const fn new() -> Self {
                Self { $($field: Counter::new(),)+ }
            }

            /// Number of counters (for the KUnit tests, which count `Stats`).
            #[allow(dead_code)]
            pub(crate) const COUNT: usize = [$(stringify!($field),)+].len();

            /// Calls `f` with the name and the counter, for every counter, in declaration order.
            pub(crate) fn for_each<'a>(&'a self, mut f: impl FnMut(&'static CStr, &'a Counter)) {
                $(f(c_name!($field), &self.$field);)+
            }
        }
    };
}

define_stats! {
    /// One client's counters; the field names are the debugfs file names.
    Stats {
    /// Ranges claimed in `acquire` (GPU memory, pinned for the registration).
    registrations_acquired,
    /// Ranges `acquire` declined: not GPU memory (or not pinnable); nothing held.
    registrations_declined,
    /// Claimed ranges given back in `release`. Live: acquired - released.
    registrations_released,
    /// Page tables pinned through `nvidia_p2p_get_pages*` (one per registration).
    page_tables_pinned,
    /// Page tables given back: put, or taken by the GPU driver's free callback.
    /// Live pins: pinned - unpinned.
    page_tables_unpinned,
    /// Page tables pinned whose flags say CPU_CACHEABLE (a v2 table, driver
    /// 580 or later, of a cache-coherent GPU such as Grace Hopper's): mapped
    /// for the NIC like any other (docs/module.md), counted to show it.
    page_tables_cpu_cacheable,
    /// GPU pages (64 KiB) pinned.
    pages_pinned,
    /// GPU pages unpinned, by `put_pages` or because the GPU memory was freed.
    pages_unpinned,
    /// Bytes pinned (pages_pinned in bytes).
    bytes_pinned,
    /// Bytes unpinned.
    bytes_unpinned,
    /// Successful `dma_map` calls.
    dma_maps,
    /// Mappings undone: by `dma_unmap`, or by the free callback. Live: dma_maps - dma_unmaps.
    dma_unmaps,
    /// Scatter-list entries before coalescing: one per GPU page mapped.
    sg_entries_uncoalesced,
    /// Scatter-list entries handed to the core after coalescing contiguous pages.
    sg_entries_coalesced,
    /// Free callbacks received from the GPU driver.
    free_callbacks,
    /// Free callbacks that came after a put of their page table had
    /// returned 0 (the driver answered a put while the callback was
    /// pending): their reference was returned by the put; nothing to do.
    free_callbacks_after_put,
    /// Invalidations sent to the core because the GPU memory was freed.
    invalidations_gpu_free,
    /// Registrations revoked because the process unmapped or moved their
    /// range (MMU notifier), including ones not registered yet (their
    /// registration then fails with EFAULT).
    address_changes,
    /// Invalidations sent to the core because the process unmapped or moved a registered range (MMU notifier).
    invalidations_mmu_notifier,
    /// Registration objects created (in `acquire`).
    objects_created,
    /// Registration objects freed (last reference gone). Live: created - freed.
    objects_freed,
    /// `nv_mem`: keeper pins taken in `acquire` (a persistent pin of the
    /// range beside the pin with the free callback; the keeper is what is
    /// DMA-mapped, and it keeps the memory until the revocation finished).
    keeper_pins,
    /// `nv_mem`: keeper pins given back. Live: keeper_pins - keeper_unpins.
    keeper_unpins,
    /// `nv_mem`: keeper pins the GPU driver refuses by design
    /// (`ENOTSUPP`: confidential computing, MIG without an internal P2P
    /// object); that registration falls back to one pin whose free
    /// callback waits for a mapping in progress, which can deadlock with a
    /// free racing the registration (logged; docs/architecture.md, "Locking").
    keeper_pins_refused,
    /// `nv_mem`: keeper pins that failed otherwise (`ENOMEM`: BAR1 full,
    /// after the process's cached pins were given back and one more try;
    /// any other error): the registration is declined (logged).
    keeper_pins_failed,
    /// `nv_mem`: pins with a free callback left with the GPU driver when
    /// their registration ended, because the process that would give them
    /// back is not the one that pinned them (NVIDIA's driver ignores a put
    /// from any other process): the deregistration ran in another process
    /// (a forked child, a passed file), or peermem unloaded while a
    /// process had cached pins. Each stays until the pinning process frees
    /// the memory or exits, when the driver calls its free callback.
    /// Left now: pins_left_to_callback - pins_left_freed.
    pins_left_to_callback,
    /// `nv_mem`: free callbacks of pins left to them.
    pins_left_freed,
    /// `nv_mem`: revocations the free callback queued to a work item (the
    /// core's invalidate, the PCI unmap and the keeper's put run there,
    /// after the callback returned).
    revocations_deferred,
    /// `nv_mem`: ranges the process unmapped or moved while `acquire`
    /// pinned them: claimed anyway, so the registration fails with EFAULT
    /// instead of going to `nv_mem_nc` (issue 22).
    registrations_stale,
    /// `nv_mem`: deregistered ranges parked in the watch-pin cache (the
    /// keeper put, the watch pin and the address watch kept). Cached now:
    /// parked - hits - evicted.
    watch_cache_parked,
    /// `nv_mem`: registrations that took a parked range (one pin, the
    /// keeper, instead of two).
    watch_cache_hits,
    /// `nv_mem`: parked ranges dropped (their watch pin put or freed): the
    /// memory was freed or the range unmapped, the cache needed the room,
    /// it was flushed (`watch_cache_flush`, a failed pin), or unload.
    watch_cache_evicted,
    /// Calls that failed, for any reason (each failure also logs why).
    errors,
    }
}

define_stats! {
    /// The PFN-map source's PCI BAR path (`/sys/kernel/debug/peermem/pfn/`,
    /// next to its [`Stats`]); the field names are the debugfs file names.
    BarStats {
    /// `dma_map` calls on a PCI BAR served by the BAR's bus addresses (the
    /// DMA device reaches it through a PCIe switch, no IOMMU on the way).
    bar_maps_bus_addr,
    /// `dma_map` calls on a PCI BAR served with `dma_map_resource` (through a
    /// host bridge the kernel allows peer-to-peer).
    bar_maps_host_bridge,
    /// `dma_map` calls on a PCI BAR refused with EOPNOTSUPP: the DMA device
    /// cannot reach it peer-to-peer (`pci_p2pdma_distance`).
    bar_maps_refused,
    }
}

define_stats! {
    /// The PFN-map source's walks of a range's page tables
    /// (`/sys/kernel/debug/peermem/pfn/`, next to its [`Stats`]); the field
    /// names are the debugfs file names.
    WalkStats {
    /// Walks begun (one per PFN-mapped range looked at). Running: started - ended.
    walks_started,
    /// Walks ended, however.
    walks_ended,
    /// Pages read (`follow_pfnmap_start/end`), by all walks.
    walk_pages,
    /// Lookups in the firmware's resource map (`/proc/iomem`), by all walks.
    walk_resource_lookups,
    /// Walks stopped because their process got a fatal signal.
    walks_killed,
    /// Walks refused because the range has more physical runs than the
    /// limit (docs/module.md, "PFN-mapped memory", Limits).
    walks_over_limit,
    }
}

/// The version and flags of the last page table pinned (either client),
/// shown in hex in `/sys/kernel/debug/peermem/last_pin_version` and
/// `last_pin_flags`: which layout the GPU driver hands out (0x00010002:
/// 550-575, 0x00020000: 580 on) and, for a v2 table, its flags (0 for v1).
/// Both 0 until the first pin. The two are written one after the other, so
/// a reader racing a pin may see one of each.
pub(crate) struct LastPin {
    version: AtomicU32,
    flags: AtomicU32,
}

impl LastPin {
    const fn new() -> Self {
        Self {
            version: AtomicU32::new(0),
            flags: AtomicU32::new(0),
        }
    }

    /// Records a pinned table's version and flags.
    pub(crate) fn record(&self, version: u32, flags: u32) {
        self.version.store(version, Ordering::Relaxed);
        self.flags.store(flags, Ordering::Relaxed);
    }

    /// Calls `f` with each debugfs file name and its value.
    pub(crate) fn for_each(&'static self, mut f: impl FnMut(&'static CStr, &'static AtomicU32)) {
        f(c"last_pin_version", &self.version);
        f(c"last_pin_flags", &self.flags);
    }
}

/// The last pin's page-table version and flags.
pub(crate) static LAST_PIN: LastPin = LastPin::new();

/// The counters of the invalidating client (`nv_mem`), and of what is not
/// any one registration's (free callbacks only come for its pins).
pub(crate) static STATS: Stats = Stats::new();

/// The counters of the non-invalidating client (`nv_mem_nc`).
pub(crate) static STATS_NC: Stats = Stats::new();

/// The counters of the PFN-map source (registrations of PFN-mapped memory
/// through `nv_mem`, `/sys/kernel/debug/peermem/pfn/`): "pinned" there
/// means held for a registration (no reference is taken), a page is 4 KiB
/// (`PAGE_SIZE`), a page table is one registration's runs, and
/// `registrations_declined` counts PFN-mapped ranges refused (the range
/// first went through the GPU source, which counts it declined in `nv_mem`).
pub(crate) static STATS_PFN: Stats = Stats::new();

/// The PFN-map source's PCI BAR counters, in `/sys/kernel/debug/peermem/pfn/`.
pub(crate) static STATS_PFN_BAR: BarStats = BarStats::new();

/// The PFN-map source's walk counters, in `/sys/kernel/debug/peermem/pfn/`.
pub(crate) static STATS_PFN_WALK: WalkStats = WalkStats::new();

/// The sets of counters, each with its directory under debugfs (`None`:
/// the top one) and its name in `/proc/driver/peermem`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Set {
    /// `nv_mem`'s: debugfs's top directory, `client`.
    Client,
    /// `nv_mem_nc`'s: `nc/`, `client_nc`.
    ClientNc,
    /// The PFN-map source's: `pfn/`, `pfn`.
    Pfn,
}

impl Set {
    /// Every set, in the order they are shown.
    pub(crate) const ALL: [Set; 3] = [Set::Client, Set::ClientNc, Set::Pfn];

    /// Its debugfs subdirectory; `None` for the top directory.
    pub(crate) fn debugfs_dir(self) -> Option<&'static CStr> {
        match self {
            Set::Client => None,
            Set::ClientNc => Some(c"nc"),
            Set::Pfn => Some(c"pfn"),
        }
    }

    /// Its name in `/proc/driver/peermem`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Set::Client => "client",
            Set::ClientNc => "client_nc",
            Set::Pfn => "pfn",
        }
    }

    /// Calls `f` with the name and counter of each of its counters.
    pub(crate) fn for_each(self, mut f: impl FnMut(&'static CStr, &'static Counter)) {
        match self {
            Set::Client => STATS.for_each(f),
            Set::ClientNc => STATS_NC.for_each(f),
            Set::Pfn => {
                STATS_PFN.for_each(&mut f);
                STATS_PFN_BAR.for_each(&mut f);
                STATS_PFN_WALK.for_each(&mut f);
            }
        }
    }
}

/// The counters anyone may read: `/proc/driver/peermem`, one line
/// `SET NAME VALUE` a counter, SET `client` ([`STATS`]), `client_nc`
/// ([`STATS_NC`]) or `pfn` (the PFN-map source's). They are sums over
/// every process of the machine, with no address, process or kernel
/// pointer in them (how much GPU memory registration the machine does, as
/// `/proc/interrupts` says how much I/O): what a monitoring agent without
/// root needs, and nothing about any one process. The test knobs, the
/// watch-pin cache's flush and the last page table's version stay in
/// debugfs (root).
pub(crate) struct PublicCounters;

impl ProcShow for PublicCounters {
    fn show(out: &mut ProcText<'_>) -> fmt::Result {
        let mut res = Ok(());
        for set in Set::ALL {
            set.for_each(|name, c| {
                if res.is_ok() {
                    res = writeln!(
                        out,
                        "{} {} {}",
                        set.name(),
                        name.to_str().unwrap_or("?"),
                        c.get()
                    );
                }
            });
        }
        res
    }
}

#[cfg(peermem_kunit)]
#[::kernel::macros::kunit_tests(peermem_stats)]
mod tests {
    use super::*;

    #[test]
    fn counter_starts_at_zero_and_adds() {
        let c = Counter::new();
        assert_eq!(c.get(), 0);
        c.inc();
        c.add(41);
        assert_eq!(c.get(), 42);
        c.add(0);
        assert_eq!(c.get(), 42);
    }

    #[test]
    fn every_counter_is_listed_once_with_its_own_name() {
        let stats = Stats::new();
        let mut n = 0usize;
        let mut names: [&CStr; Stats::COUNT] = [c""; Stats::COUNT];
        stats.for_each(|name, counter| {
            if n < Stats::COUNT {
                names[n] = name;
            }
            n += 1;
            // Each counter is a distinct object: bumping one by its index
            // must show on that one only (checked below).
            counter.add(n as u64);
        });
        assert_eq!(n, Stats::COUNT);
        let mut i = 0;
        while i < Stats::COUNT {
            assert!(!names[i].to_bytes().is_empty());
            let mut j = i + 1;
            while j < Stats::COUNT {
                assert!(names[i] != names[j]);
                j += 1;
            }
            i += 1;
        }
        let mut k = 0u64;
        stats.for_each(|_, counter| {
            k += 1;
            assert_eq!(counter.get(), k);
        });
        assert_eq!(stats.errors.get(), Stats::COUNT as u64);
    }

    #[test]
    fn names_are_the_field_names() {
        let stats = Stats::new();
        let mut first: Option<&CStr> = None;
        let mut last: Option<&CStr> = None;
        stats.for_each(|name, _| {
            if first.is_none() {
                first = Some(name);
            }
            last = Some(name);
        });
        assert!(first == Some(c"registrations_acquired"));
        assert!(last == Some(c"errors"));
    }
}
