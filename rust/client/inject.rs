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

use core::sync::atomic::{AtomicU32, Ordering};

/// One delay knob, in milliseconds.
pub(crate) struct Knob(AtomicU32);

impl Knob {
    const fn new() -> Self {
        Self(AtomicU32::new(0))
    }

    /// The value, for the debugfs file that reads and writes it.
    pub(crate) fn atomic(&self) -> &AtomicU32 {
        &self.0
    }

    /// The delay the knob says, in milliseconds (longest: 10 s).
    pub(crate) fn ms(&self) -> u32 {
        self.0.load(Ordering::Relaxed).min(10_000)
    }

    /// Sleeps as long as the knob says (longest: 10 s).
    pub(crate) fn delay(&self) {
        let ms = self.ms();
        if ms != 0 {
            crate::kapi::delay::msleep(ms);
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

/// PFN-map source: delay in the walk of a range's page tables, every
/// 4096 pages (`PEERMEM_PFN_WALK_BATCH`) (a long walk of a large ring, made
/// long on purpose).
pub(crate) static DELAY_PFN_WALK_MS: Knob = Knob::new();

/// Calls `f` with the file name and the knob, for every knob.
pub(crate) fn for_each(mut f: impl FnMut(&'static core::ffi::CStr, &'static Knob)) {
    f(c"inject_delay_acquire_ms", &DELAY_ACQUIRE_MS);
    f(c"inject_delay_get_pages_ms", &DELAY_GET_PAGES_MS);
    f(c"inject_delay_dma_map_ms", &DELAY_DMA_MAP_MS);
    f(c"inject_delay_unpin_ms", &DELAY_UNPIN_MS);
    f(c"inject_delay_release_ms", &DELAY_RELEASE_MS);
    f(c"inject_delay_address_work_ms", &DELAY_ADDRESS_WORK_MS);
    f(c"inject_delay_address_change_ms", &DELAY_ADDRESS_CHANGE_MS);
    f(c"inject_delay_invalidate_ms", &DELAY_INVALIDATE_MS);
    f(c"inject_delay_free_callback_ms", &DELAY_FREE_CALLBACK_MS);
    f(c"inject_delay_teardown_ms", &DELAY_TEARDOWN_MS);
    f(c"inject_delay_pfn_walk_ms", &DELAY_PFN_WALK_MS);
}
