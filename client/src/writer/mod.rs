//! [`FileWriter`]: an `AsyncWrite` that streams a file through chunk pipelines.
//!
//! Three layers, each in its own file:
//!
//! - the **front** (this file): [`FileWriter`] cuts bytes into packet-sized buffers
//!   and hands them over a bounded channel to the writer's task, with `hflush`,
//!   `hsync` and `close` as commands that wait for their answer;
//! - the **engine** ([`engine`], its [`event`]s and actions, the rules in [`policy`]):
//!   every decision, as a pure state machine. It keeps up to `window` bytes in flight,
//!   matches acks to packets, crosses chunk boundaries (commit the full chunk, ask the
//!   master for the next), and recovers the pipeline when a replica fails: a version
//!   bump over the survivors, then the unacknowledged packets again. A fenced writer
//!   (a chunkserver answered `StaleToken`, or the master says the lease is gone) fails
//!   for good: every later call returns [`Error::Fenced`] and nothing is retried with
//!   the old token. Its unit tests ([`tests`]) are contracts 5 and 6, without sockets;
//! - the **runtime** ([`runtime`]): the task that performs the engine's actions
//!   (sockets, master and chunkserver calls) and feeds back their outcome.
//!
//! **Where bytes go.** An *append* writer ([`WriteMode::Append`]: `create`, `append`)
//! writes at the end only and cannot seek. A writer for writes anywhere
//! ([`WriteMode::Anywhere`], from [`crate::OpenOptions`]) has a position
//! ([`AsyncSeek`], [`FileWriter::write_at`]): it may write anywhere in the file and
//! past the end, where a gap is written as zeros first. A write outside the chunk it
//! is writing moves it to the chunk that holds the offset: it drains, commits the
//! chunk it leaves and asks the master for that chunk's grant (`OpenChunk`, a new
//! version bumped on its replicas: fenced like a new chunk). [`FileWriter::set_len`]
//! grows a file (with zeros) and shrinks it to any length (dropping the chunks past
//! the new end).
//!
//! Packets queued while more data is already waiting are pushed onto the socket
//! together; acknowledged packet buffers go back to the front for reuse; `hflush` and
//! `hsync` send the buffered tail as their last packet (carrying the sync flag itself).
//! [`FileWriter::record_ack_latencies`] turns on a per-packet ack-latency recorder
//! (off by default: one relaxed atomic load per packet).
//!
//! **Idle streams.** A chunkserver ends a write stream whose upstream stays silent for
//! its `--idle-timeout` (60 s by default) with nothing outstanding. That is no failure
//! of the head, and must not cost a replica: a log writer that writes a line every few
//! minutes would otherwise lose one replica per pause (a version bump without the
//! head) until too few are left. So the writer closes its own stream after
//! [`ClientConfig::stream_idle_close`](crate::ClientConfig::stream_idle_close) at rest
//! (20 s by default, below the chunkservers' timeout), and a stream the head closed
//! anyway is judged by [`policy::after_stream_end`]: closed (EOF, reset, broken pipe)
//! while nothing was in flight, or while everything in flight went out after the
//! stream had gone quiet with no ack since (the close may have come before those
//! packets were sent), it is replaced by a new stream with the same token at the
//! acknowledged offset, with no master call. A stream that breaks with packets in
//! flight that the head had been acking, or that stalls or sends garbage, is recovered
//! without the head, as before: that is what fences a dead chunkserver. Misjudging a
//! dead head as an idle close costs one connection attempt: the reopen cannot reach it
//! and the head is then excluded all the same.

mod engine;
mod event;
mod policy;
mod runtime;
#[cfg(test)]
mod tests;

use crate::client::Client;
use crate::error::{Error, Result};
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use stampfs_proto::{FileStatus, WriteGrant};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::PollSender;
use tracing::Instrument;

/// Commands from the front to the writer's task; the channel is small because the window,
/// not the channel, bounds memory.
const CMD_QUEUE: usize = 4;
/// Most ack-latency samples kept (16 MiB); later packets are not sampled.
const MAX_LATENCY_SAMPLES: usize = 1 << 20;

/// Packet buffers handed back by the runtime once acknowledged and reused by the
/// front, so a long write neither allocates nor page-faults in a fresh buffer per
/// packet. Bounded: at most a window's worth is kept.
#[derive(Debug)]
struct BufferPool {
    /// Empty buffers of at least one packet's capacity; held only to push or pop.
    free: Mutex<Vec<BytesMut>>,
    packet_size: usize,
    max: usize,
}

impl BufferPool {
    fn new(packet_size: usize, window: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            packet_size,
            max: (window / packet_size.max(1)).clamp(2, 1024) + 2,
        }
    }

    fn take(&self) -> BytesMut {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        reused.unwrap_or_else(|| BytesMut::with_capacity(self.packet_size))
    }

    /// Takes `data` back if nothing else refers to its buffer any more.
    fn give(&self, data: Bytes) {
        if let Ok(mut b) = data.try_into_mut() {
            b.clear();
            if b.capacity() >= self.packet_size {
                let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
                if free.len() < self.max {
                    free.push(b);
                }
            }
        }
    }
}

/// Per-packet ack latencies (first send to full-pipeline ack), shared by the front and
/// the runtime. Off by default: then the only cost is one relaxed load per packet.
#[derive(Debug, Default)]
struct AckClock {
    on: AtomicBool,
    /// Samples in ack order; the runtime appends, the front takes them. Held only for
    /// a push or a take, never across an `.await`.
    samples: Mutex<Vec<Duration>>,
}

impl AckClock {
    fn start(&self) -> Option<Instant> {
        self.on.load(Ordering::Relaxed).then(Instant::now)
    }

    fn record(&self, latency: Duration) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() < MAX_LATENCY_SAMPLES {
            s.push(latency);
        }
    }
}

pub(super) enum Cmd {
    /// Bytes to write at file offset `offset`.
    Data { offset: u64, data: Bytes },
    Flush {
        sync: bool,
        /// The front's buffered tail (at file offset `offset`): sent as the flush's
        /// last packet, which carries the `sync` flag itself, instead of a data packet
        /// plus an empty sync packet.
        offset: u64,
        data: Bytes,
        done: oneshot::Sender<Result<()>>,
    },
    /// Shrink the file to `offset` (in the chunk being written).
    Cut {
        offset: u64,
        done: oneshot::Sender<Result<()>>,
    },
    Close {
        /// Nothing was written since the open or since the times were set.
        keep_mtime: bool,
        done: oneshot::Sender<Result<FileStatus>>,
    },
}

/// Where a writer may write (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// At the end only.
    Append,
    /// Anywhere in the chunk being written and at or past the end.
    Anywhere,
}

/// Writes one file. Implements [`AsyncWrite`]: `flush` is [`FileWriter::hflush`] and
/// `shutdown` is [`FileWriter::close`]; a writer for writes anywhere also implements
/// [`AsyncSeek`]. Dropping it without `close` leaves the file open until the master
/// recovers its lease.
pub struct FileWriter {
    /// For [`FileWriter::read_at`].
    client: Client,
    path: String,
    packet_size: usize,
    mode: WriteMode,
    /// File offset of the next byte written.
    pos: u64,
    /// File offset of `buf`'s first byte.
    buf_at: u64,
    /// The file's end as this writer knows it (its length at open, grown by writes).
    end: u64,
    /// A seek accepted by `start_seek`, returned by `poll_complete`.
    seek_to: Option<std::io::Result<u64>>,
    /// Bytes accepted but not yet handed to the writer's task (less than one packet).
    buf: BytesMut,
    /// Hands packets to the writer's task with backpressure; closed by `close`.
    tx: PollSender<Cmd>,
    /// A clone of the same channel for the flush/close futures.
    raw_tx: mpsc::Sender<Cmd>,
    /// A flush or close in progress inside `poll_flush` / `poll_shutdown`.
    pending: Option<BoxFuture<'static, Result<()>>>,
    /// Set once the writer has failed or closed; later calls return it.
    done: Option<Error>,
    written: u64,
    /// Bytes were written (or the length changed) since the open or since
    /// [`FileWriter::times_set`]: the close moves the modification time.
    modified: bool,
    status: FileStatus,
    /// Ack-latency recording, shared with the runtime.
    clock: Arc<AckClock>,
    /// Where the next packet buffer comes from (the runtime refills it).
    pool: Arc<BufferPool>,
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("path", &self.path)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl FileWriter {
    /// A writer of the file `status` describes, starting with the grant of its partial
    /// last chunk (`last`, from an `Append`). An append writer starts at the end, a
    /// writer for writes anywhere at offset 0.
    pub(crate) fn start(
        client: Client,
        status: FileStatus,
        last: Option<WriteGrant>,
        mode: WriteMode,
    ) -> Self {
        let (raw_tx, rx) = mpsc::channel(CMD_QUEUE);
        let packet_size = client.config().packet_size;
        let clock = Arc::new(AckClock::default());
        let pool = Arc::new(BufferPool::new(packet_size, client.config().window));
        let engine = engine::Engine::new(
            status.path.clone(),
            client.id(),
            client.config().window as u64,
            last,
            mode == WriteMode::Anywhere,
        )
        .with_file(status.length, status.chunk_size);
        let runtime = runtime::Runtime {
            client: client.clone(),
            path: status.path.clone(),
            engine,
            stream: None,
            clock: clock.clone(),
            stamps: VecDeque::new(),
            pool: pool.clone(),
            flush_waiter: None,
            close_waiter: None,
        };
        let span = tracing::info_span!("writer", path = %status.path, client = %client.id());
        tokio::spawn(runtime.run(rx).instrument(span));
        let end = status.length;
        let pos = match mode {
            WriteMode::Append => end,
            WriteMode::Anywhere => 0,
        };
        Self {
            client: client.clone(),
            path: status.path.clone(),
            packet_size,
            mode,
            pos,
            buf_at: pos,
            end,
            seek_to: None,
            buf: BytesMut::with_capacity(packet_size),
            tx: PollSender::new(raw_tx.clone()),
            raw_tx,
            pending: None,
            done: None,
            written: 0,
            modified: false,
            status,
            clock,
            pool,
        }
    }

    /// Starts (or stops) recording each packet's ack latency: the time from its first
    /// send to its acknowledgement by every replica of the pipeline. Off by default.
    pub fn record_ack_latencies(&mut self, on: bool) {
        self.clock.on.store(on, Ordering::Relaxed);
    }

    /// Takes the ack latencies recorded so far, in ack order (at most about a million
    /// are kept).
    pub fn take_ack_latencies(&mut self) -> Vec<Duration> {
        std::mem::take(&mut *self.clock.samples.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Bytes accepted by this writer so far (not counting zeros it wrote into a
    /// gap).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The file's times were set since the last write (`futimens` on an open file,
    /// as `cp -p` does before `close`): unless more is written, the close leaves the
    /// modification time as set. Flush first, so that no buffered byte reaches the
    /// master after the times.
    pub fn times_set(&mut self) {
        self.modified = false;
    }

    /// Where the next byte goes (an append writer: the end).
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The file's length as this writer knows it: its length when opened, grown by
    /// every byte written since (acknowledged or not).
    pub fn len(&self) -> u64 {
        self.end
    }

    /// True when the file is empty so far.
    pub fn is_empty(&self) -> bool {
        self.end == 0
    }

    /// How this writer writes.
    pub fn mode(&self) -> WriteMode {
        self.mode
    }

    /// The lowest offset a write may start at: the end for an append writer, 0 for
    /// a writer for writes anywhere.
    pub fn writable_from(&self) -> u64 {
        match self.mode {
            WriteMode::Append => self.end,
            WriteMode::Anywhere => 0,
        }
    }

    /// Writes all of `data` at file offset `offset` (a writer for writes anywhere):
    /// `seek` there, then `write_all`. Visible to readers after `hflush`, durable
    /// after `hsync`, like any write.
    pub async fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        use tokio::io::{AsyncSeekExt, AsyncWriteExt};
        self.seek(std::io::SeekFrom::Start(offset))
            .await
            .map_err(Error::from_io)?;
        self.write_all(data).await.map_err(Error::from_io)
    }

    /// Reads up to `len` bytes at `offset` as this writer left them (a writer for writes
    /// anywhere): every write so far is hflushed first, then read back from the
    /// replicas, so the bytes are what any reader now sees. Shorter at the end of the
    /// file; empty past it.
    pub async fn read_at(&mut self, offset: u64, len: usize) -> Result<Bytes> {
        if self.mode == WriteMode::Append {
            return Err(Error::NotSupported {
                path: self.path.clone(),
                reason: "an append writer does not read (open it with OpenOptions::write)".into(),
            });
        }
        self.hflush().await?;
        let reader = self.client.open(&self.path).await?;
        reader.read_at(offset, len).await
    }

    /// Sets the file's length to `len` (a writer for writes anywhere): a longer file
    /// gets zeros up to `len` (written like any bytes, so they cost disk); the same
    /// length changes nothing; a shorter one is cut: every write so far is
    /// acknowledged first, the chunks past the new end are dropped (their replicas
    /// deleted), and within the new last chunk the master lowers its committed length
    /// and an append set-up at the new end cuts every replica. The position does not
    /// move; a later write past the new end fills the gap with zeros.
    pub async fn set_len(&mut self, len: u64) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        if self.mode == WriteMode::Append {
            return Err(Error::NotSupported {
                path: self.path.clone(),
                reason: "an append writer does not set the length (open it with \
                         OpenOptions::write)"
                    .into(),
            });
        }
        if len < self.end {
            return self.cut(len).await;
        }
        let (pos, written) = (self.pos, self.written);
        let zeros = vec![0u8; self.packet_size];
        let mut res = Ok(());
        while self.end < len && res.is_ok() {
            let n = (len - self.end).min(zeros.len() as u64) as usize;
            self.pos = self.end;
            res = self.write_all(&zeros[..n]).await.map_err(Error::from_io);
        }
        (self.pos, self.written) = (pos, written);
        res
    }

    /// Shrinks the file to `len`, in the chunk being written.
    async fn cut(&mut self, len: u64) -> Result<()> {
        if let Some(e) = &self.done {
            return Err(e.duplicate(&self.path));
        }
        std::future::poll_fn(|cx| self.poll_send_buf(cx)).await?;
        self.modified = true;
        let (done, rx) = oneshot::channel();
        let closed = || Error::WriterClosed {
            path: self.path.clone(),
        };
        self.raw_tx
            .send(Cmd::Cut { offset: len, done })
            .await
            .map_err(|_| closed())?;
        let res = rx.await.unwrap_or_else(|_| Err(closed()));
        match res {
            Ok(()) => {
                self.end = len;
                self.buf_at = self.buf_at.min(len);
                Ok(())
            }
            Err(e) => {
                if e.is_fenced() {
                    self.done = Some(e.duplicate(&self.path));
                }
                Err(e)
            }
        }
    }

    /// Checks that a write at `self.pos` is possible now.
    fn check_position(&self) -> Result<()> {
        let from = self.writable_from();
        if self.pos < from {
            return Err(Error::NotSupported {
                path: self.path.clone(),
                reason: format!(
                    "a write at offset {}: this writer writes from offset {from} (the end)",
                    self.pos
                ),
            });
        }
        Ok(())
    }

    /// The file's status when it was opened, or after `close`.
    pub fn status(&self) -> &FileStatus {
        &self.status
    }

    fn closed_error(&self) -> Error {
        match &self.done {
            Some(e) => e.duplicate(&self.path),
            None => Error::WriterClosed {
                path: self.path.clone(),
            },
        }
    }

    fn poll_send_buf(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.buf.is_empty() {
            return Poll::Ready(Ok(()));
        }
        if ready!(self.tx.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(self.closed_error()));
        }
        let offset = self.buf_at;
        let data = std::mem::replace(&mut self.buf, self.pool.take()).freeze();
        self.buf_at += data.len() as u64;
        if self.tx.send_item(Cmd::Data { offset, data }).is_err() {
            return Poll::Ready(Err(self.closed_error()));
        }
        Poll::Ready(Ok(()))
    }

    /// Makes `buf` take bytes at `pos`: sends what it holds when they would not
    /// follow it, and writes zeros into a gap between the end and `pos` first. Ready
    /// when the next byte at `pos` can be appended to `buf`.
    fn poll_place(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        loop {
            // Where the next byte taken into `buf` goes: `pos`, or the end while a gap
            // before `pos` is being filled.
            let next = self.pos.min(self.end);
            let buf_end = self.buf_at + self.buf.len() as u64;
            if self.buf.len() >= self.packet_size || (!self.buf.is_empty() && buf_end != next) {
                ready!(self.poll_send_buf(cx))?;
                continue;
            }
            if self.buf.is_empty() {
                self.buf_at = next;
            }
            if self.pos <= self.end {
                return Poll::Ready(Ok(()));
            }
            let zeros = (self.pos - self.end).min((self.packet_size - self.buf.len()) as u64);
            self.buf.resize(self.buf.len() + zeros as usize, 0);
            self.end += zeros;
        }
    }

    fn flush_future(&self, sync: bool, offset: u64, data: Bytes) -> BoxFuture<'static, Result<()>> {
        let tx = self.raw_tx.clone();
        let path = self.path.clone();
        Box::pin(async move {
            let (done, rx) = oneshot::channel();
            tx.send(Cmd::Flush {
                sync,
                offset,
                data,
                done,
            })
            .await
            .map_err(|_| Error::WriterClosed { path: path.clone() })?;
            rx.await.map_err(|_| Error::WriterClosed { path })?
        })
    }

    fn poll_flush_inner(&mut self, cx: &mut Context<'_>, sync: bool) -> Poll<Result<()>> {
        if self.done.is_some() {
            return Poll::Ready(Err(self.closed_error()));
        }
        if self.pending.is_none() {
            let offset = self.buf_at;
            let data = if self.buf.is_empty() {
                Bytes::new()
            } else {
                std::mem::replace(&mut self.buf, self.pool.take()).freeze()
            };
            self.buf_at += data.len() as u64;
            self.pending = Some(self.flush_future(sync, offset, data));
        }
        let res = match self.pending.as_mut() {
            Some(fut) => ready!(fut.as_mut().poll(cx)),
            None => Ok(()),
        };
        self.pending = None;
        if let Err(e) = &res {
            if e.is_fenced() {
                self.done = Some(e.duplicate(&self.path));
            }
        }
        Poll::Ready(res)
    }

    /// Returns once every byte written so far is acknowledged by every replica of the
    /// pipeline (visible to new readers).
    pub async fn hflush(&mut self) -> Result<()> {
        std::future::poll_fn(|cx| self.poll_flush_inner(cx, false)).await
    }

    /// Like [`FileWriter::hflush`], and the bytes are on the replicas' disks.
    pub async fn hsync(&mut self) -> Result<()> {
        std::future::poll_fn(|cx| self.poll_flush_inner(cx, true)).await
    }

    /// Flushes, commits the last chunk's length, and releases the lease. Returns the
    /// file's final status.
    pub async fn close(&mut self) -> Result<FileStatus> {
        if let Some(e) = &self.done {
            return Err(e.duplicate(&self.path));
        }
        std::future::poll_fn(|cx| self.poll_send_buf(cx)).await?;
        let (done, rx) = oneshot::channel();
        let keep_mtime = !self.modified;
        let res = match self.raw_tx.send(Cmd::Close { keep_mtime, done }).await {
            Ok(()) => rx.await.unwrap_or_else(|_| {
                Err(Error::WriterClosed {
                    path: self.path.clone(),
                })
            }),
            Err(_) => Err(self.closed_error()),
        };
        self.tx.close();
        match res {
            Ok(status) => {
                self.status = status.clone();
                self.done = Some(Error::WriterClosed {
                    path: self.path.clone(),
                });
                Ok(status)
            }
            Err(e) => {
                self.done = Some(e.duplicate(&self.path));
                Err(e)
            }
        }
    }
}

impl AsyncWrite for FileWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.done.is_some() {
            return Poll::Ready(Err(this.closed_error().into_io()));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        this.check_position().map_err(Error::into_io)?;
        ready!(this.poll_place(cx)).map_err(Error::into_io)?;
        let n = data.len().min(this.packet_size - this.buf.len());
        this.buf.extend_from_slice(&data[..n]);
        this.written += n as u64;
        this.modified = true;
        this.pos += n as u64;
        this.end = this.end.max(this.pos);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut()
            .poll_flush_inner(cx, false)
            .map_err(Error::into_io)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if matches!(this.done, Some(Error::WriterClosed { .. })) {
            return Poll::Ready(Ok(()));
        }
        if this.done.is_some() {
            return Poll::Ready(Err(this.closed_error().into_io()));
        }
        if this.pending.is_none() {
            ready!(this.poll_send_buf(cx)).map_err(Error::into_io)?;
            let tx = this.raw_tx.clone();
            let path = this.path.clone();
            let keep_mtime = !this.modified;
            this.pending = Some(Box::pin(async move {
                let (done, rx) = oneshot::channel();
                tx.send(Cmd::Close { keep_mtime, done })
                    .await
                    .map_err(|_| Error::WriterClosed { path: path.clone() })?;
                rx.await
                    .map_err(|_| Error::WriterClosed { path })?
                    .map(|_| ())
            }));
        }
        let res = match this.pending.as_mut() {
            Some(fut) => ready!(fut.as_mut().poll(cx)),
            None => Ok(()),
        };
        this.pending = None;
        this.tx.close();
        this.done = Some(match &res {
            Ok(()) => Error::WriterClosed {
                path: this.path.clone(),
            },
            Err(e) => e.duplicate(&this.path),
        });
        Poll::Ready(res.map_err(Error::into_io))
    }
}

impl tokio::io::AsyncSeek for FileWriter {
    fn start_seek(self: Pin<&mut Self>, to: std::io::SeekFrom) -> std::io::Result<()> {
        let this = self.get_mut();
        if this.mode == WriteMode::Append {
            return Err(Error::NotSupported {
                path: this.path.clone(),
                reason: "an append writer writes at the end only (open it with \
                         OpenOptions::write to write anywhere)"
                    .into(),
            }
            .into_io());
        }
        let target = match to {
            std::io::SeekFrom::Start(n) => Some(n),
            std::io::SeekFrom::Current(d) => this.pos.checked_add_signed(d),
            std::io::SeekFrom::End(d) => this.end.checked_add_signed(d),
        };
        let target = target.ok_or_else(|| {
            Error::InvalidArgument {
                reason: format!("seek {to:?} from {} leaves the file", this.pos),
            }
            .into_io()
        })?;
        this.seek_to = Some(Ok(target));
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        let this = self.get_mut();
        match this.seek_to.take() {
            Some(Ok(to)) => {
                this.pos = to;
                Poll::Ready(Ok(to))
            }
            Some(Err(e)) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(this.pos)),
        }
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    #[test]
    fn acknowledged_buffers_are_reused_when_nothing_else_holds_them() {
        let pool = BufferPool::new(1024, 4096);
        let mut b = pool.take();
        b.extend_from_slice(&[1u8; 1024]);
        let data = b.freeze();
        let extra = data.clone();
        pool.give(data);
        assert!(pool.free.lock().expect("lock").is_empty(), "still shared");
        pool.give(extra);
        let back = pool.take();
        assert!(back.is_empty() && back.capacity() >= 1024);
        // A piece of a buffer (a packet cut at a chunk boundary) is not kept.
        let mut b = BytesMut::with_capacity(1024);
        b.extend_from_slice(&[2u8; 1024]);
        let mut whole = b.freeze();
        let head = whole.split_to(100);
        drop(head);
        pool.give(whole);
        assert!(pool.free.lock().expect("lock").is_empty());
        // The pool is bounded.
        for _ in 0..100 {
            pool.give(Bytes::from(vec![0u8; 1024]));
        }
        assert!(pool.free.lock().expect("lock").len() <= pool.max);
    }
}
