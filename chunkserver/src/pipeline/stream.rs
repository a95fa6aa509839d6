//! One open stream: its five parts (read upstream, write locally, forward, read
//! downstream acks, ack upstream), joined in one task.

use super::ack::{compose_ack, DownResult};
use super::checks::check_packet;
use super::downstream::{forward, read_downstream, ForwardJob};
use super::idle::{idle_check, Activity, Idleness};
use super::{WriteMode, MAX_BATCH, QUEUE};
use crate::server::Shared;
use crate::stall::GuardedWriteHalf;
use crate::store::PacketWrite;
use bytes::Bytes;
use stampfs_proto::net::ConnRead;
use stampfs_proto::{
    ChunkHandle, ChunkToken, ChunkVersion, ChunkserverId, Frame, FrameReader, FrameSink,
    FrameWriter, Packet, RemoteError, ReplicaAck,
};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One packet waiting to be acknowledged.
struct Pending {
    seq: u64,
    /// When the packet was read (its ack's latency is measured from here).
    received: std::time::Instant,
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

pub(super) struct Stream {
    pub(super) shared: Arc<Shared>,
    pub(super) handle: ChunkHandle,
    /// Append or overwrite: how packets are checked and written.
    pub(super) mode: WriteMode,
    pub(super) own: ChunkserverId,
    /// The replicas behind this one, as the downstream accepted them at set-up.
    pub(super) down_ids: Vec<ChunkserverId>,
    /// The upstream (the writer or the previous chunkserver).
    pub(super) peer: SocketAddr,
    /// Last frame received or ack sent, for the idle timeout.
    pub(super) activity: Activity,
    /// Ends the stream: cancelled by server shutdown, or after a local failure was acked.
    pub(super) stop: CancellationToken,
}

impl Stream {
    pub(super) async fn run(
        self,
        token: ChunkToken,
        offset: u64,
        reader: FrameReader<ConnRead>,
        writer: FrameWriter<GuardedWriteHalf>,
        link: Option<(FrameReader<ConnRead>, FrameSink<GuardedWriteHalf>)>,
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
        mut reader: FrameReader<ConnRead>,
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
                self.mode,
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
                            received: std::time::Instant::now(),
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
                received: std::time::Instant::now(),
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
                let outcome = self
                    .shared
                    .store
                    .write_batch(self.handle, self.mode, packets)
                    .await;
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
            crate::counters::ack_sent(p.received.elapsed(), failed);
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
