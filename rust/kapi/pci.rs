// SPDX-License-Identifier: GPL-2.0

//! PCI devices: the kernel's list of them (with references), their memory
//! BARs, and whether one reaches another peer-to-peer. Upstream
//! counterpart: `kernel::pci::Device` (6.13; its API differs between the
//! supported kernels, and it has no device search or peer-to-peer
//! queries); exported functions are called directly, the static inline
//! ones (`pci_upstream_bridge`, `pci_bus_address`, `pci_p2pdma_distance`)
//! through the C glue.

use super::raw;
use core::ptr::NonNull;
use kernel::types::Opaque;

/// The memory BARs of a device (`PCI_STD_NUM_BARS`).
pub(crate) const NUM_BARS: u32 = raw::peermem_pfn_const_PEERMEM_PCI_STD_NUM_BARS;

/// A PCI device (`struct pci_dev`), borrowed: alive as long as the
/// reference.
#[repr(transparent)]
pub(crate) struct Device(Opaque<kernel::bindings::pci_dev>);

impl Device {
    /// The device at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` points to a live `struct pci_dev` that stays alive for `'a`.
    pub(super) unsafe fn from_raw<'a>(ptr: *mut kernel::bindings::pci_dev) -> &'a Self {
        // SAFETY: `Device` is a transparent wrapper of the C struct, alive
        // for `'a` (function safety).
        unsafe { &*ptr.cast::<Self>() }
    }

    /// The C pointer.
    pub(super) fn as_raw(&self) -> *mut kernel::bindings::pci_dev {
        self.0.get()
    }

    /// Its generic device (`&pdev->dev`), for the DMA API.
    pub(super) fn as_dev_raw(&self) -> *mut kernel::bindings::device {
        // SAFETY: a live device (type invariant of the reference).
        unsafe { raw::peermem_pci_device(self.as_raw()) }
    }

    /// BAR `bar` (below [`NUM_BARS`]) as `(start, end, flags)`.
    fn resource(&self, bar: u32) -> Option<(u64, u64, u64)> {
        if bar >= NUM_BARS {
            return None;
        }
        // SAFETY: a live device; `resource` has more than `NUM_BARS`
        // entries.
        let r = unsafe { raw::peermem_pci_resource(self.as_raw(), bar as i32) };
        // SAFETY: a resource of the live device; its fields are read as
        // C reads them.
        Some(unsafe { ((*r).start, (*r).end, (*r).flags as u64) })
    }

    /// BAR `bar` (below [`NUM_BARS`]) as `(start, end)` (end inclusive, CPU
    /// physical addresses) if it is a memory BAR (`IORESOURCE_MEM`).
    pub(crate) fn mem_bar(&self, bar: u32) -> Option<(u64, u64)> {
        let (start, end, flags) = self.resource(bar)?;
        let mem = u64::from(raw::peermem_pfn_const_PEERMEM_IORESOURCE_MEM);
        (flags & mem != 0).then_some((start, end))
    }

    /// The CPU physical start of BAR `bar` (`pci_resource_start`), 0 for
    /// an index past the BARs.
    pub(crate) fn resource_start(&self, bar: u32) -> u64 {
        self.resource(bar).map_or(0, |(start, _, _)| start)
    }

    /// The bus address of BAR `bar`'s start (`pci_bus_address`), 0 for an
    /// index past the BARs.
    pub(crate) fn bus_address(&self, bar: u32) -> u64 {
        if bar >= NUM_BARS {
            return 0;
        }
        // SAFETY: a live device and one of its BARs.
        unsafe { raw::peermem_pci_bus_address(self.as_raw(), bar as i32) }
    }

    /// The bridge above the device (`pci_upstream_bridge`): `None` on a
    /// root bus. The bridge lives at least as long as the device (its bus
    /// holds a reference).
    pub(crate) fn upstream_bridge(&self) -> Option<&Device> {
        // SAFETY: a live device.
        let b = unsafe { raw::peermem_pci_upstream_bridge(self.as_raw()) };
        // SAFETY: the bridge outlives the device (above), so `&self`'s
        // lifetime.
        NonNull::new(b).map(|b| unsafe { Device::from_raw(b.as_ptr()) })
    }

    /// Whether this port redirects peer requests upstream: its ACS
    /// control, read now, has request or completion redirect or egress
    /// control on. `false` without an ACS capability.
    pub(crate) fn acs_redirects(&self) -> bool {
        // SAFETY: a live device.
        let cap = unsafe { raw::peermem_pci_acs_cap(self.as_raw()) };
        if cap == 0 {
            return false;
        }
        let mut ctrl: u16 = 0;
        let at = cap + raw::peermem_pfn_const_PEERMEM_PCI_ACS_CTRL as u16;
        // SAFETY: a live device; `ctrl` is a local (set to all ones on a
        // failed read).
        unsafe { raw::pci_read_config_word(self.as_raw(), at.into(), &mut ctrl) };
        ctrl & raw::peermem_pfn_const_PEERMEM_PCI_ACS_REDIRECT as u16 != 0
    }

    /// `pci_p2pdma_distance(self, client, verbose)`: negative if `client`
    /// cannot reach this device's memory peer-to-peer (with `verbose`,
    /// the kernel logs why), else the distance.
    pub(crate) fn p2pdma_distance(&self, client: &Device, verbose: bool) -> i32 {
        // SAFETY: two live devices.
        unsafe { raw::peermem_pci_p2pdma_distance(self.as_raw(), client.as_dev_raw(), verbose) }
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        core::ptr::eq(self, other)
    }
}

/// Whether a verbose `pci_p2pdma_distance` may log now (at most once a
/// minute).
pub(crate) fn p2pdma_verbose_ratelimit() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_p2pdma_verbose_ratelimit() }
}

/// A PCI device with a reference of ours (`pci_dev_get`), given back
/// (`pci_dev_put`) on drop.
///
/// # Invariants
///
/// `0` holds a reference on a live `struct pci_dev`.
pub(crate) struct DevRef(NonNull<kernel::bindings::pci_dev>);

// SAFETY: the reference may be given back from any thread; the device's
// queries here are safe from any thread.
unsafe impl Send for DevRef {}
// SAFETY: as above.
unsafe impl Sync for DevRef {}

impl DevRef {
    /// The first PCI device, in the kernel's order (`pci_get_device`), for
    /// which `f` says yes, with a reference; `None` if none does. Process
    /// context (it takes the PCI bus semaphore).
    pub(crate) fn find(mut f: impl FnMut(&Device) -> bool) -> Option<Self> {
        let mut dev: *mut kernel::bindings::pci_dev = core::ptr::null_mut();
        loop {
            // SAFETY: `dev` is NULL or a device we hold a reference on,
            // which `pci_get_device` gives back; it takes one on the
            // device it returns. `!0` is `PCI_ANY_ID`.
            dev = unsafe { raw::pci_get_device(!0, !0, dev) };
            let d = NonNull::new(dev)?;
            // SAFETY: we hold a reference on `d` during the call.
            if f(unsafe { Device::from_raw(d.as_ptr()) }) {
                // INVARIANT: the reference `pci_get_device` took.
                return Some(Self(d));
            }
        }
    }
}

impl core::ops::Deref for DevRef {
    type Target = Device;

    fn deref(&self) -> &Device {
        // SAFETY: alive while we hold the reference (type invariant).
        unsafe { Device::from_raw(self.0.as_ptr()) }
    }
}

impl Drop for DevRef {
    fn drop(&mut self) {
        // SAFETY: our reference (type invariant), given back once.
        unsafe { raw::pci_dev_put(self.0.as_ptr()) };
    }
}
