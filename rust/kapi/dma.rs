// SPDX-License-Identifier: GPL-2.0

//! Physical memory mapped for a PCI device's DMA without struct pages
//! (`dma_map_resource`: the memory may have none, and DMA-API debug
//! accepts it for reserved RAM). Upstream counterpart: none
//! (`kernel::dma` maps coherent allocations only).

use super::device::PciDev;
use super::kvmem::KvArray;
use super::{raw, sched};
use kernel::error::{code, Error};

/// Physically contiguous bytes, page aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PhysRun {
    /// The CPU physical address of the first byte.
    pub(crate) phys: u64,
    /// Bytes.
    pub(crate) len: u64,
}

/// Which way the device moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Reads and writes (`DMA_BIDIRECTIONAL`).
    Bidirectional,
    /// Reads only (`DMA_TO_DEVICE`).
    ToDevice,
}

impl Direction {
    fn raw(self) -> raw::dma_data_direction {
        match self {
            Self::Bidirectional => raw::dma_data_direction_DMA_BIDIRECTIONAL,
            Self::ToDevice => raw::dma_data_direction_DMA_TO_DEVICE,
        }
    }
}

/// Runs mapped for a device with `dma_map_resource`; unmapped on drop.
///
/// # Invariants
///
/// Run `i` of `runs` is mapped for `dev` in direction `dir` at `addrs[i]`
/// (as many addresses as runs), until `unmap` or `drop`.
pub(crate) struct ResourceMappings {
    runs: KvArray<PhysRun>,
    addrs: KvArray<u64>,
    dev: PciDev,
    dir: Direction,
}

// SAFETY: plain memory and a device handle; the mappings may be undone
// from any thread.
unsafe impl Send for ResourceMappings {}
// SAFETY: `&ResourceMappings` only reads the arrays.
unsafe impl Sync for ResourceMappings {}

impl ResourceMappings {
    /// Maps every run for `dev` (which outlives the mapping), yielding
    /// between runs. `ENOMEM` (no room for the addresses, charged to the
    /// caller's memory cgroup) or `EIO` (a run could not be mapped):
    /// nothing is left mapped and the runs come back.
    pub(crate) fn map(
        dev: &PciDev,
        runs: KvArray<PhysRun>,
        dir: Direction,
    ) -> core::result::Result<Self, (KvArray<PhysRun>, Error)> {
        let mut addrs = match KvArray::with_capacity(runs.len()) {
            Ok(a) => a,
            Err(_) => return Err((runs, code::ENOMEM)),
        };
        let d = dev.pci().as_dev_raw();
        for r in runs.as_slice() {
            // SAFETY: `d` is a live device; the run is memory the caller
            // hands to the device.
            let a = unsafe { raw::dma_map_resource(d, r.phys, r.len as usize, dir.raw(), 0) };
            // SAFETY: `a` came from `dma_map_resource` for `d`.
            if unsafe { raw::peermem_dma_mapping_error(d, a) } != 0 {
                let mapped = addrs.as_slice().iter().zip(runs.as_slice());
                for (&a, r) in mapped.rev() {
                    // SAFETY: mapped just above for `d` with these arguments.
                    unsafe { raw::dma_unmap_resource(d, a, r.len as usize, dir.raw(), 0) };
                }
                return Err((runs, code::EIO));
            }
            if addrs.push_within_capacity(a).is_err() {
                // Cannot happen: room for one address per run.
                // SAFETY: mapped just above for `d`.
                unsafe { raw::dma_unmap_resource(d, a, r.len as usize, dir.raw(), 0) };
                return Err((runs, code::ENOMEM));
            }
            sched::cond_resched();
        }
        // INVARIANT: one address per run, each mapped for `dev` in `dir`.
        Ok(Self {
            runs,
            addrs,
            dev: dev.clone_handle(),
            dir,
        })
    }

    /// The runs.
    pub(crate) fn runs(&self) -> &[PhysRun] {
        self.runs.as_slice()
    }

    /// The bus address of each run, in order.
    pub(crate) fn addrs(&self) -> &[u64] {
        self.addrs.as_slice()
    }

    /// Unmaps every run that has an address, yielding between runs.
    fn unmap_all(&mut self) {
        let d = self.dev.pci().as_dev_raw();
        for (&a, r) in self.addrs.as_slice().iter().zip(self.runs.as_slice()) {
            // SAFETY: mapped for `dev` in `dir` at `a` (type invariant),
            // not unmapped yet: the addresses go with the unmapping.
            unsafe { raw::dma_unmap_resource(d, a, r.len as usize, self.dir.raw(), 0) };
            sched::cond_resched();
        }
    }

    /// Undoes the mapping; the runs come back.
    pub(crate) fn unmap(mut self) -> KvArray<PhysRun> {
        self.unmap_all();
        // INVARIANT: no addresses left, so no mapping; `drop` then
        // unmaps nothing.
        self.addrs = KvArray::new();
        core::mem::replace(&mut self.runs, KvArray::new())
    }
}

impl Drop for ResourceMappings {
    fn drop(&mut self) {
        self.unmap_all();
    }
}
