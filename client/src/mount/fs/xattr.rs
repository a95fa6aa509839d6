//! Extended attributes through the mount: the `user.` namespace is stored by the
//! master (`getxattr`, `listxattr`, `setxattr`, `removexattr`); a name in any other
//! namespace (`security.`, `system.`, `trusted.`) has none and cannot be set
//! (`EOPNOTSUPP`), answered without asking the master: the kernel asks for
//! `security.capability` before writes.

use super::*;
use stampfs_proto::XattrSet;

/// The namespace the master stores.
pub(super) const USER: &str = "user.";

/// What an `xattr` call answers with a value of `len` bytes when the caller's buffer
/// holds `size`: the length (`size` 0), `ERANGE` (too small), or the bytes.
pub(super) fn reply_sized(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(u32::try_from(data.len()).unwrap_or(u32::MAX));
    } else if (size as usize) < data.len() {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

/// setxattr(2)'s flags as the master takes them (`EINVAL` for both or others).
pub(super) fn how(flags: i32) -> Result<XattrSet, Errno> {
    match flags {
        0 => Ok(XattrSet::Any),
        libc::XATTR_CREATE => Ok(XattrSet::Create),
        libc::XATTR_REPLACE => Ok(XattrSet::Replace),
        _ => Err(Errno::EINVAL),
    }
}

impl Shared {
    #[tracing::instrument(skip_all, fields(%path, %name))]
    pub(super) async fn getxattr(&self, path: String, name: String) -> Result<Vec<u8>, Errno> {
        self.client
            .get_xattr(&path, &name)
            .await
            .map_err(|e| errno_for(&e, "getxattr", &path))?
            .ok_or(Errno::NO_XATTR)
    }

    /// The names, each followed by a NUL, as listxattr(2) lists them.
    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn listxattr(&self, path: String) -> Result<Vec<u8>, Errno> {
        let names = self
            .client
            .list_xattr(&path)
            .await
            .map_err(|e| errno_for(&e, "listxattr", &path))?;
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// Sets (`Some`) or removes (`None`) `name`; `ENODATA` when a removal or an
    /// `XATTR_REPLACE` finds none.
    #[tracing::instrument(skip_all, fields(%path, %name))]
    pub(super) async fn setxattr(
        &self,
        path: String,
        name: String,
        value: Option<Vec<u8>>,
        how: XattrSet,
    ) -> Result<(), Errno> {
        let removal = value.is_none();
        let op = if removal { "removexattr" } else { "setxattr" };
        let existed = self
            .client
            .set_xattr(&path, &name, value, how)
            .await
            .map_err(|e| errno_for(&e, op, &path))?;
        self.invalidate(&path);
        if !existed && (removal || how == XattrSet::Replace) {
            return Err(Errno::NO_XATTR);
        }
        Ok(())
    }
}
