//! Review finding: the client writer has no ack timeout. When the pipeline's head
//! chunkserver is frozen (SIGSTOP, VM pause) its kernel still accepts the TCP bytes,
//! no ack ever comes back and no error is ever raised, so `hflush`/`close` wait
//! forever; the lease-renewal task keeps the lease alive, so lease recovery never runs
//! either. The writer should route around the head (pipeline recovery) or fail.

mod common;

use common::{pattern, TestCluster};
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn a_writer_does_not_hang_forever_on_a_frozen_pipeline_head() {
    let c = TestCluster::start();
    let first = pattern(200_000, 3);
    let mut w = c
        .cmd(&["put", "-", "/frozen"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn writer");
    let mut stdin = w.stdin.take().expect("stdin");
    stdin.write_all(&first).expect("feed");
    stdin.flush().expect("flush");
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.run(&["cat", "/frozen"]).stdout.len() < first.len() {
        assert!(Instant::now() < deadline, "first bytes never acknowledged");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The head of the pipeline is the first replica listed (pipeline order).
    let st = c.stat_json("/frozen");
    let head_addr = st["chunks"][0]["replicas"][0]["addr"]
        .as_str()
        .expect("head addr")
        .to_string();
    let head = c
        .chunkservers
        .iter()
        .position(|p| p.addr == head_addr)
        .expect("head chunkserver");
    c.chunkservers[head].stop();

    // Less than a pipe buffer, so feeding it never blocks the test itself.
    let more = pattern(40_000, 4);
    stdin.write_all(&more).expect("feed more");
    drop(stdin); // EOF: put sends it, waits for its acks, and closes.

    // Generous: the client's own request timeout is 30 s.
    let limit = Duration::from_secs(45);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(s)) = w.try_wait() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = w.kill();
            let _ = w.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    c.chunkservers[head].cont();
    let status = status.unwrap_or_else(|| {
        panic!(
            "the writer neither finished nor failed within {limit:?} of the pipeline head \
             being frozen: it waits for acks with no timeout"
        )
    });
    // The frozen head is dropped by pipeline recovery; the write completes on the others.
    assert!(status.success(), "put failed: {status}");
    let mut want = first;
    want.extend_from_slice(&more);
    assert!(
        c.cat("/frozen") == want,
        "file differs after recovering from a frozen head"
    );
}
