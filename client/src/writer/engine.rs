//! The writer's decisions as a pure state machine, in the style of openraft's `Engine`:
//! [`Engine::handle`] takes an [`Event`] and queues [`Action`]s; the runtime
//! ([`super::runtime`]) performs them and feeds back what came of them. No I/O, no
//! tokio, no clock: the ack and idle timers are the runtime's and arrive as events.
//!
//! The engine owns the per-chunk bookkeeping ([`Chunk`]: the grant, the packets sent
//! and not yet acknowledged, the acknowledged and sent offsets, `quiet_burst`) and at
//! most one piece of work at a time:
//!
//! - a **job**, the front's command being carried out: a write (cut into packets,
//!   crossing chunk boundaries: drain, commit, `AddChunk`), a flush (the data, an empty
//!   sync packet for a bare `hsync`, then a drain until every packet is acknowledged by
//!   every member), or a close (a drain, then `Close` at the master);
//! - a **reopen**, the one procedure behind the first open of a chunk's stream, the
//!   reopen after an idle close and pipeline recovery: exclude the failed members
//!   (`UpdatePipeline` with the survivors and the acknowledged length), ask every
//!   member its replica length when packets are outstanding and start at
//!   [`resume_offset`], set the stream up, resend what is unacknowledged. At most
//!   [`MAX_RECOVERIES`] attempts per failure. `StaleToken` anywhere (set-up reply, ack,
//!   `ReplicaInfo`) fails the writer as fenced, and nothing is tried again.
//!
//! A stream's end is judged in one place ([`Engine::stream_ended`], by
//! [`after_stream_end`]), whether an ack reader, a send, a flush or the at-rest check
//! found it.
//!
//! **Writes at any offset.** Every write carries its file offset; packets carry their
//! chunk offset and acks are matched by sequence number, not offset. An *overwrite*
//! engine (a writer opened for writes anywhere) opens its streams with
//! `OverwriteSetup`: a piece may start anywhere in the current chunk, below what was
//! sent (in place) or at its end. `sent` and `acked` are then the furthest chunk
//! offsets sent and acknowledged (what is committed as the chunk's length), and the
//! window counts the bytes of the unacknowledged packets. A reopen of an overwrite
//! stream asks no member its length (its set-up cuts nothing, so nothing needs
//! judging): it sets up at the first unacknowledged packet's offset (or the
//! acknowledged length) and resends every unacknowledged packet in order, which
//! leaves every member with the same bytes whatever part of them it had applied
//! (DESIGN.md, "Writes at any offset"). A piece before the current chunk fails the
//! write with `NotSupported` (the front refuses it first); a grant of an existing
//! chunk, next to [`Action::AddChunk`], is the next step.

mod job;
mod reopen;

use super::event::{Action, Event, Packet, StreamFailure, Wait, Watch};
use super::policy::{after_stream_end, excluded, EndAction};
use crate::error::{Error, Result};
use job::{CutStage, FlushStage, Job, Pieces};
use reopen::{Reopen, Then};
use stampfs_proto::{
    ChunkCommit, ChunkVersion, ChunkserverId, ClientId, FileStatus, RemoteError, WriteGrant,
};
use std::collections::VecDeque;

/// The chunk currently being written.
#[derive(Debug)]
struct Chunk {
    grant: WriteGrant,
    /// The head of the current stream, while one is set up and resent to.
    stream: Option<ChunkserverId>,
    /// Chunk offset just past the furthest byte sent (of an append stream: the next
    /// byte to send).
    sent: u64,
    /// Chunk offset up to which every replica has acknowledged (of an overwrite
    /// stream: the furthest byte every replica acknowledged).
    acked: u64,
    unacked: VecDeque<Packet>,
    /// Bytes of the packets in `unacked` (what the window bounds).
    unacked_bytes: u64,
    /// A shrink in progress: the next stream is an append stream set up at this chunk
    /// offset (its set-up cuts every member there).
    cut: Option<u64>,
    /// Every unacked packet went onto the current stream after it had been at rest
    /// (nothing in flight), and no ack has come back since: if the stream turns out
    /// closed, the head may have closed it for idleness before they were sent.
    quiet_burst: bool,
    /// A packet without the sync flag was queued after the last one with it: the
    /// replicas may hold bytes of this chunk they have not fsynced. A move to another
    /// chunk syncs first, so that an `hsync` there covers this one too.
    unsynced: bool,
}

impl Chunk {
    fn new(grant: WriteGrant, offset: u64) -> Self {
        Self {
            grant,
            stream: None,
            sent: offset,
            acked: offset,
            unacked: VecDeque::new(),
            unacked_bytes: 0,
            cut: None,
            quiet_burst: false,
            unsynced: false,
        }
    }

    fn in_flight(&self) -> u64 {
        self.unacked_bytes
    }

    /// Keeps `packet` until every replica acknowledged it.
    fn keep(&mut self, packet: Packet) {
        self.unsynced = !packet.sync;
        self.sent = self.sent.max(packet.end());
        self.unacked_bytes += packet.data.len() as u64;
        self.unacked.push_back(packet);
    }

    fn unacked_end(&self) -> u64 {
        self.unacked.back().map_or(self.acked, Packet::end)
    }

    fn commit(&self) -> ChunkCommit {
        ChunkCommit {
            handle: self.grant.token.handle,
            length: self.acked,
        }
    }
}

/// What the engine waits for: the answer to the last action it emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Awaiting {
    EndCheck,
    Send,
    Flush,
    NewChunk,
    /// The reopen's own questions (its step says which).
    Reopen,
    FileClose,
    /// `CutLastChunk` at the master.
    Cut,
    /// `DropChunks` at the master.
    Drop,
}

/// The writer's state machine (see the module docs).
#[derive(Debug)]
pub(crate) struct Engine {
    path: String,
    client: ClientId,
    /// Bytes in flight before the front's commands wait.
    window: u64,
    /// Streams are overwrite streams (see the module docs).
    overwrite: bool,
    /// The file as known when the writer left its last chunk (or opened): its length
    /// and its number of chunks. With the current chunk's end (see
    /// [`Engine::known_end`]) this says where a write outside the current chunk goes.
    length: u64,
    chunks: u64,
    /// The file's chunk size (0: unknown until a grant tells).
    chunk_size: u64,
    chunk: Option<Chunk>,
    next_seq: u64,
    failed: Option<Error>,
    job: Option<Job>,
    reopen: Option<Reopen>,
    awaiting: Option<Awaiting>,
    /// The drain in progress pushed the socket since its last ack.
    drain_flushed: bool,
    /// Closed (or the close failed): the runtime stops.
    finished: bool,
    output: VecDeque<Action>,
}

impl Engine {
    /// A writer of `path`; `last`: the grant of a partial last chunk (an append);
    /// `overwrite`: writes may go below the end (overwrite streams).
    pub(crate) fn new(
        path: String,
        client: ClientId,
        window: u64,
        last: Option<WriteGrant>,
        overwrite: bool,
    ) -> Self {
        let (length, chunks, chunk_size) = last.as_ref().map_or((0, 0, 0), |g| {
            (
                g.file_offset + g.chunk_offset,
                g.chunk_index + 1,
                g.chunk_size,
            )
        });
        Self {
            path,
            client,
            window,
            overwrite,
            length,
            chunks,
            chunk_size,
            chunk: last.map(|g| {
                let offset = g.chunk_offset;
                Chunk::new(g, offset)
            }),
            next_seq: 0,
            failed: None,
            job: None,
            reopen: None,
            awaiting: None,
            drain_flushed: false,
            finished: false,
            output: VecDeque::new(),
        }
    }

    /// The file the writer opened: its committed `length` and `chunk_size` (every
    /// chunk before the last is full).
    pub(crate) fn with_file(mut self, length: u64, chunk_size: u64) -> Self {
        if chunk_size > 0 {
            self.chunk_size = chunk_size;
            self.length = self.length.max(length);
            self.chunks = self.chunks.max(length.div_ceil(chunk_size));
        }
        self
    }

    /// The file's end as far as this writer knows: what it was when the writer last
    /// left its last chunk, or the end of what was sent in it.
    pub(super) fn known_end(&self) -> u64 {
        let current = self
            .chunk
            .as_ref()
            .map_or(0, |c| c.grant.file_offset + c.sent);
        self.length.max(current)
    }

    /// How many chunks the file has as far as this writer knows.
    pub(super) fn known_chunks(&self) -> u64 {
        let current = self.chunk.as_ref().map_or(0, |c| c.grant.chunk_index + 1);
        self.chunks.max(current)
    }

    /// Installs the grant of the chunk the writer moves to (a new one or an existing
    /// one), remembering the file's end and chunk count first.
    pub(super) fn install(&mut self, grant: WriteGrant) {
        self.length = self.known_end();
        self.chunks = self.known_chunks().max(grant.chunk_index + 1);
        if grant.chunk_size > 0 {
            self.chunk_size = grant.chunk_size;
        }
        let offset = grant.chunk_offset;
        self.chunk = Some(Chunk::new(grant, offset));
    }

    /// The next action to perform.
    pub(crate) fn next_action(&mut self) -> Option<Action> {
        self.output.pop_front()
    }

    /// The writer closed (or its close failed): nothing more will happen.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// What the runtime waits for now (with no action left to perform).
    pub(crate) fn wait(&self) -> Wait {
        let stream = self.chunk.as_ref().filter(|c| c.stream.is_some());
        if self.finished || self.awaiting.is_some() || self.reopen.is_some() {
            return Wait {
                commands: false,
                stream: None,
            };
        }
        if self.job.is_some() {
            // Only a drain waits with a job in progress, and only for acks.
            return Wait {
                commands: false,
                stream: stream.map(|_| Watch::Acks),
            };
        }
        let in_flight = self.chunk.as_ref().map_or(0, Chunk::in_flight);
        let healthy = self.failed.is_none();
        Wait {
            commands: !healthy || in_flight < self.window,
            stream: stream.filter(|_| healthy).map(|c| {
                if c.unacked.is_empty() {
                    Watch::AtRest
                } else {
                    Watch::Acks
                }
            }),
        }
    }

    /// Takes one event and queues what follows from it.
    pub(crate) fn handle(&mut self, event: Event) {
        match event {
            Event::Write { offset, data } => {
                if self.failed.is_none() && !data.is_empty() {
                    self.job = Some(Job::Write(Pieces::new(offset, data, false)));
                }
            }
            Event::Flush { sync, offset, data } => match self.check() {
                Err(e) => self.output.push_back(Action::FlushDone(Err(e))),
                Ok(()) => {
                    let stage = if data.is_empty() {
                        FlushStage::SyncPacket(None)
                    } else {
                        FlushStage::Data(Pieces::new(offset, data, sync))
                    };
                    self.job = Some(Job::Flush { sync, stage });
                }
            },
            Event::Cut { offset } => match self.check().and_then(|()| self.cut_point(offset)) {
                Err(e) => self.output.push_back(Action::FlushDone(Err(e))),
                Ok(None) => self.output.push_back(Action::FlushDone(Ok(()))),
                Ok(Some(at)) => {
                    self.job = Some(Job::Cut {
                        at,
                        stage: CutStage::Drain,
                    })
                }
            },
            Event::ChunkCut(res) => {
                self.answered(Awaiting::Cut);
                self.on_chunk_cut(res);
            }
            Event::ChunksDropped(res) => {
                self.answered(Awaiting::Drop);
                self.on_chunks_dropped(res);
            }
            Event::Close { keep_mtime } => match self.check() {
                Err(e) => self.close_done(Err(e)),
                Ok(()) => {
                    self.job = Some(Job::Close {
                        committing: false,
                        keep_mtime,
                    })
                }
            },
            Event::Poll { backlog } => self.poll(backlog),
            Event::Ack(ack) => {
                self.drain_flushed = false;
                self.on_ack(ack);
            }
            Event::StreamEnded(f) => {
                self.drain_flushed = false;
                self.stream_ended(f, Then::Fail);
            }
            Event::IdleTimeout => self.close_idle_stream(),
            Event::EndChecked(end) => {
                self.answered(Awaiting::EndCheck);
                if let Some(f) = end {
                    self.stream_ended(f, Then::Fail);
                }
            }
            Event::Sent(res) | Event::Flushed(res) => {
                let was = self.awaiting.take();
                debug_assert!(matches!(was, Some(Awaiting::Send | Awaiting::Flush)));
                if let Err(f) = res {
                    tracing::warn!(error = %f.error, "sending to the pipeline failed");
                    self.stream_ended(f, Then::Return);
                }
            }
            Event::Granted(res) if self.awaiting == Some(Awaiting::NewChunk) => {
                self.awaiting = None;
                match res {
                    Ok(grant) => {
                        tracing::debug!(chunk = %grant.token.handle, version = %grant.token.version, index = grant.chunk_index, "writing in a new chunk or another one");
                        self.install(grant);
                    }
                    Err(e) => {
                        let e = self.master_error(e);
                        if e.is_quota_exceeded() {
                            // Closed before the caller hears of the refusal (a CLI
                            // exits on it).
                            self.close_refused();
                        }
                        self.raise(e, Then::Return);
                    }
                }
            }
            Event::Granted(res) => {
                self.answered(Awaiting::Reopen);
                self.on_granted(res);
            }
            Event::ReplicaLength(res) => {
                self.answered(Awaiting::Reopen);
                self.on_replica_length(res);
            }
            Event::SetupReplied(res) => {
                self.answered(Awaiting::Reopen);
                self.on_setup(res);
            }
            Event::Resent(res) => {
                self.answered(Awaiting::Reopen);
                self.on_resent(res.is_ok());
            }
            Event::FileClosed(res) => {
                self.answered(Awaiting::FileClose);
                let res = res.map_err(|e| {
                    let e = self.master_error(e);
                    self.fail(e.duplicate(&self.path));
                    e
                });
                self.close_done(res);
            }
        }
        self.advance();
    }

    fn answered(&mut self, what: Awaiting) {
        let was = self.awaiting.take();
        debug_assert_eq!(was, Some(what), "an answer nobody asked for");
    }

    fn ask(&mut self, what: Awaiting, action: Action) {
        debug_assert!(self.awaiting.is_none(), "one question at a time");
        self.awaiting = Some(what);
        self.output.push_back(action);
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.duplicate(&self.path)),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: Error) {
        if self.failed.is_none() {
            self.output.push_back(Action::Fail(e.duplicate(&self.path)));
            self.failed = Some(e);
        }
    }

    /// A failure of a step: the final drain of a flush or close hands it to the
    /// waiter as it is (the writer keeps a copy); anything else fails the writer, and
    /// the job sees that at its next step.
    fn raise(&mut self, e: Error, then: Then) {
        let final_drain = matches!(
            self.job,
            Some(Job::Flush {
                stage: FlushStage::Drain,
                ..
            }) | Some(Job::Close {
                committing: false,
                ..
            })
        );
        if then == Then::Return && final_drain {
            self.fail(e.duplicate(&self.path));
            self.drain_flushed = false;
            match self.job.take() {
                Some(Job::Close { .. }) => self.close_done(Err(e)),
                _ => self.output.push_back(Action::FlushDone(Err(e))),
            }
        } else {
            self.fail(e);
        }
    }

    /// A quota refused the next chunk (asked only once everything sent was
    /// acknowledged, with the chunk written in complete): the file is closed at what
    /// fit, as a program writing through MooseFS keeps the bytes before `EDQUOT`,
    /// instead of staying open, its chunks counted whole, until its lease expires.
    fn close_refused(&mut self) {
        let last = self.chunk.as_ref().map(Chunk::commit);
        self.finish_stream();
        self.output
            .push_back(Action::CloseRefused(stampfs_proto::Close {
                path: self.path.clone(),
                client: self.client,
                last,
                keep_mtime: false,
            }));
    }

    fn close_done(&mut self, res: Result<FileStatus>) {
        self.job = None;
        self.finished = true;
        self.output.push_back(Action::CloseDone(res));
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

    fn drop_stream(&mut self) {
        if let Some(c) = self.chunk.as_mut() {
            if c.stream.take().is_some() {
                self.output.push_back(Action::DropStream);
            }
        }
    }

    fn finish_stream(&mut self) {
        if let Some(c) = self.chunk.as_mut() {
            if c.stream.take().is_some() {
                self.output.push_back(Action::FinishStream);
            }
        }
    }

    // -------------------------------------------------------------------- the stream

    /// Between commands: pushes queued packets onto the socket when no more data is
    /// waiting right now (or the window is full).
    fn poll(&mut self, backlog: bool) {
        if self.job.is_some() || self.awaiting.is_some() || self.reopen.is_some() {
            return;
        }
        if self.failed.is_some() || self.finished {
            return;
        }
        let Some(chunk) = self.chunk.as_ref() else {
            return;
        };
        if chunk.stream.is_some() && (!backlog || chunk.in_flight() >= self.window) {
            self.ask(Awaiting::Flush, Action::FlushStream);
        }
    }

    /// Closes the current stream after the writer's idle close with nothing in flight,
    /// before the head's idle timeout does; the next packet opens a new one with the
    /// same token.
    fn close_idle_stream(&mut self) {
        let Some(chunk) = self.chunk.as_ref() else {
            return;
        };
        if !chunk.unacked.is_empty() {
            return;
        }
        if let Some(head) = chunk.stream {
            tracing::debug!(%head, "closing the idle pipeline stream");
            self.finish_stream();
        }
    }

    /// The one judgement of a stream's end ([`after_stream_end`]), wherever it was
    /// found: a closed stream with nothing in flight (or only a quiet burst) is
    /// reopened with the same token, the next packet's or at once; anything else is a
    /// pipeline recovery without the head.
    fn stream_ended(&mut self, f: StreamFailure, then: Then) {
        let Some(chunk) = self.chunk.as_ref() else {
            return;
        };
        let head = chunk.stream;
        let outstanding = chunk.unacked.len();
        let action = after_stream_end(f.end, outstanding > 0, chunk.quiet_burst);
        match action {
            EndAction::Reopen => tracing::info!(
                head = ?head,
                outstanding,
                reason = %f.error,
                "pipeline head closed the stream while it was idle; reopening it with the same token"
            ),
            EndAction::ExcludeHead => {
                tracing::warn!(error = %f.error, outstanding, "pipeline stream broke")
            }
        }
        self.drop_stream();
        let bad = excluded(action, head);
        // At rest, the next packet opens the new stream.
        if !bad.is_empty() || outstanding > 0 {
            self.start_reopen(bad, then);
        }
    }

    /// Matches an ack to the oldest unacked packet.
    fn on_ack(&mut self, ack: stampfs_proto::Ack) {
        let Some(chunk) = self.chunk.as_mut() else {
            return;
        };
        let head = chunk.stream;
        let Some(front) = chunk.unacked.front() else {
            return;
        };
        if ack.seq != front.seq {
            tracing::warn!(got = ack.seq, want = front.seq, "ack out of order");
            self.drop_stream();
            self.start_reopen(head.into_iter().collect(), Then::Fail);
            return;
        }
        let mut bad = Vec::new();
        for r in &ack.replicas {
            match &r.result {
                Ok(_) => {}
                Err(RemoteError::StaleToken { current, .. }) => {
                    let e = self.fenced(Some(*current));
                    self.fail(e);
                    return;
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
            self.drop_stream();
            self.start_reopen(bad, Then::Fail);
            return;
        }
        if let Some(done) = chunk.unacked.pop_front() {
            chunk.quiet_burst = false;
            chunk.acked = chunk.acked.max(done.end());
            chunk.unacked_bytes -= done.data.len() as u64;
            self.output.push_back(Action::Acked(done));
        }
    }
}

#[cfg(test)]
impl Engine {
    /// The acknowledged and sent offsets of the current chunk.
    pub(crate) fn offsets(&self) -> Option<(u64, u64)> {
        self.chunk.as_ref().map(|c| (c.acked, c.sent))
    }

    /// File offset of the end of what was sent (0 before the first chunk).
    pub(crate) fn file_end(&self) -> u64 {
        self.chunk
            .as_ref()
            .map_or(0, |c| c.grant.file_offset + c.sent)
    }

    /// The current chunk's grant.
    pub(crate) fn grant(&self) -> Option<&WriteGrant> {
        self.chunk.as_ref().map(|c| &c.grant)
    }

    pub(crate) fn quiet_burst(&self) -> bool {
        self.chunk.as_ref().is_some_and(|c| c.quiet_burst)
    }

    pub(crate) fn failure(&self) -> Option<&Error> {
        self.failed.as_ref()
    }
}
