//! Error codes on the wire, and this crate's error type.
//!
//! [`RemoteError`] is what a server sends back instead of a reply: a typed error with
//! structured fields (a fenced writer learns the version it presented and the current
//! one). [`ErrorCode`] is its stable numeric code. [`Error`] is the proto crate's own
//! error: framing, decoding, key files, or a [`RemoteError`] received from a peer.

use crate::ids::{ChunkHandle, ChunkVersion, ChunkserverId, ClientId};
use bincode::{Decode, Encode};

/// Stable numeric error codes. Never renumber; add new codes at the end.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    StaleToken = 1,
    ReplicaStale = 2,
    BadToken = 3,
    ChecksumMismatch = 4,
    NotFound = 5,
    AlreadyExists = 6,
    NotADirectory = 7,
    IsADirectory = 8,
    DirectoryNotEmpty = 9,
    LeaseConflict = 10,
    LeaseExpired = 11,
    RecoveryInProgress = 12,
    NoSpace = 13,
    NotEnoughReplicas = 14,
    BadRequest = 15,
    Internal = 16,
    FrameTooLarge = 17,
    MalformedFrame = 18,
    Io = 19,
    Unavailable = 20,
    InvalidPath = 21,
    NotSupported = 22,
    ReplicaShort = 23,
    ReplicaFinalized = 24,
    PermissionDenied = 25,
    NotPermitted = 26,
    XattrTooBig = 27,
    Unauthenticated = 28,
    NotLeader = 29,
    QuotaExceeded = 30,
}

/// A typed error carried in a reply frame.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, thiserror::Error)]
pub enum RemoteError {
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
    #[error("token for chunk {handle} failed authentication")]
    BadToken { handle: ChunkHandle },
    #[error("checksum mismatch in chunk {handle} at offset {offset}")]
    ChecksumMismatch { handle: ChunkHandle, offset: u64 },
    #[error("not found: {what}")]
    NotFound { what: String },
    #[error("already exists: {path}")]
    AlreadyExists { path: String },
    #[error("not a directory: {path}")]
    NotADirectory { path: String },
    #[error("is a directory: {path}")]
    IsADirectory { path: String },
    #[error("directory not empty: {path}")]
    DirectoryNotEmpty { path: String },
    /// `holder` is [`ClientId::MASTER`] when the master does not name it (to a user
    /// other than a superuser).
    #[error("{path} is being written by {}; its lease expires in {expires_in_ms} ms", holder_name(.holder))]
    LeaseConflict {
        path: String,
        holder: ClientId,
        expires_in_ms: u64,
    },
    #[error("the write lease on {path} is no longer held by this client")]
    LeaseExpired { path: String },
    #[error("lease recovery of {path} is in progress")]
    RecoveryInProgress { path: String },
    #[error("no space left on {chunkserver}")]
    NoSpace { chunkserver: ChunkserverId },
    #[error("not enough live chunkservers: {live} live, {needed} needed")]
    NotEnoughReplicas { live: u32, needed: u32 },
    #[error("bad request: {reason}")]
    BadRequest { reason: String },
    #[error("internal error: {reason}")]
    Internal { reason: String },
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: u64, max: u64 },
    #[error("malformed frame: {reason}")]
    MalformedFrame { reason: String },
    #[error("I/O error: {reason}")]
    Io { reason: String },
    #[error("unavailable: {reason}")]
    Unavailable { reason: String },
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },
    #[error("not supported: {reason}")]
    NotSupported { reason: String },
    /// The replica holds fewer bytes than the request needs (a stream set-up or write
    /// past its end, a truncate or finalize longer than it): it missed bytes. Appended
    /// after every older variant, so their wire indexes stay.
    #[error("replica of chunk {handle} holds {length} bytes, short of offset {offset}")]
    ReplicaShort {
        handle: ChunkHandle,
        offset: u64,
        length: u64,
    },
    /// The replica is finalized at `length`: writing to it needs a version bump first,
    /// and it is not finalized again at another length.
    #[error("replica of chunk {handle} is finalized at {length} bytes")]
    ReplicaFinalized { handle: ChunkHandle, length: u64 },
    /// The caller lacks a permission bit on `path` (`EACCES`).
    #[error("permission denied: {path}: {reason}")]
    PermissionDenied { path: String, reason: String },
    /// The operation is reserved to the entry's owner or root (`EPERM`).
    #[error("operation not permitted: {path}: {reason}")]
    NotPermitted { path: String, reason: String },
    /// The extended attributes of `path` would hold `bytes`, past `max` (`E2BIG`).
    #[error("extended attributes of {path} would hold {bytes} bytes, past {max}")]
    XattrTooBig { path: String, bytes: u64, max: u64 },
    /// The request needs a party that has proven who it is, and this one has not (or
    /// its proof was wrong).
    #[error("unauthenticated: {reason}")]
    Unauthenticated { reason: String },
    /// This master is a member of a group that another member leads (its address, when
    /// known): the request was not served; send it to the leader.
    #[error("not the leader of the master group{}", .leader.as_ref().map(|a| format!(": the leader is at {a}")).unwrap_or_default())]
    NotLeader { leader: Option<String> },
    /// The request would take a directory past one of its quotas (`EDQUOT`): nothing
    /// was changed.
    #[error("{}", crate::msg::describe_quota_exceeded(.path, *.resource, *.limit, *.used, *.requested))]
    QuotaExceeded {
        path: String,
        resource: crate::msg::QuotaResource,
        limit: u64,
        used: u64,
        requested: u64,
    },
}

impl RemoteError {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            RemoteError::StaleToken { .. } => ErrorCode::StaleToken,
            RemoteError::ReplicaStale { .. } => ErrorCode::ReplicaStale,
            RemoteError::BadToken { .. } => ErrorCode::BadToken,
            RemoteError::ChecksumMismatch { .. } => ErrorCode::ChecksumMismatch,
            RemoteError::NotFound { .. } => ErrorCode::NotFound,
            RemoteError::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            RemoteError::NotADirectory { .. } => ErrorCode::NotADirectory,
            RemoteError::IsADirectory { .. } => ErrorCode::IsADirectory,
            RemoteError::DirectoryNotEmpty { .. } => ErrorCode::DirectoryNotEmpty,
            RemoteError::LeaseConflict { .. } => ErrorCode::LeaseConflict,
            RemoteError::LeaseExpired { .. } => ErrorCode::LeaseExpired,
            RemoteError::RecoveryInProgress { .. } => ErrorCode::RecoveryInProgress,
            RemoteError::NoSpace { .. } => ErrorCode::NoSpace,
            RemoteError::NotEnoughReplicas { .. } => ErrorCode::NotEnoughReplicas,
            RemoteError::BadRequest { .. } => ErrorCode::BadRequest,
            RemoteError::Internal { .. } => ErrorCode::Internal,
            RemoteError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            RemoteError::MalformedFrame { .. } => ErrorCode::MalformedFrame,
            RemoteError::Io { .. } => ErrorCode::Io,
            RemoteError::Unavailable { .. } => ErrorCode::Unavailable,
            RemoteError::InvalidPath { .. } => ErrorCode::InvalidPath,
            RemoteError::NotSupported { .. } => ErrorCode::NotSupported,
            RemoteError::ReplicaShort { .. } => ErrorCode::ReplicaShort,
            RemoteError::ReplicaFinalized { .. } => ErrorCode::ReplicaFinalized,
            RemoteError::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            RemoteError::NotPermitted { .. } => ErrorCode::NotPermitted,
            RemoteError::XattrTooBig { .. } => ErrorCode::XattrTooBig,
            RemoteError::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            RemoteError::NotLeader { .. } => ErrorCode::NotLeader,
            RemoteError::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
        }
    }
}

/// Errors of the proto crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: u64 },
    #[error("frame checksum mismatch: header says {expected:#010x}, body has {actual:#010x}")]
    FrameChecksum { expected: u32, actual: u32 },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("malformed frame: {reason}")]
    Malformed { reason: String },
    #[error("cannot encode message: {reason}")]
    Encode { reason: String },
    #[error("token for chunk {handle} failed authentication")]
    BadToken { handle: ChunkHandle },
    #[error("master command failed authentication")]
    BadCommandMac,
    #[error("invalid cluster key: {reason}")]
    InvalidKey { reason: String },
    #[error("cluster key file {path}: {reason}")]
    KeyFile { path: String, reason: String },
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },
    #[error("TLS file {path}: {reason}")]
    TlsFile { path: String, reason: String },
    #[error("reply to request {got} arrived where {expected} was awaited")]
    UnexpectedReply { expected: u64, got: u64 },
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

impl Error {
    /// The wire code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Io(_) => ErrorCode::Io,
            Error::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            Error::FrameChecksum { .. } => ErrorCode::MalformedFrame,
            Error::Truncated => ErrorCode::MalformedFrame,
            Error::Malformed { .. } => ErrorCode::MalformedFrame,
            Error::Encode { .. } => ErrorCode::Internal,
            Error::BadToken { .. } => ErrorCode::BadToken,
            Error::BadCommandMac => ErrorCode::BadToken,
            Error::InvalidKey { .. } => ErrorCode::BadRequest,
            Error::KeyFile { .. } | Error::TlsFile { .. } => ErrorCode::Io,
            Error::InvalidPath { .. } => ErrorCode::InvalidPath,
            Error::UnexpectedReply { .. } => ErrorCode::MalformedFrame,
            Error::Remote(r) => r.code(),
        }
    }

    /// This error as it is sent to a peer.
    pub fn to_remote(&self) -> RemoteError {
        match self {
            Error::Io(e) => RemoteError::Io {
                reason: e.to_string(),
            },
            Error::FrameTooLarge { len, max } => RemoteError::FrameTooLarge {
                len: *len,
                max: *max,
            },
            Error::BadToken { handle } => RemoteError::BadToken { handle: *handle },
            Error::InvalidPath { path, reason } => RemoteError::InvalidPath {
                path: path.clone(),
                reason: reason.clone(),
            },
            Error::Remote(r) => r.clone(),
            Error::FrameChecksum { .. }
            | Error::Truncated
            | Error::Malformed { .. }
            | Error::UnexpectedReply { .. } => RemoteError::MalformedFrame {
                reason: self.to_string(),
            },
            Error::BadCommandMac | Error::InvalidKey { .. } => RemoteError::BadRequest {
                reason: self.to_string(),
            },
            Error::Encode { .. } | Error::KeyFile { .. } | Error::TlsFile { .. } => {
                RemoteError::Internal {
                    reason: self.to_string(),
                }
            }
        }
    }
}

/// Result with the proto crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a lease holder is named in an error: its id, or "another client" when the
/// master keeps it to itself.
fn holder_name(holder: &ClientId) -> String {
    if *holder == ClientId::MASTER {
        "another client".to_string()
    } else {
        holder.to_string()
    }
}
