//! A master crash in the middle of lease recovery, after the replicas were bumped,
//! truncated and finalized but before the commit record: replay brings the file back
//! in recovery and the worker finishes it at a fresh version, never a lower one.
//!
//! Uses the `fail-points` feature (enabled for this crate's tests); fail points are
//! process-wide, so this file holds the only test that enables one.

mod common;

use common::*;
use stampfs_master::fail;
use stampfs_proto::*;

#[tokio::test]
async fn a_crash_before_the_commit_resumes_and_finishes_the_recovery() {
    let mut cl = Cluster::start(|_| {}).await;
    let mut c = cl.client().await;
    let g = create_with_chunk(&mut c, "/f").await;
    let h = g.token.handle;
    let data = pattern(120_000, 3);
    let mut stream = Stream::open(&g).await;
    stream.write_acked(&data, 3).await;

    fail::enable("recovery-before-commit");
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
        (out.closed, out.old_version, out.new_version, out.length),
        (false, Some(ChunkVersion(1)), Some(ChunkVersion(2)), 0),
        "the attempt stopped before its commit"
    );
    // Everything but the commit happened: the replicas are sealed at version 2 and
    // the writer is already fenced.
    for id in ids(&g) {
        let hd = cl.header(id, h);
        assert_eq!(
            (hd.version, hd.state, hd.length),
            (ChunkVersion(2), ReplicaState::Finalized, 120_000)
        );
    }
    let ack = stream.send(b"late").await;
    assert_eq!(
        ack.replicas[0].result,
        Err(RemoteError::StaleToken {
            handle: h,
            presented: ChunkVersion(1),
            current: ChunkVersion(2),
        })
    );

    // Crash now (the worker would retry after its back-off otherwise).
    cl.restart_master(true).await;
    fail::disable("recovery-before-commit");
    let mut c = cl.client().await;
    let st = wait_closed(&mut c, "/f").await;
    assert_eq!(st.length, 120_000);
    let v = cl.header(ids(&g)[0], h).version;
    assert!(
        v >= ChunkVersion(3),
        "a fresh version after the restart: {v}"
    );
    for id in ids(&g) {
        let hd = cl.header(id, h);
        assert_eq!(
            (hd.version, hd.state, hd.length),
            (v, ReplicaState::Finalized, 120_000)
        );
        assert_eq!(cl.data(id, h, 120_000), data);
    }
    // Versions keep growing: the next append is above the recovered one.
    let g2 = c
        .call(Append {
            path: "/f".into(),
            client: B,
            caller: None,
        })
        .await
        .expect("append after recovery")
        .last_chunk
        .expect("re-leased");
    assert_eq!(g2.token.version, v.next());
    assert_eq!(g2.chunk_offset, 120_000);
    cl.shutdown().await;
}
