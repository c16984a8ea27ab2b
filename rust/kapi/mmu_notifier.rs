// SPDX-License-Identifier: GPL-2.0

//! Watches on an address range of a process (the kernel's
//! `mmu_interval_notifier`, one per watch, with its `ops` built here):
//! when the range is unmapped or moved, a work item tells the watch's
//! owner. Upstream counterpart: none yet (C's `mmu_interval_notifier`).

use super::raw;
use super::sync::{new_lock, Lock};
use super::work;
use core::marker::PhantomData;
use core::pin::Pin;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use kernel::alloc::{flags::GFP_KERNEL, KBox};
use kernel::bindings;
use kernel::error::{code, to_result, Result};
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};
use kernel::types::Opaque;

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

/// The work queue of the [`AddressWatch`]es of owners `T`; dropping it (at
/// unload, when every watch is stopped) runs the work items still queued.
/// One per module.
pub(crate) struct Watches<T: AddressChange>(PhantomData<T>);

impl<T: AddressChange> Watches<T> {
    /// Sets up the watches' work queue; `ENOMEM` if it cannot.
    pub(crate) fn setup() -> Result<Self> {
        work::setup_queue()?;
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
        // At unload, when every watch was stopped (the owner's duty, see
        // `AddressWatch::start`), so no work item can be queued anew.
        work::teardown_queue();
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
    range: *const bindings::mmu_notifier_range,
}

#[cfg(CONFIG_MMU_NOTIFIER)]
impl Invalidation {
    /// `range->event`, one of `bindings::mmu_notifier_event_MMU_NOTIFY_*`.
    fn event(&self) -> bindings::mmu_notifier_event {
        // SAFETY: `range` is the live range of the call (type invariant).
        unsafe { (*self.range).event }
    }

    /// Whether the address space still has users (`mm_users`): not when
    /// the process's address space is being torn down.
    fn mm_alive(&self) -> bool {
        // SAFETY: as in `event`.
        unsafe { raw::peermem_range_mm_alive(self.range.cast()) }
    }

    /// `mmu_notifier_range_blockable()`.
    fn blockable(&self) -> bool {
        // SAFETY: as in `event`.
        let flags = unsafe { (*self.range).flags };
        flags & bindings::MMU_NOTIFIER_RANGE_BLOCKABLE != 0
    }

    /// The native system call the current user thread is in, if the
    /// notifier runs in a user thread (not a kernel thread, not a 32-bit
    /// compat call; with `own_mm`, only in a thread of the address space
    /// being invalidated).
    fn syscall(&self, own_mm: bool) -> Option<super::c_long> {
        // SAFETY: FFI calls on the current task; `range` as in `event`.
        unsafe {
            if raw::peermem_current_kthread()
                || (own_mm && raw::peermem_current_mm() != (*self.range).mm)
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
        if event == bindings::mmu_notifier_event_MMU_NOTIFY_RELEASE || !self.mm_alive() {
            return Unmapping::Exiting;
        }
        match event {
            bindings::mmu_notifier_event_MMU_NOTIFY_UNMAP => self.unmap_how(),
            bindings::mmu_notifier_event_MMU_NOTIFY_PROTECTION_VMA
            | bindings::mmu_notifier_event_MMU_NOTIFY_PROTECTION_PAGE => Unmapping::Protected,
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
        if event == bindings::mmu_notifier_event_MMU_NOTIFY_SOFT_DIRTY {
            return true;
        }
        // SAFETY: a constant defined in the C glue.
        let ioctl = unsafe { raw::peermem_nr_ioctl };
        event == bindings::mmu_notifier_event_MMU_NOTIFY_PROTECTION_VMA
            && self.syscall(false) == Some(ioctl)
    }
}

/// The kernel's notifier of a watch and the watch's state, pinned in a box
/// the [`AddressWatch`] holds.
///
/// # Invariants
///
/// `work` was initialized to call `peermem_watch_work`, `changed` is
/// `changed::<T>` for the owner type `T`, and `revoked` was initialized as a
/// completion; `mni` is in the mm's interval tree, with `ops::<T>()`, iff
/// `inserted`; then `owner` points to a live `T` in an `Arc`.
#[cfg(CONFIG_MMU_NOTIFIER)]
#[pin_data]
struct Watch {
    /// Serializes start and stop (and the reads of `inserted` that must
    /// not race with them).
    #[pin]
    lock: Lock<()>,
    #[pin]
    mni: Opaque<bindings::mmu_interval_notifier>,
    #[pin]
    work: Opaque<bindings::work_struct>,
    /// Blocking watches: completed when `changed` returned.
    #[pin]
    revoked: Opaque<bindings::completion>,
    /// Borrowed: alive while `inserted` (see `AddressWatch::start`).
    owner: AtomicPtr<super::c_void>,
    /// The work item's reference, from `hold`.
    work_ref: AtomicPtr<super::c_void>,
    /// Calls the owner's `changed` with the work item's reference.
    changed: unsafe fn(*const super::c_void),
    /// The notifier is in the mm's interval tree.
    inserted: AtomicBool,
    /// The work item was queued (once per watch).
    fired: AtomicBool,
    /// The PFN-map source's kind: see `AddressWatch::set_blocking`.
    blocking: AtomicBool,
}

/// The `Watch` whose field at `offset` is at `field`.
#[cfg(CONFIG_MMU_NOTIFIER)]
fn watch_of<F>(field: *mut F, offset: usize) -> *const Watch {
    field.cast::<u8>().wrapping_sub(offset).cast::<Watch>()
}

/// The notifier's operations for watches of owners `T`.
#[cfg(CONFIG_MMU_NOTIFIER)]
fn ops<T: AddressChange>() -> &'static bindings::mmu_interval_notifier_ops {
    struct Ops<T>(PhantomData<T>);
    impl<T: AddressChange> Ops<T> {
        const OPS: bindings::mmu_interval_notifier_ops = {
            // SAFETY: a struct of optional function pointers: all `None`.
            let mut ops: bindings::mmu_interval_notifier_ops = unsafe { core::mem::zeroed() };
            ops.invalidate = Some(invalidate_tramp::<T>);
            ops
        };
    }
    &Ops::<T>::OPS
}

#[cfg(CONFIG_MMU_NOTIFIER)]
impl Watch {
    fn new<T: AddressChange>() -> impl PinInit<Self> {
        pin_init!(Self {
            lock <- new_lock!((), "peermem_watch"),
            mni: Opaque::new(bindings::mmu_interval_notifier::default()),
            // SAFETY: a new `work_struct`, pinned with the watch.
            work <- Opaque::ffi_init(|w| unsafe { work::init(w, Some(peermem_watch_work)) }),
            // SAFETY: a new completion, pinned with the watch.
            revoked <- Opaque::ffi_init(|c| unsafe { raw::peermem_init_completion(c) }),
            owner: AtomicPtr::new(ptr::null_mut()),
            work_ref: AtomicPtr::new(ptr::null_mut()),
            changed: changed::<T>,
            inserted: AtomicBool::new(false),
            fired: AtomicBool::new(false),
            blocking: AtomicBool::new(false),
        })
    }

    fn start<T: AddressChange>(&self, owner: *const T, start: u64, len: u64) -> Result {
        // SAFETY: FFI call without preconditions. (Not a read of
        // `task_struct::mm` through `kernel::bindings`: its layout of
        // `task_struct` is not the C compiler's on every configuration.)
        let mm = unsafe { raw::peermem_current_mm() };
        if mm.is_null() {
            return Err(code::EINVAL);
        }
        let _guard = self.lock.lock();
        if self.inserted.load(Ordering::Relaxed) {
            return Err(code::EBUSY);
        }
        self.owner.store(owner.cast_mut().cast(), Ordering::Release);
        // SAFETY: `mni` is pinned and not inserted (`inserted` is false
        // under the lock); `mm` is the current task's address space, alive
        // while it runs this; `ops::<T>()` is static.
        to_result(unsafe {
            bindings::mmu_interval_notifier_insert(
                self.mni.get(),
                mm,
                start as super::c_ulong,
                len as super::c_ulong,
                ops::<T>(),
            )
        })?;
        // INVARIANT: inserted with `ops::<T>()` and the live `owner`.
        self.inserted.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn stop(&self) {
        // Held across the removal: a concurrent stop returns after it too.
        let _guard = self.lock.lock();
        if self.inserted.swap(false, Ordering::Relaxed) {
            // SAFETY: inserted (just seen under the lock).
            unsafe { bindings::mmu_interval_notifier_remove(self.mni.get()) };
        }
    }

    fn set_blocking(&self) {
        let _guard = self.lock.lock();
        self.blocking.store(true, Ordering::Relaxed);
    }

    fn read_begin(&self) -> Option<super::c_ulong> {
        let _guard = self.lock.lock();
        if !self.inserted.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: inserted (seen under the lock, which `stop` takes).
        Some(unsafe { bindings::mmu_interval_read_begin(self.mni.get()) })
    }

    /// `mmu_interval_read_retry()`.
    fn read_retry(&self, seq: super::c_ulong) -> bool {
        // SAFETY: `mni` is initialized; the inline reads the field plainly.
        unsafe { (*self.mni.get()).invalidate_seq != seq }
    }

    /// `mmu_interval_set_seq()` (from the notifier call).
    fn set_seq(&self, cur_seq: super::c_ulong) {
        // SAFETY: `mni` is initialized; the inline's `WRITE_ONCE`.
        unsafe { ptr::addr_of_mut!((*self.mni.get()).invalidate_seq).write_volatile(cur_seq) };
    }

    fn has_fired(&self) -> bool {
        self.fired.load(Ordering::Relaxed)
    }

    /// A blocking watch's work item returned (`completion_done()`).
    fn revoke_done(&self) -> bool {
        // SAFETY: an initialized completion (type invariant).
        unsafe { bindings::completion_done(self.revoked.get()) }
    }

    /// Waits until a blocking watch's work item returned.
    fn wait_revoked(&self) {
        // SAFETY: an initialized completion (type invariant).
        unsafe { bindings::wait_for_completion(self.revoked.get()) };
    }

    /// Queues the work item that calls `changed` with `r`.
    ///
    /// # Safety
    ///
    /// Once per watch (`fired` was set by the caller); the watch stays
    /// alive until the work item ran (it holds a reference to the owner,
    /// which holds the watch).
    unsafe fn queue(&self, r: *const super::c_void) {
        self.work_ref.store(r.cast_mut(), Ordering::Release);
        // SAFETY: initialized (type invariant), queued once, alive until it
        // ran (the function's safety requirements); the queue exists while
        // a watch is started (`Watches`).
        unsafe { work::queue(self.work.get()) };
    }
}

/// Reports how the watch fired (revocation events, before the work item,
/// so before the core's invalidate) and queues the work item with a new
/// reference to the owner.
///
/// # Safety
///
/// `w` is a started watch whose owner is a live `T` in an `Arc`, and its
/// `fired` was set by this caller.
#[cfg(CONFIG_MMU_NOTIFIER)]
unsafe fn fire<T: AddressChange>(w: &Watch, how: Unmapping) {
    let owner = w.owner.load(Ordering::Acquire);
    // SAFETY: the owner of a started watch is a live `T` inside an `Arc`
    // (see `AddressWatch::start`), for the duration of this call.
    let borrowed = unsafe { ArcBorrow::<T>::from_raw(owner.cast::<T>()) };
    T::unmapping(&borrowed, how);
    // SAFETY: once (the function's safety requirements); the work item
    // consumes the reference, which keeps the owner and so the watch alive.
    unsafe { w.queue(hold(&borrowed)) };
}

/// The `invalidate` of `ops::<T>()`: finds the watch of `mni`.
///
/// # Safety
///
/// Called by the kernel for an inserted notifier of `ops::<T>()`, the
/// `mni` of a [`Watch`], with the `range` of the call.
#[cfg(CONFIG_MMU_NOTIFIER)]
unsafe extern "C" fn invalidate_tramp<T: AddressChange>(
    mni: *mut bindings::mmu_interval_notifier,
    range: *const bindings::mmu_notifier_range,
    cur_seq: super::c_ulong,
) -> bool {
    let w = watch_of(mni, core::mem::offset_of!(Watch, mni));
    // SAFETY: an inserted notifier is the `mni` of a live `Watch` (the
    // function's safety requirements; it is removed before it is freed).
    unsafe { invalidate::<T>(&*w, range, cur_seq) }
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
/// Called for the started watch `w`, with the kernel's `range` of the call.
#[cfg(CONFIG_MMU_NOTIFIER)]
unsafe fn invalidate<T: AddressChange>(
    w: &Watch,
    range: *const bindings::mmu_notifier_range,
    cur_seq: super::c_ulong,
) -> bool {
    // INVARIANT: the range of this call, used only during it.
    let inv = Invalidation { range };
    if w.blocking.load(Ordering::Relaxed) {
        // SAFETY: `w` is a started watch (the function's safety requirements).
        return unsafe { invalidate_blocking::<T>(w, &inv, cur_seq) };
    }
    w.set_seq(cur_seq);
    if inv.event() != bindings::mmu_notifier_event_MMU_NOTIFY_UNMAP
        || !inv.mm_alive()
        || w.fired.swap(true, Ordering::SeqCst)
    {
        return true;
    }
    // SAFETY: `w` is started (the function's safety requirements); `fired` set just above.
    unsafe { fire::<T>(w, inv.unmap_how()) };
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
    w: &Watch,
    inv: &Invalidation,
    cur_seq: super::c_ulong,
) -> bool {
    // Revoked already (the work item returned): nothing left to wait
    // for, so a call that may not block goes ahead.
    if w.has_fired() && w.revoke_done() {
        w.set_seq(cur_seq);
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
    w.set_seq(cur_seq);
    if !w.fired.swap(true, Ordering::SeqCst) {
        // SAFETY: `w` is started (the function's safety requirements);
        // `fired` set just above.
        unsafe { fire::<T>(w, inv.blocking_how()) };
    }
    // Also a concurrent second invalidation waits for the first one's work.
    w.wait_revoked();
    true
}

/// Calls `T::changed` with the reference `hold::<T>` took.
///
/// # Safety
///
/// `r` came from `hold::<T>` and is not used after this.
#[cfg(CONFIG_MMU_NOTIFIER)]
unsafe fn changed<T: AddressChange>(r: *const super::c_void) {
    // SAFETY: `r` came from `Arc::into_raw` in `hold::<T>`; it is ours now.
    T::changed(unsafe { Arc::from_raw(r.cast::<T>()) });
}

/// The work item: the watched range changed; calls the owner's `changed`
/// with the reference `hold` took, then (blocking watch) completes
/// `revoked`. Not generic, so it keeps one symbol name, which tracing
/// tests look for (`t_peermem_notifier_alloc`).
///
/// # Safety
///
/// Called by the kernel for the `work` of a [`Watch`], once, after
/// `Watch::queue`.
#[cfg(CONFIG_MMU_NOTIFIER)]
#[no_mangle]
unsafe extern "C" fn peermem_watch_work(work: *mut bindings::work_struct) {
    let w = watch_of(work, core::mem::offset_of!(Watch, work));
    // SAFETY: the watch is alive: the reference in `work_ref` keeps its
    // owner, which holds it, alive.
    let (blocking, r, changed) = unsafe {
        (
            (*w).blocking.load(Ordering::Relaxed),
            (*w).work_ref.load(Ordering::Acquire),
            (*w).changed,
        )
    };
    // SAFETY: `r` came from `hold` for the watch's owner type, whose
    // `changed` this is (`Watch::new`). This may free the watch (allowed
    // in a work function).
    unsafe { changed(r) };
    // A blocking watch's notifier call waits for this, so the watch is
    // still inserted and its owner alive.
    if blocking {
        // SAFETY: as just said; an initialized completion.
        unsafe { bindings::complete_all((*w).revoked.get()) };
    }
}

/// Without MMU notifiers there are no watches ([`AddressWatch::new`]
/// returns none): a type without values.
#[cfg(not(CONFIG_MMU_NOTIFIER))]
enum Watch {}

#[cfg(not(CONFIG_MMU_NOTIFIER))]
impl Watch {
    fn start<T: AddressChange>(&self, _: *const T, _: u64, _: u64) -> Result {
        match *self {}
    }
    fn stop(&self) {
        match *self {}
    }
    fn set_blocking(&self) {
        match *self {}
    }
    fn read_begin(&self) -> Option<super::c_ulong> {
        match *self {}
    }
    fn read_retry(&self, _: super::c_ulong) -> bool {
        match *self {}
    }
    fn has_fired(&self) -> bool {
        match *self {}
    }
}

/// A sequence number of a watch's range, from [`AddressWatch::read_begin`].
#[derive(Clone, Copy)]
pub(crate) struct ReadSeq(super::c_ulong);

/// A watch on a range in the address space of the process that made it,
/// for an owner `T` (usually the owner holds the watch as a field).
///
/// # Invariants
///
/// `watch` was initialized by `Watch::new::<T>`.
pub(crate) struct AddressWatch<T: AddressChange> {
    watch: Pin<KBox<Watch>>,
    _owner: PhantomData<fn(Arc<T>)>,
}

// SAFETY: the kernel's notifier and work item are used from any thread.
unsafe impl<T: AddressChange> Send for AddressWatch<T> {}
// SAFETY: start and stop of one watch are serialized by the watch's own
// mutex, so `start` and `stop` through `&self` may run concurrently (a
// `stop` that finds the watch not started returns at once; one that finds
// it started returns once the notifier is removed, also when another
// `stop` removes it); the rest is atomics.
unsafe impl<T: AddressChange> Sync for AddressWatch<T> {}

impl<T: AddressChange> AddressWatch<T> {
    /// A watch for the calling process, not started yet. `Ok(None)` if
    /// there is nothing to watch: the `mmu_notifier` parameter is off, the
    /// kernel has no MMU notifiers, or the caller has no user address space.
    pub(crate) fn new() -> Result<Option<Self>> {
        if !Watches::<T>::available() || super::mm::current_key() == 0 {
            return Ok(None);
        }
        #[cfg(CONFIG_MMU_NOTIFIER)]
        let watch = KBox::pin_init(Watch::new::<T>(), GFP_KERNEL)?;
        // Unreachable: `available()` is false.
        #[cfg(not(CONFIG_MMU_NOTIFIER))]
        let watch: Pin<KBox<Watch>> = return Ok(None);
        // INVARIANT: from `Watch::new::<T>`.
        Ok(Some(Self {
            watch,
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
        // `p` is the pointer `Arc::into_raw` would give for `owner`, valid
        // until `stop` (the caller's obligation).
        self.watch.start::<T>(p, start, len)
    }

    /// Makes this a blocking watch (for memory the owner holds no
    /// reference on: the PFN-map source). Call before [`AddressWatch::start`].
    /// A blocking watch fires on every invalidation of its range, also at
    /// process exit, and the kernel's invalidation waits until
    /// [`AddressChange::changed`] has returned (it still runs in the work
    /// item; see `invalidate_blocking`).
    pub(crate) fn set_blocking(&self) {
        self.watch.set_blocking();
    }

    /// `mmu_interval_read_begin`: the sequence to check with
    /// [`AddressWatch::read_retry`] after reading the range's page tables.
    /// `None` if the watch is not started.
    pub(crate) fn read_begin(&self) -> Option<ReadSeq> {
        self.watch.read_begin().map(ReadSeq)
    }

    /// `mmu_interval_read_retry`: whether the range was invalidated since
    /// `seq` was read (then what was read may be stale).
    pub(crate) fn read_retry(&self, seq: ReadSeq) -> bool {
        self.watch.read_retry(seq.0)
    }

    /// Whether the watch has fired (once per watch: the range was
    /// unmapped or moved, and [`AddressChange::changed`] is queued or ran).
    /// Set in the notifier, before the unmapping call returns to the process.
    pub(crate) fn has_fired(&self) -> bool {
        self.watch.has_fired()
    }

    /// Stops watching: when it returns, the notifier takes no new
    /// reference. Idempotent; sleeps.
    pub(crate) fn stop(&self) {
        self.watch.stop();
    }
}

impl<T: AddressChange> Drop for AddressWatch<T> {
    fn drop(&mut self) {
        // Its work item, if it was queued, has run: it holds a reference
        // to the owner, and an owner drops its watch only when its last
        // reference is gone. The box is freed after this.
        self.watch.stop();
    }
}
