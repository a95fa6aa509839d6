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

#[test]
fn a_lookup_waiting_for_a_frozen_master_holds_up_no_read_of_an_open_file() {
    if !fuse_or_skip("a_lookup_waiting_for_a_frozen_master_holds_up_no_read_of_an_open_file") {
        return;
    }
    let c = TestCluster::start();
    // Two threads; attributes trusted long enough that reading the open file asks the
    // master nothing while it is frozen.
    let m = MountGuard::start_with(&c, &["--threads", "2", "--cache-timeout", "60s"]);
    let data = pattern(4 * MIB, 7);
    std::fs::write(m.path("f"), &data).expect("write through the mount");
    let f = File::open(m.path("f")).expect("open");
    let mut head = vec![0u8; 4096];
    f.read_exact_at(&mut head, 0).expect("read the first page");
    assert_eq!(head, data[..4096]);

    c.master.stop();
    // A name nobody looked up yet: its lookup goes to the master and waits there,
    // holding one of the two threads.
    let missing = m.path("not-yet");
    let (started_tx, started_rx) = mpsc::channel();
    let lookup = std::thread::spawn(move || {
        let _ = started_tx.send(());
        std::fs::metadata(missing)
    });
    started_rx.recv().expect("lookup thread started");
    std::thread::sleep(Duration::from_millis(300));
    // The other thread reads the open file far past what the kernel read ahead: the
    // reader knows the chunk's replicas, so no master is needed.
    let tail = within(
        Duration::from_secs(20),
        "a read while a lookup waits",
        move || {
            let mut buf = vec![0u8; 64 * 1024];
            let at = 3 * MIB as u64;
            f.read_exact_at(&mut buf, at).map(|()| buf)
        },
    )
    .expect("read of the open file while the master is frozen");
    c.master.cont();
    assert_eq!(tail, data[3 * MIB..3 * MIB + 64 * 1024]);
    let looked = lookup.join().expect("lookup thread");
    assert_eq!(
        looked.expect_err("nothing made that name").kind(),
        std::io::ErrorKind::NotFound
    );
    // The thread that waited serves again.
    std::fs::write(m.path("after"), b"x").expect("create after the thaw");
    assert_eq!(std::fs::read(m.path("after")).expect("read back"), b"x");
}
