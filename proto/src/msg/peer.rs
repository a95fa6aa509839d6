//! master → master: the group's Raft RPCs; and the administration of its membership.
//!
//! A member dials another, proves the cluster key with the handshake chunkservers use
//! (`auth.rs`: both sides hold it), then sends [`RaftCall`]s. The openraft message
//! itself (append entries, vote, snapshot chunk), and its answer, travel as the frame's
//! data section, encoded by the master (bincode over serde): this crate does not know
//! openraft's types.

use bincode::{Decode, Encode};

/// Which openraft RPC a [`RaftCall`] carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum RaftKind {
    AppendEntries,
    Vote,
    InstallSnapshot,
    /// From the leader handing its lead over: campaign now (no message).
    ElectNow,
}

/// One Raft RPC from member `from`; the message is the frame's data.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RaftCall {
    pub from: u64,
    pub kind: RaftKind,
}

/// The answer to a [`RaftCall`]: openraft's answer (or its error) is the frame's data.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RaftReply {}

/// Adds member `id`, serving at `addr`, to the master group (an administrator's
/// request to the leader): it is sent the group's state as a learner, then made a
/// voter. The new member runs with `--join` on a new directory.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct AddMaster {
    pub id: u64,
    pub addr: String,
}

/// Removes member `id` from the master group (an administrator's request to the
/// leader).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RemoveMaster {
    pub id: u64,
}

/// Hands the lead of the master group to member `to` (an administrator's request to
/// the leader).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct TransferLeader {
    pub to: u64,
}
