//! The health worker's soft state ([`Tracker`]: corrupt marks, verifications, commands
//! in flight, orphans first seen, per-chunkserver command queues) and [`prune`], which
//! forgets what finished or was lost.

use super::{
    is_live, Action, Asked, VerifyRefusal, MAX_QUEUED_PER_SERVER, MAX_VERIFIES_PER_SERVER,
    MAX_VERIFYING_PER_SERVER, VERIFY_INTERVAL_MS,
};
use crate::chunk_table::ChunkTable;
use crate::registry::Registry;
use crate::state::Settings;
use stampfs_proto::{ChunkCommand, ChunkHandle, ChunkVersion, ChunkserverId, ReplicaState};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// A re-replication ordered and not yet confirmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copy {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
    pub source: ChunkserverId,
    pub target: ChunkserverId,
    pub started_ms: u64,
}

/// A deletion or finalize ordered and not yet confirmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Pending {
    pub(super) command: ChunkCommand,
    pub(super) since_ms: u64,
}

impl Pending {
    pub(super) fn is_delete(&self) -> bool {
        matches!(self.command, ChunkCommand::Delete { .. })
    }
}

/// A verification of a replica reported corrupt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Check {
    asked: Asked,
    /// Still waiting for the chunkserver's answer.
    running: bool,
}

/// The health worker's soft state: corrupt replicas, verifications, commands in
/// flight, orphans first seen, and the per-chunkserver command queues. Lost on restart,
/// which only makes the next master re-decide from fresh reports.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Replicas verified corrupt: `(chunk, chunkserver)` → the replica's version then.
    pub(super) corrupt: BTreeMap<(ChunkHandle, ChunkserverId), ChunkVersion>,
    /// Verifications of reported replicas started within [`VERIFY_INTERVAL_MS`] (or
    /// still running): at most [`MAX_VERIFIES_PER_SERVER`] per chunkserver.
    pub(super) checks: HashMap<(ChunkHandle, ChunkserverId), Check>,
    /// Re-replications ordered and not yet confirmed.
    pub(super) copies: Vec<Copy>,
    /// Deletions and finalizes ordered and not yet confirmed.
    pub(super) pending: HashMap<(ChunkserverId, ChunkHandle), Pending>,
    /// Deletions in `pending`, per chunkserver (kept with it, so a pass slice checks
    /// the per-server cap without counting the whole map).
    pending_deletes: HashMap<ChunkserverId, usize>,
    /// When each orphan replica was first reported (master clock).
    pub(super) orphans_seen: HashMap<(ChunkserverId, ChunkHandle), u64>,
    /// Commands for each chunkserver's next heartbeat reply.
    pub(super) outbox: HashMap<ChunkserverId, VecDeque<ChunkCommand>>,
    /// Chunks a balancer's copy was ordered for, and the chunkserver the move came
    /// from: its replica is the surplus to delete once the copy is reported.
    moved_from: HashMap<ChunkHandle, ChunkserverId>,
}

impl Tracker {
    /// Marks `server`'s replica of `handle` (at `version`) corrupt; false when it was
    /// already marked.
    pub fn mark_corrupt(
        &mut self,
        handle: ChunkHandle,
        server: ChunkserverId,
        version: ChunkVersion,
    ) -> bool {
        self.corrupt.insert((handle, server), version).is_none()
    }

    /// Corrupt replicas of `handle`: `(chunkserver, version)`.
    pub fn corrupt_of(
        &self,
        handle: ChunkHandle,
    ) -> impl Iterator<Item = (ChunkserverId, ChunkVersion)> + '_ {
        self.corrupt
            .range((handle, ChunkserverId(0))..=(handle, ChunkserverId(u64::MAX)))
            .map(|((_, s), v)| (*s, *v))
    }

    /// Whether a report of `server`'s replica of `handle` at `version` is the replica
    /// marked corrupt (a newer one, e.g. a fresh copy, is not).
    pub fn is_corrupt(
        &self,
        handle: ChunkHandle,
        server: ChunkserverId,
        version: ChunkVersion,
    ) -> bool {
        self.corrupt
            .get(&(handle, server))
            .is_some_and(|v| version <= *v)
    }

    /// Forgets the corrupt mark of `server`'s replica of `handle`.
    pub fn clear_corrupt(&mut self, handle: ChunkHandle, server: ChunkserverId) -> bool {
        self.corrupt.remove(&(handle, server)).is_some()
    }

    /// Forgets marks of replicas `server` no longer reports.
    pub fn retain_corrupt_reported(
        &mut self,
        server: ChunkserverId,
        reported: impl Fn(ChunkHandle) -> bool,
    ) {
        self.corrupt
            .retain(|(h, s), _| *s != server || reported(*h));
    }

    /// Corrupt replicas marked, cluster-wide.
    pub fn corrupt_count(&self) -> usize {
        self.corrupt.len()
    }

    /// A report names `server`'s replica of `handle` corrupt: starts tracking a
    /// verification of it (the request goes to `addr`, about the replica at `version`),
    /// or says why none starts now.
    pub fn begin_verify(
        &mut self,
        handle: ChunkHandle,
        server: ChunkserverId,
        addr: &str,
        version: ChunkVersion,
        now_ms: u64,
    ) -> Result<(), VerifyRefusal> {
        if let Some(c) = self.checks.get(&(handle, server)) {
            if c.running {
                return Err(VerifyRefusal::Running);
            }
            let ago_ms = now_ms.saturating_sub(c.asked.started_ms);
            if ago_ms < VERIFY_INTERVAL_MS {
                return Err(VerifyRefusal::Recent { ago_ms });
            }
        }
        // Finished checks matter only within the interval (this keeps the map small
        // even when the health worker, which also prunes it, is off).
        self.checks.retain(|_, c| {
            c.running || now_ms.saturating_sub(c.asked.started_ms) < VERIFY_INTERVAL_MS
        });
        let (mut running, mut started) = (0usize, 0usize);
        for ((_, s), c) in &self.checks {
            if *s != server {
                continue;
            }
            running += usize::from(c.running);
            started += usize::from(now_ms.saturating_sub(c.asked.started_ms) < VERIFY_INTERVAL_MS);
        }
        if running >= MAX_VERIFYING_PER_SERVER || started >= MAX_VERIFIES_PER_SERVER {
            return Err(VerifyRefusal::Busy);
        }
        self.checks.insert(
            (handle, server),
            Check {
                asked: Asked {
                    addr: addr.to_string(),
                    version,
                    started_ms: now_ms,
                },
                running: true,
            },
        );
        Ok(())
    }

    /// The verification of `server`'s replica of `handle` ended (whatever it found);
    /// the replica is not verified again within [`VERIFY_INTERVAL_MS`] of its start.
    /// Returns what was asked; `None` when none was running.
    pub fn finish_verify(&mut self, handle: ChunkHandle, server: ChunkserverId) -> Option<Asked> {
        match self.checks.get_mut(&(handle, server)) {
            Some(c) if c.running => {
                c.running = false;
                Some(c.asked.clone())
            }
            _ => None,
        }
    }

    /// [`Tracker::finish_verify`], when what was asked does not matter (no answer came).
    /// False when none was running.
    pub fn end_verify(&mut self, handle: ChunkHandle, server: ChunkserverId) -> bool {
        self.finish_verify(handle, server).is_some()
    }

    /// Verifications running on `server`.
    pub fn verifying(&self, server: ChunkserverId) -> usize {
        self.checks
            .iter()
            .filter(|((_, s), c)| *s == server && c.running)
            .count()
    }

    /// A chunk was deleted: orders the deletion of every replica the master knew
    /// (`(chunkserver, version)`) and forgets the chunk's marks and copies. The
    /// commands only leave once the deletion is durable (the heartbeat waits).
    pub fn forget_chunk(
        &mut self,
        handle: ChunkHandle,
        max_version: ChunkVersion,
        replicas: &[ChunkserverId],
    ) {
        self.moved_from.remove(&handle);
        let marked: Vec<ChunkserverId> = self.corrupt_of(handle).map(|(s, _)| s).collect();
        for s in &marked {
            self.corrupt.remove(&(handle, *s));
        }
        let mut servers: Vec<ChunkserverId> = replicas.to_vec();
        servers.extend(marked);
        servers.sort();
        servers.dedup();
        for s in servers {
            self.remove_pending(s, handle);
            self.enqueue(
                s,
                ChunkCommand::Delete {
                    handle,
                    max_version,
                },
            );
        }
        let dropped: Vec<Copy> = self
            .copies
            .iter()
            .filter(|c| c.handle == handle)
            .cloned()
            .collect();
        for c in dropped {
            self.drop_copy(&c);
        }
    }

    /// `server` registered again (it restarted, or the master asked it to): the
    /// commands already delivered to it may have died with the process (a deletion
    /// waiting in its paced queue, a copy it was sending or receiving). Forgets them,
    /// so the next pass re-decides from the fresh report it just sent instead of
    /// waiting out `--replication-timeout`. Commands still queued for its next
    /// heartbeat stay. Every command is idempotent and bounded by a version, so one
    /// that did run and is ordered again changes nothing.
    pub fn forget_server(&mut self, server: ChunkserverId) {
        let queued: Vec<ChunkCommand> = self
            .outbox
            .get(&server)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default();
        self.pending
            .retain(|(s, _), p| *s != server || queued.contains(&p.command));
        let deletes = self
            .pending
            .iter()
            .filter(|((s, _), p)| *s == server && p.is_delete())
            .count();
        self.set_pending_deletes(server, deletes);
        let lost: Vec<Copy> = self
            .copies
            .iter()
            .filter(|c| {
                c.target == server
                    || (c.source == server
                        && !queued.iter().any(|cmd| {
                            matches!(cmd, ChunkCommand::Replicate { handle, version, target }
                                if *handle == c.handle && *version == c.version && target.id == c.target)
                        }))
            })
            .cloned()
            .collect();
        for c in lost {
            self.drop_copy(&c);
            // A balancer's move that failed moves nothing: its source's replica
            // stays like any other.
            self.moved_from.remove(&c.handle);
        }
    }

    /// Queues `cmd` for `server` unless the same command is already queued.
    pub fn enqueue(&mut self, server: ChunkserverId, cmd: ChunkCommand) -> bool {
        let q = self.outbox.entry(server).or_default();
        if q.len() >= MAX_QUEUED_PER_SERVER || q.contains(&cmd) {
            return false;
        }
        q.push_back(cmd);
        true
    }

    /// Takes up to `max` queued commands for `server`.
    pub fn take_commands(&mut self, server: ChunkserverId, max: usize) -> Vec<ChunkCommand> {
        let Some(q) = self.outbox.get_mut(&server) else {
            return Vec::new();
        };
        let n = q.len().min(max);
        let out: Vec<ChunkCommand> = q.drain(..n).collect();
        if q.is_empty() {
            self.outbox.remove(&server);
        }
        out
    }

    /// Commands queued for `server`.
    pub fn queued(&self, server: ChunkserverId) -> usize {
        self.outbox.get(&server).map_or(0, VecDeque::len)
    }

    /// Re-replications in flight.
    pub fn copies(&self) -> &[Copy] {
        &self.copies
    }

    /// Whether a deletion of `server`'s replica of `handle` is in flight.
    pub fn deleting(&self, server: ChunkserverId, handle: ChunkHandle) -> bool {
        self.pending
            .get(&(server, handle))
            .is_some_and(Pending::is_delete)
    }

    /// When the orphan `handle` on `server` was first reported.
    pub fn orphan_seen(&self, server: ChunkserverId, handle: ChunkHandle) -> Option<u64> {
        self.orphans_seen.get(&(server, handle)).copied()
    }

    /// Deletions ordered on `server` and not yet confirmed.
    pub fn pending_deletes(&self, server: ChunkserverId) -> usize {
        self.pending_deletes.get(&server).copied().unwrap_or(0)
    }

    fn insert_pending(&mut self, server: ChunkserverId, handle: ChunkHandle, p: Pending) {
        let delete = p.is_delete();
        if let Some(old) = self.pending.insert((server, handle), p) {
            if old.is_delete() {
                self.add_pending_deletes(server, -1);
            }
        }
        if delete {
            self.add_pending_deletes(server, 1);
        }
    }

    fn remove_pending(&mut self, server: ChunkserverId, handle: ChunkHandle) -> Option<Pending> {
        let p = self.pending.remove(&(server, handle))?;
        if p.is_delete() {
            self.add_pending_deletes(server, -1);
        }
        Some(p)
    }

    fn add_pending_deletes(&mut self, server: ChunkserverId, by: isize) {
        let n = self.pending_deletes(server).saturating_add_signed(by);
        self.set_pending_deletes(server, n);
    }

    fn set_pending_deletes(&mut self, server: ChunkserverId, n: usize) {
        if n == 0 {
            self.pending_deletes.remove(&server);
        } else {
            self.pending_deletes.insert(server, n);
        }
    }

    fn unqueue(&mut self, server: ChunkserverId, cmd: &ChunkCommand) {
        if let Some(q) = self.outbox.get_mut(&server) {
            q.retain(|c| c != cmd);
        }
    }

    fn drop_copy(&mut self, c: &Copy) {
        let target = c.target;
        self.copies.retain(|x| x != c);
        if let Some(q) = self.outbox.get_mut(&c.source) {
            q.retain(|cmd| {
                !matches!(cmd, ChunkCommand::Replicate { handle, version, target: t }
                    if *handle == c.handle && *version == c.version && t.id == target)
            });
        }
    }

    /// The chunkserver a balancer's move of `handle` came from, while its replica
    /// has not been deleted.
    pub fn moved_from(&self, handle: ChunkHandle) -> Option<ChunkserverId> {
        self.moved_from.get(&handle).copied()
    }

    /// Queues the commands of `actions` and tracks them until they are confirmed.
    pub fn record(&mut self, actions: &[Action], now_ms: u64) {
        for a in actions {
            let Some((server, cmd)) = a.command() else {
                continue;
            };
            if !self.enqueue(server, cmd.clone()) {
                continue;
            }
            match a {
                Action::Replicate {
                    handle,
                    version,
                    source,
                    target,
                    moving_from,
                    ..
                } => {
                    self.copies.push(Copy {
                        handle: *handle,
                        version: *version,
                        source: *source,
                        target: target.id,
                        started_ms: now_ms,
                    });
                    if let Some(from) = moving_from {
                        self.moved_from.insert(*handle, *from);
                    }
                }
                Action::Delete { handle, .. } | Action::Finalize { handle, .. } => {
                    if matches!(a, Action::Delete { server: s, .. } if self.moved_from.get(handle) == Some(s))
                    {
                        self.moved_from.remove(handle);
                    }
                    self.insert_pending(
                        server,
                        *handle,
                        Pending {
                            command: cmd,
                            since_ms: now_ms,
                        },
                    );
                }
                Action::PurgeTrash { .. } | Action::CheckpointTrash { .. } => {}
            }
        }
    }
}

/// What [`prune`] found finished or lost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Copies the target confirmed.
    pub copied: Vec<Copy>,
    /// Copies dropped to be ordered again, with why.
    pub lost: Vec<(Copy, &'static str)>,
    /// Deletions and finalizes that were not confirmed in time.
    pub expired: usize,
}

/// Forgets the copies that completed or were lost (timed out, the chunk changed, or a
/// side died): what [`prune`] does first, and all that a later slice of a health pass
/// does, so a long pass neither counts finished copies against the stream caps nor
/// leaves lost ones unreplaced until the next pass. Costs one look per copy in flight
/// (bounded by the stream caps).
pub fn prune_copies(
    tracker: &mut Tracker,
    chunks: &ChunkTable,
    registry: &Registry,
    settings: &Settings,
    now_ms: u64,
) -> Pruned {
    let mut out = Pruned::default();
    let dead_after = settings.dead_after_ms;
    let timeout = settings.replication_timeout_ms;
    for c in tracker.copies.clone() {
        let info = chunks.get(c.handle);
        let done = info
            .and_then(|i| i.replica(c.target))
            .is_some_and(|r| r.version >= c.version);
        let why = if done {
            None
        } else if info.is_none_or(|i| i.version != c.version) {
            Some("the chunk changed or was deleted")
        } else if !is_live(registry, c.source, now_ms, dead_after) {
            Some("the source died")
        } else if !is_live(registry, c.target, now_ms, dead_after) {
            Some("the target died")
        } else if now_ms.saturating_sub(c.started_ms) >= timeout {
            Some("it timed out")
        } else {
            continue;
        };
        tracker.drop_copy(&c);
        match why {
            None => out.copied.push(c),
            Some(why) => {
                tracker.moved_from.remove(&c.handle);
                out.lost.push((c, why))
            }
        }
    }
    out
}

/// Forgets commands that completed (the chunkserver's report shows the result) or
/// were lost (timed out, or a side died), and notes orphans first reported now.
pub fn prune(
    tracker: &mut Tracker,
    chunks: &ChunkTable,
    registry: &Registry,
    settings: &Settings,
    now_ms: u64,
) -> Pruned {
    let mut out = prune_copies(tracker, chunks, registry, settings, now_ms);
    let timeout = settings.replication_timeout_ms;
    let mut orphans: HashSet<(ChunkserverId, ChunkHandle)> = HashSet::new();
    for cs in registry.iter() {
        for o in &cs.orphans {
            orphans.insert((cs.id, o.handle));
            tracker
                .orphans_seen
                .entry((cs.id, o.handle))
                .or_insert(now_ms);
        }
    }
    tracker.orphans_seen.retain(|k, _| orphans.contains(k));
    // Verifications: a finished one is remembered for the interval. A running one ends
    // within the replication timeout (plus a connect timeout) in the service; one still
    // marked running well past that lost its task, and is forgotten.
    let stuck_after = timeout.max(VERIFY_INTERVAL_MS).saturating_mul(2);
    tracker.checks.retain(|_, c| {
        let age = now_ms.saturating_sub(c.asked.started_ms);
        if c.running {
            age < stuck_after
        } else {
            age < VERIFY_INTERVAL_MS
        }
    });
    let mut expired = Vec::new();
    for ((server, handle), p) in &tracker.pending {
        let still = match p.command {
            // A replica raised above the bound is kept by its chunkserver: nothing more
            // will happen (a new decision may order another deletion).
            ChunkCommand::Delete { max_version, .. } => {
                let raised = chunks
                    .get(*handle)
                    .and_then(|i| i.replica(*server))
                    .is_some_and(|r| r.version > max_version);
                !raised
                    && (registry
                        .get(*server)
                        .is_some_and(|cs| cs.replicas.contains(handle))
                        || orphans.contains(&(*server, *handle)))
            }
            _ => chunks
                .get(*handle)
                .and_then(|i| i.replica(*server))
                .is_some_and(|r| r.state == ReplicaState::Writing),
        };
        if !still {
            expired.push((*server, *handle, false));
        } else if now_ms.saturating_sub(p.since_ms) >= timeout {
            expired.push((*server, *handle, true));
        }
    }
    for (server, handle, late) in expired {
        if let Some(p) = tracker.remove_pending(server, handle) {
            if late {
                tracker.unqueue(server, &p.command);
                out.expired += 1;
            }
        }
    }
    out
}
