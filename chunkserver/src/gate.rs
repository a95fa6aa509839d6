//! The fencing gate: a token's version against the replica header's (DESIGN.md, contract 3).
//!
//! Callers run [`check`] under the per-chunk lock that also serializes the operation it
//! guards, so a version bump and a write can never interleave.

use crate::error::{Error, Result};
use stampfs_proto::{ChunkHandle, ChunkVersion};
use std::cmp::Ordering;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

/// Requests refused by this process's gate for presenting an older version than the
/// replica's (`metrics.rs` serves it).
static FENCED: AtomicU64 = AtomicU64::new(0);

/// How many requests were refused as fenced since the process started.
pub fn fenced_total() -> u64 {
    FENCED.load(AtomicOrdering::Relaxed)
}

/// Counts a refusal of a stale version made outside [`check`].
pub fn count_fenced() {
    FENCED.fetch_add(1, AtomicOrdering::Relaxed);
}

/// Equal: proceed. Lower: the presenter is fenced ([`Error::StaleToken`]). Higher: this
/// replica missed a bump and must not serve ([`Error::ReplicaStale`]).
pub fn check(handle: ChunkHandle, presented: ChunkVersion, current: ChunkVersion) -> Result<()> {
    match presented.cmp(&current) {
        Ordering::Equal => Ok(()),
        Ordering::Less => {
            count_fenced();
            Err(Error::StaleToken {
                handle,
                presented,
                current,
            })
        }
        Ordering::Greater => Err(Error::ReplicaStale {
            handle,
            presented,
            current,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{ErrorCode, RemoteError};

    const H: ChunkHandle = ChunkHandle(5);

    #[test]
    fn equal_versions_pass() {
        check(H, ChunkVersion(3), ChunkVersion(3)).expect("equal passes");
    }

    #[test]
    fn lower_is_a_stale_token_naming_both_versions() {
        let err = check(H, ChunkVersion(2), ChunkVersion(3)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::StaleToken);
        assert_eq!(
            err.to_remote(),
            RemoteError::StaleToken {
                handle: H,
                presented: ChunkVersion(2),
                current: ChunkVersion(3)
            }
        );
    }

    #[test]
    fn higher_means_this_replica_is_stale() {
        let err = check(H, ChunkVersion(4), ChunkVersion(3)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ReplicaStale);
        assert!(matches!(
            err,
            Error::ReplicaStale {
                presented: ChunkVersion(4),
                current: ChunkVersion(3),
                ..
            }
        ));
    }
}
