//! The group's state machine, as far as a group of one needs it: it follows what was
//! committed and publishes the highest committed LSN ([`Progress`]), which is what
//! the master's requests wait for before anything they did leaves
//! ([`super::proposer::Proposer::wait_committed`]).
//!
//! In a group of one every batch was applied to the master's state when it was queued
//! (speculatively, as the operation log does today), so applying a committed entry
//! only moves the commit point. What a follower applies, and snapshots (the
//! checkpoints), come with the later increments of docs/openraft-plan.md; until then
//! the snapshot calls answer an error that says so, and nothing calls them: a group of
//! one runs with `SnapshotPolicy::Never` and nobody installs a snapshot on it.

use super::{Applied, Entry, MasterNode, NodeId, SnapshotFile, TypeConfig};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use std::sync::{Arc, Mutex};
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
}

#[derive(Debug)]
struct Inner {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, MasterNode>,
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StateMachine {
    /// A state machine that has applied no entry, over a master state whose records
    /// up to `committed_lsn` are durable already (its checkpoint), and the progress it
    /// publishes.
    pub fn new(committed_lsn: u64) -> (StateMachine, Arc<watch::Sender<Progress>>) {
        let (tx, _) = watch::channel(Progress {
            committed_lsn,
            failed: None,
        });
        let progress = Arc::new(tx);
        let sm = StateMachine {
            inner: Arc::new(Mutex::new(Inner {
                last_applied: None,
                membership: StoredMembership::default(),
            })),
            progress: progress.clone(),
        };
        (sm, progress)
    }
}

fn not_yet(what: &str) -> StorageError<NodeId> {
    StorageIOError::write_snapshot(
        None,
        AnyError::error(format!(
            "{what}: snapshots of the master group are not built yet (a group of one \
             checkpoints as before)"
        )),
    )
    .into()
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        Err(not_yet("build a snapshot"))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

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
        self.clone()
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
        Ok(None)
    }
}
