//! Administration of the cluster's data: a file's replication factor (`stampfs
//! setrep`) and the draining of chunkservers (`stampfs admin decommission`).

use super::Caller;
use crate::ids::ChunkserverId;
use bincode::{Decode, Encode};
use serde::Serialize;

/// Sets the replication factor of the file at `path` and of each of its chunks, as
/// `hdfs dfs -setrep`: the master copies or trims replicas until every chunk has
/// `replication` of them. Needs write permission on the file. Answers the file's
/// status.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct SetReplication {
    pub path: String,
    pub replication: u8,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

/// Starts (`on`) or ends the decommission of chunkserver `server` (superusers only).
/// A chunkserver being decommissioned gets no new replicas, and every chunk it holds
/// is copied to other chunkservers until it has its replication factor without it;
/// its own replicas stay readable meanwhile. Answers its state after the change.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Decommission {
    pub server: ChunkserverId,
    pub on: bool,
}

/// Where a chunkserver stands in its decommission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum DecommissionState {
    /// Not being decommissioned: it takes new replicas.
    InService,
    /// Being decommissioned: `waiting` of its replicas' chunks do not yet have their
    /// replication factor on other live chunkservers (chunks still being written
    /// count too: they are copied once their file closes).
    Decommissioning { waiting: u64 },
    /// Every chunk it holds has its replication factor elsewhere: it can be stopped
    /// without lowering any chunk's replication.
    Decommissioned,
    /// Being decommissioned, but the master has not heard from it since it started:
    /// which chunks it holds is not known, so it is not safe to stop yet. After every
    /// older variant, so that each keeps its wire index.
    Unreported,
}

impl DecommissionState {
    /// A short word for tables: `in-service`, `decommissioning`, `decommissioned`.
    pub fn word(&self) -> &'static str {
        match self {
            DecommissionState::InService => "in-service",
            DecommissionState::Decommissioning { .. } => "decommissioning",
            DecommissionState::Decommissioned => "decommissioned",
            DecommissionState::Unreported => "decommissioning (not reported)",
        }
    }
}

/// What `stampfs admin safemode` asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum SafeModeAction {
    /// Only the state.
    Get,
    /// Turn safe mode on until `Leave`.
    Enter,
    /// End safe mode now (automatic or by hand).
    Leave,
}

/// `stampfs admin safemode get|enter|leave` (superusers only). Answers the state
/// after the action.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct SafeModeRequest {
    pub action: SafeModeAction,
}

/// Safe mode as the master sees it: while it is on, the master orders no replica
/// deletions and no re-replication (it does not yet know where enough replicas are).
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct SafeModeStatus {
    pub on: bool,
    /// Turned on by an operator: it ends only by hand.
    pub manual: bool,
    /// What the last whole health pass found: chunks examined (those of closed files
    /// and the complete chunks of open ones), and how many had a live replica at the
    /// master's version.
    pub chunks: u64,
    pub reported: u64,
    /// The share of chunks with a replica reported that ends automatic safe mode, in
    /// parts per million.
    pub threshold_ppm: u32,
    /// The threshold is met: automatic safe mode ends after this many more
    /// milliseconds.
    pub extension_left_ms: Option<u64>,
    /// Automatic safe mode whose first health pass has not run yet (`--dead-after`
    /// after the start or the new lead): `chunks` and `reported` count nothing yet.
    /// Last, but it changes the encoding of the cluster report: clients and servers
    /// are upgraded together.
    pub first_pass_pending: bool,
}

impl SafeModeStatus {
    /// One line for people: `Safe mode is OFF`, or ON with why.
    pub fn describe(&self) -> String {
        if !self.on {
            return "Safe mode is OFF".into();
        }
        if self.manual {
            return "Safe mode is ON (entered by hand: `stampfs admin safemode leave` ends it)"
                .into();
        }
        let pct = |n: u64, of: u64| {
            if of == 0 {
                100.0
            } else {
                n as f64 * 100.0 / of as f64
            }
        };
        let threshold = f64::from(self.threshold_ppm) / 10_000.0;
        if self.first_pass_pending {
            return format!(
                "Safe mode is ON: waiting for the first health pass, which counts the chunks \
                 with a replica reported once the chunkservers have registered (--dead-after \
                 after the start); it ends on its own at {threshold}% \
                 (`stampfs admin safemode leave` ends it now)"
            );
        }
        match self.extension_left_ms {
            Some(ms) => format!(
                "Safe mode is ON: {} of {} chunks reported ({:.2}%, threshold {threshold}%); it ends in {:.1} s",
                self.reported,
                self.chunks,
                pct(self.reported, self.chunks),
                ms as f64 / 1000.0
            ),
            None => format!(
                "Safe mode is ON: {} of {} chunks reported ({:.2}%), below the threshold {threshold}%; \
                 it ends on its own once enough chunkservers have reported \
                 (`stampfs fsck` shows missing chunks; `stampfs admin safemode leave` ends it now)",
                self.reported,
                self.chunks,
                pct(self.reported, self.chunks),
            ),
        }
    }
}

/// What `stampfs admin balance` asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum BalanceAction {
    /// Only the state.
    Status,
    /// Start (or retune) balancing: replicas move from chunkservers whose use (used /
    /// capacity) is more than `threshold_pct` points above the cluster's to those
    /// more than that below it, until none is.
    Start { threshold_pct: u8 },
    /// Stop: copies in flight finish, no new ones start.
    Stop,
}

/// `stampfs admin balance` (superusers only). Answers the state after the action.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct BalanceRequest {
    pub action: BalanceAction,
}

/// The balancer as the master sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct BalanceStatus {
    pub running: bool,
    pub threshold_pct: u8,
    /// Replica moves ordered since it started (a copy, then the source's replica
    /// deleted).
    pub moves_ordered: u64,
    /// What the last health pass found: the cluster's use in parts per million, and
    /// how many live chunkservers are above and below it by more than the threshold.
    pub average_ppm: u32,
    pub over: u32,
    pub under: u32,
    /// The last pass found nothing to move: every live chunkserver within the
    /// threshold.
    pub balanced: bool,
    /// It gave up before the cluster was balanced: several passes in a row could
    /// move nothing.
    pub stuck: bool,
}
