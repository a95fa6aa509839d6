//! The plain-threads engine: `pread`/`pwrite`/`fdatasync` on tokio's blocking pool.

use super::{IoEngine, IoOp};
use bytes::Bytes;
use rustix::fs::Advice;
use std::fs::File;
use std::io::{self, IoSlice};
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

/// Most buffers in one `pwritev` (the kernel's `UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// `pwritev` until every byte of `bufs` is written at `offset` onwards.
fn write_all_vectored_at(file: &File, bufs: &[Bytes], offset: u64) -> io::Result<()> {
    let total: usize = bufs.iter().map(Bytes::len).sum();
    let mut done = 0usize;
    while done < total {
        let mut skip = done;
        let mut slices = Vec::with_capacity(bufs.len().min(MAX_IOVECS));
        for b in bufs {
            if slices.len() == MAX_IOVECS {
                break;
            }
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            slices.push(IoSlice::new(&b[skip..]));
            skip = 0;
        }
        match rustix::io::pwritev(file, &slices, offset + done as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn joined<T>(r: Result<io::Result<T>, tokio::task::JoinError>) -> io::Result<T> {
    r.map_err(|e| io::Error::other(format!("blocking I/O task failed: {e}")))?
}

/// Counts a blocking I/O job in flight for the metrics while it lives.
struct InFlight;

impl InFlight {
    fn new() -> Self {
        crate::counters::add(&crate::counters::IO_IN_FLIGHT, 1);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        crate::counters::sub(&crate::counters::IO_IN_FLIGHT, 1);
    }
}

#[async_trait::async_trait]
impl IoEngine for ThreadsEngine {
    fn name(&self) -> &'static str {
        "threads"
    }

    async fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let _counted = InFlight::new();
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
        let chain = move || -> io::Result<()> {
            for op in ops {
                match op {
                    IoOp::Write { offset, data } => file.write_all_at(&data, offset)?,
                    IoOp::Writev { offset, bufs } => write_all_vectored_at(&file, &bufs, offset)?,
                    IoOp::WriteBehind { offset, len } => {
                        if let Some(len) = std::num::NonZeroU64::new(len) {
                            rustix::fs::fadvise(&*file, offset, Some(len), Advice::DontNeed)?;
                        }
                    }
                    IoOp::PunchHole { offset, len } => punch_hole(&file, offset, len)?,
                    IoOp::SyncData => file.sync_data()?,
                    IoOp::SyncAll => file.sync_all()?,
                }
            }
            Ok(())
        };
        let _counted = InFlight::new();
        joined(tokio::task::spawn_blocking(chain).await)
    }
}

/// `fallocate(PUNCH_HOLE | KEEP_SIZE)` over `len` bytes at `offset` (nothing when
/// `len` is 0).
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    rustix::fs::fallocate(
        file,
        rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )?;
    Ok(())
}
