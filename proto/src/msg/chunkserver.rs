//! Chunkserver → master: the handshake, registration, heartbeats and chunk reports.

use super::chunk::ChunkCommand;
use super::shared::ReplicaReport;
use crate::ids::ChunkserverId;
use crate::token::Signed;
use bincode::{Decode, Encode};

/// The first message of a chunkserver's connection to the master: the chunkserver's
/// challenge. The master answers with its own ([`ServerChallenge`]); the chunkserver
/// then proves it holds the cluster key ([`ServerProve`]) and the master proves it
/// back (see [`crate::auth`]). Until then the connection may not register, heartbeat
/// or report.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ServerHello {
    pub nonce: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ServerChallenge {
    pub nonce: [u8; 32],
}

/// The chunkserver's proof of the cluster key over both challenges; the reply is the
/// master's ([`ServerProveReply`]), or `Unauthenticated`.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ServerProve {
    pub proof: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ServerProveReply {
    pub proof: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Register {
    /// The id persisted in the chunkserver's directory, if it has one.
    pub id: Option<ChunkserverId>,
    pub addr: String,
    pub capacity: u64,
    pub used: u64,
    pub replicas: Vec<ReplicaReport>,
    /// A random number the chunkserver draws for this registration: the master signs
    /// every command for it under this session ([`crate::replay`]).
    pub session: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RegisterReply {
    pub id: ChunkserverId,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Heartbeat {
    pub id: ChunkserverId,
    pub capacity: u64,
    pub used: u64,
    pub replica_count: u64,
    pub active_streams: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct HeartbeatReply {
    /// Work for the chunkserver: deletions, replications.
    pub commands: Vec<Signed<ChunkCommand>>,
    /// The master does not know this chunkserver (it restarted): register again.
    pub reregister: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ChunkReport {
    pub id: ChunkserverId,
    pub replicas: Vec<ReplicaReport>,
}

/// One part of a full report too long for one message (a chunkserver sends at most
/// 64 Ki replicas per message). The master keeps the parts a connection sends, in
/// order, and puts them before the replicas of the next [`Register`] or
/// [`ChunkReport`] on the same connection, which completes the report; parts not
/// completed when the connection closes are forgotten. A report that fits in one
/// message has no parts, so a master that predates this message still serves a
/// chunkserver of up to 64 Ki replicas (upgrade masters first).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReportPart {
    pub replicas: Vec<ReplicaReport>,
}
