//! The scan benchmark's generator and measure at a tiny size, so that they cannot rot
//! (no figure is asserted): every generated replica loads, serves its bytes, and is in
//! the report.

mod common;

use common::{engine, init_tracing};
use stampfs_chunkserver::bench;
use stampfs_chunkserver::store::Store;
use stampfs_chunkserver::IoEngineKind;
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaState};

#[tokio::test]
async fn generated_replicas_load_serve_and_are_measured() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let n = 1500;
    let generated = bench::generate(dir.path(), n, 2).expect("generate");
    assert_eq!(generated.replicas, n);
    bench::drop_cached_pages(dir.path()).expect("drop cached pages");
    let f = bench::measure(dir.path(), engine(IoEngineKind::Threads))
        .await
        .expect("measure");
    assert_eq!((f.replicas, f.corrupt), (n, 0));
    println!("{f:?}");
    let s = Store::open(dir.path(), engine(IoEngineKind::Threads))
        .await
        .expect("open");
    let reports = s.reports().await;
    assert_eq!(reports.len() as u64, n);
    assert!(reports
        .iter()
        .enumerate()
        .all(|(i, r)| r.handle == ChunkHandle(i as u64 + 1) && r.state == ReplicaState::Finalized));
    // A generated replica is a real one: its bytes (zeros) read back verified.
    for h in [1, 255, 256, 257, n] {
        let r = reports[h as usize - 1];
        let (_, data) = s
            .read(ChunkHandle(h), ChunkVersion(1), 0, 1 << 20)
            .await
            .expect("read");
        assert_eq!(data.len() as u64, r.length);
        assert!(data.iter().all(|b| *b == 0));
    }
}
