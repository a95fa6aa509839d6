//! Replica health: fsck and the cluster report.

use super::admin::{BalanceStatus, DecommissionState, SafeModeStatus};
use super::shared::FileState;
use crate::ids::{ChunkHandle, ChunkVersion, ChunkserverId};
use bincode::{Decode, Encode};
use serde::Serialize;

/// `stampfs fsck [PATH]`: replica health of the files under `path` (`/` when absent).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Fsck {
    pub path: Option<String>,
}

/// Serializes a chunk handle as its 16 hex digits (the replica file name).
fn handle_hex<S: serde::Serializer>(h: &ChunkHandle, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&h.to_string())
}

/// Counts by health, for one file or a whole tree. Chunk counts (`chunks`, `healthy`,
/// `under_replicated`, `missing`) are per chunk; the `*_replicas` counts are per replica.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct HealthCounts {
    pub files: u64,
    pub chunks: u64,
    /// At least `replication` live replicas at the master's version, nothing pending.
    pub healthy: u64,
    /// Some, but fewer than `replication`, live replicas at the master's version.
    pub under_replicated: u64,
    /// No live replica at the master's version (includes chunks lease recovery found
    /// missing).
    pub missing: u64,
    /// Replicas below the master's version, pending deletion (never handed out).
    pub stale_replicas: u64,
    /// Replicas reported corrupt, excluded and pending replacement and deletion.
    pub corrupt_replicas: u64,
    /// Replicas ABOVE the master's version: invariant 1 was broken; kept aside.
    pub ahead_replicas: u64,
    /// Files open for writing.
    pub open_files: u64,
    /// Files in lease recovery.
    pub recovering_files: u64,
}

/// One chunk that is not healthy.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct ChunkProblem {
    #[serde(serialize_with = "handle_hex")]
    pub handle: ChunkHandle,
    pub index: u64,
    pub version: ChunkVersion,
    pub replication: u8,
    /// Live replicas at the master's version.
    pub live: u64,
    pub stale: u64,
    pub corrupt: u64,
    pub ahead: u64,
    pub missing: bool,
}

/// One file that is not healthy, or is open or in recovery.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct FileHealth {
    pub path: String,
    pub state: FileState,
    pub length: u64,
    pub replication: u8,
    pub healthy: bool,
    pub counts: HealthCounts,
    pub problems: Vec<ChunkProblem>,
}

/// What `Fsck` returns.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct FsckReport {
    /// The tree that was checked.
    pub path: String,
    /// True when nothing under `path` needs attention (open files are fine).
    pub healthy: bool,
    pub total: HealthCounts,
    /// Files that are unhealthy, open or in recovery (healthy closed files are only
    /// counted).
    pub files: Vec<FileHealth>,
    /// `files` was cut at the reply's limit.
    pub truncated: bool,
    /// Replicas of chunks the master does not know, pending deletion (whole cluster).
    pub orphan_replicas: u64,
    /// Re-replications running (whole cluster).
    pub replications_in_flight: u64,
}

/// `stampfs admin report`.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClusterReportRequest {}

/// Whether the master hears from a chunkserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChunkserverState {
    Live,
    Dead,
}

/// One chunkserver as the master sees it.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct ChunkserverStatus {
    pub id: ChunkserverId,
    pub addr: String,
    pub state: ChunkserverState,
    /// Milliseconds since its last heartbeat; `None` when it has not registered since
    /// the master started.
    pub last_heartbeat_ms_ago: Option<u64>,
    pub capacity: u64,
    pub used: u64,
    /// Replicas it reported.
    pub replicas: u64,
    /// Open write and replication streams it reported.
    pub active_streams: u32,
    /// Commands queued for its next heartbeat reply.
    pub queued_commands: u64,
    /// Its decommission. After every older field, so that each keeps its place.
    pub decommission: DecommissionState,
}

/// What `ClusterReportRequest` returns.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct ClusterReport {
    pub chunkservers: Vec<ChunkserverStatus>,
    /// Chunk totals by health over the whole namespace.
    pub chunks: HealthCounts,
    pub orphan_replicas: u64,
    pub replications_in_flight: u64,
    /// The master group, as its leader sees it (`None`: a master that keeps an
    /// operation log). After every older field, so that each keeps its place.
    pub masters: Option<GroupStatus>,
    /// Safe mode (see `SafeModeStatus`). After every older field, so that each keeps
    /// its place.
    pub safe_mode: SafeModeStatus,
    /// The balancer. After every older field, so that each keeps its place.
    pub balancer: BalanceStatus,
}

/// A master group's state, from its leader (openraft's metrics).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct GroupStatus {
    /// The member answering (the leader).
    pub this: u64,
    pub term: u64,
    /// The epoch its commands carry: `term/member`.
    pub epoch: String,
    pub leader: Option<u64>,
    /// Index of the last entry committed (applied on the leader) and of the last in
    /// its log.
    pub applied_index: Option<u64>,
    pub last_log_index: Option<u64>,
    /// The entry the newest snapshot covers, and the last purged from the log.
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    /// Milliseconds since a quorum last acknowledged the leader.
    pub quorum_ack_ms_ago: Option<u64>,
    pub members: Vec<MemberStatus>,
}

/// One member of a master group.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct MemberStatus {
    pub id: u64,
    pub addr: String,
    /// `leader`, `follower` or `learner`.
    pub role: String,
    /// The last entry the leader knows it holds.
    pub matched_index: Option<u64>,
    /// Entries it is behind the leader's log.
    pub lag: Option<u64>,
}
