//! Start-up, the TCP listener, connection handlers and shutdown.
//!
//! [`start`] locks the directory (one master per directory, see
//! [`oplog::DirLock`]), loads (or creates) the cluster key, replays the checkpoint and
//! the log, binds, writes `DIR/addr` and spawns the listener and the background
//! workers. The listener caps connections with a semaphore and backs off on accept
//! errors; each connection is one task answering its requests in order. A malformed
//! frame closes that connection only. [`MasterHandle::shutdown`] stops accepting, lets
//! handlers finish the request they are in, stops the workers and flushes the log.
//! The directory lock is released only once nothing of this master writes into the
//! directory any more: the handle is gone, the log stopped (its segment closed after
//! any batch being written, its sweeper thread joined), and no
//! checkpoint write or trim is in flight (a dropped handle leaves a running one to
//! finish first).

use crate::auth::ConnAuth;
use crate::config::MasterConfig;
use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::lease::Clock;
use crate::oplog;
use crate::raft::network::Network;
use crate::recovery::RECOVERY_TICK;
use crate::service::Core;
use crate::state::{Settings, REQUEST_USER};
use bincode::Encode;
use bytes::Bytes;
use stampfs_proto::codec::{Frame, FrameReader, FrameWriter};
use stampfs_proto::net::Acceptor;
use stampfs_proto::rpc::{parse_request, reply_frame};
use stampfs_proto::{ClusterKey, MasterRequest, RemoteError};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long shutdown waits for connection handlers to finish their current request.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often the checkpoint worker checks whether one is due.
const CHECKPOINT_POLL: Duration = Duration::from_secs(1);

// The binary may move the handle between tasks.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<MasterHandle>();
};

mod calls;
mod recover;
mod report_parts;

use calls::{serve_once, serve_raft};
pub use recover::RAFT_DIR;
use report_parts::ReportParts;
pub use report_parts::MAX_REPORT_REPLICAS;

/// A running master.
#[derive(Debug)]
pub struct MasterHandle {
    addr: SocketAddr,
    core: Arc<Core>,
    /// Tells the listener, the connection handlers and the workers to stop.
    shutdown: CancellationToken,
    /// Every spawned task, so shutdown can wait for them.
    tasks: TaskTracker,
    /// `shutdown` ran: dropping the handle must not halt the log.
    stopped: bool,
    /// The exclusive lock on the directory, held while this master serves from it.
    /// Besides this handle, only work that writes into the directory holds it: the log
    /// is stopped before the handle lets go (by `shutdown`, or by `drop`: its segment
    /// closed once the batch being written is done, so no request writes after),
    /// and a checkpoint holds its own reference until its write and trim are done
    /// (`Core::dir_guard`). So the lock is released once the handle is gone and no such
    /// work runs: when `shutdown` returns (it waited for the checkpoint worker), or on
    /// a drop without it (a simulated crash) once a checkpoint in flight has finished.
    _dir_lock: Arc<oplog::DirLock>,
}

impl MasterHandle {
    /// The address the master listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Writes a checkpoint now and trims the log (normally done in the background).
    pub async fn checkpoint(&self) -> Result<bool> {
        self.core.checkpoint().await
    }

    /// Log writer counters (fsyncs, records).
    pub fn log_stats(&self) -> oplog::LogStats {
        self.core.log.stats()
    }

    /// The request layer this master serves from: what its connection handlers call
    /// for each request. In-process drivers (`stampfs bench master`) call it directly
    /// to measure the master without the wire in between.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Stops serving, waits for in-flight requests, stops the workers and flushes the
    /// operation log.
    pub async fn shutdown(mut self) -> Result<()> {
        self.stopped = true;
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("connection handlers did not finish within {SHUTDOWN_GRACE:?}; closing the log anyway");
        }
        match &self.core.log {
            Journal::Oplog(_) => {
                let core = self.core.clone();
                tokio::task::spawn_blocking(move || core.log.oplog()?.close())
                    .await
                    .map_err(|e| Error::LogFailed {
                        reason: format!("log close task failed: {e}"),
                    })??;
            }
            Journal::Group(g) => g.shutdown().await?,
        }
        remove_addr_file(&self.core.config.dir);
        tracing::info!(addr = %self.addr, "master stopped; operation log flushed");
        Ok(())
    }
}

impl Drop for MasterHandle {
    /// Dropping a handle without [`MasterHandle::shutdown`] is a crash: the listener
    /// and handlers stop, and records not yet durable are dropped. The directory stays
    /// locked until a checkpoint in flight has finished writing and trimming.
    fn drop(&mut self) {
        if !self.stopped {
            self.shutdown.cancel();
            self.core.log.halt();
        }
    }
}

/// The directory holds the cluster key, and the users' keys in the log and the
/// checkpoint: nobody but the master's own user may enter it (mode 0700).
fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let what = |e| Error::io(format!("make {} private", dir.display()), e);
    let mode = std::fs::metadata(dir).map_err(what)?.permissions().mode();
    if mode & 0o077 != 0 {
        tracing::warn!(dir = %dir.display(), mode = format!("{:o}", mode & 0o777), "the master's directory was open to others; making it 0700 (it holds the cluster key and the users' keys)");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(what)?;
    }
    Ok(())
}

fn remove_addr_file(dir: &Path) {
    if let Err(e) = std::fs::remove_file(dir.join("addr")) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(error = %e, "cannot remove the addr file");
        }
    }
}

/// Writes `DIR/addr` durably: temp file, fsync, rename, directory fsync.
/// Writes `DIR/addr`: this master's address, then (a member of a group of several)
/// the other members', comma-separated: what a client's or a chunkserver's
/// `--master` takes.
fn write_addr_file(dir: &Path, addr: SocketAddr, others: &[String]) -> Result<()> {
    use std::io::Write;
    let tmp = dir.join("addr.tmp");
    let io = |e| Error::io(format!("write {}", tmp.display()), e);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    let mut line = addr.to_string();
    for other in others {
        line.push(',');
        line.push_str(other);
    }
    writeln!(f, "{line}")
        .and_then(|()| f.sync_all())
        .map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, dir.join("addr")).map_err(io)?;
    oplog::sync_dir(dir)
}

/// Starts a master: directory lock, key, replay, bind, `DIR/addr`, server and
/// workers. Fails with [`Error::DirLocked`] when another master (in any process) holds
/// the directory.
pub async fn start(config: MasterConfig) -> Result<MasterHandle> {
    config.validate()?;
    let dir = config.dir.clone();
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    private_dir(&dir)?;
    // First, before anything reads or changes the directory: a second master must not
    // remove the first one's address file, truncate its log tail on replay, or append.
    let dir_lock = Arc::new(oplog::DirLock::acquire(&dir)?);
    let (acceptor, dialer) = config.tls.load()?;
    if acceptor.is_tls() || dialer.is_tls() {
        tracing::info!(
            serves_tls = acceptor.is_tls(),
            dials_tls = dialer.is_tls(),
            "TLS configured"
        );
    }
    let nofile = stampfs_proto::limits::raise_open_files();
    tracing::info!(was = ?nofile.was, soft = ?nofile.soft, hard = ?nofile.hard, "open-file limit (soft raised to the hard limit)");
    // A stale address from an earlier run must not be mistaken for this one.
    remove_addr_file(&dir);
    let (key, created) = ClusterKey::load_or_create(&config.key_file())?;
    if created {
        tracing::info!(file = %config.key_file().display(), "created a new cluster key");
    }
    let clock = Clock::new();
    let settings = Settings::from_config(&config);
    let recover::Recovered {
        state,
        checkpoint_lsn,
        log,
    } = {
        let network = if config.peers.len() > 1 || config.join {
            Network::new(config.id, dialer.clone(), key.clone())
        } else {
            Network::none()
        };
        recover::recover(&config, &dir_lock, settings, clock, network).await?
    };
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| Error::io(format!("listen on {}", config.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("read the listening address", e))?;
    let max_connections = config.max_connections;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let core = Arc::new(Core::new(
        config,
        key,
        state,
        log,
        clock,
        checkpoint_lsn,
        tasks.clone(),
        shutdown.clone(),
        &dir_lock,
        dialer,
    ));
    if core.log.serving().is_ok() {
        core.bootstrap_admin().await?;
    } else {
        // A member of a group: the first to lead creates the superuser.
        tasks.spawn(bootstrap_when_leading(core.clone(), shutdown.clone()));
    }
    if let Some(addr) = core.config.metrics_listen.clone() {
        // Read first: a bad token file fails before anything is bound.
        let token = match &core.config.metrics_token_file {
            Some(path) => Some(stampfs_metrics::Token::read(path).map_err(|e| {
                let (what, source) = e.into_parts();
                Error::io(what, source)
            })?),
            None => None,
        };
        let file = core.config.dir.join("metrics-addr");
        let listener = stampfs_metrics::bind(&addr, &file).await.map_err(|e| {
            let (what, source) = e.into_parts();
            Error::io(what, source)
        })?;
        let (exporter, requests) = crate::metrics::exporter(&core);
        let _ = core.metrics.set(requests);
        let stop = shutdown.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = stampfs_metrics::serve(listener, exporter, token) => {}
                () = stop.cancelled() => {}
            }
        });
        tracing::info!(%addr, token = core.config.metrics_token_file.is_some(), "serving metrics at /metrics");
    }
    let limit = Arc::new(Semaphore::new(max_connections));
    tasks.spawn(accept_loop(
        listener,
        acceptor,
        core.clone(),
        limit,
        shutdown.clone(),
        tasks.clone(),
    ));
    let monitor_period = (core.config.dead_after / 4)
        .min(Duration::from_secs(1))
        .max(Duration::from_millis(10));
    let c = core.clone();
    tasks.spawn(periodic(
        "monitor",
        monitor_period,
        shutdown.clone(),
        move || {
            if c.log.serving().is_ok() {
                c.monitor();
            }
            async {}
        },
    ));
    let c = core.clone();
    tasks.spawn(periodic(
        "lease-recovery",
        RECOVERY_TICK,
        shutdown.clone(),
        move || {
            if c.log.serving().is_ok() {
                c.recovery_pass();
            }
            async {}
        },
    ));
    if !core.config.health_interval.is_zero() {
        let c = core.clone();
        tasks.spawn(periodic(
            "replica-health",
            core.config.health_interval,
            shutdown.clone(),
            move || {
                let c = c.clone();
                async move {
                    if c.log.serving().is_ok() {
                        c.health_pass().await
                    }
                }
            },
        ));
    } else {
        tracing::warn!("the replica-health worker is off (--health-interval 0): no re-replication, no garbage collection");
    }
    let c = core.clone();
    tasks.spawn(periodic(
        "checkpoint",
        CHECKPOINT_POLL,
        shutdown.clone(),
        move || {
            let c = c.clone();
            async move {
                if let Err(e) = c.maybe_checkpoint().await {
                    tracing::error!(error = %e, "checkpoint failed");
                }
            }
        },
    ));
    let handle = MasterHandle {
        addr,
        core,
        shutdown,
        tasks,
        stopped: false,
        _dir_lock: dir_lock,
    };
    // A failure from here drops the handle: the tasks stop and the log halts before
    // the directory is unlocked.
    let others: Vec<String> = handle
        .core
        .log
        .group()
        .map(|g| g.member_addrs())
        .unwrap_or_default()
        .into_iter()
        .filter(|(id, _)| Some(*id) != handle.core.log.group().map(|g| g.id))
        .map(|(_, a)| a)
        .collect();
    write_addr_file(&handle.core.config.dir, addr, &others)?;
    tracing::info!(%addr, dir = %handle.core.config.dir.display(), "master ready");
    Ok(handle)
}

/// Creates the superuser once this member of a group leads (the first leader of a new
/// group does; later ones find it).
async fn bootstrap_when_leading(core: Arc<Core>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if core.log.serving().is_err() {
            // Another member led first and created it: nothing left to do.
            if !core.state().user_list().is_empty() {
                return;
            }
            continue;
        }
        match core.bootstrap_admin().await {
            Ok(()) => return,
            Err(e @ (Error::NotLeader { .. } | Error::LeadershipLost { .. })) => {
                tracing::debug!(error = %e, "the superuser waits for a leader");
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot create the superuser");
                return;
            }
        }
    }
}

/// The shape of every background worker: run `tick` every `period` until shutdown.
async fn periodic<F, Fut>(
    name: &'static str,
    period: Duration,
    shutdown: CancellationToken,
    mut tick: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = interval.tick() => tick().await,
        }
    }
    tracing::debug!(worker = name, "worker stopped");
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Acceptor,
    core: Arc<Core>,
    limit: Arc<Semaphore>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let mut backoff = Duration::from_millis(5);
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::from_millis(5);
                tasks.spawn(handle_connection(
                    acceptor.clone(),
                    stream,
                    peer,
                    core.clone(),
                    shutdown.clone(),
                    permit,
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed; backing off {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

async fn handle_connection(
    acceptor: Acceptor,
    stream: TcpStream,
    peer: SocketAddr,
    core: Arc<Core>,
    shutdown: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let conn = tokio::select! {
        _ = shutdown.cancelled() => return,
        c = acceptor.accept(stream, peer) => c,
    };
    let conn = match conn {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!(%peer, error = %e, "closed before its TLS handshake");
            return;
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "TLS handshake failed; closing this connection");
            return;
        }
    };
    let mut reader = FrameReader::new(conn.read);
    let mut writer = FrameWriter::new(conn.write);
    // The parts of a long chunk report sent so far on this connection.
    let mut parts = ReportParts::default();
    // What this connection has proven (a chunkserver's or a client's handshake).
    let mut auth = ConnAuth::default();
    // The mark of the next chunk report on this connection, and whose (see
    // `state/report.rs`).
    let mut mark = None;
    loop {
        let frame = tokio::select! {
            _ = shutdown.cancelled() => break,
            f = reader.read_frame() => f,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "bad frame; closing this connection");
                break;
            }
        };
        let (id, req) = match parse_request::<MasterRequest>(&frame) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "malformed request; closing this connection");
                break;
            }
        };
        let mut refused = false;
        let reply = match req {
            MasterRequest::ServerHello(h) => {
                reply(id, Ok(auth.hello(h.nonce, stampfs_proto::auth::nonce())))
            }
            MasterRequest::ServerProve(p) => match auth.prove(core.key(), &p.proof) {
                Ok(r) => {
                    tracing::debug!(%peer, "a chunkserver proved the cluster key");
                    reply(id, Ok(r))
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "a chunkserver failed to prove the cluster key; refusing it and closing its connection");
                    refused = true;
                    reply::<()>(id, Err(e))
                }
            },
            MasterRequest::ClientHello(h) => {
                match auth.client_hello(h.user, h.nonce, stampfs_proto::auth::nonce()) {
                    Ok(challenge) => reply(id, Ok(challenge)),
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "a client named a user nobody can be; refusing it and closing its connection");
                        refused = true;
                        reply::<()>(id, Err(e))
                    }
                }
            }
            MasterRequest::ClientProve(p) => {
                let epoch = core.users_epoch();
                match auth.client_prove(epoch, |name| core.user_key(name), &p.proof) {
                    Ok(r) => {
                        tracing::debug!(%peer, user = %r.identity.name, "a client proved its user's key");
                        reply(id, Ok(r))
                    }
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "a client failed to prove a user's key; refusing it and closing its connection");
                        refused = true;
                        reply::<()>(id, Err(e))
                    }
                }
            }
            mut req => match authorize(&core, &mut auth, &mut req) {
                Err(e @ Error::Unauthenticated { .. }) => {
                    tracing::warn!(%peer, error = %e, "request on an unauthenticated connection; refusing it and closing the connection");
                    refused = true;
                    reply::<()>(id, Err(e))
                }
                Err(e) => reply::<()>(id, Err(e)),
                Ok(()) if matches!(req, MasterRequest::Raft(_)) => {
                    serve_raft(&core, id, req, &frame.data).await
                }
                Ok(()) => match parts.take(req) {
                    Ok(Some(req)) => {
                        // Lease holders' client ids are named to superusers only: an id
                        // is what another user would need to take a client's place.
                        let hide = auth.user().is_some_and(|u| !u.superuser);
                        let served = HIDE_HOLDERS
                            .scope(hide, Core::request(dispatch(&core, id, req, &mut mark)));
                        // The leases it gives a client are logged as that user's.
                        match auth.user() {
                            Some(u) => REQUEST_USER.scope(u.name.clone(), served).await,
                            None => served.await,
                        }
                    }
                    Ok(None) => reply(id, Ok(())),
                    Err(e) => reply::<()>(id, Err(e)),
                },
            },
        };
        if let Err(e) = writer.write_frame(&reply).await {
            tracing::debug!(%peer, error = %e, "cannot send a reply; closing");
            break;
        }
        if refused {
            break;
        }
    }
}

/// Whether the connection may send `req`, and as whom (see `auth.rs`): a client
/// request is made to act as the connection's user, and its client id is bound to
/// that user.
fn authorize(core: &Core, auth: &mut ConnAuth, req: &mut MasterRequest) -> Result<()> {
    auth.admits(req)?;
    // The user table changed since this connection proved its user: it must still be
    // the same user (not removed, same key and ids), or it is nobody.
    let epoch = core.users_epoch();
    if auth.user().is_some() && auth.epoch() != epoch {
        auth.revalidate(epoch, |name| core.user_key(name))?;
    }
    if let Some(user) = auth.user() {
        auth.act_as(req, |uid| core.state().user_by_uid(uid))?;
        if let Some(client) = req.client_id() {
            core.clients.bind(client, &user.name, core.clock.now_ms())?;
        }
    }
    Ok(())
}

tokio::task_local! {
    /// Set while serving a request of a user who is not a superuser: lease conflicts
    /// do not name the holder.
    static HIDE_HOLDERS: bool;
}

pub(super) fn reply<T: Encode>(id: u64, result: Result<T>) -> Frame {
    let result = result.map_err(|e| {
        match e.code() {
            stampfs_proto::ErrorCode::Internal | stampfs_proto::ErrorCode::Io => {
                tracing::error!(error = %e, "request failed")
            }
            _ => tracing::debug!(error = %e, "request refused"),
        }
        let mut r = e.to_remote();
        if let RemoteError::LeaseConflict { holder, .. } = &mut r {
            if HIDE_HOLDERS.try_with(|h| *h).unwrap_or(false) {
                *holder = stampfs_proto::ClientId::MASTER;
            }
        }
        r
    });
    reply_frame(id, &result, Bytes::new())
        .or_else(|e| {
            let err: std::result::Result<(), RemoteError> = Err(RemoteError::Internal {
                reason: format!("cannot encode the reply: {e}"),
            });
            reply_frame(id, &err, Bytes::new())
        })
        .unwrap_or_default()
}

/// Serves one request; `mark`: the connection's report mark and the chunkserver it is
/// for, set by a heartbeat or a registration and used by the chunk report that
/// follows it.
pub(super) async fn dispatch(
    core: &Arc<Core>,
    id: u64,
    req: MasterRequest,
    mark: &mut Option<(stampfs_proto::ChunkserverId, u64)>,
) -> Frame {
    let Some(metrics) = core.metrics.get() else {
        return dispatch_one(core, id, req, mark).await;
    };
    let op = req.name();
    let started = std::time::Instant::now();
    let frame = dispatch_one(core, id, req, mark).await;
    metrics.observe(op, started.elapsed());
    frame
}

async fn dispatch_one(
    core: &Arc<Core>,
    id: u64,
    req: MasterRequest,
    mark: &mut Option<(stampfs_proto::ChunkserverId, u64)>,
) -> Frame {
    // A halted master (its state ahead of its log) refuses everything, reads included.
    if let Err(e) = core.check_running() {
        return reply::<()>(id, Err(e));
    }
    // A member of a group that does not lead serves nothing but the group's own calls.
    if let Err(e) = core.log.serving() {
        return reply::<()>(id, Err(e));
    }
    match req {
        MasterRequest::Once(o) => serve_once(core, id, o, mark).await,
        MasterRequest::Mkdir(r) => reply(id, core.mkdir(r).await),
        MasterRequest::Create(r) => reply(id, core.create(r).await),
        MasterRequest::Append(r) => reply(id, core.append(r).await),
        MasterRequest::AddChunk(r) => reply(id, core.add_chunk(r).await),
        MasterRequest::UpdatePipeline(r) => reply(id, core.update_pipeline(r).await),
        MasterRequest::Close(r) => reply(id, core.close(r).await),
        MasterRequest::RenewLease(r) => reply(id, core.renew_lease(r).await),
        MasterRequest::GetLocations(r) => reply(id, core.get_locations(r).await),
        MasterRequest::List(r) => reply(id, core.list(r).await),
        MasterRequest::Stat(r) => reply(id, core.stat(r).await),
        MasterRequest::Rename(r) => reply(id, core.rename(r).await),
        MasterRequest::Delete(r) => reply(id, core.delete(r).await),
        MasterRequest::RecoverLease(r) => reply(id, core.recover_lease(r).await),
        MasterRequest::ReportCorrupt(r) => reply(id, core.report_corrupt(r).await),
        MasterRequest::Register(r) => match core.register_marked(r).await {
            Ok((done, m)) => {
                *mark = Some((done.id, m));
                reply(id, Ok(done))
            }
            Err(e) => reply::<()>(id, Err(e)),
        },
        MasterRequest::Heartbeat(r) => {
            let from = r.id;
            match core.heartbeat_marked(r).await {
                Ok((done, m)) => {
                    *mark = Some((from, m));
                    reply(id, Ok(done))
                }
                Err(e) => reply::<()>(id, Err(e)),
            }
        }
        MasterRequest::ChunkReport(r) => {
            let m = mark.filter(|(from, _)| *from == r.id).map_or(0, |(_, m)| m);
            reply(id, core.chunk_report(r, m).await)
        }
        MasterRequest::Fsck(r) => reply(id, core.fsck(r).await),
        MasterRequest::ClusterReport(r) => reply(id, core.cluster_report(r).await),
        // Kept by the connection (`ReportParts`), never dispatched.
        MasterRequest::ReportPart(_) => reply(id, Ok(())),
        MasterRequest::AddUser(r) => reply(id, core.add_user(r).await),
        MasterRequest::ListUsers(r) => reply(id, core.list_users(r).await),
        MasterRequest::RemoveUser(r) => reply(id, core.remove_user(r).await),
        // The connection's handshake (`ConnAuth`), never dispatched.
        MasterRequest::ServerHello(_)
        | MasterRequest::Raft(_)
        | MasterRequest::ServerProve(_)
        | MasterRequest::ClientHello(_)
        | MasterRequest::ClientProve(_) => reply::<()>(
            id,
            Err(Error::BadRequest {
                reason: "a handshake message outside the connection handler".into(),
            }),
        ),
        MasterRequest::MakeFile(r) => reply(id, core.make_file(r).await),
        MasterRequest::CutLastChunk(r) => reply(id, core.cut_last_chunk(r).await),
        MasterRequest::OpenChunk(r) => reply(id, core.open_chunk(r).await),
        MasterRequest::DropChunks(r) => reply(id, core.drop_chunks(r).await),
        MasterRequest::Symlink(r) => reply(id, core.symlink(r).await),
        MasterRequest::ReadLink(r) => reply(id, core.read_link(r).await),
        MasterRequest::SetAttr(r) => reply(id, core.set_attr(r).await),
        MasterRequest::GetXattr(r) => reply(id, core.get_xattr(r).await),
        MasterRequest::ListXattr(r) => reply(id, core.list_xattr(r).await),
        MasterRequest::SetXattr(r) => reply(id, core.set_xattr(r).await),
        MasterRequest::AddMaster(r) => reply(id, core.add_master(r).await),
        MasterRequest::RemoveMaster(r) => reply(id, core.remove_master(r).await),
        MasterRequest::TransferLeader(r) => reply(id, core.transfer_leader(r).await),
        MasterRequest::SetReplication(r) => reply(id, core.set_replication(r).await),
        MasterRequest::Decommission(r) => reply(id, core.decommission(r).await),
        MasterRequest::SafeMode(r) => reply(id, core.safe_mode(r).await),
        MasterRequest::DeleteNow(r) => reply(id, core.delete_now(r).await),
        MasterRequest::RestoreTrash(r) => reply(id, core.restore_trash(r).await),
        MasterRequest::Balance(r) => reply(id, core.balance(r).await),
        MasterRequest::SetQuota(r) => reply(id, core.set_quota(r).await),
        MasterRequest::GetQuota(r) => reply(id, core.get_quota(r).await),
        MasterRequest::ListQuotas(r) => reply(id, core.list_quotas(r).await),
    }
}
