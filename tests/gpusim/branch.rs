// SPDX-License-Identifier: GPL-2.0

//! Which NVIDIA driver branch gpusim emulates: the module parameter
//! `branch` (550, 570, 580 or 595; default 595, the newest), read once at
//! load. Every behaviour that differs between the branches asks this
//! module; docs/gpusim.md has the table with the NVIDIA source each one
//! follows.
//!
//! The parameter itself is declared in `gpusim_glue.c` (`module_param`),
//! because the Rust `module!` parameters of this kernel have no sysfs file
//! and tests read `/sys/module/gpusim/parameters/branch`.

use kernel::prelude::*;
use kernel::sync::atomic::{Atomic, Relaxed};

extern "C" {
    fn gpusim_branch_param() -> u32;
}

/// An emulated driver branch. Ordered: a later branch compares greater.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Branch {
    /// 550.x: version-1.2 page tables, persistent flags must be 0.
    B550,
    /// 570.x (555 to 575 where nothing else changed): 64 KiB alignment
    /// enforced by the driver, persistent flags with FORCE_BAR1.
    B570,
    /// 580.x: version-2.0 page tables with `flags` (CPU_CACHEABLE);
    /// `get_rsync_registers` is -ENODEV unconditionally (from 575).
    B580,
    /// 590.x/595.x: as 580 for everything gpusim emulates.
    B595,
}

/// The branch as its number, 0 until `init` succeeded.
static BRANCH: Atomic<u32> = Atomic::new(0);

impl Branch {
    fn from_number(n: u32) -> Option<Self> {
        match n {
            550 => Some(Self::B550),
            570 => Some(Self::B570),
            580 => Some(Self::B580),
            595 => Some(Self::B595),
            _ => None,
        }
    }

    /// The branch this instance of gpusim emulates.
    pub(crate) fn current() -> Self {
        // `init` stored a valid number before any entry point can run.
        Self::from_number(BRANCH.load(Relaxed)).unwrap_or(Self::B595)
    }

    /// Page tables are version 2.0 (40 bytes, with `flags`): 580.65.06+.
    pub(crate) fn page_table_v2(self) -> bool {
        self >= Self::B580
    }

    /// `nvidia_p2p_get_pages_persistent` takes flags (truncated to u8,
    /// only FORCE_BAR1_MAPPING read, unknown bits ignored): 570.86.15+.
    /// Before, any non-zero flags are -EINVAL.
    pub(crate) fn persistent_flags(self) -> bool {
        self >= Self::B570
    }

    /// `nvidia_p2p_get_rsync_registers` checks its argument (NULL is
    /// -EINVAL) before answering -ENODEV: up to 570; from 575.51.02 it
    /// returns -ENODEV unconditionally.
    pub(crate) fn rsync_checks_null(self) -> bool {
        self <= Self::B570
    }
}

/// Reads and validates the `branch` parameter. An unknown branch fails the
/// load with -EINVAL.
pub(crate) fn init() -> Result<Branch> {
    // SAFETY: Reads an integer module parameter, set before init runs.
    let n = unsafe { gpusim_branch_param() };
    let Some(b) = Branch::from_number(n) else {
        pr_err!(
            "branch={} is not an emulated NVIDIA driver branch; use 550, 570, 580 or 595 \
             (docs/gpusim.md, \"Driver branches\")\n",
            n
        );
        return Err(EINVAL);
    };
    BRANCH.store(n, Relaxed);
    pr_info!(
        "emulating the NVIDIA {} driver branch (page table version {:#010x})\n",
        n,
        if b.page_table_v2() {
            crate::abi::PAGE_TABLE_VERSION_V2
        } else {
            crate::abi::PAGE_TABLE_VERSION_V1
        }
    );
    Ok(b)
}
