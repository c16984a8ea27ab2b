// SPDX-License-Identifier: GPL-2.0

//! peermem: a peer-memory client for the MLNX_OFED/DOCA-OFED ib_core that
//! lets `ibv_reg_mr()` register GPU memory exported through the NVIDIA P2P
//! interface (`nvidia_p2p_*`).
//!
//! This version is the skeleton: it loads, checks its parameters, shows
//! its counters in `/sys/kernel/debug/peermem/` and carries the range and
//! scatter-list arithmetic the client is built on (with KUnit tests). It
//! does not register with the peer-memory core yet.
//!
//! Layout: `ffi` is the only module with raw bindings and C calls;
//! everything else is safe Rust. Kernel interfaces whose Rust abstractions
//! differ between the supported kernels (module parameters, debugfs) live
//! in the C glue `helpers.c`, behind `ffi`.

use kernel::prelude::*;

mod ffi;
mod params;
mod range;
mod stats;

// Only the keys that `module!` accepts on every supported kernel (6.12
// wants `author:`, 7.x `authors: [..]`): author, version and parameters
// are declared in helpers.c.
module! {
    type: PeerMem,
    name: "peermem",
    description: "Peer-memory client for RDMA on GPU memory (NVIDIA P2P interface)",
    license: "GPL",
}

struct PeerMem {
    _debugfs: Option<ffi::Debugfs>,
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
        pr_info!(
            "version {} loaded (peer_name={}, enable_invalidate={}); not registered with a peer-memory core yet\n",
            ffi::VERSION,
            params.peer_name,
            params.enable_invalidate
        );
        Ok(Self { _debugfs: debugfs })
    }
}

impl Drop for PeerMem {
    fn drop(&mut self) {
        pr_info!("unloaded\n");
    }
}
