// SPDX-License-Identifier: GPL-2.0

//! The module's parameters, declared in the C glue (`rust/helpers.c`: names,
//! defaults and the descriptions `modinfo` shows), read here. Upstream
//! counterpart: `kernel::module_param` (the `module!` macro's `params:`,
//! whose syntax differs between 6.12 and 7.x).

use super::{peer_mem::PEER_NAME_CAPACITY, raw};

/// The `peer_name` parameter, unchecked.
pub(crate) fn peer_name() -> &'static [u8] {
    // SAFETY: FFI call without preconditions.
    let name = unsafe { raw::peermem_param_peer_name() };
    // SAFETY: per `peermem_ffi.h` `name` points to a buffer of
    // `IB_PEER_MEMORY_NAME_MAX` bytes that the module loader filled before
    // init and that nothing changes until the module unloads, which ends
    // every use of this reference.
    let buf = unsafe { core::slice::from_raw_parts(name.cast::<u8>(), PEER_NAME_CAPACITY) };
    // The loader always leaves a NUL in it; without one, take the whole buffer
    // (the caller's check then refuses it as too long).
    let len = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    &buf[..len]
}

/// The `enable_invalidate` parameter.
pub(crate) fn enable_invalidate() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_enable_invalidate() }
}

/// The `enable_nc` parameter.
pub(crate) fn enable_nc() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_enable_nc() }
}

/// The `mmu_notifier` parameter.
pub(crate) fn mmu_notifier() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_mmu_notifier() }
}

/// The `watch_cache` parameter (entries), unchecked.
pub(crate) fn watch_cache() -> u32 {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_watch_cache() }
}

/// The `watch_cache_mib` parameter, unchecked.
pub(crate) fn watch_cache_mib() -> u32 {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_watch_cache_mib() }
}

/// nvidia-peermem's `peerdirect_support` parameter (default 0).
pub(crate) fn peerdirect_support() -> i32 {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_peerdirect_support() }
}

/// nvidia-peermem's `persistent_api_support` parameter (-1: not given).
pub(crate) fn persistent_api_support() -> i32 {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_persistent_api_support() }
}
