//! [`FileWriter`]: an `AsyncWrite` that streams a file through chunk pipelines.
//!
//! The front ([`FileWriter`]) cuts bytes into packets and hands them to a streamer
//! task over a bounded channel. The streamer owns the pipeline: it keeps up to
//! `window` bytes in flight, matches acks to packets, crosses chunk boundaries (commit
//! the full chunk, ask the master for the next), and recovers the pipeline when a
//! replica fails: a version bump over the survivors, then the unacknowledged packets
//! again. A fenced writer (a chunkserver answered `StaleToken`, or the master says the
//! lease is gone) fails for good: every later call returns [`Error::Fenced`] and
//! nothing is retried with the old token.
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
//! head) until too few are left. So the streamer closes its own stream after
//! [`ClientConfig::stream_idle_close`](crate::ClientConfig::stream_idle_close) at rest
//! (20 s by default, below the chunkservers' timeout), and a stream the head closed
//! anyway is judged by [`after_stream_end`]: closed (EOF, reset, broken pipe) while
//! nothing was in flight, or while everything in flight went out after the stream had
//! gone quiet with no ack since (the close may have come before those packets were
//! sent), it is replaced by a new stream with the same token at the acknowledged
//! offset, with no master call. A stream that breaks with packets in flight that the
//! head had been acking, or that stalls or sends garbage, is recovered without the head,
//! as before: that is what fences a dead chunkserver. Misjudging a dead head as an idle
//! close costs one connection attempt: the reopen cannot reach it and the head is then
//! excluded all the same.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::pipeline::{Incoming, PipelineStream, SetupError, StreamEnd, StreamEvent};
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use stampfs_proto::{
    AddChunk, ChunkCommit, ChunkVersion, ChunkserverId, Close, FileStatus, RemoteError,
    ReplicaInfo, UpdatePipeline, WriteGrant,
};
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

/// Commands from the front to the streamer; the channel is small because the window,
/// not the channel, bounds memory.
const CMD_QUEUE: usize = 4;
/// Pipeline recoveries tried for one failure before giving up.
const MAX_RECOVERIES: usize = 6;
/// Most ack-latency samples kept (16 MiB); later packets are not sampled.
const MAX_LATENCY_SAMPLES: usize = 1 << 20;

/// Packet buffers handed back by the streamer once acknowledged and reused by the
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
/// the streamer. Off by default: then the only cost is one relaxed load per packet.
#[derive(Debug, Default)]
struct AckClock {
    on: AtomicBool,
    /// Samples in ack order; the streamer appends, the front takes them. Held only for
    /// a push or a take, never across an `.await`.
    samples: Mutex<Vec<Duration>>,
}

impl AckClock {
    fn start(&self) -> Option<Instant> {
        self.on.load(Ordering::Relaxed).then(Instant::now)
    }

    fn record(&self, since: Option<Instant>) {
        if let Some(t) = since {
            let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            if s.len() < MAX_LATENCY_SAMPLES {
                s.push(t.elapsed());
            }
        }
    }
}

enum Cmd {
    Data(Bytes),
    Flush {
        sync: bool,
        /// The front's buffered tail: sent as the flush's last packet, which carries the
        /// `sync` flag itself, instead of a data packet plus an empty sync packet.
        data: Bytes,
        done: oneshot::Sender<Result<()>>,
    },
    Close {
        done: oneshot::Sender<Result<FileStatus>>,
    },
}

/// Writes one file. Implements [`AsyncWrite`]: `flush` is [`FileWriter::hflush`] and
/// `shutdown` is [`FileWriter::close`]. Dropping it without `close` leaves the file
/// open until the master recovers its lease.
pub struct FileWriter {
    path: String,
    packet_size: usize,
    /// Bytes accepted but not yet handed to the streamer (less than one packet).
    buf: BytesMut,
    /// Hands packets to the streamer with backpressure; closed by `close`.
    tx: PollSender<Cmd>,
    /// A clone of the same channel for the flush/close futures.
    raw_tx: mpsc::Sender<Cmd>,
    /// A flush or close in progress inside `poll_flush` / `poll_shutdown`.
    pending: Option<BoxFuture<'static, Result<()>>>,
    /// Set once the writer has failed or closed; later calls return it.
    done: Option<Error>,
    written: u64,
    status: FileStatus,
    /// Ack-latency recording, shared with the streamer task.
    clock: Arc<AckClock>,
    /// Where the next packet buffer comes from (the streamer refills it).
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
    pub(crate) fn start(client: Client, status: FileStatus, last: Option<WriteGrant>) -> Self {
        let (raw_tx, rx) = mpsc::channel(CMD_QUEUE);
        let packet_size = client.config().packet_size;
        let chunk = last.map(|grant| ChunkState::new(grant.clone(), grant.chunk_offset));
        let clock = Arc::new(AckClock::default());
        let pool = Arc::new(BufferPool::new(packet_size, client.config().window));
        let streamer = Streamer {
            client: client.clone(),
            path: status.path.clone(),
            chunk,
            failed: None,
            next_seq: 0,
            clock: clock.clone(),
            pool: pool.clone(),
        };
        let span = tracing::info_span!("writer", path = %status.path, client = %client.id());
        tokio::spawn(streamer.run(rx).instrument(span));
        Self {
            path: status.path.clone(),
            packet_size,
            buf: BytesMut::with_capacity(packet_size),
            tx: PollSender::new(raw_tx.clone()),
            raw_tx,
            pending: None,
            done: None,
            written: 0,
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

    /// Bytes accepted by this writer so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The file's status when it was opened, or after `close`.
    pub fn status(&self) -> &FileStatus {
        &self.status
    }

    fn closed_error(&self) -> Error {
        match &self.done {
            Some(e) => e.duplicate(),
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
        let data = std::mem::replace(&mut self.buf, self.pool.take()).freeze();
        if self.tx.send_item(Cmd::Data(data)).is_err() {
            return Poll::Ready(Err(self.closed_error()));
        }
        Poll::Ready(Ok(()))
    }

    fn flush_future(&self, sync: bool, data: Bytes) -> BoxFuture<'static, Result<()>> {
        let tx = self.raw_tx.clone();
        let path = self.path.clone();
        Box::pin(async move {
            let (done, rx) = oneshot::channel();
            tx.send(Cmd::Flush { sync, data, done })
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
            let data = if self.buf.is_empty() {
                Bytes::new()
            } else {
                std::mem::replace(&mut self.buf, self.pool.take()).freeze()
            };
            self.pending = Some(self.flush_future(sync, data));
        }
        let res = match self.pending.as_mut() {
            Some(fut) => ready!(fut.as_mut().poll(cx)),
            None => Ok(()),
        };
        self.pending = None;
        if let Err(e) = &res {
            if e.is_fenced() {
                self.done = Some(e.duplicate());
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
            return Err(e.duplicate());
        }
        std::future::poll_fn(|cx| self.poll_send_buf(cx)).await?;
        let (done, rx) = oneshot::channel();
        let res = match self.raw_tx.send(Cmd::Close { done }).await {
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
                self.done = Some(e.duplicate());
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
        if this.buf.len() >= this.packet_size {
            ready!(this.poll_send_buf(cx)).map_err(Error::into_io)?;
        }
        let n = data.len().min(this.packet_size - this.buf.len());
        this.buf.extend_from_slice(&data[..n]);
        this.written += n as u64;
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
            this.pending = Some(Box::pin(async move {
                let (done, rx) = oneshot::channel();
                tx.send(Cmd::Close { done })
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
            Err(e) => e.duplicate(),
        });
        Poll::Ready(res.map_err(Error::into_io))
    }
}

/// A packet sent but not yet acknowledged by the whole pipeline.
struct Pending {
    seq: u64,
    offset: u64,
    crc: u32,
    sync: bool,
    data: Bytes,
    /// When it was first sent, if ack latencies are being recorded.
    sent_at: Option<Instant>,
}

/// The chunk currently being written.
struct ChunkState {
    grant: WriteGrant,
    stream: Option<PipelineStream>,
    /// Chunk offset of the next byte to send.
    sent: u64,
    /// Chunk offset up to which every replica has acknowledged.
    acked: u64,
    unacked: VecDeque<Pending>,
    /// Every unacked packet went onto the current stream after it had been at rest
    /// (nothing in flight), and no ack has come back since: if the stream turns out
    /// closed, the head may have closed it for idleness before they were sent.
    quiet_burst: bool,
}

impl ChunkState {
    fn new(grant: WriteGrant, offset: u64) -> Self {
        Self {
            grant,
            stream: None,
            sent: offset,
            acked: offset,
            unacked: VecDeque::new(),
            quiet_burst: false,
        }
    }

    fn room(&self) -> u64 {
        self.grant.chunk_size.saturating_sub(self.sent)
    }

    fn in_flight(&self) -> u64 {
        self.sent - self.acked
    }
}

/// What went wrong with one ack or send.
enum Trouble {
    /// These replicas failed; the others may go on.
    Replicas(Vec<ChunkserverId>),
    /// The head closed the stream in a way that blames nobody (see
    /// [`after_stream_end`]): open a new one with the same token.
    Closed,
    /// The writer is fenced or the failure is final.
    Fatal(Error),
}

/// What the writer does when its stream to the pipeline's head ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EndAction {
    /// Open a new stream with the same token at the acknowledged offset (no master
    /// call) and send the unacknowledged packets again.
    Reopen,
    /// Pipeline recovery without the head: a version bump over the others.
    ExcludeHead,
}

/// Decides what a stream's end means. `outstanding`: packets were in flight when the
/// writer saw the end. `quiet_burst`: all of them went out after the stream had been
/// at rest, and no ack came back since ([`ChunkState::quiet_burst`]).
///
/// A chunkserver closes a stream for idleness only while none of its packets is
/// outstanding, so a *closed* stream (EOF, reset, broken pipe) is an idle close when
/// nothing was in flight; and when everything in flight was sent after a quiet spell
/// with no ack since, the close may have come before those packets left (the writer
/// had not yet seen the EOF): it is treated the same. A stream that the head closed
/// while acking the packets around it, or that broke any other way (garbage, an ack
/// or send that timed out), excludes the head. Treating a dead head as idle is safe:
/// the reopen cannot reach it, and then it is excluded.
fn after_stream_end(end: StreamEnd, outstanding: bool, quiet_burst: bool) -> EndAction {
    match end {
        StreamEnd::Closed if !outstanding || quiet_burst => EndAction::Reopen,
        StreamEnd::Closed | StreamEnd::Broken => EndAction::ExcludeHead,
    }
}

/// Where a reopened stream starts: the least that every member of the (new) pipeline
/// holds, between what this writer saw acknowledged (`acked`) and the end of what it
/// sent (`unacked_end`); `acked` when a member did not answer.
///
/// Not `acked` itself: the members may all hold bytes whose ack never reached this
/// writer, and a reader may have read them (a reader reads what every replica holds).
/// Opening at `acked` would cut them; if this writer then died before its resend, lease
/// recovery would find them gone, and the reader would have seen bytes that are not in
/// the file (the nemesis saw exactly that). What every member holds came from this
/// writer's own stream, so the packets resent below the start are idempotent retries.
pub(crate) fn resume_offset(acked: u64, unacked_end: u64, lengths: &[Option<u64>]) -> u64 {
    if lengths.iter().any(Option::is_none) {
        return acked;
    }
    lengths
        .iter()
        .flatten()
        .min()
        .copied()
        .unwrap_or(acked)
        .clamp(acked, unacked_end.max(acked))
}

/// Whether the head's refusal of a stream set-up ends the writer (after `StaleToken`,
/// which fences it, was handled). A refusal about the head's own replica — missing,
/// short of the stream's offset after a crash (`ReplicaShort`), finalized, stale,
/// corrupt, an I/O error — is that replica's failure: the writer goes on without it
/// through a version bump, exactly as if the head were unreachable, so the bytes the
/// other replicas hold are never lost to it. Only a refusal of the token itself (which
/// every chunkserver of the cluster would give) or of the request's shape
/// (`BadRequest`, kept for malformed requests) ends the writer.
fn head_refusal_is_fatal(e: &RemoteError) -> bool {
    match e {
        RemoteError::BadToken { .. }
        | RemoteError::BadRequest { .. }
        | RemoteError::FrameTooLarge { .. }
        | RemoteError::MalformedFrame { .. }
        | RemoteError::InvalidPath { .. } => true,
        RemoteError::StaleToken { .. }
        | RemoteError::ReplicaStale { .. }
        | RemoteError::ChecksumMismatch { .. }
        | RemoteError::NotFound { .. }
        | RemoteError::ReplicaShort { .. }
        | RemoteError::ReplicaFinalized { .. }
        | RemoteError::Internal { .. }
        | RemoteError::Io { .. }
        | RemoteError::Unavailable { .. }
        | RemoteError::NoSpace { .. }
        | RemoteError::AlreadyExists { .. }
        | RemoteError::NotADirectory { .. }
        | RemoteError::IsADirectory { .. }
        | RemoteError::DirectoryNotEmpty { .. }
        | RemoteError::LeaseConflict { .. }
        | RemoteError::LeaseExpired { .. }
        | RemoteError::RecoveryInProgress { .. }
        | RemoteError::NotEnoughReplicas { .. }
        | RemoteError::NotSupported { .. } => false,
    }
}

/// The replicas a stream's end excludes.
fn excluded(action: EndAction, head: Option<ChunkserverId>) -> Vec<ChunkserverId> {
    match action {
        EndAction::Reopen => Vec::new(),
        EndAction::ExcludeHead => head.into_iter().collect(),
    }
}

struct Streamer {
    client: Client,
    path: String,
    chunk: Option<ChunkState>,
    failed: Option<Error>,
    next_seq: u64,
    clock: Arc<AckClock>,
    /// Acknowledged packet buffers go back here for the front to reuse.
    pool: Arc<BufferPool>,
}

impl Streamer {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let idle_close = self.client.config().stream_idle_close;
        loop {
            let window = self.client.config().window as u64;
            // Packets are queued on the stream and pushed onto the socket together
            // when no more data is waiting right now (or the window is full).
            let in_flight = self.chunk.as_ref().map_or(0, ChunkState::in_flight);
            if self.failed.is_none() && (rx.is_empty() || in_flight >= window) {
                if let Err(e) = self.flush_stream().await {
                    self.fail(e);
                }
            }
            let in_flight = self.chunk.as_ref().map_or(0, ChunkState::in_flight);
            let streaming =
                self.failed.is_none() && self.chunk.as_ref().is_some_and(|c| c.stream.is_some());
            let waiting_acks =
                streaming && self.chunk.as_ref().is_some_and(|c| !c.unacked.is_empty());
            tokio::select! {
                biased;
                // In flight: the next ack. At rest: the head closing the stream, or
                // the writer's own idle close.
                event = stream_event(&mut self.chunk, waiting_acks, idle_close), if streaming => {
                    match event {
                        StreamEvent::Incoming(item) => self.on_ack(item).await,
                        StreamEvent::Idle => self.close_idle_stream().await,
                    }
                }
                cmd = rx.recv(), if in_flight < window || self.failed.is_some() => {
                    match cmd {
                        None => break,
                        Some(Cmd::Data(data)) => {
                            if self.failed.is_none() {
                                if let Err(e) = self.send_data(data, false).await {
                                    self.fail(e);
                                }
                            }
                        }
                        Some(Cmd::Flush { sync, data, done }) => {
                            let res = self.flush(sync, data).await;
                            let _ = done.send(res);
                        }
                        Some(Cmd::Close { done }) => {
                            let res = self.close().await;
                            let _ = done.send(res);
                            break;
                        }
                    }
                }
            }
        }
        if let Some(chunk) = self.chunk.as_mut() {
            if let Some(stream) = chunk.stream.take() {
                stream.finish().await;
            }
        }
        self.client.release_lease(&self.path);
    }

    fn fail(&mut self, e: Error) {
        tracing::warn!(error = %e, "writer failed");
        if self.failed.is_none() {
            self.failed = Some(e);
        }
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.duplicate()),
            None => Ok(()),
        }
    }

    fn fenced(&self, current: Option<ChunkVersion>) -> Error {
        let grant = self.chunk.as_ref().map(|c| &c.grant);
        Error::Fenced {
            path: self.path.clone(),
            handle: grant.map(|g| g.token.handle),
            presented: grant.map(|g| g.token.version),
            current,
        }
    }

    /// Classifies an error from the master during a write.
    fn master_error(&self, e: Error) -> Error {
        match e {
            Error::Remote(RemoteError::LeaseExpired { .. }) => self.fenced(None),
            Error::Remote(RemoteError::StaleToken { current, .. }) => self.fenced(Some(current)),
            other => other,
        }
    }

    /// Cuts `data` into packets on the current chunk (and the next ones); with
    /// `sync_last`, the last packet asks every replica to sync.
    async fn send_data(&mut self, mut data: Bytes, sync_last: bool) -> Result<()> {
        while !data.is_empty() {
            if self.chunk.as_ref().is_none_or(|c| c.room() == 0) {
                self.next_chunk().await?;
            }
            let chunk = match self.chunk.as_mut() {
                Some(c) => c,
                None => unreachable!("next_chunk sets a chunk"),
            };
            let n = (data.len() as u64).min(chunk.room()) as usize;
            let piece = data.split_to(n);
            let pending = Pending {
                seq: self.next_seq,
                offset: chunk.sent,
                crc: crc32fast::hash(&piece),
                sync: sync_last && data.is_empty(),
                data: piece,
                sent_at: self.clock.start(),
            };
            self.next_seq += 1;
            self.push(pending).await?;
        }
        Ok(())
    }

    /// Pushes packets queued on the stream onto the socket; a failure recovers the
    /// pipeline as a failed send does.
    async fn flush_stream(&mut self) -> Result<()> {
        let Some(chunk) = self.chunk.as_mut() else {
            return Ok(());
        };
        let Some(stream) = chunk.stream.as_mut() else {
            return Ok(());
        };
        if let Err(e) = stream.flush().await {
            let head = stream.head;
            let action = after_stream_end(
                StreamEnd::of(&e),
                !chunk.unacked.is_empty(),
                chunk.quiet_burst,
            );
            tracing::warn!(error = %e, ?action, "sending to the pipeline failed");
            chunk.stream = None;
            return self.reopen(excluded(action, Some(head))).await;
        }
        Ok(())
    }

    /// Closes the current stream after the writer's idle close with nothing in
    /// flight, before the head's idle timeout does; the next packet opens a new one
    /// with the same token.
    async fn close_idle_stream(&mut self) {
        let Some(chunk) = self.chunk.as_mut() else {
            return;
        };
        if !chunk.unacked.is_empty() {
            return;
        }
        if let Some(stream) = chunk.stream.take() {
            tracing::debug!(head = %stream.head, "closing the idle pipeline stream");
            stream.finish().await;
        }
    }

    /// Queues a new packet on the current chunk's stream (opening it if needed); the
    /// run loop or `drain` flushes it.
    async fn push(&mut self, p: Pending) -> Result<()> {
        let Some(chunk) = self.chunk.as_mut() else {
            return Ok(());
        };
        let at_rest = chunk.unacked.is_empty();
        if at_rest {
            // The head may have closed the stream while nothing was in flight (its
            // idle timeout): settle that before sending anything on it.
            if let Some(end) = chunk.stream.as_mut().and_then(PipelineStream::take_end) {
                self.on_ack(Some(end)).await;
                self.check()?;
            }
        }
        let Some(chunk) = self.chunk.as_mut() else {
            return Ok(());
        };
        chunk.sent = p.offset + p.data.len() as u64;
        let (seq, offset, crc, sync, data) = (p.seq, p.offset, p.crc, p.sync, p.data.clone());
        chunk.unacked.push_back(p);
        if chunk.stream.is_none() {
            // Opening the stream sends every unacked packet, this one included.
            return self.reopen(Vec::new()).await;
        }
        if at_rest {
            chunk.quiet_burst = true;
        }
        let token = chunk.grant.token;
        let sent = match chunk.stream.as_mut() {
            Some(stream) => stream.send(token, seq, offset, crc, sync, data).await,
            None => Ok(()),
        };
        if let Err(e) = sent {
            let head = chunk.stream.as_ref().map(|s| s.head);
            let action = after_stream_end(StreamEnd::of(&e), true, chunk.quiet_burst);
            tracing::warn!(error = %e, ?action, "sending to the pipeline failed");
            chunk.stream = None;
            return self.reopen(excluded(action, head)).await;
        }
        Ok(())
    }

    async fn on_ack(&mut self, ack: Option<Incoming>) {
        let trouble = match self.process_ack(ack) {
            Ok(()) => return,
            Err(t) => t,
        };
        match trouble {
            Trouble::Fatal(e) => self.fail(e),
            Trouble::Closed => {
                let Some(c) = self.chunk.as_mut() else {
                    return;
                };
                c.stream = None;
                // At rest the next packet opens the new stream; otherwise resend now.
                if !c.unacked.is_empty() {
                    if let Err(e) = self.reopen(Vec::new()).await {
                        self.fail(e);
                    }
                }
            }
            Trouble::Replicas(bad) => {
                if let Some(c) = self.chunk.as_mut() {
                    c.stream = None;
                }
                if let Err(e) = self.reopen(bad).await {
                    self.fail(e);
                }
            }
        }
    }

    fn process_ack(&mut self, ack: Option<Incoming>) -> std::result::Result<(), Trouble> {
        let Some(chunk) = self.chunk.as_mut() else {
            return Ok(());
        };
        let head = chunk.stream.as_ref().map(|s| s.head);
        let (end, e) = match ack {
            Some(Incoming::Ack(ack)) => return self.take_ack(ack),
            Some(Incoming::End(end, e)) => (end, e),
            // The reader went away without a word: treat it as a closed connection.
            None => (
                StreamEnd::Closed,
                Error::Remote(RemoteError::Unavailable {
                    reason: "the pipeline closed the stream".into(),
                }),
            ),
        };
        let outstanding = chunk.unacked.len();
        match after_stream_end(end, outstanding > 0, chunk.quiet_burst) {
            EndAction::Reopen => {
                tracing::info!(
                    head = ?head,
                    outstanding,
                    reason = %e,
                    "pipeline head closed the stream while it was idle; reopening it with the same token"
                );
                Err(Trouble::Closed)
            }
            EndAction::ExcludeHead => {
                tracing::warn!(error = %e, outstanding, "pipeline stream broke");
                Err(Trouble::Replicas(head.into_iter().collect()))
            }
        }
    }

    /// Matches an ack to the oldest unacked packet.
    fn take_ack(&mut self, ack: stampfs_proto::Ack) -> std::result::Result<(), Trouble> {
        let Some(chunk) = self.chunk.as_mut() else {
            return Ok(());
        };
        let head = chunk.stream.as_ref().map(|s| s.head);
        let Some(front) = chunk.unacked.front() else {
            return Ok(());
        };
        if ack.seq != front.seq {
            tracing::warn!(got = ack.seq, want = front.seq, "ack out of order");
            return Err(Trouble::Replicas(head.into_iter().collect()));
        }
        let mut bad = Vec::new();
        for r in &ack.replicas {
            match &r.result {
                Ok(_) => {}
                Err(RemoteError::StaleToken { current, .. }) => {
                    let current = Some(*current);
                    let presented = Some(chunk.grant.token.version);
                    return Err(Trouble::Fatal(Error::Fenced {
                        path: self.path.clone(),
                        handle: Some(chunk.grant.token.handle),
                        presented,
                        current,
                    }));
                }
                Err(e) => {
                    tracing::warn!(chunkserver = %r.chunkserver, error = %e, "replica failed");
                    bad.push(r.chunkserver);
                }
            }
        }
        // Every replica of the pipeline must have answered for the ack to count.
        for member in &chunk.grant.pipeline {
            if !ack.replicas.iter().any(|r| r.chunkserver == member.id) && !bad.contains(&member.id)
            {
                bad.push(member.id);
            }
        }
        if !bad.is_empty() {
            return Err(Trouble::Replicas(bad));
        }
        if let Some(done) = chunk.unacked.pop_front() {
            chunk.quiet_burst = false;
            chunk.acked = done.offset + done.data.len() as u64;
            self.clock.record(done.sent_at);
            self.pool.give(done.data);
        }
        Ok(())
    }

    /// (Re)opens the stream of the current chunk, first excluding `bad` replicas
    /// through a version bump at the master, then resending every unacked packet. The
    /// stream starts at [`resume_offset`]: what every member already holds is kept (the
    /// resent packets below it are idempotent retries), not cut back to what this
    /// writer saw acknowledged.
    async fn reopen(&mut self, mut bad: Vec<ChunkserverId>) -> Result<()> {
        // Whether this is a pipeline recovery (a replica excluded), not the first open
        // of the chunk's stream or a reopen after an idle close.
        let mut recovering = false;
        for _ in 0..MAX_RECOVERIES {
            let Some(chunk) = self.chunk.as_mut() else {
                return Ok(());
            };
            chunk.stream = None;
            if !bad.is_empty() {
                recovering = true;
                let survivors: Vec<ChunkserverId> = chunk
                    .grant
                    .pipeline
                    .iter()
                    .map(|m| m.id)
                    .filter(|id| !bad.contains(id))
                    .collect();
                tracing::info!(
                    chunk = %chunk.grant.token.handle,
                    version = %chunk.grant.token.version,
                    ?bad,
                    ?survivors,
                    acked = chunk.acked,
                    "pipeline recovery"
                );
                let req = UpdatePipeline {
                    path: self.path.clone(),
                    client: self.client.id(),
                    handle: chunk.grant.token.handle,
                    survivors,
                    acked_length: chunk.acked,
                };
                let grant = match self.client.call(req).await {
                    Ok(g) => g,
                    Err(e) => return Err(self.master_error(e)),
                };
                let Some(chunk) = self.chunk.as_mut() else {
                    return Ok(());
                };
                chunk.grant = grant;
                bad.clear();
            }
            let Some(chunk) = self.chunk.as_mut() else {
                return Ok(());
            };
            let timeout = self.client.config().request_timeout;
            let ack_timeout = self.client.config().ack_timeout;
            let unacked_end = chunk
                .unacked
                .back()
                .map_or(chunk.acked, |p| p.offset + p.data.len() as u64);
            let start = if unacked_end > chunk.acked {
                let mut lengths = Vec::with_capacity(chunk.grant.pipeline.len());
                for m in &chunk.grant.pipeline {
                    let info = ReplicaInfo {
                        token: chunk.grant.token,
                    };
                    match self.client.call_chunkserver(&m.addr, info).await {
                        Ok((report, _)) => lengths.push(Some(report.length)),
                        Err(Error::Remote(RemoteError::StaleToken { current, .. })) => {
                            return Err(self.fenced(Some(current)));
                        }
                        Err(e) => {
                            // Not opened at `acked` with it: a member that cannot answer
                            // may still receive the set-up (a one-way partition), and a
                            // set-up below its length cuts bytes a reader may have seen.
                            tracing::warn!(chunkserver = %m.id, error = %e, "replica info failed: excluding the replica");
                            bad.push(m.id);
                        }
                    }
                }
                if !bad.is_empty() {
                    continue;
                }
                let start = resume_offset(chunk.acked, unacked_end, &lengths);
                if start > chunk.acked {
                    tracing::info!(
                        acked = chunk.acked,
                        start,
                        "reopening where every member's replica ends: their bytes past the \
                         acknowledged length are kept"
                    );
                }
                start
            } else {
                chunk.acked
            };
            let Some(chunk) = self.chunk.as_mut() else {
                return Ok(());
            };
            let (mut stream, reply) = match PipelineStream::open(
                &chunk.grant,
                start,
                timeout,
                ack_timeout,
            )
            .await
            {
                Ok(s) => s,
                Err(SetupError::Head(id, e)) => {
                    tracing::warn!(chunkserver = %id, error = %e, "pipeline head unreachable");
                    bad.push(id);
                    continue;
                }
                Err(SetupError::Rejected(RemoteError::StaleToken { current, .. })) => {
                    return Err(self.fenced(Some(current)));
                }
                Err(SetupError::Rejected(e)) if head_refusal_is_fatal(&e) => {
                    return Err(Error::Pipeline {
                        path: self.path.clone(),
                        reason: e.to_string(),
                    })
                }
                Err(SetupError::Rejected(e)) => {
                    let head = chunk.grant.pipeline[0].id;
                    tracing::warn!(chunkserver = %head, error = %e, "pipeline head refused the stream");
                    bad.push(head);
                    continue;
                }
            };
            let stale = reply.failed.iter().find_map(|(_, r)| match r {
                RemoteError::StaleToken { current, .. } => Some(*current),
                _ => None,
            });
            if let Some(current) = stale {
                return Err(self.fenced(Some(current)));
            }
            if !reply.failed.is_empty() {
                bad.extend(reply.failed.iter().map(|(id, _)| *id));
                stream.finish().await;
                continue;
            }
            stampfs_proto::crash_point!(
                "writer-reopen-before-resend",
                if recovering && !chunk.unacked.is_empty()
            );
            let token = chunk.grant.token;
            let mut ok = true;
            for p in &chunk.unacked {
                let sent = stream
                    .send(token, p.seq, p.offset, p.crc, p.sync, p.data.clone())
                    .await;
                if sent.is_err() {
                    ok = false;
                    break;
                }
            }
            if ok && stream.flush().await.is_ok() {
                // The resent packets left right after the set-up: a close of this
                // stream before their acks is no idle close.
                chunk.quiet_burst = false;
                chunk.stream = Some(stream);
                return Ok(());
            }
            bad.push(stream.head);
        }
        Err(Error::Pipeline {
            path: self.path.clone(),
            reason: format!("gave up after {MAX_RECOVERIES} pipeline recoveries"),
        })
    }

    /// Waits until every packet sent so far is acknowledged.
    async fn drain(&mut self) -> Result<()> {
        loop {
            self.check()?;
            let Some(chunk) = self.chunk.as_mut() else {
                return Ok(());
            };
            if chunk.unacked.is_empty() {
                return Ok(());
            }
            if chunk.stream.is_none() {
                self.reopen(Vec::new()).await?;
                continue;
            }
            self.flush_stream().await?;
            let ack = next_ack(&mut self.chunk).await;
            self.on_ack(ack).await;
        }
    }

    /// Commits the current chunk (once drained) and gets the next one.
    async fn next_chunk(&mut self) -> Result<()> {
        self.drain().await?;
        let previous = self.chunk.as_ref().map(|c| ChunkCommit {
            handle: c.grant.token.handle,
            length: c.acked,
        });
        if let Some(mut old) = self.chunk.take() {
            if let Some(stream) = old.stream.take() {
                stream.finish().await;
            }
            self.chunk = Some(old);
        }
        let req = AddChunk {
            path: self.path.clone(),
            client: self.client.id(),
            previous,
        };
        let grant = match self.client.call(req).await {
            Ok(g) => g,
            Err(e) => return Err(self.master_error(e)),
        };
        tracing::debug!(chunk = %grant.token.handle, version = %grant.token.version, "new chunk");
        self.chunk = Some(ChunkState::new(grant, 0));
        Ok(())
    }

    async fn flush(&mut self, sync: bool, data: Bytes) -> Result<()> {
        self.check()?;
        let carried = !data.is_empty();
        if carried {
            if let Err(e) = self.send_data(data, sync).await {
                self.fail(e);
            }
        }
        if sync && !carried {
            if let Some(chunk) = self.chunk.as_ref() {
                // An empty packet with `sync` makes every replica fdatasync what it has.
                let p = Pending {
                    seq: self.next_seq,
                    offset: chunk.sent,
                    crc: crc32fast::hash(&[]),
                    sync: true,
                    data: Bytes::new(),
                    sent_at: self.clock.start(),
                };
                self.next_seq += 1;
                if let Err(e) = self.push(p).await {
                    self.fail(e);
                }
            }
        }
        let res = self.drain().await;
        if let Err(e) = &res {
            self.fail(e.duplicate());
        }
        res
    }

    async fn close(&mut self) -> Result<FileStatus> {
        self.flush(false, Bytes::new()).await?;
        let last = self.chunk.as_ref().map(|c| ChunkCommit {
            handle: c.grant.token.handle,
            length: c.acked,
        });
        if let Some(chunk) = self.chunk.as_mut() {
            if let Some(stream) = chunk.stream.take() {
                stream.finish().await;
            }
        }
        let req = Close {
            path: self.path.clone(),
            client: self.client.id(),
            last,
        };
        match self.client.call(req).await {
            Ok(status) => Ok(status),
            Err(e) => {
                let e = self.master_error(e);
                self.fail(e.duplicate());
                Err(e)
            }
        }
    }
}

async fn next_ack(chunk: &mut Option<ChunkState>) -> Option<Incoming> {
    match chunk.as_mut().and_then(|c| c.stream.as_mut()) {
        Some(stream) => stream.next_ack().await,
        None => std::future::pending().await,
    }
}

/// The next ack while packets are in flight (`waiting`); at rest, the end of the
/// stream or the writer's idle close (`idle_close`).
async fn stream_event(
    chunk: &mut Option<ChunkState>,
    waiting: bool,
    idle_close: Option<Duration>,
) -> StreamEvent {
    match chunk.as_mut().and_then(|c| c.stream.as_mut()) {
        Some(stream) if waiting => StreamEvent::Incoming(stream.next_ack().await),
        Some(stream) => stream.watch_at_rest(idle_close).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reopened_stream_keeps_what_every_member_holds() {
        // Every member holds 150 of the 200 bytes sent; 100 were acknowledged.
        assert_eq!(resume_offset(100, 200, &[Some(150), Some(180)]), 150);
        // Nothing beyond the acknowledged bytes on one member: start there.
        assert_eq!(resume_offset(100, 200, &[Some(100), Some(180)]), 100);
        // A member that does not answer: the acknowledged length, as before.
        assert_eq!(resume_offset(100, 200, &[Some(150), None]), 100);
        // Never past what this writer sent, never below what it saw acknowledged.
        assert_eq!(resume_offset(100, 200, &[Some(250), Some(300)]), 200);
        assert_eq!(resume_offset(100, 200, &[Some(50)]), 100);
        assert_eq!(resume_offset(100, 100, &[]), 100);
    }

    #[test]
    fn only_a_refused_token_or_request_ends_the_writer_at_set_up() {
        let handle = stampfs_proto::ChunkHandle(3);
        assert!(head_refusal_is_fatal(&RemoteError::BadToken { handle }));
        // A malformed request is this writer's bug, whichever chunkserver it goes to.
        assert!(head_refusal_is_fatal(&RemoteError::BadRequest {
            reason: "a pipeline of 9 downstream chunkservers exceeds the limit".into(),
        }));
        // The head's replica came back shorter than the acknowledged length (a crash
        // lost its unsynced tail), was finalized, vanished, or is corrupt: exclude it,
        // keep writing.
        for e in [
            RemoteError::ReplicaShort {
                handle,
                offset: 100,
                length: 40,
            },
            RemoteError::ReplicaFinalized { handle, length: 40 },
            RemoteError::NotFound {
                what: "chunk".into(),
            },
            RemoteError::ChecksumMismatch { handle, offset: 0 },
            RemoteError::Io {
                reason: "EIO".into(),
            },
        ] {
            assert!(!head_refusal_is_fatal(&e), "{e}");
        }
    }

    #[test]
    fn a_stream_closed_with_nothing_in_flight_is_reopened_not_blamed() {
        for quiet in [false, true] {
            assert_eq!(
                after_stream_end(StreamEnd::Closed, false, quiet),
                EndAction::Reopen
            );
        }
        assert!(excluded(EndAction::Reopen, Some(ChunkserverId(1))).is_empty());
    }

    #[test]
    fn a_close_seen_only_after_new_packets_went_out_on_a_quiet_stream_is_an_idle_close() {
        // The head closed the idle stream; the writer queued packets on the dead
        // socket before it saw the EOF. No ack came back for them.
        assert_eq!(
            after_stream_end(StreamEnd::Closed, true, true),
            EndAction::Reopen
        );
    }

    #[test]
    fn a_stream_that_breaks_with_packets_in_flight_excludes_the_head() {
        // Closed while the head was acking the packets around these: it died.
        assert_eq!(
            after_stream_end(StreamEnd::Closed, true, false),
            EndAction::ExcludeHead
        );
        assert_eq!(
            excluded(EndAction::ExcludeHead, Some(ChunkserverId(1))),
            vec![ChunkserverId(1)]
        );
        // Garbage, or an ack or send that timed out (a frozen head): never idle.
        for (outstanding, quiet) in [(false, false), (true, false), (true, true)] {
            assert_eq!(
                after_stream_end(StreamEnd::Broken, outstanding, quiet),
                EndAction::ExcludeHead
            );
        }
    }

    #[test]
    fn stream_ends_are_classified_by_how_the_connection_failed() {
        use std::io::ErrorKind;
        let io = |k: ErrorKind| Error::Proto(stampfs_proto::Error::Io(k.into()));
        for k in [
            ErrorKind::UnexpectedEof,
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::BrokenPipe,
        ] {
            assert_eq!(StreamEnd::of(&io(k)), StreamEnd::Closed, "{k:?}");
            assert_eq!(StreamEnd::of(&Error::Io(k.into())), StreamEnd::Closed);
        }
        for e in [
            io(ErrorKind::TimedOut),
            Error::Proto(stampfs_proto::Error::Truncated),
            Error::Proto(stampfs_proto::Error::Malformed { reason: "x".into() }),
            Error::Remote(RemoteError::Unavailable {
                reason: "did not acknowledge".into(),
            }),
        ] {
            assert_eq!(StreamEnd::of(&e), StreamEnd::Broken, "{e}");
        }
    }

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
