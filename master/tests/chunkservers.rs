//! An in-process master with three real chunkservers: version bumps land in the
//! replicas' on-disk headers before grants are returned, stale replicas are never
//! handed out, and versions keep growing across master restarts and crashes.

mod admin;

use stampfs_chunkserver::header::{Header, SLOT_SIZE};
use stampfs_chunkserver::{ChunkserverConfig, ChunkserverHandle};
use stampfs_master::{start, MasterConfig, MasterHandle};
use stampfs_proto::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const A: ClientId = ClientId(0xa11ce);
const B: ClientId = ClientId(0xb0b);
const CHUNK: u64 = 1 << 20;

struct Cluster {
    master_cfg: MasterConfig,
    master: Option<MasterHandle>,
    servers: Vec<Option<ChunkserverHandle>>,
    /// Data directory of each chunkserver id.
    dirs: HashMap<ChunkserverId, PathBuf>,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut master_cfg = MasterConfig::new(tmp.path().join("master"));
        master_cfg.dead_after = Duration::from_millis(800);
        // These tests keep stale replicas around on purpose: no garbage collection.
        master_cfg.health_interval = Duration::ZERO;
        let master = start(master_cfg.clone()).await.expect("master");
        // Restarts reuse the port the chunkservers know.
        master_cfg.listen = master.addr().to_string();
        let mut servers = Vec::new();
        let mut dirs = HashMap::new();
        for i in 0..3 {
            let dir = tmp.path().join(format!("cs{i}"));
            let mut cfg = ChunkserverConfig::new(
                dir.clone(),
                master.addr().to_string(),
                master_cfg.key_file(),
            );
            cfg.heartbeat = Duration::from_millis(100);
            cfg.capacity = Some(1 << 30);
            let cs = stampfs_chunkserver::start(cfg).await.expect("chunkserver");
            let id = wait_for("chunkserver registration", || cs.id()).await;
            dirs.insert(id, dir);
            servers.push(Some(cs));
        }
        Self {
            master_cfg,
            master: Some(master),
            servers,
            dirs,
            _tmp: tmp,
        }
    }

    async fn client(&self) -> RpcClient {
        let m = self.master.as_ref().expect("master running");
        admin::connect(&m.addr().to_string(), &m.core().config.dir).await
    }

    fn header(&self, id: ChunkserverId, handle: ChunkHandle) -> Header {
        read_header(&self.dirs[&id], handle)
    }

    async fn restart_master(&mut self, crash: bool) {
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
}

fn read_header(dir: &Path, handle: ChunkHandle) -> Header {
    let bytes = std::fs::read(stampfs_chunkserver::layout::replica_path(dir, handle))
        .expect("replica file");
    let slot = SLOT_SIZE as usize;
    Header::newest(&bytes[..slot], &bytes[slot..2 * slot]).expect("a valid header")
}

async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `GetLocations` until the first chunk lists `n` replicas.
async fn wait_replicas(c: &mut RpcClient, path: &str, n: usize) -> LocatedChunk {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let loc = c
            .call(GetLocations {
                path: path.into(),
                client: A,
                access: false,
                caller: None,
            })
            .await
            .expect("locations");
        if let Some(first) = loc.chunks.first() {
            if first.replicas.len() == n {
                return first.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {n} replicas of {path}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ids(g: &WriteGrant) -> Vec<ChunkserverId> {
    g.pipeline.iter().map(|p| p.id).collect()
}

#[tokio::test]
async fn bumps_land_in_replica_headers_before_grants() {
    let mut cl = Cluster::start().await;
    let mut c = cl.client().await;
    c.call(Create {
        path: "/f".into(),
        client: A,
        replication: None,
        chunk_size: Some(CHUNK),
        overwrite: false,
        attr: None,
        caller: None,
    })
    .await
    .expect("create");

    // A new chunk: version 1 on three distinct chunkservers, durable in their headers.
    let g1 = c
        .call(AddChunk {
            path: "/f".into(),
            client: A,
            previous: None,
        })
        .await
        .expect("add chunk");
    let h = g1.token.handle;
    assert_eq!(g1.token.version, ChunkVersion(1));
    assert_eq!(g1.token.client, A);
    assert_eq!(
        (
            g1.chunk_index,
            g1.file_offset,
            g1.chunk_offset,
            g1.chunk_size
        ),
        (0, 0, 0, CHUNK)
    );
    let all = ids(&g1);
    assert_eq!(all.len(), 3);
    for id in &all {
        let hd = cl.header(*id, h);
        assert_eq!((hd.handle, hd.version), (h, ChunkVersion(1)));
    }

    // Close commits and finalizes.
    let st = c
        .call(Close {
            path: "/f".into(),
            client: A,
            last: Some(ChunkCommit {
                handle: h,
                length: 0,
            }),
            keep_mtime: false,
        })
        .await
        .expect("close");
    assert_eq!(st.state, FileState::Closed);
    for id in &all {
        assert_eq!(cl.header(*id, h).state, ReplicaState::Finalized);
    }

    // Append re-leases the partial chunk: version 2 everywhere before the grant.
    let r = c
        .call(Append {
            path: "/f".into(),
            client: B,
            caller: None,
        })
        .await
        .expect("append");
    let g2 = r.last_chunk.expect("the partial chunk is re-leased");
    assert_eq!(
        (g2.token.handle, g2.token.version, g2.token.client),
        (h, ChunkVersion(2), B)
    );
    assert_eq!(ids(&g2).len(), 3);
    for id in &all {
        assert_eq!(cl.header(*id, h).version, ChunkVersion(2));
    }

    // Pipeline recovery over two survivors: version 3 on them, the third is stale.
    let survivors = ids(&g2)[..2].to_vec();
    let dropped = ids(&g2)[2];
    let g3 = c
        .call(UpdatePipeline {
            path: "/f".into(),
            client: B,
            handle: h,
            survivors: survivors.clone(),
            acked_length: 0,
        })
        .await
        .expect("update pipeline");
    assert_eq!(g3.token.version, ChunkVersion(3));
    assert_eq!(ids(&g3), survivors);
    for id in &survivors {
        assert_eq!(cl.header(*id, h).version, ChunkVersion(3));
    }
    assert_eq!(cl.header(dropped, h).version, ChunkVersion(2));
    let loc = wait_replicas(&mut c, "/f", 2).await;
    assert_eq!(loc.version, ChunkVersion(3));
    assert!(!loc.complete, "the file is open");
    assert!(
        loc.replicas.iter().all(|r| r.chunkserver != dropped),
        "stale replica handed out"
    );
    let key = ClusterKey::load(&cl.master_cfg.key_file()).expect("key");
    loc.token
        .verify_read(&key)
        .expect("read token is signed with the cluster key");
    assert!(
        loc.token.verify(&key).is_err(),
        "a read token is not a write token"
    );
    c.call(Close {
        path: "/f".into(),
        client: B,
        last: Some(ChunkCommit {
            handle: h,
            length: 0,
        }),
        keep_mtime: false,
    })
    .await
    .expect("close");

    // Clean restart: the chunkservers re-register, the stale replica stays out, and
    // the next version is above everything issued before.
    cl.restart_master(false).await;
    let mut c = cl.client().await;
    let loc = wait_replicas(&mut c, "/f", 2).await;
    assert!(loc.replicas.iter().all(|r| r.chunkserver != dropped));
    let r = c
        .call(Append {
            path: "/f".into(),
            client: A,
            caller: None,
        })
        .await
        .expect("append after restart");
    let g4 = r.last_chunk.expect("re-leased");
    assert_eq!(g4.token.version, ChunkVersion(4));
    assert_eq!(ids(&g4).len(), 2, "only current replicas are bumped");
    for id in ids(&g4) {
        assert_eq!(cl.header(id, h).version, ChunkVersion(4));
    }

    // Crash (no shutdown) right after the grant: the version is still never reissued.
    cl.restart_master(true).await;
    let mut c = cl.client().await;
    wait_replicas(&mut c, "/f", 2).await;
    let st = c
        .call(Stat {
            path: "/f".into(),
            caller: None,
        })
        .await
        .expect("stat");
    assert_eq!(
        st.state,
        FileState::Open,
        "the acknowledged reopen survived the crash"
    );
    let g5 = c
        .call(UpdatePipeline {
            path: "/f".into(),
            client: A,
            handle: h,
            survivors: ids(&g4),
            acked_length: 0,
        })
        .await
        .expect("pipeline recovery after crash");
    assert_eq!(g5.token.version, ChunkVersion(5));

    // A chunkserver that stops heartbeating is dead: not handed out, not placed on.
    let victim = ids(&g5)[0];
    let idx = cl
        .servers
        .iter()
        .position(|s| s.as_ref().and_then(|s| s.id()) == Some(victim))
        .expect("victim");
    cl.servers[idx]
        .take()
        .expect("running")
        .shutdown()
        .await
        .expect("chunkserver shutdown");
    let loc = wait_replicas(&mut c, "/f", 1).await;
    assert!(loc.replicas.iter().all(|r| r.chunkserver != victim));
    let g6 = c
        .call(AddChunk {
            path: "/f".into(),
            client: A,
            previous: Some(ChunkCommit {
                handle: h,
                length: 0,
            }),
        })
        .await
        .expect("add chunk with one server down");
    assert_eq!(ids(&g6).len(), 2, "under-replicated but above the minimum");
    assert!(!ids(&g6).contains(&victim));
    assert!(g6.token.handle > h);
    assert_eq!(g6.chunk_index, 1);
    for id in ids(&g6) {
        assert_eq!(cl.header(id, g6.token.handle).version, ChunkVersion(1));
    }

    for s in cl.servers.iter_mut() {
        if let Some(s) = s.take() {
            s.shutdown().await.expect("chunkserver shutdown");
        }
    }
    cl.master
        .take()
        .expect("master")
        .shutdown()
        .await
        .expect("master shutdown");
}
