//! The namespace's checkpoint form is the one the derived encoding of its earlier
//! types wrote (a hash map of inodes, names as strings, chunk lists as vectors).

use super::*;
use std::collections::HashMap;

#[derive(Debug, PartialEq, Encode, Decode)]
struct OldDir {
    children: BTreeMap<Box<str>, InodeId>,
}

#[derive(Debug, PartialEq, Encode, Decode)]
struct OldFile {
    replication: u8,
    chunk_size: u64,
    chunks: Vec<ChunkHandle>,
    write: WriteState,
}

#[derive(Debug, PartialEq, Encode, Decode)]
enum OldKind {
    Dir(OldDir),
    File(OldFile),
    Symlink(String),
}

#[derive(Debug, PartialEq, Encode, Decode)]
struct OldInode {
    parent: InodeId,
    attr: Attr,
    kind: OldKind,
    xattrs: Option<BTreeMap<String, Vec<u8>>>,
}

#[derive(Debug, PartialEq, Encode, Decode)]
struct OldNamespace {
    inodes: HashMap<InodeId, OldInode>,
    next_inode: u64,
}

fn sample() -> Namespace {
    let mut ns = Namespace::default();
    ns.insert(ROOT, "d", InodeId(2), Inode::dir(ROOT, 1))
        .expect("d");
    let file = InodeKind::File(FileMeta {
        replication: 2,
        chunk_size: 1 << 20,
        chunks: ThinVec::from(vec![ChunkHandle(4), ChunkHandle(9)]),
        write: WriteState::Open {
            client: ClientId(3),
            granted: ChunkVersion(5),
        },
    });
    let f = Inode::new(InodeId(2), 7, file);
    ns.insert(
        InodeId(2),
        "a name longer than fifteen bytes",
        InodeId(5),
        f,
    )
    .expect("f");
    assert!(ns.set_xattr(InodeId(5), "user.a", Some(&[1])));
    ns.insert(ROOT, "l", InodeId(6), Inode::symlink(ROOT, 8, "d".into()))
        .expect("l");
    ns
}

#[test]
fn checkpoints_keep_their_format_both_ways() {
    let cfg = bincode::config::standard();
    let ns = sample();
    let bytes = bincode::encode_to_vec(&ns, cfg).expect("encode");
    let (old, used): (OldNamespace, usize) =
        bincode::decode_from_slice(&bytes, cfg).expect("decode as the old form");
    assert_eq!(used, bytes.len());
    assert_eq!(old.next_inode, 7);
    assert_eq!(old.inodes.len(), 4);
    let OldKind::File(f) = &old.inodes[&InodeId(5)].kind else {
        panic!("not a file");
    };
    assert_eq!(f.chunks, vec![ChunkHandle(4), ChunkHandle(9)]);
    let OldKind::Dir(d) = &old.inodes[&InodeId(2)].kind else {
        panic!("not a dir");
    };
    assert_eq!(
        d.children.get("a name longer than fifteen bytes"),
        Some(&InodeId(5))
    );
    let x = old.inodes[&InodeId(5)].xattrs.as_ref();
    assert_eq!(x.and_then(|x| x.get("user.a")), Some(&vec![1]));
    assert_eq!(old.inodes[&InodeId(6)].xattrs, None);
    // The old form's bytes decode to the same namespace.
    let old_bytes = bincode::encode_to_vec(&old, cfg).expect("encode old");
    let (back, _): (Namespace, usize) =
        bincode::decode_from_slice(&old_bytes, cfg).expect("decode old bytes");
    assert_eq!(back, ns);
    assert_eq!(
        back.path_of(InodeId(5)).as_deref(),
        Some("/d/a name longer than fifteen bytes")
    );
}

#[test]
fn a_checkpoint_with_inode_zero_is_refused() {
    let cfg = bincode::config::standard();
    let ns = sample();
    let mut old: OldNamespace =
        bincode::decode_from_slice(&bincode::encode_to_vec(&ns, cfg).expect("e"), cfg)
            .expect("d")
            .0;
    let l = old.inodes.remove(&InodeId(6)).expect("l");
    old.inodes.insert(InodeId(0), l);
    let bytes = bincode::encode_to_vec(&old, cfg).expect("encode");
    let e = bincode::decode_from_slice::<Namespace, _>(&bytes, cfg).unwrap_err();
    assert!(e.to_string().contains("inode 0"), "{e}");
}

#[test]
fn an_inode_is_compact() {
    // The design budget is 200 bytes of master memory per file: its slot (this
    // plus the key), an index entry and its name in the parent.
    assert!(
        std::mem::size_of::<Inode>() <= 96,
        "{}",
        std::mem::size_of::<Inode>()
    );
}

#[test]
fn an_inode_the_slab_refuses_leaves_its_parent_alone() {
    let mut ns = Namespace::default();
    let before = ns.clone();
    let e = ns
        .insert(ROOT, "zero", InodeId(0), Inode::dir(ROOT, 5))
        .unwrap_err();
    assert!(e.contains("inode 0"), "{e}");
    assert_eq!(ns, before, "no entry and no new times in the parent");
    assert_eq!(ns.child(ROOT, "zero"), None);
}
