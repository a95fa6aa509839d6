//! The group's state machine, as far as a group of one needs it: it follows what was
//! committed and publishes the highest committed LSN ([`Progress`]), which is what
//! the master's requests wait for before anything they did leaves
//! ([`super::proposer::Proposer::wait_committed`]), and it builds the snapshots (the
//! checkpoints).
//!
//! In a group of one every batch was applied to the master's state when it was queued
//! (speculatively, as the operation log does), so applying a committed entry only
//! moves the commit point. A snapshot is built off the state lock from the previous
//! snapshot and the log up to the entry applied when it was asked for
//! ([`super::replay::build`]), on a blocking thread, while apply goes on. What a
//! follower applies, and receiving snapshots, come with the later increments of
//! docs/openraft-plan.md; until then those calls answer an error that says so.

use super::log_store::LogStore;
use super::{replay, snapshot};
use super::{Applied, Entry, MasterNode, NodeId, SnapshotFile, TypeConfig};
use crate::oplog::DirLock;
use crate::state::Settings;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::watch;

/// How far the group's log is committed, and why it stopped if it did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every record up to this LSN is committed.
    pub committed_lsn: u64,
    /// Why no more will be (openraft stopped, a batch was refused).
    pub failed: Option<String>,
}

/// The state machine. Clones share it.
#[derive(Clone, Debug)]
pub struct StateMachine {
    inner: Arc<Mutex<Inner>>,
    progress: Arc<watch::Sender<Progress>>,
    disk: Arc<Disk>,
}

/// What building a snapshot needs.
#[derive(Debug)]
struct Disk {
    dir: PathBuf,
    log: LogStore,
    settings: Settings,
    /// Held while a snapshot is written into the directory; gone once the master's
    /// handle is (no snapshot is written after that).
    dir_lock: Weak<DirLock>,
    /// The LSN of the newest snapshot on disk.
    snapshot_lsn: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Inner {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, MasterNode>,
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a state machine starts.
#[derive(Debug)]
pub struct Start {
    /// The group's directory (its snapshot) and log.
    pub dir: PathBuf,
    pub log: LogStore,
    pub settings: Settings,
    pub dir_lock: Weak<DirLock>,
    /// The snapshot on disk: the entries it covers count as applied.
    pub snapshot: Option<SnapshotMeta<NodeId, MasterNode>>,
    /// Its LSN.
    pub snapshot_lsn: u64,
    /// Every record up to this LSN is committed already (replayed at start).
    pub committed_lsn: u64,
}

impl StateMachine {
    /// A state machine that has applied what the snapshot covers, and the progress it
    /// publishes.
    pub fn new(start: Start) -> (StateMachine, Arc<watch::Sender<Progress>>) {
        let (tx, _) = watch::channel(Progress {
            committed_lsn: start.committed_lsn,
            failed: None,
        });
        let progress = Arc::new(tx);
        let (last_applied, membership) = match &start.snapshot {
            Some(m) => (m.last_log_id, m.last_membership.clone()),
            None => (None, StoredMembership::default()),
        };
        let sm = StateMachine {
            inner: Arc::new(Mutex::new(Inner {
                last_applied,
                membership,
            })),
            progress: progress.clone(),
            disk: Arc::new(Disk {
                dir: start.dir,
                log: start.log,
                settings: start.settings,
                dir_lock: start.dir_lock,
                snapshot_lsn: Arc::new(AtomicU64::new(start.snapshot_lsn)),
            }),
        };
        (sm, progress)
    }

    /// The last entry applied.
    pub fn last_applied(&self) -> Option<LogId<NodeId>> {
        lock(&self.inner).last_applied
    }

    /// The LSN of the newest snapshot on disk (shared: it moves when one is built).
    pub fn snapshot_lsn(&self) -> Arc<AtomicU64> {
        self.disk.snapshot_lsn.clone()
    }
}

fn not_yet(what: &str) -> StorageError<NodeId> {
    StorageIOError::write_snapshot(
        None,
        AnyError::error(format!(
            "{what}: snapshots are not sent between members yet (a group of one builds \
             its own)"
        )),
    )
    .into()
}

/// Builds the snapshot at the entry applied when it was asked for.
#[derive(Debug)]
pub struct Builder {
    disk: Arc<Disk>,
    at: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, MasterNode>,
}

fn snapshot_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_snapshot(None, AnyError::error(e.to_string())).into()
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let Some(at) = self.at else {
            return Err(snapshot_err("nothing applied yet: no snapshot to build"));
        };
        let disk = self.disk.clone();
        let membership = self.membership.clone();
        let built = tokio::task::spawn_blocking(move || -> crate::Result<_> {
            let _dir_lock = disk.dir_lock.upgrade().ok_or(crate::Error::ShuttingDown)?;
            let (meta, lsn) = replay::build(&disk.dir, &disk.log, disk.settings, at, membership)?;
            disk.snapshot_lsn.fetch_max(lsn, Ordering::AcqRel);
            Ok((meta, lsn))
        })
        .await
        .map_err(snapshot_err)?;
        let (meta, lsn) = built.map_err(snapshot_err)?;
        let (meta, file) = snapshot::open(&self.disk.dir)
            .await
            .map_err(snapshot_err)?
            .filter(|(m, _)| m.last_log_id == meta.last_log_id)
            .ok_or_else(|| snapshot_err("the snapshot just written is gone"))?;
        tracing::info!(at = %at, lsn, "master group snapshot written");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, MasterNode>), StorageError<NodeId>>
    {
        let i = lock(&self.inner);
        Ok((i.last_applied, i.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let mut committed = self.progress.borrow().committed_lsn;
        {
            let mut i = lock(&self.inner);
            for e in entries {
                i.last_applied = Some(e.log_id);
                match e.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(batch) => {
                        if let Some(last) = batch.last_lsn() {
                            // Batches follow one another without gaps (the proposer
                            // submits one at a time, in LSN order); a batch at or below
                            // the commit point is one replayed after a restart.
                            if batch.first_lsn > committed + 1 {
                                return Err(StorageIOError::apply(
                                    e.log_id,
                                    AnyError::error(format!(
                                        "records from LSN {} committed after {committed}",
                                        batch.first_lsn
                                    )),
                                )
                                .into());
                            }
                            committed = committed.max(last);
                        }
                    }
                    EntryPayload::Membership(m) => {
                        i.membership = StoredMembership::new(Some(e.log_id), m);
                    }
                }
                out.push(Applied {
                    last_lsn: committed,
                });
            }
        }
        self.progress.send_if_modified(|p| {
            let moved = committed > p.committed_lsn;
            p.committed_lsn = p.committed_lsn.max(committed);
            moved
        });
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let i = lock(&self.inner);
        Builder {
            disk: self.disk.clone(),
            at: i.last_applied,
            membership: i.membership.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<SnapshotFile>, StorageError<NodeId>> {
        Err(not_yet("receive a snapshot"))
    }

    async fn install_snapshot(
        &mut self,
        _meta: &SnapshotMeta<NodeId, MasterNode>,
        _snapshot: Box<SnapshotFile>,
    ) -> Result<(), StorageError<NodeId>> {
        Err(not_yet("install a snapshot"))
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let found = snapshot::open(&self.disk.dir).await.map_err(snapshot_err)?;
        Ok(found.map(|(meta, file)| Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}
