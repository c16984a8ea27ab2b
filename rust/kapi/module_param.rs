// SPDX-License-Identifier: GPL-2.0

//! The module's parameters, declared in the C glue (`rust/helpers.c`: names,
//! defaults and the descriptions `modinfo` shows), read here. Upstream
//! counterpart: `kernel::module_param` (the `module!` macro's `params:`,
//! which 6.12 lacks and whose syntax differs between 7.x releases).

use super::{peer_mem::PEER_NAME_CAPACITY, raw};
use core::ptr;

/// Reads the parameter variable at `p`.
///
/// # Safety
///
/// `p` is one of the parameter variables of `peermem_ffi.h`: stored by the
/// module loader before init, and written by nothing afterwards (0444).
unsafe fn read<T: Copy>(p: *const T) -> T {
    // SAFETY: by the function's safety requirements: valid, and no write
    // can race with this read.
    unsafe { p.read() }
}

/// The `peer_name` parameter, unchecked.
pub(crate) fn peer_name() -> &'static [u8] {
    // SAFETY: per `peermem_ffi.h` the buffer of `IB_PEER_MEMORY_NAME_MAX`
    // bytes was filled by the module loader before init and nothing changes
    // it until the module unloads, which ends every use of this reference.
    let buf: &'static [u8] = unsafe {
        core::slice::from_raw_parts(
            ptr::addr_of!(raw::peermem_peer_name).cast::<u8>(),
            PEER_NAME_CAPACITY,
        )
    };
    // The loader always leaves a NUL in it; without one, take the whole buffer
    // (the caller's check then refuses it as too long).
    let len = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    &buf[..len]
}

/// The `enable_invalidate` parameter.
pub(crate) fn enable_invalidate() -> bool {
    // SAFETY: a parameter variable.
    unsafe { read(ptr::addr_of!(raw::peermem_enable_invalidate)) }
}

/// The `enable_nc` parameter.
pub(crate) fn enable_nc() -> bool {
    // SAFETY: a parameter variable.
    unsafe { read(ptr::addr_of!(raw::peermem_enable_nc)) }
}

/// The `mmu_notifier` parameter.
pub(crate) fn mmu_notifier() -> bool {
    // SAFETY: a parameter variable.
    unsafe { read(ptr::addr_of!(raw::peermem_mmu_notifier)) }
}

/// The `watch_cache` parameter (entries), unchecked.
pub(crate) fn watch_cache() -> u32 {
    // SAFETY: a parameter variable.
    unsafe { read(ptr::addr_of!(raw::peermem_watch_cache)) }
}

/// The `watch_cache_mib` parameter, unchecked.
pub(crate) fn watch_cache_mib() -> u32 {
    // SAFETY: a parameter variable.
    unsafe { read(ptr::addr_of!(raw::peermem_watch_cache_mib)) }
}

/// nvidia-peermem's `peerdirect_support` parameter (default 0).
pub(crate) fn peerdirect_support() -> i32 {
    // SAFETY: a parameter variable.
    unsafe { read(ptr::addr_of!(raw::peermem_peerdirect_support)) }
}

/// nvidia-peermem's `persistent_api_support` parameter (-1: not given).
pub(crate) fn persistent_api_support() -> i32 {
    // SAFETY: a parameter variable.
    unsafe { read(ptr::addr_of!(raw::peermem_persistent_api_support)) }
}
