//! The requests that change the namespace, as methods of [`MasterState`]: each
//! validates, commits its [`Record`] and returns the result. The write path (leases,
//! chunks, grants) is in `write.rs`.

use super::{MasterState, Record, Usage};
use crate::config::{check_chunk_size, check_replication};
use crate::error::{Error, Result};
use crate::lease::Takeover;
use crate::namespace::{self, join, Inode, InodeKind, ROOT};
use crate::trash;
use stampfs_proto::{
    Caller, ClientId, Create, Delete, DeleteNow, FileStatus, InodeId, MakeFile, Mkdir, NewAttr,
    Rename, RestoreTrash, SetAttr, SetTime, Symlink, MAX_SYMLINK_TARGET, MODE_BITS,
};

/// `/.trash`: root's, passable by everyone to their own directory (each user's is
/// theirs, 0700: an entry moved there left the directories that protected it, so
/// nobody else may reach it), listed by root alone.
const TRASH_MODE: u32 = 0o711;
/// A user's directory in the trash and the directories made under it.
const TRASH_USER_MODE: u32 = 0o700;
/// Names tried for an entry whose name is taken in the trash (`name`, `name.<ms>`,
/// `name.<ms>.1`, ...).
const MAX_TAKEN: u32 = 64;

/// The error of an entry the trash has no free name for.
fn taken(name: &str) -> Error {
    Error::AlreadyExists {
        path: format!("{name} (in the trash, under {MAX_TAKEN} names)"),
    }
}

/// How old an access time may grow before a read moves it though the entry has not
/// changed since (Linux's `relatime`: a day).
const RELATIME_NS: i64 = 24 * 3600 * 1_000_000_000;

/// `rec` with its creator's mode and owner, when it has them (a mode with bits past
/// `0o7777` is refused).
fn with_attr(rec: Record, attr: Option<NewAttr>) -> Result<Record> {
    let Some(attr) = attr else {
        return Ok(rec);
    };
    if attr.mode & !MODE_BITS != 0 {
        return Err(Error::bad_request(format!(
            "mode {:o} has bits past 0o7777",
            attr.mode
        )));
    }
    Ok(Record::WithAttr {
        record: Box::new(rec),
        attr,
    })
}

impl MasterState {
    // ------------------------------------------------------------ namespace mutations

    /// `mkdir`; returns the directory's status (an existing directory is fine with
    /// `parents`, like `mkdir -p`).
    pub fn mkdir(&mut self, req: &Mkdir, now_ms: u64, mtime_ms: u64) -> Result<FileStatus> {
        let comps = namespace::components(&req.path)?;
        let path = join(&comps);
        let who = req.caller.as_ref();
        self.search(&comps, who)?;
        let mut cur = ROOT;
        let mut dirs = Vec::new();
        let mut parent = ROOT;
        let mut parent_len = 0;
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
                    parent_len = i;
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
        self.require_dir_write(parent, &join(&comps[..parent_len]), who)?;
        self.check_quota(parent, Usage::names(dirs.len() as u64), None)?;
        let attr = self.creator_attr(parent, &path, req.attr, 0o755, true, who)?;
        let rec = with_attr(
            Record::Mkdir {
                parent,
                dirs,
                mtime_ms,
            },
            attr,
        )?;
        self.commit(rec, now_ms)?;
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
        let who = req.caller.as_ref();
        self.search(&comps, who)?;
        let (parent, name) = self.ns.resolve_parent(&comps)?;
        let parent_path = join(&comps[..comps.len() - 1]);
        let mut kept = None;
        let replaces = match self.ns.child(parent, name) {
            None => {
                self.require_dir_write(parent, &parent_path, who)?;
                None
            }
            Some(old) => {
                let f = self
                    .ns
                    .file(old)
                    .ok_or_else(|| self.not_a_file(&path, old))?;
                if !req.overwrite {
                    return Err(Error::AlreadyExists { path });
                }
                // Replacing keeping the file's owner is a truncate (`O_TRUNC`): write
                // permission on the file is enough. Giving it another owner is an
                // unlink and a create: the directory's rules too.
                self.require(old, &path, who, crate::perm::WRITE)?;
                let old_attr = self.ns.get(old).map(|i| i.attr).unwrap_or_default();
                // It keeps the old mode too (a writer that is not the owner drops
                // set-uid and set-gid, as a write does on Linux).
                let kill = if crate::perm::owns(&old_attr, who) {
                    0
                } else {
                    0o6000
                };
                kept = req
                    .attr
                    .filter(|a| (a.uid, a.gid) == (old_attr.uid, old_attr.gid))
                    .map(|a| NewAttr {
                        mode: old_attr.mode & !kill,
                        ..a
                    });
                if kept.is_none() {
                    self.require_removable(parent, &parent_path, old, &path, who)?;
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
        // Replacing a file keeps the count of names.
        let names = u64::from(replaces.is_none());
        self.check_quota(parent, Usage::names(names), None)?;
        let inode = self.ns.next_inode();
        let attr = match kept {
            Some(a) => Some(a),
            None => self.creator_attr(parent, &path, req.attr, 0o644, false, who)?,
        };
        let rec = with_attr(
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
            attr,
        )?;
        self.commit(rec, now_ms)?;
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
        let who = req.caller.as_ref();
        self.search(&comps, who)?;
        let (parent, name) = self.ns.resolve_parent(&comps)?;
        if self.ns.child(parent, name).is_some() {
            return Err(Error::AlreadyExists { path });
        }
        self.require_dir_write(parent, &join(&comps[..comps.len() - 1]), who)?;
        self.check_quota(parent, Usage::names(1), None)?;
        let attr = self.creator_attr(parent, &path, req.attr, 0o777, false, who)?;
        let inode = self.ns.next_inode();
        let rec = with_attr(
            Record::Symlink {
                parent,
                name: name.to_string(),
                inode,
                target: req.target.clone(),
                mtime_ms,
            },
            attr,
        )?;
        self.commit(rec, now_ms)?;
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
            attr: req.attr,
            caller: req.caller.clone(),
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

    /// `chmod`, `chown`, `utimensat` of the entry at `req.path` (a symbolic link's
    /// own attributes: links are never followed); the change time becomes
    /// `mtime_ms`, and so does a time set to [`SetTime::Now`]. A mode with bits past
    /// `0o7777` is refused, and so is a link's mode (it is always `0o777`). A request
    /// that sets nothing changes nothing and answers the status.
    pub fn set_attr(&mut self, req: &SetAttr, now_ms: u64, mtime_ms: u64) -> Result<FileStatus> {
        let comps = namespace::components(&req.path)?;
        let path = join(&comps);
        let who = req.caller.as_ref();
        self.search(&comps, who)?;
        let ino = self.ns.resolve(&comps)?;
        if let Some(m) = req.mode {
            if m & !MODE_BITS != 0 {
                return Err(Error::bad_request(format!(
                    "mode {m:o} has bits past 0o7777 (the kind of an entry cannot change)"
                )));
            }
            if self.ns.get(ino).and_then(Inode::as_symlink).is_some() {
                return Err(Error::NotSupported {
                    reason: format!("{path} is a symbolic link, whose mode is always 0777"),
                });
            }
        }
        let mode = self.permitted_mode(ino, &path, req, who)?;
        let now = namespace::ms_to_ns(mtime_ms);
        let at = |t: Option<SetTime>| {
            t.map(|t| match t {
                SetTime::Now => now,
                SetTime::At(ns) => ns,
            })
        };
        let nothing = req.mode.is_none()
            && req.uid.is_none()
            && req.gid.is_none()
            && req.atime.is_none()
            && req.mtime.is_none();
        if !nothing {
            self.commit(
                Record::SetAttr {
                    inode: ino,
                    mode,
                    uid: req.uid,
                    gid: req.gid,
                    atime_ns: at(req.atime),
                    mtime_ns: at(req.mtime),
                    ctime_ns: Some(now),
                },
                now_ms,
            )?;
        }
        self.status(path, ino)
    }

    /// The mode a `setattr` of `ino` stores (`None`: unchanged), once the caller may
    /// do what it asks: `chmod` by the owner or root (a non-member owner's set-gid on a
    /// file dropped), `chown` by root or, for the group only, the owner; a change of
    /// owner or group drops a file's set-uid (and group-executable set-gid) bits;
    /// explicit times by the owner or root, the current time also by a writer.
    fn permitted_mode(
        &self,
        ino: InodeId,
        path: &str,
        req: &SetAttr,
        who: Option<&stampfs_proto::Caller>,
    ) -> Result<Option<u32>> {
        let Some(inode) = self.ns.get(ino) else {
            return Err(Error::NotFound { path: path.into() });
        };
        let refused = |reason: &str| Error::NotPermitted {
            path: path.to_string(),
            reason: reason.to_string(),
        };
        let cur = inode.attr;
        let is_file = inode.as_file().is_some();
        let mut mode = match req.mode {
            Some(m) => Some(crate::perm::chmod(&cur, m, who).map_err(refused)?),
            None => None,
        };
        if req.uid.is_some() || req.gid.is_some() {
            let base = stampfs_proto::Attr {
                mode: mode.unwrap_or(cur.mode),
                ..cur
            };
            let m = crate::perm::chown(&base, is_file, req.uid, req.gid, who).map_err(refused)?;
            if m != base.mode || mode.is_some() {
                mode = Some(m);
            }
        }
        if req.atime.is_some() || req.mtime.is_some() {
            let explicit = [req.atime, req.mtime]
                .iter()
                .any(|t| matches!(t, Some(SetTime::At(_))));
            crate::perm::set_times(&cur, explicit, who).map_err(|reason| {
                if explicit || crate::perm::owns(&cur, who) {
                    refused(reason)
                } else {
                    Error::PermissionDenied {
                        path: path.to_string(),
                        reason: reason.to_string(),
                    }
                }
            })?;
        }
        Ok(mode)
    }

    /// Whether a read of `ino` at `mtime_ms` moves its access time, by the rules of
    /// Linux's `relatime`: when the access time is not after the modification or
    /// change time, or is a day old. Returns the record that does it.
    pub fn access(&self, ino: InodeId, mtime_ms: u64) -> Option<Record> {
        let a = self.ns.get(ino)?.attr;
        let now = namespace::ms_to_ns(mtime_ms);
        let stale = a.atime_ns <= a.mtime_ns
            || a.atime_ns <= a.ctime_ns
            || now.saturating_sub(a.atime_ns) >= RELATIME_NS;
        (stale && now > a.atime_ns).then_some(Record::SetAttr {
            inode: ino,
            mode: None,
            uid: None,
            gid: None,
            atime_ns: Some(now),
            mtime_ns: None,
            ctime_ns: None,
        })
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
        self.rename_from(req, false, now_ms, mtime_ms)
    }

    /// `stampfs trash restore`: the entry at `req.path`, inside a bucket of the trash,
    /// moves to `req.to`, outside the trash (which must not exist). Answers its status
    /// there.
    pub fn restore_trash(
        &mut self,
        req: &RestoreTrash,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<FileStatus> {
        let src = namespace::components(&req.path)?;
        // An entry of the older flat layout (`/.trash/<ms>-<inode>-<name>`), which
        // only root reaches, is restored by its path too.
        let flat = matches!(src.as_slice(), [dir, name] if *dir == trash::DIR && trash::deleted_at(name).is_some());
        if trash::original(&src).is_none() && !flat {
            return Err(Error::bad_request(format!(
                "{} is not an entry in the trash (/{}/<user>/{}/<path> or a checkpoint)",
                join(&src),
                trash::DIR,
                trash::CURRENT
            )));
        }
        let to = namespace::components(&req.to)?;
        if to.first() == Some(&trash::DIR) {
            return Err(Error::bad_request(format!(
                "a restore goes out of the trash, not to {}",
                join(&to)
            )));
        }
        let rename = Rename {
            src: join(&src),
            dst: join(&to),
            replace: false,
            caller: req.caller.clone(),
        };
        self.rename_from(&rename, true, now_ms, mtime_ms)?;
        let ino = self.ns.resolve(&to)?;
        self.status(join(&to), ino)
    }

    /// A rename; one out of the trash only for a restore (`restoring`).
    fn rename_from(
        &mut self,
        req: &Rename,
        restoring: bool,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<()> {
        let src = namespace::components(&req.src)?;
        let dst = namespace::components(&req.dst)?;
        if src.is_empty() {
            return Err(Error::bad_request("cannot rename /"));
        }
        let in_trash = |c: &[&str]| c.first() == Some(&trash::DIR);
        if src.len() == 1 && in_trash(&src) {
            return Err(Error::NotPermitted {
                path: join(&src),
                reason: "the trash itself cannot be renamed".into(),
            });
        }
        if in_trash(&src) && !in_trash(&dst) && !restoring {
            return Err(Error::NotPermitted {
                path: join(&src),
                reason: "entries leave the trash only by `stampfs trash restore`".into(),
            });
        }
        // A user's directory and its buckets (`Current`, the checkpoints named by
        // their time) are the master's to make, rename and expire; nothing else goes
        // at their level. (An entry of the older flat layout may leave.)
        let own_level = |c: &[&str]| in_trash(c) && c.len() <= 3;
        let flat = src.len() == 2 && trash::deleted_at(src[1]).is_some();
        let refused = if own_level(&src) && !flat {
            Some(&src)
        } else if own_level(&dst) {
            Some(&dst)
        } else {
            None
        };
        if let Some(c) = refused {
            return Err(Error::NotPermitted {
                path: join(c),
                reason: "the trash's own directories are not renamed (only entries in them)".into(),
            });
        }
        let who = req.caller.as_ref();
        self.search(&src, who)?;
        self.search(&dst, who)?;
        let ino = self.ns.resolve(&src)?;
        if dst.is_empty() {
            return Err(Error::AlreadyExists { path: join(&dst) });
        }
        let (src_parent, src_name) = self.ns.resolve_parent(&src)?;
        let (dst_parent, dst_name) = self.ns.resolve_parent(&dst)?;
        let replaced = match self.ns.child(dst_parent, dst_name) {
            None => None,
            Some(_) if !req.replace => return Err(Error::AlreadyExists { path: join(&dst) }),
            // The same entry under both names: rename(2) does nothing.
            Some(old) if old == ino => return Ok(()),
            Some(old) => Some(self.check_replaceable(ino, old, &dst)?),
        };
        let (src_dir, dst_dir) = (join(&src[..src.len() - 1]), join(&dst[..dst.len() - 1]));
        self.require_removable(src_parent, &src_dir, ino, &join(&src), who)?;
        self.require_dir_write(dst_parent, &dst_dir, who)?;
        if src_parent != dst_parent && self.ns.get(ino).and_then(Inode::as_dir).is_some() {
            // Its ".." changes.
            self.require(ino, &join(&src), who, crate::perm::WRITE)?;
        }
        if self.ns.is_within(dst_parent, ino) {
            return Err(Error::bad_request(format!(
                "cannot move {} into itself ({})",
                join(&src),
                join(&dst)
            )));
        }
        self.check_move_quota(ino, dst_parent, replaced)?;
        let rec = match replaced {
            None => Record::Rename {
                src_parent,
                src_name: src_name.to_string(),
                dst_parent,
                dst_name: dst_name.to_string(),
                mtime_ms,
            },
            Some(replaced) => {
                self.require_removable(dst_parent, &dst_dir, replaced, &join(&dst), who)?;
                Record::RenameOver {
                    src_parent,
                    src_name: src_name.to_string(),
                    dst_parent,
                    dst_name: dst_name.to_string(),
                    replaced,
                    mtime_ms,
                }
            }
        };
        self.commit(rec, now_ms)?;
        Ok(())
    }

    /// Whether `src` may replace `old` (at `dst`) in a rename: a directory only an
    /// empty directory, anything else only what is not a directory (rename(2)).
    fn check_replaceable(&self, src: InodeId, old: InodeId, dst: &[&str]) -> Result<InodeId> {
        let path = join(dst);
        let src_dir = self.ns.get(src).and_then(Inode::as_dir).is_some();
        match (src_dir, self.ns.get(old).and_then(Inode::as_dir)) {
            (true, None) => Err(Error::NotADirectory { path }),
            (false, Some(_)) => Err(Error::IsADirectory { path }),
            (true, Some(d)) if !d.children.is_empty() => Err(Error::DirectoryNotEmpty { path }),
            _ => Ok(old),
        }
    }

    /// `rm`: into the trash when the master keeps one (see [`trash`]), else at once.
    pub fn delete(&mut self, req: &Delete, now_ms: u64, mtime_ms: u64) -> Result<()> {
        self.remove(
            &req.path,
            req.recursive,
            req.caller.as_ref(),
            true,
            now_ms,
            mtime_ms,
        )
    }

    /// `rm --skip-trash`: at once.
    pub fn delete_now(&mut self, req: &DeleteNow, now_ms: u64, mtime_ms: u64) -> Result<()> {
        self.remove(
            &req.path,
            req.recursive,
            req.caller.as_ref(),
            false,
            now_ms,
            mtime_ms,
        )
    }

    fn remove(
        &mut self,
        path: &str,
        recursive: bool,
        who: Option<&Caller>,
        to_trash: bool,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<()> {
        let comps = namespace::components(path)?;
        if comps.is_empty() {
            return Err(Error::bad_request("cannot delete /"));
        }
        self.search(&comps, who)?;
        let ino = self.ns.resolve(&comps)?;
        if let Some(d) = self.ns.get(ino).and_then(Inode::as_dir) {
            if !d.children.is_empty() && !recursive {
                return Err(Error::DirectoryNotEmpty { path: join(&comps) });
            }
        }
        let (parent, name) = self.ns.resolve_parent(&comps)?;
        let path = join(&comps);
        self.require_removable(parent, &join(&comps[..comps.len() - 1]), ino, &path, who)?;
        self.require_subtree_removable(ino, &path, who)?;
        let in_trash = comps.first() == Some(&trash::DIR);
        if to_trash && self.settings.trash_ms > 0 && !in_trash {
            if let Some((dst_parent, dst_name)) = self.trash_place(&comps, who, now_ms, mtime_ms)? {
                self.commit(
                    Record::Rename {
                        src_parent: parent,
                        src_name: name.to_string(),
                        dst_parent,
                        dst_name: dst_name.clone(),
                        mtime_ms,
                    },
                    now_ms,
                )?;
                tracing::info!(path = %join(&comps), "moved to the trash");
                return Ok(());
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

    /// Where the entry at `comps`, removed by `who`, goes in the trash:
    /// `/.trash/<user>/Current/<comps>`, the directories on the way made (one record)
    /// and taken names made unique ([`trash::taken_name`]). `None` when `/.trash` is
    /// taken by a file (then `rm` deletes at once).
    fn trash_place(
        &mut self,
        comps: &[&str],
        who: Option<&Caller>,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<Option<(InodeId, String)>> {
        let Some(bin) = self.trash_dir(now_ms, mtime_ms)? else {
            return Ok(None);
        };
        let (uid, gid) = who.map_or((0, 0), |c| (c.uid, c.gid));
        let user = self
            .users
            .iter()
            .find(|(_, u)| u.uid == uid)
            .map(|(n, _)| n.as_str());
        // The user's own directory: one they own. A name taken by another uid's
        // (a user removed and added again, a user called `uid-<n>`) gets the uid
        // appended.
        let mut udir = trash::user_dir(user, uid);
        for attempt in 0..2 {
            match self.ns.child(bin, &udir).and_then(|c| self.ns.get(c)) {
                Some(i) if i.as_dir().is_none() || i.attr.uid != uid => {
                    if attempt == 1 {
                        return Err(Error::NotPermitted {
                            path: format!("/{}/{udir}", trash::DIR),
                            reason: format!("taken by uid {}, not this user's", i.attr.uid),
                        });
                    }
                    udir = format!("{udir}.{uid}");
                }
                _ => break,
            }
        }
        let mut dirs: Vec<String> = vec![udir, trash::CURRENT.to_string()];
        dirs.extend(comps[..comps.len() - 1].iter().map(|c| c.to_string()));
        let is_dir = |st: &Self, ino| st.ns.get(ino).and_then(Inode::as_dir).is_some();
        let mut parent = bin;
        let mut make: Vec<(String, InodeId)> = Vec::new();
        let mut next = self.ns.next_inode().0;
        for d in dirs {
            if !make.is_empty() {
                make.push((d, InodeId(next)));
                next += 1;
                continue;
            }
            // The directory itself, or a second name for it when something that is
            // not a directory took its name.
            let found = (0..MAX_TAKEN).find_map(|n| {
                let name = if n == 0 {
                    d.clone()
                } else {
                    trash::taken_name(&d, mtime_ms, n - 1)
                };
                match self.ns.child(parent, &name) {
                    Some(c) if is_dir(self, c) => Some(Ok(c)),
                    Some(_) => None,
                    None => Some(Err(name)),
                }
            });
            match found {
                Some(Ok(c)) => parent = c,
                Some(Err(name)) => {
                    make.push((name, InodeId(next)));
                    next += 1;
                }
                None => return Err(taken(&d)),
            }
        }
        if let Some(last) = make.last().map(|m| m.1) {
            self.commit(
                Record::WithAttr {
                    record: Box::new(Record::Mkdir {
                        parent,
                        dirs: make,
                        mtime_ms,
                    }),
                    attr: NewAttr {
                        mode: TRASH_USER_MODE,
                        uid,
                        gid,
                    },
                },
                now_ms,
            )?;
            parent = last;
        }
        let base = comps[comps.len() - 1];
        let name = (0..MAX_TAKEN)
            .map(|n| {
                if n == 0 {
                    base.to_string()
                } else {
                    trash::taken_name(base, mtime_ms, n - 1)
                }
            })
            .find(|name| self.ns.child(parent, name).is_none())
            .ok_or_else(|| taken(base))?;
        Ok(Some((parent, name)))
    }

    /// The trash directory, created when missing; `None` when `/.trash` is taken by a
    /// file (then `rm` deletes at once).
    pub(super) fn trash_dir(&mut self, now_ms: u64, mtime_ms: u64) -> Result<Option<InodeId>> {
        if let Some(t) = self.ns.child(ROOT, trash::DIR) {
            let Some(a) = self
                .ns
                .get(t)
                .filter(|i| i.as_dir().is_some())
                .map(|i| i.attr)
            else {
                tracing::warn!(
                    "/{} is not a directory; removing without the trash",
                    trash::DIR
                );
                return Ok(None);
            };
            // A trash from an older version (0755 before permissions, 0700 before the
            // users' own directories) becomes root's, passable, listed by root alone;
            // but not while it holds entries of the flat layout, which left the
            // protection of their old directories: root alone reaches them until
            // they expire (the users' own trash waits for that).
            let flat = |st: &Self| {
                st.ns.get(t).and_then(Inode::as_dir).is_some_and(|d| {
                    d.children
                        .iter()
                        .any(|(n, _)| trash::deleted_at(n).is_some() && st.user(n).is_none())
                })
            };
            let mode = if flat(self) { 0o700 } else { TRASH_MODE };
            if (a.mode, a.uid, a.gid) != (mode, 0, 0) {
                self.commit(
                    Record::SetAttr {
                        inode: t,
                        mode: Some(mode),
                        uid: Some(0),
                        gid: Some(0),
                        atime_ns: None,
                        mtime_ns: None,
                        ctime_ns: Some(namespace::ms_to_ns(mtime_ms)),
                    },
                    now_ms,
                )?;
            }
            return Ok(Some(t));
        }
        let ino = self.ns.next_inode();
        self.commit(
            Record::WithAttr {
                record: Box::new(Record::Mkdir {
                    parent: ROOT,
                    dirs: vec![(trash::DIR.to_string(), ino)],
                    mtime_ms,
                }),
                attr: NewAttr {
                    mode: TRASH_MODE,
                    uid: 0,
                    gid: 0,
                },
            },
            now_ms,
        )?;
        Ok(Some(ino))
    }
}
