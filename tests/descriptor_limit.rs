//! A chunkserver whose open-file limit is 256 (soft and hard, so it cannot raise it)
//! holds and serves far more replicas than that: its files go through the bounded
//! descriptor cache (128 open at most, the rest left for sockets). Written through the
//! real client, read back, the chunkserver restarted, and the master's view (its
//! registration and reports) checked to list every replica. A second test gives such
//! a chunkserver more replicas than one report message carries, so it registers and
//! reports in parts. No timing assertions.

mod common;

use common::{pattern, TestCluster};
use serde_json::Value;
use std::time::{Duration, Instant};

const LIMIT: &str = "--nofile=256:256";
const CHUNK: usize = 4096;
const CHUNKS: usize = 5000;

fn under_limit() -> [&'static str; 2] {
    ["prlimit", LIMIT]
}

/// A cluster of a master and no chunkserver (each test adds its own under the limit,
/// with `extra` arguments). The master declares a chunkserver dead after 10 s of
/// silence, not the harness's 2 s: these tests are about descriptors, and their one
/// chunkserver's replicas must not vanish from a reader's view because a loaded
/// machine delayed a heartbeat (a candidate for the one CI failure this test had;
/// the failure message now shows the master's view of the chunkserver either way).
fn cluster(extra: &[&str]) -> TestCluster {
    let mut opts = common::Opts {
        chunkservers: 0,
        master_args: vec!["--dead-after".into(), "10s".into()],
        ..common::Opts::default()
    };
    opts.chunkserver_args
        .extend(extra.iter().map(|a| a.to_string()));
    TestCluster::with(opts)
}

fn wait_for(what: &str, c: &TestCluster, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = c;
}

/// The master's `admin report --json`.
fn report(c: &TestCluster) -> Value {
    serde_json::from_slice(&c.ok(&["admin", "report", "--json"])).expect("report json")
}

/// The process's limit on open files, as the kernel has it: (soft, hard).
fn nofile_of(pid: i32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_string(), f[4].to_string())
}

/// The chunkserver's id in the master's report, its state and its replica count.
fn server_in(report: &Value) -> (u64, String, u64) {
    let cs = &report["chunkservers"][0];
    (
        cs["id"].as_u64().expect("id"),
        cs["state"].as_str().expect("state").to_string(),
        cs["replicas"].as_u64().expect("replicas"),
    )
}

/// `stampfs cat /many`, which must give back `data`. A failure says how long the cat
/// ran and what it printed, and what the master made of the chunkserver just after (a
/// reader is handed out no replica of a chunkserver the master counts dead); a wrong
/// answer, where the bytes first differ.
fn read_back(c: &TestCluster, what: &str, data: &[u8]) {
    let started = Instant::now();
    let out = c.run(&["cat", "/many"]);
    let took = started.elapsed();
    if !out.status.success() {
        panic!(
            "{what}: stampfs cat failed ({}) after {took:.1?}; the master's view of the \
             chunkserver just after: {}\n{}",
            out.status,
            master_view(c),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if out.stdout != data {
        let at = common::common_prefix(&out.stdout, data);
        panic!(
            "{what}: cat gave {} bytes of {} after {took:.1?}, the first difference at byte \
             {at} (chunk {}, byte {} of it); the master's view of the chunkserver: {}\n{}",
            out.stdout.len(),
            data.len(),
            at / CHUNK,
            at % CHUNK,
            master_view(c),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The chunkserver as the master's report has it (state, heartbeat age, replicas), or
/// why the report could not be had; for failure messages.
fn master_view(c: &TestCluster) -> String {
    let out = c.run(&["admin", "report", "--json"]);
    if !out.status.success() {
        return format!(
            "no report ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    match serde_json::from_slice::<Value>(&out.stdout) {
        Ok(r) => r["chunkservers"].to_string(),
        Err(e) => format!("the report is not JSON: {e}"),
    }
}

/// Prints each step with the time since the test started (shown with a failure: a
/// step that ran into a 30 s request timeout shows as such).
struct Steps(Instant);

impl Steps {
    fn at(&self, what: &str) {
        println!("[{:>6.1?}] {what}", self.0.elapsed());
    }
}

#[test]
fn a_chunkserver_limited_to_256_descriptors_holds_and_serves_5000_replicas() {
    let steps = Steps(Instant::now());
    // No periodic chunk report during the test: a report built before a chunk was
    // created and applied after the writer left that chunk drops its replica from the
    // master's view until the next report (a known race, see the README's "What is
    // left"; it failed this test in CI once, one chunk of 5000 unlisted). This test is
    // about descriptors; the registration's report is whole.
    let mut c = cluster(&["--report-every", "1h"]);
    let i = c.add_chunkserver_under(&under_limit());
    c.wait_live(1);
    let pid = c.chunkservers[i].pid();
    assert_eq!(
        nofile_of(pid),
        ("256".into(), "256".into()),
        "the premise: the chunkserver cannot open more than 256 files"
    );
    let log = c.chunkservers[i].log_text();
    assert!(
        log.contains("max_open_files=128"),
        "the cache takes half of the limit:\n{log}"
    );

    // 5000 chunks of 4 KiB (the last one shorter), one replica each.
    let data = pattern(CHUNKS * CHUNK - 1000, 15);
    steps.at("put");
    c.put_bytes(
        "/many",
        &data,
        &["--chunk-size", "4KiB", "--replication", "1"],
    );
    steps.at("stat");
    let st = c.stat_json("/many");
    let chunks = st["chunks"].as_array().expect("chunks");
    assert_eq!(chunks.len(), CHUNKS, "chunks of the file put");
    let unlisted = chunks
        .iter()
        .filter(|c| c["replicas"].as_array().is_none_or(|r| r.len() != 1))
        .count();
    assert!(
        unlisted == 0,
        "{unlisted} chunks are not listed with their replica; the master's view of the \
         chunkserver: {}",
        master_view(&c)
    );
    steps.at("cat");
    read_back(&c, "read back whole", &data);
    steps.at("descriptors");
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .count();
    println!("{open} descriptors open holding {CHUNKS} replicas");
    assert!(open <= 256, "{open} descriptors open");

    // Restarted (under the same limit), it finds every replica, and its registration
    // gives the master all of them.
    steps.at("restart");
    c.chunkservers[i].restart();
    let pid = c.chunkservers[i].pid();
    assert_eq!(nofile_of(pid).1, "256");
    wait_for(
        "the master to list the restarted chunkserver's replicas",
        &c,
        Duration::from_secs(60),
        || {
            let (_, state, replicas) = server_in(&report(&c));
            state == "live" && replicas == CHUNKS as u64
        },
    );
    steps.at("stat after the restart");
    let (id, _, _) = server_in(&report(&c));
    let st = c.stat_json("/many");
    let chunks = st["chunks"].as_array().expect("chunks");
    for (n, chunk) in chunks.iter().enumerate() {
        let replicas = chunk["replicas"].as_array().expect("replicas");
        assert!(
            replicas.len() == 1 && replicas[0]["chunkserver"].as_u64() == Some(id),
            "chunk {n} is listed on the chunkserver: {chunk}"
        );
    }
    steps.at("cat after the restart");
    read_back(&c, "read back after the restart", &data);
    steps.at("fsck");
    let (code, fsck) = common::fsck_json(&c, &["/many"]);
    assert_eq!(code, Some(0), "{fsck}");
}

/// More replicas than one report message holds (64 Ki): the registration and the
/// periodic reports go in parts, and the master has all of them. The replicas are
/// generated on disk before the chunkserver starts; the master does not know their
/// chunks, so it lists them as orphans (deleted only after `--orphan-grace`, 10 min).
#[test]
fn a_chunkserver_of_more_replicas_than_one_report_message_registers_them_all() {
    const REPLICAS: u64 = 70_000;
    // A periodic report every second, so that several go out in parts.
    let mut c = cluster(&["--report-every", "1s"]);
    let dir = c.dir.path().join("cs0");
    stampfs_chunkserver::bench::generate(&dir, REPLICAS, 2).expect("generate replicas");
    let i = c.add_chunkserver_under(&under_limit());
    c.wait_live(1);
    let counts = |c: &TestCluster| {
        let r = report(c);
        (
            server_in(&r).2,
            r["orphan_replicas"].as_u64().expect("orphans"),
        )
    };
    wait_for(
        "the master to list every replica",
        &c,
        Duration::from_secs(60),
        || counts(&c) == (REPLICAS, REPLICAS),
    );
    // The periodic reports that follow, in parts too, keep them all listed.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(counts(&c), (REPLICAS, REPLICAS));
    let log = c.chunkservers[i].log_text();
    assert!(!log.contains("master unreachable"), "{log}");
    assert!(log.contains(&format!("replicas={REPLICAS}")), "{log}");
}
