//! How library errors become the errno a program sees through the mount.

use crate::error::Error;
use fuser::Errno;
use stampfs_proto::ErrorCode;

/// The errno for a stable error code: one arm per code, no catch-all, so a new code
/// has to be placed here on purpose.
pub(crate) fn errno_of_code(code: ErrorCode) -> Errno {
    match code {
        ErrorCode::NotFound => Errno::ENOENT,
        ErrorCode::AlreadyExists => Errno::EEXIST,
        ErrorCode::NotADirectory => Errno::ENOTDIR,
        ErrorCode::IsADirectory => Errno::EISDIR,
        ErrorCode::DirectoryNotEmpty => Errno::ENOTEMPTY,
        ErrorCode::LeaseConflict => Errno::EBUSY,
        ErrorCode::RecoveryInProgress => Errno::EBUSY,
        ErrorCode::NoSpace => Errno::ENOSPC,
        ErrorCode::InvalidPath => Errno::EINVAL,
        ErrorCode::BadRequest => Errno::EINVAL,
        ErrorCode::NotSupported => Errno::EOPNOTSUPP,
        ErrorCode::PermissionDenied => Errno::EACCES,
        ErrorCode::Unauthenticated => Errno::EACCES,
        ErrorCode::NotPermitted => Errno::EPERM,
        ErrorCode::XattrTooBig => Errno::E2BIG,
        ErrorCode::QuotaExceeded => Errno::EDQUOT,
        ErrorCode::Unavailable => Errno::EIO,
        // A master that does not lead its group (the mount follows no leader yet).
        ErrorCode::NotLeader => Errno::EIO,
        ErrorCode::NotEnoughReplicas => Errno::EIO,
        // A fenced or expired writer: the storage refused this mount's token.
        ErrorCode::StaleToken => Errno::EIO,
        ErrorCode::LeaseExpired => Errno::EIO,
        ErrorCode::ReplicaStale => Errno::EIO,
        ErrorCode::BadToken => Errno::EIO,
        ErrorCode::ChecksumMismatch => Errno::EIO,
        ErrorCode::Internal => Errno::EIO,
        ErrorCode::FrameTooLarge => Errno::EIO,
        ErrorCode::MalformedFrame => Errno::EIO,
        ErrorCode::Io => Errno::EIO,
        // A replica's own trouble, which the writer routes around; seen only when it
        // could not.
        ErrorCode::ReplicaShort => Errno::EIO,
        ErrorCode::ReplicaFinalized => Errno::EIO,
    }
}

/// The errno for a library error met while serving `op` on `path`. Errors that a
/// program cannot explain from the errno alone (fencing, I/O trouble) are logged once
/// here, with the library's full message.
pub(crate) fn errno_for(e: &Error, op: &'static str, path: &str) -> Errno {
    let errno = match e {
        Error::Io(io) => io.raw_os_error().map_or(Errno::EIO, Errno::from_i32),
        other => errno_of_code(other.code()),
    };
    if e.is_fenced() {
        tracing::error!(
            op,
            path,
            error = %e,
            "writer fenced: the storage rejected this mount's chunk version (the file was \
             taken over by lease recovery or another writer); returning EIO"
        );
    } else if errno == Errno::EIO {
        tracing::warn!(op, path, error = %e, "returning EIO");
    } else {
        tracing::debug!(op, path, error = %e, errno = ?errno, "request failed");
    }
    errno
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{ClientId, RemoteError};

    #[test]
    fn namespace_errors_map_to_their_posix_meaning() {
        let cases = [
            (RemoteError::NotFound { what: "x".into() }, Errno::ENOENT),
            (
                RemoteError::AlreadyExists { path: "/x".into() },
                Errno::EEXIST,
            ),
            (
                RemoteError::NotADirectory { path: "/x".into() },
                Errno::ENOTDIR,
            ),
            (
                RemoteError::DirectoryNotEmpty { path: "/x".into() },
                Errno::ENOTEMPTY,
            ),
            (
                RemoteError::LeaseConflict {
                    path: "/x".into(),
                    holder: ClientId::random(),
                    expires_in_ms: 5,
                },
                Errno::EBUSY,
            ),
            (
                RemoteError::InvalidPath {
                    path: "x".into(),
                    reason: "relative".into(),
                },
                Errno::EINVAL,
            ),
            (
                RemoteError::NotSupported {
                    reason: "later".into(),
                },
                Errno::EOPNOTSUPP,
            ),
            (
                RemoteError::QuotaExceeded {
                    path: "/q".into(),
                    resource: stampfs_proto::QuotaResource::Bytes,
                    limit: 10,
                    used: 9,
                    requested: 3,
                },
                Errno::EDQUOT,
            ),
        ];
        for (remote, want) in cases {
            assert_eq!(errno_for(&Error::Remote(remote), "test", "/x"), want);
        }
    }

    #[test]
    fn fenced_writers_and_transport_trouble_are_eio() {
        let fenced = Error::Fenced {
            path: "/x".into(),
            handle: None,
            presented: None,
            current: None,
        };
        assert_eq!(errno_for(&fenced, "write", "/x"), Errno::EIO);
        let io = Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(errno_for(&io, "write", "/x"), Errno::ENOSPC);
        let plain = Error::Io(std::io::Error::other("boom"));
        assert_eq!(errno_for(&plain, "write", "/x"), Errno::EIO);
    }
}
