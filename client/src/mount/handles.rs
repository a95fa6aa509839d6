//! Open files and directories of the mount, and where writes and truncates may go.
//!
//! A handle number (`fh`) names one open file description. Read handles keep a
//! [`FileReader`] (its 1 MiB read-ahead buffer serves sequential reads); write handles
//! keep a [`FileWriter`], opened lazily by the first write of an existing file so that
//! opening for write alone never takes the file's lease. The requests of one write
//! handle run one at a time in the order the kernel sent them ([`Turnstile`]): the
//! kernel's order is the file's byte order.
//!
//! A file the mount creates is made empty and **closed** at the master in one durable
//! step (`MakeFile`), and its handle starts without a writer, like one opened for
//! writing: the lease is taken by the first write. So until a write is sent on a handle
//! ([`WriteHandle::wrote`]) it holds nothing at the master, and its flush and release
//! are answered at once ([`settles_at_once`]): a `touch` costs one request, and a crash
//! anywhere leaves the file absent or closed and empty, never open.

use crate::reader::FileReader;
use crate::writer::FileWriter;
use fuser::FileType;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// Whether a flush or release of a write handle is answered at once, on the FUSE
/// thread that read it, without waiting for a turn or asking the cluster: when no
/// write was ever sent on the handle. Such a handle has no writer (only a write opens one), so there
/// is nothing to flush, no length to commit and no lease to release; every earlier
/// request on it was a flush or an fsync of nothing.
pub(crate) fn settles_at_once(wrote: bool) -> bool {
    !wrote
}

/// Serves tickets in the order they were taken. The FUSE thread that read a request
/// takes a ticket before anything answers it, so a request sent after an earlier one
/// was answered takes a later ticket (requests in flight together take theirs in the
/// order the threads read them); the task that serves the request waits for its turn.
/// Every ticket must be entered once, or later ones wait forever.
pub(crate) struct Turnstile {
    next: AtomicU64,
    /// The ticket being served; bumped when a [`Turn`] ends, watched by waiting tasks.
    serving: watch::Sender<u64>,
}

impl Default for Turnstile {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(0),
            serving: watch::Sender::new(0),
        }
    }
}

impl Turnstile {
    /// Takes the next ticket (never blocks).
    pub(crate) fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Waits until `ticket` is served; its turn ends when the returned guard drops.
    pub(crate) async fn enter(&self, ticket: u64) -> Turn<'_> {
        let mut rx = self.serving.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|serving| *serving >= ticket).await;
        Turn { turnstile: self }
    }
}

/// One request's turn on a [`Turnstile`].
pub(crate) struct Turn<'a> {
    turnstile: &'a Turnstile,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turnstile.serving.send_modify(|s| *s += 1);
    }
}

/// An open file for reading.
pub(crate) struct ReadHandle {
    pub(crate) ino: u64,
    pub(crate) path: String,
    /// The reader and its read-ahead buffer, with the mount's generation when it was
    /// opened; one read at a time uses it (the kernel's concurrent read-ahead requests
    /// for this handle queue here, other handles don't).
    pub(crate) reader: tokio::sync::Mutex<(FileReader, u64)>,
}

/// The mutable part of a write handle.
pub(crate) struct WriteState {
    /// `None` until the first write of a file opened (not created) for writing.
    pub(crate) writer: Option<FileWriter>,
    /// A reader for `O_RDWR` handles, opened by the first read.
    pub(crate) reader: Option<FileReader>,
    /// Set once the writer failed for good (fenced, pipeline lost): later writes fail.
    pub(crate) failed: Option<fuser::Errno>,
    /// Set by release: the writer is closed.
    pub(crate) closed: bool,
    /// The mount's generation when `reader` was opened (see [`Handles::overwrote`]).
    pub(crate) reader_generation: u64,
}

/// An open file for writing (and perhaps reading).
pub(crate) struct WriteHandle {
    pub(crate) ino: u64,
    pub(crate) path: String,
    /// Opened with `O_APPEND`.
    pub(crate) append_mode: bool,
    /// Bytes in the file as this handle's writer sees them (its start plus every byte
    /// it accepted); [`NO_WRITER`] until the writer exists.
    pub(crate) end: AtomicU64,
    /// Set after the first refusal so it is logged once per handle.
    pub(crate) warned: AtomicBool,
    /// A write in place (below the end) or a truncate not yet hflushed: a read through
    /// this mount hflushes first and drops what it read ahead.
    pub(crate) overwrote: AtomicBool,
    /// Set by the FUSE thread that read a write on this handle, before the write is
    /// answered (true from the start for a handle given a writer): see
    /// [`settles_at_once`].
    pub(crate) wrote: AtomicBool,
    /// Created empty and closed by this mount: its first write reopens it without
    /// asking the master for its length first (it was empty; `Append` says if another
    /// client wrote meanwhile).
    pub(crate) fresh: bool,
    /// Orders this handle's writes, flushes and release as the kernel sent them.
    pub(crate) turn: Turnstile,
    /// Held by the request whose turn it is (and by the final drain at unmount).
    pub(crate) state: tokio::sync::Mutex<WriteState>,
}

/// [`WriteHandle::end`] before the handle has a writer.
pub(crate) const NO_WRITER: u64 = u64::MAX;

impl WriteHandle {
    pub(crate) fn new(
        ino: u64,
        path: String,
        append_mode: bool,
        writer: Option<FileWriter>,
    ) -> Self {
        let end = writer.as_ref().map_or(NO_WRITER, |w| w.status().length);
        Self {
            ino,
            path,
            append_mode,
            end: AtomicU64::new(end),
            warned: AtomicBool::new(false),
            overwrote: AtomicBool::new(false),
            wrote: AtomicBool::new(writer.is_some()),
            fresh: false,
            turn: Turnstile::default(),
            state: tokio::sync::Mutex::new(WriteState {
                writer,
                reader: None,
                failed: None,
                closed: false,
                reader_generation: 0,
            }),
        }
    }

    /// A handle of a file this mount just created (empty and closed at the master).
    pub(crate) fn created(ino: u64, path: String, append_mode: bool) -> Self {
        Self {
            fresh: true,
            ..Self::new(ino, path, append_mode, None)
        }
    }

    /// The size this handle's writer has produced, if it has a writer.
    pub(crate) fn local_end(&self) -> Option<u64> {
        match self.end.load(Ordering::SeqCst) {
            NO_WRITER => None,
            n => Some(n),
        }
    }
}

/// One directory entry of a listing snapshot.
#[derive(Clone, Debug)]
pub(crate) struct DirEntry {
    pub(crate) ino: u64,
    pub(crate) kind: FileType,
    pub(crate) name: String,
}

/// An open directory: the listing taken by the `readdir` at offset 0, served from
/// there to later offsets so entries are neither skipped nor repeated.
pub(crate) struct DirHandle {
    pub(crate) ino: u64,
    /// Replaced by each `readdir` at offset 0; locked briefly, never across an await.
    pub(crate) entries: std::sync::Mutex<Vec<DirEntry>>,
}

/// An open handle of any kind.
#[derive(Clone)]
pub(crate) enum Handle {
    Dir(Arc<DirHandle>),
    Read(Arc<ReadHandle>),
    Write(Arc<WriteHandle>),
}

/// Every open handle by number.
#[derive(Default)]
pub(crate) struct Handles {
    next: u64,
    open: HashMap<u64, Handle>,
}

impl Handles {
    /// Registers a handle and returns its number (never 0).
    pub(crate) fn insert(&mut self, h: Handle) -> u64 {
        self.next += 1;
        let fh = self.next;
        self.open.insert(fh, h);
        fh
    }

    pub(crate) fn get(&self, fh: u64) -> Option<Handle> {
        self.open.get(&fh).cloned()
    }

    pub(crate) fn remove(&mut self, fh: u64) -> Option<Handle> {
        self.open.remove(&fh)
    }

    /// The size of `ino` as written through this mount: the largest end among its
    /// write handles that have a writer.
    pub(crate) fn local_size(&self, ino: u64) -> Option<u64> {
        self.open
            .values()
            .filter_map(|h| match h {
                Handle::Write(w) if w.ino == ino => w.local_end(),
                _ => None,
            })
            .max()
    }

    /// Whether a write handle of `ino` wrote in place (or truncated) since its last
    /// flush.
    pub(crate) fn overwrote(&self, ino: u64) -> bool {
        self.open.values().any(|h| match h {
            Handle::Write(w) => w.ino == ino && w.overwrote.load(Ordering::SeqCst),
            _ => false,
        })
    }

    /// Every write handle still open (for the drain at unmount).
    pub(crate) fn writers(&self) -> Vec<(u64, Arc<WriteHandle>)> {
        self.open
            .iter()
            .filter_map(|(fh, h)| match h {
                Handle::Write(w) => Some((*fh, w.clone())),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_never_written_settles_at_once() {
        assert!(settles_at_once(false));
        let h = WriteHandle::created(7, "/f".into(), false);
        assert!(h.fresh);
        assert!(settles_at_once(h.wrote.load(Ordering::SeqCst)));
    }

    #[test]
    fn a_handle_written_to_waits_for_its_turn() {
        assert!(!settles_at_once(true));
        let h = WriteHandle::created(7, "/f".into(), false);
        h.wrote.store(true, Ordering::SeqCst);
        assert!(!settles_at_once(h.wrote.load(Ordering::SeqCst)));
    }

    #[tokio::test]
    async fn turnstile_serves_tickets_in_order() {
        let t = Arc::new(Turnstile::default());
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tickets: Vec<u64> = (0..8).map(|_| t.ticket()).collect();
        let mut tasks = Vec::new();
        // Spawned last-ticket-first: each still runs in ticket order.
        for ticket in tickets.into_iter().rev() {
            let (t, order) = (t.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = t.enter(ticket).await;
                order.lock().expect("lock").push(ticket);
                tokio::task::yield_now().await;
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(*order.lock().expect("lock"), (0..8).collect::<Vec<u64>>());
    }

    #[test]
    fn handle_numbers_are_unique_and_local_size_is_the_largest_end() {
        let mut hs = Handles::default();
        let a = hs.insert(Handle::Write(Arc::new(WriteHandle::new(
            7,
            "/f".into(),
            false,
            None,
        ))));
        let b = hs.insert(Handle::Dir(Arc::new(DirHandle {
            ino: 1,
            entries: std::sync::Mutex::new(Vec::new()),
        })));
        assert_ne!(a, b);
        assert_ne!(a, 0);
        assert_eq!(hs.local_size(7), None, "no writer yet");
        if let Some(Handle::Write(w)) = hs.get(a) {
            w.end.store(100, Ordering::SeqCst);
        }
        assert_eq!(hs.local_size(7), Some(100));
        assert_eq!(hs.writers().len(), 1);
        hs.remove(a);
        assert_eq!(hs.local_size(7), None);
        assert_eq!(hs.len(), 1);
    }
}
