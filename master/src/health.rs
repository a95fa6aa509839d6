//! Replica health (DESIGN.md invariant 4): the decisions that keep every chunk at its
//! replication factor with up-to-date, uncorrupted replicas, and reclaim replicas
//! nobody needs.
//!
//! The health worker calls [`prune`] (which forgets commands that completed or were
//! lost), then [`plan`] (a pure function of the master's state and the time that
//! returns [`Action`]s), then [`Tracker::record`], which queues each action's command
//! for its chunkserver. The heartbeat handler hands queued commands out, signed, in
//! the chunkserver's next `HeartbeatReply`, after waiting until the log is durable up
//! to the state they were decided on.
//!
//! The rules:
//! - **Stale replicas** (below the master's version) are never handed out (see
//!   `MasterState::locations`), are deleted with `Delete { max_version: their version }`
//!   (a replica raised meanwhile is kept), and leave their chunk under-replicated. A
//!   chunk with no live up-to-date replica (missing) keeps its stale ones: they may be
//!   all that is left of it.
//! - **Short replicas** (at the master's version but reported shorter than the
//!   committed length: a bump that reached a chunkserver after the master gave up on
//!   it, so it missed the bytes written under that version) are never handed out,
//!   copied from or counted as up to date, and are deleted like corrupt ones (once the
//!   chunk has enough good replicas, or when their chunkserver is the only place left
//!   for a new copy).
//! - **Replicas above the master's version** mean invariant 1 was broken: they are
//!   logged as errors at every report, never handed out, copied, counted or deleted;
//!   fsck shows them.
//! - **Re-replication**: a chunk with fewer live up-to-date replicas than its
//!   replication factor is queued by priority (a single live replica first, then by
//!   how many are missing) and copied, under the same version, from a live finalized
//!   replica to a live chunkserver holding no replica of it (placement rules: most
//!   free space first, random among near-equals); at most `--max-replication-streams`
//!   copies per chunkserver, as source or target. Copies are tracked until the target
//!   reports the replica; one that takes longer than `--replication-timeout`, or whose
//!   source or target dies, is dropped and ordered again.
//! - **Over-replication**: surplus up-to-date replicas are deleted from the fullest
//!   chunkservers (never while a copy of the chunk is in flight).
//! - **Corruption reports are hints**: a `ReportCorrupt` (from a reader, or from the
//!   chunkserver's own read path or scrub: the master cannot tell them apart) changes
//!   nothing by itself. The master asks the replica's chunkserver to verify the replica
//!   now (a signed `VerifyReplica`: every block read and checked, as the scrub does),
//!   at most one verification per replica at a time, none within
//!   [`VERIFY_INTERVAL_MS`] of the last one, at most [`MAX_VERIFYING_PER_SERVER`]
//!   running and [`MAX_VERIFIES_PER_SERVER`] started per interval on one chunkserver
//!   ([`Tracker::begin_verify`]). A clean replica stays; one found corrupt (moved aside
//!   by its chunkserver) or absent is treated as below. So a buggy or hostile client
//!   can cost a few bounded reads, never a good replica. The answer counts only if it
//!   can be about the replica asked about ([`judge_answer`]): the same chunkserver
//!   still registered at the address asked (no other one there), the replica still at
//!   the version asked about, and a `Corrupt` answer naming that version; otherwise it
//!   is ignored, and the chunk reports and the chunkserver's scrub remain the safety
//!   net.
//! - **Corruption**: a replica verified corrupt leaves the replica list at once
//!   ([`Tracker::mark_corrupt`]). A chunkserver that found it has moved it aside
//!   already; one that still holds it is told to delete it once the chunk has enough
//!   good replicas again (or when no other chunkserver could take a new one).
//! - **Writing replicas of finished chunks** (a finalize that did not arrive) are
//!   finalized at the committed length.
//! - **Deleted chunks**: the replicas the master knows are deleted as soon as the
//!   deletion is durable ([`Tracker::forget_chunk`]); replicas of chunks the master
//!   does not know (or knows only as deleted) are deleted `--orphan-grace` after they
//!   were first reported.
//! - **Trash** ([`crate::trash`]): entries older than `--trash-for` are purged.
//!
//! Only chunks of closed files and complete chunks of open files are touched: the last
//! chunk of a file that is open or in lease recovery belongs to its writer (or to the
//! recovery), and its replicas legitimately sit below a version just minted.

use crate::chunk_table::{ChunkInfo, ChunkTable, ReplicaClass};
use crate::namespace::{FileMeta, WriteState, ROOT};
use crate::placement::{self, Candidate};
use crate::registry::Registry;
use crate::state::{CorruptReport, MasterState, Settings};
use crate::trash;
use rand::Rng;
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkVersion, ChunkserverAddr, ChunkserverId, ReplicaState,
    Verification,
};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;

/// Most commands handed to one chunkserver per heartbeat reply.
pub const MAX_COMMANDS_PER_HEARTBEAT: usize = 256;
/// Most commands queued for one chunkserver; further ones wait for a later pass.
pub const MAX_QUEUED_PER_SERVER: usize = 8192;
/// Most deletions ordered and not yet confirmed per chunkserver (the master's share of
/// deletion pacing; the chunkserver paces the ones it gets).
pub const MAX_PENDING_DELETES_PER_SERVER: usize = 512;
/// A replica reported corrupt is verified at most once per this many milliseconds
/// (master clock); reports in between are ignored.
pub const VERIFY_INTERVAL_MS: u64 = 60_000;
/// Verifications running at once on one chunkserver.
pub const MAX_VERIFYING_PER_SERVER: usize = 2;
/// Verifications started on one chunkserver per [`VERIFY_INTERVAL_MS`] (so a flood of
/// reports naming many chunks cannot turn into a full-speed scrub of the server).
pub const MAX_VERIFIES_PER_SERVER: usize = 16;

/// Why a replica is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// Below the master's version.
    Stale,
    /// Reported corrupt and replaced.
    Corrupt,
    /// More up-to-date replicas than the replication factor.
    OverReplicated,
    /// A chunk the master does not know.
    Orphan,
    /// Its chunk was deleted (file removed).
    Deleted,
    /// At the master's version but shorter than the committed length.
    Short,
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeleteReason::Stale => "stale",
            DeleteReason::Corrupt => "corrupt",
            DeleteReason::OverReplicated => "over-replicated",
            DeleteReason::Orphan => "orphan",
            DeleteReason::Deleted => "deleted",
            DeleteReason::Short => "short",
        })
    }
}

/// One decision of [`plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Delete `server`'s replica of `handle` if its version is at most `max_version`.
    Delete {
        server: ChunkserverId,
        handle: ChunkHandle,
        max_version: ChunkVersion,
        reason: DeleteReason,
    },
    /// Copy the finalized replica at `version` from `source` to `target`.
    Replicate {
        handle: ChunkHandle,
        version: ChunkVersion,
        source: ChunkserverId,
        target: ChunkserverAddr,
        /// Live up-to-date replicas when the copy was ordered.
        live: usize,
        replication: u8,
    },
    /// Seal `server`'s replica, still `Writing`, of a finished chunk.
    Finalize {
        server: ChunkserverId,
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    },
    /// Delete the trash entry `/.trash/<name>` for good (a logged namespace change).
    PurgeTrash { name: String },
}

impl Action {
    /// The chunkserver and command this action sends, if it sends one.
    pub fn command(&self) -> Option<(ChunkserverId, ChunkCommand)> {
        match self {
            Action::Delete {
                server,
                handle,
                max_version,
                ..
            } => Some((
                *server,
                ChunkCommand::Delete {
                    handle: *handle,
                    max_version: *max_version,
                },
            )),
            Action::Replicate {
                handle,
                version,
                source,
                target,
                ..
            } => Some((
                *source,
                ChunkCommand::Replicate {
                    handle: *handle,
                    version: *version,
                    target: target.clone(),
                },
            )),
            Action::Finalize {
                server,
                handle,
                version,
                length,
            } => Some((
                *server,
                ChunkCommand::Finalize {
                    handle: *handle,
                    version: *version,
                    length: *length,
                },
            )),
            Action::PurgeTrash { .. } => None,
        }
    }
}

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
struct Pending {
    command: ChunkCommand,
    since_ms: u64,
}

impl Pending {
    fn is_delete(&self) -> bool {
        matches!(self.command, ChunkCommand::Delete { .. })
    }
}

/// What the master asked when it sent a `VerifyReplica`: the answer counts only for
/// this (see [`judge_answer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    /// Where the request went: the chunkserver's registered address then.
    pub addr: String,
    /// The replica's version in the chunk table then.
    pub version: ChunkVersion,
    /// When the request went (master clock).
    pub started_ms: u64,
}

/// A verification of a replica reported corrupt.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Check {
    asked: Asked,
    /// Still waiting for the chunkserver's answer.
    running: bool,
}

/// Why a corruption report does not start a verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyRefusal {
    /// One is running for this replica.
    Running,
    /// This replica was verified less than [`VERIFY_INTERVAL_MS`] ago.
    Recent { ago_ms: u64 },
    /// Its chunkserver is at [`MAX_VERIFYING_PER_SERVER`] or
    /// [`MAX_VERIFIES_PER_SERVER`].
    Busy,
}

/// What a `ReportCorrupt` (a hint, from anyone) leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CorruptHint {
    /// Ask the chunkserver at `addr` to verify its replica (at `version` as the master
    /// knows it) now; [`MasterState::verified`] or [`MasterState::verify_failed`] must
    /// follow.
    Verify { addr: String, version: ChunkVersion },
    /// No verification now (one is running, one ran recently, or the chunkserver has
    /// enough to do): the report is dropped.
    Refused(VerifyRefusal),
    /// Already known corrupt.
    AlreadyMarked,
    /// The master does not list that replica (never did, or its chunkserver no longer
    /// reports it): nothing to verify.
    NotAReplica,
    /// The chunkserver is not live: it cannot be asked, and its replicas are not handed
    /// out meanwhile anyway.
    NotLive,
    /// No such chunk.
    UnknownChunk,
}

/// What a verification's answer did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// The replica checked out: it stays.
    Clean,
    /// Its chunkserver found it corrupt (and moved it aside).
    Corrupt(CorruptReport),
    /// Its chunkserver does not hold it (moved aside earlier, or deleted).
    Absent(CorruptReport),
    /// The answer may not be about the replica that was asked about: nothing changed.
    Ignored(Ignored),
}

/// Why the answer to a verification is not acted on ([`judge_answer`]). Nothing is
/// lost: the chunkserver's chunk reports and its background scrub still find (and
/// report) a replica that is really gone or corrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// No verification of this replica is running (it was forgotten as stuck): the
    /// master no longer knows what it asked.
    NotAsked,
    /// The chunkserver is no longer registered at the address the request went to (it
    /// registered again elsewhere): whoever answered there may be another process.
    Moved,
    /// Another chunkserver, live at some time since the request went, is registered at
    /// that address (a restart under a new id, a reused port): the answer may be its.
    AddressShared { other: ChunkserverId },
    /// The master's replica is no longer at the version asked about (bumped, or
    /// reported again at another version).
    ReplicaChanged {
        asked: ChunkVersion,
        now: ChunkVersion,
    },
    /// The answer speaks of another version of the replica than the one asked about.
    OtherVersion {
        asked: ChunkVersion,
        found: ChunkVersion,
    },
    /// A clean answer about another chunk than the one asked about.
    OtherChunk { found: ChunkHandle },
}

/// The health worker's soft state: corrupt replicas, verifications, commands in
/// flight, orphans first seen, and the per-chunkserver command queues. Lost on restart,
/// which only makes the next master re-decide from fresh reports.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Replicas verified corrupt: `(chunk, chunkserver)` → the replica's version then.
    corrupt: BTreeMap<(ChunkHandle, ChunkserverId), ChunkVersion>,
    /// Verifications of reported replicas started within [`VERIFY_INTERVAL_MS`] (or
    /// still running): at most [`MAX_VERIFIES_PER_SERVER`] per chunkserver.
    checks: HashMap<(ChunkHandle, ChunkserverId), Check>,
    /// Re-replications ordered and not yet confirmed.
    copies: Vec<Copy>,
    /// Deletions and finalizes ordered and not yet confirmed.
    pending: HashMap<(ChunkserverId, ChunkHandle), Pending>,
    /// When each orphan replica was first reported (master clock).
    orphans_seen: HashMap<(ChunkserverId, ChunkHandle), u64>,
    /// Commands for each chunkserver's next heartbeat reply.
    outbox: HashMap<ChunkserverId, VecDeque<ChunkCommand>>,
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
        reported: &HashSet<ChunkHandle>,
    ) {
        self.corrupt
            .retain(|(h, s), _| *s != server || reported.contains(h));
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
        let marked: Vec<ChunkserverId> = self.corrupt_of(handle).map(|(s, _)| s).collect();
        for s in &marked {
            self.corrupt.remove(&(handle, *s));
        }
        let mut servers: Vec<ChunkserverId> = replicas.to_vec();
        servers.extend(marked);
        servers.sort();
        servers.dedup();
        for s in servers {
            self.pending.remove(&(s, handle));
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
                    ..
                } => self.copies.push(Copy {
                    handle: *handle,
                    version: *version,
                    source: *source,
                    target: target.id,
                    started_ms: now_ms,
                }),
                Action::Delete { handle, .. } | Action::Finalize { handle, .. } => {
                    self.pending.insert(
                        (server, *handle),
                        Pending {
                            command: cmd,
                            since_ms: now_ms,
                        },
                    );
                }
                Action::PurgeTrash { .. } => {}
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

fn is_live(reg: &Registry, id: ChunkserverId, now_ms: u64, dead_after_ms: u64) -> bool {
    reg.get(id)
        .is_some_and(|c| c.is_live(now_ms, dead_after_ms))
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
            Some(why) => out.lost.push((c, why)),
        }
    }
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
        if let Some(p) = tracker.pending.remove(&(server, handle)) {
            if late {
                tracker.unqueue(server, &p.command);
                out.expired += 1;
            }
        }
    }
    out
}

/// One chunk as the replica-health rules see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Examined {
    /// Replicas at the master's version on live chunkservers (corrupt ones are not in
    /// the chunk's replica list at all).
    pub live: Vec<(ChunkserverId, ReplicaState)>,
    /// Replicas below the master's version on live chunkservers.
    pub stale: Vec<(ChunkserverId, ChunkVersion)>,
    /// Replicas above the master's version (anywhere).
    pub ahead: Vec<ChunkserverId>,
    /// Replicas marked corrupt: `(chunkserver, version, still held by it)`.
    pub corrupt: Vec<(ChunkserverId, ChunkVersion, bool)>,
    /// Replicas at the master's version but shorter than the committed length, on
    /// live chunkservers.
    pub short: Vec<(ChunkserverId, ChunkVersion)>,
}

impl Examined {
    /// No live replica at the master's version.
    pub fn missing(&self) -> bool {
        self.live.is_empty()
    }
}

/// Whether the answer `found` to the verification of `server`'s replica of `handle`,
/// asked as `asked`, may be acted on. Pure. The answer came from whoever listens at
/// `asked.addr` now, and it speaks of the replica as it is now, so it counts only
/// when:
/// - `server` is still registered at `asked.addr`, and no other chunkserver registered
///   at that address was live at any time since the request went (else
///   [`Ignored::Moved`] or [`Ignored::AddressShared`]);
/// - the answer names the chunk and the version asked about ([`Ignored::OtherChunk`],
///   [`Ignored::OtherVersion`]; `Absent` names none);
/// - the master's replica is still at that version ([`Ignored::ReplicaChanged`]). A
///   replica the master no longer lists (its chunkserver stopped reporting it, or it
///   is marked corrupt already) passes: acting on it changes nothing.
pub fn judge_answer(
    st: &MasterState,
    handle: ChunkHandle,
    server: ChunkserverId,
    asked: &Asked,
    found: &Verification,
) -> Result<(), Ignored> {
    if st.registry.get(server).map(|cs| cs.addr.as_str()) != Some(asked.addr.as_str()) {
        return Err(Ignored::Moved);
    }
    let dead_after = st.settings.dead_after_ms;
    let other = st
        .registry
        .iter()
        .filter(|cs| cs.id != server && cs.addr == asked.addr)
        .filter(|cs| cs.is_live(asked.started_ms, dead_after))
        .map(|cs| cs.id)
        .min();
    if let Some(other) = other {
        return Err(Ignored::AddressShared { other });
    }
    let found_version = match found {
        Verification::Clean { replica } if replica.handle != handle => {
            return Err(Ignored::OtherChunk {
                found: replica.handle,
            });
        }
        Verification::Clean { replica } => Some(replica.version),
        Verification::Corrupt { version, .. } => Some(*version),
        Verification::Absent => None,
    };
    if let Some(found) = found_version.filter(|v| *v != asked.version) {
        return Err(Ignored::OtherVersion {
            asked: asked.version,
            found,
        });
    }
    let now = st
        .chunks
        .get(handle)
        .and_then(|info| info.replica(server))
        .map(|r| r.version);
    if let Some(now) = now.filter(|v| *v != asked.version) {
        return Err(Ignored::ReplicaChanged {
            asked: asked.version,
            now,
        });
    }
    Ok(())
}

/// Sorts `info`'s replicas of chunk `handle` by what the rules do with them.
pub fn examine(st: &MasterState, handle: ChunkHandle, info: &ChunkInfo, now_ms: u64) -> Examined {
    let dead_after = st.settings.dead_after_ms;
    let mut ex = Examined::default();
    for r in info.replicas.iter() {
        let id = r.server_id();
        let live = is_live(&st.registry, id, now_ms, dead_after);
        match info.class_of(r) {
            ReplicaClass::Current if live => ex.live.push((id, r.state)),
            ReplicaClass::Current => {}
            ReplicaClass::Stale if live => ex.stale.push((id, r.version)),
            ReplicaClass::Stale => {}
            ReplicaClass::Ahead => ex.ahead.push(id),
            ReplicaClass::Short if live => ex.short.push((id, r.version)),
            ReplicaClass::Short => {}
        }
    }
    for (s, v) in st.health.corrupt_of(handle) {
        let held = st
            .registry
            .get(s)
            .is_some_and(|cs| cs.replicas.contains(&handle));
        ex.corrupt.push((s, v, held));
    }
    ex
}

/// Whether the replicas of chunk `index` of `f` may be touched: every chunk of a
/// closed file, every chunk but the last of an open or recovering one.
pub fn settled(f: &FileMeta, index: usize) -> bool {
    f.write == WriteState::Closed || index + 1 < f.chunks.len()
}

/// A chunk that needs copies.
#[derive(Clone, Debug)]
struct Need {
    handle: ChunkHandle,
    version: ChunkVersion,
    length: u64,
    replication: u8,
    live: usize,
    /// Copies to order (missing replicas minus copies in flight).
    copies: usize,
    /// Live finalized up-to-date replicas that can be copied from.
    sources: Vec<ChunkserverId>,
    /// Chunkservers holding any replica of the chunk (never targets).
    holders: HashSet<ChunkserverId>,
}

/// Live chunkservers that could take a new replica of a chunk: room for `length`
/// bytes and no replica of it (`holders`).
fn target_candidates(
    st: &MasterState,
    holders: &HashSet<ChunkserverId>,
    length: u64,
    now_ms: u64,
) -> Vec<Candidate> {
    st.registry
        .candidates(now_ms, st.settings.dead_after_ms, length)
        .into_iter()
        .filter(|c| !holders.contains(&c.id))
        .collect()
}

/// Decides what to do now. Pure: reads the state (including the tracker, so nothing
/// in flight is ordered twice) and returns the actions; [`Tracker::record`] queues
/// them. `wall_ms` dates trash entries; `rng` breaks placement ties.
pub fn plan<R: Rng + ?Sized>(
    st: &MasterState,
    now_ms: u64,
    wall_ms: u64,
    rng: &mut R,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let tracker = &st.health;
    let mut pending_deletes: HashMap<ChunkserverId, usize> = HashMap::new();
    for ((s, _), p) in &tracker.pending {
        if p.is_delete() {
            *pending_deletes.entry(*s).or_default() += 1;
        }
    }
    let mut delete = |actions: &mut Vec<Action>,
                      server: ChunkserverId,
                      handle: ChunkHandle,
                      max_version: ChunkVersion,
                      reason: DeleteReason| {
        if tracker.pending.contains_key(&(server, handle)) {
            return;
        }
        let n = pending_deletes.entry(server).or_default();
        if *n >= MAX_PENDING_DELETES_PER_SERVER {
            return;
        }
        *n += 1;
        actions.push(Action::Delete {
            server,
            handle,
            max_version,
            reason,
        });
    };
    let mut in_flight: HashMap<ChunkHandle, usize> = HashMap::new();
    for c in &tracker.copies {
        *in_flight.entry(c.handle).or_default() += 1;
    }
    let mut needs: Vec<Need> = Vec::new();

    // Chunks, file by file (in inode order, so plans are reproducible).
    let mut files: Vec<_> = st
        .ns
        .iter()
        .filter_map(|(ino, i)| i.as_file().map(|f| (*ino, f)))
        .collect();
    files.sort_by_key(|(ino, _)| *ino);
    for (_, f) in files {
        for (index, handle) in f.chunks.iter().enumerate() {
            if !settled(f, index) {
                continue;
            }
            let Some(info) = st.chunks.get(*handle) else {
                continue;
            };
            let ex = examine(st, *handle, info, now_ms);
            let replication = usize::from(info.replication.max(1));
            // Stale replicas go only while an up-to-date one is live: the last remnants
            // of a missing chunk are left for an operator.
            if !ex.live.is_empty() {
                for (s, v) in &ex.stale {
                    delete(&mut actions, *s, *handle, *v, DeleteReason::Stale);
                }
            }
            for (s, state) in &ex.live {
                if *state == ReplicaState::Writing && !tracker.pending.contains_key(&(*s, *handle))
                {
                    actions.push(Action::Finalize {
                        server: *s,
                        handle: *handle,
                        version: info.version,
                        length: info.length,
                    });
                }
            }
            let good: Vec<(ChunkserverId, ReplicaState)> = ex
                .live
                .iter()
                .copied()
                .filter(|(s, _)| !tracker.deleting(*s, *handle))
                .collect();
            let mut holders: HashSet<ChunkserverId> =
                info.replicas.iter().map(|r| r.server_id()).collect();
            holders.extend(ex.corrupt.iter().filter(|c| c.2).map(|c| c.0));
            holders.extend(
                tracker
                    .copies
                    .iter()
                    .filter(|c| c.handle == *handle)
                    .map(|c| c.target),
            );
            for (s, v, held) in &ex.corrupt {
                if !held || !is_live(&st.registry, *s, now_ms, st.settings.dead_after_ms) {
                    continue;
                }
                let nowhere_else = target_candidates(st, &holders, info.length, now_ms).is_empty();
                if good.len() >= replication || (!good.is_empty() && nowhere_else) {
                    delete(&mut actions, *s, *handle, *v, DeleteReason::Corrupt);
                }
            }
            // Short replicas go like corrupt ones: once the chunk has enough good
            // replicas again, or when their chunkserver is the only place left for a
            // new copy. The bound is their version: a raised replica is kept.
            for (s, v) in &ex.short {
                let nowhere_else = target_candidates(st, &holders, info.length, now_ms).is_empty();
                if good.len() >= replication || (!good.is_empty() && nowhere_else) {
                    delete(&mut actions, *s, *handle, *v, DeleteReason::Short);
                }
            }
            let flying = in_flight.get(handle).copied().unwrap_or(0);
            if !good.is_empty() && good.len() + flying < replication {
                needs.push(Need {
                    handle: *handle,
                    version: info.version,
                    length: info.length,
                    replication: info.replication,
                    live: good.len(),
                    copies: replication - good.len() - flying,
                    sources: good
                        .iter()
                        .filter(|(_, state)| *state == ReplicaState::Finalized)
                        .map(|(s, _)| *s)
                        .collect(),
                    holders,
                });
            } else if flying == 0 && good.len() > replication {
                // The fullest servers give up their replica.
                let mut victims: Vec<(u64, ChunkserverId)> = good
                    .iter()
                    .map(|(s, _)| (st.registry.get(*s).map_or(0, |c| c.free()), *s))
                    .collect();
                victims.sort();
                for (_, s) in victims.into_iter().take(good.len() - replication) {
                    delete(
                        &mut actions,
                        s,
                        *handle,
                        info.version,
                        DeleteReason::OverReplicated,
                    );
                }
            }
        }
    }

    // Re-replication, most urgent first, within the per-server stream cap.
    needs.sort_by_key(|n| (n.live != 1, std::cmp::Reverse(n.copies), n.handle));
    let cap = st.settings.max_replication_streams;
    let mut streams: HashMap<ChunkserverId, usize> = HashMap::new();
    for c in &tracker.copies {
        *streams.entry(c.source).or_default() += 1;
        *streams.entry(c.target).or_default() += 1;
    }
    let busy = |streams: &HashMap<ChunkserverId, usize>, s: ChunkserverId| {
        streams.get(&s).copied().unwrap_or(0) >= cap
    };
    for mut n in needs {
        for _ in 0..n.copies {
            let Some(source) = n
                .sources
                .iter()
                .copied()
                .filter(|s| !busy(&streams, *s))
                .min_by_key(|s| (streams.get(s).copied().unwrap_or(0), *s))
            else {
                break;
            };
            let candidates: Vec<Candidate> = target_candidates(st, &n.holders, n.length, now_ms)
                .into_iter()
                .filter(|c| !busy(&streams, c.id))
                .collect();
            let Ok(chosen) = placement::choose(&candidates, 1, 1, rng) else {
                break;
            };
            let Some(target) = chosen.targets.first().and_then(|t| st.registry.get(*t)) else {
                break;
            };
            *streams.entry(source).or_default() += 1;
            *streams.entry(target.id).or_default() += 1;
            n.holders.insert(target.id);
            actions.push(Action::Replicate {
                handle: n.handle,
                version: n.version,
                source,
                target: target.addr(),
                live: n.live,
                replication: n.replication,
            });
        }
    }

    // Orphans: replicas of chunks the master does not know, once past the grace.
    let mut servers: Vec<_> = st
        .registry
        .iter()
        .filter(|c| c.is_live(now_ms, st.settings.dead_after_ms))
        .collect();
    servers.sort_by_key(|c| c.id);
    for cs in servers {
        for o in &cs.orphans {
            let seen = tracker.orphan_seen(cs.id, o.handle).unwrap_or(now_ms);
            if now_ms.saturating_sub(seen) >= st.settings.orphan_grace_ms {
                delete(
                    &mut actions,
                    cs.id,
                    o.handle,
                    o.version,
                    DeleteReason::Orphan,
                );
            }
        }
    }

    // Trash entries past `--trash-for`.
    if let Some(dir) = st
        .ns
        .child(ROOT, trash::DIR)
        .and_then(|t| st.ns.get(t))
        .and_then(|t| t.as_dir())
    {
        for (name, ino) in &dir.children {
            let at = trash::deleted_at(name)
                .or_else(|| st.ns.get(*ino).map(|i| i.mtime_ms))
                .unwrap_or(0);
            if trash::expired(at, st.settings.trash_ms, wall_ms) {
                actions.push(Action::PurgeTrash { name: name.clone() });
            }
        }
    }
    actions
}

#[cfg(test)]
mod tests;
