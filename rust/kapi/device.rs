// SPDX-License-Identifier: GPL-2.0

//! The device a peer-memory client maps for. Upstream counterparts:
//! `kernel::device::Device` and `kernel::pci::Device` (whose APIs differ
//! between 6.12 and 7.x; the C glue does the lookups).

use super::raw;
use core::ptr::NonNull;

/// A PCI device used as DMA peer.
///
/// # Invariants
///
/// `0` points to a live `struct pci_dev` (the core's RDMA DMA device,
/// which outlives every umem of the device).
pub(crate) struct PciDev(NonNull<kernel::bindings::pci_dev>);

// SAFETY: a reference to a device, usable from any thread.
unsafe impl Send for PciDev {}

impl PciDev {
    /// The C pointer, for the NVIDIA P2P interface.
    pub(super) fn as_raw(&self) -> *mut kernel::bindings::pci_dev {
        self.0.as_ptr()
    }

    /// Another handle to the same device (valid as long as this one).
    pub(super) fn clone_handle(&self) -> Self {
        Self(self.0)
    }

    /// The device, for PCI queries ([`super::pci::Device`]).
    pub(crate) fn pci(&self) -> &super::pci::Device {
        // SAFETY: a live device (type invariant), for as long as `self`.
        unsafe { super::pci::Device::from_raw(self.0.as_ptr()) }
    }
}

/// The DMA device `dma_map` is asked to map for (valid for `'a`, the call).
pub(crate) enum DmaDevice<'a> {
    /// A PCI device, with its scatter-gather limits.
    Pci {
        /// The device.
        pdev: PciDev,
        /// `dma_get_max_seg_size()`.
        max_seg_size: u32,
        /// `dma_get_seg_boundary()`.
        seg_boundary: u64,
    },
    /// Some other device (peer-to-peer needs PCI).
    Other(NotPci<'a>),
}

/// A DMA device that is not a PCI device, valid for `'a`.
pub(crate) struct NotPci<'a>(
    NonNull<kernel::bindings::device>,
    core::marker::PhantomData<&'a ()>,
);

impl NotPci<'_> {
    /// Logs (rate-limited, naming the device) that it cannot do GPU peer-to-peer DMA.
    pub(crate) fn report(&self) {
        // SAFETY: a live device (from `DmaDevice::from_raw`'s caller).
        unsafe { raw::peermem_report_not_pci(self.0.as_ptr().cast()) };
    }
}

impl DmaDevice<'_> {
    /// `None` for a NULL device (no device to map for).
    ///
    /// # Safety
    ///
    /// `dev` is NULL or a live device that outlives the returned value.
    pub(super) unsafe fn from_raw(dev: *mut kernel::bindings::device) -> Option<Self> {
        let dev = NonNull::new(dev)?;
        // SAFETY: `dev` is a live device.
        let pdev = unsafe { raw::peermem_to_pci_dev(dev.as_ptr()) };
        Some(
            match NonNull::new(pdev.cast::<kernel::bindings::pci_dev>()) {
                Some(p) => Self::Pci {
                    // INVARIANT: the PCI device of the live `dev`.
                    pdev: PciDev(p),
                    // SAFETY: `dev` is a live device.
                    max_seg_size: unsafe { raw::peermem_dma_max_seg_size(dev.as_ptr()) },
                    // SAFETY: `dev` is a live device.
                    seg_boundary: unsafe { raw::peermem_dma_seg_boundary(dev.as_ptr()) },
                },
                None => Self::Other(NotPci(dev, core::marker::PhantomData)),
            },
        )
    }
}
