// SPDX-License-Identifier: GPL-2.0

//! Test knobs: delays that widen the windows in which the GPU driver's free
//! callback can race a registration, so tests can hit each one on purpose.
//!
//! Files `inject_*` in `/sys/kernel/debug/peermem/` (root only, 0 = off):
//! the delay in milliseconds at one point of peermem's code, where another
//! thread (a free callback, the address-change work item, the core's next
//! call, module unload) can come in. `get_pages` and `dma_map`: at the
//! start of the core's call, before peermem takes the registration lock;
//! the core holds the umem's mapping lock across both calls, so an
//! invalidation waits meanwhile, as it would for a slow driver. The others
//! mark the windows of the lifetime bugs the tests reproduce
//! (`tests/guest/peermem/t_peermem_lifetime.c`).
//!
//! Each knob also counts the delays it made: `inject/<knob>.entered` when a
//! thread began to sleep in it, `inject/<knob>.left` when it woke (read-only
//! files; both move only while the knob is on). A test that lands another
//! thread's action in the window waits for `entered` to move and checks
//! that `left` had not yet (`tests/guest/peermem/t_peermem_matrix.c`).
//!
//! Only in rig builds (`--cfg peermem_rig`, Kbuild's `PEERMEM_RIG`, on for a
//! build from the checkout, off in the DKMS and package builds): elsewhere
//! no file is created and every delay is zero, compiled out.

// Outside rig builds nothing creates the files (peermem.rs).
#![cfg_attr(not(peermem_rig), allow(dead_code))]

use super::stats::Counter;
use core::ffi::CStr;
use core::sync::atomic::{AtomicU32, Ordering};

/// One delay knob, in milliseconds, with the count of delays begun and ended.
pub(crate) struct Knob {
    ms: AtomicU32,
    entered: Counter,
    left: Counter,
}

impl Knob {
    const fn new() -> Self {
        Self {
            ms: AtomicU32::new(0),
            entered: Counter::new(),
            left: Counter::new(),
        }
    }

    /// The value, for the debugfs file that reads and writes it.
    pub(crate) fn atomic(&self) -> &AtomicU32 {
        &self.ms
    }

    /// The delay the knob says, in milliseconds (longest: 10 s; always 0
    /// outside rig builds).
    pub(crate) fn ms(&self) -> u32 {
        if cfg!(peermem_rig) {
            self.ms.load(Ordering::Relaxed).min(10_000)
        } else {
            0
        }
    }

    /// Sleeps as long as the knob says (longest: 10 s), counted in
    /// `entered` before and `left` after.
    pub(crate) fn delay(&self) {
        let ms = self.ms();
        if ms != 0 {
            self.entered.inc();
            crate::kapi::delay::msleep(ms);
            self.left.inc();
        }
    }
}

/// Delay in `acquire` after the pin, before the registration lock is taken
/// (the pin runs with no lock held).
pub(crate) static DELAY_ACQUIRE_MS: Knob = Knob::new();
/// Delay at the start of `get_pages` (between `acquire` and the ticket).
pub(crate) static DELAY_GET_PAGES_MS: Knob = Knob::new();
/// Delay at the start of `dma_map` (after `get_pages`, before the mapping).
pub(crate) static DELAY_DMA_MAP_MS: Knob = Knob::new();

/// Delay in `put_pages`/`release` after the page table was taken out of
/// the registration and the lock dropped, before it is given back.
pub(crate) static DELAY_UNPIN_MS: Knob = Knob::new();
/// Delay in `release` after it found no invalidation running, before it
/// unpins and returns.
pub(crate) static DELAY_RELEASE_MS: Knob = Knob::new();
/// Delay at the start of the address-change work item, before it takes
/// the registration lock (the notifier has fired; the revocation is to come).
pub(crate) static DELAY_ADDRESS_WORK_MS: Knob = Knob::new();
/// Delay in the address-change work item after the core's invalidate
/// returned, before the mapping is undone.
pub(crate) static DELAY_ADDRESS_CHANGE_MS: Knob = Knob::new();
/// Delay in the free callback before it calls the core's invalidate.
pub(crate) static DELAY_INVALIDATE_MS: Knob = Knob::new();
/// Delay at the end of the free callback, before it drops its reference.
pub(crate) static DELAY_FREE_CALLBACK_MS: Knob = Knob::new();
/// Delay in the teardown of a registration (its last reference dropped).
pub(crate) static DELAY_TEARDOWN_MS: Knob = Knob::new();

/// Delay at the end of `get_pages`, inside it: the GPU source after the
/// ticket was stored and the lock dropped; the PFN source after the walk
/// read the runs, before they are stored (under the lock, if the range did
/// not change meanwhile).
pub(crate) static DELAY_GET_PAGES_INNER_MS: Knob = Knob::new();
/// Delay inside `dma_map`, in `Mapping` with the lock dropped, before the
/// table is mapped for the device.
pub(crate) static DELAY_MAPPING_MS: Knob = Knob::new();
/// Delay at the start of `dma_unmap`, before the registration lock.
pub(crate) static DELAY_DMA_UNMAP_MS: Knob = Knob::new();
/// Delay at the start of `put_pages`, before anything (the PFN source's
/// put has no other window: it holds no pin).
pub(crate) static DELAY_PUT_PAGES_MS: Knob = Knob::new();

/// Delay in dropping a registration taken out of the watch-pin cache's
/// table (a flush, making room, unload), before its `parked` mark is
/// cleared and its watch pin put.
pub(crate) static DELAY_DROP_PARKED_MS: Knob = Knob::new();

/// PFN-map source: delay in the walk of a range's page tables, every
/// 4096 pages (`PEERMEM_PFN_WALK_BATCH`) (a long walk of a large ring, made
/// long on purpose).
pub(crate) static DELAY_PFN_WALK_MS: Knob = Knob::new();

/// A knob's files: the knob's own, and its counters' (in `inject/`).
pub(crate) struct Names {
    pub(crate) knob: &'static CStr,
    pub(crate) entered: &'static CStr,
    pub(crate) left: &'static CStr,
}

/// A `&'static CStr` from string literals, at compile time.
macro_rules! cstr {
    ($($s:expr),+) => {{
        const NAME: &CStr = match CStr::from_bytes_with_nul(concat!($($s),+, "\0").as_bytes()) {
            Ok(name) => name,
            Err(_) => panic!("knob names are plain words"),
        };
        NAME
    }};
}

macro_rules! names {
    ($n:literal) => {
        Names {
            knob: cstr!($n),
            entered: cstr!($n, ".entered"),
            left: cstr!($n, ".left"),
        }
    };
}

/// Calls `f` with the files' names and the knob, for every knob.
pub(crate) fn for_each(mut f: impl FnMut(Names, &'static Knob)) {
    f(names!("inject_delay_acquire_ms"), &DELAY_ACQUIRE_MS);
    f(names!("inject_delay_get_pages_ms"), &DELAY_GET_PAGES_MS);
    f(
        names!("inject_delay_get_pages_inner_ms"),
        &DELAY_GET_PAGES_INNER_MS,
    );
    f(names!("inject_delay_dma_map_ms"), &DELAY_DMA_MAP_MS);
    f(names!("inject_delay_mapping_ms"), &DELAY_MAPPING_MS);
    f(names!("inject_delay_dma_unmap_ms"), &DELAY_DMA_UNMAP_MS);
    f(names!("inject_delay_put_pages_ms"), &DELAY_PUT_PAGES_MS);
    f(names!("inject_delay_unpin_ms"), &DELAY_UNPIN_MS);
    f(names!("inject_delay_release_ms"), &DELAY_RELEASE_MS);
    f(
        names!("inject_delay_address_work_ms"),
        &DELAY_ADDRESS_WORK_MS,
    );
    f(
        names!("inject_delay_address_change_ms"),
        &DELAY_ADDRESS_CHANGE_MS,
    );
    f(names!("inject_delay_invalidate_ms"), &DELAY_INVALIDATE_MS);
    f(
        names!("inject_delay_free_callback_ms"),
        &DELAY_FREE_CALLBACK_MS,
    );
    f(names!("inject_delay_teardown_ms"), &DELAY_TEARDOWN_MS);
    f(names!("inject_delay_pfn_walk_ms"), &DELAY_PFN_WALK_MS);
    f(names!("inject_delay_drop_parked_ms"), &DELAY_DROP_PARKED_MS);
}

impl Knob {
    /// The counter of delays begun (`entered`) or ended, for debugfs.
    pub(crate) fn counter(&self, entered: bool) -> &Counter {
        if entered {
            &self.entered
        } else {
            &self.left
        }
    }
}
