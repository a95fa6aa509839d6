//! Permissions of the namespace requests for the caller's identity (issue 17 item 3):
//! search along a path, write and search on the directory an entry is added to or
//! removed from, sticky directories, rename rules, `chmod`/`chown`/`utimensat`
//! rules, reads and appends, entries created for their creator only, set-gid
//! directories. Pure: no sockets.

use super::*;
use stampfs_proto::{
    Append, Caller, Create, Delete, Mkdir, NewAttr, Rename, SetAttr, SetTime, Symlink,
};

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const STAFF: u32 = 50;

fn alice() -> Option<Caller> {
    Some(Caller {
        uid: ALICE,
        gid: ALICE,
        groups: vec![STAFF],
    })
}

fn bob() -> Option<Caller> {
    Some(Caller {
        uid: BOB,
        gid: BOB,
        groups: vec![],
    })
}

fn own(who: &Option<Caller>, mode: u32) -> Option<NewAttr> {
    who.as_ref().map(|c| NewAttr {
        mode,
        uid: c.uid,
        gid: c.gid,
    })
}

fn mkdir(st: &mut MasterState, path: &str, who: Option<Caller>, mode: u32) -> Result<FileStatus> {
    st.mkdir(
        &Mkdir {
            path: path.into(),
            parents: false,
            attr: own(&who, mode).or(Some(NewAttr {
                mode,
                uid: 0,
                gid: 0,
            })),
            caller: who,
        },
        0,
        1,
    )
}

fn create(st: &mut MasterState, path: &str, who: Option<Caller>) -> Result<FileStatus> {
    let attr = own(&who, 0o644);
    st.make_file(
        &stampfs_proto::MakeFile {
            path: path.into(),
            client: ClientId(1),
            replication: None,
            chunk_size: None,
            attr,
            caller: who,
        },
        0,
        2,
    )
}

fn delete(st: &mut MasterState, path: &str, who: Option<Caller>) -> Result<()> {
    st.delete(
        &Delete {
            path: path.into(),
            recursive: true,
            caller: who,
        },
        0,
        3,
    )
}

fn rename(st: &mut MasterState, src: &str, dst: &str, who: Option<Caller>) -> Result<()> {
    st.rename(
        &Rename {
            src: src.into(),
            dst: dst.into(),
            caller: who,
            replace: false,
        },
        0,
        4,
    )
}

fn set(path: &str, who: Option<Caller>) -> SetAttr {
    SetAttr {
        caller: who,
        ..SetAttr::new(path)
    }
}

fn denied(r: Result<impl std::fmt::Debug>) -> bool {
    matches!(r, Err(Error::PermissionDenied { .. }))
}

fn not_permitted(r: Result<impl std::fmt::Debug>) -> bool {
    matches!(r, Err(Error::NotPermitted { .. }))
}

/// `/` 0755 root, `/home/alice` 0750 alice:staff, `/tmp` 1777 root.
fn tree() -> MasterState {
    let mut st = MasterState::new(Settings::for_tests());
    mkdir(&mut st, "/home", None, 0o755).expect("home");
    mkdir(&mut st, "/tmp", None, 0o1777).expect("tmp");
    mkdir(&mut st, "/home/alice", None, 0o750).expect("alice's home");
    st.set_attr(
        &SetAttr {
            uid: Some(ALICE),
            gid: Some(STAFF),
            ..set("/home/alice", None)
        },
        0,
        1,
    )
    .expect("chown");
    st
}

#[test]
fn adding_and_removing_entries_needs_write_and_search_on_the_directory() {
    let mut st = tree();
    // Only root writes in a root directory of mode 0755.
    assert!(denied(create(&mut st, "/f", alice())));
    assert!(denied(mkdir(&mut st, "/home/bob", bob(), 0o755)));
    assert!(create(&mut st, "/f", None).is_ok());
    assert!(denied(delete(&mut st, "/f", alice())));
    // Alice writes in her home; Bob cannot even look inside (no search permission).
    assert!(create(&mut st, "/home/alice/notes", alice()).is_ok());
    assert!(denied(st.check_access(
        "/home/alice/notes",
        bob().as_ref(),
        0
    )));
    assert!(denied(create(&mut st, "/home/alice/x", bob())));
    assert!(denied(delete(&mut st, "/home/alice/notes", bob())));
    let e = st
        .symlink(
            &Symlink {
                path: "/home/alice/l".into(),
                target: "notes".into(),
                attr: None,
                caller: bob(),
            },
            0,
            5,
        )
        .expect_err("bob's link in alice's home");
    assert!(matches!(e, Error::PermissionDenied { .. }), "{e:?}");
    // Search permission alone lets a member of the group stat, not list.
    let carol = Some(Caller {
        uid: 1002,
        gid: 1002,
        groups: vec![STAFF],
    });
    st.set_attr(
        &SetAttr {
            mode: Some(0o710),
            ..set("/home/alice", None)
        },
        0,
        6,
    )
    .expect("chmod");
    assert!(st
        .check_access("/home/alice/notes", carol.as_ref(), 0)
        .is_ok());
    assert!(denied(st.check_access(
        "/home/alice",
        carol.as_ref(),
        crate::perm::READ
    )));
    // A non-empty tree goes only when every directory in it may be emptied.
    mkdir(&mut st, "/tmp/t", alice(), 0o755).expect("t");
    mkdir(&mut st, "/tmp/t/sub", alice(), 0o755).expect("sub");
    create(&mut st, "/tmp/t/sub/f", alice()).expect("f");
    st.set_attr(
        &SetAttr {
            mode: Some(0o555),
            ..set("/tmp/t/sub", alice())
        },
        0,
        7,
    )
    .expect("read-only sub");
    assert!(denied(delete(&mut st, "/tmp/t", alice())));
    assert!(st.stat("/tmp/t/sub/f").is_ok(), "nothing removed");
}

#[test]
fn a_sticky_directory_keeps_each_users_entries_their_own() {
    let mut st = tree();
    create(&mut st, "/tmp/a", alice()).expect("alice's file");
    create(&mut st, "/tmp/b", bob()).expect("bob's file");
    assert!(not_permitted(delete(&mut st, "/tmp/a", bob())));
    assert!(not_permitted(rename(&mut st, "/tmp/a", "/tmp/mine", bob())));
    assert!(delete(&mut st, "/tmp/b", bob()).is_ok());
    assert!(rename(&mut st, "/tmp/a", "/tmp/a2", alice()).is_ok());
    assert!(delete(&mut st, "/tmp/a2", None).is_ok(), "root may");
}

#[test]
fn rename_needs_both_directories_and_a_moved_directory_itself() {
    let mut st = tree();
    mkdir(&mut st, "/tmp/d", alice(), 0o755).expect("d");
    mkdir(&mut st, "/tmp/d/inner", alice(), 0o755).expect("inner");
    // Into a directory Bob may not write.
    create(&mut st, "/tmp/bf", bob()).expect("bob's file");
    assert!(denied(rename(&mut st, "/tmp/bf", "/tmp/d/bf", bob())));
    // A directory moving to another parent needs write permission on itself (its
    // ".." changes), even for its parent's owner.
    st.set_attr(
        &SetAttr {
            mode: Some(0o555),
            ..set("/tmp/d/inner", alice())
        },
        0,
        8,
    )
    .expect("chmod");
    assert!(denied(rename(
        &mut st,
        "/tmp/d/inner",
        "/tmp/inner",
        alice()
    )));
    assert!(rename(&mut st, "/tmp/d/inner", "/tmp/d/renamed", alice()).is_ok());
}

#[test]
fn mode_owner_and_times_follow_the_posix_rules() {
    let mut st = tree();
    create(&mut st, "/tmp/a", alice()).expect("alice's file");
    // chmod: the owner or root.
    assert!(not_permitted(st.set_attr(
        &SetAttr {
            mode: Some(0o777),
            ..set("/tmp/a", bob())
        },
        0,
        9
    )));
    let s = st
        .set_attr(
            &SetAttr {
                mode: Some(0o2666),
                ..set("/tmp/a", alice())
            },
            0,
            9,
        )
        .expect("chmod");
    assert_eq!(s.attr.mode, 0o2666, "alice is in her own group");
    // chown: only root gives a file away; the owner changes its group to one of hers.
    assert!(not_permitted(st.set_attr(
        &SetAttr {
            uid: Some(BOB),
            ..set("/tmp/a", alice())
        },
        0,
        10
    )));
    assert!(not_permitted(st.set_attr(
        &SetAttr {
            gid: Some(BOB),
            ..set("/tmp/a", alice())
        },
        0,
        10
    )));
    let s = st
        .set_attr(
            &SetAttr {
                gid: Some(STAFF),
                ..set("/tmp/a", alice())
            },
            0,
            10,
        )
        .expect("chgrp to staff");
    assert_eq!((s.attr.gid, s.attr.mode), (STAFF, 0o2666));
    // utimensat: explicit times by the owner; "now" also by a writer (0666 here).
    assert!(not_permitted(st.set_attr(
        &SetAttr {
            mtime: Some(SetTime::At(5)),
            ..set("/tmp/a", bob())
        },
        0,
        11
    )));
    assert!(st
        .set_attr(
            &SetAttr {
                atime: Some(SetTime::Now),
                mtime: Some(SetTime::Now),
                ..set("/tmp/a", bob())
            },
            0,
            11
        )
        .is_ok());
    st.set_attr(
        &SetAttr {
            mode: Some(0o644),
            ..set("/tmp/a", alice())
        },
        0,
        12,
    )
    .expect("chmod");
    assert!(denied(st.set_attr(
        &SetAttr {
            mtime: Some(SetTime::Now),
            ..set("/tmp/a", bob())
        },
        0,
        12
    )));
}

#[test]
fn reading_and_writing_need_their_bits_and_entries_belong_to_their_creator() {
    let mut st = tree();
    create(&mut st, "/tmp/a", alice()).expect("alice's file");
    st.set_attr(
        &SetAttr {
            mode: Some(0o600),
            ..set("/tmp/a", alice())
        },
        0,
        13,
    )
    .expect("chmod");
    assert!(st
        .check_access("/tmp/a", alice().as_ref(), crate::perm::READ)
        .is_ok());
    assert!(denied(st.check_access(
        "/tmp/a",
        bob().as_ref(),
        crate::perm::READ
    )));
    let ino = st.resolve_path("/tmp/a").expect("a");
    let append = |who| Append {
        path: "/tmp/a".into(),
        client: ClientId(2),
        caller: who,
    };
    assert!(denied(st.append(&append(bob()), ino, 0, 14)));
    assert!(st.append(&append(alice()), ino, 0, 14).is_ok());
    // Replacing a file needs write permission on it too.
    let e = st
        .create(
            &Create {
                path: "/tmp/a".into(),
                client: ClientId(3),
                replication: None,
                chunk_size: None,
                overwrite: true,
                attr: own(&bob(), 0o644),
                caller: bob(),
            },
            0,
            15,
        )
        .expect_err("bob replaces alice's file");
    assert!(
        matches!(
            e,
            Error::PermissionDenied { .. } | Error::LeaseConflict { .. }
        ),
        "{e:?}"
    );
    // Nobody but root creates entries for someone else; without a mode and owner a
    // caller's entry is its own.
    let e = st
        .make_file(
            &stampfs_proto::MakeFile {
                path: "/tmp/forged".into(),
                client: ClientId(4),
                replication: None,
                chunk_size: None,
                attr: own(&alice(), 0o4755),
                caller: bob(),
            },
            0,
            16,
        )
        .expect_err("bob creates alice's set-uid file");
    assert!(matches!(e, Error::NotPermitted { .. }), "{e:?}");
    let s = st
        .make_file(
            &stampfs_proto::MakeFile {
                path: "/tmp/plain".into(),
                client: ClientId(4),
                replication: None,
                chunk_size: None,
                attr: None,
                caller: bob(),
            },
            0,
            16,
        )
        .expect("bob's own");
    assert_eq!((s.attr.uid, s.attr.gid, s.attr.mode), (BOB, BOB, 0o644));
}

#[test]
fn a_set_gid_directory_hands_its_group_down() {
    let mut st = tree();
    mkdir(&mut st, "/tmp/shared", alice(), 0o2775).expect("shared");
    st.set_attr(
        &SetAttr {
            gid: Some(STAFF),
            ..set("/tmp/shared", alice())
        },
        0,
        17,
    )
    .expect("chgrp");
    let carol = Some(Caller {
        uid: 1002,
        gid: 1002,
        groups: vec![STAFF],
    });
    let f = create(&mut st, "/tmp/shared/f", carol.clone()).expect("f");
    assert_eq!((f.attr.uid, f.attr.gid, f.attr.mode), (1002, STAFF, 0o644));
    // A set-gid file of a group its creator is not in drops the bit.
    st.set_attr(
        &SetAttr {
            mode: Some(0o2777),
            ..set("/tmp/shared", alice())
        },
        0,
        24,
    )
    .expect("open to all");
    let sg = st
        .make_file(
            &stampfs_proto::MakeFile {
                path: "/tmp/shared/sg".into(),
                client: ClientId(7),
                replication: None,
                chunk_size: None,
                attr: own(&bob(), 0o2755),
                caller: bob(),
            },
            0,
            24,
        )
        .expect("bob's set-gid file");
    assert_eq!((sg.attr.gid, sg.attr.mode), (STAFF, 0o755));
    let d = mkdir(&mut st, "/tmp/shared/d", carol, 0o755).expect("d");
    assert_eq!((d.attr.gid, d.attr.mode), (STAFF, 0o2755));
}

#[test]
fn each_users_trash_is_their_own() {
    let mut settings = Settings::for_tests();
    settings.trash_ms = 3_600_000;
    let mut st = MasterState::new(settings);
    mkdir(&mut st, "/tmp", None, 0o1777).expect("tmp");
    create(&mut st, "/tmp/a", alice()).expect("alice's file");
    delete(&mut st, "/tmp/a", alice()).expect("alice's rm");
    let trash = st.stat("/.trash").expect("trash");
    assert_eq!((trash.attr.mode, trash.attr.uid), (0o711, 0));
    let entries = st.list("/.trash").expect("root lists");
    assert_eq!(entries.len(), 1);
    let mine = entries[0].path.clone();
    assert_eq!(
        mine,
        format!("/.trash/uid-{ALICE}"),
        "no user has her uid here"
    );
    let d = st.stat(&mine).expect("her trash");
    assert_eq!((d.attr.mode, d.attr.uid, d.attr.gid), (0o700, ALICE, ALICE));
    let kept = format!("{mine}/Current/tmp/a");
    assert!(st
        .check_access(&kept, alice().as_ref(), crate::perm::READ)
        .is_ok());
    assert!(st
        .check_access(&mine, alice().as_ref(), crate::perm::READ)
        .is_ok());
    // Nobody else lists the trash or enters her part of it.
    assert!(denied(st.check_access(
        "/.trash",
        bob().as_ref(),
        crate::perm::READ
    )));
    assert!(denied(st.check_access(&kept, bob().as_ref(), 0)));
    // A trash from before (0755 or 0700) gets its mode at the next rm.
    st.set_attr(
        &SetAttr {
            mode: Some(0o755),
            ..set("/.trash", None)
        },
        0,
        20,
    )
    .expect("open it up");
    create(&mut st, "/tmp/b", bob()).expect("bob's file");
    delete(&mut st, "/tmp/b", bob()).expect("bob's rm");
    assert_eq!(st.stat("/.trash").expect("trash").attr.mode, 0o711);
}

#[test]
fn a_group_writer_may_truncate_by_replacing_keeping_the_owner() {
    let mut st = tree();
    mkdir(&mut st, "/tmp/team", alice(), 0o755).expect("alice's dir");
    let f = create(&mut st, "/tmp/team/f", alice()).expect("alice's file");
    st.set_attr(
        &SetAttr {
            mode: Some(0o6664),
            gid: Some(STAFF),
            ..set("/tmp/team/f", alice())
        },
        0,
        21,
    )
    .expect("group-writable");
    let carol = Some(Caller {
        uid: 1002,
        gid: 1002,
        groups: vec![STAFF],
    });
    // Carol may not write the directory, but may truncate the file she may write.
    let s = st
        .create(
            &Create {
                path: "/tmp/team/f".into(),
                client: ClientId(5),
                replication: None,
                chunk_size: None,
                overwrite: true,
                attr: Some(NewAttr {
                    mode: 0o777,
                    uid: ALICE,
                    gid: STAFF,
                }),
                caller: carol.clone(),
            },
            0,
            22,
        )
        .expect("truncate");
    assert_ne!(s.inode, f.inode);
    assert_eq!(
        (s.attr.uid, s.attr.gid, s.attr.mode),
        (ALICE, STAFF, 0o664),
        "the owner and mode kept, set-uid and set-gid dropped"
    );
    // Giving it to herself is an unlink and a create: the directory says no.
    let e = st
        .create(
            &Create {
                path: "/tmp/team/f".into(),
                client: ClientId(6),
                replication: None,
                chunk_size: None,
                overwrite: true,
                attr: own(&carol, 0o644),
                caller: carol,
            },
            0,
            23,
        )
        .expect_err("replace as her own");
    assert!(
        matches!(
            e,
            Error::PermissionDenied { .. } | Error::LeaseConflict { .. }
        ),
        "{e:?}"
    );
}
