//! [`Client`]: the handle applications hold. Namespace calls go to the master over a
//! small pool of connections; writers and readers are created from it.
//!
//! Reads and replica queries go to chunkservers over a second pool, per address.
//! Chunkservers close a connection that stays silent for their `--idle-timeout`
//! (60 s by default), so a pooled connection is reused only while it has been idle
//! less than [`ClientConfig::pooled_connection_max_idle`]; one that turns out closed
//! anyway (a transport failure before any reply) is replaced once by a fresh
//! connection, as the master's command sender does. Only requests that change
//! nothing go through this pool ([`conn::PooledChunkRequest`]), so sending one twice is
//! harmless.

use crate::error::{Error, Result};
use stampfs_proto::net::Dialer;
use stampfs_proto::{
    Caller, ClientId, ClusterReport, ClusterReportRequest, Credentials, Delete, DeleteNow,
    FileLocations, FileStatus, GetLocations, GetXattr, List, ListXattr, Mkdir, NewAttr, ReadLink,
    RecoverLease, RecoveryOutcome, RemoteError, Rename, RenewLease, RestoreTrash, RpcClient,
    SetAttr, SetReplication, SetXattr, Stat, Symlink, UserInfo, XattrSet,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod conn;
mod files;
pub(crate) mod inline;

pub(crate) use conn::connection_closed;
use conn::{dial_master, IdlePool};

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
    /// How the master and chunkservers are dialed: plain TCP, or TLS checked against
    /// a certificate authority (`--tls-ca`, [`Dialer::tls`]).
    pub dialer: Dialer,
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
            dialer: Dialer::plain(),
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
    /// The `--master` given: one address, or a group's members separated by commas.
    pub(crate) master: String,
    /// Its addresses.
    pub(crate) masters: Vec<String>,
    /// The one requests go to: the leader, as far as this client knows.
    pub(crate) leader: Mutex<String>,
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
    /// The last call id given to a `Once` call (namespace changes sent to a group).
    pub(crate) calls: std::sync::atomic::AtomicU64,
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
        let masters = stampfs_proto::net::master_addrs(addr);
        if masters.is_empty() {
            return Err(Error::InvalidArgument {
                reason: format!("`{addr}` names no master address"),
            });
        }
        // The first member that answers the handshake (any member does); requests
        // then find the leader.
        let mut dialed = None;
        let mut last_err = None;
        for m in &masters {
            match dial_master(&config.dialer, m, config.connect_timeout, &creds).await {
                Ok(ok) => {
                    dialed = Some((m.clone(), ok));
                    break;
                }
                Err(e @ Error::Remote(RemoteError::Unauthenticated { .. })) => return Err(e),
                Err(e) => last_err = Some(e),
            }
        }
        let Some((first, (conn, identity))) = dialed else {
            return Err(last_err.unwrap_or_else(|| Error::InvalidArgument {
                reason: "no master to connect to".into(),
            }));
        };
        let client = Client {
            inner: Arc::new(Inner {
                master: addr.to_string(),
                masters,
                leader: Mutex::new(first),
                id: ClientId::random(),
                config,
                creds,
                identity,
                master_pool: Mutex::new(vec![conn]),
                chunk_pool: Mutex::new(IdlePool::new(MAX_IDLE_PER_CHUNKSERVER)),
                leases: Mutex::new(HashMap::new()),
                renewer: Mutex::new(None),
                calls: std::sync::atomic::AtomicU64::new(0),
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
                masters: vec!["127.0.0.1:1".into()],
                leader: Mutex::new("127.0.0.1:1".into()),
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
                calls: std::sync::atomic::AtomicU64::new(0),
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

    /// `stampfs setrep`: the replication factor of the file at `path` (and of every
    /// chunk it has) becomes `replication`; the master copies or trims replicas in
    /// the background. Answers the file's status.
    pub async fn set_replication(&self, path: &str, replication: u8) -> Result<FileStatus> {
        self.call(SetReplication {
            path: normalized(path)?,
            replication,
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

    /// Deletes a file, or a directory (`recursive` for a non-empty one): into the
    /// trash (`/.trash/<user>/Current/<path>`) when the master keeps one.
    pub async fn delete(&self, path: &str, recursive: bool) -> Result<()> {
        self.call(Delete {
            path: normalized(path)?,
            recursive,
            caller: self.caller(),
        })
        .await
    }

    /// Deletes at once, past the trash (`rm --skip-trash`).
    pub async fn delete_now(&self, path: &str, recursive: bool) -> Result<()> {
        self.call(DeleteNow {
            path: normalized(path)?,
            recursive,
            caller: self.caller(),
        })
        .await
    }

    /// Moves the trash entry at `path` (`/.trash/<user>/<bucket>/...`) back to `to`,
    /// outside the trash (`stampfs trash restore`); answers its status there.
    pub async fn restore_trash(&self, path: &str, to: &str) -> Result<FileStatus> {
        self.call(RestoreTrash {
            path: normalized(path)?,
            to: normalized(to)?,
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

    /// Starts (`on`) or ends the decommission of chunkserver `server` (superusers).
    pub async fn decommission(
        &self,
        server: stampfs_proto::ChunkserverId,
        on: bool,
    ) -> Result<stampfs_proto::DecommissionState> {
        self.call(stampfs_proto::Decommission { server, on }).await
    }

    /// Asks the balancer (superusers).
    pub async fn balance(
        &self,
        action: stampfs_proto::BalanceAction,
    ) -> Result<stampfs_proto::BalanceStatus> {
        self.call(stampfs_proto::BalanceRequest { action }).await
    }

    /// `stampfs admin quota set|clear` (superusers): changes the name and space
    /// limits of the directory at `path`; answers its quotas after the change.
    pub async fn set_quota(
        &self,
        path: &str,
        names: stampfs_proto::QuotaChange,
        bytes: stampfs_proto::QuotaChange,
    ) -> Result<stampfs_proto::QuotaReport> {
        self.call(stampfs_proto::SetQuota {
            path: normalized(path)?,
            names,
            bytes,
        })
        .await
    }

    /// The quotas of the entry at `path` and what its subtree uses of them (no
    /// limits for an entry without a quota).
    pub async fn quota(&self, path: &str) -> Result<stampfs_proto::QuotaReport> {
        self.call(stampfs_proto::GetQuota {
            path: normalized(path)?,
            caller: self.caller(),
        })
        .await
    }

    /// Every directory with a quota (superusers).
    pub async fn list_quotas(&self) -> Result<Vec<stampfs_proto::QuotaReport>> {
        self.call(stampfs_proto::ListQuotas {}).await
    }

    /// Asks about, enters or leaves safe mode (superusers).
    pub async fn safe_mode(
        &self,
        action: stampfs_proto::SafeModeAction,
    ) -> Result<stampfs_proto::SafeModeStatus> {
        self.call(stampfs_proto::SafeModeRequest { action }).await
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
                        // A writer that closed while the renewal was on its way
                        // leaves nothing to renew: not a lost lease.
                        let held = client.inner.leases.lock().map(|l| l.len()).unwrap_or(0);
                        if terms.renewed > 0 {
                            said_nothing_renewed = false;
                        } else if held > 0 && !said_nothing_renewed {
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

/// Validates a path on the client side so obvious mistakes fail before a round trip.
pub(crate) fn normalized(path: &str) -> Result<String> {
    stampfs_proto::path::normalize(path).map_err(Error::from)
}
#[cfg(test)]
mod tests {
    use super::*;

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
}
