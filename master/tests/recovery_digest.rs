//! Lease recovery compares the replicas' content (DESIGN.md, "Lease recovery compares
//! content"), with an in-process master and three real chunkservers. Replicas are
//! made to diverge without any overwrite: with the writer's token, each member of the
//! granted pipeline is written alone (a set-up with no downstream), with other bytes
//! of the same length. Recovery keeps the first replica of the pipeline among those
//! it reached, alone, at one more version; the others are stale, never served, and
//! replica health replaces them with copies of the kept one.

mod common;

use bytes::Bytes;
use common::*;
use stampfs_proto::*;
use std::time::{Duration, Instant};

const LEN: usize = 100_000;

/// A's file `/f` whose pipeline member `i` holds `contents[i]` (each written to it
/// alone, all of one length) at version 1.
async fn diverged(c: &mut RpcClient, seeds: [u64; 3]) -> (WriteGrant, Vec<Vec<u8>>) {
    let g = create_with_chunk(c, "/f").await;
    assert_eq!(ids(&g).len(), 3);
    let mut contents = Vec::new();
    for (i, seed) in seeds.into_iter().enumerate() {
        let data = pattern(LEN, seed);
        let mut s = Stream::open_alone(&g, i).await;
        assert_eq!(s.write_acked(&data, 1).await, LEN as u64);
        contents.push(data);
    }
    (g, contents)
}

async fn recover(c: &mut RpcClient) -> RecoveryOutcome {
    c.call(RecoverLease {
        path: "/f".into(),
        client: OP,
        accept_loss: false,
        caller: None,
    })
    .await
    .expect("recover")
}

/// The replica on `id` is at `version` in `state`, `LEN` bytes long, holding `data`.
fn assert_replica(
    cl: &Cluster,
    id: ChunkserverId,
    h: ChunkHandle,
    version: u64,
    state: ReplicaState,
    data: &[u8],
) {
    let hd = cl.header(id, h);
    assert_eq!(
        (hd.version, hd.state, hd.length),
        (ChunkVersion(version), state, LEN as u64),
        "replica on {id}"
    );
    assert_eq!(cl.data(id, h, LEN as u64), data, "data on {id}");
}

/// Reads the whole chunk from the first replica `GetLocations` lists.
async fn read_file(c: &mut RpcClient) -> (LocatedChunk, Vec<u8>) {
    let loc = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    let chunk = loc.chunks[0].clone();
    let replica = chunk.replicas.first().expect("a replica to read from");
    let mut cs = RpcClient::connect(&stampfs_proto::net::Dialer::plain(), &replica.addr, TIMEOUT)
        .await
        .expect("connect");
    let (_, data): (ReadReply, Bytes) = cs
        .call_with_data(
            Read {
                token: chunk.token,
                offset: 0,
                len: chunk.length as u32,
            },
            Bytes::new(),
        )
        .await
        .expect("read");
    (chunk, data.to_vec())
}

async fn fsck(c: &mut RpcClient) -> FsckReport {
    c.call(Fsck { path: None }).await.expect("fsck")
}

#[tokio::test]
async fn diverged_replicas_keep_the_pipeline_head_at_one_more_version_and_the_rest_go_stale() {
    let cl = Cluster::start(|_| {}).await;
    let mut c = cl.client().await;
    let (g, contents) = diverged(&mut c, [11, 12, 13]).await;
    let h = g.token.handle;
    let members = ids(&g);

    let out = recover(&mut c).await;
    assert_eq!(
        out,
        RecoveryOutcome {
            path: "/f".into(),
            closed: true,
            old_version: Some(ChunkVersion(1)),
            new_version: Some(ChunkVersion(3)),
            length: LEN as u64,
        },
        "recovery took 2 for every replica and 3 for the kept one"
    );
    // The head is kept, finalized at 3; the others stay at 2, cut, never finalized.
    assert_replica(&cl, members[0], h, 3, ReplicaState::Finalized, &contents[0]);
    for i in 1..3 {
        assert_replica(&cl, members[i], h, 2, ReplicaState::Writing, &contents[i]);
    }
    // Only the kept replica is served, and reading the file gives its bytes.
    let (chunk, data) = read_file(&mut c).await;
    assert_eq!(
        (chunk.version, chunk.length, chunk.complete),
        (ChunkVersion(3), LEN as u64, true)
    );
    let served: Vec<_> = chunk.replicas.iter().map(|r| r.chunkserver).collect();
    assert_eq!(served, vec![members[0]]);
    assert!(data == contents[0], "the file reads as the kept replica");
    // fsck: the others are stale, the chunk under-replicated until health acts
    // (switched off in this cluster).
    let report = fsck(&mut c).await;
    assert_eq!(
        (
            report.total.stale_replicas,
            report.total.under_replicated,
            report.total.missing
        ),
        (2, 1, 0),
        "{report:?}"
    );
    // A stale replica refuses a reader at the master's version.
    let mut stale = RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        &g.pipeline[1].addr,
        TIMEOUT,
    )
    .await
    .expect("connect");
    let e = stale
        .call_with_data(
            Read {
                token: chunk.token,
                offset: 0,
                len: 10,
            },
            Bytes::new(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            remote(e),
            RemoteError::ReplicaStale {
                presented: ChunkVersion(3),
                current: ChunkVersion(2),
                ..
            }
        ),
        "a stale replica must not serve"
    );
    cl.shutdown().await;
}

#[tokio::test]
async fn replica_health_replaces_the_stale_replicas_with_copies_of_the_kept_one() {
    let cl = Cluster::start(|m| m.health_interval = Duration::from_millis(200)).await;
    let mut c = cl.client().await;
    // Only the last member holds other bytes: the head and the second agree, but
    // only the head is kept.
    let (g, contents) = diverged(&mut c, [21, 21, 22]).await;
    let h = g.token.handle;
    let members = ids(&g);
    let out = recover(&mut c).await;
    assert_eq!(
        (out.closed, out.new_version, out.length),
        (true, Some(ChunkVersion(3)), LEN as u64)
    );
    let (_, data) = read_file(&mut c).await;
    assert!(data == contents[0]);

    // Eventually (a generous bound, not a speed requirement) every chunkserver holds
    // a finalized copy of the kept replica at the master's version.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let loc = c
            .call(GetLocations {
                path: "/f".into(),
                client: B,
                access: false,
                caller: None,
            })
            .await
            .expect("locations");
        let listed = loc.chunks[0].replicas.len();
        let healthy = fsck(&mut c).await.healthy;
        let on_disk = members.iter().all(|id| {
            cl.try_header(*id, h).is_some_and(|hd| {
                (hd.version, hd.state, hd.length)
                    == (ChunkVersion(3), ReplicaState::Finalized, LEN as u64)
            })
        });
        if listed == 3 && healthy && on_disk {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica health did not repair the chunk: {listed} listed, healthy {healthy}, on disk {on_disk}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in &members {
        assert_replica(&cl, *id, h, 3, ReplicaState::Finalized, &contents[0]);
    }
    cl.shutdown().await;
}

#[tokio::test]
async fn with_the_pipeline_head_down_the_next_member_is_kept() {
    let mut cl = Cluster::start(|_| {}).await;
    let mut c = cl.client().await;
    let (g, contents) = diverged(&mut c, [31, 32, 33]).await;
    let h = g.token.handle;
    let members = ids(&g);
    cl.stop_chunkserver(members[0]).await;
    let out = recover(&mut c).await;
    assert_eq!(
        (out.closed, out.new_version, out.length),
        (true, Some(ChunkVersion(3)), LEN as u64)
    );
    assert_replica(&cl, members[1], h, 3, ReplicaState::Finalized, &contents[1]);
    assert_replica(&cl, members[2], h, 2, ReplicaState::Writing, &contents[2]);
    assert_replica(&cl, members[0], h, 1, ReplicaState::Writing, &contents[0]);
    let (chunk, data) = read_file(&mut c).await;
    let served: Vec<_> = chunk.replicas.iter().map(|r| r.chunkserver).collect();
    assert_eq!(served, vec![members[1]]);
    assert!(data == contents[1]);
    cl.shutdown().await;
}

#[tokio::test]
async fn identical_replicas_are_all_finalized_at_the_recovery_version() {
    let cl = Cluster::start(|_| {}).await;
    let mut c = cl.client().await;
    // Written alone too, but with the same bytes: nothing diverged.
    let (g, contents) = diverged(&mut c, [41, 41, 41]).await;
    let out = recover(&mut c).await;
    assert_eq!(
        (out.closed, out.new_version, out.length),
        (true, Some(ChunkVersion(2)), LEN as u64)
    );
    for id in ids(&g) {
        assert_replica(
            &cl,
            id,
            g.token.handle,
            2,
            ReplicaState::Finalized,
            &contents[0],
        );
    }
    assert!(fsck(&mut c).await.healthy);
    cl.shutdown().await;
}
