// SPDX-License-Identifier: GPL-2.0

//! The only module that touches raw bindings.
//!
//! `ffi_generated.rs` is written by `scripts/bindgen.sh` during the build
//! from `include/peermem_ffi.h` (our ABI headers and the prototypes of the
//! C glue in `rust/helpers.c`). This module wraps what the rest of the
//! crate needs in safe functions and types; nothing else declares `extern`
//! functions or calls into C directly.
//!
//! Three interfaces meet here:
//!
//! - the peer-memory core (`ib_register_peer_memory_client`): the client
//!   structure, its callbacks (`extern "C"` trampolines that turn the
//!   core's raw arguments into [`Registration`] references and call
//!   `crate::client`), the core's invalidate function;
//! - the NVIDIA P2P interface (`nvidia_p2p_*`): [`PageTable`],
//!   [`DmaMapping`], and the free callback;
//! - kernel helpers from `helpers.c`: [`SgTable`], [`DmaDevice`], messages,
//!   the count of live registration objects.
//!
//! peermem registers two clients with the core (like nvidia-peermem):
//! [`Kind::Invalidating`] (`nv_mem`) and [`Kind::Persistent`]
//! (`nv_mem_nc`). Each has its own client structure, handle and `acquire`
//! trampoline; the other callbacks get the registration, which knows its kind.

use crate::client::{self, Kind, Registration};
use crate::stats::{Counter, Stats};
use core::cell::UnsafeCell;
use core::ffi::CStr;
// The C types of the generated bindings: the kernel's `ffi` crate from 6.13
// on (c_char is u8, c_ulong usize), `core::ffi` before.
#[cfg(not(peermem_ffi_crate))]
use core::ffi::{c_char, c_int, c_ulong, c_void};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use kernel::error::{code, to_result, Error, Result};
#[cfg(peermem_ffi_crate)]
use kernel::ffi::{c_char, c_int, c_ulong, c_void};
use kernel::sync::Arc;
use kernel::{pr_err, pr_warn};

#[allow(
    clippy::all,
    dead_code,
    improper_ctypes,
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    unreachable_pub,
    unsafe_op_in_unsafe_fn
)]
#[allow(
    clippy::undocumented_unsafe_blocks,
    clippy::ptr_as_ptr,
    clippy::ref_as_ptr
)]
mod raw {
    include!("ffi_generated.rs");
}

/// Bytes in the ABI's client name array, NUL included.
pub(crate) const PEER_NAME_CAPACITY: usize = raw::IB_PEER_MEMORY_NAME_MAX as usize;

/// peermem's version (`PEERMEM_VERSION` in `include/peermem_ffi.h`).
pub(crate) const VERSION: &str = {
    let Ok(v) = CStr::from_bytes_with_nul(raw::PEERMEM_VERSION) else {
        panic!("PEERMEM_VERSION is a C string");
    };
    let Ok(v) = core::str::from_utf8(v.to_bytes()) else {
        panic!("PEERMEM_VERSION is ASCII");
    };
    v
};

// The version doubles as the peer-memory client's version string, which
// leaves its last two bytes to the NUL and the extended-client marker.
const _: () = assert!(VERSION.len() <= raw::IB_PEER_MEMORY_VER_MAX as usize - 2);

/// `EOVERFLOW`, which the kernel crate of 6.12 does not name.
pub(crate) fn eoverflow() -> Error {
    Error::from_errno(-(kernel::bindings::EOVERFLOW as i32))
}

/// The errno of a C return value (`0` or `-errno`).
fn result_of(ret: c_int) -> Result {
    to_result(ret)
}

/// The `peer_name` module parameter, unchecked (see `params`).
pub(crate) fn param_peer_name() -> &'static [u8] {
    // SAFETY: FFI call without preconditions.
    let name = unsafe { raw::peermem_param_peer_name() };
    // SAFETY: per `peermem_ffi.h` `name` points to a buffer of
    // `IB_PEER_MEMORY_NAME_MAX` bytes that the module loader filled before
    // init and that nothing changes until the module unloads, which ends
    // every use of this reference.
    let buf = unsafe { core::slice::from_raw_parts(name.cast::<u8>(), PEER_NAME_CAPACITY) };
    // The loader always leaves a NUL in it; without one, take the whole buffer
    // (the check in `params` then refuses it as too long).
    let len = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    &buf[..len]
}

/// The `enable_invalidate` module parameter.
pub(crate) fn param_enable_invalidate() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_enable_invalidate() }
}

/// The `enable_nc` module parameter.
pub(crate) fn param_enable_nc() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_enable_nc() }
}

/// The `mmu_notifier` module parameter.
pub(crate) fn param_mmu_notifier() -> bool {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_param_mmu_notifier() }
}

/// Whether the debugfs directory exists (there is only one).
static DEBUGFS_LIVE: AtomicBool = AtomicBool::new(false);

/// `/sys/kernel/debug/peermem/`: one read-only file per counter of the
/// invalidating client and the test knobs, and `nc/` with the counters of
/// the non-invalidating client; removed on drop.
///
/// # Invariants
///
/// While a `Debugfs` exists, the C glue's directory exists and
/// `DEBUGFS_LIVE` is true; there is at most one `Debugfs`.
pub(crate) struct Debugfs(());

impl Debugfs {
    /// Creates the directory with a file for each of the counters in
    /// `stats` (the invalidating client's) and the subdirectory `nc/` for
    /// those in `stats_nc`.
    ///
    /// `EBUSY` if it exists already; the C glue's error (e.g. `ENODEV`
    /// without debugfs) if it cannot be created.
    pub(crate) fn create(stats: &'static Stats, stats_nc: &'static Stats) -> Result<Self> {
        if DEBUGFS_LIVE.swap(true, Ordering::AcqRel) {
            return Err(code::EBUSY);
        }
        // SAFETY: `DEBUGFS_LIVE` was false, so no directory exists: this is
        // the single create call `peermem_ffi.h` asks for. `read_counter`
        // is code of this module, valid until the directory is removed.
        let ret = unsafe { raw::peermem_debugfs_create(Some(read_counter)) };
        if let Err(e) = to_result(ret) {
            DEBUGFS_LIVE.store(false, Ordering::Release);
            return Err(e);
        }
        // SAFETY: the directory exists; the name is a static C string.
        let nc_dir =
            unsafe { raw::peermem_debugfs_subdir(c"nc".to_bytes_with_nul().as_ptr().cast()) };
        // Without its subdirectory (out of memory) the nc client has no files.
        let dirs = [
            (ptr::null_mut(), Some(stats)),
            (nc_dir, (!nc_dir.is_null()).then_some(stats_nc)),
        ];
        for (dir, stats) in dirs {
            let Some(stats) = stats else { continue };
            stats.for_each(|name, counter| {
                // SAFETY: `dir` is null (the top directory) or a directory
                // the glue made under it, removed with it; `name` is a
                // `'static` C string and `counter` a `&'static Counter`,
                // the type `read_counter` expects: both outlive the
                // directory.
                unsafe {
                    raw::peermem_debugfs_add_counter(
                        dir,
                        name.to_bytes_with_nul().as_ptr().cast(),
                        ptr::from_ref::<Counter>(counter).cast::<c_void>(),
                    )
                };
            });
        }
        crate::inject::for_each(|name, knob| {
            // SAFETY: `name` is a `'static` C string and `knob` a `'static`
            // `u32` (the knob's atomic), both outliving the directory.
            unsafe {
                raw::peermem_debugfs_add_knob(
                    name.to_bytes_with_nul().as_ptr().cast(),
                    knob.as_ptr(),
                )
            };
        });
        // INVARIANT: the directory was created and `DEBUGFS_LIVE` is true.
        Ok(Self(()))
    }
}

impl Drop for Debugfs {
    fn drop(&mut self) {
        // SAFETY: the directory exists (type invariant); after this call no
        // counter read runs or can start.
        unsafe { raw::peermem_debugfs_remove() };
        DEBUGFS_LIVE.store(false, Ordering::Release);
    }
}

/// Called by the C glue when a counter file is read.
///
/// # Safety
///
/// `counter` must be a pointer passed to `peermem_debugfs_add_counter` by
/// `Debugfs::create`, i.e. to a `'static` `Counter`.
unsafe extern "C" fn read_counter(counter: *const c_void) -> u64 {
    // SAFETY: by the function's safety requirements.
    unsafe { &*counter.cast::<Counter>() }.get()
}

// ---------------------------------------------------------------------------
// Messages and sleeping

/// Sleeps `ms` milliseconds (`msleep`).
pub(crate) fn msleep(ms: u32) {
    // SAFETY: FFI call without preconditions; callers are in process context.
    unsafe { raw::peermem_msleep(ms) };
}

/// `pr_warn_ratelimited()` of `msg` (for messages a user can trigger in a loop).
pub(crate) fn warn_ratelimited(msg: &CStr) {
    // SAFETY: `msg` is a NUL-terminated string valid for the call.
    unsafe { raw::peermem_warn_ratelimited(msg.to_bytes_with_nul().as_ptr().cast()) };
}

// ---------------------------------------------------------------------------
// Live registration objects

/// Membership in the count of live registration objects, which module
/// unload waits to drop to zero (see [`wait_for_objects`]).
///
/// # Invariants
///
/// Each `ObjectCount` has added one to the C glue's count, which its drop removes.
pub(crate) struct ObjectCount(());

impl ObjectCount {
    /// Counts one more live object.
    pub(crate) fn new() -> Self {
        // SAFETY: FFI call without preconditions.
        unsafe { raw::peermem_objects_inc() };
        // INVARIANT: counted just above.
        Self(())
    }
}

impl Drop for ObjectCount {
    fn drop(&mut self) {
        // SAFETY: this object was counted (type invariant).
        unsafe { raw::peermem_objects_dec() };
    }
}

/// Sleeps until no [`ObjectCount`] exists.
pub(crate) fn wait_for_objects() {
    // SAFETY: FFI call without preconditions; it may sleep (module exit does).
    unsafe { raw::peermem_objects_wait() };
}

// ---------------------------------------------------------------------------
// Free-callback references

/// The free callback's reference to a registration, kept in the C glue's
/// registry under a never-reused id; the id, not a pointer, is the
/// callback's `data`. Whoever takes the entry out of the registry owns the
/// reference: the free callback ([`cb_gpu_free`], on entry) or the
/// registration after a put that returned 0 ([`CallbackRef::take`]).
/// Removal is atomic, so exactly one of them gets it, whatever the GPU
/// driver's put returned and whenever its callback runs.
///
/// # Invariants
///
/// `0` is a (non-zero) id that `peermem_cbref_insert` handed out for a
/// reference from `Arc::into_raw`; its entry may have been taken since.
pub(crate) struct CallbackRef(u64);

impl CallbackRef {
    /// Puts `reg` in the registry; `ENOMEM` if it cannot.
    fn insert(reg: Arc<Registration>) -> Result<Self> {
        let ptr = Arc::into_raw(reg);
        let mut id = 0u64;
        // SAFETY: `ptr` is a non-null, aligned pointer; `id` a valid out pointer.
        let ret = unsafe { raw::peermem_cbref_insert(ptr.cast(), &mut id) };
        if let Err(e) = to_result(ret) {
            // SAFETY: not stored: the reference `into_raw` made is ours again.
            drop(unsafe { Arc::from_raw(ptr) });
            return Err(e);
        }
        // INVARIANT: `id` names the entry holding `ptr`.
        Ok(Self(id))
    }

    /// The callback's `data`: the id.
    fn data(&self) -> *mut c_void {
        // The glue hands out ids that fit an `unsigned long`, i.e. a pointer.
        self.0 as usize as *mut c_void
    }

    /// Takes the reference out of the registry: `None` if the free
    /// callback took it already (or for a persistent pin).
    pub(crate) fn take(&self) -> Option<Arc<Registration>> {
        take_callback_ref(self.0)
    }
}

/// Removes entry `id` from the registry and returns its reference, if any.
fn take_callback_ref(id: u64) -> Option<Arc<Registration>> {
    if id == 0 {
        return None;
    }
    // SAFETY: FFI call without preconditions (any id is fine).
    let ptr = unsafe { raw::peermem_cbref_take(id) };
    // SAFETY: a non-null result is a reference from `Arc::into_raw` stored
    // by `CallbackRef::insert`; the removal was atomic, so it is ours alone.
    (!ptr.is_null()).then(|| unsafe { Arc::from_raw(ptr.cast::<Registration>()) })
}

/// How many free-callback references are still in the registry (0 once
/// every registration object is gone: each entry holds one).
pub(crate) fn callback_refs_left() -> u64 {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_cbrefs_left() }
}

// ---------------------------------------------------------------------------
// Address-space watches

/// The work queue and callbacks of [`AddressWatch`]es; dropping it (at
/// unload, after the core released every registration, so that every
/// watch is stopped) runs the work items still queued.
pub(crate) struct Watches(());

impl Watches {
    /// Sets up the watches' work queue; `ENOMEM` if it cannot.
    pub(crate) fn setup() -> Result<Self> {
        // SAFETY: both functions stay valid until `drop`, which runs the
        // queued work items before the module can go.
        to_result(unsafe { raw::peermem_watch_setup(Some(watch_hold), Some(watch_changed)) })?;
        Ok(Self(()))
    }

    /// Whether registrations get an address-space watch.
    pub(crate) fn available() -> bool {
        // SAFETY: FFI call without preconditions.
        unsafe { raw::peermem_watch_available() }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        // SAFETY: called once, at unload; every watch was stopped (the core
        // released every registration), so no work item can be queued anew.
        unsafe { raw::peermem_watch_teardown() };
    }
}

/// The notifier's `hold`: a new reference to the registration it watches.
///
/// # Safety
///
/// Called by the C glue with the `reg` given to `peermem_watch_start`,
/// while the watch is started: the registration is alive then (see
/// [`AddressWatch::start`]).
unsafe extern "C" fn watch_hold(reg: *const c_void) -> *const c_void {
    // SAFETY: `reg` points to a live registration inside an `Arc` (by the
    // function's safety requirements); `ManuallyDrop` leaves its count alone.
    let borrowed =
        core::mem::ManuallyDrop::new(unsafe { Arc::from_raw(reg.cast::<Registration>()) });
    Arc::into_raw(Arc::clone(&borrowed)).cast()
}

/// The work item: the watched range was unmapped; `r` is the reference
/// `watch_hold` took.
///
/// # Safety
///
/// Called by the C glue once per `watch_hold`, with what it returned.
unsafe extern "C" fn watch_changed(r: *const c_void) {
    // SAFETY: `r` came from `Arc::into_raw` in `watch_hold`; it is ours now.
    let reg = unsafe { Arc::from_raw(r.cast::<Registration>()) };
    client::address_changed(reg);
}

/// An mmu interval notifier on a registration's range in the address space
/// of the process that registered it: when the range is unmapped or moved
/// it calls [`client::address_changed`] from a work item.
///
/// # Invariants
///
/// `0` was returned by `peermem_watch_alloc` and is freed only by `drop`.
/// Once started for a registration, it is stopped before that
/// registration's last reference can go (the owner's duty, see
/// [`AddressWatch::start`]).
pub(crate) struct AddressWatch(NonNull<raw::peermem_watch>);

// SAFETY: the C object is used from any thread.
unsafe impl Send for AddressWatch {}
// SAFETY: the C side serializes `peermem_watch_start` and
// `peermem_watch_stop` of one watch with the watch's own mutex, so `start`
// and `stop` through `&self` may run concurrently (a `stop` that finds the
// watch not started returns at once; one that finds it started returns
// once the notifier is removed, also when another `stop` removes it).
unsafe impl Sync for AddressWatch {}

impl AddressWatch {
    /// A watch for the calling process, not started yet. `Ok(None)` if
    /// there is nothing to watch: the `mmu_notifier` parameter is off, the
    /// kernel has no MMU notifiers, or the caller has no user address space.
    pub(crate) fn new() -> Result<Option<Self>> {
        // SAFETY: FFI call without preconditions.
        let p = unsafe { raw::peermem_watch_alloc() };
        let v = p as isize;
        if (-4095..0).contains(&v) {
            return Err(Error::from_errno(v as i32));
        }
        // INVARIANT: from `peermem_watch_alloc`.
        Ok(NonNull::new(p).map(Self))
    }

    /// Watches `[start, start + len)` of the calling process for `reg`:
    /// until [`AddressWatch::stop`] returns, the notifier may take new
    /// references to `reg` from the pointer it keeps. `EBUSY` if the watch
    /// is started already.
    ///
    /// # Safety
    ///
    /// `reg` stays alive until [`AddressWatch::stop`] has returned: the
    /// caller calls `stop` before the last reference to `reg` can go (for
    /// a watch that is a field of `reg`, before the reference it gives up
    /// last).
    pub(crate) unsafe fn start(&self, reg: &Arc<Registration>, start: u64, len: u64) -> Result {
        let p: *const Registration = &**reg;
        // SAFETY: `self.0` is a live watch (type invariant); `p` is the
        // pointer `Arc::into_raw` would give for `reg`, valid until `stop`
        // (the caller's obligation).
        to_result(unsafe { raw::peermem_watch_start(self.0.as_ptr(), p.cast(), start, len) })
    }

    /// Stops watching: when it returns, the notifier takes no new
    /// reference. Idempotent; sleeps.
    pub(crate) fn stop(&self) {
        // SAFETY: a live watch (type invariant).
        unsafe { raw::peermem_watch_stop(self.0.as_ptr()) };
    }
}

impl Drop for AddressWatch {
    fn drop(&mut self) {
        // SAFETY: a live watch, not used after this. Its work item, if it
        // was queued, has run: it holds a reference to the registration
        // that owns this watch, and this drop runs when that is gone.
        unsafe { raw::peermem_watch_free(self.0.as_ptr()) };
    }
}

// ---------------------------------------------------------------------------
// The peer-memory core

/// GPU page size of the NVIDIA P2P interface (`NVIDIA_P2P_PAGE_SIZE_64KB`).
pub(crate) const P2P_PAGE_SIZE_64KB: u32 = raw::nvidia_p2p_page_size_type_NVIDIA_P2P_PAGE_SIZE_64KB;
/// The page-table version peermem is built against.
pub(crate) const P2P_PAGE_TABLE_VERSION: u32 = raw::NVIDIA_P2P_PAGE_TABLE_VERSION;
/// The DMA-mapping version peermem is built against.
pub(crate) const P2P_DMA_MAPPING_VERSION: u32 = raw::NVIDIA_P2P_DMA_MAPPING_VERSION;

/// One of peermem's clients as the core knows it: the client structure
/// handed to the core, which must stay valid (and unchanged) until
/// unregistration, so it lives in a static, and the registration's state.
struct Slot {
    client: UnsafeCell<raw::peer_memory_client_ex>,
    /// Whether this client is registered (at most once: the slot is static).
    registered: AtomicBool,
    /// The core's registration handle, null while not registered.
    handle: AtomicPtr<c_void>,
    /// The core's invalidate function (as an address), 0 if none.
    invalidate: AtomicUsize,
    /// Set once the handle and the invalidate function are stored:
    /// `acquire` declines everything before (a free callback may need both).
    ready: AtomicBool,
}

// SAFETY: `client` is written only by `CoreClient::register`, before the
// core has seen it and while this slot is not registered (`registered`);
// afterwards only the core reads it. The rest is atomics.
unsafe impl Sync for Slot {}

/// An empty client structure.
const EMPTY_CLIENT: raw::peer_memory_client_ex = {
    // SAFETY: all-zero bytes are a valid `peer_memory_client_ex` (arrays of
    // integers, integers and `Option`s of function pointers).
    unsafe { core::mem::zeroed() }
};

impl Slot {
    const fn new() -> Self {
        Self {
            client: UnsafeCell::new(EMPTY_CLIENT),
            registered: AtomicBool::new(false),
            handle: AtomicPtr::new(ptr::null_mut()),
            invalidate: AtomicUsize::new(0),
            ready: AtomicBool::new(false),
        }
    }
}

/// The invalidating client (`nv_mem`).
static SLOT_INVALIDATING: Slot = Slot::new();
/// The non-invalidating client (`nv_mem_nc`).
static SLOT_PERSISTENT: Slot = Slot::new();

fn slot(kind: Kind) -> &'static Slot {
    match kind {
        Kind::Invalidating => &SLOT_INVALIDATING,
        Kind::Persistent => &SLOT_PERSISTENT,
    }
}

/// One of peermem's registrations with the peer-memory core; dropping it
/// unregisters, which sleeps until the core released every registration
/// that client serves.
///
/// # Invariants
///
/// While a `CoreClient` of kind `k` exists, `slot(k).client` is registered
/// with the core under the handle in `slot(k).handle`, and
/// `slot(k).registered` is true.
pub(crate) struct CoreClient(Kind);

impl CoreClient {
    /// Registers the client `name` of `kind` with the core:
    /// [`Kind::Invalidating`] is an extended client with
    /// `PEER_MEM_INVALIDATE_UNMAPS` that gets the core's invalidate
    /// function, [`Kind::Persistent`] a plain non-invalidating one (as
    /// nvidia-peermem registers `nv_mem` and `nv_mem_nc`). `EBUSY` if that
    /// client is registered already, `EINVAL` if the core refuses (it logs
    /// why) or the name does not fit.
    pub(crate) fn register(kind: Kind, name: &str) -> Result<Self> {
        if name.len() >= PEER_NAME_CAPACITY {
            return Err(code::EINVAL);
        }
        let slot = slot(kind);
        if slot.registered.swap(true, Ordering::AcqRel) {
            return Err(code::EBUSY);
        }
        let invalidate = kind == Kind::Invalidating;
        // SAFETY: `registered` was false: the core does not know this
        // client structure and nothing else writes it (see `Slot`).
        let ex = unsafe { &mut *slot.client.get() };
        *ex = EMPTY_CLIENT;
        for (d, s) in ex.client.name.iter_mut().zip(name.bytes()) {
            *d = c_char::from_ne_bytes([s]);
        }
        for (d, s) in ex.client.version.iter_mut().zip(VERSION.bytes()) {
            *d = c_char::from_ne_bytes([s]);
        }
        ex.client.acquire = Some(match kind {
            Kind::Invalidating => cb_acquire_invalidating,
            Kind::Persistent => cb_acquire_persistent,
        });
        ex.client.get_pages = Some(cb_get_pages);
        ex.client.dma_map = Some(cb_dma_map);
        ex.client.dma_unmap = Some(cb_dma_unmap);
        ex.client.put_pages = Some(cb_put_pages);
        ex.client.get_page_size = Some(cb_get_page_size);
        ex.client.release = Some(cb_release);
        if invalidate {
            // The marker of an extended client (VERSION leaves room, see above).
            ex.client.version[raw::IB_PEER_MEMORY_VER_MAX as usize - 1] = 1;
            ex.ex_size = core::mem::size_of::<raw::peer_memory_client_ex>();
            ex.flags = raw::PEER_MEM_INVALIDATE_UNMAPS;
        }
        let mut inval: raw::invalidate_peer_memory = None;
        // SAFETY: the client structure is complete and static; `inval`
        // outlives the call. The core keeps the pointer to it until
        // `ib_unregister_peer_memory_client`, which only `drop` calls.
        let handle = unsafe {
            raw::ib_register_peer_memory_client(
                ptr::from_ref(&ex.client),
                if invalidate {
                    &mut inval
                } else {
                    ptr::null_mut()
                },
            )
        };
        if handle.is_null() {
            slot.registered.store(false, Ordering::Release);
            return Err(code::EINVAL);
        }
        let inval_addr = inval.map_or(0, |f| f as usize);
        if invalidate && inval_addr == 0 {
            // SAFETY: `handle` was just returned by the core and is not used again.
            unsafe { raw::ib_unregister_peer_memory_client(handle) };
            slot.registered.store(false, Ordering::Release);
            pr_err!("the peer-memory core accepted the invalidating client {} but handed out no invalidate function; this core cannot serve one: load peermem with enable_invalidate=0\n", name);
            return Err(code::EINVAL);
        }
        slot.handle.store(handle, Ordering::Release);
        slot.invalidate.store(inval_addr, Ordering::Release);
        slot.ready.store(true, Ordering::Release);
        // INVARIANT: registered under `handle`, stored in the slot.
        Ok(Self(kind))
    }
}

impl Drop for CoreClient {
    fn drop(&mut self) {
        let slot = slot(self.0);
        slot.ready.store(false, Ordering::Release);
        let handle = slot.handle.load(Ordering::Acquire);
        // SAFETY: `handle` is the registration (type invariant); after this
        // call the core never calls the client again, so its structure and
        // callbacks may go.
        unsafe { raw::ib_unregister_peer_memory_client(handle) };
        slot.invalidate.store(0, Ordering::Release);
        slot.handle.store(ptr::null_mut(), Ordering::Release);
        slot.registered.store(false, Ordering::Release);
    }
}

/// Calls the core's invalidate function of the invalidating client for
/// `ticket` (a `core_context` from `get_pages`). `None` if that client has
/// none (not registered).
///
/// Must not be called with a lock held that `get_pages`/`dma_map` take:
/// the core waits for the mapping lock, held across those.
/// The caller must keep the registration of `ticket` from being released
/// until this returns (see the safety comment inside).
pub(crate) fn core_invalidate(ticket: u64) -> Option<i32> {
    let slot = slot(Kind::Invalidating);
    let f = slot.invalidate.load(Ordering::Acquire);
    let handle = slot.handle.load(Ordering::Acquire);
    if f == 0 || handle.is_null() {
        return None;
    }
    // SAFETY: `f` is the address of the core's `invalidate_peer_memory`
    // function, stored by `CoreClient::register` from what the core wrote.
    let f: unsafe extern "C" fn(*mut c_void, u64) -> c_int = unsafe { core::mem::transmute(f) };
    // SAFETY: `handle` is the live registration: callers invalidate a
    // ticket of a registration the core has not released yet and count the
    // call as running in it (`client::Inner::begin_invalidate`); the core's
    // `release` of that registration waits until no call is running, and
    // unregistration returns only after every `release` returned.
    Some(unsafe { f(handle, ticket) })
}

/// The registration behind a core `client_context`.
///
/// # Safety
///
/// `ctx` must be a pointer that `cb_acquire_*` stored and `cb_release` has
/// not consumed yet: the core's reference keeps the object alive for `'a`
/// (the callback's duration).
unsafe fn registration<'a>(ctx: *mut c_void) -> &'a Registration {
    // SAFETY: by the function's safety requirements.
    unsafe { &*ctx.cast::<Registration>() }
}

/// `acquire` of the invalidating client.
///
/// # Safety
///
/// Called by the peer-memory core only, with the arguments its ABI
/// describes (`include/peer_mem_abi.h`); a `client_context` is one that
/// `cb_acquire_*` stored and `cb_release` has not consumed yet.
unsafe extern "C" fn cb_acquire_invalidating(
    addr: c_ulong,
    size: usize,
    _legacy_private: *mut c_void,
    _legacy_name: *mut c_char,
    client_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: as this function's.
    unsafe { acquire(Kind::Invalidating, addr, size, client_context) }
}

/// `acquire` of the non-invalidating client.
///
/// # Safety
///
/// As [`cb_acquire_invalidating`].
unsafe extern "C" fn cb_acquire_persistent(
    addr: c_ulong,
    size: usize,
    _legacy_private: *mut c_void,
    _legacy_name: *mut c_char,
    client_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: as this function's.
    unsafe { acquire(Kind::Persistent, addr, size, client_context) }
}

/// # Safety
///
/// The arguments of the core's `acquire` call to the client `kind`.
unsafe fn acquire(
    kind: Kind,
    addr: c_ulong,
    size: usize,
    client_context: *mut *mut c_void,
) -> c_int {
    if client_context.is_null() || !slot(kind).ready.load(Ordering::Acquire) {
        return 0;
    }
    #[allow(clippy::useless_conversion)] // c_ulong is u64 before 6.13
    let addr = u64::try_from(addr).unwrap_or(u64::MAX);
    match client::acquire(kind, addr, size as u64) {
        Some(reg) => {
            // SAFETY: the core passes a valid pointer for the context; the
            // reference stored there is given back in `cb_release`.
            unsafe { *client_context = Arc::into_raw(reg).cast_mut().cast() };
            1
        }
        None => 0,
    }
}

/// # Safety
///
/// Called by the peer-memory core only, with the arguments its ABI
/// describes (`include/peer_mem_abi.h`); a `client_context` is one that
/// `cb_acquire_*` stored and `cb_release` has not consumed yet.
unsafe extern "C" fn cb_get_pages(
    addr: c_ulong,
    size: usize,
    _write: c_int,
    _force: c_int,
    _legacy_sg: *mut kernel::bindings::sg_table,
    client_context: *mut c_void,
    core_context: u64,
) -> c_int {
    // SAFETY: the core passes the context `cb_acquire_*` stored and has not released it.
    let reg = unsafe { registration(client_context) };
    #[allow(clippy::useless_conversion)] // c_ulong is u64 before 6.13
    let addr = u64::try_from(addr).unwrap_or(u64::MAX);
    match client::get_pages(reg, addr, size as u64, core_context) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// Called by the peer-memory core only, with the arguments its ABI
/// describes (`include/peer_mem_abi.h`); a `client_context` is one that
/// `cb_acquire_*` stored and `cb_release` has not consumed yet.
unsafe extern "C" fn cb_dma_map(
    sgt: *mut kernel::bindings::sg_table,
    client_context: *mut c_void,
    dma_device: *mut kernel::bindings::device,
    _legacy_dmasync: c_int,
    nmap: *mut c_int,
) -> c_int {
    if sgt.is_null() || nmap.is_null() {
        return code::EINVAL.to_errno();
    }
    // SAFETY: as in `cb_get_pages`.
    let reg = unsafe { registration(client_context) };
    // SAFETY: the core passes its RDMA device's DMA device, live for the
    // umem's lifetime, or NULL.
    let dev = unsafe { DmaDevice::from_raw(dma_device) };
    match client::dma_map(reg, dev.as_ref()) {
        Ok(view) => {
            // SAFETY: `sgt` and `nmap` are the core's, valid for the call.
            unsafe {
                *sgt = view.0;
                *nmap = view.0.nents as c_int;
            }
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// Called by the peer-memory core only, with the arguments its ABI
/// describes (`include/peer_mem_abi.h`); a `client_context` is one that
/// `cb_acquire_*` stored and `cb_release` has not consumed yet.
unsafe extern "C" fn cb_dma_unmap(
    sgt: *mut kernel::bindings::sg_table,
    client_context: *mut c_void,
    _dma_device: *mut kernel::bindings::device,
) -> c_int {
    // SAFETY: as in `cb_get_pages`.
    let reg = unsafe { registration(client_context) };
    let sgl = if sgt.is_null() {
        0
    } else {
        // SAFETY: the core's table, valid for the call.
        unsafe { (*sgt).sgl as usize }
    };
    client::dma_unmap(reg, sgl);
    0
}

/// # Safety
///
/// Called by the peer-memory core only, with the arguments its ABI
/// describes (`include/peer_mem_abi.h`); a `client_context` is one that
/// `cb_acquire_*` stored and `cb_release` has not consumed yet.
unsafe extern "C" fn cb_put_pages(
    _sgt: *mut kernel::bindings::sg_table,
    client_context: *mut c_void,
) {
    // SAFETY: as in `cb_get_pages`.
    let reg = unsafe { registration(client_context) };
    client::put_pages(reg);
}

/// # Safety
///
/// Called by the peer-memory core only, with the arguments its ABI
/// describes (`include/peer_mem_abi.h`); a `client_context` is one that
/// `cb_acquire_*` stored and `cb_release` has not consumed yet.
unsafe extern "C" fn cb_get_page_size(client_context: *mut c_void) -> c_ulong {
    // SAFETY: as in `cb_get_pages`.
    let reg = unsafe { registration(client_context) };
    #[allow(clippy::useless_conversion)] // c_ulong is u64 before 6.13
    c_ulong::try_from(client::page_size(reg)).unwrap_or(0)
}

/// # Safety
///
/// Called by the peer-memory core only, with the arguments its ABI
/// describes (`include/peer_mem_abi.h`); a `client_context` is one that
/// `cb_acquire_*` stored and `cb_release` has not consumed yet.
unsafe extern "C" fn cb_release(client_context: *mut c_void) {
    // SAFETY: the core releases each context once, the one `cb_acquire_*`
    // stored with `Arc::into_raw`: this takes that reference back.
    let reg = unsafe { Arc::from_raw(client_context.cast_const().cast::<Registration>()) };
    client::release(reg);
}

// ---------------------------------------------------------------------------
// The NVIDIA P2P interface

/// Whether a structure of version `have` is usable by code built against
/// `want` (`NVIDIA_P2P_VERSION_COMPATIBLE`): same major, minor at least ours.
pub(crate) fn p2p_version_compatible(have: u32, want: u32) -> bool {
    let major = |v: u32| (v & raw::NVIDIA_P2P_MAJOR_VERSION_MASK) >> 16;
    let minor = |v: u32| v & raw::NVIDIA_P2P_MINOR_VERSION_MASK;
    major(have) == major(want) && minor(have) >= minor(want)
}

/// The free callback given to `nvidia_p2p_get_pages`: `data` is the id of
/// the callback's reference (see [`CallbackRef`]). It takes the reference
/// out of the registry first; if it is gone, a put that returned 0 took it
/// and the core's teardown owns the registration: nothing to do.
///
/// # Safety
///
/// Called by the GPU driver, with a pin's `data`. Any value is safe: it is
/// only looked up, never dereferenced.
unsafe extern "C" fn cb_gpu_free(data: *mut c_void) {
    match take_callback_ref(data as usize as u64) {
        Some(reg) => client::gpu_freed(reg),
        None => client::gpu_freed_after_put(),
    }
}

/// A page table pinned with `nvidia_p2p_get_pages*`.
///
/// # Invariants
///
/// `ptr` is a page table the driver handed out for `[va, va + len)` and
/// did not free: it stays valid until [`PageTable::put`] or, for a
/// non-persistent one, until its free callback returns; the owner of the
/// `PageTable` makes sure neither happened while it uses it (before either
/// can happen it turns it into a [`PendingPut`], which reads nothing) (peermem's
/// free callback takes the table out of its registration, under the
/// registration's lock, before returning). `callback` names the free
/// callback's reference (`None` for a persistent pin); `stats` are the
/// counters of the client that pinned it.
pub(crate) struct PageTable {
    ptr: NonNull<raw::nvidia_p2p_page_table>,
    va: u64,
    callback: Option<CallbackRef>,
    stats: &'static Stats,
}

// SAFETY: the page table is the driver's object, usable from any thread;
// `callback` is an id.
unsafe impl Send for PageTable {}

/// Pins `[va, va + len)` (64 KiB aligned) of the calling process.
///
/// With `callback`, a non-persistent pin whose free callback gets that
/// reference (through the registry, see [`CallbackRef`]; on failure it is
/// dropped); without, a persistent pin. `stats`: the counters of the
/// client pinning.
pub(crate) fn p2p_get_pages(
    va: u64,
    len: u64,
    callback: Option<Arc<Registration>>,
    stats: &'static Stats,
) -> Result<PageTable> {
    let mut pt: *mut raw::nvidia_p2p_page_table = ptr::null_mut();
    let (ret, callback) = match callback {
        Some(reg) => {
            let cref = CallbackRef::insert(reg)?;
            // SAFETY: `pt` is a valid out pointer; `cb_gpu_free` stays valid
            // until the callback ran or the pages were put (its entry keeps
            // a registration alive, and module unload waits for those);
            // `data` is an id, never dereferenced.
            let ret = unsafe {
                raw::nvidia_p2p_get_pages(0, 0, va, len, &mut pt, Some(cb_gpu_free), cref.data())
            };
            (ret, Some(cref))
        }
        None => {
            // SAFETY: `pt` is a valid out pointer.
            let ret = unsafe { raw::nvidia_p2p_get_pages_persistent(va, len, &mut pt, 0) };
            (ret, None)
        }
    };
    // The pin failed: the driver never calls the callback, its reference is ours again.
    let back = |e: Error| {
        drop(callback.as_ref().and_then(CallbackRef::take));
        e
    };
    if let Err(e) = result_of(ret) {
        return Err(back(e));
    }
    match NonNull::new(pt) {
        // INVARIANT: the driver handed out `pt` for this range.
        Some(ptr) => Ok(PageTable {
            ptr,
            va,
            callback,
            stats,
        }),
        None => {
            pr_err!("nvidia_p2p_get_pages returned success but no page table; the GPU driver is broken\n");
            // No page table to put back or to call a callback for.
            Err(back(code::EIO))
        }
    }
}

impl PageTable {
    fn table(&self) -> &raw::nvidia_p2p_page_table {
        // SAFETY: valid while `self` exists (type invariant).
        unsafe { self.ptr.as_ref() }
    }

    /// The structure's version.
    pub(crate) fn version(&self) -> u32 {
        self.table().version
    }

    /// The page size, an `nvidia_p2p_page_size_type` value.
    pub(crate) fn page_size_type(&self) -> u32 {
        self.table().page_size
    }

    /// Number of pages.
    pub(crate) fn entries(&self) -> u32 {
        self.table().entries
    }

    /// Whether every page pointer is there.
    pub(crate) fn pages_present(&self) -> bool {
        let t = self.table();
        if t.pages.is_null() {
            return false;
        }
        (0..t.entries as usize).all(|i| {
            // SAFETY: `pages` has `entries` elements (the driver's promise).
            !unsafe { *t.pages.add(i) }.is_null()
        })
    }

    /// Starts giving the table back: what is left is only the table's
    /// address, the driver's key for `nvidia_p2p_put_pages*`. Call this
    /// where the table is still valid (for a non-persistent pin: where its
    /// free callback cannot have run, e.g. under the lock the callback
    /// takes); from then on the callback may run and the driver free the
    /// table, and nothing reads it any more.
    pub(crate) fn begin_put(self) -> PendingPut {
        let mut this = core::mem::ManuallyDrop::new(self);
        PendingPut {
            ptr: this.ptr,
            va: this.va,
            callback: this.callback.take(),
            stats: this.stats,
        }
    }

    /// Called from the free callback: the page table is the driver's from
    /// now on (it frees it when the callback returns); not touched again.
    pub(crate) fn give_to_driver(self) {
        core::mem::forget(self);
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        // Every owner gives the table back explicitly (`put` or
        // `give_to_driver`); reaching this is a peermem bug that leaks a pin.
        self.stats.errors.inc();
        pr_err!("BUG: a pinned page table at {:#x} was dropped without being put back; its GPU memory stays pinned\n", self.va);
    }
}

/// A page table being given back ([`PageTable::begin_put`]): its address
/// and range, which the driver's put looks up, and nothing that reads it.
///
/// # Invariants
///
/// `ptr` was a page table the driver handed out for `[va, va + len)`, not
/// put yet; it may have been freed since (its free callback ran), so it is
/// never dereferenced. `callback` and `stats` as in [`PageTable`].
pub(crate) struct PendingPut {
    ptr: NonNull<raw::nvidia_p2p_page_table>,
    va: u64,
    callback: Option<CallbackRef>,
    stats: &'static Stats,
}

// SAFETY: an address and an id.
unsafe impl Send for PendingPut {}

impl PendingPut {
    /// Whether this pin is persistent (no free callback).
    pub(crate) fn is_persistent(&self) -> bool {
        self.callback.is_none()
    }

    /// Unpins the pages (`nvidia_p2p_put_pages*`). The page table is gone
    /// afterwards whatever the result; the name of the callback's reference
    /// (`None`: persistent) comes back for the caller to decide about (see
    /// [`CallbackRef::take`]).
    pub(crate) fn put(self) -> (Result, Option<CallbackRef>) {
        let mut this = core::mem::ManuallyDrop::new(self);
        let callback = this.callback.take();
        let ret = if callback.is_none() {
            // SAFETY: a persistent pin of this range, not put before (type
            // invariant); a persistent table has no free callback, and the
            // driver only looks the address up.
            unsafe { raw::nvidia_p2p_put_pages_persistent(this.va, this.ptr.as_ptr(), 0) }
        } else {
            // SAFETY: a pin of this range, not put before. The driver looks
            // the address up among its live tables without reading it: if
            // the free callback ran (or runs), it finds none and returns 0
            // (550) or an error, and frees nothing twice.
            unsafe { raw::nvidia_p2p_put_pages(0, 0, this.va, this.ptr.as_ptr()) }
        };
        (result_of(ret), callback)
    }
}

impl Drop for PendingPut {
    fn drop(&mut self) {
        // `put` consumes it; reaching this is a peermem bug that leaks a pin.
        self.stats.errors.inc();
        pr_err!("BUG: a page table at {:#x} being put back was dropped instead; its GPU memory stays pinned\n", self.va);
    }
}

/// A PCI device used as DMA peer.
///
/// # Invariants
///
/// `0` points to a live `struct pci_dev` (the core's RDMA DMA device,
/// which outlives every umem of the device).
pub(crate) struct PciDev(NonNull<kernel::bindings::pci_dev>);

// SAFETY: a reference to a device, usable from any thread.
unsafe impl Send for PciDev {}

/// The DMA device `dma_map` is asked to map for (valid for `'a`, the call).
pub(crate) enum DmaDevice<'a> {
    /// A PCI device, with its scatter-gather limits.
    Pci {
        /// The device.
        pdev: PciDev,
        /// `dma_get_max_seg_size()`.
        max_seg_size: u32,
        /// `dma_get_seg_boundary()`.
        seg_boundary: u64,
    },
    /// Some other device (peer-to-peer needs PCI).
    Other(NotPci<'a>),
}

/// A DMA device that is not a PCI device, valid for `'a`.
pub(crate) struct NotPci<'a>(
    NonNull<kernel::bindings::device>,
    core::marker::PhantomData<&'a ()>,
);

impl NotPci<'_> {
    /// Logs (rate-limited, naming the device) that it cannot do GPU peer-to-peer DMA.
    pub(crate) fn report(&self) {
        // SAFETY: a live device (from `DmaDevice::from_raw`'s caller).
        unsafe { raw::peermem_report_not_pci(self.0.as_ptr().cast()) };
    }
}

impl DmaDevice<'_> {
    /// `None` for a NULL device (no device to map for).
    ///
    /// # Safety
    ///
    /// `dev` is NULL or a live device that outlives the returned value.
    unsafe fn from_raw(dev: *mut kernel::bindings::device) -> Option<Self> {
        let dev = NonNull::new(dev)?;
        // SAFETY: `dev` is a live device.
        let pdev = unsafe { raw::peermem_to_pci_dev(dev.as_ptr()) };
        Some(
            match NonNull::new(pdev.cast::<kernel::bindings::pci_dev>()) {
                Some(p) => Self::Pci {
                    // INVARIANT: the PCI device of the live `dev`.
                    pdev: PciDev(p),
                    // SAFETY: `dev` is a live device.
                    max_seg_size: unsafe { raw::peermem_dma_max_seg_size(dev.as_ptr()) },
                    // SAFETY: `dev` is a live device.
                    seg_boundary: unsafe { raw::peermem_dma_seg_boundary(dev.as_ptr()) },
                },
                None => Self::Other(NotPci(dev, core::marker::PhantomData)),
            },
        )
    }
}

/// Set once `dma_map` was called without a DMA device (see [`report_no_dma_device`]).
static NO_DMA_DEVICE_REPORTED: AtomicBool = AtomicBool::new(false);

/// Logs, once per load, that the core asked for a mapping without a DMA device.
pub(crate) fn report_no_dma_device() {
    if !NO_DMA_DEVICE_REPORTED.swap(true, Ordering::Relaxed) {
        pr_err!("dma_map without a DMA device (NULL): the RDMA driver or the peer-memory core gives peermem no PCI device to map GPU memory for, and GPU peer-to-peer DMA needs one (a hardware RDMA adapter); every such registration on GPU memory fails with EINVAL (reported once)\n");
    }
}

/// A DMA mapping of a page table for a PCI device (`nvidia_p2p_dma_map_pages`).
///
/// # Invariants
///
/// `ptr` is a mapping the driver made of a page table for `pdev`, not yet
/// unmapped or given back; valid while that page table is (see [`PageTable`]).
pub(crate) struct DmaMapping {
    ptr: NonNull<raw::nvidia_p2p_dma_mapping>,
    pdev: PciDev,
    /// The counters of the client that mapped it.
    stats: &'static Stats,
}

// SAFETY: the driver's object, usable from any thread.
unsafe impl Send for DmaMapping {}

impl DmaMapping {
    /// Maps `pt` for DMA by `pdev`.
    pub(crate) fn map(pdev: &PciDev, pt: &PageTable) -> Result<Self> {
        let mut m: *mut raw::nvidia_p2p_dma_mapping = ptr::null_mut();
        // SAFETY: `pdev` is live, `pt` is a live page table (type
        // invariants), `m` a valid out pointer.
        let ret = unsafe {
            raw::nvidia_p2p_dma_map_pages(pdev.0.as_ptr().cast(), pt.ptr.as_ptr(), &mut m)
        };
        result_of(ret)?;
        let ptr = NonNull::new(m).ok_or(code::EIO)?;
        // INVARIANT: just mapped for `pdev`.
        Ok(Self {
            ptr,
            pdev: PciDev(pdev.0),
            stats: pt.stats,
        })
    }

    fn mapping(&self) -> &raw::nvidia_p2p_dma_mapping {
        // SAFETY: valid (type invariant).
        unsafe { self.ptr.as_ref() }
    }

    /// The structure's version.
    pub(crate) fn version(&self) -> u32 {
        self.mapping().version
    }

    /// The page size, an `nvidia_p2p_page_size_type` value.
    pub(crate) fn page_size_type(&self) -> u32 {
        self.mapping().page_size_type
    }

    /// Number of DMA addresses.
    pub(crate) fn entries(&self) -> u32 {
        self.mapping().entries
    }

    /// The DMA address of each page, in order (none if the array is missing).
    pub(crate) fn addresses(&self) -> impl Iterator<Item = u64> + '_ {
        let m = self.mapping();
        let n = if m.dma_addresses.is_null() {
            0
        } else {
            m.entries as usize
        };
        (0..n).map(move |i| {
            // SAFETY: `dma_addresses` has `entries` elements (the driver's promise).
            unsafe { *m.dma_addresses.add(i) }
        })
    }

    /// Unmaps (`nvidia_p2p_dma_unmap_pages`); `pt` is the page table it maps.
    pub(crate) fn unmap(self, pt: &PageTable) -> Result {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: a live mapping of the live `pt` for `pdev` (type invariants).
        result_of(unsafe {
            raw::nvidia_p2p_dma_unmap_pages(
                this.pdev.0.as_ptr().cast(),
                pt.ptr.as_ptr(),
                this.ptr.as_ptr(),
            )
        })
    }

    /// From inside the free callback: give the mapping back to the driver
    /// (`nvidia_p2p_free_dma_mapping`), which frees it with the page table.
    pub(crate) fn free_in_callback(self) {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: a live mapping, inside its page table's free callback.
        let ret = unsafe { raw::nvidia_p2p_free_dma_mapping(this.ptr.as_ptr()) };
        if ret != 0 {
            pr_warn!("nvidia_p2p_free_dma_mapping failed ({}) in the free callback; the GPU driver frees the mapping with its page table anyway\n", ret);
        }
    }
}

impl Drop for DmaMapping {
    fn drop(&mut self) {
        self.stats.errors.inc();
        pr_err!("BUG: a DMA mapping was dropped without being unmapped\n");
    }
}

// ---------------------------------------------------------------------------
// Scatter-gather tables

/// A scatter-gather table peermem allocated (its own copy; the core gets a
/// shallow copy of the `struct sg_table`, sharing the entries).
///
/// # Invariants
///
/// `0` was filled by `peermem_sgt_alloc` (or is zeroed) and is freed on drop.
pub(crate) struct SgTable(kernel::bindings::sg_table);

// SAFETY: plain memory owned by this object.
unsafe impl Send for SgTable {}

/// The `struct sg_table` handed to the core.
pub(crate) struct SgView(kernel::bindings::sg_table);

impl SgTable {
    /// A table of `nents` zeroed entries.
    pub(crate) fn new(nents: u32) -> Result<Self> {
        if nents == 0 {
            return Err(code::EINVAL);
        }
        // SAFETY: all-zero is the empty `struct sg_table`.
        let mut t = Self(unsafe { core::mem::zeroed() });
        // SAFETY: `t.0` is a valid, empty table to fill.
        result_of(unsafe { raw::peermem_sgt_alloc(&mut t.0, nents) })?;
        Ok(t)
    }

    /// Number of entries.
    pub(crate) fn nents(&self) -> u32 {
        let t = &self.0;
        t.orig_nents
    }

    /// Address of the first entry (identifies the table).
    pub(crate) fn sgl_addr(&self) -> usize {
        self.0.sgl as usize
    }

    /// What the core gets: the same entries, `nents` entries mapped.
    pub(crate) fn view(&self) -> SgView {
        SgView(kernel::bindings::sg_table {
            sgl: self.0.sgl,
            nents: self.0.orig_nents,
            orig_nents: self.0.orig_nents,
        })
    }

    /// A cursor over the entries, to fill them in order.
    pub(crate) fn cursor(&mut self) -> SgCursor<'_> {
        SgCursor {
            next: self.0.sgl,
            _table: core::marker::PhantomData,
        }
    }
}

impl Drop for SgTable {
    fn drop(&mut self) {
        // SAFETY: allocated by `peermem_sgt_alloc` or zeroed (type invariant).
        unsafe { raw::peermem_sgt_free(&mut self.0) };
    }
}

/// Fills the entries of an [`SgTable`] one after the other.
pub(crate) struct SgCursor<'a> {
    next: *mut kernel::bindings::scatterlist,
    _table: core::marker::PhantomData<&'a mut SgTable>,
}

impl SgCursor<'_> {
    fn advance(&mut self) -> Result<*mut kernel::bindings::scatterlist> {
        let sg = self.next;
        if sg.is_null() {
            return Err(code::EINVAL);
        }
        // SAFETY: `sg` is an entry of the table this cursor borrows.
        self.next = unsafe { raw::peermem_sg_next(sg) };
        Ok(sg)
    }

    /// Next entry: DMA address and length only (no page). `EINVAL` past the end.
    pub(crate) fn set_dma(&mut self, addr: u64, len: u32) -> Result {
        let sg = self.advance()?;
        // SAFETY: `sg` is an entry of the borrowed table.
        unsafe { raw::peermem_sg_set_dma(sg, addr, len) };
        Ok(())
    }
}
