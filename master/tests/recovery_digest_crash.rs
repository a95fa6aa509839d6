//! A master crash in the middle of a recovery whose replicas diverged: after the
//! extra version for the kept replica is durable, before it is pushed. Replay brings
//! the file back in recovery with its chunk at that version; the resumed attempt
//! bumps every pipeline replica again, compares again, and keeps the pipeline head
//! at a fresh version, the others one below it.
//!
//! Uses the `fail-points` feature (enabled for this crate's tests); fail points are
//! process-wide, so this file holds the only test that enables this one.

mod common;

use common::*;
use stampfs_master::fail;
use stampfs_proto::*;

const LEN: usize = 90_000;

#[tokio::test]
async fn a_crash_after_the_kept_version_resumes_and_keeps_the_head_again() {
    let mut cl = Cluster::start(|_| {}).await;
    let mut c = cl.client().await;
    let g = create_with_chunk(&mut c, "/f").await;
    let h = g.token.handle;
    let members = ids(&g);
    let contents: Vec<Vec<u8>> = (0..3).map(|i| pattern(LEN, 50 + i)).collect();
    for (i, data) in contents.iter().enumerate() {
        let mut s = Stream::open_alone(&g, i).await;
        assert_eq!(s.write_acked(data, 1).await, LEN as u64);
    }

    fail::enable("recovery-after-kept-version");
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
        (out.closed, out.old_version, out.new_version),
        (false, Some(ChunkVersion(1)), Some(ChunkVersion(3))),
        "the attempt stopped after minting the kept replica's version"
    );
    // Every replica took the attempt's version 2; none took 3.
    for (id, data) in members.iter().zip(&contents) {
        let hd = cl.header(*id, h);
        assert_eq!(
            (hd.version, hd.state, hd.length),
            (ChunkVersion(2), ReplicaState::Writing, LEN as u64)
        );
        assert_eq!(&cl.data(*id, h, LEN as u64), data);
    }

    cl.restart_master(true).await;
    fail::disable("recovery-after-kept-version");
    let mut c = cl.client().await;
    let st = wait_closed(&mut c, "/f").await;
    assert_eq!(st.length, LEN as u64);
    let kept = cl.header(members[0], h);
    assert!(
        kept.version >= ChunkVersion(5),
        "a fresh attempt (4) and its kept version (5) at least: {}",
        kept.version
    );
    assert_eq!(
        (kept.state, kept.length),
        (ReplicaState::Finalized, LEN as u64)
    );
    assert_eq!(cl.data(members[0], h, LEN as u64), contents[0]);
    for (id, data) in members.iter().zip(&contents).skip(1) {
        let hd = cl.header(*id, h);
        assert_eq!(
            (hd.version, hd.state, hd.length),
            (
                ChunkVersion(kept.version.0 - 1),
                ReplicaState::Writing,
                LEN as u64
            ),
            "left at the resumed attempt's version, stale"
        );
        assert_eq!(&cl.data(*id, h, LEN as u64), data);
    }
    let loc = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    assert_eq!(loc.chunks[0].version, kept.version);
    let served: Vec<_> = loc.chunks[0]
        .replicas
        .iter()
        .map(|r| r.chunkserver)
        .collect();
    assert_eq!(served, vec![members[0]]);
    cl.shutdown().await;
}
