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
//! until `put_pages`/`release`. An unmap whose notifier fired before
//! `get_pages` while its work item runs after it (so the work item revokes
//! the MR through the core) is reported by `get_pages` ([`Tag::arm`]). The report happens where peermem decides
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
//!
//! # Cost and limits
//!
//! A report visits the files of the revoked registration's address space
//! only ([`Table`]: a tree of address spaces, each with a tree of its
//! files), never every open file. An open allocates everything it needs,
//! tree nodes included, before it takes the lock, charged to the opener's
//! memory cgroup, and one user holds at most `event_files_per_user` files
//! (`EMFILE` beyond).

use super::Kind;
use crate::kapi::global_lock::EventsLocked;
use crate::kapi::miscdev::{MiscDevice, MiscDeviceRegistration, UserWriter, Vma, WaitQueue};
use crate::kapi::mm::{current_uid, MmRef, SharedPage};
use crate::kapi::mmu_notifier::Unmapping;
use crate::kapi::print::warn_ratelimited;
use crate::kapi::{module_param, uapi};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use kernel::alloc::flags::GFP_KERNEL_ACCOUNT;
use kernel::prelude::*;
use kernel::rbtree::{RBTree, RBTreeNodeReservation};
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
// A queue is one allocation at open (`KVec`, kmalloc): the largest one must
// stay within kmalloc's largest size (4 MiB with 4 KiB pages and the
// default MAX_PAGE_ORDER of 10), or an open at `event_queue_len=65536`
// would WARN instead of succeeding.
const _: () = assert!(QUEUE_LEN_MAX as usize * core::mem::size_of::<Record>() <= 4 << 20);

/// Fewest and most open files one user may hold (`event_files_per_user`).
pub(crate) const FILES_PER_USER_MIN: u32 = 1;
pub(crate) const FILES_PER_USER_MAX: u32 = 65536;

/// Whether the device exists (registrations then remember their address space).
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Open files: with none, a report is this one load.
static OPEN: AtomicU32 = AtomicU32::new(0);
/// Records per queue (`event_queue_len`, checked at load).
static QUEUE_LEN: AtomicU32 = AtomicU32::new(256);
/// Open files per user (`event_files_per_user`, checked at load).
static FILES_PER_USER: AtomicU32 = AtomicU32::new(1024);

/// The open files and their queues (`None` while the device is not enabled).
static TABLE: EventsLocked<Option<Table>> = EventsLocked::new(None);

/// Every open file, found by address space, and how many each user holds.
/// Nothing in it is a contiguous array that grows with the number of
/// files: each file is one node of its address space's tree, each address
/// space and each user one node, all allocated before the lock is taken
/// (charged to the opener's memory cgroup), so inserting allocates
/// nothing and a report visits only the files of the revoked address space.
struct Table {
    /// Address spaces with open files, by [`MmRef::key`].
    spaces: RBTree<usize, Space>,
    /// Open files per user id (users holding none have no entry).
    users: RBTree<u32, u32>,
}

/// The open files of one address space.
struct Space {
    /// By [`Watcher::key`].
    files: RBTree<usize, Slot>,
    /// Entries in `files`.
    count: usize,
}

impl Table {
    /// The slot of `w` (present from `open` until `release`).
    fn slot_of(&mut self, w: &Watcher) -> Option<&mut Slot> {
        self.spaces.get_mut(&w.mm.key())?.files.get_mut(&w.key())
    }
}

/// The slot of `w` in the table, if there is one.
fn slot_of<'a>(t: &'a mut Option<Table>, w: &Watcher) -> Option<&'a mut Slot> {
    t.as_mut()?.slot_of(w)
}

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
        // head < cap and len < cap: no division (whose by-zero panic 6.12's
        // objtool does not know as noreturn).
        let mut at = self.head + self.len;
        if at >= cap {
            at -= cap;
        }
        self.buf[at] = rec;
        self.len += 1;
    }

    fn pop(&mut self) -> Option<Record> {
        if self.len > 0 {
            let rec = self.buf[self.head];
            self.head += 1;
            if self.head == self.buf.len() {
                self.head = 0;
            }
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
    /// Everything still queued is newer than the lost record; one overflow
    /// record of the newest generation takes the place of all of it, so
    /// the records stay in generation order and the last one read carries
    /// the counter's value.
    fn lost(&mut self) {
        self.len = 0;
        self.overflow = Some(self.generation);
    }
}

/// An open file's queue, in [`TABLE`].
struct Slot {
    watcher: Arc<Watcher>,
    ring: Ring,
}

/// One open `/dev/peermem`.
///
/// Drop order: fields drop in declaration order; none depends on another.
pub(crate) struct Watcher {
    /// The opener's address space.
    mm: MmRef,
    /// The opener's user, whose count of open files this file is in.
    uid: u32,
    /// The generation page user space maps.
    page: SharedPage,
    waitq: WaitQueue,
}

impl Watcher {
    /// This file's key in its address space's tree: its address, unique
    /// among the live files (each is in an `Arc`, which does not move).
    fn key(&self) -> usize {
        core::ptr::from_ref(self) as usize
    }
}

/// Why an open is refused after its allocations.
enum Refused {
    /// The device is going away.
    Gone,
    /// The user holds `event_files_per_user` files already.
    Limit,
}

/// An open refused by `event_files_per_user`: says so (rate-limited), `EMFILE`.
fn refuse_limit() -> Error {
    warn_ratelimited(c"a user holds as many open /dev/peermem files as event_files_per_user allows; its opens fail with EMFILE until it closes one (or load peermem with a larger event_files_per_user)");
    EMFILE
}

impl MiscDevice for Watcher {
    fn open() -> Result<Arc<Self>> {
        // A kernel thread has no registrations to watch.
        let mm = MmRef::current().ok_or(EINVAL)?;
        let uid = current_uid();
        let limit = FILES_PER_USER.load(Ordering::Relaxed);
        // A user at the limit is refused before anything is allocated
        // (checked again at insertion: another open may have raced this one).
        let at_limit = {
            let g = TABLE.lock();
            g.as_ref()
                .is_some_and(|t| t.users.get(&uid).is_some_and(|&n| n >= limit))
        };
        if at_limit {
            return Err(refuse_limit());
        }
        let qlen = QUEUE_LEN.load(Ordering::Relaxed) as usize;
        // Everything this file holds is charged to the opener's memory
        // cgroup, and allocated here, before the event lock.
        let mut buf = KVec::with_capacity(qlen, GFP_KERNEL_ACCOUNT)?;
        buf.extend_with(qlen, Record::EMPTY, GFP_KERNEL_ACCOUNT)?;
        let page = SharedPage::new()?;
        page.store_u32(uapi::gen_page::VERSION, uapi::VERSION);
        page.store_u32(uapi::gen_page::EVENT_SIZE, uapi::EVENT_SIZE as u32);
        page.store_u32(uapi::gen_page::QUEUE_LEN, qlen as u32);
        let watcher = Arc::new(
            Watcher {
                mm,
                uid,
                page,
                waitq: WaitQueue::new()?,
            },
            GFP_KERNEL_ACCOUNT,
        )?;
        // The tree nodes the insertion may need (a new address space, a
        // new user): the unused ones are freed after the lock.
        let file_node = RBTreeNodeReservation::new(GFP_KERNEL_ACCOUNT)?;
        let mut space_node = Some(RBTreeNodeReservation::new(GFP_KERNEL_ACCOUNT)?);
        let mut user_node = Some(RBTreeNodeReservation::new(GFP_KERNEL_ACCOUNT)?);
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
            let mut g = TABLE.lock();
            match g.as_mut() {
                None => Err((Refused::Gone, slot, file_node)),
                Some(t) => {
                    let held = t.users.get(&uid).copied().unwrap_or(0);
                    if held >= limit {
                        Err((Refused::Limit, slot, file_node))
                    } else {
                        match t.users.get_mut(&uid) {
                            Some(n) => *n += 1,
                            None => {
                                if let Some(node) = user_node.take() {
                                    t.users.insert(node.into_node(uid, 1));
                                }
                            }
                        }
                        let mm_key = watcher.mm.key();
                        let node = file_node.into_node(watcher.key(), slot);
                        match t.spaces.get_mut(&mm_key) {
                            Some(space) => {
                                space.files.insert(node);
                                space.count += 1;
                            }
                            None => {
                                let mut files = RBTree::new();
                                files.insert(node);
                                if let Some(sn) = space_node.take() {
                                    t.spaces
                                        .insert(sn.into_node(mm_key, Space { files, count: 1 }));
                                }
                            }
                        }
                        OPEN.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                }
            }
        };
        // Outside the lock: what the refusal hands back, the unused nodes.
        drop(space_node);
        drop(user_node);
        match refused {
            Ok(()) => Ok(watcher),
            Err((why, slot, node)) => {
                drop(slot);
                drop(node);
                match why {
                    Refused::Gone => Err(ENODEV),
                    Refused::Limit => Err(refuse_limit()),
                }
            }
        }
    }

    fn release(this: Arc<Self>) {
        let (slot, space) = {
            let mut g = TABLE.lock();
            match g.as_mut() {
                None => (None, None),
                Some(t) => {
                    let mm_key = this.mm.key();
                    let mut slot = None;
                    let mut empty = false;
                    if let Some(space) = t.spaces.get_mut(&mm_key) {
                        slot = space.files.remove(&this.key());
                        if slot.is_some() {
                            space.count -= 1;
                            empty = space.count == 0;
                        }
                    }
                    let space = if empty {
                        t.spaces.remove(&mm_key)
                    } else {
                        None
                    };
                    if slot.is_some() {
                        OPEN.fetch_sub(1, Ordering::Relaxed);
                        let last = match t.users.get_mut(&this.uid) {
                            Some(n) => {
                                *n -= 1;
                                *n == 0
                            }
                            None => false,
                        };
                        if last {
                            t.users.remove(&this.uid);
                        }
                    }
                    (slot, space)
                }
            }
        };
        // Outside the lock: the last references may free the queue and the file.
        drop(space);
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
                let mut g = TABLE.lock();
                slot_of(&mut g, self).and_then(|s| s.ring.pop())
            };
            let Some(rec) = rec else { break };
            // Copied outside the lock (the copy may fault and sleep).
            if let Err(e) = out.write(&rec.encode()) {
                let mut g = TABLE.lock();
                if let Some(s) = slot_of(&mut g, self) {
                    s.ring.lost();
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
        let mut g = TABLE.lock();
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
/// records and at most `files_per_user` open files per user (both checked
/// by the caller). Call before the core can call `acquire`.
pub(crate) fn enable(queue_len: u32, files_per_user: u32) {
    QUEUE_LEN.store(queue_len, Ordering::Relaxed);
    FILES_PER_USER.store(files_per_user, Ordering::Relaxed);
    let empty = Table {
        spaces: RBTree::new(),
        users: RBTree::new(),
    };
    let old = TABLE.lock().replace(empty);
    drop(old);
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
        // registration (a field) is gone, none can be: free the table.
        let table = TABLE.lock().take();
        drop(table);
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
    let mut g = TABLE.lock();
    // Only the files of `owner`: the cost is theirs, not every open file's.
    let Some(space) = g.as_mut().and_then(|t| t.spaces.get_mut(&owner.key())) else {
        return;
    };
    for s in space.files.values_mut() {
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
    /// [`Tag::IDLE`], [`Tag::ARMED`], [`Tag::DONE`], or [`Tag::FIRED`]
    /// plus the cause's number ([`Tag::fired`]).
    state: AtomicU8,
}

impl Tag {
    /// Not a mapping of the core yet, and not revoked: a revocation now
    /// is not reported at once (the registration fails, unless the core
    /// gets it before the revocation is carried out: see `FIRED`).
    const IDLE: u8 = 0;
    /// The core has its ticket: a revocation is reported.
    const ARMED: u8 = 1;
    /// Reported, or being given back by the core: never reported (again).
    const DONE: u8 = 2;
    /// Revoked before the core had its ticket (the address watch fired
    /// while `get_pages` waited for the registration lock): the revocation
    /// is carried out later (the watch's work item). If the core still
    /// gets the registration, the work item revokes the MR through the
    /// core, so [`Tag::arm`] reports it then; if not, nothing is reported.
    /// The cause is in the low bits.
    const FIRED: u8 = 0x10;

    /// `FIRED` with `cause`.
    fn fired(cause: Cause) -> u8 {
        Self::FIRED
            | match cause {
                Cause::GpuFree => 0,
                Cause::Unmap => 1,
                Cause::Move => 2,
                Cause::Exit => 3,
                Cause::Driver => 4,
                Cause::Protect => 5,
            }
    }

    /// The cause of a `FIRED` state.
    fn fired_cause(state: u8) -> Option<Cause> {
        if state & !0x0f != Self::FIRED {
            return None;
        }
        Some(match state & 0x0f {
            0 => Cause::GpuFree,
            1 => Cause::Unmap,
            2 => Cause::Move,
            3 => Cause::Exit,
            4 => Cause::Driver,
            _ => Cause::Protect,
        })
    }

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

    /// The core took the registration `[start, start + length)` of client
    /// `client` (`get_pages` gave it its ticket, under the registration
    /// lock, the registration not marked revoked). If a revocation fired
    /// before, the revocation still to come (the watch's work item, which
    /// now finds the ticket) is reported here, before it reaches the core.
    pub(crate) fn arm(&self, client: Kind, start: u64, length: u64) {
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let (next, report_cause) = if cur == Self::IDLE {
                (Self::ARMED, None)
            } else if let Some(cause) = Self::fired_cause(cur) {
                (Self::DONE, Some(cause))
            } else {
                return;
            };
            match self
                .state
                .compare_exchange(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    if let (Some(cause), Some(owner)) = (report_cause, &self.owner) {
                        report(owner, client, start, length, cause);
                    }
                    return;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// A registration taken from the watch-pin cache is being made again:
    /// as new (`IDLE`), for the same address space.
    pub(crate) fn reset(&self) {
        self.state.store(Self::IDLE, Ordering::Relaxed);
    }

    /// The core is giving the registration back (`put_pages`, `release`).
    pub(crate) fn disarm(&self) {
        self.state.store(Self::DONE, Ordering::Relaxed);
    }

    /// peermem revokes the registration `[start, start + length)` of
    /// client `client`: reported once if armed; remembered for [`Tag::arm`]
    /// if the core has no ticket yet. Call before the core's invalidate;
    /// any context that may spin; allocates nothing.
    pub(crate) fn revoked(&self, client: Kind, start: u64, length: u64, cause: Cause) {
        let Some(owner) = &self.owner else { return };
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let next = match cur {
                Self::ARMED => Self::DONE,
                Self::IDLE => Self::fired(cause),
                // Reported, given back, or fired already (the first
                // revocation is the one that counts).
                _ => return,
            };
            match self
                .state
                .compare_exchange(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    if next == Self::DONE {
                        report(owner, client, start, length, cause);
                    }
                    return;
                }
                Err(now) => cur = now,
            }
        }
    }
}
