//! [`Client`]: the handle applications hold. Namespace calls go to the master over a
//! small pool of connections; writers and readers are created from it.

use crate::error::{Error, Result};
use crate::reader::FileReader;
use crate::writer::FileWriter;
use stampfs_proto::rpc::Rpc;
use stampfs_proto::{
    Append, ClientId, Create, Delete, FileLocations, FileStatus, GetLocations, List, MasterRequest,
    Mkdir, RecoverLease, RecoveryOutcome, RemoteError, Rename, RenewLease, RpcClient, Stat,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Tunables of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Payload bytes per pipeline packet.
    pub packet_size: usize,
    /// Bytes in flight (sent, not yet acknowledged) per writer.
    pub window: usize,
    /// How often held write leases are renewed. Keep well under the master's soft limit.
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
}

pub(crate) struct Inner {
    pub(crate) master: String,
    pub(crate) id: ClientId,
    pub(crate) config: ClientConfig,
    /// Idle master connections; a call takes one out and puts it back on success.
    master_pool: Mutex<Vec<RpcClient>>,
    /// Idle chunkserver connections by address, reused by reads and replica queries.
    chunk_pool: Mutex<HashMap<String, Vec<RpcClient>>>,
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
        let conn = RpcClient::connect(addr, config.connect_timeout).await?;
        let client = Client {
            inner: Arc::new(Inner {
                master: addr.to_string(),
                id: ClientId::random(),
                config,
                master_pool: Mutex::new(vec![conn]),
                chunk_pool: Mutex::new(HashMap::new()),
                leases: Mutex::new(HashMap::new()),
                renewer: Mutex::new(None),
            }),
        };
        Ok(client)
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
        let pooled = self.inner.master_pool.lock().ok().and_then(|mut p| p.pop());
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                RpcClient::connect(&self.inner.master, self.inner.config.connect_timeout).await?
            }
        };
        let reply = tokio::time::timeout(self.inner.config.request_timeout, conn.call(req))
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

    /// Sends one request (with data) to a chunkserver, reusing pooled connections.
    pub(crate) async fn call_chunkserver<R>(
        &self,
        addr: &str,
        req: R,
    ) -> Result<(R::Response, bytes::Bytes)>
    where
        R: Rpc<Request = stampfs_proto::ChunkRequest>,
    {
        let pooled = self
            .inner
            .chunk_pool
            .lock()
            .ok()
            .and_then(|mut p| p.get_mut(addr).and_then(|v| v.pop()));
        let mut conn = match pooled {
            Some(c) => c,
            None => RpcClient::connect(addr, self.inner.config.connect_timeout).await?,
        };
        let reply = tokio::time::timeout(
            self.inner.config.request_timeout,
            conn.call_with_data(req, bytes::Bytes::new()),
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
                Ok(r)
            }
            Err(stampfs_proto::Error::Remote(r)) => {
                self.put_chunk(addr, conn);
                Err(Error::Remote(r))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn put_chunk(&self, addr: &str, conn: RpcClient) {
        if let Ok(mut p) = self.inner.chunk_pool.lock() {
            let v = p.entry(addr.to_string()).or_default();
            if v.len() < 4 {
                v.push(conn);
            }
        }
    }

    /// Creates a directory (`parents`: also its missing ancestors, and no error when it
    /// exists).
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<FileStatus> {
        self.call(Mkdir {
            path: normalized(path)?,
            parents,
        })
        .await
    }

    /// Lists a directory (or returns the one entry of a file).
    pub async fn list(&self, path: &str) -> Result<Vec<FileStatus>> {
        self.call(List {
            path: normalized(path)?,
        })
        .await
    }

    /// Status of one path.
    pub async fn stat(&self, path: &str) -> Result<FileStatus> {
        self.call(Stat {
            path: normalized(path)?,
        })
        .await
    }

    /// A file's chunks with their replicas at the current version.
    pub async fn locations(&self, path: &str) -> Result<FileLocations> {
        self.call(GetLocations {
            path: normalized(path)?,
            client: self.inner.id,
        })
        .await
    }

    /// Renames a file or directory; the destination must not exist.
    pub async fn rename(&self, src: &str, dst: &str) -> Result<()> {
        self.call(Rename {
            src: normalized(src)?,
            dst: normalized(dst)?,
        })
        .await
    }

    /// Deletes a file, or a directory (`recursive` for a non-empty one).
    pub async fn delete(&self, path: &str, recursive: bool) -> Result<()> {
        self.call(Delete {
            path: normalized(path)?,
            recursive,
        })
        .await
    }

    /// Asks the master to recover the write lease on `path` (its writer died or hung):
    /// the last chunk's version is bumped, replicas agree on a length, and the file is
    /// closed.
    pub async fn recover_lease(&self, path: &str) -> Result<RecoveryOutcome> {
        self.call(RecoverLease {
            path: normalized(path)?,
            client: self.inner.id,
        })
        .await
    }

    /// Creates a file and returns its writer (the client now holds its write lease).
    pub async fn create(&self, path: &str, opts: CreateOptions) -> Result<FileWriter> {
        let path = normalized(path)?;
        let status = self
            .call(Create {
                path: path.clone(),
                client: self.inner.id,
                replication: opts.replication,
                chunk_size: opts.chunk_size,
                overwrite: opts.overwrite,
            })
            .await?;
        self.hold_lease(&path);
        Ok(FileWriter::start(self.clone(), status, None))
    }

    /// Reopens a closed file for writing at its end. When the master is recovering the
    /// lease of a previous writer, waits (up to the configured bound) and retries.
    pub async fn append(&self, path: &str) -> Result<FileWriter> {
        let path = normalized(path)?;
        let deadline = tokio::time::Instant::now() + self.inner.config.recovery_wait;
        let mut warned = false;
        loop {
            let res = self
                .call(Append {
                    path: path.clone(),
                    client: self.inner.id,
                })
                .await;
            match res {
                Ok(reply) => {
                    self.hold_lease(&path);
                    return Ok(FileWriter::start(
                        self.clone(),
                        reply.status,
                        reply.last_chunk,
                    ));
                }
                Err(Error::Remote(RemoteError::RecoveryInProgress { .. }))
                    if tokio::time::Instant::now() < deadline =>
                {
                    if !warned {
                        tracing::info!(%path, "waiting for lease recovery of the previous writer");
                        warned = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens a file for reading.
    pub async fn open(&self, path: &str) -> Result<FileReader> {
        FileReader::open(self.clone(), normalized(path)?).await
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
        let every = self.inner.config.lease_renew_interval;
        *renewer = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let client = Client { inner };
                let held = client
                    .inner
                    .leases
                    .lock()
                    .map(|l| !l.is_empty())
                    .unwrap_or(false);
                if !held {
                    continue;
                }
                let id = client.inner.id;
                if let Err(e) = client.call(RenewLease { client: id }).await {
                    tracing::warn!(error = %e, "lease renewal failed");
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

/// Validates a path on the client side so obvious mistakes fail before a round trip.
pub(crate) fn normalized(path: &str) -> Result<String> {
    stampfs_proto::path::normalize(path).map_err(Error::from)
}
