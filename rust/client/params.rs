// SPDX-License-Identifier: GPL-2.0

//! Module parameters: read once at load from the C glue, checked here.
//!
//! The parameters themselves (names, defaults, descriptions shown by
//! `modinfo`) are declared in `rust/helpers.c`.

use crate::kapi::{module_param, peer_mem};
use kernel::prelude::*;

/// Longest client name the peer-memory ABI holds (its `name[]` keeps a NUL).
pub(crate) const PEER_NAME_MAX: usize = peer_mem::PEER_NAME_CAPACITY - 1;

/// What the non-invalidating client's name adds to `peer_name`, as
/// nvidia-peermem names its clients `nv_mem` and `nv_mem_nc`.
pub(crate) const NC_SUFFIX: &str = "_nc";

/// Why a peer name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameError {
    /// Empty.
    Empty,
    /// Longer than the limit given to [`check_peer_name`].
    TooLong,
    /// `.` or `..`: the core uses the name as a sysfs directory name.
    Reserved,
    /// A byte outside `A-Z a-z 0-9 _ . -` (the name becomes a directory name).
    BadChar(u8),
}

/// Checks a peer-memory client name of at most `max` bytes and returns it as a `str`.
pub(crate) fn check_peer_name(name: &[u8], max: usize) -> Result<&str, NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > max {
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

/// A client name built at load (`peer_name` + [`NC_SUFFIX`]), at most
/// [`PEER_NAME_MAX`] bytes of `A-Z a-z 0-9 _ . -`.
pub(crate) struct NameBuf {
    buf: [u8; PEER_NAME_MAX],
    len: usize,
}

impl NameBuf {
    /// `base` followed by `suffix`; `None` if that is longer than [`PEER_NAME_MAX`].
    pub(crate) fn join(base: &str, suffix: &str) -> Option<Self> {
        let len = base.len() + suffix.len();
        if len > PEER_NAME_MAX {
            return None;
        }
        let mut buf = [0u8; PEER_NAME_MAX];
        buf[..base.len()].copy_from_slice(base.as_bytes());
        buf[base.len()..len].copy_from_slice(suffix.as_bytes());
        Some(Self { buf, len })
    }

    /// The name.
    pub(crate) fn as_str(&self) -> &str {
        // Built from two `str`s (`join`): valid UTF-8.
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

/// What peermem does with nvidia-peermem's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NvParam {
    /// Nothing to say: the value means what peermem does anyway.
    Same,
    /// `peerdirect_support=1`: the MLNX_OFED 4.9 legacy client, which
    /// peermem does not provide.
    LegacyClientAsked,
    /// `persistent_api_support=1`: nvidia-peermem's single persistent
    /// `nv_mem`; peermem keeps its clients as `enable_*` say.
    PersistentOnlyAsked,
}

/// Which nvidia-peermem parameter is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NvParamError {
    /// `peerdirect_support` other than 0 or 1.
    PeerdirectSupport(i32),
    /// `persistent_api_support` other than 0 or 1 (or -1, not given).
    PersistentApiSupport(i32),
}

/// Checks nvidia-peermem's `peerdirect_support` and
/// `persistent_api_support` as its 595 release does (0 and 1, anything
/// else fails the load) and says what peermem does with them.
pub(crate) fn check_nv_params(
    peerdirect: i32,
    persistent: i32,
) -> Result<[NvParam; 2], NvParamError> {
    let a = match peerdirect {
        0 => NvParam::Same,
        1 => NvParam::LegacyClientAsked,
        v => return Err(NvParamError::PeerdirectSupport(v)),
    };
    let b = match persistent {
        -1 | 0 => NvParam::Same,
        1 => NvParam::PersistentOnlyAsked,
        v => return Err(NvParamError::PersistentApiSupport(v)),
    };
    Ok([a, b])
}

/// Reads nvidia-peermem's parameters; logs what peermem does with them;
/// `EINVAL` for a value nvidia-peermem refuses too.
fn nv_params_from_module() -> Result {
    let (pd, pa) = (
        module_param::peerdirect_support(),
        module_param::persistent_api_support(),
    );
    match check_nv_params(pd, pa) {
        Err(NvParamError::PeerdirectSupport(v)) => {
            pr_err!("invalid peerdirect_support={}: nvidia-peermem's parameter takes 0 (extended client, the default) or 1 (MLNX_OFED 4.9 legacy client); fix the options line in /etc/modprobe.d or leave it out\n", v);
            Err(EINVAL)
        }
        Err(NvParamError::PersistentApiSupport(v)) => {
            pr_err!("invalid persistent_api_support={}: nvidia-peermem's parameter takes 0 or 1; fix the options line in /etc/modprobe.d or leave it out\n", v);
            Err(EINVAL)
        }
        Ok(what) => {
            for w in what {
                match w {
                    NvParam::Same => {}
                    NvParam::LegacyClientAsked => pr_warn!("peerdirect_support=1 asks for nvidia-peermem's MLNX_OFED 4.9 legacy client, which peermem does not provide: it registers the extended client (PEER_MEM_INVALIDATE_UNMAPS) that MLNX_OFED 5 and later and DOCA-OFED expect; remove the parameter, and use MLNX_OFED 5 or later\n"),
                    NvParam::PersistentOnlyAsked => pr_info!("persistent_api_support=1: nvidia-peermem would register only a persistent nv_mem; peermem keeps its clients as enable_invalidate and enable_nc say (invalidating nv_mem and persistent nv_mem_nc by default); load with enable_invalidate=0 for persistent pins only\n"),
                }
            }
            Ok(())
        }
    }
}

/// The module's parameters, checked.
pub(crate) struct Params {
    /// Name of the invalidating client (`peer_name`).
    pub(crate) peer_name: &'static str,
    /// Name of the non-invalidating client, `peer_name` + [`NC_SUFFIX`],
    /// if it is registered (`enable_nc`).
    pub(crate) nc_name: Option<NameBuf>,
    /// Register the invalidating client (`enable_invalidate`).
    pub(crate) invalidating: bool,
    /// Revoke registrations whose range the process unmaps or moves.
    pub(crate) mmu_notifier: bool,
}

impl Params {
    /// Reads and checks the parameters given at load; `EINVAL` (and a
    /// message saying which and why) if one is unusable.
    pub(crate) fn from_module() -> Result<Self> {
        nv_params_from_module()?;
        let invalidating = module_param::enable_invalidate();
        let nc = module_param::enable_nc();
        if !invalidating && !nc {
            pr_err!("enable_invalidate=0 and enable_nc=0 leave no peer-memory client to register; load peermem with at least one of them on\n");
            return Err(EINVAL);
        }
        // The non-invalidating client's name must fit too.
        let max = if nc {
            PEER_NAME_MAX - NC_SUFFIX.len()
        } else {
            PEER_NAME_MAX
        };
        let raw = module_param::peer_name();
        let peer_name = match check_peer_name(raw, max) {
            Ok(name) => name,
            Err(e) => {
                let why = match e {
                    NameError::Empty => "it is empty",
                    NameError::TooLong if nc => {
                        "it is longer than 60 characters, and the non-invalidating client's name (peer_name followed by _nc) must fit in 63 (or load with enable_nc=0)"
                    }
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
        // Fits: `max` left room for the suffix.
        let nc_name = if nc {
            Some(NameBuf::join(peer_name, NC_SUFFIX).ok_or(EINVAL)?)
        } else {
            None
        };
        Ok(Self {
            peer_name,
            nc_name,
            invalidating,
            mmu_notifier: module_param::mmu_notifier(),
        })
    }
}

#[cfg(peermem_kunit)]
#[::kernel::macros::kunit_tests(peermem_params)]
mod tests {
    use super::*;

    const M: usize = PEER_NAME_MAX;

    #[test]
    fn good_names() {
        assert_eq!(check_peer_name(b"peermem", M), Ok("peermem"));
        assert_eq!(check_peer_name(b"nv_mem", M), Ok("nv_mem"));
        assert_eq!(check_peer_name(b"a", M), Ok("a"));
        assert_eq!(check_peer_name(b"peer.mem-1_X", M), Ok("peer.mem-1_X"));
        assert_eq!(check_peer_name(b"...", M), Ok("..."));
        let max = [b'x'; PEER_NAME_MAX];
        assert!(check_peer_name(&max, M).is_ok());
    }

    #[test]
    fn bad_names() {
        assert_eq!(check_peer_name(b"", M), Err(NameError::Empty));
        assert_eq!(
            check_peer_name(&[b'x'; PEER_NAME_MAX + 1], M),
            Err(NameError::TooLong)
        );
        assert_eq!(check_peer_name(b".", M), Err(NameError::Reserved));
        assert_eq!(check_peer_name(b"..", M), Err(NameError::Reserved));
        assert_eq!(check_peer_name(b"a/b", M), Err(NameError::BadChar(b'/')));
        assert_eq!(check_peer_name(b"a b", M), Err(NameError::BadChar(b' ')));
        assert_eq!(check_peer_name(b"tab\t", M), Err(NameError::BadChar(b'\t')));
        assert_eq!(
            check_peer_name("m\u{e4}m".as_bytes(), M),
            Err(NameError::BadChar(0xc3))
        );
        assert_eq!(check_peer_name(b"nul\0", M), Err(NameError::BadChar(0)));
    }

    #[test]
    fn nvidia_peermem_params_as_in_595() {
        // Defaults (peerdirect_support=0, persistent_api_support not given).
        assert_eq!(check_nv_params(0, -1), Ok([NvParam::Same, NvParam::Same]));
        assert_eq!(check_nv_params(0, 0), Ok([NvParam::Same, NvParam::Same]));
        assert_eq!(
            check_nv_params(1, 1),
            Ok([NvParam::LegacyClientAsked, NvParam::PersistentOnlyAsked])
        );
        // nvidia-peermem fails the load with -EINVAL on anything else.
        for v in [2, -1, -2, i32::MAX, i32::MIN] {
            assert_eq!(
                check_nv_params(v, -1),
                Err(NvParamError::PeerdirectSupport(v))
            );
        }
        for v in [2, -2, 100, i32::MIN] {
            assert_eq!(
                check_nv_params(0, v),
                Err(NvParamError::PersistentApiSupport(v))
            );
        }
    }

    #[test]
    fn name_capacity_matches_the_abi() {
        // name[IB_PEER_MEMORY_NAME_MAX] with its terminating NUL.
        assert_eq!(PEER_NAME_MAX, 63);
    }

    #[test]
    fn the_nc_name_is_the_peer_name_with_its_suffix() {
        assert_eq!(
            NameBuf::join("nv_mem", NC_SUFFIX)
                .as_ref()
                .map(NameBuf::as_str),
            Some("nv_mem_nc")
        );
        // A peer_name of 60 characters leaves room for "_nc", 61 does not.
        let limit = PEER_NAME_MAX - NC_SUFFIX.len();
        assert_eq!(limit, 60);
        let long = [b'y'; PEER_NAME_MAX];
        let at_limit = check_peer_name(&long[..limit], limit);
        assert!(at_limit.is_ok());
        let nc = at_limit.ok().and_then(|n| NameBuf::join(n, NC_SUFFIX));
        assert_eq!(nc.as_ref().map(|n| n.as_str().len()), Some(PEER_NAME_MAX));
        assert_eq!(
            check_peer_name(&long[..limit + 1], limit),
            Err(NameError::TooLong)
        );
        let too_long = core::str::from_utf8(&long[..limit + 1]).unwrap_or("");
        assert!(NameBuf::join(too_long, NC_SUFFIX).is_none());
    }
}
