//! The trash (`trash.rs`): `rm` keeps original paths under the user's `Current`,
//! the worker checkpoints and purges, entries leave only by a restore. Pure: no
//! sockets, no sleeps.

use super::tests::{beat, file, id, servers, set, settings, NOW};
use super::*;
use crate::error::Error;
use crate::state::replay_records;
use rand::rngs::StdRng;
use rand::SeedableRng;
use stampfs_proto::{ChunkCommand, Delete, DeleteNow, Mkdir, Rename, RestoreTrash};
use ReplicaState::Finalized as F;

const KEEP: u64 = 60_000;
const T0: u64 = 1_700_000_000_000;

fn trashing() -> MasterState {
    let mut s = settings();
    s.trash_ms = KEEP;
    servers(s, &[10, 10, 10])
}

fn rm(st: &mut MasterState, path: &str, at: u64) -> crate::error::Result<()> {
    st.delete(
        &Delete {
            path: path.into(),
            recursive: true,
            caller: None,
        },
        0,
        at,
    )
}

fn mkdir(st: &mut MasterState, path: &str) {
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
    .expect("mkdir");
}

fn trash_actions(st: &MasterState, wall: u64) -> Vec<Action> {
    plan(st, NOW, wall, &mut StdRng::seed_from_u64(1))
        .into_iter()
        .filter(|a| {
            matches!(
                a,
                Action::PurgeTrash { .. } | Action::CheckpointTrash { .. }
            )
        })
        .collect()
}

#[test]
fn rm_keeps_the_original_path_and_the_worker_checkpoints_then_purges() {
    let mut st = trashing();
    mkdir(&mut st, "/a/b");
    let (ino, hs) = file(&mut st, "/a/b/f", 1, true);
    set(&mut st, hs[0], &[(1, 1, F)]);
    rm(&mut st, "/a/b/f", T0).expect("rm");
    // No user has uid 0 in this state: its trash is `uid-0`.
    let kept = "/.trash/uid-0/Current/a/b/f";
    assert_eq!(st.resolve_path(kept).expect("kept"), ino);
    assert!(st.resolve_path("/a/b").is_ok(), "its directory stays");
    let names: Vec<String> = st
        .list("/")
        .expect("ls")
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(names, vec!["/a"], "the trash is hidden from /");
    assert!(
        st.chunks.get(hs[0]).is_some(),
        "chunks live on in the trash"
    );

    // The same path removed again: a second name, with the time.
    file(&mut st, "/a/b/f", 0, true);
    rm(&mut st, "/a/b/f", T0 + 5).expect("rm again");
    assert!(st
        .resolve_path(&format!("/.trash/uid-0/Current/a/b/f.{}", T0 + 5))
        .is_ok());

    // The worker checkpoints Current (no checkpoint yet) ...
    beat(&mut st, &[1, 2, 3], NOW);
    let a = trash_actions(&st, T0 + 10);
    assert_eq!(
        a,
        vec![Action::CheckpointTrash {
            user: "uid-0".into()
        }]
    );
    let ckpt = st
        .checkpoint_trash("uid-0", NOW, T0 + 10)
        .expect("checkpoint")
        .expect("taken");
    assert_eq!(ckpt, (T0 + 10).to_string());
    assert!(st
        .resolve_path(&format!("/.trash/uid-0/{ckpt}/a/b/f"))
        .is_ok());
    // ... and purges it once --trash-for has passed since.
    assert!(trash_actions(&st, T0 + 10 + KEEP - 1).is_empty());
    let due = trash_actions(&st, T0 + 10 + KEEP);
    let purge = Action::PurgeTrash {
        name: format!("uid-0/{ckpt}"),
    };
    assert_eq!(due, vec![purge]);
    assert!(st
        .purge_trash(&format!("uid-0/{ckpt}"), NOW, T0 + 10 + KEEP)
        .expect("purge"));
    assert!(!st
        .purge_trash(&format!("uid-0/{ckpt}"), NOW, T0 + 10 + KEEP)
        .expect("again"));
    assert!(st.chunks.get(hs[0]).is_none());
    assert_eq!(
        st.health.take_commands(id(1), 10),
        vec![ChunkCommand::Delete {
            handle: hs[0],
            max_version: ChunkVersion(1)
        }]
    );

    // A new Current waits half of --trash-for after the newest checkpoint.
    file(&mut st, "/g", 0, true);
    rm(&mut st, "/g", T0 + 20).expect("rm g");
    st.checkpoint_trash("uid-0", NOW, T0 + 20)
        .expect("checkpoint");
    file(&mut st, "/h", 0, true);
    rm(&mut st, "/h", T0 + 30).expect("rm h");
    assert!(trash_actions(&st, T0 + 20 + KEEP / 2 - 1).is_empty());
    assert!(
        trash_actions(&st, T0 + 20 + KEEP / 2).contains(&Action::CheckpointTrash {
            user: "uid-0".into()
        })
    );

    // All of it replays to the same state.
    let log = st.take_outbox();
    let mut back = MasterState::new(st.settings);
    replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
    assert!(back.same_persisted(&st));
}

#[test]
fn entries_leave_the_trash_only_by_a_restore() {
    let mut st = trashing();
    mkdir(&mut st, "/d");
    let (ino, _) = file(&mut st, "/d/f", 0, true);
    rm(&mut st, "/d/f", T0).expect("rm");
    let kept = "/.trash/uid-0/Current/d/f";
    let rename = |src: &str, dst: &str| Rename {
        src: src.into(),
        dst: dst.into(),
        replace: false,
        caller: None,
    };
    for (src, dst) in [(kept, "/x"), ("/.trash", "/t"), ("/.trash/uid-0", "/u")] {
        assert!(
            matches!(
                st.rename(&rename(src, dst), 0, 1),
                Err(Error::NotPermitted { .. })
            ),
            "{src} -> {dst}"
        );
    }
    // Within the trash, renames are fine.
    st.rename(&rename(kept, "/.trash/uid-0/Current/d/g"), 0, 1)
        .expect("within");
    let restore = |path: &str, to: &str| RestoreTrash {
        path: path.into(),
        to: to.into(),
        caller: None,
    };
    assert!(matches!(
        st.restore_trash(&restore("/.trash/uid-0", "/y"), 0, 1),
        Err(Error::BadRequest { .. })
    ));
    assert!(matches!(
        st.restore_trash(&restore("/.trash/uid-0/Current/d/g", "/.trash/z"), 0, 1),
        Err(Error::BadRequest { .. })
    ));
    let back = st
        .restore_trash(&restore("/.trash/uid-0/Current/d/g", "/d/f"), 0, 1)
        .expect("restore");
    assert_eq!((back.path.as_str(), back.inode), ("/d/f", ino));
    // Not over something that exists.
    file(&mut st, "/e", 0, true);
    rm(&mut st, "/e", T0 + 1).expect("rm e");
    file(&mut st, "/e", 0, true);
    assert!(matches!(
        st.restore_trash(&restore("/.trash/uid-0/Current/e", "/e"), 0, 1),
        Err(Error::AlreadyExists { .. })
    ));
}

#[test]
fn skip_trash_and_rm_in_the_trash_delete_at_once_and_flat_entries_still_expire() {
    let mut st = trashing();
    file(&mut st, "/f", 0, true);
    st.delete_now(
        &DeleteNow {
            path: "/f".into(),
            recursive: false,
            caller: None,
        },
        0,
        T0,
    )
    .expect("skip the trash");
    assert!(
        st.resolve_path("/.trash").is_err(),
        "nothing went to the trash"
    );
    file(&mut st, "/g", 0, true);
    rm(&mut st, "/g", T0).expect("rm");
    rm(&mut st, "/.trash/uid-0/Current/g", T0 + 1).expect("rm in the trash");
    assert!(st.resolve_path("/.trash/uid-0/Current/g").is_err());

    // An entry of the flat layout an older version left behind.
    file(&mut st, "/old", 0, true);
    let flat = format!("{T0}-77-old");
    as_flat_entry(&mut st, "/old", &flat);
    beat(&mut st, &[1, 2, 3], NOW);
    assert!(trash_actions(&st, T0 + KEEP).contains(&Action::PurgeTrash { name: flat }));
}

#[test]
fn a_path_taken_by_a_file_in_the_trash_gets_a_second_name() {
    let mut st = trashing();
    // /a was a file when it was removed ...
    file(&mut st, "/a", 0, true);
    rm(&mut st, "/a", T0).expect("rm /a");
    // ... and is a directory now.
    mkdir(&mut st, "/a");
    file(&mut st, "/a/f", 0, true);
    rm(&mut st, "/a/f", T0 + 1).expect("rm /a/f");
    let kept = format!("/.trash/uid-0/Current/a.{}/f", T0 + 1);
    assert!(st.resolve_path(&kept).is_ok());
    assert!(
        st.resolve_path("/.trash/uid-0/Current/a").is_ok(),
        "the file /a"
    );
    // Three removals of one path in one millisecond: three names.
    for _ in 0..3 {
        file(&mut st, "/g", 0, true);
        rm(&mut st, "/g", T0 + 2).expect("rm /g");
    }
    for name in [
        "g".to_string(),
        format!("g.{}", T0 + 2),
        format!("g.{}.1", T0 + 2),
    ] {
        assert!(
            st.resolve_path(&format!("/.trash/uid-0/Current/{name}"))
                .is_ok(),
            "{name}"
        );
    }
    // The trash's own directories are not renamed, not even within it.
    let rename = |src: &str, dst: &str| Rename {
        src: src.into(),
        dst: dst.into(),
        replace: false,
        caller: None,
    };
    for (src, dst) in [
        ("/.trash/uid-0/Current", "/.trash/uid-0/99999999999999"),
        ("/.trash/uid-0/Current/g", "/.trash/uid-0/1"),
    ] {
        assert!(
            matches!(
                st.rename(&rename(src, dst), 0, 1),
                Err(Error::NotPermitted { .. })
            ),
            "{src} -> {dst}"
        );
    }
    // A purge asked for before its time does nothing.
    let ckpt = st
        .checkpoint_trash("uid-0", NOW, T0 + 10)
        .expect("checkpoint")
        .expect("taken");
    assert!(!st
        .purge_trash(&format!("uid-0/{ckpt}"), NOW, T0 + 11)
        .expect("early"));
    assert!(st.resolve_path(&format!("/.trash/uid-0/{ckpt}")).is_ok());
}

/// Puts `path` into the trash as an older version did (`/.trash/<ms>-<ino>-<name>`).
fn as_flat_entry(st: &mut MasterState, path: &str, name: &str) {
    let comps = crate::namespace::components(path).expect("path");
    let (parent, last) = st.ns.resolve_parent(&comps).expect("parent");
    let bin = st.resolve_path("/.trash").expect("the trash");
    st.commit(
        crate::state::Record::Rename {
            src_parent: parent,
            src_name: last.to_string(),
            dst_parent: bin,
            dst_name: name.to_string(),
            mtime_ms: 1,
        },
        0,
    )
    .expect("as an older version left it");
}

#[test]
fn a_user_dir_owned_by_another_uid_is_not_used_and_flat_entries_restore() {
    use stampfs_proto::Caller;
    let mut st = trashing();
    let alice = Caller {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    };
    // Someone else's directory took the name of the one uid 1000 would get.
    mkdir(&mut st, "/.trash/uid-1000");
    st.mkdir(
        &Mkdir {
            path: "/tmp".into(),
            parents: false,
            attr: Some(stampfs_proto::NewAttr {
                mode: 0o1777,
                uid: 0,
                gid: 0,
            }),
            caller: None,
        },
        0,
        1,
    )
    .expect("tmp");
    st.make_file(
        &stampfs_proto::MakeFile {
            path: "/tmp/a".into(),
            client: stampfs_proto::ClientId(1),
            replication: None,
            chunk_size: None,
            attr: Some(stampfs_proto::NewAttr {
                mode: 0o644,
                uid: 1000,
                gid: 1000,
            }),
            caller: Some(alice.clone()),
        },
        0,
        1,
    )
    .expect("alice's file");
    st.delete(
        &Delete {
            path: "/tmp/a".into(),
            recursive: false,
            caller: Some(alice.clone()),
        },
        0,
        T0,
    )
    .expect("alice's rm");
    let d = st.stat("/.trash/uid-1000.1000").expect("her own");
    assert_eq!((d.attr.uid, d.attr.mode), (1000, 0o700));
    assert!(st
        .resolve_path("/.trash/uid-1000.1000/Current/tmp/a")
        .is_ok());

    // An entry of the older flat layout comes back by its path.
    file(&mut st, "/old", 0, true);
    let flat = format!("{T0}-77-old");
    as_flat_entry(&mut st, "/old", &flat);
    st.restore_trash(
        &RestoreTrash {
            path: format!("/.trash/{flat}"),
            to: "/old".into(),
            caller: None,
        },
        0,
        1,
    )
    .expect("restored");
    assert!(st.resolve_path("/old").is_ok());
}
