//! Helpers shared by the integration tests: engines to run, chunkservers on loopback,
//! tokens and commands signed with a test cluster key, a pipeline client.
#![allow(dead_code)]

use bytes::Bytes;
use stampfs_chunkserver::{start, ChunkserverConfig, ChunkserverHandle, IoEngineKind};
use stampfs_proto::net::{ConnRead, ConnWrite};
use stampfs_proto::rpc::request_frame;
use stampfs_proto::{
    Ack, ChunkCommand, ChunkHandle, ChunkToken, ChunkVersion, ChunkserverAddr, ChunkserverId,
    ClientId, ClusterKey, Frame, FrameReader, FrameWriter, Issue, OverwriteSetup, Packet, Read,
    ReadReply, RemoteError, ReplicaReport, RpcClient, Signed, WriteSetup, WriteSetupReply,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The engines to test: threads always; io_uring when available (required in CI).
pub fn engines() -> Vec<IoEngineKind> {
    let mut out = vec![IoEngineKind::Threads];
    match stampfs_chunkserver::io::uring_available() {
        Ok(()) => out.push(IoEngineKind::Uring),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "io_uring must be available in CI: {e}"
            );
            println!("SKIPPED: io_uring cases: io_uring unavailable: {e}");
        }
    }
    out
}

pub fn engine(kind: IoEngineKind) -> std::sync::Arc<dyn stampfs_chunkserver::io::IoEngine> {
    stampfs_chunkserver::io::open_engine(kind).expect("engine")
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// An address nobody listens on (the master is absent in most tests).
pub fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    drop(l);
    a.to_string()
}

/// A test cluster: one key, chunkservers in temp dirs with preset ids.
pub struct Cluster {
    pub key: ClusterKey,
    pub root: tempfile::TempDir,
    pub key_file: PathBuf,
    pub master: String,
    /// Per chunkserver process (by address): its registration session and the
    /// number of the next command signed for it.
    sessions: std::sync::Mutex<std::collections::HashMap<std::net::SocketAddr, (u64, u64)>>,
}

impl Cluster {
    pub fn new() -> Self {
        init_tracing();
        let root = tempfile::tempdir().expect("tempdir");
        let key = ClusterKey::generate();
        let key_file = root.path().join("cluster.key");
        std::fs::write(&key_file, key.to_hex()).expect("key file");
        Self {
            key,
            root,
            key_file,
            master: dead_addr(),
            sessions: Default::default(),
        }
    }

    pub fn dir(&self, n: u64) -> PathBuf {
        self.root.path().join(format!("cs{n}"))
    }

    pub fn config(&self, n: u64, kind: IoEngineKind) -> ChunkserverConfig {
        let mut c = ChunkserverConfig::new(self.dir(n), self.master.clone(), self.key_file.clone());
        c.io_engine = kind;
        c.heartbeat = Duration::from_millis(100);
        c.connect_timeout = Duration::from_secs(2);
        c.ack_timeout = Duration::from_secs(5);
        c
    }

    /// Starts chunkserver `n` with id `n` persisted beforehand.
    pub async fn start(&self, n: u64, kind: IoEngineKind) -> ChunkserverHandle {
        self.start_with(n, self.config(n, kind)).await
    }

    pub async fn start_with(&self, n: u64, config: ChunkserverConfig) -> ChunkserverHandle {
        std::fs::create_dir_all(self.dir(n)).expect("dir");
        std::fs::write(self.dir(n).join("chunkserver.id"), format!("{n}\n")).expect("id");
        start(config).await.expect("chunkserver starts")
    }

    pub fn token(&self, handle: u64, version: u64) -> ChunkToken {
        ChunkToken::sign(
            &self.key,
            ChunkHandle(handle),
            ChunkVersion(version),
            ClientId(77),
        )
    }

    /// Signs `cmd` for chunkserver `cs` as its master would: for its registration
    /// session (begun here, once per chunkserver process), with the next number.
    pub fn command(&self, cs: &ChunkserverHandle, cmd: ChunkCommand) -> Signed<ChunkCommand> {
        let issue = self.issue(cs);
        Signed::new(&self.key, issue, cmd).expect("sign")
    }

    /// [`Cluster::command`] in a registration session begun now (the chunkserver's
    /// session was restarted behind this cluster's back).
    pub fn command_fresh(&self, cs: &ChunkserverHandle, cmd: ChunkCommand) -> Signed<ChunkCommand> {
        self.sessions.lock().expect("sessions").remove(&cs.addr());
        self.command(cs, cmd)
    }

    /// The next [`Issue`] for `cs` (see [`Cluster::command`]).
    pub fn issue(&self, cs: &ChunkserverHandle) -> Issue {
        let mut sessions = self.sessions.lock().expect("sessions");
        let (session, next) = sessions
            .entry(cs.addr())
            .or_insert_with(|| (cs.begin_registration(), 0));
        let seq = *next;
        *next += 1;
        Issue {
            chunkserver: cs.id().expect("preset id"),
            session: *session,
            seq,
            epoch: stampfs_proto::MasterEpoch::default(),
        }
    }
}

pub fn addr_of(cs: &ChunkserverHandle) -> ChunkserverAddr {
    ChunkserverAddr {
        id: cs.id().expect("preset id"),
        addr: cs.addr().to_string(),
    }
}

pub async fn connect(cs: &ChunkserverHandle) -> RpcClient {
    RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        &cs.addr().to_string(),
        TIMEOUT,
    )
    .await
    .expect("connect")
}

/// Sends a signed command and returns the typed outcome.
pub async fn command(
    cs: &ChunkserverHandle,
    cmd: Signed<ChunkCommand>,
) -> Result<Option<ReplicaReport>, RemoteError> {
    let mut c = connect(cs).await;
    match c.call(cmd).await {
        Ok(r) => Ok(r),
        Err(stampfs_proto::Error::Remote(e)) => Err(e),
        Err(e) => panic!("transport error: {e}"),
    }
}

pub async fn bump(
    cluster: &Cluster,
    cs: &ChunkserverHandle,
    handle: u64,
    version: u64,
) -> ReplicaReport {
    command(
        cs,
        cluster.command(
            cs,
            ChunkCommand::BumpVersion {
                handle: ChunkHandle(handle),
                version: ChunkVersion(version),
                create: true,
            },
        ),
    )
    .await
    .expect("bump")
    .expect("report")
}

pub async fn read(
    cs: &ChunkserverHandle,
    token: ChunkToken,
    offset: u64,
    len: u32,
) -> Result<(ReplicaReport, Bytes), RemoteError> {
    let mut c = connect(cs).await;
    match c
        .call_with_data(Read { token, offset, len }, Bytes::new())
        .await
    {
        Ok((ReadReply { replica }, data)) => Ok((replica, data)),
        Err(stampfs_proto::Error::Remote(e)) => Err(e),
        Err(e) => panic!("transport error: {e}"),
    }
}

/// A client end of a write pipeline.
pub struct Writer {
    pub reader: FrameReader<ConnRead>,
    pub writer: FrameWriter<ConnWrite>,
    pub token: ChunkToken,
    pub setup: WriteSetupReply,
}

impl Writer {
    pub async fn open(
        first: &ChunkserverHandle,
        token: ChunkToken,
        offset: u64,
        downstream: Vec<ChunkserverAddr>,
    ) -> Result<Writer, RemoteError> {
        let mut c = connect(first).await;
        let setup = match c
            .call(WriteSetup {
                token,
                offset,
                downstream,
            })
            .await
        {
            Ok(s) => s,
            Err(stampfs_proto::Error::Remote(e)) => return Err(e),
            Err(e) => panic!("transport error: {e}"),
        };
        let (reader, writer) = c.into_parts();
        Ok(Writer {
            reader,
            writer,
            token,
            setup,
        })
    }

    /// Opens an overwrite stream (`OverwriteSetup`): packets at any offset up to the
    /// replica's length.
    pub async fn open_overwrite(
        first: &ChunkserverHandle,
        token: ChunkToken,
        offset: u64,
        downstream: Vec<ChunkserverAddr>,
    ) -> Result<Writer, RemoteError> {
        let mut c = connect(first).await;
        let setup = match c
            .call(OverwriteSetup {
                setup: WriteSetup {
                    token,
                    offset,
                    downstream,
                },
            })
            .await
        {
            Ok(s) => s,
            Err(stampfs_proto::Error::Remote(e)) => return Err(e),
            Err(e) => panic!("transport error: {e}"),
        };
        let (reader, writer) = c.into_parts();
        Ok(Writer {
            reader,
            writer,
            token,
            setup,
        })
    }

    pub async fn send(&mut self, seq: u64, offset: u64, data: &[u8], sync: bool) {
        let packet = Packet {
            token: self.token,
            seq,
            offset,
            crc: crc32fast::hash(data),
            sync,
        };
        self.writer
            .write_frame(&Frame::new(&packet, Bytes::copy_from_slice(data)).expect("frame"))
            .await
            .expect("send packet");
    }

    pub async fn send_packet(&mut self, packet: &Packet, data: &[u8]) {
        self.writer
            .write_frame(&Frame::new(packet, Bytes::copy_from_slice(data)).expect("frame"))
            .await
            .expect("send packet");
    }

    pub async fn ack(&mut self) -> Option<Ack> {
        let frame = tokio::time::timeout(TIMEOUT, self.reader.read_frame())
            .await
            .expect("ack in time")
            .expect("ack frame")?;
        Some(frame.decode().expect("ack decodes"))
    }
}

/// The names of the files in a data directory and its replica subdirectories.
pub fn data_file_names(dir: &Path) -> Vec<String> {
    let subdirs = std::fs::read_dir(dir)
        .expect("data dir")
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path());
    std::iter::once(dir.to_path_buf())
        .chain(subdirs)
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Replica data straight from the file (skipping header and checksum table).
pub fn file_data(dir: &Path, handle: u64, length: u64) -> Vec<u8> {
    let bytes = std::fs::read(stampfs_chunkserver::layout::replica_path(
        dir,
        stampfs_proto::ChunkHandle(handle),
    ))
    .expect("replica file");
    let start = stampfs_chunkserver::header::DATA_OFFSET as usize;
    bytes[start..start + length as usize].to_vec()
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

/// Request/reply by hand (for tests that need raw frames).
pub fn raw_request<Q: stampfs_proto::Rpc>(id: u64, q: Q) -> Bytes {
    request_frame(id, q, Bytes::new())
        .expect("frame")
        .to_bytes()
        .expect("bytes")
}

pub fn ids(v: &[u64]) -> Vec<ChunkserverId> {
    v.iter().map(|i| ChunkserverId(*i)).collect()
}
