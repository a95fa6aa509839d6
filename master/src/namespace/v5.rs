//! The namespace as checkpoint formats 2 to 5 wrote it (before attributes were
//! stored: an inode held its modification time in milliseconds only), decoded only to
//! upgrade old checkpoints. Their entries take the defaults of [`Inode::new`]: uid 0,
//! gid 0, the default mode of their kind, every time at their modification time.

use super::InodeKind;
use bincode::Decode;
use stampfs_proto::InodeId;
use std::collections::HashMap;

#[derive(Decode)]
#[cfg_attr(test, derive(bincode::Encode, Debug, PartialEq))]
pub struct Inode {
    pub parent: InodeId,
    pub mtime_ms: u64,
    pub kind: InodeKind,
}

/// A namespace of formats 2 to 5.
#[derive(Decode)]
#[cfg_attr(test, derive(bincode::Encode))]
pub struct Namespace {
    pub inodes: HashMap<InodeId, Inode>,
    pub next_inode: u64,
}

impl Namespace {
    /// `ns` as formats 2 to 5 wrote it: every attribute but the modification
    /// time (in milliseconds) dropped.
    #[cfg(test)]
    pub fn downgrade(ns: &super::Namespace) -> Self {
        Self {
            inodes: ns
                .inodes
                .iter()
                .map(|(ino, i)| {
                    let old = Inode {
                        parent: i.parent,
                        mtime_ms: i.mtime_ms(),
                        kind: i.kind.clone(),
                    };
                    (*ino, old)
                })
                .collect(),
            next_inode: ns.next_inode,
        }
    }

    /// The current form (an inode id the current form refuses, 0, is an error).
    pub fn upgrade(self) -> Result<super::Namespace, String> {
        super::Namespace::from_inodes(
            self.inodes
                .into_iter()
                .map(|(ino, i)| (ino, super::Inode::new(i.parent, i.mtime_ms, i.kind))),
            self.next_inode,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::{DirMeta, ROOT};

    #[test]
    fn a_format_5_namespace_upgrades_with_default_attributes() {
        let mut root = DirMeta::default();
        root.children.insert("l".into(), InodeId(2));
        let mut inodes = HashMap::new();
        inodes.insert(
            ROOT,
            Inode {
                parent: ROOT,
                mtime_ms: 7,
                kind: InodeKind::Dir(root),
            },
        );
        inodes.insert(
            InodeId(2),
            Inode {
                parent: ROOT,
                mtime_ms: 9,
                kind: InodeKind::Symlink("t".into()),
            },
        );
        let old = Namespace {
            inodes,
            next_inode: 3,
        };
        let bytes = bincode::encode_to_vec(&old, bincode::config::standard()).unwrap();
        let (back, _): (Namespace, usize) =
            bincode::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        let ns = back.upgrade().expect("upgrade");
        let root = ns.get(ROOT).unwrap();
        assert_eq!(root.attr.mode, 0o755);
        assert_eq!(root.attr.mtime_ns, 7_000_000);
        let link = ns.get(InodeId(2)).unwrap();
        assert_eq!(link.attr.mode, 0o777);
        assert_eq!((link.attr.uid, link.attr.gid), (0, 0));
        assert_eq!(link.attr.atime_ns, 9_000_000);
        assert_eq!(link.attr.ctime_ns, 9_000_000);
        assert_eq!(ns.next_inode().0, 3);
    }
}
