//! Lease recovery: taking a file away from a writer that died or hung (DESIGN.md,
//! "Lease recovery"), as pure decisions.
//!
//! **Triggers.** The recovery worker starts it for every lease past its hard limit;
//! an `append` (by anyone) on a file whose holder is past its soft limit starts it
//! and is answered `RecoveryInProgress` (before the soft limit: `LeaseConflict`, see
//! [`on_append`]); `RecoverLease` (`stampfs recover`) forces it at any time. At most
//! one recovery runs per file, under the same per-file lock as the writer's own
//! `AddChunk` / `UpdatePipeline` / `Close`.
//!
//! **Procedure** for a file whose last chunk is open ([`decide`]):
//! 1. mint a fresh version `N` for the last chunk and log `RecoveryStarted` durably:
//!    the file is `Recovering`, the holder's lease is gone (its later requests get
//!    `LeaseExpired`);
//! 2. push `BumpVersion(N)` to every live replica at a recoverable version
//!    ([`recoverable_targets`]): from the version the writer was last *granted* (the
//!    floor kept in `WriteState::Open`, logged by `Record::Granted`) up to the
//!    master's current one. A version minted for a pipeline update or reopen whose
//!    bump failed was never granted, so the replicas below it still count: they hold
//!    every byte the writer had acknowledged. A bump of such a version that *did*
//!    reach a replica raises the floor of an open file's recovery to it
//!    ([`open_floor`]): the replicas it excluded were not handed to readers since,
//!    and may lack bytes they read. From then on each bumped replica
//!    rejects the old writer with `StaleToken`. Replicas that miss the bump stay
//!    below the master's version: stale, never handed out (invariant 4);
//! 3. the bump replies carry each replica's length; the file keeps the shortest
//!    ([`recovered_length`]): every acknowledged byte is on every pipeline replica
//!    (invariant 5), so the minimum never cuts one;
//! 4. `Truncate` at that length on each bumped replica, then ask each for its digest
//!    (`DigestReplica`: the CRC of each block up to the length) and compare them
//!    ([`compare_content`], in the `seal` module with the other end-of-attempt rules).
//!    Identical: `Finalize` every one at `N`. Different: keep the first replica of the
//!    granted pipeline among those that answered, log one more version `N + 1`
//!    (`SetVersion`), bump only that replica to it and finalize it there; the others
//!    stay at `N`, stale. A replica whose truncate, digest or finalize fails counts as
//!    unsealed ([`after_seal`]: when some are sealed, one that failed is dropped from
//!    the chunk's replicas; when none is, all stay listed and the attempt is retried);
//! 5. log `RecoveryCommitted` at the version the sealed replicas hold: the chunk's
//!    committed length, the file closed.
//!
//! A file that is open without an open last chunk (no chunk yet, or its last chunk is
//! full: the writer died between chunks) is closed at its committed length: the
//! writer committed a full chunk's length itself with `AddChunk` (which also has its
//! replicas finalized), so everything it had acknowledged is within that length.
//!
//! **No reachable replica.** When no live replica of the last chunk holds a
//! recoverable version, recovery never closes the file at the master's committed
//! length, which knows nothing of what was hflushed or hsynced since: the replicas that
//! are unreachable now may hold acknowledged bytes. The rule ([`decide`]):
//! - an open file is **fenced** all the same: a fresh version is minted and logged
//!   (`RecoveryStarted`), the holder's lease is gone (its `AddChunk`, `UpdatePipeline`
//!   and `Close` get `LeaseExpired`), and the file stays `Recovering`;
//! - a file in recovery **waits**: the worker retries with back-off, and at once when
//!   a chunkserver holding a replica registers or comes back to life;
//! - it closes at the committed length only when the replicas are **proven gone**
//!   ([`proven_gone`]): every chunkserver the master ever handed an id to has
//!   registered with it since it started (so its full chunk report is in the table),
//!   and none lists a replica at a recoverable version. The chunk is then reported
//!   missing; the version was minted first, so nothing accepts the old writer again.
//!
//! Proof sketch that no acknowledged byte is cut: a byte acknowledged to the writer is
//! on every replica of its pipeline (invariant 5), each of them at a version at least
//! the granted one. Such a replica is listed in the chunk table from the bump reply
//! that put it in the pipeline or, after a master restart, from its chunkserver's
//! registration report; it leaves the table only when its chunkserver reports it
//! gone or at another version, or when a seal at a newer version failed. So while any
//! pipeline replica may still exist, either it is listed (recovery waits for it or
//! bumps it) or its chunkserver has not registered since the restart (recovery
//! waits). A bump makes the replica refuse the old writer before its length is read,
//! so the length read is final, and the minimum over bumped pipeline replicas is at
//! least every acknowledged offset. Writes the old writer got acknowledged while the
//! master could not reach the replicas are on those replicas too, and counted the
//! same way when they are bumped.
//!
//! **A failed reopen.** An `append` whose bump reaches too few replicas has already
//! logged the new version; the file goes to recovery from the version the closed file
//! had (`Record::RecoveryQueued`) instead of closing at a version nobody holds, and
//! the appending client gets `NotEnoughReplicas`.
//!
//! **Restart.** `RecoveryStarted` is durable, so replay brings the file back in
//! `Recovering`. Once the chunkservers had a chance to register ([`resume_ready`]) the
//! worker resumes it. A resumed (or retried) attempt mints a fresh version rather than
//! reusing the logged one: an interrupted attempt may already have truncated some
//! replicas, and a fresh version makes every replica the new attempt does not reach
//! stale, so the length is always decided over exactly the replicas that will serve.
//! Versions are only ever minted through the log, strictly increasing (invariant 1).
//! That holds for the extra version of diverged replicas too: a restart between its
//! `SetVersion` and the commit finds the file still `Recovering` with its chunk at
//! `N + 1`; the resumed attempt takes every pipeline replica from the writer's
//! version up to `N + 1` (the kept one, bumped or not, and those left at `N`), mints
//! `N + 2` over them and compares again.

use crate::chunk_table::ChunkInfo;
use crate::lease::Takeover;
use crate::namespace::WriteState;
use stampfs_proto::{ChunkVersion, ChunkserverAddr, ChunkserverId, ClientId, InodeId};
use std::collections::HashMap;
use std::fmt;

mod seal;
pub use seal::{
    after_seal, compare_content, in_pipeline_order, recovered_length, replica_at, seal_decision,
    AfterSeal, Content, SealDecision,
};

/// How long `RecoverLease` waits for the recovery before answering `closed: false`.
pub const RECOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often the recovery worker looks for due recoveries.
pub const RECOVERY_TICK: std::time::Duration = std::time::Duration::from_millis(200);
/// Delay before retrying a recovery whose first attempt failed.
pub const FIRST_RETRY_MS: u64 = 500;
/// Longest delay between attempts.
pub const MAX_RETRY_MS: u64 = 30_000;

/// Why a recovery runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// `holder`'s lease passed the hard limit.
    HardLimit { holder: ClientId },
    /// `client` asked to append after `holder`'s soft limit.
    Append { client: ClientId, holder: ClientId },
    /// `stampfs recover` by `client`: forced, whatever the lease. `accept_loss`: the
    /// operator declares unreachable replicas lost (`--accept-loss`).
    Operator { client: ClientId, accept_loss: bool },
    /// The file was left in recovery by an earlier attempt or a master restart.
    Resume,
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::HardLimit { .. } => f.write_str("hard-limit"),
            Trigger::Append { client, .. } => write!(f, "append by {client}"),
            Trigger::Operator {
                client,
                accept_loss: false,
            } => write!(f, "recover by {client}"),
            Trigger::Operator {
                client,
                accept_loss: true,
            } => write!(f, "recover --accept-loss by {client}"),
            Trigger::Resume => f.write_str("resume"),
        }
    }
}

impl Trigger {
    /// The holder whose expired lease triggered the recovery. If another client holds
    /// the file by the time the recovery runs, the file changed hands and is left
    /// alone. `None`: recover whoever holds it (operator, resume).
    pub fn expired_holder(&self) -> Option<ClientId> {
        match self {
            Trigger::HardLimit { holder } | Trigger::Append { holder, .. } => Some(*holder),
            Trigger::Operator { .. } | Trigger::Resume => None,
        }
    }
}

/// What an `append` on a file that has a writer runs into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnAppend {
    /// The holder is within its soft limit: `LeaseConflict`.
    Conflict {
        holder: ClientId,
        expires_in_ms: u64,
    },
    /// The holder passed its soft limit (or has no lease timer at all): recover the
    /// file and answer `RecoveryInProgress`.
    Recover { holder: ClientId },
}

/// The append rule, from the lease table's view of an open file held by `holder`. The
/// same client id is treated like any other: its old session is what went away.
pub fn on_append(holder: ClientId, takeover: Takeover) -> OnAppend {
    match takeover {
        Takeover::Conflict {
            holder,
            expires_in_ms,
        } => OnAppend::Conflict {
            holder,
            expires_in_ms,
        },
        Takeover::SoftExpired { holder } | Takeover::HardExpired { holder } => {
            OnAppend::Recover { holder }
        }
        // An open file always has a lease; one without is recoverable by definition.
        Takeover::Free => OnAppend::Recover { holder },
    }
}

/// How a recovery attempt starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// The file has no writer: nothing to do.
    Closed,
    /// Another client than the expired holder holds the file now: nothing to do.
    HolderChanged { holder: ClientId },
    /// Open without an open last chunk: close at the committed length.
    CloseAtCommitted,
    /// No live replica holds the last chunk at a recoverable version and the file is
    /// still open: mint `version` (log it; the holder's lease is gone) and wait in
    /// recovery for a replica to be reachable.
    Fence {
        holder: ClientId,
        old_version: ChunkVersion,
        version: ChunkVersion,
    },
    /// No live replica holds the last chunk at a recoverable version, and the file is
    /// in recovery already (its holder fenced by a version past `old_version`): wait.
    Unreachable {
        holder: ClientId,
        old_version: ChunkVersion,
    },
    /// Every replica of the last chunk is proven gone ([`proven_gone`]): close at the
    /// chunk's committed length and report the chunk missing, at `version` (minted
    /// first when `mint`).
    Lost {
        old_version: ChunkVersion,
        version: ChunkVersion,
        mint: bool,
    },
    /// The last chunk was added but never granted to anyone (the master stopped
    /// between logging it and the bump that creates its replicas), it holds nothing
    /// committed and no chunkserver ever reported it: nothing can have been
    /// acknowledged on it. Drop it and close at the committed length.
    DropEmpty,
    /// Mint `version` (log it), push it to `targets`, then seal.
    Bump {
        holder: ClientId,
        old_version: ChunkVersion,
        version: ChunkVersion,
        targets: Vec<ChunkserverAddr>,
    },
}

/// Decides how to recover a file from its write state, chunk size and the chunk it is
/// written in (`last`; `reopened` when a `ChunkOpened` moved the writer to it, so
/// that it is open even when full). `expired` is the holder the trigger saw expire
/// ([`Trigger::expired_holder`]);
/// `holders` is what the master knows of who may hold the writer's bytes; `live`
/// gives the address of a live chunkserver.
pub fn decide(
    write: WriteState,
    expired: Option<ClientId>,
    chunk_size: u64,
    last: Option<&ChunkInfo>,
    reopened: bool,
    holders: &Holders<'_>,
    live: impl Fn(ChunkserverId) -> Option<String>,
) -> Start {
    let (holder, old_version, info) = match (write, last) {
        (WriteState::Closed, _) => return Start::Closed,
        (WriteState::Open { client, .. }, _) if expired.is_some_and(|e| e != client) => {
            return Start::HolderChanged { holder: client }
        }
        (WriteState::Open { .. }, None) => return Start::CloseAtCommitted,
        (WriteState::Open { .. }, Some(info)) if info.length >= chunk_size && !reopened => {
            return Start::CloseAtCommitted
        }
        (WriteState::Open { client, granted }, Some(info)) => {
            let floor = open_floor(info, granted, holders, &live);
            (client, floor, info)
        }
        (WriteState::Recovering { .. }, None) => return Start::CloseAtCommitted,
        (
            WriteState::Recovering {
                holder,
                old_version,
            },
            Some(info),
        ) => (holder, old_version, info),
    };
    let targets = recoverable_targets(info, old_version, holders.pipeline, live);
    if targets.is_empty() {
        // Fenced in the log already: in recovery, at a version past the writer's.
        let fenced = matches!(write, WriteState::Recovering { .. }) && info.version > old_version;
        if proven_gone(info, old_version, holders) {
            if holders.never_granted && info.length == 0 && info.replicas.is_empty() {
                return Start::DropEmpty;
            }
            return Start::Lost {
                old_version,
                version: if fenced {
                    info.version
                } else {
                    info.version.next()
                },
                mint: !fenced,
            };
        }
        if fenced {
            return Start::Unreachable {
                holder,
                old_version,
            };
        }
        return Start::Fence {
            holder,
            old_version,
            version: info.version.next(),
        };
    }
    Start::Bump {
        holder,
        old_version,
        version: info.version.next(),
        targets,
    }
}

/// What the master knows of who may hold a writer's acknowledged bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Holders<'a> {
    /// The operator declared every unreachable replica lost (`--accept-loss`).
    pub loss_accepted: bool,
    /// The chunkservers of the granted pipeline (`Record::GrantedPipeline`); `None`
    /// when it is not known (a grant logged before pipelines were): then any
    /// chunkserver may.
    pub pipeline: Option<&'a [ChunkserverId]>,
    /// The chunkservers (ever handed an id) that have not registered with this master
    /// since it started: their replicas are not in the chunk table yet.
    pub unreported: &'a [ChunkserverId],
    /// No grant of the last chunk was ever logged (no `GrantedPipeline` for it): no
    /// writer ever held a token for it. (A log written before grants named their
    /// pipelines says this of every chunk; only a chunk that is also empty and never
    /// reported is dropped on its strength, see [`Start::DropEmpty`].)
    pub never_granted: bool,
}

impl Holders<'_> {
    /// Whether `id` may hold the writer's bytes.
    fn may_hold(&self, id: ChunkserverId) -> bool {
        self.pipeline.is_none_or(|p| p.contains(&id))
    }
}

/// Whether every replica that may hold bytes the writer had acknowledged is known to
/// be gone: no replica of `info` at a recoverable version (`from..=current`, not
/// short) is listed on a chunkserver that may hold them (live or dead), and every such
/// chunkserver has reported its replicas to this master since it started, so no
/// unlisted replica can still exist; or the operator declared them lost
/// ([`Holders::loss_accepted`]).
pub fn proven_gone(info: &ChunkInfo, from: ChunkVersion, holders: &Holders<'_>) -> bool {
    if holders.loss_accepted {
        return true;
    }
    let listed = info.replicas.iter().any(|r| {
        r.version >= from
            && r.version <= info.version
            && !r.short
            && holders.may_hold(r.server_id())
    });
    !listed && !holders.unreported.iter().any(|id| holders.may_hold(*id))
}

/// The floor of the recovery of a file that is still open: the highest version that a
/// replica of the writer's (between the `granted` one and the master's current one, in
/// the granted pipeline, not short) holds, live or not; `granted` when none is above
/// it. A replica above the granted version took a bump of a pipeline update (or of a
/// reopen or a move) whose grant the master never logged: it stopped in between. That
/// bump excluded the replicas that missed it, and from then on readers were handed only
/// the replicas at the master's version (invariant 4): they may have read bytes the
/// excluded ones lack, and the shortest length taken with those would cut them (the
/// nemesis found it, seed 8126). Every acknowledged byte is on the survivors as on
/// every replica of the pipeline, so leaving the excluded ones out loses none. While no
/// survivor is live the file waits for one; when the operator gave unreachable
/// replicas up (`--accept-loss`), the highest version among the live ones is taken.
///
/// Only for an open file: once in recovery the floor is the one logged with
/// `RecoveryStarted`, and the versions above it are the attempts' own, which readers
/// never see past the committed length (a recovering file is read only that far).
pub fn open_floor(
    info: &ChunkInfo,
    granted: ChunkVersion,
    holders: &Holders<'_>,
    live: impl Fn(ChunkserverId) -> Option<String>,
) -> ChunkVersion {
    info.replicas
        .iter()
        .filter(|r| r.version > granted && r.version <= info.version && !r.short)
        .filter(|r| holders.may_hold(r.server_id()))
        .filter(|r| !holders.loss_accepted || live(r.server_id()).is_some())
        .map(|r| r.version)
        .max()
        .unwrap_or(granted)
}

/// The live replicas of `info` that hold the writer's data: at a version between
/// `from` (the version the writer was granted) and the master's current one, and in
/// the granted `pipeline` when it is known. Replicas below `from` missed an earlier
/// bump and are stale; replicas outside the pipeline took a bump the master had given
/// up on (it was applied late) and never got the writer's bytes; replicas known to be
/// shorter than the committed length (a bump applied late, see
/// [`crate::chunk_table::Replica::short`]) lack committed bytes. Ordered by
/// chunkserver id.
pub fn recoverable_targets(
    info: &ChunkInfo,
    from: ChunkVersion,
    pipeline: Option<&[ChunkserverId]>,
    live: impl Fn(ChunkserverId) -> Option<String>,
) -> Vec<ChunkserverAddr> {
    let mut out: Vec<ChunkserverAddr> = info
        .replicas
        .iter()
        .filter(|r| r.version >= from && r.version <= info.version && !r.short)
        .filter(|r| pipeline.is_none_or(|p| p.contains(&r.server_id())))
        .filter_map(|r| {
            live(r.server_id()).map(|addr| ChunkserverAddr {
                id: r.server_id(),
                addr,
            })
        })
        .collect();
    out.sort_by_key(|a| a.id);
    out
}

/// Whether a file left in recovery may be resumed after a start-up: every one of its
/// `replication` replicas is back (`present`), or the chunkservers had `grace_ms`
/// (one `dead_after`) to register.
pub fn resume_ready(now_ms: u64, grace_ms: u64, present: usize, replication: u8) -> bool {
    now_ms >= grace_ms || present >= usize::from(replication.max(1))
}

/// Delay before attempt `failures + 1`, after `failures` failed ones (at least one).
pub fn retry_delay_ms(failures: u32) -> u64 {
    let shift = failures.saturating_sub(1).min(16);
    FIRST_RETRY_MS.saturating_mul(1 << shift).min(MAX_RETRY_MS)
}

/// When failed recoveries may be tried again (soft state of the worker).
#[derive(Debug, Default)]
pub struct RetrySchedule {
    /// File → (failed attempts in a row, earliest next attempt in master-clock ms).
    failures: HashMap<InodeId, (u32, u64)>,
}

impl RetrySchedule {
    /// Whether the worker may start an attempt on `ino` now.
    pub fn may_start(&self, ino: InodeId, now_ms: u64) -> bool {
        self.failures.get(&ino).is_none_or(|(_, at)| now_ms >= *at)
    }

    /// An attempt on `ino` failed at `now_ms`; returns the delay before the next.
    pub fn failed(&mut self, ino: InodeId, now_ms: u64) -> u64 {
        let entry = self.failures.entry(ino).or_insert((0, 0));
        entry.0 = entry.0.saturating_add(1);
        let delay = retry_delay_ms(entry.0);
        entry.1 = now_ms.saturating_add(delay);
        delay
    }

    /// The recovery of `ino` finished (or the file is gone).
    pub fn done(&mut self, ino: InodeId) {
        self.failures.remove(&ino);
    }

    /// Files with a pending retry.
    pub fn len(&self) -> usize {
        self.failures.len()
    }

    pub fn is_empty(&self) -> bool {
        self.failures.is_empty()
    }
}

/// `cs1,cs2,cs3`: chunkserver ids for log fields.
pub fn id_list<'a>(ids: impl IntoIterator<Item = &'a ChunkserverId>) -> String {
    ids.into_iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
