// SPDX-License-Identifier: GPL-2.0

//! peermem: a peer-memory client for the MLNX_OFED/DOCA-OFED ib_core that
//! lets `ibv_reg_mr()` register GPU memory exported through the NVIDIA P2P
//! interface (`nvidia_p2p_*`).
//!
//! At load it registers two clients with the peer-memory core, as
//! nvidia-peermem does: `peer_name` (by default `nv_mem`), invalidating
//! with `PEER_MEM_INVALIDATE_UNMAPS`, and `<peer_name>_nc` (`nv_mem_nc`),
//! non-invalidating, which pins persistently and serves the umems the core
//! cannot invalidate (queue buffers, doorbell pages) and the registrations
//! `nv_mem` declines; `enable_invalidate=0` or `enable_nc=0` leaves one
//! out. Each registration pins its GPU pages in `acquire` (`nv_mem`: a pin
//! with a free callback that watches the memory, and a persistent keeper
//! that is what gets mapped; `nv_mem_nc`: one persistent pin), and maps
//! them for the RDMA device's PCI device (`nvidia_p2p_dma_map_pages`) with
//! contiguous bus addresses coalesced; when the GPU memory is freed under a
//! live `nv_mem` registration the driver's free callback queues its
//! revocation through the core, and so does an mmu interval notifier when
//! the process unmaps or moves the registered range. A pin with a free
//! callback is given back only in the process that made it (the driver
//! ignores a put from anywhere else). See `docs/module.md`.
//!
//! Layout (`docs/architecture.md`): `kapi` holds the safe abstractions,
//! one per concept (the peer-memory core client, the NVIDIA P2P page table
//! and its mapping, the callback-reference registry, devices,
//! scatterlists, address watches, debugfs, object counting), with every
//! `unsafe` block that touches C; `client` is the driver on top of them
//! (the two clients, the registration and its states, the checks of what
//! the GPU driver hands out, counters, parameters, test delays). `kapi`
//! never names `client`. What Rust cannot call (static inlines,
//! macros) and the module parameter definitions are one-line C glue in
//! `helpers.c`, behind `kapi`.

use kernel::prelude::*;

mod client;
mod kapi;

#[cfg(peermem_rig)]
use client::inject;
use client::{params, stats, NvMem, NvMemNc, Registration};
use kapi::debugfs::Debugfs;
use kapi::mmu_notifier::Watches;
use kapi::peer_mem::{CoreClient, PeerMemoryClient};
use kapi::procfs::ProcFile;

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

/// The module. `Drop` takes the parts down in the order unload needs
/// (see there); a load that fails part way drops what it has built so far
/// the same way.
struct PeerMem {
    /// `/proc/driver/peermem`: the counters anyone may read.
    counters: Option<ProcFile<stats::PublicCounters>>,
    /// `/dev/peermem` (revocation events), unless `events=0`.
    events: Option<client::events::Device>,
    /// The non-invalidating client (`nv_mem_nc`), unless `enable_nc=0`.
    core_nc: Option<CoreClient<NvMemNc>>,
    /// The invalidating client (`nv_mem`), unless `enable_invalidate=0`.
    core: Option<CoreClient<NvMem>>,
    watches: Option<Watches<Registration>>,
    debugfs: Option<Debugfs>,
    params: params::Params,
    /// `init` returned it: `Drop` is an unload, not a failed load.
    loaded: bool,
}

/// Registers client `T` as `name`, or says why the core refused.
fn register<T: PeerMemoryClient>(name: &str) -> Result<CoreClient<T>> {
    CoreClient::<T>::register(name).inspect_err(|_| {
        pr_err!(
            "the peer-memory core refused to register client {} (see its messages above); unload peermem and other peer-memory clients and load it again, or report the core's message\n",
            name
        );
    })
}

impl kernel::Module for PeerMem {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        // Before anything reads a kernel structure through the bindings.
        kapi::layout::check()?;
        let params = params::Params::from_module()?;
        let events = events_enabled()?;
        client::wcache::setup()?;
        // From here on, a failure (`?`) drops `this`, whose `Drop` undoes
        // what was done, in the order unload does.
        let mut this = Self {
            counters: None,
            events: None,
            core_nc: None,
            core: None,
            watches: None,
            debugfs: None,
            params,
            loaded: false,
        };
        // Before the core can call acquire, which starts watches.
        this.watches = Some(Watches::<Registration>::setup().inspect_err(|_| {
            pr_err!("out of memory creating peermem's work queue; try loading it again\n");
        })?);
        // The invalidating client first: the core asks clients in the
        // order they registered, so MRs go to it and only what it declines
        // (and what cannot be invalidated) to the non-invalidating one.
        if this.params.invalidating {
            this.core = Some(register::<NvMem>(this.params.peer_name)?);
        }
        if let Some(name) = &this.params.nc_name {
            this.core_nc = Some(register::<NvMemNc>(name.as_str())?);
        }
        // The files user space opens come last, when nothing but their own
        // creation can fail any more: an open file holds a module
        // reference, which it gets while the module is still loading, yet
        // the loader frees a module whose init failed, open files or not
        // (their file operations are the module's). The device may fail,
        // so it comes before the debugfs files, which never fail the load.
        if events {
            this.events = Some(create_events_device()?);
        }
        this.debugfs = match create_debugfs() {
            Ok(d) => Some(d),
            Err(e) => {
                pr_warn!(
                    "no debugfs counters (error {}); mount debugfs or enable CONFIG_DEBUG_FS to see them\n",
                    e.to_errno()
                );
                None
            }
        };
        // Like the debugfs files, never a reason to fail the load.
        this.counters = ProcFile::create(c"driver/peermem")
            .inspect_err(|e| {
                pr_warn!(
                    "no /proc/driver/peermem (error {}): the counters are only in debugfs\n",
                    e.to_errno()
                );
            })
            .ok();
        this.loaded = true;
        let params = &this.params;
        pr_info!(
            "version {} (build {}) loaded\n",
            kapi::VERSION,
            kapi::build()
        );
        if this.core.is_some() {
            pr_info!(
                "registered as peer-memory client {} (invalidating: freed GPU memory is revoked from RDMA{})\n",
                params.peer_name,
                match (Watches::<Registration>::available(), params.mmu_notifier) {
                    (true, _) => "; so is a range the process unmaps or moves",
                    (false, false) => {
                        "; mmu_notifier=0: unmapping or moving a registered range does not revoke it"
                    }
                    (false, true) => {
                        "; this kernel has no MMU notifiers: unmapping or moving a registered range does not revoke it"
                    }
                }
            );
        } else {
            pr_info!("enable_invalidate=0: no invalidating client; memory registrations on GPU memory are pinned persistently by the non-invalidating client, and freed GPU memory stays allocated until they are deregistered\n");
        }
        match &params.nc_name {
            Some(name) => pr_info!(
                "registered as peer-memory client {} (not invalidating: persistent pins for queue buffers, doorbell pages and registrations {} does not take; freed GPU memory stays allocated until they are released)\n",
                name.as_str(),
                if this.core.is_some() { params.peer_name } else { "no other client" }
            ),
            None => pr_info!("enable_nc=0: no non-invalidating client; queue buffers and doorbell pages on GPU memory cannot be registered (EFAULT)\n"),
        }
        Ok(this)
    }
}

impl Drop for PeerMem {
    fn drop(&mut self) {
        let live = |s: &stats::Stats| {
            s.registrations_acquired
                .get()
                .wrapping_sub(s.registrations_released.get())
        };
        let live = live(&stats::STATS)
            .wrapping_add(live(&stats::STATS_NC))
            .wrapping_add(live(&stats::STATS_PFN));
        let doing = if self.loaded {
            "unloading"
        } else {
            "the load failed"
        };
        if live != 0 {
            pr_info!(
                "{}: waiting until the {} registration(s) on GPU memory are deregistered (ibv_dereg_mr, closing what holds them, or process exit)\n",
                doing,
                live
            );
        }
        // First, so no file can be opened any more; open files hold a
        // module reference, so none is left. The debugfs files too (their
        // removal waits for a write in progress): no flush of the watch-pin
        // cache runs beside the unload's drain below.
        drop(self.counters.take());
        drop(self.events.take());
        drop(self.debugfs.take());
        // Each sleeps until the core released every registration of that
        // client (which stops every address watch).
        drop(self.core_nc.take());
        drop(self.core.take());
        // The watch-pin cache's entries, before the work queue their free
        // callbacks queue to goes: the pins of other processes are left to
        // their free callbacks (only the pinning process can put them).
        client::WATCH_CACHE.drain_all();
        let left = stats::STATS
            .pins_left_to_callback
            .get()
            .wrapping_sub(stats::STATS.pins_left_freed.get());
        if left != 0 {
            pr_warn!(
                "{}: waiting for {} GPU pin(s) that only the processes that made them can give back (NVIDIA's driver ignores a put from any other process): unloading completes when those processes free the memory or exit\n",
                doing,
                left
            );
        }
        // Runs the address-change work items still queued.
        drop(self.watches.take());
        // A GPU free callback may still be finishing on another CPU.
        kapi::object_count::wait_for_objects();
        // Every registry entry holds an object: none can be left now.
        let left = kapi::cbref::left();
        if left != 0 {
            pr_err!(
                "BUG: {} free callback references left in the registry at unload; their registrations leak. Please report this peermem bug\n",
                left
            );
        }
        if !self.loaded {
            pr_info!(
                "the load failed (see the message above); everything it had set up is undone\n"
            );
            return;
        }
        let p = &self.params;
        match (p.invalidating, &p.nc_name) {
            (true, Some(nc)) => pr_info!(
                "unregistered {} and {} and unloaded\n",
                p.peer_name,
                nc.as_str()
            ),
            (true, None) => pr_info!("unregistered {} and unloaded\n", p.peer_name),
            (false, Some(nc)) => pr_info!("unregistered {} and unloaded\n", nc.as_str()),
            (false, None) => pr_info!("unloaded\n"),
        }
    }
}

/// Whether to create `/dev/peermem` (revocation events: `events`, with
/// `event_queue_len` and `event_files_per_user` checked); if so, registrations remember their address
/// space from now on, before the core can call `acquire`.
fn events_enabled() -> Result<bool> {
    use client::events::{FILES_PER_USER_MAX, FILES_PER_USER_MIN, QUEUE_LEN_MAX, QUEUE_LEN_MIN};
    if !kapi::uapi::params::events() {
        pr_info!("events=0: no /dev/peermem; applications learn of revoked registrations only from failing RDMA\n");
        return Ok(false);
    }
    let qlen = kapi::uapi::params::event_queue_len();
    if !(QUEUE_LEN_MIN..=QUEUE_LEN_MAX).contains(&qlen) {
        pr_err!(
            "event_queue_len={} is out of range; load peermem with a value from {} to {}\n",
            qlen,
            QUEUE_LEN_MIN,
            QUEUE_LEN_MAX
        );
        return Err(EINVAL);
    }
    let files = kapi::uapi::params::event_files_per_user();
    if !(FILES_PER_USER_MIN..=FILES_PER_USER_MAX).contains(&files) {
        pr_err!(
            "event_files_per_user={} is out of range; load peermem with a value from {} to {}\n",
            files,
            FILES_PER_USER_MIN,
            FILES_PER_USER_MAX
        );
        return Err(EINVAL);
    }
    client::events::enable(qlen, files);
    Ok(true)
}

/// `/dev/peermem` (revocation events), after [`events_enabled`].
fn create_events_device() -> Result<client::events::Device> {
    client::events::Device::register().inspect_err(|e| {
        pr_err!(
            "cannot create /dev/peermem (error {}); another module may own the name: unload it, or load peermem with events=0\n",
            e.to_errno()
        );
    })
}

/// `/sys/kernel/debug/peermem/`: a read-only file per counter of the
/// invalidating client and the test knobs, and `nc/` with the counters of
/// the non-invalidating client.
fn create_debugfs() -> Result<Debugfs> {
    let d = Debugfs::create()?;
    // Each set of counters in its directory (`nc/`: the nc client's,
    // `pfn/`: the PFN-map source's); without its subdirectory (out of
    // memory) a set has no files.
    for set in stats::Set::ALL {
        match set.debugfs_dir() {
            None => set.for_each(|name, c| d.add_u64(None, name, c.atomic())),
            Some(dir) => {
                if let Some(sub) = d.subdir(dir) {
                    set.for_each(|name, c| d.add_u64(Some(&sub), name, c.atomic()));
                }
            }
        }
    }
    stats::LAST_PIN.for_each(|name, value| d.add_hex(name, value));
    // Drops every cached watch pin (tests: "nothing pinned" after deregistering).
    d.add_action::<client::wcache::Flush<Registration>>(c"watch_cache_flush");
    // The fault-injection delays: rig builds only (client/inject.rs).
    #[cfg(peermem_rig)]
    {
        inject::for_each(|n, knob| d.add_u32(n.knob, knob.atomic()));
        // How many delays each knob made (begun, ended): tests prove with
        // them that what they raced landed inside the window.
        if let Some(dir) = d.subdir(c"inject") {
            inject::for_each(|n, knob| {
                d.add_u64(Some(&dir), n.entered, knob.counter(true).atomic());
                d.add_u64(Some(&dir), n.left, knob.counter(false).atomic());
            });
        }
    }
    Ok(d)
}
