// SPDX-License-Identifier: GPL-2.0

//! The user-space interface of `/dev/peermem`, from
//! `include/uapi/peermem.h` (through bindgen, so the numbers cannot drift
//! from the header): the version, the event causes, and the byte layout of
//! a record and of the generation page, which `crate::client::events`
//! writes field by field. Upstream counterpart: none (`uapi` crate items).

use super::raw;
use core::mem::{offset_of, size_of};

/// `PEERMEM_EVENTS_VERSION`.
pub(crate) const VERSION: u32 = raw::PEERMEM_EVENTS_VERSION;

/// `sizeof(struct peermem_event)`.
pub(crate) const EVENT_SIZE: usize = size_of::<raw::peermem_event>();
/// `PEERMEM_CLIENT_NAME_LEN`.
pub(crate) const CLIENT_NAME_LEN: usize = raw::PEERMEM_CLIENT_NAME_LEN as usize;

/// Offsets of `struct peermem_event`'s fields.
pub(crate) mod event {
    use super::*;
    pub(crate) const GENERATION: usize = offset_of!(raw::peermem_event, generation);
    pub(crate) const START: usize = offset_of!(raw::peermem_event, start);
    pub(crate) const LENGTH: usize = offset_of!(raw::peermem_event, length);
    pub(crate) const CAUSE: usize = offset_of!(raw::peermem_event, cause);
    pub(crate) const FLAGS: usize = offset_of!(raw::peermem_event, flags);
    pub(crate) const CLIENT: usize = offset_of!(raw::peermem_event, client);
}

/// Offsets of `struct peermem_gen_page`'s fields.
pub(crate) mod gen_page {
    use super::*;
    pub(crate) const GENERATION: usize = offset_of!(raw::peermem_gen_page, generation);
    pub(crate) const VERSION: usize = offset_of!(raw::peermem_gen_page, version);
    pub(crate) const EVENT_SIZE: usize = offset_of!(raw::peermem_gen_page, event_size);
    pub(crate) const QUEUE_LEN: usize = offset_of!(raw::peermem_gen_page, queue_len);
}

/// `enum peermem_cause`.
pub(crate) mod cause {
    use super::raw;
    pub(crate) const GPU_FREE: u32 = raw::peermem_cause_PEERMEM_CAUSE_GPU_FREE;
    pub(crate) const UNMAP: u32 = raw::peermem_cause_PEERMEM_CAUSE_UNMAP;
    pub(crate) const MOVE: u32 = raw::peermem_cause_PEERMEM_CAUSE_MOVE;
    pub(crate) const EXIT: u32 = raw::peermem_cause_PEERMEM_CAUSE_EXIT;
    pub(crate) const DRIVER: u32 = raw::peermem_cause_PEERMEM_CAUSE_DRIVER;
    pub(crate) const PROTECT: u32 = raw::peermem_cause_PEERMEM_CAUSE_PROTECT;
    pub(crate) const OVERFLOW: u32 = raw::peermem_cause_PEERMEM_CAUSE_OVERFLOW;
}

/// The device's name (`/dev/peermem`).
pub(crate) const DEVICE_NAME: &core::ffi::CStr = c"peermem";

/// The event channel's module parameters (`module_param_named` in `rust/miscdev.c`).
pub(crate) mod params {
    use super::raw;

    /// `events`: create the device.
    pub(crate) fn events() -> bool {
        // SAFETY: the module loader sets it before init; nothing writes
        // it after (mode 0444).
        unsafe { raw::peermem_param_events }
    }

    /// `event_queue_len`, unchecked.
    pub(crate) fn event_queue_len() -> u32 {
        // SAFETY: the module loader sets it before init; nothing writes
        // it after (mode 0444).
        unsafe { raw::peermem_param_event_queue_len }
    }

    /// `event_files_per_user`, unchecked.
    pub(crate) fn event_files_per_user() -> u32 {
        // SAFETY: the module loader sets it before init; nothing writes
        // it after (mode 0444).
        unsafe { raw::peermem_param_event_files_per_user }
    }
}
