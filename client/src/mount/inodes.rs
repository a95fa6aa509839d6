//! Inode numbers and the attribute cache: pure bookkeeping, no I/O.
//!
//! The kernel names files by inode number; the master names them by path. The FUSE
//! inode number is the master's [`InodeId`](stampfs_proto::InodeId) (the root is 1 on
//! both sides), and [`Inodes`] remembers the path of every inode the kernel holds a
//! reference to, counting lookups so `forget` can drop it. [`AttrCache`] keeps recent
//! [`FileStatus`] answers by path for a short TTL so `ls -l` costs one `List` and not
//! one `Stat` per entry.

use stampfs_proto::FileStatus;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The kernel's inode number for the root directory (and the master's).
pub(crate) const ROOT: u64 = 1;

/// Entries kept in the attribute cache before stale ones are swept out.
const ATTR_CACHE_SWEEP_AT: usize = 16 * 1024;

/// `parent/name` as a namespace path.
pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The last component of a path.
pub(crate) fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// True when `path` is `dir` or inside it.
fn within(path: &str, dir: &str) -> bool {
    path == dir
        || (path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/')
}

struct Node {
    path: String,
    /// Lookups the kernel holds on this inode (each entry reply adds one).
    lookups: u64,
}

/// Inode number → path for every inode the kernel knows.
pub(crate) struct Inodes {
    nodes: HashMap<u64, Node>,
}

impl Default for Inodes {
    fn default() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                path: "/".to_string(),
                lookups: 1,
            },
        );
        Self { nodes }
    }
}

impl Inodes {
    /// The path of `ino`, if the kernel still holds it.
    pub(crate) fn path(&self, ino: u64) -> Option<&str> {
        self.nodes.get(&ino).map(|n| n.path.as_str())
    }

    /// The inode number the kernel knows for `path`, if any.
    pub(crate) fn ino_of(&self, path: &str) -> Option<u64> {
        self.nodes
            .iter()
            .find(|(_, n)| n.path == path)
            .map(|(ino, _)| *ino)
    }

    /// The path of `name` inside directory `parent`.
    pub(crate) fn child(&self, parent: u64, name: &str) -> Option<String> {
        self.path(parent).map(|p| join(p, name))
    }

    /// Records that the kernel was handed `ino` at `path` (one more lookup).
    pub(crate) fn remember(&mut self, ino: u64, path: &str) {
        let node = self.nodes.entry(ino).or_insert_with(|| Node {
            path: path.to_string(),
            lookups: 0,
        });
        if node.path != path {
            // Renamed behind our back (by another client): the newest answer wins.
            node.path = path.to_string();
        }
        node.lookups += 1;
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
            if node.lookups == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    /// `from` was renamed to `to`: it and everything below it move.
    pub(crate) fn renamed(&mut self, from: &str, to: &str) {
        for node in self.nodes.values_mut() {
            if within(&node.path, from) {
                node.path = format!("{to}{}", &node.path[from.len()..]);
            }
        }
    }

    /// How many inodes are remembered (the root included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// A cached answer: the master's status and the size to show for it.
#[derive(Clone, Debug)]
pub(crate) struct Cached {
    pub(crate) status: FileStatus,
    /// For a file being written elsewhere, the hflushed length readers can see;
    /// otherwise the status's length.
    pub(crate) size: u64,
    at: Instant,
}

/// Recent `Stat`/`List` answers by path, trusted for `ttl`.
pub(crate) struct AttrCache {
    ttl: Duration,
    entries: HashMap<String, Cached>,
}

impl AttrCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: HashMap::new(),
        }
    }

    /// The answer for `path` if it is younger than the TTL at `now`.
    pub(crate) fn get(&self, path: &str, now: Instant) -> Option<Cached> {
        self.entries
            .get(path)
            .filter(|c| now.saturating_duration_since(c.at) < self.ttl)
            .cloned()
    }

    pub(crate) fn put(&mut self, status: FileStatus, size: u64, now: Instant) {
        if self.entries.len() >= ATTR_CACHE_SWEEP_AT {
            let ttl = self.ttl;
            self.entries
                .retain(|_, c| now.saturating_duration_since(c.at) < ttl);
        }
        let path = status.path.clone();
        self.entries.insert(
            path,
            Cached {
                status,
                size,
                at: now,
            },
        );
    }

    /// Drops `path` and everything below it.
    pub(crate) fn invalidate(&mut self, path: &str) {
        self.entries.retain(|p, _| !within(p, path));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{FileKind, FileState, InodeId};

    fn status(path: &str, ino: u64) -> FileStatus {
        FileStatus {
            path: path.into(),
            inode: InodeId(ino),
            kind: FileKind::File,
            length: 7,
            replication: 3,
            chunk_size: 1 << 20,
            state: FileState::Closed,
            attr: stampfs_proto::Attr::default(),
        }
    }

    #[test]
    fn paths_join_and_split() {
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
        assert_eq!(base_name("/a/b"), "b");
        assert_eq!(base_name("/"), "");
        assert!(within("/a/b", "/a"));
        assert!(within("/a", "/a"));
        assert!(!within("/ab", "/a"));
    }

    #[test]
    fn lookups_are_counted_and_forgotten() {
        let mut t = Inodes::default();
        assert_eq!(t.path(ROOT), Some("/"));
        t.remember(5, "/x");
        t.remember(5, "/x");
        assert_eq!(t.child(5, "y").as_deref(), Some("/x/y"));
        assert_eq!(t.ino_of("/x"), Some(5));
        t.forget(5, 1);
        assert_eq!(t.path(5), Some("/x"));
        t.forget(5, 1);
        assert_eq!(t.path(5), None);
        t.forget(ROOT, 100);
        assert_eq!(t.path(ROOT), Some("/"), "the root is never forgotten");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn rename_moves_a_subtree_and_nothing_else() {
        let mut t = Inodes::default();
        t.remember(2, "/a");
        t.remember(3, "/a/f");
        t.remember(4, "/ab");
        t.renamed("/a", "/z/q");
        assert_eq!(t.path(2), Some("/z/q"));
        assert_eq!(t.path(3), Some("/z/q/f"));
        assert_eq!(t.path(4), Some("/ab"));
    }

    #[test]
    fn attributes_expire_after_the_ttl() {
        let mut c = AttrCache::new(Duration::from_secs(1));
        let t0 = Instant::now();
        c.put(status("/f", 9), 7, t0);
        assert!(c.get("/f", t0 + Duration::from_millis(999)).is_some());
        assert!(c.get("/f", t0 + Duration::from_secs(1)).is_none());
        c.put(status("/d/g", 10), 7, t0);
        c.invalidate("/d");
        assert!(c.get("/d/g", t0).is_none());
        assert!(c.get("/f", t0).is_some());
    }
}
