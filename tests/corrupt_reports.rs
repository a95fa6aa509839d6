//! Corruption reports are hints, with real processes: a client that reports GOOD
//! replicas as corrupt (over and over) gets one verification per replica from their
//! chunkservers and nothing else, while a replica whose bytes really were flipped on
//! disk is found by the verification its report asks for, moved aside, and repaired.
//! Verification requests not signed with the cluster key are refused.

mod common;

use common::{
    flip, fsck_json, id_of, pattern, proc_of, replica_file, replica_file_with, runtime, Opts,
    TestCluster,
};
use serde_json::Value;
use stampfs_proto::{
    ChunkHandle, ChunkserverId, ClusterKey, Issue, RemoteError, ReportCorrupt, RpcClient, Signed,
    VerifyReplica,
};
use std::time::{Duration, Instant};

/// A cluster with a fast health worker, fast heartbeats and the background scrub off
/// (so only the verification a report asks for can find a flipped byte).
fn cluster() -> TestCluster {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    TestCluster::with(Opts {
        chunkservers: 3,
        master_args: args(&["--health-interval", "200ms", "--replication-timeout", "10s"]),
        chunkserver_args: args(&["--heartbeat", "200ms", "--scrub-rate", "0"]),
        ..Default::default()
    })
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `ReportCorrupt { handle, chunkserver }` `times` times as a client would (on
/// a connection that proved the superuser's key).
fn report(c: &TestCluster, handle: ChunkHandle, chunkserver: u64, times: usize) {
    runtime().block_on(async {
        let mut master = RpcClient::connect(
            &stampfs_proto::net::Dialer::plain(),
            &c.master.addr,
            Duration::from_secs(5),
        )
        .await
        .expect("connect to the master");
        stampfs_proto::auth::authenticate_client(&mut master, &common::test_credentials())
            .await
            .expect("authenticate to the master");
        for _ in 0..times {
            master
                .call(ReportCorrupt {
                    handle,
                    chunkserver: ChunkserverId(chunkserver),
                })
                .await
                .expect("report accepted");
        }
    });
}

fn handle_of(st: &Value) -> (String, ChunkHandle) {
    let hex = st["chunks"][0]["handle"]
        .as_str()
        .expect("handle")
        .to_string();
    let h = u64::from_str_radix(&hex, 16).expect("hex handle");
    (hex, ChunkHandle(h))
}

/// Sorted chunkserver ids the master hands out for the first chunk.
fn replica_ids(st: &Value) -> Vec<u64> {
    let mut ids: Vec<u64> = st["chunks"][0]["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| r["chunkserver"].as_u64().expect("id"))
        .collect();
    ids.sort();
    ids
}

fn lines_with(log: &str, all: &[&str]) -> usize {
    log.lines()
        .filter(|l| all.iter().all(|s| l.contains(s)))
        .count()
}

#[test]
fn reports_of_good_replicas_are_verified_and_change_nothing() {
    let c = cluster();
    let data = pattern(300_000, 11);
    c.put_bytes("/good", &data, &[]);
    let st = c.stat_json("/good");
    let (hex, h) = handle_of(&st);
    let ids = replica_ids(&st);
    assert_eq!(ids.len(), 3);

    // A buggy or hostile client names every replica corrupt, again and again.
    for id in &ids {
        report(&c, h, *id, 25);
    }
    wait_for("every replica verified clean", || {
        let log = c.master.log_text();
        ids.iter().all(|id| {
            lines_with(
                &log,
                &["verified clean", &hex, &format!("chunkserver=cs{id}")],
            ) == 1
        })
    });
    // A few health passes later nothing has moved.
    std::thread::sleep(Duration::from_secs(1));
    let st = c.stat_json("/good");
    assert_eq!(replica_ids(&st), ids, "every replica is still handed out");
    let v = fsck_json(&c, &[]).1;
    assert_eq!(v["healthy"], true, "{v}");
    assert_eq!(v["total"]["corrupt_replicas"], 0, "{v}");
    assert_eq!(v["total"]["under_replicated"], 0, "{v}");
    assert_eq!(v["replications_in_flight"], 0, "{v}");
    let r: Value = serde_json::from_slice(&c.ok(&["admin", "report", "--json"])).expect("json");
    assert_eq!(r["chunks"]["healthy"], 1, "{r}");
    for p in &c.chunkservers {
        assert!(replica_file(p, &hex).exists(), "{}", p.name);
        assert!(
            !replica_file_with(p, &hex, ".corrupt").exists(),
            "{}",
            p.name
        );
        assert_eq!(
            lines_with(&p.log_text(), &["verified clean", &hex]),
            1,
            "{} read the replica once for 25 reports",
            p.name
        );
    }
    let log = c.master.log_text();
    for id in &ids {
        assert_eq!(
            lines_with(
                &log,
                &["asked to verify", &hex, &format!("chunkserver=cs{id}")]
            ),
            1,
            "one verification per replica: cs{id}"
        );
    }
    assert_eq!(lines_with(&log, &["excluded"]), 0, "nothing excluded");
    assert_eq!(lines_with(&log, &["re-replication ordered"]), 0);
    assert_eq!(lines_with(&log, &["replica deletion ordered"]), 0);
    assert_eq!(c.cat("/good"), data);

    // Only the master can ask for a verification: a request signed with another key is
    // refused, and so is one signed with the cluster key outside the chunkserver's
    // registration with the master (a replay, or a forger who stole the key but not the
    // session), each with a clear error, and the connection keeps serving.
    let cs = &c.chunkservers[0];
    let key = ClusterKey::load(&c.key_file()).expect("cluster key");
    let issue = Issue {
        chunkserver: ChunkserverId(id_of(cs)),
        session: 0x5eed,
        seq: 0,
        epoch: stampfs_proto::MasterEpoch::default(),
    };
    runtime().block_on(async {
        let mut conn = RpcClient::connect(
            &stampfs_proto::net::Dialer::plain(),
            &cs.addr,
            Duration::from_secs(5),
        )
        .await
        .expect("connect to a chunkserver");
        let forged =
            Signed::new(&ClusterKey::generate(), issue, VerifyReplica { handle: h }).expect("sign");
        let err = conn.call(forged).await.expect_err("forged request refused");
        assert!(
            matches!(
                err,
                stampfs_proto::Error::Remote(RemoteError::BadRequest { .. })
            ),
            "{err}"
        );
        let outside = Signed::new(&key, issue, VerifyReplica { handle: h }).expect("sign");
        let err = conn
            .call(outside)
            .await
            .expect_err("a request outside the registration is refused");
        assert!(
            matches!(
                &err,
                stampfs_proto::Error::Remote(RemoteError::BadRequest { reason })
                    if reason.contains("earlier registration")
            ),
            "{err}"
        );
    });
}

#[test]
fn a_report_of_a_really_corrupt_replica_still_gets_it_repaired() {
    let c = cluster();
    let data = pattern(250_000, 12);
    c.put_bytes("/bad", &data, &[]);
    let st = c.stat_json("/bad");
    let (hex, h) = handle_of(&st);
    let ids = replica_ids(&st);
    let bad = ids[1];
    let p = proc_of(&c, bad);
    flip(p, &hex, 200_000);

    // Nobody reads it and the scrub is off: only the report's verification finds it.
    report(&c, h, bad, 3);
    wait_for("the corrupt replica moved aside and replaced", || {
        replica_file_with(p, &hex, ".corrupt").exists() && replica_file(p, &hex).exists()
    });
    wait_for("fsck healthy after the repair", || {
        fsck_json(&c, &[]).1["healthy"] == true
    });
    let st = c.stat_json("/bad");
    assert_eq!(
        replica_ids(&st),
        ids,
        "three replicas again, cs{bad} included"
    );
    assert_eq!(c.cat("/bad"), data);
    let log = c.master.log_text();
    assert_eq!(
        lines_with(
            &log,
            &["verified corrupt", &hex, &format!("chunkserver=cs{bad}")]
        ),
        1,
        "excluded on its chunkserver's word"
    );
    assert!(
        lines_with(
            &p.log_text(),
            &["verification found a corrupt replica", &hex]
        ) == 1,
        "cs{bad} found it"
    );
}
