//! Administration of the data with real processes, as HDFS operators know it:
//! `stampfs setrep` (trim, copy, wait, directories) and the decommission of a
//! chunkserver (its chunks copied elsewhere first, then it can be SIGKILLed without
//! a chunk falling below its replication factor; no new replicas meanwhile).

mod common;

use common::{id_of, pattern, Opts, TestCluster};
use serde_json::Value;
use std::time::{Duration, Instant};

fn cluster(chunkservers: usize) -> TestCluster {
    TestCluster::with(Opts {
        chunkservers,
        master_args: ["--health-interval", "200ms", "--replication-timeout", "10s"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..Default::default()
    })
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The chunkserver ids of the replicas the master hands out, per chunk of `path`.
fn replicas(c: &TestCluster, path: &str) -> Vec<Vec<u64>> {
    let st = c.stat_json(path);
    st["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .map(|ch| {
            let mut ids: Vec<u64> = ch["replicas"]
                .as_array()
                .expect("replicas")
                .iter()
                .map(|r| r["chunkserver"].as_u64().expect("id"))
                .collect();
            ids.sort();
            ids
        })
        .collect()
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn report_entry(c: &TestCluster, id: u64) -> Value {
    let r: Value =
        serde_json::from_slice(&c.ok(&["admin", "report", "--json"])).expect("report json");
    r["chunkservers"]
        .as_array()
        .expect("chunkservers")
        .iter()
        .find(|s| s["id"] == id)
        .cloned()
        .expect("the chunkserver is in the report")
}

#[test]
fn setrep_trims_copies_waits_and_walks_directories() {
    let c = cluster(4);
    let data = pattern(2_500_000, 7);
    c.put_bytes("/f", &data, &["--chunk-size", "1MiB"]);
    assert!(replicas(&c, "/f").iter().all(|r| r.len() == 3));

    // Down to one, waiting until every chunk has exactly one.
    let out = c.ok(&["setrep", "-w", "1", "/f"]);
    let said = String::from_utf8_lossy(&out);
    assert!(said.contains("Replication 1 set: /f"), "{said}");
    let r = replicas(&c, "/f");
    assert!(r.iter().all(|r| r.len() == 1), "{r:?}");
    assert_eq!(c.stat_json("/f")["replication"], 1);
    // Up to four: every chunkserver holds every chunk.
    c.ok(&["setrep", "4", "/f", "-w"]);
    let r = replicas(&c, "/f");
    assert!(r.iter().all(|r| r.len() == 4), "{r:?}");
    assert_eq!(c.cat("/f"), data);

    // A directory: every file under it (-R is accepted, as HDFS does).
    c.ok(&["mkdir", "-p", "/d/e"]);
    c.put_bytes("/d/a", &pattern(10_000, 1), &[]);
    c.put_bytes("/d/e/b", &pattern(10_000, 2), &[]);
    let out = c.ok(&["setrep", "-R", "-w", "2", "/d"]);
    let said = String::from_utf8_lossy(&out);
    assert!(
        said.contains("/d/a") && said.contains("/d/e/b"),
        "each file is named: {said}"
    );
    for p in ["/d/a", "/d/e/b"] {
        assert_eq!(c.stat_json(p)["replication"], 2);
        assert!(replicas(&c, p).iter().all(|r| r.len() == 2), "{p}");
    }

    // Clear refusals, nothing changed.
    let out = c.run(&["setrep", "0", "/f"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("between 1 and"), "{}", text(&out));
    let out = c.run(&["setrep", "2", "/nope"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("/nope"), "{}", text(&out));
    assert!(!text(&out).contains("panicked"));
    assert_eq!(c.stat_json("/f")["replication"], 4);
}

#[test]
fn a_decommissioned_chunkserver_is_drained_then_can_be_killed_without_loss() {
    let mut c = cluster(4);
    let data = pattern(2_500_000, 11);
    c.put_bytes("/f", &data, &["--chunk-size", "1MiB"]);
    let victim = replicas(&c, "/f")[0][0];
    let victim_index = c
        .chunkservers
        .iter()
        .position(|p| id_of(p) == victim)
        .expect("the victim's process");

    let out = c.ok(&["admin", "decommission", &victim.to_string()]);
    let said = String::from_utf8_lossy(&out);
    assert!(said.contains("decommission"), "{said}");
    wait_for("the victim decommissioned", || {
        report_entry(&c, victim)["decommission"]["state"] == "decommissioned"
    });
    // Every chunk has three replicas besides the victim's, which stays readable.
    for r in replicas(&c, "/f") {
        assert_eq!(r.iter().filter(|id| **id != victim).count(), 3, "{r:?}");
    }
    // Its replicas are listed as on a chunkserver being decommissioned, and `setrep
    // -w` does not count them: three others each, so it returns at once.
    let st = c.stat_json("/f");
    let mut draining = 0;
    for ch in st["chunks"].as_array().expect("chunks") {
        for r in ch["replicas"].as_array().expect("replicas") {
            assert_eq!(r["decommissioning"], r["chunkserver"] == victim, "{r}");
            draining += usize::from(r["chunkserver"] == victim);
        }
    }
    assert!(draining > 0, "the victim's replicas are still listed: {st}");
    c.ok(&["setrep", "-w", "3", "/f"]);
    let shown = String::from_utf8_lossy(&c.ok(&["admin", "report"])).to_string();
    assert!(shown.contains("decommissioned"), "{shown}");
    // New chunks go elsewhere.
    c.put_bytes("/g", &pattern(1_500_000, 12), &["--chunk-size", "1MiB"]);
    for r in replicas(&c, "/g") {
        assert!(!r.contains(&victim), "a new replica on the victim: {r:?}");
    }

    // Stopped hard: nothing falls below its factor, nothing is lost.
    c.chunkservers[victim_index].kill();
    wait_for("the victim dead", || {
        report_entry(&c, victim)["state"] == "dead"
    });
    for r in replicas(&c, "/f") {
        assert_eq!(r.len(), 3, "{r:?}");
    }
    assert_eq!(c.cat("/f"), data);
    let (code, fsck) = common::fsck_json(&c, &[]);
    assert_eq!(code, Some(0), "{fsck}");
    assert_eq!(fsck["total"]["under_replicated"], 0, "{fsck}");

    // Recommissioned: in service again (the report says so even while it is dead).
    c.ok(&["admin", "recommission", &victim.to_string()]);
    assert_eq!(
        report_entry(&c, victim)["decommission"]["state"],
        "in_service"
    );
    let out = c.run(&["admin", "decommission", "999"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("999"), "{}", text(&out));
}

fn out(c: &TestCluster, args: &[&str]) -> String {
    String::from_utf8(c.ok(args)).expect("utf-8")
}

#[test]
fn the_trash_keeps_original_paths_restores_and_refuses_other_ways_out() {
    let c = cluster(3);
    c.ok(&["mkdir", "-p", "/d"]);
    let data = pattern(300_000, 5);
    c.put_bytes("/d/f", &data, &[]);
    c.put_bytes("/d/g", &pattern(1000, 6), &[]);
    c.ok(&["rm", "/d/f"]);
    assert!(c.run(&["stat", "/d/f"]).status.code() != Some(0));

    // Listed under its original path, kept under the superuser's name.
    let list = out(&c, &["trash", "list"]);
    assert!(list.contains("/d/f\t300000\tCurrent"), "{list}");
    let json: Value = serde_json::from_str(&out(&c, &["trash", "list", "--json"])).expect("json");
    let f = json
        .as_array()
        .expect("array")
        .iter()
        .find(|e| e["original"] == "/d/f")
        .expect("listed");
    assert_eq!(f["trash_path"], "/.trash/admin/Current/d/f");

    // Out of the trash only by a restore.
    let moved = c.run(&["mv", "/.trash/admin/Current/d/f", "/x"]);
    assert!(!moved.status.success());
    assert!(text(&moved).contains("trash restore"), "{}", text(&moved));
    let moved = c.run(&["mv", "/.trash", "/t"]);
    assert!(!moved.status.success(), "the trash itself stays");
    let said = out(&c, &["trash", "restore", "/d/f"]);
    assert!(
        said.contains("Restored /.trash/admin/Current/d/f to /d/f"),
        "{said}"
    );
    assert_eq!(c.cat("/d/f"), data);
    let again = c.run(&["trash", "restore", "/d/f"]);
    assert!(!again.status.success());
    assert!(
        text(&again).contains("not in the trash"),
        "{}",
        text(&again)
    );

    // --skip-trash: gone at once.
    c.ok(&["rm", "--skip-trash", "/d/g"]);
    assert!(!out(&c, &["trash", "list"]).contains("/d/g"));
    // A restore elsewhere, by its trash path.
    c.ok(&["rm", "/d/f"]);
    c.ok(&[
        "trash",
        "restore",
        "/.trash/admin/Current/d/f",
        "--to",
        "/back",
    ]);
    assert_eq!(c.cat("/back"), data);
}

#[test]
fn trash_checkpoints_expire_and_their_replicas_go() {
    let c = TestCluster::with(Opts {
        chunkservers: 3,
        master_args: ["--health-interval", "200ms", "--trash-for", "2s"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..Default::default()
    });
    c.put_bytes("/f", &pattern(100_000, 9), &[]);
    let handle = c.stat_json("/f")["chunks"][0]["handle"]
        .as_str()
        .expect("handle")
        .to_string();
    c.ok(&["rm", "/f"]);
    // Checkpointed, then purged; then its replicas leave every disk.
    wait_for("a checkpoint", || {
        out(&c, &["trash", "list"]).contains("checkpoint of")
    });
    wait_for("the trash emptied", || {
        out(&c, &["trash", "list"]).contains("is empty")
    });
    wait_for("the replicas deleted", || {
        c.chunkservers
            .iter()
            .all(|p| !common::replica_file(p, &handle).exists())
    });
}

#[test]
fn safe_mode_holds_copies_back_until_replicas_are_reported_or_an_operator_leaves() {
    let mut c = cluster(3);
    c.put_bytes("/f", &pattern(2_500_000, 13), &["--chunk-size", "1MiB"]);
    let safemode = |c: &TestCluster, a: &str| out(c, &["admin", "safemode", a]);
    wait_for("safe mode off after the start", || {
        safemode(&c, "get").contains("OFF")
    });

    // A master restarted while no chunkserver runs: nothing is reported.
    for p in &mut c.chunkservers {
        p.kill();
    }
    c.master.restart();
    wait_for("a pass that found no replica", || {
        safemode(&c, "get").contains("0 of 3 chunks reported")
    });
    let report = out(&c, &["admin", "report"]);
    assert!(report.contains("Safe mode is ON"), "{report}");
    for p in &mut c.chunkservers {
        p.restart();
    }
    // Off on its own once they reported.
    let waited = out(&c, &["admin", "safemode", "wait"]);
    assert!(waited.trim_end().ends_with("Safe mode is OFF"), "{waited}");

    // By hand: a dead chunkserver's chunks are not copied to a new one meanwhile.
    assert!(safemode(&c, "enter").contains("entered by hand"));
    let gone = id_of(&c.chunkservers[0]);
    c.chunkservers[0].kill();
    let fourth = c.add_chunkserver();
    c.wait_live(4);
    let new_id = id_of(&c.chunkservers[fourth]);
    wait_for("the killed chunkserver dead", || {
        report_entry(&c, gone)["state"] == "dead"
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        replicas(&c, "/f").iter().all(|r| !r.contains(&new_id)),
        "no copy in safe mode"
    );
    assert!(safemode(&c, "leave").contains("OFF"));
    wait_for("copies to the new chunkserver", || {
        replicas(&c, "/f")
            .iter()
            .all(|r| r.len() == 3 && r.contains(&new_id))
    });
}

#[test]
fn the_balancer_fills_new_chunkservers_until_the_cluster_is_balanced() {
    let mut c = TestCluster::with(Opts {
        chunkservers: 3,
        master_args: ["--health-interval", "200ms"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        chunkserver_args: ["--heartbeat", "200ms", "--capacity", "64MiB"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..Default::default()
    });
    let data = pattern(12 << 20, 17);
    c.put_bytes("/f", &data, &["--chunk-size", "1MiB"]);
    let a = c.add_chunkserver();
    let b = c.add_chunkserver();
    c.wait_live(5);
    let new = [id_of(&c.chunkservers[a]), id_of(&c.chunkservers[b])];
    let said = out(&c, &["admin", "balance", "--threshold", "5%"]);
    assert!(said.contains("the cluster is balanced"), "{said}");
    // Each new chunkserver holds its share, and every chunk still has three replicas.
    wait_for("the moved replicas deleted", || {
        replicas(&c, "/f").iter().all(|r| r.len() == 3)
    });
    let r = replicas(&c, "/f");
    for id in new {
        let held = r.iter().filter(|ids| ids.contains(&id)).count();
        assert!(held >= 4, "chunkserver {id} holds {held} chunks: {r:?}");
    }
    assert_eq!(c.cat("/f"), data);
    let status = out(&c, &["admin", "balance", "--status"]);
    assert!(status.contains("balanced"), "{status}");
    let (code, fsck) = common::fsck_json(&c, &[]);
    assert_eq!(code, Some(0), "{fsck}");
}

#[test]
fn each_users_trash_is_their_own() {
    let c = cluster(3);
    let user = |name: &str, uid: u32| {
        let path = c.dir.path().join(format!("{name}.credentials"));
        let (uid, p) = (uid.to_string(), path.display().to_string());
        c.ok(&["admin", "user", "add", name, "--uid", &uid, "-o", &p]);
        path
    };
    let as_user = |creds: &std::path::Path, args: &[&str]| {
        c.cmd(args)
            .env(stampfs_proto::credentials::CREDENTIALS_ENV, creds)
            .output()
            .expect("run stampfs")
    };
    let alice = user("alice", 1000);
    let bob = user("bob", 1001);
    c.ok(&["mkdir", "/tmp"]);
    c.ok(&["chmod", "1777", "/tmp"]);
    assert!(as_user(&alice, &["touchz", "/tmp/a"]).status.success());
    assert!(as_user(&alice, &["rm", "/tmp/a"]).status.success());
    let mine = as_user(&alice, &["trash", "list"]);
    assert!(
        text(&mine).contains("/tmp/a\t0\tCurrent"),
        "{}",
        text(&mine)
    );
    let hers = as_user(&bob, &["trash", "list"]);
    assert!(
        text(&hers).contains("The trash of bob is empty"),
        "{}",
        text(&hers)
    );
    // Bob reaches none of it.
    for args in [
        &["trash", "list", "--user", "alice"][..],
        &[
            "trash",
            "restore",
            "/.trash/alice/Current/tmp/a",
            "--to",
            "/tmp/b",
        ],
        &["ls", "/.trash"],
        &["cat", "/.trash/alice/Current/tmp/a"],
    ] {
        let out = as_user(&bob, args);
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("ermission denied"),
            "{args:?}: {}",
            text(&out)
        );
    }
    let back = as_user(&alice, &["trash", "restore", "/tmp/a"]);
    assert!(back.status.success(), "{}", text(&back));
    assert!(c.run(&["stat", "/tmp/a"]).status.success());

    // Bob removed and added again under another uid: his old directory is the old
    // uid's, so the new bob's entries go to `bob.<uid>`, which `trash list` finds.
    assert!(as_user(&bob, &["touchz", "/tmp/old"]).status.success());
    assert!(as_user(&bob, &["rm", "/tmp/old"]).status.success());
    c.ok(&["admin", "user", "remove", "bob"]);
    let again = c.dir.path().join("bob-again.credentials");
    let p = again.display().to_string();
    c.ok(&["admin", "user", "add", "bob", "--uid", "1005", "-o", &p]);
    assert!(as_user(&again, &["touchz", "/tmp/new"]).status.success());
    assert!(as_user(&again, &["rm", "/tmp/new"]).status.success());
    let listed = text(&as_user(&again, &["trash", "list"]));
    assert!(listed.contains("/tmp/new\t0\tCurrent"), "{listed}");
    assert!(!listed.contains("/tmp/old"), "{listed}");
    let theirs = text(&c.run(&["trash", "list", "--user", "bob"]));
    assert!(theirs.contains("/tmp/new"), "{theirs}");
    let back = as_user(&again, &["trash", "restore", "/tmp/new"]);
    assert!(back.status.success(), "{}", text(&back));
}
