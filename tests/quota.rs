//! Directory quotas with real processes, as HDFS operators know them: `stampfs admin
//! quota set|clear|get|list`, `count -q`, refusals with a clear error from `put`,
//! `touchz`, `mkdir` and `mv` (nothing left behind), `EDQUOT` through the mount, a
//! quota that outlives a master restart, and only superusers setting quotas.

mod common;

use common::mount::{fuse_or_skip, MountGuard};
use common::{pattern, Opts, TestCluster};
use serde_json::Value;
use std::process::Output;

const MIB: u64 = 1 << 20;

fn cluster() -> TestCluster {
    TestCluster::with(Opts::default())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `admin quota get PATH --json`: (names used, names limit, bytes used, bytes limit).
fn quota(c: &TestCluster, path: &str) -> Value {
    serde_json::from_slice(&c.ok(&["admin", "quota", "get", path, "--json"])).expect("quota json")
}

/// Runs a command that must fail with a quota refusal naming `path`; its output.
fn refused(c: &TestCluster, args: &[&str], path: &str) -> String {
    let out = c.run(args);
    let said = text(&out);
    assert!(!out.status.success(), "{args:?} succeeded: {said}");
    assert!(
        said.contains(&format!("quota of {path} is exceeded")),
        "{args:?} should say the quota of {path} is exceeded: {said}"
    );
    // Said once, as an error, without log lines.
    assert_eq!(said.matches("is exceeded").count(), 1, "{said}");
    assert!(
        !said.contains(" WARN ") && !said.contains(" ERROR "),
        "{said}"
    );
    said
}

#[test]
fn quotas_refuse_what_would_pass_them_and_free_what_leaves() {
    let c = cluster();
    c.ok(&["mkdir", "/q"]);
    let set = text(&c.run(&[
        "admin", "quota", "set", "/q", "--names", "4", "--bytes", "7MiB",
    ]));
    assert!(set.contains("/q: names 1 of 4"), "{set}");

    // 1.5 MiB on three replicas: 4.5 MiB of the 7.
    let a = pattern(3 * MIB as usize / 2, 1);
    c.put_bytes("/q/a", &a, &["--chunk-size", "1MiB"]);
    let q = quota(&c, "/q");
    assert_eq!(q["names"]["used"], 2, "{q}");
    assert_eq!(q["bytes"]["used"], 9 * MIB / 2, "{q}");

    // The next chunk would count 3 MiB whole: refused, and `put` leaves no file.
    let local = c.dir.path().join("b");
    std::fs::write(&local, pattern(1000, 2)).expect("write local");
    let said = refused(
        &c,
        &[
            "put",
            "--chunk-size",
            "1MiB",
            &local.display().to_string(),
            "/q/b",
        ],
        "/q",
    );
    assert!(said.contains("space quota"), "{said}");
    assert!(!c.run(&["test", "-e", "/q/b"]).status.success(), "{said}");
    assert_eq!(quota(&c, "/q")["bytes"]["used"], 9 * MIB / 2);

    // An append that needs a new chunk past the limit keeps what fit in the last one,
    // and the file is closed, not left open.
    let c_part = pattern(MIB as usize / 4, 3);
    // 0.5 MiB in use at two replicas, 2 MiB open (one chunk whole), then 2 more.
    c.put_bytes(
        "/c",
        &c_part,
        &["--chunk-size", "1MiB", "--replication", "2"],
    );
    c.ok(&["mv", "/c", "/q/c"]);
    let more = c.dir.path().join("more");
    std::fs::write(&more, pattern(MIB as usize, 4)).expect("write local");
    let said = refused(&c, &["append", &more.display().to_string(), "/q/c"], "/q");
    assert!(said.contains("space quota"), "{said}");
    let st = c.stat_json("/q/c");
    assert_eq!(st["state"], "closed", "{st}");
    let kept = st["length"].as_u64().expect("length");
    assert!((c_part.len() as u64..=MIB).contains(&kept), "{st}");
    assert_eq!(c.cat("/q/c")[..c_part.len()], c_part[..]);
    c.ok(&["rm", "--skip-trash", "/q/c"]);

    // Names: the directory counts itself.
    c.ok(&["mkdir", "/q/d"]);
    c.ok(&["touchz", "/q/d/x"]);
    refused(&c, &["touchz", "/q/y"], "/q");
    refused(&c, &["mkdir", "/q/e"], "/q");

    // `count -q`: QUOTA REM_QUOTA SPACE_QUOTA REM_SPACE_QUOTA, then the counts.
    let line = String::from_utf8_lossy(&c.ok(&["count", "-q", "/q"])).into_owned();
    let cols: Vec<&str> = line.split_whitespace().collect();
    let rem = (7 * MIB - 9 * MIB / 2).to_string();
    assert_eq!(
        cols,
        [
            "4",
            "0",
            &(7 * MIB).to_string(),
            &rem,
            "2",
            "2",
            &a.len().to_string(),
            "/q"
        ],
        "{line}"
    );
    let header = String::from_utf8_lossy(&c.ok(&["count", "-q", "-v", "/"])).into_owned();
    assert!(
        header.contains("REM_SPACE_QUOTA") && header.contains("none"),
        "{header}"
    );

    // A move into the tree is checked; within it and out of it are not.
    c.ok(&["touchz", "/outside"]);
    refused(&c, &["mv", "/outside", "/q/outside"], "/q");
    c.ok(&["mv", "/q/d/x", "/q/x"]);
    c.ok(&["mv", "/q/x", "/x"]);
    c.ok(&["mv", "/outside", "/q/outside"]);

    // Deleting frees (into the trash: out of the tree).
    c.ok(&["rm", "/q/a"]);
    let q = quota(&c, "/q");
    assert_eq!(
        (q["names"]["used"].as_u64(), q["bytes"]["used"].as_u64()),
        (Some(3), Some(0)),
        "{q}"
    );

    // Clearing one limit keeps the other; `list` shows what is left.
    c.ok(&["admin", "quota", "clear", "/q", "--names"]);
    let q = quota(&c, "/q");
    assert!(
        q["names"].is_null() && q["bytes"]["limit"] == 7 * MIB,
        "{q}"
    );
    let list = String::from_utf8_lossy(&c.ok(&["admin", "quota", "list"])).into_owned();
    assert!(list.contains("none") && list.contains(" /q"), "{list}");

    // A limit of zero, a file, a missing path: clear errors.
    let out = c.run(&["admin", "quota", "set", "/q", "--names", "0"]);
    assert!(!out.status.success());
    let out = c.run(&["admin", "quota", "set", "/x", "--names", "3"]);
    assert!(text(&out).contains("not a directory"), "{}", text(&out));
    let out = c.run(&["admin", "quota", "set", "/nope", "--names", "3"]);
    assert!(text(&out).contains("not found"), "{}", text(&out));

    // The quota and its use outlive a restart of the master.
    let before = quota(&c, "/q");
    let mut c = c;
    c.master.restart();
    assert_eq!(quota(&c, "/q"), before);
    c.ok(&["admin", "quota", "clear", "/q"]);
    let listed = String::from_utf8_lossy(&c.ok(&["admin", "quota", "list"])).into_owned();
    assert!(listed.contains("No directory has a quota"), "{listed}");
}

#[test]
fn only_superusers_set_quotas_and_anyone_reads_them() {
    let c = cluster();
    c.ok(&["mkdir", "/home"]);
    c.ok(&["admin", "quota", "set", "/home", "--names", "10"]);
    let creds = c.dir.path().join("bob.credentials");
    c.ok(&[
        "admin",
        "user",
        "add",
        "bob",
        "--uid",
        "1001",
        "-o",
        &creds.display().to_string(),
    ]);
    let as_bob = |args: &[&str]| {
        c.cmd(args)
            .env(stampfs_proto::credentials::CREDENTIALS_ENV, &creds)
            .output()
            .expect("run stampfs")
    };
    let out = as_bob(&["admin", "quota", "set", "/home", "--names", "1000"]);
    assert!(!out.status.success(), "{}", text(&out));
    let out = as_bob(&["count", "-q", "/home"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).trim_start().starts_with("10 "), "{}", text(&out));
    assert_eq!(quota(&c, "/home")["names"]["limit"], 10);
}

#[test]
fn the_mount_says_disk_quota_exceeded() {
    if !fuse_or_skip("the_mount_says_disk_quota_exceeded") {
        return;
    }
    let c = cluster();
    c.ok(&["mkdir", "/q"]);
    // Room for one chunk of the default size on three replicas, not two.
    c.ok(&["admin", "quota", "set", "/q", "--bytes", "200MiB"]);
    let m = MountGuard::start(&c);
    let q = m.path("q");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("head -c 100000 /dev/zero > small && head -c 70000000 /dev/zero > big")
        .current_dir(&q)
        .output()
        .expect("sh");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second file passes the quota");
    assert!(said.contains("Disk quota exceeded"), "{said}");
    assert_eq!(
        std::fs::read(q.join("small")).expect("read small").len(),
        100_000,
        "what fit is kept"
    );
    // The refused file is closed at once (not left open until its lease's hard limit),
    // keeping what fit before the refusal: at most its first chunk.
    let big = c.stat_json("/q/big");
    assert_eq!(big["state"], "closed", "{big}");
    let kept = big["length"].as_u64().expect("length");
    assert!(kept <= 64 * MIB, "{big}");
    let use_now = quota(&c, "/q")["bytes"]["used"].as_u64();
    assert_eq!(
        use_now,
        Some(3 * (100_000 + kept)),
        "closed files count their length"
    );
    // Removing frees the room, through the mount too.
    std::fs::remove_file(q.join("big")).expect("rm big");
    std::fs::remove_file(q.join("small")).expect("rm small");
    std::fs::write(q.join("again"), vec![7u8; 1000]).expect("fits again");
    drop(m);
    assert_eq!(c.cat("/q/again"), vec![7u8; 1000]);
}
