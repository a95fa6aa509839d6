//! The chunkserver process: start-up, the listener, one handler per connection, request
//! dispatch, and shutdown.
//!
//! Shape (mini-redis): a listener accepts connections under a semaphore that caps them,
//! backing off on accept errors; each connection gets a task; every task selects on the
//! shared [`CancellationToken`]; shutdown cancels it and waits (through a
//! [`TaskTracker`]) for every handler, the heartbeat task and running replications.
//!
//! A connection carries request frames `(id, ChunkRequest)` answered by reply frames
//! `(id, Result<_, RemoteError>)`, one at a time, until a `WriteSetup`, an
//! `OverwriteSetup` or a `ReceiveReplica` turns it into a stream (see [`crate::pipeline`] and
//! [`crate::replication`]). A malformed frame closes that connection only, and so does
//! silence: a peer that sends no request for `--idle-timeout` after its last reply
//! (frozen, vanished, or a half-open TCP connection) is disconnected, which frees its
//! connection permit.
//!
//! The same timeout bounds the other direction: every reply (and every ack or frame a
//! stream sends back on this connection) is written through a [`StallGuard`], so a
//! peer that stops *reading* (SIGSTOP, a dead VM, a receive window that stays full)
//! and takes no byte for `--idle-timeout`
//! is treated as gone: the write fails, the guard logs the peer at info, and the
//! connection ends as on a broken socket, giving back its connection permit and, for
//! a read, its share of the read budget. The clock restarts whenever the peer takes
//! some bytes, so a slow reader of a 16 MiB read reply is not cut (see
//! [`crate::stall`]).

use crate::config::ChunkserverConfig;
use crate::error::{Error, Result};
use crate::stall::StallGuard;
use crate::store::{self, Store};
use crate::{deletion, digest, heartbeat, io, pipeline, replication, scrub};
use bytes::Bytes;
use stampfs_proto::net::{Acceptor, Conn, Dialer};
use stampfs_proto::rpc::{parse_request, reply_frame};
use stampfs_proto::{
    ChunkCommand, ChunkRequest, ChunkserverId, ClusterKey, DirLock, FrameReader, FrameWriter,
    RemoteError, ReplayWindow, ReplicaReport, Signed, SignedBody,
};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Locks a mutex of plain bookkeeping (a panic elsewhere cannot leave it half-updated).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// File in the data directory holding the chunkserver id (decimal).
pub const ID_FILE: &str = "chunkserver.id";
/// File in the data directory holding the bound address (`ip:port`).
pub const ADDR_FILE: &str = "addr";
/// Bytes of read replies in flight at once, across all connections.
const READ_BUDGET: usize = 256 << 20;

/// How long a registration waits for the master commands still running
/// ([`Shared::settle_commands`]).
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// State shared by the listener, the handlers and the heartbeat task.
pub(crate) struct Shared {
    pub config: ChunkserverConfig,
    pub key: ClusterKey,
    /// How the master and other chunkservers are dialed (plain, or TLS by `--tls-ca`).
    pub dialer: Dialer,
    pub store: Arc<Store>,
    /// The address announced to the master.
    pub advertised: String,
    /// The id from `DIR/chunkserver.id` or the master; written by the heartbeat task.
    id: Mutex<Option<ChunkserverId>>,
    /// The master's commands admitted in this registration session
    /// ([`stampfs_proto::replay`]): each is applied at most once.
    replay: Mutex<ReplayWindow>,
    /// The highest master epoch seen (`DIR/master-epoch`): commands signed under a
    /// lower one come from a deposed master and are refused.
    epoch: crate::epoch::EpochFence,
    /// Held shared by every master command from its admission to its answer, and
    /// taken exclusively by a registration once it changed sessions
    /// ([`Shared::settle_commands`]).
    commands: tokio::sync::RwLock<()>,
    /// Write streams currently open (reported in heartbeats).
    pub active_streams: AtomicU32,
    /// Caps concurrent outgoing replications; each holds a permit while it runs.
    pub replications: Arc<Semaphore>,
    /// Deletions from the master waiting for the paced deletion task.
    pub deletions: deletion::Deletions,
    /// Byte permits for read replies (held from the read until the reply is written),
    /// so many concurrent large reads cannot exhaust memory.
    read_budget: Arc<Semaphore>,
    /// Cancelled by shutdown; every task selects on it.
    pub cancel: CancellationToken,
    /// Requests served and their latency, when metrics are served (`metrics.rs`).
    pub metrics: std::sync::OnceLock<stampfs_metrics::Requests>,
    /// Why this chunkserver cannot go on (the master and it hold different cluster
    /// keys); set once, with `cancel` cancelled, for the process to exit saying so.
    fatal: tokio::sync::watch::Sender<Option<String>>,
    /// Every spawned task, so shutdown can wait for them.
    pub tracker: TaskTracker,
    /// The exclusive lock on the data directory (one chunkserver per directory). It is
    /// released when the last task holding this state is gone: after `shutdown` waited
    /// for them all, or, on a drop without it, once every cancelled task has stopped
    /// touching the directory (or at once when the process ends).
    _dir_lock: DirLock,
}

impl Shared {
    /// Stops the chunkserver for good, for `reason` (see [`ChunkserverHandle::failed`]).
    pub fn fail(&self, reason: String) {
        tracing::error!(reason = %reason, "stopping: this chunkserver cannot serve");
        self.fatal.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(reason);
                true
            } else {
                false
            }
        });
        self.cancel.cancel();
    }

    /// This chunkserver's id, if it has one.
    pub fn id(&self) -> Option<ChunkserverId> {
        *self.id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id used in acks and setup replies (0 before the first registration).
    pub fn own_id(&self) -> ChunkserverId {
        self.id().unwrap_or(ChunkserverId(0))
    }

    /// Starts a registration with a fresh session: every command signed for an
    /// earlier one is refused from now on. Returns the session for the `Register`.
    pub fn begin_registration(&self) -> u64 {
        let session = rand::random();
        lock(&self.replay).begin(self.id(), session);
        session
    }

    /// Waits for the master commands admitted before now to be done. A registration
    /// calls it after [`Shared::begin_registration`] and before it builds its report:
    /// every command the master heard answered before the `Register` arrived then
    /// shows in the report, which the master relies on to take replicas away (its
    /// "mark", DESIGN.md "The report mark").
    ///
    /// At most [`SETTLE_TIMEOUT`]: a command stuck on the disk fails the registration
    /// (it is retried with backoff) rather than holding up every later command.
    pub async fn settle_commands(&self) -> Result<()> {
        match tokio::time::timeout(SETTLE_TIMEOUT, self.commands.write()).await {
            Ok(held) => {
                drop(held);
                Ok(())
            }
            Err(_) => Err(Error::Unavailable {
                reason: format!(
                    "master commands still running after {SETTLE_TIMEOUT:?}; registering later"
                ),
            }),
        }
    }

    /// Authenticates a signed master request and admits it once
    /// ([`ReplayWindow::admit`]): a forged, altered, replayed, misaddressed or
    /// pre-registration request is refused with the reason, and changes nothing.
    pub fn admit<T: SignedBody>(&self, signed: Signed<T>, what: &str) -> Result<T> {
        let (issue, body) = signed.verify(&self.key).map_err(|e| {
            tracing::warn!(error = %e, "{what} refused");
            Error::BadCommand
        })?;
        self.epoch.admit(issue.epoch).inspect_err(|e| {
            tracing::warn!(seq = issue.seq, epoch = %issue.epoch, error = %e, "{what} refused");
        })?;
        lock(&self.replay).admit(&issue).map_err(|refusal| {
            tracing::warn!(seq = issue.seq, %refusal, "{what} refused");
            Error::CommandRefused {
                reason: refusal.to_string(),
            }
        })?;
        Ok(body)
    }

    /// Records (and persists, atomically) the id the master assigned.
    pub fn set_id(&self, id: ChunkserverId) -> Result<()> {
        lock(&self.replay).set_id(id);
        if self.id() == Some(id) {
            return Ok(());
        }
        store::replace_file(
            &self.config.dir.join(ID_FILE),
            format!("{}\n", id.0).as_bytes(),
        )?;
        *self.id.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
        Ok(())
    }
}

/// A running chunkserver.
pub struct ChunkserverHandle {
    addr: SocketAddr,
    engine: &'static str,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ChunkserverHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkserverHandle")
            .field("addr", &self.addr)
            .field("engine", &self.engine)
            .field("id", &self.id())
            .finish()
    }
}

impl ChunkserverHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The chunkserver id, once known (persisted or assigned by the master).
    pub fn id(&self) -> Option<ChunkserverId> {
        self.shared.id()
    }

    /// The I/O engine that runs: `"uring"` or `"threads"`.
    pub fn engine(&self) -> &'static str {
        self.engine
    }

    /// Starts a registration session as registering with a master does (commands
    /// signed for any earlier session are refused from now on) and returns it: for
    /// driving a chunkserver without a master, as its tests do.
    pub fn begin_registration(&self) -> u64 {
        self.shared.begin_registration()
    }

    /// Resolves, with the reason, once the chunkserver has stopped itself because it
    /// cannot serve (the master does not share its cluster key); never otherwise. The
    /// caller should then shut it down and exit with an error.
    pub async fn failed(&self) -> String {
        let mut rx = self.shared.fatal.subscribe();
        let reason = match rx.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            // The sender lives as long as the shared state, which this handle holds.
            Err(_) => None,
        };
        match reason {
            Some(r) => r,
            None => std::future::pending().await,
        }
    }

    /// Stops accepting, stops every handler and background task, and waits for them.
    pub async fn shutdown(self) -> Result<()> {
        self.shared.cancel.cancel();
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
        tracing::info!(addr = %self.addr, "chunkserver stopped");
        Ok(())
    }
}

impl Drop for ChunkserverHandle {
    fn drop(&mut self) {
        // Dropped without `shutdown`: still stop the background tasks.
        self.shared.cancel.cancel();
    }
}

fn load_id(dir: &Path) -> Result<Option<ChunkserverId>> {
    let path = dir.join(ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(v) => Ok(Some(ChunkserverId(v))),
            Err(_) => Err(Error::Config {
                field: "dir",
                reason: format!("{} does not hold a chunkserver id", path.display()),
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", &path, e)),
    }
}

/// Starts a chunkserver: loads the cluster key, locks the data directory, opens the
/// store (scanning and verifying every replica), binds, writes `DIR/addr` atomically,
/// and spawns the server and the heartbeat task. The master need not be running. Fails
/// with [`Error::DirLocked`] when another chunkserver (in any process) holds the
/// directory.
pub async fn start(config: ChunkserverConfig) -> Result<ChunkserverHandle> {
    config.validate()?;
    let key = ClusterKey::load(&config.cluster_key_file).map_err(Error::ClusterKey)?;
    let (acceptor, dialer) = config.tls.load()?;
    std::fs::create_dir_all(&config.dir).map_err(|e| Error::io("create", &config.dir, e))?;
    // First, before anything reads or changes the directory: a second chunkserver must
    // not recover, truncate or move aside the first one's replicas, nor overwrite its
    // address or id file.
    let dir_lock = DirLock::acquire(&config.dir)?;
    let nofile = stampfs_proto::limits::raise_open_files();
    tracing::info!(was = ?nofile.was, soft = ?nofile.soft, hard = ?nofile.hard, "open-file limit (soft raised to the hard limit)");
    let max_open_files = config.open_files_capacity(nofile.soft);
    if nofile
        .soft
        .is_some_and(|soft| max_open_files as u64 >= soft)
    {
        tracing::warn!(max_open_files, soft = ?nofile.soft, "--max-open-files leaves no descriptors for sockets under the soft open-file limit");
    }
    tracing::info!(
        max_open_files,
        auto = config.max_open_files == 0,
        "replica file cache (auto: max(64, soft limit / 2))"
    );
    let engine = io::open_engine(config.io_engine)?;
    let engine_name = engine.name();
    let store = Arc::new(
        Store::open(&config.dir, engine)
            .await?
            .with_write_behind(config.write_behind)
            .with_max_open_files(max_open_files),
    );
    let id = load_id(&config.dir)?;
    let epoch = crate::epoch::EpochFence::load(&config.dir)?;
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| Error::io("bind", &config.listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("bind", &config.listen, e))?;
    let advertised = config.advertise.clone().unwrap_or_else(|| addr.to_string());
    let (deletions, deletion_queue) = deletion::Deletions::new();
    let shared = Arc::new(Shared {
        key,
        dialer,
        store,
        advertised,
        id: Mutex::new(id),
        replay: Mutex::new(ReplayWindow::default()),
        epoch,
        commands: tokio::sync::RwLock::new(()),
        active_streams: AtomicU32::new(0),
        replications: Arc::new(Semaphore::new(config.max_replications)),
        deletions,
        read_budget: Arc::new(Semaphore::new(READ_BUDGET)),
        cancel: CancellationToken::new(),
        metrics: std::sync::OnceLock::new(),
        fatal: tokio::sync::watch::channel(None).0,
        tracker: TaskTracker::new(),
        _dir_lock: dir_lock,
        config,
    });
    store::replace_file(
        &shared.config.dir.join(ADDR_FILE),
        format!("{addr}\n").as_bytes(),
    )?;
    if let Some(at) = shared.config.metrics_listen.clone() {
        // Read first: a bad token file fails before anything is bound.
        let token = match &shared.config.metrics_token_file {
            Some(path) => Some(stampfs_metrics::Token::read(path).map_err(|e| {
                let (_, source) = e.into_parts();
                Error::io("read the metrics token file", path, source)
            })?),
            None => None,
        };
        let file = shared.config.dir.join("metrics-addr");
        let listener = stampfs_metrics::bind(&at, &file).await.map_err(|e| {
            let (_, source) = e.into_parts();
            Error::io("serve metrics on", &at, source)
        })?;
        let (exporter, requests) = crate::metrics::exporter(&shared, engine_name);
        let _ = shared.metrics.set(requests);
        let stop = shared.cancel.clone();
        shared.tracker.spawn(async move {
            tokio::select! {
                () = stampfs_metrics::serve(listener, exporter, token) => {}
                () = stop.cancelled() => {}
            }
        });
        tracing::info!(addr = %at, token = shared.config.metrics_token_file.is_some(), "serving metrics at /metrics");
    }
    let limit = Arc::new(Semaphore::new(shared.config.max_connections));
    shared
        .tracker
        .spawn(listen(shared.clone(), listener, acceptor, limit));
    shared.tracker.spawn(heartbeat::run(shared.clone()));
    shared
        .tracker
        .spawn(deletion::run(shared.clone(), deletion_queue));
    shared.tracker.spawn(scrub::run(shared.clone()));
    tracing::info!(
        %addr,
        engine = engine_name,
        tls = shared.dialer.is_tls(),
        id = ?id,
        dir = %shared.config.dir.display(),
        master = %shared.config.master,
        "chunkserver ready"
    );
    Ok(ChunkserverHandle {
        addr,
        engine: engine_name,
        shared,
    })
}

/// Accepts connections until shutdown.
async fn listen(
    shared: Arc<Shared>,
    listener: TcpListener,
    acceptor: Acceptor,
    limit: Arc<Semaphore>,
) {
    let mut backoff = Duration::from_millis(10);
    loop {
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shared.cancel.cancelled() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shared.cancel.cancelled() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::from_millis(10);
                let shared2 = shared.clone();
                let acceptor = acceptor.clone();
                shared.tracker.spawn(async move {
                    let conn = tokio::select! {
                        c = acceptor.accept(stream, peer) => c,
                        _ = shared2.cancel.cancelled() => return,
                    };
                    match conn {
                        Ok(conn) => serve_connection(shared2, conn).await,
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                            tracing::debug!(%peer, error = %e, "closed before its TLS handshake")
                        }
                        Err(e) => tracing::warn!(%peer, error = %e, "TLS handshake failed; closing this connection"),
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed; backing off");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shared.cancel.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Serves one connection until EOF, a malformed frame, a finished stream, or shutdown.
async fn serve_connection(shared: Arc<Shared>, conn: Conn) {
    let peer = conn.peer;
    let idle_timeout = shared.config.idle_timeout;
    let (r, w) = (conn.read, conn.write);
    let mut reader = FrameReader::new(r);
    // Every write to this peer, replies and stream acks alike, fails once the peer has
    // taken no byte for the idle timeout (it stopped reading: gone).
    let mut writer = FrameWriter::new(StallGuard::new(w, peer, idle_timeout));
    loop {
        // The idle clock runs only while waiting for the next request: from the moment
        // the previous reply was written until a whole frame has arrived.
        let frame = tokio::select! {
            f = stampfs_proto::pause::timeout(idle_timeout, reader.read_frame()) => f,
            _ = shared.cancel.cancelled() => return,
        };
        let frame = match frame {
            Ok(f) => f,
            Err(_) => {
                tracing::debug!(%peer, ?idle_timeout, "closing an idle connection");
                return;
            }
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                return;
            }
        };
        let (id, request) = match parse_request::<ChunkRequest>(&frame) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection: undecodable request");
                return;
            }
        };
        // Read permits stay held until the reply has been written (or its write has
        // failed: a peer that stopped reading gives them back after the idle timeout).
        let mut _read_permit = None;
        let (op, started) = (request.name(), std::time::Instant::now());
        if request.is_stream() {
            // A stream takes the connection: counted when it starts, not timed.
            if let Some(m) = shared.metrics.get() {
                m.count(op);
            }
        }
        let outcome = match request {
            ChunkRequest::WriteSetup(setup) => {
                let mode = pipeline::WriteMode::Append;
                pipeline::serve(shared.clone(), id, setup, mode, reader, writer, peer).await;
                return;
            }
            ChunkRequest::OverwriteSetup(overwrite) => {
                let mode = pipeline::WriteMode::Overwrite;
                let setup = overwrite.setup;
                pipeline::serve(shared.clone(), id, setup, mode, reader, writer, peer).await;
                return;
            }
            ChunkRequest::ReceiveReplica(req) => {
                replication::receive(shared.clone(), id, req, reader, writer, peer).await;
                return;
            }
            ChunkRequest::Read(read) => {
                let want = (read.len as usize).clamp(1, stampfs_proto::MAX_DATA_LEN) as u32;
                _read_permit = tokio::select! {
                    p = shared.read_budget.clone().acquire_many_owned(want) => p.ok(),
                    _ = shared.cancel.cancelled() => return,
                };
                let result = handle_read(&shared, read).await;
                match result {
                    Ok((reply, data)) => reply_frame(id, &Ok(reply), data),
                    Err(e) => reply_frame::<stampfs_proto::ReadReply>(id, &Err(e), Bytes::new()),
                }
            }
            ChunkRequest::ReplicaInfo(info) => {
                let result = handle_replica_info(&shared, info).await;
                reply_frame(id, &result, Bytes::new())
            }
            ChunkRequest::Command(cmd) => {
                let result = run_command(&shared, cmd).await;
                reply_frame(id, &result, Bytes::new())
            }
            ChunkRequest::Verify(req) => {
                let result = scrub::verify_request(&shared, req).await;
                reply_frame(id, &result, Bytes::new())
            }
            ChunkRequest::Digest(req) => {
                let result = digest::serve(&shared, req).await;
                reply_frame(id, &result, Bytes::new())
            }
        };
        if let Some(m) = shared.metrics.get() {
            m.observe(op, started.elapsed());
        }
        let sent = match outcome {
            Ok(frame) => writer.write_frame(&frame).await,
            Err(e) => {
                tracing::error!(%peer, error = %e, "cannot encode reply");
                return;
            }
        };
        if let Err(e) = sent {
            tracing::debug!(%peer, error = %e, "connection closed while replying");
            return;
        }
    }
}

#[tracing::instrument(skip_all, fields(chunk = %read.token.handle, version = %read.token.version, offset = read.offset, len = read.len))]
async fn handle_read(
    shared: &Shared,
    read: stampfs_proto::Read,
) -> std::result::Result<(stampfs_proto::ReadReply, Bytes), RemoteError> {
    // Reads take read tokens (from GetLocations) or write tokens; writes never take
    // read tokens.
    read.token
        .verify_read(&shared.key)
        .map_err(|e| Error::from(e).to_remote())?;
    let (replica, data) = shared
        .store
        .read(
            read.token.handle,
            read.token.version,
            read.offset,
            u64::from(read.len),
        )
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "read refused");
            e.to_remote()
        })?;
    crate::counters::add(&crate::counters::BYTES_READ, data.len() as u64);
    Ok((stampfs_proto::ReadReply { replica }, data))
}

#[tracing::instrument(skip_all, fields(chunk = %info.token.handle, version = %info.token.version))]
async fn handle_replica_info(
    shared: &Shared,
    info: stampfs_proto::ReplicaInfo,
) -> std::result::Result<ReplicaReport, RemoteError> {
    info.token
        .verify_read(&shared.key)
        .map_err(|e| Error::from(e).to_remote())?;
    shared
        .store
        .gated_info(info.token.handle, info.token.version)
        .await
        .map_err(|e| e.to_remote())
}

/// Verifies and runs one master command (directly or from a heartbeat reply).
/// `Replicate` is started in the background and answers `None` at once.
#[tracing::instrument(skip_all)]
pub(crate) async fn run_command(
    shared: &Arc<Shared>,
    cmd: Signed<ChunkCommand>,
) -> std::result::Result<Option<ReplicaReport>, RemoteError> {
    // Held until the answer: a registration waits for it (`Shared::settle_commands`).
    let _running = shared.commands.read().await;
    let cmd = shared
        .admit(cmd, "master command")
        .map_err(|e| e.to_remote())?;
    execute(shared, cmd).await
}

/// Runs one admitted master command (see [`run_command`]).
pub(crate) async fn execute(
    shared: &Arc<Shared>,
    cmd: ChunkCommand,
) -> std::result::Result<Option<ReplicaReport>, RemoteError> {
    let store = &shared.store;
    let result = match cmd.clone() {
        ChunkCommand::BumpVersion {
            handle,
            version,
            create,
        } => {
            let bumped = store.bump_version(handle, version, create).await;
            // The new header is durable; the master has not heard.
            stampfs_proto::crash_point!("replica-bump-before-reply", if bumped.is_ok());
            bumped.map(Some)
        }
        ChunkCommand::Truncate {
            handle,
            version,
            length,
        } => store.truncate(handle, version, length).await.map(Some),
        ChunkCommand::Finalize {
            handle,
            version,
            length,
        } => store.finalize(handle, version, length).await.map(Some),
        ChunkCommand::Delete {
            handle,
            max_version,
        } => store.delete(handle, max_version).await,
        ChunkCommand::Info { handle } => store.info(handle).await.map(Some),
        ChunkCommand::Replicate {
            handle,
            version,
            target,
        } => {
            replication::spawn(shared.clone(), handle, version, target);
            Ok(None)
        }
    };
    match &result {
        Ok(report) => tracing::debug!(command = ?cmd, ?report, "command done"),
        Err(e) => tracing::warn!(command = ?cmd, error = %e, "command failed"),
    }
    result.map_err(|e| e.to_remote())
}

/// Tracks an open write stream for heartbeats.
pub(crate) struct StreamGuard<'a>(&'a AtomicU32);

impl<'a> StreamGuard<'a> {
    pub fn new(counter: &'a AtomicU32) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
