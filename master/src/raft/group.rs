//! Starting the group: openraft's settings (docs/openraft-plan.md 2.8), and a group of
//! one on a directory (initialized at the first start, a leader at once after).

use super::log_store::LogStore;
use super::network::Network;
use super::proposer::Proposer;
use super::state_machine::StateMachine;
use super::{MasterNode, NodeId, TypeConfig};
use crate::error::{Error, Result};
use openraft::{Raft, SnapshotPolicy};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long a group of one may take to lead after it starts.
const LEAD_WAIT: Duration = Duration::from_secs(10);

/// openraft's settings for the master group: heartbeats every 150 ms, elections after
/// 600-900 ms of silence, snapshots only when the master asks.
pub fn config() -> Result<Arc<openraft::Config>> {
    let c = openraft::Config {
        cluster_name: "stampfs".into(),
        heartbeat_interval: 150,
        election_timeout_min: 600,
        election_timeout_max: 900,
        install_snapshot_timeout: 10_000,
        snapshot_policy: SnapshotPolicy::Never,
        max_payload_entries: 8,
        max_in_snapshot_log_to_keep: 4096,
        ..Default::default()
    }
    .validate()
    .map_err(|e| failed(format!("bad group settings: {e}")))?;
    Ok(Arc::new(c))
}

fn failed(reason: String) -> Error {
    Error::LogFailed { reason }
}

/// A master group of one member: openraft over the log in a directory, and the
/// proposer the master queues its records with.
pub struct GroupOfOne {
    pub raft: Raft<TypeConfig>,
    pub proposer: Arc<Proposer>,
    pub log: LogStore,
}

impl std::fmt::Debug for GroupOfOne {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupOfOne")
            .field("log", &self.log)
            .field("proposer", &self.proposer)
            .finish_non_exhaustive()
    }
}

impl GroupOfOne {
    /// Opens the group's log in `dir` and starts member `id` (serving at `addr`) as the
    /// sole voter: initialized on a new directory, and waited for until it leads.
    /// Records up to `committed_lsn` are durable elsewhere already (a checkpoint).
    pub async fn start(dir: &Path, id: NodeId, addr: &str, committed_lsn: u64) -> Result<Self> {
        let log = LogStore::open(dir)?;
        let (sm, progress) = StateMachine::new(committed_lsn);
        let raft = Raft::new(id, config()?, Network, log.clone(), sm)
            .await
            .map_err(|e| failed(format!("cannot start the master group: {e}")))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| failed(format!("the master group stopped: {e}")))?;
        if !initialized {
            let members = BTreeMap::from([(
                id,
                MasterNode {
                    addr: addr.to_string(),
                },
            )]);
            raft.initialize(members)
                .await
                .map_err(|e| failed(format!("cannot form the master group: {e}")))?;
        }
        raft.wait(Some(LEAD_WAIT))
            .state(openraft::ServerState::Leader, "a group of one leads")
            .await
            .map_err(|e| failed(format!("the master group did not lead: {e}")))?;
        let proposer = Proposer::start(raft.clone(), progress);
        Ok(GroupOfOne {
            raft,
            proposer,
            log,
        })
    }

    /// Stops taking records and stops the member.
    pub async fn shutdown(self) -> Result<()> {
        self.proposer.stop();
        self.raft
            .shutdown()
            .await
            .map_err(|e| failed(format!("the master group did not stop cleanly: {e}")))
    }
}
