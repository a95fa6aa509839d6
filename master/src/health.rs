//! Replica health (DESIGN.md invariant 4): the decisions that keep every chunk at its
//! replication factor with up-to-date, uncorrupted replicas, and reclaim replicas
//! nobody needs.
//!
//! The health worker calls [`prune`] (which forgets commands that completed or were
//! lost), then decides with a [`Pass`] (pure functions of the master's state and the
//! time that return [`Action`]s), then [`Tracker::record`], which queues each action's
//! command for its chunkserver. A pass runs in slices of bounded work, each under one
//! short hold of the state lock, so the master keeps serving while it walks a table
//! of millions of chunks (`health/pass.rs`); [`plan`] is the same pass in one piece. The heartbeat handler hands queued commands out, signed, in
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
//!   chunkservers (never while a copy of the chunk is in flight); the replica a
//!   balancer's move came from goes first ([`balance`]).
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
//! - **Trash** ([`crate::trash`]): each user's `Current` becomes a checkpoint at most
//!   once per half `--trash-for`, and checkpoints older than `--trash-for` are purged.
//!
//! Only chunks of closed files and complete chunks of open files are touched: the last
//! chunk of a file that is open or in lease recovery belongs to its writer (or to the
//! recovery), and its replicas legitimately sit below a version just minted.

use crate::chunk_table::{ChunkInfo, ReplicaClass};
use crate::namespace::{FileMeta, WriteState};
use crate::registry::Registry;
use crate::state::{CorruptReport, MasterState};
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkVersion, ChunkserverAddr, ChunkserverId, InodeId, ReplicaState,
    Verification,
};
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
        /// A balancer's move: `source`'s replica goes once the copy is reported
        /// (`health/balance.rs`).
        moving_from: Option<ChunkserverId>,
    },
    /// Seal `server`'s replica, still `Writing`, of a finished chunk.
    Finalize {
        server: ChunkserverId,
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    },
    /// Delete the trash entry `/.trash/<name>` for good (a logged namespace change):
    /// a checkpoint (`<user>/<ms>`) or an entry of the older flat layout.
    PurgeTrash { name: String },
    /// Turn `/.trash/<user>/Current` into a checkpoint (a logged rename).
    CheckpointTrash { user: String },
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
            Action::PurgeTrash { .. } | Action::CheckpointTrash { .. } => None,
        }
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

pub(crate) fn is_live(reg: &Registry, id: ChunkserverId, now_ms: u64, dead_after_ms: u64) -> bool {
    reg.get(id)
        .is_some_and(|c| c.is_live(now_ms, dead_after_ms))
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

/// Whether the replicas of chunk `index` of `f` (inode `ino`) may be touched: every
/// chunk of a closed file, every chunk but the one being written
/// ([`MasterState::open_index_of`]) of an open or recovering one.
pub fn settled(st: &MasterState, ino: InodeId, f: &FileMeta, index: usize) -> bool {
    f.write == WriteState::Closed || st.open_index_of(ino, f) != Some(index)
}

pub mod balance;
mod pass;
mod tracker;
pub use pass::{plan, Pass, SLICE_BUDGET};
pub use tracker::{prune, prune_copies, Copy, Pruned, Tracker};

#[cfg(test)]
mod admin_tests;
#[cfg(test)]
mod pass_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod trash_tests;
