use super::*;
use crate::lease::LeaseLimits;
use crate::state::{replay_records, Settings};
use stampfs_proto::{
    AddChunk, Append, ChunkCommit, Close, Create, FileState, Register, ReplicaReport, ReplicaState,
    UpdatePipeline,
};
use std::time::Duration;

const A: ClientId = ClientId(0xa);
pub(super) const B: ClientId = ClientId(0xb);
const CHUNK: u64 = 1 << 20;

fn settings() -> Settings {
    Settings {
        chunk_size: CHUNK,
        orphan_grace_ms: 60_000,
        limits: LeaseLimits::new(Duration::from_millis(300), Duration::from_millis(600)),
        ..Settings::for_tests()
    }
}

pub(super) fn state_with_servers(n: u64) -> MasterState {
    let mut st = MasterState::new(settings());
    for i in 0..n {
        st.register(
            &Register {
                id: None,
                addr: format!("127.0.0.1:{}", 9000 + i),
                capacity: 1 << 40,
                used: 0,
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

fn create(st: &mut MasterState, path: &str) -> InodeId {
    st.create(
        &Create {
            path: path.into(),
            client: A,
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

/// A file held by A with one chunk at version 1 on three replicas.
pub(super) fn open_file(st: &mut MasterState) -> (InodeId, ChunkHandle, Vec<ChunkserverId>) {
    let ino = create(st, "/f");
    let p = st
        .add_chunk(
            &AddChunk {
                path: "/f".into(),
                client: A,
                previous: None,
            },
            ino,
            0,
            1,
        )
        .expect("chunk");
    let acks: Vec<_> = p
        .bump
        .targets
        .iter()
        .map(|t| (t.id, report(p.bump.handle, 1, 0, ReplicaState::Writing)))
        .collect();
    st.record_replicas(p.bump.handle, &acks);
    let ids: Vec<ChunkserverId> = p.bump.targets.iter().map(|t| t.id).collect();
    st.grant_made(&p.bump, A, &ids, 0).expect("granted");
    (ino, p.bump.handle, ids)
}

pub(super) fn report(
    handle: ChunkHandle,
    version: u64,
    length: u64,
    state: ReplicaState,
) -> ReplicaReport {
    ReplicaReport {
        handle,
        version: ChunkVersion(version),
        length,
        state,
    }
}

pub(super) fn replay(st: &MasterState, log: &[(u64, Vec<u8>)]) -> MasterState {
    let mut back = MasterState::new(settings());
    replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
    assert!(back.same_persisted(st));
    back
}

#[test]
fn append_gate_follows_the_soft_limit() {
    let mut st = state_with_servers(3);
    let ino = create(&mut st, "/f");
    assert!(matches!(
        st.append_gate("/f", 299),
        Err(Error::LeaseConflict {
            holder: A,
            expires_in_ms: 1,
            ..
        })
    ));
    assert_eq!(
        st.append_gate("/f", 300).expect("gate"),
        AppendGate::Recover {
            inode: ino,
            holder: A
        }
    );
    // Whatever the ordinary append reports goes through to it.
    for p in ["/nope", "/", "relative"] {
        assert_eq!(st.append_gate(p, 0).expect("gate"), AppendGate::Proceed);
    }
}

#[test]
fn recovery_bumps_fences_the_holder_and_commits_the_shortest_length() {
    let mut st = state_with_servers(3);
    let (ino, h, ids) = open_file(&mut st);
    // One replica missed the writer's version (stale from the start).
    st.record_replicas(h, &[(ids[2], report(h, 0, 0, ReplicaState::Writing))]);
    let RecoveryBegin::Bump(plan) = st
        .begin_recovery(ino, Trigger::Resume, 1_000, 2)
        .expect("begin")
    else {
        panic!("expected a bump");
    };
    assert_eq!(
        (plan.old_version, plan.previous, plan.version, plan.holder),
        (ChunkVersion(1), ChunkVersion(1), ChunkVersion(2), A)
    );
    let mut want = ids[..2].to_vec();
    want.sort();
    assert_eq!(plan.targets.iter().map(|t| t.id).collect::<Vec<_>>(), want);
    assert_eq!(plan.path, "/f");
    // The file is in recovery, the holder's lease is gone and it is refused.
    assert_eq!(st.stat("/f").expect("stat").state, FileState::Recovering);
    assert!(st.leases.get(ino).is_none());
    assert!(matches!(
        st.add_chunk(
            &AddChunk {
                path: "/f".into(),
                client: A,
                previous: None
            },
            ino,
            1_000,
            2
        ),
        Err(Error::LeaseExpired { .. })
    ));
    assert!(matches!(
        st.update_pipeline(
            &UpdatePipeline {
                path: "/f".into(),
                client: A,
                handle: h,
                survivors: ids[..2].to_vec(),
                acked_length: 0
            },
            ino,
            1_000
        ),
        Err(Error::LeaseExpired { .. })
    ));
    let close = |len| Close {
        path: "/f".into(),
        client: A,
        last: Some(ChunkCommit {
            handle: h,
            length: len,
        }),
        keep_mtime: false,
    };
    assert!(matches!(
        st.close(&close(10), ino, 1_000, 2),
        Err(Error::LeaseExpired { .. })
    ));
    let append = |client| Append {
        path: "/f".into(),
        client,
        caller: None,
    };
    assert!(matches!(
        st.append_gate("/f", 1_000),
        Err(Error::RecoveryInProgress { .. })
    ));
    assert!(matches!(
        st.append(&append(B), ino, 1_000, 2),
        Err(Error::RecoveryInProgress { .. })
    ));
    let outcome = st.recovery_outcome(ino, "/f".into()).expect("outcome");
    assert_eq!(
        (outcome.closed, outcome.old_version, outcome.new_version),
        (false, Some(ChunkVersion(1)), Some(ChunkVersion(2)))
    );
    // The bumped replicas are current; the one that missed it is never handed out.
    let bumped: Vec<_> = plan
        .targets
        .iter()
        .zip([4096, 1000])
        .map(|(t, len)| (t.id, report(h, 2, len, ReplicaState::Writing)))
        .collect();
    st.record_replicas(h, &bumped);
    let key = stampfs_proto::ClusterKey::from_bytes([1; 32]);
    let loc = st.locations("/f", B, &key, 1_000).expect("locations");
    assert_eq!(loc.chunks[0].replicas.len(), 2);
    assert!(!loc.chunks[0].complete);
    let length =
        crate::recovery::recovered_length(bumped.iter().map(|(_, r)| r.length)).expect("some");
    assert_eq!(length, 1000);
    let out = st.commit_recovery(&plan, length, 1_000, 3).expect("commit");
    assert_eq!(
        (out.closed, out.old_version, out.new_version, out.length),
        (true, Some(ChunkVersion(1)), Some(ChunkVersion(2)), 1000)
    );
    let status = st.stat("/f").expect("stat");
    assert_eq!((status.state, status.length), (FileState::Closed, 1000));
    assert!(st.recovering.is_empty());
    // A retried close of exactly what was recovered is harmless; anything else is
    // refused.
    st.close(&close(1000), ino, 1_000, 3).expect("same length");
    assert!(st.close(&close(999), ino, 1_000, 3).is_err());
    // A second commit of the same plan is refused (the file moved on).
    assert!(st.commit_recovery(&plan, length, 1_000, 3).is_err());
    // The next append re-leases the partial chunk at N+2 on the current replicas.
    let a = st.append(&append(B), ino, 1_000, 4).expect("append");
    let bump = a.bump.expect("re-leased");
    assert_eq!((bump.version, bump.chunk_offset), (ChunkVersion(3), 1000));
    assert_eq!(bump.targets.len(), 2);
    let log = st.take_outbox();
    let back = replay(&st, &log);
    assert_eq!(back.chunks.get(h).expect("chunk").version, ChunkVersion(3));
    assert_eq!(back.leases.get(ino).expect("lease").holder, B);
}

#[test]
fn an_interrupted_recovery_is_replayed_in_recovery_and_resumes_with_a_new_version() {
    let mut st = state_with_servers(3);
    let (ino, h, ids) = open_file(&mut st);
    let RecoveryBegin::Bump(plan) = st
        .begin_recovery(ino, Trigger::Resume, 0, 2)
        .expect("begin")
    else {
        panic!("expected a bump");
    };
    let log = st.take_outbox();
    // Replay (log) and checkpoint both restore the file in recovery, no lease.
    let mut back = replay(&st, &log);
    let snap = st.encode_snapshot().expect("snapshot");
    let from_ckpt = MasterState::decode_snapshot(settings(), &snap, 0).expect("decode");
    for s in [&back, &from_ckpt] {
        assert_eq!(s.recovering.iter().copied().collect::<Vec<_>>(), vec![ino]);
        assert!(s.leases.is_empty());
        assert_eq!(s.stat("/f").expect("stat").state, FileState::Recovering);
        assert_eq!(s.chunks.get(h).expect("chunk").version, plan.version);
    }
    // Nothing is due before the chunkservers registered or the grace passed.
    assert!(back.recoveries_due(100, 800).is_empty());
    // Two replicas come back: one took the first bump, one still at the writer's.
    for (i, v) in [(0usize, 2u64), (1, 1)] {
        back.register(
            &Register {
                id: Some(ids[i]),
                addr: format!("127.0.0.1:{}", 9100 + i),
                capacity: 1 << 40,
                used: 0,
                replicas: vec![report(h, v, 10, ReplicaState::Writing)],
                session: 0,
            },
            100,
            back.ack_mark(),
        )
        .expect("register");
    }
    assert!(
        back.recoveries_due(200, 800).is_empty(),
        "one still missing"
    );
    assert_eq!(back.recoveries_due(800, 800), vec![(ino, Trigger::Resume)]);
    let RecoveryBegin::Bump(again) = back
        .begin_recovery(ino, Trigger::Resume, 800, 3)
        .expect("resume")
    else {
        panic!("expected a bump");
    };
    assert_eq!(
        (again.old_version, again.previous, again.version),
        (ChunkVersion(1), ChunkVersion(2), ChunkVersion(3)),
        "a fresh version, above everything minted"
    );
    assert_eq!(again.targets.len(), 2);
    back.commit_recovery(&again, 10, 900, 4).expect("commit");
    let out = back.recovery_outcome(ino, "/f".into()).expect("outcome");
    assert!(out.closed);
    assert!(back.recoveries_due(10_000, 800).is_empty());
}

#[test]
fn files_without_an_open_chunk_or_live_replicas_close_at_once() {
    let mut st = state_with_servers(3);
    // No chunk at all.
    let ino = create(&mut st, "/empty");
    let RecoveryBegin::Done { outcome, how } = st
        .begin_recovery(ino, Trigger::Resume, 0, 2)
        .expect("begin")
    else {
        panic!("expected done");
    };
    assert_eq!(how, Closing::AtCommitted);
    assert_eq!(
        (outcome.closed, outcome.old_version, outcome.length),
        (true, None, 0)
    );
    // Again: already closed.
    let RecoveryBegin::Done { how, .. } = st
        .begin_recovery(ino, Trigger::Resume, 0, 2)
        .expect("begin")
    else {
        panic!("expected done");
    };
    assert_eq!(how, Closing::AlreadyClosed);

    // Every chunkserver is dead (or the master only thinks so): their replicas may
    // hold acknowledged bytes, so the file does not close. The holder is fenced by
    // a fresh version and the file waits in recovery.
    let (ino, h, ids) = open_file(&mut st);
    let RecoveryBegin::Waiting {
        outcome, fenced, ..
    } = st
        .begin_recovery(ino, Trigger::HardLimit { holder: A }, 20_000, 2)
        .expect("begin")
    else {
        panic!("expected to wait");
    };
    assert!(fenced);
    assert_eq!(
        (outcome.closed, outcome.old_version, outcome.new_version),
        (false, Some(ChunkVersion(1)), Some(ChunkVersion(2)))
    );
    assert!(st.missing_chunks.is_empty());
    assert!(st.leases.get(ino).is_none(), "the holder's lease is gone");
    assert_eq!(st.stat("/f").expect("stat").state, FileState::Recovering);
    // A second attempt while still unreachable waits without minting again.
    let RecoveryBegin::Waiting { fenced, .. } = st
        .begin_recovery(ino, Trigger::Resume, 21_000, 2)
        .expect("again")
    else {
        panic!("expected to wait");
    };
    assert!(!fenced);
    assert_eq!(st.chunks.get(h).expect("chunk").version, ChunkVersion(2));
    // Every chunkserver comes back without the replica (their disks were lost):
    // now it is proven gone, and the file closes at its committed length.
    for (i, id) in ids.iter().enumerate() {
        st.register(
            &Register {
                id: Some(*id),
                addr: format!("127.0.0.1:{}", 9000 + i),
                capacity: 1 << 40,
                used: 0,
                replicas: vec![],
                session: 0,
            },
            22_000,
            st.ack_mark(),
        )
        .expect("register");
    }
    let RecoveryBegin::Done { outcome, how } = st
        .begin_recovery(ino, Trigger::Resume, 22_000, 3)
        .expect("begin")
    else {
        panic!("expected done");
    };
    assert_eq!(
        how,
        Closing::Missing {
            handle: h,
            version: ChunkVersion(2)
        }
    );
    assert!(outcome.closed);
    assert!(st.missing_chunks.contains(&h));
    // A replica at the version reported again takes it off the list.
    st.apply_report(
        ids[0],
        &[report(h, 2, 0, ReplicaState::Writing)],
        st.ack_mark(),
    );
    assert!(st.missing_chunks.is_empty());
    let log = st.take_outbox();
    replay(&st, &log);
}

#[test]
fn an_open_file_whose_replicas_are_proven_gone_is_fenced_then_closed() {
    // After a restart every chunkserver registered with an empty report.
    let mut st = state_with_servers(3);
    let (ino, h, _) = open_file(&mut st);
    let ids: Vec<ChunkserverId> = st.servers.keys().copied().collect();
    for id in &ids {
        st.apply_report(*id, &[], st.ack_mark());
    }
    let RecoveryBegin::Done { outcome, how } = st
        .begin_recovery(ino, Trigger::HardLimit { holder: A }, 1_000, 2)
        .expect("begin")
    else {
        panic!("expected done");
    };
    assert_eq!(
        how,
        Closing::Missing {
            handle: h,
            version: ChunkVersion(2)
        },
        "a version is minted before the file closes"
    );
    assert_eq!(
        (outcome.closed, outcome.new_version),
        (true, Some(ChunkVersion(2)))
    );
    let log = st.take_outbox();
    let back = replay(&st, &log);
    assert_eq!(back.chunks.get(h).expect("chunk").version, ChunkVersion(2));
}

#[test]
fn a_periodic_report_built_before_the_create_bump_keeps_the_pipeline_replica() {
    let mut st = state_with_servers(3);
    let (ino, h, ids) = open_file(&mut st);
    // Every pipeline chunkserver's periodic report, built before the bump, arrives
    // after it: the replicas stay listed, so recovery does not take them for gone.
    for id in &ids {
        st.apply_periodic_report(*id, &[], st.ack_mark());
    }
    assert_eq!(st.chunks.get(h).expect("chunk").replicas.len(), 3);
    let RecoveryBegin::Waiting { .. } = st
        .begin_recovery(ino, Trigger::HardLimit { holder: A }, 20_000, 2)
        .expect("begin")
    else {
        panic!("expected to wait for the pipeline's replicas");
    };
    // A registration (a restarted chunkserver's full scan) is believed.
    st.apply_report(ids[0], &[], st.ack_mark());
    assert_eq!(st.chunks.get(h).expect("chunk").replicas.len(), 2);
}

#[test]
fn readers_of_an_open_chunk_are_sent_to_the_granted_pipeline_only() {
    let mut st = state_with_servers(4);
    let (_, h, ids) = open_file(&mut st);
    let outsider = st
        .servers
        .keys()
        .copied()
        .find(|id| !ids.contains(id))
        .expect("a fourth chunkserver");
    // It applied a bump of the same version late and reports it, with no bytes.
    st.apply_report(
        outsider,
        &[report(h, 1, 0, ReplicaState::Writing)],
        st.ack_mark(),
    );
    let key = stampfs_proto::ClusterKey::from_bytes([1; 32]);
    let loc = st.locations("/f", B, &key, 0).expect("locations");
    let mut got: Vec<_> = loc.chunks[0]
        .replicas
        .iter()
        .map(|r| r.chunkserver)
        .collect();
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn a_chunkserver_that_has_not_reported_since_a_restart_keeps_the_file_waiting() {
    let mut st = state_with_servers(3);
    let (ino, h, _) = open_file(&mut st);
    let log = st.take_outbox();
    // A restart: the ids are in the log, the replica lists are not.
    let mut back = replay(&st, &log);
    assert!(back.chunks.get(h).expect("chunk").replicas.is_empty());
    let RecoveryBegin::Waiting { fenced, .. } = back
        .begin_recovery(ino, Trigger::HardLimit { holder: A }, 20_000, 2)
        .expect("begin")
    else {
        panic!("expected to wait: nobody has reported yet");
    };
    assert!(fenced);
    assert!(back.missing_chunks.is_empty());
}

#[test]
fn a_holder_that_renewed_before_the_file_lock_keeps_its_file() {
    let mut st = state_with_servers(3);
    let (ino, h, _) = open_file(&mut st);
    // The worker judged the lease expired at 600; the holder's renewal, queued
    // behind that judgement, lands before the recovery takes the file lock.
    assert_eq!(
        st.recoveries_due(600, 0),
        vec![(ino, Trigger::HardLimit { holder: A })]
    );
    assert_eq!(st.renew(A, 610), 1);
    let RecoveryBegin::Done { how, outcome } = st
        .begin_recovery(ino, Trigger::HardLimit { holder: A }, 620, 2)
        .expect("begin")
    else {
        panic!("expected the file to be left alone");
    };
    assert_eq!(how, Closing::Renewed { holder: A });
    assert!(!outcome.closed);
    assert_eq!(st.chunks.get(h).expect("chunk").version, ChunkVersion(1));
    // An operator's recovery is forced all the same.
    assert!(matches!(
        st.begin_recovery(
            ino,
            Trigger::Operator {
                client: B,
                accept_loss: false
            },
            620,
            2
        )
        .expect("forced"),
        RecoveryBegin::Bump(_)
    ));
}

#[test]
fn granted_pipelines_survive_the_log_and_checkpoints_of_every_format() {
    let mut st = state_with_servers(3);
    let (ino, h, ids) = open_file(&mut st);
    let mut want = ids.clone();
    want.sort();
    let mut got = st
        .pipeline_of(ino, h, ChunkVersion(1))
        .expect("pipeline")
        .to_vec();
    got.sort();
    assert_eq!(got, want);
    assert!(
        st.pipeline_of(ino, h, ChunkVersion(2)).is_none(),
        "other floor"
    );
    let log = st.take_outbox();
    let back = replay(&st, &log);
    assert_eq!(back.pipelines, st.pipelines);
    let snap = st.encode_snapshot().expect("snapshot");
    let from_ckpt = MasterState::decode_snapshot(settings(), &snap, 0).expect("decode");
    assert!(from_ckpt.same_persisted(&st));
    // A format-2 checkpoint (before pipelines) is read with none known (and with
    // what formats before 6 kept of the namespace).
    let v5_ns = crate::namespace::v5::Namespace::downgrade(&st.ns);
    let v2 = bincode::encode_to_vec(
        (
            2u32,
            st.last_lsn,
            &v5_ns,
            &st.chunks,
            &st.servers,
            st.next_server_id().0,
        ),
        bincode::config::standard(),
    )
    .expect("v2");
    let old = MasterState::decode_snapshot(settings(), &v2, 0).expect("decode v2");
    assert!(old.pipelines.is_empty());
    assert_eq!(old.ns, v5_ns.upgrade().expect("upgrade"));
    // A pipeline record naming a chunkserver twice, or one never registered, is
    // refused.
    for servers in [vec![ids[0], ids[0]], vec![ChunkserverId(77)]] {
        let bad = Record::GrantedPipeline {
            inode: ino,
            handle: h,
            version: ChunkVersion(1),
            servers,
        };
        assert!(st.commit(bad, 0).is_err());
    }
    // Closing the file forgets its pipeline.
    st.close(
        &Close {
            path: "/f".into(),
            client: A,
            last: Some(ChunkCommit {
                handle: h,
                length: 0,
            }),
            keep_mtime: false,
        },
        ino,
        0,
        2,
    )
    .expect("close");
    assert!(st.pipelines.is_empty());
}

#[test]
fn the_hard_limit_makes_the_worker_recover_open_files_once() {
    let mut st = state_with_servers(3);
    let (ino, _, _) = open_file(&mut st);
    assert!(st.recoveries_due(599, 0).is_empty());
    assert_eq!(
        st.recoveries_due(600, 0),
        vec![(ino, Trigger::HardLimit { holder: A })]
    );
    assert!(st.recoveries_due(700, 0).is_empty(), "once per expiry");
}

fn pipeline_update(
    st: &mut MasterState,
    ino: InodeId,
    h: ChunkHandle,
    survivors: &[ChunkserverId],
) -> crate::state::BumpPlan {
    st.update_pipeline(
        &UpdatePipeline {
            path: "/f".into(),
            client: A,
            handle: h,
            survivors: survivors.to_vec(),
            acked_length: 0,
        },
        ino,
        0,
    )
    .expect("update pipeline")
}

#[test]
fn a_failed_pipeline_update_leaves_recovery_at_the_granted_version() {
    // The bump of the new version reached nobody: the writer got an error and still
    // holds version 1, which is what its three replicas have.
    let mut st = state_with_servers(3);
    let (ino, h, ids) = open_file(&mut st);
    let failed = pipeline_update(&mut st, ino, h, &ids);
    assert_eq!(failed.version, ChunkVersion(2));
    let log = st.take_outbox();
    let back = replay(&st, &log);
    assert_eq!(
        back.ns.file(ino).expect("file").write,
        WriteState::Open {
            client: A,
            granted: ChunkVersion(1)
        },
        "the failed version is not granted after a restart either"
    );
    let RecoveryBegin::Bump(plan) = st
        .begin_recovery(ino, Trigger::HardLimit { holder: A }, 1_000, 2)
        .expect("begin")
    else {
        panic!("expected a bump");
    };
    assert_eq!(
        (plan.old_version, plan.previous, plan.version),
        (ChunkVersion(1), ChunkVersion(2), ChunkVersion(3))
    );
    let mut want = ids.clone();
    want.sort();
    assert_eq!(plan.targets.iter().map(|t| t.id).collect::<Vec<_>>(), want);

    // A successful update over two survivors is granted: the dropped replica (at 1)
    // lacks what the writer wrote next and no longer counts.
    let mut st = state_with_servers(3);
    let (ino, h, ids) = open_file(&mut st);
    let ok = pipeline_update(&mut st, ino, h, &ids[..2]);
    let acks: Vec<_> = ids[..2]
        .iter()
        .map(|id| (*id, report(h, 2, 0, ReplicaState::Writing)))
        .collect();
    st.record_replicas(h, &acks);
    st.grant_made(&ok, A, &ids[..2], 0).expect("granted");
    assert!(
        st.grant_made(&ok, B, &ids[..2], 0).is_err(),
        "only the holder's grant is logged"
    );
    let log = st.take_outbox();
    let back = replay(&st, &log);
    assert_eq!(
        back.ns.file(ino).expect("file").write,
        WriteState::Open {
            client: A,
            granted: ChunkVersion(2)
        }
    );
    let RecoveryBegin::Bump(plan) = st
        .begin_recovery(ino, Trigger::HardLimit { holder: A }, 1_000, 2)
        .expect("begin")
    else {
        panic!("expected a bump");
    };
    assert_eq!(plan.old_version, ChunkVersion(2));
    let mut want = ids[..2].to_vec();
    want.sort();
    assert_eq!(plan.targets.iter().map(|t| t.id).collect::<Vec<_>>(), want);
}

#[test]
fn a_failed_reopen_goes_to_recovery_instead_of_closing_at_a_version_nobody_holds() {
    let mut st = state_with_servers(3);
    let (ino, h, ids) = open_file(&mut st);
    st.record_replicas(
        h,
        &ids.iter()
            .map(|id| (*id, report(h, 1, 10, ReplicaState::Writing)))
            .collect::<Vec<_>>(),
    );
    st.close(
        &Close {
            path: "/f".into(),
            client: A,
            last: Some(ChunkCommit {
                handle: h,
                length: 10,
            }),
            keep_mtime: false,
        },
        ino,
        0,
        1,
    )
    .expect("close");
    let sealed: Vec<_> = ids
        .iter()
        .map(|id| (*id, report(h, 1, 10, ReplicaState::Finalized)))
        .collect();
    st.record_replicas(h, &sealed);
    // B's append mints 2; its bump reaches nobody.
    let a = st
        .append(
            &Append {
                path: "/f".into(),
                client: B,
                caller: None,
            },
            ino,
            0,
            2,
        )
        .expect("append");
    assert_eq!(a.bump.expect("re-leased").version, ChunkVersion(2));
    assert!(st.abandon_reopen(ino, B, 0).expect("queued"));
    assert!(
        !st.abandon_reopen(ino, B, 0).expect("no-op"),
        "B no longer holds it"
    );
    let out = st.recovery_outcome(ino, "/f".into()).expect("outcome");
    assert_eq!(
        (out.closed, out.old_version, out.new_version, out.length),
        (false, Some(ChunkVersion(1)), Some(ChunkVersion(2)), 10)
    );
    assert!(st.leases.get(ino).is_none());
    assert!(matches!(
        st.append_gate("/f", 0),
        Err(Error::RecoveryInProgress { .. })
    ));
    // Replica health leaves the chunk alone meanwhile.
    let f = st.ns.file(ino).expect("file");
    assert!(!crate::health::settled(&st, ino, f, 0));
    // It survives a restart (log or checkpoint) in recovery.
    let log = st.take_outbox();
    let back = replay(&st, &log);
    let snap = st.encode_snapshot().expect("snapshot");
    let from_ckpt = MasterState::decode_snapshot(settings(), &snap, 0).expect("decode");
    for s in [&back, &from_ckpt] {
        assert!(s.recovering.contains(&ino));
        assert_eq!(
            s.ns.file(ino).expect("file").write,
            WriteState::Recovering {
                holder: B,
                old_version: ChunkVersion(1)
            }
        );
    }
    // While no replica is reachable the file waits, at the same version.
    let RecoveryBegin::Waiting { handle, .. } = st
        .begin_recovery(ino, Trigger::Resume, 20_000, 3)
        .expect("begin")
    else {
        panic!("expected to wait");
    };
    assert_eq!(handle, h);
    assert_eq!(st.chunks.get(h).expect("chunk").version, ChunkVersion(2));
    assert_eq!(st.stat("/f").expect("stat").state, FileState::Recovering);
    // The replicas come back at 1: the worker raises them to a fresh version and
    // seals them at the committed length.
    for id in &ids {
        st.registry.heartbeat(*id, 1 << 40, 0, 1, 0, 20_000);
        st.apply_report(
            *id,
            &[report(h, 1, 10, ReplicaState::Finalized)],
            st.ack_mark(),
        );
    }
    assert_eq!(st.recovering_with_replica_on(&ids[..1]), vec![ino]);
    assert!(st
        .recovering_with_replica_on(&[ChunkserverId(99)])
        .is_empty());
    assert_eq!(st.recoveries_due(20_000, 0), vec![(ino, Trigger::Resume)]);
    let RecoveryBegin::Bump(plan) = st
        .begin_recovery(ino, Trigger::Resume, 20_000, 3)
        .expect("begin")
    else {
        panic!("expected a bump");
    };
    assert_eq!(
        (
            plan.old_version,
            plan.previous,
            plan.version,
            plan.committed
        ),
        (ChunkVersion(1), ChunkVersion(2), ChunkVersion(3), 10)
    );
    assert_eq!(plan.targets.len(), 3);
    st.commit_recovery(&plan, 10, 20_000, 4).expect("commit");
    let status = st.stat("/f").expect("stat");
    assert_eq!((status.state, status.length), (FileState::Closed, 10));
}

#[test]
fn an_open_file_past_its_granted_version_waits_in_recovery_when_unreachable() {
    let mut st = state_with_servers(3);
    let (ino, h, ids) = open_file(&mut st);
    pipeline_update(&mut st, ino, h, &ids);
    // Every chunkserver is dead by now: closing at 2 would strand the replicas.
    let RecoveryBegin::Waiting { .. } = st
        .begin_recovery(ino, Trigger::HardLimit { holder: A }, 20_000, 2)
        .expect("begin")
    else {
        panic!("expected to wait");
    };
    assert!(st.missing_chunks.is_empty());
    assert_eq!(
        st.ns.file(ino).expect("file").write,
        WriteState::Recovering {
            holder: A,
            old_version: ChunkVersion(1)
        }
    );
    assert_eq!(
        st.chunks.get(h).expect("chunk").version,
        ChunkVersion(3),
        "the holder is fenced by a version past the one minted for its update"
    );
    let log = st.take_outbox();
    replay(&st, &log);
}
