//! A write whose chain fails part-way (the disk fills up after the data and checksum
//! writes landed, before the flush) must leave the replica exactly as it was: its
//! acknowledged bytes readable, at once, after a finalize and after a restart.
//!
//! Regression for a replica the nemesis saw moved aside as corrupt: a chunkserver whose
//! disk was full failed an hsync with ENOSPC after the table entry of the partial last
//! block had been overwritten with the CRC of the longer, never-acknowledged content;
//! the next read checked the acknowledged bytes against that entry, called the only
//! replica of the chunk corrupt and quarantined it. The fault here is a fail point in
//! the I/O engine: it runs a chain up to its first flush and fails there with ENOSPC.

mod common;

use bytes::Bytes;
use common::{engine, engines, init_tracing, pattern};
use stampfs_chunkserver::io::{IoEngine, IoOp};
use stampfs_chunkserver::store::Store;
use stampfs_proto::{ChunkHandle, ChunkVersion};
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const H: ChunkHandle = ChunkHandle(0x77);

/// An engine that, once armed, runs the next chain only up to its first `SyncData`
/// and then fails it with ENOSPC, as a full disk does.
struct FailAtFlush {
    inner: Arc<dyn IoEngine>,
    armed: AtomicBool,
}

#[async_trait::async_trait]
impl IoEngine for FailAtFlush {
    fn name(&self) -> &'static str {
        "fail-at-flush"
    }

    async fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.inner.read_at(file, offset, len).await
    }

    async fn run(&self, file: Arc<File>, ops: Vec<IoOp>) -> std::io::Result<()> {
        if !self.armed.swap(false, Ordering::SeqCst) {
            return self.inner.run(file, ops).await;
        }
        let before: Vec<IoOp> = ops
            .into_iter()
            .take_while(|op| !matches!(op, IoOp::SyncData | IoOp::SyncAll))
            .collect();
        self.inner.run(file, before).await?;
        Err(std::io::Error::from_raw_os_error(28))
    }
}

#[tokio::test]
async fn an_hsync_that_fails_after_its_table_write_leaves_the_acknowledged_bytes_readable() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fail = Arc::new(FailAtFlush {
            inner: engine(kind),
            armed: AtomicBool::new(false),
        });
        let s = Store::open(dir.path(), fail.clone()).await.expect("open");
        let v1 = ChunkVersion(1);
        s.bump_version(H, v1, true).await.expect("create");
        let data = pattern(30_000, 9);
        // Acknowledged: 10 000 bytes, hsynced (a partial first block).
        s.write(H, v1, 0, Bytes::copy_from_slice(&data[..10_000]), true)
            .await
            .expect("first hsync");
        // The next hsync fails at its flush, after its data and table writes.
        fail.armed.store(true, Ordering::SeqCst);
        let failed = s
            .write(H, v1, 10_000, Bytes::copy_from_slice(&data[10_000..]), true)
            .await;
        assert!(failed.is_err(), "{kind:?}: the failed hsync must fail");
        // A batch's path too (what the pipeline uses).
        fail.armed.store(true, Ordering::SeqCst);
        let out = s
            .write_batch(
                H,
                stampfs_chunkserver::store::WriteMode::Append,
                vec![stampfs_chunkserver::store::PacketWrite {
                    version: v1,
                    offset: 10_000,
                    data: Bytes::copy_from_slice(&data[10_000..20_000]),
                    crc: None,
                    sync: true,
                }],
            )
            .await;
        assert!(out.error.is_some(), "{kind:?}: the failed batch must fail");

        let (report, got) = s
            .read(H, v1, 0, 1 << 20)
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: the acknowledged bytes must stay readable: {e}"));
        assert_eq!(report.length, 10_000, "{kind:?}");
        assert_eq!(&got[..], &data[..10_000], "{kind:?}");
        assert!(s.take_corrupt().is_empty(), "{kind:?}: nothing quarantined");

        // Lease recovery's steps: a bump, then finalize at the length.
        let v2 = ChunkVersion(2);
        s.bump_version(H, v2, false).await.expect("bump");
        s.finalize(H, v2, 10_000).await.expect("finalize");
        let (_, got) = s
            .read(H, v2, 0, 1 << 20)
            .await
            .expect("read after finalize");
        assert_eq!(&got[..], &data[..10_000], "{kind:?}");
        drop(s);

        // And after a restart, with a healthy engine.
        let s = Store::open(dir.path(), engine(kind)).await.expect("reopen");
        assert!(
            s.take_corrupt().is_empty(),
            "{kind:?}: nothing corrupt at start-up"
        );
        let (report, got) = s.read(H, v2, 0, 1 << 20).await.expect("read after restart");
        assert_eq!(report.length, 10_000);
        assert_eq!(&got[..], &data[..10_000], "{kind:?}");
    }
}
