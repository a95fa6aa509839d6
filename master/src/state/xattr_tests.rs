//! Extended attributes (`GetXattr`, `ListXattr`, `SetXattr`, `Record::SetXattr`):
//! the `user.` namespace only, setxattr(2)'s create and replace flags, the size
//! limit, permissions, links refused, and replay and checkpoints keeping them. Pure:
//! no sockets.

use super::*;
use stampfs_proto::{
    Caller, GetXattr, ListXattr, MakeFile, SetAttr, SetXattr, Symlink, XattrSet, MAX_XATTR_BYTES,
};

fn set(
    st: &mut MasterState,
    path: &str,
    name: &str,
    value: Option<&[u8]>,
    how: XattrSet,
) -> Result<bool> {
    st.set_xattr(
        &SetXattr {
            path: path.into(),
            name: name.into(),
            value: value.map(<[u8]>::to_vec),
            how,
            caller: None,
        },
        0,
        9,
    )
}

fn get(st: &MasterState, path: &str, name: &str) -> Result<Option<Vec<u8>>> {
    st.get_xattr(&GetXattr {
        path: path.into(),
        name: name.into(),
        caller: None,
    })
}

fn list(st: &MasterState, path: &str) -> Vec<String> {
    st.list_xattr(&ListXattr {
        path: path.into(),
        caller: None,
    })
    .expect("list")
}

fn file(st: &mut MasterState, path: &str) {
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
    .expect("make_file");
}

#[test]
fn user_attributes_are_set_read_listed_and_removed() {
    let mut st = MasterState::new(Settings::for_tests());
    file(&mut st, "/f");
    assert_eq!(get(&st, "/f", "user.a").expect("get"), None);
    assert!(!set(&mut st, "/f", "user.a", Some(b"1"), XattrSet::Any).expect("set"));
    assert!(set(&mut st, "/f", "user.a", Some(b"one"), XattrSet::Any).expect("replace"));
    assert!(!set(&mut st, "/f", "user.b", Some(b""), XattrSet::Create).expect("create"));
    assert_eq!(
        get(&st, "/f", "user.a").expect("get").as_deref(),
        Some(&b"one"[..])
    );
    assert_eq!(
        get(&st, "/f", "user.b").expect("get").as_deref(),
        Some(&b""[..])
    );
    assert_eq!(list(&st, "/f"), vec!["user.a", "user.b"]);
    assert_eq!(list(&st, "/"), Vec::<String>::new());
    // The flags: create refuses an existing one, replace and remove a missing one do
    // nothing (and say so).
    assert!(matches!(
        set(&mut st, "/f", "user.a", Some(b"x"), XattrSet::Create),
        Err(Error::AlreadyExists { .. })
    ));
    let lsn = st.last_lsn;
    assert!(!set(&mut st, "/f", "user.c", Some(b"x"), XattrSet::Replace).expect("replace"));
    assert!(!set(&mut st, "/f", "user.c", None, XattrSet::Any).expect("remove"));
    assert_eq!(st.last_lsn, lsn, "nothing logged");
    assert!(set(&mut st, "/f", "user.b", None, XattrSet::Any).expect("remove"));
    assert_eq!(list(&st, "/f"), vec!["user.a"]);
    // A change moves the change time.
    assert_eq!(st.stat("/f").expect("stat").attr.ctime_ns, 9_000_000);
    // Replay and checkpoints keep them.
    let log = st.take_outbox();
    let mut back = MasterState::new(Settings::for_tests());
    replay_records(&mut back, log.iter().map(|(l, b)| (*l, b.as_slice())), 0).expect("replay");
    assert!(back.same_persisted(&st));
    let snap = st.encode_snapshot().expect("snapshot");
    let ckpt = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
    assert_eq!(
        get(&ckpt, "/f", "user.a").expect("get").as_deref(),
        Some(&b"one"[..])
    );
}

#[test]
fn other_namespaces_links_and_oversized_values_are_refused() {
    let mut st = MasterState::new(Settings::for_tests());
    file(&mut st, "/f");
    for name in [
        "security.capability",
        "trusted.x",
        "system.posix_acl_access",
    ] {
        assert!(matches!(
            set(&mut st, "/f", name, Some(b"x"), XattrSet::Any),
            Err(Error::NotSupported { .. })
        ));
        assert!(matches!(
            get(&st, "/f", name),
            Err(Error::NotSupported { .. })
        ));
    }
    for name in ["user.", "user.a\0b"] {
        assert!(matches!(
            set(&mut st, "/f", name, Some(b"x"), XattrSet::Any),
            Err(Error::BadRequest { .. })
        ));
    }
    let long = format!("user.{}", "n".repeat(251));
    assert!(set(&mut st, "/f", &long, Some(b"x"), XattrSet::Any).is_err());
    st.symlink(
        &Symlink {
            path: "/l".into(),
            target: "f".into(),
            attr: None,
            caller: None,
        },
        0,
        2,
    )
    .expect("symlink");
    assert!(matches!(
        set(&mut st, "/l", "user.a", Some(b"x"), XattrSet::Any),
        Err(Error::NotPermitted { .. })
    ));
    // The limit counts names and values of one entry together.
    let half = vec![7u8; MAX_XATTR_BYTES / 2];
    set(&mut st, "/f", "user.a", Some(&half), XattrSet::Any).expect("half");
    assert!(matches!(
        set(&mut st, "/f", "user.b", Some(&half), XattrSet::Any),
        Err(Error::XattrTooBig { .. })
    ));
    // Replacing a value counts the new one only.
    set(&mut st, "/f", "user.a", Some(&half), XattrSet::Replace).expect("same size again");
}

#[test]
fn reading_needs_read_and_changing_needs_write_permission() {
    let mut st = MasterState::new(Settings::for_tests());
    file(&mut st, "/f");
    set(&mut st, "/f", "user.a", Some(b"v"), XattrSet::Any).expect("set");
    st.set_attr(
        &SetAttr {
            path: "/f".into(),
            mode: Some(0o600),
            uid: None,
            gid: None,
            atime: None,
            mtime: None,
            caller: None,
        },
        0,
        3,
    )
    .expect("chmod");
    let other = Some(Caller {
        uid: 1234,
        gid: 1234,
        groups: vec![],
    });
    let e = st
        .get_xattr(&GetXattr {
            path: "/f".into(),
            name: "user.a".into(),
            caller: other.clone(),
        })
        .expect_err("no read permission");
    assert!(matches!(e, Error::PermissionDenied { .. }), "{e:?}");
    let e = st
        .set_xattr(
            &SetXattr {
                path: "/f".into(),
                name: "user.a".into(),
                value: None,
                how: XattrSet::Any,
                caller: other.clone(),
            },
            0,
            4,
        )
        .expect_err("no write permission");
    assert!(matches!(e, Error::PermissionDenied { .. }), "{e:?}");
    // Listing needs only search permission along the path.
    let names = st
        .list_xattr(&ListXattr {
            path: "/f".into(),
            caller: other,
        })
        .expect("list");
    assert_eq!(names, vec!["user.a"]);
}
