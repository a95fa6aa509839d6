//! The master on the group's log (`--log group`, a group of one): an operation-log
//! directory moves to it and stays there, a binary that knows only the operation log
//! refuses the moved directory, and the group's checkpoints (openraft snapshots)
//! carry the state across crashes.

mod common;

use common::admin;

use stampfs_master::config::LogKind;
use stampfs_master::raft::snapshot;
use stampfs_master::{start, Error, MasterConfig, MasterHandle};
use stampfs_proto::*;
use std::path::Path;
use std::time::Duration;

fn config(dir: &Path, log: LogKind) -> MasterConfig {
    let mut cfg = MasterConfig::new(dir.to_path_buf());
    cfg.log = log;
    cfg
}

async fn mkdir(m: &MasterHandle, path: &str) {
    let mut c = admin::connect(&m.addr().to_string(), &m.core().config.dir).await;
    c.call(Mkdir {
        path: path.into(),
        parents: false,
        attr: None,
        caller: None,
    })
    .await
    .unwrap_or_else(|e| panic!("mkdir {path}: {e}"));
}

async fn listing(m: &MasterHandle) -> Vec<String> {
    let mut c = admin::connect(&m.addr().to_string(), &m.core().config.dir).await;
    let mut names: Vec<String> = c
        .call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.path)
        .filter(|p| p != "/.trash")
        .collect();
    names.sort();
    names
}

fn dirs(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|n| format!("/{n}")).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_log_directory_moves_to_the_group_and_stays_there() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("master");
    // Written on the operation log, with a checkpoint and records after it; then a
    // crash (the handle dropped).
    let m = start(config(&dir, LogKind::Oplog))
        .await
        .expect("oplog master");
    for n in ["a", "b", "c"] {
        mkdir(&m, &format!("/{n}")).await;
    }
    assert!(m.checkpoint().await.expect("checkpoint"));
    mkdir(&m, "/d").await;
    drop(m);
    tokio::time::sleep(Duration::from_millis(50)).await;

    // Started on the group: the same namespace, and it goes on.
    let m = start(config(&dir, LogKind::Group))
        .await
        .expect("group master");
    assert_eq!(listing(&m).await, dirs(&["a", "b", "c", "d"]));
    mkdir(&m, "/e").await;
    m.shutdown().await.expect("shutdown");

    // The directory is a group's now; the operation log's files are set aside, and
    // what a binary that knows only them reads is a refusal, not an empty namespace.
    assert!(dir.join("raft").join("snapshot").exists());
    let aside: Vec<String> = std::fs::read_dir(dir.join("pre-raft"))
        .expect("pre-raft")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(aside.iter().any(|n| n == "checkpoint"), "{aside:?}");
    assert!(aside.iter().any(|n| n.starts_with("oplog.")), "{aside:?}");
    assert!(stampfs_master::oplog::segments(&dir)
        .expect("segments")
        .is_empty());
    match stampfs_master::oplog::read_checkpoint(&dir) {
        Err(Error::CorruptCheckpoint { reason, .. }) => {
            assert!(reason.contains("--log group"), "{reason}")
        }
        other => panic!("the marker was read as {other:?}"),
    }

    // `--log oplog` on a group's directory still serves from the group.
    let m = start(config(&dir, LogKind::Oplog)).await.expect("restart");
    assert_eq!(listing(&m).await, dirs(&["a", "b", "c", "d", "e"]));
    mkdir(&m, "/f").await;
    drop(m);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let m = start(config(&dir, LogKind::Group)).await.expect("restart");
    assert_eq!(listing(&m).await, dirs(&["a", "b", "c", "d", "e", "f"]));
    assert!(
        !dir.join("pre-raft.1").exists(),
        "nothing set aside a second time"
    );
    m.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_checkpoints_are_snapshots_that_carry_the_state_across_crashes() {
    common::init_tracing();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("master");
    let raft = dir.join("raft");
    let mut cfg = config(&dir, LogKind::Group);
    // The checkpoint worker takes one at its next poll after any change.
    cfg.checkpoint_log_size = 1;
    let m = start(cfg.clone()).await.expect("group master");
    // Formed with a snapshot at the formation's log id (or already past it: the worker
    // may have taken one of the start's own records by now).
    let formed = snapshot::read(&raft).expect("read").expect("formed");
    assert!(formed.meta.last_log_id >= Some(snapshot::FORMED_AT));
    let mut made = Vec::new();
    for i in 0..20 {
        let p = format!("/s{i:02}");
        mkdir(&m, &p).await;
        made.push(p);
    }
    // The worker's snapshot, then one asked for: each covers what was committed.
    let made_lsn = m.core().state().last_lsn;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let first = loop {
        let s = snapshot::read(&raft).expect("read").expect("snapshot");
        if s.lsn >= made_lsn {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the worker wrote no snapshot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(first.lsn > formed.lsn);
    assert!(first.meta.last_log_id > formed.meta.last_log_id);
    mkdir(&m, "/after").await;
    made.push("/after".into());
    let lsn = m.core().state().last_lsn;
    m.checkpoint().await.expect("checkpoint");
    let second = snapshot::read(&raft).expect("read").expect("snapshot");
    assert!(second.lsn >= lsn, "{} < {lsn}", second.lsn);
    assert!(second.meta.last_log_id >= first.meta.last_log_id);
    // Records after the snapshot, then a crash: the restart replays them on top.
    mkdir(&m, "/late").await;
    made.push("/late".into());
    drop(m);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A snapshot cut short by the crash: readers leave it alone (it could be one being
    // written), the next start removes it.
    let unfinished = raft.join("snapshot.tmp");
    std::fs::write(&unfinished, b"STMPSNP1 cut short").expect("write");
    assert!(snapshot::read(&raft).expect("read").is_some());
    assert!(
        unfinished.exists(),
        "a reader removed a snapshot in progress"
    );
    let m = start(cfg).await.expect("restart");
    assert!(!unfinished.exists());
    made.sort();
    assert_eq!(listing(&m).await, made);
    assert!(m.core().state().last_lsn > second.lsn);
    m.shutdown().await.expect("shutdown");
}
