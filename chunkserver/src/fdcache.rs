//! A bounded cache of open replica files, so a chunkserver is not limited to
//! `RLIMIT_NOFILE` replicas.
//!
//! A replica no longer owns a descriptor: it owns a [`FileId`] (a number unique to that
//! replica *instance*) and its path, and asks the store's [`FileCache`] for the file
//! when it does I/O. The cache keeps at most `capacity` files open, least recently used
//! first out ([`Lru`], over the `lru` crate); a miss reopens the path with [`open_replica`], the same
//! flags the store has always used (read/write, buffered: no `O_DIRECT`).
//!
//! - **In flight keeps it open.** [`FileCache::get`] hands out an `Arc<File>`; eviction
//!   only drops the cache's own `Arc`, so an operation in the kernel (an io_uring chain
//!   or a blocking-pool task holds its `Arc` until it completes) keeps its descriptor.
//!   The number of open replica descriptors can therefore exceed the capacity, but only
//!   by the operations in flight.
//! - **Identity, not path.** Every replica instance gets a fresh [`FileId`] (at load,
//!   creation, or when a received copy is renamed into place), and the store drops an
//!   instance's entry ([`FileCache::forget`]) when the instance goes (deleted, moved
//!   aside, replaced by a received copy). Paths change only under the replica's write
//!   lock and only by ending the instance, so a cached descriptor of an old inode is
//!   never handed out under a new identity, nor the reverse.
//! - **Capacity.** `--max-open-files`; 0 picks [`auto_capacity`]: half the soft open-file
//!   limit (the other half for sockets, the directory and the engines), at least 64.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Capacity of a [`crate::store::Store`] opened without
/// [`crate::store::Store::with_max_open_files`] (a chunkserver always sets it).
pub const DEFAULT_CAPACITY: usize = 1024;

/// The fewest files [`auto_capacity`] picks.
pub const AUTO_MIN: usize = 64;

/// `--max-open-files 0`: `max(64, soft / 2)` for the soft `RLIMIT_NOFILE` (`None`:
/// unlimited, taken as 2^20, Linux's default ceiling). The other half is left to
/// sockets (up to `--max-connections` clients, peers, the master), the engines and
/// short-lived opens (directory fsyncs, received copies).
pub fn auto_capacity(soft: Option<u64>) -> usize {
    let soft = soft.unwrap_or(stampfs_proto::limits::UNLIMITED_WANT);
    usize::try_from(soft / 2)
        .unwrap_or(usize::MAX)
        .max(AUTO_MIN)
}

/// Opens an existing replica file the way the store does: read/write, buffered.
pub fn open_replica(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// The identity of one replica instance in the cache (never reused by a store).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(u64);

/// A least-recently-used map of at most `capacity` entries (pure: no I/O): the `lru`
/// crate's map, with the evicted values handed back so the caller drops them (closing
/// descriptors) outside its lock.
#[derive(Debug)]
pub struct Lru<K: Hash + Eq, V> {
    inner: lru::LruCache<K, V>,
}

fn non_zero(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

impl<K: Copy + Eq + Hash, V: Clone> Lru<K, V> {
    /// An empty map holding at most `capacity` (at least 1) entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: lru::LruCache::new(non_zero(capacity)),
        }
    }

    /// The most entries kept.
    pub fn capacity(&self) -> usize {
        self.inner.cap().get()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// The value of `key`, now the most recently used.
    pub fn get(&mut self, key: K) -> Option<V> {
        self.inner.get(&key).cloned()
    }

    /// Inserts `value` for `key` unless it is there already; returns the value now
    /// held (the existing one wins) and the entries evicted to make room.
    pub fn insert(&mut self, key: K, value: V) -> (V, Vec<V>) {
        if let Some(held) = self.get(key) {
            return (held, Vec::new());
        }
        // `key` is not held, so what `push` hands back is the evicted entry.
        let evicted = self.inner.push(key, value.clone()).map(|(_, v)| v);
        (value, evicted.into_iter().collect())
    }

    /// Whether `key` is held (not a use).
    pub fn contains(&self, key: K) -> bool {
        self.inner.contains(&key)
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: K) -> Option<V> {
        self.inner.pop(&key)
    }

    /// Changes the capacity (at least 1); returns the entries evicted.
    pub fn set_capacity(&mut self, capacity: usize) -> Vec<V> {
        let capacity = non_zero(capacity);
        let mut evicted = Vec::new();
        while self.inner.len() > capacity.get() {
            match self.inner.pop_lru() {
                Some((_, v)) => evicted.push(v),
                None => break,
            }
        }
        self.inner.resize(capacity);
        evicted
    }
}

/// The open replica files of one store (see the module docs).
pub struct FileCache {
    /// The files kept open. Held only to look up, insert or remove, never across I/O
    /// or an `.await`.
    files: Mutex<Lru<FileId, Arc<File>>>,
    next_id: AtomicU64,
    /// Misses that opened a file again (see [`FileCache::reopened`]).
    reopened: AtomicU64,
}

impl std::fmt::Debug for FileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let files = lock(&self.files);
        f.debug_struct("FileCache")
            .field("capacity", &files.capacity())
            .field("open", &files.len())
            .finish()
    }
}

impl FileCache {
    /// An empty cache keeping at most `capacity` (at least 1) files open.
    pub fn new(capacity: usize) -> Self {
        Self {
            files: Mutex::new(Lru::new(capacity)),
            next_id: AtomicU64::new(0),
            reopened: AtomicU64::new(0),
        }
    }

    /// A new replica identity.
    pub fn next_id(&self) -> FileId {
        FileId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// The most files kept open.
    pub fn capacity(&self) -> usize {
        lock(&self.files).capacity()
    }

    /// Files the cache holds open now (operations in flight may hold more).
    pub fn open_files(&self) -> usize {
        lock(&self.files).len()
    }

    /// Changes the capacity, closing the least recently used files beyond it (those in
    /// use stay open until their operations finish).
    pub fn set_capacity(&self, capacity: usize) {
        let evicted = lock(&self.files).set_capacity(capacity);
        drop(evicted);
    }

    /// The open file of replica `id` at `path`: from the cache, or reopened (off the
    /// async threads) and cached, evicting the least recently used file if full.
    pub async fn get(&self, id: FileId, path: &Path) -> Result<Arc<File>> {
        self.get_or_open(id, || path.to_path_buf()).await
    }

    /// [`FileCache::get`] with the path made only on a miss (a hit costs one lookup).
    pub async fn get_or_open(
        &self,
        id: FileId,
        path: impl FnOnce() -> PathBuf,
    ) -> Result<Arc<File>> {
        if let Some(file) = lock(&self.files).get(id) {
            return Ok(file);
        }
        let path = path();
        let owned = path.clone();
        let file = tokio::task::spawn_blocking(move || open_replica(&owned))
            .await
            .map_err(|e| Error::io("open", &path, std::io::Error::other(e.to_string())))?
            .map_err(|e| Error::io("open", &path, e))?;
        self.reopened.fetch_add(1, Ordering::Relaxed);
        Ok(self.insert(id, Arc::new(file)))
    }

    /// Files opened on a miss so far: every one is a replica whose descriptor had been
    /// evicted (or never opened since start-up) and was reopened by path.
    pub fn reopened(&self) -> u64 {
        self.reopened.load(Ordering::Relaxed)
    }

    /// Caches `file` (already open, e.g. just created) as replica `id`'s; returns the
    /// file now cached for `id` (an existing entry wins).
    pub fn insert(&self, id: FileId, file: Arc<File>) -> Arc<File> {
        let (held, evicted) = lock(&self.files).insert(id, file);
        // Closed outside the lock (unless an operation still holds them).
        drop(evicted);
        held
    }

    /// Whether replica `id`'s file is cached (without counting as a use).
    pub fn holds(&self, id: FileId) -> bool {
        lock(&self.files).contains(id)
    }

    /// Drops replica `id`'s entry: its instance is gone (deleted, moved aside,
    /// replaced). The descriptor closes once no operation holds it.
    pub fn forget(&self, id: FileId) {
        let gone = lock(&self.files).remove(id);
        drop(gone);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The map is consistent after any panic in these short sections.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut lru = Lru::new(3);
        for k in 1..=3 {
            assert!(lru.insert(k, k * 10).1.is_empty());
        }
        // Using 1 makes 2 the oldest.
        assert_eq!(lru.get(1), Some(10));
        assert_eq!(lru.insert(4, 40).1, vec![20]);
        assert_eq!(lru.get(2), None);
        assert_eq!(lru.insert(5, 50).1, vec![30]);
        assert_eq!(
            (lru.get(1), lru.get(4), lru.get(5)),
            (Some(10), Some(40), Some(50))
        );
        assert_eq!(lru.len(), 3);
    }

    #[test]
    fn it_never_holds_more_than_its_capacity() {
        let mut lru = Lru::new(16);
        for k in 0..1000u32 {
            lru.insert(k, k);
            if k % 7 == 0 {
                lru.get(k / 2);
            }
            assert!(lru.len() <= 16);
        }
        assert_eq!(lru.len(), 16);
        assert_eq!(Lru::<u32, u32>::new(0).capacity(), 1, "at least one");
    }

    #[test]
    fn an_existing_entry_wins_over_a_second_insert() {
        let mut lru = Lru::new(2);
        lru.insert(1, "first");
        assert_eq!(lru.insert(1, "second"), ("first", Vec::new()));
        assert_eq!(lru.len(), 1);
    }

    #[test]
    fn a_removed_entry_is_gone_and_frees_its_place() {
        let mut lru = Lru::new(2);
        lru.insert(1, 1);
        lru.insert(2, 2);
        assert_eq!(lru.remove(1), Some(1));
        assert_eq!(lru.remove(1), None);
        assert!(lru.insert(3, 3).1.is_empty());
        assert_eq!(lru.get(1), None);
        assert_eq!(lru.len(), 2);
    }

    #[test]
    fn lowering_the_capacity_evicts_the_oldest() {
        let mut lru = Lru::new(4);
        for k in 1..=4 {
            lru.insert(k, k);
        }
        lru.get(1);
        let mut evicted = lru.set_capacity(2);
        evicted.sort();
        assert_eq!(evicted, vec![2, 3]);
        assert_eq!((lru.get(1), lru.get(4)), (Some(1), Some(4)));
    }

    #[test]
    fn auto_capacity_is_half_the_soft_limit_and_at_least_64() {
        assert_eq!(auto_capacity(Some(1024)), 512);
        assert_eq!(auto_capacity(Some(524_288)), 262_144);
        assert_eq!(auto_capacity(Some(100)), 64);
        assert_eq!(auto_capacity(None), 1 << 19);
    }

    #[tokio::test]
    async fn a_file_in_use_stays_open_after_its_eviction() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"aaaa").expect("write a");
        std::fs::write(&b, b"bbbb").expect("write b");
        let cache = FileCache::new(1);
        let (ia, ib) = (cache.next_id(), cache.next_id());
        let in_flight = cache.get(ia, &a).await.expect("open a");
        // Opening b evicts a; the operation's Arc still reads a's inode.
        let fb = cache.get(ib, &b).await.expect("open b");
        assert_eq!(cache.open_files(), 1);
        assert_eq!(
            Arc::strong_count(&in_flight),
            1,
            "only the operation holds a"
        );
        std::fs::remove_file(&a).expect("unlink a");
        let mut buf = [0u8; 4];
        in_flight.read_exact_at(&mut buf, 0).expect("read evicted");
        assert_eq!(&buf, b"aaaa");
        // A hit returns the same descriptor; a forgotten id is reopened by path.
        assert!(Arc::ptr_eq(&fb, &cache.get(ib, &b).await.expect("hit")));
        cache.forget(ib);
        assert_eq!(cache.open_files(), 0);
        assert!(!Arc::ptr_eq(&fb, &cache.get(ib, &b).await.expect("reopen")));
        // A missing file is an I/O error naming the open.
        let err = cache.get(ia, &a).await.unwrap_err();
        assert!(matches!(err, Error::Io { op: "open", .. }), "{err}");
    }
}
