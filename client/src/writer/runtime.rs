//! The writer's thin async runtime: one task per writer that performs the
//! [`Engine`]'s actions (sockets, master and chunkserver calls, the front's replies)
//! and feeds back what came of them as events. It decides nothing.
//!
//! ```text
//!  FileWriter ──Cmd──▶ run loop ──Event──▶ Engine ──Action──▶ perform ──▶ Event …
//!                        ▲  watch the stream (acks, its end, the idle close) │
//!                        └────────────────────────────────────────────────────┘
//! ```

use super::engine::Engine;
use super::event::{Action, Event, Packet, StreamFailure, Watch};
use super::{AckClock, BufferPool, Cmd};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::pipeline::{Incoming, PipelineStream, StreamEnd, StreamEvent};
use stampfs_proto::{FileStatus, RemoteError, ReplicaInfo};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

pub(super) struct Runtime {
    pub(super) client: Client,
    pub(super) path: String,
    pub(super) engine: Engine,
    /// The stream the engine set up (or is setting up); finished at the end.
    pub(super) stream: Option<PipelineStream>,
    pub(super) clock: Arc<AckClock>,
    /// When each packet was cut, while ack latencies are being recorded.
    pub(super) stamps: VecDeque<(u64, Instant)>,
    /// Acknowledged packet buffers go back here for the front to reuse.
    pub(super) pool: Arc<BufferPool>,
    /// The front's flush or close waiting for [`Action::FlushDone`] /
    /// [`Action::CloseDone`].
    pub(super) flush_waiter: Option<oneshot::Sender<Result<()>>>,
    pub(super) close_waiter: Option<oneshot::Sender<Result<FileStatus>>>,
}

impl Runtime {
    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let idle_close = self.client.config().stream_idle_close;
        loop {
            self.perform_all().await;
            if self.engine.is_finished() {
                break;
            }
            // Packets are queued on the stream and pushed onto the socket together
            // when no more data is waiting right now (or the window is full).
            self.engine.handle(Event::Poll {
                backlog: !rx.is_empty(),
            });
            self.perform_all().await;
            let wait = self.engine.wait();
            let watch = wait.stream.filter(|_| self.stream.is_some());
            tokio::select! {
                biased;
                event = watch_stream(&mut self.stream, watch, idle_close), if watch.is_some() => {
                    self.engine.handle(event);
                }
                cmd = rx.recv(), if wait.commands => {
                    match cmd {
                        None => break,
                        Some(Cmd::Data { offset, data }) => {
                            self.engine.handle(Event::Write { offset, data })
                        }
                        Some(Cmd::Flush { sync, offset, data, done }) => {
                            self.flush_waiter = Some(done);
                            self.engine.handle(Event::Flush { sync, offset, data });
                        }
                        Some(Cmd::Cut { offset, done }) => {
                            self.flush_waiter = Some(done);
                            self.engine.handle(Event::Cut { offset });
                        }
                        Some(Cmd::Close { keep_mtime, done }) => {
                            self.close_waiter = Some(done);
                            self.engine.handle(Event::Close { keep_mtime });
                        }
                    }
                }
                else => {
                    tracing::error!("the writer has nothing to wait for");
                    break;
                }
            }
        }
        if let Some(stream) = self.stream.take() {
            stream.finish().await;
        }
        self.client.release_lease(&self.path);
    }

    /// Performs the engine's actions, feeding each answer back, until it has none.
    async fn perform_all(&mut self) {
        while let Some(action) = self.engine.next_action() {
            if let Some(event) = self.perform(action).await {
                self.engine.handle(event);
            }
        }
    }

    async fn perform(&mut self, action: Action) -> Option<Event> {
        let config = self.client.config();
        match action {
            Action::OpenStream {
                grant,
                start,
                overwrite,
            } => {
                self.stream = None;
                let opened = PipelineStream::open(
                    &config.dialer,
                    &grant,
                    start,
                    overwrite,
                    config.request_timeout,
                    config.ack_timeout,
                )
                .await;
                Some(Event::SetupReplied(opened.map(|(stream, reply)| {
                    self.stream = Some(stream);
                    reply
                })))
            }
            Action::CheckEnd => {
                let end = self.stream.as_mut().and_then(PipelineStream::take_end);
                Some(Event::EndChecked(match end {
                    Some(Incoming::End(end, error)) => Some(StreamFailure { end, error }),
                    Some(Incoming::Ack(_)) | None => None,
                }))
            }
            Action::Send { token, packet } => {
                let sent = match self.stream.as_mut() {
                    Some(s) => send(s, token, &packet).await,
                    None => Ok(()),
                };
                Some(Event::Sent(sent.map_err(StreamFailure::from)))
            }
            Action::Resend {
                token,
                packets,
                recovery,
            } => {
                stampfs_proto::crash_point!(
                    "writer-reopen-before-resend",
                    if recovery && !packets.is_empty()
                );
                let Some(stream) = self.stream.as_mut() else {
                    return Some(Event::Resent(Ok(())));
                };
                let mut res = Ok(());
                for p in &packets {
                    res = send(stream, token, p).await;
                    if res.is_err() {
                        break;
                    }
                }
                if res.is_ok() {
                    res = stream.flush().await;
                }
                Some(Event::Resent(res.map_err(StreamFailure::from)))
            }
            Action::FlushStream => {
                let flushed = match self.stream.as_mut() {
                    Some(s) => s.flush().await,
                    None => Ok(()),
                };
                Some(Event::Flushed(flushed.map_err(StreamFailure::from)))
            }
            Action::FinishStream => {
                if let Some(stream) = self.stream.take() {
                    stream.finish().await;
                }
                None
            }
            Action::DropStream => {
                self.stream = None;
                None
            }
            Action::AskReplicaLength { member, token } => {
                let res = self
                    .client
                    .call_chunkserver(&member.addr, ReplicaInfo { token })
                    .await;
                Some(Event::ReplicaLength(res.map(|(report, _)| report.length)))
            }
            Action::AddChunk(req) => Some(Event::Granted(self.client.call(req).await)),
            Action::OpenChunk(req) => Some(Event::Granted(self.client.call(req).await)),
            Action::DropChunks(req) => Some(Event::ChunksDropped(self.client.call(req).await)),
            Action::UpdatePipeline(req) => Some(Event::Granted(self.client.call(req).await)),
            Action::CloseFile(req) => Some(Event::FileClosed(self.client.call(req).await)),
            Action::CutLastChunk(req) => {
                let res = self.client.call(req).await;
                stampfs_proto::crash_point!("writer-cut-before-setup", if res.is_ok());
                Some(Event::ChunkCut(res))
            }
            Action::Queued { seq } => {
                if let Some(t) = self.clock.start() {
                    self.stamps.push_back((seq, t));
                }
                None
            }
            Action::Acked(packet) => {
                self.record_latency(packet.seq);
                self.pool.give(packet.data);
                None
            }
            Action::Fail(e) => {
                if e.is_quota_exceeded() {
                    // The caller reports it; no log line needed to understand it.
                    tracing::info!(error = %e, "writer refused by a quota");
                } else {
                    tracing::warn!(error = %e, "writer failed");
                }
                None
            }
            Action::CloseRefused(req) => {
                match self.client.call(req).await {
                    Ok(st) => {
                        tracing::info!(path = %st.path, length = st.length, "refused by a quota: the file is closed at what fit")
                    }
                    Err(e) => {
                        tracing::warn!(path = %self.path, error = %e, "refused by a quota, and the file could not be closed; it stays open until its lease is recovered (`stampfs recover`)")
                    }
                }
                None
            }
            Action::FlushDone(res) => {
                if let Some(done) = self.flush_waiter.take() {
                    let _ = done.send(res);
                }
                None
            }
            Action::CloseDone(res) => {
                if let Some(done) = self.close_waiter.take() {
                    let _ = done.send(res);
                }
                None
            }
        }
    }

    fn record_latency(&mut self, seq: u64) {
        while self.stamps.front().is_some_and(|(s, _)| *s < seq) {
            self.stamps.pop_front();
        }
        if let Some(&(s, t)) = self.stamps.front() {
            if s == seq {
                self.stamps.pop_front();
                self.clock.record(t.elapsed());
            }
        }
    }
}

async fn send(
    stream: &mut PipelineStream,
    token: stampfs_proto::ChunkToken,
    p: &Packet,
) -> Result<()> {
    stream
        .send(token, p.seq, p.offset, p.crc, p.sync, p.data.clone())
        .await
}

/// The next ack while packets are in flight; at rest, the end of the stream or the
/// writer's idle close (`idle_close`).
async fn watch_stream(
    stream: &mut Option<PipelineStream>,
    watch: Option<Watch>,
    idle_close: Option<Duration>,
) -> Event {
    let (Some(stream), Some(watch)) = (stream.as_mut(), watch) else {
        return std::future::pending().await;
    };
    let item = match watch {
        Watch::Acks => stream.next_ack().await,
        Watch::AtRest => match stream.watch_at_rest(idle_close).await {
            StreamEvent::Incoming(item) => item,
            StreamEvent::Idle => return Event::IdleTimeout,
        },
    };
    match item {
        Some(Incoming::Ack(ack)) => Event::Ack(ack),
        Some(Incoming::End(end, error)) => Event::StreamEnded(StreamFailure { end, error }),
        // The reader went away without a word: treat it as a closed connection.
        None => Event::StreamEnded(StreamFailure {
            end: StreamEnd::Closed,
            error: Error::Remote(RemoteError::Unavailable {
                reason: "the pipeline closed the stream".into(),
            }),
        }),
    }
}
