// SPDX-License-Identifier: GPL-2.0

//! A client of the peer-memory core (MLNX_OFED/DOCA-OFED's
//! `ib_register_peer_memory_client`, `include/peer_mem_abi.h`). Upstream
//! counterpart: none (OFED's `include/rdma/peer_mem.h`).
//!
//! A client implements [`PeerMemoryClient`]; [`CoreClient::<T>::register`]
//! hands the core a client structure whose callbacks are the generic
//! trampolines of [`OperationsVTable<T>`], which turn the core's raw
//! arguments into borrowed references to `T::Registration` and call `T`.
//! The core keeps one reference to each registration in its
//! `client_context`, from `acquire` to `release`.

use super::device::DmaDevice;
use super::scatterlist::SgView;
use super::{c_char, c_int, c_ulong, c_void, raw, VERSION};
use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use kernel::error::{code, Result};
use kernel::pr_err;
use kernel::sync::{Arc, ArcBorrow};

/// Bytes in the ABI's client name array, NUL included.
pub(crate) const PEER_NAME_CAPACITY: usize = raw::IB_PEER_MEMORY_NAME_MAX as usize;

// The version doubles as the peer-memory client's version string, which
// leaves its last two bytes to the NUL and the extended-client marker.
const _: () = assert!(VERSION.len() <= raw::IB_PEER_MEMORY_VER_MAX as usize - 2);

/// How a client's registrations can be revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalidation {
    /// Not at all: the client pins until the core puts the pages back.
    None,
    /// Through the core's invalidate function, which the client calls; with
    /// `PEER_MEM_INVALIDATE_UNMAPS` the core then never calls `dma_unmap`
    /// or `put_pages` for that mapping: the client undoes it.
    Unmaps,
}

/// The callbacks of a peer-memory client, each called by the core.
pub(crate) trait PeerMemoryClient: Sized + 'static {
    /// What `acquire` claims a range with.
    type Registration: Send + Sync;

    /// How registrations are revoked.
    const INVALIDATION: Invalidation;

    /// The client's slot (one static per client type).
    fn slot() -> &'static ClientSlot;

    /// Is `[addr, addr + size)` this client's memory? If so, claim it.
    fn acquire(addr: u64, size: u64) -> Option<Arc<Self::Registration>>;

    /// The core asks for the pages; `ticket` names the mapping for
    /// [`Ticket::invalidate`] (clients with [`Invalidation::Unmaps`]).
    /// `read_only`: the umem is read-only (the core's `force` argument),
    /// the device will not write.
    fn get_pages(
        reg: ArcBorrow<'_, Self::Registration>,
        addr: u64,
        size: u64,
        read_only: bool,
        ticket: Ticket,
    ) -> Result;

    /// Map the pages for `dev` (`None`: the core gave no device) and
    /// return the table the core hands to the RDMA driver.
    fn dma_map(
        reg: ArcBorrow<'_, Self::Registration>,
        dev: Option<&DmaDevice<'_>>,
    ) -> Result<SgView>;

    /// Undo `dma_map`; `sgl` is the address of the table's first entry
    /// the core hands back (0 if none).
    fn dma_unmap(reg: ArcBorrow<'_, Self::Registration>, sgl: usize);

    /// Give the pages back.
    fn put_pages(reg: ArcBorrow<'_, Self::Registration>);

    /// The page size of the registration's mapping.
    fn page_size(reg: ArcBorrow<'_, Self::Registration>) -> u64;

    /// The core is done with the registration; `reg` is its reference.
    /// Once this returns, no [`Ticket::invalidate`] of the registration
    /// may be running or start.
    fn release(reg: Arc<Self::Registration>);
}

/// One client as the core knows it: the client structure handed to the
/// core, which must stay valid (and unchanged) until unregistration, so it
/// lives in a static, and the registration's state.
pub(crate) struct ClientSlot {
    client: UnsafeCell<raw::peer_memory_client_ex>,
    /// Whether this client is registered (at most once: the slot is static).
    registered: AtomicBool,
    /// The core's registration handle, null while not registered.
    handle: AtomicPtr<c_void>,
    /// The core's invalidate function (as an address), 0 if none.
    invalidate: AtomicUsize,
    /// Set once the handle and the invalidate function are stored:
    /// `acquire` declines everything before (an invalidation may need both).
    ready: AtomicBool,
}

// SAFETY: `client` is written only by `CoreClient::register`, before the
// core has seen it and while this slot is not registered (`registered`);
// afterwards only the core reads it. The rest is atomics.
unsafe impl Sync for ClientSlot {}

/// An empty client structure.
const EMPTY_CLIENT: raw::peer_memory_client_ex = {
    // SAFETY: all-zero bytes are a valid `peer_memory_client_ex` (arrays of
    // integers, integers and `Option`s of function pointers).
    unsafe { core::mem::zeroed() }
};

impl ClientSlot {
    /// An unregistered slot.
    pub(crate) const fn new() -> Self {
        Self {
            client: UnsafeCell::new(EMPTY_CLIENT),
            registered: AtomicBool::new(false),
            handle: AtomicPtr::new(ptr::null_mut()),
            invalidate: AtomicUsize::new(0),
            ready: AtomicBool::new(false),
        }
    }
}

/// Names one mapping of a registration for the core's invalidate (the
/// `core_context` of `get_pages`).
#[derive(Clone, Copy)]
pub(crate) struct Ticket {
    slot: &'static ClientSlot,
    core_context: u64,
}

impl Ticket {
    /// Asks the core to invalidate the mapping (`invalidate_peer_memory`):
    /// the RDMA device stops using it before this returns. `None` if the
    /// client is no longer registered.
    ///
    /// # Safety
    ///
    /// The core has not returned from `release` of the registration this
    /// ticket was given for, and does not until this returns (the core
    /// frees its client once every `release` returned). No lock is held
    /// that `get_pages` or `dma_map` take: the core waits for the umem's
    /// mapping lock, held across those.
    pub(crate) unsafe fn invalidate(&self) -> Option<i32> {
        let f = self.slot.invalidate.load(Ordering::Acquire);
        let handle = self.slot.handle.load(Ordering::Acquire);
        if f == 0 || handle.is_null() {
            return None;
        }
        // SAFETY: `f` is the address of the core's `invalidate_peer_memory`
        // function, stored by `CoreClient::register` from what the core wrote.
        let f: unsafe extern "C" fn(*mut c_void, u64) -> c_int = unsafe { core::mem::transmute(f) };
        // SAFETY: `handle` is the live registration: the registration of
        // this ticket is not released (the caller's guarantee), and
        // unregistration returns only after every `release` returned.
        Some(unsafe { f(handle, self.core_context) })
    }
}

/// A client registered with the core; dropping it unregisters, which
/// sleeps until the core released every registration of the client.
///
/// # Invariants
///
/// While a `CoreClient<T>` exists, `T::slot().client` is registered with
/// the core under the handle in `T::slot().handle`, and
/// `T::slot().registered` is true.
pub(crate) struct CoreClient<T: PeerMemoryClient>(PhantomData<T>);

impl<T: PeerMemoryClient> CoreClient<T> {
    /// Registers the client `name` of `T` with the core: with
    /// [`Invalidation::Unmaps`] an extended client with
    /// `PEER_MEM_INVALIDATE_UNMAPS` that gets the core's invalidate
    /// function, else a plain non-invalidating one. `EBUSY` if `T` is
    /// registered already, `EINVAL` if the core refuses (it logs why) or
    /// the name does not fit.
    pub(crate) fn register(name: &str) -> Result<Self> {
        if name.len() >= PEER_NAME_CAPACITY {
            return Err(code::EINVAL);
        }
        let slot = T::slot();
        if slot.registered.swap(true, Ordering::AcqRel) {
            return Err(code::EBUSY);
        }
        let invalidate = T::INVALIDATION == Invalidation::Unmaps;
        // SAFETY: `registered` was false: the core does not know this
        // client structure and nothing else writes it (see `ClientSlot`).
        let ex = unsafe { &mut *slot.client.get() };
        *ex = EMPTY_CLIENT;
        for (d, s) in ex.client.name.iter_mut().zip(name.bytes()) {
            *d = c_char::from_ne_bytes([s]);
        }
        for (d, s) in ex.client.version.iter_mut().zip(VERSION.bytes()) {
            *d = c_char::from_ne_bytes([s]);
        }
        ex.client.acquire = Some(OperationsVTable::<T>::acquire);
        ex.client.get_pages = Some(OperationsVTable::<T>::get_pages);
        ex.client.dma_map = Some(OperationsVTable::<T>::dma_map);
        ex.client.dma_unmap = Some(OperationsVTable::<T>::dma_unmap);
        ex.client.put_pages = Some(OperationsVTable::<T>::put_pages);
        ex.client.get_page_size = Some(OperationsVTable::<T>::get_page_size);
        ex.client.release = Some(OperationsVTable::<T>::release);
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
            pr_err!("the peer-memory core accepted the invalidating client {} but handed out no invalidate function; this core cannot serve one: load the module with enable_invalidate=0\n", name);
            return Err(code::EINVAL);
        }
        slot.handle.store(handle, Ordering::Release);
        slot.invalidate.store(inval_addr, Ordering::Release);
        slot.ready.store(true, Ordering::Release);
        // INVARIANT: registered under `handle`, stored in the slot.
        Ok(Self(PhantomData))
    }
}

impl<T: PeerMemoryClient> Drop for CoreClient<T> {
    fn drop(&mut self) {
        let slot = T::slot();
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

/// The C callbacks of client `T`: trampolines to `T`'s methods.
///
/// Each has the safety requirement of being called by the peer-memory core
/// only, with the arguments its ABI describes (`include/peer_mem_abi.h`),
/// where a `client_context` is one that `acquire` stored and `release` has
/// not consumed yet: the core's reference keeps the registration alive for
/// the duration of the call.
pub(crate) struct OperationsVTable<T: PeerMemoryClient>(PhantomData<T>);

impl<T: PeerMemoryClient> OperationsVTable<T> {
    /// The registration behind a `client_context`, borrowed for the call.
    ///
    /// # Safety
    ///
    /// `ctx` is a context `acquire` stored and `release` has not consumed.
    unsafe fn borrow<'a>(ctx: *mut c_void) -> ArcBorrow<'a, T::Registration> {
        // SAFETY: `ctx` came from `Arc::into_raw` in `acquire`, and the
        // core's reference it stands for outlives the callback (`'a`).
        unsafe { ArcBorrow::from_raw(ctx.cast_const().cast()) }
    }

    /// # Safety
    ///
    /// See [`OperationsVTable`].
    unsafe extern "C" fn acquire(
        addr: c_ulong,
        size: usize,
        _legacy_private: *mut c_void,
        _legacy_name: *mut c_char,
        client_context: *mut *mut c_void,
    ) -> c_int {
        if client_context.is_null() || !T::slot().ready.load(Ordering::Acquire) {
            return 0;
        }
        #[allow(clippy::useless_conversion)] // c_ulong is u64 before 6.13
        let addr = u64::try_from(addr).unwrap_or(u64::MAX);
        match T::acquire(addr, size as u64) {
            Some(reg) => {
                // SAFETY: the core passes a valid pointer for the context;
                // the reference stored there is given back in `release`.
                unsafe { *client_context = Arc::into_raw(reg).cast_mut().cast() };
                1
            }
            None => 0,
        }
    }

    /// # Safety
    ///
    /// See [`OperationsVTable`].
    unsafe extern "C" fn get_pages(
        addr: c_ulong,
        size: usize,
        _write: c_int,
        force: c_int,
        _legacy_sg: *mut kernel::bindings::sg_table,
        client_context: *mut c_void,
        core_context: u64,
    ) -> c_int {
        // SAFETY: the core passes a context `acquire` stored and has not released it.
        let reg = unsafe { Self::borrow(client_context) };
        #[allow(clippy::useless_conversion)] // c_ulong is u64 before 6.13
        let addr = u64::try_from(addr).unwrap_or(u64::MAX);
        let ticket = Ticket {
            slot: T::slot(),
            core_context,
        };
        match T::get_pages(reg, addr, size as u64, force != 0, ticket) {
            Ok(()) => 0,
            Err(e) => e.to_errno(),
        }
    }

    /// # Safety
    ///
    /// See [`OperationsVTable`].
    unsafe extern "C" fn dma_map(
        sgt: *mut kernel::bindings::sg_table,
        client_context: *mut c_void,
        dma_device: *mut kernel::bindings::device,
        _legacy_dmasync: c_int,
        nmap: *mut c_int,
    ) -> c_int {
        if sgt.is_null() || nmap.is_null() {
            return code::EINVAL.to_errno();
        }
        // SAFETY: as in `get_pages`.
        let reg = unsafe { Self::borrow(client_context) };
        // SAFETY: the core passes its RDMA device's DMA device, live for the
        // umem's lifetime, or NULL.
        let dev = unsafe { DmaDevice::from_raw(dma_device) };
        match T::dma_map(reg, dev.as_ref()) {
            Ok(view) => {
                let view = view.raw();
                // SAFETY: `sgt` and `nmap` are the core's, valid for the call.
                unsafe {
                    *sgt = view;
                    *nmap = view.nents as c_int;
                }
                0
            }
            Err(e) => e.to_errno(),
        }
    }

    /// # Safety
    ///
    /// See [`OperationsVTable`].
    unsafe extern "C" fn dma_unmap(
        sgt: *mut kernel::bindings::sg_table,
        client_context: *mut c_void,
        _dma_device: *mut kernel::bindings::device,
    ) -> c_int {
        // SAFETY: as in `get_pages`.
        let reg = unsafe { Self::borrow(client_context) };
        let sgl = if sgt.is_null() {
            0
        } else {
            // SAFETY: the core's table, valid for the call.
            unsafe { (*sgt).sgl as usize }
        };
        T::dma_unmap(reg, sgl);
        0
    }

    /// # Safety
    ///
    /// See [`OperationsVTable`].
    unsafe extern "C" fn put_pages(
        _sgt: *mut kernel::bindings::sg_table,
        client_context: *mut c_void,
    ) {
        // SAFETY: as in `get_pages`.
        T::put_pages(unsafe { Self::borrow(client_context) });
    }

    /// # Safety
    ///
    /// See [`OperationsVTable`].
    unsafe extern "C" fn get_page_size(client_context: *mut c_void) -> c_ulong {
        // SAFETY: as in `get_pages`.
        let size = T::page_size(unsafe { Self::borrow(client_context) });
        #[allow(clippy::useless_conversion)] // c_ulong is u64 before 6.13
        c_ulong::try_from(size).unwrap_or(0)
    }

    /// # Safety
    ///
    /// See [`OperationsVTable`]; the core releases each context once.
    unsafe extern "C" fn release(client_context: *mut c_void) {
        // SAFETY: the context `acquire` stored with `Arc::into_raw`: this
        // takes that reference back.
        T::release(unsafe { Arc::from_raw(client_context.cast_const().cast()) });
    }
}
