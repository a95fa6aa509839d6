//! Starting the group: openraft's settings (docs/openraft-plan.md 2.8), forming a group
//! of one on a directory, recovering it, and the calls the master makes of it (queue a
//! record, snapshot, stop).

use super::log_store::LogStore;
use super::network::Network;
use super::proposer::Proposer;
use super::replay::{self, Rebuilt};
use super::snapshot;
use super::state_machine::{Start, StateMachine};
use super::{NodeId, TypeConfig};
use crate::error::{Error, Result};
use crate::oplog::DirLock;
use crate::state::Settings;
use openraft::{Raft, SnapshotPolicy, Vote};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How long a group of one may take to lead after it starts.
const LEAD_WAIT: Duration = Duration::from_secs(10);
/// How often a snapshot wait asks again (a build running for an older entry ignores
/// the ask).
const SNAPSHOT_POLL: Duration = Duration::from_secs(1);

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

/// The runtime openraft's tasks run on: one thread of its own, so that the log's
/// inline `fdatasync` (openraft appends on its core task) never holds one of the
/// master's request threads, as the operation log flushes on a thread of its own.
/// Dropping it stops those tasks where they wait (a crash, to the group).
struct GroupRuntime(Option<tokio::runtime::Runtime>);

impl GroupRuntime {
    fn new() -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("stampfs-group")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the master group's thread", e))?;
        Ok(GroupRuntime(Some(rt)))
    }

    fn handle(&self) -> Result<&tokio::runtime::Handle> {
        self.0
            .as_ref()
            .map(tokio::runtime::Runtime::handle)
            .ok_or_else(|| failed("the master group's thread is gone".into()))
    }
}

impl Drop for GroupRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A master group of one member: openraft over the log in a directory, and the
/// proposer the master queues its records with.
pub struct GroupOfOne {
    pub raft: Raft<TypeConfig>,
    pub proposer: Arc<Proposer>,
    pub log: LogStore,
    sm: StateMachine,
    /// Record bytes queued since the last snapshot (the checkpoint trigger).
    bytes_since_snapshot: AtomicU64,
    records: AtomicU64,
    /// Last, so that it is dropped after the handles into it.
    _runtime: GroupRuntime,
}

impl std::fmt::Debug for GroupOfOne {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupOfOne")
            .field("log", &self.log)
            .field("proposer", &self.proposer)
            .finish_non_exhaustive()
    }
}

/// Forms a group of one in `dir` (a new directory): the first snapshot, of `payload`
/// (a `MasterState::encode_snapshot`) at `lsn`, with member `id` serving at `addr` as
/// the only voter, and its vote, committed. The member then leads at once when it
/// starts, in term 1, without an election.
pub fn form(dir: &Path, id: NodeId, addr: &str, lsn: u64, payload: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    snapshot::write(dir, &snapshot::formed_meta(id, addr, lsn), lsn, payload)?;
    let log = LogStore::open(dir)?;
    log.write_vote(&Vote::new_committed(snapshot::FORMED_AT.leader_id.term, id))
}

/// The group's directory read back at start: the state (snapshot and every entry
/// after it) and the log, open.
#[derive(Debug)]
pub struct Recovered {
    pub rebuilt: Rebuilt,
    pub log: LogStore,
}

/// Opens the group's log in `dir` and rebuilds the master's state from the snapshot
/// and every entry after it: on the sole voter's disk, every entry is committed.
pub fn recover(dir: &Path, settings: Settings, now_ms: u64) -> Result<Recovered> {
    snapshot::remove_unfinished(dir)?;
    let log = LogStore::open(dir)?;
    let rebuilt = replay::rebuild(dir, &log, settings, None, now_ms)?;
    if rebuilt.snapshot.is_none() {
        return Err(Error::CorruptCheckpoint {
            path: snapshot::path(dir),
            reason: "the master group's directory has no snapshot: it was never formed".into(),
        });
    }
    Ok(Recovered { rebuilt, log })
}

impl GroupOfOne {
    /// Starts member `id` of the group recovered from `dir` as its sole voter, and
    /// waits until it leads. `dir_lock` is the master directory's lock (held while a
    /// snapshot is written).
    pub async fn start(
        dir: &Path,
        id: NodeId,
        recovered: &Recovered,
        settings: Settings,
        dir_lock: Weak<DirLock>,
    ) -> Result<Self> {
        let r = &recovered.rebuilt;
        let log = recovered.log.clone();
        let (sm, progress) = StateMachine::new(Start {
            dir: dir.to_path_buf(),
            log: log.clone(),
            settings,
            dir_lock,
            snapshot: r.snapshot.clone(),
            snapshot_lsn: r.snapshot_lsn,
            committed_lsn: r.state.last_lsn,
        });
        let runtime = GroupRuntime::new()?;
        // openraft spawns its core and state-machine tasks where it is created.
        let raft = {
            let (log, sm, config) = (log.clone(), sm.clone(), config()?);
            runtime
                .handle()?
                .spawn(async move { Raft::new(id, config, Network, log, sm).await })
                .await
                .map_err(|e| failed(format!("cannot start the master group: {e}")))?
                .map_err(|e| failed(format!("cannot start the master group: {e}")))?
        };
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| failed(format!("the master group stopped: {e}")))?;
        if !initialized {
            return Err(failed(format!(
                "the master group in {} has no members",
                dir.display()
            )));
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
            sm,
            bytes_since_snapshot: AtomicU64::new(0),
            records: AtomicU64::new(0),
            _runtime: runtime,
        })
    }

    /// Forms a group of one with an empty state in `dir` unless it holds one, recovers
    /// it and starts its member 1 (tests and benchmarks: the master itself recovers
    /// its state with [`recover`] and starts the group with [`GroupOfOne::start`]).
    pub async fn open(dir: &Path, dir_lock: &Arc<DirLock>) -> Result<(Self, Recovered)> {
        let settings = Settings::from_config(&crate::MasterConfig::new(dir.to_path_buf()));
        if snapshot::read(dir)?.is_none() {
            let empty = crate::state::MasterState::new(settings).encode_snapshot()?;
            form(dir, 1, "127.0.0.1:7070", 0, &empty)?;
        }
        let recovered = recover(dir, settings, 0)?;
        let g = Self::start(dir, 1, &recovered, settings, Arc::downgrade(dir_lock)).await?;
        Ok((g, recovered))
    }

    /// Queues record `lsn` ([`Proposer::append`]).
    pub fn append(&self, lsn: u64, record: &[u8]) -> Result<()> {
        self.proposer.append(lsn, record)?;
        self.bytes_since_snapshot
            .fetch_add(record.len() as u64, Ordering::Relaxed);
        self.records.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes a snapshot covering at least every entry applied now (call it once the
    /// records to cover are committed) and returns the LSN it covers. The log before
    /// it is purged by openraft (whole segments).
    pub async fn snapshot(&self) -> Result<u64> {
        let Some(target) = self.sm.last_applied() else {
            return Ok(self.sm.snapshot_lsn().load(Ordering::Acquire));
        };
        let bytes_before = self.bytes_since_snapshot.load(Ordering::Relaxed);
        loop {
            self.raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| failed(format!("the master group stopped: {e}")))?;
            // A build already running (for an older entry) ignores the trigger: look
            // again until one covers the target.
            let done = self
                .raft
                .wait(Some(SNAPSHOT_POLL))
                .metrics(
                    |m| m.snapshot >= Some(target),
                    "a snapshot covers the target",
                )
                .await;
            match done {
                Ok(_) => break,
                Err(openraft::metrics::WaitError::Timeout(..)) => continue,
                Err(e) => return Err(failed(format!("no snapshot of the master group: {e}"))),
            }
        }
        self.bytes_since_snapshot
            .fetch_sub(bytes_before, Ordering::Relaxed);
        Ok(self.sm.snapshot_lsn().load(Ordering::Acquire))
    }

    /// Counters in the operation log's terms: appends (one `fdatasync` each), records
    /// queued, record bytes queued since the last snapshot.
    pub fn stats(&self) -> crate::oplog::LogStats {
        crate::oplog::LogStats {
            fsyncs: self.log.appends(),
            records: self.records.load(Ordering::Relaxed),
            bytes_since_rotate: self.bytes_since_snapshot.load(Ordering::Relaxed),
            swept: 0,
        }
    }

    /// Stops at once (a crash in tests, or a master that halted): no more records, and
    /// no write into the log once the one in progress is done.
    pub fn halt(&self) {
        self.proposer.stop();
        self.log.halt();
        let raft = self.raft.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = raft.shutdown().await;
            });
        }
    }

    /// Commits what is queued, then stops taking records and stops the member.
    pub async fn shutdown(&self) -> Result<()> {
        let last = self.proposer.last_queued();
        if let Err(e) = self.proposer.wait_committed(last).await {
            tracing::warn!(error = %e, "records queued at shutdown were not committed");
        }
        self.proposer.stop();
        self.raft
            .shutdown()
            .await
            .map_err(|e| failed(format!("the master group did not stop cleanly: {e}")))?;
        self.log.halt();
        Ok(())
    }
}
