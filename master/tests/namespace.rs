//! An in-process master on a temp dir, driven by real TCP clients.

mod admin;

use stampfs_master::config::LogKind;
use stampfs_master::{start, MasterConfig, MasterHandle};
use stampfs_proto::*;
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const TIMEOUT: Duration = Duration::from_secs(5);
const A: ClientId = ClientId(0xa11ce);
const B: ClientId = ClientId(0xb0b);

async fn master(dir: &Path) -> MasterHandle {
    start(MasterConfig::new(dir.to_path_buf()))
        .await
        .expect("master starts")
}

/// A master on the operation log whatever `STAMPFS_MASTER_LOG` says: for the tests
/// of its files (torn tails, trims); the group's log has its own (`group_log.rs`).
async fn oplog_master(dir: &Path) -> MasterHandle {
    let mut cfg = MasterConfig::new(dir.to_path_buf());
    cfg.log = LogKind::Oplog;
    start(cfg).await.expect("master starts")
}

async fn client(m: &MasterHandle) -> RpcClient {
    admin::connect(&m.addr().to_string(), &m.core().config.dir).await
}

fn remote(e: Error) -> RemoteError {
    match e {
        Error::Remote(r) => r,
        other => panic!("expected a remote error, got {other}"),
    }
}

fn mkdir(path: &str, parents: bool) -> Mkdir {
    Mkdir {
        path: path.into(),
        parents,
        attr: None,
        caller: None,
    }
}

fn create(path: &str, client: ClientId) -> Create {
    Create {
        path: path.into(),
        client,
        replication: None,
        chunk_size: None,
        overwrite: false,
        attr: None,
        caller: None,
    }
}

fn names(list: Vec<FileStatus>) -> Vec<String> {
    list.into_iter().map(|s| s.path).collect()
}

#[tokio::test]
async fn namespace_operations_over_tcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = master(dir.path()).await;
    let addr_file = std::fs::read_to_string(dir.path().join("addr")).expect("addr file");
    assert_eq!(addr_file.trim(), m.addr().to_string());
    assert!(dir.path().join("cluster.key").exists());
    let mut c = client(&m).await;

    let st = c.call(mkdir("/a/b/c", true)).await.expect("mkdir -p");
    assert_eq!((st.path.as_str(), st.kind), ("/a/b/c", FileKind::Directory));
    c.call(mkdir("/a/b/c/", true))
        .await
        .expect("mkdir -p again");
    let e = remote(c.call(mkdir("/a/b", false)).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    let e = remote(c.call(mkdir("/x/y", false)).await.unwrap_err());
    assert!(
        matches!(e, RemoteError::NotFound { ref what } if what == "/x"),
        "{e}"
    );

    let f = c.call(create("/a/f", A)).await.expect("create");
    assert_eq!(
        (f.kind, f.state, f.length, f.replication),
        (FileKind::File, FileState::Open, 0, 3)
    );
    assert_eq!(f.chunk_size, 64 << 20);
    let e = remote(c.call(create("/a/f", B)).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    let mut over = create("/a/f", B);
    over.overwrite = true;
    let e = remote(c.call(over).await.unwrap_err());
    assert!(
        matches!(e, RemoteError::LeaseConflict { holder: A, .. }),
        "{e}"
    );
    let mut small = create("/a/small", B);
    small.replication = Some(2);
    small.chunk_size = Some(1 << 20);
    let s = c.call(small).await.expect("create with overrides");
    assert_eq!((s.replication, s.chunk_size), (2, 1 << 20));
    let mut bad = create("/a/bad", B);
    bad.chunk_size = Some(3);
    assert_eq!(
        remote(c.call(bad).await.unwrap_err()).code(),
        ErrorCode::BadRequest
    );
    let e = remote(c.call(create("/a", A)).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::IsADirectory);
    let e = remote(c.call(create("/a/f/g", A)).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::NotADirectory);

    let list = c
        .call(List {
            path: "/a".into(),
            caller: None,
        })
        .await
        .expect("list");
    assert_eq!(names(list), vec!["/a/b", "/a/f", "/a/small"]);
    let list = c
        .call(List {
            path: "/a/f".into(),
            caller: None,
        })
        .await
        .expect("list a file");
    assert_eq!(names(list), vec!["/a/f"]);
    let root = c
        .call(Stat {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("stat /");
    assert_eq!(root.kind, FileKind::Directory);
    let list = c
        .call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("list /");
    assert_eq!(names(list), vec!["/a"]);

    c.call(Rename {
        src: "/a/f".into(),
        dst: "/a/b/g".into(),
        caller: None,
        replace: false,
    })
    .await
    .expect("rename file");
    let e = remote(
        c.call(Stat {
            path: "/a/f".into(),
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::NotFound);
    c.call(Stat {
        path: "/a/b/g".into(),
        caller: None,
    })
    .await
    .expect("moved");
    let e = remote(
        c.call(Rename {
            src: "/a".into(),
            dst: "/a/b/inside".into(),
            caller: None,
            replace: false,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::BadRequest, "{e}");
    let e = remote(
        c.call(Rename {
            src: "/a/small".into(),
            dst: "/a/b/g".into(),
            caller: None,
            replace: false,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    c.call(Rename {
        src: "/a/b".into(),
        dst: "/b".into(),
        caller: None,
        replace: false,
    })
    .await
    .expect("rename dir");
    assert_eq!(
        names(
            c.call(List {
                path: "/b".into(),
                caller: None
            })
            .await
            .expect("list")
        ),
        vec!["/b/c", "/b/g"]
    );

    let e = remote(
        c.call(Delete {
            path: "/b".into(),
            recursive: false,
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::DirectoryNotEmpty);
    c.call(Delete {
        path: "/b".into(),
        recursive: true,
        caller: None,
    })
    .await
    .expect("rm -r");
    let e = remote(
        c.call(Delete {
            path: "/".into(),
            recursive: true,
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::BadRequest);

    for bad in ["relative", "/a//b", "/a/../b", "/a/./b", "", "/a\0b"] {
        let e = remote(
            c.call(Stat {
                path: bad.into(),
                caller: None,
            })
            .await
            .unwrap_err(),
        );
        assert_eq!(e.code(), ErrorCode::InvalidPath, "{bad:?}: {e}");
        let e = remote(c.call(mkdir(bad, true)).await.unwrap_err());
        assert_eq!(e.code(), ErrorCode::InvalidPath, "{bad:?}: {e}");
    }
    let long = format!("/{}", "n".repeat(300));
    let e = remote(c.call(create(&long, A)).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::InvalidPath);

    m.shutdown().await.expect("shutdown");
    assert!(
        !dir.path().join("addr").exists(),
        "addr removed on shutdown"
    );
}

#[tokio::test]
async fn write_leases_over_tcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = master(dir.path()).await;
    let mut c = client(&m).await;
    c.call(create("/f", A)).await.expect("create");
    // Nobody but the holder may close or add chunks.
    let e = remote(
        c.call(Close {
            path: "/f".into(),
            client: B,
            last: None,
            keep_mtime: false,
        })
        .await
        .unwrap_err(),
    );
    assert!(matches!(e, RemoteError::LeaseExpired { .. }), "{e}");
    let e = remote(
        c.call(AddChunk {
            path: "/f".into(),
            client: B,
            previous: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::LeaseExpired);
    // Another client's append names the holder and when its lease expires.
    let e = remote(
        c.call(Append {
            path: "/f".into(),
            client: B,
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    match e {
        RemoteError::LeaseConflict {
            holder,
            expires_in_ms,
            ..
        } => {
            assert_eq!(holder, A);
            assert!(
                expires_in_ms > 50_000 && expires_in_ms <= 60_000,
                "{expires_in_ms}"
            );
        }
        other => panic!("expected a lease conflict, got {other}"),
    }
    c.call(RenewLease { client: A }).await.expect("renew");
    c.call(RenewLease { client: B })
        .await
        .expect("renew of nothing is fine");
    // No chunkservers: a chunk cannot be placed.
    let e = remote(
        c.call(AddChunk {
            path: "/f".into(),
            client: A,
            previous: None,
        })
        .await
        .unwrap_err(),
    );
    assert!(
        matches!(e, RemoteError::NotEnoughReplicas { live: 0, needed: 1 }),
        "{e}"
    );
    let st = c
        .call(Close {
            path: "/f".into(),
            client: A,
            last: None,
            keep_mtime: false,
        })
        .await
        .expect("close");
    assert_eq!((st.state, st.length), (FileState::Closed, 0));
    // A file without chunks reopens without a grant; the client then adds a chunk.
    let r = c
        .call(Append {
            path: "/f".into(),
            client: B,
            caller: None,
        })
        .await
        .expect("append");
    assert!(r.last_chunk.is_none());
    assert_eq!(r.status.state, FileState::Open);
    let loc = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    assert!(loc.chunks.is_empty());
    m.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn chunkserver_registration_and_unreachable_replicas() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = master(dir.path()).await;
    let key = ClusterKey::load(&dir.path().join("cluster.key")).expect("the master's key");
    let mut c = client(&m).await;
    // An address nothing listens on: bumps to it fail.
    let dead_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let reg = |id| Register {
        id,
        addr: format!("127.0.0.1:{dead_port}"),
        capacity: 1 << 40,
        used: 0,
        replicas: vec![],
        session: 0,
    };
    // Not before the connection proved the cluster key: refused, and closed.
    let e = remote(c.call(reg(None)).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::Unauthenticated, "{e}");
    assert!(
        c.call(Stat {
            path: "/".into(),
            caller: None
        })
        .await
        .is_err(),
        "the connection was closed"
    );
    // Nor with another key: the master refuses the proof and closes.
    let mut c = client(&m).await;
    let wrong = ClusterKey::from_bytes([0x5a; 32]);
    let err = auth::authenticate_chunkserver(&mut c, &wrong)
        .await
        .unwrap_err();
    assert!(err.is_key_mismatch(), "{err}");
    assert!(c.call(reg(None)).await.is_err());
    // With the master's key, both sides prove it and the chunkserver registers.
    let mut c = client(&m).await;
    auth::authenticate_chunkserver(&mut c, &key)
        .await
        .expect("the handshake with the right key");
    let id = c.call(reg(None)).await.expect("register").id;
    assert_eq!(
        c.call(reg(Some(id))).await.expect("again").id,
        id,
        "known id kept"
    );
    let other = c
        .call(reg(Some(ChunkserverId(999))))
        .await
        .expect("unknown id")
        .id;
    assert_ne!(other, id);
    let hb = |id| Heartbeat {
        id,
        capacity: 1 << 40,
        used: 0,
        replica_count: 0,
        active_streams: 0,
    };
    let r = c.call(hb(id)).await.expect("heartbeat");
    assert!(!r.reregister);
    assert!(r.commands.is_empty());
    assert!(c.call(hb(ChunkserverId(555))).await.expect("hb").reregister);
    let e = remote(
        c.call(ChunkReport {
            id: ChunkserverId(555),
            replicas: vec![],
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::NotFound);
    c.call(ChunkReport {
        id,
        replicas: vec![],
    })
    .await
    .expect("report");

    c.call(create("/f", A)).await.expect("create");
    let e = remote(
        c.call(AddChunk {
            path: "/f".into(),
            client: A,
            previous: None,
        })
        .await
        .unwrap_err(),
    );
    assert!(
        matches!(e, RemoteError::NotEnoughReplicas { live: 0, needed: 1 }),
        "{e}"
    );
    // The chunk that could not be placed was abandoned.
    let loc = c
        .call(GetLocations {
            path: "/f".into(),
            client: A,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    assert!(loc.chunks.is_empty());
    m.shutdown().await.expect("shutdown");

    // After a restart the master does not know the server until it registers again,
    // and then keeps its id.
    let m = master(dir.path()).await;
    let mut c = client(&m).await;
    auth::authenticate_chunkserver(&mut c, &key)
        .await
        .expect("the same key after a restart");
    assert!(c.call(hb(id)).await.expect("hb").reregister);
    assert_eq!(c.call(reg(Some(id))).await.expect("register").id, id);
    let third = c.call(reg(None)).await.expect("register new").id;
    assert!(
        third.0 > other.0,
        "ids are never reused: {third} after {other}"
    );
    m.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_malformed_frame_closes_only_its_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = master(dir.path()).await;
    let mut good = client(&m).await;
    good.call(mkdir("/d", false)).await.expect("mkdir");

    // Garbage bytes.
    let mut raw = tokio::net::TcpStream::connect(m.addr())
        .await
        .expect("connect");
    raw.write_all(b"this is not a frame at all, not even close")
        .await
        .expect("write");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(TIMEOUT, tokio::io::AsyncReadExt::read(&mut raw, &mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "the server closes a connection that sent garbage");

    // A well-framed header that is not a request.
    let mut raw = tokio::net::TcpStream::connect(m.addr())
        .await
        .expect("connect");
    let frame = Frame::message(&(1u64, "not a request", 3u8)).expect("frame");
    raw.write_all(&frame.to_bytes().expect("bytes"))
        .await
        .expect("write");
    let n = tokio::time::timeout(TIMEOUT, tokio::io::AsyncReadExt::read(&mut raw, &mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0);

    // Everyone else is still served.
    good.call(Stat {
        path: "/d".into(),
        caller: None,
    })
    .await
    .expect("still served");
    let mut again = client(&m).await;
    again
        .call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("new connections too");
    m.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn restarts_keep_every_acknowledged_mutation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = master(dir.path()).await;
    let mut c = client(&m).await;
    c.call(mkdir("/keep/sub", true)).await.expect("mkdir");
    let f1 = c.call(create("/keep/open", A)).await.expect("create");
    c.call(create("/keep/closed", A)).await.expect("create");
    c.call(Close {
        path: "/keep/closed".into(),
        client: A,
        last: None,
        keep_mtime: false,
    })
    .await
    .expect("close");
    c.call(Rename {
        src: "/keep/sub".into(),
        dst: "/keep/moved".into(),
        caller: None,
        replace: false,
    })
    .await
    .expect("rename");
    m.shutdown().await.expect("clean shutdown");

    // Clean restart.
    let m = master(dir.path()).await;
    let mut c = client(&m).await;
    let list = names(
        c.call(List {
            path: "/keep".into(),
            caller: None,
        })
        .await
        .expect("list"),
    );
    assert_eq!(list, vec!["/keep/closed", "/keep/moved", "/keep/open"]);
    let open = c
        .call(Stat {
            path: "/keep/open".into(),
            caller: None,
        })
        .await
        .expect("stat");
    assert_eq!((open.inode, open.state), (f1.inode, FileState::Open));
    // The open file's holder gets a fresh lease after the restart.
    let e = remote(
        c.call(Append {
            path: "/keep/open".into(),
            client: B,
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert!(
        matches!(e, RemoteError::LeaseConflict { holder: A, .. }),
        "{e}"
    );
    let f2 = c.call(create("/keep/new", B)).await.expect("create");
    assert!(f2.inode > f1.inode, "inode counter resumes above");
    assert!(
        m.checkpoint().await.expect("checkpoint"),
        "a checkpoint was written"
    );
    c.call(mkdir("/after-checkpoint", false))
        .await
        .expect("mkdir");
    // Simulated crash: drop without shutdown.
    drop(c);
    drop(m);

    let m = master(dir.path()).await;
    let mut c = client(&m).await;
    let list = names(
        c.call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("list"),
    );
    assert_eq!(list, vec!["/after-checkpoint", "/keep"]);
    let f3 = c.call(create("/keep/newer", B)).await.expect("create");
    assert!(
        f3.inode > f2.inode,
        "inode counter resumes above after checkpoint + crash"
    );
    m.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_crash_in_a_stream_of_mutations_keeps_every_acknowledged_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = master(dir.path()).await;
    let addr = m.addr().to_string();
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut writers = Vec::new();
    let mdir = m.core().config.dir.clone();
    for w in 0..8 {
        let addr = addr.clone();
        let mdir = mdir.clone();
        let acked = acked_tx.clone();
        writers.push(tokio::spawn(async move {
            let Some(mut c) = admin::try_connect(&addr, &mdir).await else {
                return;
            };
            for i in 0.. {
                let path = format!("/w{w}-{i}");
                match c.call(mkdir(&path, false)).await {
                    Ok(_) => {
                        if acked.send(path).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    drop(acked_tx);
    // Let the stream run, then crash in the middle of it.
    let mut acked = Vec::new();
    while acked.len() < 200 {
        match acked_rx.recv().await {
            Some(p) => acked.push(p),
            None => break,
        }
    }
    let stats = m.log_stats();
    drop(m);
    for w in writers {
        let _ = w.await;
    }
    while let Ok(p) = acked_rx.try_recv() {
        acked.push(p);
    }
    assert!(acked.len() >= 200);
    assert!(stats.fsyncs <= stats.records, "{stats:?}");

    let m = master(dir.path()).await;
    let mut c = client(&m).await;
    let present: std::collections::HashSet<String> = names(
        c.call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("list"),
    )
    .into_iter()
    .collect();
    for p in &acked {
        assert!(present.contains(p), "acknowledged {p} was lost");
    }
    m.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_torn_log_tail_is_cut_and_the_master_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = oplog_master(dir.path()).await;
    let mut c = client(&m).await;
    for i in 0..5 {
        c.call(mkdir(&format!("/d{i}"), false))
            .await
            .expect("mkdir");
    }
    m.shutdown().await.expect("shutdown");
    // Half a record of garbage at the end of the newest non-empty segment.
    let mut segs = stampfs_master::oplog::segments(dir.path()).expect("segments");
    segs.retain(|(_, p)| std::fs::metadata(p).map(|m| m.len() > 8).unwrap_or(false));
    let (_, newest) = segs.pop().expect("a segment with records");
    let mut bytes = std::fs::read(&newest).expect("read");
    let good = bytes.len();
    bytes.extend_from_slice(&[0, 0, 0, 40, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
    std::fs::write(&newest, bytes).expect("write");

    let m = oplog_master(dir.path()).await;
    assert_eq!(
        std::fs::metadata(&newest).expect("meta").len() as usize,
        good
    );
    let mut c = client(&m).await;
    let list = names(
        c.call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("list"),
    );
    assert_eq!(list, vec!["/d0", "/d1", "/d2", "/d3", "/d4"]);
    c.call(mkdir("/d5", false))
        .await
        .expect("the log continues");
    m.shutdown().await.expect("shutdown");
    let m = oplog_master(dir.path()).await;
    let mut c = client(&m).await;
    assert_eq!(
        names(
            c.call(List {
                path: "/".into(),
                caller: None
            })
            .await
            .expect("list")
        )
        .len(),
        6
    );
    m.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn the_checkpoint_worker_trims_the_log_when_it_grows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = MasterConfig::new(dir.path().to_path_buf());
    cfg.log = LogKind::Oplog;
    cfg.checkpoint_log_size = 1;
    let m = start(cfg.clone()).await.expect("start");
    let mut c = client(&m).await;
    for i in 0..20 {
        c.call(mkdir(&format!("/d{i}"), false))
            .await
            .expect("mkdir");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !dir.path().join("checkpoint").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Once written, older segments go (the trim follows the checkpoint's rename, so
    // wait for it, bounded): only records after it remain.
    loop {
        let first_left = stampfs_master::oplog::segments(dir.path())
            .expect("segments")
            .first()
            .map(|s| s.0)
            .expect("a segment");
        if first_left > 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline + Duration::from_secs(20),
            "the first segment was not trimmed after the checkpoint"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.call(mkdir("/after", false)).await.expect("mkdir");
    drop(c);
    drop(m); // crash
    tokio::time::sleep(Duration::from_millis(50)).await;
    let m = start(cfg).await.expect("restart");
    let mut c = client(&m).await;
    let list = names(
        c.call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("list"),
    );
    assert_eq!(list.len(), 21);
    assert!(list.contains(&"/after".to_string()));
    m.shutdown().await.expect("shutdown");
}

fn make_file(path: &str, client: ClientId) -> MakeFile {
    MakeFile {
        path: path.into(),
        client,
        replication: None,
        chunk_size: None,
        attr: None,
        caller: None,
    }
}

#[tokio::test]
async fn make_file_creates_a_closed_empty_file_that_survives_a_crash_and_takes_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = master(dir.path()).await;
    let mut c = client(&m).await;
    let f = c.call(make_file("/touched", A)).await.expect("make_file");
    assert_eq!(
        (f.kind, f.state, f.length),
        (FileKind::File, FileState::Closed, 0)
    );
    // No lease was taken: another client appends at once.
    let e = remote(c.call(make_file("/touched", B)).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    let e = remote(c.call(create("/touched", B)).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    for i in 0..50 {
        c.call(make_file(&format!("/many{i}"), A))
            .await
            .expect("make_file");
    }
    drop(c);
    drop(m); // crash: the log is left with its preallocated zeros
    tokio::time::sleep(Duration::from_millis(50)).await;

    let m = master(dir.path()).await;
    let mut c = client(&m).await;
    let st = c
        .call(Stat {
            path: "/touched".into(),
            caller: None,
        })
        .await
        .expect("stat after the crash");
    assert_eq!((st.state, st.length), (FileState::Closed, 0));
    let list = c
        .call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("list");
    assert_eq!(list.len(), 51);
    assert!(list.iter().all(|s| s.state == FileState::Closed));
    let reply = c
        .call(Append {
            path: "/touched".into(),
            client: B,
            caller: None,
        })
        .await
        .expect("append to a made file");
    assert_eq!(reply.status.state, FileState::Open);
    assert!(
        reply.last_chunk.is_none(),
        "an empty file has no last chunk"
    );
    m.shutdown().await.expect("shutdown");
    // A clean shutdown leaves no zeros behind: every segment holds only records.
    for (_, seg) in stampfs_master::oplog::segments(dir.path()).expect("segments") {
        let bytes = std::fs::read(&seg).expect("read segment");
        assert!(
            (bytes.len() as u64) < stampfs_master::oplog::PREALLOC,
            "{} was not cut at close ({} bytes)",
            seg.display(),
            bytes.len()
        );
    }
}
