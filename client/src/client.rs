//! [`Client`]: the handle applications hold. Namespace calls go to the master over a
//! small pool of connections; writers and readers are created from it.
//!
//! Reads and replica queries go to chunkservers over a second pool, per address.
//! Chunkservers close a connection that stays silent for their `--idle-timeout`
//! (60 s by default), so a pooled connection is reused only while it has been idle
//! less than [`ClientConfig::pooled_connection_max_idle`]; one that turns out closed
//! anyway (a transport failure before any reply) is replaced once by a fresh
//! connection, as the master's command sender does. Only requests that change
//! nothing go through this pool ([`PooledChunkRequest`]), so sending one twice is
//! harmless.

use crate::error::{Error, Result};
use stampfs_proto::auth::{authenticate_client, AuthFailure};
use stampfs_proto::rpc::Rpc;
use stampfs_proto::{
    Caller, ChunkRequest, ClientId, ClusterReport, ClusterReportRequest, Credentials, Delete,
    FileLocations, FileStatus, GetLocations, GetXattr, List, ListXattr, MasterRequest, Mkdir,
    NewAttr, Read, ReadLink, RecoverLease, RecoveryOutcome, RemoteError, Rename, RenewLease,
    ReplicaInfo, RpcClient, SetAttr, SetXattr, Stat, Symlink, UserInfo, XattrSet,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod files;

/// Idle connections kept per chunkserver.
const MAX_IDLE_PER_CHUNKSERVER: usize = 4;
/// Bytes asked for per request by [`Client::read_replica`].
const REPLICA_READ_PIECE: u64 = 1 << 20;

/// Tunables of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Payload bytes per pipeline packet.
    pub packet_size: usize,
    /// Bytes in flight (sent, not yet acknowledged) per writer.
    pub window: usize,
    /// How often held write leases are renewed at most; the client renews at a quarter
    /// of the master's soft limit when that is shorter (the renewal reply carries it).
    pub lease_renew_interval: Duration,
    /// Connect timeout for every connection.
    pub connect_timeout: Duration,
    /// Timeout for one request to the master or a chunkserver.
    pub request_timeout: Duration,
    /// How long `append` waits for a lease recovery in progress before giving up.
    pub recovery_wait: Duration,
    /// How long a sent packet may wait for its ack before the pipeline's head counts
    /// as failed and the pipeline is recovered without it. Keep it above the
    /// chunkservers' `--ack-timeout` (10 s), so a frozen replica further down is named
    /// by its upstream first.
    pub ack_timeout: Duration,
    /// A writer closes its pipeline stream itself once nothing was sent or
    /// acknowledged on it for this long with nothing in flight; its next write opens a
    /// new stream with the same token at the acknowledged offset (no master call, no
    /// replica lost). Keep it well below the chunkservers' `--idle-timeout` (60 s by
    /// default): past that they end the stream from their side. The writer copes with
    /// that too (a stream the head closed while nothing was in flight is reopened the
    /// same way, not blamed on the head), but closing first keeps a new write from
    /// racing the head's close. `None`: never close an idle stream from this side.
    pub stream_idle_close: Option<Duration>,
    /// A pooled chunkserver connection idle for longer than this is closed instead of
    /// reused. Keep it below the chunkservers' `--idle-timeout` (60 s by default),
    /// after which they close idle connections themselves; a pooled connection found
    /// closed anyway is replaced once by a fresh one.
    pub pooled_connection_max_idle: Duration,
    /// The user this client authenticates as on every master connection. `None`: the
    /// file [`Credentials::discover`] finds (`STAMPFS_CREDENTIALS`, then
    /// `~/.config/stampfs/credentials`); connecting fails when there is none.
    pub credentials: Option<Credentials>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            packet_size: stampfs_proto::DEFAULT_PACKET_SIZE,
            window: 8 << 20,
            lease_renew_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            recovery_wait: Duration::from_secs(60),
            ack_timeout: Duration::from_secs(15),
            stream_idle_close: Some(Duration::from_secs(20)),
            pooled_connection_max_idle: Duration::from_secs(20),
            credentials: None,
        }
    }
}

/// Per-file options for [`Client::create`].
#[derive(Clone, Debug, Default)]
pub struct CreateOptions {
    /// Replicas per chunk (master default when `None`).
    pub replication: Option<u8>,
    /// Chunk size in bytes (master default when `None`).
    pub chunk_size: Option<u64>,
    /// Replace an existing file.
    pub overwrite: bool,
    /// Mode and owner of the new file; `None`: this process's effective uid and gid
    /// and `0o666` less its umask (see [`process_attr`]).
    pub attr: Option<NewAttr>,
}

/// Mode and owner of an entry this process creates: its effective uid and gid, and
/// `base` (`0o666` for a file, `0o777` for a directory) less its umask, as `open` and
/// `mkdir` would give on a local filesystem.
pub fn process_attr(base: u32) -> NewAttr {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let umask = *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(0o022)
    });
    // SAFETY: geteuid and getegid take no arguments and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    NewAttr {
        mode: base & !umask & stampfs_proto::MODE_BITS,
        uid,
        gid,
    }
}

pub(crate) struct Inner {
    pub(crate) master: String,
    pub(crate) id: ClientId,
    pub(crate) config: ClientConfig,
    /// Who this client proves to be on each master connection, and who the master
    /// said that is.
    creds: Credentials,
    identity: UserInfo,
    /// Idle master connections; a call takes one out and puts it back on success.
    master_pool: Mutex<Vec<RpcClient>>,
    /// Idle chunkserver connections by address, reused by reads and replica queries;
    /// held only to take or put one, never across an `.await`.
    chunk_pool: Mutex<IdlePool<RpcClient>>,
    /// Paths this client holds write leases on, with how many writers use each; the
    /// renewal task runs while this is non-empty.
    leases: Mutex<HashMap<String, usize>>,
    /// The lease renewal task, started with the first writer; aborted on drop.
    renewer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut r) = self.renewer.lock() {
            if let Some(task) = r.take() {
                task.abort();
            }
        }
    }
}

/// A connection to a stampfs cluster. Cheap to clone; clones share connections and
/// the client id (and so the write leases).
///
/// ```no_run
/// # async fn example() -> stampfs_client::Result<()> {
/// use stampfs_client::{Client, CreateOptions};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let client = Client::connect("127.0.0.1:7070").await?;
/// client.mkdir("/logs", true).await?;
/// let mut w = client.create("/logs/app.log", CreateOptions::default()).await?;
/// w.write_all(b"hello\n").await?;
/// w.hflush().await?; // on every replica of the pipeline
/// w.close().await?;
///
/// let mut r = client.open("/logs/app.log").await?;
/// let mut text = String::new();
/// r.read_to_string(&mut text).await?;
/// assert_eq!(text, "hello\n");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
    /// Who this handle's namespace requests say they come from (see
    /// [`Client::as_caller`]); `None`: root, for the cluster's own tools.
    caller: Option<Arc<Caller>>,
}

tokio::task_local! {
    /// The identity of the FUSE request a mount task serves: it overrides the
    /// client's own for every namespace request that task sends.
    pub(crate) static REQUEST_CALLER: Caller;
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("master", &self.inner.master)
            .field("id", &self.inner.id)
            .finish()
    }
}

impl Client {
    /// Connects to the master at `addr` with default settings.
    pub async fn connect(addr: &str) -> Result<Self> {
        Self::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects to the master at `addr`; fails when the master can not be reached.
    pub async fn connect_with(addr: &str, config: ClientConfig) -> Result<Self> {
        if config.packet_size == 0 || config.packet_size > stampfs_proto::MAX_DATA_LEN {
            return Err(Error::InvalidArgument {
                reason: format!(
                    "packet size must be between 1 and {} bytes",
                    stampfs_proto::MAX_DATA_LEN
                ),
            });
        }
        if config.window < config.packet_size {
            return Err(Error::InvalidArgument {
                reason: "the window must hold at least one packet".into(),
            });
        }
        if config.stream_idle_close.is_some_and(|d| d.is_zero()) {
            return Err(Error::InvalidArgument {
                reason: "the stream idle close must be above zero (or off)".into(),
            });
        }
        let creds = match &config.credentials {
            Some(c) => c.clone(),
            None => match Credentials::discover(None)? {
                Some((c, _)) => c,
                None => {
                    return Err(Error::Remote(RemoteError::Unauthenticated {
                        reason: format!(
                            "no credentials to present to the master: pass --credentials FILE or set {} (a master writes its superuser's to DIR/{})",
                            stampfs_proto::credentials::CREDENTIALS_ENV,
                            stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE
                        ),
                    }))
                }
            },
        };
        let (conn, identity) = dial_master(addr, config.connect_timeout, &creds).await?;
        let client = Client {
            inner: Arc::new(Inner {
                master: addr.to_string(),
                id: ClientId::random(),
                config,
                creds,
                identity,
                master_pool: Mutex::new(vec![conn]),
                chunk_pool: Mutex::new(IdlePool::new(MAX_IDLE_PER_CHUNKSERVER)),
                leases: Mutex::new(HashMap::new()),
                renewer: Mutex::new(None),
            }),
            // The master takes requests without a caller as the authenticated user.
            caller: None,
        };
        Ok(client)
    }

    /// The same client (connections, leases, id) sending its namespace requests as
    /// `caller`: the master checks permissions for that identity. Only a superuser's
    /// client may name a caller other than its own user (the master refuses it
    /// otherwise).
    pub fn as_caller(&self, caller: Caller) -> Client {
        Client {
            inner: self.inner.clone(),
            caller: Some(Arc::new(caller)),
        }
    }

    /// This handle's own caller, whatever task it runs in.
    pub(crate) fn own_caller(&self) -> Option<Caller> {
        self.caller.as_deref().cloned()
    }

    /// Who the next namespace request is sent as: the FUSE request a mount task
    /// serves, else this handle's caller.
    pub(crate) fn caller(&self) -> Option<Caller> {
        REQUEST_CALLER
            .try_with(Caller::clone)
            .ok()
            .or_else(|| self.caller.as_deref().cloned())
    }

    /// A client that has no master connection (pure unit tests of option handling).
    #[cfg(test)]
    pub(crate) fn unconnected_for_tests() -> Self {
        Client {
            inner: Arc::new(Inner {
                master: "127.0.0.1:1".into(),
                id: ClientId::random(),
                config: ClientConfig::default(),
                creds: Credentials::new("test", [0; 32]).expect("a good name"),
                identity: UserInfo {
                    name: "test".into(),
                    uid: 0,
                    gid: 0,
                    groups: Vec::new(),
                    superuser: true,
                },
                master_pool: Mutex::new(Vec::new()),
                chunk_pool: Mutex::new(IdlePool::new(MAX_IDLE_PER_CHUNKSERVER)),
                leases: Mutex::new(HashMap::new()),
                renewer: Mutex::new(None),
            }),
            caller: None,
        }
    }

    /// Who the master says this client is (its authenticated user).
    pub fn identity(&self) -> &UserInfo {
        &self.inner.identity
    }

    /// Mode and owner of an entry this client creates: the caller's ids (the FUSE
    /// request a mount task serves, else the authenticated user) and `base` less this
    /// process's umask.
    pub(crate) fn new_attr(&self, base: u32) -> NewAttr {
        let mode = process_attr(base).mode;
        match self.caller() {
            Some(c) => NewAttr {
                mode,
                uid: c.uid,
                gid: c.gid,
            },
            None => NewAttr {
                mode,
                uid: self.inner.identity.uid,
                gid: self.inner.identity.gid,
            },
        }
    }

    /// This client's id (the holder name on its write leases).
    pub fn id(&self) -> ClientId {
        self.inner.id
    }

    /// The master's address.
    pub fn master(&self) -> &str {
        &self.inner.master
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Sends one request to the master.
    pub(crate) async fn call<R>(&self, req: R) -> Result<R::Response>
    where
        R: Rpc<Request = MasterRequest>,
    {
        let pooled = self.inner.master_pool.lock().ok().and_then(|mut p| {
            // Connections the master closed while they were idle (it restarted) go.
            while let Some(c) = p.pop() {
                if !c.unusable_while_idle() {
                    return Some(c);
                }
            }
            None
        });
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                dial_master(
                    &self.inner.master,
                    self.inner.config.connect_timeout,
                    &self.inner.creds,
                )
                .await?
                .0
            }
        };
        let reply =
            stampfs_proto::pause::timeout(self.inner.config.request_timeout, conn.call(req))
                .await
                .map_err(|_| {
                    Error::Remote(RemoteError::Unavailable {
                        reason: format!("master {} did not answer in time", self.inner.master),
                    })
                })?;
        match reply {
            Ok(resp) => {
                self.put_master(conn);
                Ok(resp)
            }
            // A typed error leaves the connection in a good state.
            Err(stampfs_proto::Error::Remote(r)) => {
                self.put_master(conn);
                Err(Error::Remote(r))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn put_master(&self, conn: RpcClient) {
        if let Ok(mut p) = self.inner.master_pool.lock() {
            if p.len() < 8 {
                p.push(conn);
            }
        }
    }

    /// Sends one request to a chunkserver and returns its reply and the reply's data,
    /// reusing a pooled connection when one has not been idle too long. A transport
    /// failure on a pooled connection (it may have been closed for idleness while it
    /// waited) is retried once on a fresh connection; see [`retry_on_fresh`].
    #[tracing::instrument(level = "debug", skip_all, fields(chunkserver = %addr))]
    pub(crate) async fn call_chunkserver<R>(
        &self,
        addr: &str,
        req: R,
    ) -> Result<(R::Response, bytes::Bytes)>
    where
        R: PooledChunkRequest,
    {
        let config = &self.inner.config;
        let mut pooled_allowed = true;
        loop {
            let pooled = if pooled_allowed {
                self.take_chunk(addr)
            } else {
                None
            };
            let reused = pooled.is_some();
            let (mut conn, idle_since) = match pooled {
                Some((c, since)) => (c, Some(since)),
                None => (
                    RpcClient::connect(addr, config.connect_timeout).await?,
                    None,
                ),
            };
            let reply = stampfs_proto::pause::timeout(
                config.request_timeout,
                conn.call_with_data(req.clone(), bytes::Bytes::new()),
            )
            .await
            .map_err(|_| {
                Error::Remote(RemoteError::Unavailable {
                    reason: format!("chunkserver {addr} did not answer in time"),
                })
            })?;
            match reply {
                Ok(r) => {
                    self.put_chunk(addr, conn);
                    return Ok(r);
                }
                // A typed error leaves the connection in a good state.
                Err(stampfs_proto::Error::Remote(r)) => {
                    self.put_chunk(addr, conn);
                    return Err(Error::Remote(r));
                }
                Err(e) if retry_on_fresh(reused, &e) => {
                    tracing::debug!(error = %e, "pooled chunkserver connection was closed; retrying on a new one");
                    // Connections that waited at least as long are likely closed too.
                    if let (Some(since), Ok(mut pool)) = (idle_since, self.inner.chunk_pool.lock())
                    {
                        pool.forget_idle_since(addr, since);
                    }
                    pooled_allowed = false;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A pooled connection to `addr` that has not been idle too long, with the instant
    /// it went idle.
    fn take_chunk(&self, addr: &str) -> Option<(RpcClient, Instant)> {
        let max_idle = self.inner.config.pooled_connection_max_idle;
        let mut pool = self.inner.chunk_pool.lock().ok()?;
        pool.take(addr, Instant::now(), max_idle)
    }

    fn put_chunk(&self, addr: &str, conn: RpcClient) {
        if let Ok(mut pool) = self.inner.chunk_pool.lock() {
            pool.put(addr, conn, Instant::now());
        }
    }

    /// Creates a directory (`parents`: also its missing ancestors, and no error when it
    /// exists).
    /// The directories get this process's owner and `0o777` less its umask.
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<FileStatus> {
        self.mkdir_with(path, parents, self.new_attr(0o777)).await
    }

    /// [`Client::mkdir`] with the given mode and owner for every directory it
    /// creates.
    pub async fn mkdir_with(&self, path: &str, parents: bool, attr: NewAttr) -> Result<FileStatus> {
        self.call(Mkdir {
            path: normalized(path)?,
            parents,
            attr: Some(attr),
            caller: self.caller(),
        })
        .await
    }

    /// Creates a symbolic link at `path` holding `target` (never resolved by stampfs:
    /// a mount's kernel follows it), owned by this process's uid and gid.
    pub async fn symlink(&self, path: &str, target: &str) -> Result<FileStatus> {
        self.symlink_with(path, target, self.new_attr(0o777)).await
    }

    /// [`Client::symlink`] owned by `attr`'s uid and gid (a link's mode is always
    /// `0o777`).
    pub async fn symlink_with(
        &self,
        path: &str,
        target: &str,
        attr: NewAttr,
    ) -> Result<FileStatus> {
        self.call(Symlink {
            path: normalized(path)?,
            target: target.to_string(),
            attr: Some(attr),
            caller: self.caller(),
        })
        .await
    }

    /// `chmod`, `chown`, `utimensat` of the entry at `req.path` (a symbolic link's
    /// own attributes; its mode cannot change); answers the new status. Sent as
    /// `req.caller`, or as this client's caller when that is `None`.
    pub async fn set_attr(&self, mut req: SetAttr) -> Result<FileStatus> {
        req.path = normalized(&req.path)?;
        if req.caller.is_none() {
            req.caller = self.caller();
        }
        self.call(req).await
    }

    /// The value of the extended attribute `name` (`user.*`) of `path`; `None`
    /// without one.
    pub async fn get_xattr(&self, path: &str, name: &str) -> Result<Option<Vec<u8>>> {
        self.call(GetXattr {
            path: normalized(path)?,
            name: name.to_string(),
            caller: self.caller(),
        })
        .await
    }

    /// The names of the extended attributes of `path`, sorted.
    pub async fn list_xattr(&self, path: &str) -> Result<Vec<String>> {
        self.call(ListXattr {
            path: normalized(path)?,
            caller: self.caller(),
        })
        .await
    }

    /// Sets (`Some`) or removes (`None`) the extended attribute `name` of `path`, as
    /// `how` says; whether it existed before (`false` for a removal or a
    /// [`XattrSet::Replace`]: nothing was done).
    pub async fn set_xattr(
        &self,
        path: &str,
        name: &str,
        value: Option<Vec<u8>>,
        how: XattrSet,
    ) -> Result<bool> {
        self.call(SetXattr {
            path: normalized(path)?,
            name: name.to_string(),
            value,
            how,
            caller: self.caller(),
        })
        .await
    }

    /// The target of the symbolic link at `path`.
    pub async fn read_link(&self, path: &str) -> Result<String> {
        self.call(ReadLink {
            path: normalized(path)?,
            caller: self.caller(),
        })
        .await
    }

    /// Lists a directory (or returns the one entry of a file).
    pub async fn list(&self, path: &str) -> Result<Vec<FileStatus>> {
        self.call(List {
            path: normalized(path)?,
            caller: self.caller(),
        })
        .await
    }

    /// Status of one path.
    pub async fn stat(&self, path: &str) -> Result<FileStatus> {
        self.call(Stat {
            path: normalized(path)?,
            caller: self.caller(),
        })
        .await
    }

    /// A file's chunks with their replicas at the current version (not a read: the
    /// access time stays).
    pub async fn locations(&self, path: &str) -> Result<FileLocations> {
        self.locations_for(path, false).await
    }

    /// [`Client::locations`]; `access`: for a reader opening the file, so that its
    /// access time may move.
    pub(crate) async fn locations_for(&self, path: &str, access: bool) -> Result<FileLocations> {
        self.call(GetLocations {
            path: normalized(path)?,
            client: self.inner.id,
            access,
            caller: self.caller(),
        })
        .await
    }

    /// Renames a file or directory; the destination must not exist.
    pub async fn rename(&self, src: &str, dst: &str) -> Result<()> {
        self.rename_with(src, dst, false).await
    }

    /// Renames as rename(2) does: an existing `dst` is replaced in the same step at
    /// the master (a file or link by a file or link, an empty directory by a
    /// directory), so no crash leaves `dst` missing.
    pub async fn rename_replacing(&self, src: &str, dst: &str) -> Result<()> {
        self.rename_with(src, dst, true).await
    }

    async fn rename_with(&self, src: &str, dst: &str, replace: bool) -> Result<()> {
        self.call(Rename {
            src: normalized(src)?,
            dst: normalized(dst)?,
            replace,
            caller: self.caller(),
        })
        .await
    }

    /// Deletes a file, or a directory (`recursive` for a non-empty one).
    pub async fn delete(&self, path: &str, recursive: bool) -> Result<()> {
        self.call(Delete {
            path: normalized(path)?,
            recursive,
            caller: self.caller(),
        })
        .await
    }

    /// Asks the master to recover the write lease on `path` (its writer died or hung):
    /// the last chunk's version is bumped, replicas agree on a length, and the file is
    /// closed. A file whose replicas are unreachable stays in recovery (answered
    /// `closed: false`) until they are back; see [`Client::recover_lease_accepting_loss`].
    pub async fn recover_lease(&self, path: &str) -> Result<RecoveryOutcome> {
        self.recover(path, false).await
    }

    /// Like [`Client::recover_lease`], but when no replica of the last chunk is
    /// reachable the operator declares them lost: the file is closed at the master's
    /// committed length and the chunk reported missing. Bytes the writer had
    /// acknowledged past that length are lost.
    pub async fn recover_lease_accepting_loss(&self, path: &str) -> Result<RecoveryOutcome> {
        self.recover(path, true).await
    }

    async fn recover(&self, path: &str, accept_loss: bool) -> Result<RecoveryOutcome> {
        self.call(RecoverLease {
            path: normalized(path)?,
            client: self.inner.id,
            accept_loss,
            caller: self.caller(),
        })
        .await
    }

    /// The master's view of the cluster (what `stampfs admin report` shows): every
    /// chunkserver with its state and the capacity and used bytes it last reported,
    /// and chunk totals by health. The master walks the whole namespace to answer, so
    /// callers that ask often should cache the answer.
    pub async fn cluster_report(&self) -> Result<ClusterReport> {
        self.call(ClusterReportRequest {}).await
    }

    /// Registers a held lease and makes sure the renewal task runs.
    pub(crate) fn hold_lease(&self, path: &str) {
        if let Ok(mut l) = self.inner.leases.lock() {
            *l.entry(path.to_string()).or_default() += 1;
        }
        let Ok(mut renewer) = self.inner.renewer.lock() else {
            return;
        };
        if renewer.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let configured = self.inner.config.lease_renew_interval;
        *renewer = Some(tokio::spawn(async move {
            // The first tick is immediate: the reply tells the master's soft limit, and
            // the period follows it from then on.
            let mut every = configured;
            // Said once until a renewal renews something again: a writer the mount
            // keeps open after it was fenced would otherwise have it said every tick.
            let mut said_nothing_renewed = false;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let client = Client {
                    inner,
                    caller: None,
                };
                let held = client.inner.leases.lock().map(|l| l.len()).unwrap_or(0);
                if held == 0 {
                    continue;
                }
                let id = client.inner.id;
                match client.call(RenewLease { client: id }).await {
                    Ok(terms) => {
                        if terms.renewed > 0 {
                            said_nothing_renewed = false;
                        } else if !said_nothing_renewed {
                            said_nothing_renewed = true;
                            tracing::warn!(held, "lease renewal renewed nothing: the master no longer counts this client as a writer (lease recovery took its files); their next writes will be refused");
                        }
                        let period = renew_period(configured, terms.soft_limit_ms);
                        if period != every {
                            every = period;
                            tick = tokio::time::interval_at(
                                tokio::time::Instant::now() + every,
                                every,
                            );
                            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
                }
            }
        }));
    }

    /// Drops one user of a lease (a writer closed or failed).
    pub(crate) fn release_lease(&self, path: &str) {
        if let Ok(mut l) = self.inner.leases.lock() {
            if let Some(n) = l.get_mut(path) {
                *n -= 1;
                if *n == 0 {
                    l.remove(path);
                }
            }
        }
    }
}

/// How often to renew leases under a master whose soft limit is `soft_limit_ms`: a
/// quarter of it (so three renewals in a row may be lost or late before another
/// client may take a file over), never more often than every 50 ms, and never less
/// often than `configured`.
pub(crate) fn renew_period(configured: Duration, soft_limit_ms: u64) -> Duration {
    let quarter = Duration::from_millis(soft_limit_ms / 4);
    configured.min(quarter).max(Duration::from_millis(50))
}

/// Chunkserver requests allowed through the connection pool, and so retried once on a
/// fresh connection after a transport failure: they read and change nothing, so a
/// request the chunkserver may have served before the connection failed can be sent
/// again. Today: [`Read`] and [`ReplicaInfo`]. Requests that change a replica
/// (`WriteSetup` streams, `ReceiveReplica`, master `Command`s) never implement it.
pub(crate) trait PooledChunkRequest: Rpc<Request = ChunkRequest> + Clone {}

impl PooledChunkRequest for Read {}
impl PooledChunkRequest for ReplicaInfo {}

/// A new, authenticated connection to the master at `addr`, and who the master says
/// `creds` are.
async fn dial_master(
    addr: &str,
    timeout: Duration,
    creds: &Credentials,
) -> Result<(RpcClient, UserInfo)> {
    let mut conn = RpcClient::connect(addr, timeout).await?;
    match stampfs_proto::pause::timeout(timeout, authenticate_client(&mut conn, creds)).await {
        Err(_) => Err(Error::Remote(RemoteError::Unavailable {
            reason: format!("master {addr} did not answer the handshake in time"),
        })),
        Ok(Ok(identity)) => Ok((conn, identity)),
        Ok(Err(AuthFailure::Transport(e))) => Err(e.into()),
        Ok(Err(AuthFailure::Refused { reason })) => {
            Err(Error::Remote(RemoteError::Unauthenticated {
                reason: format!("the master refused user {}: {reason}", creds.user),
            }))
        }
        Ok(Err(AuthFailure::MasterUnproven)) => Err(Error::Remote(RemoteError::Unauthenticated {
            reason: format!(
                "the master at {addr} did not prove that it knows user {}'s key: not the master these credentials are for",
                creds.user
            ),
        })),
    }
}

/// True for I/O errors that mean the peer closed the connection (EOF, reset, broken
/// pipe), as a chunkserver does to a connection or stream that stayed idle.
pub(crate) fn connection_closed(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected
    )
}

/// Whether a pooled request that failed with `e` is sent again on a fresh connection:
/// only when the connection came from the pool (it may have been closed for idleness
/// while it waited there) and the failure is the connection being closed: an EOF where
/// the reply should start (`Truncated`: `RpcClient` does not tell an EOF before the
/// reply from one inside it; both are harmless to retry for a [`PooledChunkRequest`]),
/// a reset or a broken pipe. A typed error, a malformed reply or a timeout is never
/// retried, and a fresh connection is never retried (the caller tries once).
pub(crate) fn retry_on_fresh(reused: bool, e: &stampfs_proto::Error) -> bool {
    let closed = match e {
        stampfs_proto::Error::Truncated => true,
        stampfs_proto::Error::Io(io) => connection_closed(io.kind()),
        _ => false,
    };
    reused && closed
}

/// Idle connections by address, each with the instant it went idle (its last reply:
/// a chunkserver's idle clock starts then too). The most recently used is reused
/// first; connections idle for `max_idle` or more are dropped instead of reused.
#[derive(Debug)]
pub(crate) struct IdlePool<C> {
    by_addr: HashMap<String, Vec<(C, Instant)>>,
    per_addr: usize,
}

impl<C> IdlePool<C> {
    pub(crate) fn new(per_addr: usize) -> Self {
        Self {
            by_addr: HashMap::new(),
            per_addr,
        }
    }

    /// The freshest connection to `addr` idle for less than `max_idle` at `now`;
    /// older ones are dropped.
    pub(crate) fn take(
        &mut self,
        addr: &str,
        now: Instant,
        max_idle: Duration,
    ) -> Option<(C, Instant)> {
        let list = self.by_addr.get_mut(addr)?;
        list.retain(|(_, since)| now.saturating_duration_since(*since) < max_idle);
        let got = list.pop();
        if list.is_empty() {
            self.by_addr.remove(addr);
        }
        got
    }

    /// Keeps `conn` (idle from `now`) unless `addr` already has enough.
    pub(crate) fn put(&mut self, addr: &str, conn: C, now: Instant) {
        let list = self.by_addr.entry(addr.to_string()).or_default();
        if list.len() < self.per_addr {
            list.push((conn, now));
        }
    }

    /// Drops the connections to `addr` that went idle at or before `since` (one of
    /// that age was found closed).
    pub(crate) fn forget_idle_since(&mut self, addr: &str, since: Instant) {
        if let Some(list) = self.by_addr.get_mut(addr) {
            list.retain(|(_, s)| *s > since);
            if list.is_empty() {
                self.by_addr.remove(addr);
            }
        }
    }

    #[cfg(test)]
    fn len(&self, addr: &str) -> usize {
        self.by_addr.get(addr).map_or(0, Vec::len)
    }
}

/// Validates a path on the client side so obvious mistakes fail before a round trip.
pub(crate) fn normalized(path: &str) -> Result<String> {
    stampfs_proto::path::normalize(path).map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    fn io(kind: ErrorKind) -> stampfs_proto::Error {
        stampfs_proto::Error::Io(std::io::Error::from(kind))
    }

    #[test]
    fn leases_are_renewed_at_a_quarter_of_the_soft_limit() {
        let s = Duration::from_secs(1);
        assert_eq!(renew_period(s, 1_000), Duration::from_millis(250));
        assert_eq!(
            renew_period(s, 60_000),
            s,
            "never less often than configured"
        );
        assert_eq!(renew_period(s, 100), Duration::from_millis(50), "floor");
        assert_eq!(renew_period(s, 0), Duration::from_millis(50));
    }

    #[test]
    fn a_closed_pooled_connection_is_retried_once_on_a_fresh_one() {
        for e in [
            stampfs_proto::Error::Truncated,
            io(ErrorKind::UnexpectedEof),
            io(ErrorKind::ConnectionReset),
            io(ErrorKind::ConnectionAborted),
            io(ErrorKind::BrokenPipe),
        ] {
            assert!(retry_on_fresh(true, &e), "{e}");
            // A fresh connection that fails is not retried: the chunkserver is gone.
            assert!(!retry_on_fresh(false, &e), "{e}");
        }
    }

    #[test]
    fn answers_and_other_failures_are_never_retried() {
        for e in [
            stampfs_proto::Error::Remote(RemoteError::Unavailable { reason: "x".into() }),
            stampfs_proto::Error::Malformed { reason: "x".into() },
            stampfs_proto::Error::FrameChecksum {
                expected: 1,
                actual: 2,
            },
            stampfs_proto::Error::UnexpectedReply {
                expected: 1,
                got: 2,
            },
            io(ErrorKind::TimedOut),
            io(ErrorKind::PermissionDenied),
        ] {
            assert!(!retry_on_fresh(true, &e), "{e}");
        }
    }

    #[test]
    fn pooled_connections_idle_too_long_are_not_reused() {
        let max = Duration::from_secs(20);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut pool = IdlePool::new(4);
        pool.put("a", 1u32, t0);
        pool.put("a", 2u32, t0 + s(10));
        // The freshest first.
        assert_eq!(pool.take("a", t0 + s(15), max), Some((2, t0 + s(10))));
        pool.put("a", 3u32, t0 + s(15));
        // At t0 + 20 s connection 1 has been idle for the whole bound: dropped.
        assert_eq!(pool.take("a", t0 + s(20), max), Some((3, t0 + s(15))));
        assert_eq!(pool.len("a"), 0);
        assert_eq!(pool.take("a", t0 + s(20), max), None);
        // Everything older than the bound goes at once.
        pool.put("b", 4u32, t0);
        pool.put("b", 5u32, t0 + s(1));
        assert_eq!(pool.take("b", t0 + s(60), max), None);
        assert_eq!(pool.len("b"), 0);
        // A zero bound never reuses anything.
        pool.put("c", 6u32, t0);
        assert_eq!(pool.take("c", t0, Duration::ZERO), None);
    }

    #[test]
    fn the_pool_is_bounded_per_address_and_forgets_what_is_as_old_as_a_closed_one() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut pool = IdlePool::new(2);
        for i in 0..5u32 {
            pool.put("a", i, t0 + s(i as u64));
        }
        assert_eq!(pool.len("a"), 2);
        pool.put("b", 9u32, t0);
        pool.put("a", 7u32, t0);
        assert_eq!(pool.len("a"), 2, "full: the extra one is dropped");
        // Connection 1 (idle since t0 + 1 s) was found closed: 0 and 1 go, not 2+.
        let mut pool = IdlePool::new(4);
        for i in 0..4u32 {
            pool.put("a", i, t0 + s(i as u64));
        }
        pool.put("b", 9u32, t0);
        pool.forget_idle_since("a", t0 + s(1));
        assert_eq!(pool.len("a"), 2);
        assert_eq!(pool.take("a", t0 + s(4), s(20)), Some((3, t0 + s(3))));
        assert_eq!(pool.take("a", t0 + s(4), s(20)), Some((2, t0 + s(2))));
        assert_eq!(pool.take("a", t0 + s(4), s(20)), None);
        assert_eq!(pool.len("b"), 1, "other addresses are untouched");
    }
}
