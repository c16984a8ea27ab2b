// SPDX-License-Identifier: GPL-2.0

//! Data in a `static` under a spinlock that is itself a `static`. A Rust
//! `static` cannot hold the kernel crate's `SpinLock` (it needs pinned
//! initialisation at run time); the revocation event queues must be found
//! from the GPU driver's free callback and an mmu notifier, which cannot
//! sleep or allocate, so they live in a `static` under such a lock,
//! initialised at its first use ([`StaticSpinLock`]).
//! Upstream counterpart: `kernel::sync::global_lock!` (6.16), which 6.12 lacks.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU8, Ordering};
use kernel::bindings;
use kernel::types::Opaque;

/// [`StaticSpinLock::state`]: not initialised yet.
const UNINIT: u8 = 0;
/// Being initialised by the thread that won the race to do it.
const INITIALISING: u8 = 1;
/// Initialised: usable.
const READY: u8 = 2;

/// A kernel spinlock in a `static`, with its own lockdep class, initialised
/// by whichever thread takes it first (so no load order can use it
/// uninitialised). Taking it costs one acquire load more than a
/// `DEFINE_SPINLOCK`.
///
/// # Invariants
///
/// `lock` is an initialised `spinlock_t` (named `name`, of the lock class
/// `key`) once `state` is `READY`, and `state` never leaves `READY`; until
/// then only the one thread that moved `state` from `UNINIT` to
/// `INITIALISING` touches `lock`. `name` ends with a NUL.
pub(crate) struct StaticSpinLock {
    state: AtomicU8,
    lock: Opaque<bindings::spinlock_t>,
    key: Opaque<bindings::lock_class_key>,
    name: &'static [u8],
}

// SAFETY: the spinlock is shared by design; its fields are touched only by
// the kernel's lock functions once it is initialised, and by one thread
// before that (type invariant).
unsafe impl Sync for StaticSpinLock {}

impl StaticSpinLock {
    /// A lock for a `static`; `name` (with its NUL) names it to lockdep.
    pub(crate) const fn new(name: &'static [u8]) -> Self {
        assert!(!name.is_empty() && name[name.len() - 1] == 0);
        Self {
            state: AtomicU8::new(UNINIT),
            lock: Opaque::uninit(),
            key: Opaque::uninit(),
            name,
        }
    }

    /// The initialised spinlock: initialises it if no thread has.
    fn ready(&self) -> *mut bindings::spinlock_t {
        if self.state.load(Ordering::Acquire) != READY {
            self.init_slow();
        }
        self.lock.get()
    }

    #[cold]
    fn init_slow(&self) {
        match self.state.compare_exchange(
            UNINIT,
            INITIALISING,
            Ordering::Acquire,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                // SAFETY: this thread alone moved `state` off `UNINIT`, so
                // no other touches `lock` until `READY` (type invariant);
                // `key` lives in a `static` (lockdep wants a static key),
                // `name` ends with a NUL (checked in `new`).
                unsafe {
                    bindings::__spin_lock_init(
                        self.lock.get(),
                        self.name.as_ptr().cast(),
                        self.key.get(),
                    )
                };
                // INVARIANT: initialised before `READY` is published.
                self.state.store(READY, Ordering::Release);
            }
            Err(_) => {
                // Another thread initialises it; a few instructions' wait.
                while self.state.load(Ordering::Acquire) != READY {
                    core::hint::spin_loop();
                }
            }
        }
    }

    /// Spins until the lock is ours.
    fn lock(&self) {
        let l = self.ready();
        // SAFETY: an initialised spinlock (`ready`).
        unsafe { bindings::spin_lock(l) };
    }

    /// Releases the lock.
    ///
    /// # Safety
    ///
    /// This thread holds the lock.
    unsafe fn unlock(&self) {
        // SAFETY: held by this thread, so initialised (the caller's
        // guarantee).
        unsafe { bindings::spin_unlock(self.lock.get()) };
    }
}

/// One of the module's static spinlocks, named by a type so that an
/// [`EventsLocked`] can say which one guards it.
///
/// # Safety
///
/// [`GlobalLock::spin`] returns the same lock on every call (an
/// [`EventsGuard`] releases the lock it took).
pub(crate) unsafe trait GlobalLock {
    /// The lock.
    fn spin() -> &'static StaticSpinLock;
}

/// The event lock: the event queues, the watch cache.
static EVENTS_SPIN: StaticSpinLock = StaticSpinLock::new(b"peermem_events\0");

/// The event lock's [`GlobalLock`].
pub(crate) struct EventsLock;

// SAFETY: always the one static.
unsafe impl GlobalLock for EventsLock {
    fn spin() -> &'static StaticSpinLock {
        &EVENTS_SPIN
    }
}

/// The callback-reference registry's lock.
static CBREFS_SPIN: StaticSpinLock = StaticSpinLock::new(b"peermem_cbrefs\0");

/// The callback-reference registry's [`GlobalLock`].
pub(crate) struct CbrefsLock;

// SAFETY: always the one static.
unsafe impl GlobalLock for CbrefsLock {
    fn spin() -> &'static StaticSpinLock {
        &CBREFS_SPIN
    }
}

/// A `T` guarded by one of the module's static spinlocks, `L` (by default
/// the event lock, [`EventsLock`]). Every `EventsLocked` with the
/// same `L` shares that one lock: never hold two guards of it at once (the
/// second would spin forever). Never sleep holding one.
///
/// # Invariants
///
/// `data` is accessed only through an [`EventsGuard`], which holds the lock.
pub(crate) struct EventsLocked<T, L: GlobalLock = EventsLock> {
    data: UnsafeCell<T>,
    _lock: PhantomData<L>,
}

// SAFETY: access to `data` is serialized by the lock (type invariant), so
// sharing the `static` among threads only moves `T` between them.
unsafe impl<T: Send, L: GlobalLock> Sync for EventsLocked<T, L> {}

impl<T, L: GlobalLock> EventsLocked<T, L> {
    /// A `T` under the lock (usable in a `static`).
    pub(crate) const fn new(data: T) -> Self {
        Self {
            data: UnsafeCell::new(data),
            _lock: PhantomData,
        }
    }

    /// Spins until the lock is ours. Any context that may spin (not an
    /// interrupt: the lock does not disable them).
    pub(crate) fn lock(&self) -> EventsGuard<'_, T, L> {
        L::spin().lock();
        // INVARIANT: the lock is held until the guard drops.
        EventsGuard {
            owner: self,
            _not_send: PhantomData,
        }
    }
}

/// The held lock of an [`EventsLocked`].
///
/// # Invariants
///
/// The lock `L` is held by this thread while the guard lives.
pub(crate) struct EventsGuard<'a, T, L: GlobalLock = EventsLock> {
    owner: &'a EventsLocked<T, L>,
    /// Not `Send`: the lock is released by the thread that took it.
    _not_send: PhantomData<*mut ()>,
}

impl<T, L: GlobalLock> Deref for EventsGuard<'_, T, L> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the lock is held (type invariant): no other reference.
        unsafe { &*self.owner.data.get() }
    }
}

impl<T, L: GlobalLock> DerefMut for EventsGuard<'_, T, L> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the lock is held (type invariant), and `&mut self` is unique.
        unsafe { &mut *self.owner.data.get() }
    }
}

impl<T, L: GlobalLock> Drop for EventsGuard<'_, T, L> {
    fn drop(&mut self) {
        // SAFETY: held by this thread (type invariant; `L::spin` is the lock
        // `EventsLocked::lock` took, `GlobalLock`'s safety requirement),
        // released once.
        unsafe { L::spin().unlock() };
    }
}
