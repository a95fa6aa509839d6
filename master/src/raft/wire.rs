//! The Raft RPCs between members on the wire: openraft's request and response types,
//! encoded with bincode over their serde derives, carried in the data section of a
//! frame (bulk bytes, as STYLE.md has it). Decoding is bounded by [`MAX_RPC_BYTES`] and
//! refuses trailing bytes, so a malformed or oversized body is an error, never a panic
//! or an allocation of what a length prefix claims.

use super::{NodeId, TypeConfig};
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The most bytes one RPC body may take: an AppendEntries of
/// `max_payload_entries` batches, or one snapshot chunk (3 MiB) with its header.
pub const MAX_RPC_BYTES: usize = 64 << 20;

/// `AppendEntries` from the leader.
pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
/// The answer to [`AppendEntriesRequest`].
pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<NodeId>;
/// A candidate's request for a vote.
pub type VoteRequest = openraft::raft::VoteRequest<NodeId>;
/// The answer to [`VoteRequest`].
pub type VoteResponse = openraft::raft::VoteResponse<NodeId>;
/// One chunk of a snapshot the leader streams.
pub type InstallSnapshotRequest = openraft::raft::InstallSnapshotRequest<TypeConfig>;
/// The answer to [`InstallSnapshotRequest`].
pub type InstallSnapshotResponse = openraft::raft::InstallSnapshotResponse<NodeId>;
/// How a member refuses an RPC (a fatal error, or `ForwardToLeader` and the like).
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;

fn codec() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_RPC_BYTES>()
}

/// Encodes an RPC body.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(msg, codec()).map_err(|e| Error::Codec {
        reason: format!("raft message: {e}"),
    })
}

/// Decodes an RPC body of type `T`; refuses trailing bytes and bodies over
/// [`MAX_RPC_BYTES`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    if bytes.len() > MAX_RPC_BYTES {
        return Err(Error::Codec {
            reason: format!("raft message of {} bytes", bytes.len()),
        });
    }
    let (msg, used) =
        bincode::serde::decode_from_slice(bytes, codec()).map_err(|e| Error::Codec {
            reason: format!("raft message: {e}"),
        })?;
    if used != bytes.len() {
        return Err(Error::Codec {
            reason: format!("{} trailing bytes after a raft message", bytes.len() - used),
        });
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::{Batch, Entry};
    use openraft::{CommittedLeaderId, EntryPayload, LogId, SnapshotMeta, Vote};
    use std::fmt::Debug;

    fn log_id(term: u64, node: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    /// `T` survives the wire, by its debug form (openraft's requests have no `Eq`).
    fn round_trip<T: Serialize + DeserializeOwned + Debug>(msg: &T) {
        let bytes = encode(msg).expect("encode");
        let back: T = decode(&bytes).expect("decode");
        assert_eq!(format!("{back:?}"), format!("{msg:?}"));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode::<T>(&longer).is_err(), "trailing bytes taken");
        if !bytes.is_empty() {
            assert!(
                decode::<T>(&bytes[..bytes.len() - 1]).is_err(),
                "a cut body taken"
            );
        }
    }

    #[test]
    fn every_rpc_survives_the_wire() {
        let entries: Vec<Entry> = vec![
            Entry {
                log_id: log_id(2, 1, 7),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(2, 1, 8),
                payload: EntryPayload::Normal(Batch {
                    first_lsn: 41,
                    records: vec![serde_bytes::ByteBuf::from(vec![9u8; 300])],
                }),
            },
        ];
        round_trip(&AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(1, 1, 6)),
            entries,
            leader_commit: Some(log_id(1, 1, 5)),
        });
        round_trip(&AppendEntriesResponse::Success);
        round_trip(&AppendEntriesResponse::PartialSuccess(Some(log_id(
            2, 1, 7,
        ))));
        round_trip(&AppendEntriesResponse::Conflict);
        round_trip(&AppendEntriesResponse::HigherVote(Vote::new(3, 2)));
        round_trip(&VoteRequest {
            vote: Vote::new(3, 2),
            last_log_id: Some(log_id(2, 1, 8)),
        });
        round_trip(&VoteResponse {
            vote: Vote::new(3, 2),
            vote_granted: true,
            last_log_id: None,
        });
        round_trip(&InstallSnapshotRequest {
            vote: Vote::new_committed(3, 2),
            meta: SnapshotMeta {
                last_log_id: Some(log_id(3, 2, 100)),
                last_membership: Default::default(),
                snapshot_id: "100-1".into(),
            },
            offset: 3 << 20,
            data: vec![7u8; 1000],
            done: false,
        });
        round_trip(&InstallSnapshotResponse {
            vote: Vote::new_committed(3, 2),
        });
        let refused: RaftError = RaftError::Fatal(openraft::error::Fatal::Panicked);
        round_trip(&refused);
    }

    #[test]
    fn garbage_and_oversized_bodies_are_errors() {
        assert!(decode::<AppendEntriesRequest>(&[0xff; 64]).is_err());
        assert!(decode::<VoteRequest>(&[]).is_err());
        // A length prefix claiming far more entries than the body holds.
        let mut claim = encode(&VoteRequest {
            vote: Vote::new(1, 1),
            last_log_id: None,
        })
        .expect("encode");
        claim.extend_from_slice(&[0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode::<AppendEntriesRequest>(&claim).is_err());
        assert!(decode::<VoteRequest>(&vec![0u8; MAX_RPC_BYTES + 1]).is_err());
    }
}
