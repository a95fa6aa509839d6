//! Crash points (`stampfs_proto::crash`) armed from outside, as the nemesis arms them:
//! a real server started with `STAMPFS_CRASH_POINTS` kills itself where the point sits,
//! logging the point's name, and the cluster recovers once it is restarted disarmed.
//!
//! These tests need the `stampfs` binary built with `fault-injection`. The root
//! package's dev-dependency on itself turns it on for every test build, so the binary
//! under test (`CARGO_BIN_EXE_stampfs`) has it; the first test checks that it does.

mod common;

use common::{pattern, TestCluster, BIN};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

const POINTS_VAR: &str = stampfs_proto::crash::ENV_POINTS;
const SEED_VAR: &str = stampfs_proto::crash::ENV_SEED;

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `put - PATH`, feeds it `data` and waits until a reader sees all of it (put
/// hflushes when its input pauses: every replica acknowledged it).
fn start_writer(c: &TestCluster, path: &str, data: &[u8]) -> (Child, ChildStdin) {
    let mut w = c
        .cmd(&["put", "-", path])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn writer");
    let mut stdin = w.stdin.take().expect("stdin");
    stdin.write_all(data).expect("feed writer");
    stdin.flush().expect("flush");
    wait_for("the writer's bytes to be acknowledged", || {
        c.run(&["cat", path]).stdout.len() >= data.len()
    });
    (w, stdin)
}

fn last_version(c: &TestCluster, path: &str) -> u64 {
    c.stat_json(path)["chunks"]
        .as_array()
        .and_then(|a| a.last())
        .and_then(|ch| ch["version"].as_u64())
        .expect("last chunk version")
}

/// Asserts that `p` died by itself of SIGKILL (within a bounded wait) after logging
/// that `point` was hit. (A failing test prints every log: `TestCluster`'s drop.)
fn assert_crashed_at(p: &mut common::Proc, point: &str) {
    let status = p
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("{} did not die at {point}", p.name));
    assert_eq!(
        status.signal(),
        Some(nix::sys::signal::Signal::SIGKILL as i32),
        "{} died of SIGKILL, not {status}",
        p.name
    );
    let log = p.log_text();
    assert!(
        log.contains(&format!("crash point {point} hit")),
        "{} logged the crash point:\n{log}",
        p.name
    );
}

#[test]
fn the_binary_under_test_is_built_with_crash_points() {
    let out = Command::new(BIN).arg("--version").output().expect("run");
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.contains("fault-injection"),
        "{BIN} --version: {version}"
    );
}

#[test]
fn a_malformed_crash_point_variable_stops_the_server_at_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (value, says) in [
        ("recovery-after-bmup=1", "no crash point is called"),
        ("recovery-after-bump=2", "not a number in [0, 1]"),
        ("recovery-after-bump", "is not NAME=PROBABILITY"),
    ] {
        let out = Command::new(BIN)
            .args(["master", "--listen", "127.0.0.1:0", "--dir"])
            .arg(dir.path())
            .env(POINTS_VAR, value)
            .stdin(Stdio::null())
            .output()
            .expect("run master");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{value}: {err}");
        assert!(err.contains(says), "{value}: {err}");
    }
    assert!(
        std::fs::read_dir(dir.path()).expect("dir").next().is_none(),
        "the master stopped before touching its directory"
    );
}

/// The master dies between lease recovery's bump and its seal (`recovery-after-bump`):
/// the replicas took a version the old writer no longer holds, none is truncated, the
/// file is not closed. Restarted, the master resumes the recovery from its log and
/// closes the file with every acknowledged byte.
#[test]
fn a_master_killed_in_lease_recovery_recovers_the_file_after_a_restart() {
    let mut c = TestCluster::start();
    c.master.set_env(POINTS_VAR, Some("recovery-after-bump=1"));
    c.master.set_env(SEED_VAR, Some("1"));
    c.master.restart();
    c.wait_live(3);
    assert!(
        c.master.log_text().contains("crash points armed"),
        "{}",
        c.master.log_text()
    );

    let data = pattern(300_000, 7);
    let (mut w, stdin) = start_writer(&c, "/crash", &data);
    let before = last_version(&c, "/crash");
    w.kill().expect("SIGKILL the writer");
    let _ = w.wait();
    drop(stdin);

    // An explicit recovery reaches the crash point; the master dies under it.
    let out = c.run(&["recover", "/crash"]);
    assert!(
        !out.status.success(),
        "recover answered although the master died: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_crashed_at(&mut c.master, "recovery-after-bump");
    let log = c.master.log_text();
    assert!(
        log.contains("lease recovery: replicas raised to the new version"),
        "the bump was sent before the crash:\n{log}"
    );

    c.master.set_env(POINTS_VAR, None);
    c.master.restart();
    wait_for("the recovery to close the file", || {
        let out = c.run(&["recover", "/crash"]);
        String::from_utf8_lossy(&out.stdout).contains("closed at")
    });
    let st = c.stat_json("/crash");
    assert_eq!(st["state"], "closed", "{st}");
    assert_eq!(st["length"], data.len() as u64, "{st}");
    assert!(
        c.cat("/crash") == data,
        "the file is every acknowledged byte"
    );
    let after = last_version(&c, "/crash");
    assert!(
        after > before + 1,
        "the restarted recovery minted above the version the crashed one pushed \
         ({before} -> {after})"
    );
    wait_for("fsck to find the file healthy", || {
        common::fsck_json(&c, &["/crash"]).0 == Some(0)
    });
    let st = c.stat_json("/crash");
    let replicas = st["chunks"][0]["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 3, "three replicas serve again: {st}");
}

/// The master dies after logging a new chunk and before the bump that creates its
/// replicas (`new-chunk-before-bump`): the file is open with a last chunk that no
/// writer was ever granted and no chunkserver holds. Restarted, lease recovery drops
/// that empty chunk (nothing can have been acknowledged on it) instead of closing the
/// file with a chunk missing forever; the file is healthy and can be appended to.
/// (Found by the nemesis: such a file stayed unhealthy after the heal.)
#[test]
fn a_chunk_the_master_logged_but_never_created_is_dropped_by_lease_recovery() {
    let mut c = TestCluster::start();
    c.master
        .set_env(POINTS_VAR, Some("new-chunk-before-bump=1"));
    c.master.set_env(SEED_VAR, Some("1"));
    c.master.restart();
    c.wait_live(3);
    let out = c.run_stdin(&["put", "-", "/never"], &pattern(10_000, 3));
    assert!(
        !out.status.success(),
        "put answered although the master died"
    );
    assert_crashed_at(&mut c.master, "new-chunk-before-bump");

    c.master.set_env(POINTS_VAR, None);
    c.master.restart();
    c.wait_live(3);
    wait_for("the recovery to close the file", || {
        let out = c.run(&["recover", "/never"]);
        String::from_utf8_lossy(&out.stdout).contains("closed at")
    });
    let st = c.stat_json("/never");
    assert_eq!(st["state"], "closed", "{st}");
    assert_eq!(st["length"], 0, "{st}");
    assert_eq!(
        st["chunks"].as_array().map(Vec::len),
        Some(0),
        "the never-created chunk is gone from the file: {st}"
    );
    let (code, report) = common::fsck_json(&c, &["/never"]);
    assert_eq!(code, Some(0), "fsck finds the file healthy: {report}");
    // And the file takes an append like any closed file.
    let data = pattern(100_000, 9);
    let out = c.run_stdin(&["append", "-", "/never"], &data);
    assert!(
        out.status.success(),
        "append: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(c.cat("/never") == data);
}

/// A chunkserver dies after making a new chunk's first header durable and before
/// answering the bump (`replica-bump-before-reply`). The write goes on without it;
/// restarted, its replica (at the version, without the bytes) is short and is replaced.
#[test]
fn a_chunkserver_killed_before_answering_a_bump_leaves_a_replica_that_is_replaced() {
    let mut c = TestCluster::start();
    c.chunkservers[0].set_env(POINTS_VAR, Some("replica-bump-before-reply=1"));
    c.chunkservers[0].restart();
    c.wait_live(3);
    let data = pattern(200_000, 8);
    c.put_bytes("/bumped", &data, &[]);
    assert_crashed_at(&mut c.chunkservers[0], "replica-bump-before-reply");
    assert!(c.cat("/bumped") == data);

    c.chunkservers[0].set_env(POINTS_VAR, None);
    c.chunkservers[0].restart();
    wait_for("fsck to find the file healthy", || {
        common::fsck_json(&c, &["/bumped"]).0 == Some(0)
    });
    let st = c.stat_json("/bumped");
    let replicas = st["chunks"][0]["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 3, "three replicas serve again: {st}");
    assert!(c.cat("/bumped") == data);
}

/// The files in a chunkserver's data directory (and its replica subdirectories) that
/// end with `suffix`.
fn files_ending(p: &common::Proc, suffix: &str) -> Vec<std::path::PathBuf> {
    common::data_files_ending(p, suffix)
}

/// A re-replication target dies with the whole copy sealed in its temporary file,
/// before renaming it into place (`copy-before-rename`). Restarted, it has no replica
/// (start-up removes the temporary file), and the copy is ordered again.
#[test]
fn a_copy_target_killed_before_the_rename_has_no_replica_and_gets_the_copy_again() {
    let mut c = TestCluster::start();
    let data = pattern(300_000, 9);
    c.put_bytes("/copied", &data, &[]);
    let t = c.add_chunkserver();
    c.chunkservers[t].set_env(POINTS_VAR, Some("copy-before-rename=1"));
    c.chunkservers[t].restart();
    c.wait_live(4);
    // A replica's chunkserver goes away: once it is dead (--dead-after), the only
    // place for a new copy is the armed chunkserver.
    c.chunkservers[0].kill();
    assert_crashed_at(&mut c.chunkservers[t], "copy-before-rename");
    let target = &c.chunkservers[t];
    assert_eq!(
        files_ending(target, ".tmp").len(),
        1,
        "the sealed copy is a temp file"
    );
    assert!(files_ending(target, ".chunk").is_empty(), "not in place");

    c.chunkservers[t].set_env(POINTS_VAR, None);
    c.chunkservers[t].restart();
    wait_for("the copy to be made again", || {
        !files_ending(&c.chunkservers[t], ".chunk").is_empty()
            && common::fsck_json(&c, &["/copied"]).0 == Some(0)
    });
    assert!(files_ending(&c.chunkservers[t], ".tmp").is_empty());
    assert!(c.cat("/copied") == data);
}

/// Found by the nemesis (seed 6, the slot file): a chunkserver applies the version
/// bump of a reopen but its answer never reaches the master (here it dies right after
/// the bump is durable, `replica-bump-before-reply`). The writer overwrites bytes in
/// place under that version without it; restarted, the chunkserver reports a replica
/// at the granted version and the right length, with the old bytes, which was taken
/// for current (an overwrite changes no length, so "short" does not catch it) and
/// served. Now a grant whose bump some target did not answer is bumped once more over
/// those that did, and the silent one is stale.
#[test]
fn a_replica_that_took_a_bump_without_answering_is_stale_after_an_overwrite() {
    let mut c = TestCluster::start();
    let old = pattern(100_000, 41);
    c.put_bytes("/ow", &old, &[]);
    c.chunkservers[0].set_env(POINTS_VAR, Some("replica-bump-before-reply=1"));
    c.chunkservers[0].restart();
    c.wait_live(3);
    let new = pattern(100_000, 42);
    let out = c.run_stdin(&["write", "/ow", "--offset", "0", "-"], &new);
    assert!(
        out.status.success(),
        "write: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_crashed_at(&mut c.chunkservers[0], "replica-bump-before-reply");
    assert!(c.cat("/ow") == new);
    assert!(
        c.master
            .log_text()
            .contains("did not answer the version bump"),
        "{}",
        c.master.log_text()
    );

    c.chunkservers[0].set_env(POINTS_VAR, None);
    c.chunkservers[0].restart();
    wait_for("fsck to find the file healthy with three replicas", || {
        common::fsck_json(&c, &["/ow"]).0 == Some(0)
            && c.stat_json("/ow")["chunks"][0]["replicas"]
                .as_array()
                .is_some_and(|r| r.len() == 3)
    });
    // Every replica the master hands out holds the new bytes.
    let rt = common::runtime();
    rt.block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let v = stampfs_nemesis::replicas::check_replicas(&client, "/ow", None)
            .await
            .expect("replica check");
        assert!(v.is_empty(), "{v:?}");
        let locs = client.locations("/ow").await.expect("locations");
        for r in &locs.chunks[0].replicas {
            let (_, bytes) = client
                .read_replica(&r.addr, locs.chunks[0].token, u64::MAX)
                .await
                .expect("read replica");
            assert!(
                bytes == new,
                "replica on {} holds other bytes: {} bytes, old {}, version {}, replicas {:?}\n{}",
                r.chunkserver,
                bytes.len(),
                bytes == old,
                locs.chunks[0].version,
                locs.chunks[0].replicas,
                c.logs()
            );
        }
    });
}
