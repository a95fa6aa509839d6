//! Simulated chunkservers: many in one process, each with its own loopback listener,
//! registering, heartbeating and reporting like a real one, and answering the
//! master's signed commands with the real protocol, without storing any data.
//!
//! The master reaches chunkservers only by address (its command sender keeps
//! connections per address), so each simulated chunkserver listens on a port of its
//! own and is told apart by it. What they "hold" lives in one arena indexed by chunk
//! handle (the master mints handles from a counter, so they are dense), allocated and
//! written through before the memory baseline is taken: the replicas the simulation
//! records while the master builds its chunk table do not count as master memory.
//!
//! One more, the *dense* chunkserver, holds nothing while the chunks are built (it
//! reports itself full, so placement passes it by) and then takes a copy of up to
//! `--report-replicas` existing chunks at their version and length ([`Sims::adopt`]),
//! as a chunkserver that re-replication filled would: its full report is the big one.
//!
//! Commands are decoded but their MAC is not checked (a real chunkserver checks it):
//! the simulation leaves the CPU to the master.
//!
//! | command | answer |
//! | --- | --- |
//! | `BumpVersion` | the replica at the new version, `Writing` (created when asked) |
//! | `Finalize`, `Truncate` | the replica at that length (`Finalized` for a finalize) |
//! | `Delete` | the replica gone unless above `max_version`; no report |
//! | `Info` | the replica, or `NotFound` |
//! | `Replicate` | accepted, nothing copied (no answer expected) |
//! | `VerifyReplica` | `Clean` for a held replica, `Absent` otherwise |
//!
//! Anything on the data path (write setup, reads) is refused: there is no data.

use bytes::Bytes;
use stampfs_proto::codec::{FrameReader, FrameWriter};
use stampfs_proto::rpc::{parse_request, reply_frame};
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkRequest, ChunkVersion, ChunkserverId, RemoteError,
    ReplicaReport, ReplicaState, Verification,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tokio::net::{TcpListener, TcpStream};

/// Most replicas of one chunk the simulation keeps track of: the file's (at most
/// [`MAX_REPLICATION`]) and the dense chunkserver's copy.
pub const MAX_REPLICAS: usize = 4;
/// Largest replication factor of the built files.
pub const MAX_REPLICATION: usize = MAX_REPLICAS - 1;
const NONE: u32 = u32::MAX;

/// Capacity a normal simulated chunkserver reports (1 PiB): never full in a run.
pub const CAPACITY: u64 = 1 << 50;

/// One chunk as the simulated chunkservers hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimChunk {
    pub version: u64,
    pub length: u64,
    /// Indexes of the simulated chunkservers holding a replica (`NONE`: free slot).
    pub servers: [u32; MAX_REPLICAS],
    pub finalized: bool,
}

impl SimChunk {
    const EMPTY: Self = Self {
        version: 0,
        length: 0,
        servers: [NONE; MAX_REPLICAS],
        finalized: false,
    };

    fn holds(&self, server: u32) -> bool {
        self.servers.contains(&server)
    }

    fn report(&self, handle: u64) -> ReplicaReport {
        ReplicaReport {
            handle: ChunkHandle(handle),
            version: ChunkVersion(self.version),
            length: self.length,
            state: if self.finalized {
                ReplicaState::Finalized
            } else {
                ReplicaState::Writing
            },
        }
    }
}

/// One simulated chunkserver.
pub struct SimServer {
    pub addr: SocketAddr,
    /// The id the master assigned at registration.
    pub id: OnceLock<ChunkserverId>,
}

/// Command counters.
#[derive(Default)]
pub struct Counters {
    pub bumps: AtomicU64,
    pub finalizes: AtomicU64,
    pub truncates: AtomicU64,
    pub deletes: AtomicU64,
    pub other: AtomicU64,
    /// Times the arena had to grow past what was allocated up front (each one counts
    /// as master memory by mistake, so the report says how often).
    pub arena_growths: AtomicU64,
}

/// Every simulated chunkserver, and the replicas they hold.
pub struct Sims {
    pub servers: Vec<SimServer>,
    /// Chunks by handle. Held for one command at a time, never across an await.
    chunks: Mutex<Vec<SimChunk>>,
    /// The dense chunkserver (the last one), if any.
    pub dense: Option<usize>,
    /// Replicas it holds.
    dense_held: AtomicU64,
    pub counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sims {
    /// Binds `count` listeners (plus the dense chunkserver's when `dense`) on
    /// `runtime` and allocates room for `chunks` chunk handles, every byte written so
    /// that it is resident before the master's memory is measured.
    pub async fn start(
        runtime: &tokio::runtime::Handle,
        count: usize,
        dense: bool,
        chunks: usize,
    ) -> anyhow::Result<Arc<Self>> {
        let total = count + usize::from(dense);
        let mut listeners = Vec::with_capacity(total);
        let mut servers = Vec::with_capacity(total);
        for _ in 0..total {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.set_nonblocking(true)?;
            servers.push(SimServer {
                addr: l.local_addr()?,
                id: OnceLock::new(),
            });
            listeners.push(l);
        }
        let sims = Arc::new(Self {
            servers,
            chunks: Mutex::new(vec![SimChunk::EMPTY; chunks + 1]),
            dense: dense.then_some(count),
            dense_held: AtomicU64::new(0),
            counters: Counters::default(),
        });
        for (i, l) in listeners.into_iter().enumerate() {
            let sims = sims.clone();
            let _guard = runtime.enter();
            let l = TcpListener::from_std(l)?;
            runtime.spawn(accept(l, sims, i as u32));
        }
        Ok(sims)
    }

    /// `(capacity, used)` that simulated chunkserver `i` reports: the dense one is
    /// always full.
    pub fn space(&self, i: usize) -> (u64, u64) {
        if self.dense == Some(i) {
            (CAPACITY, CAPACITY)
        } else {
            (CAPACITY, 0)
        }
    }

    /// Gives the dense chunkserver a copy of up to `n` existing chunks it does not
    /// hold (at their version and length, finalized); returns how many it holds.
    pub fn adopt(&self, n: u64) -> u64 {
        let Some(d) = self.dense else { return 0 };
        let d = d as u32;
        let mut chunks = lock(&self.chunks);
        let mut added = 0;
        for c in chunks.iter_mut() {
            if self.dense_held.load(Ordering::Relaxed) + added >= n {
                break;
            }
            if c.version == 0 || c.holds(d) {
                continue;
            }
            if let Some(slot) = c.servers.iter_mut().find(|s| **s == NONE) {
                *slot = d;
                c.finalized = true;
                added += 1;
            }
        }
        self.dense_held.fetch_add(added, Ordering::Relaxed) + added
    }

    /// Replicas the dense chunkserver holds.
    pub fn dense_held(&self) -> u64 {
        self.dense_held.load(Ordering::Relaxed)
    }

    /// Carries out one command for simulated chunkserver `server`.
    pub fn command(
        &self,
        server: u32,
        cmd: ChunkCommand,
    ) -> Result<Option<ReplicaReport>, RemoteError> {
        let c = &self.counters;
        let handle = match &cmd {
            ChunkCommand::BumpVersion { handle, .. }
            | ChunkCommand::Delete { handle, .. }
            | ChunkCommand::Replicate { handle, .. }
            | ChunkCommand::Truncate { handle, .. }
            | ChunkCommand::Finalize { handle, .. }
            | ChunkCommand::Info { handle } => handle.0,
        };
        let mut chunks = lock(&self.chunks);
        let Ok(h) = usize::try_from(handle) else {
            return Err(RemoteError::BadRequest {
                reason: format!("chunk handle {handle} is out of range"),
            });
        };
        if h >= chunks.len() {
            c.arena_growths.fetch_add(1, Ordering::Relaxed);
            let len = (h + 1).max(chunks.len() + chunks.len() / 8);
            chunks.resize(len, SimChunk::EMPTY);
        }
        let chunk = &mut chunks[h];
        let missing = || RemoteError::NotFound {
            what: format!("replica of chunk {handle}"),
        };
        match cmd {
            ChunkCommand::BumpVersion {
                version, create, ..
            } => {
                c.bumps.fetch_add(1, Ordering::Relaxed);
                if !chunk.holds(server) {
                    if !create {
                        return Err(missing());
                    }
                    let Some(slot) = chunk.servers.iter_mut().find(|s| **s == NONE) else {
                        return Err(RemoteError::NoSpace {
                            chunkserver: self.id_of(server),
                        });
                    };
                    *slot = server;
                    if self.dense == Some(server as usize) {
                        self.dense_held.fetch_add(1, Ordering::Relaxed);
                    }
                }
                chunk.version = chunk.version.max(version.0);
                chunk.finalized = false;
                Ok(Some(chunk.report(handle)))
            }
            ChunkCommand::Finalize {
                version, length, ..
            }
            | ChunkCommand::Truncate {
                version, length, ..
            } if chunk.holds(server) => {
                if matches!(cmd, ChunkCommand::Finalize { .. }) {
                    c.finalizes.fetch_add(1, Ordering::Relaxed);
                    chunk.finalized = true;
                } else {
                    c.truncates.fetch_add(1, Ordering::Relaxed);
                }
                chunk.version = chunk.version.max(version.0);
                chunk.length = length;
                Ok(Some(chunk.report(handle)))
            }
            ChunkCommand::Finalize { .. } | ChunkCommand::Truncate { .. } => Err(missing()),
            ChunkCommand::Delete { max_version, .. } => {
                c.deletes.fetch_add(1, Ordering::Relaxed);
                if chunk.holds(server) {
                    if chunk.version > max_version.0 {
                        return Ok(Some(chunk.report(handle)));
                    }
                    for s in chunk.servers.iter_mut().filter(|s| **s == server) {
                        *s = NONE;
                    }
                    if self.dense == Some(server as usize) {
                        self.dense_held.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                Ok(None)
            }
            ChunkCommand::Info { .. } => {
                c.other.fetch_add(1, Ordering::Relaxed);
                if chunk.holds(server) {
                    Ok(Some(chunk.report(handle)))
                } else {
                    Err(missing())
                }
            }
            ChunkCommand::Replicate { .. } => {
                c.other.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    fn verify(&self, server: u32, handle: ChunkHandle) -> Verification {
        self.counters.other.fetch_add(1, Ordering::Relaxed);
        let chunks = lock(&self.chunks);
        match usize::try_from(handle.0).ok().and_then(|h| chunks.get(h)) {
            Some(c) if c.holds(server) => Verification::Clean {
                replica: c.report(handle.0),
            },
            _ => Verification::Absent,
        }
    }

    fn id_of(&self, server: u32) -> ChunkserverId {
        self.servers
            .get(server as usize)
            .and_then(|s| s.id.get().copied())
            .unwrap_or(ChunkserverId(0))
    }

    /// Every simulated chunkserver's full report, in one pass over the arena.
    pub fn full_reports(&self) -> Vec<Vec<ReplicaReport>> {
        let mut out = vec![Vec::new(); self.servers.len()];
        let chunks = lock(&self.chunks);
        for (h, c) in chunks.iter().enumerate() {
            for &s in c.servers.iter().filter(|s| **s != NONE) {
                if let Some(list) = out.get_mut(s as usize) {
                    list.push(c.report(h as u64));
                }
            }
        }
        out
    }
}

async fn accept(listener: TcpListener, sims: Arc<Sims>, server: u32) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve(stream, sims.clone(), server));
            }
            Err(e) => {
                tracing::warn!(error = %e, "simulated chunkserver: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve(stream: TcpStream, sims: Arc<Sims>, server: u32) {
    let _ = stream.set_nodelay(true);
    let (r, w) = stream.into_split();
    let mut reader = FrameReader::with_capacity(1024, r);
    // Replies are a few dozen bytes; this process's heap is what the benchmark
    // measures, so the simulation's ends of the master's connections stay small.
    let mut writer = FrameWriter::with_capacity(1024, w);
    while let Ok(Some(frame)) = reader.read_frame().await {
        let Ok((id, req)) = parse_request::<ChunkRequest>(&frame) else {
            break;
        };
        let reply = match req {
            ChunkRequest::Command(cmd) => {
                reply_frame(id, &sims.command(server, cmd.body), Bytes::new())
            }
            ChunkRequest::Verify(v) => reply_frame(
                id,
                &Ok::<_, RemoteError>(sims.verify(server, v.body.handle)),
                Bytes::new(),
            ),
            _ => reply_frame(
                id,
                &Err::<(), _>(RemoteError::Unavailable {
                    reason: "a simulated chunkserver holds no data".into(),
                }),
                Bytes::new(),
            ),
        };
        let Ok(frame) = reply else { break };
        if writer.write_frame(&frame).await.is_err() {
            break;
        }
    }
}
