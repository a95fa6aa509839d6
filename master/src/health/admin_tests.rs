//! `stampfs setrep` and the decommission of chunkservers, as the replica-health rules
//! see them (`state/admin.rs`): pure, no sockets.

use super::tests::{copies, deletes, file, id, pass, servers, set, settings, NOW};
use super::*;
use stampfs_proto::{DecommissionState, SetReplication};
use ReplicaState::Finalized as F;

fn setrep(st: &mut MasterState, path: &str, n: u8) -> crate::error::Result<u8> {
    st.set_replication(
        &SetReplication {
            path: path.into(),
            replication: n,
            caller: None,
        },
        NOW,
    )
    .map(|s| s.replication)
}

#[test]
fn setrep_trims_and_copies_every_chunk_of_the_file() {
    let mut st = servers(settings(), &[10, 20, 30, 40]);
    let (ino, hs) = file(&mut st, "/f", 2, true);
    for h in &hs {
        set(&mut st, *h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    }
    super::tests::beat(&mut st, &[1, 2, 3, 4], NOW);
    assert!(pass(&mut st, NOW).is_empty(), "three of three: quiet");

    assert_eq!(setrep(&mut st, "/f", 1).expect("setrep"), 1);
    assert_eq!(st.ns.file(ino).expect("file").replication, 1);
    let d = deletes(&pass(&mut st, NOW));
    for h in &hs {
        assert_eq!(st.chunks.get(*h).expect("chunk").replication, 1);
        // The two fullest holders give theirs up.
        let mine: Vec<_> = d.iter().filter(|x| x.1 == *h).map(|x| x.0).collect();
        assert_eq!(mine, vec![id(3), id(2)], "{d:?}");
    }

    // Back up to four: one copy per chunk, to the one server without a replica.
    let mut st = servers(settings(), &[10, 20, 30, 40]);
    let (_, hs) = file(&mut st, "/g", 1, true);
    set(&mut st, hs[0], &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    super::tests::beat(&mut st, &[1, 2, 3, 4], NOW);
    setrep(&mut st, "/g", 4).expect("setrep");
    let c = copies(&pass(&mut st, NOW));
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].2, id(4));
}

#[test]
fn setrep_refuses_bad_factors_and_directories_and_replays() {
    let mut st = servers(settings(), &[10]);
    file(&mut st, "/f", 1, true);
    assert!(setrep(&mut st, "/f", 0).is_err());
    assert!(setrep(&mut st, "/f", crate::config::MAX_REPLICATION + 1).is_err());
    assert!(matches!(
        setrep(&mut st, "/", 2),
        Err(crate::error::Error::IsADirectory { .. })
    ));
    assert!(matches!(
        setrep(&mut st, "/nope", 2),
        Err(crate::error::Error::NotFound { .. })
    ));
    // The same factor again logs nothing.
    let lsn = st.last_lsn;
    setrep(&mut st, "/f", 3).expect("same");
    assert_eq!(st.last_lsn, lsn);
    setrep(&mut st, "/f", 2).expect("set");
    assert_eq!(st.last_lsn, lsn + 1);
    // A checkpoint keeps it.
    let snap = st.encode_snapshot().expect("encode");
    let back = MasterState::decode_snapshot(settings(), &snap, NOW).expect("decode");
    let f = back.resolve_path("/f").expect("resolve");
    assert_eq!(back.ns.file(f).expect("file").replication, 2);
}

#[test]
fn a_decommissioned_servers_chunks_are_copied_elsewhere_and_it_gets_no_new_ones() {
    let mut st = servers(settings(), &[10, 20, 30, 40]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    set(&mut st, h, &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    super::tests::beat(&mut st, &[1, 2, 3, 4], NOW);
    assert_eq!(
        st.decommission_state(id(1), NOW),
        DecommissionState::InService
    );
    let s = st.decommission(id(1), true, NOW).expect("decommission");
    assert_eq!(s, DecommissionState::Decommissioning { waiting: 1 });
    // No new replica goes to it.
    assert!(st
        .placement_candidates(NOW, 100)
        .iter()
        .all(|c| c.id != id(1)));
    let a = pass(&mut st, NOW);
    let c = copies(&a);
    assert_eq!(c.len(), 1, "{a:?}");
    assert_eq!(c[0].2, id(4), "the only server without a replica");
    assert!(deletes(&a).is_empty(), "its replica stays: {a:?}");
    // The copy lands: four replicas, three counted. Nothing is trimmed, and it is done.
    set(&mut st, h, &[(4, 1, F)]);
    super::tests::beat(&mut st, &[1, 2, 3, 4], NOW + 500);
    let a = pass(&mut st, NOW + 500);
    assert!(copies(&a).is_empty() && deletes(&a).is_empty(), "{a:?}");
    assert_eq!(
        st.decommission_state(id(1), NOW + 500),
        DecommissionState::Decommissioned
    );
    // A checkpoint keeps the decommission.
    let snap = st.encode_snapshot().expect("encode");
    let back = MasterState::decode_snapshot(settings(), &snap, NOW).expect("decode");
    assert!(back.decommissioning.contains(&id(1)));
    // Recommissioned, its replica counts again: one surplus goes, from the fullest.
    let s = st
        .decommission(id(1), false, NOW + 600)
        .expect("recommission");
    assert_eq!(s, DecommissionState::InService);
    let d = deletes(&pass(&mut st, NOW + 600));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].0, id(4), "the fullest holder");
}

#[test]
fn a_chunk_only_on_decommissioned_servers_is_copied_first_and_unknown_servers_are_refused() {
    let mut st = servers(settings(), &[10, 10, 10]);
    let (_, one) = file(&mut st, "/one", 1, true);
    let (_, two) = file(&mut st, "/two", 1, true);
    set(&mut st, one[0], &[(1, 1, F)]);
    set(&mut st, two[0], &[(2, 1, F), (3, 1, F)]);
    super::tests::beat(&mut st, &[1, 2, 3], NOW);
    st.decommission(id(1), true, NOW).expect("decommission");
    let c = copies(&pass(&mut st, NOW));
    assert!(
        c.iter().any(|(h, s, _)| *h == one[0] && *s == id(1)),
        "{c:?}"
    );
    assert!(matches!(
        st.decommission(id(99), true, NOW),
        Err(crate::error::Error::NotFound { .. })
    ));
}

#[test]
fn in_safe_mode_nothing_is_deleted_or_copied_and_the_pass_counts_reported_chunks() {
    let mut st = servers(settings(), &[10, 10, 10, 10]);
    let (_, under) = file(&mut st, "/under", 1, true);
    let (_, over) = file(&mut st, "/over", 1, true);
    // A chunk with no replica reported anywhere.
    file(&mut st, "/lost", 1, true);
    set(&mut st, under[0], &[(1, 1, F)]);
    set(
        &mut st,
        over[0],
        &[(1, 1, F), (2, 1, F), (3, 1, F), (4, 1, F)],
    );
    super::tests::beat(&mut st, &[1, 2, 3, 4], NOW);
    st.safe_mode.enter_auto(None);
    let mut p = Pass::new();
    let mut actions = Vec::new();
    let mut rng = rand::thread_rng();
    while !p.done() {
        actions.extend(p.step(&st, NOW, 0, &mut rng, usize::MAX));
    }
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!((p.chunks, p.reported), (3, 2), "the lost chunk has none");
    // Below 99.9%: it stays on; by hand it ends, and the rules act again.
    let t = st.settings.safe_mode;
    st.safe_mode.after_pass(p.chunks, p.reported, NOW, t);
    assert!(st.safe_mode.is_on());
    assert!(!st.cluster_report(NOW).safe_mode.describe().contains("OFF"));
    st.safe_mode.leave();
    let a = pass(&mut st, NOW);
    assert_eq!(copies(&a).len(), 2, "{a:?}");
    assert_eq!(deletes(&a).len(), 1, "{a:?}");
}

/// Sets chunkserver `s`'s use to `used_gib` of its 100 GiB.
fn used(st: &mut MasterState, s: u64, used_gib: u64, now: u64) {
    st.registry.heartbeat(
        id(s),
        100 * super::tests::GIB,
        used_gib * super::tests::GIB,
        0,
        0,
        now,
    );
}

#[test]
fn the_balancer_moves_replicas_from_the_most_used_and_deletes_the_moved_one() {
    use crate::health::balance::{spread, Balancer};
    let mut st = servers(settings(), &[70, 90, 85, 0]);
    let mut hs = Vec::new();
    for i in 0..4 {
        let (_, h) = file(&mut st, &format!("/f{i}"), 1, true);
        set(&mut st, h[0], &[(1, 1, F), (2, 1, F), (3, 1, F)]);
        hs.push(h[0]);
    }
    super::tests::beat(&mut st, &[1, 2, 3, 4], NOW);
    assert!(pass(&mut st, NOW).is_empty(), "no balancer: nothing moves");
    let sp = spread(&st, NOW, 10);
    // Use 245 of 400 GiB: 61.25%. Over by 10 points: 2 and 3 (not 1, at 70%).
    assert_eq!((sp.average_ppm, sp.over, sp.under), (612_500, 2, 1));
    assert_eq!(
        (sp.sources.clone(), sp.targets.clone()),
        (vec![id(2), id(3)], vec![id(4)])
    );

    st.balancer = Some(Balancer {
        threshold_pct: 10,
        ..Balancer::default()
    });
    let (_, a) = st.health_pass(NOW, 0, &mut rand::thread_rng());
    let moves: Vec<_> = a
        .iter()
        .filter_map(|a| match a {
            Action::Replicate {
                handle,
                source,
                target,
                moving_from: Some(from),
                ..
            } => Some((*handle, *source, target.id, *from)),
            _ => None,
        })
        .collect();
    // The target takes two streams: two moves, from the most used.
    assert_eq!(moves.len(), 2, "{a:?}");
    for (_, source, target, from) in &moves {
        assert_eq!((*source, *target, *from), (id(2), id(4), id(2)));
    }
    // The copies land; meanwhile server 1 became the fullest. The moved replicas go,
    // from server 2, not from the fullest.
    for (h, ..) in &moves {
        set(&mut st, *h, &[(4, 1, F)]);
    }
    used(&mut st, 1, 99, NOW + 500);
    for s in [2, 3, 4] {
        super::tests::beat(&mut st, &[s], NOW + 500);
    }
    let (_, a) = st.health_pass(NOW + 500, 0, &mut rand::thread_rng());
    let d = deletes(&a);
    let moved: Vec<_> = moves.iter().map(|m| m.0).collect();
    let mine: Vec<_> = d.iter().filter(|x| moved.contains(&x.1)).collect();
    assert_eq!(mine.len(), 2, "{d:?}");
    assert!(
        mine.iter()
            .all(|x| x.0 == id(2) && x.3 == DeleteReason::OverReplicated),
        "{d:?}"
    );

    // Evenly used: nothing to move (`Balancer::after_pass` then stops it: see the
    // test below).
    for s in 1..=4 {
        used(&mut st, s, 60, NOW + 1_000);
    }
    assert!(spread(&st, NOW + 1_000, 10).balanced());
}

#[test]
fn decommission_counts_only_replicas_the_pass_would_keep() {
    let mut st = servers(settings(), &[10, 10, 10]);
    let (_, hs) = file(&mut st, "/f", 1, true);
    let h = hs[0];
    // Replication 1: replicas on 1 and 2, one of them surplus.
    setrep(&mut st, "/f", 1).expect("setrep");
    set(&mut st, h, &[(1, 1, F), (2, 1, F)]);
    super::tests::beat(&mut st, &[1, 2, 3], NOW);
    let d = deletes(&pass(&mut st, NOW));
    assert_eq!(d.len(), 1, "{d:?}");
    let doomed = d[0].0;
    let other = if doomed == id(1) { id(2) } else { id(1) };
    // The one kept is decommissioned: the doomed one does not count as elsewhere.
    let s = st.decommission(other, true, NOW).expect("decommission");
    assert_eq!(s, DecommissionState::Decommissioning { waiting: 1 });
    // Never heard from since the start: not known to be safe.
    let mut fresh = MasterState::new(settings());
    fresh.servers.insert(id(9), "127.0.0.1:1".into());
    assert_eq!(
        fresh.decommission(id(9), true, NOW).expect("known id"),
        DecommissionState::Unreported
    );
}

#[test]
fn the_balancer_stops_when_balanced_or_after_idle_passes() {
    use crate::health::balance::{Balancer, Outcome, Spread, Step, IDLE_PASSES};
    let unbalanced = Spread {
        average_ppm: 500_000,
        sources: vec![id(1)],
        targets: vec![id(2)],
        over: 1,
        under: 1,
    };
    let mut b = Balancer {
        threshold_pct: 10,
        ..Balancer::default()
    };
    let moved = Step {
        spread: unbalanced.clone(),
        moves: 3,
        cursors: vec![(id(1), 42)],
        copies_in_flight: false,
    };
    assert_eq!(b.after_pass(&moved), Outcome::Running);
    assert_eq!(
        (b.moves_ordered, b.after.get(&id(1)).copied()),
        (3, Some(42))
    );
    // Copies in flight are progress; passes with neither are idle.
    let waiting = Step {
        moves: 0,
        copies_in_flight: true,
        ..moved.clone()
    };
    for _ in 0..IDLE_PASSES + 1 {
        assert_eq!(b.after_pass(&waiting), Outcome::Running);
    }
    let idle = Step {
        moves: 0,
        copies_in_flight: false,
        ..moved.clone()
    };
    for _ in 1..IDLE_PASSES {
        assert_eq!(b.after_pass(&idle), Outcome::Running);
    }
    assert_eq!(b.after_pass(&idle), Outcome::Stuck);
    let s = Balancer::status(Some(&b));
    assert!(!s.running && s.stuck && !s.balanced);

    let mut b = Balancer::default();
    let balanced = Step {
        spread: Spread {
            average_ppm: 500_000,
            ..Spread::default()
        },
        ..Step::default()
    };
    assert_eq!(b.after_pass(&balanced), Outcome::Balanced);
    let s = Balancer::status(Some(&b));
    assert!(!s.running && s.balanced && !s.stuck);
}

#[test]
fn a_format_8_checkpoint_is_read_with_nobody_decommissioned() {
    let mut st = servers(settings(), &[10, 10]);
    file(&mut st, "/f", 1, true);
    let v8 = bincode::encode_to_vec(
        (
            8u32,
            st.last_lsn,
            &st.ns,
            &st.chunks,
            &st.servers,
            1u64 + st.servers.len() as u64,
            &st.pipelines,
            &st.open_chunks,
            std::collections::BTreeMap::<String, crate::state::User>::new(),
            std::collections::BTreeMap::<stampfs_proto::ClientId, String>::new(),
        ),
        bincode::config::standard(),
    )
    .expect("encode");
    let back = MasterState::decode_snapshot(settings(), &v8, 0).expect("decode");
    assert_eq!(back.ns, st.ns);
    assert_eq!(back.servers, st.servers);
    assert!(back.decommissioning.is_empty());
    // And format 9 keeps it.
    st.decommission(id(1), true, NOW).expect("decommission");
    let v9 = st.encode_snapshot().expect("encode");
    let back = MasterState::decode_snapshot(settings(), &v9, 0).expect("decode");
    assert!(back.same_persisted(&st));
}
