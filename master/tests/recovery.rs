//! Lease recovery with an in-process master and three real chunkservers: the version
//! bump lands in the replicas' headers, the old writer's next packet is rejected by
//! the chunkservers (StaleToken), the file closes at the acknowledged length, and the
//! triggers (RecoverLease, the hard limit, another client's append) all get there.

mod common;

use common::*;
use stampfs_proto::*;
use std::time::Duration;

/// A's file `/f` with `len` acknowledged bytes at version 1, its stream still open.
async fn written(cl: &Cluster, c: &mut RpcClient, len: usize) -> (WriteGrant, Stream, Vec<u8>) {
    let g = create_with_chunk(c, "/f").await;
    assert_eq!(g.token.version, ChunkVersion(1));
    assert_eq!(ids(&g).len(), 3);
    let data = pattern(len, 1);
    let mut s = Stream::open(&g).await;
    assert_eq!(s.write_acked(&data, 3).await, len as u64);
    for id in ids(&g) {
        assert_eq!(cl.header(id, g.token.handle).version, ChunkVersion(1));
    }
    (g, s, data)
}

/// Every replica in `on` is at `version`, finalized at `len`, holding `data`.
fn assert_sealed(cl: &Cluster, on: &[ChunkserverId], h: ChunkHandle, version: u64, data: &[u8]) {
    for id in on {
        let hd = cl.header(*id, h);
        assert_eq!(
            (hd.version, hd.state, hd.length),
            (
                ChunkVersion(version),
                ReplicaState::Finalized,
                data.len() as u64
            ),
            "replica on {id}"
        );
        assert_eq!(cl.data(*id, h, data.len() as u64), data, "data on {id}");
    }
}

#[tokio::test]
async fn recover_lease_fences_the_writer_and_closes_at_the_acknowledged_length() {
    let cl = Cluster::start(|_| {}).await;
    let mut c = cl.client().await;
    let (g, mut stream, data) = written(&cl, &mut c, 100_000).await;
    let h = g.token.handle;

    let out = c
        .call(RecoverLease {
            path: "/f".into(),
            client: OP,
            accept_loss: false,
            caller: None,
        })
        .await
        .expect("recover");
    assert_eq!(
        out,
        RecoveryOutcome {
            path: "/f".into(),
            closed: true,
            old_version: Some(ChunkVersion(1)),
            new_version: Some(ChunkVersion(2)),
            length: 100_000,
        }
    );
    assert_sealed(&cl, &ids(&g), h, 2, &data);
    let st = c
        .call(Stat {
            path: "/f".into(),
            caller: None,
        })
        .await
        .expect("stat");
    assert_eq!((st.state, st.length), (FileState::Closed, 100_000));

    // The old writer's next packet, on its still open stream, is refused by the
    // chunkserver that holds the data.
    let ack = stream.send(b"late bytes").await;
    assert_eq!(
        ack.replicas[0].result,
        Err(RemoteError::StaleToken {
            handle: h,
            presented: ChunkVersion(1),
            current: ChunkVersion(2),
        }),
        "{ack:?}"
    );
    assert_sealed(&cl, &ids(&g), h, 2, &data);
    // And the master refuses its metadata calls.
    let e = remote(
        c.call(AddChunk {
            path: "/f".into(),
            client: A,
            previous: Some(ChunkCommit {
                handle: h,
                length: 100_010,
            }),
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::LeaseExpired, "{e}");
    let e = remote(
        c.call(Close {
            path: "/f".into(),
            client: A,
            last: Some(ChunkCommit {
                handle: h,
                length: 100_010,
            }),
            keep_mtime: false,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::LeaseExpired, "{e}");

    let loc = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    let chunk = &loc.chunks[0];
    assert_eq!(
        (chunk.version, chunk.length, chunk.complete),
        (ChunkVersion(2), 100_000, true)
    );
    assert_eq!(chunk.replicas.len(), 3);

    // Recovering a closed file reports it as it is.
    let again = c
        .call(RecoverLease {
            path: "/f".into(),
            client: OP,
            accept_loss: false,
            caller: None,
        })
        .await
        .expect("recover a closed file");
    assert_eq!(
        (
            again.closed,
            again.old_version,
            again.new_version,
            again.length
        ),
        (true, None, None, 100_000)
    );
    c.call(Mkdir {
        path: "/d".into(),
        parents: false,
        attr: None,
        caller: None,
    })
    .await
    .expect("mkdir");
    for (p, code) in [
        ("/d", ErrorCode::IsADirectory),
        ("/nope", ErrorCode::NotFound),
        ("bad", ErrorCode::InvalidPath),
    ] {
        let e = remote(
            c.call(RecoverLease {
                path: p.into(),
                client: OP,
                accept_loss: false,
                caller: None,
            })
            .await
            .unwrap_err(),
        );
        assert_eq!(e.code(), code, "{p}: {e}");
    }
    cl.shutdown().await;
}

#[tokio::test]
async fn the_hard_limit_recovers_the_file_on_its_own() {
    let cl = Cluster::start(|m| {
        m.lease_soft = Duration::from_millis(400);
        m.lease_hard = Duration::from_millis(800);
    })
    .await;
    let mut c = cl.client().await;
    let (g, _stream, data) = written(&cl, &mut c, 70_000).await;
    // Nobody renews the lease: the worker recovers the file.
    let st = wait_closed(&mut c, "/f").await;
    assert_eq!(st.length, 70_000);
    assert_sealed(&cl, &ids(&g), g.token.handle, 2, &data);
    cl.shutdown().await;
}

#[tokio::test]
async fn append_after_the_soft_limit_recovers_then_proceeds_at_the_next_version() {
    let cl = Cluster::start(|m| {
        m.lease_soft = Duration::from_millis(300);
        m.lease_hard = Duration::from_secs(60);
    })
    .await;
    let mut c = cl.client().await;
    let (g, mut old_stream, data) = written(&cl, &mut c, 80_000).await;
    let h = g.token.handle;
    let append = Append {
        path: "/f".into(),
        client: B,
        caller: None,
    };
    // Within the soft limit (A just renewed): a conflict naming the holder.
    c.call(RenewLease { client: A }).await.expect("renew");
    let e = remote(c.call(append.clone()).await.unwrap_err());
    assert!(
        matches!(e, RemoteError::LeaseConflict { holder: A, .. }),
        "{e}"
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    // Past it: recovery starts, the caller is told to come back.
    let e = remote(c.call(append.clone()).await.unwrap_err());
    assert!(
        matches!(e, RemoteError::RecoveryInProgress { ref path } if path == "/f"),
        "{e}"
    );
    let reply = loop {
        match c.call(append.clone()).await {
            Ok(r) => break r,
            Err(e) => {
                let e = remote(e);
                assert_eq!(e.code(), ErrorCode::RecoveryInProgress, "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(reply.status.length, 80_000);
    let g2 = reply.last_chunk.expect("the partial chunk is re-leased");
    assert_eq!(
        (g2.token.handle, g2.token.version, g2.token.client),
        (h, ChunkVersion(3), B),
        "recovery took version 2, the append 3"
    );
    assert_eq!(g2.chunk_offset, 80_000);
    assert_eq!(ids(&g2).len(), 3);
    // B writes after A's acknowledged bytes and closes.
    let more = pattern(30_000, 2);
    let mut s = Stream::open(&g2).await;
    assert_eq!(s.write_acked(&more, 3).await, 110_000);
    // A wakes up: fenced at the replicas, by B's version now.
    let ack = old_stream.send(b"late").await;
    assert_eq!(
        ack.replicas[0].result,
        Err(RemoteError::StaleToken {
            handle: h,
            presented: ChunkVersion(1),
            current: ChunkVersion(3),
        })
    );
    let st = c
        .call(Close {
            path: "/f".into(),
            client: B,
            last: Some(ChunkCommit {
                handle: h,
                length: 110_000,
            }),
            keep_mtime: false,
        })
        .await
        .expect("close");
    assert_eq!(st.length, 110_000);
    let mut all = data.clone();
    all.extend_from_slice(&more);
    assert_sealed(&cl, &ids(&g2), h, 3, &all);
    cl.shutdown().await;
}

#[tokio::test]
async fn recovery_with_a_replica_down_closes_on_the_others_and_never_serves_it() {
    let mut cl = Cluster::start(|_| {}).await;
    let mut c = cl.client().await;
    let (g, _stream, data) = written(&cl, &mut c, 90_000).await;
    let h = g.token.handle;
    let down = ids(&g)[2];
    let up = ids(&g)[..2].to_vec();
    cl.stop_chunkserver(down).await;
    let out = c
        .call(RecoverLease {
            path: "/f".into(),
            client: OP,
            accept_loss: false,
            caller: None,
        })
        .await
        .expect("recover");
    // The bump to the replica that is down was not answered: it might have taken it
    // (a reply lost looks the same), so the two that answered are sealed at one more
    // version, leaving whatever it holds below it.
    assert_eq!(
        (out.closed, out.old_version, out.new_version, out.length),
        (true, Some(ChunkVersion(1)), Some(ChunkVersion(3)), 90_000)
    );
    assert_sealed(&cl, &up, h, 3, &data);
    let hd = cl.header(down, h);
    assert_eq!(
        (hd.version, hd.state),
        (ChunkVersion(1), ReplicaState::Writing),
        "the down replica missed the bump"
    );
    // It comes back with its stale replica: registered, never handed out.
    cl.restart_chunkserver(down).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let loc = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    let got: Vec<_> = loc.chunks[0]
        .replicas
        .iter()
        .map(|r| r.chunkserver)
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(!got.contains(&down), "a stale replica was handed out");
    assert!(loc.chunks[0]
        .replicas
        .iter()
        .all(|r| r.version == ChunkVersion(3)));
    // The next append bumps only the current replicas.
    let g2 = c
        .call(Append {
            path: "/f".into(),
            client: B,
            caller: None,
        })
        .await
        .expect("append")
        .last_chunk
        .expect("re-leased");
    assert_eq!(g2.token.version, ChunkVersion(4));
    let mut got = ids(&g2);
    got.sort();
    let mut want = up.clone();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(cl.header(down, h).version, ChunkVersion(1));
    cl.shutdown().await;
}

#[tokio::test]
async fn a_recovery_whose_bumps_all_fail_survives_a_crash_and_finishes_after_it() {
    // dead_after is long so the stopped chunkservers still look live: the recovery
    // mints its version, but no bump lands.
    let mut cl = Cluster::start(|m| {
        m.dead_after = Duration::from_secs(5);
        m.command_timeout = Duration::from_millis(500);
    })
    .await;
    let mut c = cl.client().await;
    let (g, _stream, data) = written(&cl, &mut c, 50_000).await;
    let h = g.token.handle;
    for id in ids(&g) {
        cl.stop_chunkserver(id).await;
    }
    let out = c
        .call(RecoverLease {
            path: "/f".into(),
            client: OP,
            accept_loss: false,
            caller: None,
        })
        .await
        .expect("recover");
    assert!(!out.closed, "{out:?}");
    assert_eq!(out.old_version, Some(ChunkVersion(1)));
    let minted = out.new_version.expect("a version was minted");
    assert!(minted >= ChunkVersion(2));
    let st = c
        .call(Stat {
            path: "/f".into(),
            caller: None,
        })
        .await
        .expect("stat");
    assert_eq!(st.state, FileState::Recovering);
    let e = remote(
        c.call(Append {
            path: "/f".into(),
            client: B,
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::RecoveryInProgress, "{e}");

    // Crash the master; bring everything back.
    cl.restart_master(true).await;
    for id in ids(&g) {
        cl.restart_chunkserver(id).await;
    }
    let mut c = cl.client().await;
    let st = wait_closed(&mut c, "/f").await;
    assert_eq!(st.length, 50_000);
    let v = cl.header(ids(&g)[0], h).version;
    assert!(v > minted, "resumed at a fresh version {v} above {minted}");
    assert_sealed(&cl, &ids(&g), h, v.0, &data);
    let loc = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    assert_eq!(loc.chunks[0].version, v);
    cl.shutdown().await;
}
