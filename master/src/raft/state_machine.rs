//! The group's state machine: it applies committed entries to the master's state and
//! publishes the highest committed LSN ([`Progress`]), which is what the master's
//! requests wait for before anything they did leaves
//! ([`super::proposer::Proposer::wait_committed`]), and it builds the snapshots (the
//! checkpoints).
//!
//! Its role ([`Role`], see `leadership.rs`) decides what applying an entry does:
//! - **leading** under `L`: an entry of `L` holds records the master applied to its
//!   state when it queued them (speculatively, as the operation log does), so applying
//!   it only moves the commit point, without the state lock;
//! - **following**: the entry's records are applied to the master's state, in LSN order
//!   without gaps.
//!
//! A leader steps down when the watcher sees it deposed, or by itself when asked to
//! apply an entry of another leader. Stepping down raises the [`Progress`]'s
//! generation (a request waiting for a record it queued as leader fails instead of
//! taking another leader's record at the same LSN for its own) and, when the state
//! holds records that were not committed, rebuilds it from the snapshot and the
//! entries applied. Both happen under the state machine's lock and the master's state
//! lock, in that order, with [`Leadership::set_serving`]: no request changes the
//! state in between.
//!
//! A snapshot is built off the state lock from the previous snapshot and the log up to
//! the entry applied when it was asked for ([`super::replay::build`]), on a blocking
//! thread, while apply goes on. A member that fell behind the leader's purged log
//! receives the leader's snapshot file (streamed by openraft in chunks into
//! `snapshot.recv`), which is checked, made durable and renamed over its own; its
//! state becomes the snapshot's.

use super::leadership::{Leadership, Role};
use super::log_store::LogStore;
use super::proposer::Proposer;
use super::{replay, snapshot};
use super::{Applied, Batch, Entry, MasterNode, NodeId, SnapshotFile, TypeConfig};
use crate::lease::Clock;
use crate::oplog::DirLock;
use crate::state::{replay_records, MasterState, Settings};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, CommittedLeaderId, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use tokio::sync::watch;

/// How far the group's log is committed, and why it stopped if it did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every record up to this LSN is committed.
    pub committed_lsn: u64,
    /// Raised at every change of role: records queued in one generation commit in it
    /// or not at all.
    pub generation: u64,
    /// Whether this member leads in this generation (its own records commit).
    pub leading: bool,
    /// Why no more will be (openraft stopped, the state machine failed).
    pub failed: Option<String>,
}

/// The state machine. Clones share it.
#[derive(Clone, Debug)]
pub struct StateMachine {
    inner: Arc<Mutex<Inner>>,
    progress: Arc<watch::Sender<Progress>>,
    disk: Arc<Disk>,
    /// The master's state (the same as its requests').
    master: Arc<Mutex<MasterState>>,
    leadership: Arc<Leadership>,
    clock: Clock,
    /// The proposer, told when this member takes or gives up the lead (set once it
    /// exists: it needs openraft, which needs this).
    proposer: Arc<OnceLock<Arc<Proposer>>>,
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
    /// Held while a snapshot is written or a received one adopted: a local build
    /// never renames an older snapshot over one just installed.
    snapshot_io: Mutex<()>,
}

#[derive(Debug)]
struct Inner {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, MasterNode>,
    role: Role,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
    /// The snapshot on disk.
    pub snapshot: Option<SnapshotMeta<NodeId, MasterNode>>,
    /// Its LSN.
    pub snapshot_lsn: u64,
    /// The last entry the master's state holds (replayed at start): it and every
    /// entry before it count as applied.
    pub applied: Option<LogId<NodeId>>,
    /// The master's state, holding every record up to the committed LSN.
    pub master: Arc<Mutex<MasterState>>,
    pub leadership: Arc<Leadership>,
    pub clock: Clock,
}

impl StateMachine {
    /// A state machine that has applied what the snapshot covers, and the progress it
    /// publishes.
    pub fn new(start: Start) -> (StateMachine, Arc<watch::Sender<Progress>>) {
        let committed_lsn = lock(&start.master).last_lsn;
        let (tx, _) = watch::channel(Progress {
            committed_lsn,
            ..Progress::default()
        });
        let progress = Arc::new(tx);
        let membership = match &start.snapshot {
            Some(m) => m.last_membership.clone(),
            None => StoredMembership::default(),
        };
        let last_applied = start
            .applied
            .or_else(|| start.snapshot.as_ref().and_then(|m| m.last_log_id));
        let sm = StateMachine {
            master: start.master,
            leadership: start.leadership,
            clock: start.clock,
            proposer: Arc::new(OnceLock::new()),
            inner: Arc::new(Mutex::new(Inner {
                last_applied,
                membership,
                role: Role::Following,
            })),
            progress: progress.clone(),
            disk: Arc::new(Disk {
                dir: start.dir,
                log: start.log,
                settings: start.settings,
                dir_lock: start.dir_lock,
                snapshot_lsn: Arc::new(AtomicU64::new(start.snapshot_lsn)),
                snapshot_io: Mutex::new(()),
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

    /// Publishes why no more records will commit (openraft stopped): waiters fail.
    pub fn fail(&self, reason: String) {
        self.progress.send_modify(|p| {
            if p.failed.is_none() {
                p.failed = Some(reason);
            }
        });
    }

    /// Tells `proposer` when this member takes or gives up the lead.
    pub fn attach(&self, proposer: Arc<Proposer>) {
        let _ = self.proposer.set(proposer);
    }

    /// The role.
    pub fn role(&self) -> Role {
        lock(&self.inner).role
    }

    /// The members' addresses, as of the last entry applied.
    pub fn member_addr(&self, id: NodeId) -> Option<String> {
        lock(&self.inner)
            .membership
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())
    }

    /// Takes the lead under `leader` if this member follows and its state holds exactly
    /// what is committed; the caller checked (with [`super::leadership::decide`]) that
    /// every entry of its log is applied, the last one `leader`'s. The proposer takes
    /// records from then on. Returns whether it leads now.
    pub fn take_lead(&self, leader: CommittedLeaderId<NodeId>) -> bool {
        let mut i = lock(&self.inner);
        if i.role != Role::Following || i.last_applied.map(|a| a.leader_id) != Some(leader) {
            return false;
        }
        let mut st = lock(&self.master);
        let committed = self.progress.borrow().committed_lsn;
        if st.last_lsn != committed {
            tracing::error!(
                state_lsn = st.last_lsn,
                committed,
                "the master's state is not the committed one: not leading"
            );
            return false;
        }
        let Some(proposer) = self.proposer.get() else {
            return false;
        };
        // The writers renewed their leases with the leader before this one, which
        // logged nothing of it: every lease starts a new term now.
        st.leases.renew_all(self.clock.now_ms());
        i.role = Role::Leading(leader);
        let mut generation = 0;
        self.progress.send_modify(|p| {
            p.generation += 1;
            p.leading = true;
            generation = p.generation;
        });
        let pipelined = i.membership.membership().voter_ids().nth(1).is_some();
        proposer.lead(generation, committed, pipelined);
        self.leadership.set_epoch(leader);
        self.leadership.set_led_since(self.clock.now_ms());
        self.leadership.set_serving(true);
        tracing::info!(
            epoch = %super::MasterEpoch::from(leader),
            lsn = committed,
            "this master leads the group"
        );
        true
    }

    /// Steps down if this member leads (see the module doc).
    pub fn step_down(&self) -> crate::Result<()> {
        let mut i = lock(&self.inner);
        self.step_down_locked(&mut i)
    }

    fn step_down_locked(&self, i: &mut Inner) -> crate::Result<()> {
        let Role::Leading(leader) = i.role else {
            return Ok(());
        };
        let mut st = lock(&self.master);
        self.leadership.set_serving(false);
        if let Some(p) = self.proposer.get() {
            p.follow();
        }
        i.role = Role::Following;
        self.progress.send_modify(|p| {
            p.generation += 1;
            p.leading = false;
        });
        let committed = self.progress.borrow().committed_lsn;
        tracing::warn!(
            epoch = %super::MasterEpoch::from(leader),
            committed_lsn = committed,
            uncommitted = st.last_lsn.saturating_sub(committed),
            "this master no longer leads the group"
        );
        // Rebuilt whether or not it holds uncommitted records: what the master never
        // logs (the chunkservers it heard from, replica lists, queued commands) goes
        // stale while it follows, and a member that leads again starts from the log.
        {
            let upto = i.last_applied.map(|a| a.index);
            let r = replay::rebuild(
                &self.disk.dir,
                &self.disk.log,
                self.disk.settings,
                upto,
                self.clock.now_ms(),
            )?;
            if r.state.last_lsn != committed {
                return Err(crate::Error::Replay {
                    lsn: r.state.last_lsn,
                    reason: format!(
                        "the state rebuilt up to entry {upto:?} ends at LSN {}, the commit \
                         point is LSN {committed}",
                        r.state.last_lsn
                    ),
                });
            }
            // The answers kept for repeated calls, up to the commit point: those
            // before the snapshot are not in the rebuilt state.
            let mut retry = std::mem::take(&mut st.retry);
            retry.keep_up_to(committed);
            *st = r.state;
            st.retry = retry;
        }
        Ok(())
    }

    /// Applies the records of a committed entry of another leader to the master's state.
    fn apply_foreign(&self, log_id: LogId<NodeId>, batch: &Batch) -> crate::Result<u64> {
        let mut st = lock(&self.master);
        if batch.records.is_empty() {
            return Ok(st.last_lsn);
        }
        if batch.first_lsn != st.last_lsn + 1 {
            return Err(crate::Error::Replay {
                lsn: batch.first_lsn,
                reason: format!(
                    "entry {log_id} starts at LSN {} after LSN {}",
                    batch.first_lsn, st.last_lsn
                ),
            });
        }
        let records = (batch.first_lsn..)
            .zip(batch.records.iter())
            .map(|(lsn, bytes)| (lsn, bytes.as_slice()));
        replay_records(&mut st, records, self.clock.now_ms())?;
        Ok(st.last_lsn)
    }
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
            let _io = lock(&disk.snapshot_io);
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
                let fail = |reason: String| -> StorageError<NodeId> {
                    StorageIOError::apply(e.log_id, AnyError::error(reason)).into()
                };
                match &e.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(batch) => {
                        let own = match i.role {
                            Role::Leading(l) => {
                                l == e.log_id.leader_id
                                    && (batch.records.is_empty()
                                        || self.proposer.get().is_some_and(|p| p.claim(batch)))
                            }
                            Role::Following => true,
                        };
                        if !own {
                            // Another leader's entry (this one was deposed), or a batch
                            // drained before this member led again: its records are not
                            // the ones in the state.
                            self.step_down_locked(&mut i)
                                .map_err(|err| fail(err.to_string()))?;
                        }
                        match i.role {
                            Role::Leading(_) => {
                                if let Some(last) = batch.last_lsn() {
                                    // Its own records, queued one batch at a time in
                                    // LSN order and in the state already.
                                    if batch.first_lsn != committed + 1 {
                                        return Err(fail(format!(
                                            "records from LSN {} committed after {committed}",
                                            batch.first_lsn
                                        )));
                                    }
                                    committed = last;
                                }
                            }
                            Role::Following => {
                                committed = self
                                    .apply_foreign(e.log_id, batch)
                                    .map_err(|err| fail(err.to_string()))?;
                            }
                        }
                    }
                    EntryPayload::Membership(m) => {
                        i.membership = StoredMembership::new(Some(e.log_id), m.clone());
                    }
                }
                i.last_applied = Some(e.log_id);
                out.push(Applied {
                    last_lsn: committed,
                });
                // Published entry by entry: a step-down above must see the commit
                // point of the entries before it.
                self.progress.send_if_modified(|p| {
                    let moved = committed > p.committed_lsn;
                    p.committed_lsn = p.committed_lsn.max(committed);
                    moved
                });
            }
        }
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
        snapshot::begin_receive(&self.disk.dir)
            .await
            .map(Box::new)
            .map_err(snapshot_err)
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, MasterNode>,
        received: Box<SnapshotFile>,
    ) -> Result<(), StorageError<NodeId>> {
        use tokio::io::AsyncWriteExt;
        // First: no rebuild from the old snapshot may run once the new one is in place.
        self.step_down().map_err(snapshot_err)?;
        let mut file = received.file;
        file.flush().await.map_err(snapshot_err)?;
        drop(file);
        let disk = self.disk.clone();
        let expected = meta.last_log_id;
        let now_ms = self.clock.now_ms();
        let (lsn, state) = tokio::task::spawn_blocking(move || -> crate::Result<_> {
            let _dir_lock = disk.dir_lock.upgrade().ok_or(crate::Error::ShuttingDown)?;
            let _io = lock(&disk.snapshot_io);
            let loaded = snapshot::adopt_received(&disk.dir, expected)?;
            let st = MasterState::decode_snapshot(disk.settings, &loaded.payload, now_ms)?;
            if st.last_lsn != loaded.lsn {
                return Err(crate::Error::CorruptCheckpoint {
                    path: snapshot::path(&disk.dir),
                    reason: format!(
                        "header says LSN {}, contents say {}",
                        loaded.lsn, st.last_lsn
                    ),
                });
            }
            Ok((loaded.lsn, st))
        })
        .await
        .map_err(snapshot_err)?
        .map_err(snapshot_err)?;
        let mut i = lock(&self.inner);
        self.step_down_locked(&mut i).map_err(snapshot_err)?;
        {
            // The answers kept for repeated calls that the snapshot covers stay.
            let mut master = lock(&self.master);
            let mut state = state;
            let mut retry = std::mem::take(&mut master.retry);
            retry.keep_up_to(lsn);
            state.retry = retry;
            *master = state;
        }
        i.last_applied = meta.last_log_id;
        i.membership = meta.last_membership.clone();
        self.disk.snapshot_lsn.fetch_max(lsn, Ordering::AcqRel);
        self.progress.send_modify(|p| p.committed_lsn = lsn);
        tracing::info!(at = ?meta.last_log_id, lsn, "installed the snapshot the leader sent");
        Ok(())
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
