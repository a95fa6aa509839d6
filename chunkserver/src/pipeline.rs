//! The write pipeline: one stream per `WriteSetup` connection.
//!
//! **Set-up.** The token is authenticated and gated under the per-chunk lock; bytes
//! beyond the setup offset (an unacknowledged tail of the writer holding this version:
//! pipeline recovery) are cut, a gap before it is refused. Then the next chunkserver is
//! connected and sent the same setup with the rest of the chain. A downstream that
//! cannot be reached or refuses is listed in `failed` and the next one is tried in its
//! place; the reply lists `accepted` (this replica first) and `failed`.
//!
//! **Stream.** Five concurrent parts, joined in one task:
//!
//! ```text
//! upstream ──frames──▶ read_upstream ─┬─▶ write_local ──────────────────────┐ (result per seq)
//!                      (MAC, CRC,     ├─▶ forward ──frames──▶ downstream    │
//!                       contiguity,   │                     │               │
//!                       byte permits) │   read_downstream ◀─acks            │ (acks per seq)
//!                                     └─▶ ack_upstream ◀────────────────────┘
//! upstream ◀──acks── ack_upstream (in seq order, once local write AND downstream ack are done)
//! ```
//!
//! Every packet holds byte permits from a per-stream semaphore from the moment it is
//! read until its ack is written, so a slow downstream (or a slow upstream reader of
//! acks) stops this stream from reading: backpressure, never unbounded memory.
//! A packet rejected here (bad MAC, CRC, gap) is not forwarded; its ack lists only this
//! replica. After a local failure the failing seq is acked with the error and the
//! stream is closed. If the downstream connection dies (or its ack does not arrive
//! within `--ack-timeout`), its replicas' entries become `Unavailable`, naming it, and
//! the stream goes on locally.
//!
//! **Idle streams.** An upstream that sends no frame for `--idle-timeout` while none of
//! its packets is outstanding (received and not yet acknowledged) is treated as gone:
//! the stream ends exactly as on an upstream EOF (the parts drain, the downstream is
//! half-closed, the upstream socket is shut down), so a frozen or vanished writer can
//! not pin a stream, its connection permit and its downstream streams forever. The
//! clock restarts on every frame received and every ack sent, so only silence counts;
//! while a packet is outstanding the ack timeout is what applies ([`idle_check`]).
//!
//! **Peers that stop reading.** Idleness is about what a peer sends; the other
//! direction is bounded by progress ([`crate::stall`]): the acks (and the set-up reply)
//! go to the upstream through the connection's [`StallGuard`], so an upstream that
//! takes no byte of them for `--idle-timeout` is gone and the stream ends as on a broken socket (its packets'
//! byte permits would otherwise stay held, and with them the stream, forever).
//! Forwarded packets go downstream through a guard with `--ack-timeout`: a downstream
//! that takes no byte for as long as an ack may take is lost like one whose ack did not
//! come, and the stream goes on locally.
//!
//! **Throughput.** `write_local` takes whatever packets queued up while the previous
//! write was on disk as one batch ([`Store::write_batch`](crate::store::Store::write_batch)):
//! one hold of the per-chunk lock in which every packet still passes the version gate
//! in turn, one vectored write. Forwarding goes through a `FrameSink`: the frame CRC
//! is combined from the packet CRC verified on arrival ([`frame_prefix`](stampfs_proto::codec::frame_prefix)) and queued
//! frames leave in one vectored write; acks that are ready together are flushed
//! together.

use crate::error::Error;
use crate::header::MAX_CHUNK_SIZE;
use crate::server::{Shared, StreamGuard};
use crate::stall::{GuardedWriteHalf, StallGuard};
use crate::store::PacketWrite;
use bytes::Bytes;
use stampfs_proto::rpc::{parse_reply, reply_frame, request_frame};
use stampfs_proto::{
    Ack, ChunkHandle, ChunkToken, ChunkVersion, ChunkserverId, ClusterKey, Frame, FrameReader,
    FrameSink, FrameWriter, Packet, RemoteError, ReplicaAck, WriteSetup, WriteSetupReply,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Packets queued between the parts of a stream (bytes are bounded by permits).
const QUEUE: usize = 1024;
/// Most packets written to disk as one batch (one lock hold, one I/O chain).
const MAX_BATCH: usize = 128;
/// Most chunkservers a setup may list downstream.
pub const MAX_DOWNSTREAM: usize = 16;
/// How far ahead the idle check looks when the idle timeout is too large to add to an
/// instant (it then never expires).
const FAR_CHECK: Duration = Duration::from_secs(24 * 60 * 60);

/// What the idle check of a write stream decides (see [`idle_check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idleness {
    /// Silent for the whole idle timeout with nothing outstanding: end the stream.
    Expired,
    /// Not idle (yet): check again at this instant.
    CheckAt(Instant),
}

/// Whether a write stream has been silent too long at `now`. `last_activity` is the
/// later of the last frame its upstream sent (or the set-up) and the last ack sent
/// back; `outstanding` is whether a packet has been received and not yet acknowledged.
/// Silence counts only while nothing is outstanding: a packet in flight is the ack
/// timeout's business, so a slow disk or a slow downstream never makes a stream idle,
/// and the quiet time starts again when its ack goes out.
pub fn idle_check(
    now: Instant,
    last_activity: Instant,
    outstanding: bool,
    timeout: Duration,
) -> Idleness {
    let far = || now + FAR_CHECK;
    if outstanding {
        return Idleness::CheckAt(now.checked_add(timeout).unwrap_or_else(far));
    }
    match last_activity.checked_add(timeout) {
        Some(deadline) if now >= deadline => Idleness::Expired,
        Some(deadline) => Idleness::CheckAt(deadline),
        None => Idleness::CheckAt(far()),
    }
}

/// When a stream last heard from its upstream or answered it: the idle clock. Kept as
/// nanoseconds since `base` in an atomic, so the reading and the acking parts of the
/// stream both move it forward without a lock.
struct Activity {
    base: Instant,
    nanos: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            nanos: AtomicU64::new(0),
        }
    }

    /// Records activity now.
    fn touch(&self) {
        let n = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_max(n, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.base + Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

/// What became of a packet downstream, for [`compose_ack`].
#[derive(Debug)]
pub enum DownResult {
    /// This replica is the last of the pipeline.
    NoDownstream,
    /// The packet was rejected here and not forwarded.
    NotForwarded,
    /// The downstream acked it with these entries.
    Acked(Vec<ReplicaAck>),
    /// The downstream connection died before acking it.
    Lost,
}

/// The ack for one packet: this replica's result, then the downstream replicas'.
/// When the downstream was lost, every replica behind this one (`down_ids`, as the
/// downstream accepted at set-up) is `Unavailable`, the first named as the failed one.
pub fn compose_ack(
    seq: u64,
    own: ChunkserverId,
    local: std::result::Result<u64, RemoteError>,
    down: DownResult,
    down_ids: &[ChunkserverId],
) -> Ack {
    let mut replicas = vec![ReplicaAck {
        chunkserver: own,
        result: local,
    }];
    match down {
        DownResult::NoDownstream | DownResult::NotForwarded => {}
        DownResult::Acked(entries) => replicas.extend(entries),
        DownResult::Lost => {
            let first = down_ids.first().copied();
            replicas.extend(down_ids.iter().map(|id| ReplicaAck {
                chunkserver: *id,
                result: Err(RemoteError::Unavailable {
                    reason: match first {
                        Some(f) if f != *id => format!("unreachable: pipeline broken at {f}"),
                        _ => format!("lost the pipeline connection to {id}"),
                    },
                }),
            }));
        }
    }
    Ack { seq, replicas }
}

/// Where the next packet must start, given one at `offset` with `len` bytes when
/// `expected` was next: contiguous (`offset == expected`) or a retry of bytes already
/// sent (`offset < expected`). A gap is refused.
pub fn next_offset(offset: u64, len: u64, expected: u64) -> std::result::Result<u64, String> {
    let end = offset
        .checked_add(len)
        .ok_or_else(|| "packet offset overflows".to_string())?;
    if end > MAX_CHUNK_SIZE {
        return Err(format!(
            "packet ending at {end} exceeds the chunk limit of {MAX_CHUNK_SIZE} bytes"
        ));
    }
    if offset > expected {
        return Err(format!(
            "packet at offset {offset} is not contiguous: expected {expected}"
        ));
    }
    Ok(end.max(expected))
}

/// Checks a packet before it is written or forwarded: same chunk as the setup, MAC (a
/// token equal to the last verified one is not re-verified), CRC (`data_crc` is
/// `crc32` of the packet's `data_len` bytes, from the frame reader's verifying pass),
/// contiguity.
fn check_packet(
    key: &ClusterKey,
    verified: &mut ChunkToken,
    packet: &Packet,
    (data_len, data_crc): (u64, u32),
    expected: u64,
) -> std::result::Result<u64, RemoteError> {
    let handle = verified.handle;
    if packet.token.handle != handle {
        return Err(RemoteError::BadRequest {
            reason: format!(
                "packet for chunk {} on a stream of chunk {handle}",
                packet.token.handle
            ),
        });
    }
    if packet.token != *verified {
        packet
            .token
            .verify(key)
            .map_err(|_| RemoteError::BadToken { handle })?;
        *verified = packet.token;
    }
    if data_crc != packet.crc {
        return Err(RemoteError::ChecksumMismatch {
            handle,
            offset: packet.offset,
        });
    }
    next_offset(packet.offset, data_len, expected)
        .map_err(|reason| RemoteError::BadRequest { reason })
}

/// Connects to `addr` and opens the stream there with `setup` (what `RpcClient`
/// would do, keeping the raw write half for the [`FrameSink`]). Writes to it fail once
/// it has taken no byte for `stall` (see [`crate::stall`]).
async fn open_downstream(
    addr: &str,
    setup: WriteSetup,
    timeout: Duration,
    stall: Duration,
) -> stampfs_proto::Result<(
    FrameReader<OwnedReadHalf>,
    FrameSink<GuardedWriteHalf>,
    WriteSetupReply,
)> {
    let unavailable =
        |reason: String| stampfs_proto::Error::Remote(RemoteError::Unavailable { reason });
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| unavailable(format!("connecting to {addr} timed out")))?
        .map_err(|e| unavailable(format!("cannot connect to {addr}: {e}")))?;
    stream.set_nodelay(true)?;
    let peer = stream.peer_addr()?;
    let (r, w) = stream.into_split();
    let mut reader = FrameReader::new(r);
    let mut sink = FrameSink::new(StallGuard::new(w, peer, stall));
    sink.feed_frame(&request_frame(1, setup, Bytes::new())?)?;
    sink.flush().await?;
    let frame = reader
        .read_frame()
        .await?
        .ok_or(stampfs_proto::Error::Truncated)?;
    let reply = parse_reply(1, &frame)?;
    Ok((reader, sink, reply))
}

/// The downstream side after set-up.
struct Downstream {
    link: Option<(FrameReader<OwnedReadHalf>, FrameSink<GuardedWriteHalf>)>,
    accepted: Vec<ChunkserverId>,
    failed: Vec<(ChunkserverId, RemoteError)>,
}

async fn connect_downstream(shared: &Shared, setup: &WriteSetup) -> Downstream {
    let mut failed = Vec::new();
    let timeout = shared.config.connect_timeout;
    for (i, target) in setup.downstream.iter().enumerate() {
        let rest = setup.downstream[i + 1..].to_vec();
        // The next chunkserver may itself wait for the ones after it.
        let budget = timeout * (rest.len() as u32 + 2);
        let attempt = open_downstream(
            &target.addr,
            WriteSetup {
                token: setup.token,
                offset: setup.offset,
                downstream: rest,
            },
            timeout,
            shared.config.ack_timeout,
        );
        let outcome = match stampfs_proto::pause::timeout(budget, attempt).await {
            Ok(Ok(x)) => Ok(x),
            Ok(Err(e)) => Err(e.to_remote()),
            Err(_) => Err(RemoteError::Unavailable {
                reason: format!("pipeline set-up with {} timed out", target.id),
            }),
        };
        match outcome {
            Ok((reader, sink, reply)) => {
                failed.extend(reply.failed);
                return Downstream {
                    link: Some((reader, sink)),
                    accepted: reply.accepted,
                    failed,
                };
            }
            Err(e) => {
                tracing::warn!(downstream = %target.id, addr = %target.addr, error = %e, "downstream refused or unreachable; skipping it");
                failed.push((target.id, e));
            }
        }
    }
    Downstream {
        link: None,
        accepted: Vec::new(),
        failed,
    }
}

/// Serves a `WriteSetup` connection to its end.
#[tracing::instrument(skip_all, fields(chunk = %setup.token.handle, version = %setup.token.version, offset = setup.offset, %peer))]
pub(crate) async fn serve(
    shared: Arc<Shared>,
    id: u64,
    setup: WriteSetup,
    reader: FrameReader<OwnedReadHalf>,
    mut writer: FrameWriter<GuardedWriteHalf>,
    peer: SocketAddr,
) {
    let _active = StreamGuard::new(&shared.active_streams);
    let own = shared.own_id();
    let local = async {
        setup.token.verify(&shared.key).map_err(Error::from)?;
        if setup.downstream.len() > MAX_DOWNSTREAM {
            return Err(Error::bad_request(format!(
                "a pipeline of {} downstream chunkservers exceeds the limit of {MAX_DOWNSTREAM}",
                setup.downstream.len()
            )));
        }
        shared
            .store
            .open_for_write(setup.token.handle, setup.token.version, setup.offset)
            .await
    }
    .await;
    if let Err(e) = local {
        tracing::warn!(error = %e, "write stream refused");
        if let Ok(frame) = reply_frame::<WriteSetupReply>(id, &Err(e.to_remote()), Bytes::new()) {
            let _ = writer.write_frame(&frame).await;
        }
        return;
    }
    let down = tokio::select! {
        d = connect_downstream(&shared, &setup) => d,
        _ = shared.cancel.cancelled() => return,
    };
    let reply = WriteSetupReply {
        accepted: std::iter::once(own)
            .chain(down.accepted.iter().copied())
            .collect(),
        failed: down.failed,
    };
    tracing::info!(accepted = ?reply.accepted, failed = ?reply.failed, "write stream open");
    match reply_frame(id, &Ok(reply), Bytes::new()) {
        Ok(frame) => {
            if writer.write_frame(&frame).await.is_err() {
                return;
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the setup reply");
            return;
        }
    }
    let stream = Stream {
        shared: shared.clone(),
        handle: setup.token.handle,
        own,
        down_ids: down.accepted,
        peer,
        activity: Activity::new(),
        stop: shared.cancel.child_token(),
    };
    stream
        .run(setup.token, setup.offset, reader, writer, down.link)
        .await;
    tracing::info!("write stream closed");
}

/// One packet waiting to be acknowledged.
struct Pending {
    seq: u64,
    local: LocalOutcome,
    down: DownOutcome,
    /// Byte permits held until the ack is written.
    _permit: OwnedSemaphorePermit,
}

enum LocalOutcome {
    Pending(oneshot::Receiver<std::result::Result<u64, RemoteError>>),
    Rejected(RemoteError),
}

enum DownOutcome {
    NoDownstream,
    NotForwarded,
    Lost,
    Pending(oneshot::Receiver<Vec<ReplicaAck>>),
}

struct LocalJob {
    version: ChunkVersion,
    offset: u64,
    data: Bytes,
    /// The packet's CRC, already checked against `data`.
    crc: u32,
    sync: bool,
    /// Hands the outcome to the acker (which holds the receiver in `Pending`).
    result: oneshot::Sender<std::result::Result<u64, RemoteError>>,
}

struct ForwardJob {
    frame: Frame,
    /// CRC of the frame's data (verified on arrival).
    crc: u32,
    seq: u64,
    /// Passed on to `read_downstream`, which fills it with the downstream's ack
    /// entries; dropping it unfilled means the downstream was lost.
    result: oneshot::Sender<Vec<ReplicaAck>>,
}

type Expectation = (u64, oneshot::Sender<Vec<ReplicaAck>>);

struct Stream {
    shared: Arc<Shared>,
    handle: ChunkHandle,
    own: ChunkserverId,
    /// The replicas behind this one, as the downstream accepted them at set-up.
    down_ids: Vec<ChunkserverId>,
    /// The upstream (the writer or the previous chunkserver).
    peer: SocketAddr,
    /// Last frame received or ack sent, for the idle timeout.
    activity: Activity,
    /// Ends the stream: cancelled by server shutdown, or after a local failure was acked.
    stop: CancellationToken,
}

impl Stream {
    async fn run(
        self,
        token: ChunkToken,
        offset: u64,
        reader: FrameReader<OwnedReadHalf>,
        writer: FrameWriter<GuardedWriteHalf>,
        link: Option<(FrameReader<OwnedReadHalf>, FrameSink<GuardedWriteHalf>)>,
    ) {
        let (local_tx, local_rx) = mpsc::channel(QUEUE);
        let (ack_tx, ack_rx) = mpsc::channel(QUEUE);
        let (fwd_tx, forwarding) = match link {
            Some((down_reader, down_writer)) => {
                let (fwd_tx, fwd_rx) = mpsc::channel(QUEUE);
                let (expect_tx, expect_rx) = mpsc::channel(QUEUE);
                (
                    Some(fwd_tx),
                    Some((down_reader, down_writer, fwd_rx, expect_tx, expect_rx)),
                )
            }
            None => (None, None),
        };
        let downstream = async {
            if let Some((down_reader, down_writer, fwd_rx, expect_tx, expect_rx)) = forwarding {
                tokio::join!(
                    forward(down_writer, fwd_rx, expect_tx),
                    read_downstream(down_reader, expect_rx, self.shared.config.ack_timeout)
                );
            }
        };
        let work = async {
            tokio::join!(
                self.read_upstream(token, offset, reader, local_tx, fwd_tx, ack_tx),
                self.write_local(local_rx),
                downstream,
                self.ack_upstream(writer, ack_rx),
            )
        };
        tokio::select! {
            _ = work => {}
            _ = self.stop.cancelled() => {}
        }
    }

    async fn read_upstream(
        &self,
        token: ChunkToken,
        mut expected: u64,
        mut reader: FrameReader<OwnedReadHalf>,
        local_tx: mpsc::Sender<LocalJob>,
        mut fwd_tx: Option<mpsc::Sender<ForwardJob>>,
        ack_tx: mpsc::Sender<Pending>,
    ) {
        let cap = self.shared.config.stream_buffer.min(u32::MAX as u64);
        let permits = Arc::new(Semaphore::new(cap as usize));
        let mut verified = token;
        let idle_timeout = self.shared.config.idle_timeout;
        // A lazy timer: frames only move `activity`; when the timer fires, the idle
        // check either ends the stream or sets the next check.
        let now = Instant::now();
        let idle = tokio::time::sleep_until(
            match idle_check(now, self.activity.last(), false, idle_timeout) {
                Idleness::CheckAt(at) => at,
                Idleness::Expired => now,
            },
        );
        tokio::pin!(idle);
        loop {
            // The same read future is polled until it completes (a frame read is not
            // cancel-safe); it is dropped only when the stream ends.
            let read = reader.read_frame_with_data_crc();
            tokio::pin!(read);
            let frame = loop {
                tokio::select! {
                    biased;
                    f = &mut read => break f,
                    () = &mut idle => {
                        let outstanding = permits.available_permits() < cap as usize;
                        match idle_check(Instant::now(), self.activity.last(), outstanding, idle_timeout) {
                            Idleness::Expired => {
                                tracing::info!(peer = %self.peer, ?idle_timeout, "upstream idle; ending the stream");
                                return;
                            }
                            Idleness::CheckAt(at) => idle.as_mut().reset(at),
                        }
                    }
                }
            };
            let (frame, data_crc) = match frame {
                Ok(Some(f)) => {
                    self.activity.touch();
                    f
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "bad frame from upstream; ending the stream");
                    return;
                }
            };
            let packet: Packet = match frame.decode() {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable packet; ending the stream");
                    return;
                }
            };
            let want = (frame.data.len().max(1) as u64).min(cap) as u32;
            let Ok(permit) = permits.clone().acquire_many_owned(want).await else {
                return;
            };
            let seq = packet.seq;
            match check_packet(
                &self.shared.key,
                &mut verified,
                &packet,
                (frame.data.len() as u64, data_crc),
                expected,
            ) {
                Ok(next) => expected = next,
                Err(e) => {
                    tracing::warn!(seq, offset = packet.offset, error = %e, "packet rejected");
                    let _ = ack_tx
                        .send(Pending {
                            seq,
                            local: LocalOutcome::Rejected(e),
                            down: DownOutcome::NotForwarded,
                            _permit: permit,
                        })
                        .await;
                    return;
                }
            }
            let (local_result, local_rx) = oneshot::channel();
            let job = LocalJob {
                version: packet.token.version,
                offset: packet.offset,
                data: frame.data.clone(),
                crc: packet.crc,
                sync: packet.sync,
                result: local_result,
            };
            if local_tx.send(job).await.is_err() {
                return;
            }
            let down = match &fwd_tx {
                None if self.down_ids.is_empty() => DownOutcome::NoDownstream,
                None => DownOutcome::Lost,
                Some(tx) => {
                    let (result, rx) = oneshot::channel();
                    let job = ForwardJob {
                        frame,
                        crc: packet.crc,
                        seq,
                        result,
                    };
                    if tx.send(job).await.is_ok() {
                        DownOutcome::Pending(rx)
                    } else {
                        fwd_tx = None;
                        DownOutcome::Lost
                    }
                }
            };
            let pending = Pending {
                seq,
                local: LocalOutcome::Pending(local_rx),
                down,
                _permit: permit,
            };
            if ack_tx.send(pending).await.is_err() {
                return;
            }
        }
    }

    /// Writes packets in arrival order. Whatever has queued up while the previous
    /// batch was on disk goes as the next batch: one hold of the per-chunk lock (every
    /// packet still passes the version gate in turn) and one I/O chain.
    async fn write_local(&self, mut rx: mpsc::Receiver<LocalJob>) {
        let mut failed: Option<RemoteError> = None;
        let mut jobs = Vec::with_capacity(MAX_BATCH);
        while rx.recv_many(&mut jobs, MAX_BATCH).await > 0 {
            let mut lengths = Vec::new().into_iter();
            if failed.is_none() {
                let packets = jobs
                    .iter()
                    .map(|j| PacketWrite {
                        version: j.version,
                        offset: j.offset,
                        data: j.data.clone(),
                        crc: Some(j.crc),
                        sync: j.sync,
                    })
                    .collect();
                let outcome = self.shared.store.write_batch(self.handle, packets).await;
                if let Some(e) = outcome.error {
                    let at = jobs.get(outcome.lengths.len()).map(|j| j.offset);
                    tracing::warn!(offset = at, error = %e, "local write failed");
                    failed = Some(e.to_remote());
                }
                lengths = outcome.lengths.into_iter();
            }
            for job in jobs.drain(..) {
                let result = match (lengths.next(), &failed) {
                    (Some(length), _) => Ok(length),
                    (None, Some(e)) => Err(e.clone()),
                    (None, None) => Err(RemoteError::Internal {
                        reason: "the local write left a packet unanswered".into(),
                    }),
                };
                let _ = job.result.send(result);
            }
        }
    }

    /// Acks packets in order. Acks that are ready back to back go out in one write:
    /// the queued acks are flushed only before waiting for something not yet done.
    async fn ack_upstream(
        &self,
        mut writer: FrameWriter<GuardedWriteHalf>,
        mut rx: mpsc::Receiver<Pending>,
    ) {
        loop {
            let p = match rx.try_recv() {
                Ok(p) => p,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    if writer.flush().await.is_err() {
                        self.stop.cancel();
                        return;
                    }
                    match rx.recv().await {
                        Some(p) => p,
                        None => break,
                    }
                }
            };
            let local = match p.local {
                LocalOutcome::Rejected(e) => Ok(Some(Err(e))),
                LocalOutcome::Pending(r) => ready_or_flush(r, &mut writer).await,
            };
            let local = match local {
                Ok(l) => l.unwrap_or_else(|| {
                    Err(RemoteError::Internal {
                        reason: "the local writer stopped".into(),
                    })
                }),
                Err(e) => {
                    tracing::debug!(error = %e, "upstream went away");
                    self.stop.cancel();
                    return;
                }
            };
            let down = match p.down {
                DownOutcome::NoDownstream => DownResult::NoDownstream,
                DownOutcome::NotForwarded => DownResult::NotForwarded,
                DownOutcome::Lost => DownResult::Lost,
                DownOutcome::Pending(r) => match ready_or_flush(r, &mut writer).await {
                    Ok(Some(entries)) => DownResult::Acked(entries),
                    Ok(None) => DownResult::Lost,
                    Err(e) => {
                        tracing::debug!(error = %e, "upstream went away");
                        self.stop.cancel();
                        return;
                    }
                },
            };
            let failed = local.is_err();
            let ack = compose_ack(p.seq, self.own, local, down, &self.down_ids);
            let sent = match Frame::message(&ack) {
                Ok(frame) => writer.feed(&frame).await,
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                tracing::debug!(error = %e, "upstream went away");
                self.stop.cancel();
                return;
            }
            // Answering is activity too: the idle clock of a stream whose packets took
            // long restarts when the last of them is acknowledged.
            self.activity.touch();
            if failed {
                tracing::warn!(seq = p.seq, "closing the stream after a local failure");
                let _ = writer.shutdown().await;
                self.stop.cancel();
                return;
            }
        }
        let _ = writer.shutdown().await;
    }
}

/// `rx`'s value; when it is not ready yet, the acks queued in `writer` are flushed
/// before waiting. `None` when the sender went away.
async fn ready_or_flush<T>(
    mut rx: oneshot::Receiver<T>,
    writer: &mut FrameWriter<GuardedWriteHalf>,
) -> stampfs_proto::Result<Option<T>> {
    match rx.try_recv() {
        Ok(v) => Ok(Some(v)),
        Err(oneshot::error::TryRecvError::Closed) => Ok(None),
        Err(oneshot::error::TryRecvError::Empty) => {
            writer.flush().await?;
            Ok(rx.await.ok())
        }
    }
}

/// Sends packets downstream in order, registering each one's ack expectation first.
async fn forward(
    mut writer: FrameSink<GuardedWriteHalf>,
    mut rx: mpsc::Receiver<ForwardJob>,
    expect: mpsc::Sender<Expectation>,
) {
    while let Some(job) = rx.recv().await {
        if expect.send((job.seq, job.result)).await.is_err() {
            return;
        }
        if let Err(e) = writer.feed(&job.frame, job.crc).await {
            tracing::warn!(error = %e, "downstream write failed");
            return;
        }
        if rx.is_empty() {
            if let Err(e) = writer.flush().await {
                tracing::warn!(error = %e, "downstream write failed");
                return;
            }
        }
    }
    let _ = writer.shutdown().await;
}

/// Matches downstream acks to the packets sent, in order. Returning drops every
/// outstanding expectation, which the acker reports as a lost downstream.
async fn read_downstream(
    mut reader: FrameReader<OwnedReadHalf>,
    mut expect: mpsc::Receiver<Expectation>,
    ack_timeout: Duration,
) {
    while let Some((seq, result)) = expect.recv().await {
        let frame = match stampfs_proto::pause::timeout(ack_timeout, reader.read_frame()).await {
            Ok(Ok(Some(f))) => f,
            Ok(Ok(None)) => {
                tracing::warn!(seq, "downstream closed the pipeline");
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(seq, error = %e, "downstream connection failed");
                return;
            }
            Err(_) => {
                tracing::warn!(seq, timeout = ?ack_timeout, "downstream ack timed out");
                return;
            }
        };
        let ack: Ack = match frame.decode() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(seq, error = %e, "undecodable downstream ack");
                return;
            }
        };
        if ack.seq != seq {
            tracing::warn!(
                expected = seq,
                got = ack.seq,
                "downstream acked out of order"
            );
            return;
        }
        let _ = result.send(ack.replicas);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::ChunkVersion;

    fn ids(v: &[u64]) -> Vec<ChunkserverId> {
        v.iter().map(|i| ChunkserverId(*i)).collect()
    }

    #[test]
    fn contiguous_retry_and_gap() {
        assert_eq!(next_offset(0, 10, 0), Ok(10));
        assert_eq!(next_offset(10, 5, 10), Ok(15));
        // An exact retry of bytes already sent keeps the expectation.
        assert_eq!(next_offset(0, 10, 15), Ok(15));
        // Overlapping the end moves it.
        assert_eq!(next_offset(12, 10, 15), Ok(22));
        assert!(next_offset(16, 1, 15).is_err());
        assert!(next_offset(MAX_CHUNK_SIZE, 1, MAX_CHUNK_SIZE).is_err());
        assert!(next_offset(u64::MAX, 2, 0).is_err());
    }

    #[test]
    fn ack_lists_this_replica_then_downstream() {
        let down = vec![
            ReplicaAck {
                chunkserver: ChunkserverId(2),
                result: Ok(100),
            },
            ReplicaAck {
                chunkserver: ChunkserverId(3),
                result: Ok(100),
            },
        ];
        let ack = compose_ack(
            7,
            ChunkserverId(1),
            Ok(100),
            DownResult::Acked(down.clone()),
            &ids(&[2, 3]),
        );
        assert_eq!(ack.seq, 7);
        assert_eq!(ack.replicas[0].chunkserver, ChunkserverId(1));
        assert_eq!(&ack.replicas[1..], &down[..]);
    }

    #[test]
    fn a_lost_downstream_names_it_and_everything_behind_it() {
        let ack = compose_ack(1, ChunkserverId(1), Ok(5), DownResult::Lost, &ids(&[2, 3]));
        assert_eq!(ack.replicas.len(), 3);
        assert_eq!(ack.replicas[0].result, Ok(5));
        for (entry, id) in ack.replicas[1..].iter().zip([2u64, 3]) {
            assert_eq!(entry.chunkserver, ChunkserverId(id));
            match &entry.result {
                Err(RemoteError::Unavailable { reason }) => {
                    assert!(reason.contains("cs2"), "{reason}")
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
    }

    #[test]
    fn rejected_or_last_packets_list_only_this_replica() {
        let err = RemoteError::ChecksumMismatch {
            handle: ChunkHandle(1),
            offset: 0,
        };
        let ack = compose_ack(
            1,
            ChunkserverId(1),
            Err(err.clone()),
            DownResult::NotForwarded,
            &ids(&[2]),
        );
        assert_eq!(ack.replicas.len(), 1);
        assert_eq!(ack.replicas[0].result, Err(err));
        let ack = compose_ack(1, ChunkserverId(3), Ok(1), DownResult::NoDownstream, &[]);
        assert_eq!(ack.replicas.len(), 1);
    }

    #[test]
    fn a_stream_is_idle_only_after_a_whole_quiet_timeout() {
        let t = Duration::from_secs(60);
        let s = Duration::from_secs;
        let t0 = Instant::now();
        assert_eq!(idle_check(t0, t0, false, t), Idleness::CheckAt(t0 + t));
        assert_eq!(
            idle_check(t0 + s(59), t0, false, t),
            Idleness::CheckAt(t0 + t)
        );
        assert_eq!(idle_check(t0 + t, t0, false, t), Idleness::Expired);
        assert_eq!(idle_check(t0 + s(3600), t0, false, t), Idleness::Expired);
        // Activity (a frame in, an ack out) restarts the clock.
        assert_eq!(
            idle_check(t0 + t, t0 + s(30), false, t),
            Idleness::CheckAt(t0 + s(90))
        );
    }

    #[test]
    fn a_stream_with_a_packet_outstanding_is_never_idle() {
        let t = Duration::from_secs(60);
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(3600);
        assert_eq!(idle_check(late, t0, true, t), Idleness::CheckAt(late + t));
    }

    #[test]
    fn a_slow_writer_is_never_idle() {
        // A packet (and its ack) every 5 s for an hour against a 6 s timeout: every
        // check the timer could make finds it busy.
        let t = Duration::from_secs(6);
        let t0 = Instant::now();
        for k in 0..720u64 {
            let last = t0 + Duration::from_secs(5 * k);
            for after in [0u64, 1, 4, 5] {
                let now = last + Duration::from_secs(after);
                assert_eq!(idle_check(now, last, false, t), Idleness::CheckAt(last + t));
            }
        }
    }

    #[test]
    fn a_huge_idle_timeout_never_expires_and_never_overflows() {
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(3600);
        for outstanding in [false, true] {
            match idle_check(late, t0, outstanding, Duration::MAX) {
                Idleness::CheckAt(at) => assert!(at > late),
                Idleness::Expired => panic!("a huge timeout expired"),
            }
        }
    }

    #[test]
    fn activity_starts_at_creation_and_only_moves_forward() {
        let a = Activity::new();
        let first = a.last();
        assert_eq!(first, a.base);
        a.touch();
        let second = a.last();
        assert!(second >= first);
        a.touch();
        assert!(a.last() >= second);
    }

    #[test]
    fn packet_checks() {
        let key = ClusterKey::from_bytes([1; 32]);
        let token = ChunkToken::sign(
            &key,
            ChunkHandle(9),
            ChunkVersion(2),
            stampfs_proto::ClientId(5),
        );
        let mut verified = token;
        let data = b"hello";
        let sum = |d: &[u8]| (d.len() as u64, crc32fast::hash(d));
        let good = Packet {
            token,
            seq: 0,
            offset: 0,
            crc: crc32fast::hash(data),
            sync: false,
        };
        assert_eq!(
            check_packet(&key, &mut verified, &good, sum(data), 0),
            Ok(5)
        );
        let mut bad_crc = good.clone();
        bad_crc.crc ^= 1;
        assert!(matches!(
            check_packet(&key, &mut verified, &bad_crc, sum(data), 0),
            Err(RemoteError::ChecksumMismatch { .. })
        ));
        let mut forged = good.clone();
        forged.token.version = ChunkVersion(3);
        assert!(matches!(
            check_packet(&key, &mut verified, &forged, sum(data), 0),
            Err(RemoteError::BadToken { .. })
        ));
        let gap = Packet {
            offset: 6,
            ..good.clone()
        };
        assert!(matches!(
            check_packet(&key, &mut verified, &gap, sum(data), 5),
            Err(RemoteError::BadRequest { .. })
        ));
        // A newer genuine token for the same chunk is verified and cached.
        let newer = ChunkToken::sign(
            &key,
            ChunkHandle(9),
            ChunkVersion(3),
            stampfs_proto::ClientId(5),
        );
        let p = Packet {
            token: newer,
            ..good
        };
        assert_eq!(check_packet(&key, &mut verified, &p, sum(data), 5), Ok(5));
        assert_eq!(verified, newer);
    }
}
