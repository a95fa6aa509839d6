//! A read through the mount never comes back short below the size the kernel was
//! told of the file (the nemesis's seed 9941). The kernel fills the rest of a short
//! read's pages with zeros, and when the file's attributes changed during the read it
//! keeps them and shows them: a reader saw zeros where acknowledged records were.
//!
//! The readable length of a file being written can fall back for a while: a master
//! that restarted lists the open last chunk's replicas only once every member of the
//! writer's pipeline has registered again, and until then readers may read only what
//! is committed. Real processes: a library writer hflushes, the mount shows the
//! hflushed size, one chunkserver of the pipeline is frozen and the master restarted;
//! a read of the file through the mount then fails (EIO) or returns every byte, never
//! fewer. Once the chunkserver is back, the mount reads the whole file.

mod common;

use common::mount::{fuse_or_skip, MountGuard};
use common::{pattern, runtime, TestCluster};
use std::time::{Duration, Instant};

#[test]
fn a_file_whose_readable_length_falls_back_is_never_read_short_through_the_mount() {
    if !fuse_or_skip("a_file_whose_readable_length_falls_back_is_never_read_short") {
        return;
    }
    let mut c = TestCluster::start();
    // The kernel and the mount keep the size they learned for the whole test.
    let m = MountGuard::start_with(&c, &["--cache-timeout", "60s"]);
    let data = pattern(600_000, 41);
    runtime().block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let mut w = common::hflushed_writer(&client, "/f", &data).await;

        let size = std::fs::metadata(m.path("f")).expect("stat").len();
        assert_eq!(size, data.len() as u64, "the mount shows the hflushed size");

        // Every chunkserver holds the open last chunk (three replicas of three); one
        // frozen and the master restarted, readers may read only the committed chunks.
        c.chunkservers[0].stop();
        c.master.restart();
        // The two others register again (every 200 ms), the frozen one cannot.
        std::thread::sleep(Duration::from_millis(1500));
        let started = Instant::now();
        match std::fs::read(m.path("f")) {
            Ok(bytes) => {
                assert_eq!(
                    bytes.len(),
                    data.len(),
                    "a read shorter than the size shown"
                );
                assert!(
                    bytes == data,
                    "a read returned other bytes than were written"
                );
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the read gave up within its retries"
        );

        // The chunkserver back: the whole file reads again.
        c.chunkservers[0].cont();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match std::fs::read(m.path("f")) {
                Ok(bytes) if bytes == data => break,
                Ok(bytes) => assert!(
                    bytes.len() == data.len() && bytes == data,
                    "a read of {} bytes that is not the file",
                    bytes.len()
                ),
                Err(e) => {
                    assert!(Instant::now() < deadline, "still failing: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        w.close().await.expect("close");
    });
    let log = m.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
