//! Attributes in the namespace (`Record::WithAttr`, `Record::SetAttr`): the creator's
//! mode and owner, `chmod`/`chown`/`utimensat`, the change time, a close that keeps
//! the modification time, the `relatime` rule of reads, and replay and checkpoints
//! keeping all of it. Pure: no sockets.

use super::*;
use stampfs_proto::{Close, Create, Mkdir, NewAttr, SetAttr, SetTime, Symlink};

const A: ClientId = ClientId(0xa);
const OWNER: NewAttr = NewAttr {
    mode: 0o640,
    uid: 1000,
    gid: 100,
};
const MS: i64 = 1_000_000;

fn set(path: &str) -> SetAttr {
    SetAttr::new(path)
}

fn create(st: &mut MasterState, path: &str, attr: Option<NewAttr>, at_ms: u64) -> FileStatus {
    st.create(
        &Create {
            path: path.into(),
            client: A,
            replication: None,
            chunk_size: None,
            overwrite: false,
            attr,
            caller: None,
        },
        0,
        at_ms,
    )
    .expect("create")
}

fn close(st: &mut MasterState, path: &str, ino: InodeId, keep_mtime: bool, at_ms: u64) {
    st.close(
        &Close {
            path: path.into(),
            client: A,
            last: None,
            keep_mtime,
        },
        ino,
        0,
        at_ms,
    )
    .expect("close");
}

fn replay_all(st: &mut MasterState) -> MasterState {
    let log = st.take_outbox();
    let mut back = MasterState::new(Settings::for_tests());
    replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
    assert!(back.same_persisted(st), "replay rebuilds the same state");
    let snap = st.encode_snapshot().expect("snapshot");
    let from_ckpt = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
    assert!(
        from_ckpt.same_persisted(st),
        "a checkpoint keeps the same state"
    );
    back
}

#[test]
fn entries_take_their_creators_mode_and_owner() {
    let mut st = MasterState::new(Settings::for_tests());
    let f = create(&mut st, "/f", Some(OWNER), 5);
    assert_eq!((f.attr.mode, f.attr.uid, f.attr.gid), (0o640, 1000, 100));
    assert_eq!(
        (f.attr.atime_ns, f.attr.mtime_ns, f.attr.ctime_ns),
        (5 * MS, 5 * MS, 5 * MS)
    );
    // Without a creator: uid 0, gid 0 and the default mode of the kind.
    let g = create(&mut st, "/g", None, 5);
    assert_eq!((g.attr.mode, g.attr.uid, g.attr.gid), (0o644, 0, 0));
    // mkdir -p: every directory of the chain.
    let dir = NewAttr {
        mode: 0o750,
        ..OWNER
    };
    st.mkdir(
        &Mkdir {
            path: "/a/b/c".into(),
            parents: true,
            attr: Some(dir),
            caller: None,
        },
        0,
        6,
    )
    .expect("mkdir");
    for p in ["/a", "/a/b", "/a/b/c"] {
        let s = st.stat(p).expect("stat");
        assert_eq!(
            (s.attr.mode, s.attr.uid, s.attr.gid),
            (0o750, 1000, 100),
            "{p}"
        );
    }
    // A link takes the owner; its mode stays 0777.
    let l = st
        .symlink(
            &Symlink {
                path: "/l".into(),
                target: "f".into(),
                attr: Some(OWNER),
                caller: None,
            },
            0,
            7,
        )
        .expect("symlink");
    assert_eq!((l.attr.mode, l.attr.uid, l.attr.gid), (0o777, 1000, 100));
    // The parent's times moved with each entry.
    let root = st.stat("/").expect("root");
    assert_eq!((root.attr.mtime_ns, root.attr.ctime_ns), (7 * MS, 7 * MS));
    // A mode with bits past 0o7777 (a file type) is refused, changing nothing.
    let bad = NewAttr {
        mode: 0o100644,
        ..OWNER
    };
    let e = st
        .create(
            &Create {
                path: "/h".into(),
                client: A,
                replication: None,
                chunk_size: None,
                overwrite: false,
                attr: Some(bad),
                caller: None,
            },
            0,
            8,
        )
        .expect_err("a file type in the mode");
    assert!(matches!(e, Error::BadRequest { .. }), "{e:?}");
    assert!(st.stat("/h").is_err());
    let back = replay_all(&mut st);
    assert_eq!(
        back.stat("/a/b").expect("stat").attr,
        st.stat("/a/b").expect("stat").attr
    );
}

#[test]
fn chmod_chown_and_utimens_persist_and_move_the_change_time() {
    let mut st = MasterState::new(Settings::for_tests());
    let f = create(&mut st, "/f", Some(OWNER), 5);
    close(&mut st, "/f", f.inode, false, 6);
    let s = st
        .set_attr(
            &SetAttr {
                mode: Some(0o4755),
                ..set("/f")
            },
            0,
            10,
        )
        .expect("chmod");
    assert_eq!(s.attr.mode, 0o4755);
    assert_eq!(s.attr.ctime_ns, 10 * MS);
    assert_eq!(
        s.attr.mtime_ns,
        6 * MS,
        "chmod leaves the modification time"
    );
    let s = st
        .set_attr(
            &SetAttr {
                uid: Some(0),
                gid: Some(7),
                ..set("/f")
            },
            0,
            11,
        )
        .expect("chown");
    // A new owner or group drops a file's set-uid bit (as Linux does, for root too).
    assert_eq!((s.attr.uid, s.attr.gid, s.attr.mode), (0, 7, 0o755));
    // Times are set exactly, before the epoch too; "now" is the master's clock.
    let s = st
        .set_attr(
            &SetAttr {
                atime: Some(SetTime::At(-1_500_000_001)),
                mtime: Some(SetTime::At(946_684_800_123_456_789)),
                ..set("/f")
            },
            0,
            12,
        )
        .expect("utimens");
    assert_eq!(s.attr.atime_ns, -1_500_000_001);
    assert_eq!(s.attr.mtime_ns, 946_684_800_123_456_789);
    assert_eq!(s.attr.ctime_ns, 12 * MS);
    let s = st
        .set_attr(
            &SetAttr {
                mtime: Some(SetTime::Now),
                ..set("/f")
            },
            0,
            13,
        )
        .expect("touch");
    assert_eq!((s.attr.mtime_ns, s.attr.ctime_ns), (13 * MS, 13 * MS));
    // Setting nothing logs nothing.
    let before = st.last_lsn;
    st.set_attr(&set("/f"), 0, 14).expect("nothing");
    assert_eq!(st.last_lsn, before);
    // Refused: a file type in the mode, a link's mode, a missing path.
    let e = st
        .set_attr(
            &SetAttr {
                mode: Some(0o40755),
                ..set("/f")
            },
            0,
            15,
        )
        .expect_err("type bits");
    assert!(matches!(e, Error::BadRequest { .. }), "{e:?}");
    st.symlink(
        &Symlink {
            path: "/l".into(),
            target: "f".into(),
            attr: None,
            caller: None,
        },
        0,
        15,
    )
    .expect("symlink");
    let e = st
        .set_attr(
            &SetAttr {
                mode: Some(0o700),
                ..set("/l")
            },
            0,
            16,
        )
        .expect_err("a link's mode");
    assert!(matches!(e, Error::NotSupported { .. }), "{e:?}");
    // A link's owner and times are its own (never the target's).
    let l = st
        .set_attr(
            &SetAttr {
                uid: Some(5),
                mtime: Some(SetTime::At(3)),
                ..set("/l")
            },
            0,
            16,
        )
        .expect("lchown");
    assert_eq!((l.attr.uid, l.attr.mtime_ns), (5, 3));
    assert_eq!(st.stat("/f").expect("f").attr.uid, 0);
    assert!(matches!(
        st.set_attr(&set("/nope"), 0, 17),
        Err(Error::NotFound { .. })
    ));
    let back = replay_all(&mut st);
    assert_eq!(
        back.stat("/f").expect("f").attr,
        st.stat("/f").expect("f").attr
    );
}

#[test]
fn a_close_after_the_times_were_set_keeps_the_modification_time() {
    let mut st = MasterState::new(Settings::for_tests());
    let f = create(&mut st, "/f", None, 5);
    // `cp -p`: the times are set on the open file, then it is closed.
    st.set_attr(
        &SetAttr {
            mtime: Some(SetTime::At(2 * MS)),
            ..set("/f")
        },
        0,
        6,
    )
    .expect("futimens");
    close(&mut st, "/f", f.inode, true, 9);
    let s = st.stat("/f").expect("stat");
    assert_eq!(s.attr.mtime_ns, 2 * MS, "kept as set");
    assert_eq!(s.attr.ctime_ns, 6 * MS);
    // A writer that wrote moves it.
    let g = create(&mut st, "/g", None, 5);
    close(&mut st, "/g", g.inode, false, 9);
    assert_eq!(st.stat("/g").expect("stat").attr.mtime_ns, 9 * MS);
    replay_all(&mut st);
}

#[test]
fn reads_move_the_access_time_by_the_relatime_rules() {
    const DAY_MS: u64 = 24 * 3600 * 1000;
    let mut st = MasterState::new(Settings::for_tests());
    let f = create(&mut st, "/f", None, 5);
    close(&mut st, "/f", f.inode, false, 6);
    // Not after the modification time: the first read moves it.
    let rec = st.access(f.inode, 10).expect("atime <= mtime");
    st.commit(rec, 0).expect("commit");
    let s = st.stat("/f").expect("stat");
    assert_eq!(s.attr.atime_ns, 10 * MS);
    assert_eq!(s.attr.ctime_ns, 6 * MS, "an access is not a change");
    // Later reads within a day do not log anything.
    assert!(st.access(f.inode, 20).is_none());
    assert!(st.access(f.inode, 10 + DAY_MS - 1).is_none());
    // A day later they do.
    assert!(st.access(f.inode, 10 + DAY_MS).is_some());
    // So does a read after a change.
    st.set_attr(
        &SetAttr {
            mode: Some(0o600),
            ..set("/f")
        },
        0,
        30,
    )
    .expect("chmod");
    assert!(st.access(f.inode, 31).is_some());
    // A clock behind the access time never moves it back.
    assert!(st.access(f.inode, 1).is_none());
    replay_all(&mut st);
}

#[test]
fn malformed_attribute_records_are_refused_by_apply() {
    let mut st = MasterState::new(Settings::for_tests());
    let around_close = Record::WithAttr {
        record: Box::new(Record::Close {
            inode: InodeId(1),
            last: None,
            mtime_ms: 1,
        }),
        attr: OWNER,
    };
    assert!(st.apply(1, &around_close, 0).is_err());
    let bad_mode = Record::SetAttr {
        inode: namespace::ROOT,
        mode: Some(0o170000),
        uid: None,
        gid: None,
        atime_ns: None,
        mtime_ns: None,
        ctime_ns: None,
    };
    assert!(st.apply(1, &bad_mode, 0).is_err());
    let unknown = Record::SetAttr {
        inode: InodeId(99),
        mode: None,
        uid: Some(1),
        gid: None,
        atime_ns: None,
        mtime_ns: None,
        ctime_ns: None,
    };
    assert!(st.apply(1, &unknown, 0).is_err());
    assert_eq!(st.last_lsn, 0);
}

#[test]
fn a_write_sets_the_modification_time_back_from_the_future() {
    let mut st = MasterState::new(Settings::for_tests());
    let f = create(&mut st, "/f", None, 5);
    st.set_attr(
        &SetAttr {
            mtime: Some(SetTime::At(4_000_000_000 * 1_000_000_000)),
            ..set("/f")
        },
        0,
        6,
    )
    .expect("touch -d 2096");
    close(&mut st, "/f", f.inode, false, 9);
    let s = st.stat("/f").expect("stat");
    assert_eq!(
        (s.attr.mtime_ns, s.attr.ctime_ns),
        (9 * MS, 9 * MS),
        "as make expects"
    );
}
