//! The mount's namespace mutations: `mkdir`, `unlink`/`rmdir`, `rename` (rename(2)'s
//! replacing one at the master, or `RENAME_NOREPLACE`) and the creation of empty
//! files (`create`, `mknod`), each invalidating the attribute cache it changes.

use super::*;

impl Shared {
    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn mkdir(
        &self,
        path: String,
        attr: stampfs_proto::NewAttr,
    ) -> Result<FileStatus, Errno> {
        let res = self.client.mkdir_with(&path, false, attr).await;
        self.name_changed(&path, res.as_ref().ok().map(|_| true));
        let st = res.map_err(|e| errno_for(&e, "mkdir", &path))?;
        self.invalidate(&path);
        Ok(st)
    }

    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn remove(&self, path: String, op: &'static str) -> Result<(), Errno> {
        let res = self.client.delete(&path, false).await;
        self.invalidate(&path);
        self.name_changed(&path, res.as_ref().ok().map(|_| false));
        res.map_err(|e| errno_for(&e, op, &path))
    }

    #[tracing::instrument(skip_all, fields(%from, %to))]
    pub(super) async fn rename(
        &self,
        from: String,
        to: String,
        replace: bool,
    ) -> Result<(), Errno> {
        let res = if replace {
            self.client.rename_replacing(&from, &to).await
        } else {
            self.client.rename(&from, &to).await
        };
        if res.is_err() {
            self.name_changed(&from, None);
            self.name_changed(&to, None);
        }
        res.map_err(|e| errno_for(&e, "rename", &from))?;
        self.name_changed(&from, Some(false));
        self.name_changed(&to, Some(true));
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
        attr: stampfs_proto::NewAttr,
    ) -> Result<(FileStatus, u64), Errno> {
        let opts = CreateOptions {
            attr: Some(attr),
            ..CreateOptions::default()
        };
        let res = self.client.make_file(&path, opts).await;
        self.name_changed(&path, res.as_ref().ok().map(|_| true));
        let st = res.map_err(|e| errno_for(&e, "create", &path))?;
        let handle = WriteHandle::created(st.inode.0, st.path.clone(), append_mode);
        let fh = lock(&self.handles).insert(Handle::Write(Arc::new(handle)));
        lock(&self.attrs).put(st.clone(), 0, Instant::now());
        Ok((st, fh))
    }

    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn mknod(
        &self,
        path: String,
        attr: stampfs_proto::NewAttr,
    ) -> Result<FileStatus, Errno> {
        let opts = CreateOptions {
            attr: Some(attr),
            ..CreateOptions::default()
        };
        let res = self.client.make_file(&path, opts).await;
        self.name_changed(&path, res.as_ref().ok().map(|_| true));
        let st = res.map_err(|e| errno_for(&e, "mknod", &path))?;
        lock(&self.attrs).put(st.clone(), 0, Instant::now());
        Ok(st)
    }
}
