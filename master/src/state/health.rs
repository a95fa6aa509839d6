//! Replica health as methods of [`MasterState`]: corruption reports (hints to verify,
//! then verified results), the health worker's pass (prune, plan, queue; the rules are
//! in [`crate::health`]), trash purging, and the fsck and cluster reports.

use super::{MasterState, Record};
use crate::chunk_table::server_index;
use crate::error::Result;
use crate::health::{self, Action, CorruptHint, Ignored, Pruned, Verified};
use crate::namespace::{self, join, FileMeta, InodeKind, WriteState, ROOT};
use crate::trash;
use rand::Rng;
use stampfs_proto::{
    ChunkHandle, ChunkProblem, ChunkVersion, ChunkserverId, ChunkserverState, ChunkserverStatus,
    ClusterReport, FileHealth, FileState, FsckReport, HealthCounts, InodeId, Verification,
};

/// Most files listed in one fsck reply (the totals always cover everything).
pub const MAX_FSCK_FILES: usize = 10_000;

/// What a corruption report did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CorruptReport {
    /// The replica left the chunk's replica list; it is replaced, then deleted.
    Excluded { version: ChunkVersion },
    /// Already known corrupt.
    AlreadyMarked,
    /// The chunkserver no longer holds it (it moved it aside itself).
    Gone,
    /// No such chunk.
    UnknownChunk,
}

impl MasterState {
    /// A `ReportCorrupt` names `server`'s replica of `handle`: never acted on as such
    /// (anyone can send one), but the replica's chunkserver may be asked to verify it.
    pub fn corrupt_hint(
        &mut self,
        handle: ChunkHandle,
        server: ChunkserverId,
        now_ms: u64,
    ) -> CorruptHint {
        let Some(info) = self.chunks.get(handle) else {
            return CorruptHint::UnknownChunk;
        };
        let Some(cs) = self.registry.get(server) else {
            return CorruptHint::NotAReplica;
        };
        if !cs.replicas.contains(&handle) {
            return CorruptHint::NotAReplica;
        }
        let Some(version) = info.replica(server).map(|r| r.version) else {
            return if self.health.corrupt_of(handle).any(|(s, _)| s == server) {
                CorruptHint::AlreadyMarked
            } else {
                CorruptHint::NotAReplica
            };
        };
        if !cs.is_live(now_ms, self.settings.dead_after_ms) {
            return CorruptHint::NotLive;
        }
        let addr = cs.addr.clone();
        match self
            .health
            .begin_verify(handle, server, &addr, version, now_ms)
        {
            Ok(()) => CorruptHint::Verify { addr, version },
            Err(why) => CorruptHint::Refused(why),
        }
    }

    /// The chunkserver answered the verification of its replica of `handle`: a clean
    /// replica stays; a corrupt or absent one is excluded ([`Self::report_corrupt`]).
    /// An answer that may not be about the replica asked about (another chunkserver at
    /// that address, the replica at another version since, a `Corrupt` naming another
    /// version: [`health::judge_answer`]) changes nothing but ending the verification.
    pub fn verified(
        &mut self,
        handle: ChunkHandle,
        server: ChunkserverId,
        found: &Verification,
    ) -> Verified {
        let Some(asked) = self.health.finish_verify(handle, server) else {
            return Verified::Ignored(Ignored::NotAsked);
        };
        if let Err(why) = health::judge_answer(self, handle, server, &asked, found) {
            return Verified::Ignored(why);
        }
        match found {
            Verification::Clean { .. } => Verified::Clean,
            Verification::Corrupt { .. } => Verified::Corrupt(self.report_corrupt(handle, server)),
            Verification::Absent => Verified::Absent(self.report_corrupt(handle, server)),
        }
    }

    /// The verification of `server`'s replica of `handle` got no answer: nothing
    /// changes (the replica is not verified again within the interval).
    pub fn verify_failed(&mut self, handle: ChunkHandle, server: ChunkserverId) {
        self.health.end_verify(handle, server);
    }

    /// `server`'s replica of `handle` is known corrupt (its chunkserver verified it so):
    /// it is never handed out again; re-replication replaces it and, if its chunkserver
    /// still holds it, it is deleted afterwards.
    pub fn report_corrupt(&mut self, handle: ChunkHandle, server: ChunkserverId) -> CorruptReport {
        let Some(info) = self.chunks.get_mut(handle) else {
            return CorruptReport::UnknownChunk;
        };
        let held = self
            .registry
            .get(server)
            .is_some_and(|cs| cs.replicas.contains(&handle));
        if !held {
            return CorruptReport::Gone;
        }
        let Some(version) = info.replica(server).map(|r| r.version) else {
            return CorruptReport::AlreadyMarked;
        };
        if let Some(idx) = server_index(server) {
            info.remove_replica(idx);
        }
        if self.health.mark_corrupt(handle, server, version) {
            CorruptReport::Excluded { version }
        } else {
            CorruptReport::AlreadyMarked
        }
    }

    /// One pass of the health worker in one piece: forgets what finished or was lost,
    /// decides, and queues the commands (the worker runs it in slices instead,
    /// [`Self::health_step`]). Returns what it pruned and decided (for logging; trash
    /// purges are left to the caller, which logs them as records).
    pub fn health_pass<R: Rng + ?Sized>(
        &mut self,
        now_ms: u64,
        wall_ms: u64,
        rng: &mut R,
    ) -> (Pruned, Vec<Action>) {
        let pruned = health::prune(
            &mut self.health,
            &self.chunks,
            &self.registry,
            &self.settings,
            now_ms,
        );
        let actions = health::plan(self, now_ms, wall_ms, rng);
        self.health.record(&actions, now_ms);
        (pruned, actions)
    }

    /// One slice of a health pass: on its first step it forgets what finished or was
    /// lost (on later steps, the copies only: [`health::prune_copies`]), then decides on at most `budget` units of work from where `pass` stopped
    /// ([`health::Pass::step`]) and queues the commands, all under the caller's one
    /// hold of the state. Returns what it pruned and decided, as [`Self::health_pass`].
    pub fn health_step<R: Rng + ?Sized>(
        &mut self,
        pass: &mut health::Pass,
        now_ms: u64,
        wall_ms: u64,
        rng: &mut R,
        budget: usize,
    ) -> (Pruned, Vec<Action>) {
        let pruned = if pass.steps == 0 {
            health::prune(
                &mut self.health,
                &self.chunks,
                &self.registry,
                &self.settings,
                now_ms,
            )
        } else {
            health::prune_copies(
                &mut self.health,
                &self.chunks,
                &self.registry,
                &self.settings,
                now_ms,
            )
        };
        let actions = pass.step(self, now_ms, wall_ms, rng, budget);
        self.health.record(&actions, now_ms);
        (pruned, actions)
    }

    /// Deletes the trash entry `/.trash/<name>` (a checkpoint `<user>/<ms>`, or an
    /// entry of the flat layout) for good, if it expired by `mtime_ms` (the wall
    /// clock); false when it is gone already or not due.
    pub fn purge_trash(&mut self, name: &str, now_ms: u64, mtime_ms: u64) -> Result<bool> {
        let path = format!("/{}/{name}", trash::DIR);
        let comps = crate::namespace::components(&path)?;
        let Ok((parent, last)) = self.ns.resolve_parent(&comps) else {
            return Ok(false);
        };
        let Some(ino) = self.ns.child(parent, last) else {
            return Ok(false);
        };
        let at = match comps.as_slice() {
            [_, _, bucket] => trash::checkpoint_at(bucket),
            [_, entry] => {
                trash::deleted_at(entry).or_else(|| self.ns.get(ino).map(|i| i.mtime_ms()))
            }
            _ => None,
        };
        if !at.is_some_and(|at| trash::expired(at, self.settings.trash_ms, mtime_ms)) {
            return Ok(false);
        }
        self.commit(
            Record::Delete {
                parent,
                name: last.to_string(),
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(true)
    }

    /// Turns `/.trash/<user>/Current` into the checkpoint named by `wall_ms` (the next
    /// free millisecond); the name, or `None` when there is no `Current`.
    pub fn checkpoint_trash(
        &mut self,
        user: &str,
        now_ms: u64,
        wall_ms: u64,
    ) -> Result<Option<String>> {
        // The trash's own mode first (it opens once the older flat entries expired).
        self.trash_dir(now_ms, wall_ms)?;
        let Some(dir) = self
            .ns
            .child(ROOT, trash::DIR)
            .and_then(|bin| self.ns.child(bin, user))
        else {
            return Ok(None);
        };
        if self.ns.child(dir, trash::CURRENT).is_none() {
            return Ok(None);
        }
        let mut at = wall_ms;
        while self.ns.child(dir, &trash::checkpoint_name(at)).is_some() {
            at += 1;
        }
        let name = trash::checkpoint_name(at);
        self.commit(
            Record::Rename {
                src_parent: dir,
                src_name: trash::CURRENT.to_string(),
                dst_parent: dir,
                dst_name: name.clone(),
                mtime_ms: wall_ms,
            },
            now_ms,
        )?;
        Ok(Some(name))
    }

    /// Health of one file: its counts and its unhealthy chunks.
    fn file_health(&self, f: &FileMeta, now_ms: u64) -> (HealthCounts, Vec<ChunkProblem>) {
        let mut c = HealthCounts {
            files: 1,
            chunks: f.chunks.len() as u64,
            ..HealthCounts::default()
        };
        match f.write {
            WriteState::Open { .. } => c.open_files = 1,
            WriteState::Recovering { .. } => c.recovering_files = 1,
            WriteState::Closed => {}
        }
        let mut problems = Vec::new();
        for (index, h) in f.chunks.iter().enumerate() {
            let Some(info) = self.chunks.get(*h) else {
                c.missing += 1;
                problems.push(ChunkProblem {
                    handle: *h,
                    index: index as u64,
                    version: ChunkVersion(0),
                    replication: f.replication,
                    live: 0,
                    stale: 0,
                    corrupt: 0,
                    ahead: 0,
                    missing: true,
                });
                continue;
            };
            let ex = health::examine(self, *h, info, now_ms);
            let live = ex.live.len() as u64;
            let missing = ex.missing() || self.missing_chunks.contains(h);
            // Short replicas missed bytes written under the current version: stale
            // in all but the version number.
            let (stale, corrupt, ahead) = (
                (ex.stale.len() + ex.short.len()) as u64,
                ex.corrupt.len() as u64,
                ex.ahead.len() as u64,
            );
            let under = !missing && live < u64::from(info.replication);
            c.missing += u64::from(missing);
            c.under_replicated += u64::from(under);
            c.stale_replicas += stale;
            c.corrupt_replicas += corrupt;
            c.ahead_replicas += ahead;
            if !missing && !under && stale == 0 && corrupt == 0 && ahead == 0 {
                c.healthy += 1;
            } else {
                problems.push(ChunkProblem {
                    handle: *h,
                    index: index as u64,
                    version: info.version,
                    replication: info.replication,
                    live,
                    stale,
                    corrupt,
                    ahead,
                    missing,
                });
            }
        }
        (c, problems)
    }

    /// `fsck`: replica health of every file under `path` (`/` when absent).
    pub fn fsck(&self, path: Option<&str>, now_ms: u64) -> Result<FsckReport> {
        let comps = namespace::components(path.unwrap_or("/"))?;
        let root_path = join(&comps);
        let root = self.ns.resolve(&comps)?;
        let mut total = HealthCounts::default();
        let mut files = Vec::new();
        let mut truncated = false;
        let mut stack: Vec<(InodeId, String)> = vec![(root, root_path.clone())];
        while let Some((ino, p)) = stack.pop() {
            let Some(inode) = self.ns.get(ino) else {
                continue;
            };
            match &inode.kind {
                InodeKind::Dir(d) => {
                    for (name, child) in d.children.iter().rev() {
                        let cp = if p == "/" {
                            format!("/{name}")
                        } else {
                            format!("{p}/{name}")
                        };
                        stack.push((*child, cp));
                    }
                }
                InodeKind::File(f) => {
                    let (c, problems) = self.file_health(f, now_ms);
                    add(&mut total, &c);
                    let healthy = problems.is_empty();
                    if healthy && f.write == WriteState::Closed {
                        continue;
                    }
                    if files.len() >= MAX_FSCK_FILES {
                        truncated = true;
                        continue;
                    }
                    files.push(FileHealth {
                        path: p,
                        state: match f.write {
                            WriteState::Closed => FileState::Closed,
                            WriteState::Open { .. } => FileState::Open,
                            WriteState::Recovering { .. } => FileState::Recovering,
                        },
                        length: self.file_length(f),
                        replication: f.replication,
                        healthy,
                        counts: c,
                        problems,
                    });
                }
                // A link holds no chunks: nothing to be healthy or not.
                InodeKind::Symlink(_) => {}
            }
        }
        Ok(FsckReport {
            path: root_path,
            healthy: total.healthy == total.chunks,
            total,
            files,
            truncated,
            orphan_replicas: self.orphan_replicas(),
            replications_in_flight: self.health.copies().len() as u64,
        })
    }

    fn orphan_replicas(&self) -> u64 {
        self.registry.iter().map(|c| c.orphans.len() as u64).sum()
    }

    /// `admin report`: every chunkserver ever registered, and chunk totals by health.
    pub fn cluster_report(&self, now_ms: u64) -> ClusterReport {
        let dead_after = self.settings.dead_after_ms;
        let mut ids: Vec<ChunkserverId> = self.servers.keys().copied().collect();
        ids.extend(self.registry.iter().map(|c| c.id));
        ids.sort();
        ids.dedup();
        let chunkservers = ids
            .into_iter()
            .map(|id| match self.registry.get(id) {
                Some(cs) => ChunkserverStatus {
                    id,
                    addr: cs.addr.clone(),
                    state: if cs.is_live(now_ms, dead_after) {
                        ChunkserverState::Live
                    } else {
                        ChunkserverState::Dead
                    },
                    last_heartbeat_ms_ago: Some(now_ms.saturating_sub(cs.last_heartbeat_ms)),
                    capacity: cs.capacity,
                    used: cs.used,
                    replicas: (cs.replicas.len() + cs.orphans.len()) as u64,
                    active_streams: cs.active_streams,
                    queued_commands: self.health.queued(id) as u64,
                    decommission: self.decommission_state(id, now_ms),
                },
                None => ChunkserverStatus {
                    id,
                    addr: self.servers.get(&id).cloned().unwrap_or_default(),
                    state: ChunkserverState::Dead,
                    last_heartbeat_ms_ago: None,
                    capacity: 0,
                    used: 0,
                    replicas: 0,
                    active_streams: 0,
                    queued_commands: self.health.queued(id) as u64,
                    decommission: self.decommission_state(id, now_ms),
                },
            })
            .collect();
        let mut chunks = HealthCounts::default();
        for (_, inode) in self.ns.iter() {
            if let Some(f) = inode.as_file() {
                add(&mut chunks, &self.file_health(f, now_ms).0);
            }
        }
        ClusterReport {
            chunkservers,
            chunks,
            orphan_replicas: self.orphan_replicas(),
            replications_in_flight: self.health.copies().len() as u64,
            masters: None,
            safe_mode: self.safe_mode.status(self.settings.safe_mode, now_ms),
            balancer: crate::health::balance::Balancer::status(self.balancer.as_ref()),
        }
    }
}

fn add(total: &mut HealthCounts, c: &HealthCounts) {
    total.files += c.files;
    total.chunks += c.chunks;
    total.healthy += c.healthy;
    total.under_replicated += c.under_replicated;
    total.missing += c.missing;
    total.stale_replicas += c.stale_replicas;
    total.corrupt_replicas += c.corrupt_replicas;
    total.ahead_replicas += c.ahead_replicas;
    total.open_files += c.open_files;
    total.recovering_files += c.recovering_files;
}
