//! An in-process master with three real chunkservers, and a raw pipeline writer, for
//! the lease recovery tests.
#![allow(dead_code)]

#[path = "../admin/mod.rs"]
pub mod admin;

use bytes::Bytes;
use stampfs_chunkserver::header::{Header, DATA_OFFSET, SLOT_SIZE};
use stampfs_chunkserver::{ChunkserverConfig, ChunkserverHandle};
use stampfs_master::{start, MasterConfig, MasterHandle};
use stampfs_proto::net::{ConnRead, ConnWrite};
use stampfs_proto::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The writer that goes away.
pub const A: ClientId = ClientId(0xa11ce);
/// The client that takes the file over.
pub const B: ClientId = ClientId(0xb0b);
/// The operator running `stampfs recover`.
pub const OP: ClientId = ClientId(0x0b5);
pub const CHUNK: u64 = 1 << 20;

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

pub struct Cluster {
    pub master_cfg: MasterConfig,
    pub master: Option<MasterHandle>,
    /// Running chunkservers by id.
    pub servers: HashMap<ChunkserverId, ChunkserverHandle>,
    /// Data directory of each chunkserver id.
    pub dirs: HashMap<ChunkserverId, PathBuf>,
    pub key: ClusterKey,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    /// A master (configured by `tune`) and three chunkservers.
    pub async fn start(tune: impl FnOnce(&mut MasterConfig)) -> Self {
        init_tracing();
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut master_cfg = MasterConfig::new(tmp.path().join("master"));
        master_cfg.dead_after = Duration::from_millis(800);
        master_cfg.command_timeout = Duration::from_secs(2);
        // These tests keep stale replicas around on purpose: no garbage collection.
        master_cfg.health_interval = Duration::ZERO;
        tune(&mut master_cfg);
        let master = start(master_cfg.clone()).await.expect("master");
        // Restarts reuse the port the chunkservers know.
        master_cfg.listen = master.addr().to_string();
        let key = ClusterKey::load(&master_cfg.key_file()).expect("key");
        let mut cl = Self {
            master_cfg,
            master: Some(master),
            servers: HashMap::new(),
            dirs: HashMap::new(),
            key,
            _tmp: tmp,
        };
        for i in 0..3 {
            let dir = cl._tmp.path().join(format!("cs{i}"));
            let cs = cl.start_chunkserver_in(dir.clone()).await;
            let id = wait_for("chunkserver registration", || cs.id()).await;
            cl.dirs.insert(id, dir);
            cl.servers.insert(id, cs);
        }
        cl
    }

    async fn start_chunkserver_in(&self, dir: PathBuf) -> ChunkserverHandle {
        let mut cfg = ChunkserverConfig::new(
            dir,
            self.master_cfg.listen.clone(),
            self.master_cfg.key_file(),
        );
        cfg.heartbeat = Duration::from_millis(100);
        cfg.capacity = Some(1 << 30);
        stampfs_chunkserver::start(cfg).await.expect("chunkserver")
    }

    /// Stops chunkserver `id` cleanly.
    pub async fn stop_chunkserver(&mut self, id: ChunkserverId) {
        let cs = self.servers.remove(&id).expect("running");
        cs.shutdown().await.expect("chunkserver shutdown");
    }

    /// Starts chunkserver `id` again on its data directory (a new port).
    pub async fn restart_chunkserver(&mut self, id: ChunkserverId) {
        let cs = self.start_chunkserver_in(self.dirs[&id].clone()).await;
        assert_eq!(cs.id(), Some(id));
        self.servers.insert(id, cs);
    }

    pub async fn client(&self) -> RpcClient {
        let m = self.master.as_ref().expect("master running");
        admin::connect(&m.addr().to_string(), &m.core().config.dir).await
    }

    /// The newest header of `id`'s replica of `handle`, read from its file.
    pub fn header(&self, id: ChunkserverId, handle: ChunkHandle) -> Header {
        let bytes = std::fs::read(replica_path(&self.dirs[&id], handle)).expect("replica file");
        let slot = SLOT_SIZE as usize;
        Header::newest(&bytes[..slot], &bytes[slot..2 * slot]).expect("a valid header")
    }

    /// The newest header of `id`'s replica of `handle`, when there is a replica file
    /// with a valid header (replica health may be deleting or replacing it).
    pub fn try_header(&self, id: ChunkserverId, handle: ChunkHandle) -> Option<Header> {
        let bytes = std::fs::read(replica_path(&self.dirs[&id], handle)).ok()?;
        let slot = SLOT_SIZE as usize;
        if bytes.len() < 2 * slot {
            return None;
        }
        Header::newest(&bytes[..slot], &bytes[slot..2 * slot]).ok()
    }

    /// The first `len` data bytes of `id`'s replica of `handle`.
    pub fn data(&self, id: ChunkserverId, handle: ChunkHandle, len: u64) -> Vec<u8> {
        let bytes = std::fs::read(replica_path(&self.dirs[&id], handle)).expect("replica file");
        let start = DATA_OFFSET as usize;
        bytes[start..start + len as usize].to_vec()
    }

    /// Drops the master without shutdown (a crash) or shuts it down, and starts it
    /// again on the same directory and port.
    pub async fn restart_master(&mut self, crash: bool) {
        let m = self.master.take().expect("master running");
        if crash {
            drop(m);
            // Let the crashed master's tasks see the cancellation and close the listener.
            tokio::time::sleep(Duration::from_millis(50)).await;
        } else {
            m.shutdown().await.expect("shutdown");
        }
        self.master = Some(start(self.master_cfg.clone()).await.expect("restart"));
    }

    pub async fn shutdown(mut self) {
        for (_, s) in self.servers.drain() {
            s.shutdown().await.expect("chunkserver shutdown");
        }
        if let Some(m) = self.master.take() {
            m.shutdown().await.expect("master shutdown");
        }
    }
}

fn replica_path(dir: &Path, handle: ChunkHandle) -> PathBuf {
    stampfs_chunkserver::layout::replica_path(dir, handle)
}

pub async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `Stat` until `path` is closed.
pub async fn wait_closed(c: &mut RpcClient, path: &str) -> FileStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = c
            .call(Stat {
                path: path.into(),
                caller: None,
            })
            .await
            .expect("stat");
        if st.state == FileState::Closed {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {path} to close"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn remote(e: Error) -> RemoteError {
    match e {
        Error::Remote(r) => r,
        other => panic!("expected a remote error, got {other}"),
    }
}

pub fn ids(g: &WriteGrant) -> Vec<ChunkserverId> {
    g.pipeline.iter().map(|p| p.id).collect()
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Creates `path` for A and gets its first chunk's grant.
pub async fn create_with_chunk(c: &mut RpcClient, path: &str) -> WriteGrant {
    c.call(Create {
        path: path.into(),
        client: A,
        replication: None,
        chunk_size: Some(CHUNK),
        overwrite: false,
        attr: None,
        caller: None,
    })
    .await
    .expect("create");
    c.call(AddChunk {
        path: path.into(),
        client: A,
        previous: None,
    })
    .await
    .expect("add chunk")
}

/// A writer's end of a pipeline stream, driven with raw packets.
pub struct Stream {
    reader: stampfs_proto::FrameReader<ConnRead>,
    writer: stampfs_proto::FrameWriter<ConnWrite>,
    pub token: ChunkToken,
    pub seq: u64,
    /// Chunk offset of the next packet.
    pub offset: u64,
}

impl Stream {
    /// Sets up the grant's pipeline (every replica must accept).
    pub async fn open(g: &WriteGrant) -> Stream {
        let mut c = RpcClient::connect(
            &stampfs_proto::net::Dialer::plain(),
            &g.pipeline[0].addr,
            TIMEOUT,
        )
        .await
        .expect("connect to the pipeline head");
        let reply = c
            .call(WriteSetup {
                token: g.token,
                offset: g.chunk_offset,
                downstream: g.pipeline[1..].to_vec(),
            })
            .await
            .expect("write setup");
        assert!(
            reply.failed.is_empty(),
            "setup failures: {:?}",
            reply.failed
        );
        assert_eq!(reply.accepted, ids(g));
        let (reader, writer) = c.into_parts();
        Stream {
            reader,
            writer,
            token: g.token,
            seq: 0,
            offset: g.chunk_offset,
        }
    }

    /// Sets up a stream to pipeline member `i` of the grant alone (no downstream):
    /// what it is sent, the other members never see. Makes replicas diverge without
    /// any overwrite.
    pub async fn open_alone(g: &WriteGrant, i: usize) -> Stream {
        let member = &g.pipeline[i];
        let mut c = RpcClient::connect(&stampfs_proto::net::Dialer::plain(), &member.addr, TIMEOUT)
            .await
            .expect("connect to the member");
        let reply = c
            .call(WriteSetup {
                token: g.token,
                offset: g.chunk_offset,
                downstream: Vec::new(),
            })
            .await
            .expect("write setup");
        assert_eq!(reply.accepted, vec![member.id], "{reply:?}");
        let (reader, writer) = c.into_parts();
        Stream {
            reader,
            writer,
            token: g.token,
            seq: 0,
            offset: g.chunk_offset,
        }
    }

    /// Sends one packet (with hsync) and returns its ack.
    pub async fn send(&mut self, data: &[u8]) -> Ack {
        let packet = Packet {
            token: self.token,
            seq: self.seq,
            offset: self.offset,
            crc: crc32fast::hash(data),
            sync: true,
        };
        self.writer
            .write_frame(&Frame::new(&packet, Bytes::copy_from_slice(data)).expect("frame"))
            .await
            .expect("send packet");
        let frame = tokio::time::timeout(TIMEOUT, self.reader.read_frame())
            .await
            .expect("ack in time")
            .expect("ack frame")
            .expect("an ack, not EOF");
        let ack: Ack = frame.decode().expect("ack decodes");
        assert_eq!(ack.seq, self.seq);
        self.seq += 1;
        ack
    }

    /// Sends `data` in packets, asserting every replica acknowledges each; returns
    /// the chunk offset after it (the acknowledged length).
    pub async fn write_acked(&mut self, data: &[u8], replicas: usize) -> u64 {
        for part in data.chunks(DEFAULT_PACKET_SIZE) {
            let ack = self.send(part).await;
            assert_eq!(ack.replicas.len(), replicas, "{ack:?}");
            let end = self.offset + part.len() as u64;
            for r in &ack.replicas {
                assert_eq!(r.result, Ok(end), "{ack:?}");
            }
            self.offset = end;
        }
        self.offset
    }
}
