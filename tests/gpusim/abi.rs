// SPDX-License-Identifier: GPL-2.0

//! The structures of the NVIDIA P2P ABI that gpusim hands to its clients,
//! declared in Rust with the layout of `include/nv_p2p_abi.h` (550 series)
//! and, for the page table, also the layout of the 580+ drivers (version
//! 2.0, with a trailing `flags`).
//!
//! `gpusim_glue.c` asserts the same sizes and offsets against the C header
//! (the version-2 page table numerically, until the header declares it),
//! and the `const` assertions below pin the Rust side to those numbers, so
//! the two cannot drift apart without breaking the build.

use core::mem::{offset_of, size_of};
use kernel::ffi::c_void;

/// `NVIDIA_P2P_PAGE_TABLE_VERSION` of the 550 to 575 drivers: version 1.2,
/// the 32-byte [`NvP2pPageTable`].
pub(crate) const PAGE_TABLE_VERSION_V1: u32 = 0x0001_0002;
/// `NVIDIA_P2P_PAGE_TABLE_VERSION` from 580.65.06 on: version 2.0, the
/// 40-byte [`NvP2pPageTableV2`].
pub(crate) const PAGE_TABLE_VERSION_V2: u32 = 0x0002_0000;
/// `NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE` (580.65.06+), in
/// [`NvP2pPageTableV2::flags`].
pub(crate) const PAGE_TABLE_FLAGS_CPU_CACHEABLE: u32 = 0x1;
/// `NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING` (570.86.15+): the one flag of
/// `nvidia_p2p_get_pages_persistent` the driver reads.
pub(crate) const FLAGS_FORCE_BAR1_MAPPING: u8 = 0x1;
/// `NVIDIA_P2P_DMA_MAPPING_VERSION`.
pub(crate) const DMA_MAPPING_VERSION: u32 = 0x0002_0003;
/// `NVIDIA_P2P_RSYNC_DRIVER_VERSION`.
pub(crate) const RSYNC_DRIVER_VERSION: u32 = 0x0001_0001;
/// `NVIDIA_P2P_PAGE_SIZE_64KB`: the only page size gpusim (like the 550
/// driver) reports.
pub(crate) const PAGE_SIZE_64KB: u32 = 1;
/// `NVIDIA_P2P_GPU_UUID_LEN`.
pub(crate) const GPU_UUID_LEN: usize = 16;

/// The emulated GPU page size in bytes.
pub(crate) const GPU_PAGE: u64 = 64 * 1024;

/// `NVIDIA_P2P_MAJOR_VERSION_MATCHES && minor >=`: whether a structure of
/// version `have` satisfies a caller that needs `want`.
pub(crate) const fn version_compatible(have: u32, want: u32) -> bool {
    (have >> 16) == (want >> 16) && (have & 0xffff) >= (want & 0xffff)
}

/// `struct nvidia_p2p_page`: one 64 KiB GPU page. `registers` is the
/// legacy Fermi mailbox union (six `u32`), always zero here.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct NvP2pPage {
    pub(crate) physical_address: u64,
    pub(crate) registers: [u32; 6],
}

/// `struct nvidia_p2p_page_table`, version 1.2 (550 to 575): 32 bytes.
/// Also the first 32 bytes of [`NvP2pPageTableV2`].
#[repr(C)]
pub(crate) struct NvP2pPageTable {
    pub(crate) version: u32,
    pub(crate) page_size: u32,
    pub(crate) pages: *mut *mut NvP2pPage,
    pub(crate) entries: u32,
    pub(crate) gpu_uuid: *mut u8,
}

/// `struct nvidia_p2p_page_table`, version 2.0 (580.65.06 and later): the
/// version-1.2 fields unchanged, then `u32 flags` at offset 32; 40 bytes.
#[repr(C)]
pub(crate) struct NvP2pPageTableV2 {
    pub(crate) v1: NvP2pPageTable,
    pub(crate) flags: u32,
}

/// `struct nvidia_p2p_dma_mapping`. `pci_dev` is opaque here.
#[repr(C)]
pub(crate) struct NvP2pDmaMapping {
    pub(crate) version: u32,
    pub(crate) page_size_type: u32,
    pub(crate) entries: u32,
    pub(crate) dma_addresses: *mut u64,
    pub(crate) private: *mut c_void,
    pub(crate) pci_dev: *mut kernel::bindings::pci_dev,
}

/// `struct nvidia_p2p_rsync_driver`.
#[repr(C)]
pub(crate) struct NvP2pRsyncDriver {
    pub(crate) version: u32,
    pub(crate) get_relaxed_ordering_mode:
        Option<unsafe extern "C" fn(*mut i32, *mut c_void) -> i32>,
    pub(crate) put_relaxed_ordering_mode: Option<unsafe extern "C" fn(i32, *mut c_void)>,
    pub(crate) wait_for_rsync:
        Option<unsafe extern "C" fn(*mut kernel::bindings::pci_dev, *mut c_void)>,
}

/// `struct nvidia_p2p_rsync_reg_info` (gpusim never hands one out: it
/// emulates no IBM NPU).
#[repr(C)]
pub(crate) struct NvP2pRsyncRegInfo {
    pub(crate) version: u32,
    pub(crate) regs: *mut c_void,
    pub(crate) entries: usize,
}

/// `struct nvidia_p2p_params` is only passed to the unsupported
/// `nvidia_p2p_init_mapping`; gpusim never reads it.
pub(crate) type NvP2pParams = c_void;

/// A client's free callback.
pub(crate) type FreeCallback = Option<unsafe extern "C" fn(*mut c_void)>;

// The same numbers gpusim_glue.c checks against include/nv_p2p_abi.h.
const _: () = {
    assert!(size_of::<NvP2pPage>() == 32);
    assert!(offset_of!(NvP2pPage, registers) == 8);
    assert!(size_of::<NvP2pPageTable>() == 32);
    assert!(offset_of!(NvP2pPageTable, page_size) == 4);
    assert!(offset_of!(NvP2pPageTable, pages) == 8);
    assert!(offset_of!(NvP2pPageTable, entries) == 16);
    assert!(offset_of!(NvP2pPageTable, gpu_uuid) == 24);
    assert!(size_of::<NvP2pPageTableV2>() == 40);
    assert!(offset_of!(NvP2pPageTableV2, v1) == 0);
    assert!(offset_of!(NvP2pPageTableV2, flags) == 32);
    assert!(size_of::<NvP2pDmaMapping>() == 40);
    assert!(offset_of!(NvP2pDmaMapping, page_size_type) == 4);
    assert!(offset_of!(NvP2pDmaMapping, entries) == 8);
    assert!(offset_of!(NvP2pDmaMapping, dma_addresses) == 16);
    assert!(offset_of!(NvP2pDmaMapping, private) == 24);
    assert!(offset_of!(NvP2pDmaMapping, pci_dev) == 32);
    assert!(size_of::<NvP2pRsyncDriver>() == 32);
    assert!(offset_of!(NvP2pRsyncDriver, get_relaxed_ordering_mode) == 8);
    assert!(offset_of!(NvP2pRsyncDriver, wait_for_rsync) == 24);
    assert!(size_of::<NvP2pRsyncRegInfo>() == 24);
};
