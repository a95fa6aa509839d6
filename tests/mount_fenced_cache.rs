//! A fenced writer's bytes are never read back through the mount, not even by a
//! descriptor that was open all along (issue 14, the seed-9607 dirty read through a
//! FUSE mount).
//!
//! Without direct I/O the kernel copies each `write(2)` into its page cache before the
//! mount sees it, and serves the reads of descriptors already open from that copy: a
//! fresh `open(2)` drops it, an open descriptor does not. So when the cluster fences
//! the writer (lease recovery took the file, a newer writer wrote over the range), the
//! stale bytes stayed readable through every descriptor the mount's programs held
//! open. The mount now drops the kernel's cache of a file whose writer failed.
//!
//! Needs root and /dev/fuse: in CI (`CI=true`) their absence is a failure; elsewhere
//! the test prints `SKIPPED: <why>`.

mod common;

use common::mount::{fuse_or_skip, MountGuard};
use common::{Opts, TestCluster};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

const LEN: usize = 64 << 10;

fn read_through(f: &std::fs::File) -> Vec<u8> {
    let mut buf = vec![0u8; LEN + 4096];
    let mut n = 0;
    loop {
        let got = f
            .read_at(&mut buf[n..], n as u64)
            .expect("read through the mount");
        if got == 0 {
            break;
        }
        n += got;
    }
    buf.truncate(n);
    buf
}

#[test]
fn a_fenced_writers_bytes_are_dropped_from_the_kernel_cache_of_open_descriptors() {
    if !fuse_or_skip("a_fenced_writers_bytes_are_dropped_from_the_kernel_cache_of_open_descriptors")
    {
        return;
    }
    let c = TestCluster::with(Opts {
        chunkservers: 1,
        master_args: vec!["--replication".into(), "1".into()],
        ..Opts::default()
    });
    let m = MountGuard::start(&c);
    let old = vec![b'o'; LEN];
    let stale = vec![b's'; LEN];
    let new = vec![b'n'; LEN];

    let writer = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("f"))
        .expect("create through the mount");
    writer.write_all_at(&old, 0).expect("write OLD");
    writer.sync_all().expect("fsync OLD");

    // A reader that stays open, with OLD in the kernel's cache.
    let reader = std::fs::File::open(m.path("f")).expect("open for read");
    assert_eq!(read_through(&reader), old, "the reader sees OLD first");

    // The writer overwrites without syncing: the kernel's cache now holds STALE.
    writer.write_all_at(&stale, 0).expect("write STALE");

    // Another client fences it: recovery takes the file, a newer writer writes NEW.
    c.ok(&["recover", "/f"]);
    let local = c.dir.path().join("new.local");
    std::fs::write(&local, &new).expect("write a local copy of NEW");
    c.ok(&[
        "write",
        "/f",
        local.to_str().expect("utf-8 path"),
        "--offset",
        "0",
    ]);
    assert_eq!(c.cat("/f"), new, "the cluster holds NEW");

    // The fenced writer learns it at its next sync.
    let err = writer
        .sync_all()
        .expect_err("a fenced writer's fsync must fail");
    drop(writer);
    eprintln!("fenced writer's fsync: {err}");

    // The mount dropped the kernel's cache before it answered the fsync: the open
    // reader is served what the cluster holds, never STALE.
    let seen = read_through(&reader);
    assert!(
        !seen.contains(&b's'),
        "an open descriptor read the fenced writer's bytes back"
    );
    assert_eq!(seen, new, "the open reader reads NEW");
    assert_eq!(
        std::fs::read(m.path("f")).expect("fresh read"),
        new,
        "a fresh open reads NEW"
    );
}
