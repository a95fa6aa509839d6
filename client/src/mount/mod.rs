//! The FUSE mount: a stampfs cluster as a local directory, built on [`Client`] (no
//! second implementation of the protocol) and the pure-Rust `fuser` crate (as root it
//! mounts through `/dev/fuse` directly, no libfuse or fusermount needed).
//!
//! [`Mount::start`] mounts and serves; [`Mount::ended`] resolves when someone runs
//! `umount`; [`Mount::unmount`] unmounts, waits for the requests in progress and closes
//! every file still open for writing.
//!
//! What a program sees:
//! - **Writes anywhere.** A write may go anywhere in the file and at or past its end
//!   (a gap reads as zeros); `truncate`, `ftruncate` and `O_TRUNC` set any size.
//!   `O_APPEND` writes always go to the end. A program reads what it wrote through the mount, in place
//!   too (the writer is hflushed before the read).
//! - **Durability.** `close(2)` (FUSE `flush`) is [`FileWriter::hflush`]: the bytes
//!   are on every replica and visible to every reader. `fsync` is
//!   [`FileWriter::hsync`]. The last close of a file (FUSE `release`) closes the
//!   writer: the length is committed and the lease released.
//! - **Sizes of open files.** A file this mount is writing shows the bytes written so
//!   far (what a local file system would show the writer). A file another client is
//!   writing shows what readers can read: its hflushed length.
//! - **Caching.** Attributes and directory entries are cached for a short TTL (1 s by
//!   default) by the kernel and here; a listing fills the cache so `ls -l` costs one
//!   request. Reads go through the page cache and each open file's [`FileReader`]
//!   with its read-ahead buffer.
//! - **Concurrency.** [`MountConfig::threads`] threads read the kernel's requests.
//!   A namespace request (lookup, getattr, create, mkdir, unlink, rename, readdir,
//!   xattrs, chmod...) is served to its end on the thread that read it, on a
//!   current-thread runtime of that thread's own, as mfsmount's workers do: the
//!   master's reply wakes the thread that answers the kernel, with no hand-off
//!   between threads. One thread always stays free to read: a namespace request that
//!   would take the last one runs as a task instead (with one thread, every request
//!   does). Reads, writes, opens, flushes and truncates always run as tasks on the
//!   mount's runtime, which answer when done: a slow read holds no thread, a master
//!   that does not answer holds up no read of an open file, and any number of files
//!   can be open.
//! - **Crashes.** If the mount process dies, its leases lapse and the files it was
//!   writing are closed by lease recovery (`stampfs recover PATH`, or the master on
//!   its own after the hard limit), keeping every acknowledged byte.
//! - **`df`.** `statfs` reports the cluster's raw space, as HDFS's `dfs -df` and a
//!   MooseFS mount do: the capacity and used bytes of the live chunkservers, summed
//!   (every replica counts). It comes from the master's cluster report, cached for
//!   2 s; when the master does not answer within 1 s, the last known values (or
//!   zeros) are reported instead of an error. Inode counts are not reported (zero).
//! - **Mount points.** [`Mount::start`] refuses a non-empty directory (unless
//!   [`MountConfig::nonempty`]), a live stampfs mount and a stale FUSE mount whose
//!   server died, each as [`Error::Mountpoint`] with its [`MountpointProblem`].
//! - **Names.** A name over 255 bytes is `ENAMETOOLONG` in every operation that takes
//!   one.
//!
//! [`FileWriter::hflush`]: crate::FileWriter::hflush
//! [`FileWriter::hsync`]: crate::FileWriter::hsync
//! [`FileReader`]: crate::FileReader

mod capacity;
mod errno;
mod fs;
mod handles;
mod inodes;
mod mountpoint;

use crate::client::Client;
use crate::error::{Error, Result};
use fs::{Shared, StampFs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

pub use mountpoint::{resolve as resolve_mountpoint, MountpointProblem};

/// Checks that `mountpoint` may be mounted on, as [`Mount::start`] does first (an
/// empty directory, any directory with `nonempty`, not a stampfs mount already, live
/// or stale), and returns it resolved. Needs no cluster: a command can refuse a bad
/// mount point before it connects.
pub async fn check_mountpoint(mountpoint: &Path, nonempty: bool) -> Result<PathBuf> {
    let resolved = mountpoint::resolve(mountpoint)?;
    mountpoint::check(&resolved, nonempty)
        .await
        .map_err(|problem| Error::Mountpoint {
            path: resolved.clone(),
            problem,
        })?;
    Ok(resolved)
}

/// Settings of a [`Mount`].
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// How long the kernel and the mount trust attributes and directory entries.
    pub attr_ttl: Duration,
    /// How long the mount takes a name missing from a listing of its directory not to
    /// exist (answering the lookup without the master); zero: never.
    pub negative_ttl: Duration,
    /// How long [`Mount::unmount`] waits for requests in progress, then for open
    /// writers to close.
    pub drain_timeout: Duration,
    /// The mount's source name in `/proc/mounts`.
    pub fsname: String,
    /// Mount over a directory that is not empty (hiding what it holds until the
    /// unmount), as libfuse's `-o nonempty`; refused otherwise.
    pub nonempty: bool,
    /// Threads reading requests from the kernel; at least 1. All but one serve
    /// namespace requests to their end themselves (see "Concurrency" above); the last
    /// free one hands them to the runtime.
    pub threads: usize,
    /// Other users may use the mount (`-o allow_other`), each with their own
    /// permissions: the kernel checks the stored modes (`default_permissions`) and
    /// the master checks namespace changes for the calling process's identity.
    pub allow_other: bool,
}

impl Default for MountConfig {
    fn default() -> Self {
        Self {
            attr_ttl: Duration::from_secs(1),
            negative_ttl: Duration::ZERO,
            drain_timeout: Duration::from_secs(30),
            fsname: "stampfs".to_string(),
            threads: 4,
            nonempty: false,
            allow_other: false,
        }
    }
}

/// A mounted stampfs. Unmount it with [`Mount::unmount`]; dropping it unmounts too,
/// but without closing the files still open for writing.
pub struct Mount {
    mountpoint: PathBuf,
    config: MountConfig,
    shared: Arc<Shared>,
    /// Unmounts the kernel mount; fuser's handle, shared with its session.
    unmounter: fuser::SessionUnmounter,
    /// Fires when the session loop ends (the file system was unmounted, by us or by
    /// `umount`); `None` once that was seen.
    session_done: Option<oneshot::Receiver<std::io::Result<()>>>,
    /// Set by `unmount`, so `Drop` has nothing left to do.
    unmounted: bool,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

impl Mount {
    /// Mounts the cluster `client` talks to at `mountpoint` and starts serving it on
    /// the current tokio runtime. The mount point must be an empty directory (any
    /// directory with [`MountConfig::nonempty`]), not a stampfs mount already, live or
    /// stale: [`Error::Mountpoint`] says which it is otherwise (see `mountpoint.rs`).
    #[tracing::instrument(skip_all, fields(mountpoint = %mountpoint.display()))]
    pub async fn start(client: Client, mountpoint: &Path, config: MountConfig) -> Result<Mount> {
        let mountpoint = &check_mountpoint(mountpoint, config.nonempty).await?;
        let shared = Arc::new(Shared::new(
            client,
            tokio::runtime::Handle::current(),
            config.attr_ttl,
            config.negative_ttl,
            config.threads,
        ));
        // Learn the root's attributes now, so that a getattr of the root can be answered
        // from them later if the master is slow or gone (`df` must not hang).
        shared.prefetch_root_attr();
        let fs = StampFs {
            shared: shared.clone(),
        };
        let mut options = fuser::Config::default();
        options.mount_options = vec![
            fuser::MountOption::FSName(config.fsname.clone()),
            fuser::MountOption::Subtype("stampfs".to_string()),
            fuser::MountOption::DefaultPermissions,
        ];
        if config.allow_other {
            // Handles read and take write leases as the mount (the kernel checked
            // the open): only a root mount may do that for every user.
            // SAFETY: geteuid takes no arguments and cannot fail.
            if unsafe { libc::geteuid() } != 0 {
                return Err(Error::InvalidArgument {
                    reason: "--allow-other needs a mount run as root: its handles read and \
                             write as the mount for every user"
                        .into(),
                });
            }
            options.acl = fuser::SessionACL::All;
        }
        // Requests the kernel sent one after the other (the first answered before the
        // second went) reach the callbacks in that order whichever thread reads them:
        // so the turn tickets taken there keep each open file's requests in order.
        options.n_threads = Some(config.threads.max(1));
        let mp = mountpoint.to_path_buf();
        // Mounting waits for the kernel's INIT request: off the async threads.
        let session = tokio::task::spawn_blocking(move || fuser::Session::new(fs, &mp, &options))
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?
            .map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("cannot mount at {}: {e}", mountpoint.display()),
                ))
            })?;
        let mut session = session;
        let unmounter = session.unmount_callable();
        let _ = shared.kernel.set(session.notifier());
        let (done_tx, done_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("stampfs-fuse".into())
            .spawn(move || {
                let res = session.run();
                let _ = done_tx.send(res);
            })
            .map_err(Error::Io)?;
        tracing::info!("mounted");
        Ok(Mount {
            mountpoint: mountpoint.to_path_buf(),
            config,
            shared,
            unmounter,
            session_done: Some(done_rx),
            unmounted: false,
        })
    }

    /// The mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Resolves when the session ends: the file system was unmounted (`umount`) or
    /// the kernel connection was aborted.
    pub async fn ended(&mut self) {
        if let Some(rx) = self.session_done.as_mut() {
            match rx.await {
                Ok(Ok(())) => tracing::info!("the file system was unmounted"),
                Ok(Err(e)) => tracing::warn!(error = %e, "the FUSE session ended with an error"),
                Err(_) => tracing::warn!("the FUSE session thread went away"),
            }
            self.session_done = None;
        }
    }

    /// Unmounts (lazily when the mount is busy: open descriptors then fail), waits for
    /// the requests in progress, and closes every file still open for writing so its
    /// length is committed and its lease released.
    pub async fn unmount(mut self) -> Result<()> {
        self.unmounted = true;
        let mut lazily = false;
        if self.session_done.is_some() {
            if let Err(e) = self.unmounter.unmount() {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    tracing::warn!(
                        "the mount point is busy (files or directories are open there); \
                         detaching it lazily: writes on descriptors still open there will fail"
                    );
                    lazily = true;
                    nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH)
                        .map_err(|e| Error::Io(e.into()))?;
                } else {
                    return Err(Error::Io(std::io::Error::new(
                        e.kind(),
                        format!("cannot unmount {}: {e}", self.mountpoint.display()),
                    )));
                }
            }
        }
        let drain = self.config.drain_timeout;
        if !lazily {
            // A clean unmount ends the session promptly.
            let _ = tokio::time::timeout(drain, self.ended()).await;
        }
        self.shared.tasks.close();
        if tokio::time::timeout(drain, self.shared.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                timeout = ?drain,
                "requests still running at unmount; closing open files anyway"
            );
        }
        let writers = fs::lock(&self.shared.handles).writers();
        if !writers.is_empty() {
            tracing::info!(
                files = writers.len(),
                "closing files still open for writing"
            );
        }
        let shared = self.shared.clone();
        let close_all = async move {
            for (fh, h) in writers {
                shared.close_writer(&h).await;
                shared.drop_writer(fh);
            }
        };
        if tokio::time::timeout(drain, close_all).await.is_err() {
            tracing::warn!(
                "some files could not be closed in time; lease recovery will close them"
            );
        }
        tracing::info!(open = fs::lock(&self.shared.handles).len(), "unmounted");
        Ok(())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !self.unmounted && self.session_done.is_some() {
            if let Err(e) = self.unmounter.unmount() {
                tracing::warn!(error = %e, "unmount on drop failed");
            }
        }
    }
}
