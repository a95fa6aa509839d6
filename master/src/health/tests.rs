//! The replica-health rules as pure functions of the state and the time: no sockets,
//! no sleeps.

use super::*;
use crate::state::{CorruptReport, Settings};
use rand::rngs::StdRng;
use rand::SeedableRng;
use stampfs_proto::{
    AddChunk, Append, ChunkCommit, ClientId, Close, ClusterKey, Create, Delete, InodeId, Register,
    ReplicaReport,
};

pub(super) const A: ClientId = ClientId(0xa);
const B: ClientId = ClientId(0xb);
pub(super) const GIB: u64 = 1 << 30;
/// A time after registration at which every server is live.
pub(super) const NOW: u64 = 1_000;

pub(super) fn settings() -> Settings {
    Settings::for_tests()
}

pub(super) fn id(n: u64) -> ChunkserverId {
    ChunkserverId(n)
}

/// A state with `n` chunkservers (ids 1..=n); server `i` has `used[i]` GiB used of 100.
pub(super) fn servers(settings: Settings, used: &[u64]) -> MasterState {
    let mut st = MasterState::new(settings);
    for (i, u) in used.iter().enumerate() {
        st.register(
            &Register {
                id: None,
                addr: format!("127.0.0.1:{}", 9001 + i),
                capacity: 100 * GIB,
                used: u * GIB,
                replicas: vec![],
                session: 0,
            },
            0,
            st.ack_mark(),
        )
        .expect("register");
    }
    st
}

pub(super) fn beat(st: &mut MasterState, ids: &[u64], now: u64) {
    for i in ids {
        let cs = st.registry.get(id(*i)).expect("registered").clone();
        st.registry
            .heartbeat(id(*i), cs.capacity, cs.used, 0, 0, now);
    }
}

pub(super) fn rep(h: ChunkHandle, v: u64, state: ReplicaState) -> ReplicaReport {
    ReplicaReport {
        handle: h,
        version: ChunkVersion(v),
        length: 100,
        state,
    }
}

/// Sets the replicas of `h`: `(server, version, state)`.
pub(super) fn set(st: &mut MasterState, h: ChunkHandle, replicas: &[(u64, u64, ReplicaState)]) {
    let acks: Vec<_> = replicas
        .iter()
        .map(|(s, v, state)| (id(*s), rep(h, *v, *state)))
        .collect();
    st.record_replicas(h, &acks);
}

pub(super) fn create(st: &mut MasterState, path: &str, client: ClientId) -> InodeId {
    st.create(
        &Create {
            path: path.into(),
            client,
            replication: None,
            chunk_size: None,
            overwrite: false,
            attr: None,
            caller: None,
        },
        0,
        1,
    )
    .expect("create")
    .inode
}

/// A file with `n` chunks of 100 bytes, left open (`close: false`) or closed; every
/// chunk at version 1 with no replicas yet.
pub(super) fn file(
    st: &mut MasterState,
    path: &str,
    n: usize,
    close: bool,
) -> (InodeId, Vec<ChunkHandle>) {
    let ino = create(st, path, A);
    let mut hs: Vec<ChunkHandle> = Vec::new();
    for _ in 0..n {
        let p = st
            .add_chunk(
                &AddChunk {
                    path: path.into(),
                    client: A,
                    previous: hs.last().map(|h| ChunkCommit {
                        handle: *h,
                        length: 100,
                    }),
                },
                ino,
                0,
                1,
            )
            .expect("chunk");
        hs.push(p.bump.handle);
    }
    if close {
        st.close(
            &Close {
                path: path.into(),
                client: A,
                last: hs.last().map(|h| ChunkCommit {
                    handle: *h,
                    length: 100,
                }),
                keep_mtime: false,
            },
            ino,
            0,
            1,
        )
        .expect("close");
    }
    (ino, hs)
}

fn plan_now(st: &MasterState, now: u64) -> Vec<Action> {
    plan(st, now, 0, &mut StdRng::seed_from_u64(7))
}

/// One worker pass (prune, plan, record), as the service runs it.
pub(super) fn pass(st: &mut MasterState, now: u64) -> Vec<Action> {
    st.health_pass(now, 0, &mut StdRng::seed_from_u64(7)).1
}

pub(super) fn deletes(
    actions: &[Action],
) -> Vec<(ChunkserverId, ChunkHandle, ChunkVersion, DeleteReason)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete {
                server,
                handle,
                max_version,
                reason,
            } => Some((*server, *handle, *max_version, *reason)),
            _ => None,
        })
        .collect()
}

pub(super) fn copies(actions: &[Action]) -> Vec<(ChunkHandle, ChunkserverId, ChunkserverId)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Replicate {
                handle,
                source,
                target,
                ..
            } => Some((*handle, *source, target.id)),
            _ => None,
        })
        .collect()
}

/// The chunkserver `s` reports exactly `replicas` (a full chunk report).
pub(super) fn report(st: &mut MasterState, s: u64, replicas: &[ReplicaReport]) {
    st.apply_report(id(s), replicas, st.ack_mark());
}

use ReplicaState::{Finalized as F, Writing as W};

#[test]
fn a_stale_replica_is_deleted_within_its_version_then_replaced() {
    let mut st = servers(settings(), &[10, 10, 10]);
    let (ino, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    set(&mut st, h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    // Reopen and close: version 2 on servers 1 and 2; server 3 missed the bump.
    st.append(
        &Append {
            path: "/f".into(),
            client: B,
            caller: None,
        },
        ino,
        0,
        1,
    )
    .expect("append");
    st.close(
        &Close {
            path: "/f".into(),
            client: B,
            last: None,
            keep_mtime: false,
        },
        ino,
        0,
        1,
    )
    .expect("close");
    set(&mut st, h, &[(1, 2, F), (2, 2, F), (3, 1, F)]);
    beat(&mut st, &[1, 2, 3], NOW);
    let loc = st
        .locations("/f", A, &ClusterKey::from_bytes([1; 32]), NOW)
        .expect("locations");
    assert_eq!(
        loc.chunks[0].replicas.len(),
        2,
        "the stale one is never handed out"
    );

    let a = pass(&mut st, NOW);
    assert_eq!(
        deletes(&a),
        vec![(id(3), h, ChunkVersion(1), DeleteReason::Stale)]
    );
    assert!(
        copies(&a).is_empty(),
        "server 3 still holds a replica: no target"
    );
    let fsck = st.fsck(None, NOW).expect("fsck");
    assert!(!fsck.healthy);
    assert_eq!(
        (fsck.total.under_replicated, fsck.total.stale_replicas),
        (1, 1)
    );
    // Ordered once, delivered in the heartbeat reply.
    assert!(deletes(&pass(&mut st, NOW + 100)).is_empty());
    assert_eq!(
        st.health.take_commands(id(3), 10),
        vec![ChunkCommand::Delete {
            handle: h,
            max_version: ChunkVersion(1)
        }]
    );
    // Server 3 deleted it: now it is the target of a copy at the same version.
    report(&mut st, 3, &[]);
    let a = pass(&mut st, NOW + 200);
    let c = copies(&a);
    assert_eq!(c.len(), 1, "{a:?}");
    assert_eq!((c[0].0, c[0].2), (h, id(3)));
    assert!(matches!(a[0], Action::Replicate { version, .. } if version == ChunkVersion(2)));
    assert_eq!(st.health.copies().len(), 1);
    // The copy arrives; the chunk is healthy.
    report(&mut st, 3, &[rep(h, 2, F)]);
    let (pruned, a) = st.health_pass(NOW + 300, 0, &mut StdRng::seed_from_u64(1));
    assert_eq!(pruned.copied.len(), 1);
    assert!(a.is_empty(), "{a:?}");
    assert!(st.fsck(None, NOW + 300).expect("fsck").healthy);
}

#[test]
fn commands_delivered_to_a_chunkserver_that_restarted_are_ordered_again_at_once() {
    let mut st = servers(settings(), &[10, 10, 10]);
    let (ino, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    set(&mut st, h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    st.append(
        &Append {
            path: "/f".into(),
            client: B,
            caller: None,
        },
        ino,
        0,
        1,
    )
    .expect("append");
    st.close(
        &Close {
            path: "/f".into(),
            client: B,
            last: None,
            keep_mtime: false,
        },
        ino,
        0,
        1,
    )
    .expect("close");
    set(&mut st, h, &[(1, 2, F), (2, 2, F), (3, 1, F)]);
    beat(&mut st, &[1, 2, 3], NOW);
    assert_eq!(deletes(&pass(&mut st, NOW)).len(), 1);
    // Delivered in a heartbeat reply; then server 3 is killed before it deletes.
    assert_eq!(st.health.take_commands(id(3), 10).len(), 1);
    assert!(deletes(&pass(&mut st, NOW + 100)).is_empty(), "in flight");
    // It comes back still holding the stale replica and registers again: the
    // deletion is ordered again on the next pass, not after the replication timeout.
    st.register(
        &Register {
            id: Some(id(3)),
            addr: "127.0.0.1:9003".into(),
            capacity: 100 * GIB,
            used: 10 * GIB,
            replicas: vec![rep(h, 1, F)],
            session: 0,
        },
        NOW + 200,
        st.ack_mark(),
    )
    .expect("register");
    assert_eq!(
        deletes(&pass(&mut st, NOW + 300)),
        vec![(id(3), h, ChunkVersion(1), DeleteReason::Stale)]
    );
    // A command still waiting for its heartbeat reply is not ordered twice.
    st.register(
        &Register {
            id: Some(id(3)),
            addr: "127.0.0.1:9003".into(),
            capacity: 100 * GIB,
            used: 10 * GIB,
            replicas: vec![rep(h, 1, F)],
            session: 0,
        },
        NOW + 400,
        st.ack_mark(),
    )
    .expect("register");
    assert!(deletes(&pass(&mut st, NOW + 500)).is_empty());
    assert_eq!(st.health.queued(id(3)), 1);
}

#[test]
fn the_last_chunk_of_an_open_or_recovering_file_is_never_touched() {
    let mut st = servers(settings(), &[10, 10, 10, 10]);
    let (_, hs) = file(&mut st, "/open", 2, false);
    // Both chunks have a replica below the master's version and are under-replicated.
    for h in &hs {
        st.chunks.get_mut(*h).expect("chunk").version = ChunkVersion(2);
        set(&mut st, *h, &[(1, 2, F), (2, 1, W)]);
    }
    beat(&mut st, &[1, 2, 3, 4], NOW);
    let a = plan_now(&st, NOW);
    let touched: Vec<ChunkHandle> = a
        .iter()
        .filter_map(|a| a.command().map(|(_, c)| c))
        .map(|c| match c {
            ChunkCommand::Delete { handle, .. }
            | ChunkCommand::Replicate { handle, .. }
            | ChunkCommand::Finalize { handle, .. }
            | ChunkCommand::Truncate { handle, .. }
            | ChunkCommand::BumpVersion { handle, .. }
            | ChunkCommand::Info { handle } => handle,
        })
        .collect();
    assert!(
        touched.contains(&hs[0]),
        "the complete chunk is handled: {a:?}"
    );
    assert!(
        !touched.contains(&hs[1]),
        "the open last chunk is not: {a:?}"
    );
    let open = st.resolve_path("/open").expect("f");
    assert!(settled(&st, open, st.ns.file(open).expect("f"), 0));
    let fsck = st.fsck(None, NOW).expect("fsck");
    assert_eq!(fsck.total.open_files, 1);
    assert_eq!(fsck.files[0].state, stampfs_proto::FileState::Open);
}

#[test]
fn replicas_above_the_masters_version_are_kept_aside() {
    let mut st = servers(settings(), &[10, 10, 10, 10]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    set(&mut st, h, &[(1, 1, F), (2, 1, F), (3, 7, F)]);
    beat(&mut st, &[1, 2, 3, 4], NOW);
    let a = plan_now(&st, NOW);
    assert!(deletes(&a).is_empty(), "never deleted: {a:?}");
    let c = copies(&a);
    assert_eq!(c.len(), 1, "not counted as a replica: {a:?}");
    assert_ne!(c[0].1, id(3), "never a source");
    assert_eq!(c[0].2, id(4), "its server is a holder, never a target");
    let fsck = st.fsck(None, NOW).expect("fsck");
    assert_eq!(fsck.total.ahead_replicas, 1);
    assert!(!fsck.healthy);
    assert_eq!(fsck.files[0].problems[0].ahead, 1);
}

#[test]
fn copies_go_most_urgent_first_within_the_stream_cap() {
    let mut s = settings();
    s.max_replication_streams = 1;
    let mut st = servers(s, &[10, 10, 10, 10, 10, 10]);
    let (_, two) = file(&mut st, "/two", 1, true);
    let (_, one) = file(&mut st, "/one", 1, true);
    let (_, writing) = file(&mut st, "/w", 1, true);
    set(&mut st, two[0], &[(1, 1, F), (2, 1, F)]);
    set(&mut st, one[0], &[(3, 1, F)]);
    set(&mut st, writing[0], &[(4, 1, W)]);
    beat(&mut st, &[1, 2, 3, 4, 5, 6], NOW);
    let a = pass(&mut st, NOW);
    let c = copies(&a);
    // The single-replica chunk first; each server in at most one copy.
    assert_eq!(c[0].0, one[0], "{a:?}");
    assert_eq!(c[0].1, id(3));
    let mut busy: Vec<ChunkserverId> = c.iter().flat_map(|(_, s, t)| [*s, *t]).collect();
    let n = busy.len();
    busy.sort();
    busy.dedup();
    assert_eq!(busy.len(), n, "one stream per server: {c:?}");
    assert!(
        !c.iter().any(|(h, _, _)| *h == writing[0]),
        "a Writing replica is not copied from"
    );
    assert!(
        a.iter().any(|a| matches!(a, Action::Finalize { server, handle, .. } if *server == id(4) && *handle == writing[0])),
        "it is finalized at the committed length: {a:?}"
    );
    for (h, _, t) in &c {
        let info = st.chunks.get(*h).expect("chunk");
        assert!(info.replica(*t).is_none(), "targets hold no replica");
    }
}

#[test]
fn lost_copies_are_ordered_again() {
    let mut st = servers(settings(), &[10, 10, 10, 10]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    set(&mut st, h, &[(1, 1, F), (2, 1, F)]);
    beat(&mut st, &[1, 2, 3, 4], NOW);
    let first = copies(&pass(&mut st, NOW));
    assert_eq!(first.len(), 1);
    assert!(copies(&pass(&mut st, NOW + 1_000)).is_empty(), "in flight");
    beat(&mut st, &[1, 2, 3, 4], NOW + 25_000);
    // Past the timeout: dropped, its queued command too, and ordered again.
    let (pruned, a) = st.health_pass(NOW + 31_000, 0, &mut StdRng::seed_from_u64(3));
    assert_eq!(pruned.lost.len(), 1, "{pruned:?}");
    assert_eq!(pruned.lost[0].1, "it timed out");
    assert_eq!(copies(&a).len(), 1);
    let queued = st.health.take_commands(first[0].1, 10);
    assert_eq!(
        queued
            .iter()
            .filter(|c| matches!(c, ChunkCommand::Replicate { .. }))
            .count(),
        usize::from(copies(&a)[0].1 == first[0].1),
        "the lost copy's command is not sent: {queued:?}"
    );
    // A target that dies drops the copy at once.
    let target = copies(&a)[0].2;
    let others: Vec<u64> = [1, 2, 3, 4]
        .into_iter()
        .filter(|s| id(*s) != target)
        .collect();
    beat(&mut st, &others, NOW + 40_000);
    let (pruned, _) = st.health_pass(NOW + 40_500, 0, &mut StdRng::seed_from_u64(3));
    assert_eq!(pruned.lost.len(), 1);
    assert_eq!(pruned.lost[0].1, "the target died");
}

#[test]
fn over_replicated_chunks_drop_the_fullest_servers() {
    let mut st = servers(settings(), &[10, 90, 50, 95, 20]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    set(
        &mut st,
        h,
        &[(1, 1, F), (2, 1, F), (3, 1, F), (4, 1, F), (5, 1, F)],
    );
    beat(&mut st, &[1, 2, 3, 4, 5], NOW);
    let d = deletes(&pass(&mut st, NOW));
    assert_eq!(
        d,
        vec![
            (id(4), h, ChunkVersion(1), DeleteReason::OverReplicated),
            (id(2), h, ChunkVersion(1), DeleteReason::OverReplicated)
        ]
    );
    assert!(deletes(&pass(&mut st, NOW + 100)).is_empty(), "pending");
    assert!(st.fsck(None, NOW).expect("fsck").healthy);
}

#[test]
fn a_corrupt_replica_is_excluded_replaced_then_deleted() {
    let mut st = servers(settings(), &[10, 10, 10, 10]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    set(&mut st, h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    beat(&mut st, &[1, 2, 3, 4], NOW);
    assert_eq!(
        st.report_corrupt(h, id(2)),
        CorruptReport::Excluded {
            version: ChunkVersion(1)
        }
    );
    assert_eq!(st.report_corrupt(h, id(2)), CorruptReport::AlreadyMarked);
    assert_eq!(
        st.report_corrupt(ChunkHandle(999), id(2)),
        CorruptReport::UnknownChunk
    );
    let loc = st
        .locations("/f", A, &ClusterKey::from_bytes([1; 32]), NOW)
        .expect("locations");
    assert!(loc.chunks[0]
        .replicas
        .iter()
        .all(|r| r.chunkserver != id(2)));
    // A full report still listing it does not bring it back.
    report(&mut st, 2, &[rep(h, 1, F)]);
    assert!(st.chunks.get(h).expect("c").replica(id(2)).is_none());
    let a = pass(&mut st, NOW);
    assert!(deletes(&a).is_empty(), "not before it is replaced: {a:?}");
    let c = copies(&a);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].2, id(4), "server 2 still holds it: not a target");
    assert_eq!(st.fsck(None, NOW).expect("fsck").total.corrupt_replicas, 1);
    // Replaced: now it goes.
    report(&mut st, 4, &[rep(h, 1, F)]);
    let d = deletes(&pass(&mut st, NOW + 100));
    assert_eq!(d, vec![(id(2), h, ChunkVersion(1), DeleteReason::Corrupt)]);
    report(&mut st, 2, &[]);
    pass(&mut st, NOW + 200);
    assert!(st.fsck(None, NOW + 200).expect("fsck").healthy);
    assert_eq!(st.health.corrupt_count(), 0);

    // With nowhere else to put a replica, it goes once one good replica exists.
    let mut st = servers(settings(), &[10, 10, 10]);
    let (_, hs) = file(&mut st, "/g", 1, true);
    let h = hs[0];
    set(&mut st, h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    beat(&mut st, &[1, 2, 3], NOW);
    st.report_corrupt(h, id(3));
    let d = deletes(&pass(&mut st, NOW));
    assert_eq!(d, vec![(id(3), h, ChunkVersion(1), DeleteReason::Corrupt)]);
    // A chunkserver that moved it aside itself: its next report drops the mark and
    // it can take the new copy.
    report(&mut st, 3, &[]);
    let c = copies(&pass(&mut st, NOW + 100));
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].2, id(3));
    // A late report from a reader about a replica already gone changes nothing.
    assert_eq!(st.report_corrupt(h, id(3)), CorruptReport::Gone);
}

#[test]
fn orphans_are_deleted_after_the_grace_only() {
    let mut st = servers(settings(), &[10, 10]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    set(&mut st, hs[0], &[(1, 1, F)]);
    let orphan = ChunkHandle(777);
    // Known chunks are never orphans, fresh ones included.
    report(&mut st, 1, &[rep(hs[0], 1, F), rep(orphan, 4, F)]);
    beat(&mut st, &[1, 2], NOW);
    assert!(deletes(&pass(&mut st, NOW)).is_empty(), "within the grace");
    assert!(deletes(&pass(&mut st, NOW + 4_999)).is_empty());
    beat(&mut st, &[1, 2], NOW + 5_000);
    let d = deletes(&pass(&mut st, NOW + 5_000));
    assert_eq!(
        d,
        vec![(id(1), orphan, ChunkVersion(4), DeleteReason::Orphan)]
    );
    // Gone from the next report: forgotten.
    report(&mut st, 1, &[rep(hs[0], 1, F)]);
    pass(&mut st, NOW + 5_100);
    assert_eq!(st.health.orphan_seen(id(1), orphan), None);
    assert_eq!(st.fsck(None, NOW).expect("fsck").orphan_replicas, 0);
}

#[test]
fn deleted_chunks_replicas_are_ordered_deleted_at_once() {
    let mut st = servers(settings(), &[10, 10, 10]);
    let (_, hs) = file(&mut st, "/f", 2, true);
    for h in &hs {
        set(&mut st, *h, &[(1, 1, F), (2, 1, F)]);
    }
    st.delete(
        &Delete {
            path: "/f".into(),
            recursive: false,
            caller: None,
        },
        0,
        1,
    )
    .expect("rm");
    assert!(st.chunks.is_empty());
    for s in [1, 2] {
        let mut got = st.health.take_commands(id(s), 10);
        got.sort_by_key(|c| match c {
            ChunkCommand::Delete { handle, .. } => *handle,
            _ => ChunkHandle(0),
        });
        assert_eq!(
            got,
            hs.iter()
                .map(|h| ChunkCommand::Delete {
                    handle: *h,
                    max_version: ChunkVersion(1)
                })
                .collect::<Vec<_>>()
        );
    }
    assert!(st.health.take_commands(id(3), 10).is_empty());
}

#[test]
fn dead_servers_are_neither_counted_nor_sources_nor_targets() {
    let mut st = servers(settings(), &[10, 10, 10, 10]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    set(&mut st, h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    // Server 3 and 4 stop beating.
    beat(&mut st, &[1, 2], 20_000);
    let a = plan_now(&st, 20_000);
    assert!(copies(&a).is_empty(), "server 4 is dead too: {a:?}");
    let f = st.fsck(None, 20_000).expect("fsck");
    assert_eq!(f.total.under_replicated, 1);
    assert_eq!(f.files[0].problems[0].live, 2);
    beat(&mut st, &[1, 2, 4], 21_000);
    let c = copies(&plan_now(&st, 21_000));
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].2, id(4));
    // No live replica: missing, nothing to copy from.
    let f = st.fsck(None, 40_000).expect("fsck");
    assert_eq!(f.total.missing, 1);
    assert!(copies(&plan_now(&st, 40_000)).is_empty());
    let r = st.cluster_report(21_000);
    assert_eq!(r.chunkservers.len(), 4);
    assert_eq!(r.chunks.chunks, 1);
}

#[test]
fn a_missing_chunk_keeps_its_stale_replicas() {
    let mut st = servers(settings(), &[10, 10, 10]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    st.chunks.get_mut(h).expect("chunk").version = ChunkVersion(2);
    set(&mut st, h, &[(1, 1, F), (2, 2, F)]);
    // Server 2 (the only up-to-date replica) is dead.
    beat(&mut st, &[1, 3], 20_000);
    assert!(deletes(&plan_now(&st, 20_000)).is_empty());
    let f = st.fsck(None, 20_000).expect("fsck");
    assert_eq!((f.total.missing, f.total.stale_replicas), (1, 1));
    // It is back: the stale replica goes.
    beat(&mut st, &[1, 2, 3], 21_000);
    assert_eq!(
        deletes(&plan_now(&st, 21_000)),
        vec![(id(1), h, ChunkVersion(1), DeleteReason::Stale)]
    );
}

fn rep_len(h: ChunkHandle, v: u64, length: u64, state: ReplicaState) -> ReplicaReport {
    ReplicaReport {
        handle: h,
        version: ChunkVersion(v),
        length,
        state,
    }
}

/// A closed 100-byte chunk on servers 1..=3 reopened by B at version 2: servers 1 and
/// 2 took the bump, server 3 timed out; B wrote to 300 bytes and closed. Returns the
/// chunk.
fn appended_without_server_3(st: &mut MasterState) -> ChunkHandle {
    let (ino, hs) = file(st, "/f", 1, true);
    let h = hs[0];
    set(st, h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    let a = st
        .append(
            &Append {
                path: "/f".into(),
                client: B,
                caller: None,
            },
            ino,
            0,
            1,
        )
        .expect("append");
    let bump = a.bump.expect("re-leased");
    st.record_replicas(
        h,
        &[
            (id(1), rep_len(h, 2, 100, W)),
            (id(2), rep_len(h, 2, 100, W)),
        ],
    );
    st.grant_made(&bump, B, &[id(1), id(2)], 0)
        .expect("granted");
    st.close(
        &Close {
            path: "/f".into(),
            client: B,
            last: Some(ChunkCommit {
                handle: h,
                length: 300,
            }),
            keep_mtime: false,
        },
        ino,
        0,
        1,
    )
    .expect("close");
    st.record_replicas(
        h,
        &[
            (id(1), rep_len(h, 2, 300, F)),
            (id(2), rep_len(h, 2, 300, F)),
        ],
    );
    h
}

#[test]
fn a_replica_that_took_a_bump_late_is_short_never_served_and_replaced() {
    let mut st = servers(settings(), &[10, 10, 10]);
    let h = appended_without_server_3(&mut st);
    beat(&mut st, &[1, 2, 3], NOW);
    // Server 3 wakes up and applies the bump it was sent: at the master's version,
    // but with only the 100 bytes it had.
    let s = st.apply_report(id(3), &[rep_len(h, 2, 100, W)], st.ack_mark());
    assert_eq!((s.current, s.short), (0, 1));
    let info = st.chunks.get(h).expect("chunk");
    assert_eq!(
        info.class_of(info.replica(id(3)).expect("known")),
        crate::chunk_table::ReplicaClass::Short
    );
    // A report from server 1 built before its finalize (Writing, 100 bytes) arriving
    // late does not make it short.
    st.apply_report(id(1), &[rep_len(h, 2, 100, W)], st.ack_mark());
    let loc = st
        .locations("/f", A, &ClusterKey::from_bytes([1; 32]), NOW)
        .expect("locations");
    let mut got: Vec<_> = loc.chunks[0]
        .replicas
        .iter()
        .map(|r| r.chunkserver)
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![id(1), id(2)],
        "the short replica is never handed out"
    );
    assert!(loc.chunks[0].complete);
    let fsck = st.fsck(None, NOW).expect("fsck");
    assert_eq!(
        (fsck.total.under_replicated, fsck.total.stale_replicas),
        (1, 1)
    );
    // Nowhere else to put a copy: it goes (bounded by its version), then server 3
    // gets a good copy from 1 or 2 (never from itself).
    let a = pass(&mut st, NOW);
    assert_eq!(
        deletes(&a),
        vec![(id(3), h, ChunkVersion(2), DeleteReason::Short)]
    );
    assert!(copies(&a).is_empty());
    report(&mut st, 3, &[]);
    let c = copies(&pass(&mut st, NOW + 100));
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].2, id(3));
    assert!(c[0].1 == id(1) || c[0].1 == id(2));
    report(&mut st, 3, &[rep_len(h, 2, 300, F)]);
    pass(&mut st, NOW + 200);
    assert!(st.fsck(None, NOW + 200).expect("fsck").healthy);
}

#[test]
fn a_short_replica_is_replaced_before_it_is_deleted_when_there_is_room() {
    let mut st = servers(settings(), &[10, 10, 10, 10]);
    let h = appended_without_server_3(&mut st);
    beat(&mut st, &[1, 2, 3, 4], NOW);
    st.apply_report(id(3), &[rep_len(h, 2, 100, W)], st.ack_mark());
    let a = pass(&mut st, NOW);
    assert!(deletes(&a).is_empty(), "{a:?}");
    let c = copies(&a);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].2, id(4));
    assert_ne!(c[0].1, id(3), "never copied from");
    report(&mut st, 4, &[rep_len(h, 2, 300, F)]);
    assert_eq!(
        deletes(&pass(&mut st, NOW + 100)),
        vec![(id(3), h, ChunkVersion(2), DeleteReason::Short)]
    );
}

// ------------------------------------------------ corruption reports are hints

use crate::health::{CorruptHint, Verified, VerifyRefusal};
use stampfs_proto::Verification;

fn clean(h: ChunkHandle, v: u64) -> Verification {
    Verification::Clean {
        replica: rep(h, v, F),
    }
}

fn handed_out(st: &MasterState, path: &str, now: u64) -> Vec<ChunkserverId> {
    let loc = st
        .locations(path, A, &ClusterKey::from_bytes([1; 32]), now)
        .expect("locations");
    let mut ids: Vec<ChunkserverId> = loc.chunks[0]
        .replicas
        .iter()
        .map(|r| r.chunkserver)
        .collect();
    ids.sort();
    ids
}

/// Four live servers and a closed one-chunk file `/f` on servers 1, 2 and 3.
fn three_replicas() -> (MasterState, ChunkHandle) {
    let mut st = servers(settings(), &[10, 10, 10, 10]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    set(&mut st, hs[0], &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    beat(&mut st, &[1, 2, 3, 4], NOW);
    (st, hs[0])
}

#[test]
fn a_report_is_a_hint_and_a_replica_verified_clean_stays() {
    let (mut st, h) = three_replicas();
    assert_eq!(
        st.corrupt_hint(h, id(2), NOW),
        CorruptHint::Verify {
            addr: "127.0.0.1:9002".into(),
            version: ChunkVersion(1)
        }
    );
    // Nothing changed yet: still handed out, counted, healthy; nothing planned.
    assert_eq!(handed_out(&st, "/f", NOW), vec![id(1), id(2), id(3)]);
    assert!(pass(&mut st, NOW).is_empty());
    assert!(st.fsck(None, NOW).expect("fsck").healthy);
    assert_eq!(st.health.corrupt_count(), 0);
    assert_eq!(st.health.verifying(id(2)), 1);
    // A flood of reports while it runs asks for nothing more.
    for i in 0..1_000 {
        assert_eq!(
            st.corrupt_hint(h, id(2), NOW + i),
            CorruptHint::Refused(VerifyRefusal::Running)
        );
    }
    // Clean: it stays, and nothing is ordered.
    assert_eq!(st.verified(h, id(2), &clean(h, 1)), Verified::Clean);
    assert_eq!(st.health.verifying(id(2)), 0);
    assert_eq!(handed_out(&st, "/f", NOW + 100), vec![id(1), id(2), id(3)]);
    assert!(pass(&mut st, NOW + 100).is_empty());
    assert!(st.fsck(None, NOW + 100).expect("fsck").healthy);
    assert_eq!(st.health.corrupt_count(), 0);
    // Within the interval, more reports are ignored; after it, one more verification.
    assert_eq!(
        st.corrupt_hint(h, id(2), NOW + 1_000),
        CorruptHint::Refused(VerifyRefusal::Recent { ago_ms: 1_000 })
    );
    let later = NOW + VERIFY_INTERVAL_MS;
    beat(&mut st, &[1, 2, 3, 4], later);
    pass(&mut st, later);
    assert!(matches!(
        st.corrupt_hint(h, id(2), later),
        CorruptHint::Verify { .. }
    ));
}

#[test]
fn a_replica_verified_corrupt_is_excluded_replaced_then_deleted_as_before() {
    let (mut st, h) = three_replicas();
    assert!(matches!(
        st.corrupt_hint(h, id(2), NOW),
        CorruptHint::Verify { .. }
    ));
    let found = Verification::Corrupt {
        version: ChunkVersion(1),
        offset: 65_536,
    };
    assert_eq!(
        st.verified(h, id(2), &found),
        Verified::Corrupt(CorruptReport::Excluded {
            version: ChunkVersion(1)
        })
    );
    assert_eq!(handed_out(&st, "/f", NOW), vec![id(1), id(3)]);
    // A report naming it again: known already, nothing to verify.
    assert_eq!(st.corrupt_hint(h, id(2), NOW), CorruptHint::AlreadyMarked);
    let a = pass(&mut st, NOW);
    assert!(deletes(&a).is_empty(), "not before it is replaced: {a:?}");
    let c = copies(&a);
    assert_eq!(c.len(), 1, "{a:?}");
    assert_eq!(c[0].2, id(4), "server 2 may still hold it: not a target");
    assert_ne!(c[0].1, id(2), "never a source");
    assert_eq!(st.fsck(None, NOW).expect("fsck").total.corrupt_replicas, 1);
    // Replaced; server 2 had moved it aside: its report drops the mark.
    report(&mut st, 4, &[rep(h, 1, F)]);
    report(&mut st, 2, &[]);
    pass(&mut st, NOW + 100);
    assert!(st.fsck(None, NOW + 100).expect("fsck").healthy);
    assert_eq!(st.health.corrupt_count(), 0);
}

#[test]
fn a_replica_absent_on_verification_is_excluded() {
    let (mut st, h) = three_replicas();
    // The chunkserver moved it aside itself (its own read or scrub) and reported it.
    assert!(matches!(
        st.corrupt_hint(h, id(3), NOW),
        CorruptHint::Verify { .. }
    ));
    assert_eq!(
        st.verified(h, id(3), &Verification::Absent),
        Verified::Absent(CorruptReport::Excluded {
            version: ChunkVersion(1)
        })
    );
    assert_eq!(handed_out(&st, "/f", NOW), vec![id(1), id(2)]);
    assert_eq!(copies(&pass(&mut st, NOW)).len(), 1);

    // Its chunk report (which no longer lists it) may come before the answer: then the
    // answer finds it gone, and the report alone made the chunk under-replicated.
    let (mut st, h) = three_replicas();
    assert!(matches!(
        st.corrupt_hint(h, id(3), NOW),
        CorruptHint::Verify { .. }
    ));
    report(&mut st, 3, &[]);
    assert_eq!(
        st.verified(h, id(3), &Verification::Absent),
        Verified::Absent(CorruptReport::Gone)
    );
    assert_eq!(st.fsck(None, NOW).expect("fsck").total.under_replicated, 1);
}

#[test]
fn verifications_are_bounded_per_chunkserver() {
    let mut st = servers(settings(), &[10, 10, 10]);
    let n = MAX_VERIFIES_PER_SERVER + 4;
    let (_, hs) = file(&mut st, "/many", n, true);
    for h in &hs {
        set(&mut st, *h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    }
    beat(&mut st, &[1, 2, 3], NOW);
    let verify = |st: &mut MasterState, h: ChunkHandle, s: u64| {
        matches!(st.corrupt_hint(h, id(s), NOW), CorruptHint::Verify { .. })
    };
    // At most MAX_VERIFYING_PER_SERVER at once on one server; others are not held up.
    for h in &hs[..MAX_VERIFYING_PER_SERVER] {
        assert!(verify(&mut st, *h, 1));
    }
    assert_eq!(
        st.corrupt_hint(hs[MAX_VERIFYING_PER_SERVER], id(1), NOW),
        CorruptHint::Refused(VerifyRefusal::Busy)
    );
    assert!(verify(&mut st, hs[MAX_VERIFYING_PER_SERVER], 2));
    // As they finish, more start, up to MAX_VERIFIES_PER_SERVER per interval.
    let mut started = MAX_VERIFYING_PER_SERVER;
    for (i, h) in hs.iter().enumerate() {
        st.verified(*h, id(1), &clean(*h, 1));
        let next = hs[(i + MAX_VERIFYING_PER_SERVER) % n];
        if verify(&mut st, next, 1) {
            started += 1;
        }
    }
    assert_eq!(started, MAX_VERIFIES_PER_SERVER);
    assert_eq!(st.health.verifying(id(1)), 0);
    assert_eq!(
        st.corrupt_hint(hs[n - 1], id(1), NOW),
        CorruptHint::Refused(VerifyRefusal::Busy)
    );
    // Nothing was touched meanwhile.
    assert!(st.fsck(None, NOW).expect("fsck").healthy);
    // After the interval the budget is back.
    let later = NOW + VERIFY_INTERVAL_MS;
    beat(&mut st, &[1, 2, 3], later);
    pass(&mut st, later);
    assert!(matches!(
        st.corrupt_hint(hs[n - 1], id(1), later),
        CorruptHint::Verify { .. }
    ));
}

#[test]
fn reports_naming_no_live_replica_verify_nothing() {
    let (mut st, h) = three_replicas();
    assert_eq!(
        st.corrupt_hint(ChunkHandle(999), id(1), NOW),
        CorruptHint::UnknownChunk
    );
    assert_eq!(st.corrupt_hint(h, id(4), NOW), CorruptHint::NotAReplica);
    assert_eq!(st.corrupt_hint(h, id(99), NOW), CorruptHint::NotAReplica);
    // Server 3 stops beating.
    beat(&mut st, &[1, 2, 4], 20_000);
    assert_eq!(st.corrupt_hint(h, id(3), 20_000), CorruptHint::NotLive);
    assert_eq!(st.health.verifying(id(3)), 0);
}

#[test]
fn a_verification_without_an_answer_changes_nothing() {
    let (mut st, h) = three_replicas();
    assert!(matches!(
        st.corrupt_hint(h, id(1), NOW),
        CorruptHint::Verify { .. }
    ));
    st.verify_failed(h, id(1));
    assert_eq!(handed_out(&st, "/f", NOW), vec![id(1), id(2), id(3)]);
    assert!(pass(&mut st, NOW).is_empty());
    assert!(matches!(
        st.corrupt_hint(h, id(1), NOW + 10),
        CorruptHint::Refused(VerifyRefusal::Recent { .. })
    ));
    // One whose task never answered is forgotten well past the timeouts.
    assert!(matches!(
        st.corrupt_hint(h, id(2), NOW),
        CorruptHint::Verify { .. }
    ));
    let stuck = NOW + 2 * VERIFY_INTERVAL_MS.max(settings().replication_timeout_ms);
    beat(&mut st, &[1, 2, 3, 4], stuck);
    assert_eq!(
        st.corrupt_hint(h, id(2), stuck - 1),
        CorruptHint::Refused(VerifyRefusal::Running)
    );
    pass(&mut st, stuck);
    assert_eq!(st.health.verifying(id(2)), 0);
    assert!(matches!(
        st.corrupt_hint(h, id(2), stuck),
        CorruptHint::Verify { .. }
    ));
}

// ------------------------------------------------ answers count only for what was asked

use crate::health::{judge_answer, Asked, Ignored};

fn corrupt_at(v: u64) -> Verification {
    Verification::Corrupt {
        version: ChunkVersion(v),
        offset: 0,
    }
}

/// Asks server `s` to verify its replica of `h` (it must be started).
fn ask(st: &mut MasterState, h: ChunkHandle, s: u64, now: u64) {
    assert!(
        matches!(st.corrupt_hint(h, id(s), now), CorruptHint::Verify { .. }),
        "a verification of cs{s}'s replica starts"
    );
}

/// Registers a chunkserver the master never saw at `addr` (a restart under a new id, or
/// another process on a reused port); returns its id.
fn newcomer(st: &mut MasterState, addr: &str, now: u64) -> ChunkserverId {
    st.register(
        &Register {
            id: None,
            addr: addr.into(),
            capacity: 100 * GIB,
            used: 0,
            replicas: vec![],
            session: 0,
        },
        now,
        st.ack_mark(),
    )
    .expect("register")
}

/// Nothing happened to the replica: still listed, handed out, not marked, and not
/// verified again within the interval (the verification did end).
fn untouched(st: &mut MasterState, h: ChunkHandle, s: u64, now: u64) {
    assert!(handed_out(st, "/f", now).contains(&id(s)));
    assert_eq!(st.health.corrupt_count(), 0);
    assert_eq!(st.health.verifying(id(s)), 0);
    assert!(matches!(
        st.corrupt_hint(h, id(s), now),
        CorruptHint::Refused(VerifyRefusal::Recent { .. })
    ));
}

#[test]
fn an_absent_from_another_chunkserver_at_the_address_asked_is_ignored() {
    let (mut st, h) = three_replicas();
    ask(&mut st, h, 3, NOW);
    // cs3's process is gone; another one (a new id) registers on its port and answers.
    let other = newcomer(&mut st, "127.0.0.1:9003", NOW + 10);
    assert_eq!(
        st.verified(h, id(3), &Verification::Absent),
        Verified::Ignored(Ignored::AddressShared { other })
    );
    untouched(&mut st, h, 3, NOW + 10);
    assert!(pass(&mut st, NOW + 10).is_empty());

    // The same when the newcomer registered before the request went, and for a
    // corrupt answer too.
    let (mut st, h) = three_replicas();
    let other = newcomer(&mut st, "127.0.0.1:9003", NOW);
    ask(&mut st, h, 3, NOW + 10);
    assert_eq!(
        st.verified(h, id(3), &corrupt_at(1)),
        Verified::Ignored(Ignored::AddressShared { other })
    );
    untouched(&mut st, h, 3, NOW + 10);
}

#[test]
fn an_answer_after_the_chunkserver_registered_elsewhere_is_ignored() {
    let (mut st, h) = three_replicas();
    ask(&mut st, h, 2, NOW);
    // cs2 restarted on another port: whoever answered at the old one is not cs2.
    st.register(
        &Register {
            id: Some(id(2)),
            addr: "127.0.0.1:9902".into(),
            capacity: 100 * GIB,
            used: 10 * GIB,
            replicas: vec![rep(h, 1, F)],
            session: 0,
        },
        NOW + 10,
        st.ack_mark(),
    )
    .expect("register again");
    assert_eq!(
        st.verified(h, id(2), &Verification::Absent),
        Verified::Ignored(Ignored::Moved)
    );
    untouched(&mut st, h, 2, NOW + 10);

    // Back at the address asked (the same chunkserver, restarted on its directory):
    // its answer counts again.
    let (mut st, h) = three_replicas();
    ask(&mut st, h, 2, NOW);
    st.register(
        &Register {
            id: Some(id(2)),
            addr: "127.0.0.1:9002".into(),
            capacity: 100 * GIB,
            used: 10 * GIB,
            replicas: vec![rep(h, 1, F)],
            session: 0,
        },
        NOW + 10,
        st.ack_mark(),
    )
    .expect("register again");
    assert_eq!(
        st.verified(h, id(2), &corrupt_at(1)),
        Verified::Corrupt(CorruptReport::Excluded {
            version: ChunkVersion(1)
        })
    );
    assert_eq!(handed_out(&st, "/f", NOW + 10), vec![id(1), id(3)]);
}

#[test]
fn a_chunkserver_long_dead_at_the_address_does_not_hide_the_one_there_now() {
    let (mut st, h) = three_replicas();
    // cs3 died long ago; cs5 took its port and holds a replica.
    let later = NOW + 2 * settings().dead_after_ms;
    beat(&mut st, &[1, 2, 4], later);
    let five = newcomer(&mut st, "127.0.0.1:9003", later);
    report(&mut st, five.0, &[rep(h, 1, F)]);
    ask(&mut st, h, five.0, later);
    assert_eq!(
        st.verified(h, five, &corrupt_at(1)),
        Verified::Corrupt(CorruptReport::Excluded {
            version: ChunkVersion(1)
        })
    );
    assert_eq!(st.health.corrupt_count(), 1);
}

#[test]
fn an_answer_about_another_version_is_ignored() {
    // A corrupt answer naming another version than the one asked about.
    let (mut st, h) = three_replicas();
    ask(&mut st, h, 1, NOW);
    assert_eq!(
        st.verified(h, id(1), &corrupt_at(2)),
        Verified::Ignored(Ignored::OtherVersion {
            asked: ChunkVersion(1),
            found: ChunkVersion(2)
        })
    );
    untouched(&mut st, h, 1, NOW);

    // The replica moved to another version while the request was out: neither a
    // corrupt answer (even at the version asked) nor an absent one counts.
    for found in [corrupt_at(1), Verification::Absent] {
        let (mut st, h) = three_replicas();
        ask(&mut st, h, 1, NOW);
        set(&mut st, h, &[(1, 2, F)]);
        assert_eq!(
            st.verified(h, id(1), &found),
            Verified::Ignored(Ignored::ReplicaChanged {
                asked: ChunkVersion(1),
                now: ChunkVersion(2)
            }),
            "{found:?}"
        );
        assert_eq!(st.health.corrupt_count(), 0);
        assert_eq!(
            st.chunks
                .get(h)
                .and_then(|i| i.replica(id(1)))
                .map(|r| r.version),
            Some(ChunkVersion(2)),
            "the replica stays listed"
        );
    }

    // Clean answers about another version or another chunk are not taken as clean.
    let (mut st, h) = three_replicas();
    ask(&mut st, h, 1, NOW);
    assert_eq!(
        st.verified(h, id(1), &clean(h, 3)),
        Verified::Ignored(Ignored::OtherVersion {
            asked: ChunkVersion(1),
            found: ChunkVersion(3)
        })
    );
    ask(&mut st, h, 2, NOW);
    let elsewhere = ChunkHandle(h.0 + 1000);
    assert_eq!(
        st.verified(h, id(2), &clean(elsewhere, 1)),
        Verified::Ignored(Ignored::OtherChunk { found: elsewhere })
    );
    assert_eq!(handed_out(&st, "/f", NOW), vec![id(1), id(2), id(3)]);
}

#[test]
fn an_answer_nobody_asked_for_is_ignored() {
    let (mut st, h) = three_replicas();
    // Never asked (or forgotten as stuck): nothing to compare the answer with.
    assert_eq!(
        st.verified(h, id(1), &Verification::Absent),
        Verified::Ignored(Ignored::NotAsked)
    );
    assert_eq!(handed_out(&st, "/f", NOW), vec![id(1), id(2), id(3)]);
    // A second answer to one request: only the first counts.
    ask(&mut st, h, 2, NOW);
    assert_eq!(st.verified(h, id(2), &clean(h, 1)), Verified::Clean);
    assert_eq!(
        st.verified(h, id(2), &corrupt_at(1)),
        Verified::Ignored(Ignored::NotAsked)
    );
    assert_eq!(st.health.corrupt_count(), 0);
}

#[test]
fn judge_answer_is_a_pure_check_of_the_answer_against_what_was_asked() {
    let (st, h) = three_replicas();
    let asked = Asked {
        addr: "127.0.0.1:9002".into(),
        version: ChunkVersion(1),
        started_ms: NOW,
    };
    assert_eq!(judge_answer(&st, h, id(2), &asked, &corrupt_at(1)), Ok(()));
    assert_eq!(
        judge_answer(&st, h, id(2), &asked, &Verification::Absent),
        Ok(())
    );
    assert_eq!(judge_answer(&st, h, id(2), &asked, &clean(h, 1)), Ok(()));
    // Asked at another chunkserver's address, or of one never registered.
    assert_eq!(
        judge_answer(&st, h, id(3), &asked, &Verification::Absent),
        Err(Ignored::Moved)
    );
    assert_eq!(
        judge_answer(&st, h, id(99), &asked, &Verification::Absent),
        Err(Ignored::Moved)
    );
    // A replica the master no longer lists: acting on it changes nothing, so it passes.
    assert_eq!(
        judge_answer(&st, ChunkHandle(999), id(2), &asked, &Verification::Absent),
        Ok(())
    );
}
