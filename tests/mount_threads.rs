//! The mount's request threads (`stampfs mount --threads`): a namespace request is
//! served to its end on the thread that read it from the kernel, so one waiting for a
//! frozen master holds that thread and nothing else. Needs root and /dev/fuse (see
//! `tests/mount.rs`).

mod common;

use common::mount::{fuse_or_skip, MountGuard};
use common::{pattern, TestCluster};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Runs `f` on a thread of its own and waits at most `limit` for its result: a request
/// the mount never answers fails the test instead of hanging it.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"))
}

/// With the master frozen, `lookups` lookups of new names wait for it while a read of
/// an open file must still be served.
fn reads_go_on_while_lookups_wait(threads: &str, lookups: usize) {
    let c = TestCluster::start();
    // Attributes trusted long enough that reading the open file asks the master
    // nothing while it is frozen.
    let m = MountGuard::start_with(&c, &["--threads", threads, "--cache-timeout", "60s"]);
    let data = pattern(4 * MIB, 7);
    std::fs::write(m.path("f"), &data).expect("write through the mount");
    let f = File::open(m.path("f")).expect("open");
    let mut head = vec![0u8; 4096];
    f.read_exact_at(&mut head, 0).expect("read the first page");
    assert_eq!(head, data[..4096]);

    c.master.stop();
    // Names nobody looked up yet: their lookups go to the master and wait there.
    let mut waiting = Vec::new();
    for i in 0..lookups {
        let missing = m.path(&format!("not-yet-{i}"));
        let (started_tx, started_rx) = mpsc::channel();
        waiting.push(std::thread::spawn(move || {
            let _ = started_tx.send(());
            std::fs::metadata(missing)
        }));
        started_rx.recv().expect("lookup thread started");
    }
    std::thread::sleep(Duration::from_millis(300));
    // A read of the open file far past what the kernel read ahead: the reader knows
    // the chunk's replicas, so no master is needed, and a thread is free to read it.
    let tail = within(
        Duration::from_secs(20),
        "a read while lookups wait",
        move || {
            let mut buf = vec![0u8; 64 * 1024];
            let at = 3 * MIB as u64;
            f.read_exact_at(&mut buf, at).map(|()| buf)
        },
    )
    .expect("read of the open file while the master is frozen");
    c.master.cont();
    assert_eq!(tail, data[3 * MIB..3 * MIB + 64 * 1024]);
    for w in waiting {
        let looked = w.join().expect("lookup thread");
        assert_eq!(
            looked.expect_err("nothing made that name").kind(),
            std::io::ErrorKind::NotFound
        );
    }
    // The threads that waited serve again.
    std::fs::write(m.path("after"), b"x").expect("create after the thaw");
    assert_eq!(std::fs::read(m.path("after")).expect("read back"), b"x");
}

#[test]
fn lookups_waiting_for_a_frozen_master_hold_up_no_read_of_an_open_file() {
    if !fuse_or_skip("lookups_waiting_for_a_frozen_master_hold_up_no_read_of_an_open_file") {
        return;
    }
    // Two threads: one serves a lookup inline, the other stays free (the second
    // lookup becomes a task); one thread: every request is a task.
    reads_go_on_while_lookups_wait("2", 3);
    reads_go_on_while_lookups_wait("1", 2);
}
