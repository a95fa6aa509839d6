//! Chunkservers and the master prove the cluster key to each other (issue 18 item 1),
//! with real processes on loopback: a chunkserver started with another cluster's key
//! is refused by the master (which logs its address), exits saying why, and is never
//! listed or given replicas, so files keep their three replicas on the chunkservers
//! that hold the key.

mod common;

use common::{pattern, TestCluster, BIN};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn report_json(c: &TestCluster) -> Value {
    serde_json::from_slice(&c.ok(&["admin", "report", "--json"])).expect("report json")
}

#[test]
fn a_chunkserver_with_another_key_is_refused_exits_and_is_never_placed() {
    let c = TestCluster::start();
    let wrong = c.dir.path().join("other-cluster.key");
    std::fs::write(&wrong, format!("{}\n", "5a".repeat(32))).expect("write a key");
    let dir = c.dir.path().join("cs-wrong");
    let mut child = Command::new(BIN)
        .args(["chunkserver", "--dir"])
        .arg(&dir)
        .args(["--listen", "127.0.0.1:0", "--master", &c.master.addr])
        .arg("--cluster-key-file")
        .arg(&wrong)
        .args(["--heartbeat", "200ms"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the chunkserver");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a chunkserver with the wrong key is still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("its output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused this chunkserver's cluster key")
            && stderr.contains("hold different cluster keys"),
        "the chunkserver says why it stopped: {stderr}"
    );
    assert!(
        !dir.join("chunkserver.id").exists(),
        "it was never given an id"
    );
    // The master refused it and named the address it came from.
    let log = c.master.log_text();
    let refusal = log
        .lines()
        .find(|l| l.contains("failed to prove the cluster key"))
        .unwrap_or_else(|| panic!("the master logs the refusal:\n{log}"));
    assert!(refusal.contains("127.0.0.1:"), "{refusal}");
    // Only the three chunkservers with the key are listed, and a file gets three
    // replicas on them.
    let report = report_json(&c);
    let listed = report["chunkservers"].as_array().expect("chunkservers");
    assert_eq!(listed.len(), 3, "{report}");
    let data = pattern(200_000, 7);
    c.put_bytes("/f", &data, &[]);
    assert_eq!(c.cat("/f"), data);
    let st = c.stat_json("/f");
    let replicas = st["chunks"][0]["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 3, "{st}");
}

#[test]
fn the_chunkservers_of_the_cluster_still_register_after_a_master_restart() {
    let mut c = TestCluster::start();
    c.master.restart();
    // Each chunkserver reconnects, proves the key to the new master process and
    // registers again; data written afterwards has its three replicas.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = c
            .run(&["admin", "report", "--json"])
            .status
            .success()
            .then(|| report_json(&c))
            .map(|r| {
                r["chunkservers"]
                    .as_array()
                    .map(|v| v.iter().filter(|s| s["state"] == "live").count())
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        if live == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the chunkservers did not register again"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let data = pattern(100_000, 8);
    c.put_bytes("/after", &data, &[]);
    assert_eq!(c.cat("/after"), data);
    assert_eq!(
        c.stat_json("/after")["chunks"][0]["replicas"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    assert!(
        !c.master
            .log_text()
            .contains("failed to prove the cluster key"),
        "no chunkserver of the cluster was refused"
    );
}
