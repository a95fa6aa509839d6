//! The master's request logic: each [`MasterRequest`](stampfs_proto::MasterRequest)
//! as an async method on [`Core`].
//!
//! The shape of every mutation: lock the state, validate and commit a record (which
//! applies it), move the record to the log queue, unlock; wait until the log is
//! durable; only then send version bumps or reply. Multi-step writes (log, bump,
//! grant) hold the file's async lock so that two of them never interleave on one
//! file. A re-leased chunk (append, pipeline update) logs `Granted` between its bump
//! and its grant; when the bump reaches too few replicas nothing is granted, and a
//! failed append hands the file to lease recovery instead of closing it at a version
//! no replica may hold. Reads wait for the log too, so a reply never shows state that
//! a crash could still take back.
//!
//! A grant's bump that some target did not answer is pushed again, under a fresh
//! version, to those that did (`push_bump_fenced`), so a replica that applied it
//! without answering is stale rather than a current replica missing the writer's
//! bytes.
//!
//! Each version bump of a write lease (reopen, new chunk, pipeline update) has a
//! crash point on either side of its push (`stampfs_proto::crash`): the version is
//! durable before, the bump answered after, and neither the grant logged nor sent.
//!
//! Lease recovery (`service/recovery.rs`) has the same shape under the same file lock:
//! it runs as background tasks (at most one per file) started by the recovery
//! worker, by `append` past the soft limit, and by `RecoverLease`.

use crate::commands::CommandSender;
use crate::config::MasterConfig;
use crate::error::{Error, Result};
use crate::journal::{Journal, Mark};
use crate::lease::{wall_ms, Clock};
use crate::oplog::{lock, DirLock};
use crate::state::{BumpPlan, FinalizePlan, MasterState};
use stampfs_proto::net::Dialer;
use stampfs_proto::{
    ChunkToken, ChunkserverAddr, ClusterKey, Create, Delete, DeleteNow, FileLocations, FileStatus,
    GetLocations, GetXattr, InodeId, List, ListXattr, MakeFile, Mkdir, ReadLink, RemoteError,
    Rename, RestoreTrash, SetAttr, SetXattr, Stat, Symlink, WriteGrant,
};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Most extra bumps of one grant whose targets did not all answer
/// (`Core::push_bump_fenced`).
const MAX_FENCE_ROUNDS: usize = 3;

mod admin;
mod checkpoint;
mod chunkservers;
mod health;
mod masters;
mod once;
mod recovery;
mod users;
mod warmup;
mod write;

use crate::retry_cache::CachedReply;
pub use health::PassSummary;
pub use once::ONCE;
use once::{status, unit};
pub use recovery::Recoveries;

/// Fail point that stalls (a blocking thread) for as long as `name` is enabled: a test
/// catches the work in flight there. Compiled to nothing without `fail-points`.
#[cfg(feature = "fail-points")]
fn stall_point(name: &str) {
    if crate::fail::is_enabled(name) {
        tracing::warn!(point = name, "fail point hit: stalling while it is enabled");
        while crate::fail::is_enabled(name) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
#[cfg(not(feature = "fail-points"))]
fn stall_point(_name: &str) {}

/// Per-file async locks for the multi-step write operations.
#[derive(Debug, Default)]
pub struct FileLocks {
    /// One async mutex per file that has been written; entries nobody holds or waits
    /// for are pruned when the map grows.
    map: Mutex<HashMap<InodeId, Arc<tokio::sync::Mutex<()>>>>,
}

impl FileLocks {
    pub async fn lock(&self, ino: InodeId) -> OwnedMutexGuard<()> {
        let m = {
            let mut map = lock(&self.map);
            if map.len() > 4096 {
                map.retain(|_, m| Arc::strong_count(m) > 1);
            }
            map.entry(ino).or_default().clone()
        };
        m.lock_owned().await
    }
}

tokio::task_local! {
    /// Set once the request being served logged a record ([`Core::request`]).
    static LOGGED: std::cell::Cell<bool>;
}

/// Everything a request handler needs.
pub struct Core {
    pub config: MasterConfig,
    key: ClusterKey,
    /// The state machine. Locked briefly by every request, never across an await;
    /// committed records move to the log while it is held, so log order is apply order.
    state: Arc<Mutex<MasterState>>,
    pub log: Journal,
    commands: CommandSender,
    /// Serializes log + bump + grant sequences per file.
    file_locks: FileLocks,
    pub clock: Clock,
    /// Highest LSN covered by a durable checkpoint.
    checkpoint_lsn: AtomicU64,
    /// When the last checkpoint was written (master clock, ms).
    last_checkpoint_ms: AtomicU64,
    /// One checkpoint at a time (the worker and explicit calls).
    checkpointing: tokio::sync::Mutex<()>,
    /// Lease recoveries running in the background, at most one per file.
    recoveries: Recoveries,
    /// Where background recoveries are spawned (the server's tracker, so shutdown
    /// waits for them).
    tasks: TaskTracker,
    /// Cancelled at shutdown (or crash): background recoveries stop.
    shutdown: CancellationToken,
    /// Why the master stopped serving, once a committed record could not be handed to
    /// the log (fail-stop: the state then holds changes the log never will).
    halted: std::sync::OnceLock<String>,
    /// Cancelled with `halted`: wakes requests waiting for a durability that will
    /// never come.
    halt: CancellationToken,
    /// The directory lock, weakly. [`MasterHandle`](crate::server::MasterHandle) holds
    /// it while the master runs; work that writes into the directory outside the log
    /// (a checkpoint: its write and its trim) holds it too, from start to
    /// end ([`Core::dir_guard`]). So the lock outlives a dropped handle until that work
    /// is done, and once the handle is gone no such work starts.
    dir_lock: Weak<DirLock>,
    /// Which user each client id belongs to.
    pub clients: crate::auth::ClientBindings,
    /// Raised by every change of the user table: connections check their user again
    /// when it moved (`ConnAuth::revalidate`).
    users_epoch: AtomicU64,
    /// The `Once` calls being made now (`service/once.rs`).
    calls: once::CallsInFlight,
    /// Requests served and their latency, when metrics are served (`metrics.rs`).
    pub metrics: std::sync::OnceLock<stampfs_metrics::Requests>,
    /// Events counted as they happen (lease recoveries, re-replications).
    pub events: crate::metrics::Events,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("dir", &self.config.dir)
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// The cluster key (commands, tokens and chunkservers' handshakes).
    pub fn key(&self) -> &ClusterKey {
        &self.key
    }

    /// A core serving `state`; background recoveries are spawned on `tasks` and stop
    /// when `shutdown` is cancelled. `dir_lock` is the directory's lock: the caller
    /// holds it; the core keeps a weak reference, which checkpoints upgrade for as long
    /// as they write into the directory.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: MasterConfig,
        key: ClusterKey,
        state: Arc<Mutex<MasterState>>,
        log: Journal,
        clock: Clock,
        checkpoint_lsn: u64,
        tasks: TaskTracker,
        shutdown: CancellationToken,
        dir_lock: &Arc<DirLock>,
        dialer: Dialer,
    ) -> Self {
        let leadership = log.group().map(|g| g.leadership.clone());
        let commands = CommandSender::new(key.clone(), config.command_timeout, dialer, leadership);
        // The ids of clients holding leases stay their users' across the restart.
        let clients = crate::auth::ClientBindings::default();
        clients.seed(lock(&state).owners(), clock.now_ms());
        // A master that just started knows no replica yet (`safe_mode.rs`).
        lock(&state).safe_mode.enter_auto(None);
        Self {
            config,
            key,
            state,
            log,
            commands,
            file_locks: FileLocks::default(),
            clock,
            checkpoint_lsn: AtomicU64::new(checkpoint_lsn),
            last_checkpoint_ms: AtomicU64::new(clock.now_ms()),
            checkpointing: tokio::sync::Mutex::new(()),
            recoveries: Recoveries::default(),
            tasks,
            shutdown,
            halted: std::sync::OnceLock::new(),
            halt: CancellationToken::new(),
            dir_lock: Arc::downgrade(dir_lock),
            clients,
            users_epoch: AtomicU64::new(0),
            calls: once::CallsInFlight::default(),
            metrics: std::sync::OnceLock::new(),
            events: crate::metrics::Events::default(),
        }
    }

    /// The directory lock, for work that writes into the directory outside the log
    /// writer: held until that work ends (moved into its blocking closure, so even a
    /// runtime that drops the awaiting task keeps it), the lock is not released under
    /// it. Fails with `ShuttingDown` once the master's handle is gone.
    fn dir_guard(&self) -> Result<Arc<DirLock>> {
        self.dir_lock.upgrade().ok_or(Error::ShuttingDown)
    }

    /// `Err(Halted)` once the master stopped serving (see `Core::mutate`).
    pub fn check_running(&self) -> Result<()> {
        match self.halted.get() {
            Some(reason) => Err(Error::Halted {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Fail-stop: record `lsn` was applied to the state but could not be queued in the
    /// log. From now on every request is refused with `Halted` (an `Internal` error)
    /// and the background workers do nothing; a restart replays the log, which holds
    /// exactly what was acknowledged.
    fn halt_serving(&self, lsn: u64, e: &Error) -> Error {
        let reason = format!("log record {lsn} could not be queued: {e}");
        if self.halted.set(reason.clone()).is_ok() {
            if matches!(e, Error::ShuttingDown) {
                tracing::warn!(lsn, "a mutation raced the shutdown and was not logged; refusing every request until the restart");
            } else {
                tracing::error!(lsn, error = %e, "the operation log refused a committed record: the master STOPS SERVING (every request is refused) until it is restarted");
            }
            self.halt.cancel();
        }
        Error::Halted { reason }
    }

    /// Queues the committed records of one mutation in the log, together.
    fn append_records(&self, records: &[(u64, Vec<u8>)]) -> Result<()> {
        fail_point!("log-append");
        let all: Vec<(u64, &[u8])> = records.iter().map(|(l, b)| (*l, b.as_slice())).collect();
        self.log.append_all(&all)
    }

    /// Waits until the marked record is durable (or the master stopped serving).
    async fn durable(&self, mark: Mark) -> Result<()> {
        tokio::select! {
            r = self.log.wait_durable(mark) => r,
            _ = self.halt.cancelled() => self.check_running(),
        }
    }

    /// The state, locked.
    pub fn state(&self) -> MutexGuard<'_, MasterState> {
        lock(&self.state)
    }

    /// Runs a mutation under the state lock and queues its records in the log. Returns
    /// its result and the LSN to wait for before anything depending on it leaves.
    ///
    /// A record that cannot be queued (the log failed or stopped) leaves the state
    /// ahead of the log for good: the master halts ([`Core::check_running`]).
    fn mutate<T>(
        &self,
        f: impl FnOnce(&mut MasterState, u64, u64) -> Result<T>,
    ) -> Result<(T, Mark)> {
        let mut st = self.state();
        self.check_running()?;
        // Under the state lock: a member that stops leading does so under it too.
        self.serving_for_this_request(st.last_lsn)?;
        let result = f(&mut st, self.clock.now_ms(), wall_ms());
        // Records committed before a failure must reach the log all the same.
        let outbox = st.take_outbox();
        if let Err(e) = self.append_records(&outbox) {
            let lsn = outbox.first().map_or(st.last_lsn, |(l, _)| *l);
            return Err(self.halt_serving(lsn, &e));
        }
        let mark = self.log.mark(st.last_lsn);
        drop(st);
        if result.is_ok() {
            let _ = LOGGED.try_with(|l| l.set(true));
        }
        result.map(|v| (v, mark))
    }

    /// `Ok` when this master serves. Refused, a request that logged a record already
    /// (a later step of a multi-step write) is told the leadership was lost, not sent
    /// to the leader: its first step was applied, so sending it again would apply it
    /// twice.
    fn serving_for_this_request(&self, lsn: u64) -> Result<()> {
        match self.log.serving() {
            Err(Error::NotLeader { .. }) if LOGGED.try_with(|l| l.get()).unwrap_or(false) => {
                Err(Error::LeadershipLost { lsn })
            }
            other => other,
        }
    }

    /// Runs `f` as one request: [`Core::serving_for_this_request`] knows whether it
    /// logged a record.
    pub async fn request<F: std::future::Future>(f: F) -> F::Output {
        LOGGED.scope(std::cell::Cell::new(false), f).await
    }

    /// Runs a mutation and waits until it is durable.
    async fn mutate_durable<T>(
        &self,
        f: impl FnOnce(&mut MasterState, u64, u64) -> Result<T>,
    ) -> Result<T> {
        let (v, mark) = self.mutate(f)?;
        self.durable(mark).await?;
        Ok(v)
    }

    /// Runs a read and waits until everything it saw is durable (and, in a master
    /// group of several, until a quorum confirmed this member still leads).
    async fn read<T>(&self, f: impl FnOnce(&MasterState, u64) -> Result<T>) -> Result<T> {
        let (v, mark) = {
            let st = self.state();
            self.check_running()?;
            self.serving_for_this_request(st.last_lsn)?;
            (f(&st, self.clock.now_ms())?, self.log.mark(st.last_lsn))
        };
        tokio::select! {
            r = self.log.wait_readable(mark) => r?,
            _ = self.halt.cancelled() => self.check_running()?,
        }
        Ok(v)
    }

    /// Resolves `path` and takes its file lock, making sure the path still names the
    /// same inode once the lock is held.
    async fn lock_file(&self, path: &str) -> Result<(InodeId, OwnedMutexGuard<()>)> {
        for _ in 0..4 {
            let ino = self.state().resolve_path(path)?;
            let guard = self.file_locks.lock(ino).await;
            if self.state().resolve_path(path)? == ino {
                return Ok((ino, guard));
            }
        }
        Err(RemoteError::Unavailable {
            reason: format!("{path} keeps changing; try again"),
        }
        .into())
    }

    fn grant(
        &self,
        plan: &BumpPlan,
        client: stampfs_proto::ClientId,
        pipeline: Vec<ChunkserverAddr>,
    ) -> WriteGrant {
        WriteGrant {
            token: ChunkToken::sign(&self.key, plan.handle, plan.version, client),
            chunk_index: plan.chunk_index,
            file_offset: plan.file_offset,
            chunk_offset: plan.chunk_offset,
            chunk_size: plan.chunk_size,
            pipeline,
        }
    }

    /// Pushes a bump (its record is already durable) and records who took it.
    async fn push_bump(&self, plan: &BumpPlan) -> Vec<ChunkserverAddr> {
        let acked = self
            .commands
            .bump(&plan.targets, plan.handle, plan.version, plan.create)
            .await;
        let reports: Vec<_> = acked.iter().map(|(a, r)| (a.id, *r)).collect();
        self.state().record_replicas(plan.handle, &reports);
        tracing::info!(
            chunk = %plan.handle,
            version = %plan.version,
            path = %plan.path,
            acked = acked.len(),
            targets = plan.targets.len(),
            "version bumped"
        );
        acked.into_iter().map(|(a, _)| a).collect()
    }

    /// Pushes `plan`'s bump, then fences the targets that did not answer: such a target
    /// may have applied the bump all the same (its reply lost, or a frozen chunkserver
    /// applying it when it resumes), and would then hold the granted version without
    /// what the writer writes under it: a replica of the right version and length with
    /// other bytes, which nothing else tells apart once the file is closed (an
    /// overwrite does not change the length; found by the nemesis). So while some
    /// target did not answer and enough did, a fresh version (durable first) is pushed
    /// to those that did, leaving the others below it: stale. At most
    /// [`MAX_FENCE_ROUNDS`] rounds; a pipeline that keeps losing members is given up
    /// as too short.
    async fn push_bump_fenced(
        &self,
        plan: &BumpPlan,
        client: stampfs_proto::ClientId,
    ) -> Result<(BumpPlan, Vec<ChunkserverAddr>)> {
        let mut plan = plan.clone();
        let mut pipeline = self.push_bump(&plan).await;
        for round in 0.. {
            if pipeline.len() == plan.targets.len() || pipeline.len() < plan.needed {
                return Ok((plan, pipeline));
            }
            if round == MAX_FENCE_ROUNDS {
                return Ok((plan, Vec::new()));
            }
            let missing: Vec<_> = plan
                .targets
                .iter()
                .filter(|t| !pipeline.iter().any(|p| p.id == t.id))
                .map(|t| t.id)
                .collect();
            let version = self
                .mutate_durable(|st, now, _| st.fence_version(&plan, client, now))
                .await?;
            tracing::warn!(
                chunk = %plan.handle,
                path = %plan.path,
                from = %plan.version,
                to = %version,
                unanswered = %crate::recovery::id_list(missing.iter()),
                "some replicas did not answer the version bump and may hold it all the same; \
                 bumping those that did once more, so the others are stale"
            );
            plan.version = version;
            plan.targets = pipeline;
            pipeline = self.push_bump(&plan).await;
        }
        Ok((plan, pipeline))
    }

    async fn finalize(&self, plan: &FinalizePlan) {
        let acked = self
            .commands
            .finalize(&plan.targets, plan.handle, plan.version, plan.length)
            .await;
        self.state().record_replicas(plan.handle, &acked);
    }

    // ------------------------------------------------------------ namespace

    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn mkdir(&self, req: Mkdir) -> Result<FileStatus> {
        self.mutate_once(|st, now, mt| st.mkdir(&req, now, mt), status)
            .await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client))]
    pub async fn create(&self, req: Create) -> Result<FileStatus> {
        self.mutate_once(|st, now, mt| st.create(&req, now, mt), status)
            .await
    }

    /// An empty file, closed at once: its create and its close are queued together,
    /// so they share one `fdatasync` and no state between them is ever seen.
    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client))]
    pub async fn make_file(&self, req: MakeFile) -> Result<FileStatus> {
        self.mutate_once(|st, now, mt| st.make_file(&req, now, mt), status)
            .await
    }

    #[tracing::instrument(skip_all, fields(src = %req.src, dst = %req.dst))]
    pub async fn rename(&self, req: Rename) -> Result<()> {
        self.mutate_once(|st, now, mt| st.rename(&req, now, mt), unit)
            .await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn delete(&self, req: Delete) -> Result<()> {
        self.mutate_once(|st, now, mt| st.delete(&req, now, mt), unit)
            .await
    }

    /// `rm --skip-trash`.
    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn delete_now(&self, req: DeleteNow) -> Result<()> {
        self.mutate_once(|st, now, mt| st.delete_now(&req, now, mt), unit)
            .await
    }

    /// `stampfs trash restore`.
    #[tracing::instrument(skip_all, fields(path = %req.path, to = %req.to))]
    pub async fn restore_trash(&self, req: RestoreTrash) -> Result<FileStatus> {
        self.mutate_once(|st, now, mt| st.restore_trash(&req, now, mt), status)
            .await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn stat(&self, req: Stat) -> Result<FileStatus> {
        self.read(|st, _| {
            st.check_access(&req.path, req.caller.as_ref(), 0)?;
            st.stat(&req.path)
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn symlink(&self, req: Symlink) -> Result<FileStatus> {
        self.mutate_once(|st, now, mt| st.symlink(&req, now, mt), status)
            .await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn read_link(&self, req: ReadLink) -> Result<String> {
        self.read(|st, _| {
            st.check_access(&req.path, req.caller.as_ref(), 0)?;
            st.read_link(&req.path)
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn list(&self, req: List) -> Result<Vec<FileStatus>> {
        self.read(|st, _| {
            let who = req.caller.as_ref();
            st.check_access(&req.path, who, 0)?;
            if st.stat(&req.path)?.kind == stampfs_proto::FileKind::Directory {
                st.check_access(&req.path, who, crate::perm::READ)?;
            }
            st.list(&req.path)
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path, name = %req.name))]
    pub async fn get_xattr(&self, req: GetXattr) -> Result<Option<Vec<u8>>> {
        self.read(|st, _| st.get_xattr(&req)).await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn list_xattr(&self, req: ListXattr) -> Result<Vec<String>> {
        self.read(|st, _| st.list_xattr(&req)).await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path, name = %req.name))]
    pub async fn set_xattr(&self, req: SetXattr) -> Result<bool> {
        self.mutate_once(
            |st, now, mt| st.set_xattr(&req, now, mt),
            |b| CachedReply::Bool(*b),
        )
        .await
    }

    /// `chmod`, `chown`, `utimensat`.
    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn set_attr(&self, req: SetAttr) -> Result<FileStatus> {
        self.mutate_durable(|st, now, mt| st.set_attr(&req, now, mt))
            .await
    }

    /// A file's chunks for a reader; the read moves the file's access time when the
    /// `relatime` rules say so (not for the file's own writer), durable before the
    /// answer like every mutation.
    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client))]
    pub async fn get_locations(&self, req: GetLocations) -> Result<FileLocations> {
        let writer = |st: &MasterState, ino| st.ns.file(ino).and_then(|f| f.writer());
        let locs = self
            .read(|st, now| {
                // A reader needs read permission (the tokens let it read the
                // replicas); the file's own writer reads what it writes, as long as
                // the identity asking may write it (one client may carry several).
                let who = req.caller.as_ref();
                let is_writer = st
                    .resolve_path(&req.path)
                    .is_ok_and(|ino| writer(st, ino) == Some(req.client));
                let read = st.check_access(&req.path, who, crate::perm::READ);
                if read.is_err() && is_writer {
                    st.check_access(&req.path, who, crate::perm::WRITE)?;
                } else {
                    read?;
                }
                st.locations(&req.path, req.client, &self.key, now)
            })
            .await?;
        let ino = locs.status.inode;
        let writer = |st: &MasterState| writer(st, ino);
        let stale = req.access && {
            let st = self.state();
            writer(&st) != Some(req.client) && st.access(ino, wall_ms()).is_some()
        };
        if stale {
            self.mutate_durable(|st, now, mt| {
                if writer(st) != Some(req.client) {
                    if let Some(rec) = st.access(ino, mt) {
                        st.commit(rec, now)?;
                    }
                }
                Ok(())
            })
            .await?;
        }
        Ok(locs)
    }

    // ------------------------------------------------------------ background

    /// Logs chunkservers that died or came back. (Leases past their hard limit are the
    /// recovery worker's: [`Core::recovery_pass`].)
    pub fn monitor(&self) {
        if !self.clock.settled(crate::lease::RESUME_SETTLE) {
            return;
        }
        let now = self.clock.now_ms();
        let mut back = Vec::new();
        {
            let mut st = self.state();
            let dead_after = st.settings.dead_after_ms;
            for (id, live) in st.registry.liveness_changes(now, dead_after) {
                if live {
                    tracing::info!(chunkserver = %id, "chunkserver is live again");
                    back.push(id);
                } else {
                    tracing::warn!(chunkserver = %id, "chunkserver missed its heartbeats: dead; its replicas are no longer handed out");
                }
            }
        }
        self.replicas_back(&back);
    }
}
