//! The write path's requests, as methods of [`MasterState`]: reopening a file for
//! append, new chunks, moves between chunks, dropped chunks, pipeline updates, cuts,
//! close, and the grants after a bump. Each validates, commits its [`Record`] and
//! returns what the server must do next (the bumps to push before the grant, the
//! replicas to finalize).

use super::{MasterState, Record};
use crate::chunk_table::server_index;
use crate::error::{Error, Result};
use crate::namespace::WriteState;
use crate::placement;
use stampfs_proto::{
    Append, ChunkHandle, ChunkVersion, ChunkserverAddr, ChunkserverId, ClientId, DropChunks,
    FileStatus, InodeId, OpenChunk, ReplicaReport, UpdatePipeline,
};
use std::collections::HashSet;

/// Version bumps to push before a write grant goes out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BumpPlan {
    pub inode: InodeId,
    pub path: String,
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
    /// `BumpVersion { create }`: a new replica is made.
    pub create: bool,
    /// Where to push it, in pipeline order.
    pub targets: Vec<ChunkserverAddr>,
    /// Fewest successful bumps for the grant.
    pub needed: usize,
    pub chunk_index: u64,
    pub file_offset: u64,
    pub chunk_offset: u64,
    pub chunk_size: u64,
}

/// Replicas to seal at a committed length (best effort).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalizePlan {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
    pub length: u64,
    pub targets: Vec<ChunkserverAddr>,
}

/// What `Append` decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendPlan {
    pub status: FileStatus,
    /// Present when the last chunk is re-leased under a new version.
    pub bump: Option<BumpPlan>,
}

/// What `AddChunk` decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddChunkPlan {
    pub bump: BumpPlan,
    pub finalize: Option<FinalizePlan>,
}

/// What `OpenChunk` decided: the bump of the chunk moved to, and the finalize of the
/// one left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenChunkPlan {
    pub bump: BumpPlan,
    pub finalize: Option<FinalizePlan>,
}

/// What `Close` decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClosePlan {
    pub status: FileStatus,
    pub finalize: Option<FinalizePlan>,
}

impl MasterState {
    /// `cut_last_chunk`: the writer of `expect` lowers its last chunk's committed length
    /// to `req.length` before cutting the replicas (logged; nothing when the length is
    /// not below the committed one).
    pub fn cut_last_chunk(
        &mut self,
        req: &stampfs_proto::CutLastChunk,
        expect: InodeId,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<()> {
        let path = self.locked_file(&req.path, expect)?.0;
        self.check_writer(&path, expect, req.client, now_ms)?;
        let (path, f) = self.locked_file(&req.path, expect)?;
        if f.chunks.last() != Some(&req.handle) || self.open_chunk_of(expect, f) != Some(req.handle)
        {
            return Err(Error::bad_request(format!(
                "chunk {} is not the last chunk of {path} being written",
                req.handle
            )));
        }
        let committed = self
            .chunks
            .get(req.handle)
            .map(|i| i.length)
            .ok_or_else(|| Error::bad_request(format!("chunk {} is unknown", req.handle)))?;
        if req.length >= committed {
            return Ok(());
        }
        self.commit(
            Record::CutChunk {
                inode: expect,
                handle: req.handle,
                length: req.length,
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(())
    }

    /// `append`: reopens a closed file for `client`. When its last chunk has room, a new
    /// version is minted for it and the bump targets are its live current replicas.
    pub fn append(
        &mut self,
        req: &Append,
        expect: InodeId,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<AppendPlan> {
        self.check_access(&req.path, req.caller.as_ref(), crate::perm::WRITE)?;
        let (path, f) = self.locked_file(&req.path, expect)?;
        if f.is_recovering() {
            return Err(Error::RecoveryInProgress { path });
        }
        if let Some(holder) = f.writer() {
            return Err(self.conflict(&path, expect, holder, now_ms));
        }
        // Reopened, its chunks count whole against the quotas above it.
        let open_charge = (f.chunks.len() as u64)
            .saturating_mul(f.chunk_size)
            .saturating_mul(u64::from(f.replication));
        self.check_file_growth(expect, open_charge.saturating_sub(self.charged_bytes(f)))?;
        let needed = self.settings.needed(f.replication);
        let chunk_size = f.chunk_size;
        let last = match f.chunks.last() {
            Some(h) => {
                let info = self
                    .chunks
                    .get(*h)
                    .ok_or_else(|| Error::bad_request(format!("chunk {h} of {path} is unknown")))?;
                (info.length < chunk_size).then_some((*h, info.version, info.length))
            }
            None => None,
        };
        let index = f.chunks.len().saturating_sub(1);
        let file_offset = self.offset_of(f, index);
        let bump = match last {
            None => None,
            Some((handle, version, length)) => {
                let info = self
                    .chunks
                    .get(handle)
                    .ok_or_else(|| Error::bad_request("chunk vanished"))?;
                let targets = self.current_targets(info, now_ms);
                if targets.len() < needed {
                    return Err(Error::NotEnoughReplicas {
                        live: targets.len() as u32,
                        needed: needed as u32,
                    });
                }
                Some(BumpPlan {
                    inode: expect,
                    path: path.clone(),
                    handle,
                    version: version.next(),
                    create: false,
                    targets,
                    needed,
                    chunk_index: index as u64,
                    file_offset,
                    chunk_offset: length,
                    chunk_size,
                })
            }
        };
        self.commit(
            Record::Reopen {
                inode: expect,
                client: req.client,
                last: bump.as_ref().map(|b| (b.handle, b.version)),
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(AppendPlan {
            status: self.status(path, expect)?,
            bump,
        })
    }

    /// `add_chunk`: commits the previous chunk, mints a handle and version 1 for a new
    /// one and places it.
    pub fn add_chunk(
        &mut self,
        req: &stampfs_proto::AddChunk,
        expect: InodeId,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<AddChunkPlan> {
        let path = self.locked_file(&req.path, expect)?.0;
        self.check_writer(&path, expect, req.client, now_ms)?;
        let (_, f) = self.locked_file(&req.path, expect)?;
        let retried = self.retried_add(expect, f, req);
        if retried.is_none() {
            // The new chunk counts whole against the quotas above the file.
            let growth = f.chunk_size.saturating_mul(u64::from(f.replication));
            self.check_file_growth(expect, growth)?;
        }
        if let Some(last) = retried {
            tracing::info!(path = %path, chunk = %last, client = %req.client, "a new chunk asked for again (the answer to the first ask was lost): the empty chunk added then is dropped for a new one");
            self.commit(
                Record::AbandonChunk {
                    inode: expect,
                    handle: last,
                },
                now_ms,
            )?;
        }
        let (_, f) = self.locked_file(&req.path, expect)?;
        // Asked again, the commit is made already (`retried_add` checked it).
        match (&req.previous, retried) {
            (_, Some(_)) => {}
            (Some(c), None) => self.check_commit(&path, expect, f, c)?,
            (None, None) => self.check_full_end(&path, f)?,
        }
        let replication = f.replication;
        let chunk_size = f.chunk_size;
        let needed = self.settings.needed(replication);
        let candidates = self.placement_candidates(now_ms, chunk_size);
        let placed = placement::choose(
            &candidates,
            usize::from(replication),
            needed,
            &mut rand::thread_rng(),
        )
        .map_err(|e| Error::NotEnoughReplicas {
            live: e.live,
            needed: e.needed,
        })?;
        let handle = self.chunks.next_handle();
        let version = ChunkVersion(1);
        self.commit(
            Record::AddChunk {
                inode: expect,
                previous: if retried.is_some() {
                    None
                } else {
                    req.previous
                },
                handle,
                version,
                mtime_ms,
            },
            now_ms,
        )?;
        let mut targets = Vec::with_capacity(placed.targets.len());
        for id in &placed.targets {
            self.registry.reserve(*id, chunk_size);
            if let Some(cs) = self.registry.get(*id) {
                targets.push(cs.addr());
            }
        }
        if placed.under_replicated {
            tracing::info!(chunk = %handle, path = %path, placed = targets.len(), replication, "chunk placed under-replicated");
        }
        let f = self
            .ns
            .file(expect)
            .ok_or_else(|| Error::NotFound { path: path.clone() })?;
        let index = f.chunks.len().saturating_sub(1);
        let file_offset = self.offset_of(f, index);
        let finalize = req.previous.and_then(|c| {
            let info = self.chunks.get(c.handle)?;
            Some(FinalizePlan {
                handle: c.handle,
                version: info.version,
                length: c.length,
                targets: self.current_targets(info, now_ms),
            })
        });
        Ok(AddChunkPlan {
            bump: BumpPlan {
                inode: expect,
                path,
                handle,
                version,
                create: true,
                targets,
                needed,
                chunk_index: index as u64,
                file_offset,
                chunk_offset: 0,
                chunk_size,
            },
            finalize,
        })
    }

    /// `open_chunk`: moves the writer to chunk `req.index` of its file, committing the
    /// chunk it was writing; a new version is minted for the chunk and its bump
    /// targets are its live current replicas (the previous chunk's are finalized).
    pub fn open_chunk(
        &mut self,
        req: &OpenChunk,
        expect: InodeId,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<OpenChunkPlan> {
        let path = self.locked_file(&req.path, expect)?.0;
        self.check_writer(&path, expect, req.client, now_ms)?;
        let (_, f) = self.locked_file(&req.path, expect)?;
        let retried = self.retried_open(expect, f, req);
        if let (Some(c), false) = (&req.previous, retried) {
            self.check_commit(&path, expect, f, c)?;
        }
        let index = usize::try_from(req.index)
            .ok()
            .filter(|i| *i < f.chunks.len())
            .ok_or_else(|| {
                Error::bad_request(format!(
                    "chunk index {} of {path}, which has {} chunks",
                    req.index,
                    f.chunks.len()
                ))
            })?;
        let handle = f.chunks[index];
        if retried {
            tracing::info!(path = %path, chunk = %handle, client = %req.client, "a move to a chunk asked for again (the answer to the first ask was lost): the chunk gets another version");
        } else {
            self.check_leaving(&path, expect, f, req.previous.as_ref())?;
            if req.previous.is_some_and(|c| c.handle == handle)
                || self.granted_chunk(expect, f) == Some(handle)
            {
                return Err(Error::bad_request(format!(
                    "chunk {handle} of {path} is being written already"
                )));
            }
        }
        let chunk_size = f.chunk_size;
        let needed = self.settings.needed(f.replication);
        let last = index + 1 == f.chunks.len();
        let file_offset = self.offset_of(f, index);
        let info = self
            .chunks
            .get(handle)
            .ok_or_else(|| Error::bad_request(format!("chunk {handle} of {path} is unknown")))?;
        if !last && info.length != chunk_size {
            return Err(Error::bad_request(format!(
                "chunk {handle} of {path} is before the last but holds {} of {chunk_size} bytes",
                info.length
            )));
        }
        let targets = match f.write.floor() {
            Some(floor) if retried => self.targets_since(info, floor, now_ms),
            _ => self.current_targets(info, now_ms),
        };
        if targets.len() < needed {
            return Err(Error::NotEnoughReplicas {
                live: targets.len() as u32,
                needed: needed as u32,
            });
        }
        let version = info.version.next();
        let length = info.length;
        self.commit(
            Record::ChunkOpened {
                inode: expect,
                // Asked again: the first ask committed `previous` and moved the writer.
                previous: if retried { None } else { req.previous },
                handle,
                version,
                mtime_ms,
            },
            now_ms,
        )?;
        let finalize = req.previous.and_then(|c| {
            let info = self.chunks.get(c.handle)?;
            Some(FinalizePlan {
                handle: c.handle,
                version: info.version,
                length: c.length,
                targets: self.current_targets(info, now_ms),
            })
        });
        Ok(OpenChunkPlan {
            bump: BumpPlan {
                inode: expect,
                path,
                handle,
                version,
                create: false,
                targets,
                needed,
                chunk_index: index as u64,
                file_offset,
                chunk_offset: length,
                chunk_size,
            },
            finalize,
        })
    }

    /// `drop_chunks`: shrinks the file below its last chunk, keeping `req.keep`
    /// chunks and committing the chunk being written; that chunk's replicas are
    /// finalized when it is kept. Dropped chunks' replicas are deleted once the record
    /// is durable.
    pub fn drop_chunks(
        &mut self,
        req: &DropChunks,
        expect: InodeId,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<Option<FinalizePlan>> {
        let path = self.locked_file(&req.path, expect)?.0;
        self.check_writer(&path, expect, req.client, now_ms)?;
        let (_, f) = self.locked_file(&req.path, expect)?;
        if let Some(c) = &req.previous {
            self.check_commit(&path, expect, f, c)?;
        }
        self.check_leaving(&path, expect, f, req.previous.as_ref())?;
        let keep = usize::try_from(req.keep)
            .ok()
            .filter(|k| *k < f.chunks.len())
            .ok_or_else(|| {
                Error::bad_request(format!(
                    "keeping {} chunks of {path}, which has {}: nothing to drop",
                    req.keep,
                    f.chunks.len()
                ))
            })?;
        if let Some(h) = keep.checked_sub(1).map(|i| f.chunks[i]) {
            let length = match &req.previous {
                Some(c) if c.handle == h => c.length,
                _ => self.chunks.get(h).map_or(0, |i| i.length),
            };
            if length != f.chunk_size {
                return Err(Error::bad_request(format!(
                    "the chunk {h} that would be left last in {path} holds {length} of {} bytes",
                    f.chunk_size
                )));
            }
        }
        let kept = req
            .previous
            .filter(|c| f.chunks[..keep].contains(&c.handle));
        self.commit(
            Record::ChunksDropped {
                inode: expect,
                previous: req.previous,
                keep: req.keep,
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(kept.and_then(|c| {
            let info = self.chunks.get(c.handle)?;
            Some(FinalizePlan {
                handle: c.handle,
                version: info.version,
                length: c.length,
                targets: self.current_targets(info, now_ms),
            })
        }))
    }

    /// `update_pipeline`: a new version for the chunk being written over the survivors.
    pub fn update_pipeline(
        &mut self,
        req: &UpdatePipeline,
        expect: InodeId,
        now_ms: u64,
    ) -> Result<BumpPlan> {
        let path = self.locked_file(&req.path, expect)?.0;
        self.check_writer(&path, expect, req.client, now_ms)?;
        let (_, f) = self.locked_file(&req.path, expect)?;
        let Some(index) = self
            .open_index_of(expect, f)
            .filter(|i| f.chunks.get(*i) == Some(&req.handle))
        else {
            return Err(Error::bad_request(format!(
                "chunk {} is not the chunk being written in {path}",
                req.handle
            )));
        };
        let needed = self.settings.needed(f.replication);
        let chunk_size = f.chunk_size;
        let file_offset = self.offset_of(f, index);
        let info = self
            .chunks
            .get(req.handle)
            .ok_or_else(|| Error::bad_request(format!("chunk {} is unknown", req.handle)))?;
        if req.acked_length > chunk_size || req.acked_length < info.length {
            return Err(Error::bad_request(format!(
                "acknowledged length {} is outside [{}, {chunk_size}]",
                req.acked_length, info.length
            )));
        }
        if req.survivors.is_empty() {
            return Err(Error::NotEnoughReplicas {
                live: 0,
                needed: needed as u32,
            });
        }
        // The version the writer holds: a later one minted for it whose answer it never
        // got (the master failed over, or the connection broke) may have reached some
        // of its replicas or none, and the writer asks again with the same survivors.
        let held = self
            .pipelines
            .get(&expect)
            .filter(|p| p.handle == req.handle)
            .map_or(info.version, |p| p.version);
        let mut seen = HashSet::new();
        let mut targets = Vec::with_capacity(req.survivors.len());
        for s in &req.survivors {
            if !seen.insert(*s) {
                return Err(Error::bad_request(format!("survivor {s} is listed twice")));
            }
            match info.replica(*s) {
                Some(r) if r.version >= held && r.version <= info.version => {}
                _ => {
                    return Err(Error::bad_request(format!(
                        "{s} is not an up-to-date replica of chunk {}",
                        req.handle
                    )))
                }
            }
            if let Some(cs) = self.registry.get(*s) {
                targets.push(cs.addr());
            }
        }
        let version = info.version.next();
        self.commit(
            Record::SetVersion {
                handle: req.handle,
                version,
            },
            now_ms,
        )?;
        Ok(BumpPlan {
            inode: expect,
            path,
            handle: req.handle,
            version,
            create: false,
            targets,
            needed,
            chunk_index: index as u64,
            file_offset,
            chunk_offset: req.acked_length,
            chunk_size,
        })
    }

    /// `close`: commits the last chunk, closes the file, releases the lease. A retried
    /// close of a file already closed at the same length succeeds again.
    pub fn close(
        &mut self,
        req: &stampfs_proto::Close,
        expect: InodeId,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<ClosePlan> {
        let (path, f) = self.locked_file(&req.path, expect)?;
        if f.write == WriteState::Closed {
            let same = match &req.last {
                None => true,
                Some(c) => {
                    f.chunks.contains(&c.handle)
                        && self.chunks.get(c.handle).map(|i| i.length) == Some(c.length)
                }
            };
            if same {
                return Ok(ClosePlan {
                    status: self.status(path, expect)?,
                    finalize: None,
                });
            }
        }
        self.check_writer(&path, expect, req.client, now_ms)?;
        let (_, f) = self.locked_file(&req.path, expect)?;
        if let Some(c) = &req.last {
            self.check_commit(&path, expect, f, c)?;
        }
        self.commit(
            Record::Close {
                inode: expect,
                last: req.last,
                // Zero leaves the modification time where it is.
                mtime_ms: if req.keep_mtime { 0 } else { mtime_ms },
            },
            now_ms,
        )?;
        let finalize = req.last.and_then(|c| {
            let info = self.chunks.get(c.handle)?;
            Some(FinalizePlan {
                handle: c.handle,
                version: info.version,
                length: c.length,
                targets: self.current_targets(info, now_ms),
            })
        });
        Ok(ClosePlan {
            status: self.status(path, expect)?,
            finalize,
        })
    }

    /// The bump of `plan` (a new chunk, a reopen or a pipeline update) reached enough
    /// replicas, `pipeline`: logs [`Record::GrantedPipeline`], so that lease recovery
    /// of the file only lets those replicas vote on the length from now on (and only
    /// at the granted version or above). Must be durable before the grant leaves.
    /// A fresh version for the chunk of `plan`, whose bump some targets did not answer
    /// (see `Core::push_bump_fenced`): logged as `SetVersion` while `client` still
    /// holds the file and still writes that chunk, at the plan's version.
    pub fn fence_version(
        &mut self,
        plan: &BumpPlan,
        client: ClientId,
        now_ms: u64,
    ) -> Result<ChunkVersion> {
        let f = self.ns.file(plan.inode).ok_or_else(|| Error::NotFound {
            path: plan.path.clone(),
        })?;
        if f.writer() != Some(client) || self.open_chunk_of(plan.inode, f) != Some(plan.handle) {
            return Err(Error::LeaseExpired {
                path: plan.path.clone(),
                client,
            });
        }
        let at = self.chunks.get(plan.handle).map(|i| i.version);
        if at != Some(plan.version) {
            return Err(stampfs_proto::RemoteError::Unavailable {
                reason: format!(
                    "chunk {} of {} moved on from version {} meanwhile",
                    plan.handle, plan.path, plan.version
                ),
            }
            .into());
        }
        let version = plan.version.next();
        self.commit(
            Record::SetVersion {
                handle: plan.handle,
                version,
            },
            now_ms,
        )?;
        Ok(version)
    }

    pub fn grant_made(
        &mut self,
        plan: &BumpPlan,
        client: ClientId,
        pipeline: &[ChunkserverId],
        now_ms: u64,
    ) -> Result<()> {
        let f = self.ns.file(plan.inode).ok_or_else(|| Error::NotFound {
            path: plan.path.clone(),
        })?;
        if f.writer() != Some(client) || self.open_chunk_of(plan.inode, f) != Some(plan.handle) {
            return Err(Error::LeaseExpired {
                path: plan.path.clone(),
                client,
            });
        }
        self.commit(
            Record::GrantedPipeline {
                inode: plan.inode,
                handle: plan.handle,
                version: plan.version,
                servers: pipeline.to_vec(),
            },
            now_ms,
        )?;
        Ok(())
    }

    /// A reopen whose bump did not reach enough replicas: its last chunk is now at a
    /// version the replicas may not hold, so the file can not simply close again (every
    /// replica would look stale). It goes to lease recovery from the version the closed
    /// file had ([`Record::RecoveryQueued`]); the recovery worker raises whichever
    /// replicas are reachable to a fresh version and seals them. Returns whether the
    /// file was queued (false when `client` no longer holds it).
    pub fn abandon_reopen(&mut self, ino: InodeId, client: ClientId, now_ms: u64) -> Result<bool> {
        match self.ns.file(ino).map(|f| f.writer()) {
            Some(Some(c)) if c == client => {
                self.commit(Record::RecoveryQueued { inode: ino }, now_ms)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Drops a new chunk that could not be placed, if it is still the file's last.
    pub fn abandon_chunk(&mut self, ino: InodeId, handle: ChunkHandle, now_ms: u64) -> Result<()> {
        if self.ns.file(ino).and_then(|f| f.chunks.last()) == Some(&handle) {
            self.commit(Record::AbandonChunk { inode: ino, handle }, now_ms)?;
        }
        Ok(())
    }

    /// Records replicas that acknowledged a command (bump, finalize) with their report.
    pub fn record_replicas(
        &mut self,
        handle: ChunkHandle,
        acks: &[(ChunkserverId, ReplicaReport)],
    ) {
        let Some(info) = self.chunks.get_mut(handle) else {
            return;
        };
        for (id, rep) in acks {
            let Some(idx) = server_index(*id) else {
                continue;
            };
            info.record_report(idx, rep);
            self.acks += 1;
            if let Some(cs) = self.registry.get_mut(*id) {
                cs.replicas.insert(handle);
                cs.acked.insert(handle, self.acks);
            }
        }
    }

    /// The acknowledgement clock now. Every command answer recorded so far has a
    /// clock at most this; a report the chunkserver built after hearing something the
    /// master sent once it read this mark (a heartbeat reply, see `server.rs`) covers
    /// them all: those commands had run by then.
    pub fn ack_mark(&self) -> u64 {
        self.acks
    }

    /// Renews every lease `client` holds.
    pub fn renew(&mut self, client: ClientId, now_ms: u64) -> usize {
        self.leases.renew_client(client, now_ms)
    }
}
