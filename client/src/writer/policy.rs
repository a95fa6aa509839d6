//! The writer's rules, as pure functions: what a stream's end means, where a reopened
//! stream starts, which set-up refusals end the writer. The [`engine`](super::engine)
//! applies them; each is tested here on its own.

use crate::error::Error;
use crate::pipeline::StreamEnd;
use stampfs_proto::{ChunkserverId, RemoteError};

/// Pipeline recoveries tried for one failure before giving up.
pub(crate) const MAX_RECOVERIES: usize = 6;

/// What the writer does when its stream to the pipeline's head ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EndAction {
    /// Open a new stream with the same token at the acknowledged offset (no master
    /// call) and send the unacknowledged packets again.
    Reopen,
    /// Pipeline recovery without the head: a version bump over the others.
    ExcludeHead,
}

/// Decides what a stream's end means. `outstanding`: packets were in flight when the
/// writer saw the end. `quiet_burst`: all of them went out after the stream had been
/// at rest, and no ack came back since (the engine's `Chunk::quiet_burst`).
///
/// A chunkserver closes a stream for idleness only while none of its packets is
/// outstanding, so a *closed* stream (EOF, reset, broken pipe) is an idle close when
/// nothing was in flight; and when everything in flight was sent after a quiet spell
/// with no ack since, the close may have come before those packets left (the writer
/// had not yet seen the EOF): it is treated the same. A stream that the head closed
/// while acking the packets around it, or that broke any other way (garbage, an ack
/// or send that timed out), excludes the head. Treating a dead head as idle is safe:
/// the reopen cannot reach it, and then it is excluded.
pub(crate) fn after_stream_end(end: StreamEnd, outstanding: bool, quiet_burst: bool) -> EndAction {
    match end {
        StreamEnd::Closed if !outstanding || quiet_burst => EndAction::Reopen,
        StreamEnd::Closed | StreamEnd::Broken => EndAction::ExcludeHead,
    }
}

/// The replicas a stream's end excludes.
pub(crate) fn excluded(action: EndAction, head: Option<ChunkserverId>) -> Vec<ChunkserverId> {
    match action {
        EndAction::Reopen => Vec::new(),
        EndAction::ExcludeHead => head.into_iter().collect(),
    }
}

/// Where a reopened stream starts: the least that every member of the (new) pipeline
/// holds, between what this writer saw acknowledged (`acked`) and the end of what it
/// sent (`unacked_end`); `acked` when a member did not answer.
///
/// Not `acked` itself: the members may all hold bytes whose ack never reached this
/// writer, and a reader may have read them (a reader reads what every replica holds).
/// Opening at `acked` would cut them; if this writer then died before its resend, lease
/// recovery would find them gone, and the reader would have seen bytes that are not in
/// the file (the nemesis saw exactly that). What every member holds came from this
/// writer's own stream, so the packets resent below the start are idempotent retries.
pub(crate) fn resume_offset(acked: u64, unacked_end: u64, lengths: &[Option<u64>]) -> u64 {
    if lengths.iter().any(Option::is_none) {
        return acked;
    }
    lengths
        .iter()
        .flatten()
        .min()
        .copied()
        .unwrap_or(acked)
        .clamp(acked, unacked_end.max(acked))
}

/// Whether the head's refusal of a stream set-up ends the writer (after `StaleToken`,
/// which fences it, was handled). A refusal about the head's own replica — missing,
/// short of the stream's offset after a crash (`ReplicaShort`), finalized, stale,
/// corrupt, an I/O error — is that replica's failure: the writer goes on without it
/// through a version bump, exactly as if the head were unreachable, so the bytes the
/// other replicas hold are never lost to it. Only a refusal of the token itself (which
/// every chunkserver of the cluster would give) or of the request's shape
/// (`BadRequest`, kept for malformed requests) ends the writer.
pub(crate) fn head_refusal_is_fatal(e: &RemoteError) -> bool {
    match e {
        RemoteError::BadToken { .. }
        | RemoteError::BadRequest { .. }
        | RemoteError::FrameTooLarge { .. }
        | RemoteError::MalformedFrame { .. }
        | RemoteError::InvalidPath { .. }
        | RemoteError::PermissionDenied { .. }
        | RemoteError::NotPermitted { .. }
        | RemoteError::XattrTooBig { .. }
        | RemoteError::QuotaExceeded { .. }
        | RemoteError::Unauthenticated { .. } => true,
        RemoteError::StaleToken { .. }
        | RemoteError::ReplicaStale { .. }
        | RemoteError::ChecksumMismatch { .. }
        | RemoteError::NotFound { .. }
        | RemoteError::ReplicaShort { .. }
        | RemoteError::ReplicaFinalized { .. }
        | RemoteError::Internal { .. }
        | RemoteError::Io { .. }
        | RemoteError::Unavailable { .. }
        | RemoteError::NoSpace { .. }
        | RemoteError::AlreadyExists { .. }
        | RemoteError::NotADirectory { .. }
        | RemoteError::IsADirectory { .. }
        | RemoteError::DirectoryNotEmpty { .. }
        | RemoteError::LeaseConflict { .. }
        | RemoteError::LeaseExpired { .. }
        | RemoteError::RecoveryInProgress { .. }
        | RemoteError::NotEnoughReplicas { .. }
        | RemoteError::NotLeader { .. }
        | RemoteError::NotSupported { .. } => false,
    }
}

/// Whether a master's answer `e` to a request leaves open whether it was applied: the
/// connection broke or timed out, or the master lost the lead with it under way
/// (`Unavailable`). Any other answer is a refusal: nothing was applied.
pub(crate) fn outcome_unknown(e: &Error) -> bool {
    matches!(
        e,
        Error::Proto(_) | Error::Io(_) | Error::Remote(RemoteError::Unavailable { .. })
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_or_a_lost_lead_leaves_the_outcome_open() {
        use std::io::ErrorKind;
        assert!(outcome_unknown(&Error::Proto(stampfs_proto::Error::Io(
            ErrorKind::ConnectionReset.into()
        ))));
        assert!(outcome_unknown(&Error::Remote(RemoteError::Unavailable {
            reason: "the leadership was lost".into()
        })));
        for refused in [
            RemoteError::BadRequest { reason: "x".into() },
            RemoteError::NotEnoughReplicas { live: 0, needed: 1 },
            RemoteError::NotLeader { leader: None },
        ] {
            assert!(!outcome_unknown(&Error::Remote(refused)));
        }
    }

    #[test]
    fn a_reopened_stream_keeps_what_every_member_holds() {
        // Every member holds 150 of the 200 bytes sent; 100 were acknowledged.
        assert_eq!(resume_offset(100, 200, &[Some(150), Some(180)]), 150);
        // Nothing beyond the acknowledged bytes on one member: start there.
        assert_eq!(resume_offset(100, 200, &[Some(100), Some(180)]), 100);
        // A member that does not answer: the acknowledged length, as before.
        assert_eq!(resume_offset(100, 200, &[Some(150), None]), 100);
        // Never past what this writer sent, never below what it saw acknowledged.
        assert_eq!(resume_offset(100, 200, &[Some(250), Some(300)]), 200);
        assert_eq!(resume_offset(100, 200, &[Some(50)]), 100);
        assert_eq!(resume_offset(100, 100, &[]), 100);
    }

    #[test]
    fn only_a_refused_token_or_request_ends_the_writer_at_set_up() {
        let handle = stampfs_proto::ChunkHandle(3);
        assert!(head_refusal_is_fatal(&RemoteError::BadToken { handle }));
        // A malformed request is this writer's bug, whichever chunkserver it goes to.
        assert!(head_refusal_is_fatal(&RemoteError::BadRequest {
            reason: "a pipeline of 9 downstream chunkservers exceeds the limit".into(),
        }));
        // The head's replica came back shorter than the acknowledged length (a crash
        // lost its unsynced tail), was finalized, vanished, or is corrupt: exclude it,
        // keep writing.
        for e in [
            RemoteError::ReplicaShort {
                handle,
                offset: 100,
                length: 40,
            },
            RemoteError::ReplicaFinalized { handle, length: 40 },
            RemoteError::NotFound {
                what: "chunk".into(),
            },
            RemoteError::ChecksumMismatch { handle, offset: 0 },
            RemoteError::Io {
                reason: "EIO".into(),
            },
        ] {
            assert!(!head_refusal_is_fatal(&e), "{e}");
        }
    }

    #[test]
    fn a_stream_closed_with_nothing_in_flight_is_reopened_not_blamed() {
        for quiet in [false, true] {
            assert_eq!(
                after_stream_end(StreamEnd::Closed, false, quiet),
                EndAction::Reopen
            );
        }
        assert!(excluded(EndAction::Reopen, Some(ChunkserverId(1))).is_empty());
    }

    #[test]
    fn a_close_seen_only_after_new_packets_went_out_on_a_quiet_stream_is_an_idle_close() {
        // The head closed the idle stream; the writer queued packets on the dead
        // socket before it saw the EOF. No ack came back for them.
        assert_eq!(
            after_stream_end(StreamEnd::Closed, true, true),
            EndAction::Reopen
        );
    }

    #[test]
    fn a_stream_that_breaks_with_packets_in_flight_excludes_the_head() {
        // Closed while the head was acking the packets around these: it died.
        assert_eq!(
            after_stream_end(StreamEnd::Closed, true, false),
            EndAction::ExcludeHead
        );
        assert_eq!(
            excluded(EndAction::ExcludeHead, Some(ChunkserverId(1))),
            vec![ChunkserverId(1)]
        );
        // Garbage, or an ack or send that timed out (a frozen head): never idle.
        for (outstanding, quiet) in [(false, false), (true, false), (true, true)] {
            assert_eq!(
                after_stream_end(StreamEnd::Broken, outstanding, quiet),
                EndAction::ExcludeHead
            );
        }
    }

    #[test]
    fn stream_ends_are_classified_by_how_the_connection_failed() {
        use std::io::ErrorKind;
        let io = |k: ErrorKind| Error::Proto(stampfs_proto::Error::Io(k.into()));
        for k in [
            ErrorKind::UnexpectedEof,
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::BrokenPipe,
        ] {
            assert_eq!(StreamEnd::of(&io(k)), StreamEnd::Closed, "{k:?}");
            assert_eq!(StreamEnd::of(&Error::Io(k.into())), StreamEnd::Closed);
        }
        for e in [
            io(ErrorKind::TimedOut),
            Error::Proto(stampfs_proto::Error::Truncated),
            Error::Proto(stampfs_proto::Error::Malformed { reason: "x".into() }),
            Error::Remote(RemoteError::Unavailable {
                reason: "did not acknowledge".into(),
            }),
        ] {
            assert_eq!(StreamEnd::of(&e), StreamEnd::Broken, "{e}");
        }
    }
}
