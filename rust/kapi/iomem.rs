// SPDX-License-Identifier: GPL-2.0

//! The firmware's memory map as the kernel's resource tree holds it
//! (`/proc/iomem`): which physical addresses are RAM, or reserved.
//! Upstream counterpart: none (`walk_iomem_res_desc`, called directly).

use super::{c_int, c_ulong, c_void, raw};

/// A kind of resource in the memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Region {
    /// "System RAM" (`IORESOURCE_SYSTEM_RAM`).
    SystemRam,
    /// "Reserved" memory (`IORESOURCE_MEM`, `IORES_DESC_RESERVED`:
    /// `memmap=nn$ss`, a no-map reserved-memory region).
    Reserved,
}

/// The end of the stretch from `pos` on that resources of kind `region`
/// (nested or not) cover without a gap: `pos` if none covers `pos`. One
/// search of the resource tree (`walk_iomem_res_desc`, under its lock).
pub(crate) fn covered_end(region: Region, pos: u64) -> u64 {
    let (flags, desc) = match region {
        Region::SystemRam => (
            raw::peermem_pfn_const_PEERMEM_IORESOURCE_SYSTEM_RAM,
            raw::peermem_pfn_const_PEERMEM_IORES_DESC_NONE,
        ),
        Region::Reserved => (
            raw::peermem_pfn_const_PEERMEM_IORESOURCE_MEM,
            raw::peermem_pfn_const_PEERMEM_IORES_DESC_RESERVED,
        ),
    };
    let mut next = pos;
    // SAFETY: `extend` reads its resource and writes `next`, a local that
    // outlives the call, which calls it only until it returns.
    unsafe {
        raw::walk_iomem_res_desc(
            desc as c_ulong,
            flags as c_ulong,
            pos,
            u64::MAX,
            core::ptr::from_mut(&mut next).cast::<c_void>(),
            Some(extend),
        )
    };
    next
}

/// `walk_iomem_res_desc` callback: extends `*arg` (a `u64`) over a
/// resource that starts by it; stops (returns 1) at a gap.
///
/// # Safety
///
/// `res` is a live resource and `arg` points to a `u64` nothing else uses
/// during the call.
unsafe extern "C" fn extend(res: *mut kernel::bindings::resource, arg: *mut c_void) -> c_int {
    // SAFETY: a live resource (function safety).
    let (start, end) = unsafe { ((*res).start, (*res).end) };
    // SAFETY: a `u64` of ours (function safety).
    let next = unsafe { &mut *arg.cast::<u64>() };
    if start > *next {
        return 1;
    }
    *next = (*next).max(end.wrapping_add(1));
    0
}
