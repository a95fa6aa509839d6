//! The namespace as checkpoint format 1 wrote it (before `WriteState::Open` carried
//! the granted version), decoded only to upgrade old checkpoints.

use super::DirMeta;
use bincode::Decode;
use stampfs_proto::{ChunkHandle, ChunkVersion, ClientId, InodeId};
use std::collections::HashMap;

#[derive(Decode)]
#[cfg_attr(test, derive(bincode::Encode))]
enum WriteState {
    Closed,
    Open {
        client: ClientId,
    },
    Recovering {
        holder: ClientId,
        old_version: ChunkVersion,
    },
}

#[derive(Decode)]
#[cfg_attr(test, derive(bincode::Encode))]
struct FileMeta {
    replication: u8,
    chunk_size: u64,
    chunks: Vec<ChunkHandle>,
    write: WriteState,
}

#[derive(Decode)]
#[cfg_attr(test, derive(bincode::Encode))]
enum InodeKind {
    Dir(DirMeta),
    File(FileMeta),
}

#[derive(Decode)]
#[cfg_attr(test, derive(bincode::Encode))]
struct Inode {
    parent: InodeId,
    mtime_ms: u64,
    kind: InodeKind,
}

/// A format-1 namespace.
#[derive(Decode)]
#[cfg_attr(test, derive(bincode::Encode))]
pub struct Namespace {
    inodes: HashMap<InodeId, Inode>,
    next_inode: u64,
}

impl Namespace {
    /// The current form. An open file's granted version is what format 1 implied:
    /// the current version of its last chunk (`version_of`), zero without one.
    pub fn upgrade(
        self,
        version_of: impl Fn(ChunkHandle) -> ChunkVersion,
    ) -> Result<super::Namespace, String> {
        let inodes = self.inodes.into_iter().map(|(ino, i)| {
            let kind = match i.kind {
                InodeKind::Dir(d) => super::InodeKind::Dir(d),
                InodeKind::File(f) => {
                    let write = match f.write {
                        WriteState::Closed => super::WriteState::Closed,
                        WriteState::Open { client } => super::WriteState::Open {
                            client,
                            granted: f.chunks.last().map_or(ChunkVersion(0), |h| version_of(*h)),
                        },
                        WriteState::Recovering {
                            holder,
                            old_version,
                        } => super::WriteState::Recovering {
                            holder,
                            old_version,
                        },
                    };
                    super::InodeKind::File(super::FileMeta {
                        replication: f.replication,
                        chunk_size: f.chunk_size,
                        chunks: f.chunks.into(),
                        write,
                    })
                }
            };
            (ino, super::Inode::new(i.parent, i.mtime_ms, kind))
        });
        super::Namespace::from_inodes(inodes, self.next_inode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::ROOT;

    #[test]
    fn a_format_1_namespace_upgrades_with_the_last_chunks_version_granted() {
        let mut root = DirMeta::default();
        root.children.insert("open".into(), InodeId(2));
        root.children.insert("closed".into(), InodeId(3));
        let file = |write| Inode {
            parent: ROOT,
            mtime_ms: 5,
            kind: InodeKind::File(FileMeta {
                replication: 3,
                chunk_size: 1 << 20,
                chunks: vec![ChunkHandle(7)],
                write,
            }),
        };
        let old = Namespace {
            inodes: HashMap::from([
                (
                    ROOT,
                    Inode {
                        parent: ROOT,
                        mtime_ms: 0,
                        kind: InodeKind::Dir(root),
                    },
                ),
                (
                    InodeId(2),
                    file(WriteState::Open {
                        client: ClientId(9),
                    }),
                ),
                (InodeId(3), file(WriteState::Closed)),
            ]),
            next_inode: 4,
        };
        let cfg = bincode::config::standard();
        let bytes = bincode::encode_to_vec(&old, cfg).expect("encode");
        let (back, _): (Namespace, usize) =
            bincode::decode_from_slice(&bytes, cfg).expect("decode");
        let ns = back
            .upgrade(|h| {
                assert_eq!(h, ChunkHandle(7));
                ChunkVersion(4)
            })
            .expect("upgrade");
        assert_eq!(
            ns.file(InodeId(2)).expect("file").write,
            super::super::WriteState::Open {
                client: ClientId(9),
                granted: ChunkVersion(4)
            }
        );
        assert_eq!(
            ns.file(InodeId(3)).expect("file").write,
            super::super::WriteState::Closed
        );
        assert_eq!(ns.next_inode(), InodeId(4));
        assert_eq!(ns.resolve(&["open"]).expect("resolve"), InodeId(2));
    }
}
