//! Directory quotas (`state/quota.rs`): what counts, where it is refused, and that
//! the use kept record by record always equals a fresh walk of the subtree, through
//! replay and checkpoints. Pure, no sockets.

use super::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use stampfs_proto::{
    AddChunk, Append, ChunkCommit, Close, Create, Delete, Mkdir, QuotaChange, QuotaResource,
    Rename, SetQuota, SetReplication, Symlink,
};

const A: ClientId = ClientId(0xa);
const MIB: u64 = 1 << 20;

/// Three chunkservers, the unit tests' settings.
fn state() -> MasterState {
    super::tests::state_with_servers(3)
}

fn mkdir(st: &mut MasterState, path: &str) -> Result<FileStatus> {
    st.mkdir(
        &Mkdir {
            path: path.into(),
            parents: true,
            attr: None,
            caller: None,
        },
        0,
        1,
    )
}

fn create(st: &mut MasterState, path: &str, replication: u8) -> Result<InodeId> {
    st.create(
        &Create {
            path: path.into(),
            client: A,
            replication: Some(replication),
            chunk_size: Some(MIB),
            overwrite: false,
            attr: None,
            caller: None,
        },
        0,
        1,
    )
    .map(|s| s.inode)
}

/// Adds a chunk to the open file `path`, committing the one before as full.
fn add_chunk(st: &mut MasterState, path: &str, ino: InodeId) -> Result<ChunkHandle> {
    let previous = st
        .ns
        .file(ino)
        .and_then(|f| f.chunks.last())
        .map(|h| ChunkCommit {
            handle: *h,
            length: MIB,
        });
    st.add_chunk(
        &AddChunk {
            path: path.into(),
            client: A,
            previous,
        },
        ino,
        0,
        1,
    )
    .map(|p| p.bump.handle)
}

fn close(st: &mut MasterState, path: &str, ino: InodeId, last_length: u64) -> Result<()> {
    let last = st
        .ns
        .file(ino)
        .and_then(|f| f.chunks.last())
        .map(|h| ChunkCommit {
            handle: *h,
            length: last_length,
        });
    st.close(
        &Close {
            path: path.into(),
            client: A,
            last,
            keep_mtime: false,
        },
        ino,
        0,
        1,
    )
    .map(|_| ())
}

/// A closed file of `chunks` chunks, the last holding `last_length` bytes.
fn file(
    st: &mut MasterState,
    path: &str,
    replication: u8,
    chunks: usize,
    last_length: u64,
) -> Result<InodeId> {
    let ino = create(st, path, replication)?;
    for _ in 0..chunks {
        add_chunk(st, path, ino)?;
    }
    close(st, path, ino, last_length)?;
    Ok(ino)
}

fn set_quota(st: &mut MasterState, path: &str, names: Option<u64>, bytes: Option<u64>) {
    let change = |v: Option<u64>| v.map_or(QuotaChange::Clear, QuotaChange::Set);
    st.set_quota(
        &SetQuota {
            path: path.into(),
            names: change(names),
            bytes: change(bytes),
        },
        0,
    )
    .expect("set quota");
}

fn used(st: &MasterState, path: &str) -> Usage {
    let ino = st.resolve_path(path).expect("resolve");
    st.quotas.get(&ino).expect("a quota").used
}

fn rename(st: &mut MasterState, src: &str, dst: &str, replace: bool) -> Result<()> {
    st.rename(
        &Rename {
            src: src.into(),
            dst: dst.into(),
            replace,
            caller: None,
        },
        0,
        1,
    )
}

fn rm(st: &mut MasterState, path: &str) -> Result<()> {
    st.delete(
        &Delete {
            path: path.into(),
            recursive: true,
            caller: None,
        },
        0,
        1,
    )
}

/// Every quota'd directory's kept use equals a fresh walk of its subtree.
fn assert_consistent(st: &MasterState, context: &str) {
    for (ino, q) in &st.quotas {
        assert_eq!(
            q.used,
            st.subtree_usage(*ino),
            "kept use of {ino} after {context}"
        );
    }
}

fn exceeded(r: Result<impl std::fmt::Debug>) -> (String, QuotaResource) {
    match r {
        Err(Error::QuotaExceeded { path, resource, .. }) => (path, resource),
        other => panic!("expected a quota refusal, got {other:?}"),
    }
}

#[test]
fn names_and_replicated_bytes_count_and_open_chunks_count_whole() {
    let mut st = state();
    mkdir(&mut st, "/q").expect("mkdir");
    set_quota(&mut st, "/q", Some(100), Some(100 * MIB));
    // The directory counts itself.
    assert_eq!(used(&st, "/q"), Usage { names: 1, bytes: 0 });
    let ino = create(&mut st, "/q/f", 3).expect("create");
    assert_eq!(used(&st, "/q"), Usage { names: 2, bytes: 0 });
    add_chunk(&mut st, "/q/f", ino).expect("chunk");
    // Open: the chunk counts whole, once per replica.
    assert_eq!(used(&st, "/q").bytes, 3 * MIB);
    add_chunk(&mut st, "/q/f", ino).expect("chunk");
    assert_eq!(used(&st, "/q").bytes, 6 * MIB);
    close(&mut st, "/q/f", ino, 10).expect("close");
    // Closed: its length, once per replica.
    assert_eq!(used(&st, "/q").bytes, 3 * (MIB + 10));
    st.symlink(
        &Symlink {
            path: "/q/l".into(),
            target: "f".into(),
            attr: None,
            caller: None,
        },
        0,
        1,
    )
    .expect("symlink");
    mkdir(&mut st, "/q/a/b").expect("mkdir -p");
    assert_eq!(used(&st, "/q").names, 5);
    assert_consistent(&st, "building");
    rm(&mut st, "/q/f").expect("rm");
    assert_eq!(used(&st, "/q"), Usage { names: 4, bytes: 0 });
    assert_consistent(&st, "rm");
}

#[test]
fn a_name_quota_refuses_creates_mkdirs_and_links_past_it_and_logs_nothing() {
    let mut st = state();
    mkdir(&mut st, "/q").expect("mkdir");
    set_quota(&mut st, "/q", Some(3), None);
    create(&mut st, "/q/a", 1).expect("second name");
    mkdir(&mut st, "/q/d").expect("third name");
    let lsn = st.last_lsn;
    assert_eq!(
        exceeded(create(&mut st, "/q/b", 1)),
        ("/q".to_string(), QuotaResource::Names)
    );
    exceeded(mkdir(&mut st, "/q/d/e"));
    exceeded(st.symlink(
        &Symlink {
            path: "/q/l".into(),
            target: "a".into(),
            attr: None,
            caller: None,
        },
        0,
        1,
    ));
    assert_eq!(st.last_lsn, lsn, "a refusal logs nothing");
    // An overwrite keeps the count of names: it fits.
    st.create(
        &Create {
            path: "/q/a".into(),
            client: A,
            replication: Some(1),
            chunk_size: Some(MIB),
            overwrite: true,
            attr: None,
            caller: None,
        },
        0,
        1,
    )
    .expect("overwrite at the limit");
    // Raising the limit lets it grow again; a limit below the use is allowed.
    set_quota(&mut st, "/q", Some(4), None);
    create(&mut st, "/q/b", 1).expect("fits now");
    set_quota(&mut st, "/q", Some(1), None);
    exceeded(create(&mut st, "/q/c", 1));
    rm(&mut st, "/q/b").expect("deletes still work past the limit");
    assert_consistent(&st, "names");
}

#[test]
fn a_space_quota_refuses_the_chunk_that_would_pass_it_and_a_reopen_charges_the_rest() {
    let mut st = state();
    mkdir(&mut st, "/q").expect("mkdir");
    set_quota(&mut st, "/q", None, Some(4 * MIB));
    // Two chunks of 1 MiB on 2 replicas fill it.
    file(&mut st, "/q/a", 2, 2, MIB).expect("fits");
    assert_eq!(used(&st, "/q").bytes, 4 * MIB);
    let ino = create(&mut st, "/q/b", 1).expect("an empty file costs no bytes");
    let lsn = st.last_lsn;
    let (path, resource) = exceeded(add_chunk(&mut st, "/q/b", ino));
    assert_eq!((path.as_str(), resource), ("/q", QuotaResource::Bytes));
    assert_eq!(st.last_lsn, lsn);
    close(&mut st, "/q/b", ino, 0).expect("close");
    rm(&mut st, "/q/a").expect("rm");

    // A file closed half full charges half a chunk; reopened, the chunk counts
    // whole again, so a reopen that does not fit is refused.
    let ino = file(&mut st, "/q/c", 2, 1, MIB / 2).expect("half a chunk");
    assert_eq!(used(&st, "/q").bytes, MIB);
    // Its replicas are where a reopen finds them.
    let h = st.ns.file(ino).expect("file").chunks[0];
    let version = st.chunks.get(h).expect("chunk").version;
    let replicas: Vec<_> = (1..=2)
        .map(|i| {
            (
                ChunkserverId(i),
                stampfs_proto::ReplicaReport {
                    handle: h,
                    version,
                    length: MIB / 2,
                    state: stampfs_proto::ReplicaState::Finalized,
                },
            )
        })
        .collect();
    st.record_replicas(h, &replicas);
    set_quota(&mut st, "/q", None, Some(MIB + MIB / 2));
    let append = Append {
        path: "/q/c".into(),
        client: A,
        caller: None,
    };
    exceeded(st.append(&append, ino, 0, 1));
    set_quota(&mut st, "/q", None, Some(2 * MIB));
    st.append(&append, ino, 0, 1).expect("fits");
    assert_eq!(used(&st, "/q").bytes, 2 * MIB);
    assert_consistent(&st, "space");
}

#[test]
fn the_nearest_quota_that_would_pass_is_named_and_every_ancestor_counts() {
    let mut st = state();
    mkdir(&mut st, "/q/sub").expect("mkdir");
    set_quota(&mut st, "/q", Some(10), None);
    set_quota(&mut st, "/q/sub", Some(2), None);
    create(&mut st, "/q/sub/a", 1).expect("fits");
    let (path, _) = exceeded(create(&mut st, "/q/sub/b", 1));
    assert_eq!(path, "/q/sub");
    create(&mut st, "/q/b", 1).expect("the outer one has room");
    assert_eq!(used(&st, "/q").names, 4);
    assert_eq!(used(&st, "/q/sub").names, 2);
    // A quota'd directory removed takes its quota with it.
    rm(&mut st, "/q/sub").expect("rm");
    assert_eq!(st.quotas.len(), 1);
    assert_eq!(used(&st, "/q").names, 2);
    assert_eq!(st.list_quotas().len(), 1);
}

#[test]
fn a_removed_quotad_directory_takes_its_quota_with_it_wherever_it_was() {
    // At the top, with nothing quota'd above it; and below a directory without one.
    let mut st = state();
    mkdir(&mut st, "/q").expect("mkdir");
    mkdir(&mut st, "/a/q").expect("mkdir");
    mkdir(&mut st, "/r").expect("mkdir");
    set_quota(&mut st, "/q", Some(5), None);
    set_quota(&mut st, "/a/q", Some(5), None);
    set_quota(&mut st, "/r", Some(5), None);
    rm(&mut st, "/q").expect("rm");
    rm(&mut st, "/a").expect("rm");
    // Replaced by a rename over it (an empty directory).
    mkdir(&mut st, "/s").expect("mkdir");
    rename(&mut st, "/s", "/r", true).expect("rename over");
    assert!(st.quotas.is_empty(), "{:?}", st.quotas);
    let snap = st.encode_snapshot().expect("encode");
    let back = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
    assert!(back.same_persisted(&st));

    // Into the trash it keeps its quota (it still exists); deleted from there, it goes.
    let mut st = MasterState::new(Settings {
        trash_ms: 3_600_000,
        ..Settings::for_tests()
    });
    mkdir(&mut st, "/q").expect("mkdir");
    set_quota(&mut st, "/q", Some(5), None);
    rm(&mut st, "/q").expect("rm into the trash");
    assert_eq!(st.quotas.len(), 1);
    let in_trash = st.list_quotas().pop().expect("listed").path;
    assert!(in_trash.starts_with("/.trash/"), "{in_trash}");
    st.delete_now(
        &stampfs_proto::DeleteNow {
            path: "/.trash".into(),
            recursive: true,
            caller: None,
        },
        0,
        1,
    )
    .expect("empty the trash");
    assert!(st.quotas.is_empty(), "{:?}", st.quotas);
}

#[test]
fn renames_into_a_quota_are_checked_and_renames_within_or_out_are_not() {
    let mut st = state();
    mkdir(&mut st, "/q/in").expect("mkdir");
    mkdir(&mut st, "/out").expect("mkdir");
    set_quota(&mut st, "/q", Some(3), Some(2 * MIB));
    file(&mut st, "/q/f", 1, 1, MIB).expect("file");
    // At its name limit: a move within the tree still fits.
    assert_eq!(used(&st, "/q").names, 3);
    rename(&mut st, "/q/f", "/q/in/f", false).expect("within");
    file(&mut st, "/out/g", 1, 1, 10).expect("outside");
    let (_, resource) = exceeded(rename(&mut st, "/out/g", "/q/g", false));
    assert_eq!(resource, QuotaResource::Names);
    // Over a file it replaces, a move adds no name and frees the replaced bytes.
    rename(&mut st, "/out/g", "/q/in/f", true).expect("over a file");
    assert_eq!(
        used(&st, "/q"),
        Usage {
            names: 3,
            bytes: 10
        }
    );
    // Out of the tree frees it.
    rename(&mut st, "/q/in", "/out/in", false).expect("out");
    assert_eq!(used(&st, "/q"), Usage { names: 1, bytes: 0 });
    // A subtree that passes the space limit is refused whole.
    file(&mut st, "/out/in/big", 3, 1, MIB).expect("big");
    let (_, resource) = exceeded(rename(&mut st, "/out/in", "/q/in", false));
    assert_eq!(resource, QuotaResource::Names);
    set_quota(&mut st, "/q", None, Some(2 * MIB));
    let (_, resource) = exceeded(rename(&mut st, "/out/in", "/q/in", false));
    assert_eq!(resource, QuotaResource::Bytes);
    assert_consistent(&st, "renames");
}

#[test]
fn setrep_up_is_checked_and_down_frees() {
    let mut st = state();
    mkdir(&mut st, "/q").expect("mkdir");
    set_quota(&mut st, "/q", None, Some(3 * MIB));
    file(&mut st, "/q/f", 1, 2, MIB / 2).expect("file");
    assert_eq!(used(&st, "/q").bytes, MIB + MIB / 2);
    let setrep = |st: &mut MasterState, n| {
        st.set_replication(
            &SetReplication {
                path: "/q/f".into(),
                replication: n,
                caller: None,
            },
            0,
        )
    };
    exceeded(setrep(&mut st, 3));
    setrep(&mut st, 2).expect("fits");
    assert_eq!(used(&st, "/q").bytes, 3 * MIB);
    setrep(&mut st, 1).expect("down");
    assert_eq!(used(&st, "/q").bytes, MIB + MIB / 2);
}

#[test]
fn set_quota_refuses_files_zero_limits_and_unknown_paths() {
    let mut st = state();
    file(&mut st, "/f", 1, 0, 0).expect("file");
    mkdir(&mut st, "/d").expect("mkdir");
    let ask = |st: &mut MasterState, path: &str, names| {
        st.set_quota(
            &SetQuota {
                path: path.into(),
                names,
                bytes: QuotaChange::Keep,
            },
            0,
        )
    };
    assert!(matches!(
        ask(&mut st, "/f", QuotaChange::Set(3)),
        Err(Error::NotADirectory { .. })
    ));
    assert!(matches!(
        ask(&mut st, "/d", QuotaChange::Set(0)),
        Err(Error::BadRequest { .. })
    ));
    assert!(matches!(
        ask(&mut st, "/nope", QuotaChange::Set(3)),
        Err(Error::NotFound { .. })
    ));
    // Keep leaves the other limit; clearing both removes the quota.
    set_quota(&mut st, "/d", Some(5), Some(MIB));
    let r = ask(&mut st, "/d", QuotaChange::Keep).expect("keep");
    assert_eq!(r.names.map(|q| q.limit), Some(5));
    assert_eq!(r.bytes.map(|q| q.limit), Some(MIB));
    let lsn = st.last_lsn;
    ask(&mut st, "/d", QuotaChange::Set(5)).expect("the same");
    assert_eq!(st.last_lsn, lsn, "an unchanged quota logs nothing");
    set_quota(&mut st, "/d", None, None);
    assert!(st.quotas.is_empty());
}

#[test]
fn quotas_survive_checkpoints_and_format_9_loads_without_any() {
    let mut st = state();
    mkdir(&mut st, "/q/a").expect("mkdir");
    file(&mut st, "/q/a/f", 2, 1, 100).expect("file");
    set_quota(&mut st, "/q", Some(50), Some(10 * MIB));
    let snap = st.encode_snapshot().expect("encode");
    let back = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
    assert!(back.same_persisted(&st));
    assert_eq!(
        used(&back, "/q"),
        Usage {
            names: 3,
            bytes: 200
        }
    );

    let v9 = bincode::encode_to_vec(
        (
            9u32,
            st.last_lsn,
            &st.ns,
            &st.chunks,
            &st.servers,
            st.next_server,
            &st.pipelines,
            &st.open_chunks,
            &st.users,
            st.owners(),
            &st.decommissioning,
        ),
        bincode::config::standard(),
    )
    .expect("encode");
    let back = MasterState::decode_snapshot(Settings::for_tests(), &v9, 0).expect("decode");
    assert_eq!(back.ns, st.ns);
    assert!(back.quotas.is_empty());
}

/// Random namespace changes under random quotas: after each, every kept use equals
/// a walk; replay of the whole log, and a checkpoint taken halfway with the rest of
/// the log replayed on it, end with the same quotas and uses.
#[test]
fn kept_use_always_equals_a_walk_through_random_changes_replay_and_checkpoints() {
    let (mut refused, mut done) = (0, 0);
    for seed in 0..8u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut st = state();
        let mut log = Vec::new();
        let mut half: Option<(Vec<u8>, usize)> = None;
        let dirs = ["/a", "/a/b", "/a/b/c", "/d", "/d/e"];
        for d in dirs {
            mkdir(&mut st, d).expect("mkdir");
        }
        let mut open: Vec<(String, InodeId)> = Vec::new();
        for step in 0..400 {
            let dir = dirs[rng.gen_range(0..dirs.len())];
            let name = format!("{dir}/n{}", rng.gen_range(0..12));
            let what = rng.gen_range(0..11);
            let r: Result<()> = match what {
                0 => {
                    let names = rng.gen_bool(0.7).then(|| rng.gen_range(1..30));
                    let bytes = rng.gen_bool(0.7).then(|| rng.gen_range(1..40) * MIB);
                    st.set_quota(
                        &SetQuota {
                            path: dir.into(),
                            names: names.map_or(QuotaChange::Clear, QuotaChange::Set),
                            bytes: bytes.map_or(QuotaChange::Clear, QuotaChange::Set),
                        },
                        0,
                    )
                    .map(|_| ())
                }
                1 => mkdir(&mut st, &name).map(|_| ()),
                2 | 3 => create(&mut st, &name, rng.gen_range(1..=3)).map(|ino| {
                    open.push((name.clone(), ino));
                }),
                4 | 5 => match open.get(rng.gen_range(0..open.len().max(1))) {
                    Some((p, ino)) => add_chunk(&mut st, &p.clone(), *ino).map(|_| ()),
                    None => Ok(()),
                },
                6 => match open.pop() {
                    Some((p, ino)) => close(&mut st, &p, ino, rng.gen_range(0..=MIB)),
                    None => Ok(()),
                },
                7 if rng.gen_bool(0.1) => {
                    // A quota'd directory (perhaps) removed, then made again empty.
                    let d = dirs[rng.gen_range(1..dirs.len())];
                    let r = rm(&mut st, d);
                    mkdir(&mut st, d).map(|_| ()).and(r)
                }
                7 => rm(&mut st, &name),
                8 => {
                    let to = dirs[rng.gen_range(0..dirs.len())];
                    let dst = format!("{to}/n{}", rng.gen_range(0..12));
                    rename(&mut st, &name, &dst, rng.gen_bool(0.5))
                }
                9 => st
                    .set_replication(
                        &SetReplication {
                            path: name.clone(),
                            replication: rng.gen_range(1..=3),
                            caller: None,
                        },
                        0,
                    )
                    .map(|_| ()),
                _ => match st.resolve_path(&name) {
                    Ok(ino) if st.ns.file(ino).is_some_and(|f| f.writer().is_none()) => st
                        .append(
                            &Append {
                                path: name.clone(),
                                client: A,
                                caller: None,
                            },
                            ino,
                            0,
                            1,
                        )
                        .map(|_| open.push((name.clone(), ino))),
                    _ => Ok(()),
                },
            };
            refused += usize::from(matches!(r, Err(Error::QuotaExceeded { .. })));
            done += usize::from(r.is_ok());
            open.retain(|(_, ino)| st.ns.file(*ino).is_some_and(|f| f.writer() == Some(A)));
            log.extend(st.take_outbox());
            assert_consistent(&st, &format!("seed {seed} step {step} (op {what})"));
            assert!(
                st.quotas.keys().all(|ino| st.ns.get(*ino).is_some()),
                "seed {seed} step {step}: a quota of a removed directory"
            );
            if step == 200 {
                half = Some((st.encode_snapshot().expect("snapshot"), log.len()));
            }
        }
        let mut back = MasterState::new(Settings::for_tests());
        replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
        assert!(back.same_persisted(&st), "seed {seed}: replay");
        let (snap, at) = half.expect("halfway");
        let mut from =
            MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
        replay_records(
            &mut from,
            log[at..].iter().map(|(l, b)| (*l, b.as_slice())),
            0,
        )
        .expect("rest");
        assert!(from.same_persisted(&st), "seed {seed}: checkpoint and log");
    }
    // The changes both fit and passed quotas, many times over.
    assert!(
        refused > 100 && done > 1000,
        "{refused} refused, {done} done"
    );
}
