//! The scenarios stampfs exists for, with real processes: a writer that died, a writer
//! that froze past its lease (SIGSTOP) and woke up, master restarts in between, and
//! recovery with a replica down. The rejection of the late writer must come from the
//! chunkservers.

mod common;

use common::{pattern, Opts, TestCluster};
use std::io::Write;
use std::process::{Child, ChildStdin, Stdio};
use std::time::{Duration, Instant};

fn opts(soft: &str, hard: &str) -> Opts {
    Opts {
        master_args: vec![
            "--lease-soft".into(),
            soft.into(),
            "--lease-hard".into(),
            hard.into(),
        ],
        ..Opts::default()
    }
}

/// Starts `put - PATH` and feeds it `first`, then waits until a reader sees all of it
/// (put hflushes when its input pauses, so it is acknowledged by every replica).
fn start_writer(c: &TestCluster, path: &str, first: &[u8]) -> (Child, ChildStdin) {
    let mut w = c
        .cmd(&["put", "-", path])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn writer");
    let mut stdin = w.stdin.take().expect("stdin");
    stdin.write_all(first).expect("feed writer");
    stdin.flush().expect("flush");
    wait_for(
        || c.run(&["cat", path]).stdout.len() >= first.len(),
        "the writer's first bytes to be acknowledged",
    );
    (w, stdin)
}

fn last_version(c: &TestCluster, path: &str) -> u64 {
    let st = c.stat_json(path);
    st["chunks"]
        .as_array()
        .and_then(|a| a.last())
        .and_then(|ch| ch["version"].as_u64())
        .expect("last chunk version")
}

fn wait_for(mut f: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_killed_writer_is_recovered_when_another_client_appends() {
    let c = TestCluster::with(opts("2s", "60s"));
    let a = pattern(300_000, 1);
    let (mut w, stdin) = start_writer(&c, "/killed", &a);
    let v_before = last_version(&c, "/killed");
    w.kill().expect("SIGKILL the writer");
    let _ = w.wait();
    drop(stdin);
    // Before the soft limit the dead writer's lease still stands; after it, another
    // client's append takes the file over through lease recovery.
    let out = c.run_stdin(&["append", "-", "/killed"], b"too early");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("being written by"));
    std::thread::sleep(Duration::from_millis(2200));
    let b = pattern(70_000, 2);
    let t = Instant::now();
    let out = c.run_stdin(&["append", "-", "/killed"], &b);
    assert!(
        out.status.success(),
        "append after a killed writer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "append waited for recovery, boundedly"
    );
    let got = c.cat("/killed");
    assert!(
        got.len() >= a.len() + b.len(),
        "acknowledged bytes were cut"
    );
    let (prefix, tail) = got.split_at(got.len() - b.len());
    assert!(
        a.starts_with(prefix),
        "the file starts with a prefix of A's data"
    );
    assert_eq!(
        prefix.len(),
        a.len(),
        "every acknowledged byte of A is kept"
    );
    assert!(tail == b, "followed by the new data");
    assert!(
        last_version(&c, "/killed") > v_before,
        "the chunk version went up"
    );
}

/// The scenario that motivates the project.
fn paused_writer_is_fenced(restart_master: bool) {
    let mut c = TestCluster::with(opts("1s", "3s"));
    let a = pattern(200_000, 10);
    let (mut w1, mut w1_in) = start_writer(&c, "/paused", &a);
    let v1 = last_version(&c, "/paused");
    let pid = nix::unistd::Pid::from_raw(w1.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    if restart_master {
        c.master.kill();
        c.master.restart();
        c.wait_live(3);
    }
    // W2 takes the file over once the lease has lapsed (the soft limit is 1 s; after a
    // master restart every lease starts a fresh timer).
    std::thread::sleep(Duration::from_millis(1500));
    let b = pattern(90_000, 11);
    let out = c.run_stdin(&["append", "-", "/paused"], &b);
    assert!(
        out.status.success(),
        "W2's append: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v2 = last_version(&c, "/paused");
    assert!(v2 > v1, "W2 writes under a newer version ({v1} -> {v2})");
    // W1 wakes up and writes with its old token.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    let late = vec![b'X'; 300_000];
    let _ = w1_in.write_all(&late);
    drop(w1_in);
    let status = wait_exit(&mut w1, Duration::from_secs(30));
    let mut err = String::new();
    if let Some(mut e) = w1.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert_eq!(status, Some(3), "W1 must exit with status 3; stderr: {err}");
    assert!(err.contains("fenced"), "{err}");
    assert!(
        err.contains(&format!("presented version {v1}")),
        "the rejection names the stale version: {err}"
    );
    let got = c.cat("/paused");
    let mut want = a.clone();
    want.extend_from_slice(&b);
    assert!(
        got == want,
        "file must be A's acknowledged data then all of B's"
    );
    assert!(
        !got.windows(64).any(|w| w.iter().all(|&b| b == b'X')),
        "none of W1's late bytes landed"
    );
    assert!(last_version(&c, "/paused") >= v2, "versions never go back");
}

#[test]
fn a_paused_writer_is_fenced_by_the_chunkservers() {
    paused_writer_is_fenced(false);
}

#[test]
fn a_paused_writer_is_fenced_across_a_master_restart() {
    paused_writer_is_fenced(true);
}

#[test]
fn recovery_with_a_replica_down_closes_the_file_on_the_others() {
    let mut c = TestCluster::with(opts("1s", "60s"));
    let a = pattern(150_000, 20);
    let (mut w, stdin) = start_writer(&c, "/degraded", &a);
    let st = c.stat_json("/degraded");
    let down_addr = st["chunks"][0]["replicas"][2]["addr"]
        .as_str()
        .expect("replica addr")
        .to_string();
    let v1 = last_version(&c, "/degraded");
    w.kill().expect("kill writer");
    let _ = w.wait();
    drop(stdin);
    let down = c
        .chunkservers
        .iter()
        .position(|p| p.addr == down_addr)
        .expect("replica's chunkserver");
    c.chunkservers[down].kill();
    let out = c.ok(&["recover", "/degraded"]);
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("closed at"), "{text}");
    let st = c.stat_json("/degraded");
    assert_eq!(st["state"], "closed");
    assert_eq!(st["length"], a.len() as u64);
    let replicas = st["chunks"][0]["replicas"].as_array().expect("replicas");
    assert_eq!(
        replicas.len(),
        2,
        "only the two bumped replicas serve: {st}"
    );
    assert!(replicas.iter().all(|r| r["addr"] != down_addr.as_str()));
    assert!(last_version(&c, "/degraded") > v1);
    assert!(c.cat("/degraded") == a);
    // The replica that missed the bump comes back stale and is never handed out.
    c.chunkservers[down].restart();
    std::thread::sleep(Duration::from_millis(800));
    let st = c.stat_json("/degraded");
    let replicas = st["chunks"][0]["replicas"].as_array().expect("replicas");
    assert!(
        replicas.iter().all(|r| r["addr"] != down_addr.as_str()),
        "a stale replica must not be handed out: {st}"
    );
    assert!(c.cat("/degraded") == a);
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("writer did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
