//! Gaps cost no disk, against real processes on loopback with both I/O engines: a file
//! grown by `stampfs truncate` and written past its end through `stampfs write` reads
//! the gap as zeros, while its chunkservers' data directories hold a few pages for it
//! instead of the gap's bytes (three times over).

mod common;

use common::files::cluster;
use common::TestCluster;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Disk bytes allocated to the files under `dir`.
fn allocated(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() {
            total += allocated(&e.path());
        } else {
            total += meta.blocks() * 512;
        }
    }
    total
}

fn allocated_by_chunkservers(c: &TestCluster) -> u64 {
    c.chunkservers.iter().map(|p| allocated(&p.dir)).sum()
}

#[test]
fn a_gap_reads_as_zeros_and_costs_no_disk() {
    for engine in ["uring", "threads"] {
        let c = cluster(engine);
        let before = allocated_by_chunkservers(&c);
        c.put_bytes("/gap", b"head", &["--chunk-size", "16MiB"]);
        // 40 MiB of gap over three chunks: grown by truncate, then written past the end.
        c.ok(&["truncate", "/gap", "30000000"]);
        let out = c.run_stdin(&["write", "/gap", "--offset", "40000000", "-"], b"tail");
        assert!(
            out.status.success(),
            "{engine}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let data = c.cat("/gap");
        assert_eq!(data.len(), 40_000_004, "{engine}");
        assert_eq!(&data[..4], b"head", "{engine}");
        assert_eq!(&data[40_000_000..], b"tail", "{engine}");
        assert!(
            data[4..40_000_000].iter().all(|b| *b == 0),
            "{engine}: the gap reads as zeros"
        );
        let st = c.stat_json("/gap");
        assert_eq!(st["chunks"].as_array().map(Vec::len), Some(3), "{engine}");
        // Three replicas of 40 MB of gap would be 120 MB; each replica's header,
        // checksum table and the pages around the gap's ends are a few dozen KiB.
        let used = allocated_by_chunkservers(&c).saturating_sub(before);
        assert!(
            used < 8 << 20,
            "{engine}: the chunkservers hold {used} more bytes for a file of 8 bytes and a 40 MB gap"
        );
    }
}
