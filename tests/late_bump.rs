//! Review finding: a version bump that reaches a replica *after* the master gave up on
//! it (command timeout; the chunkserver was frozen and processes the queued command
//! when it wakes) makes that replica "current" although it was left out of the
//! pipeline and misses every byte written under the new version. The master tracks no
//! replica lengths, so it hands the short replica to readers, and the reader takes a
//! short reply as the end of the chunk: `cat` silently returns a truncated file.

mod common;

use common::{pattern, Opts, TestCluster};
use std::time::{Duration, Instant};

#[test]
fn a_replica_that_took_a_late_bump_is_not_served_short() {
    let mut c = TestCluster::with(Opts {
        master_args: vec!["--command-timeout".into(), "1s".into()],
        chunkserver_args: vec![
            "--heartbeat".into(),
            "200ms".into(),
            "--report-every".into(),
            "300ms".into(),
        ],
        ..Opts::default()
    });
    let a = pattern(100_000, 31);
    c.put_bytes("/late", &a, &[]);
    let st = c.stat_json("/late");
    let x_addr = st["chunks"][0]["replicas"][0]["addr"]
        .as_str()
        .expect("replica addr")
        .to_string();
    let x = c
        .chunkservers
        .iter()
        .position(|p| p.addr == x_addr)
        .expect("replica's chunkserver");

    // X freezes; an append bumps the chunk: X's bump times out, the append goes on
    // with the two others and closes.
    c.chunkservers[x].stop();
    let b = pattern(200_000, 32);
    let out = c.run_stdin(&["append", "-", "/late"], &b);
    assert!(
        out.status.success(),
        "append: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // X wakes up and carries out the bump that was waiting in its socket.
    c.chunkservers[x].cont();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = c.stat_json("/late");
        let reps = st["chunks"][0]["replicas"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if reps.iter().any(|r| r["addr"] == x_addr.as_str()) {
            break;
        }
        if Instant::now() > deadline {
            // X never became current: the scenario did not happen here (not a failure
            // of the property under test).
            eprintln!("SKIPPED: the late bump did not reach X");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The two complete replicas go away; only X is left.
    for (i, p) in c.chunkservers.iter_mut().enumerate() {
        if i != x {
            p.kill();
        }
    }
    std::thread::sleep(Duration::from_millis(2600));
    let out = c.run(&["cat", "/late"]);
    let mut want = a.clone();
    want.extend_from_slice(&b);
    assert!(
        !out.status.success() || out.stdout == want,
        "cat succeeded with {} bytes of the {} committed: a short replica was served",
        out.stdout.len(),
        want.len()
    );
}
