// SPDX-License-Identifier: GPL-2.0

//! The emulated resource-manager (RM) API lock (module parameter
//! `rm_lock`, then debugfs `rm_lock`).
//!
//! NVIDIA's 550 driver does the work of `nvidia_p2p_get_pages*`,
//! `nvidia_p2p_put_pages*` and `nvidia_p2p_dma_map_pages` inside its
//! resource manager, under RM's global API lock, and frees GPU memory
//! (cudaFree, close, exit) under the same lock, calling every client's free
//! callback with it held, synchronously in the freeing thread. A client
//! that holds one of its own locks across one of those calls and takes the
//! same lock in its free callback can deadlock against a concurrent free.
//! With `rm_lock=1` gpusim holds one lockdep-tracked mutex in the same
//! places, so lockdep reports such a client. `nvidia_p2p_dma_unmap_pages`
//! takes no RM lock in the real driver and takes none here.
//!
//! A thread that already holds the RM lock (a client calling gpusim from
//! its free callback) is refused with `-EIO`, as the real driver's
//! `rmapiLockAcquire()` refuses a recursive acquisition with
//! `NV_ERR_INVALID_LOCK_STATE` (mapped to `-EIO`), and counted in
//! `rm_lock_recursions`. Facts and file:line references: docs/gpusim.md,
//! "The resource manager's lock".

use crate::knobs::{RM_LOCK, RM_LOCK_RECURSIONS};
use kernel::prelude::*;
use kernel::sync::atomic::{Atomic, Relaxed};
use kernel::sync::global_lock;
use kernel::sync::lock::GlobalGuard;
use kernel::task::Task;

global_lock! {
    // SAFETY: Initialized in module init (`init()`), before any entry point
    // can be reached.
    pub(crate) unsafe(uninit) static GPUSIM_RM_API_LOCK: Mutex<()> = ();
}

/// The task holding `GPUSIM_RM_API_LOCK` (identity), 0 if none. Only the
/// holder stores its own identity and clears it before unlocking, so a
/// thread that reads its own identity here holds the lock.
static OWNER: Atomic<usize> = Atomic::new(0);

/// Initializes the lock and records whether it is used.
///
/// # Safety
///
/// Must be called exactly once, from module init, before anything else.
pub(crate) unsafe fn init(enabled: bool) {
    // SAFETY: Guaranteed by the caller.
    unsafe { GPUSIM_RM_API_LOCK.init() };
    RM_LOCK.store(u64::from(enabled), Relaxed);
}

/// Holds the RM lock (if `rm_lock=1`) until dropped.
pub(crate) struct RmGuard(Option<GlobalGuard<GPUSIM_RM_API_LOCK>>);

impl Drop for RmGuard {
    fn drop(&mut self) {
        if self.0.is_some() {
            OWNER.store(0, Relaxed);
        }
        // The guard field unlocks after this.
    }
}

/// Takes the RM lock for entry point `what`, if `rm_lock=1`. `EIO` if the
/// calling thread already holds it (a call from inside a free callback).
pub(crate) fn acquire(what: &str) -> Result<RmGuard> {
    if RM_LOCK.load(Relaxed) == 0 {
        return Ok(RmGuard(None));
    }
    let me = Task::current_raw() as usize;
    if OWNER.load(Relaxed) == me {
        RM_LOCK_RECURSIONS.add(1, Relaxed);
        pr_err!(
            "{what}() called from a free callback (this thread holds the RM lock): the 550 \
             driver refuses it with -EIO (and WARNs for put_pages); a client must not call \
             RM from its free callback\n"
        );
        return Err(EIO);
    }
    let g = GPUSIM_RM_API_LOCK.lock();
    OWNER.store(me, Relaxed);
    Ok(RmGuard(Some(g)))
}
