// SPDX-License-Identifier: GPL-2.0

//! Test knobs: delays that widen the windows in which the GPU driver's free
//! callback can race a registration, so tests can hit each one on purpose.
//!
//! Files `inject_*` in `/sys/kernel/debug/peermem/` (root only, 0 = off):
//! the delay in milliseconds at the start of the core's call, before
//! peermem takes the registration lock. The core holds the umem's mapping
//! lock across both calls, so an invalidation waits meanwhile, as it would
//! for a slow driver.

use core::sync::atomic::{AtomicU32, Ordering};

/// One delay knob, in milliseconds.
pub(crate) struct Knob(AtomicU32);

impl Knob {
    const fn new() -> Self {
        Self(AtomicU32::new(0))
    }

    /// The value's storage, for the debugfs file that reads and writes it.
    pub(crate) fn as_ptr(&self) -> *mut u32 {
        self.0.as_ptr()
    }

    /// Sleeps as long as the knob says (longest: 10 s).
    pub(crate) fn delay(&self) {
        let ms = self.0.load(Ordering::Relaxed).min(10_000);
        if ms != 0 {
            crate::ffi::msleep(ms);
        }
    }
}

/// Delay at the start of `get_pages` (between `acquire` and the ticket).
pub(crate) static DELAY_GET_PAGES_MS: Knob = Knob::new();
/// Delay at the start of `dma_map` (after `get_pages`, before the mapping).
pub(crate) static DELAY_DMA_MAP_MS: Knob = Knob::new();

/// Calls `f` with the file name and the knob, for every knob.
pub(crate) fn for_each(mut f: impl FnMut(&'static core::ffi::CStr, &'static Knob)) {
    f(c"inject_delay_get_pages_ms", &DELAY_GET_PAGES_MS);
    f(c"inject_delay_dma_map_ms", &DELAY_DMA_MAP_MS);
}
