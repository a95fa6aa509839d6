//! One master per directory: a second `start` on a directory a running master holds
//! fails at once with `Error::DirLocked` (naming the directory and the holder's pid)
//! and touches nothing of the first; the lock goes with the first master's handle,
//! whether it shuts down cleanly or is dropped (a crash) — but not before a checkpoint
//! that was being written and trimmed at that moment has finished.

mod admin;

use stampfs_master::{start, Error, MasterConfig};
use stampfs_proto::*;
use std::time::Duration;

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
    let mut c = admin::connect(&first.addr().to_string(), &first.core().config.dir).await;
    c.call(Mkdir {
        path: "/still-here".into(),
        parents: false,
        attr: None,
        caller: None,
    })
    .await
    .expect("mkdir on the first master");
    drop(c);

    // Dropping the first handle (a crash) releases the lock; the next master replays
    // what the first acknowledged.
    drop(first);
    let second = start(cfg.clone()).await.expect("master after a crash");
    let mut c = admin::connect(&second.addr().to_string(), &second.core().config.dir).await;
    let st = c
        .call(Stat {
            path: "/still-here".into(),
            caller: None,
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

// ------------------------------------------------ a dropped master's checkpoint

/// Fail point (process-wide: no other test in this file writes a checkpoint) that
/// stalls a checkpoint after its file is in place and before its log trim.
const STALL: &str = "checkpoint-before-trim";

/// Enables [`STALL`] until dropped, so a failing test releases the stalled checkpoint
/// thread (the runtime waits for it at the end) instead of hanging.
struct Stalled;

impl Stalled {
    fn enable() -> Self {
        stampfs_master::fail::enable(STALL);
        Self
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        stampfs_master::fail::disable(STALL);
    }
}

/// The LSN of `dir`'s checkpoint, if it has one (read without `oplog::read_checkpoint`,
/// which would remove a checkpoint temp file being written).
fn checkpoint_lsn(dir: &std::path::Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join("checkpoint")).ok()?;
    if bytes.len() < 16 || &bytes[..8] != stampfs_master::oplog::CHECKPOINT_MAGIC {
        return None;
    }
    Some(u64::from_be_bytes(bytes[8..16].try_into().ok()?))
}

/// First LSNs of `dir`'s log segments.
fn segment_starts(dir: &std::path::Path) -> Vec<u64> {
    stampfs_master::oplog::segments(dir)
        .expect("list segments")
        .into_iter()
        .map(|(first, _)| first)
        .collect()
}

/// A checkpoint at `lsn` is in place but the segments it covers are not trimmed.
fn untrimmed(dir: &std::path::Path, lsn: u64) -> bool {
    segment_starts(dir).iter().any(|first| *first <= lsn)
}

/// Makes the next directory `/d<n>` and records it in `made`.
async fn mkdir_next(c: &mut RpcClient, made: &mut Vec<String>) {
    let path = format!("/d{}", made.len());
    c.call(Mkdir {
        path: path.clone(),
        parents: false,
        attr: None,
        caller: None,
    })
    .await
    .expect("mkdir");
    made.push(path);
}

/// A master dropped (a crash) while its checkpoint is between its write and its trim
/// keeps the directory locked: a second `start` fails with `DirLocked` for as long as
/// that work runs, and succeeds once it is done, on a quiescent directory (the trim
/// finished) with everything acknowledged intact. The fail point holds the
/// checkpoint's blocking work in flight for as long as the test wants, so nothing
/// here depends on timing.
#[tokio::test]
async fn a_dropped_master_keeps_its_directory_until_its_checkpoint_has_finished() {
    let stalled = Stalled::enable();
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(tmp.path().join("master"));
    // The operation log's checkpoint, written then trimmed by the master (the group's
    // snapshots are built and purged through openraft).
    cfg.log = stampfs_master::config::LogKind::Oplog;
    // The checkpoint worker writes one at its next poll after any mutation.
    cfg.checkpoint_log_size = 1;
    let dir = cfg.dir.clone();
    let first = start(cfg.clone()).await.expect("master");
    let mut c = admin::connect(&first.addr().to_string(), &first.core().config.dir).await;
    let mut made = Vec::new();
    for _ in 0..20 {
        mkdir_next(&mut c, &mut made).await;
    }
    // The checkpoint is caught in flight: its file is in place, its trim is not done.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let caught = loop {
        if let Some(lsn) = checkpoint_lsn(&dir).filter(|lsn| untrimmed(&dir, *lsn)) {
            break lsn;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no checkpoint stalled before its trim"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Records after the checkpoint's LSN, in the segment its rotation opened.
    for _ in 0..20 {
        mkdir_next(&mut c, &mut made).await;
    }
    drop(c);
    drop(first);

    // While the checkpoint's work runs, the directory stays locked.
    for _ in 0..10 {
        match start(cfg.clone()).await {
            Err(Error::DirLocked { dir: locked, .. }) => assert_eq!(locked, dir),
            Ok(_) => panic!("a master started while the dropped one's checkpoint was in flight"),
            Err(e) => panic!("expected DirLocked, got {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(untrimmed(&dir, caught), "the stalled trim has not run");

    // Once it is done, the next master starts, on a quiescent directory.
    drop(stalled);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let second = loop {
        match start(cfg.clone()).await {
            Ok(m) => break m,
            Err(Error::DirLocked { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("master did not start after the checkpoint finished: {e}"),
        }
    };
    assert_eq!(checkpoint_lsn(&dir), Some(caught));
    assert!(
        !untrimmed(&dir, caught),
        "the trim finished before the lock was released: {:?}",
        segment_starts(&dir)
    );
    let mut c = admin::connect(&second.addr().to_string(), &second.core().config.dir).await;
    for path in &made {
        let st = c
            .call(Stat {
                path: path.clone(),
                caller: None,
            })
            .await
            .unwrap_or_else(|e| panic!("{path} after the restart: {e}"));
        assert_eq!(st.kind, FileKind::Directory);
    }
    drop(c);
    second.shutdown().await.expect("shutdown");
}
