//! The plain-threads engine: `pread`/`pwrite`/`fdatasync` on tokio's blocking pool.

use super::{IoEngine, IoOp};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Runs each request as one blocking task.
#[derive(Debug, Default)]
pub struct ThreadsEngine;

impl ThreadsEngine {
    pub fn new() -> Self {
        Self
    }
}

fn joined<T>(r: Result<io::Result<T>, tokio::task::JoinError>) -> io::Result<T> {
    r.map_err(|e| io::Error::other(format!("blocking I/O task failed: {e}")))?
}

#[async_trait::async_trait]
impl IoEngine for ThreadsEngine {
    fn name(&self) -> &'static str {
        "threads"
    }

    async fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        joined(
            tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; len];
                let mut filled = 0;
                while filled < len {
                    match file.read_at(&mut buf[filled..], offset + filled as u64) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                buf.truncate(filled);
                Ok(buf)
            })
            .await,
        )
    }

    async fn run(&self, file: Arc<File>, ops: Vec<IoOp>) -> io::Result<()> {
        joined(
            tokio::task::spawn_blocking(move || {
                for op in ops {
                    match op {
                        IoOp::Write { offset, data } => file.write_all_at(&data, offset)?,
                        IoOp::SyncData => file.sync_data()?,
                        IoOp::SyncAll => file.sync_all()?,
                    }
                }
                Ok(())
            })
            .await,
        )
    }
}
