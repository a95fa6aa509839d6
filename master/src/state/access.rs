//! Permission checks of the namespace requests, as methods of [`MasterState`]: the
//! decisions are [`crate::perm`]'s; these find the attributes they decide on and name
//! the path in the error. Every check runs before anything is committed.

use super::MasterState;
use crate::error::{Error, Result};
use crate::namespace::{join, InodeKind};
use crate::perm::{self, EXEC, READ, WRITE};
use stampfs_proto::{Attr, Caller, InodeId, NewAttr, MAX_GROUPS};

/// What a permission mask asks for, for error messages.
fn wanted(want: u32) -> &'static str {
    match want {
        READ => "read permission",
        WRITE => "write permission",
        EXEC => "search permission",
        w if w == WRITE | EXEC => "write and search permission",
        w if w == READ | EXEC => "read and search permission",
        _ => "permission",
    }
}

impl MasterState {
    fn attr_of(&self, ino: InodeId) -> Attr {
        self.ns.get(ino).map(|i| i.attr).unwrap_or_default()
    }

    /// Refuses a caller naming more supplementary groups than [`MAX_GROUPS`].
    pub(super) fn check_caller(&self, who: Option<&Caller>) -> Result<()> {
        match who {
            Some(c) if c.groups.len() > MAX_GROUPS => Err(Error::bad_request(format!(
                "a caller in {} groups (at most {MAX_GROUPS})",
                c.groups.len()
            ))),
            _ => Ok(()),
        }
    }

    /// Search permission on every directory a lookup of `comps` passes through (the
    /// root and each directory named before the last component), as far as they
    /// exist: a missing or non-directory component is left to the lookup that follows,
    /// which names it.
    pub(super) fn search(&self, comps: &[&str], who: Option<&Caller>) -> Result<()> {
        self.check_caller(who)?;
        if perm::is_root(who) {
            return Ok(());
        }
        let mut cur = crate::namespace::ROOT;
        for (i, name) in comps.iter().enumerate() {
            let Some(inode) = self.ns.get(cur) else {
                return Ok(());
            };
            if !matches!(inode.kind, InodeKind::Dir(_)) {
                return Ok(());
            }
            if !perm::allows(&inode.attr, who, EXEC) {
                return Err(Error::PermissionDenied {
                    path: join(&comps[..i]),
                    reason: "no search permission on this directory".into(),
                });
            }
            match self.ns.child(cur, name) {
                Some(next) => cur = next,
                None => return Ok(()),
            }
        }
        Ok(())
    }

    /// `want` (a mask of [`READ`], [`WRITE`], [`EXEC`]) on `ino`, named `path`.
    pub(super) fn require(
        &self,
        ino: InodeId,
        path: &str,
        who: Option<&Caller>,
        want: u32,
    ) -> Result<()> {
        if perm::allows(&self.attr_of(ino), who, want) {
            return Ok(());
        }
        Err(Error::PermissionDenied {
            path: path.to_string(),
            reason: format!("no {}", wanted(want)),
        })
    }

    /// An entry may be added to or removed from the directory `dir` (`dir_path`):
    /// write and search permission on it.
    pub(super) fn require_dir_write(
        &self,
        dir: InodeId,
        dir_path: &str,
        who: Option<&Caller>,
    ) -> Result<()> {
        self.require(dir, dir_path, who, WRITE | EXEC)
    }

    /// `entry` (`path`) may leave the directory `dir`: write and search permission on
    /// it, and under a sticky directory only for the entry's or the directory's owner.
    pub(super) fn require_removable(
        &self,
        dir: InodeId,
        dir_path: &str,
        entry: InodeId,
        path: &str,
        who: Option<&Caller>,
    ) -> Result<()> {
        self.require_dir_write(dir, dir_path, who)?;
        if perm::sticky_allows(&self.attr_of(dir), &self.attr_of(entry), who) {
            return Ok(());
        }
        Err(Error::NotPermitted {
            path: path.to_string(),
            reason: format!(
                "{dir_path} is sticky: only the entry's owner, the directory's owner or root \
                 may remove or rename it"
            ),
        })
    }

    /// Removing `ino` (`path`) with everything below it: every directory of the
    /// subtree must let `who` list and empty it, and each entry leave it.
    pub(super) fn require_subtree_removable(
        &self,
        ino: InodeId,
        path: &str,
        who: Option<&Caller>,
    ) -> Result<()> {
        if perm::is_root(who) {
            return Ok(());
        }
        let mut stack = vec![(ino, path.to_string())];
        while let Some((dir, dir_path)) = stack.pop() {
            let Some(d) = self.ns.get(dir).and_then(|i| i.as_dir()) else {
                continue;
            };
            if d.children.is_empty() {
                continue;
            }
            self.require(dir, &dir_path, who, READ | WRITE | EXEC)?;
            for (name, child) in &d.children {
                let child_path = format!("{}/{name}", dir_path.trim_end_matches('/'));
                self.require_removable(dir, &dir_path, *child, &child_path, who)?;
                stack.push((*child, child_path));
            }
        }
        Ok(())
    }

    /// The mode and owner a new entry under `parent` is created with: the creator's
    /// (`attr`; without one a non-root caller's own ids and `default_mode`), refused
    /// when a non-root caller would create it for someone else, and under a set-gid
    /// directory with the directory's group (a new directory also set-gid). `None`
    /// only when nothing is given and nothing applies: the master's defaults.
    pub(super) fn creator_attr(
        &self,
        parent: InodeId,
        path: &str,
        attr: Option<NewAttr>,
        default_mode: u32,
        is_dir: bool,
        who: Option<&Caller>,
    ) -> Result<Option<NewAttr>> {
        let attr = match (attr, who) {
            (Some(a), _) => Some(a),
            (None, Some(c)) if c.uid != 0 => Some(NewAttr {
                mode: default_mode,
                uid: c.uid,
                gid: c.gid,
            }),
            (None, _) => None,
        };
        let parent_attr = self.attr_of(parent);
        let sgid = parent_attr.mode & 0o2000 != 0;
        let Some(mut a) = attr.or_else(|| {
            sgid.then_some(NewAttr {
                mode: default_mode,
                uid: 0,
                gid: 0,
            })
        }) else {
            return Ok(None);
        };
        perm::may_own(a.uid, a.gid, who).map_err(|reason| Error::NotPermitted {
            path: path.to_string(),
            reason: reason.into(),
        })?;
        (a.gid, a.mode) = perm::inherited(&parent_attr, a.gid, a.mode, is_dir);
        if let Some(c) = who.filter(|c| c.uid != 0) {
            // A file set-gid to a group its creator is not in (one a set-gid
            // directory gave it) drops the bit, as Linux does.
            if !is_dir && !perm::in_group(c, a.gid) {
                a.mode &= !0o2000;
            }
        }
        Ok(Some(a))
    }

    /// Search permission along `path`, then `want` on the entry itself (nothing more
    /// when `want` is 0): what `stat` (0), `list` of a directory and a reader
    /// ([`READ`]), and `append` or `recover` ([`WRITE`]) need.
    pub fn check_access(&self, path: &str, who: Option<&Caller>, want: u32) -> Result<()> {
        let comps = crate::namespace::components(path)?;
        self.search(&comps, who)?;
        if want == 0 {
            return Ok(());
        }
        let ino = self.ns.resolve(&comps)?;
        self.require(ino, &join(&comps), who, want)
    }
}
