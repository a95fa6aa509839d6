//! The mount's namespace mutations: `mkdir`, `unlink`/`rmdir`, `rename` (POSIX
//! replace semantics over the master's refusing rename) and the creation of empty
//! files (`create`, `mknod`), each invalidating the attribute cache it changes.

use super::*;

impl Shared {
    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn mkdir(&self, path: String) -> Result<FileStatus, Errno> {
        let st = self
            .client
            .mkdir(&path, false)
            .await
            .map_err(|e| errno_for(&e, "mkdir", &path))?;
        self.invalidate(&path);
        Ok(st)
    }

    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn remove(&self, path: String, op: &'static str) -> Result<(), Errno> {
        let res = self.client.delete(&path, false).await;
        self.invalidate(&path);
        res.map_err(|e| errno_for(&e, op, &path))
    }

    #[tracing::instrument(skip_all, fields(%from, %to))]
    pub(super) async fn rename(
        &self,
        from: String,
        to: String,
        replace: bool,
    ) -> Result<(), Errno> {
        let first = self.client.rename(&from, &to).await;
        let res = match first {
            Err(Error::Remote(RemoteError::AlreadyExists { .. })) if replace => {
                // POSIX rename replaces its target; the master's refuses. Remove the
                // target (a file, or an empty directory of the same kind) and retry.
                let src = self
                    .client
                    .stat(&from)
                    .await
                    .map_err(|e| errno_for(&e, "rename", &from))?;
                let dst = self
                    .client
                    .stat(&to)
                    .await
                    .map_err(|e| errno_for(&e, "rename", &to))?;
                // Only a directory replaces a directory; files and links replace files
                // and links (rename(2)).
                let dir = |k: FileKind| k == FileKind::Directory;
                match (dir(src.kind), dir(dst.kind)) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    _ => {}
                }
                self.client
                    .delete(&to, false)
                    .await
                    .map_err(|e| errno_for(&e, "rename", &to))?;
                self.invalidate(&to);
                self.client.rename(&from, &to).await
            }
            other => other,
        };
        res.map_err(|e| errno_for(&e, "rename", &from))?;
        lock(&self.inodes).renamed(&from, &to);
        self.invalidate(&from);
        self.invalidate(&to);
        Ok(())
    }

    /// Creates the file empty and closed at the master (one durable step, no lease);
    /// the handle's first write takes the lease (see [`super::handles`]).
    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn create(
        &self,
        path: String,
        append_mode: bool,
    ) -> Result<(FileStatus, u64), Errno> {
        let st = self
            .client
            .make_file(&path, CreateOptions::default())
            .await
            .map_err(|e| errno_for(&e, "create", &path))?;
        let handle = WriteHandle::created(st.inode.0, st.path.clone(), append_mode);
        let fh = lock(&self.handles).insert(Handle::Write(Arc::new(handle)));
        lock(&self.attrs).put(st.clone(), 0, Instant::now());
        Ok((st, fh))
    }

    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn mknod(&self, path: String) -> Result<FileStatus, Errno> {
        let st = self
            .client
            .make_file(&path, CreateOptions::default())
            .await
            .map_err(|e| errno_for(&e, "mknod", &path))?;
        lock(&self.attrs).put(st.clone(), 0, Instant::now());
        Ok(st)
    }
}
