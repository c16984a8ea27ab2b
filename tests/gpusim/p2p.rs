// SPDX-License-Identifier: GPL-2.0

//! The exported `nvidia_p2p_*` functions, with the names, signatures and
//! error codes of the real driver of the emulated branch (`branch.rs`). `gpusim_glue.c` exports
//! them GPL-only. Where the real driver would crash or WARN on a client
//! bug (an unknown page table, a double put), gpusim returns an error and
//! counts it instead; see docs/gpusim.md for every deviation.

use crate::abi::*;
use crate::branch::Branch;
use crate::knobs::*;
use crate::state::{self, STATE};
use core::ptr;
use kernel::bindings;
use kernel::ffi::{c_int, c_void};
use kernel::prelude::*;

/// Unsupported by every emulated branch: always -ENOTSUPP.
#[no_mangle]
extern "C" fn nvidia_p2p_init_mapping(
    _p2p_token: u64,
    _params: *mut NvP2pParams,
    _destroy_callback: FreeCallback,
    _data: *mut c_void,
) -> c_int {
    ENOTSUPP.to_errno()
}

/// Unsupported by every emulated branch: always -ENOTSUPP.
#[no_mangle]
extern "C" fn nvidia_p2p_destroy_mapping(_p2p_token: u64) -> c_int {
    ENOTSUPP.to_errno()
}

/// Pins `length` bytes of gpusim memory at `virtual_address` in the calling
/// process. See docs/gpusim.md for the error cases.
///
/// # Safety
///
/// `page_table` must be NULL or valid for a pointer write; `free_callback`
/// must be callable with `data` until the pages are put.
#[no_mangle]
unsafe extern "C" fn nvidia_p2p_get_pages(
    p2p_token: u64,
    va_space: u32,
    virtual_address: u64,
    length: u64,
    page_table: *mut *mut NvP2pPageTable,
    free_callback: FreeCallback,
    data: *mut c_void,
) -> c_int {
    if let Err(e) = E_GET_PAGES.enter() {
        if !page_table.is_null() {
            // SAFETY: The caller provides a writable `page_table`.
            unsafe { *page_table = ptr::null_mut() };
        }
        return e;
    }
    if page_table.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: The caller provides a writable `page_table`.
    unsafe { *page_table = ptr::null_mut() };
    // The real driver requires a callback and non-NULL data; gpusim has no
    // p2p tokens or VA spaces (nobody passes anything but 0).
    if free_callback.is_none() || data.is_null() || p2p_token != 0 || va_space != 0 {
        return EINVAL.to_errno();
    }
    // RM does the pinning under its API lock (rm_p2p_get_pages).
    let _rm = match crate::rm::acquire("nvidia_p2p_get_pages") {
        Ok(g) => g,
        Err(e) => return e.to_errno(),
    };
    match state::get_pages(
        virtual_address,
        length,
        state::PinKind::Callback,
        free_callback,
        data,
    ) {
        Ok(pt) => {
            // The pin-cost model (0 unless asked for), under the RM lock.
            crate::knobs::pin_cost(length / GPU_PAGE);
            // SAFETY: As above.
            unsafe { *page_table = pt };
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// Pins like `nvidia_p2p_get_pages` but without a free callback: the
/// memory stays until `nvidia_p2p_put_pages_persistent`.
///
/// # Safety
///
/// `page_table` must be NULL or valid for a pointer write.
#[no_mangle]
unsafe extern "C" fn nvidia_p2p_get_pages_persistent(
    virtual_address: u64,
    length: u64,
    page_table: *mut *mut NvP2pPageTable,
    flags: u32,
) -> c_int {
    if let Err(e) = E_GET_PAGES_PERSISTENT.enter() {
        if !page_table.is_null() {
            // SAFETY: The caller provides a writable `page_table`.
            unsafe { *page_table = ptr::null_mut() };
        }
        return e;
    }
    if page_table.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: The caller provides a writable `page_table`.
    unsafe { *page_table = ptr::null_mut() };
    // 550: flags must be 0. 570.86.15+: the driver passes them on as a u8
    // (bits 8-31 are dropped) and reads only FORCE_BAR1_MAPPING; other bits
    // are ignored, not refused.
    let force_bar1 = if Branch::current().persistent_flags() {
        (flags as u8) & FLAGS_FORCE_BAR1_MAPPING != 0
    } else if flags != 0 {
        return EINVAL.to_errno();
    } else {
        false
    };
    // Under the RM lock, as rm_p2p_get_pages_persistent.
    let _rm = match crate::rm::acquire("nvidia_p2p_get_pages_persistent") {
        Ok(g) => g,
        Err(e) => return e.to_errno(),
    };
    match state::get_pages(
        virtual_address,
        length,
        state::PinKind::Persistent { force_bar1 },
        None,
        ptr::null_mut(),
    ) {
        Ok(pt) => {
            crate::knobs::pin_cost(length / GPU_PAGE);
            // SAFETY: As above.
            unsafe { *page_table = pt };
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// Unpins a page table from `nvidia_p2p_get_pages`. NULL is a no-op (as in
/// the real driver). The page table is only compared, never dereferenced,
/// so a stale pointer is safe: it gets the `stale_errno` knob's error.
#[no_mangle]
extern "C" fn nvidia_p2p_put_pages(
    p2p_token: u64,
    va_space: u32,
    virtual_address: u64,
    page_table: *mut NvP2pPageTable,
) -> c_int {
    if let Err(e) = E_PUT_PAGES.enter() {
        return e;
    }
    if page_table.is_null() {
        return 0;
    }
    if p2p_token != 0 || va_space != 0 {
        return EINVAL.to_errno();
    }
    // RM unlinks the page table under its API lock (rm_p2p_put_pages); the
    // table and its leftover DMA mappings are freed after it is released.
    let rm = match crate::rm::acquire("nvidia_p2p_put_pages") {
        Ok(g) => g,
        Err(e) => return e.to_errno(),
    };
    state::put_pages(virtual_address, page_table as usize, false, rm)
}

/// Unpins a page table from `nvidia_p2p_get_pages_persistent`.
#[no_mangle]
extern "C" fn nvidia_p2p_put_pages_persistent(
    virtual_address: u64,
    page_table: *mut NvP2pPageTable,
    flags: u32,
) -> c_int {
    if let Err(e) = E_PUT_PAGES_PERSISTENT.enter() {
        return e;
    }
    if flags != 0 {
        return EINVAL.to_errno();
    }
    if page_table.is_null() {
        return 0;
    }
    let rm = match crate::rm::acquire("nvidia_p2p_put_pages_persistent") {
        Ok(g) => g,
        Err(e) => return e.to_errno(),
    };
    state::put_pages(virtual_address, page_table as usize, true, rm)
}

/// A no-op in the 550 driver (it frees page tables itself); 0, or -EINVAL
/// for NULL.
#[no_mangle]
extern "C" fn nvidia_p2p_free_page_table(page_table: *mut NvP2pPageTable) -> c_int {
    if page_table.is_null() {
        return EINVAL.to_errno();
    }
    0
}

/// Maps a page table for DMA by `peer` through the kernel DMA API. `peer`
/// must be a PCI device of this system with a DMA mask: NULL (a software
/// RDMA device such as rxe or siw has none) is -EINVAL, as in the real
/// driver, and so is any other pointer that is not one of the PCI bus's
/// devices (e.g. `to_pci_dev(NULL)` from a client that converted a NULL
/// `struct device *`): it is compared with the bus's devices before it is
/// dereferenced.
///
/// # Safety
///
/// If `peer` is a PCI device of this system it stays alive until the
/// mapping is unmapped; `dma_mapping` must be NULL or valid for a pointer
/// write.
#[no_mangle]
unsafe extern "C" fn nvidia_p2p_dma_map_pages(
    peer: *mut bindings::pci_dev,
    page_table: *mut NvP2pPageTable,
    dma_mapping: *mut *mut NvP2pDmaMapping,
) -> c_int {
    if let Err(e) = E_DMA_MAP.enter() {
        if !dma_mapping.is_null() {
            // SAFETY: The caller provides a writable `dma_mapping`.
            unsafe { *dma_mapping = ptr::null_mut() };
        }
        return e;
    }
    if peer.is_null() || page_table.is_null() || dma_mapping.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: The caller provides a writable `dma_mapping`.
    unsafe { *dma_mapping = ptr::null_mut() };
    // RM maps under its API lock (rm_p2p_dma_map_pages).
    let _rm = match crate::rm::acquire("nvidia_p2p_dma_map_pages") {
        Ok(g) => g,
        Err(e) => return e.to_errno(),
    };
    // SAFETY: `state::dma_map` checks that `peer` is a PCI device before
    // using it; the caller keeps such a device alive.
    match unsafe { state::dma_map(peer, page_table as usize) } {
        Ok(m) => {
            // SAFETY: As above.
            unsafe { *dma_mapping = m };
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// Unmaps a mapping from `nvidia_p2p_dma_map_pages`. Allowed from inside
/// the free callback; takes no RM lock (neither does the real driver).
#[no_mangle]
extern "C" fn nvidia_p2p_dma_unmap_pages(
    peer: *mut bindings::pci_dev,
    page_table: *mut NvP2pPageTable,
    dma_mapping: *mut NvP2pDmaMapping,
) -> c_int {
    if let Err(e) = E_DMA_UNMAP.enter() {
        return e;
    }
    if peer.is_null() || page_table.is_null() || dma_mapping.is_null() {
        return EINVAL.to_errno();
    }
    state::dma_unmap(peer, page_table as usize, dma_mapping as usize)
}

/// A no-op in the 550 driver (gpusim unmaps what is left after the free
/// callback returns); 0, or -EINVAL for NULL.
#[no_mangle]
extern "C" fn nvidia_p2p_free_dma_mapping(dma_mapping: *mut NvP2pDmaMapping) -> c_int {
    if dma_mapping.is_null() {
        return EINVAL.to_errno();
    }
    0
}

/// Registers an rsync driver: validated as the real driver does; one at a
/// time (-EBUSY). gpusim never calls it (it emulates no NVLink).
///
/// # Safety
///
/// `driver` must be NULL or point to a readable `nvidia_p2p_rsync_driver`.
#[no_mangle]
unsafe extern "C" fn nvidia_p2p_register_rsync_driver(
    driver: *mut NvP2pRsyncDriver,
    _data: *mut c_void,
) -> c_int {
    if driver.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: The caller provides a readable driver structure.
    let d = unsafe { &*driver };
    if !version_compatible(d.version, RSYNC_DRIVER_VERSION)
        || d.get_relaxed_ordering_mode.is_none()
        || d.put_relaxed_ordering_mode.is_none()
        || d.wait_for_rsync.is_none()
    {
        return EINVAL.to_errno();
    }
    let mut st = STATE.lock();
    if st.rsync != 0 {
        return EBUSY.to_errno();
    }
    st.rsync = driver as usize;
    0
}

/// Unregisters the rsync driver registered with `driver`.
#[no_mangle]
extern "C" fn nvidia_p2p_unregister_rsync_driver(
    driver: *mut NvP2pRsyncDriver,
    _data: *mut c_void,
) {
    let mut st = STATE.lock();
    if driver.is_null() || st.rsync != driver as usize {
        pr_warn!("nvidia_p2p_unregister_rsync_driver() of a driver that is not registered\n");
        return;
    }
    st.rsync = 0;
}

/// gpusim emulates no IBM NPU: -ENODEV, as every branch on x86. Up to 570
/// a NULL argument is -EINVAL first; from 575.51.02 the driver returns
/// -ENODEV without looking at it.
#[no_mangle]
extern "C" fn nvidia_p2p_get_rsync_registers(reg_info: *mut *mut NvP2pRsyncRegInfo) -> c_int {
    if reg_info.is_null() && Branch::current().rsync_checks_null() {
        return EINVAL.to_errno();
    }
    ENODEV.to_errno()
}

/// gpusim never hands out register info, so there is nothing to free.
#[no_mangle]
extern "C" fn nvidia_p2p_put_rsync_registers(reg_info: *mut NvP2pRsyncRegInfo) {
    if !reg_info.is_null() {
        pr_warn!("nvidia_p2p_put_rsync_registers() of an object gpusim never returned\n");
    }
}
