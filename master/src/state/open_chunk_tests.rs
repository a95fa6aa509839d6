//! A writer that moves to an existing chunk of its file (`OpenChunk`,
//! `Record::ChunkOpened`): the chunk it leaves is committed and finalized, the chunk it
//! moves to gets a new version and is the one being written (listed incomplete, left
//! alone by replica health, recovered by lease recovery even though it is full), and
//! all of it survives replay and checkpoints. Pure: no sockets.

use super::recovery::RecoveryBegin;
use super::*;
use crate::recovery::Trigger;
use stampfs_proto::{
    AddChunk, ChunkCommit, Close, Create, DropChunks, OpenChunk, ReplicaReport, ReplicaState,
    UpdatePipeline,
};

const A: ClientId = ClientId(0xa);
const B: ClientId = ClientId(0xb);
const CHUNK: u64 = 1 << 20;

fn state_with_servers(n: u64) -> MasterState {
    let mut st = MasterState::new(Settings::for_tests());
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

/// Every target of `plan` took its bump (at the plan's chunk offset).
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
    let ids: Vec<_> = plan.targets.iter().map(|t| t.id).collect();
    st.grant_made(plan, A, &ids, 0).expect("granted");
}

/// `/f` open by A with `n` chunks, every one but the last written full, the last
/// `last` bytes long (acknowledged, not committed).
fn file_of(st: &mut MasterState, n: usize) -> (InodeId, Vec<ChunkHandle>) {
    let ino = st
        .create(
            &Create {
                path: "/f".into(),
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
        .inode;
    let mut hs: Vec<ChunkHandle> = Vec::new();
    for _ in 0..n {
        let add = AddChunk {
            path: "/f".into(),
            client: A,
            previous: hs.last().map(|h| ChunkCommit {
                handle: *h,
                length: CHUNK,
            }),
        };
        let plan = st.add_chunk(&add, ino, 0, 2).expect("chunk").bump;
        ack_all(st, &plan);
        hs.push(plan.handle);
    }
    (ino, hs)
}

fn open_req(previous: Option<ChunkCommit>, index: u64) -> OpenChunk {
    OpenChunk {
        path: "/f".into(),
        client: A,
        previous,
        index,
    }
}

/// Replays the whole log so far (`log` gathers what each call takes from the outbox)
/// and loads a checkpoint: both rebuild the same state.
fn replayed(st: &mut MasterState, log: &mut Vec<(u64, Vec<u8>)>) -> MasterState {
    log.extend(st.take_outbox());
    let mut back = MasterState::new(Settings::for_tests());
    replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
    assert!(back.same_persisted(st), "replay rebuilds the same state");
    let snap = st.encode_snapshot().expect("snapshot");
    let loaded = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("load");
    assert!(loaded.same_persisted(st), "so does the checkpoint");
    back
}

#[test]
fn a_writer_moves_to_an_earlier_chunk_and_back_and_closes() {
    let mut st = state_with_servers(3);
    let mut log = Vec::new();
    let (ino, hs) = file_of(&mut st, 3);
    let last = ChunkCommit {
        handle: hs[2],
        length: 500,
    };
    let v0 = st.chunks.get(hs[0]).expect("chunk 0").version;
    let plan = st
        .open_chunk(&open_req(Some(last), 0), ino, 0, 3)
        .expect("open chunk 0");
    assert_eq!(plan.bump.handle, hs[0]);
    assert_eq!(plan.bump.version, v0.next(), "a new version for the chunk");
    assert!(!plan.bump.create);
    assert_eq!(
        (
            plan.bump.chunk_index,
            plan.bump.file_offset,
            plan.bump.chunk_offset
        ),
        (0, 0, CHUNK),
        "full: written in place"
    );
    assert_eq!(plan.bump.targets.len(), 3);
    let fin = plan.finalize.as_ref().expect("the chunk left is finalized");
    assert_eq!((fin.handle, fin.length), (hs[2], 500));
    assert_eq!(st.chunks.get(hs[2]).map(|c| c.length), Some(500));
    // Until the grant, lease recovery starts from the version the replicas held.
    let f = st.ns.file(ino).expect("file");
    assert_eq!(f.write.floor(), Some(v0));
    assert_eq!(st.open_chunk_of(ino, f), Some(hs[0]));
    ack_all(&mut st, &plan.bump);
    let f = st.ns.file(ino).expect("file");
    assert_eq!(f.write.floor(), Some(v0.next()));

    // Readers see chunk 0 as the one being written; the last chunk is committed.
    let key = ClusterKey::from_bytes([1; 32]);
    let loc = st.locations("/f", B, &key, 0).expect("locations");
    let complete: Vec<bool> = loc.chunks.iter().map(|c| c.complete).collect();
    assert_eq!(complete, [false, true, true]);
    assert_eq!(loc.status.length, 2 * CHUNK + 500);
    // Replica health leaves chunk 0 alone, not the others.
    let f = st.ns.file(ino).expect("file");
    let settled: Vec<bool> = (0..3)
        .map(|i| crate::health::settled(&st, ino, f, i))
        .collect();
    assert_eq!(settled, [false, true, true]);
    let back = replayed(&mut st, &mut log);
    assert_eq!(back.open_chunks.get(&ino), Some(&hs[0]));

    // Back to the last chunk, then close there.
    let plan = st
        .open_chunk(
            &open_req(
                Some(ChunkCommit {
                    handle: hs[0],
                    length: CHUNK,
                }),
                2,
            ),
            ino,
            0,
            4,
        )
        .expect("open the last chunk");
    assert_eq!((plan.bump.handle, plan.bump.chunk_offset), (hs[2], 500));
    ack_all(&mut st, &plan.bump);
    let close = Close {
        path: "/f".into(),
        client: A,
        last: Some(ChunkCommit {
            handle: hs[2],
            length: 700,
        }),
        keep_mtime: false,
    };
    st.close(&close, ino, 0, 5).expect("close");
    assert!(st.open_chunks.is_empty());
    let loc = st.locations("/f", B, &key, 0).expect("locations");
    assert!(loc.chunks.iter().all(|c| c.complete));
    assert_eq!(loc.status.length, 2 * CHUNK + 700);
    replayed(&mut st, &mut log);
}

#[test]
fn closing_in_an_earlier_chunk_commits_it_full_and_reads_the_rest_as_committed() {
    let mut st = state_with_servers(3);
    let mut log = Vec::new();
    let (ino, hs) = file_of(&mut st, 2);
    let plan = st
        .open_chunk(
            &open_req(
                Some(ChunkCommit {
                    handle: hs[1],
                    length: 10,
                }),
                0,
            ),
            ino,
            0,
            3,
        )
        .expect("open chunk 0");
    ack_all(&mut st, &plan.bump);
    // A commit of the earlier chunk below its size is refused, the file stays open.
    let short = Close {
        path: "/f".into(),
        client: A,
        last: Some(ChunkCommit {
            handle: hs[0],
            length: CHUNK - 1,
        }),
        keep_mtime: false,
    };
    assert!(matches!(
        st.close(&short, ino, 0, 4),
        Err(Error::BadRequest { .. })
    ));
    // So is a commit of another chunk than the one being written.
    let other = Close {
        path: "/f".into(),
        client: A,
        last: Some(ChunkCommit {
            handle: hs[1],
            length: 10,
        }),
        keep_mtime: false,
    };
    assert!(matches!(
        st.close(&other, ino, 0, 4),
        Err(Error::BadRequest { .. })
    ));
    let close = Close {
        path: "/f".into(),
        client: A,
        last: Some(ChunkCommit {
            handle: hs[0],
            length: CHUNK,
        }),
        keep_mtime: false,
    };
    let plan = st.close(&close, ino, 0, 4).expect("close");
    assert_eq!(plan.finalize.map(|f| f.handle), Some(hs[0]));
    assert_eq!(plan.status.length, CHUNK + 10);
    replayed(&mut st, &mut log);
}

#[test]
fn bad_moves_are_refused_and_change_nothing() {
    let mut st = state_with_servers(3);
    let (ino, hs) = file_of(&mut st, 2);
    let lsn = st.last_lsn;
    let last = Some(ChunkCommit {
        handle: hs[1],
        length: 10,
    });
    let bad = |st: &mut MasterState, req: OpenChunk| {
        let e = st.open_chunk(&req, ino, 0, 3).expect_err("refused");
        assert!(matches!(e, Error::BadRequest { .. }), "{e:?}");
    };
    // Past the last chunk.
    bad(&mut st, open_req(last, 2));
    // The chunk being written already.
    bad(&mut st, open_req(last, 1));
    // A previous that is not the chunk being written.
    bad(
        &mut st,
        open_req(
            Some(ChunkCommit {
                handle: hs[0],
                length: CHUNK,
            }),
            0,
        ),
    );
    // Another client.
    let mut other = open_req(last, 0);
    other.client = B;
    assert!(st.open_chunk(&other, ino, 0, 3).is_err());
    assert_eq!(st.last_lsn, lsn, "nothing was logged");
    assert!(st.open_chunks.is_empty());
}

#[test]
fn an_earlier_chunk_that_is_not_full_is_never_opened() {
    let mut st = state_with_servers(3);
    let ino = st
        .create(
            &Create {
                path: "/f".into(),
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
        .inode;
    // A chunk committed short, then another after it (no client writes this, the
    // master does not refuse it).
    let mut prev = None;
    let mut hs = Vec::new();
    for _ in 0..2 {
        let add = AddChunk {
            path: "/f".into(),
            client: A,
            previous: prev,
        };
        let plan = st.add_chunk(&add, ino, 0, 2).expect("chunk").bump;
        ack_all(&mut st, &plan);
        hs.push(plan.handle);
        prev = Some(ChunkCommit {
            handle: plan.handle,
            length: 100,
        });
    }
    let e = st
        .open_chunk(&open_req(prev, 0), ino, 0, 3)
        .expect_err("refused");
    assert!(matches!(e, Error::BadRequest { .. }), "{e:?}");
}

#[test]
fn lease_recovery_recovers_the_earlier_chunk_being_written_even_though_it_is_full() {
    let mut st = state_with_servers(3);
    let mut log = Vec::new();
    let (ino, hs) = file_of(&mut st, 2);
    let plan = st
        .open_chunk(
            &open_req(
                Some(ChunkCommit {
                    handle: hs[1],
                    length: 10,
                }),
                0,
            ),
            ino,
            0,
            3,
        )
        .expect("open chunk 0");
    ack_all(&mut st, &plan.bump);
    let granted = plan.bump.version;
    let begin = st
        .begin_recovery(
            ino,
            Trigger::Operator {
                client: B,
                accept_loss: false,
            },
            0,
            9,
        )
        .expect("recovery");
    let RecoveryBegin::Bump(rec) = begin else {
        panic!("the full earlier chunk is recovered, not closed at once: {begin:?}");
    };
    assert_eq!(rec.handle, hs[0]);
    assert_eq!(rec.old_version, granted);
    assert_eq!(rec.version, granted.next());
    assert_eq!(
        rec.committed, CHUNK,
        "no replica shorter than the chunk votes"
    );
    assert_eq!(rec.targets.len(), 3);
    // The commit keeps the chunk full; a shorter length is refused.
    let short = Record::RecoveryCommitted {
        inode: ino,
        handle: hs[0],
        version: rec.version,
        length: CHUNK - 1,
        mtime_ms: 10,
    };
    assert!(st.commit(short, 0).is_err());
    st.commit(
        Record::RecoveryCommitted {
            inode: ino,
            handle: hs[0],
            version: rec.version,
            length: CHUNK,
            mtime_ms: 10,
        },
        0,
    )
    .expect("committed");
    let f = st.ns.file(ino).expect("file");
    assert_eq!(f.write, WriteState::Closed);
    assert!(st.open_chunks.is_empty());
    assert_eq!(
        st.status("/f".into(), ino).expect("status").length,
        CHUNK + 10
    );
    replayed(&mut st, &mut log);
}

#[test]
fn a_full_last_chunk_written_again_is_recovered_too() {
    let mut st = state_with_servers(3);
    let (ino, hs) = file_of(&mut st, 2);
    // The writer fills the last chunk, goes to chunk 0, then back to the full last.
    let plan = st
        .open_chunk(
            &open_req(
                Some(ChunkCommit {
                    handle: hs[1],
                    length: CHUNK,
                }),
                0,
            ),
            ino,
            0,
            3,
        )
        .expect("open chunk 0");
    ack_all(&mut st, &plan.bump);
    let plan = st
        .open_chunk(
            &open_req(
                Some(ChunkCommit {
                    handle: hs[0],
                    length: CHUNK,
                }),
                1,
            ),
            ino,
            0,
            4,
        )
        .expect("open the full last chunk");
    ack_all(&mut st, &plan.bump);
    let begin = st
        .begin_recovery(
            ino,
            Trigger::Operator {
                client: B,
                accept_loss: false,
            },
            0,
            9,
        )
        .expect("recovery");
    assert!(
        matches!(&begin, RecoveryBegin::Bump(rec) if rec.handle == hs[1]),
        "{begin:?}"
    );
}

#[test]
fn dropping_chunks_leaves_a_full_last_chunk_and_forgets_the_rest() {
    let mut st = state_with_servers(3);
    let mut log = Vec::new();
    let (ino, hs) = file_of(&mut st, 4);
    // The writer is in chunk 1 (moved there from the last).
    let plan = st
        .open_chunk(
            &open_req(
                Some(ChunkCommit {
                    handle: hs[3],
                    length: 10,
                }),
                1,
            ),
            ino,
            0,
            3,
        )
        .expect("open chunk 1");
    ack_all(&mut st, &plan.bump);
    let drop = |previous, keep| DropChunks {
        path: "/f".into(),
        client: A,
        previous,
        keep,
    };
    let at_one = Some(ChunkCommit {
        handle: hs[1],
        length: CHUNK,
    });
    // Nothing to drop, or a short chunk left last: refused, nothing logged.
    let lsn = st.last_lsn;
    assert!(st.drop_chunks(&drop(at_one, 4), ino, 0, 4).is_err());
    let short = Some(ChunkCommit {
        handle: hs[1],
        length: CHUNK - 1,
    });
    assert!(st.drop_chunks(&drop(short, 2), ino, 0, 4).is_err());
    assert_eq!(st.last_lsn, lsn);
    // Keep chunks 0 and 1: chunk 1, the one being written, is finalized.
    let fin = st
        .drop_chunks(&drop(at_one, 2), ino, 0, 4)
        .expect("drop")
        .expect("the kept chunk being written is finalized");
    assert_eq!((fin.handle, fin.length), (hs[1], CHUNK));
    let f = st.ns.file(ino).expect("file");
    assert_eq!(f.chunks, hs[..2]);
    assert!(st.chunks.get(hs[2]).is_none() && st.chunks.get(hs[3]).is_none());
    assert_eq!(st.open_chunk_of(ino, f), Some(hs[1]), "the new last chunk");
    assert_eq!(
        f.write.floor(),
        st.chunks.get(hs[1]).map(|i| i.version),
        "recovery starts from the chunk's version"
    );
    assert_eq!(
        st.status("/f".into(), ino).expect("status").length,
        2 * CHUNK
    );
    // Everything, from the last chunk: the file is empty and still open.
    assert_eq!(
        st.drop_chunks(&drop(None, 0), ino, 0, 5).expect("drop all"),
        None
    );
    let f = st.ns.file(ino).expect("file");
    assert!(f.chunks.is_empty());
    assert_eq!(f.writer(), Some(A));
    replayed(&mut st, &mut log);
}

#[test]
fn a_move_without_committing_the_granted_chunk_is_refused() {
    let mut st = state_with_servers(3);
    let (ino, hs) = file_of(&mut st, 2);
    let lsn = st.last_lsn;
    // Granted the last chunk: moving (or dropping) without its commit would lose it.
    for req in [open_req(None, 0), open_req(None, 1)] {
        let e = st.open_chunk(&req, ino, 0, 3).expect_err("refused");
        assert!(matches!(e, Error::BadRequest { .. }), "{e:?}");
    }
    let drop = DropChunks {
        path: "/f".into(),
        client: A,
        previous: None,
        keep: 1,
    };
    assert!(st.drop_chunks(&drop, ino, 0, 3).is_err());
    assert_eq!(st.last_lsn, lsn);
    // A close retried after it closed the file in an earlier chunk answers again.
    let at_one = Some(ChunkCommit {
        handle: hs[1],
        length: 10,
    });
    let plan = st
        .open_chunk(&open_req(at_one, 0), ino, 0, 3)
        .expect("open chunk 0");
    ack_all(&mut st, &plan.bump);
    let close = Close {
        path: "/f".into(),
        client: A,
        last: Some(ChunkCommit {
            handle: hs[0],
            length: CHUNK,
        }),
        keep_mtime: false,
    };
    st.close(&close, ino, 0, 4).expect("close");
    let again = st.close(&close, ino, 0, 5).expect("the retry");
    assert!(again.finalize.is_none());
    assert_eq!(again.status.length, CHUNK + 10);
}

/// A master group failed over (or a connection broke) between a request and its
/// answer, and the writer, which never got the answer, asks again: the move to an
/// earlier chunk and the pipeline update are made again under a newer version, and
/// lease recovery still starts from the version the writer held.
#[test]
fn a_move_or_a_pipeline_update_asked_again_gets_another_version() {
    let mut st = state_with_servers(3);
    let mut log = Vec::new();
    let (ino, hs) = file_of(&mut st, 3);
    let last = ChunkCommit {
        handle: hs[2],
        length: 500,
    };
    let v0 = st.chunks.get(hs[0]).expect("chunk 0").version;
    let first = st
        .open_chunk(&open_req(Some(last), 0), ino, 0, 3)
        .expect("open chunk 0");
    // The bump went out and the grant was logged, but the answer was lost.
    ack_all(&mut st, &first.bump);
    let again = st
        .open_chunk(&open_req(Some(last), 0), ino, 0, 3)
        .expect("asked again");
    assert_eq!(again.bump.handle, hs[0]);
    assert!(again.bump.version > first.bump.version);
    let f = st.ns.file(ino).expect("file");
    assert_eq!(st.open_chunk_of(ino, f), Some(hs[0]));
    assert_eq!(
        f.write.floor(),
        Some(first.bump.version),
        "the floor the first grant set"
    );
    // Once more, before the second answer's bump reached any replica: the floor stays.
    let third = st
        .open_chunk(&open_req(Some(last), 0), ino, 0, 3)
        .expect("asked a third time");
    assert!(third.bump.version > again.bump.version);
    let f = st.ns.file(ino).expect("file");
    assert_eq!(f.write.floor(), Some(first.bump.version));
    assert!(v0 < first.bump.version);
    // A commit that is not the one the first ask made is refused as before.
    let other = ChunkCommit {
        handle: hs[2],
        length: 400,
    };
    assert!(st.open_chunk(&open_req(Some(other), 0), ino, 0, 3).is_err());

    // A pipeline update asked again: the replicas still hold the granted version (the
    // second version's bump never reached them) and are accepted as survivors.
    ack_all(&mut st, &third.bump);
    let survivors: Vec<_> = third.bump.targets.iter().map(|t| t.id).take(2).collect();
    let update = UpdatePipeline {
        path: "/f".into(),
        client: A,
        handle: hs[0],
        survivors: survivors.clone(),
        acked_length: CHUNK,
    };
    let u1 = st.update_pipeline(&update, ino, 0).expect("update");
    let u2 = st
        .update_pipeline(&update, ino, 0)
        .expect("update asked again");
    assert!(u2.version > u1.version && u1.version > third.bump.version);
    assert_eq!(u2.targets.len(), 2);
    // A replica below the version the writer holds is not a survivor.
    let excluded = third
        .bump
        .targets
        .iter()
        .map(|t| t.id)
        .find(|id| !survivors.contains(id))
        .expect("a third replica");
    st.record_replicas(
        hs[0],
        &[(
            excluded,
            ReplicaReport {
                handle: hs[0],
                version: first.bump.version,
                length: CHUNK,
                state: ReplicaState::Writing,
            },
        )],
    );
    let stale = UpdatePipeline {
        survivors: vec![excluded],
        ..update
    };
    assert!(st.update_pipeline(&stale, ino, 0).is_err());
    let back = replayed(&mut st, &mut log);
    assert_eq!(back.open_chunks.get(&ino), Some(&hs[0]));
}

/// A writer moved back to an earlier chunk writes on to the end of the file: its
/// `AddChunk` commits the earlier chunk and adds a chunk after the full last one. Asked
/// again after a lost answer, the empty chunk is dropped for a new one, the earlier
/// chunk stays committed, and the first grant's version was bumped on some replicas
/// only (no grant logged): the floor and the file are as the writer left them.
#[test]
fn a_new_chunk_asked_again_from_an_earlier_chunk_replaces_the_empty_one() {
    let mut st = state_with_servers(3);
    let mut log = Vec::new();
    let (ino, mut hs) = file_of(&mut st, 2);
    // The last chunk full, then back to chunk 0.
    let full_last = ChunkCommit {
        handle: hs[1],
        length: CHUNK,
    };
    let back = st
        .open_chunk(&open_req(Some(full_last), 0), ino, 0, 3)
        .expect("open chunk 0");
    ack_all(&mut st, &back.bump);
    let add = AddChunk {
        path: "/f".into(),
        client: A,
        previous: Some(ChunkCommit {
            handle: hs[0],
            length: CHUNK,
        }),
    };
    let first = st.add_chunk(&add, ino, 0, 4).expect("a new chunk");
    assert_eq!(first.bump.chunk_index, 2);
    // The bump reached one replica; no grant was logged; the answer was lost.
    let one = first.bump.targets[0].id;
    st.record_replicas(
        first.bump.handle,
        &[(
            one,
            ReplicaReport {
                handle: first.bump.handle,
                version: first.bump.version,
                length: 0,
                state: ReplicaState::Writing,
            },
        )],
    );
    let again = st.add_chunk(&add, ino, 0, 4).expect("asked again");
    assert_eq!(again.bump.chunk_index, 2);
    assert_ne!(again.bump.handle, first.bump.handle);
    let f = st.ns.file(ino).expect("file");
    hs.push(again.bump.handle);
    assert_eq!(f.chunks, hs, "no chunk left behind an empty one");
    assert_eq!(st.open_chunk_of(ino, f), Some(again.bump.handle));
    assert_eq!(st.chunks.get(hs[0]).map(|c| c.length), Some(CHUNK));
    // A commit of another length is not the same ask: refused.
    let other = AddChunk {
        previous: Some(ChunkCommit {
            handle: hs[0],
            length: CHUNK - 1,
        }),
        ..add
    };
    assert!(st.add_chunk(&other, ino, 0, 4).is_err());
    replayed(&mut st, &mut log);
}
