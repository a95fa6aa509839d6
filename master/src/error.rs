//! The master's error type.
//!
//! Client-facing variants mirror [`RemoteError`] with structured fields; the rest are
//! the master's own failures (configuration, disk, a corrupt log). [`Error::code`]
//! maps every variant to its wire code and [`Error::to_remote`] builds the reply.

use stampfs_proto::dirlock::{describe_holder, DirLockError};
use stampfs_proto::{ClientId, ErrorCode, RemoteError};
use std::path::PathBuf;

/// Everything that can go wrong in the master.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not found: {path}")]
    NotFound { path: String },
    #[error("already exists: {path}")]
    AlreadyExists { path: String },
    #[error("not a directory: {path}")]
    NotADirectory { path: String },
    #[error("is a directory: {path}")]
    IsADirectory { path: String },
    #[error("directory not empty: {path}")]
    DirectoryNotEmpty { path: String },
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },
    #[error("{path} is being written by {holder}; its lease expires in {expires_in_ms} ms")]
    LeaseConflict {
        path: String,
        holder: ClientId,
        expires_in_ms: u64,
    },
    #[error("the write lease on {path} is not held by {client}")]
    LeaseExpired { path: String, client: ClientId },
    #[error("lease recovery of {path} is in progress")]
    RecoveryInProgress { path: String },
    #[error("not enough live chunkservers: {live} live, {needed} needed")]
    NotEnoughReplicas { live: u32, needed: u32 },
    #[error("bad request: {reason}")]
    BadRequest { reason: String },
    #[error("not supported: {reason}")]
    NotSupported { reason: String },
    /// The caller lacks a permission bit (`EACCES`).
    #[error("permission denied: {path}: {reason}")]
    PermissionDenied { path: String, reason: String },
    /// Reserved to the owner or root (`EPERM`).
    #[error("operation not permitted: {path}: {reason}")]
    NotPermitted { path: String, reason: String },
    /// The peer has not proven who it is, or its proof was wrong.
    #[error("unauthenticated: {reason}")]
    Unauthenticated { reason: String },
    /// The entry's extended attributes would hold too many bytes (`E2BIG`).
    #[error("extended attributes of {path} would hold {bytes} bytes, past {max}")]
    XattrTooBig {
        path: String,
        bytes: usize,
        max: usize,
    },
    /// The request would take a directory past one of its quotas (`EDQUOT`).
    #[error("{}", stampfs_proto::describe_quota_exceeded(.path, *.resource, *.limit, *.used, *.requested))]
    QuotaExceeded {
        path: String,
        resource: stampfs_proto::QuotaResource,
        limit: u64,
        used: u64,
        requested: u64,
    },
    #[error("invalid configuration: {field}: {reason}")]
    Config { field: &'static str, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("operation log {path} is corrupt at offset {offset}: {reason}")]
    CorruptLog {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("checkpoint {path} is corrupt: {reason}")]
    CorruptCheckpoint { path: PathBuf, reason: String },
    #[error("replaying log record {lsn} failed: {reason}")]
    Replay { lsn: u64, reason: String },
    #[error("the operation log can no longer be written: {reason}")]
    LogFailed { reason: String },
    #[error("the master is shutting down")]
    ShuttingDown,
    #[error("{}", not_leader(.leader))]
    NotLeader { leader: Option<String> },
    #[error("this master lost the lead of its group before log record {lsn} committed: the change may or may not have been made (look before trying again)")]
    LeadershipLost { lsn: u64 },
    #[error("the master stopped serving: its state holds changes its operation log does not ({reason}); restart it to replay the log")]
    Halted { reason: String },
    #[error("cannot encode or decode metadata: {reason}")]
    Codec { reason: String },
    #[error(
        "master directory {} is in use by another master ({}); two masters must never share a directory",
        .dir.display(),
        describe_holder(.holder)
    )]
    DirLocked {
        dir: PathBuf,
        /// The pid the holder wrote into `DIR/LOCK`, if it has written it yet.
        holder: Option<u32>,
    },
    #[error(transparent)]
    Proto(#[from] stampfs_proto::Error),
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// A malformed request.
    pub fn bad_request(reason: impl Into<String>) -> Self {
        Error::BadRequest {
            reason: reason.into(),
        }
    }

    /// The stable wire code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotFound { .. } => ErrorCode::NotFound,
            Error::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            Error::NotADirectory { .. } => ErrorCode::NotADirectory,
            Error::IsADirectory { .. } => ErrorCode::IsADirectory,
            Error::DirectoryNotEmpty { .. } => ErrorCode::DirectoryNotEmpty,
            Error::InvalidPath { .. } => ErrorCode::InvalidPath,
            Error::LeaseConflict { .. } => ErrorCode::LeaseConflict,
            Error::LeaseExpired { .. } => ErrorCode::LeaseExpired,
            Error::RecoveryInProgress { .. } => ErrorCode::RecoveryInProgress,
            Error::NotEnoughReplicas { .. } => ErrorCode::NotEnoughReplicas,
            Error::BadRequest { .. } => ErrorCode::BadRequest,
            Error::NotSupported { .. } => ErrorCode::NotSupported,
            Error::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            Error::NotPermitted { .. } => ErrorCode::NotPermitted,
            Error::XattrTooBig { .. } => ErrorCode::XattrTooBig,
            Error::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            Error::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            Error::Config { .. } => ErrorCode::BadRequest,
            Error::Io { .. } => ErrorCode::Io,
            Error::CorruptLog { .. } => ErrorCode::Internal,
            Error::CorruptCheckpoint { .. } => ErrorCode::Internal,
            Error::Replay { .. } => ErrorCode::Internal,
            Error::LogFailed { .. } => ErrorCode::Unavailable,
            Error::ShuttingDown => ErrorCode::Unavailable,
            Error::NotLeader { .. } => ErrorCode::NotLeader,
            Error::LeadershipLost { .. } => ErrorCode::Unavailable,
            Error::Halted { .. } => ErrorCode::Internal,
            Error::Codec { .. } => ErrorCode::Internal,
            Error::DirLocked { .. } => ErrorCode::Unavailable,
            Error::Proto(e) => e.code(),
        }
    }

    /// This error as a reply to a peer.
    pub fn to_remote(&self) -> RemoteError {
        match self {
            Error::NotFound { path } => RemoteError::NotFound { what: path.clone() },
            Error::AlreadyExists { path } => RemoteError::AlreadyExists { path: path.clone() },
            Error::NotADirectory { path } => RemoteError::NotADirectory { path: path.clone() },
            Error::IsADirectory { path } => RemoteError::IsADirectory { path: path.clone() },
            Error::DirectoryNotEmpty { path } => {
                RemoteError::DirectoryNotEmpty { path: path.clone() }
            }
            Error::InvalidPath { path, reason } => RemoteError::InvalidPath {
                path: path.clone(),
                reason: reason.clone(),
            },
            Error::LeaseConflict {
                path,
                holder,
                expires_in_ms,
            } => RemoteError::LeaseConflict {
                path: path.clone(),
                holder: *holder,
                expires_in_ms: *expires_in_ms,
            },
            Error::LeaseExpired { path, .. } => RemoteError::LeaseExpired { path: path.clone() },
            Error::RecoveryInProgress { path } => {
                RemoteError::RecoveryInProgress { path: path.clone() }
            }
            Error::NotEnoughReplicas { live, needed } => RemoteError::NotEnoughReplicas {
                live: *live,
                needed: *needed,
            },
            Error::BadRequest { reason } => RemoteError::BadRequest {
                reason: reason.clone(),
            },
            Error::NotSupported { reason } => RemoteError::NotSupported {
                reason: reason.clone(),
            },
            Error::PermissionDenied { path, reason } => RemoteError::PermissionDenied {
                path: path.clone(),
                reason: reason.clone(),
            },
            Error::NotPermitted { path, reason } => RemoteError::NotPermitted {
                path: path.clone(),
                reason: reason.clone(),
            },
            Error::Unauthenticated { reason } => RemoteError::Unauthenticated {
                reason: reason.clone(),
            },
            Error::XattrTooBig { path, bytes, max } => RemoteError::XattrTooBig {
                path: path.clone(),
                bytes: *bytes as u64,
                max: *max as u64,
            },
            Error::QuotaExceeded {
                path,
                resource,
                limit,
                used,
                requested,
            } => RemoteError::QuotaExceeded {
                path: path.clone(),
                resource: *resource,
                limit: *limit,
                used: *used,
                requested: *requested,
            },
            Error::Io { .. } => RemoteError::Io {
                reason: self.to_string(),
            },
            Error::NotLeader { leader } => RemoteError::NotLeader {
                leader: leader.clone(),
            },
            Error::LogFailed { .. }
            | Error::ShuttingDown
            | Error::DirLocked { .. }
            | Error::LeadershipLost { .. } => RemoteError::Unavailable {
                reason: self.to_string(),
            },
            Error::Config { .. }
            | Error::CorruptLog { .. }
            | Error::CorruptCheckpoint { .. }
            | Error::Replay { .. }
            | Error::Halted { .. }
            | Error::Codec { .. } => RemoteError::Internal {
                reason: self.to_string(),
            },
            Error::Proto(e) => e.to_remote(),
        }
    }
}

fn not_leader(leader: &Option<String>) -> String {
    match leader {
        Some(addr) => format!("this master does not lead its group: the leader is at {addr}"),
        None => "this master does not lead its group, and no leader is known yet".into(),
    }
}

impl From<DirLockError> for Error {
    fn from(e: DirLockError) -> Self {
        match e {
            DirLockError::Locked { dir, holder } => Error::DirLocked { dir, holder },
            DirLockError::Io { path, source } => {
                Error::io(format!("lock {}", path.display()), source)
            }
        }
    }
}

impl From<RemoteError> for Error {
    fn from(e: RemoteError) -> Self {
        Error::Proto(stampfs_proto::Error::Remote(e))
    }
}

/// Result with the master's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_keep_their_fields_on_the_wire() {
        let e = Error::LeaseConflict {
            path: "/f".into(),
            holder: ClientId(7),
            expires_in_ms: 1500,
        };
        assert_eq!(e.code(), ErrorCode::LeaseConflict);
        assert_eq!(
            e.to_remote(),
            RemoteError::LeaseConflict {
                path: "/f".into(),
                holder: ClientId(7),
                expires_in_ms: 1500
            }
        );
        let e = Error::NotEnoughReplicas { live: 1, needed: 2 };
        assert_eq!(e.to_remote().code(), ErrorCode::NotEnoughReplicas);
    }

    #[test]
    fn a_directory_lock_failure_becomes_dir_locked() {
        let e = Error::from(DirLockError::Locked {
            dir: "/srv/m".into(),
            holder: Some(42),
        });
        assert!(
            matches!(&e, Error::DirLocked { dir, holder: Some(42) } if dir.as_os_str() == "/srv/m"),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "master directory /srv/m is in use by another master (pid 42); two masters must never share a directory"
        );
        assert_eq!(e.code(), ErrorCode::Unavailable);
        let e = Error::from(DirLockError::Io {
            path: "/srv/m/LOCK".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(e.to_string().starts_with("lock /srv/m/LOCK: "), "{e}");
    }

    #[test]
    fn remote_errors_pass_through() {
        let r = RemoteError::Unavailable {
            reason: "down".into(),
        };
        let e = Error::from(r.clone());
        assert_eq!(e.code(), ErrorCode::Unavailable);
        assert_eq!(e.to_remote(), r);
    }
}
