// SPDX-License-Identifier: GPL-2.0

//! The watch-pin cache: deregistered `nv_mem` registrations
//! whose watch pin (the pin with the free callback) and address watch are
//! kept, so that registering the same range again in the same process
//! takes only the keeper: one pin where nvidia-peermem takes two, and no
//! new registration object, address watch or registry entry.
//!
//! What an entry holds, and what it does not: the watch pin keeps no GPU
//! memory from being freed (its free callback comes at the free, and drops
//! the entry: the registration's `gpu_freed`), and the keeper, which
//! does keep memory, is put at every deregistration as before. An entry
//! holds BAR1 space (the pin's mapping), bounded here in entries and bytes
//! (`watch_cache`, `watch_cache_mib`). The address watch keeps running: an
//! unmap or move of the range drops the entry (its notifier marks the
//! watch fired before the unmapping call returns, so a later registration
//! of the address never takes it). Process exit leaves the entry until its
//! memory is freed (at the latest when the GPU driver tears the process's
//! memory down), the cache needs the room, or peermem unloads.
//!
//! An entry's watch pin can be given back only by the process that pinned
//! it (NVIDIA's driver ignores `nvidia_p2p_put_pages` from any other:
//! `crate::kapi::nvidia_p2p`), so the cache is one table with entries per
//! process: a process's registration evicts only that process's entries,
//! a failed pin gives back only the caller's, and the flush file drops
//! the writer's. An entry whose range was unmapped stays until its process
//! meets it again or its free callback comes. At unload, entries of other
//! processes cannot be given back: their pins are left to their free
//! callbacks, which unload waits for (`pins_left_to_callback`).
//!
//! Entries live in a small table in a `static` under the event spinlock
//! (`kapi::global_lock`; never held across anything but the table's own
//! work, never together with another guard of that lock). A registration is in the
//! table only while its `parked` mark is set (under its own lock); the
//! table's reference belongs to whoever takes the entry out of the table.
//!
//! The cache knows registrations only through [`Parkable`]: the
//! registration module owns the one [`WatchCache`] (a `static`) and
//! implements the trait, so this module never names it and the two do not
//! depend on each other both ways.

use crate::kapi::debugfs::Action;
use crate::kapi::global_lock::EventsLocked;
use crate::kapi::task::ThreadGroup;
use crate::kapi::{mm, module_param};
use core::marker::PhantomData;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;

/// The most entries `watch_cache` may ask for (the table's size).
pub(crate) const MAX_ENTRIES: u32 = 64;
/// The most MiB `watch_cache_mib` may ask for (1 TiB).
pub(crate) const MAX_MIB: u32 = 1 << 20;

/// Entries allowed (`watch_cache`; 0: the cache is off). Set at load.
static LIMIT_ENTRIES: AtomicU32 = AtomicU32::new(0);
/// Bytes allowed (`watch_cache_mib`). Set at load.
static LIMIT_BYTES: AtomicU64 = AtomicU64::new(0);

/// What the cache asks of what it parks (a registration).
pub(crate) trait Parkable: Send + Sync + Sized + 'static {
    /// The one cache of this type.
    fn cache() -> &'static WatchCache<Self>;
    /// Whether `this` may be parked at all (its kind, its state).
    fn may_be_parked(this: &Arc<Self>) -> bool;
    /// The GPU memory its watch pin covers.
    fn parked_bytes(this: &Arc<Self>) -> u64;
    /// Parks it: marks it and inserts it with [`WatchCache::insert`];
    /// `false` if it could not be.
    fn park(this: &Arc<Self>) -> bool;
    /// Drops an entry taken out of the table: puts its watch pin.
    fn drop_parked(this: Arc<Self>);
    /// Drops one that was not parked, as a release without the cache does.
    fn drop_unparked(this: Arc<Self>);
}

/// One parked registration.
struct Entry<T> {
    /// The registering address space ([`mm::current_key`]); the started
    /// address watch keeps its `mm_struct`, so the key is not reused.
    mm: usize,
    /// The process that pinned the watch pin, the only one that can put it.
    owner: ThreadGroup,
    addr: u64,
    len: u64,
    /// GPU memory its watch pin covers (the aligned range).
    bytes: u64,
    reg: Arc<T>,
}

/// The cache's table.
///
/// # Invariants
///
/// `slots[..entries]` are `Some`, in the order they were parked (the
/// oldest first), and `slots[entries..]` are `None`; `addrs[i]` is the
/// `addr` of `slots[i]` for each `i < entries`; `bytes` is the sum of
/// their `bytes`. So a lookup reads only the entries there are, from the
/// newest, and the oldest of a process is the first of its in the order,
/// with no age to compare: a miss (a range registered for the first time,
/// which evicts the oldest entry to park its own) costs a few comparisons
/// per entry instead of a pass over every slot for each of its three
/// steps.
struct Table<T> {
    slots: [Option<Entry<T>>; MAX_ENTRIES as usize],
    /// `addrs[i]` is `slots[i]`'s `addr` for `i < entries`: a lookup
    /// compares these (one `u64` each, side by side) and reads an entry only
    /// where the address matches.
    addrs: [u64; MAX_ENTRIES as usize],
    /// Entries in `slots`, all at its start.
    entries: u32,
    /// Sum of the entries' `bytes`.
    bytes: u64,
}

impl<T> Table<T> {
    /// The entries, oldest first.
    fn live(&self) -> &[Option<Entry<T>>] {
        &self.slots[..self.entries as usize]
    }

    /// Takes out the entry at `i`, moving the newer ones down one slot
    /// (order and compactness kept).
    fn take_slot(&mut self, i: usize) -> Option<Arc<T>> {
        let n = self.entries as usize;
        if i >= n {
            return None;
        }
        let e = self.slots[i].take()?;
        // `slots[i]` is `None` now; it moves to the end of the entries.
        self.slots[i..n].rotate_left(1);
        self.addrs[i..n].rotate_left(1);
        self.entries -= 1;
        self.bytes -= e.bytes;
        Some(e.reg)
    }

    /// Takes out the oldest entry of `owner`'s, if any.
    fn take_oldest(&mut self, owner: ThreadGroup) -> Option<Arc<T>> {
        let i = self
            .live()
            .iter()
            .position(|s| s.as_ref().is_some_and(|e| e.owner == owner))?;
        self.take_slot(i)
    }

    /// Takes out the oldest entry (of `owner`'s, if given), if any.
    fn take_any(&mut self, owner: Option<ThreadGroup>) -> Option<Arc<T>> {
        let i = self.live().iter().position(|s| {
            s.as_ref()
                .is_some_and(|e| owner.is_none_or(|o| e.owner == o))
        })?;
        self.take_slot(i)
    }

    /// The index of the entry for `mm`'s `[addr, addr + len)`, if parked;
    /// the newest first (a range registered again is most likely a recent
    /// one).
    fn find(&self, mm: usize, addr: u64, len: u64) -> Option<usize> {
        let n = self.entries as usize;
        let (addrs, slots) = (&self.addrs[..n], &self.slots[..n]);
        // The addresses alone (a miss reads nothing else), then the entry
        // of each match.
        let mut i = n;
        while i > 0 {
            i -= 1;
            if addrs[i] == addr
                && slots[i]
                    .as_ref()
                    .is_some_and(|e| e.len == len && e.mm == mm)
            {
                return Some(i);
            }
        }
        None
    }

    /// Whether an entry of `bytes` fits in the limits.
    fn fits(&self, bytes: u64) -> bool {
        self.entries < LIMIT_ENTRIES.load(Ordering::Relaxed)
            && self.bytes.saturating_add(bytes) <= LIMIT_BYTES.load(Ordering::Relaxed)
    }

    /// Appends an entry (the newest); `false` if the table is full.
    fn push(&mut self, e: Entry<T>) -> bool {
        let i = self.entries as usize;
        let (Some(slot), Some(a)) = (self.slots.get_mut(i), self.addrs.get_mut(i)) else {
            return false;
        };
        self.bytes += e.bytes;
        *a = e.addr;
        *slot = Some(e);
        self.entries += 1;
        true
    }
}

/// The watch-pin cache of `T`s: its table under the global lock.
pub(crate) struct WatchCache<T> {
    table: EventsLocked<Table<T>>,
}

/// Reads and checks `watch_cache` and `watch_cache_mib` at load; `EINVAL`
/// (logged) if out of range.
pub(crate) fn setup() -> Result {
    let entries = module_param::watch_cache();
    let mib = module_param::watch_cache_mib();
    if entries > MAX_ENTRIES {
        pr_err!(
            "watch_cache={} is out of range; load peermem with a value from 0 (no cache) to {}\n",
            entries,
            MAX_ENTRIES
        );
        return Err(EINVAL);
    }
    if mib > MAX_MIB {
        pr_err!(
            "watch_cache_mib={} is out of range; load peermem with a value from 0 to {}\n",
            mib,
            MAX_MIB
        );
        return Err(EINVAL);
    }
    LIMIT_BYTES.store(u64::from(mib) << 20, Ordering::Relaxed);
    LIMIT_ENTRIES.store(if mib == 0 { 0 } else { entries }, Ordering::Relaxed);
    Ok(())
}

/// Whether deregistered ranges may be parked.
pub(crate) fn enabled() -> bool {
    LIMIT_ENTRIES.load(Ordering::Relaxed) != 0
}

impl<T: Parkable> WatchCache<T> {
    /// An empty cache (for the one `static` of its user).
    pub(crate) const fn new() -> Self {
        Self {
            table: EventsLocked::new(Table {
                slots: [const { None }; MAX_ENTRIES as usize],
                addrs: [0; MAX_ENTRIES as usize],
                entries: 0,
                bytes: 0,
            }),
        }
    }

    /// Takes the entry of `[addr, addr + len)` of the caller's address space,
    /// if there is one; it is the caller's then (its `parked` mark still set).
    pub(crate) fn take(&self, addr: u64, len: u64) -> Option<Arc<T>> {
        if !enabled() {
            return None;
        }
        let mm = mm::current_key();
        if mm == 0 {
            return None;
        }
        let mut t = self.table.lock();
        let i = t.find(mm, addr, len)?;
        t.take_slot(i)
    }

    /// Takes `reg`'s entry out, if it is still in the table.
    pub(crate) fn remove(&self, reg: &T) -> Option<Arc<T>> {
        let mut t = self.table.lock();
        let i = t
            .live()
            .iter()
            .position(|s| s.as_ref().is_some_and(|e| core::ptr::eq::<T>(&*e.reg, reg)))?;
        t.take_slot(i)
    }

    /// Makes room for an entry of `bytes`: drops the caller's oldest entries
    /// until it fits (another process's cannot be given back here). `false`
    /// if it does not fit.
    fn make_room(&self, bytes: u64) -> bool {
        if bytes > LIMIT_BYTES.load(Ordering::Relaxed) {
            return false;
        }
        let me = ThreadGroup::current();
        loop {
            let victim = {
                let mut t = self.table.lock();
                if t.fits(bytes) {
                    return true;
                }
                t.take_oldest(me)
            };
            match victim {
                // Outside the lock: puts the watch pin.
                Some(v) => T::drop_parked(v),
                None => return false,
            }
        }
    }

    /// Inserts `reg` (called by [`Parkable::park`] under `reg`'s lock,
    /// which it takes before this lock). `false`: no room (another thread
    /// parked meanwhile); nothing inserted.
    pub(crate) fn insert(&self, reg: &Arc<T>, mm: usize, addr: u64, len: u64, bytes: u64) -> bool {
        let mut t = self.table.lock();
        // One entry per range and address space (two registrations of it at
        // once: the second to go is not kept).
        if t.find(mm, addr, len).is_some() || !t.fits(bytes) {
            return false;
        }
        t.push(Entry {
            mm,
            owner: ThreadGroup::current(),
            addr,
            len,
            bytes,
            reg: reg.clone(),
        })
    }

    /// `release` of a registration that may be parked: parks it (making room
    /// first), or puts its watch pin as before.
    pub(crate) fn park_or_drop(&self, reg: Arc<T>) {
        // Room is made (older entries put) only for one that can be parked.
        if T::may_be_parked(&reg) && self.make_room(T::parked_bytes(&reg)) && T::park(&reg) {
            return;
        }
        T::drop_unparked(reg);
    }

    /// Drops the entries of `owner` (every entry for `None`); returns how many.
    fn drain_of(&self, owner: Option<ThreadGroup>) -> u32 {
        let mut n = 0;
        loop {
            // The guard goes at the end of this statement: never held below.
            let reg = self.table.lock().take_any(owner);
            let Some(reg) = reg else {
                return n;
            };
            T::drop_parked(reg);
            n += 1;
        }
    }

    /// Drops the caller's entries, their watch pins put; returns how many.
    /// For a pin of the caller's that failed, and the `watch_cache_flush`
    /// debugfs file.
    pub(crate) fn drain_mine(&self) -> u32 {
        self.drain_of(Some(ThreadGroup::current()))
    }

    /// Drops every entry, at unload (after the core released every
    /// registration and the flush file is gone, before the work queue goes):
    /// the caller's watch pins are put, every other process's left to their
    /// free callbacks, which unload then waits for.
    pub(crate) fn drain_all(&self) -> u32 {
        self.drain_of(None)
    }
}

/// The `watch_cache_flush` debugfs file: drops the writer's entries (only
/// the process that pinned a watch pin can give it back).
pub(crate) struct Flush<T>(PhantomData<T>);

impl<T: Parkable> Action for Flush<T> {
    fn run() {
        T::cache().drain_mine();
    }
}
