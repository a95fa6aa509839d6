//! rename(2) at the master (`Rename { replace }`, `Record::RenameOver`): an existing
//! destination replaced in one record, by the rules of its kind, and kept by replay and
//! checkpoints. Pure: no sockets.

use super::*;
use stampfs_proto::{MakeFile, Mkdir, Rename, Symlink};

fn file(st: &mut MasterState, path: &str) -> InodeId {
    st.make_file(
        &MakeFile {
            path: path.into(),
            client: ClientId(1),
            replication: None,
            chunk_size: None,
            attr: None,
            caller: None,
        },
        0,
        1,
    )
    .expect("make_file")
    .inode
}

fn dir(st: &mut MasterState, path: &str) -> InodeId {
    st.mkdir(
        &Mkdir {
            path: path.into(),
            parents: false,
            attr: None,
            caller: None,
        },
        0,
        1,
    )
    .expect("mkdir")
    .inode
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
        5,
    )
}

#[test]
fn a_rename_replaces_what_rename_2_replaces_in_one_record() {
    let mut st = MasterState::new(Settings::for_tests());
    let a = file(&mut st, "/a");
    file(&mut st, "/b");
    // Without replace an existing name is refused, as before.
    assert!(matches!(
        rename(&mut st, "/a", "/b", false),
        Err(Error::AlreadyExists { .. })
    ));
    // A file replaces a file: one record, the old one gone, the name never missing.
    let before = st.last_lsn;
    rename(&mut st, "/a", "/b", true).expect("replace");
    assert_eq!(st.last_lsn, before + 1, "one record");
    assert_eq!(st.resolve_path("/b").expect("b"), a);
    assert!(st.resolve_path("/a").is_err());
    // A link replaces a file, a file a link.
    st.symlink(
        &Symlink {
            path: "/l".into(),
            target: "b".into(),
            attr: None,
            caller: None,
        },
        0,
        6,
    )
    .expect("symlink");
    rename(&mut st, "/l", "/b", true).expect("link over file");
    assert!(st.read_link("/b").is_ok());
    // The same entry under both names: nothing happens.
    let lsn = st.last_lsn;
    rename(&mut st, "/b", "/b", true).expect("onto itself");
    assert_eq!(st.last_lsn, lsn);
    // Directories: only over an empty directory; never across kinds.
    let d = dir(&mut st, "/d");
    dir(&mut st, "/e");
    file(&mut st, "/d/f");
    file(&mut st, "/f");
    assert!(matches!(
        rename(&mut st, "/f", "/e", true),
        Err(Error::IsADirectory { .. })
    ));
    assert!(matches!(
        rename(&mut st, "/e", "/f", true),
        Err(Error::NotADirectory { .. })
    ));
    assert!(matches!(
        rename(&mut st, "/e", "/d", true),
        Err(Error::DirectoryNotEmpty { .. })
    ));
    rename(&mut st, "/d", "/e", true).expect("dir over empty dir");
    assert_eq!(st.resolve_path("/e").expect("e"), d);
    assert!(st.stat("/e/f").is_ok());
    // Nor into itself, replacing or not.
    dir(&mut st, "/e/sub");
    assert!(rename(&mut st, "/e", "/e/sub", true).is_err());
    assert_eq!(st.resolve_path("/e").expect("e"), d, "unchanged");

    let log = st.take_outbox();
    let mut back = MasterState::new(Settings::for_tests());
    replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
    assert!(back.same_persisted(&st), "replay rebuilds the same state");
    let snap = st.encode_snapshot().expect("snapshot");
    let ckpt = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
    assert!(ckpt.same_persisted(&st));
}

#[test]
fn a_rename_over_record_that_does_not_fit_the_state_is_refused() {
    let mut st = MasterState::new(Settings::for_tests());
    let a = file(&mut st, "/a");
    let d = dir(&mut st, "/d");
    let lsn = st.last_lsn;
    let over = |replaced| Record::RenameOver {
        src_parent: namespace::ROOT,
        src_name: "a".into(),
        dst_parent: namespace::ROOT,
        dst_name: "d".into(),
        replaced,
        mtime_ms: 9,
    };
    // A file over a directory, and a record naming the wrong inode.
    assert!(st.apply(lsn + 1, &over(d), 0).is_err());
    assert!(st.apply(lsn + 1, &over(a), 0).is_err());
    assert_eq!(st.last_lsn, lsn);
    assert_eq!(st.resolve_path("/d").expect("d"), d, "nothing changed");
}
