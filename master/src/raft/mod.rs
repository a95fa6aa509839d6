//! The master group's replicated log, built on openraft 0.9 (issue 19;
//! `docs/openraft-plan.md` is the plan, DESIGN.md "Master group" what exists).
//!
//! A master started with `--log group` keeps its records here, as a group of one
//! (DESIGN.md, "The master group's log"); other members come with the plan's later
//! increments. The pieces:
//! - [`TypeConfig`]: openraft's type configuration. A Raft entry's data is a
//!   [`Batch`]: one group-commit batch of encoded [`Record`](crate::state::Record)s,
//!   the LSN of the first one with it (the LSN stays the record number; the Raft index
//!   numbers entries).
//! - [`MasterNode`]: what the group knows of a member (its address).
//! - [`MasterEpoch`]: the leader id `(term, node)` a master minted under, ordered as
//!   openraft orders leader ids: the fence a deposed master meets at the chunkservers.
//! - [`SnapshotFile`]: a snapshot (a checkpoint) on disk, streamed in chunks.
//! - [`disk`]: the on-disk forms of entries, the vote and snapshot metadata, our own
//!   bincode layouts pinned by golden bytes, so no openraft upgrade changes the
//!   directory format.
//! - [`log_store`]: the group's log on disk (openraft's `RaftLogStorage`): segments
//!   with the operation log's framing and zeros written ahead, the vote, the commit
//!   point.
//! - [`proposer`]: group commit through openraft: records queued under the state
//!   lock, submitted one batch (one entry) at a time, waited for until committed.
//! - [`state_machine`]: follows the commit point, publishes the committed LSN and
//!   builds snapshots (a group of one; what followers apply comes later).
//! - [`snapshot`]: the snapshot file, a checkpoint with openraft's metadata;
//!   [`replay`]: the state rebuilt from the snapshot and the log (start-up, snapshots).
//! - [`group`]: openraft's settings, forming a group of one on a directory, recovering
//!   and starting it ([`group::Group`]).
//! - [`network`]: the connections to other members (none in a group of one).
//! - [`wire`]: the Raft RPCs between members, bincode over serde, bounded on decode.

pub mod disk;
pub mod group;
pub mod leadership;
pub mod log_store;
pub mod membership;
pub mod network;
pub mod proposer;
pub mod replay;
pub mod snapshot;
pub mod state_machine;
pub mod wire;

#[cfg(test)]
mod group_tests;

use serde::{Deserialize, Serialize};
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

openraft::declare_raft_types!(
    /// The master group's openraft types.
    pub TypeConfig:
        D = Batch,
        R = Applied,
        NodeId = u64,
        Node = MasterNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = SnapshotFile,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
);

/// A member's id in the group (`stampfs master --id N`).
pub type NodeId = u64;

/// An entry of the group's log.
pub type Entry = openraft::Entry<TypeConfig>;

/// One group-commit batch: the records queued while the previous batch was written,
/// each encoded as the operation log encodes it, the first with LSN `first_lsn` and
/// the others following without gaps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub first_lsn: u64,
    pub records: Vec<serde_bytes::ByteBuf>,
}

impl Batch {
    /// The LSN of the last record, or `None` for an empty batch.
    pub fn last_lsn(&self) -> Option<u64> {
        let n = u64::try_from(self.records.len()).ok()?;
        n.checked_sub(1)
            .and_then(|more| self.first_lsn.checked_add(more))
    }
}

impl std::fmt::Display for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch of {} records from LSN {}",
            self.records.len(),
            self.first_lsn
        )
    }
}

/// What applying an entry gives its proposer: the highest LSN applied so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub last_lsn: u64,
}

/// A member of the group as the others know it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MasterNode {
    /// Where it serves clients, chunkservers and the other members (`host:port`).
    pub addr: String,
}

impl std::fmt::Display for MasterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.addr)
    }
}

/// The leader id a master serves under: openraft's `LeaderId { term, node_id }`, ordered
/// by term, then node (the derived order, as openraft's). Two leaders may share a term,
/// never an epoch. Every command and token a master issues will carry it, and a
/// chunkserver refuses commands from an epoch below the highest it has seen.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
pub struct MasterEpoch {
    pub term: u64,
    pub leader: NodeId,
}

impl From<openraft::LeaderId<NodeId>> for MasterEpoch {
    fn from(id: openraft::LeaderId<NodeId>) -> Self {
        Self {
            term: id.term,
            leader: id.node_id,
        }
    }
}

impl std::fmt::Display for MasterEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.term, self.leader)
    }
}

/// A snapshot on disk: the open file and its path, so that a snapshot received from
/// the leader is renamed into place, never copied. openraft streams it in chunks.
#[derive(Debug)]
pub struct SnapshotFile {
    pub path: PathBuf,
    pub file: tokio::fs::File,
}

impl AsyncRead for SnapshotFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.file).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        Pin::new(&mut self.file).start_seek(position)
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Pin::new(&mut self.file).poll_complete(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_order_as_openraft_orders_leader_ids() {
        let ids = [(1, 3), (2, 1), (2, 2), (3, 1)];
        for a in ids {
            for b in ids {
                let (la, lb) = (
                    openraft::LeaderId::new(a.0, a.1),
                    openraft::LeaderId::new(b.0, b.1),
                );
                assert_eq!(
                    MasterEpoch::from(la).cmp(&MasterEpoch::from(lb)),
                    la.partial_cmp(&lb).expect("leader ids are totally ordered"),
                    "{a:?} against {b:?}"
                );
            }
        }
        assert_eq!(MasterEpoch { term: 6, leader: 3 }.to_string(), "6/3");
    }

    #[test]
    fn a_batch_knows_its_last_lsn() {
        let rec = |b: &[u8]| serde_bytes::ByteBuf::from(b.to_vec());
        let b = Batch {
            first_lsn: 10,
            records: vec![rec(b"a"), rec(b"b"), rec(b"c")],
        };
        assert_eq!(b.last_lsn(), Some(12));
        assert_eq!(Batch::default().last_lsn(), None);
        let top = Batch {
            first_lsn: u64::MAX,
            records: vec![rec(b"a"), rec(b"b")],
        };
        assert_eq!(top.last_lsn(), None, "past the last LSN");
    }
}
