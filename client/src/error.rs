//! The client library's error type.

use crate::mount::MountpointProblem;
use stampfs_proto::{ChunkHandle, ChunkVersion, ErrorCode, RemoteError};
use std::path::PathBuf;

/// Errors returned by [`crate::Client`], writers and readers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The storage rejected this writer's token: another writer (or lease recovery)
    /// holds a newer version of the chunk. Every later call on the writer returns this
    /// too, and nothing is retried with the old token.
    #[error("{}", fenced_message(.path, .handle, .presented, .current))]
    Fenced {
        path: String,
        handle: Option<ChunkHandle>,
        presented: Option<ChunkVersion>,
        current: Option<ChunkVersion>,
    },
    /// The master or a chunkserver answered with an error.
    #[error(transparent)]
    Remote(RemoteError),
    /// Framing, decoding or connection trouble.
    #[error(transparent)]
    Proto(stampfs_proto::Error),
    /// No replica of a chunk could serve a read.
    #[error("no replica of chunk {handle} could be read: {last}")]
    NoReplica { handle: ChunkHandle, last: String },
    /// The write pipeline failed and could not be recovered.
    #[error("write pipeline for {path} failed: {reason}")]
    Pipeline { path: String, reason: String },
    /// The writer was closed, or failed earlier.
    #[error("the writer for {path} is closed")]
    WriterClosed { path: String },
    #[error("invalid argument: {reason}")]
    InvalidArgument { reason: String },
    /// An operation stampfs does not support (yet), saying which and why.
    #[error("{path}: not supported: {reason}")]
    NotSupported { path: String, reason: String },
    /// [`crate::Mount::start`] refused the mount point, saying why.
    #[error("mount point {}: {problem}", path.display())]
    Mountpoint {
        path: PathBuf,
        problem: MountpointProblem,
    },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

fn fenced_message(
    path: &str,
    handle: &Option<ChunkHandle>,
    presented: &Option<ChunkVersion>,
    current: &Option<ChunkVersion>,
) -> String {
    let chunk = handle.map(|h| format!(" (chunk {h})")).unwrap_or_default();
    match (presented, current) {
        (Some(p), Some(c)) => format!(
            "writer of {path} was fenced{chunk}: presented version {p}, current version {c}"
        ),
        (Some(p), None) => {
            format!("writer of {path} was fenced{chunk}: presented version {p}, its lease was lost")
        }
        _ => format!("writer of {path} was fenced{chunk}: its lease was lost"),
    }
}

impl From<stampfs_proto::Error> for Error {
    fn from(e: stampfs_proto::Error) -> Self {
        match e {
            stampfs_proto::Error::Remote(r) => Error::Remote(r),
            other => Error::Proto(other),
        }
    }
}

impl From<RemoteError> for Error {
    fn from(e: RemoteError) -> Self {
        Error::Remote(e)
    }
}

impl Error {
    /// The wire code closest to this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Fenced { .. } => ErrorCode::StaleToken,
            Error::Remote(r) => r.code(),
            Error::Proto(p) => p.code(),
            Error::NoReplica { .. } => ErrorCode::Unavailable,
            Error::Pipeline { .. } => ErrorCode::Unavailable,
            Error::WriterClosed { .. } => ErrorCode::BadRequest,
            Error::InvalidArgument { .. } => ErrorCode::BadRequest,
            Error::NotSupported { .. } => ErrorCode::NotSupported,
            Error::Mountpoint { .. } => ErrorCode::BadRequest,
            Error::Io(_) => ErrorCode::Io,
        }
    }

    /// True when this writer has been fenced (exit status 3 in the CLI).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Fenced { .. })
    }

    /// Whether a directory quota refused this (`EDQUOT`): a writer refused so has its
    /// file closed at what fit (see the writer's runtime).
    pub fn is_quota_exceeded(&self) -> bool {
        matches!(
            self,
            Error::Remote(stampfs_proto::RemoteError::QuotaExceeded { .. })
        )
    }

    /// Recovers a library error carried inside an `std::io::Error` (from the
    /// `AsyncWrite`/`AsyncRead` impls), or wraps the I/O error.
    pub fn from_io(e: std::io::Error) -> Self {
        if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
            if let Some(inner) = e.into_inner() {
                if let Ok(err) = inner.downcast::<Error>() {
                    return *err;
                }
            }
            return Error::InvalidArgument {
                reason: "unrecoverable wrapped error".into(),
            };
        }
        Error::Io(e)
    }

    /// A copy good enough to hand to several callers (the writer of `path` reports one
    /// failure to every later call). Errors that cannot be cloned become a
    /// [`Error::Pipeline`] of `path` that carries their message.
    pub(crate) fn duplicate(&self, path: &str) -> Error {
        match self {
            Error::Fenced {
                path,
                handle,
                presented,
                current,
            } => Error::Fenced {
                path: path.clone(),
                handle: *handle,
                presented: *presented,
                current: *current,
            },
            Error::Remote(r) => Error::Remote(r.clone()),
            Error::NoReplica { handle, last } => Error::NoReplica {
                handle: *handle,
                last: last.clone(),
            },
            Error::WriterClosed { path } => Error::WriterClosed { path: path.clone() },
            Error::NotSupported { path, reason } => Error::NotSupported {
                path: path.clone(),
                reason: reason.clone(),
            },
            Error::Pipeline { path, reason } => Error::Pipeline {
                path: path.clone(),
                reason: reason.clone(),
            },
            other => Error::Pipeline {
                path: path.to_string(),
                reason: other.to_string(),
            },
        }
    }

    pub(crate) fn into_io(self) -> std::io::Error {
        let kind = match &self {
            Error::Remote(RemoteError::NotFound { .. }) => std::io::ErrorKind::NotFound,
            Error::Fenced { .. } => std::io::ErrorKind::PermissionDenied,
            Error::NotSupported { .. } => std::io::ErrorKind::Unsupported,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, self)
    }
}

/// Result with the client's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicated_failure_names_the_path_once() {
        let e = Error::Pipeline {
            path: "/f".into(),
            reason: "gave up".into(),
        };
        assert_eq!(
            e.duplicate("/f").to_string(),
            "write pipeline for /f failed: gave up"
        );
        let e = Error::Proto(stampfs_proto::Error::Truncated);
        assert_eq!(
            e.duplicate("/f").to_string(),
            "write pipeline for /f failed: connection closed in the middle of a frame"
        );
        assert!(Error::Fenced {
            path: "/f".into(),
            handle: None,
            presented: None,
            current: None
        }
        .duplicate("/f")
        .is_fenced());
    }
}
