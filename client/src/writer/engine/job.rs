//! The front's commands carried out step by step: a write cut into packets (crossing
//! chunk boundaries: drain, commit, `AddChunk`), a flush (its data, an empty sync
//! packet for a bare `hsync`, then a drain until every member acknowledged every
//! packet), a close (a drain, then `Close` at the master).

use super::reopen::Then;
use super::{Awaiting, Chunk, Engine};
use crate::error::{Error, Result};
use crate::writer::event::{Action, Packet};
use bytes::Bytes;
use stampfs_proto::{AddChunk, Close, CutLastChunk};

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
    /// Crossing a chunk boundary: draining the full chunk, then its `AddChunk`.
    switch: Option<Switch>,
}

/// Where a chunk switch is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Switch {
    Draining,
    Adding,
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
    },
    /// A shrink of the current chunk to chunk offset `at`.
    Cut {
        at: u64,
        stage: CutStage,
    },
}

/// Where a shrink is: drain every packet, lower the committed length at the master
/// (`CutLastChunk`), set an append stream up at the new end (its set-up cuts every
/// member), finish it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum CutStage {
    Drain,
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
            Job::Close { committing: true } => {
                // The master answered (`FileClosed` completes the job).
                Progress::Done
            }
            Job::Close { committing } => match self.step_drain() {
                Ok(Progress::Done) => {
                    *committing = true;
                    let last = self.chunk.as_ref().map(Chunk::commit);
                    self.finish_stream();
                    let req = Close {
                        path: self.path.clone(),
                        client: self.client,
                        last,
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

    /// The chunk offset a shrink to file offset `offset` cuts the current chunk at;
    /// `None` when it changes nothing (the end). Anything outside the current chunk's
    /// bytes is refused.
    pub(super) fn cut_point(&self, offset: u64) -> Result<Option<u64>> {
        let refused = |reason: String| Error::NotSupported {
            path: self.path.clone(),
            reason,
        };
        let Some(chunk) = self.chunk.as_ref() else {
            return Err(refused(format!(
                "shrinking to {offset}: no chunk is being written"
            )));
        };
        let g = &chunk.grant;
        let end = g.file_offset + chunk.sent;
        if offset == end {
            return Ok(None);
        }
        if !self.overwrite || offset < g.file_offset || offset > end {
            return Err(refused(format!(
                "shrinking to {offset}: only within the chunk being written ({}..{end})",
                g.file_offset
            )));
        }
        Ok(Some(offset - g.file_offset))
    }

    fn step_cut(&mut self, at: u64, stage: &mut CutStage) -> Progress {
        if let Err(e) = self.check() {
            self.output.push_back(Action::FlushDone(Err(e)));
            return Progress::Done;
        }
        match stage {
            CutStage::Drain => match self.step_drain() {
                Ok(Progress::Done) => {
                    let Some(chunk) = self.chunk.as_ref() else {
                        return Progress::Done;
                    };
                    *stage = CutStage::Asking;
                    let req = CutLastChunk {
                        path: self.path.clone(),
                        client: self.client,
                        handle: chunk.grant.token.handle,
                        length: at,
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
            // `ChunkCut` moves it on (or completes the job with its error).
            CutStage::Asking => Progress::Done,
            CutStage::Cutting => {
                let Some(chunk) = self.chunk.as_mut() else {
                    return Progress::Done;
                };
                tracing::info!(chunk = %chunk.grant.token.handle, from = chunk.sent, to = at, "cutting the chunk's replicas");
                chunk.sent = at;
                chunk.acked = at;
                chunk.cut = Some(at);
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
                    self.fail(e.duplicate());
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
            Some(Switch::Adding) => {
                // `Granted` installed the new chunk (or failed the writer).
                p.switch = None;
                return Progress::Continue;
            }
            Some(Switch::Draining) => {
                return match self.step_drain() {
                    Ok(Progress::Done) => {
                        p.switch = Some(Switch::Adding);
                        let previous = self.chunk.as_ref().map(Chunk::commit);
                        self.finish_stream();
                        let req = AddChunk {
                            path: self.path.clone(),
                            client: self.client,
                            previous,
                        };
                        self.ask(Awaiting::NewChunk, Action::AddChunk(req));
                        Progress::Continue
                    }
                    Ok(other) => other,
                    Err(_) => Progress::Done,
                };
            }
            None => {}
        }
        let (offset, room) = match self.place(p.at) {
            Ok(placed) => placed,
            Err(e) => {
                self.raise(e, Then::Fail);
                return Progress::Done;
            }
        };
        if room == 0 {
            p.switch = Some(Switch::Draining);
            return Progress::Continue;
        }
        let n = (p.data.len() as u64).min(room) as usize;
        let piece = p.data.split_to(n);
        p.at += n as u64;
        let sync = p.sync_last && p.data.is_empty();
        p.push = Some(self.cut(offset, piece, sync));
        Progress::Continue
    }

    /// Where bytes at file offset `at` go in the current chunk: their chunk offset
    /// and the room left after it; no room when they start at or past its end (or
    /// there is no chunk yet), where the next chunk begins. An append writer's bytes
    /// always start at the end of what was sent; an overwrite writer's anywhere up to
    /// it, never before the current chunk.
    fn place(&self, at: u64) -> Result<(u64, u64)> {
        let Some(chunk) = self.chunk.as_ref() else {
            return Ok((0, 0));
        };
        let g = &chunk.grant;
        let end = g.file_offset + chunk.sent;
        let fits = if self.overwrite {
            at >= g.file_offset && at <= end
        } else {
            at == end
        };
        if !fits {
            return Err(Error::NotSupported {
                path: self.path.clone(),
                reason: format!(
                    "a write at offset {at}: this writer writes {} (the file's chunk {} starts at {}, {} bytes written in it)",
                    if self.overwrite {
                        "from the start of the chunk it is writing up to its end"
                    } else {
                        "at the end only"
                    },
                    g.chunk_index,
                    g.file_offset,
                    chunk.sent
                ),
            });
        }
        let offset = at - g.file_offset;
        Ok((offset, g.chunk_size.saturating_sub(offset)))
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
