//! The mount's write path: opening for write, writes (at the end with `O_APPEND`,
//! anywhere in the file and past its end otherwise), `truncate` /
//! `ftruncate` and `O_TRUNC`, flush and fsync, the reads of `O_RDWR` handles, and the
//! close that commits the length.
//!
//! Each write handle takes the file's lease at its first write, with a writer for
//! writes anywhere (or an append writer under `O_APPEND`). A write the library
//! refuses (`NotSupported`) fails with `EOPNOTSUPP`, logged once per handle with the
//! reason, and changes nothing: the writer goes on. A write in place marks the handle `overwrote`; a read
//! of the file through this mount hflushes such writers first and drops its read-ahead
//! (the mount's `generation` moved), so a program reads what it wrote.

use super::*;
use crate::writer::WriteMode;

/// What a `setattr` changes besides the size.
#[derive(Debug, Default)]
pub(super) struct AttrChange {
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) atime: Option<SetTime>,
    pub(super) mtime: Option<SetTime>,
}

impl AttrChange {
    fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
    }
}

impl Shared {
    /// `setattr`: the size through a writer (see [`Shared::set_size`]), then mode,
    /// owner and times at the master. Times set while this mount writes the file
    /// flush its writer first and keep the close from moving the modification time
    /// ([`FileWriter::times_set`]): `cp -p` sets them on the open file before `close`.
    #[tracing::instrument(skip_all, fields(ino = ino.0, size = ?size))]
    pub(super) async fn setattr(
        &self,
        ino: INodeNo,
        size: Option<u64>,
        change: AttrChange,
    ) -> Result<FileAttr, Errno> {
        let path = self.path_of(ino)?;
        let (mut st, fetched) = self.status_and_size(&path).await?;
        let mut current = self.shown_size(&st, fetched);
        if let Some(requested) = size.filter(|r| *r != current) {
            // As the mount, like every write: the kernel checked the truncate (or the
            // open of the descriptor an ftruncate goes through, which may be a file
            // created read-only).
            let me = self.client.own_caller().unwrap_or(stampfs_proto::Caller {
                uid: 0,
                gid: 0,
                groups: Vec::new(),
            });
            crate::client::REQUEST_CALLER
                .scope(me, self.set_size(ino.0, &path, requested))
                .await?;
            current = requested;
        }
        if change.is_empty() {
            return Ok(self.attr(&st, current));
        }
        // Only a set modification time concerns this mount's writers (their close
        // would move it); in fh order, so two setattrs never lock them crosswise.
        let writers: Vec<_> = if change.mtime.is_some() {
            let mut w: Vec<_> = lock(&self.handles)
                .writers()
                .into_iter()
                .filter(|(_, w)| w.ino == ino.0)
                .collect();
            w.sort_by_key(|(fh, _)| *fh);
            w.into_iter().map(|(_, w)| w).collect()
        } else {
            Vec::new()
        };
        let mut held = Vec::new();
        for h in &writers {
            let mut state = h.state.lock().await;
            if let Some(w) = state.writer.as_mut() {
                w.hflush()
                    .await
                    .map_err(|e| errno_for(&e, "utimensat", &path))?;
            }
            held.push(state);
        }
        let req = stampfs_proto::SetAttr {
            path: path.clone(),
            mode: change.mode,
            uid: change.uid,
            gid: change.gid,
            atime: change.atime,
            mtime: change.mtime,
            caller: None,
        };
        let res = self.client.set_attr(req).await;
        self.invalidate(&path);
        st = res.map_err(|e| errno_for(&e, "setattr", &path))?;
        for state in &mut held {
            if let Some(w) = state.writer.as_mut() {
                w.times_set();
            }
        }
        Ok(self.attr(&st, current))
    }

    /// Sets the size of `ino` to `requested`: through the writer of a handle of this
    /// mount that writes the file, or a writer of its own, closed at once.
    async fn set_size(&self, ino: u64, path: &str, requested: u64) -> Result<(), Errno> {
        let handle = lock(&self.handles)
            .writers()
            .into_iter()
            .map(|(_, w)| w)
            .find(|w| w.ino == ino && w.local_end().is_some());
        if let Some(h) = handle {
            let mut state = h.state.lock().await;
            if let Some(writer) = state.writer.as_mut() {
                writer
                    .set_len(requested)
                    .await
                    .map_err(|e| errno_for(&e, "truncate", path))?;
                h.end.store(writer.len(), Ordering::SeqCst);
                h.overwrote.store(true, Ordering::SeqCst);
                self.invalidate(path);
                return Ok(());
            }
        }
        let mut writer = self.take_lease(ino, path, WriteMode::Anywhere).await?;
        let res = writer.set_len(requested).await;
        let closed = writer.close().await;
        self.invalidate(path);
        self.generation.fetch_add(1, Ordering::SeqCst);
        res.and(closed.map(|_| ()))
            .map_err(|e| errno_for(&e, "truncate", path))
    }

    /// Opens for writing; `truncate` (`O_TRUNC`) empties the file.
    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn open_write(
        &self,
        ino: INodeNo,
        path: String,
        append_mode: bool,
        truncate: bool,
    ) -> Result<u64, Errno> {
        if truncate {
            let (st, size) = self.status_and_size(&path).await?;
            let current = self.shown_size(&st, size);
            if current > 0 {
                self.set_size(ino.0, &path, 0).await?;
            }
        }
        let h = WriteHandle::new(ino.0, path, append_mode, None);
        Ok(lock(&self.handles).insert(Handle::Write(Arc::new(h))))
    }

    /// hflushes every writer of `ino` in this mount, each in its turn after the
    /// requests already queued on it.
    pub(super) async fn flush_local_writers(&self, ino: u64) {
        let writers: Vec<Arc<WriteHandle>> = lock(&self.handles)
            .writers()
            .into_iter()
            .filter(|(_, w)| w.ino == ino)
            .map(|(_, w)| w)
            .collect();
        for w in writers {
            let ticket = w.turn.ticket();
            let _turn = w.turn.enter(ticket).await;
            if let Err(e) = self.flush(&w, false).await {
                tracing::debug!(path = %w.path, errno = ?e, "flush before a read failed");
            }
        }
    }

    /// A read on a handle opened for reading and writing.
    #[tracing::instrument(skip_all, fields(path = %h.path, offset = offset, size = size))]
    pub(super) async fn read_rw(
        &self,
        h: &WriteHandle,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let mut st = h.state.lock().await;
        let want_end = offset.saturating_add(u64::from(size));
        let stale = h.overwrote.load(Ordering::SeqCst)
            || st.reader_generation != self.generation.load(Ordering::SeqCst);
        if stale || st.reader.as_ref().is_none_or(|r| want_end > r.len()) {
            // Reads see this handle's own writes: hflush them first.
            if let Some(w) = st.writer.as_mut() {
                match w.hflush().await {
                    Ok(()) => {
                        if h.overwrote.swap(false, Ordering::SeqCst) {
                            self.generation.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "flush before a read failed"),
                }
            }
            let fresh = self
                .client
                .open(&h.path)
                .await
                .map_err(|e| errno_for(&e, "read", &h.path))?;
            st.reader = Some(fresh);
            st.reader_generation = self.generation.load(Ordering::SeqCst);
        }
        let Some(reader) = st.reader.as_mut() else {
            return Err(Errno::EIO);
        };
        read_from(reader, &h.path, offset, size).await
    }

    fn refuse_write(&self, h: &WriteHandle, offset: u64, end: u64, why: &str) -> Errno {
        if !h.warned.swap(true, Ordering::SeqCst) {
            tracing::warn!(offset, end, "write refused with EOPNOTSUPP: {why}");
        }
        Errno::EOPNOTSUPP
    }

    /// Opens the writer of a handle at its first write, taking the lease.
    async fn open_writer(&self, h: &WriteHandle, st: &mut WriteState) -> Result<(), Errno> {
        if !h.fresh {
            let status = self
                .client
                .stat(&h.path)
                .await
                .map_err(|e| errno_for(&e, "write", &h.path))?;
            if status.kind == FileKind::Directory {
                return Err(Errno::EISDIR);
            }
        }
        let mode = if h.append_mode {
            WriteMode::Append
        } else {
            WriteMode::Anywhere
        };
        let writer = self.take_lease(h.ino, &h.path, mode).await?;
        h.end.store(writer.len(), Ordering::SeqCst);
        st.writer = Some(writer);
        self.invalidate(&h.path);
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(path = %h.path, offset = offset, len = data.len()))]
    pub(super) async fn write(
        &self,
        h: &WriteHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<u32, Errno> {
        let len = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let mut st = h.state.lock().await;
        if st.closed {
            return Err(Errno::EBADF);
        }
        if let Some(e) = st.failed {
            return Err(e);
        }
        if st.writer.is_none() {
            self.open_writer(h, &mut st).await?;
        }
        let Some(writer) = st.writer.as_mut() else {
            return Err(Errno::EIO);
        };
        let end = writer.len();
        let res = if h.append_mode {
            writer.write_all(data).await.map_err(Error::from_io)
        } else {
            writer.write_at(offset, data).await
        };
        match res {
            Ok(()) => {}
            Err(Error::NotSupported { reason, .. }) => {
                // The kernel already holds the refused bytes in its cache.
                drop(self.drop_page_cache(h.ino));
                return Err(self.refuse_write(h, offset, end, &reason));
            }
            Err(e) => {
                let errno = errno_for(&e, "write", &h.path);
                // Not awaited: see `drop_page_cache`.
                drop(self.writer_failed(h, &mut st, errno));
                return Err(errno);
            }
        }
        if h.append_mode && offset != end {
            // The kernel cached the bytes at its idea of the end, not where they went.
            tracing::debug!(
                kernel = offset,
                landed = end,
                "append landed elsewhere than the kernel put it"
            );
            drop(self.drop_page_cache(h.ino));
        }
        if !h.append_mode && offset < end {
            h.overwrote.store(true, Ordering::SeqCst);
        }
        h.end.store(writer.len(), Ordering::SeqCst);
        Ok(len)
    }

    /// `flush` (every close(2)) is hflush; `fsync` is hsync.
    #[tracing::instrument(skip_all, fields(path = %h.path, sync = sync))]
    pub(super) async fn flush(&self, h: &WriteHandle, sync: bool) -> Result<(), Errno> {
        let mut st = h.state.lock().await;
        if let Some(e) = st.failed {
            return Err(e);
        }
        if st.closed {
            return Ok(());
        }
        let Some(writer) = st.writer.as_mut() else {
            return Ok(());
        };
        let res = if sync {
            writer.hsync().await
        } else {
            writer.hflush().await
        };
        if let Err(e) = res {
            let errno = errno_for(&e, if sync { "fsync" } else { "flush" }, &h.path);
            let dropping = self.writer_failed(h, &mut st, errno);
            self.page_cache_dropped(dropping).await;
            return Err(errno);
        }
        if h.overwrote.swap(false, Ordering::SeqCst) {
            // Readers of this mount drop what they read ahead.
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Marks the handle failed (every later write, flush and fsync returns `errno`) and
    /// drops what the kernel cached of the bytes it wrote: the cluster may never hold
    /// them (a fenced writer's bytes above all), so no reader may be served them.
    fn writer_failed(
        &self,
        h: &WriteHandle,
        st: &mut WriteState,
        errno: Errno,
    ) -> tokio::task::JoinHandle<()> {
        st.failed = Some(errno);
        self.drop_page_cache(h.ino)
    }

    /// Forgets a closed write handle and wakes appends waiting for it.
    pub(crate) fn drop_writer(&self, fh: u64) {
        lock(&self.handles).remove(fh);
        self.released.notify_waiters();
    }

    /// Takes the lease of `path` (`ino`) with a writer of `mode`. When the lease is
    /// held by this very mount (an earlier handle of the file is closed by the program
    /// but its release has not been served yet: the kernel sends it in the
    /// background), waits a little for that writer to close, then tries once more.
    async fn take_lease(&self, ino: u64, path: &str, mode: WriteMode) -> Result<FileWriter, Errno> {
        let first = self.client.reopen(path, mode).await;
        let ours = matches!(
            &first,
            Err(Error::Remote(RemoteError::LeaseConflict { holder, .. })) if *holder == self.client.id()
        );
        if !ours {
            return first.map_err(|e| errno_for(&e, "write", path));
        }
        tracing::debug!("the lease is still held by this mount's previous writer; waiting");
        let deadline = tokio::time::Instant::now() + OWN_WRITER_WAIT;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if lock(&self.handles).local_size(ino).is_none() {
                break;
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                tracing::warn!(
                    "another handle of this mount is still writing the file; one writer \
                     per file (returning EBUSY)"
                );
                return Err(Errno::EBUSY);
            }
        }
        self.client
            .reopen(path, mode)
            .await
            .map_err(|e| errno_for(&e, "write", path))
    }

    /// Closes the handle's writer: commits the length and releases the lease.
    #[tracing::instrument(skip_all, fields(path = %h.path))]
    pub(crate) async fn close_writer(&self, h: &WriteHandle) {
        let mut st = h.state.lock().await;
        if st.closed {
            return;
        }
        st.closed = true;
        st.reader = None;
        let Some(mut writer) = st.writer.take() else {
            return;
        };
        match writer.close().await {
            Ok(status) => {
                tracing::debug!(length = status.length, "closed");
            }
            Err(e) if e.is_quota_exceeded() => {
                // The writer closed it at what fit; the program saw EDQUOT already.
                tracing::info!(error = %e, path = %h.path, "a quota refused the file more room: closed at what fit");
                self.page_cache_dropped(self.drop_page_cache(h.ino)).await;
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "closing the file failed; it stays open until its lease is recovered \
                     (`stampfs recover`)"
                );
                self.page_cache_dropped(self.drop_page_cache(h.ino)).await;
            }
        }
        if h.overwrote.swap(false, Ordering::SeqCst) {
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
        self.invalidate(&h.path);
    }
}
