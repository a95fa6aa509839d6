//! Unit tests of the state machine: namespace operations, chunks, grants, replay and
//! checkpoints (lease recovery's are in `recovery.rs`, moves between chunks in
//! `open_chunk_tests.rs`).

use super::*;
use stampfs_proto::{
    AddChunk, Append, ChunkCommit, Close, Create, Delete, Mkdir, Rename, ReplicaReport,
    ReplicaState, UpdatePipeline,
};

const A: ClientId = ClientId(0xa);
const B: ClientId = ClientId(0xb);

fn settings() -> Settings {
    Settings {
        orphan_grace_ms: 60_000,
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

fn replayed(st: &mut MasterState, log: &[(u64, Vec<u8>)]) -> MasterState {
    let mut back = MasterState::new(settings());
    replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
    assert!(back.same_persisted(st), "replay rebuilds the same state");
    back
}

fn create(st: &mut MasterState, path: &str, client: ClientId) -> InodeId {
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

fn ack_all(st: &mut MasterState, plan: &BumpPlan) {
    let acks: Vec<_> = plan
        .targets
        .iter()
        .map(|t| {
            (
                t.id,
                ReplicaReport {
                    handle: plan.handle,
                    version: plan.version,
                    length: plan.chunk_offset,
                    state: ReplicaState::Writing,
                },
            )
        })
        .collect();
    st.record_replicas(plan.handle, &acks);
}

#[test]
fn namespace_operations_validate_and_replay() {
    let mut st = MasterState::new(settings());
    let mk = |path: &str, parents| Mkdir {
        path: path.into(),
        parents,
        attr: None,
        caller: None,
    };
    assert!(matches!(
        st.mkdir(&mk("/a/b", false), 0, 1),
        Err(Error::NotFound { .. })
    ));
    st.mkdir(&mk("/a/b/c", true), 0, 1).expect("mkdir -p");
    assert!(matches!(
        st.mkdir(&mk("/a/b", false), 0, 1),
        Err(Error::AlreadyExists { .. })
    ));
    st.mkdir(&mk("/a/b", true), 0, 1)
        .expect("mkdir -p of an existing dir");
    create(&mut st, "/a/f", A);
    assert!(matches!(
        st.mkdir(&mk("/a/f/x", true), 0, 1),
        Err(Error::NotADirectory { .. })
    ));
    assert!(matches!(
        st.create(
            &Create {
                path: "/a/f".into(),
                client: B,
                replication: None,
                chunk_size: None,
                overwrite: true,
                attr: None,
                caller: None,
            },
            0,
            1
        ),
        Err(Error::LeaseConflict { holder: A, .. })
    ));
    assert!(matches!(
        st.create(
            &Create {
                path: "/nope/f".into(),
                client: B,
                replication: None,
                chunk_size: None,
                overwrite: false,
                attr: None,
                caller: None,
            },
            0,
            1
        ),
        Err(Error::NotFound { ref path }) if path == "/nope"
    ));
    assert!(matches!(
        st.create(
            &Create {
                path: "/g".into(),
                client: B,
                replication: Some(0),
                chunk_size: None,
                overwrite: false,
                attr: None,
                caller: None,
            },
            0,
            1
        ),
        Err(Error::BadRequest { .. })
    ));
    let names: Vec<_> = st
        .list("/a")
        .expect("list")
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(names, vec!["/a/b", "/a/f"]);
    assert_eq!(st.list("/a/f").expect("list file").len(), 1);
    st.rename(
        &Rename {
            src: "/a/f".into(),
            dst: "/a/b/g".into(),
            caller: None,
            replace: false,
        },
        0,
        2,
    )
    .expect("rename");
    assert!(matches!(
        st.rename(
            &Rename {
                src: "/a".into(),
                dst: "/a/b/x".into(),
                caller: None,
                replace: false,
            },
            0,
            2
        ),
        Err(Error::BadRequest { .. })
    ));
    assert!(matches!(
        st.rename(
            &Rename {
                src: "/a/b".into(),
                dst: "/a/b/c".into(),
                caller: None,
                replace: false,
            },
            0,
            2
        ),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        st.delete(
            &Delete {
                path: "/a".into(),
                recursive: false,
                caller: None,
            },
            0,
            3
        ),
        Err(Error::DirectoryNotEmpty { .. })
    ));
    assert!(matches!(st.stat("a/b"), Err(Error::InvalidPath { .. })));
    assert_eq!(st.stat("/a/b/g").expect("stat").state, FileState::Open);
    let log = st.take_outbox();
    replayed(&mut st, &log);
    st.delete(
        &Delete {
            path: "/a".into(),
            recursive: true,
            caller: None,
        },
        0,
        3,
    )
    .expect("rm -r");
    assert!(
        st.leases.is_empty(),
        "the deleted open file's lease is gone"
    );
    assert!(st.ns.is_empty());
}

#[test]
fn the_open_last_chunk_is_listed_in_pipeline_order_whatever_the_ack_order() {
    let mut st = state_with_servers(3);
    let ino = create(&mut st, "/f", A);
    let add = AddChunk {
        path: "/f".into(),
        client: A,
        previous: None,
    };
    let plan = st.add_chunk(&add, ino, 0, 2).expect("chunk").bump;
    let pipeline: Vec<_> = plan.targets.iter().map(|t| t.id).collect();
    // The tail's bump answered first, the head's last.
    let mut acks: Vec<_> = pipeline
        .iter()
        .map(|id| {
            (
                *id,
                ReplicaReport {
                    handle: plan.handle,
                    version: plan.version,
                    length: 0,
                    state: ReplicaState::Writing,
                },
            )
        })
        .collect();
    acks.reverse();
    st.record_replicas(plan.handle, &acks);
    st.grant_made(&plan, A, &pipeline, 0).expect("granted");
    let loc = st
        .locations("/f", B, &ClusterKey::from_bytes([1; 32]), 0)
        .expect("locations");
    let listed: Vec<_> = loc.chunks[0]
        .replicas
        .iter()
        .map(|r| r.chunkserver)
        .collect();
    assert_eq!(listed, pipeline, "head first, as the writer streams");
    assert!(!loc.chunks[0].unconfirmed, "every member is listed");
    // The tail's chunkserver stops heartbeating and is declared dead: what it holds
    // is unknown, so readers are told to read the committed length only.
    let later = st.settings.dead_after_ms + 1;
    for id in &pipeline[..2] {
        assert!(st.registry.heartbeat(*id, 1 << 40, 0, 1, 0, later));
    }
    let loc = st
        .locations("/f", B, &ClusterKey::from_bytes([1; 32]), later)
        .expect("locations");
    let listed: Vec<_> = loc.chunks[0]
        .replicas
        .iter()
        .map(|r| r.chunkserver)
        .collect();
    assert_eq!(listed, pipeline[..2], "the dead tail is not listed");
    assert!(loc.chunks[0].unconfirmed, "and the chunk says so");
}

#[test]
fn add_chunk_mints_handles_and_versions_and_commits_the_previous() {
    let mut st = state_with_servers(3);
    let ino = create(&mut st, "/f", A);
    let add = |prev| AddChunk {
        path: "/f".into(),
        client: A,
        previous: prev,
    };
    let p0 = st.add_chunk(&add(None), ino, 0, 2).expect("first chunk");
    assert_eq!((p0.bump.chunk_index, p0.bump.file_offset), (0, 0));
    assert!(p0.finalize.is_none());
    // A second copy of the first request (its reply lost, the writer asks again):
    // the empty chunk the first one added is dropped for a new one, never a chunk
    // added behind an empty one.
    let again = st.add_chunk(&add(None), ino, 0, 2).expect("asked again");
    assert_ne!(again.bump.handle, p0.bump.handle);
    assert_eq!((again.bump.chunk_index, again.bump.file_offset), (0, 0));
    assert_eq!(
        st.ns.file(ino).expect("file").chunks,
        vec![again.bump.handle]
    );
    assert!(
        st.chunks.get(p0.bump.handle).is_none(),
        "the first is forgotten"
    );
    let p0 = again;
    let p1 = st
        .add_chunk(
            &add(Some(ChunkCommit {
                handle: p0.bump.handle,
                length: 1 << 20,
            })),
            ino,
            0,
            2,
        )
        .expect("second chunk");
    assert_eq!(p1.bump.chunk_index, 1);
    ack_all(&mut st, &p1.bump);
    assert_eq!(p1.bump.version, ChunkVersion(1));
    assert_eq!(p1.bump.targets.len(), 3);
    assert!(p1.bump.create);
    let p2 = st
        .add_chunk(
            &add(Some(ChunkCommit {
                handle: p1.bump.handle,
                length: 1000,
            })),
            ino,
            0,
            3,
        )
        .expect("third chunk");
    assert!(p2.bump.handle > p1.bump.handle);
    // The same ask again, committing the same length: the third chunk is replaced.
    let p2 = st
        .add_chunk(
            &add(Some(ChunkCommit {
                handle: p1.bump.handle,
                length: 1000,
            })),
            ino,
            0,
            3,
        )
        .expect("third chunk asked again");
    assert_eq!(p2.bump.chunk_index, 2);
    assert_eq!(st.ns.file(ino).expect("file").chunks.len(), 3);
    // A chunk that was not the one asked for is not replaced: an ask that commits
    // another length than the first one committed is refused.
    let e = st
        .add_chunk(
            &add(Some(ChunkCommit {
                handle: p1.bump.handle,
                length: 2000,
            })),
            ino,
            0,
            3,
        )
        .unwrap_err();
    assert!(e.to_string().contains("not the chunk being written"), "{e}");
    assert_eq!(p2.bump.file_offset, (1 << 20) + 1000);
    let fin = p2.finalize.expect("finalize previous");
    assert_eq!(
        (fin.handle, fin.length, fin.targets.len()),
        (p1.bump.handle, 1000, 3)
    );
    // Another client may not add chunks.
    let mut other = add(None);
    other.client = B;
    assert!(matches!(
        st.add_chunk(&other, ino, 0, 3),
        Err(Error::LeaseExpired { .. })
    ));
    // A commit of a chunk that is not the last is refused.
    assert!(matches!(
        st.add_chunk(
            &add(Some(ChunkCommit {
                handle: p1.bump.handle,
                length: 5
            })),
            ino,
            0,
            3
        ),
        Err(Error::BadRequest { .. })
    ));
    let log = st.take_outbox();
    let back = replayed(&mut st, &log);
    assert!(back.chunks.next_handle() > p2.bump.handle);
}

#[test]
fn add_chunk_without_live_servers_is_not_enough_replicas() {
    let mut st = MasterState::new(settings());
    let ino = create(&mut st, "/f", A);
    let err = st
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
        .unwrap_err();
    assert!(
        matches!(err, Error::NotEnoughReplicas { live: 0, needed: 1 }),
        "{err}"
    );
    let mut st = state_with_servers(2);
    let ino = create(&mut st, "/f", A);
    // Servers die after dead_after without heartbeats.
    let err = st
        .add_chunk(
            &AddChunk {
                path: "/f".into(),
                client: A,
                previous: None,
            },
            ino,
            20_000,
            1,
        )
        .unwrap_err();
    assert!(matches!(err, Error::NotEnoughReplicas { .. }), "{err}");
}

#[test]
fn append_close_and_pipeline_recovery_bump_versions() {
    let mut st = state_with_servers(3);
    let ino = create(&mut st, "/f", A);
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
    ack_all(&mut st, &p.bump);
    let h = p.bump.handle;
    let close = |client, len| Close {
        path: "/f".into(),
        client,
        last: Some(ChunkCommit {
            handle: h,
            length: len,
        }),
        keep_mtime: false,
    };
    assert!(matches!(
        st.close(&close(B, 10), ino, 0, 2),
        Err(Error::LeaseExpired { .. })
    ));
    let c = st.close(&close(A, 10), ino, 0, 2).expect("close");
    assert_eq!((c.status.length, c.status.state), (10, FileState::Closed));
    assert!(st.leases.is_empty());
    // A retried close is fine; a different one is not.
    st.close(&close(A, 10), ino, 0, 2)
        .expect("idempotent close");
    assert!(st.close(&close(A, 11), ino, 0, 2).is_err());

    // Append re-leases the partial last chunk under version 2.
    let a = st
        .append(
            &Append {
                path: "/f".into(),
                client: B,
                caller: None,
            },
            ino,
            0,
            3,
        )
        .expect("append");
    let bump = a.bump.expect("partial chunk is re-leased");
    assert_eq!(
        (bump.version, bump.chunk_offset, bump.create),
        (ChunkVersion(2), 10, false)
    );
    assert_eq!(bump.targets.len(), 3);
    assert_eq!(a.status.state, FileState::Open);
    // Someone else's append now conflicts.
    let err = st
        .append(
            &Append {
                path: "/f".into(),
                client: A,
                caller: None,
            },
            ino,
            1_000,
            3,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseConflict {
                holder: B,
                expires_in_ms: 59_000,
                ..
            }
        ),
        "{err}"
    );
    ack_all(&mut st, &bump);
    // Pipeline recovery over two survivors: version 3, the third is now stale.
    let survivors: Vec<_> = bump.targets.iter().take(2).map(|t| t.id).collect();
    let up = UpdatePipeline {
        path: "/f".into(),
        client: B,
        handle: h,
        survivors: survivors.clone(),
        acked_length: 50,
    };
    let r = st.update_pipeline(&up, ino, 0).expect("recovery");
    assert_eq!(
        (r.version, r.chunk_offset, r.targets.len()),
        (ChunkVersion(3), 50, 2)
    );
    ack_all(&mut st, &r);
    let info = st.chunks.get(h).expect("chunk");
    assert_eq!(info.current().count(), 2);
    assert_eq!(info.stale().count(), 1);
    let loc = st
        .locations("/f", A, &ClusterKey::from_bytes([1; 32]), 0)
        .expect("locations");
    assert_eq!(
        loc.chunks[0].replicas.len(),
        2,
        "the stale replica is never handed out"
    );
    assert!(!loc.chunks[0].complete);
    assert_eq!(loc.chunks[0].version, ChunkVersion(3));
    // A survivor that is stale is refused.
    let mut bad = up.clone();
    bad.survivors = vec![bump.targets[2].id];
    assert!(matches!(
        st.update_pipeline(&bad, ino, 0),
        Err(Error::BadRequest { .. })
    ));
    let log = st.take_outbox();
    let back = replayed(&mut st, &log);
    assert_eq!(back.chunks.get(h).expect("chunk").version, ChunkVersion(3));
    assert_eq!(back.leases.get(ino).expect("open file lease").holder, B);
}

#[test]
fn counters_resume_strictly_above_after_replay_and_checkpoint() {
    let mut st = state_with_servers(2);
    let mut log = st.take_outbox();
    let mut handles = Vec::new();
    for i in 0..5 {
        let path = format!("/f{i}");
        let ino = create(&mut st, &path, A);
        let p = st
            .add_chunk(
                &AddChunk {
                    path: path.clone(),
                    client: A,
                    previous: None,
                },
                ino,
                0,
                1,
            )
            .expect("chunk");
        ack_all(&mut st, &p.bump);
        handles.push(p.bump.handle);
        st.close(
            &Close {
                path: path.clone(),
                client: A,
                last: Some(ChunkCommit {
                    handle: p.bump.handle,
                    length: 1,
                }),
                keep_mtime: false,
            },
            ino,
            0,
            1,
        )
        .expect("close");
        let a = st
            .append(
                &Append {
                    path,
                    client: B,
                    caller: None,
                },
                ino,
                0,
                1,
            )
            .expect("append");
        assert_eq!(a.bump.expect("bump").version, ChunkVersion(2));
    }
    st.delete(
        &Delete {
            path: "/f4".into(),
            recursive: false,
            caller: None,
        },
        0,
        1,
    )
    .expect("rm");
    log.extend(st.take_outbox());
    // Full log replay.
    let mut back = replayed(&mut st, &log);
    // Checkpoint at the middle, then the rest of the log.
    let mid = log.len() / 2;
    let mut half = MasterState::new(settings());
    replay_records(
        &mut half,
        log[..mid].iter().map(|(l, b)| (*l, b.as_slice())),
        0,
    )
    .expect("first half");
    let snap = half.encode_snapshot().expect("snapshot");
    let mut from_ckpt = MasterState::decode_snapshot(settings(), &snap, 0).expect("decode");
    replay_records(
        &mut from_ckpt,
        log[mid..].iter().map(|(l, b)| (*l, b.as_slice())),
        0,
    )
    .expect("second half");
    assert!(from_ckpt.same_persisted(&st));
    for replayed in [&mut back, &mut from_ckpt] {
        assert!(replayed.chunks.next_handle() > *handles.iter().max().expect("some"));
        assert!(replayed.ns.next_inode().0 > 6);
        assert_eq!(replayed.next_server_id(), ChunkserverId(3));
        assert_eq!(replayed.last_lsn, st.last_lsn);
        // The next version minted for each surviving chunk is above every one issued.
        for h in &handles[..4] {
            assert_eq!(
                replayed.chunks.get(*h).expect("chunk").version,
                ChunkVersion(2)
            );
        }
        assert!(
            replayed.chunks.get(handles[4]).is_none(),
            "deleted with its file"
        );
        // A new chunk gets a fresh handle.
        replayed
            .register(
                &Register {
                    id: Some(ChunkserverId(1)),
                    addr: "127.0.0.1:9000".into(),
                    capacity: 1 << 40,
                    used: 0,
                    replicas: vec![],
                    session: 0,
                },
                0,
                replayed.ack_mark(),
            )
            .expect("re-register keeps the id");
        let ino = replayed.resolve_path("/f0").expect("f0");
        // B reopened /f0: it commits the last chunk it holds as it moves on.
        let last = *replayed
            .ns
            .file(ino)
            .and_then(|f| f.chunks.last())
            .expect("a chunk");
        let length = replayed.chunks.get(last).expect("chunk").length;
        let p = replayed
            .add_chunk(
                &AddChunk {
                    path: "/f0".into(),
                    client: B,
                    previous: Some(ChunkCommit {
                        handle: last,
                        length,
                    }),
                },
                ino,
                0,
                1,
            )
            .expect("new chunk");
        assert!(!handles.contains(&p.bump.handle));
        assert!(p.bump.handle > *handles.iter().max().expect("some"));
    }
}

#[test]
fn a_format_1_checkpoint_is_still_read() {
    let mut st = state_with_servers(1);
    let ino = create(&mut st, "/f", A);
    st.close(
        &Close {
            path: "/f".into(),
            client: A,
            last: None,
            keep_mtime: false,
        },
        ino,
        0,
        1,
    )
    .expect("close");
    st.mkdir(
        &Mkdir {
            path: "/d".into(),
            parents: false,
            attr: None,
            caller: None,
        },
        0,
        1,
    )
    .expect("mkdir");
    assert_eq!(
        st.encode_snapshot().expect("snapshot")[0],
        SNAPSHOT_FORMAT as u8
    );
    // What formats before 6 kept of the namespace: no attributes but the
    // modification time.
    st.ns = crate::namespace::v5::Namespace::downgrade(&st.ns)
        .upgrade()
        .expect("upgrade");
    // Without open files formats 1 and 2 differ only in the leading number (one
    // varint byte), and 2 to 5 share the namespace's layout.
    let mut snap = bincode::encode_to_vec(
        (
            2u32,
            st.last_lsn,
            crate::namespace::v5::Namespace::downgrade(&st.ns),
            &st.chunks,
            &st.servers,
            st.next_server_id().0,
        ),
        bincode::config::standard(),
    )
    .expect("v2");
    snap[0] = 1;
    let back = MasterState::decode_snapshot(settings(), &snap, 0).expect("format 1");
    assert!(back.same_persisted(&st));
    snap[0] = 9;
    assert!(MasterState::decode_snapshot(settings(), &snap, 0).is_err());
}

#[test]
fn registration_keeps_known_ids_and_classifies_reports() {
    let mut st = state_with_servers(1);
    let ino = create(&mut st, "/f", A);
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
    let h = p.bump.handle;
    st.update_pipeline(
        &UpdatePipeline {
            path: "/f".into(),
            client: A,
            handle: h,
            survivors: vec![],
            acked_length: 0,
        },
        ino,
        0,
    )
    .expect_err("no survivors");
    let rep = |version| ReplicaReport {
        handle: h,
        version: ChunkVersion(version),
        length: 0,
        state: ReplicaState::Writing,
    };
    let orphan = ReplicaReport {
        handle: ChunkHandle(999),
        ..rep(1)
    };
    let id = st
        .register(
            &Register {
                id: Some(ChunkserverId(1)),
                addr: "127.0.0.1:9000".into(),
                capacity: 1,
                used: 0,
                replicas: vec![rep(1), orphan],
                session: 0,
            },
            0,
            st.ack_mark(),
        )
        .expect("register");
    assert_eq!(id, ChunkserverId(1));
    let cs = st.registry.get(id).expect("registered");
    assert_eq!(cs.orphans, vec![orphan]);
    assert_eq!(st.chunks.get(h).expect("c").current().count(), 1);
    // A report above the master's version is never handed out.
    let s = st.apply_report(id, &[rep(7)], st.ack_mark());
    assert_eq!(s.ahead, 1);
    let loc = st
        .locations("/f", A, &ClusterKey::from_bytes([1; 32]), 0)
        .expect("locations");
    assert!(loc.chunks[0].replicas.is_empty());
    // An empty full report removes the replica.
    st.apply_report(id, &[], st.ack_mark());
    assert!(st.chunks.get(h).expect("c").replicas.is_empty());
    // An unknown id gets a fresh one.
    let new = st
        .register(
            &Register {
                id: Some(ChunkserverId(77)),
                addr: "x".into(),
                capacity: 1,
                used: 0,
                replicas: vec![],
                session: 0,
            },
            0,
            st.ack_mark(),
        )
        .expect("register");
    assert_eq!(new, ChunkserverId(2));
}
