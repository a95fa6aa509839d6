//! The one procedure behind the first open of a chunk's stream, the reopen after an
//! idle close and pipeline recovery. Each attempt: exclude the failed members
//! (`UpdatePipeline` with the survivors and the acknowledged length), ask every member
//! its length when packets are outstanding (a member that does not answer is
//! excluded too, never opened at the acknowledged offset), set the stream up at
//! [`resume_offset`], resend every unacknowledged packet. `StaleToken` at any step
//! fences the writer; [`MAX_RECOVERIES`] attempts at most.

use super::{Awaiting, Engine};
use crate::error::{Error, Result};
use crate::pipeline::SetupError;
use crate::writer::event::Action;
use crate::writer::policy::{head_refusal_is_fatal, resume_offset, MAX_RECOVERIES};
use stampfs_proto::{ChunkserverId, RemoteError, UpdatePipeline, WriteGrant, WriteSetupReply};

/// Where the error of a failed reopen goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Then {
    /// The writer fails; the job, if any, sees it at its next step (a reopen started by
    /// an ack or a stream end found by the ack reader).
    Fail,
    /// The step that started it fails with this error (a send or flush that failed).
    Return,
}

#[derive(Debug)]
pub(super) struct Reopen {
    /// Members to exclude before the next attempt.
    bad: Vec<ChunkserverId>,
    attempts: usize,
    /// A member was excluded: this is a pipeline recovery, not the first open of the
    /// chunk's stream or a reopen after an idle close.
    recovering: bool,
    then: Then,
    step: ReopenStep,
}

#[derive(Debug)]
pub(super) enum ReopenStep {
    Updating,
    /// Asking member `next` of the pipeline its length.
    Probing {
        lengths: Vec<Option<u64>>,
        next: usize,
    },
    Opening {
        head: Option<ChunkserverId>,
    },
    Resending {
        head: Option<ChunkserverId>,
    },
}

impl Engine {
    /// (Re)opens the stream of the current chunk, first excluding `bad` replicas
    /// through a version bump at the master, then resending every unacked packet. The
    /// stream starts at [`resume_offset`]: what every member already holds is kept (the
    /// resent packets below it are idempotent retries), not cut back to what this
    /// writer saw acknowledged.
    pub(super) fn start_reopen(&mut self, bad: Vec<ChunkserverId>, then: Then) {
        debug_assert!(self.reopen.is_none());
        self.reopen = Some(Reopen {
            bad,
            attempts: 0,
            recovering: false,
            then,
            step: ReopenStep::Updating,
        });
        self.attempt();
    }

    fn attempt(&mut self) {
        let Some(r) = self.reopen.as_mut() else {
            return;
        };
        if r.attempts == MAX_RECOVERIES {
            let e = Error::Pipeline {
                path: self.path.clone(),
                reason: format!("gave up after {MAX_RECOVERIES} pipeline recoveries"),
            };
            return self.end_reopen(Err(e));
        }
        r.attempts += 1;
        if r.bad.is_empty() {
            return self.probe();
        }
        r.recovering = true;
        r.step = ReopenStep::Updating;
        let bad = r.bad.clone();
        self.drop_stream();
        let Some(chunk) = self.chunk.as_ref() else {
            return self.end_reopen(Ok(()));
        };
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
            client: self.client,
            handle: chunk.grant.token.handle,
            survivors,
            acked_length: chunk.acked,
        };
        self.ask(Awaiting::Reopen, Action::UpdatePipeline(req));
    }

    pub(super) fn on_granted(&mut self, res: Result<WriteGrant>) {
        match res {
            Err(e) => {
                let e = self.master_error(e);
                self.end_reopen(Err(e));
            }
            Ok(grant) => {
                if let Some(chunk) = self.chunk.as_mut() {
                    chunk.grant = grant;
                }
                if let Some(r) = self.reopen.as_mut() {
                    r.bad.clear();
                }
                self.probe();
            }
        }
    }

    /// With packets outstanding, asks every member its length before opening. An
    /// overwrite stream asks nobody: its set-up cuts nothing, and it starts at the
    /// first unacknowledged packet (every member holds at least what was
    /// acknowledged, and that packet starts within it).
    fn probe(&mut self) {
        self.drop_stream();
        let Some(chunk) = self.chunk.as_ref() else {
            return self.end_reopen(Ok(()));
        };
        if let Some(at) = chunk.cut {
            return self.open(at);
        }
        if self.overwrite {
            let start = chunk
                .unacked
                .front()
                .map_or(chunk.acked, |p| p.offset.min(chunk.acked));
            return self.open(start);
        }
        if chunk.unacked_end() > chunk.acked {
            self.ask_length(Vec::new(), 0);
        } else {
            let start = chunk.acked;
            self.open(start);
        }
    }

    fn ask_length(&mut self, lengths: Vec<Option<u64>>, next: usize) {
        let (Some(chunk), Some(r)) = (self.chunk.as_ref(), self.reopen.as_mut()) else {
            return;
        };
        let Some(member) = chunk.grant.pipeline.get(next).cloned() else {
            return self.probed(lengths);
        };
        r.step = ReopenStep::Probing { lengths, next };
        let token = chunk.grant.token;
        self.ask(Awaiting::Reopen, Action::AskReplicaLength { member, token });
    }

    pub(super) fn on_replica_length(&mut self, res: Result<u64>) {
        let Some(r) = self.reopen.as_mut() else {
            return;
        };
        let ReopenStep::Probing { lengths, next } = &mut r.step else {
            debug_assert!(false, "a replica length nobody asked for");
            return;
        };
        let (mut lengths, next) = (std::mem::take(lengths), *next);
        let member = self
            .chunk
            .as_ref()
            .and_then(|c| c.grant.pipeline.get(next))
            .map(|m| m.id);
        match res {
            Ok(length) => lengths.push(Some(length)),
            Err(Error::Remote(RemoteError::StaleToken { current, .. })) => {
                let e = self.fenced(Some(current));
                return self.end_reopen(Err(e));
            }
            Err(e) => {
                // Not opened at `acked` with it: a member that cannot answer may still
                // receive the set-up (a one-way partition), and a set-up below its
                // length cuts bytes a reader may have seen.
                tracing::warn!(chunkserver = ?member, error = %e, "replica info failed: excluding the replica");
                r.bad.extend(member);
            }
        }
        self.ask_length(lengths, next + 1);
    }

    /// Every member was asked.
    fn probed(&mut self, lengths: Vec<Option<u64>>) {
        let (Some(chunk), Some(r)) = (self.chunk.as_ref(), self.reopen.as_ref()) else {
            return;
        };
        if !r.bad.is_empty() {
            return self.attempt();
        }
        let start = resume_offset(chunk.acked, chunk.unacked_end(), &lengths);
        if start > chunk.acked {
            tracing::info!(
                acked = chunk.acked,
                start,
                "reopening where every member's replica ends: their bytes past the \
                 acknowledged length are kept"
            );
        }
        self.open(start);
    }

    fn open(&mut self, start: u64) {
        let (Some(chunk), Some(r)) = (self.chunk.as_ref(), self.reopen.as_mut()) else {
            return;
        };
        let head = chunk.grant.pipeline.first().map(|m| m.id);
        r.step = ReopenStep::Opening { head };
        let grant = chunk.grant.clone();
        // A cut is an append set-up: that is what cuts.
        let overwrite = self.overwrite && chunk.cut.is_none();
        self.ask(
            Awaiting::Reopen,
            Action::OpenStream {
                grant,
                start,
                overwrite,
            },
        );
    }

    pub(super) fn on_setup(&mut self, res: std::result::Result<WriteSetupReply, SetupError>) {
        let Some(r) = self.reopen.as_mut() else {
            return;
        };
        let ReopenStep::Opening { head } = r.step else {
            debug_assert!(false, "a set-up reply nobody asked for");
            return;
        };
        match res {
            Err(SetupError::Head(id, e)) => {
                tracing::warn!(chunkserver = %id, error = %e, "pipeline head unreachable");
                r.bad.push(id);
                self.attempt();
            }
            Err(SetupError::Rejected(RemoteError::StaleToken { current, .. })) => {
                let e = self.fenced(Some(current));
                self.end_reopen(Err(e));
            }
            Err(SetupError::Rejected(e)) if head_refusal_is_fatal(&e) => {
                let e = Error::Pipeline {
                    path: self.path.clone(),
                    reason: e.to_string(),
                };
                self.end_reopen(Err(e));
            }
            Err(SetupError::Rejected(e)) => {
                tracing::warn!(chunkserver = ?head, error = %e, "pipeline head refused the stream");
                r.bad.extend(head);
                self.attempt();
            }
            Ok(reply) => {
                let stale = reply.failed.iter().find_map(|(_, e)| match e {
                    RemoteError::StaleToken { current, .. } => Some(*current),
                    _ => None,
                });
                if let Some(current) = stale {
                    self.output.push_back(Action::DropStream);
                    let e = self.fenced(Some(current));
                    return self.end_reopen(Err(e));
                }
                if !reply.failed.is_empty() {
                    r.bad.extend(reply.failed.iter().map(|(id, _)| *id));
                    self.output.push_back(Action::FinishStream);
                    return self.attempt();
                }
                let recovery = r.recovering;
                r.step = ReopenStep::Resending { head };
                let Some(chunk) = self.chunk.as_ref() else {
                    return self.end_reopen(Ok(()));
                };
                let token = chunk.grant.token;
                let packets = chunk.unacked.iter().cloned().collect();
                self.ask(
                    Awaiting::Reopen,
                    Action::Resend {
                        token,
                        packets,
                        recovery,
                    },
                );
            }
        }
    }

    pub(super) fn on_resent(&mut self, ok: bool) {
        let Some(r) = self.reopen.as_mut() else {
            return;
        };
        let ReopenStep::Resending { head } = r.step else {
            debug_assert!(false, "a resend nobody asked for");
            return;
        };
        if ok {
            if let Some(chunk) = self.chunk.as_mut() {
                // The resent packets left right after the set-up: a close of this
                // stream before their acks is no idle close.
                chunk.quiet_burst = false;
                chunk.stream = head;
            }
            return self.end_reopen(Ok(()));
        }
        self.output.push_back(Action::DropStream);
        r.bad.extend(head);
        self.attempt();
    }

    fn end_reopen(&mut self, res: Result<()>) {
        let Some(r) = self.reopen.take() else {
            return;
        };
        if let Err(e) = res {
            self.raise(e, r.then);
        }
    }
}
