//! Replica health with real processes: a stale replica is deleted and rebuilt at the
//! new version, a dead chunkserver's replicas are rebuilt elsewhere, a corrupt replica
//! is detected (on read and by the scrub) and repaired, removed files' replicas leave
//! every disk (also through a master restart, as orphans), and the output of
//! `stampfs fsck` and `stampfs admin report`.

mod common;

use common::{
    flip, fsck_json, id_of, pattern, proc_of, replica_file, replica_file_with, Opts, Proc,
    TestCluster,
};
use serde_json::Value;
use stampfs_chunkserver::header::{Header, SLOT_SIZE};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// A cluster with a fast replica-health worker and short orphan grace.
fn cluster(chunkservers: usize, master: &[&str], chunkserver: &[&str]) -> TestCluster {
    let mut master_args: Vec<String> = [
        "--health-interval",
        "200ms",
        "--orphan-grace",
        "1s",
        "--replication-timeout",
        "10s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    master_args.extend(master.iter().map(|s| s.to_string()));
    let mut chunkserver_args: Vec<String> = vec!["--heartbeat".into(), "200ms".into()];
    chunkserver_args.extend(chunkserver.iter().map(|s| s.to_string()));
    TestCluster::with(Opts {
        chunkservers,
        master_args,
        chunkserver_args,
        ..Default::default()
    })
}

fn wait_for(what: &str, c: &TestCluster, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = c;
}

/// The version in a replica file's header, if the file exists.
fn disk_version(p: &Proc, handle: &str) -> Option<u64> {
    let f = std::fs::File::open(replica_file(p, handle)).ok()?;
    let mut slots = vec![0u8; 2 * SLOT_SIZE as usize];
    f.read_exact_at(&mut slots, 0).ok()?;
    let (a, b) = slots.split_at(SLOT_SIZE as usize);
    Header::newest(a, b).ok().map(|h| h.version.0)
}

fn handles(st: &Value) -> Vec<String> {
    st["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .map(|c| c["handle"].as_str().expect("handle").to_string())
        .collect()
}

/// `(chunkserver id, version)` of the replicas the master hands out for chunk `i`.
fn replicas(st: &Value, i: usize) -> Vec<(u64, u64)> {
    st["chunks"][i]["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| {
            (
                r["chunkserver"].as_u64().expect("id"),
                r["version"].as_u64().expect("version"),
            )
        })
        .collect()
}

fn report_json(c: &TestCluster) -> Value {
    serde_json::from_slice(&c.ok(&["admin", "report", "--json"])).expect("report json")
}

/// Waits until the master reports chunkserver `id` as `state`.
fn wait_state(c: &TestCluster, id: u64, state: &str) {
    wait_for(&format!("cs{id} to be {state}"), c, || {
        report_json(c)["chunkservers"]
            .as_array()
            .expect("chunkservers")
            .iter()
            .any(|s| s["id"] == id && s["state"] == state)
    });
}

fn healthy(c: &TestCluster) -> bool {
    let (code, v) = fsck_json(c, &[]);
    code == Some(0) && v["healthy"] == true
}

#[test]
fn a_stale_replica_is_deleted_and_the_chunk_rebuilt_at_the_new_version() {
    let mut c = cluster(3, &[], &[]);
    let first = pattern(200_000, 1);
    c.put_bytes("/f", &first, &[]);
    let st = c.stat_json("/f");
    let h = handles(&st)[0].clone();
    let v1 = st["chunks"][0]["version"].as_u64().expect("version");
    assert_eq!(replicas(&st, 0).len(), 3);

    // cs0 goes away and misses the bump of the append.
    let down = id_of(&c.chunkservers[0]);
    c.chunkservers[0].kill();
    wait_state(&c, down, "dead");
    let more = pattern(50_000, 2);
    let out = c.run_stdin(&["append", "-", "/f"], &more);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = c.stat_json("/f");
    let v2 = st["chunks"][0]["version"].as_u64().expect("version");
    assert!(v2 > v1, "the append bumped the version ({v1} -> {v2})");
    assert_eq!(replicas(&st, 0).len(), 2);
    assert_eq!(
        disk_version(&c.chunkservers[0], &h),
        Some(v1),
        "cs0 is stale"
    );
    let (code, v) = fsck_json(&c, &[]);
    assert_eq!(code, Some(1), "under-replicated is not healthy: {v}");
    assert_eq!(v["total"]["under_replicated"], 1);

    // It comes back with its stale replica: deleted, then rebuilt at the new version.
    c.chunkservers[0].restart();
    wait_for("three replicas at the new version", &c, || {
        let st = c.stat_json("/f");
        let r = replicas(&st, 0);
        r.len() == 3 && r.iter().all(|(_, v)| *v == v2)
    });
    assert_eq!(disk_version(&c.chunkservers[0], &h), Some(v2));
    let log = c.master.log_text();
    assert!(
        log.lines().any(|l| l.contains("replica deletion ordered")
            && l.contains(&h)
            && l.contains("reason=stale")
            && l.contains(&format!("chunkserver=cs{down}"))),
        "the stale replica was deleted, not overwritten"
    );
    assert!(
        c.chunkservers[0]
            .log_text()
            .lines()
            .any(|l| l.contains("replica deleted") && l.contains(&h)),
        "cs0 deleted its stale replica"
    );
    let mut want = first;
    want.extend_from_slice(&more);
    assert_eq!(c.cat("/f"), want);
    wait_for("fsck healthy", &c, || healthy(&c));
}

#[test]
fn a_dead_chunkservers_replicas_are_rebuilt_on_a_fourth() {
    let mut c = cluster(3, &[], &[]);
    let data = pattern(2_500_000, 3);
    c.put_bytes("/g", &data, &["--chunk-size", "1MiB"]);
    let st = c.stat_json("/g");
    let hs = handles(&st);
    assert_eq!(hs.len(), 3);
    let fourth = c.add_chunkserver();
    c.wait_live(4);
    let new_id = id_of(&c.chunkservers[fourth]);
    let gone = id_of(&c.chunkservers[1]);
    c.chunkservers[1].kill();
    wait_for("every chunk back to three live replicas", &c, || {
        let st = c.stat_json("/g");
        (0..hs.len()).all(|i| {
            let r = replicas(&st, i);
            r.len() == 3
                && r.iter().any(|(id, _)| *id == new_id)
                && !r.iter().any(|(id, _)| *id == gone)
        })
    });
    for h in &hs {
        assert!(
            replica_file(&c.chunkservers[fourth], h).exists(),
            "{h} was copied to the fourth chunkserver"
        );
    }
    assert_eq!(c.cat("/g"), data);
    wait_for("fsck healthy", &c, || healthy(&c));
}

#[test]
fn a_corrupt_replica_is_detected_excluded_and_repaired() {
    let c = cluster(3, &[], &["--scrub-rate", "32MiB"]);
    // Read path: the first replica handed out is corrupt; `get` still gets the data.
    let d1 = pattern(300_000, 4);
    c.put_bytes("/c1", &d1, &[]);
    let st = c.stat_json("/c1");
    let h1 = handles(&st)[0].clone();
    let bad1 = replicas(&st, 0)[0].0;
    flip(proc_of(&c, bad1), &h1, 150_000);
    let local = c.dir.path().join("c1.out");
    c.ok(&["get", "/c1", &local.display().to_string()]);
    assert_eq!(
        std::fs::read(&local).expect("read back"),
        d1,
        "get returned correct data"
    );
    // Scrub: a replica nobody reads.
    let d2 = pattern(200_000, 5);
    c.put_bytes("/c2", &d2, &[]);
    let st = c.stat_json("/c2");
    let h2 = handles(&st)[0].clone();
    let bad2 = replicas(&st, 0)[2].0;
    flip(proc_of(&c, bad2), &h2, 100_000);

    for (h, bad) in [(&h1, bad1), (&h2, bad2)] {
        let p = proc_of(&c, bad);
        wait_for(
            &format!("{h} on cs{bad} to be moved aside and replaced"),
            &c,
            || replica_file_with(p, h, ".corrupt").exists() && replica_file(p, h).exists(),
        );
    }
    wait_for("fsck healthy after the repair", &c, || healthy(&c));
    for (path, h, data) in [("/c1", &h1, &d1), ("/c2", &h2, &d2)] {
        let st = c.stat_json(path);
        assert_eq!(replicas(&st, 0).len(), 3, "{path}");
        assert_eq!(&c.cat(path), data, "{path}");
        let _ = h;
    }
    let log = c.master.log_text();
    assert!(
        log.contains("replica reported corrupt"),
        "the master heard of it"
    );
}

#[test]
fn removed_files_replicas_leave_every_disk() {
    let mut c = cluster(3, &["--trash-for", "0"], &[]);
    let data = pattern(2_200_000, 6);
    c.put_bytes("/d", &data, &["--chunk-size", "1MiB"]);
    let hs = handles(&c.stat_json("/d"));
    assert_eq!(hs.len(), 3);
    for p in &c.chunkservers {
        for h in &hs {
            assert!(replica_file(p, h).exists());
        }
    }
    c.ok(&["rm", "/d"]);
    wait_for("every replica of /d to be deleted", &c, || {
        c.chunkservers
            .iter()
            .all(|p| hs.iter().all(|h| !replica_file(p, h).exists()))
    });
    let ls = String::from_utf8(c.ok(&["ls", "/"])).expect("utf8");
    assert!(ls.trim().is_empty(), "no trash with --trash-for 0: {ls:?}");

    // A chunkserver that is away when a file is removed, and a master that forgets
    // its queued deletions: the replicas come back as orphans and go after the grace.
    c.put_bytes("/e", &data, &["--chunk-size", "1MiB"]);
    let hs = handles(&c.stat_json("/e"));
    let away = id_of(&c.chunkservers[2]);
    c.chunkservers[2].kill();
    c.ok(&["rm", "/e"]);
    c.master.restart();
    c.chunkservers[2].restart();
    wait_for("the orphans to be deleted", &c, || {
        c.chunkservers
            .iter()
            .all(|p| hs.iter().all(|h| !replica_file(p, h).exists()))
    });
    let log = c.master.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("reason=orphan") && l.contains(&format!("chunkserver=cs{away}"))),
        "deleted as orphans after the grace"
    );
}

#[test]
fn fsck_and_admin_report_output() {
    let mut c = cluster(3, &[], &[]);
    c.put_bytes("/ok", &pattern(10_000, 7), &[]);
    c.ok(&["mkdir", "/dir"]);
    c.put_bytes("/dir/x", &pattern(20_000, 8), &[]);

    let (code, v) = fsck_json(&c, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["path"], "/");
    assert_eq!(v["healthy"], true);
    for (field, n) in [
        ("files", 2),
        ("chunks", 2),
        ("healthy", 2),
        ("under_replicated", 0),
        ("missing", 0),
        ("stale_replicas", 0),
        ("corrupt_replicas", 0),
        ("ahead_replicas", 0),
        ("open_files", 0),
        ("recovering_files", 0),
    ] {
        assert_eq!(v["total"][field], n, "total.{field} in {v}");
    }
    assert_eq!(
        v["files"],
        serde_json::json!([]),
        "healthy closed files are only counted"
    );
    assert_eq!(v["orphan_replicas"], 0);
    assert_eq!(v["replications_in_flight"], 0);
    assert_eq!(v["truncated"], false);
    let (code, v) = fsck_json(&c, &["/dir"]);
    assert_eq!(
        (code, v["path"].as_str(), v["total"]["files"].as_u64()),
        (Some(0), Some("/dir"), Some(1))
    );
    let text = String::from_utf8(c.ok(&["fsck"])).expect("utf8");
    assert!(text.contains("fsck /: HEALTHY"), "{text}");
    assert!(text.contains("under-replicated"), "{text}");

    let r = report_json(&c);
    let servers = r["chunkservers"].as_array().expect("chunkservers");
    assert_eq!(servers.len(), 3, "{r}");
    for s in servers {
        assert_eq!(s["state"], "live", "{s}");
        assert!(
            s["addr"]
                .as_str()
                .is_some_and(|a| a.starts_with("127.0.0.1:")),
            "{s}"
        );
        assert!(
            s["last_heartbeat_ms_ago"]
                .as_u64()
                .is_some_and(|ms| ms < 2_000),
            "{s}"
        );
        assert!(s["capacity"].as_u64().is_some_and(|b| b > 0), "{s}");
        assert!(s["used"].as_u64().is_some(), "{s}");
        assert_eq!(s["replicas"], 2, "{s}");
        assert!(s["id"].as_u64().is_some(), "{s}");
    }
    assert_eq!(r["chunks"]["chunks"], 2);
    assert_eq!(r["chunks"]["healthy"], 2);
    let text = String::from_utf8(c.ok(&["admin", "report"])).expect("utf8");
    assert!(
        text.contains("LAST HEARTBEAT") && text.contains("live"),
        "{text}"
    );

    // A chunkserver down: under-replicated, fsck fails, the report says dead.
    let down = id_of(&c.chunkservers[0]);
    c.chunkservers[0].kill();
    wait_state(&c, down, "dead");
    let (code, v) = fsck_json(&c, &[]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["healthy"], false);
    assert_eq!(v["total"]["under_replicated"], 2);
    let files = v["files"].as_array().expect("files");
    assert_eq!(files.len(), 2, "{v}");
    assert_eq!(files[0]["problems"][0]["live"], 2, "{v}");
    assert_eq!(files[0]["problems"][0]["replication"], 3, "{v}");
    let out = c.run(&["fsck"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("fsck /: UNHEALTHY") && text.contains("2/3 live"),
        "{text}"
    );
    let text = String::from_utf8(c.ok(&["admin", "report"])).expect("utf8");
    assert!(
        text.contains("dead") && text.contains("(2 live, 1 dead)"),
        "{text}"
    );
    let out = c.run(&["fsck", "/nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("stampfs: error:") && err.contains("not found"),
        "{err}"
    );

    // `rm` keeps the file in the (hidden) trash until `--trash-for`; removing it from
    // the trash deletes it.
    c.chunkservers[0].restart();
    wait_state(&c, down, "live");
    let h = handles(&c.stat_json("/ok"))[0].clone();
    c.ok(&["rm", "/ok"]);
    let ls = String::from_utf8(c.ok(&["ls", "/"])).expect("utf8");
    assert!(!ls.contains("ok") && !ls.contains(".trash"), "{ls}");
    // Under the superuser's name, at its original path: in `Current`, or in the
    // checkpoint the trash worker may have made of it meanwhile.
    let listed: serde_json::Value =
        serde_json::from_slice(&c.ok(&["trash", "list", "--json"])).expect("trash list json");
    let kept = listed
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["original"] == "/ok")
        .cloned()
        .expect("/ok is in the trash");
    let entry = kept["trash_path"].as_str().expect("trash path").to_string();
    assert!(entry.starts_with("/.trash/admin/"), "{kept}");
    assert_eq!(kept["kind"], "file", "{kept}");
    assert!(
        replica_file(&c.chunkservers[1], &h).exists(),
        "kept while in the trash"
    );
    // Removing the user's whole trash deletes at once, wherever the entry is now.
    c.ok(&["rm", "-r", "/.trash/admin"]);
    wait_for("the trashed file's replicas to go", &c, || {
        c.chunkservers.iter().all(|p| !replica_file(p, &h).exists())
    });
}
