//! The sliced health pass ([`super::Pass`]): pure, no sockets, no sleeps.

use super::tests::{beat, copies, deletes, file, id, rep, report, servers, set, settings, NOW};
use super::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use stampfs_proto::{Append, ChunkVersion, Delete, ReplicaState::Finalized as F};
use std::collections::BTreeMap;

/// Five chunkservers and `files` closed files of `chunks` chunks each, every chunk
/// with current replicas on 1 and 2 and a stale one on 3 (so each one the pass
/// examines shows in its actions: a deletion for 3, and a copy to 4 or 5).
fn cluster(files: usize, chunks: usize) -> MasterState {
    let mut st = servers(settings(), &[10, 20, 30, 40, 50]);
    for f in 0..files {
        add_file(&mut st, &format!("/f{f}"), chunks);
    }
    beat(&mut st, &[1, 2, 3, 4, 5], NOW);
    st
}

fn add_file(st: &mut MasterState, path: &str, chunks: usize) -> Vec<ChunkHandle> {
    let (_, hs) = file(st, path, chunks, true);
    for h in &hs {
        set(st, *h, &[(1, 1, F), (2, 1, F), (3, 0, F)]);
    }
    hs
}

/// Runs a whole pass in steps of `budget`, recording each step's actions as the
/// worker does; `between` runs between steps.
fn sliced(
    st: &mut MasterState,
    budget: usize,
    mut between: impl FnMut(&mut MasterState, &Pass),
) -> (Vec<Action>, Pass) {
    let mut pass = Pass::new();
    let mut rng = StdRng::seed_from_u64(7);
    let mut all = Vec::new();
    while !pass.done() {
        let (_, actions) = st.health_step(&mut pass, NOW, 0, &mut rng, budget);
        all.extend(actions);
        between(st, &pass);
    }
    (all, pass)
}

#[test]
fn a_sliced_pass_decides_what_the_one_piece_pass_decides() {
    for budget in [1, 2, 7, 64, SLICE_BUDGET] {
        let mut whole = cluster(30, 4);
        let expected = whole.health_pass(NOW, 0, &mut StdRng::seed_from_u64(7)).1;
        let mut st = cluster(30, 4);
        let (actions, pass) = sliced(&mut st, budget, |_, _| {});
        assert_eq!(actions, expected, "budget {budget}");
        assert_eq!(pass.chunks, 120);
        assert_eq!(deletes(&actions).len(), 120);
        assert!(!copies(&actions).is_empty());
        if budget == 1 {
            assert!(pass.steps > 120, "{} steps", pass.steps);
        }
    }
}

#[test]
fn a_step_examines_at_most_its_budget() {
    let mut st = cluster(20, 10);
    let mut pass = Pass::new();
    let mut rng = StdRng::seed_from_u64(1);
    let mut before = 0;
    while !pass.done() {
        st.health_step(&mut pass, NOW, 0, &mut rng, 16);
        assert!(pass.chunks - before <= 16, "{}", pass.chunks - before);
        before = pass.chunks;
    }
    assert_eq!(pass.chunks, 200, "every chunk once");
}

#[test]
fn a_sliced_pass_visits_every_chunk_while_files_come_and_go() {
    let mut st = cluster(40, 3);
    let mut created: Vec<(bool, Vec<ChunkHandle>)> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    let (actions, _) = sliced(&mut st, 5, |st, pass| {
        let step = pass.steps;
        // Between every pair of slices: a new file, and every third step one deleted
        // (before or after the cursor, alternately).
        let hs = add_file(st, &format!("/new{step}"), 2);
        created.push((pass.scanning(), hs));
        if step % 3 == 0 {
            let victim = if step % 2 == 0 {
                step / 3
            } else {
                39u64.saturating_sub(step / 3)
            };
            let path = format!("/f{victim}");
            if !deleted.contains(&path)
                && st
                    .delete(
                        &Delete {
                            path: path.clone(),
                            recursive: false,
                            caller: None,
                        },
                        NOW,
                        1,
                    )
                    .is_ok()
            {
                deleted.push(path);
            }
        }
    });
    let mut stale_deletes: BTreeMap<ChunkHandle, usize> = BTreeMap::new();
    for (s, h, v, why) in deletes(&actions) {
        assert_eq!((s, v, why), (id(3), ChunkVersion(0), DeleteReason::Stale));
        *stale_deletes.entry(h).or_default() += 1;
    }
    assert!(
        stale_deletes.values().all(|n| *n == 1),
        "no chunk judged twice"
    );
    // Every chunk of a file that lived through the pass was judged.
    for f in 0..40 {
        let path = format!("/f{f}");
        if deleted.contains(&path) {
            continue;
        }
        let ino = st.resolve_path(&path).expect("file");
        for h in &st.ns.file(ino).expect("file").chunks {
            assert!(stale_deletes.contains_key(h), "{path}: chunk {h} missed");
        }
    }
    // Files created while the pass was still in its chunk phase have inodes past the
    // cursor: judged too.
    let during = created.iter().filter(|(scanning, _)| *scanning);
    for h in during.flat_map(|(_, hs)| hs) {
        if st.chunks.get(*h).is_some() {
            assert!(stale_deletes.contains_key(h), "new chunk {h} missed");
        }
    }
    assert!(deleted.len() >= 3, "{deleted:?}");
}

#[test]
fn a_queued_need_is_judged_again_on_the_state_of_its_slice() {
    // Two chunks, each with one live replica: both queued for copies.
    let mut st = servers(settings(), &[10, 20, 30, 40, 50]);
    let (ino, hs) = file(&mut st, "/f", 2, true);
    for h in &hs {
        set(&mut st, *h, &[(1, 1, F)]);
    }
    beat(&mut st, &[1, 2, 3, 4, 5], NOW);
    let mut pass = Pass::new();
    let mut rng = StdRng::seed_from_u64(3);
    // One unit per inode and chunk: root, then /f's two chunks, then the phase ends.
    let (_, a) = st.health_step(&mut pass, NOW, 0, &mut rng, 3);
    assert!(copies(&a).is_empty(), "still in the chunk phase: {a:?}");
    // Before the replicate phase: chunk 0 got its replicas back from elsewhere, and the
    // file was reopened for append (chunk 1, its last, moves to a new version and
    // belongs to the writer).
    set(&mut st, hs[0], &[(1, 1, F), (2, 1, F), (3, 1, F)]);
    st.append(
        &Append {
            path: "/f".into(),
            client: super::tests::A,
            caller: None,
        },
        ino,
        NOW,
        1,
    )
    .expect("append");
    // Its replica took the append's bump and looks good (finalized at the current
    // version, as if the writer had not written yet): only the version the need was
    // queued at keeps a copy of the writer's chunk from being ordered (removing that
    // check fails this test).
    set(&mut st, hs[1], &[(1, 2, F)]);
    let mut rest = Vec::new();
    while !pass.done() {
        rest.extend(st.health_step(&mut pass, NOW, 0, &mut rng, SLICE_BUDGET).1);
    }
    assert!(copies(&rest).is_empty(), "{rest:?}");
    assert_eq!(st.health.copies().len(), 0);
}

#[test]
fn orphans_and_trash_are_sliced_too() {
    let mut s = settings();
    s.orphan_grace_ms = 0;
    let mut st = servers(s, &[10, 20]);
    let orphans: Vec<_> = (0..10).map(|i| rep(ChunkHandle(1000 + i), 1, F)).collect();
    report(&mut st, 1, &orphans);
    report(&mut st, 2, &orphans[..4]);
    beat(&mut st, &[1, 2], NOW);
    let mut pass = Pass::new();
    let mut rng = StdRng::seed_from_u64(3);
    let mut all = Vec::new();
    let mut first = true;
    while !pass.done() {
        // The first step prunes (notes the orphans as seen now): past the grace of 0.
        let (_, a) = st.health_step(&mut pass, NOW, 0, &mut rng, if first { 1 } else { 2 });
        first = false;
        all.extend(a);
    }
    let d = deletes(&all);
    assert_eq!(d.len(), 14, "{d:?}");
    assert!(d.iter().all(|x| x.3 == DeleteReason::Orphan));
    let mut seen: Vec<_> = d.iter().map(|x| (x.0, x.1)).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 14, "each orphan once");
}

#[test]
fn the_per_server_pending_delete_count_follows_the_commands() {
    // 30 chunks with a stale replica on 3: 30 deletions ordered on 3, counted.
    let mut st = cluster(10, 3);
    let (actions, _) = sliced(&mut st, 4, |_, _| {});
    assert_eq!(deletes(&actions).len(), 30);
    assert_eq!(st.health.pending_deletes(id(3)), 30);
    // Chunkserver 3 reports none of them any more: the next pass's prune forgets them.
    report(&mut st, 3, &[]);
    st.health_pass(NOW + 10, 0, &mut StdRng::seed_from_u64(1));
    assert_eq!(st.health.pending_deletes(id(3)), 0);
    // Ordered again (the old commands were delivered meanwhile).
    st.health.take_commands(id(3), 1000);
    for h in st.chunks.iter().map(|(h, _)| *h).collect::<Vec<_>>() {
        set(&mut st, h, &[(3, 0, F)]);
    }
    st.health_pass(NOW + 20, 0, &mut StdRng::seed_from_u64(1));
    assert_eq!(st.health.pending_deletes(id(3)), 30);
    // 3 restarts: what is still queued for it stays pending, what it was handed goes.
    st.health.forget_server(id(3));
    assert_eq!(st.health.pending_deletes(id(3)), 30, "all still queued");
    assert_eq!(st.health.take_commands(id(3), 10).len(), 10);
    st.health.forget_server(id(3));
    assert_eq!(st.health.pending_deletes(id(3)), 20);
}

#[test]
fn a_copy_that_completes_mid_pass_frees_its_streams_for_the_rest_of_the_pass() {
    // One copy stream per server, and two chunks whose only replica is on server 1: a
    // pass can order a copy of the second only once the first copy is done.
    let mut s = settings();
    s.max_replication_streams = 1;
    let mut st = servers(s, &[10, 20, 30, 40]);
    let (_, hs) = file(&mut st, "/f", 2, true);
    for h in &hs {
        set(&mut st, *h, &[(1, 1, F)]);
    }
    beat(&mut st, &[1, 2, 3, 4], NOW);
    // Between slices, every copy in flight completes (its target reports the replica).
    let (actions, _) = sliced(&mut st, 1, |st, _| {
        let done: Vec<_> = st
            .health
            .copies()
            .iter()
            .map(|c| (c.handle, c.target, c.version))
            .collect();
        for (h, target, v) in done {
            set(st, h, &[(1, v.0, F), (target.0, v.0, F)]);
        }
    });
    let copied: std::collections::BTreeSet<ChunkHandle> =
        copies(&actions).iter().map(|(h, _, _)| *h).collect();
    assert_eq!(
        copied,
        hs.iter().copied().collect(),
        "the second chunk waited for the next pass: {actions:?}"
    );
}
