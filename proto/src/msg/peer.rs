//! master → master: the group's Raft RPCs.
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
