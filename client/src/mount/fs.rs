//! [`StampFs`]: the fuser callbacks, and [`Shared`]: the state and the async work
//! behind them.
//!
//! fuser calls [`StampFs`] on its request threads (`MountConfig::threads`). A callback
//! answers from memory when it can (cached attributes, directory snapshots). Otherwise
//! a namespace request is served to its end on that thread ([`StampFs::inline`]: the
//! thread's own runtime; DESIGN.md "The mount's request path"), and a request on an
//! open file (read, write, open, flush, fsync, release, truncate) goes with its
//! `Reply*` object to a task on the mount's runtime ([`StampFs::spawn`]), which replies
//! when the cluster has answered: a slow read holds no thread.

use super::capacity::{Capacity, CapacityCache, Lookup};
use super::errno::errno_for;
use super::handles::{
    settles_at_once, DirEntry, DirHandle, Handle, Handles, ReadHandle, WriteHandle, WriteState,
};
use super::inodes::{base_name, parent_of, AttrCache, Cached, Inodes, ROOT};
use crate::client::{Client, CreateOptions};
use crate::error::Error;
use crate::reader::FileReader;
use crate::writer::FileWriter;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use stampfs_proto::{FileKind, FileState, FileStatus, RemoteError, SetTime};
use std::ffi::OsStr;
use std::future::Future;
use std::io::SeekFrom;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio_util::task::TaskTracker;
use write::AttrChange;

mod attrs;
mod links;
mod namespace;
mod read;
mod shared;
mod write;
mod xattr;

use attrs::{caller_of, epoch_ns, new_attr, system_time};
use read::read_from;
pub(crate) use shared::Shared;

/// `st_blksize`: tools size their buffers from it (`cp` then writes 1 MiB at a time).
const BLKSIZE: u32 = 1 << 20;
/// Largest read served in one request (the kernel asks for at most 1 MiB).
const MAX_READ: u32 = 32 << 20;
/// Read-ahead the kernel may do per file.
const READAHEAD: u32 = 1 << 20;
/// How long an append waits for this mount's own earlier writer of the file to close.
const OWN_WRITER_WAIT: Duration = Duration::from_secs(5);
/// How long the cluster's capacity (and a failure to learn it) is reused by `statfs`:
/// `df` in a loop asks the master at most this often.
const CAPACITY_TTL: Duration = Duration::from_secs(2);
/// How long a `statfs` waits for the master before answering with the last known
/// capacity (or zeros): `df` never hangs on an unreachable master.
const CAPACITY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a getattr of the mount's root waits for the master before answering with
/// the root's last known attributes: the root always exists, and `df`, `ls -d` and shell
/// prompts stat it, so they must not hang on an unreachable master.
const ROOT_ATTR_WAIT: Duration = Duration::from_secs(1);
/// How long a failed `flush`/`fsync` waits for the kernel to drop the file's cached
/// pages before answering (see [`Shared::page_cache_dropped`]).
const CACHE_DROP_WAIT: Duration = Duration::from_secs(1);
/// Longest name component (`f_namemax`), as the master enforces it.
const NAME_MAX: u32 = stampfs_proto::path::MAX_COMPONENT_LEN as u32;

/// Locks a mutex that only guards plain bookkeeping: a panic elsewhere cannot leave it
/// half-updated in a way worth refusing service for.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A name the kernel handed us, as the master takes it: `ENAMETOOLONG` past
/// [`NAME_MAX`] bytes (every operation that takes a name: lookup, create, mknod,
/// mkdir, rename, unlink, rmdir, symlink, link), `EINVAL` when it is not UTF-8.
fn checked_name(name: &OsStr) -> Result<&str, Errno> {
    if name.len() > NAME_MAX as usize {
        return Err(Errno::ENAMETOOLONG);
    }
    name.to_str().ok_or(Errno::EINVAL)
}

/// `path` unless it is longer than the master takes (`ENAMETOOLONG`).
fn checked_path(path: String) -> Result<String, Errno> {
    if path.len() > stampfs_proto::path::MAX_PATH_LEN {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(path)
}

/// Answers a `statfs` with the cluster's raw capacity in [`BLKSIZE`] blocks (see
/// [`super::capacity`]).
///
/// File counts are reported as 0 total and 0 free: stampfs has no inode table that
/// can fill up (the master's namespace grows with its memory), and 0/0 is how Linux
/// file systems without a fixed inode count (btrfs, many network and FUSE file
/// systems) say "not counted"; `df -i` then shows zeros. Inventing a large free
/// count would promise something the master never checks.
fn reply_statfs(reply: ReplyStatfs, capacity: Capacity) {
    let b = capacity.blocks(BLKSIZE);
    reply.statfs(b.total, b.free, b.avail, 0, 0, BLKSIZE, NAME_MAX, BLKSIZE);
}

/// A FUSE thread serving a request inline ([`StampFs::inline`]); given back on drop.
struct InlineSlot<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InlineSlot<'a> {
    /// A slot unless taking it would leave fewer than one of the `threads` free.
    fn take(shared: &'a Shared) -> Option<Self> {
        use std::sync::atomic::Ordering;
        let busy = &shared.inline_busy;
        let before = busy.fetch_add(1, Ordering::AcqRel);
        if before + 1 >= shared.threads {
            busy.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(InlineSlot(busy))
    }
}

impl Drop for InlineSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The fuser file system: thin callbacks over [`Shared`].
pub(crate) struct StampFs {
    pub(crate) shared: Arc<Shared>,
}

impl StampFs {
    /// Runs a request on the runtime; its reply is sent from there.
    fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.shared.tasks.spawn_on(fut, &self.shared.rt);
    }

    /// [`StampFs::spawn`] for a namespace change: the task's requests to the master
    /// go as the process that made `req` ([`caller_of`]), so the master checks its
    /// permissions and the entries it creates are its own. Opens are the kernel's to
    /// check (`default_permissions`): reads and the write lease a handle takes at its
    /// first write go as the mount, so a file created read-only (as git creates its
    /// objects) can still be written through the descriptor that created it.
    fn spawn_as<F>(&self, req: &Request, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let caller = caller_of(req);
        self.spawn(crate::client::REQUEST_CALLER.scope(caller, fut));
    }

    /// Runs a namespace request to its end on this FUSE thread's own runtime, which
    /// answers the kernel from here (see `client/inline.rs`): a request that needs only
    /// the master crosses no thread of the mount. Unless it would leave no thread free
    /// to read the next request (with one thread, always): then it runs as a task, as
    /// reads and writes do, so requests waiting for the master never hold up the ones
    /// that need only the open files.
    fn inline<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(_slot) = InlineSlot::take(&self.shared) else {
            return self.spawn(fut);
        };
        let run = std::panic::AssertUnwindSafe(|| crate::client::inline::block_on(fut));
        match std::panic::catch_unwind(run) {
            Ok(Ok(())) => {}
            // The request (and its reply) was dropped unanswered: fuser answers EIO.
            Ok(Err(e)) => tracing::error!(error = %e, "cannot build the FUSE thread's runtime"),
            Err(_) => tracing::error!("a namespace request panicked; it was answered EIO"),
        }
    }

    /// [`StampFs::inline`] as the process that made `req` (see [`StampFs::spawn_as`]).
    fn inline_as<F>(&self, req: &Request, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let caller = caller_of(req);
        self.inline(crate::client::REQUEST_CALLER.scope(caller, fut));
    }

    fn handle(&self, fh: FileHandle) -> Option<Handle> {
        lock(&self.shared.handles).get(fh.0)
    }
}

impl fuser::Filesystem for StampFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_readahead(READAHEAD) {
            let _ = config.set_max_readahead(max);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = match self.shared.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if let Some(c) = self.shared.cached(&path) {
            return self.shared.reply_entry(reply, &c.status, c.size);
        }
        if self.shared.known_absent(&path) {
            return reply.error(Errno::ENOENT);
        }
        let sh = self.shared.clone();
        self.inline(async move {
            match sh.status_and_size(&path).await {
                Ok((st, size)) => sh.reply_entry(reply, &st, size),
                Err(e) => reply.error(e),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut inodes = lock(&self.shared.inodes);
        inodes.forget(ino.0, nlookup);
        if inodes.path(ino.0).is_none() {
            lock(&self.shared.told).remove(&ino.0);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let sh = self.shared.clone();
        self.inline(async move {
            match sh.getattr(ino).await {
                Ok(attr) => reply.attr(&sh.ttl, &attr),
                Err(e) => reply.error(e),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Creation time and BSD flags are not stored: refused, never dropped. The
        // change time is the master's (Linux never sends one).
        if crtime.is_some() || flags.is_some() {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let time = |t: Option<TimeOrNow>| -> Result<Option<SetTime>, Errno> {
            Ok(match t {
                None => None,
                Some(TimeOrNow::Now) => Some(SetTime::Now),
                Some(TimeOrNow::SpecificTime(t)) => Some(SetTime::At(epoch_ns(t)?)),
            })
        };
        let change = match (time(atime), time(mtime)) {
            (Ok(atime), Ok(mtime)) => AttrChange {
                mode: mode.map(|m| m & stampfs_proto::MODE_BITS),
                uid,
                gid,
                atime,
                mtime,
            },
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let sh = self.shared.clone();
        let work = async move {
            match sh.setattr(ino, size, change).await {
                Ok(attr) => reply.attr(&sh.ttl, &attr),
                Err(e) => reply.error(e),
            }
        };
        if size.is_none() && mtime.is_none() {
            self.inline_as(req, work);
        } else {
            // A truncate or a set modification time concerns this mount's writers
            // (runtime tasks): served among them.
            self.spawn_as(req, work);
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let path = match self.shared.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let attr = new_attr(req, mode, umask);
        let sh = self.shared.clone();
        self.inline_as(req, async move {
            match sh.mknod(path, attr).await {
                Ok(st) => sh.reply_entry(reply, &st, 0),
                Err(e) => reply.error(e),
            }
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let path = match self.shared.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let attr = new_attr(req, mode, umask);
        let sh = self.shared.clone();
        self.inline_as(req, async move {
            match sh.mkdir(path, attr).await {
                Ok(st) => sh.reply_entry(reply, &st, 0),
                Err(e) => reply.error(e),
            }
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.shared.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let sh = self.shared.clone();
        self.inline_as(req, async move {
            match sh.remove(path, "unlink").await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.shared.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let sh = self.shared.clone();
        self.inline_as(req, async move {
            match sh.remove(path, "rmdir").await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let path = match self.shared.child_path(parent, link_name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let attr = new_attr(req, 0o777, 0);
        let (sh, target) = (self.shared.clone(), target.to_path_buf());
        self.inline_as(req, async move {
            match sh.symlink(path, &target, attr).await {
                Ok(st) => {
                    let size = st.length;
                    sh.reply_entry(reply, &st, size)
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let path = match self.shared.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let sh = self.shared.clone();
        self.inline(async move {
            match sh.readlink(path).await {
                Ok(target) => reply.data(target.as_bytes()),
                Err(e) => reply.error(e),
            }
        });
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // No hard links either (EPERM, as link(2) says for such a file system).
        match self.shared.child_path(newparent, newname) {
            Ok(_) => reply.error(Errno::EPERM),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = match (
            self.shared.child_path(parent, name),
            self.shared.child_path(newparent, newname),
        ) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return reply.error(Errno::EINVAL);
        }
        let replace = !flags.contains(RenameFlags::RENAME_NOREPLACE);
        let sh = self.shared.clone();
        self.inline_as(req, async move {
            match sh.rename(from, to, replace).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let path = match self.shared.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let sh = self.shared.clone();
        if flags.acc_mode() == OpenAccMode::O_RDONLY {
            self.spawn(async move {
                match sh.open_read(ino, path).await {
                    Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                    Err(e) => reply.error(e),
                }
            });
            return;
        }
        let append_mode = flags.0 & libc::O_APPEND != 0;
        let truncate = flags.0 & libc::O_TRUNC != 0;
        self.spawn(async move {
            match sh.open_write(ino, path, append_mode, truncate).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let sh = self.shared.clone();
        match self.handle(fh) {
            Some(Handle::Read(h)) => self.spawn(async move {
                match sh.read(&h, offset, size).await {
                    Ok(data) => reply.data(&data),
                    Err(e) => reply.error(e),
                }
            }),
            Some(Handle::Write(h)) => self.spawn(async move {
                match sh.read_rw(&h, offset, size).await {
                    Ok(data) => reply.data(&data),
                    Err(e) => reply.error(e),
                }
            }),
            Some(Handle::Dir(_)) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::EBADF),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(Handle::Write(h)) = self.handle(fh) else {
            return reply.error(Errno::EBADF);
        };
        h.wrote.store(true, Ordering::SeqCst);
        // The ticket is taken here, in the kernel's order; the task waits its turn.
        let ticket = h.turn.ticket();
        let data = data.to_vec();
        let sh = self.shared.clone();
        self.spawn(async move {
            let _turn = h.turn.enter(ticket).await;
            match sh.write(&h, offset, &data).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let Some(Handle::Write(h)) = self.handle(fh) else {
            return reply.ok();
        };
        if settles_at_once(h.wrote.load(Ordering::SeqCst)) {
            return reply.ok();
        }
        let ticket = h.turn.ticket();
        let sh = self.shared.clone();
        self.spawn(async move {
            let _turn = h.turn.enter(ticket).await;
            match sh.flush(&h, false).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let Some(Handle::Write(h)) = self.handle(fh) else {
            lock(&self.shared.handles).remove(fh.0);
            return reply.ok();
        };
        if settles_at_once(h.wrote.load(Ordering::SeqCst)) {
            // No writer, no lease: nothing to close at the master. A task still
            // serving an fsync of this handle holds its own reference.
            self.shared.drop_writer(fh.0);
            return reply.ok();
        }
        let ticket = h.turn.ticket();
        let sh = self.shared.clone();
        self.spawn(async move {
            let _turn = h.turn.enter(ticket).await;
            sh.close_writer(&h).await;
            sh.drop_writer(fh.0);
            sh.invalidate(&h.path);
            reply.ok();
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(Handle::Write(h)) = self.handle(fh) else {
            return reply.ok();
        };
        let ticket = h.turn.ticket();
        let sh = self.shared.clone();
        self.spawn(async move {
            let _turn = h.turn.enter(ticket).await;
            match sh.flush(&h, true).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let d = DirHandle {
            ino: ino.0,
            entries: Mutex::new(Vec::new()),
        };
        let fh = lock(&self.shared.handles).insert(Handle::Dir(Arc::new(d)));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let Some(Handle::Dir(d)) = self.handle(fh) else {
            return reply.error(Errno::EBADF);
        };
        if offset > 0 {
            return Shared::fill_dir(&d, offset, reply);
        }
        let sh = self.shared.clone();
        self.inline(async move {
            match sh.list(&d).await {
                Ok(()) => Shared::fill_dir(&d, 0, reply),
                Err(e) => reply.error(e),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.shared.handles).remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are durable at the master before it answers.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let lookup = lock(&self.shared.capacity).lookup(Instant::now());
        match lookup {
            Lookup::Answer(capacity) => reply_statfs(reply, capacity),
            Lookup::Fetch => {
                let sh = self.shared.clone();
                self.inline(async move {
                    let capacity = sh.fetch_capacity().await;
                    reply_statfs(reply, capacity);
                });
            }
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Some(name) = name.to_str().filter(|n| n.starts_with(xattr::USER)) else {
            // Only user.* is stored: nothing to ask the master for.
            return reply.error(Errno::NO_XATTR);
        };
        let path = match self.shared.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let (sh, name) = (self.shared.clone(), name.to_string());
        self.inline(async move {
            match sh.getxattr(path, name).await {
                Ok(v) => xattr::reply_sized(reply, size, &v),
                Err(e) => reply.error(e),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let path = match self.shared.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let sh = self.shared.clone();
        self.inline(async move {
            match sh.listxattr(path).await {
                Ok(v) => xattr::reply_sized(reply, size, &v),
                Err(e) => reply.error(e),
            }
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let Some(name) = name.to_str().filter(|n| n.starts_with(xattr::USER)) else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        let how = match xattr::how(flags) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        if name.len() > stampfs_proto::MAX_XATTR_NAME {
            return reply.error(Errno::ERANGE);
        }
        if value.len() > stampfs_proto::MAX_XATTR_BYTES {
            return reply.error(Errno::E2BIG);
        }
        let path = match self.shared.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let (sh, name, value) = (self.shared.clone(), name.to_string(), value.to_vec());
        self.inline_as(req, async move {
            match sh.setxattr(path, name, Some(value), how).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(name) = name.to_str().filter(|n| n.starts_with(xattr::USER)) else {
            return reply.error(Errno::NO_XATTR);
        };
        let path = match self.shared.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let (sh, name) = (self.shared.clone(), name.to_string());
        self.inline_as(req, async move {
            match sh
                .setxattr(path, name, None, stampfs_proto::XattrSet::Any)
                .await
            {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let path = match self.shared.child_path(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let append_mode = flags & libc::O_APPEND != 0;
        let exclusive = flags & libc::O_EXCL != 0;
        let attr = new_attr(req, mode, umask);
        let sh = self.shared.clone();
        self.inline_as(req, async move {
            match sh.create(path, append_mode, attr).await {
                Ok((st, fh)) => {
                    let attr = sh.attr(&st, 0);
                    lock(&sh.inodes).remember(st.inode.0, &st.path);
                    reply.created(
                        &sh.ttl,
                        &attr,
                        Generation(0),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    );
                }
                // The kernel thought the name free (a negative answer from a listing,
                // or another client's create in between) and open(2) without O_EXCL
                // must open the file: ESTALE makes the kernel look the name up again
                // (the failed create dropped the listing) and open what it finds, with
                // its own permission checks and symbolic links followed.
                Err(Errno::EEXIST) if !exclusive => reply.error(Errno::ESTALE),
                Err(e) => reply.error(e),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn a_name_of_255_bytes_is_taken() {
        let name = "x".repeat(255);
        assert_eq!(checked_name(OsStr::new(&name)), Ok(name.as_str()));
    }

    #[test]
    fn a_name_over_255_bytes_is_enametoolong() {
        assert_eq!(
            checked_name(OsStr::new(&"x".repeat(256))),
            Err(Errno::ENAMETOOLONG)
        );
        // Bytes, not characters: 128 two-byte characters are 256 bytes.
        assert_eq!(
            checked_name(OsStr::new(&"é".repeat(128))),
            Err(Errno::ENAMETOOLONG)
        );
    }

    #[test]
    fn a_name_that_is_not_utf8_is_einval() {
        assert_eq!(
            checked_name(OsStr::from_bytes(b"a\xffb")),
            Err(Errno::EINVAL)
        );
        // Too long wins over not UTF-8.
        assert_eq!(
            checked_name(OsStr::from_bytes(&[0xff; 300])),
            Err(Errno::ENAMETOOLONG)
        );
    }

    #[test]
    fn a_path_over_4096_bytes_is_enametoolong() {
        let max = format!("/{}", "a".repeat(stampfs_proto::path::MAX_PATH_LEN - 1));
        assert_eq!(checked_path(max.clone()), Ok(max.clone()));
        assert_eq!(checked_path(max + "b"), Err(Errno::ENAMETOOLONG));
    }
}
