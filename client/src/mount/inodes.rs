//! Inode numbers and the attribute cache: pure bookkeeping, no I/O.
//!
//! The kernel names files by inode number; the master names them by path. The FUSE
//! inode number is the master's [`InodeId`](stampfs_proto::InodeId) (the root is 1 on
//! both sides), and [`Inodes`] remembers the path of every inode the kernel holds a
//! reference to, counting lookups so `forget` can drop it. [`AttrCache`] keeps recent
//! [`FileStatus`] answers by path for a short TTL so `ls -l` costs one `List` and not
//! one `Stat` per entry, and the complete lists of names of the directories this mount
//! walks: a lookup of a name in it is answered from the cached attributes, and, with
//! a negative timeout, a lookup of a name that is not in it (every `open(O_CREAT)` of
//! a new file starts with one) is answered "no such file", without a round trip to
//! the master either way.

use stampfs_proto::FileStatus;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// The kernel's inode number for the root directory (and the master's).
pub(crate) const ROOT: u64 = 1;

/// Entries kept in the attribute cache before stale ones are swept out.
const ATTR_CACHE_SWEEP_AT: usize = 16 * 1024;

/// Lookups in one directory within a TTL that make the mount list it whole (a
/// directory being walked or filled) rather than ask for each name.
pub(crate) const LIST_AFTER_LOOKUPS: u32 = 2;

/// The most names a directory listing kept for lookups may hold; a larger directory
/// is asked name by name (listing it every TTL would cost more than it saves).
pub(crate) const MAX_LISTED_NAMES: usize = 16 * 1024;

/// How long a directory found to hold more than [`MAX_LISTED_NAMES`] is not listed
/// again for lookups.
const TOO_LARGE_HOLD: Duration = Duration::from_secs(60);

/// The most names all kept listings may hold together; past it, stale listings are
/// dropped, and a new one is not kept while it stays past.
const MAX_LISTED_TOTAL: usize = 256 * 1024;

/// The master's trash directory at the root (`rm` moves entries there): hidden from
/// the root's listing, so never judged by it.
const TRASH: &str = "/.trash";

/// The parent directory of a path (`/` for the root and its entries).
pub(crate) fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

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

/// The complete list of names of one directory, as listed at `at` and changed since
/// by this mount's own creates, removes and renames in it; `None`: it had more than
/// [`MAX_LISTED_NAMES`], and is asked name by name until `at` is a TTL old.
struct Listing {
    names: Option<HashSet<String>>,
    at: Instant,
}

impl Listing {
    fn len(&self) -> usize {
        self.names.as_ref().map_or(0, HashSet::len)
    }
}

/// Recent `Stat`/`List` answers by path, trusted for `ttl`, and recent complete
/// listings of directories: a name missing from a listing younger than the negative
/// timeout is taken not to exist (another client's create shows within that time, as
/// its changes to a file show within the TTL; 0, the default, never answers so). A
/// create the master then refuses because the name exists after all is answered so
/// that the kernel looks the name up again and opens what it finds
/// (`Shared::create`).
pub(crate) struct AttrCache {
    ttl: Duration,
    /// How long a listing answers for the names it lacks.
    negative_ttl: Duration,
    /// Ordered, so that a directory's entries (`dir/...`) are one range.
    entries: BTreeMap<String, Cached>,
    listings: HashMap<String, Listing>,
    /// Lookups that went to the master, per directory: when the count started, and
    /// how many (see [`LIST_AFTER_LOOKUPS`]).
    lookups: HashMap<String, (Instant, u32)>,
    /// Raised by every change this mount makes or forgets ([`AttrCache::changes`]).
    changes: u64,
    /// Names held by `listings`, together.
    listed_names: usize,
    /// `entries` is swept of stale answers when it reaches this size (then set to
    /// twice what is left, so that caching a large listing is not quadratic).
    sweep_at: usize,
}

impl AttrCache {
    pub(crate) fn new(ttl: Duration, negative_ttl: Duration) -> Self {
        Self {
            ttl,
            negative_ttl,
            entries: BTreeMap::new(),
            listings: HashMap::new(),
            lookups: HashMap::new(),
            changes: 0,
            listed_names: 0,
            sweep_at: ATTR_CACHE_SWEEP_AT,
        }
    }

    /// Whether a listing of `dir` may judge its names: not the trash (hidden from its
    /// parent's listing), nor anything under it (`rm` adds names there unseen).
    fn judged(path: &str) -> bool {
        path != "/" && !within(path, TRASH)
    }

    /// A count of the changes this mount made (names made, removed, attributes
    /// dropped). Read before asking the master for a listing: if it moved by the
    /// answer, the answer may predate one of them and is not kept.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    fn fresh(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) < self.ttl
    }

    /// Whether `path` is known not to exist at `now`: its directory was listed within
    /// the negative timeout and the name is not in it.
    pub(crate) fn absent(&self, path: &str, now: Instant) -> bool {
        if !Self::judged(path) {
            return false;
        }
        self.listings.get(parent_of(path)).is_some_and(|l| {
            now.saturating_duration_since(l.at) < self.negative_ttl
                && l.names
                    .as_ref()
                    .is_some_and(|n| !n.contains(base_name(path)))
        })
    }

    /// Counts a lookup of `path` that goes to the master; true when its directory is
    /// being walked ([`LIST_AFTER_LOOKUPS`] within a TTL) and has no fresh listing:
    /// list it instead.
    pub(crate) fn should_list_parent(&mut self, path: &str, now: Instant) -> bool {
        if !Self::judged(path) {
            return false;
        }
        let dir = parent_of(path);
        if self.listings.get(dir).is_some_and(|l| {
            let age = now.saturating_duration_since(l.at);
            age < self.ttl || (l.names.is_none() && age < TOO_LARGE_HOLD)
        }) {
            return false;
        }
        if self.lookups.len() >= ATTR_CACHE_SWEEP_AT {
            let ttl = self.ttl;
            self.lookups
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
        }
        let ttl = self.ttl;
        let (at, n) = self.lookups.entry(dir.to_string()).or_insert((now, 0));
        if now.saturating_duration_since(*at) >= ttl {
            (*at, *n) = (now, 0);
        }
        *n += 1;
        if *n < LIST_AFTER_LOOKUPS {
            return false;
        }
        // One listing per TTL at most, whether it then succeeds or not.
        *n = 0;
        true
    }

    /// Keeps the complete list of names of `dir` as listed at `now` (not when it has
    /// more than [`MAX_LISTED_NAMES`]).
    pub(crate) fn listed<'a>(
        &mut self,
        dir: &str,
        names: impl ExactSizeIterator<Item = &'a str>,
        now: Instant,
    ) {
        self.lookups.remove(dir);
        self.drop_listing(dir);
        let count = names.len();
        if self.listed_names + count > MAX_LISTED_TOTAL
            || self.listings.len() >= ATTR_CACHE_SWEEP_AT
        {
            let keep = self.ttl.max(self.negative_ttl);
            self.listings
                .retain(|_, l| now.saturating_duration_since(l.at) < keep);
            self.listed_names = self.listings.values().map(Listing::len).sum();
        }
        let names = (count <= MAX_LISTED_NAMES && self.listed_names + count <= MAX_LISTED_TOTAL)
            .then(|| names.map(str::to_string).collect::<HashSet<_>>());
        self.listed_names += names.as_ref().map_or(0, HashSet::len);
        self.listings
            .insert(dir.to_string(), Listing { names, at: now });
    }

    fn drop_listing(&mut self, dir: &str) {
        if let Some(l) = self.listings.remove(dir) {
            self.listed_names -= l.len();
        }
    }

    /// Drops the listings of `path` and of every directory below it.
    fn drop_listings_within(&mut self, path: &str) {
        let mut dropped = 0;
        self.listings.retain(|d, l| {
            let keep = !within(d, path);
            if !keep {
                dropped += l.len();
            }
            keep
        });
        self.listed_names -= dropped;
    }

    /// This mount made `path`: its directory's listing gains the name.
    /// A directory made there (a rename over an empty one included) has no listing
    /// yet.
    pub(crate) fn name_added(&mut self, path: &str) {
        self.changes += 1;
        if let Some(names) = self
            .listings
            .get_mut(parent_of(path))
            .and_then(|l| l.names.as_mut())
        {
            if names.insert(base_name(path).to_string()) {
                self.listed_names += 1;
            }
        }
        self.drop_listings_within(path);
    }

    /// A change of `path` failed in a way that leaves unknown whether it exists:
    /// its directory's listing goes.
    pub(crate) fn name_unknown(&mut self, path: &str) {
        self.changes += 1;
        self.drop_listing(parent_of(path));
        self.drop_listings_within(path);
    }

    /// This mount removed `path` (or renamed it away): its directory's listing loses
    /// the name, and listings of `path` and below go.
    pub(crate) fn name_removed(&mut self, path: &str) {
        self.changes += 1;
        if let Some(names) = self
            .listings
            .get_mut(parent_of(path))
            .and_then(|l| l.names.as_mut())
        {
            if names.remove(base_name(path)) {
                self.listed_names -= 1;
            }
        }
        self.drop_listings_within(path);
    }

    /// The answer for `path` if it is younger than the TTL at `now`.
    pub(crate) fn get(&self, path: &str, now: Instant) -> Option<Cached> {
        self.entries
            .get(path)
            .filter(|c| self.fresh(c.at, now))
            .cloned()
    }

    pub(crate) fn put(&mut self, status: FileStatus, size: u64, now: Instant) {
        if self.entries.len() >= self.sweep_at {
            let ttl = self.ttl;
            self.entries
                .retain(|_, c| now.saturating_duration_since(c.at) < ttl);
            self.sweep_at = (self.entries.len() * 2).max(ATTR_CACHE_SWEEP_AT);
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

    /// Drops the attributes of `path` and of everything below it.
    pub(crate) fn invalidate(&mut self, path: &str) {
        self.changes += 1;
        self.entries.remove(path);
        // Below `path`: the range from `path/` up to `path0` ('0' follows '/').
        let below: Vec<String> = self
            .entries
            .range(
                format!("{}/", path.trim_end_matches('/'))
                    ..format!("{}0", path.trim_end_matches('/')),
            )
            .map(|(p, _)| p.clone())
            .collect();
        for p in below {
            self.entries.remove(&p);
        }
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
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::from_secs(1));
        let t0 = Instant::now();
        c.put(status("/f", 9), 7, t0);
        assert!(c.get("/f", t0 + Duration::from_millis(999)).is_some());
        assert!(c.get("/f", t0 + Duration::from_secs(1)).is_none());
        c.put(status("/d/g", 10), 7, t0);
        c.invalidate("/d");
        assert!(c.get("/d/g", t0).is_none());
        assert!(c.get("/f", t0).is_some());
    }

    #[test]
    fn invalidation_takes_a_subtree_and_nothing_beside_it() {
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::from_secs(1));
        let t0 = Instant::now();
        for (p, i) in [
            ("/a", 1),
            ("/a/b", 2),
            ("/a/b/c", 3),
            ("/ab", 4),
            ("/a0", 5),
        ] {
            c.put(status(p, i), 7, t0);
        }
        c.invalidate("/a");
        for gone in ["/a", "/a/b", "/a/b/c"] {
            assert!(c.get(gone, t0).is_none(), "{gone}");
        }
        assert!(c.get("/ab", t0).is_some() && c.get("/a0", t0).is_some());
        c.invalidate("/");
        assert!(c.get("/ab", t0).is_none(), "the root takes everything");
    }

    #[test]
    fn a_name_missing_from_a_fresh_listing_is_absent() {
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::from_secs(1));
        let t0 = Instant::now();
        assert!(!c.absent("/d/x", t0), "nothing is known before a listing");
        c.listed("/d", ["a", "b"].into_iter(), t0);
        assert!(c.absent("/d/x", t0));
        assert!(!c.absent("/d/a", t0));
        assert!(!c.absent("/e/x", t0), "another directory is not known");
        assert!(
            !c.absent("/d/x", t0 + Duration::from_secs(1)),
            "a listing is trusted for the TTL only"
        );
        let before = c.changes();
        c.name_added("/d/x");
        assert!(!c.absent("/d/x", t0), "this mount's create is in it");
        assert_ne!(c.changes(), before, "a listing asked before it is not kept");
        c.name_removed("/d/a");
        assert!(c.absent("/d/a", t0), "and its removal");
        // The root's entries.
        c.listed("/", ["d"].into_iter(), t0);
        assert!(c.absent("/q", t0) && !c.absent("/d", t0));
        // A directory removed or renamed away loses its listing.
        c.name_removed("/d");
        assert!(!c.absent("/d/x", t0) && !c.absent("/d/zz", t0));
    }

    #[test]
    fn without_a_negative_timeout_a_listing_answers_for_no_missing_name() {
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::ZERO);
        let t0 = Instant::now();
        c.listed("/d", ["a"].into_iter(), t0);
        assert!(!c.absent("/d/x", t0), "another client may have made it");
        assert!(
            !c.should_list_parent("/d/x", t0),
            "still listed: its attributes answer for the names it has"
        );
    }

    #[test]
    fn the_root_and_the_trash_are_never_judged_by_a_listing() {
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::from_secs(1));
        let t0 = Instant::now();
        c.listed("/", ["d"].into_iter(), t0);
        assert!(!c.absent("/", t0), "the root itself");
        assert!(!c.absent("/.trash", t0), "hidden from the root's listing");
        c.listed("/.trash", [].into_iter(), t0);
        assert!(!c.absent("/.trash/1-2-x", t0), "rm adds names there unseen");
        assert!(!c.should_list_parent("/.trash/a", t0));
        assert!(!c.should_list_parent("/.trash/b", t0));
    }

    #[test]
    fn a_directory_renamed_over_an_empty_one_has_no_listing() {
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::from_secs(1));
        let t0 = Instant::now();
        c.listed("/", ["src", "dst"].into_iter(), t0);
        c.listed("/dst", [].into_iter(), t0);
        c.listed("/src", ["child"].into_iter(), t0);
        assert!(c.absent("/dst/child", t0));
        c.name_removed("/src");
        c.name_added("/dst");
        assert!(
            !c.absent("/dst/child", t0),
            "the empty directory's listing went"
        );
        assert!(!c.absent("/src/child", t0));
        assert_eq!(c.listed_names, 1, "the root's one name left");
    }

    #[test]
    fn a_failed_listing_is_not_asked_again_within_the_ttl() {
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::ZERO);
        let t0 = Instant::now();
        assert!(!c.should_list_parent("/d/a", t0));
        assert!(
            c.should_list_parent("/d/b", t0),
            "listed (and the listing failed)"
        );
        assert!(!c.should_list_parent("/d/c", t0), "the count starts over");
    }

    #[test]
    fn a_directory_is_listed_once_it_is_walked() {
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::from_secs(1));
        let t0 = Instant::now();
        assert!(
            !c.should_list_parent("/d/a", t0),
            "one lookup: ask for the name"
        );
        assert!(
            c.should_list_parent("/d/b", t0),
            "a second within the TTL: list"
        );
        assert!(!c.should_list_parent("/e/a", t0), "counted per directory");
        c.listed("/d", ["a"].into_iter(), t0);
        assert!(!c.should_list_parent("/d/c", t0), "listed: no need");
        let later = t0 + Duration::from_secs(2);
        assert!(
            !c.should_list_parent("/d/c", later),
            "the count starts again"
        );
        assert!(c.should_list_parent("/d/e", later));
    }

    #[test]
    fn a_directory_too_large_is_not_kept() {
        let mut c = AttrCache::new(Duration::from_secs(1), Duration::from_secs(1));
        let t0 = Instant::now();
        let names: Vec<String> = (0..=MAX_LISTED_NAMES).map(|i| format!("f{i}")).collect();
        c.listed("/big", names.iter().map(String::as_str), t0);
        assert!(!c.absent("/big/x", t0));
        let later = t0 + Duration::from_secs(5);
        assert!(
            !c.should_list_parent("/big/x", later) && !c.should_list_parent("/big/y", later),
            "a directory too large is not listed again soon"
        );
        assert_eq!(c.listed_names, 0, "and none of its names is kept");
        assert_eq!(parent_of("/big/x"), "/big");
        assert_eq!(parent_of("/x"), "/");
    }
}
