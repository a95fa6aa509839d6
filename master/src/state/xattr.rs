//! Extended attributes (`getxattr`, `listxattr`, `setxattr`, `removexattr`) as
//! methods of [`MasterState`]: only the `user.` namespace is stored (others are
//! `NotSupported`), on files and directories (a link's are refused, as Linux refuses
//! them), at most [`MAX_XATTR_BYTES`] per entry. Reading one needs read permission,
//! listing only search permission along the path, changing one write permission.

use super::{MasterState, Record};
use crate::error::{Error, Result};
use crate::namespace::{self, join, InodeKind};
use crate::perm::{READ, WRITE};
use stampfs_proto::{GetXattr, ListXattr, SetXattr, XattrSet, MAX_XATTR_BYTES, MAX_XATTR_NAME};

/// The namespace stampfs stores.
const USER: &str = "user.";

/// Refuses a name outside `user.`, empty after it, too long, or holding NUL.
fn check_name(name: &str) -> Result<()> {
    if !name.starts_with(USER) {
        return Err(Error::NotSupported {
            reason: format!("extended attribute {name:?}: stampfs stores the user. namespace only"),
        });
    }
    if name.len() == USER.len() || name.len() > MAX_XATTR_NAME || name.contains('\0') {
        return Err(Error::bad_request(format!(
            "extended attribute name {name:?}: 1 to {} bytes after user., no NUL",
            MAX_XATTR_NAME - USER.len()
        )));
    }
    Ok(())
}

impl MasterState {
    /// The value of `req.name`, `None` without one.
    pub fn get_xattr(&self, req: &GetXattr) -> Result<Option<Vec<u8>>> {
        check_name(&req.name)?;
        self.check_access(&req.path, req.caller.as_ref(), READ)?;
        let ino = self.resolve_path(&req.path)?;
        Ok(self.ns.xattrs(ino).and_then(|m| m.get(&req.name).cloned()))
    }

    /// The names of the entry's extended attributes, sorted.
    pub fn list_xattr(&self, req: &ListXattr) -> Result<Vec<String>> {
        self.check_access(&req.path, req.caller.as_ref(), 0)?;
        let ino = self.resolve_path(&req.path)?;
        Ok(self
            .ns
            .xattrs(ino)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default())
    }

    /// Sets or removes `req.name`; whether it existed before (see [`SetXattr`]).
    pub fn set_xattr(&mut self, req: &SetXattr, now_ms: u64, mtime_ms: u64) -> Result<bool> {
        check_name(&req.name)?;
        let comps = namespace::components(&req.path)?;
        let path = join(&comps);
        self.check_access(&path, req.caller.as_ref(), WRITE)?;
        let ino = self.ns.resolve(&comps)?;
        let inode = self
            .ns
            .get(ino)
            .ok_or_else(|| Error::NotFound { path: path.clone() })?;
        if matches!(inode.kind, InodeKind::Symlink(_)) {
            return Err(Error::NotPermitted {
                path,
                reason: "a symbolic link has no user extended attributes".into(),
            });
        }
        let map = self.ns.xattrs(ino);
        let existed = map.is_some_and(|m| m.contains_key(&req.name));
        match (&req.value, req.how) {
            (None, _) | (Some(_), XattrSet::Replace) if !existed => return Ok(false),
            (Some(_), XattrSet::Create) if existed => {
                return Err(Error::AlreadyExists {
                    path: format!("{path} (extended attribute {})", req.name),
                })
            }
            _ => {}
        }
        if let Some(v) = &req.value {
            let others: usize = map
                .into_iter()
                .flatten()
                .filter(|(k, _)| **k != req.name)
                .map(|(k, v)| k.len() + v.len())
                .sum();
            let total = others + req.name.len() + v.len();
            if total > MAX_XATTR_BYTES {
                return Err(Error::XattrTooBig {
                    path,
                    bytes: total,
                    max: MAX_XATTR_BYTES,
                });
            }
        }
        self.commit(
            Record::SetXattr {
                inode: ino,
                name: req.name.clone(),
                value: req.value.clone(),
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(existed)
    }
}
