//! One master per directory: a second `start` on a directory a running master holds
//! fails at once with `Error::DirLocked` (naming the directory and the holder's pid)
//! and touches nothing of the first; the lock goes with the first master's handle,
//! whether it shuts down cleanly or is dropped (a crash).

use stampfs_master::{start, Error, MasterConfig};
use stampfs_proto::*;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);

fn config(dir: std::path::PathBuf) -> MasterConfig {
    let mut cfg = MasterConfig::new(dir);
    cfg.health_interval = Duration::ZERO;
    cfg
}

#[tokio::test]
async fn a_second_master_on_the_same_directory_fails_and_leaves_the_first_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path().join("master"));
    let first = start(cfg.clone()).await.expect("first master");
    let addr_file = cfg.dir.join("addr");
    let first_addr = std::fs::read_to_string(&addr_file).expect("addr file");

    let e = start(cfg.clone())
        .await
        .expect_err("a second master on the same directory");
    match &e {
        Error::DirLocked { dir, holder } => {
            assert_eq!(dir, &cfg.dir);
            assert_eq!(*holder, Some(std::process::id()));
        }
        other => panic!("expected DirLocked, got {other}"),
    }
    let text = e.to_string();
    assert!(text.contains(&cfg.dir.display().to_string()), "{text}");
    assert!(
        text.contains(&format!("pid {}", std::process::id())),
        "{text}"
    );
    assert_eq!(e.code(), ErrorCode::Unavailable);
    assert_eq!(e.to_remote().code(), ErrorCode::Unavailable);

    // The first master still owns its address file and serves.
    assert_eq!(
        std::fs::read_to_string(&addr_file).expect("addr file"),
        first_addr
    );
    let mut c = RpcClient::connect(&first.addr().to_string(), TIMEOUT)
        .await
        .expect("connect");
    c.call(Mkdir {
        path: "/still-here".into(),
        parents: false,
    })
    .await
    .expect("mkdir on the first master");
    drop(c);

    // Dropping the first handle (a crash) releases the lock; the next master replays
    // what the first acknowledged.
    drop(first);
    let second = start(cfg.clone()).await.expect("master after a crash");
    let mut c = RpcClient::connect(&second.addr().to_string(), TIMEOUT)
        .await
        .expect("connect");
    let st = c
        .call(Stat {
            path: "/still-here".into(),
        })
        .await
        .expect("stat");
    assert_eq!(st.kind, FileKind::Directory);
    drop(c);
    // Still exclusive, and released again by a clean shutdown.
    assert!(matches!(
        start(cfg.clone()).await,
        Err(Error::DirLocked { .. })
    ));
    second.shutdown().await.expect("shutdown");
    let third = start(cfg.clone())
        .await
        .expect("master after a clean shutdown");
    third.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn masters_on_different_directories_do_not_interfere() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = start(config(tmp.path().join("a"))).await.expect("master a");
    let b = start(config(tmp.path().join("b"))).await.expect("master b");
    a.shutdown().await.expect("shutdown a");
    b.shutdown().await.expect("shutdown b");
}
