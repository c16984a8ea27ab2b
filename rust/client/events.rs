// SPDX-License-Identifier: GPL-2.0

//! Revocation events (`/dev/peermem`, `include/uapi/peermem.h`,
//! `docs/module.md` "Revocation events"): a process that opens the device
//! learns which of its own registrations peermem revoked and why, through
//! a generation counter on a read-only page and a queue of records.
//!
//! # Who sees what
//!
//! An open file is a [`Watcher`] bound to the opener's address space (an
//! [`MmRef`]); a registration remembers the address space that made it
//! ([`Tag`]). A revocation goes to every watcher of that address space and
//! to no other; `read` and `mmap` from any other address space fail with
//! `EPERM` (a forked child, a process the file was passed to, the opener
//! after `execve`; `poll` there reports readable, so `read` says why). Both hold `mmgrab` references, so an address
//! space's key cannot be reused by another while either exists.
//!
//! # When and in which order
//!
//! A registration is reported once ([`Tag`]): from the core's `get_pages`
//! (the core holds a ticket: the registration is or is about to be an MR)
//! until `put_pages`/`release`. The report happens where peermem decides
//! to revoke, before the core's invalidate is called: in the GPU driver's
//! free callback, and for an unmap or a move in the mmu notifier itself,
//! synchronously in the unmapping thread (the invalidation follows in a
//! work item), so the counter has moved when `munmap`/`mremap` returns.
//! Under the one event lock the record is queued first, then the counter
//! stored (release), then readers woken: a reader that sees generation G
//! finds the record of generation G in the queue.
//!
//! # Contexts
//!
//! The notifier may be called where it must not sleep and the free
//! callback may hold the GPU driver's locks: a report takes only the event
//! spinlock (never held across anything else, and never taken by
//! `get_pages`/`dma_map`), allocates nothing (the queue is allocated at
//! open) and wakes the readers. With no file open it is one atomic load.

use super::Kind;
use crate::kapi::global_lock::EventsLocked;
use crate::kapi::miscdev::{MiscDevice, MiscDeviceRegistration, UserWriter, Vma, WaitQueue};
use crate::kapi::mm::{MmRef, SharedPage};
use crate::kapi::mmu_notifier::Unmapping;
use crate::kapi::{module_param, uapi};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;

/// Why a registration was revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The GPU memory was freed (the driver's free callback).
    GpuFree,
    /// The process unmapped the range (munmap, mmap(MAP_FIXED) over it).
    Unmap,
    /// The process moved the range (mremap).
    Move,
    /// The process is exiting (PFN registrations; never delivered).
    Exit,
    /// The driver that mapped a PFN range zapped it.
    Driver,
    /// The process changed a PFN range's protection (mprotect).
    Protect,
}

impl From<Unmapping> for Cause {
    fn from(how: Unmapping) -> Self {
        match how {
            Unmapping::Unmapped => Cause::Unmap,
            Unmapping::Moved => Cause::Move,
            Unmapping::Exiting => Cause::Exit,
            Unmapping::Protected => Cause::Protect,
            Unmapping::Zapped => Cause::Driver,
        }
    }
}

/// Fewest and most records a queue may hold (`event_queue_len`).
pub(crate) const QUEUE_LEN_MIN: u32 = 2;
pub(crate) const QUEUE_LEN_MAX: u32 = 65536;

/// Whether the device exists (registrations then remember their address space).
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Open files: with none, a report is this one load.
static OPEN: AtomicU32 = AtomicU32::new(0);
/// Records per queue (`event_queue_len`, checked at load).
static QUEUE_LEN: AtomicU32 = AtomicU32::new(256);

/// The open files and their queues.
static SLOTS: EventsLocked<KVec<Option<Slot>>> = EventsLocked::new(KVec::new());

/// One record of the queue.
#[derive(Clone, Copy)]
struct Record {
    generation: u64,
    start: u64,
    length: u64,
    cause: u32,
    /// The client that held the registration (`None`: an overflow record).
    client: Option<Kind>,
}

impl Record {
    const EMPTY: Record = Record {
        generation: 0,
        start: 0,
        length: 0,
        cause: 0,
        client: None,
    };

    /// The record as `struct peermem_event`.
    fn encode(&self) -> [u8; uapi::EVENT_SIZE] {
        use uapi::event as off;
        let mut b = [0u8; uapi::EVENT_SIZE];
        b[off::GENERATION..off::GENERATION + 8].copy_from_slice(&self.generation.to_ne_bytes());
        b[off::START..off::START + 8].copy_from_slice(&self.start.to_ne_bytes());
        b[off::LENGTH..off::LENGTH + 8].copy_from_slice(&self.length.to_ne_bytes());
        b[off::CAUSE..off::CAUSE + 4].copy_from_slice(&self.cause.to_ne_bytes());
        b[off::FLAGS..off::FLAGS + 4].copy_from_slice(&0u32.to_ne_bytes());
        if let Some(kind) = self.client {
            // The core's names: peer_name, and peer_name + "_nc" (at most
            // 63 bytes, checked at load); a NUL always stays.
            let name = module_param::peer_name();
            let suffix: &[u8] = match kind {
                Kind::Invalidating => b"",
                Kind::Persistent => super::params::NC_SUFFIX.as_bytes(),
            };
            let dst = &mut b[off::CLIENT..off::CLIENT + uapi::CLIENT_NAME_LEN - 1];
            for (d, s) in dst
                .iter_mut()
                .zip(Iterator::chain(name.iter(), suffix.iter()))
            {
                *d = *s;
            }
        }
        b
    }
}

/// A bounded queue of records; when full, one overflow record takes the
/// place of every record that does not fit, until it is read.
struct Ring {
    buf: KVec<Record>,
    head: usize,
    len: usize,
    /// Generation of the last revocation of this file's address space.
    generation: u64,
    /// Records were dropped; the generation of the last one.
    overflow: Option<u64>,
}

impl Ring {
    fn push(&mut self, rec: Record) {
        let cap = self.buf.len();
        if self.overflow.is_some() || self.len == cap {
            // Everything from here on is covered by the overflow record,
            // which comes after what is queued.
            self.overflow = Some(rec.generation);
            return;
        }
        self.buf[(self.head + self.len) % cap] = rec;
        self.len += 1;
    }

    fn pop(&mut self) -> Option<Record> {
        if self.len > 0 {
            let rec = self.buf[self.head];
            self.head = (self.head + 1) % self.buf.len();
            self.len -= 1;
            return Some(rec);
        }
        self.overflow.take().map(|generation| Record {
            generation,
            cause: uapi::cause::OVERFLOW,
            ..Record::EMPTY
        })
    }

    fn readable(&self) -> bool {
        self.len > 0 || self.overflow.is_some()
    }

    /// A popped record could not be delivered: the reader must flush.
    fn lost(&mut self, generation: u64) {
        let g = self.overflow.map_or(generation, |o| o.max(generation));
        self.overflow = Some(g);
    }
}

/// An open file's queue, in [`SLOTS`].
struct Slot {
    watcher: Arc<Watcher>,
    ring: Ring,
}

/// The slot of `w` (present from `open` until `release`).
fn slot_of<'a>(slots: &'a mut KVec<Option<Slot>>, w: &Watcher) -> Option<&'a mut Slot> {
    slots
        .iter_mut()
        .flatten()
        .find(|s| core::ptr::eq(&*s.watcher, w))
}

/// One open `/dev/peermem`.
///
/// Drop order: fields drop in declaration order; none depends on another.
pub(crate) struct Watcher {
    /// The opener's address space.
    mm: MmRef,
    /// The generation page user space maps.
    page: SharedPage,
    waitq: WaitQueue,
}

impl MiscDevice for Watcher {
    fn open() -> Result<Arc<Self>> {
        // A kernel thread has no registrations to watch.
        let mm = MmRef::current().ok_or(EINVAL)?;
        let qlen = QUEUE_LEN.load(Ordering::Relaxed) as usize;
        let mut buf = KVec::with_capacity(qlen, GFP_KERNEL)?;
        buf.extend_with(qlen, Record::EMPTY, GFP_KERNEL)?;
        let page = SharedPage::new()?;
        page.store_u32(uapi::gen_page::VERSION, uapi::VERSION);
        page.store_u32(uapi::gen_page::EVENT_SIZE, uapi::EVENT_SIZE as u32);
        page.store_u32(uapi::gen_page::QUEUE_LEN, qlen as u32);
        let watcher = Arc::new(
            Watcher {
                mm,
                page,
                waitq: WaitQueue::new()?,
            },
            GFP_KERNEL,
        )?;
        let slot = Slot {
            watcher: watcher.clone(),
            ring: Ring {
                buf,
                head: 0,
                len: 0,
                generation: 0,
                overflow: None,
            },
        };
        let refused = {
            let mut g = SLOTS.lock();
            if let Some(free) = g.iter_mut().find(|s| s.is_none()) {
                *free = Some(slot);
                OPEN.fetch_add(1, Ordering::Relaxed);
                None
            } else {
                // Grows by one slot, rarely (slots are reused).
                match g.push(Some(slot), GFP_ATOMIC) {
                    Ok(()) => {
                        OPEN.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                    Err(_) => Some(ENOMEM),
                }
            }
        };
        match refused {
            None => Ok(watcher),
            Some(e) => Err(e),
        }
    }

    fn release(this: Arc<Self>) {
        let slot = {
            let mut g = SLOTS.lock();
            let slot = g
                .iter_mut()
                .find(|s| {
                    s.as_ref()
                        .is_some_and(|s| core::ptr::eq(&*s.watcher, &*this))
                })
                .and_then(|s| s.take());
            if slot.is_some() {
                OPEN.fetch_sub(1, Ordering::Relaxed);
            }
            slot
        };
        // Outside the lock: the last references may free the queue and the file.
        drop(slot);
        drop(this);
    }

    fn read(&self, out: &mut UserWriter) -> Result<usize> {
        if !self.mm.is_current() {
            return Err(EPERM);
        }
        if out.len() == 0 || out.len() % uapi::EVENT_SIZE != 0 {
            return Err(EINVAL);
        }
        let mut copied = 0;
        while out.remaining() >= uapi::EVENT_SIZE {
            let rec = {
                let mut g = SLOTS.lock();
                slot_of(&mut g, self).and_then(|s| s.ring.pop())
            };
            let Some(rec) = rec else { break };
            // Copied outside the lock (the copy may fault and sleep).
            if let Err(e) = out.write(&rec.encode()) {
                let mut g = SLOTS.lock();
                if let Some(s) = slot_of(&mut g, self) {
                    s.ring.lost(rec.generation);
                }
                return if copied > 0 { Ok(copied) } else { Err(e) };
            }
            copied += uapi::EVENT_SIZE;
        }
        if copied == 0 {
            Err(EAGAIN)
        } else {
            Ok(copied)
        }
    }

    fn readable(&self) -> bool {
        if !self.mm.is_current() {
            // read() fails at once.
            return true;
        }
        let mut g = SLOTS.lock();
        slot_of(&mut g, self).is_some_and(|s| s.ring.readable())
    }

    fn wait_queue(&self) -> &WaitQueue {
        &self.waitq
    }

    fn mmap(&self, vma: &Vma) -> Result {
        if !self.mm.is_current() {
            return Err(EPERM);
        }
        vma.map_page_read_only(&self.page)
    }
}

/// The device, while registered.
pub(crate) struct Device {
    _reg: MiscDeviceRegistration<Watcher>,
}

/// From now on new registrations remember their address space, for the
/// device [`Device::register`] creates later, with queues of `queue_len`
/// records. Call before the core can call `acquire`.
pub(crate) fn enable(queue_len: u32) {
    QUEUE_LEN.store(queue_len, Ordering::Relaxed);
    ENABLED.store(true, Ordering::Relaxed);
}

impl Device {
    /// Creates `/dev/peermem` (after [`enable`]). An open file holds a
    /// module reference, which it gets even while the module is still
    /// loading: call this last at load, when nothing can fail any more
    /// (the loader frees a module whose init failed, open files or not).
    pub(crate) fn register() -> Result<Self> {
        let reg = MiscDeviceRegistration::<Watcher>::register(uapi::DEVICE_NAME)?;
        Ok(Self { _reg: reg })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::Relaxed);
        // No file is open (each holds a module reference, and the device
        // was created when the load could no longer fail) and, once the
        // registration (a field) is gone, none can be: free the slot table.
        let slots = core::mem::take(&mut *SLOTS.lock());
        drop(slots);
    }
}

/// Reports `[start, start + length)` of address space `owner` revoked.
fn report(owner: &MmRef, client: Kind, start: u64, length: u64, cause: Cause) {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    let cause = match cause {
        Cause::GpuFree => uapi::cause::GPU_FREE,
        Cause::Unmap => uapi::cause::UNMAP,
        Cause::Move => uapi::cause::MOVE,
        Cause::Exit => uapi::cause::EXIT,
        Cause::Driver => uapi::cause::DRIVER,
        Cause::Protect => uapi::cause::PROTECT,
    };
    let mut g = SLOTS.lock();
    for s in g.iter_mut().flatten() {
        if !s.watcher.mm.same(owner) {
            continue;
        }
        s.ring.generation += 1;
        let generation = s.ring.generation;
        s.ring.push(Record {
            generation,
            start,
            length,
            cause,
            client: Some(client),
        });
        // After the record: whoever sees this value finds it queued.
        s.watcher
            .page
            .store_u64_release(uapi::gen_page::GENERATION, generation);
        s.watcher.waitq.wake();
    }
}

/// A registration's part in revocation events: the address space that made
/// it, and whether it is reported when revoked.
pub(crate) struct Tag {
    /// `None`: no device, or made by a kernel thread.
    owner: Option<MmRef>,
    /// [`Tag::IDLE`], [`Tag::ARMED`] or [`Tag::DONE`].
    state: AtomicU8,
}

impl Tag {
    /// Not a mapping of the core yet: a revocation now is not reported
    /// (the registration fails).
    const IDLE: u8 = 0;
    /// The core has its ticket: a revocation is reported.
    const ARMED: u8 = 1;
    /// Reported, or being given back by the core: never reported (again).
    const DONE: u8 = 2;

    /// A tag for a registration made by the calling process.
    pub(crate) fn current() -> Self {
        Self {
            owner: if ENABLED.load(Ordering::Relaxed) {
                MmRef::current()
            } else {
                None
            },
            state: AtomicU8::new(Self::IDLE),
        }
    }

    /// The core took the registration (`get_pages` gave it its ticket).
    pub(crate) fn arm(&self) {
        let _ = self.state.compare_exchange(
            Self::IDLE,
            Self::ARMED,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// The core is giving the registration back (`put_pages`, `release`).
    pub(crate) fn disarm(&self) {
        self.state.store(Self::DONE, Ordering::Relaxed);
    }

    /// peermem revokes the registration `[start, start + length)` of
    /// client `client`: reported once if armed. Call before the core's
    /// invalidate; any context that may spin; allocates nothing.
    pub(crate) fn revoked(&self, client: Kind, start: u64, length: u64, cause: Cause) {
        let Some(owner) = &self.owner else { return };
        if self
            .state
            .compare_exchange(
                Self::ARMED,
                Self::DONE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            report(owner, client, start, length, cause);
        }
    }
}
