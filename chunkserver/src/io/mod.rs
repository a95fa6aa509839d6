//! Disk I/O behind a small trait, with an io_uring and a plain-threads implementation.
//!
//! The store never touches a file descriptor directly: it asks an [`IoEngine`] to read a
//! range, or to run a *chain* of [`IoOp`]s in order (each starting only after the
//! previous one completed, stopping at the first error). The io_uring engine submits a
//! chain as linked SQEs (`IO_LINK`), which is how a version change becomes "header
//! write, then fsync" in one submission; the threads engine runs it step by step on
//! tokio's blocking pool.
//!
//! [`open_engine`] picks the engine for `--io-engine`; `auto` probes io_uring (builds a
//! ring, runs a NOP) and falls back to threads.

pub mod sparse;
mod threads;
mod uring;

pub use threads::{punch_hole, ThreadsEngine};
pub use uring::UringEngine;

use crate::config::IoEngineKind;
use crate::error::{Error, Result};
use bytes::Bytes;
use std::fs::File;
use std::io;
use std::sync::Arc;

/// One step of a chain.
#[derive(Clone, Debug)]
pub enum IoOp {
    /// Write all of `data` at `offset` (short writes are continued).
    Write { offset: u64, data: Bytes },
    /// Write `bufs` back to back starting at `offset`, as one vectored write where the
    /// engine can (short writes are continued). Keeps a batch of packets one syscall.
    Writev { offset: u64, bufs: Vec<Bytes> },
    /// Start writing `len` bytes at `offset` back to the disk now, without waiting
    /// for them (write-behind, so a later sync finds little left to do). A hint: it
    /// makes nothing durable. io_uring: `sync_file_range(SYNC_FILE_RANGE_WRITE)`;
    /// threads: `posix_fadvise(DONTNEED)`, which starts the writeback the same way.
    WriteBehind { offset: u64, len: u64 },
    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`: `len` bytes at
    /// `offset` read as zeros and hold no disk blocks; the file's size is unchanged
    /// (see [`sparse`]). Only on a file system whose store probed it works.
    PunchHole { offset: u64, len: u64 },
    /// `fdatasync`.
    SyncData,
    /// `fsync`.
    SyncAll,
}

/// How the store reads and writes replica files.
#[async_trait::async_trait]
pub trait IoEngine: Send + Sync + 'static {
    /// `"uring"` or `"threads"`.
    fn name(&self) -> &'static str;

    /// Reads `len` bytes at `offset`; fewer only when the file ends first.
    async fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> io::Result<Vec<u8>>;

    /// Runs `ops` in order, each after the previous one completed; stops at the first
    /// error. The chain runs to its end even if the caller stops waiting.
    async fn run(&self, file: Arc<File>, ops: Vec<IoOp>) -> io::Result<()>;

    /// Sets the file's length (`ftruncate`).
    async fn set_len(&self, file: Arc<File>, len: u64) -> io::Result<()> {
        tokio::task::spawn_blocking(move || file.set_len(len))
            .await
            .map_err(|e| io::Error::other(format!("set_len task failed: {e}")))?
    }
}

/// Whether io_uring works here: a ring can be built and a NOP completes.
pub fn uring_available() -> std::result::Result<(), String> {
    uring::probe().map_err(|e| e.to_string())
}

/// The engine for `kind`, logging which one runs.
pub fn open_engine(kind: IoEngineKind) -> Result<Arc<dyn IoEngine>> {
    let engine: Arc<dyn IoEngine> = match kind {
        IoEngineKind::Threads => Arc::new(ThreadsEngine::new()),
        IoEngineKind::Uring => {
            Arc::new(UringEngine::new().map_err(|e| Error::io("start io_uring engine", "", e))?)
        }
        IoEngineKind::Auto => match UringEngine::new() {
            Ok(e) => Arc::new(e),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable; falling back to the threads engine");
                Arc::new(ThreadsEngine::new())
            }
        },
    };
    tracing::info!(engine = engine.name(), requested = ?kind, "I/O engine selected");
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    async fn exercise(engine: Arc<dyn IoEngine>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .expect("open"),
        );
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        engine
            .run(
                file.clone(),
                vec![
                    IoOp::Write {
                        offset: 10,
                        data: Bytes::from(big.clone()),
                    },
                    IoOp::SyncData,
                    IoOp::Write {
                        offset: 0,
                        data: Bytes::from_static(b"0123456789"),
                    },
                    IoOp::SyncAll,
                ],
            )
            .await
            .expect("chain");
        let mut check = vec![0u8; 10 + big.len()];
        file.read_exact_at(&mut check, 0).expect("read back");
        assert_eq!(&check[..10], b"0123456789");
        assert_eq!(&check[10..], &big[..]);
        let got = engine.read_at(file.clone(), 5, 100).await.expect("read");
        assert_eq!(got, check[5..105].to_vec());
        // Reading past the end returns what exists.
        let got = engine
            .read_at(file.clone(), check.len() as u64 - 3, 100)
            .await
            .expect("read tail");
        assert_eq!(got, check[check.len() - 3..].to_vec());
        let got = engine
            .read_at(file.clone(), 10 << 20, 10)
            .await
            .expect("read beyond");
        assert!(got.is_empty());
        // A vectored write lands its buffers back to back (and empty ones are fine).
        let parts: Vec<Bytes> = vec![
            Bytes::from_static(b"abc"),
            Bytes::new(),
            Bytes::from(big[..100_000].to_vec()),
            Bytes::from_static(b"xyz"),
        ];
        let end = 10 + big.len() as u64;
        engine
            .run(
                file.clone(),
                vec![
                    IoOp::Writev {
                        offset: end,
                        bufs: parts.clone(),
                    },
                    IoOp::Writev {
                        offset: end + 100_006,
                        bufs: Vec::new(),
                    },
                    IoOp::SyncData,
                ],
            )
            .await
            .expect("writev chain");
        let want: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
        let mut got = vec![0u8; want.len()];
        file.read_exact_at(&mut got, end).expect("read writev");
        assert_eq!(got, want);
        engine.set_len(file.clone(), 7).await.expect("set_len");
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), 7);
        // Many concurrent chains complete.
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let e = engine.clone();
            let f = file.clone();
            tasks.push(tokio::spawn(async move {
                e.run(
                    f.clone(),
                    vec![IoOp::Write {
                        offset: 1000 + i * 8,
                        data: Bytes::from(i.to_le_bytes().to_vec()),
                    }],
                )
                .await
                .expect("write");
                let back = e.read_at(f, 1000 + i * 8, 8).await.expect("read");
                assert_eq!(back, i.to_le_bytes().to_vec());
            }));
        }
        for t in tasks {
            t.await.expect("join");
        }
    }

    #[tokio::test]
    async fn threads_engine_reads_writes_and_chains() {
        exercise(Arc::new(ThreadsEngine::new())).await;
    }

    #[tokio::test]
    async fn uring_engine_reads_writes_and_chains() {
        match UringEngine::new() {
            Ok(e) => exercise(Arc::new(e)).await,
            Err(e) => {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "io_uring must be available in CI: {e}"
                );
                println!("SKIPPED: io_uring unavailable: {e}");
            }
        }
    }

    #[tokio::test]
    async fn errors_are_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").expect("write");
        let ro = Arc::new(std::fs::File::open(&path).expect("open"));
        let mut engines: Vec<Arc<dyn IoEngine>> = vec![Arc::new(ThreadsEngine::new())];
        if let Ok(e) = UringEngine::new() {
            engines.push(Arc::new(e));
        }
        for e in engines {
            let err = e
                .run(
                    ro.clone(),
                    vec![IoOp::Write {
                        offset: 0,
                        data: Bytes::from_static(b"y"),
                    }],
                )
                .await
                .unwrap_err();
            assert_eq!(err.raw_os_error(), Some(9), "{}: {err}", e.name());
        }
    }
}
