//! [`Shared`]: what the mount's callbacks and their tasks share (the client, the
//! inode and attribute caches, the open handles, the capacity cache), with the
//! lookups, attributes and directory listings the callbacks build their replies from.

use super::*;
use std::collections::HashMap;
/// Everything the callbacks and their tasks share.
pub(crate) struct Shared {
    pub(crate) client: Client,
    /// Where request tasks run.
    pub(crate) rt: tokio::runtime::Handle,
    pub(super) ttl: Duration,
    /// Inodes the kernel holds, with their paths; locked briefly, never across an await.
    pub(super) inodes: Mutex<Inodes>,
    /// Recent attributes by path; locked briefly, never across an await.
    pub(super) attrs: Mutex<AttrCache>,
    /// Open handles; locked briefly, never across an await.
    pub(crate) handles: Mutex<Handles>,
    /// Every request task, so unmount can wait for the ones in progress.
    pub(crate) tasks: TaskTracker,
    /// Woken whenever a write handle is closed and dropped: an append that found this
    /// mount's own earlier writer still holding the lease waits here for it.
    pub(super) released: tokio::sync::Notify,
    /// The cluster's capacity for `statfs`; locked briefly, never across an await.
    pub(super) capacity: Mutex<CapacityCache>,
    /// The root's last attributes from the master (see [`ROOT_ATTR_WAIT`]); locked
    /// briefly, never across an await.
    pub(super) root_attr: Mutex<Option<FileAttr>>,
    /// Moves on whenever bytes written in place (or a truncate) through this mount
    /// were flushed: readers opened before drop what they read ahead ([`write`]).
    pub(super) generation: std::sync::atomic::AtomicU64,
    /// The kernel side of the session, to drop what its page cache holds of a file
    /// ([`Shared::drop_page_cache`]); set once the session exists.
    pub(crate) kernel: std::sync::OnceLock<fuser::Notifier>,
    /// Per regular file (inode): the size last told to the kernel. A read that ends
    /// below it must not come back short: the kernel would fill the rest of its pages
    /// with zeros and show them ([`short_read_verdict`](super::read::short_read_verdict)).
    pub(super) told: Mutex<HashMap<u64, u64>>,
    /// The threads reading the kernel's requests ([`MountConfig::threads`]).
    pub(super) threads: usize,
    /// How many of them serve a request inline now (see `StampFs::inline`).
    pub(super) inline_busy: std::sync::atomic::AtomicUsize,
}

impl Shared {
    pub(crate) fn new(
        client: Client,
        rt: tokio::runtime::Handle,
        ttl: Duration,
        negative_ttl: Duration,
        threads: usize,
    ) -> Self {
        Self {
            client,
            rt,
            ttl,
            inodes: Mutex::new(Inodes::default()),
            attrs: Mutex::new(AttrCache::new(ttl, negative_ttl)),
            handles: Mutex::new(Handles::default()),
            tasks: TaskTracker::new(),
            released: tokio::sync::Notify::new(),
            capacity: Mutex::new(CapacityCache::new(CAPACITY_TTL, CAPACITY_TIMEOUT)),
            root_attr: Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
            kernel: std::sync::OnceLock::new(),
            told: Mutex::new(HashMap::new()),
            threads: threads.max(1),
            inline_busy: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Drops the kernel's cached pages and attributes of inode `ino`, in the
    /// background.
    ///
    /// Without direct I/O the kernel copies every `write(2)` into its page cache
    /// before the mount sees it, at the offset the kernel chose, and serves later reads
    /// of descriptors already open from there. That copy is wrong when the cluster
    /// refused the bytes (a writer fenced by a newer one: its bytes must never be read
    /// back), and when an `O_APPEND` write landed elsewhere than the kernel guessed
    /// (another client appended since the kernel last learned the length). A fresh
    /// open drops the cache anyway; this covers descriptors already open.
    ///
    /// Runs on a blocking thread. A `write` reply must never wait for it: the kernel
    /// holds the locks of the pages a write touches until that write is answered. A
    /// `flush`, `fsync` or release holds none, so their replies wait for it (see
    /// [`Shared::page_cache_dropped`]), and no program hears of a failed sync before
    /// the cache is gone.
    pub(super) fn drop_page_cache(&self, ino: u64) -> tokio::task::JoinHandle<()> {
        let kernel = self.kernel.get().cloned();
        self.tasks.spawn_blocking_on(
            move || {
                let Some(kernel) = kernel else {
                    return;
                };
                // ENOENT: the kernel has forgotten the inode, so it caches nothing.
                if let Err(e) = kernel.inval_inode(INodeNo(ino), 0, 0) {
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        tracing::debug!(ino, error = %e, "could not drop the kernel's cache");
                    }
                }
            },
            &self.rt,
        )
    }

    /// Waits for a [`Shared::drop_page_cache`], at most [`CACHE_DROP_WAIT`]: a write of
    /// another thread on the same descriptor can hold page locks while its task waits
    /// for the turn of the request that waits here; the bound breaks that cycle.
    pub(super) async fn page_cache_dropped(&self, dropping: tokio::task::JoinHandle<()>) {
        if tokio::time::timeout(CACHE_DROP_WAIT, dropping)
            .await
            .is_err()
        {
            tracing::debug!("the kernel is still dropping a file's cache; answering anyway");
        }
    }

    pub(super) fn path_of(&self, ino: INodeNo) -> Result<String, Errno> {
        lock(&self.inodes)
            .path(ino.0)
            .map(str::to_string)
            .ok_or(Errno::ENOENT)
    }

    /// The namespace path of `name` in directory `parent`, its length checked
    /// ([`checked_name`], [`checked_path`]).
    pub(super) fn child_path(&self, parent: INodeNo, name: &OsStr) -> Result<String, Errno> {
        let name = checked_name(name)?;
        let path = lock(&self.inodes)
            .child(parent.0, name)
            .ok_or(Errno::ENOENT)?;
        checked_path(path)
    }

    /// The attributes told to the kernel for `st` with `size`; remembers the size of a
    /// regular file (see [`Shared::told`]).
    pub(super) fn attr(&self, st: &FileStatus, size: u64) -> FileAttr {
        if st.kind == FileKind::File {
            lock(&self.told).insert(st.inode.0, size);
        }
        let a = &st.attr;
        let (kind, nlink) = match st.kind {
            FileKind::Directory => (FileType::Directory, 2),
            FileKind::File => (FileType::RegularFile, 1),
            FileKind::Symlink => (FileType::Symlink, 1),
        };
        let mtime = system_time(a.mtime_ns);
        FileAttr {
            ino: INodeNo(st.inode.0),
            size,
            blocks: size.div_ceil(512),
            atime: system_time(a.atime_ns),
            mtime,
            ctime: system_time(a.ctime_ns),
            crtime: mtime,
            kind,
            perm: (a.mode & stampfs_proto::MODE_BITS) as u16,
            nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        }
    }

    /// The size to show: what this mount's writer has produced if it is writing the
    /// file, else the cached or fetched size.
    pub(super) fn shown_size(&self, st: &FileStatus, size: u64) -> u64 {
        lock(&self.handles).local_size(st.inode.0).unwrap_or(size)
    }

    pub(super) fn cached(&self, path: &str) -> Option<Cached> {
        lock(&self.attrs).get(path, Instant::now())
    }

    pub(super) fn invalidate(&self, path: &str) {
        lock(&self.attrs).invalidate(path);
    }

    /// Whether `path` is known not to exist: its directory was listed within the TTL
    /// and the name is not in it (see [`AttrCache`]).
    pub(super) fn known_absent(&self, path: &str) -> bool {
        lock(&self.attrs).absent(path, Instant::now())
    }

    /// Records how a change of the name `path` by this mount went, for the listing of
    /// its directory: `Some(true)` made, `Some(false)` removed, `None` unknown (it
    /// failed).
    pub(super) fn name_changed(&self, path: &str, exists: Option<bool>) {
        let mut attrs = lock(&self.attrs);
        match exists {
            Some(true) => attrs.name_added(path),
            Some(false) => attrs.name_removed(path),
            None => attrs.name_unknown(path),
        }
    }

    /// Status and readable size of `path`, from the cache when fresh. A directory
    /// walked name by name is listed whole instead ([`AttrCache::should_list_parent`]):
    /// one `List` answers the lookups of the TTL that follows, the names it lacks
    /// included.
    pub(super) async fn status_and_size(&self, path: &str) -> Result<(FileStatus, u64), Errno> {
        if let Some(c) = self.cached(path) {
            return Ok((c.status, c.size));
        }
        if self.known_absent(path) {
            return Err(Errno::ENOENT);
        }
        let walked = lock(&self.attrs).should_list_parent(path, Instant::now());
        if walked && self.load_listing(parent_of(path)).await.is_ok() {
            if let Some(c) = self.cached(path) {
                return Ok((c.status, c.size));
            }
            if self.known_absent(path) {
                return Err(Errno::ENOENT);
            }
        }
        let st = self
            .client
            .stat(path)
            .await
            .map_err(|e| errno_for(&e, "stat", path))?;
        let size = self.visible_size(&st).await;
        lock(&self.attrs).put(st.clone(), size, Instant::now());
        Ok((st, size))
    }

    /// For a file another client is writing, the length readers can see (everything
    /// hflushed is on every replica); the committed length otherwise.
    pub(super) async fn visible_size(&self, st: &FileStatus) -> u64 {
        if st.kind != FileKind::File || st.state == FileState::Closed {
            return st.length;
        }
        if lock(&self.handles).local_size(st.inode.0).is_some() {
            return st.length;
        }
        match self.client.visible_length(&st.path).await {
            Ok(len) => len.max(st.length),
            Err(e) => {
                tracing::debug!(path = %st.path, error = %e, "visible length unknown; using the committed length");
                st.length
            }
        }
    }

    pub(super) fn reply_entry(&self, reply: ReplyEntry, st: &FileStatus, size: u64) {
        let attr = self.attr(st, self.shown_size(st, size));
        lock(&self.inodes).remember(st.inode.0, &st.path);
        reply.entry(&self.ttl, &attr, Generation(0));
    }

    /// Asks the master for the cluster's capacity, for at most [`CAPACITY_TIMEOUT`];
    /// on failure, the last known capacity (or zeros).
    #[tracing::instrument(skip_all)]
    pub(super) async fn fetch_capacity(&self) -> Capacity {
        let asked = tokio::time::timeout(CAPACITY_TIMEOUT, self.client.cluster_report()).await;
        let now = Instant::now();
        match asked {
            Ok(Ok(report)) => lock(&self.capacity).fetched(Capacity::from_report(&report), now),
            Ok(Err(e)) => {
                tracing::warn!(
                    error = %e,
                    "statfs: cannot get the cluster's capacity from the master; \
                     reporting the last known values (zeros if none)"
                );
                lock(&self.capacity).failed(now)
            }
            Err(_) => {
                tracing::warn!(
                    timeout = ?CAPACITY_TIMEOUT,
                    "statfs: the master did not report the cluster's capacity in time; \
                     reporting the last known values (zeros if none)"
                );
                lock(&self.capacity).failed(now)
            }
        }
    }

    #[tracing::instrument(skip_all, fields(ino = ino.0))]
    pub(super) async fn getattr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        if ino.0 != ROOT {
            return self.fresh_attr(ino).await;
        }
        let last = *lock(&self.root_attr);
        let fresh = match last {
            Some(_) => tokio::time::timeout(ROOT_ATTR_WAIT, self.fresh_attr(ino))
                .await
                .unwrap_or(Err(Errno::ETIMEDOUT)),
            None => self.fresh_attr(ino).await,
        };
        match (fresh, last) {
            (Ok(attr), _) => {
                *lock(&self.root_attr) = Some(attr);
                Ok(attr)
            }
            (Err(e), Some(last)) => {
                tracing::warn!(errno = ?e, "the master did not give the root's attributes in time; answering with the last known ones");
                Ok(last)
            }
            (Err(e), None) => Err(e),
        }
    }

    /// Fetches the root's attributes in the background (best effort), for
    /// [`ROOT_ATTR_WAIT`]'s fallback.
    pub(crate) fn prefetch_root_attr(self: &Arc<Self>) {
        let sh = self.clone();
        self.tasks.spawn_on(
            async move {
                if let Err(e) = sh.getattr(INodeNo(ROOT)).await {
                    tracing::debug!(errno = ?e, "could not learn the root's attributes yet");
                }
            },
            &self.rt,
        );
    }

    /// The attributes of `ino` as the master has them now.
    pub(super) async fn fresh_attr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let path = self.path_of(ino)?;
        let (st, size) = self.status_and_size(&path).await?;
        if st.inode.0 != ino.0 {
            // The path now names another file (replaced by another client).
            self.invalidate(&path);
            return Err(Errno::ESTALE);
        }
        Ok(self.attr(&st, self.shown_size(&st, size)))
    }

    /// Lists directory `dir` at the master, keeping what it says: the attributes of
    /// its entries and its names ([`Shared::absorb_listing`]).
    #[tracing::instrument(skip_all, fields(%dir))]
    async fn load_listing(&self, dir: &str) -> Result<(), Errno> {
        let asked = self.listing_asked();
        let entries = self
            .client
            .list(dir)
            .await
            .map_err(|e| errno_for(&e, "lookup", dir))?;
        self.absorb_listing(dir, &entries, asked);
        Ok(())
    }

    /// When a listing is asked for, and the count of this mount's changes then (see
    /// [`Shared::absorb_listing`]).
    fn listing_asked(&self) -> (Instant, u64) {
        (Instant::now(), lock(&self.attrs).changes())
    }

    /// Keeps a listing of `dir` asked for at `asked` ([`Shared::listing_asked`]): the
    /// attributes of its directories and closed files (files being written elsewhere
    /// need their visible length: not cached here) and its complete list of names,
    /// trusted from when it was asked. Not when this mount changed something since:
    /// the answer may have been built before that change (a name this mount just made
    /// would be missing from it).
    fn absorb_listing(&self, dir: &str, entries: &[FileStatus], asked: (Instant, u64)) {
        let (now, changes) = asked;
        let mut attrs = lock(&self.attrs);
        if attrs.changes() != changes {
            return;
        }
        for e in entries {
            if e.kind == FileKind::Directory || e.state == FileState::Closed {
                attrs.put(e.clone(), e.length, now);
            }
        }
        attrs.listed(dir, entries.iter().map(|e| base_name(&e.path)), now);
    }

    #[tracing::instrument(skip_all, fields(ino = d.ino))]
    pub(super) async fn list(&self, d: &DirHandle) -> Result<(), Errno> {
        let path = self.path_of(INodeNo(d.ino))?;
        let asked = self.listing_asked();
        let entries = self
            .client
            .list(&path)
            .await
            .map_err(|e| errno_for(&e, "readdir", &path))?;
        self.absorb_listing(&path, &entries, asked);
        let parent_ino = lock(&self.inodes).ino_of(parent_of(&path)).unwrap_or(ROOT);
        let mut out = vec![
            DirEntry {
                ino: d.ino,
                kind: FileType::Directory,
                name: ".".into(),
            },
            DirEntry {
                ino: parent_ino,
                kind: FileType::Directory,
                name: "..".into(),
            },
        ];
        for e in entries {
            let kind = match e.kind {
                FileKind::Directory => FileType::Directory,
                FileKind::File => FileType::RegularFile,
                FileKind::Symlink => FileType::Symlink,
            };
            out.push(DirEntry {
                ino: e.inode.0,
                kind,
                name: base_name(&e.path).to_string(),
            });
        }
        *lock(&d.entries) = out;
        Ok(())
    }

    pub(super) fn fill_dir(d: &DirHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = lock(&d.entries);
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, e) in entries.iter().enumerate().skip(skip) {
            if reply.add(INodeNo(e.ino), (i + 1) as u64, e.kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }
}
