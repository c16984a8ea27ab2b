// SPDX-License-Identifier: GPL-2.0

//! Watches on an address range of a process (an mmu interval notifier per
//! watch, in the C glue): when the range is unmapped or moved, a work item
//! tells the watch's owner. Upstream counterpart: none yet (C's
//! `mmu_interval_notifier`).

use super::raw;
use core::marker::PhantomData;
use core::ptr::NonNull;
use kernel::error::{code::ENOMEM, to_result, Result};
use kernel::sync::{Arc, ArcBorrow};

/// What a watch's owner does when its range changes meaning.
pub(crate) trait AddressChange: Send + Sync + Sized + 'static {
    /// The watched range was unmapped or moved (from a work item, process
    /// context, no lock held); `this` is the work item's reference.
    fn changed(this: Arc<Self>);

    /// The watched range is being unmapped (`how`), from the notifier
    /// itself, before the work item that calls [`AddressChange::changed`]
    /// is queued: possibly in a context that must not sleep, so this must
    /// neither sleep nor allocate. Once per watch. Default: nothing.
    fn unmapping(_this: &Self, _how: Unmapping) {}
}

/// How a watched range stopped meaning what it meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unmapping {
    /// `munmap`, `mmap(MAP_FIXED)` over it, any other unmap.
    Unmapped,
    /// The unmapping thread is in `mremap` (the range moved).
    Moved,
    /// The address space is being torn down (blocking watches only).
    Exiting,
    /// `mprotect` changed the range's protection (blocking watches only).
    Protected,
    /// Any other invalidation: the driver that mapped the range zapped it
    /// (`unmap_mapping_range`; blocking watches only).
    Zapped,
}

/// The work queue and callbacks of the [`AddressWatch`]es of owners `T`;
/// dropping it (at unload, when every watch is stopped) runs the work
/// items still queued. One per module.
///
/// # Invariants
///
/// The C glue's callbacks are the trampolines for `T`.
pub(crate) struct Watches<T: AddressChange>(PhantomData<T>);

impl<T: AddressChange> Watches<T> {
    /// Sets up the watches' work queue; `ENOMEM` if it cannot.
    pub(crate) fn setup() -> Result<Self> {
        #[cfg(CONFIG_MMU_NOTIFIER)]
        let invalidate: raw::peermem_watch_invalidate_t = Some(invalidate::<T>);
        #[cfg(not(CONFIG_MMU_NOTIFIER))]
        let invalidate: raw::peermem_watch_invalidate_t = None;
        // SAFETY: both functions stay valid until `drop`, which runs the
        // queued work items before the module can go; set before any watch
        // starts (none can exist before `setup`, which the owner calls first).
        to_result(unsafe { raw::peermem_watch_setup(Some(changed::<T>), invalidate) })?;
        // INVARIANT: set up with `T`'s trampolines.
        Ok(Self(PhantomData))
    }

    /// Whether owners get watches (the `mmu_notifier` parameter is on and
    /// the kernel has MMU notifiers).
    pub(crate) fn available() -> bool {
        cfg!(CONFIG_MMU_NOTIFIER) && super::module_param::mmu_notifier()
    }
}

impl<T: AddressChange> Drop for Watches<T> {
    fn drop(&mut self) {
        // SAFETY: called once, at unload, when every watch was stopped (the
        // owner's duty, see `AddressWatch::start`), so no work item can be
        // queued anew.
        unsafe { raw::peermem_watch_teardown() };
    }
}

/// A new reference to `owner`, for the work item.
fn hold<T: AddressChange>(owner: &ArcBorrow<'_, T>) -> *const super::c_void {
    Arc::into_raw(Arc::from(*owner)).cast()
}

/// An invalidation of a watched range, as the notifier is called with it.
///
/// # Invariants
///
/// `range` points to the kernel's `struct mmu_notifier_range` of the
/// notifier call in progress, and `Self` lives no longer than the call.
#[cfg(CONFIG_MMU_NOTIFIER)]
struct Invalidation {
    range: *const super::c_void,
}

#[cfg(CONFIG_MMU_NOTIFIER)]
impl Invalidation {
    /// `range->event`, one of `raw::peermem_mmu_event_PEERMEM_MMU_*` (or
    /// another event).
    fn event(&self) -> super::c_uint {
        // SAFETY: `range` is the live range of the call (type invariant).
        unsafe { raw::peermem_range_event(self.range) }
    }

    /// Whether the address space still has users (`mm_users`): not when
    /// the process's address space is being torn down.
    fn mm_alive(&self) -> bool {
        // SAFETY: as in `event`.
        unsafe { raw::peermem_range_mm_alive(self.range) }
    }

    /// `mmu_notifier_range_blockable()`.
    fn blockable(&self) -> bool {
        // SAFETY: as in `event`.
        unsafe { raw::peermem_range_blockable(self.range) }
    }

    /// The native system call the current user thread is in, if the
    /// notifier runs in a user thread (not a kernel thread, not a 32-bit
    /// compat call; with `own_mm`, only in a thread of the address space
    /// being invalidated).
    fn syscall(&self, own_mm: bool) -> Option<super::c_long> {
        // SAFETY: FFI calls on the current task; `range` as in `event`.
        unsafe {
            if raw::peermem_current_kthread()
                || (own_mm && !raw::peermem_range_mm_is_current(self.range))
                || raw::peermem_current_compat()
            {
                return None;
            }
            Some(raw::peermem_current_syscall_nr())
        }
    }

    /// What an unmap is: mremap unmaps the old range with the same event
    /// as munmap and mmap(MAP_FIXED), so tell them apart by the system
    /// call of the thread doing it (the notifier runs in that thread).
    /// Anything else is an unmap.
    fn unmap_how(&self) -> Unmapping {
        // SAFETY: a constant defined in the C glue.
        let mremap = unsafe { raw::peermem_nr_mremap };
        match self.syscall(true) {
            Some(nr) if nr == mremap => Unmapping::Moved,
            _ => Unmapping::Unmapped,
        }
    }

    /// What a blocking watch's invalidation is.
    fn blocking_how(&self) -> Unmapping {
        let event = self.event();
        // exit_mmap(): MMU_NOTIFY_RELEASE to interval notifiers, then unmaps.
        if event == raw::peermem_mmu_event_PEERMEM_MMU_RELEASE || !self.mm_alive() {
            return Unmapping::Exiting;
        }
        match event {
            raw::peermem_mmu_event_PEERMEM_MMU_UNMAP => self.unmap_how(),
            raw::peermem_mmu_event_PEERMEM_MMU_PROTECTION_VMA
            | raw::peermem_mmu_event_PEERMEM_MMU_PROTECTION_PAGE => Unmapping::Protected,
            // MMU_NOTIFY_CLEAR: page-table entries cleared; of a VM_PFNMAP
            // mapping that is not copy-on-write only by its driver,
            // unmap_mapping_range() or zap_vma_ptes() (madvise(MADV_DONTNEED)
            // refuses VM_PFNMAP).
            //
            // Anything else (MMU_NOTIFY_MIGRATE, _EXCLUSIVE): migrate_vma_setup()
            // refuses VM_SPECIAL mappings and make_device_exclusive() finds
            // pages with get_user_pages(), which refuses VM_PFNMAP, so neither
            // reaches a range a blocking watch covers; were one to (or an
            // event a later kernel adds), the PFNs are no longer known good:
            // it revokes like the driver's zap, and is reported so
            // (docs/module.md, "Revocation events").
            _ => Unmapping::Zapped,
        }
    }

    /// Invalidations that change nothing a blocking watch's range maps (the
    /// watch covers only VM_PFNMAP mappings until it fires):
    ///  - the soft-dirty reset of /proc/pid/clear_refs invalidates the whole
    ///    address space (MMU_NOTIFY_SOFT_DIRTY, "still same page and same
    ///    access flags") and then skips VM_PFNMAP mappings
    ///    (clear_refs_test_walk), whose entries it never touches;
    ///  - PAGEMAP_SCAN's write-protect request (PM_SCAN_WP_MATCHING, an
    ///    ioctl() of /proc/pid/pagemap) invalidates the whole range it was
    ///    asked for with MMU_NOTIFY_PROTECTION_VMA and then skips every
    ///    mapping without userfaultfd write-protection, VM_PFNMAP ones among
    ///    them (pagemap_scan_test_walk). No ioctl() changes the protection
    ///    of a VM_PFNMAP mapping (also not another process's, through its
    ///    pagemap): userfaultfd's write-protect works per mapping and never
    ///    on VM_PFNMAP ones; mprotect() is a system call of its own. A 32-bit
    ///    compat task's ioctl() is not told apart: it revokes.
    fn blocking_ignores(&self) -> bool {
        let event = self.event();
        if event == raw::peermem_mmu_event_PEERMEM_MMU_SOFT_DIRTY {
            return true;
        }
        // SAFETY: a constant defined in the C glue.
        let ioctl = unsafe { raw::peermem_nr_ioctl };
        event == raw::peermem_mmu_event_PEERMEM_MMU_PROTECTION_VMA
            && self.syscall(false) == Some(ioctl)
    }
}

/// Reports how the watch fired (revocation events, before the work item,
/// so before the core's invalidate) and queues the work item with a new
/// reference to the owner.
///
/// # Safety
///
/// `w` is a started watch whose owner is a live `T` in an `Arc`.
#[cfg(CONFIG_MMU_NOTIFIER)]
unsafe fn fire<T: AddressChange>(w: *mut raw::peermem_watch, how: Unmapping) {
    // SAFETY: `w` is live (the function's safety requirements).
    let owner = unsafe { raw::peermem_watch_owner(w) };
    // SAFETY: the owner of a started watch is a live `T` inside an `Arc`
    // (see `AddressWatch::start`), for the duration of this call.
    let borrowed = unsafe { ArcBorrow::<T>::from_raw(owner.cast::<T>()) };
    T::unmapping(&borrowed, how);
    // SAFETY: `w` is live; the work item consumes the reference.
    unsafe { raw::peermem_watch_queue(w, hold(&borrowed)) };
}

/// The interval notifier's `invalidate`: called with the mm's invalidation
/// in progress, possibly not allowed to sleep. A watch queues its work
/// item and returns: only an unmap (munmap, the old range of mremap,
/// MAP_FIXED over it) changes what the addresses mean; a protection change,
/// soft-dirty tracking or a driver zapping its PTEs does not, and an
/// exiting process's teardown is followed by the close of its files, which
/// deregisters. A blocking watch: see [`invalidate_blocking`].
///
/// # Safety
///
/// Called by the C glue's notifier for the started watch `w`, with the
/// kernel's `range` of the call.
#[cfg(CONFIG_MMU_NOTIFIER)]
unsafe extern "C" fn invalidate<T: AddressChange>(
    w: *mut raw::peermem_watch,
    range: *const super::c_void,
    cur_seq: super::c_ulong,
) -> bool {
    // INVARIANT: the range of this call, used only during it.
    let inv = Invalidation { range };
    // SAFETY: `w` is a started watch (the function's safety requirements).
    unsafe {
        if raw::peermem_watch_is_blocking(w) {
            return invalidate_blocking::<T>(w, &inv, cur_seq);
        }
        raw::peermem_watch_set_seq(w, cur_seq);
        if inv.event() != raw::peermem_mmu_event_PEERMEM_MMU_UNMAP
            || !inv.mm_alive()
            || raw::peermem_watch_test_and_set_fired(w)
        {
            return true;
        }
        fire::<T>(w, inv.unmap_how());
    }
    true
}

/// A blocking watch (the PFN-map source) fires on every invalidation of its
/// range (unmap, the exporting driver's unmap_mapping_range, mprotect,
/// process exit; not what [`Invalidation::blocking_ignores`]), and the
/// notifier call returns only once `changed` has returned: the registration
/// is revoked through the core before the kernel goes on to change what the
/// range maps. Memory the PFN-map source serves holds no reference, so the
/// revocation must be done by then (docs/module.md, "PFN-mapped memory").
///
/// `changed` runs in the work item, not in this call: the core's invalidate
/// takes the umem's mapping lock, which the core holds across allocations,
/// and mmu notifier calls are (for lockdep) nested in reclaim. That order
/// cannot deadlock here: only VM_PFNMAP ranges that are not copy-on-write
/// get a blocking watch's first invalidation with a ticket (the PFN source
/// checks that under the mmap lock), reclaim never unmaps such a range, and
/// the later calls return at once. The wait is a completion, which lockdep
/// does not follow. A call that may not block (the OOM reaper; it skips
/// VM_PFNMAP, but not the anonymous memory a process mapped over a revoked
/// range) returns false, as the interval-notifier API requires, while the
/// revocation is to come or under way; once it is done, every call returns
/// true at once, blockable or not (else the reaper could never reap what
/// the process mapped there since).
///
/// # Safety
///
/// As for [`invalidate`].
#[cfg(CONFIG_MMU_NOTIFIER)]
unsafe fn invalidate_blocking<T: AddressChange>(
    w: *mut raw::peermem_watch,
    inv: &Invalidation,
    cur_seq: super::c_ulong,
) -> bool {
    // SAFETY: `w` is a started watch (the function's safety requirements).
    unsafe {
        // Revoked already (the work item returned): nothing left to wait
        // for, so a call that may not block goes ahead.
        if raw::peermem_watch_has_fired(w) && raw::peermem_watch_revoke_done(w) {
            raw::peermem_watch_set_seq(w, cur_seq);
            return true;
        }
        // Not a change of the range: no revocation, and the sequence stays
        // (what a registration reads meanwhile is still good).
        if inv.blocking_ignores() {
            return true;
        }
        if !inv.blockable() {
            return false;
        }
        raw::peermem_watch_set_seq(w, cur_seq);
        if !raw::peermem_watch_test_and_set_fired(w) {
            fire::<T>(w, inv.blocking_how());
        }
        // Also a concurrent second invalidation waits for the first one's work.
        raw::peermem_watch_wait_revoked(w);
    }
    true
}

/// The work item: the watched range changed; `r` is the reference `hold` took.
///
/// # Safety
///
/// Called by the C glue once per `hold`, with what it returned.
unsafe extern "C" fn changed<T: AddressChange>(r: *const super::c_void) {
    // SAFETY: `r` came from `Arc::into_raw` in `hold::<T>`; it is ours now.
    T::changed(unsafe { Arc::from_raw(r.cast::<T>()) });
}

/// A sequence number of a watch's range, from [`AddressWatch::read_begin`].
#[derive(Clone, Copy)]
pub(crate) struct ReadSeq(super::c_ulong);

/// A watch on a range in the address space of the process that made it,
/// for an owner `T` (usually the owner holds the watch as a field).
///
/// # Invariants
///
/// `ptr` was returned by `peermem_watch_alloc` and is freed only by `drop`.
pub(crate) struct AddressWatch<T: AddressChange> {
    ptr: NonNull<raw::peermem_watch>,
    _owner: PhantomData<fn(Arc<T>)>,
}

// SAFETY: the C object is used from any thread.
unsafe impl<T: AddressChange> Send for AddressWatch<T> {}
// SAFETY: the C side serializes `peermem_watch_start` and
// `peermem_watch_stop` of one watch with the watch's own mutex, so `start`
// and `stop` through `&self` may run concurrently (a `stop` that finds the
// watch not started returns at once; one that finds it started returns
// once the notifier is removed, also when another `stop` removes it).
unsafe impl<T: AddressChange> Sync for AddressWatch<T> {}

impl<T: AddressChange> AddressWatch<T> {
    /// A watch for the calling process, not started yet. `Ok(None)` if
    /// there is nothing to watch: the `mmu_notifier` parameter is off, the
    /// kernel has no MMU notifiers, or the caller has no user address space.
    pub(crate) fn new() -> Result<Option<Self>> {
        if !Watches::<T>::available() || super::mm::current_key() == 0 {
            return Ok(None);
        }
        // SAFETY: FFI call without preconditions.
        let p = unsafe { raw::peermem_watch_alloc() };
        let ptr = NonNull::new(p).ok_or(ENOMEM)?;
        // INVARIANT: from `peermem_watch_alloc`.
        Ok(Some(Self {
            ptr,
            _owner: PhantomData,
        }))
    }

    /// Watches `[start, start + len)` of the calling process for `owner`:
    /// until [`AddressWatch::stop`] returns, the notifier may take new
    /// references to `owner` from the pointer it keeps. `EBUSY` if the
    /// watch is started already.
    ///
    /// # Safety
    ///
    /// `owner` stays alive until [`AddressWatch::stop`] has returned: the
    /// caller calls `stop` before the last reference to `owner` can go (for
    /// a watch that is a field of `owner`, before the reference it gives up
    /// last). And the watch lives as long as a work item it queued, which
    /// holds a reference to `owner`: it is a field of `owner` (or `owner`
    /// keeps it alive otherwise).
    pub(crate) unsafe fn start(&self, owner: ArcBorrow<'_, T>, start: u64, len: u64) -> Result {
        let p: *const T = &*owner;
        // SAFETY: `self.ptr` is a live watch (type invariant); `p` is the
        // pointer `Arc::into_raw` would give for `owner`, valid until `stop`
        // (the caller's obligation).
        to_result(unsafe { raw::peermem_watch_start(self.ptr.as_ptr(), p.cast(), start, len) })
    }

    /// Makes this a blocking watch (for memory the owner holds no
    /// reference on: the PFN-map source). Call before [`AddressWatch::start`].
    /// A blocking watch fires on every invalidation of its range, also at
    /// process exit, and the kernel's invalidation waits until
    /// [`AddressChange::changed`] has returned (it still runs in the work
    /// item; see `invalidate_blocking`).
    pub(crate) fn set_blocking(&self) {
        // SAFETY: a live watch (type invariant).
        unsafe { raw::peermem_watch_set_blocking(self.ptr.as_ptr()) };
    }

    /// `mmu_interval_read_begin`: the sequence to check with
    /// [`AddressWatch::read_retry`] after reading the range's page tables.
    /// `None` if the watch is not started.
    pub(crate) fn read_begin(&self) -> Option<ReadSeq> {
        let mut seq = 0;
        // SAFETY: a live watch (type invariant); `seq` is writable.
        unsafe { raw::peermem_watch_read_begin(self.ptr.as_ptr(), &mut seq) }
            .then_some(ReadSeq(seq))
    }

    /// `mmu_interval_read_retry`: whether the range was invalidated since
    /// `seq` was read (then what was read may be stale).
    pub(crate) fn read_retry(&self, seq: ReadSeq) -> bool {
        // SAFETY: a live watch (type invariant), started since `seq` came
        // from `read_begin` (the C side only compares sequence numbers).
        unsafe { raw::peermem_watch_read_retry(self.ptr.as_ptr(), seq.0) }
    }

    /// Whether the watch has fired (once per watch: the range was
    /// unmapped or moved, and [`AddressChange::changed`] is queued or ran).
    /// Set in the notifier, before the unmapping call returns to the process.
    pub(crate) fn has_fired(&self) -> bool {
        // SAFETY: a live watch (type invariant).
        unsafe { raw::peermem_watch_has_fired(self.ptr.as_ptr()) }
    }

    /// Stops watching: when it returns, the notifier takes no new
    /// reference. Idempotent; sleeps.
    pub(crate) fn stop(&self) {
        // SAFETY: a live watch (type invariant).
        unsafe { raw::peermem_watch_stop(self.ptr.as_ptr()) };
    }
}

impl<T: AddressChange> Drop for AddressWatch<T> {
    fn drop(&mut self) {
        // SAFETY: a live watch, not used after this. Its work item, if it
        // was queued, has run: it holds a reference to the owner, and an
        // owner drops its watch only when its last reference is gone.
        unsafe { raw::peermem_watch_free(self.ptr.as_ptr()) };
    }
}
