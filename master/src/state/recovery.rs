//! Lease recovery's state changes, as methods of [`MasterState`]: the append gate,
//! the durable start and commit of a recovery, and what the worker should run. The
//! decisions themselves are pure functions in [`crate::recovery`]; the steps that talk
//! to chunkservers are in the service. The end of an attempt (the extra version of
//! diverged replicas, the commit, dropping replicas a seal missed) is in `finish`.

use super::{MasterState, Record};
use crate::error::{Error, Result};
use crate::lease::Takeover;
use crate::namespace::{self, join, FileMeta, WriteState};
use crate::recovery::{self, OnAppend, Start, Trigger};
use stampfs_proto::{
    ChunkHandle, ChunkVersion, ChunkserverAddr, ChunkserverId, ClientId, InodeId, RecoveryOutcome,
};

mod finish;

/// What `append` runs into before it takes the file lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendGate {
    /// No writer in the way: go on with the ordinary append.
    Proceed,
    /// The holder passed its soft limit: start recovery, answer `RecoveryInProgress`.
    Recover { inode: InodeId, holder: ClientId },
}

/// A recovery whose `RecoveryStarted` record is committed: what to push and seal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPlan {
    pub inode: InodeId,
    pub path: String,
    pub handle: ChunkHandle,
    pub holder: ClientId,
    /// The version the writer held.
    pub old_version: ChunkVersion,
    /// The master's version before this attempt (`old_version` on a first attempt,
    /// the previous attempt's version on a resumed one).
    pub previous: ChunkVersion,
    /// The version minted for this attempt.
    pub version: ChunkVersion,
    /// Live replicas at a version in `old_version..=previous`, by chunkserver id.
    pub targets: Vec<ChunkserverAddr>,
    /// The granted pipeline, in its order (empty when it is not known): which replica
    /// is kept when the targets turn out to hold different bytes.
    pub pipeline: Vec<ChunkserverId>,
    /// The chunk's committed length: no replica shorter than it may vote.
    pub committed: u64,
}

/// How a recovery that needed no bump ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closing {
    /// The file had no writer.
    AlreadyClosed,
    /// Another client than the expired holder holds the file now: left alone.
    HolderChanged { holder: ClientId },
    /// The expired holder renewed its lease before the recovery took the file lock:
    /// left alone.
    Renewed { holder: ClientId },
    /// Open without an open last chunk: closed at its committed length.
    AtCommitted,
    /// Every replica of the last chunk is proven gone
    /// ([`crate::recovery::proven_gone`]): closed at the chunk's committed length
    /// under a freshly minted `version`, the chunk listed as missing.
    Missing {
        handle: ChunkHandle,
        version: ChunkVersion,
    },
    /// The last chunk was never granted, held nothing and was never reported
    /// ([`crate::recovery::Start::DropEmpty`]): dropped, the file closed.
    DroppedEmpty { handle: ChunkHandle },
}

/// What [`MasterState::begin_recovery`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryBegin {
    /// Nothing to push: the file is closed (or changed hands).
    Done {
        outcome: RecoveryOutcome,
        how: Closing,
    },
    /// `RecoveryStarted` is committed: push the bump and seal.
    Bump(RecoveryPlan),
    /// No replica holding the granted version is reachable: the file stays in
    /// recovery and the attempt is retried later. `fenced`: this attempt took the file
    /// from its holder (it was open) and minted a version past the holder's.
    Waiting {
        outcome: RecoveryOutcome,
        handle: ChunkHandle,
        fenced: bool,
    },
}

impl MasterState {
    /// The soft-limit rule of `append` on `path`: a file in recovery answers
    /// `RecoveryInProgress`, a holder within its soft limit `LeaseConflict`, one past
    /// it [`AppendGate::Recover`]. Anything else (a closed file, a directory, a bad
    /// path) proceeds to the ordinary append, which reports it.
    pub fn append_gate(&self, path: &str, now_ms: u64) -> Result<AppendGate> {
        let Ok(comps) = namespace::components(path) else {
            return Ok(AppendGate::Proceed);
        };
        let Ok(inode) = self.ns.resolve(&comps) else {
            return Ok(AppendGate::Proceed);
        };
        let Some(f) = self.ns.file(inode) else {
            return Ok(AppendGate::Proceed);
        };
        match f.write {
            WriteState::Closed => Ok(AppendGate::Proceed),
            WriteState::Recovering { .. } => Err(Error::RecoveryInProgress { path: join(&comps) }),
            WriteState::Open { client: holder, .. } => {
                match recovery::on_append(
                    holder,
                    self.leases.takeover(inode, now_ms, self.settings.limits),
                ) {
                    OnAppend::Conflict {
                        holder,
                        expires_in_ms,
                    } => Err(Error::LeaseConflict {
                        path: join(&comps),
                        holder,
                        expires_in_ms,
                    }),
                    OnAppend::Recover { holder } => Ok(AppendGate::Recover { inode, holder }),
                }
            }
        }
    }

    /// Chunkservers ever handed an id that have not registered since this master
    /// started: their replicas are not in the chunk table.
    fn unreported_servers(&self) -> Vec<ChunkserverId> {
        self.servers
            .keys()
            .filter(|id| self.registry.get(**id).is_none())
            .copied()
            .collect()
    }

    /// The path of a file for recovery (its inode may have been renamed since).
    pub(super) fn recovery_file(&self, inode: InodeId) -> Result<(String, &FileMeta)> {
        let path = self.ns.path_of(inode).ok_or_else(|| Error::NotFound {
            path: format!("file {inode}"),
        })?;
        let f = self
            .ns
            .file(inode)
            .ok_or_else(|| self.not_a_file(&path, inode))?;
        Ok((path, f))
    }

    /// Step 1 of lease recovery (the caller holds the file lock): decides, and either
    /// closes the file at once or commits `RecoveryStarted` with a freshly minted
    /// version for the last chunk, releasing the holder's lease. Nothing may be
    /// pushed before the record is durable.
    pub fn begin_recovery(
        &mut self,
        inode: InodeId,
        trigger: Trigger,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<RecoveryBegin> {
        let (path, f) = self.recovery_file(inode)?;
        let write = f.write;
        // The trigger was judged before the file lock: a holder that renewed since
        // (its renewal was queued behind the judgement) keeps its file.
        if let (Some(expired), WriteState::Open { client, .. }) = (trigger.expired_holder(), write)
        {
            if let Takeover::Conflict { holder, .. } =
                self.leases.takeover(inode, now_ms, self.settings.limits)
            {
                if holder == expired && client == expired {
                    return Ok(RecoveryBegin::Done {
                        outcome: self.recovery_outcome(inode, path)?,
                        how: Closing::Renewed { holder },
                    });
                }
            }
        }
        let handle = self.open_chunk_of(inode, f);
        let last = handle.and_then(|h| self.chunks.get(h));
        let reopened = self.open_chunks.contains_key(&inode);
        let dead_after = self.settings.dead_after_ms;
        let unreported = self.unreported_servers();
        let holders = recovery::Holders {
            loss_accepted: matches!(
                trigger,
                Trigger::Operator {
                    accept_loss: true,
                    ..
                }
            ),
            pipeline: handle.and_then(|h| self.pipeline_of(inode, h, write.floor()?)),
            unreported: &unreported,
            never_granted: handle
                .is_some_and(|h| self.pipelines.get(&inode).is_none_or(|p| p.handle != h)),
        };
        let pipeline = holders.pipeline.map(<[_]>::to_vec).unwrap_or_default();
        let start = recovery::decide(
            write,
            trigger.expired_holder(),
            f.chunk_size,
            last,
            reopened,
            &holders,
            |id| {
                self.registry
                    .live_addr(id, now_ms, dead_after)
                    .map(str::to_string)
            },
        );
        let current = last.map(|i| i.version);
        let committed = last.map_or(0, |i| i.length);
        match start {
            Start::Closed => Ok(RecoveryBegin::Done {
                outcome: self.recovery_outcome(inode, path)?,
                how: Closing::AlreadyClosed,
            }),
            Start::HolderChanged { holder } => Ok(RecoveryBegin::Done {
                outcome: self.recovery_outcome(inode, path)?,
                how: Closing::HolderChanged { holder },
            }),
            Start::CloseAtCommitted => {
                self.close_at_committed(inode, path, mtime_ms, now_ms, Closing::AtCommitted)
            }
            Start::DropEmpty => {
                let Some(handle) = handle else {
                    return Err(Error::bad_request("an empty chunk to drop without a chunk"));
                };
                self.commit(Record::AbandonChunk { inode, handle }, now_ms)?;
                let how = Closing::DroppedEmpty { handle };
                self.close_at_committed(inode, path, mtime_ms, now_ms, how)
            }
            Start::Lost {
                old_version,
                version,
                mint,
            } => {
                let Some(handle) = handle else {
                    return Err(Error::bad_request("a lost chunk without a chunk"));
                };
                if mint {
                    self.commit(
                        Record::RecoveryStarted {
                            inode,
                            handle,
                            old_version,
                            version,
                        },
                        now_ms,
                    )?;
                }
                self.commit(
                    Record::RecoveryCommitted {
                        inode,
                        handle,
                        version,
                        length: committed,
                        mtime_ms,
                    },
                    now_ms,
                )?;
                self.missing_chunks.insert(handle);
                let mut outcome = self.recovery_outcome(inode, path)?;
                outcome.old_version = Some(old_version);
                outcome.new_version = Some(version);
                Ok(RecoveryBegin::Done {
                    outcome,
                    how: Closing::Missing { handle, version },
                })
            }
            Start::Fence {
                holder: _,
                old_version,
                version,
            } => {
                let Some(handle) = handle else {
                    return Err(Error::bad_request("a fence without a chunk"));
                };
                self.commit(
                    Record::RecoveryStarted {
                        inode,
                        handle,
                        old_version,
                        version,
                    },
                    now_ms,
                )?;
                Ok(RecoveryBegin::Waiting {
                    outcome: self.recovery_outcome(inode, path)?,
                    handle,
                    fenced: true,
                })
            }
            Start::Unreachable { .. } => {
                let Some(handle) = handle else {
                    return Err(Error::bad_request("an unreachable chunk without a chunk"));
                };
                Ok(RecoveryBegin::Waiting {
                    outcome: self.recovery_outcome(inode, path)?,
                    handle,
                    fenced: false,
                })
            }
            Start::Bump {
                holder,
                old_version,
                version,
                targets,
            } => {
                let (Some(handle), Some(previous)) = (handle, current) else {
                    return Err(Error::bad_request("a bump without a chunk"));
                };
                self.commit(
                    Record::RecoveryStarted {
                        inode,
                        handle,
                        old_version,
                        version,
                    },
                    now_ms,
                )?;
                Ok(RecoveryBegin::Bump(RecoveryPlan {
                    inode,
                    path,
                    handle,
                    holder,
                    old_version,
                    previous,
                    version,
                    targets,
                    pipeline,
                    committed,
                }))
            }
        }
    }

    /// Logs the close of `inode` at its committed length; `how` says why.
    fn close_at_committed(
        &mut self,
        inode: InodeId,
        path: String,
        mtime_ms: u64,
        now_ms: u64,
        how: Closing,
    ) -> Result<RecoveryBegin> {
        self.commit(
            Record::Close {
                inode,
                last: None,
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(RecoveryBegin::Done {
            outcome: self.recovery_outcome(inode, path)?,
            how,
        })
    }

    /// The recovery view of a file as it is now: closed (no versions), or still in
    /// recovery (`closed: false`, the writer's version and the master's current one).
    pub fn recovery_outcome(&self, inode: InodeId, path: String) -> Result<RecoveryOutcome> {
        let status = self.status(path, inode)?;
        let f = self
            .ns
            .file(inode)
            .ok_or_else(|| self.not_a_file(&status.path, inode))?;
        let (closed, old_version, new_version) = match f.write {
            WriteState::Recovering { old_version, .. } => (
                false,
                Some(old_version),
                self.open_chunk_of(inode, f)
                    .and_then(|h| self.chunks.get(h))
                    .map(|i| i.version),
            ),
            WriteState::Open { .. } => (false, None, None),
            WriteState::Closed => (true, None, None),
        };
        Ok(RecoveryOutcome {
            path: status.path,
            closed,
            old_version,
            new_version,
            length: status.length,
        })
    }

    /// Files in lease recovery whose last chunk has a replica on one of `servers` (a
    /// chunkserver that registered or came back holds a replica a waiting recovery may
    /// use).
    pub fn recovering_with_replica_on(&self, servers: &[ChunkserverId]) -> Vec<InodeId> {
        if servers.is_empty() {
            return Vec::new();
        }
        self.recovering
            .iter()
            .filter(|ino| {
                self.ns
                    .file(**ino)
                    .and_then(|f| self.open_chunk_of(**ino, f))
                    .and_then(|h| self.chunks.get(h))
                    .is_some_and(|info| servers.iter().any(|s| info.replica(*s).is_some()))
            })
            .copied()
            .collect()
    }

    /// What the recovery worker should run now: every open file whose lease passed the
    /// hard limit (each expiry once), and every file left in recovery once its
    /// chunkservers had a chance to register (`grace_ms` after start-up, or as soon as
    /// all its replicas are back).
    pub fn recoveries_due(&mut self, now_ms: u64, grace_ms: u64) -> Vec<(InodeId, Trigger)> {
        let limits = self.settings.limits;
        let mut due: Vec<(InodeId, Trigger)> = self
            .leases
            .take_hard_expired(now_ms, limits)
            .into_iter()
            .filter(|(ino, _)| self.ns.file(*ino).is_some_and(|f| f.writer().is_some()))
            .map(|(ino, lease)| {
                (
                    ino,
                    Trigger::HardLimit {
                        holder: lease.holder,
                    },
                )
            })
            .collect();
        let dead_after = self.settings.dead_after_ms;
        for ino in &self.recovering {
            let Some(f) = self.ns.file(*ino) else {
                continue;
            };
            let WriteState::Recovering { old_version, .. } = f.write else {
                continue;
            };
            let present = self
                .open_chunk_of(*ino, f)
                .and_then(|h| Some((h, self.chunks.get(h)?)))
                .map(|(h, info)| {
                    let pipeline = self.pipeline_of(*ino, h, old_version);
                    recovery::recoverable_targets(info, old_version, pipeline, |id| {
                        self.registry
                            .live_addr(id, now_ms, dead_after)
                            .map(str::to_string)
                    })
                    .len()
                })
                .unwrap_or(0);
            if recovery::resume_ready(now_ms, grace_ms, present, f.replication) {
                due.push((*ino, Trigger::Resume));
            }
        }
        due
    }
}

#[cfg(test)]
mod tests;
