// SPDX-License-Identifier: GPL-2.0

//! Knobs and counters, exposed in `/sys/kernel/debug/gpusim/`.
//!
//! All are plain atomics in statics: the entry points read them without any
//! lock, and debugfs reads/writes them through the kernel's debugfs
//! abstraction. See docs/gpusim.md for the meaning of each file.

use crate::abi::GPU_PAGE;
use kernel::debugfs::{Scope, ScopedDir};
use kernel::fmt;
use kernel::prelude::*;
use kernel::sync::atomic::{Atomic, Relaxed};
use kernel::time::{
    delay::{fsleep, udelay},
    Delta,
};
use kernel::uaccess::UserSliceReader;

/// A counter or knob.
pub(crate) type Knob = Atomic<u64>;

/// Sleep (µs) at the start of every entry point and before every free
/// callback: widens race windows.
pub(crate) static DELAY_US: Knob = Knob::new(0);
/// Physical contiguity of new allocations in bytes: a multiple of 64 KiB;
/// 0 means "the whole allocation" (capped to the allocator's maximum).
pub(crate) static CONTIG_BYTES: Knob = Knob::new(GPU_PAGE);
/// Largest allocation GPUSIM_IOC_ALLOC accepts (ENOMEM above).
pub(crate) static MAX_ALLOC_BYTES: Knob = Knob::new(256 << 20);
/// errno returned by put_pages / dma_unmap_pages / put_pages_persistent on
/// an object that is already gone (put after the free callback, double
/// put, double unmap). The default, 0, is the 550 driver's answer (see
/// docs/gpusim.md); 22 (EINVAL) makes a client's stale call visible.
pub(crate) static STALE_ERRNO: Knob = Knob::new(0);
/// errno of an injected failure.
pub(crate) static FAIL_ERRNO: Knob = Knob::new(12);
/// 1 if the RM lock is in use: the module parameter `rm_lock` at load,
/// then this knob (0 or 1). Switching is safe at any time: a call that took
/// the lock releases it whatever the knob says by then.
pub(crate) static RM_LOCK: Knob = Knob::new(0);
/// 1: the emulated GPU is cache-coherent with the CPU (a C2C system such
/// as Grace Hopper, NVIDIA's `PDB_PROP_GPU_COHERENT_CPU_MAPPING`); 0 (the
/// default): a discrete GPU behind PCIe (BAR1), the x86 case. Decides
/// CPU_CACHEABLE in version-2 page tables and whether a FORCE_BAR1 pin is
/// possible. Read at each pin.
pub(crate) static CPU_CACHEABLE: Knob = Knob::new(0);
/// The pin-cost model (docs/gpusim.md, "Pin cost"): every successful
/// `nvidia_p2p_get_pages` and `nvidia_p2p_get_pages_persistent` takes
/// `PIN_CALL_US` microseconds plus `PIN_PAGE_NS` nanoseconds per 64 KiB
/// page, slept with the RM lock held, as RM does its pinning work under its
/// API lock. Module parameters `pin_call_us`/`pin_page_ns` at load, then
/// these knobs. 0 and 0 (the default): no cost, the suite's rig.
pub(crate) static PIN_CALL_US: Knob = Knob::new(0);
/// See [`PIN_CALL_US`].
pub(crate) static PIN_PAGE_NS: Knob = Knob::new(0);
/// BAR1 size in MiB (module parameter `bar1_mib`, then this knob;
/// docs/gpusim.md, "BAR1"). Default 1024: dynamic against the default
/// `fb_mib`, and room for every test of the suite.
pub(crate) static BAR1_MIB: Knob = Knob::new(1024);
/// 0: RM's choice (static where BAR1 covers the framebuffer, dynamic
/// otherwise); 1: static; 2: dynamic.
pub(crate) static BAR1_MODE: Knob = Knob::new(0);
/// The emulated framebuffer in MiB (decides the BAR1 mode in auto).
pub(crate) static FB_MIB: Knob = Knob::new(16384);
/// Bytes of BAR1 mapped by all clients (RM's `P2PfbMappedBytes` summed):
/// with a dynamic BAR1, the aperture in use.
pub(crate) static BAR1_MAPPED: Knob = Knob::new(0);
/// The part of `BAR1_MAPPED` mapped by RM's internal client (persistent pins).
pub(crate) static BAR1_INTERNAL: Knob = Knob::new(0);
/// Pins refused because BAR1 had no room (`-ENOMEM`, total).
pub(crate) static BAR1_REFUSALS: Knob = Knob::new(0);
/// Calls refused because the calling thread held the RM lock (a client
/// calling gpusim from its free callback with `rm_lock=1`).
pub(crate) static RM_LOCK_RECURSIONS: Knob = Knob::new(0);

/// Allocations not yet freed by the user (free ioctl, close, exit).
pub(crate) static LIVE_ALLOCS: Knob = Knob::new(0);
/// Host memory still held: by live allocations, by mappings that outlive
/// their allocation, and by pins.
pub(crate) static LIVE_MEM_BYTES: Knob = Knob::new(0);
/// Page tables handed out and not yet released (persistent ones included).
pub(crate) static LIVE_PINS: Knob = Knob::new(0);
/// The persistent ones among `LIVE_PINS`.
pub(crate) static LIVE_PERSISTENT_PINS: Knob = Knob::new(0);
/// DMA mappings handed out and not yet unmapped.
pub(crate) static LIVE_DMA_MAPPINGS: Knob = Knob::new(0);
/// CPU mappings (vmas) of gpusim memory.
pub(crate) static LIVE_VMAS: Knob = Knob::new(0);
/// Free callbacks called (total since load).
pub(crate) static FREE_CALLBACKS: Knob = Knob::new(0);
/// Calls refused because their object was already gone (see STALE_ERRNO).
pub(crate) static STALE_CALLS: Knob = Knob::new(0);
/// `nvidia_p2p_put_pages` calls (non-persistent) from a process other than
/// the one that pinned the table, or from a kernel thread: answered 0 and
/// nothing unpinned, as NVIDIA's driver does (docs/gpusim.md, "Process
/// identity").
pub(crate) static FOREIGN_PUTS: Knob = Knob::new(0);
/// DMA mappings gpusim unmapped itself because their page table went away
/// (put_pages or after a free callback) while they were still mapped.
pub(crate) static DMA_REAPED: Knob = Knob::new(0);
/// Failures injected through `fail/*`.
pub(crate) static INJECTED: Knob = Knob::new(0);
/// GPU pages in the page tables handed out by get_pages* (total): what
/// clients pinned, counting a page once per pin.
pub(crate) static PAGES_PINNED: Knob = Knob::new(0);
/// GPU pages in the DMA mappings handed out by dma_map_pages (total).
pub(crate) static PAGES_DMA_MAPPED: Knob = Knob::new(0);
/// Bus-contiguous runs in the DMA mappings handed out by dma_map_pages
/// (total): the fewest scatter entries a client could make of them.
pub(crate) static DMA_RUNS_MAPPED: Knob = Knob::new(0);

/// Per-entry-point call counter and failure injection.
pub(crate) struct Entry {
    /// Calls so far.
    pub(crate) calls: Knob,
    /// 0: off. N > 0: the N-th call from now fails with `FAIL_ERRNO`, then
    /// this returns to 0.
    pub(crate) fail_nth: Knob,
}

impl Entry {
    const fn new() -> Self {
        Self {
            calls: Knob::new(0),
            fail_nth: Knob::new(0),
        }
    }

    /// Bookkeeping at the start of an entry point: counts the call, sleeps
    /// `DELAY_US`, and returns the injected errno (negative) if this is the
    /// armed call.
    pub(crate) fn enter(&self) -> core::result::Result<(), i32> {
        self.calls.add(1, Relaxed);
        delay();
        loop {
            let n = self.fail_nth.load(Relaxed);
            if n == 0 {
                return Ok(());
            }
            if self.fail_nth.cmpxchg(n, n - 1, Relaxed).is_ok() {
                if n == 1 {
                    INJECTED.add(1, Relaxed);
                    return Err(-errno_of(&FAIL_ERRNO, 12));
                }
                return Ok(());
            }
        }
    }
}

pub(crate) static E_ALLOC: Entry = Entry::new();
pub(crate) static E_GET_PAGES: Entry = Entry::new();
pub(crate) static E_GET_PAGES_PERSISTENT: Entry = Entry::new();
pub(crate) static E_PUT_PAGES: Entry = Entry::new();
pub(crate) static E_PUT_PAGES_PERSISTENT: Entry = Entry::new();
pub(crate) static E_DMA_MAP: Entry = Entry::new();
pub(crate) static E_DMA_UNMAP: Entry = Entry::new();

/// The errno in `knob` if it is a valid one (1..=4095), else `default`.
pub(crate) fn errno_of(knob: &Knob, default: i32) -> i32 {
    match knob.load(Relaxed) {
        n @ 1..=4095 => n as i32,
        _ => default,
    }
}

/// The module parameters `pin_call_us` and `pin_page_ns`, capped at
/// 1000000 as the knobs (said in the log if capped).
/// Sets `bar1_mib` from the module parameter (1 MiB to 1 TiB).
pub(crate) fn set_bar1_mib(mib: u64) {
    if !(1..=1 << 20).contains(&mib) {
        pr_warn!("bar1_mib must be 1..1048576; using 1024\n");
        return;
    }
    BAR1_MIB.store(mib, Relaxed);
}

pub(crate) fn set_pin_cost(call_us: u64, page_ns: u64) {
    if call_us > 1_000_000 || page_ns > 1_000_000 {
        pr_warn!("pin_call_us and pin_page_ns are capped at 1000000 (microseconds per pin, nanoseconds per 64 KiB page)\n");
    }
    PIN_CALL_US.store(call_us.min(1_000_000), Relaxed);
    PIN_PAGE_NS.store(page_ns.min(1_000_000), Relaxed);
}

/// The pin-cost model's time for one pin of `pages` 64 KiB pages (see
/// [`PIN_CALL_US`]), with whatever lock the caller holds: busy-waited up to
/// 2 ms (RM's pinning is CPU work, and a sleep that short overshoots by
/// its timer slack, under TCG by far more than the model's figures),
/// slept above that; capped at 10 s.
pub(crate) fn pin_cost(pages: u64) {
    let ns = PIN_CALL_US
        .load(Relaxed)
        .saturating_mul(1000)
        .saturating_add(pages.saturating_mul(PIN_PAGE_NS.load(Relaxed)));
    let us = ns.div_ceil(1000).min(10_000_000);
    if us == 0 {
        return;
    }
    if us > 2000 {
        fsleep(Delta::from_micros(us as i64));
        return;
    }
    let mut left = us;
    while left > 0 {
        let chunk = left.min(500);
        udelay(Delta::from_micros(chunk as i64));
        left -= chunk;
    }
}

/// Sleeps `DELAY_US` microseconds (if non-zero).
pub(crate) fn delay() {
    let us = DELAY_US.load(Relaxed);
    if us != 0 {
        fsleep(Delta::from_micros(us.min(10_000_000) as i64));
    }
}

/// Decrements a live counter (saturating, never wrapping below zero).
pub(crate) fn dec(knob: &Knob, by: u64) {
    let mut cur = knob.load(Relaxed);
    loop {
        let new = cur.saturating_sub(by);
        match knob.cmpxchg(cur, new, Relaxed) {
            Ok(_) => return,
            Err(seen) => cur = seen,
        }
    }
}

fn show(k: &Knob, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    writeln!(f, "{}", k.load(Relaxed))
}

fn parse_u64(r: &mut UserSliceReader) -> Result<u64> {
    let mut buf = [0u8; 24];
    let n = r.len();
    if n == 0 || n > buf.len() {
        return Err(EINVAL);
    }
    r.read_slice(&mut buf[..n])?;
    let s = core::str::from_utf8(&buf[..n]).map_err(|_| EINVAL)?;
    s.trim().parse::<u64>().map_err(|_| EINVAL)
}

fn write_any(k: &Knob, r: &mut UserSliceReader) -> Result {
    k.store(parse_u64(r)?, Relaxed);
    Ok(())
}

/// `pin_call_us`: at most 1 s per pin (the model's "up to milliseconds"
/// with room to spare).
fn write_pin_call(k: &Knob, r: &mut UserSliceReader) -> Result {
    let v = parse_u64(r)?;
    if v > 1_000_000 {
        pr_warn!("pin_call_us must be 0..1000000 (microseconds per pin)\n");
        return Err(EINVAL);
    }
    k.store(v, Relaxed);
    Ok(())
}

/// `bar1_mib`, `fb_mib`: 1 MiB to 1 TiB.
fn write_mib(k: &Knob, r: &mut UserSliceReader) -> Result {
    let v = parse_u64(r)?;
    if !(1..=1 << 20).contains(&v) {
        return Err(EINVAL);
    }
    k.store(v, Relaxed);
    Ok(())
}

/// `bar1_mode`: 0 (RM's choice), 1 (static) or 2 (dynamic).
fn write_bar1_mode(k: &Knob, r: &mut UserSliceReader) -> Result {
    let v = parse_u64(r)?;
    if v > 2 {
        return Err(EINVAL);
    }
    k.store(v, Relaxed);
    Ok(())
}

/// `pin_page_ns`: at most 1 ms per 64 KiB page.
fn write_pin_page(k: &Knob, r: &mut UserSliceReader) -> Result {
    let v = parse_u64(r)?;
    if v > 1_000_000 {
        pr_warn!("pin_page_ns must be 0..1000000 (nanoseconds per 64 KiB page)\n");
        return Err(EINVAL);
    }
    k.store(v, Relaxed);
    Ok(())
}

fn write_contig(k: &Knob, r: &mut UserSliceReader) -> Result {
    let v = parse_u64(r)?;
    if v % GPU_PAGE != 0 || v > crate::glue::max_chunk_bytes() as u64 {
        pr_warn!(
            "contig_bytes must be 0 or a multiple of 65536 up to {}\n",
            crate::glue::max_chunk_bytes()
        );
        return Err(EINVAL);
    }
    k.store(v, Relaxed);
    Ok(())
}

fn write_bool(k: &Knob, r: &mut UserSliceReader) -> Result {
    let v = parse_u64(r)?;
    if v > 1 {
        return Err(EINVAL);
    }
    k.store(v, Relaxed);
    Ok(())
}

fn write_errno(k: &Knob, r: &mut UserSliceReader) -> Result {
    let v = parse_u64(r)?;
    if v > 4095 {
        return Err(EINVAL);
    }
    k.store(v, Relaxed);
    Ok(())
}

/// Writing anything to `reset_totals` zeroes the totals (not the live
/// counters, which always describe what exists).
fn write_reset(_k: &Knob, r: &mut UserSliceReader) -> Result {
    let _ = parse_u64(r);
    for k in [
        &FREE_CALLBACKS,
        &STALE_CALLS,
        &FOREIGN_PUTS,
        &BAR1_REFUSALS,
        &DMA_REAPED,
        &INJECTED,
        &PAGES_PINNED,
        &PAGES_DMA_MAPPED,
        &DMA_RUNS_MAPPED,
        &RM_LOCK_RECURSIONS,
    ] {
        k.store(0, Relaxed);
    }
    for e in ENTRIES {
        e.1.calls.store(0, Relaxed);
        e.1.fail_nth.store(0, Relaxed);
    }
    Ok(())
}

static RESET_DUMMY: Knob = Knob::new(0);

/// Writing anything to `free_mmap_allocs` frees every allocation made
/// through `/dev/gpusim_mmap` (the free callbacks of its pins run first),
/// as a `cudaFree` under a program that only mapped the memory.
fn write_free_mmap(_k: &Knob, r: &mut UserSliceReader) -> Result {
    let _ = parse_u64(r);
    crate::state::free_where("free_mmap_allocs", |id| id & crate::dev::MMAPDEV_FILE != 0);
    Ok(())
}

const ENTRIES: [(&CStr, &Entry); 7] = [
    (c"alloc", &E_ALLOC),
    (c"get_pages", &E_GET_PAGES),
    (c"get_pages_persistent", &E_GET_PAGES_PERSISTENT),
    (c"put_pages", &E_PUT_PAGES),
    (c"put_pages_persistent", &E_PUT_PAGES_PERSISTENT),
    (c"dma_map_pages", &E_DMA_MAP),
    (c"dma_unmap_pages", &E_DMA_UNMAP),
];

fn populate(dir: &ScopedDir<'_, '_>) {
    let ro: [(&CStr, &'static Knob); 18] = [
        (c"live_allocs", &LIVE_ALLOCS),
        (c"live_mem_bytes", &LIVE_MEM_BYTES),
        (c"live_pins", &LIVE_PINS),
        (c"live_persistent_pins", &LIVE_PERSISTENT_PINS),
        (c"live_dma_mappings", &LIVE_DMA_MAPPINGS),
        (c"live_vmas", &LIVE_VMAS),
        (c"free_callbacks", &FREE_CALLBACKS),
        (c"stale_calls", &STALE_CALLS),
        (c"foreign_puts", &FOREIGN_PUTS),
        (c"bar1_mapped_bytes", &BAR1_MAPPED),
        (c"bar1_internal_bytes", &BAR1_INTERNAL),
        (c"bar1_refusals", &BAR1_REFUSALS),
        (c"dma_reaped", &DMA_REAPED),
        (c"injected_failures", &INJECTED),
        (c"pages_pinned", &PAGES_PINNED),
        (c"pages_dma_mapped", &PAGES_DMA_MAPPED),
        (c"dma_runs_mapped", &DMA_RUNS_MAPPED),
        (c"rm_lock_recursions", &RM_LOCK_RECURSIONS),
    ];
    for (name, k) in ro {
        dir.read_callback_file(name, k, &show);
    }
    dir.read_write_callback_file(c"delay_us", &DELAY_US, &show, &write_any);
    dir.read_write_callback_file(c"max_alloc_bytes", &MAX_ALLOC_BYTES, &show, &write_any);
    dir.read_write_callback_file(c"contig_bytes", &CONTIG_BYTES, &show, &write_contig);
    dir.read_write_callback_file(c"stale_errno", &STALE_ERRNO, &show, &write_errno);
    dir.read_write_callback_file(c"fail_errno", &FAIL_ERRNO, &show, &write_errno);
    dir.read_write_callback_file(c"rm_lock", &RM_LOCK, &show, &write_bool);
    dir.read_write_callback_file(c"cpu_cacheable", &CPU_CACHEABLE, &show, &write_bool);
    dir.read_write_callback_file(c"pin_call_us", &PIN_CALL_US, &show, &write_pin_call);
    dir.read_write_callback_file(c"pin_page_ns", &PIN_PAGE_NS, &show, &write_pin_page);
    dir.read_write_callback_file(c"bar1_mib", &BAR1_MIB, &show, &write_mib);
    dir.read_write_callback_file(c"bar1_mode", &BAR1_MODE, &show, &write_bar1_mode);
    dir.read_write_callback_file(c"fb_mib", &FB_MIB, &show, &write_mib);
    dir.write_only_callback_file(c"reset_totals", &RESET_DUMMY, &write_reset);
    dir.write_only_callback_file(c"free_mmap_allocs", &RESET_DUMMY, &write_free_mmap);
    let fail = dir.dir(c"fail");
    for (name, e) in ENTRIES {
        fail.read_write_callback_file(name, &e.fail_nth, &show, &write_any);
    }
    let calls = dir.dir(c"calls");
    for (name, e) in ENTRIES {
        calls.read_callback_file(name, &e.calls, &show);
    }
}

/// Creates `/sys/kernel/debug/gpusim/`; removed when the result is dropped.
pub(crate) fn debugfs() -> impl PinInit<Scope<()>> {
    Scope::dir((), c"gpusim", |(), dir| populate(dir))
}
