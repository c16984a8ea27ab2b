// SPDX-License-Identifier: GPL-2.0

//! gpusim: an emulated GPU for the peermem test rig.
//!
//! It exports the NVIDIA peer-to-peer interface (`nvidia_p2p_*`, see
//! `include/nv_p2p_abi.h`) of the 550, 570, 580 or 595 driver branch
//! (module parameter `branch`, default 595) with the real names,
//! signatures, layouts and version constants, so peermem and unmodified
//! third-party clients link against it through `KBUILD_EXTRA_SYMBOLS`.
//! User space gets "device memory" from `/dev/gpusim`. Behaviour, knobs and
//! deviations from the real driver: docs/gpusim.md.

use kernel::debugfs::Scope;
use kernel::miscdevice::{MiscDeviceOptions, MiscDeviceRegistration};
use kernel::prelude::*;

mod abi;
mod bar1;
mod branch;
mod dev;
mod glue;
mod knobs;
mod p2p;
mod rm;
mod state;

module! {
    type: GpuSimModule,
    name: "gpusim",
    authors: ["peermem project"],
    description: "Emulated GPU exporting the NVIDIA nvidia_p2p_* peer-to-peer interface (peermem test rig)",
    license: "GPL",
    params: {
        // On by default, as NVIDIA's driver holds RM's locks (docs/gpusim.md,
        // "The resource manager's lock"); 0 only for the orders the real
        // driver never produces.
        rm_lock: bool {
            default: true,
            description: "1: hold an emulated resource-manager lock across get_pages, put_pages, dma_map_pages and the free path (free callbacks), as the 550 driver does (docs/gpusim.md)",
        },
        // The pin-cost model (docs/gpusim.md, "Pin cost"): 0 and 0, no
        // cost, unless asked for.
        pin_call_us: u64 {
            default: 0,
            description: "pin-cost model: microseconds each successful nvidia_p2p_get_pages* takes, under the RM lock (0..1000000; default 0: none; debugfs pin_call_us)",
        },
        bar1_mib: u64 {
            default: 1024,
            description: "BAR1 size in MiB (1..1048576; default 1024; debugfs bar1_mib): pins map into it per RM client, with RM's 36 MiB reserve, and fail with -ENOMEM when it is full (docs/gpusim.md, BAR1)",
        },
        pin_page_ns: u64 {
            default: 0,
            description: "pin-cost model: nanoseconds per 64 KiB page each successful nvidia_p2p_get_pages* takes on top (0..1000000; default 0: none; debugfs pin_page_ns)",
        },
    },
}

#[pin_data(PinnedDrop)]
struct GpuSimModule {
    /// `/dev/gpusim_mmap`: created last, removed first.
    _mmapdev: glue::MmapDev,
    /// The emulated driver branch (module parameter `branch`); an invalid
    /// one fails the load before anything else is set up.
    _branch: branch::Branch,
    #[pin]
    misc: MiscDeviceRegistration<dev::GpuSimFile>,
    #[pin]
    debugfs: Scope<()>,
}

impl kernel::InPlaceModule for GpuSimModule {
    fn init(_module: &'static ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: Module init runs once, before any entry point can be
        // reached (the exports only resolve once init succeeded, the device
        // and debugfs files are created below).
        unsafe {
            state::init();
            rm::init(module_parameters::rm_lock.value());
        }
        knobs::set_bar1_mib(module_parameters::bar1_mib.value());
        knobs::set_pin_cost(
            module_parameters::pin_call_us.value(),
            module_parameters::pin_page_ns.value(),
        );
        try_pin_init!(Self {
            _branch: branch::init()?,
            debugfs <- knobs::debugfs(),
            misc <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"gpusim" }),
            _mmapdev: glue::MmapDev::register()?,
        })
    }
}

#[pinned_drop]
impl PinnedDrop for GpuSimModule {
    fn drop(self: Pin<&mut Self>) {
        // No file is open (each holds a module reference) and no client is
        // loaded (each holds one through the symbols it uses): anything
        // still in the tables was leaked by a client.
        state::teardown();
    }
}
