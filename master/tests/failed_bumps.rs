//! Review finding: an `append` whose version bump reaches no replica leaves the last
//! chunk of a *closed* file at a version no replica holds. `revert_reopen` closes the
//! file again, but the chunk keeps the new version, so every replica (which holds every
//! committed byte, finalized) is classified stale and never handed out again: the
//! file's committed data becomes unreadable for good.

mod common;

use common::*;
use stampfs_proto::*;
use std::time::Duration;

#[tokio::test]
async fn a_failed_append_does_not_make_committed_data_unreadable() {
    let mut cl = Cluster::start(|c| {
        // The master keeps believing the chunkservers are live for a while after they
        // stop (the window every real failure has before `dead_after` passes).
        c.dead_after = Duration::from_secs(10);
        c.command_timeout = Duration::from_millis(500);
    })
    .await;
    let mut c = cl.client().await;
    let g = create_with_chunk(&mut c, "/f").await;
    let h = g.token.handle;
    let data = pattern(100_000, 7);
    let mut s = Stream::open(&g).await;
    assert_eq!(s.write_acked(&data, 3).await, data.len() as u64);
    drop(s);
    c.call(Close {
        path: "/f".into(),
        client: A,
        last: Some(ChunkCommit {
            handle: h,
            length: data.len() as u64,
        }),
        keep_mtime: false,
    })
    .await
    .expect("close");
    let before = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    assert_eq!(before.chunks[0].replicas.len(), 3);

    // Every chunkserver holding the chunk goes away briefly; an append in that window
    // cannot push its bump and fails.
    let ids = ids(&g);
    for id in &ids {
        cl.stop_chunkserver(*id).await;
    }
    let err = c
        .call(Append {
            path: "/f".into(),
            client: B,
            caller: None,
        })
        .await
        .expect_err("the append cannot reach any replica");
    eprintln!("append failed as expected: {err}");

    // They come back with their replicas intact (finalized, every committed byte).
    for id in &ids {
        cl.restart_chunkserver(*id).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    for id in &ids {
        let hd = cl.header(*id, h);
        assert_eq!(hd.length, data.len() as u64);
        assert_eq!(cl.data(*id, h, data.len() as u64), data);
    }
    let st = c
        .call(Stat {
            path: "/f".into(),
            caller: None,
        })
        .await
        .expect("stat");
    assert_eq!(st.state, FileState::Closed);
    assert_eq!(st.length, data.len() as u64);
    let after = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    assert!(
        !after.chunks[0].replicas.is_empty(),
        "the closed file's only chunk is now at version {} (was {}) and no replica is \
         handed out, although all three hold every committed byte",
        after.chunks[0].version,
        before.chunks[0].version,
    );
    cl.shutdown().await;
}

/// Review finding: an `UpdatePipeline` whose bump reaches no survivor logs the new
/// version all the same. Lease recovery then takes that version as the writer's
/// (`recovery::decide` uses `info.version` for an open file), so the survivors, which
/// hold every acknowledged byte at the writer's real version, are "stale": the file is
/// closed at the committed length and the acknowledged bytes are dropped (invariant 5).
#[tokio::test]
async fn lease_recovery_after_a_failed_pipeline_update_keeps_acknowledged_bytes() {
    let mut cl = Cluster::start(|c| {
        c.dead_after = Duration::from_secs(10);
        c.command_timeout = Duration::from_millis(500);
    })
    .await;
    let mut c = cl.client().await;
    let g = create_with_chunk(&mut c, "/g").await;
    let h = g.token.handle;
    let data = pattern(100_000, 9);
    let mut s = Stream::open(&g).await;
    assert_eq!(s.write_acked(&data, 3).await, data.len() as u64);
    drop(s);

    // The whole pipeline becomes unreachable for a moment; the writer asks for a
    // pipeline update, which fails.
    let ids = ids(&g);
    for id in &ids {
        cl.stop_chunkserver(*id).await;
    }
    let err = c
        .call(UpdatePipeline {
            path: "/g".into(),
            client: A,
            handle: h,
            survivors: ids.clone(),
            acked_length: data.len() as u64,
        })
        .await
        .expect_err("no survivor takes the bump");
    eprintln!("pipeline update failed as expected: {err}");
    for id in &ids {
        cl.restart_chunkserver(*id).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;

    let out = c
        .call(RecoverLease {
            path: "/g".into(),
            client: OP,
            accept_loss: false,
            caller: None,
        })
        .await
        .expect("recover");
    eprintln!("recovery outcome: {out:?}");
    let st = wait_closed(&mut c, "/g").await;
    assert_eq!(
        st.length,
        data.len() as u64,
        "lease recovery cut {} acknowledged bytes that all three replicas hold",
        data.len() as u64 - st.length
    );
    cl.shutdown().await;
}
