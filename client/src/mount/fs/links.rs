//! Symbolic links through the mount: `symlink` stores the link at the master (its
//! target as the caller gave it, never resolved by stampfs), `readlink` reads it back;
//! the kernel follows links itself, so no other operation ever sees one.

use super::*;

impl Shared {
    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn symlink(
        &self,
        path: String,
        target: &std::path::Path,
        attr: stampfs_proto::NewAttr,
    ) -> Result<FileStatus, Errno> {
        // The master keeps UTF-8 text; a target of other bytes cannot be stored.
        let target = target.to_str().ok_or(Errno::EINVAL)?;
        if target.len() > stampfs_proto::MAX_SYMLINK_TARGET {
            return Err(Errno::ENAMETOOLONG);
        }
        let res = self.client.symlink_with(&path, target, attr).await;
        self.name_changed(&path, res.as_ref().ok().map(|_| true));
        let st = res.map_err(|e| errno_for(&e, "symlink", &path))?;
        self.invalidate(&path);
        Ok(st)
    }

    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn readlink(&self, path: String) -> Result<String, Errno> {
        self.client.read_link(&path).await.map_err(|e| match e {
            // Not a link: EINVAL, as readlink(2) says.
            Error::Remote(RemoteError::BadRequest { .. }) => Errno::EINVAL,
            e => errno_for(&e, "readlink", &path),
        })
    }
}
