//! The front's commands carried out step by step: a write cut into packets (crossing
//! chunk boundaries: drain, commit, `AddChunk` for a new chunk or `OpenChunk` for an
//! existing one), a flush (its data, an empty sync packet for a bare `hsync`, then a
//! drain until every member acknowledged every packet), a close (a drain, then `Close`
//! at the master), a shrink (in the last chunk, moved to first).

use super::reopen::Then;
use super::{Awaiting, Chunk, Engine};
use crate::error::{Error, Result};
use crate::writer::event::{Action, Packet};
use crate::writer::policy;
use bytes::Bytes;
use stampfs_proto::{AddChunk, Close, CutLastChunk, DropChunks, OpenChunk};

/// A packet cut for the current chunk, not yet queued on a stream.
#[derive(Debug)]
pub(super) struct Push {
    /// Chunk offset of its first byte.
    offset: u64,
    data: Bytes,
    seq: u64,
    sync: bool,
    /// The at-rest check for a stream the head closed unseen was done.
    end_checked: bool,
}

/// Bytes to cut into packets on the current chunk and the next ones.
#[derive(Debug)]
pub(super) struct Pieces {
    /// File offset of `data`'s first byte.
    at: u64,
    data: Bytes,
    /// The last packet asks every replica to sync.
    sync_last: bool,
    /// The piece being pushed.
    push: Option<Push>,
    /// Moving to another chunk: draining the one being left, then the grant.
    switch: Option<Switch>,
}

/// Where a move to another chunk is.
#[derive(Debug)]
pub(super) enum Switch {
    /// Draining the chunk being left, syncing it (an empty sync packet, acknowledged
    /// by every member) when an overwrite writer left unsynced bytes there, then
    /// asking for `Target`'s grant: an `hsync` in the next chunk covers the bytes of
    /// this one. (An append writer keeps its fast path: a replica that loses an
    /// unsynced tail is short, which the master sees, and the finalize of the full
    /// chunk, awaited before the next grant, syncs it; an overwritten replica that
    /// loses unsynced bytes looks whole.)
    Draining(Target, Option<Push>),
    /// Waiting for the grant.
    Moving,
}

/// The chunk a writer moves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// A new chunk at the end of the file (`AddChunk`).
    New,
    /// The file's existing chunk of this index (`OpenChunk`).
    Existing(u64),
}

/// Where bytes at a file offset go.
#[derive(Debug, PartialEq, Eq)]
enum Placed {
    /// In the current chunk, at this chunk offset, with this much room after it.
    Here { offset: u64, room: u64 },
    /// In another chunk.
    Move(Target),
}

/// Where an `hflush` / `hsync` is.
#[derive(Debug)]
pub(super) enum FlushStage {
    Data(Pieces),
    /// A bare `hsync`: one empty packet with the sync flag.
    SyncPacket(Option<Push>),
    Drain,
}

/// The front's command being carried out.
#[derive(Debug)]
pub(super) enum Job {
    Write(Pieces),
    Flush {
        sync: bool,
        stage: FlushStage,
    },
    /// Draining, then (`committing`) waiting for the master's `Close`.
    Close {
        committing: bool,
        /// The close leaves the modification time alone.
        keep_mtime: bool,
    },
    /// A shrink of the file to file offset `at`, in its last chunk.
    Cut {
        at: u64,
        stage: CutStage,
    },
}

/// Where a shrink is: drain every packet; below the last chunk, drop the chunks past
/// the new end (`DropChunks`, committing the chunk being written); move to the last
/// chunk when the writer is elsewhere; lower the committed length at the master
/// (`CutLastChunk`); set an append stream up at the new end (its set-up cuts every
/// member), finish it. A shrink to a chunk boundary ends with the drop.
#[derive(Debug)]
pub(super) enum CutStage {
    Drain,
    /// Syncing the chunk being left (kept, with unsynced bytes) before a drop or a
    /// move, as a move of a write does.
    Syncing(Push),
    /// Waiting for `DropChunks`' answer.
    Dropping,
    /// Waiting for the last chunk's grant.
    Moving,
    /// Waiting for `CutLastChunk`'s answer.
    Asking,
    /// The master lowered the committed length: cut the members.
    Cutting,
    /// The cutting stream's set-up is being done by a reopen.
    Reopening,
}

/// What a step of the job came to.
pub(super) enum Progress {
    /// It emitted a question, or moved on: step again once the engine is free.
    Continue,
    /// Waiting for acks.
    Wait,
    Done,
}

impl Engine {
    /// Steps the job until it asks a question, waits for acks or is done.
    pub(super) fn advance(&mut self) {
        while self.awaiting.is_none() && self.reopen.is_none() {
            let Some(mut job) = self.job.take() else {
                return;
            };
            let progress = self.step_job(&mut job);
            match progress {
                Progress::Done => {}
                Progress::Continue => self.job = Some(job),
                Progress::Wait => {
                    self.job = Some(job);
                    return;
                }
            }
        }
    }

    fn step_job(&mut self, job: &mut Job) -> Progress {
        match job {
            Job::Cut { at, stage } => self.step_cut(*at, stage),
            Job::Write(pieces) => self.step_pieces(pieces),
            Job::Flush { sync, stage } => match stage {
                FlushStage::Data(pieces) => match self.step_pieces(pieces) {
                    Progress::Done => {
                        *stage = FlushStage::Drain;
                        Progress::Continue
                    }
                    other => other,
                },
                FlushStage::SyncPacket(push) => {
                    if !*sync || self.chunk.is_none() {
                        *stage = FlushStage::Drain;
                        return Progress::Continue;
                    }
                    let at = self.chunk.as_ref().map_or(0, |c| c.sent);
                    let p = push.get_or_insert_with(|| self.cut(at, Bytes::new(), true));
                    if let Progress::Done = self.step_push(p) {
                        *stage = FlushStage::Drain;
                    }
                    Progress::Continue
                }
                FlushStage::Drain => match self.step_drain() {
                    Ok(Progress::Done) => {
                        self.output.push_back(Action::FlushDone(Ok(())));
                        Progress::Done
                    }
                    Ok(other) => other,
                    Err(e) => {
                        self.output.push_back(Action::FlushDone(Err(e)));
                        Progress::Done
                    }
                },
            },
            Job::Close {
                committing: true, ..
            } => {
                // The master answered (`FileClosed` completes the job).
                Progress::Done
            }
            Job::Close {
                committing,
                keep_mtime,
            } => match self.step_drain() {
                Ok(Progress::Done) => {
                    *committing = true;
                    let last = self.chunk.as_ref().map(Chunk::commit);
                    self.finish_stream();
                    let req = Close {
                        path: self.path.clone(),
                        client: self.client,
                        last,
                        keep_mtime: *keep_mtime,
                    };
                    self.ask(Awaiting::FileClose, Action::CloseFile(req));
                    Progress::Continue
                }
                Ok(other) => other,
                Err(e) => {
                    self.finished = true;
                    self.output.push_back(Action::CloseDone(Err(e)));
                    Progress::Done
                }
            },
        }
    }

    /// The file offset a shrink to `offset` cuts the file at; `None` when it changes
    /// nothing (the end). An append writer does not shrink.
    pub(super) fn cut_point(&self, offset: u64) -> Result<Option<u64>> {
        let end = self.known_end();
        if offset == end {
            return Ok(None);
        }
        if !self.overwrite || offset > end {
            return Err(Error::NotSupported {
                path: self.path.clone(),
                reason: format!(
                    "shrinking to {offset}: {}",
                    if self.overwrite {
                        format!("past the end ({end})")
                    } else {
                        "an append writer does not shrink".to_string()
                    }
                ),
            });
        }
        Ok(Some(offset))
    }

    /// Chunks a file cut to `at` keeps: those holding its bytes.
    fn kept_chunks(&self, at: u64) -> u64 {
        at.div_ceil(self.chunk_size.max(1))
    }

    fn step_cut(&mut self, at: u64, stage: &mut CutStage) -> Progress {
        if let Err(e) = self.check() {
            self.output.push_back(Action::FlushDone(Err(e)));
            return Progress::Done;
        }
        match stage {
            CutStage::Drain => match self.step_drain() {
                Ok(Progress::Done) => {
                    let keep = self.kept_chunks(at);
                    let last = self.known_chunks().saturating_sub(1);
                    let drop = keep < self.known_chunks();
                    if let Some(c) = self.chunk.as_ref() {
                        let i = c.grant.chunk_index;
                        if self.overwrite && c.unsynced && i < keep && (drop || i != last) {
                            let sent = c.sent;
                            *stage = CutStage::Syncing(self.cut(sent, Bytes::new(), true));
                            return Progress::Continue;
                        }
                    }
                    if drop {
                        *stage = CutStage::Dropping;
                        let previous = self.chunk.as_ref().map(Chunk::commit);
                        self.finish_stream();
                        let req = DropChunks {
                            path: self.path.clone(),
                            client: self.client,
                            previous,
                            keep,
                        };
                        self.ask(Awaiting::Drop, Action::DropChunks(req));
                        return Progress::Continue;
                    }
                    if at == keep * self.chunk_size.max(1) {
                        // A chunk boundary: the last chunk kept is full, nothing to cut.
                        self.output.push_back(Action::FlushDone(Ok(())));
                        return Progress::Done;
                    }
                    let last = self.known_chunks().saturating_sub(1);
                    let here = self.chunk.as_ref().map(|c| c.grant.chunk_index);
                    if here != Some(last) {
                        *stage = CutStage::Moving;
                        self.move_to(Target::Existing(last));
                        return Progress::Continue;
                    }
                    let Some(chunk) = self.chunk.as_ref() else {
                        return Progress::Done;
                    };
                    *stage = CutStage::Asking;
                    let req = CutLastChunk {
                        path: self.path.clone(),
                        client: self.client,
                        handle: chunk.grant.token.handle,
                        length: at.saturating_sub(chunk.grant.file_offset),
                    };
                    self.ask(Awaiting::Cut, Action::CutLastChunk(req));
                    Progress::Continue
                }
                Ok(other) => other,
                Err(e) => {
                    self.output.push_back(Action::FlushDone(Err(e)));
                    Progress::Done
                }
            },
            CutStage::Syncing(push) => {
                if let Progress::Done = self.step_push(push) {
                    *stage = CutStage::Drain;
                }
                Progress::Continue
            }
            // The grant installed the last chunk (a failure was caught above).
            CutStage::Moving => {
                *stage = CutStage::Drain;
                Progress::Continue
            }
            // `ChunkCut` moves it on (or completes the job with its error).
            CutStage::Asking => Progress::Done,
            // `ChunksDropped` moves it on (or completes the job with its error).
            CutStage::Dropping => Progress::Done,
            CutStage::Cutting => {
                let Some(chunk) = self.chunk.as_mut() else {
                    return Progress::Done;
                };
                let to = at.saturating_sub(chunk.grant.file_offset);
                tracing::info!(chunk = %chunk.grant.token.handle, from = chunk.sent, to, "cutting the chunk's replicas");
                chunk.sent = to;
                chunk.acked = to;
                chunk.cut = Some(to);
                self.length = at;
                *stage = CutStage::Reopening;
                self.finish_stream();
                self.start_reopen(Vec::new(), Then::Return);
                Progress::Continue
            }
            CutStage::Reopening => {
                if let Some(chunk) = self.chunk.as_mut() {
                    chunk.cut = None;
                }
                // The next write opens an overwrite stream again.
                self.finish_stream();
                self.output.push_back(Action::FlushDone(Ok(())));
                Progress::Done
            }
        }
    }

    /// Leaves the current chunk (drained: its commit is every byte sent) for `to`.
    fn move_to(&mut self, to: Target) {
        let previous = self.chunk.as_ref().map(Chunk::commit);
        self.finish_stream();
        let (path, client) = (self.path.clone(), self.client);
        let action = match to {
            Target::New => Action::AddChunk(AddChunk {
                path,
                client,
                previous,
            }),
            Target::Existing(index) => {
                tracing::debug!(index, "moving to an existing chunk");
                Action::OpenChunk(OpenChunk {
                    path,
                    client,
                    previous,
                    index,
                })
            }
        };
        self.ask(Awaiting::NewChunk, action);
    }

    /// The master's answer to `DropChunks`: the chunks past the new end are gone and
    /// the writer holds no chunk; on to the cut of the new last chunk (none at a chunk
    /// boundary). An error fails the shrink (the writer too when it was fenced;
    /// otherwise nothing was dropped and it goes on).
    pub(super) fn on_chunks_dropped(&mut self, res: Result<()>) {
        let Some(Job::Cut { at, stage }) = self.job.as_mut() else {
            return;
        };
        let at = *at;
        match res {
            Ok(()) => {
                let keep = at.div_ceil(self.chunk_size.max(1));
                tracing::info!(keep, at, "dropped the chunks past the new end");
                self.chunk = None;
                self.length = keep * self.chunk_size.max(1);
                self.chunks = keep;
                *stage = CutStage::Drain;
            }
            Err(e) => {
                let e = self.master_error(e);
                // Fenced, or the drop may have been made (a broken connection, a
                // master that lost the lead with it under way): the grant this writer
                // holds may name a chunk that is gone, so it writes no more.
                if e.is_fenced() || policy::outcome_unknown(&e) {
                    self.fail(e.duplicate(&self.path));
                }
                // Refused: nothing was dropped. The stream of the chunk being written
                // was finished; its grant stands, and the next write reopens a stream
                // with it.
                self.job = None;
                self.output.push_back(Action::FlushDone(Err(e)));
            }
        }
    }

    /// The master's answer to `CutLastChunk`: on to the cut, or the shrink fails (the
    /// writer too when it was fenced; otherwise nothing was cut, and it goes on).
    pub(super) fn on_chunk_cut(&mut self, res: Result<()>) {
        let Some(Job::Cut { stage, .. }) = self.job.as_mut() else {
            return;
        };
        match res {
            Ok(()) => *stage = CutStage::Cutting,
            Err(e) => {
                let e = self.master_error(e);
                if e.is_fenced() {
                    self.fail(e.duplicate(&self.path));
                }
                self.job = None;
                self.output.push_back(Action::FlushDone(Err(e)));
            }
        }
    }

    /// Cuts `data` into packets on the current chunk and the next ones.
    fn step_pieces(&mut self, p: &mut Pieces) -> Progress {
        if self.failed.is_some() {
            return Progress::Done;
        }
        if let Some(push) = p.push.as_mut() {
            if let Progress::Done = self.step_push(push) {
                p.push = None;
            }
            return Progress::Continue;
        }
        if p.data.is_empty() {
            return Progress::Done;
        }
        match p.switch {
            Some(Switch::Moving) => {
                // `Granted` installed the chunk moved to (or failed the writer).
                p.switch = None;
                return Progress::Continue;
            }
            Some(Switch::Draining(to, ref mut sync)) => {
                if let Some(push) = sync.as_mut() {
                    if let Progress::Done = self.step_push(push) {
                        *sync = None;
                    }
                    return Progress::Continue;
                }
                return match self.step_drain() {
                    Ok(Progress::Done)
                        if self.overwrite && self.chunk.as_ref().is_some_and(|c| c.unsynced) =>
                    {
                        let at = self.chunk.as_ref().map_or(0, |c| c.sent);
                        *sync = Some(self.cut(at, Bytes::new(), true));
                        Progress::Continue
                    }
                    Ok(Progress::Done) => {
                        p.switch = Some(Switch::Moving);
                        self.move_to(to);
                        Progress::Continue
                    }
                    Ok(other) => other,
                    Err(_) => Progress::Done,
                };
            }
            None => {}
        }
        let (offset, room) = match self.place(p.at) {
            Ok(Placed::Here { offset, room }) => (offset, room),
            Ok(Placed::Move(to)) => {
                p.switch = Some(Switch::Draining(to, None));
                return Progress::Continue;
            }
            Err(e) => {
                self.raise(e, Then::Fail);
                return Progress::Done;
            }
        };
        let n = (p.data.len() as u64).min(room) as usize;
        let piece = p.data.split_to(n);
        p.at += n as u64;
        let sync = p.sync_last && p.data.is_empty();
        p.push = Some(self.cut(offset, piece, sync));
        Progress::Continue
    }

    /// Where bytes at file offset `at` go: the current chunk (their chunk offset and
    /// the room left after it), or another chunk. An append writer's bytes always
    /// start at the end of what was sent, and its next chunk is a new one; an
    /// overwrite writer's go anywhere up to the file's end (the front fills a gap
    /// first), into whichever chunk holds them ([`Engine::target`]).
    fn place(&self, at: u64) -> Result<Placed> {
        let Some(chunk) = self.chunk.as_ref() else {
            if !self.overwrite || self.chunk_size == 0 {
                return Ok(Placed::Move(Target::New));
            }
            return self.target(at).map(Placed::Move);
        };
        let g = &chunk.grant;
        let end = g.file_offset + chunk.sent;
        let fits = if self.overwrite {
            at >= g.file_offset && at <= end
        } else {
            at == end
        };
        if fits {
            let offset = at - g.file_offset;
            let room = g.chunk_size.saturating_sub(offset);
            if room > 0 {
                return Ok(Placed::Here { offset, room });
            }
            if !self.overwrite {
                return Ok(Placed::Move(Target::New));
            }
        } else if !self.overwrite {
            return Err(Error::NotSupported {
                path: self.path.clone(),
                reason: format!(
                    "a write at offset {at}: this writer writes at the end only ({end})"
                ),
            });
        }
        self.target(at).map(Placed::Move)
    }

    /// The chunk that holds file offset `at`, outside the current chunk (an overwrite
    /// writer): the existing chunk `at / chunk size` (every chunk before the last is
    /// full), or a new one for the end of a file whose last chunk is full.
    fn target(&self, at: u64) -> Result<Target> {
        let refused = |reason: String| Error::NotSupported {
            path: self.path.clone(),
            reason: format!("a write at offset {at}: {reason}"),
        };
        let cs = self.chunk_size.max(1);
        let (chunks, end) = (self.known_chunks(), self.known_end());
        let index = at / cs;
        if at > end {
            // The front writes zeros into a gap first: the engine never sees one.
            return Err(refused(format!("past the file's end ({end})")));
        }
        let here = self.chunk.as_ref().map(|c| &c.grant);
        if let Some(g) = here.filter(|g| g.chunk_index == index) {
            // The chunk that should hold `at` is the current one, and yet it does not:
            // its chunks before the last are not all full.
            return Err(refused(format!(
                "the file's chunk {index} starts at {}, not at {} (a chunk before it is not full)",
                g.file_offset,
                index * cs
            )));
        }
        if index < chunks {
            return Ok(Target::Existing(index));
        }
        if index == chunks && at == end && at == chunks * cs {
            return Ok(Target::New);
        }
        Err(refused(format!("past the file's end ({end})")))
    }

    /// Numbers a new packet at chunk offset `offset` (its ack latency is measured
    /// from here).
    fn cut(&mut self, offset: u64, data: Bytes, sync: bool) -> Push {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.output.push_back(Action::Queued { seq });
        Push {
            offset,
            data,
            seq,
            sync,
            end_checked: false,
        }
    }

    /// Queues one packet on the current chunk's stream, opening one if needed.
    fn step_push(&mut self, p: &mut Push) -> Progress {
        if self.failed.is_some() {
            return Progress::Done;
        }
        let Some(chunk) = self.chunk.as_mut() else {
            return Progress::Done;
        };
        let at_rest = chunk.unacked.is_empty();
        if at_rest && chunk.stream.is_some() && !p.end_checked {
            // The head may have closed the stream while nothing was in flight (its
            // idle timeout): settle that before sending anything on it.
            p.end_checked = true;
            self.ask(Awaiting::EndCheck, Action::CheckEnd);
            return Progress::Continue;
        }
        let packet = Packet {
            seq: p.seq,
            offset: p.offset,
            crc: crc32fast::hash(&p.data),
            sync: p.sync,
            data: std::mem::take(&mut p.data),
        };
        chunk.keep(packet.clone());
        if chunk.stream.is_none() {
            // Opening the stream sends every unacked packet, this one included.
            self.start_reopen(Vec::new(), Then::Return);
            return Progress::Done;
        }
        if at_rest {
            chunk.quiet_burst = true;
        }
        let token = chunk.grant.token;
        self.ask(Awaiting::Send, Action::Send { token, packet });
        Progress::Done
    }

    /// Waits until every packet sent so far is acknowledged; `Err` (a copy of the
    /// writer's failure) once it failed.
    fn step_drain(&mut self) -> Result<Progress> {
        self.check()?;
        let Some(chunk) = self.chunk.as_ref() else {
            return Ok(Progress::Done);
        };
        if chunk.unacked.is_empty() {
            self.drain_flushed = false;
            return Ok(Progress::Done);
        }
        if chunk.stream.is_none() {
            self.start_reopen(Vec::new(), Then::Return);
            return Ok(Progress::Continue);
        }
        if !self.drain_flushed {
            self.drain_flushed = true;
            self.ask(Awaiting::Flush, Action::FlushStream);
            return Ok(Progress::Continue);
        }
        Ok(Progress::Wait)
    }
}

impl Pieces {
    /// `data` to write at file offset `at`.
    pub(super) fn new(at: u64, data: Bytes, sync_last: bool) -> Self {
        Self {
            at,
            data,
            sync_last,
            push: None,
            switch: None,
        }
    }
}
