// SPDX-License-Identifier: GPL-2.0

//! gpusim's state: allocations ("device memory"), pins (page tables handed
//! to clients) and DMA mappings, all under one global mutex, `STATE`.
//!
//! Lock order: RM lock (`rm.rs`, with `rm_lock=1`) -> `STATE`, and
//! `mmap_lock` -> `STATE`. `STATE` is never held while calling a client's
//! free callback, while sleeping for the `delay_us` knob, or while calling
//! into the mm (vm_mmap); it is held while mapping and unmapping DMA. The
//! RM lock is held across a whole free (callbacks included), as RM holds
//! its API lock across a cudaFree.
//!
//! Lifetimes: an [`Alloc`] (the backing memory) is reference counted. The
//! allocation table holds one reference until the user frees it; the CPU
//! mapping (vma) holds one; every pin holds one. The memory goes back to the
//! page allocator when the last one is dropped, so no page a client or the
//! CPU can still reach is ever freed.

use crate::abi::*;
use crate::bar1::{self, Bar1};
use crate::branch::Branch;
use crate::glue::{self, Chunk};
use crate::knobs::{self, *};
use crate::rm::{self, RmGuard};
use core::ptr;
use kernel::bindings;
use kernel::ffi::{c_int, c_void};
use kernel::prelude::*;
use kernel::sync::atomic::Relaxed;
use kernel::sync::{global_lock, Arc};

/// The UUID every gpusim page table reports (`gpu_uuid`).
const GPU_UUID: [u8; GPU_UUID_LEN] = *b"gpusim-emulated\0";

/// Allocated host memory emulating one cudaMalloc'd range.
///
/// # Invariants
///
/// `_chunks` cover `size` bytes: every chunk but the last is `chunk_bytes`
/// long; `chunk_phys[i] == _chunks[i].phys`. Immutable after creation.
pub(crate) struct Alloc {
    pub(crate) handle: u64,
    pub(crate) size: usize,
    pub(crate) chunk_bytes: usize,
    pub(crate) chunk_phys: KVec<u64>,
    /// The memory itself, owned: returned to the page allocator on drop.
    _chunks: KVec<Chunk>,
    /// The address space it was allocated in (identity only; holding the
    /// reference keeps the pointer from being reused by another process).
    mm: glue::MmRef,
}

impl Alloc {
    /// Host physical address of byte `off` of the allocation.
    fn phys_at(&self, off: usize) -> u64 {
        self.chunk_phys[off / self.chunk_bytes] + (off % self.chunk_bytes) as u64
    }

    fn in_mm(&self, mm: usize) -> bool {
        self.mm.id() == mm
    }
}

impl Drop for Alloc {
    fn drop(&mut self) {
        knobs::dec(&LIVE_MEM_BYTES, self.size as u64);
        // `_chunks` go back to the page allocator as the fields drop.
    }
}

/// Allocates `size` bytes in chunks of `chunk` bytes such that no chunk
/// starts where the previous one ends: an ideal scatter-list coalescer
/// then sees exactly `ceil(size / chunk)` physically contiguous runs.
fn alloc_chunks(size: usize, chunk: usize) -> Result<KVec<Chunk>> {
    let n = size.div_ceil(chunk);
    let mut chunks = KVec::with_capacity(n, GFP_KERNEL)?;
    // Blocks that happened to be adjacent to their predecessor; held until
    // the end so the allocator hands out others, then returned.
    let mut spacers = KVec::new();
    for i in 0..n {
        let bytes = chunk.min(size - i * chunk);
        let mut tries = 0;
        loop {
            let c = Chunk::alloc(bytes)?;
            let adjacent = match chunks.last() {
                Some(prev) => {
                    let prev: &Chunk = prev;
                    prev.phys + chunk as u64 == c.phys
                }
                None => false,
            };
            if adjacent && tries < 16 {
                tries += 1;
                spacers.push(c, GFP_KERNEL)?;
                continue;
            }
            chunks.push(c, GFP_KERNEL)?;
            break;
        }
    }
    drop(spacers);
    Ok(chunks)
}

/// One allocation in the allocation table.
pub(crate) struct AllocEntry {
    pub(crate) alloc: Arc<Alloc>,
    /// The open file it belongs to.
    file_id: u64,
    /// Its current virtual address, 0 if not mapped (yet, or any more).
    va: usize,
    /// Identity of the vma mapping it, 0 if none.
    vma: usize,
    /// Set between GPUSIM_IOC_ALLOC and its own mmap of the allocation:
    /// only then does the mmap handler accept it.
    map_pending: bool,
}

impl AllocEntry {
    fn contains(&self, mm: usize, va: u64) -> bool {
        self.va != 0
            && self.alloc.in_mm(mm)
            && va >= self.va as u64
            && va < self.va as u64 + self.alloc.size as u64
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PinState {
    /// Handed out, usable.
    Live,
    /// Its allocation is being freed: the free callback is running or
    /// about to. put_pages refuses it; gpusim frees it after the callback.
    Callback,
}

/// The page table structure handed to a client, allocated with exactly the
/// size of its version's layout: 32 bytes for version 1.2, 40 for 2.0. A
/// client that reads `flags` of a version-1.2 table reads past the end of
/// the allocation, which KASAN reports (on a real 550 or 570 driver that
/// read is just as wrong).
enum PageTable {
    V1(KBox<NvP2pPageTable>),
    V2(KBox<NvP2pPageTableV2>),
}

impl PageTable {
    /// A table of `branch`'s version with `flags` (kept only in a version-2
    /// table); its pointers are set by the caller.
    fn new(branch: Branch, entries: u32, flags: u32) -> Result<Self> {
        let base = |version| NvP2pPageTable {
            version,
            page_size: PAGE_SIZE_64KB,
            pages: ptr::null_mut(),
            entries,
            gpu_uuid: ptr::null_mut(),
        };
        Ok(if branch.page_table_v2() {
            Self::V2(KBox::new(
                NvP2pPageTableV2 {
                    v1: base(PAGE_TABLE_VERSION_V2),
                    flags,
                },
                GFP_KERNEL,
            )?)
        } else {
            Self::V1(KBox::new(base(PAGE_TABLE_VERSION_V1), GFP_KERNEL)?)
        })
    }

    /// The fields both versions share (the first 32 bytes).
    fn base(&self) -> &NvP2pPageTable {
        match self {
            Self::V1(t) => t,
            Self::V2(t) => &t.v1,
        }
    }

    fn base_mut(&mut self) -> &mut NvP2pPageTable {
        match self {
            Self::V1(t) => t,
            Self::V2(t) => &mut t.v1,
        }
    }

    /// The pointer handed to the client: the start of the allocation.
    fn as_mut_ptr(&mut self) -> *mut NvP2pPageTable {
        ptr::from_mut(self.base_mut())
    }
}

/// A page table handed to a client, and everything it owns.
///
/// # Invariants
///
/// `pt.pages` points to `page_ptrs`, whose entries point to the elements
/// of `pages`; `pt.gpu_uuid` points to `uuid`. All live in this (boxed,
/// never moved) object, or in `pt`'s own allocation, and are never
/// resized. Every `pages` address lies inside `alloc`.
pub(crate) struct PinObj {
    pt: PageTable,
    pages: KVec<NvP2pPage>,
    page_ptrs: KVec<*mut NvP2pPage>,
    uuid: [u8; GPU_UUID_LEN],
    alloc: Arc<Alloc>,
    va: u64,
    persistent: bool,
    /// The process that pinned it (`current->tgid`): the only one whose
    /// non-persistent put finds it.
    tgid: c_int,
    /// Pinned with NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING (570+, coherent GPU
    /// only): nvidia_p2p_dma_map_pages refuses it.
    force_bar1: bool,
    callback: FreeCallback,
    data: *mut c_void,
    state: PinState,
    dmas: KVec<KBox<DmaObj>>,
    /// Its BAR1 mapping, given back when it leaves the table
    /// ([`State::take_pin`]).
    bar1: Option<bar1::Mapping>,
}

// SAFETY: The raw pointers point into the object itself (see the type
// invariants) or are the client's opaque `data`, which gpusim only passes
// back to the client's callback; nothing is tied to a thread.
unsafe impl Send for PinObj {}

impl PinObj {
    /// The address handed to the client: the identity of the pin.
    fn key(&self) -> usize {
        ptr::from_ref(self.pt.base()) as usize
    }
}

impl Drop for PinObj {
    fn drop(&mut self) {
        if !self.dmas.is_empty() {
            DMA_REAPED.add(self.dmas.len() as u64, Relaxed);
        }
        knobs::dec(&LIVE_PINS, 1);
        if self.persistent {
            knobs::dec(&LIVE_PERSISTENT_PINS, 1);
        }
        // `dmas` are unmapped, then `alloc` released, as the fields drop.
    }
}

/// A DMA mapping handed to a client.
///
/// # Invariants
///
/// Each of `addrs` is a live streaming mapping of one 64 KiB page for
/// `pdev`; `m.dma_addresses` points to `addrs` once published.
pub(crate) struct DmaObj {
    m: NvP2pDmaMapping,
    addrs: KVec<u64>,
    pdev: *mut bindings::pci_dev,
}

// SAFETY: `pdev` is only passed to the DMA API, which may be called from
// any thread; the other pointers point into the object itself.
unsafe impl Send for DmaObj {}

impl DmaObj {
    fn key(&self) -> usize {
        ptr::from_ref(&self.m) as usize
    }
}

impl Drop for DmaObj {
    fn drop(&mut self) {
        for &a in self.addrs.iter() {
            // SAFETY: By the type invariant, `a` is a live mapping of one
            // GPU page for `pdev`, unmapped exactly once, here.
            unsafe { glue::dma_unmap(self.pdev, a, GPU_PAGE as usize) };
        }
        knobs::dec(&LIVE_DMA_MAPPINGS, 1);
    }
}

/// Everything `STATE` protects.
pub(crate) struct State {
    allocs: KVec<AllocEntry>,
    pins: KVec<KBox<PinObj>>,
    bar1: Bar1,
    next_handle: u64,
    /// The registered rsync driver (identity), 0 if none.
    pub(crate) rsync: usize,
}

impl State {
    const fn new() -> Self {
        Self {
            allocs: KVec::new(),
            pins: KVec::new(),
            bar1: Bar1::new(),
            next_handle: 1,
            rsync: 0,
        }
    }

    fn alloc_idx(&self, file_id: u64, handle: u64) -> Option<usize> {
        self.allocs
            .iter()
            .position(|e| e.file_id == file_id && e.alloc.handle == handle)
    }

    fn pin_idx(&self, key: usize) -> Option<usize> {
        self.pins.iter().position(|p| p.key() == key)
    }

    /// Takes pin `i` out of the table, its BAR1 mapping given back (the
    /// page table itself is freed when the caller drops it).
    fn take_pin(&mut self, i: usize) -> Option<KBox<PinObj>> {
        let mut pin = self.pins.remove(i).ok()?;
        if let Some(m) = pin.bar1.take() {
            self.bar1.unmap(&m);
        }
        Some(pin)
    }
}

global_lock! {
    // SAFETY: Initialized in module init (`init()`), before any use.
    pub(crate) unsafe(uninit) static STATE: Mutex<State> = State::new();
}

/// Initializes `STATE`.
///
/// # Safety
///
/// Must be called exactly once, from module init, before anything else.
pub(crate) unsafe fn init() {
    // SAFETY: Guaranteed by the caller.
    unsafe { STATE.init() };
}

/// Frees whatever clients leaked by the time the module unloads.
pub(crate) fn teardown() {
    let (allocs, pins) = {
        let mut st = STATE.lock();
        let mut pins = KVec::new();
        while let Some(p) = st.take_pin(0) {
            // Room for all was there: the table held them.
            if pins.push(p, GFP_ATOMIC).is_err() {
                break;
            }
        }
        // The tables' own buffers too: `STATE` is never dropped.
        drop(core::mem::take(&mut st.pins));
        st.bar1 = Bar1::new();
        (core::mem::take(&mut st.allocs), pins)
    };
    if !pins.is_empty() {
        pr_warn!(
            "unloading with {} page table(s) still pinned: a client did not call \
             nvidia_p2p_put_pages*(); freeing them\n",
            pins.len()
        );
    }
    knobs::dec(&LIVE_ALLOCS, allocs.len() as u64);
    drop(pins);
    drop(allocs);
}

/// The current process's address space (identity), or EINVAL for a kernel
/// thread.
fn current_mm() -> Result<usize> {
    glue::current_mm_id()
}

/// Contiguity for a new allocation of `size` bytes (from `contig_bytes`).
fn chunk_for(size: usize) -> usize {
    let max = glue::max_chunk_bytes();
    let want = match CONTIG_BYTES.load(Relaxed) as usize {
        0 => size,
        c => c,
    };
    want.min(size).min(max)
}

/// Creates an allocation of `size` bytes (a multiple of 64 KiB) for the
/// open file `file_id`, waiting to be mapped. Returns (handle, chunk bytes).
pub(crate) fn alloc(file_id: u64, size: usize) -> Result<(u64, usize)> {
    let mm = glue::MmRef::current()?;
    let chunk = chunk_for(size);
    let chunks = alloc_chunks(size, chunk)?;
    let mut chunk_phys = KVec::with_capacity(chunks.len(), GFP_KERNEL)?;
    for c in chunks.iter() {
        chunk_phys.push(c.phys, GFP_KERNEL)?;
    }
    let mut st = STATE.lock();
    let handle = st.next_handle;
    // Counted before the `Alloc` exists: from here on, dropping it (even
    // inside a failed `Arc::new`) uncounts it.
    LIVE_MEM_BYTES.add(size as u64, Relaxed);
    // INVARIANT: `alloc_chunks` returned chunks covering `size` in units
    // of `chunk`, and `chunk_phys` mirrors them.
    let alloc = Arc::new(
        Alloc {
            handle,
            size,
            chunk_bytes: chunk,
            chunk_phys,
            _chunks: chunks,
            mm,
        },
        GFP_KERNEL,
    )?;
    st.allocs.push(
        AllocEntry {
            alloc,
            file_id,
            va: 0,
            vma: 0,
            map_pending: true,
        },
        GFP_KERNEL,
    )?;
    st.next_handle += 1;
    LIVE_ALLOCS.add(1, Relaxed);
    Ok((handle, chunk))
}

/// The mmap handler's part: claims allocation `handle` of `file_id` for
/// the vma `vma` being created at `start` with `len` bytes. Only the mmap
/// GPUSIM_IOC_ALLOC itself issues is accepted.
pub(crate) fn mmap_claim(
    file_id: u64,
    handle: u64,
    vma: usize,
    start: usize,
    len: usize,
) -> Result<Arc<Alloc>> {
    let mm = current_mm()?;
    let mut st = STATE.lock();
    let i = st.alloc_idx(file_id, handle).ok_or(EINVAL)?;
    let e = &mut st.allocs[i];
    if !e.map_pending || e.alloc.size != len || !e.alloc.in_mm(mm) {
        return Err(EINVAL);
    }
    e.map_pending = false;
    e.va = start;
    e.vma = vma;
    Ok(e.alloc.clone())
}

/// Undoes [`mmap_claim`] when installing the mapping failed.
pub(crate) fn mmap_unclaim(alloc: &Alloc, vma: usize) {
    let mut st = STATE.lock();
    if let Some(e) = st
        .allocs
        .iter_mut()
        .find(|e| e.alloc.handle == alloc.handle)
    {
        if e.vma == vma {
            e.va = 0;
            e.vma = 0;
        }
    }
}

/// The mapping `vma` of `alloc` went away (munmap, exit): the allocation
/// stays, but its address no longer resolves for get_pages.
pub(crate) fn vma_closed(alloc: &Alloc, vma: usize) {
    let mut st = STATE.lock();
    if let Some(e) = st
        .allocs
        .iter_mut()
        .find(|e| e.alloc.handle == alloc.handle)
    {
        if e.vma == vma {
            e.va = 0;
            e.vma = 0;
        }
    }
}

/// mremap() moved the mapping of `alloc` to `vma` at `start`.
pub(crate) fn vma_moved(alloc: &Alloc, vma: usize, start: usize) {
    let mut st = STATE.lock();
    if let Some(e) = st
        .allocs
        .iter_mut()
        .find(|e| e.alloc.handle == alloc.handle)
    {
        if e.vma != 0 {
            e.va = start;
            e.vma = vma;
        }
    }
}

/// Address and size of a live allocation of `file_id`, and its pin count.
pub(crate) fn info(file_id: u64, handle: u64) -> Result<(usize, usize, usize, usize)> {
    let st = STATE.lock();
    let e = &st.allocs[st.alloc_idx(file_id, handle).ok_or(ENOENT)?];
    let pins = st
        .pins
        .iter()
        .filter(|p| Arc::ptr_eq(&p.alloc, &e.alloc))
        .count();
    Ok((e.va, e.alloc.size, e.alloc.chunk_bytes, pins))
}

/// Frees allocation `handle` of `file_id` (GPUSIM_IOC_FREE). Like RM's
/// free, under the RM lock, callbacks included.
pub(crate) fn free(file_id: u64, handle: u64) -> Result {
    let _rm = rm::acquire("GPUSIM_IOC_FREE")?;
    let alloc = {
        let mut st = STATE.lock();
        let i = st.alloc_idx(file_id, handle).ok_or(ENOENT)?;
        st.allocs.remove(i).map_err(|_| ENOENT)?.alloc
    };
    retire(alloc);
    Ok(())
}

/// Frees every allocation of `file_id` (the file is being released: close
/// or process exit).
pub(crate) fn release_file(file_id: u64) {
    free_where("release of /dev/gpusim", |id| id == file_id);
}

/// Frees every allocation whose file id `pred` accepts, one RM free (and
/// lock hold) per allocation, callbacks included.
pub(crate) fn free_where(what: &'static str, pred: impl Fn(u64) -> bool) {
    loop {
        let Ok(_rm) = rm::acquire(what) else {
            return;
        };
        let alloc = {
            let mut st = STATE.lock();
            let Some(i) = st.allocs.iter().position(|e| pred(e.file_id)) else {
                return;
            };
            match st.allocs.remove(i) {
                Ok(e) => e.alloc,
                Err(_) => return,
            }
        };
        retire(alloc);
    }
}

/// An allocation was just removed from the table: call the free callback
/// of every non-persistent pin on it, one at a time, waiting for each to
/// return, then free that page table (and any DMA mapping the client left).
/// The memory goes when the last reference (vma, persistent pin) drops.
fn retire(alloc: Arc<Alloc>) {
    knobs::dec(&LIVE_ALLOCS, 1);
    loop {
        let (key, callback, data) = {
            let mut st = STATE.lock();
            let Some(p) = st.pins.iter_mut().find(|p| {
                Arc::ptr_eq(&p.alloc, &alloc) && !p.persistent && p.state == PinState::Live
            }) else {
                break;
            };
            p.state = PinState::Callback;
            (p.key(), p.callback, p.data)
        };
        knobs::delay();
        if let Some(f) = callback {
            // SAFETY: `f` and `data` were given to nvidia_p2p_get_pages by
            // the client, whose contract is that `f(data)` may be called
            // until the pages are put; they were not put (state Live).
            unsafe { f(data) };
        }
        FREE_CALLBACKS.add(1, Relaxed);
        let pin = {
            let mut st = STATE.lock();
            st.pin_idx(key).and_then(|i| st.take_pin(i))
        };
        // Unmaps leftover DMA mappings and frees the page table.
        drop(pin);
    }
    drop(alloc);
}

/// Whether `len` bytes at `va` are a valid pin request shape.
fn check_range(va: u64, len: u64) -> Result<usize> {
    if len == 0 || va % GPU_PAGE != 0 || len % GPU_PAGE != 0 {
        return Err(EINVAL);
    }
    va.checked_add(len).ok_or(EINVAL)?;
    let entries = len / GPU_PAGE;
    if entries > u64::from(u32::MAX) {
        return Err(EINVAL);
    }
    Ok(entries as usize)
}

/// How a pin was asked for.
#[derive(Clone, Copy)]
pub(crate) enum PinKind {
    /// nvidia_p2p_get_pages: with a free callback.
    Callback,
    /// nvidia_p2p_get_pages_persistent; `force_bar1` is its
    /// NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING bit (570+).
    Persistent { force_bar1: bool },
}

/// nvidia_p2p_get_pages / _persistent: pins `len` bytes at `va` of the
/// calling process. Returns the page table to hand out.
pub(crate) fn get_pages(
    va: u64,
    len: u64,
    kind: PinKind,
    callback: FreeCallback,
    data: *mut c_void,
) -> Result<*mut NvP2pPageTable> {
    let branch = Branch::current();
    // Every branch: the range must be 64 KiB aligned (-EINVAL). The drivers
    // check it from 555.42.02 on (nv-p2p.c nv_p2p_get_pages); the 550 driver
    // has no such check, and gpusim refuses it there too (stricter; see
    // docs/gpusim.md).
    let entries = check_range(va, len)?;
    let mm = current_mm()?;
    let (persistent, force_bar1) = match kind {
        PinKind::Callback => (false, false),
        PinKind::Persistent { force_bar1 } => (true, force_bar1),
    };
    let coherent = CPU_CACHEABLE.load(Relaxed) == 1;
    // CPU_CACHEABLE (version-2 tables only): set for the pins of a coherent
    // GPU, except a FORCE_BAR1 one, which goes through BAR1 (RM's BAR1 path
    // reports it not cacheable).
    let flags = if branch.page_table_v2() && coherent && !force_bar1 {
        PAGE_TABLE_FLAGS_CPU_CACHEABLE
    } else {
        0
    };
    // Allocate outside the lock what does not depend on the allocation.
    let mut pages = KVec::with_capacity(entries, GFP_KERNEL)?;
    let mut page_ptrs = KVec::with_capacity(entries, GFP_KERNEL)?;
    let table = PageTable::new(branch, entries as u32, flags)?;

    let mut st = STATE.lock();
    let (base, alloc) = {
        let e = st
            .allocs
            .iter()
            .find(|e| e.contains(mm, va))
            .ok_or(EINVAL)?;
        (e.va as u64, e.alloc.clone())
    };
    // A range running past the allocation (into a neighbour or a hole) is
    // refused, as the real driver refuses ranges crossing allocations.
    if va + len > base + alloc.size as u64 {
        return Err(EINVAL);
    }
    // RM (RmP2PGetPagesPersistent, 570.86.15+) refuses FORCE_BAR1 on a GPU
    // without a coherent CPU mapping (every x86 system): NOT_SUPPORTED, which
    // nv-p2p.c maps to -ENOTSUPP. Only once the address was found, as there.
    if force_bar1 && !coherent {
        return Err(ENOTSUPP);
    }
    let off = (va - base) as usize;
    for i in 0..entries {
        pages.push(
            NvP2pPage {
                physical_address: alloc.phys_at(off + i * GPU_PAGE as usize),
                registers: [0; 6],
            },
            GFP_KERNEL,
        )?;
    }
    LIVE_PINS.add(1, Relaxed);
    if persistent {
        LIVE_PERSISTENT_PINS.add(1, Relaxed);
    }
    // From here on, dropping `pin` undoes the counters (PinObj::drop).
    let mut pin = KBox::new(
        PinObj {
            pt: table,
            pages,
            page_ptrs: KVec::new(),
            uuid: GPU_UUID,
            alloc,
            va,
            persistent,
            tgid: glue::current_tgid(),
            force_bar1,
            callback,
            data,
            state: PinState::Live,
            dmas: KVec::new(),
            bar1: None,
        },
        GFP_KERNEL,
    )?;
    for p in pin.pages.iter_mut() {
        page_ptrs.push(ptr::from_mut(p), GFP_KERNEL)?;
    }
    pin.page_ptrs = page_ptrs;
    // INVARIANT: the pointers go into this boxed object, whose vectors are
    // complete and never resized again.
    let pages_ptr = pin.page_ptrs.as_mut_ptr();
    let uuid_ptr = pin.uuid.as_mut_ptr();
    let base = pin.pt.base_mut();
    base.pages = pages_ptr;
    base.gpu_uuid = uuid_ptr;
    let pt = pin.pt.as_mut_ptr();
    // BAR1 last (nothing after it can fail but the push, which undoes it):
    // the pinning process's client, or RM's internal one for a persistent
    // pin (`bar1.rs`). No room: -ENOMEM, as RM's
    // NV_ERR_INSUFFICIENT_RESOURCES.
    let client = if persistent {
        bar1::Client::Internal
    } else {
        bar1::Client::Process(pin.tgid)
    };
    let handle = pin.alloc.handle;
    st.pins.reserve(1, GFP_KERNEL)?;
    pin.bar1 = Some(st.bar1.map(client, handle, off as u64, len)?);
    // Within the capacity reserved above: does not fail.
    st.pins.push(pin, GFP_KERNEL)?;
    PAGES_PINNED.add(entries as u64, Relaxed);
    Ok(pt)
}

/// The return value for a call on an object that is already gone.
fn stale() -> c_int {
    STALE_CALLS.add(1, Relaxed);
    match STALE_ERRNO.load(Relaxed) {
        0 => 0,
        _ => -knobs::errno_of(&STALE_ERRNO, 22),
    }
}

/// nvidia_p2p_put_pages / _persistent on page table `key`, called with the
/// RM lock `rm`, which is released before the page table (and any DMA
/// mapping left on it) is freed, as in the real driver.
///
/// A non-persistent put is looked up among the calling process's pins
/// only, as RM does (`RmP2PPutPages` → `RmP2PGetInfoWithoutToken`, which
/// searches the third-party P2P objects of `osGetCurrentProcess()`, i.e.
/// `current->tgid`; src/nvidia/src/kernel/gpu/bus/p2p.c): from any other
/// process or a kernel thread the lookup fails with
/// `NV_ERR_OBJECT_NOT_FOUND`, which `nv_p2p_put_pages`
/// (kernel-open/nvidia/nv-p2p.c) answers with 0 for a non-persistent
/// table, unpinning nothing: the pin, its memory and its free callback
/// stay. Persistent puts go through the table itself
/// (`rm_p2p_put_pages_persistent` with `mem_info->private`) and work from
/// anywhere.
pub(crate) fn put_pages(va: u64, key: usize, persistent: bool, rm: RmGuard) -> c_int {
    let pin = {
        let mut st = STATE.lock();
        let Some(i) = st.pin_idx(key) else {
            return stale();
        };
        let p = &st.pins[i];
        if !persistent && p.tgid != glue::current_tgid() {
            FOREIGN_PUTS.add(1, Relaxed);
            return 0;
        }
        if p.persistent != persistent || p.va != va {
            return EINVAL.to_errno();
        }
        if p.state == PinState::Callback {
            return stale();
        }
        match st.take_pin(i) {
            Some(p) => p,
            None => return stale(),
        }
    };
    drop(rm);
    drop(pin);
    0
}

/// nvidia_p2p_dma_map_pages: maps page table `key` for `pdev`. `pdev` is
/// checked against the PCI bus's devices before it is used: NULL, or a
/// pointer that is no PCI device of this system (`to_pci_dev(NULL)`, a
/// stale or made-up one), or one without a DMA mask, is `EINVAL`.
///
/// # Safety
///
/// If `pdev` is a PCI device of this system, the caller keeps it alive
/// until the mapping is unmapped (a client holds a reference to its HCA).
pub(crate) unsafe fn dma_map(
    pdev: *mut bindings::pci_dev,
    key: usize,
) -> Result<*mut NvP2pDmaMapping> {
    // A FORCE_BAR1 table is refused before anything else is looked at
    // (nv-p2p.c nvidia_p2p_dma_map_pages, 570.86.15+: only CPU mappings of
    // such a pin are supported): -ENOTSUPP.
    {
        let st = STATE.lock();
        if let Some(i) = st.pin_idx(key) {
            if st.pins[i].force_bar1 {
                return Err(ENOTSUPP);
            }
        }
    }
    if !glue::pci_dma_peer_ok(pdev) {
        return Err(EINVAL);
    }
    let mut st = STATE.lock();
    let i = st.pin_idx(key).ok_or(EINVAL)?;
    let pin = &mut st.pins[i];
    // A page table whose free callback is pending or running is mapped like
    // a live one, as NVIDIA's driver does: its nvidia_p2p_dma_map_pages
    // checks nothing of the sort (nv-p2p.c), and the page table stays
    // allocated until the callback has returned; the mapping joins the
    // table's list and is unmapped with it after the callback (`retire`).
    // A client that maps in that window and is not told by its callback
    // keeps an MR on freed memory: the rig must let it happen.
    let n = pin.pages.len();
    LIVE_DMA_MAPPINGS.add(1, Relaxed);
    // From here on, dropping `d` unmaps what it holds and undoes the count.
    let mut d = KBox::new(
        DmaObj {
            m: NvP2pDmaMapping {
                version: DMA_MAPPING_VERSION,
                page_size_type: pin.pt.base().page_size,
                entries: n as u32,
                dma_addresses: ptr::null_mut(),
                private: ptr::null_mut(),
                pci_dev: pdev,
            },
            addrs: KVec::new(),
            pdev,
        },
        GFP_KERNEL,
    )?;
    d.addrs.reserve(n, GFP_KERNEL)?;
    for page in pin.pages.iter() {
        // SAFETY: `pdev` is live and DMA capable; the page belongs to
        // `pin.alloc`, which outlives the mapping (the mapping is owned by
        // the pin, which owns a reference to the allocation).
        let a = unsafe { glue::dma_map(pdev, page.physical_address, GPU_PAGE as usize) }?;
        // INVARIANT: `a` is a live mapping of one GPU page for `pdev`.
        d.addrs.push(a, GFP_KERNEL)?;
    }
    // Bus-contiguous runs of this mapping (counted once it is handed out).
    let runs = d
        .addrs
        .windows(2)
        .filter(|w| w[1] != w[0].wrapping_add(GPU_PAGE))
        .count()
        + usize::from(n > 0);
    d.m.dma_addresses = d.addrs.as_mut_ptr();
    let m = ptr::from_mut(&mut d.m);
    pin.dmas.push(d, GFP_KERNEL)?;
    PAGES_DMA_MAPPED.add(n as u64, Relaxed);
    DMA_RUNS_MAPPED.add(runs as u64, Relaxed);
    Ok(m)
}

/// nvidia_p2p_dma_unmap_pages: unmaps mapping `mkey` of page table `key`.
pub(crate) fn dma_unmap(pdev: *mut bindings::pci_dev, key: usize, mkey: usize) -> c_int {
    let d = {
        let mut st = STATE.lock();
        let Some(i) = st.pin_idx(key) else {
            return stale();
        };
        let pin = &mut st.pins[i];
        let Some(j) = pin.dmas.iter().position(|d| d.key() == mkey) else {
            return stale();
        };
        if pin.dmas[j].pdev != pdev {
            return EINVAL.to_errno();
        }
        match pin.dmas.remove(j) {
            Ok(d) => d,
            Err(_) => return stale(),
        }
    };
    drop(d);
    0
}
