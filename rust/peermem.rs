// SPDX-License-Identifier: GPL-2.0

//! peermem: a peer-memory client for the MLNX_OFED/DOCA-OFED ib_core that
//! lets `ibv_reg_mr()` register GPU memory exported through the NVIDIA P2P
//! interface (`nvidia_p2p_*`).
//!
//! At load it registers with the peer-memory core (`peer_name`, by default
//! `nv_mem`, the name NCCL looks for) as an invalidating client with
//! `PEER_MEM_INVALIDATE_UNMAPS`, or, with `enable_invalidate=0`, as a
//! non-invalidating one that pins persistently. Each registration pins its
//! GPU pages once, in `acquire`, and maps them with contiguous pages
//! coalesced; when the GPU memory is freed under a live registration the
//! driver's free callback invalidates it through the core, and so does an
//! mmu interval notifier when the process unmaps or moves the registered
//! range. See `docs/module.md`.
//!
//! Layout: `ffi` is the only module with raw bindings and C calls;
//! `client` is the client's logic, `range` the page arithmetic, `stats`
//! the counters in `/sys/kernel/debug/peermem/`, `params` the module
//! parameters, `sync` the lock type, `inject` the test delays. Kernel
//! interfaces whose Rust abstractions differ between the supported kernels
//! (module parameters, debugfs, scatterlists, PCI) live in the C glue
//! `helpers.c`, behind `ffi`.

use kernel::prelude::*;

mod client;
mod ffi;
mod inject;
mod params;
mod range;
mod stats;
mod sync;

// Only the keys that `module!` accepts on every supported kernel (6.12
// wants `author:`, 7.x `authors: [..]`; neither has a `version:`): author,
// version (MODULE_VERSION, hence /sys/module/<name>/version) and parameters
// are declared in helpers.c. `name` is the module's name as Kbuild makes
// it (KBUILD_MODNAME) and prefixes the log messages: `make DROPIN=1` builds
// the module as nvidia_peermem, and Kbuild passes --cfg peermem_dropin.
#[cfg(not(peermem_dropin))]
module! {
    type: PeerMem,
    name: "peermem",
    description: "Peer-memory client for RDMA on GPU memory (NVIDIA P2P interface)",
    license: "GPL",
}

#[cfg(peermem_dropin)]
module! {
    type: PeerMem,
    name: "nvidia_peermem",
    description: "Peer-memory client for RDMA on GPU memory (NVIDIA P2P interface): peermem built as a drop-in for nvidia-peermem",
    license: "GPL",
}

struct PeerMem {
    core: Option<ffi::CoreClient>,
    watches: Option<ffi::Watches>,
    debugfs: Option<ffi::Debugfs>,
    name: &'static str,
}

impl kernel::Module for PeerMem {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let params = params::Params::from_module()?;
        let debugfs = match ffi::Debugfs::create(&stats::STATS) {
            Ok(d) => Some(d),
            Err(e) => {
                pr_warn!(
                    "no debugfs counters (error {}); mount debugfs or enable CONFIG_DEBUG_FS to see them\n",
                    e.to_errno()
                );
                None
            }
        };
        client::set_invalidating(params.enable_invalidate);
        // Before the core can call acquire, which starts watches.
        let watches = ffi::Watches::setup().inspect_err(|_| {
            pr_err!("out of memory creating peermem's work queue; try loading it again\n");
        })?;
        let core = match ffi::CoreClient::register(params.peer_name, params.enable_invalidate) {
            Ok(c) => c,
            Err(e) => {
                pr_err!(
                    "the peer-memory core refused to register client {} (see its messages above; a client of that name may be loaded already, e.g. nvidia-peermem as nv_mem): load peermem with another peer_name= or unload the other client\n",
                    params.peer_name
                );
                return Err(e);
            }
        };
        pr_info!(
            "version {} loaded, registered as peer-memory client {} ({}{})\n",
            ffi::VERSION,
            params.peer_name,
            if params.enable_invalidate {
                "invalidating: freed GPU memory is revoked from RDMA"
            } else {
                "not invalidating: persistent pins, freed GPU memory stays until deregistration"
            },
            match (params.enable_invalidate, ffi::Watches::available()) {
                (false, _) => "",
                (true, true) => "; so is a range the process unmaps or moves",
                (true, false) if !params.mmu_notifier => {
                    "; mmu_notifier=0: unmapping or moving a registered range does not revoke it"
                }
                (true, false) => {
                    "; this kernel has no MMU notifiers: unmapping or moving a registered range does not revoke it"
                }
            }
        );
        Ok(Self {
            core: Some(core),
            watches: Some(watches),
            debugfs,
            name: params.peer_name,
        })
    }
}

impl Drop for PeerMem {
    fn drop(&mut self) {
        let live = stats::STATS
            .registrations_acquired
            .get()
            .wrapping_sub(stats::STATS.registrations_released.get());
        if live != 0 {
            pr_info!(
                "unloading: waiting until the {} registration(s) on GPU memory are deregistered (ibv_dereg_mr or process exit)\n",
                live
            );
        }
        // Sleeps until the core released every registration (which stops
        // every address watch).
        drop(self.core.take());
        // Runs the address-change work items still queued.
        drop(self.watches.take());
        // A GPU free callback may still be finishing on another CPU.
        ffi::wait_for_objects();
        // Every registry entry holds an object: none can be left now.
        let left = ffi::callback_refs_left();
        if left != 0 {
            pr_err!(
                "BUG: {} free callback references left in the registry at unload; their registrations leak. Please report this peermem bug\n",
                left
            );
        }
        drop(self.debugfs.take());
        pr_info!("unregistered {} and unloaded\n", self.name);
    }
}
