//! Real programs on a real FUSE mount, now that the mount writes anywhere in a file's
//! last chunk and truncates within it: sqlite3 creates, updates and checks a database
//! (rollback journal, in-place page writes, fsync; 1000 inserts in ten transactions,
//! reopened and counted by a fresh process), git makes three commits, a branch and
//! checkouts both ways, and `git fsck` finds the repository sound. `.ci/run` installs both programs; elsewhere
//! a missing one skips the test, saying so. (rsync, tar and cp -a are in
//! `tests/mount_attrs.rs`.)

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

    // 1000 inserts in ten transactions, a checked database, and a fresh process that
    // reopens it and counts every row.
    let mut script = String::from("create table big(k integer primary key, v text);");
    for t in 0..10 {
        script.push_str("begin;");
        for i in 0..100 {
            let k = t * 100 + i;
            script.push_str(&format!(
                "insert into big(v) values ('value {k} {}');",
                "x".repeat(k % 50)
            ));
        }
        script.push_str("commit;");
    }
    run_in(&m.root, "sqlite3", &["big.db", &script]);
    let check = run_in(&m.root, "sqlite3", &["big.db", "pragma integrity_check;"]);
    assert_eq!(check.trim(), "ok");
    let count = run_in(
        &m.root,
        "sqlite3",
        &["big.db", "select count(*), sum(length(v)) from big;"],
    );
    let want_len: usize = (0..1000usize)
        .map(|k| format!("value {k} {}", "x".repeat(k % 50)).len())
        .sum();
    assert_eq!(count.trim(), format!("1000|{want_len}"));

    // Write-ahead logging: the -wal file takes the commits, the -shm file is a shared
    // mapping both processes write through.
    let wal = "pragma journal_mode=wal; create table w(a); \
               begin; insert into w values (1), (2), (3); commit; \
               insert into w select a + 3 from w;";
    assert_eq!(run_in(&m.root, "sqlite3", &["wal.db", wal]).trim(), "wal");
    let got = run_in(
        &m.root,
        "sqlite3",
        &[
            "wal.db",
            "pragma integrity_check; select count(*), sum(a) from w;",
        ],
    );
    assert_eq!(got, "ok\n6|21\n");
}

#[test]
fn git_commits_branches_checks_out_and_fscks_clean_on_the_mount() {
    let test = "git_commits_branches_checks_out_and_fscks_clean_on_the_mount";
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
    git(&["init", "-q", "-b", "main", "."]);
    std::fs::write(repo.join("a.txt"), b"hello\n").expect("write");
    git(&["add", "a.txt"]);
    git(&["commit", "-q", "-m", "first"]);
    std::fs::write(repo.join("a.txt"), b"hello\nmore\n").expect("rewrite");
    git(&["commit", "-q", "-a", "-m", "second"]);
    std::fs::create_dir(repo.join("sub")).expect("mkdir sub");
    std::fs::write(repo.join("sub/b.txt"), b"bee\n").expect("write b");
    git(&["add", "sub/b.txt"]);
    git(&["commit", "-q", "-m", "third"]);
    let log = git(&["log", "--format=%s"]);
    assert_eq!(log, "third\nsecond\nfirst\n");
    git(&["fsck", "--strict"]);
    assert_eq!(git(&["show", "HEAD:a.txt"]), "hello\nmore\n");
    // A branch from the first commit, a commit on it, and checkouts both ways: the
    // work tree follows (files rewritten, removed, brought back).
    git(&["checkout", "-q", "-b", "side", "HEAD~2"]);
    assert_eq!(std::fs::read(repo.join("a.txt")).expect("a"), b"hello\n");
    assert!(
        !repo.join("sub/b.txt").exists(),
        "checkout removed sub/b.txt"
    );
    std::fs::write(repo.join("c.txt"), b"side\n").expect("write c");
    git(&["add", "c.txt"]);
    git(&["commit", "-q", "-m", "on side"]);
    git(&["checkout", "-q", "main"]);
    assert_eq!(
        std::fs::read(repo.join("a.txt")).expect("a"),
        b"hello\nmore\n"
    );
    assert_eq!(std::fs::read(repo.join("sub/b.txt")).expect("b"), b"bee\n");
    assert!(!repo.join("c.txt").exists(), "checkout removed c.txt");
    assert_eq!(git(&["status", "--porcelain"]), "", "a clean work tree");
    assert_eq!(
        git(&["branch", "--format=%(refname:short)"]),
        "main\nside\n"
    );
    git(&["fsck", "--strict"]);
}
