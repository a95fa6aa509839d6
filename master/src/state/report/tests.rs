//! Full reports applied in batches: the same result as in one piece, whatever happens
//! between the batches.

use super::*;
use crate::state::Settings;
use stampfs_proto::{ChunkVersion, Register, ReplicaState::Finalized as F};

fn settings() -> Settings {
    Settings::for_tests()
}

fn rep(h: u64, v: u64) -> ReplicaReport {
    ReplicaReport {
        handle: ChunkHandle(h),
        version: ChunkVersion(v),
        length: 0,
        state: F,
    }
}

/// One chunkserver and chunks 1..=n at version 2 (no files: the report path does not
/// look at the namespace).
fn state(n: u64) -> (MasterState, ChunkserverId) {
    let mut st = MasterState::new(settings());
    let id = st
        .register(
            &Register {
                id: None,
                addr: "127.0.0.1:9001".into(),
                capacity: 1 << 40,
                used: 0,
                replicas: vec![],
                session: 0,
            },
            0,
            st.ack_mark(),
        )
        .expect("register");
    for h in 1..=n {
        st.chunks
            .insert(
                ChunkHandle(h),
                crate::chunk_table::ChunkInfo::new(ChunkVersion(2), 3),
            )
            .expect("chunk");
    }
    (st, id)
}

/// What the master knows of `id`'s replicas: (handle, version) sorted, and orphans.
fn known(st: &MasterState, id: ChunkserverId) -> (Vec<(u64, u64)>, Vec<u64>) {
    let cs = st.registry.get(id).expect("registered");
    let mut held: Vec<(u64, u64)> = cs
        .replicas
        .iter()
        .map(|h| {
            let v = st
                .chunks
                .get(h)
                .and_then(|i| i.replica(id))
                .map_or(0, |r| r.version.0);
            (h.0, v)
        })
        .collect();
    held.sort();
    let mut listed: Vec<(u64, u64)> = st
        .chunks
        .iter()
        .filter_map(|(h, i)| i.replica(id).map(|r| (h.0, r.version.0)))
        .collect();
    listed.sort();
    assert_eq!(held, listed, "the reverse index matches the chunk table");
    let mut orphans: Vec<u64> = cs.orphans.iter().map(|o| o.handle.0).collect();
    orphans.sort();
    (held, orphans)
}

#[test]
fn a_report_in_batches_ends_where_the_one_piece_report_ends() {
    // Known before: 1..=60 at version 2. The report: 20..=80 (61..=80 new, 81..=90
    // orphans), some at version 1 (stale), and it omits 1..=19.
    let first: Vec<_> = (1..=60).map(|h| rep(h, 2)).collect();
    let second: Vec<_> = (20..=90)
        .map(|h| rep(h, if h % 7 == 0 { 1 } else { 2 }))
        .collect();
    let (mut whole, id) = state(80);
    whole.apply_report(id, &first, whole.ack_mark());
    let ws = whole.apply_report(id, &second, whole.ack_mark());
    for budget in [1, 3, 16, 1000] {
        let (mut st, id) = state(80);
        st.apply_report(id, &first, st.ack_mark());
        let mut apply = st
            .begin_report(id, second.clone(), st.ack_mark())
            .expect("registered");
        let mut steps = 0;
        while !apply.done() {
            st.report_step(&mut apply, budget);
            steps += 1;
        }
        assert!(!apply.superseded);
        assert_eq!(known(&st, id), known(&whole, id), "budget {budget}");
        assert_eq!(apply.summary, ws, "budget {budget}");
        assert!(
            steps >= (71 + 60) / budget,
            "{steps} steps at budget {budget}"
        );
    }
}

#[test]
fn a_replica_is_dropped_only_after_the_whole_report_is_in() {
    let (mut st, id) = state(10);
    st.apply_report(
        id,
        &(1..=10).map(|h| rep(h, 2)).collect::<Vec<_>>(),
        st.ack_mark(),
    );
    let mut apply = st
        .begin_report(id, (1..=5).map(|h| rep(h, 2)).collect(), st.ack_mark())
        .expect("registered");
    st.report_step(&mut apply, 5);
    assert_eq!(
        known(&st, id).0.len(),
        10,
        "nothing dropped while replicas come in"
    );
    while !apply.done() {
        st.report_step(&mut apply, 2);
    }
    assert_eq!(
        known(&st, id).0,
        (1..=5).map(|h| (h, 2)).collect::<Vec<_>>()
    );
}

#[test]
fn a_registration_between_batches_supersedes_the_report() {
    let (mut st, id) = state(10);
    let mut apply = st
        .begin_report(id, (1..=10).map(|h| rep(h, 2)).collect(), st.ack_mark())
        .expect("registered");
    st.report_step(&mut apply, 4);
    // The chunkserver restarted and registered again with its fresh scan: 7..=10.
    let addr = st.registry.get(id).expect("cs").addr.clone();
    st.register(
        &Register {
            id: Some(id),
            addr,
            capacity: 1 << 40,
            used: 0,
            replicas: (7..=10).map(|h| rep(h, 2)).collect(),
            session: 0,
        },
        5,
        st.ack_mark(),
    )
    .expect("register");
    st.report_step(&mut apply, 100);
    assert!(apply.done() && apply.superseded);
    assert_eq!(
        known(&st, id).0,
        (7..=10).map(|h| (h, 2)).collect::<Vec<_>>()
    );
}

#[test]
fn changes_between_batches_are_neither_lost_nor_reverted() {
    let (mut st, id) = state(10);
    st.apply_report(
        id,
        &(1..=10).map(|h| rep(h, 2)).collect::<Vec<_>>(),
        st.ack_mark(),
    );
    // A report built before chunk 3 was bumped to version 3 and chunk 10 deleted.
    let mut apply = st
        .begin_report(id, (1..=10).map(|h| rep(h, 2)).collect(), st.ack_mark())
        .expect("registered");
    st.report_step(&mut apply, 2);
    st.chunks.get_mut(ChunkHandle(3)).expect("c").version = ChunkVersion(3);
    st.record_replicas(ChunkHandle(3), &[(id, rep(3, 3))]);
    st.chunks.remove(ChunkHandle(10));
    st.registry
        .get_mut(id)
        .expect("cs")
        .replicas
        .remove(&ChunkHandle(10));
    while !apply.done() {
        st.report_step(&mut apply, 2);
    }
    let (held, orphans) = known(&st, id);
    assert!(
        held.contains(&(3, 3)),
        "a version never goes down: {held:?}"
    );
    assert!(!held.iter().any(|(h, _)| *h == 10));
    assert_eq!(orphans, vec![10], "a deleted chunk's replica is an orphan");
}

/// `id`'s registration again, holding `replicas`, with the report mark `covered`.
fn reregister(st: &mut MasterState, id: ChunkserverId, replicas: Vec<ReplicaReport>, covered: u64) {
    let req = Register {
        id: Some(id),
        addr: "127.0.0.1:9001".into(),
        capacity: 1 << 40,
        used: 0,
        replicas,
        session: 1,
    };
    st.register(&req, 10, covered).expect("register");
}

fn holds(st: &MasterState, id: ChunkserverId, h: u64) -> bool {
    known(st, id).0.iter().any(|(k, _)| *k == h)
}

/// A periodic report built before a command created a replica arrives after the
/// command's answer was recorded: the replica stays (no pipeline names it: the grant
/// that would is still being logged). A report marked after the answer decides.
#[test]
fn a_periodic_report_older_than_a_command_answer_keeps_its_replica() {
    let (mut st, id) = state(3);
    let built = |h: &[u64]| h.iter().map(|h| rep(*h, 2)).collect::<Vec<_>>();
    st.apply_periodic_report(id, &built(&[1, 2]), st.ack_mark());
    let before = st.ack_mark();
    st.record_replicas(ChunkHandle(3), &[(id, rep(3, 2))]);
    st.apply_periodic_report(id, &built(&[1, 2]), before);
    assert!(
        holds(&st, id, 3),
        "a report built before the answer omits it"
    );
    assert!(st
        .chunks
        .get(ChunkHandle(3))
        .and_then(|c| c.replica(id))
        .is_some());
    // Batched, with the answer recorded before the report began: the same.
    let mut apply = st
        .begin_report(id, built(&[1, 2]), before)
        .expect("registered");
    while !apply.done() {
        st.report_step(&mut apply, 1);
    }
    assert!(holds(&st, id, 3));
    // Built after the answer: the chunkserver no longer holds it.
    st.apply_periodic_report(id, &built(&[1, 2]), st.ack_mark());
    assert!(
        !holds(&st, id, 3),
        "a report newer than the answer takes it away"
    );
    assert!(st
        .chunks
        .get(ChunkHandle(3))
        .and_then(|c| c.replica(id))
        .is_none());
    assert!(
        st.registry.get(id).expect("cs").acked.is_empty(),
        "covered: forgotten"
    );
}

/// The same for a registration's report: marked when the `Register` arrived, it keeps
/// a replica answered for after that, and takes away one answered for before.
#[test]
fn a_registration_keeps_what_was_answered_after_its_report() {
    let (mut st, id) = state(3);
    let before = st.ack_mark();
    st.record_replicas(ChunkHandle(2), &[(id, rep(2, 2))]);
    st.record_replicas(ChunkHandle(3), &[(id, rep(3, 2))]);
    reregister(&mut st, id, vec![rep(1, 2)], before);
    assert!(holds(&st, id, 1) && holds(&st, id, 2) && holds(&st, id, 3));
    let mid = st.ack_mark();
    st.record_replicas(ChunkHandle(3), &[(id, rep(3, 2))]);
    reregister(&mut st, id, vec![rep(1, 2)], mid);
    assert!(
        !holds(&st, id, 2),
        "answered before the mark, not reported: gone"
    );
    assert!(holds(&st, id, 3), "answered again after the mark: stays");
}

/// Answers are forgotten once a heartbeat's mark passes them (the report after that
/// heartbeat is built later); a report marked below what was forgotten (from an older
/// connection) cannot tell what it never saw, and takes nothing away.
#[test]
fn a_report_marked_below_what_was_forgotten_takes_nothing_away() {
    let (mut st, id) = state(3);
    let built = |h: &[u64]| h.iter().map(|h| rep(*h, 2)).collect::<Vec<_>>();
    let old_mark = st.ack_mark();
    st.record_replicas(ChunkHandle(3), &[(id, rep(3, 2))]);
    let heartbeat = st.ack_mark();
    st.forget_acks(id, heartbeat);
    assert!(st.registry.get(id).expect("cs").acked.is_empty());
    st.apply_periodic_report(id, &built(&[1]), old_mark);
    assert!(
        holds(&st, id, 3),
        "an older report omits nothing it can prove"
    );
    st.apply_periodic_report(id, &built(&[1]), heartbeat);
    assert!(!holds(&st, id, 3), "the report after the heartbeat decides");
    // Chunk 2 was never held: it was not in the master's view either.
    assert!(!holds(&st, id, 2));
}
