//! The chunkserver's conversation with a master: a small master on loopback that speaks
//! the real protocol (frames, `MasterRequest`, signed commands) and records what it got.

mod common;

use bytes::Bytes;
use common::*;
use stampfs_chunkserver::store::Store;
use stampfs_chunkserver::IoEngineKind;
use stampfs_proto::auth;
use stampfs_proto::rpc::{parse_request, reply_frame};
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkVersion, ChunkserverId, ClusterKey, FrameReader, FrameWriter,
    HeartbeatReply, Issue, MasterRequest, RegisterReply, RemoteError, ServerChallenge,
    ServerProveReply, Signed,
};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Serves `MasterRequest`s on `listener`, reporting each to `seen`. The first heartbeat
/// reply carries `first_commands`; the third asks the chunkserver to register again.
async fn tiny_master(
    listener: TcpListener,
    key: ClusterKey,
    seen: mpsc::UnboundedSender<MasterRequest>,
    first_commands: Vec<(ClusterKey, ChunkCommand)>,
) {
    let mut commands = Some(first_commands);
    // The session of the chunkserver's latest registration.
    let mut session = 0;
    let mut beats = 0u32;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let (r, w) = stream.into_split();
        let mut reader = FrameReader::new(r);
        let mut writer = FrameWriter::new(w);
        // The handshake's challenges (the chunkserver's, then ours).
        let mut challenges = ([0u8; 32], [0u8; 32]);
        while let Ok(Some(frame)) = reader.read_frame().await {
            let (id, req): (u64, MasterRequest) = parse_request(&frame).expect("request");
            let _ = seen.send(req.clone());
            let reply = match req {
                MasterRequest::ServerHello(h) => {
                    challenges = (h.nonce, auth::nonce());
                    let reply = ServerChallenge {
                        nonce: challenges.1,
                    };
                    reply_frame(id, &Ok::<_, RemoteError>(reply), Bytes::new())
                }
                MasterRequest::ServerProve(p) => {
                    let (c, m) = challenges;
                    assert!(
                        auth::verify_server_proof(&key, &c, &m, &p.proof),
                        "the chunkserver proves the cluster key"
                    );
                    let reply = ServerProveReply {
                        proof: auth::master_proof(&key, &c, &m),
                    };
                    reply_frame(id, &Ok::<_, RemoteError>(reply), Bytes::new())
                }
                MasterRequest::Register(reg) => {
                    session = reg.session;
                    reply_frame(
                        id,
                        &Ok::<_, RemoteError>(RegisterReply {
                            id: ChunkserverId(42),
                        }),
                        Bytes::new(),
                    )
                }
                MasterRequest::Heartbeat(_) => {
                    beats += 1;
                    // Signed as a master does, for this registration, numbered from 0.
                    let signed = commands
                        .take()
                        .unwrap_or_default()
                        .into_iter()
                        .zip(0..)
                        .map(|((key, cmd), seq)| {
                            let issue = Issue {
                                chunkserver: ChunkserverId(42),
                                session,
                                seq,
                                epoch: stampfs_proto::MasterEpoch::default(),
                            };
                            Signed::new(&key, issue, cmd).expect("sign")
                        })
                        .collect();
                    let reply = HeartbeatReply {
                        commands: signed,
                        reregister: beats == 3,
                    };
                    reply_frame(id, &Ok::<_, RemoteError>(reply), Bytes::new())
                }
                MasterRequest::ChunkReport(_) | MasterRequest::ReportCorrupt(_) => {
                    reply_frame(id, &Ok::<_, RemoteError>(()), Bytes::new())
                }
                other => panic!("unexpected request {other:?}"),
            }
            .expect("reply");
            if writer.write_frame(&reply).await.is_err() {
                break;
            }
        }
    }
}

async fn next_matching(
    rx: &mut mpsc::UnboundedReceiver<MasterRequest>,
    what: &str,
    f: impl Fn(&MasterRequest) -> bool,
) -> MasterRequest {
    // A bound on a state, not a timing assertion: generous for a loaded machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let req = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("master alive");
        if f(&req) {
            return req;
        }
    }
}

#[tokio::test]
async fn registers_heartbeats_reports_and_obeys_the_master() {
    let kind = IoEngineKind::Threads;
    let mut cluster = Cluster::new();
    let dir = cluster.dir(1);
    // Before start: one good replica, one whose headers are garbage.
    {
        let store = Store::open(&dir, engine(kind)).await.expect("store");
        store
            .bump_version(ChunkHandle(5), ChunkVersion(1), true)
            .await
            .expect("replica");
    }
    std::fs::write(
        stampfs_chunkserver::layout::replica_path(&dir, ChunkHandle(6)),
        pattern(9000, 1),
    )
    .expect("garbage");

    // The master is down at first: the chunkserver must come up anyway and retry.
    cluster.master = dead_addr();
    let mut config = cluster.config(1, kind);
    config.report_every = Duration::from_secs(3600);
    let cs = stampfs_chunkserver::start(config)
        .await
        .expect("starts without a master");
    assert_eq!(cs.id(), None);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let listener = TcpListener::bind(&cluster.master)
        .await
        .expect("master port");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let delete = (
        cluster.key.clone(),
        ChunkCommand::Delete {
            handle: ChunkHandle(5),
            max_version: ChunkVersion(1),
        },
    );
    // A command signed with a foreign key must be ignored.
    let forged = (
        ClusterKey::generate(),
        ChunkCommand::BumpVersion {
            handle: ChunkHandle(99),
            version: ChunkVersion(1),
            create: true,
        },
    );
    let master = tokio::spawn(tiny_master(
        listener,
        cluster.key.clone(),
        tx,
        vec![forged, delete],
    ));

    let MasterRequest::Register(reg) = next_matching(&mut rx, "register", |r| {
        matches!(r, MasterRequest::Register(_))
    })
    .await
    else {
        unreachable!()
    };
    assert_eq!(reg.id, None);
    assert_eq!(reg.addr, cs.addr().to_string());
    assert!(reg.capacity >= reg.used);
    assert_eq!(reg.replicas.len(), 1);
    assert_eq!(reg.replicas[0].handle, ChunkHandle(5));

    let MasterRequest::ReportCorrupt(rc) = next_matching(&mut rx, "corrupt report", |r| {
        matches!(r, MasterRequest::ReportCorrupt(_))
    })
    .await
    else {
        unreachable!()
    };
    assert_eq!(
        (rc.handle, rc.chunkserver),
        (ChunkHandle(6), ChunkserverId(42))
    );
    assert_eq!(cs.id(), Some(ChunkserverId(42)));
    let persisted = std::fs::read_to_string(dir.join("chunkserver.id")).expect("id file");
    assert_eq!(persisted.trim(), "42");

    // The Delete command from the heartbeat reply runs; the change is reported.
    let MasterRequest::ChunkReport(report) = next_matching(
        &mut rx,
        "chunk report",
        |r| matches!(r, MasterRequest::ChunkReport(c) if c.replicas.is_empty()),
    )
    .await
    else {
        unreachable!()
    };
    assert_eq!(report.id, ChunkserverId(42));
    assert!(!stampfs_chunkserver::layout::replica_path(&dir, ChunkHandle(5)).exists());
    assert!(
        !stampfs_chunkserver::layout::replica_path(&dir, ChunkHandle(99)).exists(),
        "forged command ran"
    );

    // `reregister` brings a new registration with the persisted id.
    let MasterRequest::Register(again) = next_matching(&mut rx, "re-registration", |r| {
        matches!(r, MasterRequest::Register(_))
    })
    .await
    else {
        unreachable!()
    };
    assert_eq!(again.id, Some(ChunkserverId(42)));
    let MasterRequest::Heartbeat(hb) = next_matching(&mut rx, "heartbeat", |r| {
        matches!(r, MasterRequest::Heartbeat(_))
    })
    .await
    else {
        unreachable!()
    };
    assert_eq!((hb.id, hb.replica_count), (ChunkserverId(42), 0));
    cs.shutdown().await.expect("shutdown");

    // After a restart the id comes from the data directory.
    let cs = stampfs_chunkserver::start(cluster.config(1, kind))
        .await
        .expect("restart");
    assert_eq!(cs.id(), Some(ChunkserverId(42)));
    let MasterRequest::Register(reg) = next_matching(&mut rx, "register after restart", |r| {
        matches!(r, MasterRequest::Register(_))
    })
    .await
    else {
        unreachable!()
    };
    assert_eq!(reg.id, Some(ChunkserverId(42)));
    cs.shutdown().await.expect("shutdown");
    master.abort();
}
