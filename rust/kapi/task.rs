// SPDX-License-Identifier: GPL-2.0

//! Which process the caller runs in, as NVIDIA's driver tells processes
//! apart. Upstream counterpart: `kernel::task::Task::current()` and its
//! `group_leader().pid()` (whose shape differs between the supported
//! kernels); the C glue reads `current->tgid`.

use super::raw;

/// A process, as the thread group id of its threads (`current->tgid`, the
/// global pid of the process). NVIDIA's driver identifies "the calling
/// process" this way (`os_get_current_process`, kernel-open/nvidia/
/// os-interface.c): a kernel thread (a kworker) is a process of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadGroup(i32);

impl ThreadGroup {
    /// The caller's process.
    pub(crate) fn current() -> Self {
        // SAFETY: FFI call without preconditions.
        Self(unsafe { raw::peermem_current_tgid() })
    }

    /// Whether the caller runs in this process.
    pub(crate) fn is_current(self) -> bool {
        self == Self::current()
    }

    /// The process id, for messages.
    pub(crate) fn pid(self) -> i32 {
        self.0
    }
}
