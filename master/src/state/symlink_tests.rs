//! Symbolic links in the namespace (`Symlink`, `Record::Symlink`): created, read,
//! listed, renamed and deleted like any entry, never followed by the master, refused
//! where a file is needed, and kept by replay and checkpoints. Pure: no sockets.

use super::*;
use stampfs_proto::{Append, Create, Delete, Mkdir, Rename, Symlink, MAX_SYMLINK_TARGET};

const A: ClientId = ClientId(0xa);

fn link(st: &mut MasterState, path: &str, target: &str) -> Result<FileStatus> {
    st.symlink(
        &Symlink {
            path: path.into(),
            target: target.into(),
            attr: None,
            caller: None,
        },
        0,
        7,
    )
}

#[test]
fn a_link_holds_its_target_as_given_and_is_listed_as_a_link() {
    let mut st = MasterState::new(Settings::for_tests());
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
    // Dangling, relative, absolute: the master never resolves a target.
    for (path, target) in [
        ("/d/rel", "../somewhere/else"),
        ("/d/abs", "/mnt/x"),
        ("/top", "d"),
    ] {
        let st_ = link(&mut st, path, target).expect("symlink");
        assert_eq!(st_.kind, FileKind::Symlink);
        assert_eq!(st_.length, target.len() as u64);
        assert_eq!(st.read_link(path).expect("readlink"), target);
        assert_eq!(st.stat(path).expect("stat").kind, FileKind::Symlink);
    }
    let names: Vec<(String, FileKind)> = st
        .list("/d")
        .expect("list")
        .into_iter()
        .map(|s| (s.path, s.kind))
        .collect();
    assert_eq!(
        names,
        vec![
            ("/d/abs".to_string(), FileKind::Symlink),
            ("/d/rel".to_string(), FileKind::Symlink)
        ]
    );
    // Renamed and deleted like a file.
    st.rename(
        &Rename {
            src: "/d/rel".into(),
            dst: "/d/moved".into(),
            caller: None,
            replace: false,
        },
        0,
        8,
    )
    .expect("rename");
    assert_eq!(
        st.read_link("/d/moved").expect("readlink"),
        "../somewhere/else"
    );
    st.delete(
        &Delete {
            path: "/d/moved".into(),
            recursive: false,
            caller: None,
        },
        0,
        9,
    )
    .expect("delete");
    assert!(matches!(
        st.read_link("/d/moved"),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn bad_targets_and_taken_names_are_refused() {
    let mut st = MasterState::new(Settings::for_tests());
    link(&mut st, "/l", "x").expect("symlink");
    assert!(matches!(
        link(&mut st, "/l", "y"),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        link(&mut st, "/", "y"),
        Err(Error::AlreadyExists { .. })
    ));
    for target in [
        String::new(),
        "a\0b".to_string(),
        "x".repeat(MAX_SYMLINK_TARGET + 1),
    ] {
        let e = link(&mut st, "/m", &target).expect_err("a bad target");
        assert!(matches!(e, Error::BadRequest { .. }), "{e:?}");
    }
    assert!(link(&mut st, "/m", &"x".repeat(MAX_SYMLINK_TARGET)).is_ok());
    assert!(matches!(
        link(&mut st, "/nodir/l", "x"),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn the_master_never_follows_a_link() {
    let mut st = MasterState::new(Settings::for_tests());
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
    link(&mut st, "/to-d", "/d").expect("symlink");
    // A link in the middle of a path is not a directory.
    assert!(matches!(
        st.stat("/to-d/f"),
        Err(Error::NotADirectory { .. })
    ));
    // Where a file is needed, a link is refused with what it is.
    let e = st
        .append(
            &Append {
                path: "/to-d".into(),
                client: A,
                caller: None,
            },
            st.resolve_path("/to-d").expect("resolve"),
            0,
            1,
        )
        .expect_err("append to a link");
    assert!(
        matches!(&e, Error::NotSupported { reason } if reason.contains("symbolic link")),
        "{e:?}"
    );
    let e = st
        .create(
            &Create {
                path: "/to-d".into(),
                client: A,
                replication: None,
                chunk_size: None,
                overwrite: true,
                attr: None,
                caller: None,
            },
            0,
            1,
        )
        .expect_err("create over a link");
    assert!(matches!(e, Error::NotSupported { .. }), "{e:?}");
    // A file or a directory is not a link.
    assert!(matches!(st.read_link("/d"), Err(Error::BadRequest { .. })));
}

#[test]
fn links_survive_replay_and_checkpoints() {
    let mut st = MasterState::new(Settings::for_tests());
    link(&mut st, "/l", "target/of/l").expect("symlink");
    let log = st.take_outbox();
    let mut back = MasterState::new(Settings::for_tests());
    replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
    assert!(back.same_persisted(&st), "replay rebuilds the same state");
    assert_eq!(back.read_link("/l").expect("readlink"), "target/of/l");
    let snap = st.encode_snapshot().expect("snapshot");
    let from_ckpt = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
    assert_eq!(from_ckpt.read_link("/l").expect("readlink"), "target/of/l");
    assert_eq!(from_ckpt.stat("/l").expect("stat").attr.mtime_ns, 7_000_000);
}
