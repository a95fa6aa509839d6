//! Starting the group: openraft's settings (docs/openraft-plan.md 2.8), forming a group
//! on a directory (of one member, or of the `--peers`), recovering it, the watcher that
//! has this member take or give up the lead (`leadership.rs`), and the calls the master
//! makes of it (queue a record, wait for its commit, snapshot, stop).

use super::leadership::{decide, Leadership, Seen, Step};
use super::log_store::LogStore;
use super::network::Network;
use super::proposer::Proposer;
use super::replay::{self, Rebuilt};
use super::snapshot;
use super::state_machine::{Start, StateMachine};
use super::{Batch, NodeId, TypeConfig};
use crate::error::{Error, Result};
use crate::lease::Clock;
use crate::oplog::DirLock;
use crate::state::{MasterState, Settings};
use openraft::{Raft, SnapshotPolicy, Vote};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How long a group of one may take to lead after it starts (a member of a larger
/// group serves once elected, whenever that is).
const LEAD_WAIT: Duration = Duration::from_secs(10);
/// How often a snapshot wait asks again (a build running for an older entry ignores
/// the ask).
const SNAPSHOT_POLL: Duration = Duration::from_secs(1);

/// The longest election timeout (openraft's leader lease on followers as well).
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 900;

/// openraft's settings for the master group: heartbeats every 150 ms, elections after
/// 600-900 ms of silence, snapshots only when the master asks, `keep` entries kept
/// behind a snapshot for members that fall behind (further behind, they are sent the
/// snapshot).
pub fn config(keep: u64) -> Result<Arc<openraft::Config>> {
    let c = openraft::Config {
        cluster_name: "stampfs".into(),
        heartbeat_interval: 150,
        election_timeout_min: 600,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        install_snapshot_timeout: 10_000,
        snapshot_policy: SnapshotPolicy::Never,
        max_payload_entries: 8,
        max_in_snapshot_log_to_keep: keep,
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

/// A member of the master group: openraft over the log in a directory, the proposer
/// the master queues its records with, and whether this member serves.
pub struct Group {
    pub id: NodeId,
    pub raft: Raft<TypeConfig>,
    pub proposer: Arc<Proposer>,
    pub log: LogStore,
    pub leadership: Arc<Leadership>,
    sm: StateMachine,
    reads: ReadRounds,
    /// The connections to the other members (to hand the lead over).
    pub(super) network: Network,
    /// Set while the lead is handed over: reads are refused (a read-index round would
    /// renew the followers' leader lease and keep the target from being elected).
    pub(super) handing_over: std::sync::atomic::AtomicBool,
    /// Record bytes queued since the last snapshot (the checkpoint trigger).
    bytes_since_snapshot: AtomicU64,
    records: AtomicU64,
    /// Last, so that it is dropped after the handles into it.
    _runtime: GroupRuntime,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("id", &self.id)
            .field("log", &self.log)
            .field("proposer", &self.proposer)
            .finish_non_exhaustive()
    }
}

/// Forms a group in `dir` (a new directory): the first snapshot, of `payload` (a
/// `MasterState::encode_snapshot`) at `lsn`, with `members` (id → address) as its
/// voters. A group of one also gets its member's vote, committed: it then leads at
/// once when it starts, in term 1, without an election. The members of a larger group
/// elect a leader when they start.
pub fn form(
    dir: &Path,
    members: &BTreeMap<NodeId, String>,
    lsn: u64,
    payload: &[u8],
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    snapshot::write(dir, &snapshot::formed_meta(members, lsn), lsn, payload)?;
    let log = LogStore::open(dir)?;
    match members.keys().next() {
        Some(&only) if members.len() == 1 => log.write_vote(&Vote::new_committed(
            snapshot::FORMED_AT.leader_id.term,
            only,
        )),
        _ => Ok(()),
    }
}

/// The group's directory read back at start: the state (snapshot and the entries after
/// it known to be committed) and the log, open.
#[derive(Debug)]
pub struct Recovered {
    pub rebuilt: Rebuilt,
    pub log: LogStore,
}

/// Opens the group's log in `dir` and rebuilds the master's state from the snapshot
/// and the entries after it up to the commit point the log saved (openraft applies
/// the rest once it learns they are committed).
/// A member that joined a group (`joining`) may have no snapshot yet.
pub fn recover(dir: &Path, settings: Settings, now_ms: u64, joining: bool) -> Result<Recovered> {
    snapshot::remove_unfinished(dir)?;
    let log = LogStore::open(dir)?;
    // Below the snapshot (or none saved): the snapshot alone. A member that joined
    // and was sent nothing yet has neither: an empty state.
    let upto = match (log.committed(), snapshot::path(dir).exists()) {
        (Some(c), _) => Some(c.index),
        (None, true) => Some(0),
        (None, false) => None,
    };
    let rebuilt = replay::rebuild(dir, &log, settings, upto, now_ms)?;
    if rebuilt.snapshot.is_none() && !joining {
        return Err(Error::CorruptCheckpoint {
            path: snapshot::path(dir),
            reason: "the master group's directory has no snapshot: it was never formed".into(),
        });
    }
    Ok(Recovered { rebuilt, log })
}

/// What a member starts with besides its directory.
pub struct StartWith {
    pub id: NodeId,
    pub settings: Settings,
    /// The master directory's lock (held while a snapshot is written).
    pub dir_lock: Weak<DirLock>,
    /// The master's state, rebuilt by [`recover`]; the group applies to it.
    pub master: Arc<Mutex<MasterState>>,
    pub clock: Clock,
    pub network: Network,
    /// Entries kept behind a snapshot (`--group-log-keep`).
    pub keep_entries: u64,
    /// A member started with `--join`: it waits to be added.
    pub joining: bool,
}

impl Group {
    /// Starts member `with.id` of the group recovered from `dir`. A group of one waits
    /// until its member leads; a member of a larger group returns at once and serves
    /// once elected.
    pub async fn start(dir: &Path, recovered: &Recovered, with: StartWith) -> Result<Self> {
        let r = &recovered.rebuilt;
        let log = recovered.log.clone();
        let leadership = Arc::new(Leadership::default());
        let (sm, progress) = StateMachine::new(Start {
            dir: dir.to_path_buf(),
            log: log.clone(),
            settings: with.settings,
            dir_lock: with.dir_lock,
            snapshot: r.snapshot.clone(),
            snapshot_lsn: r.snapshot_lsn,
            applied: r.last_log_id,
            master: with.master,
            leadership: leadership.clone(),
            clock: with.clock,
        });
        let runtime = GroupRuntime::new()?;
        let id = with.id;
        // openraft spawns its core and state-machine tasks where it is created, and the
        // proposer its sweeper.
        let (raft, proposer) = {
            let (log, sm, config, network) = (
                log.clone(),
                sm.clone(),
                config(with.keep_entries)?,
                with.network.clone(),
            );
            runtime
                .handle()?
                .spawn(async move {
                    let raft = Raft::new(id, config, network, log, sm.clone()).await?;
                    let proposer = Proposer::start(raft.clone(), progress);
                    sm.attach(proposer.clone());
                    Ok::<_, openraft::error::Fatal<NodeId>>((raft, proposer))
                })
                .await
                .map_err(|e| failed(format!("cannot start the master group: {e}")))?
                .map_err(|e| failed(format!("cannot start the master group: {e}")))?
        };
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| failed(format!("the master group stopped: {e}")))?;
        if !initialized && !with.joining {
            return Err(failed(format!(
                "the master group in {} has no members (a member that is to join one is \
                 started with --join)",
                dir.display()
            )));
        }
        let voters = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .count();
        runtime.handle()?.spawn(watch_leadership(
            id,
            raft.clone(),
            sm.clone(),
            proposer.clone(),
            leadership.clone(),
        ));
        if voters == 1 {
            let mut rx = raft.metrics();
            let serving = tokio::time::timeout(LEAD_WAIT, async {
                while !leadership.serving() {
                    if rx.changed().await.is_err() {
                        return false;
                    }
                }
                true
            })
            .await;
            if serving != Ok(true) {
                return Err(failed(format!(
                    "the master group did not lead within {LEAD_WAIT:?}"
                )));
            }
        }
        Ok(Group {
            id,
            raft,
            proposer,
            log,
            leadership,
            sm,
            reads: ReadRounds::default(),
            network: with.network,
            handing_over: std::sync::atomic::AtomicBool::new(false),
            bytes_since_snapshot: AtomicU64::new(0),
            records: AtomicU64::new(0),
            _runtime: runtime,
        })
    }

    /// Forms a group of one with an empty state in `dir` unless it holds one, recovers
    /// it and starts its member 1 (tests and benchmarks: the master itself recovers
    /// its state with [`recover`] and starts the group with [`Group::start`]).
    pub async fn open(
        dir: &Path,
        dir_lock: &Arc<DirLock>,
    ) -> Result<(Self, Arc<Mutex<MasterState>>)> {
        let settings = Settings::from_config(&crate::MasterConfig::new(dir.to_path_buf()));
        if snapshot::read(dir)?.is_none() {
            let empty = MasterState::new(settings).encode_snapshot()?;
            let members = BTreeMap::from([(1, "127.0.0.1:7070".to_string())]);
            form(dir, &members, 0, &empty)?;
        }
        let mut recovered = recover(dir, settings, 0, false)?;
        let state = std::mem::replace(&mut recovered.rebuilt.state, MasterState::new(settings));
        let master = Arc::new(Mutex::new(state));
        let g = Self::start(
            dir,
            &recovered,
            StartWith {
                id: 1,
                settings,
                dir_lock: Arc::downgrade(dir_lock),
                master: master.clone(),
                clock: Clock::new(),
                network: Network::none(),
                keep_entries: crate::config::DEFAULT_GROUP_LOG_KEEP,
                joining: false,
            },
        )
        .await?;
        Ok((g, master))
    }

    /// Queues record `lsn` ([`Proposer::append`]).
    pub fn append(&self, lsn: u64, record: &[u8]) -> Result<()> {
        self.append_all(&[(lsn, record)])
    }

    /// Queues `records` (LSNs in a row) to commit together, in one batch.
    pub fn append_all(&self, records: &[(u64, &[u8])]) -> Result<()> {
        self.proposer.append_all(records)?;
        let bytes: usize = records.iter().map(|(_, r)| r.len()).sum();
        self.bytes_since_snapshot
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.records
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The generation this member's records are queued in, if it leads (read it under
    /// the master's state lock, with the record's LSN).
    pub fn generation(&self) -> Option<u64> {
        self.proposer.generation()
    }

    /// Waits until record `lsn`, queued in `generation`, is committed.
    pub async fn wait_committed(&self, lsn: u64, generation: u64) -> Result<()> {
        self.proposer.wait_committed(lsn, generation).await
    }

    /// Confirms this member still leads, by a round of heartbeats answered by a quorum
    /// that started after the call (openraft's read index; a group of one answers at
    /// once): a state read before the call held everything committed before it.
    /// Concurrent callers share rounds ([`ReadRounds`]).
    pub async fn confirm_leading(&self) -> Result<()> {
        if self.handing_over.load(Ordering::Acquire) {
            return Err(Error::NotLeader { leader: None });
        }
        self.reads.confirm(&self.raft).await
    }

    /// The members (voters and learners) of the latest membership, by id, with their
    /// addresses.
    pub fn member_addrs(&self) -> Vec<(NodeId, String)> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    }

    /// The group as this member sees it (`admin report`): the leader knows how far each
    /// member's log matches its own.
    pub fn status(&self) -> stampfs_proto::GroupStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let last = m.last_log_index;
        let members = membership
            .nodes()
            .map(|(id, n)| {
                let matched = if *id == self.id {
                    last
                } else {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(id).copied().flatten())
                        .map(|l| l.index)
                };
                let role = if m.current_leader == Some(*id) {
                    "leader"
                } else if voters.contains(id) {
                    "follower"
                } else {
                    "learner"
                };
                stampfs_proto::MemberStatus {
                    id: *id,
                    addr: n.addr.clone(),
                    role: role.into(),
                    matched_index: matched,
                    lag: match (last, matched) {
                        (Some(l), Some(x)) => Some(l.saturating_sub(x)),
                        _ => None,
                    },
                }
            })
            .collect();
        stampfs_proto::GroupStatus {
            this: self.id,
            term: m.current_term,
            epoch: self.leadership.epoch().to_string(),
            leader: m.current_leader,
            applied_index: m.last_applied.map(|l| l.index),
            last_log_index: last,
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            quorum_ack_ms_ago: m.millis_since_quorum_ack,
            members,
        }
    }

    /// Whether the group has more than one voter (reads then need
    /// [`Group::confirm_leading`]).
    pub fn has_peers(&self) -> bool {
        // Asked at every read: counted without collecting the voters.
        let m = self.raft.metrics();
        let voters = m
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .take(2)
            .count();
        voters > 1
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

    /// The histograms of the log's durable appends.
    pub fn timings(&self) -> crate::oplog::LogTimings {
        self.log.timings()
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
        if let Ok(rt) = self._runtime.handle() {
            rt.spawn(async move {
                let _ = raft.shutdown().await;
            });
        }
    }

    /// Commits what is queued (when leading), then stops taking records and stops the
    /// member.
    pub async fn shutdown(&self) -> Result<()> {
        if let Some(generation) = self.proposer.generation() {
            let last = self.proposer.last_queued();
            if let Err(e) = self.proposer.wait_committed(last, generation).await {
                tracing::warn!(error = %e, "records queued at shutdown were not committed");
            }
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

/// Has member `id` take and give up the lead as openraft's metrics move (see
/// `leadership.rs`), and keeps the leader's address for the requests it refuses.
async fn watch_leadership(
    id: NodeId,
    raft: Raft<TypeConfig>,
    sm: StateMachine,
    proposer: Arc<Proposer>,
    leadership: Arc<Leadership>,
) {
    let mut rx = raft.metrics();
    let mut nudged = None;
    loop {
        let (seen, leader) = {
            let m = rx.borrow_and_update();
            let leader = m
                .current_leader
                .and_then(|l| m.membership_config.membership().get_node(&l).cloned());
            (Seen::from_metrics(id, &m), leader)
        };
        leadership.set_leader(leader.map(|n| n.addr));
        match decide(sm.role(), seen) {
            Step::Nothing => {}
            Step::StepDown => {
                if let Err(e) = sm.step_down() {
                    tracing::error!(error = %e, "cannot rebuild the state after losing the lead: the master stops");
                    proposer.stop();
                    let _ = raft.shutdown().await;
                    return;
                }
            }
            Step::TakeLead(leader) => {
                sm.take_lead(leader);
            }
            Step::Nudge(leader) if nudged != Some(leader) => {
                nudged = Some(leader);
                let committed = proposer.committed_lsn();
                let empty = Batch {
                    first_lsn: committed + 1,
                    records: Vec::new(),
                };
                if let Err(e) = raft.client_write_ff(empty).await {
                    tracing::warn!(error = %e, "cannot propose an entry as the new leader");
                }
            }
            Step::Nudge(_) => {}
        }
        let stopped = rx.borrow().state == openraft::ServerState::Shutdown;
        if stopped || rx.changed().await.is_err() {
            sm.fail("the master group's openraft stopped".into());
            return;
        }
    }
}

/// Rounds of openraft's read index shared by concurrent readers. A reader needs a
/// round that *started* after its read of the state; one running already may have
/// started before it, so the reader waits for the next. One round runs at a time; a
/// reader runs one itself when none runs and its own has not finished, so every reader
/// waits for at most the round in flight and one more, and a reader whose request is
/// dropped midway leaves the next round to the others.
#[derive(Debug, Default)]
struct ReadRounds {
    rounds: Mutex<RoundState>,
    done: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct RoundState {
    /// Rounds started.
    started: u64,
    running: bool,
    /// The outcome of each finished round, newest last (a few are kept).
    finished: std::collections::VecDeque<(u64, Outcome)>,
}

/// How a round ended.
#[derive(Clone, Debug)]
enum Outcome {
    Leads,
    NotLeader(Option<String>),
    Failed(String),
}

impl Outcome {
    fn result(&self) -> Result<()> {
        match self {
            Outcome::Leads => Ok(()),
            Outcome::NotLeader(leader) => Err(Error::NotLeader {
                leader: leader.clone(),
            }),
            Outcome::Failed(reason) => Err(failed(reason.clone())),
        }
    }
}

impl ReadRounds {
    async fn confirm(&self, raft: &Raft<TypeConfig>) -> Result<()> {
        let mine = self
            .rounds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .started
            + 1;
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let run = {
                let mut r = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((_, outcome)) = r.finished.iter().find(|(n, _)| *n >= mine) {
                    return outcome.result();
                }
                let run = !r.running;
                if run {
                    r.running = true;
                }
                run
            };
            if run {
                self.run_round(raft).await;
            } else {
                notified.await;
            }
        }
    }

    /// Runs one round (the caller set `running`); dropped midway, it lets another
    /// reader run the next.
    async fn run_round(&self, raft: &Raft<TypeConfig>) {
        struct Release<'a>(&'a ReadRounds);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0
                    .rounds
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .running = false;
                self.0.done.notify_waiters();
            }
        }
        let _release = Release(self);
        let round = {
            let mut r = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
            r.started += 1;
            r.started
        };
        let outcome = match raft.ensure_linearizable().await {
            Ok(_) => Outcome::Leads,
            Err(e) => match e.forward_to_leader::<super::MasterNode>() {
                Some(f) => Outcome::NotLeader(f.leader_node.as_ref().map(|n| n.addr.clone())),
                None => Outcome::Failed(format!("cannot confirm the leadership: {e}")),
            },
        };
        let mut r = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        r.finished.push_back((round, outcome));
        while r.finished.len() > 8 {
            r.finished.pop_front();
        }
    }
}
