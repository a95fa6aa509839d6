//! The chunkserver's error type.
//!
//! Every variant maps to a stable [`ErrorCode`] through [`Error::code`] and to the typed
//! [`RemoteError`] a peer receives through [`Error::to_remote`]. Gate failures carry the
//! versions involved, so a fenced writer learns the version it presented and the
//! current one.

use stampfs_proto::dirlock::{describe_holder, DirLockError};
use stampfs_proto::{ChunkHandle, ChunkVersion, ErrorCode, RemoteError};
use std::path::PathBuf;

/// Errors of the chunkserver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The token's version is below the replica's: the writer has been fenced.
    #[error(
        "stale token for chunk {handle}: presented version {presented}, current version {current}"
    )]
    StaleToken {
        handle: ChunkHandle,
        presented: ChunkVersion,
        current: ChunkVersion,
    },
    /// The token's version is above the replica's: this replica missed a bump.
    #[error(
        "replica of chunk {handle} is stale: token version {presented}, replica version {current}"
    )]
    ReplicaStale {
        handle: ChunkHandle,
        presented: ChunkVersion,
        current: ChunkVersion,
    },
    /// A token whose MAC does not verify under the cluster key.
    #[error("token for chunk {handle} failed authentication")]
    BadToken { handle: ChunkHandle },
    /// A master command whose MAC does not verify under the cluster key.
    #[error("master command failed authentication")]
    BadCommand,
    /// An authentic master command this chunkserver will not apply: a replay, one
    /// signed for another chunkserver or an earlier registration (see
    /// `stampfs_proto::replay`).
    #[error("master command refused: {reason}")]
    CommandRefused { reason: String },
    /// Data on disk (or a packet on the wire) does not match its CRC32.
    #[error("checksum mismatch in chunk {handle} at offset {offset}")]
    ChecksumMismatch { handle: ChunkHandle, offset: u64 },
    /// This chunkserver holds no replica of the chunk.
    #[error("no replica of chunk {handle} on this chunkserver")]
    NotFound { handle: ChunkHandle },
    /// A request that is well-formed but not acceptable (not contiguous, too long, ...).
    #[error("bad request: {reason}")]
    BadRequest { reason: String },
    /// A replica header slot that does not decode.
    #[error("corrupt replica header: {reason}")]
    CorruptHeader { reason: String },
    /// A disk operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A peer or the master could not be reached or went away.
    #[error("unavailable: {reason}")]
    Unavailable { reason: String },
    /// The replica holds `length` bytes, short of `offset` (see
    /// [`RemoteError::ReplicaShort`]).
    #[error("replica of chunk {handle} holds {length} bytes, short of offset {offset}")]
    ReplicaShort {
        handle: ChunkHandle,
        offset: u64,
        length: u64,
    },
    /// The replica is finalized at `length` (see [`RemoteError::ReplicaFinalized`]).
    #[error("replica of chunk {handle} is finalized at {length} bytes")]
    ReplicaFinalized { handle: ChunkHandle, length: u64 },
    /// A broken expectation inside the chunkserver (a bug, reported, never a panic).
    #[error("internal error: {reason}")]
    Internal { reason: String },
    /// A configuration value is unusable.
    #[error("invalid configuration --{field}: {reason}")]
    Config { field: &'static str, reason: String },
    /// The cluster key file could not be loaded (the chunkserver refuses to start).
    #[error("cannot load the cluster key: {0}")]
    ClusterKey(#[source] stampfs_proto::Error),
    /// Another chunkserver (in any process) serves from this data directory; this one
    /// refuses to start before it reads or changes anything there.
    #[error(
        "chunkserver directory {} is in use by another chunkserver ({}); two chunkservers must never share a directory",
        .dir.display(),
        describe_holder(.holder)
    )]
    DirLocked {
        dir: PathBuf,
        /// The pid the holder wrote into `DIR/LOCK`, if it has written it yet.
        holder: Option<u32>,
    },
    /// Framing, decoding or a typed error from a peer.
    #[error(transparent)]
    Proto(#[from] stampfs_proto::Error),
}

impl Error {
    /// An I/O error with the operation and the path it concerned.
    pub fn io(op: &'static str, path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// A [`Error::BadRequest`] with `reason`.
    pub fn bad_request(reason: impl Into<String>) -> Self {
        Error::BadRequest {
            reason: reason.into(),
        }
    }

    /// The wire code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::StaleToken { .. } => ErrorCode::StaleToken,
            Error::ReplicaStale { .. } => ErrorCode::ReplicaStale,
            Error::BadToken { .. } => ErrorCode::BadToken,
            Error::BadCommand | Error::CommandRefused { .. } => ErrorCode::BadToken,
            Error::ChecksumMismatch { .. } => ErrorCode::ChecksumMismatch,
            Error::NotFound { .. } => ErrorCode::NotFound,
            Error::BadRequest { .. } => ErrorCode::BadRequest,
            Error::CorruptHeader { .. } => ErrorCode::Io,
            Error::Io { .. } => ErrorCode::Io,
            Error::Unavailable { .. } => ErrorCode::Unavailable,
            Error::Internal { .. } => ErrorCode::Internal,
            Error::ReplicaShort { .. } => ErrorCode::ReplicaShort,
            Error::ReplicaFinalized { .. } => ErrorCode::ReplicaFinalized,
            Error::Config { .. } => ErrorCode::BadRequest,
            Error::ClusterKey(_) => ErrorCode::BadRequest,
            Error::DirLocked { .. } => ErrorCode::Unavailable,
            Error::Proto(e) => e.code(),
        }
    }

    /// This error as it is sent to a peer.
    pub fn to_remote(&self) -> RemoteError {
        match self {
            Error::StaleToken {
                handle,
                presented,
                current,
            } => RemoteError::StaleToken {
                handle: *handle,
                presented: *presented,
                current: *current,
            },
            Error::ReplicaStale {
                handle,
                presented,
                current,
            } => RemoteError::ReplicaStale {
                handle: *handle,
                presented: *presented,
                current: *current,
            },
            Error::BadToken { handle } => RemoteError::BadToken { handle: *handle },
            Error::BadCommand | Error::CommandRefused { .. } => RemoteError::BadRequest {
                reason: self.to_string(),
            },
            Error::ChecksumMismatch { handle, offset } => RemoteError::ChecksumMismatch {
                handle: *handle,
                offset: *offset,
            },
            Error::NotFound { handle } => RemoteError::NotFound {
                what: format!("replica of chunk {handle}"),
            },
            Error::BadRequest { reason } => RemoteError::BadRequest {
                reason: reason.clone(),
            },
            Error::CorruptHeader { .. } | Error::Io { .. } => RemoteError::Io {
                reason: self.to_string(),
            },
            Error::Unavailable { reason } => RemoteError::Unavailable {
                reason: reason.clone(),
            },
            Error::DirLocked { .. } => RemoteError::Unavailable {
                reason: self.to_string(),
            },
            Error::Internal { reason } => RemoteError::Internal {
                reason: reason.clone(),
            },
            Error::ReplicaShort {
                handle,
                offset,
                length,
            } => RemoteError::ReplicaShort {
                handle: *handle,
                offset: *offset,
                length: *length,
            },
            Error::ReplicaFinalized { handle, length } => RemoteError::ReplicaFinalized {
                handle: *handle,
                length: *length,
            },
            Error::Config { .. } | Error::ClusterKey(_) => RemoteError::BadRequest {
                reason: self.to_string(),
            },
            Error::Proto(e) => e.to_remote(),
        }
    }
}

impl From<RemoteError> for Error {
    fn from(e: RemoteError) -> Self {
        Error::Proto(stampfs_proto::Error::Remote(e))
    }
}

impl From<DirLockError> for Error {
    fn from(e: DirLockError) -> Self {
        match e {
            DirLockError::Locked { dir, holder } => Error::DirLocked { dir, holder },
            DirLockError::Io { path, source } => Error::io("lock", path, source),
        }
    }
}

/// Result with the chunkserver's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_lock_failure_names_the_directory_and_the_holder() {
        let e = Error::from(DirLockError::Locked {
            dir: "/srv/cs0".into(),
            holder: Some(42),
        });
        assert!(
            matches!(&e, Error::DirLocked { dir, holder: Some(42) } if dir.as_os_str() == "/srv/cs0"),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.starts_with(
                "chunkserver directory /srv/cs0 is in use by another chunkserver (pid 42)"
            ),
            "{text}"
        );
        assert_eq!(e.code(), ErrorCode::Unavailable);
        assert_eq!(e.to_remote().code(), ErrorCode::Unavailable);
        let e = Error::from(DirLockError::Locked {
            dir: "/srv/cs0".into(),
            holder: None,
        });
        assert!(e.to_string().contains("(pid not recorded yet)"), "{e}");
        let e = Error::from(DirLockError::Io {
            path: "/srv/cs0/LOCK".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
        assert!(matches!(e, Error::Io { op: "lock", .. }), "{e}");
        assert!(e.to_string().starts_with("lock /srv/cs0/LOCK: "), "{e}");
        assert_eq!(e.code(), ErrorCode::Io);
    }
}
