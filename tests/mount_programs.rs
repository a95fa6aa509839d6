//! Real programs on a real FUSE mount, now that the mount writes anywhere in a file's
//! last chunk and truncates within it: sqlite3 creates, updates and checks a database
//! (rollback journal, in-place page writes, fsync), git makes two commits and
//! `git fsck` finds the repository sound. `.ci/run` installs both programs; elsewhere
//! a missing one skips the test, saying so. (rsync is not tried yet: it is not on
//! the machine this was written on.)

mod common;

use common::mount::{fuse_or_skip, MountGuard};
use common::TestCluster;
use std::process::{Command, Output, Stdio};

/// Runs `program` in `dir` and asserts success; returns stdout.
fn run_in(dir: &std::path::Path, program: &str, args: &[&str]) -> String {
    let out: Output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// True when `program` can run here; panics in CI when it cannot.
fn have(test: &str, program: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: {program} is required in CI (.ci/run installs it)"
        );
        println!("SKIPPED: {test}: {program} is not installed");
    }
    found
}

#[test]
fn sqlite3_creates_updates_and_checks_a_database_on_the_mount() {
    let test = "sqlite3_creates_updates_and_checks_a_database_on_the_mount";
    if !fuse_or_skip(test) || !have(test, "sqlite3") {
        return;
    }
    let c = TestCluster::start();
    let m = MountGuard::start(&c);
    let sql = "create table t(a integer primary key, b text); \
               insert into t(b) values ('one'), ('two'), ('three'); \
               update t set b = 'TWO' where a = 2; \
               delete from t where a = 3; \
               insert into t(b) select 'row ' || a from t;";
    run_in(&m.root, "sqlite3", &["test.db", sql]);
    let got = run_in(
        &m.root,
        "sqlite3",
        &["test.db", "select a, b from t order by a;"],
    );
    assert_eq!(got, "1|one\n2|TWO\n3|row 1\n4|row 2\n", "{got}");
    let check = run_in(&m.root, "sqlite3", &["test.db", "pragma integrity_check;"]);
    assert_eq!(check.trim(), "ok");
    // The rollback journal is gone and the database is closed at the master.
    assert!(!m.path("test.db-journal").exists());
    common::wait_for("the database to be closed", || {
        c.stat_json("/test.db")["state"] == "closed"
    });
    assert_eq!(
        std::fs::read(m.path("test.db")).expect("read through the mount"),
        c.cat("/test.db")
    );
}

#[test]
fn git_commits_twice_and_fscks_clean_on_the_mount() {
    let test = "git_commits_twice_and_fscks_clean_on_the_mount";
    if !fuse_or_skip(test) || !have(test, "git") {
        return;
    }
    let c = TestCluster::start();
    let m = MountGuard::start(&c);
    let repo = m.path("repo");
    std::fs::create_dir(&repo).expect("mkdir");
    let git = |args: &[&str]| {
        let mut all = vec!["-c", "user.name=t", "-c", "user.email=t@t"];
        all.extend_from_slice(args);
        run_in(&repo, "git", &all)
    };
    git(&["init", "-q", "."]);
    std::fs::write(repo.join("a.txt"), b"hello\n").expect("write");
    git(&["add", "a.txt"]);
    git(&["commit", "-q", "-m", "first"]);
    std::fs::write(repo.join("a.txt"), b"hello\nmore\n").expect("rewrite");
    git(&["commit", "-q", "-a", "-m", "second"]);
    let log = git(&["log", "--format=%s"]);
    assert_eq!(log, "second\nfirst\n");
    git(&["fsck", "--strict"]);
    assert_eq!(git(&["show", "HEAD:a.txt"]), "hello\nmore\n");
}
