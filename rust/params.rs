// SPDX-License-Identifier: GPL-2.0

//! Module parameters: read once at load from the C glue, checked here.
//!
//! The parameters themselves (names, defaults, descriptions shown by
//! `modinfo`) are declared in `rust/helpers.c`.

use crate::ffi;
use kernel::prelude::*;

/// Longest client name the peer-memory ABI holds (its `name[]` keeps a NUL).
pub(crate) const PEER_NAME_MAX: usize = ffi::PEER_NAME_CAPACITY - 1;

/// Why a peer name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameError {
    /// Empty.
    Empty,
    /// Longer than [`PEER_NAME_MAX`] bytes.
    TooLong,
    /// `.` or `..`: the core uses the name as a sysfs directory name.
    Reserved,
    /// A byte outside `A-Z a-z 0-9 _ . -` (the name becomes a directory name).
    BadChar(u8),
}

/// Checks a peer-memory client name and returns it as a `str`.
pub(crate) fn check_peer_name(name: &[u8]) -> Result<&str, NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > PEER_NAME_MAX {
        return Err(NameError::TooLong);
    }
    if name == b"." || name == b".." {
        return Err(NameError::Reserved);
    }
    if let Some(&c) = name
        .iter()
        .find(|&&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-'))
    {
        return Err(NameError::BadChar(c));
    }
    // Only ASCII bytes are left, which are valid UTF-8.
    core::str::from_utf8(name).map_err(|_| NameError::BadChar(0))
}

/// The module's parameters, checked.
pub(crate) struct Params {
    /// Name to register with the peer-memory core.
    pub(crate) peer_name: &'static str,
    /// Register as an invalidating client.
    pub(crate) enable_invalidate: bool,
    /// Revoke registrations whose range the process unmaps or moves.
    pub(crate) mmu_notifier: bool,
}

impl Params {
    /// Reads and checks the parameters given at load; `EINVAL` (and a
    /// message saying which and why) if one is unusable.
    pub(crate) fn from_module() -> Result<Self> {
        let raw = ffi::param_peer_name();
        let peer_name = match check_peer_name(raw) {
            Ok(name) => name,
            Err(e) => {
                let why = match e {
                    NameError::Empty => "it is empty",
                    NameError::TooLong => "it is longer than 63 characters",
                    NameError::Reserved => "'.' and '..' are reserved",
                    NameError::BadChar(_) => "it may only contain A-Z a-z 0-9 _ . -",
                };
                pr_err!(
                    "invalid peer_name parameter: {}; load peermem with e.g. peer_name=peermem\n",
                    why
                );
                return Err(EINVAL);
            }
        };
        Ok(Self {
            peer_name,
            enable_invalidate: ffi::param_enable_invalidate(),
            mmu_notifier: ffi::param_mmu_notifier(),
        })
    }
}

#[cfg(peermem_kunit)]
#[::kernel::macros::kunit_tests(peermem_params)]
mod tests {
    use super::*;

    #[test]
    fn good_names() {
        assert_eq!(check_peer_name(b"peermem"), Ok("peermem"));
        assert_eq!(check_peer_name(b"nv_mem"), Ok("nv_mem"));
        assert_eq!(check_peer_name(b"a"), Ok("a"));
        assert_eq!(check_peer_name(b"peer.mem-1_X"), Ok("peer.mem-1_X"));
        assert_eq!(check_peer_name(b"..."), Ok("..."));
        let max = [b'x'; PEER_NAME_MAX];
        assert!(check_peer_name(&max).is_ok());
    }

    #[test]
    fn bad_names() {
        assert_eq!(check_peer_name(b""), Err(NameError::Empty));
        assert_eq!(
            check_peer_name(&[b'x'; PEER_NAME_MAX + 1]),
            Err(NameError::TooLong)
        );
        assert_eq!(check_peer_name(b"."), Err(NameError::Reserved));
        assert_eq!(check_peer_name(b".."), Err(NameError::Reserved));
        assert_eq!(check_peer_name(b"a/b"), Err(NameError::BadChar(b'/')));
        assert_eq!(check_peer_name(b"a b"), Err(NameError::BadChar(b' ')));
        assert_eq!(check_peer_name(b"tab\t"), Err(NameError::BadChar(b'\t')));
        assert_eq!(
            check_peer_name("m\u{e4}m".as_bytes()),
            Err(NameError::BadChar(0xc3))
        );
        assert_eq!(check_peer_name(b"nul\0"), Err(NameError::BadChar(0)));
    }

    #[test]
    fn name_capacity_matches_the_abi() {
        // name[IB_PEER_MEMORY_NAME_MAX] with its terminating NUL.
        assert_eq!(PEER_NAME_MAX, 63);
    }
}
