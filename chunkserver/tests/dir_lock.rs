//! One chunkserver per data directory: a second `start` on a directory a running
//! chunkserver holds fails at once with `Error::DirLocked` (naming the directory and
//! the holder's pid) and touches nothing of the first; the directory is free again once
//! the first has shut down, or has been dropped (a crash) and its tasks have stopped.

mod common;

use common::*;
use stampfs_chunkserver::{start, Error, IoEngineKind};
use stampfs_proto::{ChunkVersion, ErrorCode};
use std::time::Duration;

/// Starts a chunkserver on `config`, retrying while the directory is still held by a
/// dropped one whose cancelled tasks have not all stopped yet.
async fn start_when_free(
    config: stampfs_chunkserver::ChunkserverConfig,
) -> stampfs_chunkserver::ChunkserverHandle {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match start(config.clone()).await {
            Ok(cs) => return cs,
            Err(Error::DirLocked { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("chunkserver did not start on the released directory: {e}"),
        }
    }
}

#[tokio::test]
async fn a_second_chunkserver_on_the_same_directory_fails_and_leaves_the_first_alone() {
    let cluster = Cluster::new();
    let dir = cluster.dir(1);
    let first = cluster.start(1, IoEngineKind::Threads).await;
    bump(&cluster, &first, 21, 1).await;
    let addr_file = dir.join(stampfs_chunkserver::ADDR_FILE);
    let id_file = dir.join(stampfs_chunkserver::ID_FILE);
    let first_addr = std::fs::read_to_string(&addr_file).expect("addr file");
    let first_id = std::fs::read_to_string(&id_file).expect("id file");

    let e = start(cluster.config(1, IoEngineKind::Threads))
        .await
        .expect_err("a second chunkserver on the same directory");
    match &e {
        Error::DirLocked {
            dir: locked,
            holder,
        } => {
            assert_eq!(locked, &dir);
            assert_eq!(*holder, Some(std::process::id()));
        }
        other => panic!("expected DirLocked, got {other}"),
    }
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "chunkserver directory {} is in use by another chunkserver (pid {})",
            dir.display(),
            std::process::id()
        )),
        "{text}"
    );
    assert_eq!(e.code(), ErrorCode::Unavailable);
    assert_eq!(e.to_remote().code(), ErrorCode::Unavailable);

    // The first chunkserver still owns its files and serves its replica.
    assert_eq!(
        std::fs::read_to_string(&addr_file).expect("addr file"),
        first_addr
    );
    assert_eq!(
        std::fs::read_to_string(&id_file).expect("id file"),
        first_id
    );
    let (r, _) = read(&first, cluster.token(21, 1), 0, 1)
        .await
        .expect("the first chunkserver still serves");
    assert_eq!(r.version, ChunkVersion(1));

    // A clean shutdown releases the directory at once; the next one finds the replica.
    first.shutdown().await.expect("shutdown");
    let second = start(cluster.config(1, IoEngineKind::Threads))
        .await
        .expect("a chunkserver after a clean shutdown");
    let (r, _) = read(&second, cluster.token(21, 1), 0, 1)
        .await
        .expect("replica after restart");
    assert_eq!(r.version, ChunkVersion(1));
    // Still exclusive while it runs.
    assert!(matches!(
        start(cluster.config(1, IoEngineKind::Threads)).await,
        Err(Error::DirLocked { .. })
    ));

    // Dropping the handle (a crash) releases it too, once its tasks have stopped.
    drop(second);
    let third = start_when_free(cluster.config(1, IoEngineKind::Threads)).await;
    let (r, _) = read(&third, cluster.token(21, 1), 0, 1)
        .await
        .expect("replica after a crash");
    assert_eq!(r.version, ChunkVersion(1));
    third.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn chunkservers_on_different_directories_do_not_interfere() {
    let cluster = Cluster::new();
    let a = cluster.start(1, IoEngineKind::Threads).await;
    let b = cluster.start(2, IoEngineKind::Threads).await;
    a.shutdown().await.expect("shutdown a");
    b.shutdown().await.expect("shutdown b");
}
