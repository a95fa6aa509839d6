//! The requests that change the namespace, as methods of [`MasterState`]: each
//! validates, commits its [`Record`] and returns the result. The write path (leases,
//! chunks, grants) is in `write.rs`.

use super::{MasterState, Record};
use crate::config::{check_chunk_size, check_replication};
use crate::error::{Error, Result};
use crate::lease::Takeover;
use crate::namespace::{self, join, Inode, InodeKind, ROOT};
use crate::trash;
use stampfs_proto::{
    ClientId, Create, Delete, FileStatus, InodeId, MakeFile, Mkdir, Rename, Symlink,
    MAX_SYMLINK_TARGET,
};

impl MasterState {
    // ------------------------------------------------------------ namespace mutations

    /// `mkdir`; returns the directory's status (an existing directory is fine with
    /// `parents`, like `mkdir -p`).
    pub fn mkdir(&mut self, req: &Mkdir, now_ms: u64, mtime_ms: u64) -> Result<FileStatus> {
        let comps = namespace::components(&req.path)?;
        let path = join(&comps);
        let mut cur = ROOT;
        let mut dirs = Vec::new();
        let mut parent = ROOT;
        let mut next = self.ns.next_inode().0;
        for (i, name) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            if !dirs.is_empty() {
                dirs.push((name.to_string(), InodeId(next)));
                next += 1;
                continue;
            }
            match self.ns.child(cur, name) {
                Some(child) => match self.ns.get(child).map(|c| &c.kind) {
                    Some(InodeKind::Dir(_)) => cur = child,
                    _ if last => return Err(Error::AlreadyExists { path }),
                    _ => {
                        return Err(Error::NotADirectory {
                            path: join(&comps[..=i]),
                        })
                    }
                },
                None if last || req.parents => {
                    parent = cur;
                    dirs.push((name.to_string(), InodeId(next)));
                    next += 1;
                }
                None => {
                    return Err(Error::NotFound {
                        path: join(&comps[..=i]),
                    })
                }
            }
        }
        if dirs.is_empty() {
            if req.parents {
                return self.status(path, cur);
            }
            return Err(Error::AlreadyExists { path });
        }
        let ino = dirs.last().map(|d| d.1).unwrap_or(ROOT);
        self.commit(
            Record::Mkdir {
                parent,
                dirs,
                mtime_ms,
            },
            now_ms,
        )?;
        self.status(path, ino)
    }

    /// `create`: a new file, open for `client`.
    pub fn create(&mut self, req: &Create, now_ms: u64, mtime_ms: u64) -> Result<FileStatus> {
        let comps = namespace::components(&req.path)?;
        let path = join(&comps);
        if comps.is_empty() {
            return Err(Error::IsADirectory { path });
        }
        let replication = req.replication.unwrap_or(self.settings.replication);
        check_replication(replication).map_err(Error::bad_request)?;
        let chunk_size = req.chunk_size.unwrap_or(self.settings.chunk_size);
        check_chunk_size(chunk_size).map_err(Error::bad_request)?;
        let (parent, name) = self.ns.resolve_parent(&comps)?;
        let replaces = match self.ns.child(parent, name) {
            None => None,
            Some(old) => {
                let f = self
                    .ns
                    .file(old)
                    .ok_or_else(|| self.not_a_file(&path, old))?;
                if !req.overwrite {
                    return Err(Error::AlreadyExists { path });
                }
                if f.is_recovering() {
                    return Err(Error::RecoveryInProgress { path });
                }
                if let Some(holder) = f.writer() {
                    if holder != req.client {
                        return Err(self.conflict(&path, old, holder, now_ms));
                    }
                }
                Some(old)
            }
        };
        let inode = self.ns.next_inode();
        self.commit(
            Record::Create {
                parent,
                name: name.to_string(),
                inode,
                replication,
                chunk_size,
                client: req.client,
                replaces,
                mtime_ms,
            },
            now_ms,
        )?;
        self.status(path, inode)
    }

    /// `symlink`: a symbolic link at `req.path` holding `req.target`, which must be
    /// 1 to [`MAX_SYMLINK_TARGET`] bytes without NUL; it is never resolved here.
    pub fn symlink(&mut self, req: &Symlink, now_ms: u64, mtime_ms: u64) -> Result<FileStatus> {
        let comps = namespace::components(&req.path)?;
        let path = join(&comps);
        if comps.is_empty() {
            return Err(Error::AlreadyExists { path });
        }
        if req.target.is_empty() || req.target.len() > MAX_SYMLINK_TARGET {
            return Err(Error::bad_request(format!(
                "a symbolic link's target must hold 1 to {MAX_SYMLINK_TARGET} bytes, not {}",
                req.target.len()
            )));
        }
        if req.target.contains('\0') {
            return Err(Error::bad_request(
                "a symbolic link's target holds a NUL byte",
            ));
        }
        let (parent, name) = self.ns.resolve_parent(&comps)?;
        if self.ns.child(parent, name).is_some() {
            return Err(Error::AlreadyExists { path });
        }
        let inode = self.ns.next_inode();
        self.commit(
            Record::Symlink {
                parent,
                name: name.to_string(),
                inode,
                target: req.target.clone(),
                mtime_ms,
            },
            now_ms,
        )?;
        self.status(path, inode)
    }

    /// `readlink`: the target of the symbolic link at `path`.
    pub fn read_link(&self, path: &str) -> Result<String> {
        let comps = namespace::components(path)?;
        let ino = self.ns.resolve(&comps)?;
        self.ns
            .get(ino)
            .and_then(|i| i.as_symlink())
            .map(str::to_string)
            .ok_or_else(|| Error::bad_request(format!("{} is not a symbolic link", join(&comps))))
    }

    /// Creates an empty file and closes it in the same step: a `Create` record (the
    /// requester as its writer, never given a lease it could use) followed by a `Close`
    /// record, queued together under the state lock, so no request sees the file open
    /// and one durable wait covers both. Refuses an existing name, as `create` without
    /// `overwrite` does.
    pub fn make_file(&mut self, req: &MakeFile, now_ms: u64, mtime_ms: u64) -> Result<FileStatus> {
        let create = Create {
            path: req.path.clone(),
            client: req.client,
            replication: req.replication,
            chunk_size: req.chunk_size,
            overwrite: false,
        };
        let created = self.create(&create, now_ms, mtime_ms)?;
        self.commit(
            Record::Close {
                inode: created.inode,
                last: None,
                mtime_ms,
            },
            now_ms,
        )?;
        self.status(created.path, created.inode)
    }

    pub(super) fn conflict(
        &self,
        path: &str,
        ino: InodeId,
        holder: ClientId,
        now_ms: u64,
    ) -> Error {
        let expires_in_ms = match self.leases.takeover(ino, now_ms, self.settings.limits) {
            Takeover::Conflict { expires_in_ms, .. } => expires_in_ms,
            _ => 0,
        };
        Error::LeaseConflict {
            path: path.to_string(),
            holder,
            expires_in_ms,
        }
    }

    pub fn rename(&mut self, req: &Rename, now_ms: u64, mtime_ms: u64) -> Result<()> {
        let src = namespace::components(&req.src)?;
        let dst = namespace::components(&req.dst)?;
        if src.is_empty() {
            return Err(Error::bad_request("cannot rename /"));
        }
        let ino = self.ns.resolve(&src)?;
        if dst.is_empty() || self.ns.resolve(&dst).is_ok() {
            return Err(Error::AlreadyExists { path: join(&dst) });
        }
        let (src_parent, src_name) = self.ns.resolve_parent(&src)?;
        let (dst_parent, dst_name) = self.ns.resolve_parent(&dst)?;
        if self.ns.is_within(dst_parent, ino) {
            return Err(Error::bad_request(format!(
                "cannot move {} into itself ({})",
                join(&src),
                join(&dst)
            )));
        }
        self.commit(
            Record::Rename {
                src_parent,
                src_name: src_name.to_string(),
                dst_parent,
                dst_name: dst_name.to_string(),
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(())
    }

    pub fn delete(&mut self, req: &Delete, now_ms: u64, mtime_ms: u64) -> Result<()> {
        let comps = namespace::components(&req.path)?;
        if comps.is_empty() {
            return Err(Error::bad_request("cannot delete /"));
        }
        let ino = self.ns.resolve(&comps)?;
        if let Some(d) = self.ns.get(ino).and_then(Inode::as_dir) {
            if !d.children.is_empty() && !req.recursive {
                return Err(Error::DirectoryNotEmpty { path: join(&comps) });
            }
        }
        let (parent, name) = self.ns.resolve_parent(&comps)?;
        let in_trash = comps.first() == Some(&trash::DIR);
        if self.settings.trash_ms > 0 && !in_trash {
            if let Some(bin) = self.trash_dir(now_ms, mtime_ms)? {
                let dst_name = trash::entry_name(mtime_ms, ino, name);
                if self.ns.child(bin, &dst_name).is_none() {
                    self.commit(
                        Record::Rename {
                            src_parent: parent,
                            src_name: name.to_string(),
                            dst_parent: bin,
                            dst_name: dst_name.clone(),
                            mtime_ms,
                        },
                        now_ms,
                    )?;
                    tracing::info!(path = %join(&comps), trash = %format!("/{}/{dst_name}", trash::DIR), "moved to the trash");
                    return Ok(());
                }
            }
        }
        self.commit(
            Record::Delete {
                parent,
                name: name.to_string(),
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(())
    }

    /// The trash directory, created when missing; `None` when `/.trash` is taken by a
    /// file (then `rm` deletes at once).
    fn trash_dir(&mut self, now_ms: u64, mtime_ms: u64) -> Result<Option<InodeId>> {
        if let Some(t) = self.ns.child(ROOT, trash::DIR) {
            if self.ns.get(t).and_then(Inode::as_dir).is_some() {
                return Ok(Some(t));
            }
            tracing::warn!(
                "/{} is not a directory; removing without the trash",
                trash::DIR
            );
            return Ok(None);
        }
        let ino = self.ns.next_inode();
        self.commit(
            Record::Mkdir {
                parent: ROOT,
                dirs: vec![(trash::DIR.to_string(), ino)],
                mtime_ms,
            },
            now_ms,
        )?;
        Ok(Some(ino))
    }
}
