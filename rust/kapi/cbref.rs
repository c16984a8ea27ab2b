// SPDX-License-Identifier: GPL-2.0

//! References handed to C callbacks by id rather than by pointer: a
//! registry (the C glue's hash table under a spinlock, `peermem_cbref_*`
//! in rust/helpers.c) maps never-reused ids to `Arc<T>` references.
//! Upstream counterpart: `kernel::xarray::XArray` (6.14), which 6.12
//! lacks; an xarray with ever-growing ids costs every registration a path
//! of fresh nodes and their RCU frees (issue 26), the hash table one small
//! allocation freed at once.
//!
//! Whoever takes an entry out of the registry owns its reference. Removal
//! is atomic, so exactly one of several racing parties (a GPU driver's free
//! callback, and the code that put the pages back) gets it, and a late
//! callback with an id whose entry is gone finds nothing: ids are never
//! reused, so it can never find another object's entry.

use super::raw;
use core::marker::PhantomData;
use kernel::error::{to_result, Result};
use kernel::sync::Arc;

/// The name of one reference to a `T` in the registry.
///
/// # Invariants
///
/// `id` is a (non-zero) id that `peermem_cbref_insert` handed out for a
/// reference to a `T` from `Arc::into_raw`; its entry may have been taken since.
pub(crate) struct CallbackRef<T> {
    id: u64,
    _type: PhantomData<fn() -> Arc<T>>,
}

impl<T: Send + Sync> CallbackRef<T> {
    /// Puts `obj` in the registry; `ENOMEM` if it cannot.
    pub(crate) fn insert(obj: Arc<T>) -> Result<Self> {
        let ptr = Arc::into_raw(obj);
        let mut id = 0u64;
        // SAFETY: `ptr` is a non-null, aligned pointer; `id` a valid out pointer.
        let ret = unsafe { raw::peermem_cbref_insert(ptr.cast(), &mut id) };
        if let Err(e) = to_result(ret) {
            // SAFETY: not stored: the reference `into_raw` made is ours again.
            drop(unsafe { Arc::<T>::from_raw(ptr) });
            return Err(e);
        }
        // INVARIANT: `id` names the entry holding `ptr`, a reference to a `T`.
        Ok(Self {
            id,
            _type: PhantomData,
        })
    }

    /// The id, for a C callback's `data` (it fits an `unsigned long`).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Takes the reference out of the registry: `None` if someone took it already.
    pub(crate) fn take(&self) -> Option<Arc<T>> {
        // SAFETY: `self.id` names an entry for a reference to a `T` (type invariant).
        unsafe { take::<T>(self.id) }
    }
}

/// Removes entry `id` from the registry and returns its reference, if any.
///
/// # Safety
///
/// If an entry `id` exists, it holds a reference to a `T` (it was put there
/// by [`CallbackRef::<T>::insert`]).
pub(crate) unsafe fn take<T>(id: u64) -> Option<Arc<T>> {
    if id == 0 {
        return None;
    }
    // SAFETY: FFI call without preconditions (any id is fine).
    let ptr = unsafe { raw::peermem_cbref_take(id) };
    // SAFETY: a non-null result is a reference to a `T` from `Arc::into_raw`
    // (the caller's guarantee); the removal was atomic, so it is ours alone.
    (!ptr.is_null()).then(|| unsafe { Arc::from_raw(ptr.cast::<T>()) })
}

/// How many references are still in the registry (0 once every object
/// that has one is gone: each entry holds one).
pub(crate) fn left() -> u64 {
    // SAFETY: FFI call without preconditions.
    unsafe { raw::peermem_cbrefs_left() }
}
