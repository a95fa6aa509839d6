//! The pure decisions of lease recovery (`super`), each tested on its own.

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

/// Every chunkserver has reported; the pipeline is not known.
const ALL: Holders<'static> = Holders {
    loss_accepted: false,
    pipeline: None,
    unreported: &[],
    never_granted: false,
};
/// Chunkserver 9 has not registered since the master started.
const UNREPORTED: Holders<'static> = Holders {
    loss_accepted: false,
    pipeline: None,
    unreported: &[ChunkserverId(9)],
    never_granted: false,
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
        false,
        &ALL,
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
    } = decide(write, None, CHUNK, Some(&c), false, &ALL, live_except(&[]))
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
        decide(write, None, CHUNK, None, false, &ALL, live_except(&[])),
        Start::CloseAtCommitted
    );
    let full = chunk(2, CHUNK, &[(1, 2)]);
    assert_eq!(
        decide(
            write,
            None,
            CHUNK,
            Some(&full),
            false,
            &ALL,
            live_except(&[])
        ),
        Start::CloseAtCommitted,
        "the writer died between chunks"
    );
    assert_eq!(
        decide(
            WriteState::Closed,
            None,
            CHUNK,
            Some(&full),
            false,
            &ALL,
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
            false,
            &ALL,
            live_except(&[])
        ),
        Start::HolderChanged { holder: B }
    );
}

#[test]
fn an_open_file_without_a_reachable_replica_is_fenced_and_waits() {
    // The master sees no live current replica (its servers are dead, or it was
    // itself frozen): the replicas may hold hsynced bytes the committed length
    // knows nothing of. The holder is fenced by a fresh version; nothing closes.
    let write = WriteState::Open {
        client: A,
        granted: ChunkVersion(3),
    };
    let c = chunk(3, 100, &[(1, 3), (2, 2)]);
    for holders in [ALL, UNREPORTED] {
        assert_eq!(
            decide(
                write,
                Some(A),
                CHUNK,
                Some(&c),
                false,
                &holders,
                live_except(&[1])
            ),
            Start::Fence {
                holder: A,
                old_version: ChunkVersion(3),
                version: ChunkVersion(4)
            },
            "the only current replica is dead; the other is stale"
        );
    }
    // Once fenced, the file in recovery waits without minting again.
    let recovering = WriteState::Recovering {
        holder: A,
        old_version: ChunkVersion(3),
    };
    let fenced = chunk(4, 100, &[(1, 3), (2, 2)]);
    assert_eq!(
        decide(
            recovering,
            None,
            CHUNK,
            Some(&fenced),
            false,
            &ALL,
            live_except(&[1])
        ),
        Start::Unreachable {
            holder: A,
            old_version: ChunkVersion(3)
        }
    );
}

#[test]
fn a_chunk_closes_missing_only_when_every_replica_is_proven_gone() {
    let write = WriteState::Open {
        client: A,
        granted: ChunkVersion(3),
    };
    // Nothing listed, but a chunkserver has not reported since the master started
    // (a restart forgot the replica lists): it may hold the writer's bytes.
    let none = chunk(3, 100, &[]);
    assert!(matches!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&none),
            false,
            &UNREPORTED,
            live_except(&[])
        ),
        Start::Fence { .. }
    ));
    // Every chunkserver reported, and none holds it: the chunk is lost. The
    // version is still raised first.
    assert_eq!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&none),
            false,
            &ALL,
            live_except(&[])
        ),
        Start::Lost {
            old_version: ChunkVersion(3),
            version: ChunkVersion(4),
            mint: true
        }
    );
    // Only a stale and a short replica are listed: neither holds the bytes.
    let mut c = chunk(3, 100, &[(2, 2)]);
    c.set_replica(3, ChunkVersion(3), ReplicaState::Writing);
    c.record_report(
        3,
        &stampfs_proto::ReplicaReport {
            handle: stampfs_proto::ChunkHandle(1),
            version: ChunkVersion(3),
            length: 10,
            state: ReplicaState::Writing,
        },
    );
    assert!(proven_gone(&c, ChunkVersion(3), &ALL));
    // A current replica on a dead chunkserver is not gone.
    let dead = chunk(3, 100, &[(1, 3)]);
    assert!(!proven_gone(&dead, ChunkVersion(3), &ALL));
    assert!(matches!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&dead),
            false,
            &ALL,
            live_except(&[1])
        ),
        Start::Fence { .. }
    ));
    // The operator gives the dead replica up: the file closes at once.
    let given_up = Holders {
        loss_accepted: true,
        ..ALL
    };
    assert!(matches!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&dead),
            false,
            &given_up,
            live_except(&[1])
        ),
        Start::Lost { mint: true, .. }
    ));
    // ... but a reachable replica is still bumped and sealed.
    assert!(matches!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&dead),
            false,
            &given_up,
            live_except(&[])
        ),
        Start::Bump { .. }
    ));
    // A file already fenced in recovery closes at the version it has.
    let recovering = WriteState::Recovering {
        holder: A,
        old_version: ChunkVersion(3),
    };
    let fenced = chunk(4, 100, &[]);
    assert_eq!(
        decide(
            recovering,
            None,
            CHUNK,
            Some(&fenced),
            false,
            &ALL,
            live_except(&[])
        ),
        Start::Lost {
            old_version: ChunkVersion(3),
            version: ChunkVersion(4),
            mint: false
        }
    );
}

#[test]
fn replicas_excluded_by_a_pipeline_update_whose_grant_was_never_logged_stay_out() {
    // The writer held 2 over 3 and 4; 3 failed, the pipeline update minted 3 and
    // bumped 4, and the master stopped before logging the grant: the floor is
    // still 2. Readers were handed 4 alone (the master's version) and may have read
    // what it holds past 3's length; the shortest length with 3 would cut it (the
    // nemesis, seed 8126).
    let c = chunk(3, 0, &[(3, 2), (4, 3)]);
    let write = WriteState::Open {
        client: A,
        granted: ChunkVersion(2),
    };
    let start = decide(
        write,
        Some(A),
        CHUNK,
        Some(&c),
        false,
        &ALL,
        live_except(&[]),
    );
    let Start::Bump {
        old_version,
        version,
        targets,
        ..
    } = start
    else {
        panic!("expected a bump: {start:?}");
    };
    assert_eq!(ids(&targets), vec![4]);
    assert_eq!(
        (old_version, version),
        (ChunkVersion(3), ChunkVersion(4)),
        "the floor logged for the resumed attempts is the survivor's version"
    );
    // While the survivor is unreachable, 3 does not stand in for it: the file is
    // fenced and waits.
    assert_eq!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&c),
            false,
            &ALL,
            live_except(&[4])
        ),
        Start::Fence {
            holder: A,
            old_version: ChunkVersion(3),
            version: ChunkVersion(4)
        }
    );
    // Unless the operator gave the unreachable replicas up: then 3 is what is left.
    let given_up = Holders {
        loss_accepted: true,
        ..ALL
    };
    let Start::Bump { targets, .. } = decide(
        write,
        Some(A),
        CHUNK,
        Some(&c),
        false,
        &given_up,
        live_except(&[4]),
    ) else {
        panic!("expected a bump");
    };
    assert_eq!(ids(&targets), vec![3]);
    // A replica outside the granted pipeline that took the bump late does not
    // raise the floor.
    let pipeline = [ChunkserverId(3), ChunkserverId(4)];
    let c = chunk(3, 0, &[(3, 2), (4, 2), (5, 3)]);
    let in_pipeline = Holders {
        pipeline: Some(&pipeline),
        ..ALL
    };
    assert_eq!(
        open_floor(&c, ChunkVersion(2), &in_pipeline, live_except(&[])),
        ChunkVersion(2)
    );
    assert_eq!(
        open_floor(&c, ChunkVersion(2), &ALL, live_except(&[])),
        ChunkVersion(3)
    );
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
    } = decide(
        write,
        Some(A),
        CHUNK,
        Some(&c),
        false,
        &ALL,
        live_except(&[]),
    )
    else {
        panic!("expected a bump");
    };
    assert_eq!((old_version, version), (ChunkVersion(5), ChunkVersion(7)));
    assert_eq!(
        ids(&targets),
        vec![1, 2, 3],
        "all hold the acknowledged bytes"
    );
    // The bump reached one replica before the master gave up: it alone counts,
    // since from then on readers were handed it alone (`open_floor`); 2 holds the
    // acknowledged bytes too but may lack bytes a reader read from 1.
    let c = chunk(6, 0, &[(1, 6), (2, 5), (3, 4)]);
    let Start::Bump {
        targets,
        old_version,
        ..
    } = decide(
        write,
        Some(A),
        CHUNK,
        Some(&c),
        false,
        &ALL,
        live_except(&[]),
    )
    else {
        panic!("expected a bump");
    };
    assert_eq!(old_version, ChunkVersion(6));
    assert_eq!(
        ids(&targets),
        vec![1],
        "2 missed the bump to 6; 3 was dropped before 5 was granted"
    );
    // Once 6 is granted, replicas at 5 are stale.
    let granted = WriteState::Open {
        client: A,
        granted: ChunkVersion(6),
    };
    let Start::Bump { targets, .. } = decide(
        granted,
        Some(A),
        CHUNK,
        Some(&c),
        false,
        &ALL,
        live_except(&[]),
    ) else {
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
        decide(
            open,
            Some(A),
            CHUNK,
            Some(&c),
            false,
            &ALL,
            live_except(&[1, 2])
        ),
        Start::Fence {
            holder: A,
            old_version: ChunkVersion(5),
            version: ChunkVersion(7)
        }
    );
    let recovering = WriteState::Recovering {
        holder: A,
        old_version: ChunkVersion(5),
    };
    assert_eq!(
        decide(
            recovering,
            None,
            CHUNK,
            Some(&c),
            false,
            &ALL,
            live_except(&[1, 2])
        ),
        Start::Unreachable {
            holder: A,
            old_version: ChunkVersion(5)
        }
    );
    // When they are back, they are recovered.
    assert!(matches!(
        decide(
            recovering,
            None,
            CHUNK,
            Some(&c),
            false,
            &ALL,
            live_except(&[2])
        ),
        Start::Bump { .. }
    ));
}

#[test]
fn a_replica_outside_the_granted_pipeline_never_votes() {
    // The writer was granted version 5 with pipeline {1, 2}; chunkserver 3 was
    // frozen during the bump, applied it late and reports version 5 with fewer
    // bytes. Letting it vote would cut bytes acknowledged by 1 and 2.
    let c = chunk(5, 0, &[(1, 5), (2, 5), (3, 5)]);
    let pipeline = [ChunkserverId(1), ChunkserverId(2)];
    let holders = Holders {
        pipeline: Some(&pipeline),
        unreported: &[],
        ..Holders::default()
    };
    let write = WriteState::Open {
        client: A,
        granted: ChunkVersion(5),
    };
    let Start::Bump { targets, .. } = decide(
        write,
        Some(A),
        CHUNK,
        Some(&c),
        false,
        &holders,
        live_except(&[]),
    ) else {
        panic!("expected a bump");
    };
    assert_eq!(ids(&targets), vec![1, 2]);
    // Only the outsider is reachable: the writer is fenced and the file waits for
    // the pipeline instead of taking the outsider's length.
    assert!(matches!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&c),
            false,
            &holders,
            live_except(&[1, 2])
        ),
        Start::Fence { .. }
    ));
    // The pipeline's servers reported without it: gone, whatever others hold
    // or whoever else has not reported.
    let others = [ChunkserverId(7)];
    let only_outsider = chunk(5, 0, &[(3, 5)]);
    let holders = Holders {
        pipeline: Some(&pipeline),
        unreported: &others,
        ..Holders::default()
    };
    assert!(proven_gone(&only_outsider, ChunkVersion(5), &holders));
    let unreported_member = [ChunkserverId(2)];
    assert!(!proven_gone(
        &only_outsider,
        ChunkVersion(5),
        &Holders {
            pipeline: Some(&pipeline),
            unreported: &unreported_member,
            ..Holders::default()
        }
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
    let targets = recoverable_targets(&c, ChunkVersion(5), None, live_except(&[]));
    assert_eq!(ids(&targets), vec![1, 2]);
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

#[test]
fn a_chunk_added_but_never_granted_nor_reported_is_dropped_not_lost() {
    let write = WriteState::Open {
        client: A,
        granted: ChunkVersion(1),
    };
    let never = Holders {
        never_granted: true,
        ..ALL
    };
    let empty = chunk(1, 0, &[]);
    assert_eq!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&empty),
            false,
            &never,
            live_except(&[])
        ),
        Start::DropEmpty
    );
    // A grant was logged: a writer may have had bytes acknowledged on replicas
    // that are gone now; the chunk is reported missing, never dropped.
    assert!(matches!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&empty),
            false,
            &ALL,
            live_except(&[])
        ),
        Start::Lost { .. }
    ));
    // Committed bytes, or a replica ever reported (even a stale one): not dropped.
    let committed = chunk(1, 10, &[]);
    assert!(matches!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&committed),
            false,
            &never,
            live_except(&[])
        ),
        Start::Lost { .. }
    ));
    let reported = chunk(2, 0, &[(1, 1)]);
    let write2 = WriteState::Open {
        client: A,
        granted: ChunkVersion(2),
    };
    assert!(matches!(
        decide(
            write2,
            Some(A),
            CHUNK,
            Some(&reported),
            false,
            &never,
            live_except(&[])
        ),
        Start::Lost { .. }
    ));
    // A chunkserver that has not reported since the master started may hold it.
    let waiting = Holders {
        never_granted: true,
        ..UNREPORTED
    };
    assert!(matches!(
        decide(
            write,
            Some(A),
            CHUNK,
            Some(&empty),
            false,
            &waiting,
            live_except(&[])
        ),
        Start::Fence { .. }
    ));
}
