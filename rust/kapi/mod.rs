// SPDX-License-Identifier: GPL-2.0

//! Safe abstractions over the C interfaces peermem uses, one module per
//! concept. Every `unsafe` block of the crate that touches C is here.
//!
//! The rule (`docs/architecture.md`): these modules never name the driver
//! (`crate::client`): not its registration type, its counters or its test
//! knobs. What the driver supplies comes in through traits
//! ([`peer_mem::PeerMemoryClient`], [`nvidia_p2p::FreeCallback`],
//! [`mmu_notifier::AddressChange`]) whose C callbacks are generic
//! trampolines here, in the style of `kernel::block::mq::OperationsVTable`.
//! Obligations a caller must meet are `unsafe fn`s with a `# Safety`
//! section.
//!
//! The raw side is one boundary: `ffi_generated.rs`, written by
//! `scripts/bindgen.sh` during the build from `include/peermem_ffi.h` (our
//! ABI headers, the prototypes of the C glue in `rust/helpers.c`, and the
//! exported kernel functions 6.12's `kernel::bindings` lacks, named on
//! `bindgen-kernel:` lines). The C glue holds only what has no symbol:
//! parameter definitions and one-line wrappers of static inlines and
//! macros. Kernel structs come from `kernel::bindings`; a field is read
//! from Rust only where its layout was checked equal to C's
//! (`task_struct`'s is not: `current->mm` is a C one-liner). Each module names its
//! upstream counterpart, so it can be replaced by the kernel crate's once
//! 6.12 support is dropped:
//!
//! | module           | concept                                   | upstream counterpart |
//! |------------------|-------------------------------------------|----------------------|
//! | [`peer_mem`]     | peer-memory core client (OFED)            | none (OFED `peer_mem.h`) |
//! | [`nvidia_p2p`]   | pinned page table and its DMA mapping     | none (NVIDIA `nv-p2p.h`) |
//! | [`cbref`]        | registry of free-callback references      | none (an `RBTree` under a static spinlock; `kernel::xarray` (6.14) churns nodes) |
//! | [`device`]       | DMA device, PCI device                    | `kernel::device`, `kernel::pci` |
//! | [`scatterlist`]  | scatter-gather tables                     | `kernel::scatterlist` (6.18) |
//! | [`mmu_notifier`] | address-range watches                     | none yet (`mmu_interval_notifier`) |
//! | [`pfnmap`]       | the caller's mappings under its mmap lock, their PFNs, what a PFN is | `kernel::mm` (6.14; no PFN walk) |
//! | [`iomem`]        | the firmware's memory map (`/proc/iomem`)  | none (`walk_iomem_res_desc`) |
//! | [`pci`]          | PCI devices with references, BARs, peer-to-peer reach | `kernel::pci` (no search, no P2P) |
//! | [`dma`]          | physical runs mapped for DMA (`dma_map_resource`) | none |
//! | [`kvmem`]        | arrays charged to the caller's memory cgroup | `kernel::alloc::KVVec` (6.13) |
//! | [`sched`]        | `cond_resched`, fatal signals               | none |
//! | [`debugfs`]      | counter, knob and action files (their `file_operations` here) | `kernel::debugfs` (6.18) |
//! | [`procfs`]       | a read-only `/proc` file (`seq_file`)      | none |
//! | [`object_count`] | live objects module unload waits for      | none |
//! | [`module_param`] | module parameters                         | `kernel::module_param` (6.18) |
//! | [`delay`], [`print`] | `msleep`, rate-limited messages       | `kernel::time::delay`, none |
//! | [`sync`]         | lock and condition variable               | `kernel::sync` |
//! | [`miscdev`]      | misc character device, its files          | `kernel::miscdevice` (6.13) |
//! | [`mm`]           | address-space keys, a page shared with users | `kernel::mm` (6.14), `kernel::page` |
//! | [`global_lock`]  | a `static` under a static spinlock, initialised at first use | `kernel::sync::global_lock!` (6.16) |
//! | [`layout`]       | the C layout of what Rust reads or builds, checked at load | none |
//! | [`uapi`]         | `include/uapi/peermem.h`                  | none |

use core::ffi::CStr;
use kernel::error::{to_result, Error, Result};

pub(crate) mod cbref;
pub(crate) mod debugfs;
pub(crate) mod delay;
pub(crate) mod device;
pub(crate) mod dma;
pub(crate) mod global_lock;
pub(crate) mod iomem;
pub(crate) mod kvmem;
pub(crate) mod layout;
pub(crate) mod miscdev;
pub(crate) mod mm;
pub(crate) mod mmu_notifier;
pub(crate) mod module_param;
pub(crate) mod nvidia_p2p;
pub(crate) mod object_count;
pub(crate) mod pci;
pub(crate) mod peer_mem;
pub(crate) mod pfnmap;
pub(crate) mod print;
pub(crate) mod procfs;
pub(crate) mod scatterlist;
pub(crate) mod sched;
pub(crate) mod sync;
pub(crate) mod task;
pub(crate) mod uapi;
pub(crate) mod work;

#[allow(
    clippy::all,
    dead_code,
    improper_ctypes,
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    unreachable_pub,
    unsafe_op_in_unsafe_fn
)]
#[allow(
    clippy::undocumented_unsafe_blocks,
    clippy::ptr_as_ptr,
    clippy::ref_as_ptr
)]
mod raw {
    include!("../ffi_generated.rs");
}

// The C types of the generated bindings: the kernel's `ffi` crate from 6.13
// on (c_char is u8, c_ulong usize), `core::ffi` before.
#[cfg(not(peermem_ffi_crate))]
use core::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
#[cfg(peermem_ffi_crate)]
use kernel::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

/// The build's identity (`git describe` of its source, or "unknown"):
/// `peermem_build` in `rust/helpers.c`.
pub(crate) fn build() -> &'static str {
    // SAFETY: `peermem_build` is an array of static storage that nothing
    // writes (`rust/helpers.c`); its bytes are plain `char`s.
    let bytes: &'static [u8] = unsafe {
        core::slice::from_raw_parts(
            raw::peermem_build.as_ptr().cast::<u8>(),
            raw::peermem_build.len(),
        )
    };
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    core::str::from_utf8(&bytes[..len]).unwrap_or("unknown")
}

/// peermem's version (`PEERMEM_VERSION` in `include/peermem_ffi.h`).
pub(crate) const VERSION: &str = {
    let Ok(v) = CStr::from_bytes_with_nul(raw::PEERMEM_VERSION) else {
        panic!("PEERMEM_VERSION is a C string");
    };
    let Ok(v) = core::str::from_utf8(v.to_bytes()) else {
        panic!("PEERMEM_VERSION is ASCII");
    };
    v
};

/// `EOVERFLOW`, which the kernel crate of 6.12 does not name.
pub(crate) fn eoverflow() -> Error {
    Error::from_errno(-(kernel::bindings::EOVERFLOW as i32))
}

/// `EOPNOTSUPP`, which the kernel crate of 6.12 does not name.
pub(crate) fn eopnotsupp() -> Error {
    Error::from_errno(-(kernel::bindings::EOPNOTSUPP as i32))
}

/// The errno of a C return value (`0` or `-errno`).
fn result_of(ret: c_int) -> Result {
    to_result(ret)
}
