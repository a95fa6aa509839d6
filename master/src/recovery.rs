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
//!    every byte the writer had acknowledged. From then on each bumped replica
//!    rejects the old writer with `StaleToken`. Replicas that miss the bump stay
//!    below the master's version: stale, never handed out (invariant 4);
//! 3. the bump replies carry each replica's length; the file keeps the shortest
//!    ([`recovered_length`]): every acknowledged byte is on every pipeline replica
//!    (invariant 5), so the minimum never cuts one;
//! 4. `Truncate` then `Finalize` at that length on each bumped replica (a replica that
//!    fails them is dropped from the chunk's replicas);
//! 5. log `RecoveryCommitted`: the chunk's committed length, the file closed.
//!
//! A file that is open without an open last chunk (no chunk yet, or its last chunk is
//! full: the writer died between chunks) is closed at its committed length. A last
//! chunk with no live replica at a recoverable version, still at the version its
//! replicas hold, does not hang the file: it is closed at the chunk's committed length
//! and the chunk is listed as missing
//! ([`crate::state::MasterState::missing_chunks`]). Once a version was minted past
//! the granted one, closing would leave the chunk at a version no replica holds (all
//! of them stale for good), so the file stays in recovery and the worker retries,
//! backing off, until a replica holding the granted version is reachable again.
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

use crate::chunk_table::ChunkInfo;
use crate::lease::Takeover;
use crate::namespace::WriteState;
use stampfs_proto::{ChunkVersion, ChunkserverAddr, ChunkserverId, ClientId, InodeId};
use std::collections::HashMap;
use std::fmt;

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
    /// `stampfs recover` by `client`: forced, whatever the lease.
    Operator { client: ClientId },
    /// The file was left in recovery by an earlier attempt or a master restart.
    Resume,
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::HardLimit { .. } => f.write_str("hard-limit"),
            Trigger::Append { client, .. } => write!(f, "append by {client}"),
            Trigger::Operator { client } => write!(f, "recover by {client}"),
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
    /// No live replica holds the last chunk at a recoverable version, and the chunk is
    /// still at the version its replicas hold: close at the chunk's committed length
    /// and report the chunk missing.
    Missing { old_version: ChunkVersion },
    /// No live replica holds the last chunk at a recoverable version, and a version
    /// was minted past `old_version` (an earlier attempt, a failed reopen or pipeline
    /// update): closing would leave the chunk at a version no replica holds, so the
    /// file stays in (or goes to) recovery until one is reachable.
    Unreachable {
        holder: ClientId,
        old_version: ChunkVersion,
    },
    /// Mint `version` (log it), push it to `targets`, then seal.
    Bump {
        holder: ClientId,
        old_version: ChunkVersion,
        version: ChunkVersion,
        targets: Vec<ChunkserverAddr>,
    },
}

/// Decides how to recover a file from its write state, chunk size and last chunk.
/// `expired` is the holder the trigger saw expire ([`Trigger::expired_holder`]);
/// `live` gives the address of a live chunkserver.
pub fn decide(
    write: WriteState,
    expired: Option<ClientId>,
    chunk_size: u64,
    last: Option<&ChunkInfo>,
    live: impl Fn(ChunkserverId) -> Option<String>,
) -> Start {
    let (holder, old_version, info) = match (write, last) {
        (WriteState::Closed, _) => return Start::Closed,
        (WriteState::Open { client, .. }, _) if expired.is_some_and(|e| e != client) => {
            return Start::HolderChanged { holder: client }
        }
        (WriteState::Open { .. }, None) => return Start::CloseAtCommitted,
        (WriteState::Open { .. }, Some(info)) if info.length >= chunk_size => {
            return Start::CloseAtCommitted
        }
        (WriteState::Open { client, granted }, Some(info)) => (client, granted, info),
        (WriteState::Recovering { .. }, None) => return Start::CloseAtCommitted,
        (
            WriteState::Recovering {
                holder,
                old_version,
            },
            Some(info),
        ) => (holder, old_version, info),
    };
    let targets = recoverable_targets(info, old_version, live);
    if targets.is_empty() {
        if info.version > old_version {
            return Start::Unreachable {
                holder,
                old_version,
            };
        }
        return Start::Missing { old_version };
    }
    Start::Bump {
        holder,
        old_version,
        version: info.version.next(),
        targets,
    }
}

/// The live replicas of `info` that hold the writer's data: at a version between
/// `from` (the version the writer was granted) and the master's current one. Replicas
/// below `from` missed an earlier bump and are stale; replicas known to be shorter
/// than the committed length (a bump applied late, see
/// [`crate::chunk_table::Replica::short`]) lack committed bytes. Ordered by
/// chunkserver id.
pub fn recoverable_targets(
    info: &ChunkInfo,
    from: ChunkVersion,
    live: impl Fn(ChunkserverId) -> Option<String>,
) -> Vec<ChunkserverAddr> {
    let mut out: Vec<ChunkserverAddr> = info
        .replicas
        .iter()
        .filter(|r| r.version >= from && r.version <= info.version && !r.short)
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

/// The length recovery commits: the shortest replica that took the bump (`None` when
/// none did).
pub fn recovered_length(lengths: impl IntoIterator<Item = u64>) -> Option<u64> {
    lengths.into_iter().min()
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
mod tests {
    use super::*;
    use crate::lease::{LeaseLimits, LeaseTable};
    use stampfs_proto::ReplicaState;

    const A: ClientId = ClientId(0xa);
    const B: ClientId = ClientId(0xb);
    const F: InodeId = InodeId(7);
    const CHUNK: u64 = 1 << 20;
    const LIMITS: LeaseLimits = LeaseLimits {
        soft_ms: 300,
        hard_ms: 600,
    };

    fn live_except(dead: &'static [u64]) -> impl Fn(ChunkserverId) -> Option<String> {
        move |id| (!dead.contains(&id.0)).then(|| format!("127.0.0.1:{}", 9000 + id.0))
    }

    /// A chunk at `version` with replicas `(server, version)`.
    fn chunk(version: u64, length: u64, replicas: &[(u32, u64)]) -> ChunkInfo {
        let mut c = ChunkInfo::new(ChunkVersion(version), 3);
        c.length = length;
        for (s, v) in replicas {
            c.set_replica(*s, ChunkVersion(*v), ReplicaState::Writing);
        }
        c
    }

    fn ids(t: &[ChunkserverAddr]) -> Vec<u64> {
        t.iter().map(|a| a.id.0).collect()
    }

    #[test]
    fn append_conflicts_before_the_soft_limit_and_recovers_after() {
        // A controllable clock: the lease table takes `now` as a number.
        let mut leases = LeaseTable::default();
        leases.acquire(F, A, 1_000);
        let at = |now| on_append(A, leases.takeover(F, now, LIMITS));
        assert_eq!(
            at(1_000),
            OnAppend::Conflict {
                holder: A,
                expires_in_ms: 300
            }
        );
        assert_eq!(
            at(1_299),
            OnAppend::Conflict {
                holder: A,
                expires_in_ms: 1
            }
        );
        assert_eq!(at(1_300), OnAppend::Recover { holder: A });
        assert_eq!(at(1_700), OnAppend::Recover { holder: A }, "past hard too");
        // A renewal puts the holder back in charge.
        assert!(leases.renew(F, A, 1_700));
        assert!(matches!(
            on_append(A, leases.takeover(F, 1_800, LIMITS)),
            OnAppend::Conflict { .. }
        ));
        // An open file with no timer at all is recoverable.
        assert_eq!(
            on_append(B, leases.takeover(InodeId(99), 0, LIMITS)),
            OnAppend::Recover { holder: B }
        );
    }

    #[test]
    fn the_hard_limit_makes_recovery_automatic() {
        let mut leases = LeaseTable::default();
        leases.acquire(F, A, 0);
        leases.acquire(InodeId(8), B, 500);
        assert!(leases.take_hard_expired(599, LIMITS).is_empty());
        let due: Vec<_> = leases
            .take_hard_expired(600, LIMITS)
            .into_iter()
            .map(|(f, l)| (f, l.holder))
            .collect();
        assert_eq!(due, vec![(F, A)]);
        assert!(
            leases.take_hard_expired(650, LIMITS).is_empty(),
            "started once per expiry"
        );
        assert_eq!(leases.take_hard_expired(1_100, LIMITS).len(), 1);
    }

    #[test]
    fn an_open_last_chunk_is_bumped_on_its_live_current_replicas() {
        // Replica 3 is stale (missed an earlier pipeline bump), 4 is on a dead server.
        let c = chunk(5, 0, &[(1, 5), (2, 5), (3, 4), (4, 5)]);
        let start = decide(
            WriteState::Open {
                client: A,
                granted: ChunkVersion(5),
            },
            Some(A),
            CHUNK,
            Some(&c),
            live_except(&[4]),
        );
        let Start::Bump {
            holder,
            old_version,
            version,
            targets,
        } = start
        else {
            panic!("expected a bump, got {start:?}");
        };
        assert_eq!(
            (holder, old_version, version),
            (A, ChunkVersion(5), ChunkVersion(6))
        );
        assert_eq!(ids(&targets), vec![1, 2]);
    }

    #[test]
    fn a_resumed_recovery_mints_again_over_every_replica_since_the_old_version() {
        // The first attempt reached 1 and 2 (version 6); 3 missed it but is at the
        // writer's version 5; 4 is stale from before.
        let c = chunk(6, 0, &[(1, 6), (2, 6), (3, 5), (4, 4)]);
        let write = WriteState::Recovering {
            holder: A,
            old_version: ChunkVersion(5),
        };
        let Start::Bump {
            old_version,
            version,
            targets,
            ..
        } = decide(write, None, CHUNK, Some(&c), live_except(&[]))
        else {
            panic!("expected a bump");
        };
        assert_eq!((old_version, version), (ChunkVersion(5), ChunkVersion(7)));
        assert_eq!(ids(&targets), vec![1, 2, 3]);
    }

    #[test]
    fn without_an_open_last_chunk_the_file_just_closes() {
        let write = WriteState::Open {
            client: A,
            granted: ChunkVersion(2),
        };
        assert_eq!(
            decide(write, None, CHUNK, None, live_except(&[])),
            Start::CloseAtCommitted
        );
        let full = chunk(2, CHUNK, &[(1, 2)]);
        assert_eq!(
            decide(write, None, CHUNK, Some(&full), live_except(&[])),
            Start::CloseAtCommitted,
            "the writer died between chunks"
        );
        assert_eq!(
            decide(
                WriteState::Closed,
                None,
                CHUNK,
                Some(&full),
                live_except(&[])
            ),
            Start::Closed
        );
        // The expired holder closed and another client reopened the file meanwhile.
        assert_eq!(
            decide(
                WriteState::Open {
                    client: B,
                    granted: ChunkVersion(2),
                },
                Some(A),
                CHUNK,
                Some(&full),
                live_except(&[])
            ),
            Start::HolderChanged { holder: B }
        );
    }

    #[test]
    fn a_last_chunk_without_live_replicas_is_missing_not_hung() {
        let write = WriteState::Open {
            client: A,
            granted: ChunkVersion(3),
        };
        let c = chunk(3, 100, &[(1, 3), (2, 2)]);
        assert_eq!(
            decide(write, Some(A), CHUNK, Some(&c), live_except(&[1])),
            Start::Missing {
                old_version: ChunkVersion(3)
            },
            "the only current replica is dead; the other is stale"
        );
        let none = chunk(3, 0, &[]);
        assert!(matches!(
            decide(write, None, CHUNK, Some(&none), live_except(&[])),
            Start::Missing { .. }
        ));
    }

    #[test]
    fn a_version_minted_but_never_granted_does_not_make_the_writers_replicas_stale() {
        // The writer holds 5; its pipeline update minted 6, but the bump reached nobody.
        let c = chunk(6, 0, &[(1, 5), (2, 5), (3, 5)]);
        let write = WriteState::Open {
            client: A,
            granted: ChunkVersion(5),
        };
        let Start::Bump {
            old_version,
            version,
            targets,
            ..
        } = decide(write, Some(A), CHUNK, Some(&c), live_except(&[]))
        else {
            panic!("expected a bump");
        };
        assert_eq!((old_version, version), (ChunkVersion(5), ChunkVersion(7)));
        assert_eq!(
            ids(&targets),
            vec![1, 2, 3],
            "all hold the acknowledged bytes"
        );
        // The bump reached one replica before the master gave up: it counts too.
        let c = chunk(6, 0, &[(1, 6), (2, 5), (3, 4)]);
        let Start::Bump { targets, .. } = decide(write, Some(A), CHUNK, Some(&c), live_except(&[]))
        else {
            panic!("expected a bump");
        };
        assert_eq!(
            ids(&targets),
            vec![1, 2],
            "3 was dropped before 5 was granted"
        );
        // Once 6 is granted, replicas at 5 are stale.
        let granted = WriteState::Open {
            client: A,
            granted: ChunkVersion(6),
        };
        let Start::Bump { targets, .. } =
            decide(granted, Some(A), CHUNK, Some(&c), live_except(&[]))
        else {
            panic!("expected a bump");
        };
        assert_eq!(ids(&targets), vec![1]);
    }

    #[test]
    fn a_chunk_past_the_granted_version_waits_for_a_replica_instead_of_closing() {
        // No live replica, and the chunk is at a version nobody may hold: closing
        // would leave every replica stale for good.
        let c = chunk(6, 100, &[(1, 5), (2, 5)]);
        let open = WriteState::Open {
            client: A,
            granted: ChunkVersion(5),
        };
        assert_eq!(
            decide(open, Some(A), CHUNK, Some(&c), live_except(&[1, 2])),
            Start::Unreachable {
                holder: A,
                old_version: ChunkVersion(5)
            }
        );
        let recovering = WriteState::Recovering {
            holder: A,
            old_version: ChunkVersion(5),
        };
        assert_eq!(
            decide(recovering, None, CHUNK, Some(&c), live_except(&[1, 2])),
            Start::Unreachable {
                holder: A,
                old_version: ChunkVersion(5)
            }
        );
        // When they are back, they are recovered.
        assert!(matches!(
            decide(recovering, None, CHUNK, Some(&c), live_except(&[2])),
            Start::Bump { .. }
        ));
    }

    #[test]
    fn a_short_replica_never_takes_part_in_recovery() {
        let mut c = chunk(5, 1000, &[(1, 5), (2, 5)]);
        c.record_report(
            3,
            &stampfs_proto::ReplicaReport {
                handle: stampfs_proto::ChunkHandle(1),
                version: ChunkVersion(5),
                length: 10,
                state: ReplicaState::Writing,
            },
        );
        assert!(c.replica(ChunkserverId(3)).expect("recorded").short);
        let targets = recoverable_targets(&c, ChunkVersion(5), live_except(&[]));
        assert_eq!(ids(&targets), vec![1, 2]);
    }

    #[test]
    fn the_shortest_bumped_replica_decides_the_length() {
        assert_eq!(recovered_length([4096, 1000, 65536]), Some(1000));
        assert_eq!(recovered_length([7]), Some(7));
        assert_eq!(recovered_length([]), None);
    }

    #[test]
    fn resume_waits_for_registrations_with_a_cap() {
        assert!(!resume_ready(100, 800, 2, 3));
        assert!(resume_ready(100, 800, 3, 3), "every replica is back");
        assert!(resume_ready(800, 800, 0, 3), "the grace period is over");
    }

    #[test]
    fn failed_attempts_back_off() {
        assert_eq!(retry_delay_ms(1), 500);
        assert_eq!(retry_delay_ms(2), 1_000);
        assert_eq!(retry_delay_ms(3), 2_000);
        assert_eq!(retry_delay_ms(40), MAX_RETRY_MS);
        let mut s = RetrySchedule::default();
        assert!(s.may_start(F, 0));
        assert_eq!(s.failed(F, 1_000), 500);
        assert!(!s.may_start(F, 1_499));
        assert!(s.may_start(F, 1_500));
        assert_eq!(s.failed(F, 1_500), 1_000);
        assert!(!s.may_start(F, 2_499));
        s.done(F);
        assert!(s.may_start(F, 0));
        assert!(s.is_empty());
    }
}
