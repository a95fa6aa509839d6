//! Directory quotas, as HDFS's, as methods of [`MasterState`].
//!
//! **What counts.** A directory with a quota ([`MasterState::quotas`]) has a limit on
//! *names* (every file, directory and link below it, the directory itself included:
//! a name quota of 1 keeps it empty) and one on *bytes*, which count once per replica:
//! a closed file charges its length times its replication factor, and a file open for
//! writing (or in lease recovery) charges each of its chunks whole, as HDFS charges a
//! block under construction at its full size. That is what makes the check at the
//! grant of a chunk sufficient: once a writer has its chunk, nothing it writes into
//! it can take the directory further past its limit.
//!
//! **Where it is kept.** The limits are persisted (`Record::SetQuota`, checkpoints);
//! what each quota'd directory's subtree uses is soft: a walk of the subtree computes
//! it when the quota is set or a checkpoint is loaded, and every record that changes
//! it afterwards adjusts it (see [`MasterState::quota_before`] and
//! [`MasterState::quota_after`]), so replay rebuilds exactly what the serving master
//! had. A directory without a quota costs nothing; a record costs a walk up its
//! entry's ancestors once any quota exists, and a walk of a moved or removed subtree
//! only when a quota'd directory is on one side of it and not the other.
//!
//! **Where it is enforced.** The requests that would add names or bytes under a
//! quota'd directory check every quota'd ancestor before they commit, and refuse with
//! [`Error::QuotaExceeded`] (`EDQUOT` through the mount): create, mkdir, symlink, a
//! rename into another quota'd tree (including a restore from the trash), the grant of
//! a new chunk, a reopen for writing, and a higher replication factor. A limit may be
//! set below what is in use: nothing is removed, and nothing more fits until enough
//! is. The master's own moves (into the trash, lease recovery, replica health) are
//! never refused: they add nothing to a user's tree.

use super::{MasterState, Record};
use crate::error::{Error, Result};
use crate::namespace::{self, FileMeta, InodeKind, WriteState, ROOT};
use bincode::{Decode, Encode};
use stampfs_proto::{
    GetQuota, InodeId, QuotaChange, QuotaReport, QuotaResource, QuotaUse, SetQuota,
};

/// A directory's limits (persisted); `None` where it has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct QuotaLimits {
    pub names: Option<u64>,
    pub bytes: Option<u64>,
}

impl QuotaLimits {
    /// Neither limit set: the directory has no quota.
    pub fn is_empty(&self) -> bool {
        self.names.is_none() && self.bytes.is_none()
    }
}

/// What a subtree counts against a quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub names: u64,
    pub bytes: u64,
}

impl Usage {
    pub const ZERO: Usage = Usage { names: 0, bytes: 0 };

    pub fn names(n: u64) -> Self {
        Usage { names: n, bytes: 0 }
    }

    pub fn bytes(n: u64) -> Self {
        Usage { names: 0, bytes: n }
    }

    fn plus(self, o: Usage) -> Usage {
        Usage {
            names: self.names.saturating_add(o.names),
            bytes: self.bytes.saturating_add(o.bytes),
        }
    }

    fn minus(self, o: Usage) -> Usage {
        Usage {
            names: self.names.saturating_sub(o.names),
            bytes: self.bytes.saturating_sub(o.bytes),
        }
    }
}

/// A quota'd directory: its limits (persisted) and its subtree's use (soft).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub limits: QuotaLimits,
    pub used: Usage,
}

/// What a record is about to change in the use of quota'd directories, taken before
/// it applies ([`MasterState::quota_before`]).
#[derive(Debug, Default)]
pub(super) struct QuotaEffect {
    /// The file whose charge may change, with its charge before.
    file: Option<(InodeId, u64)>,
    /// Usage added under a directory (new entries).
    added: Vec<(InodeId, Usage)>,
    /// Usage removed from under a directory (removed or replaced entries).
    removed: Vec<(InodeId, Usage)>,
    /// A subtree moved from under the first directory to under the second.
    moved: Option<(InodeId, InodeId, Usage)>,
    /// Entries are removed: quotas of removed directories go.
    prune: bool,
}

impl MasterState {
    /// The bytes `f` counts against quotas: its length times its replication factor,
    /// or, open or in recovery, each of its chunks whole.
    pub fn charged_bytes(&self, f: &FileMeta) -> u64 {
        let length = match f.write {
            WriteState::Closed => self.file_length(f),
            _ => (f.chunks.len() as u64).saturating_mul(f.chunk_size),
        };
        length.saturating_mul(u64::from(f.replication))
    }

    /// What the subtree at `ino` (itself included) counts against a quota.
    pub fn subtree_usage(&self, ino: InodeId) -> Usage {
        let mut used = Usage::ZERO;
        let mut stack = vec![ino];
        while let Some(i) = stack.pop() {
            let Some(node) = self.ns.get(i) else { continue };
            used.names += 1;
            match &node.kind {
                InodeKind::Dir(d) => stack.extend(d.children.values().copied()),
                InodeKind::File(f) => used.bytes = used.bytes.saturating_add(self.charged_bytes(f)),
                InodeKind::Symlink(_) => {}
            }
        }
        used
    }

    /// The quota'd directories among `ino` and its ancestors, nearest first.
    fn quota_dirs(&self, mut ino: InodeId) -> Vec<InodeId> {
        let mut dirs = Vec::new();
        if self.quotas.is_empty() {
            return dirs;
        }
        // Bounded: a namespace's depth never exceeds its size.
        for _ in 0..=self.ns.len() {
            if self.quotas.contains_key(&ino) {
                dirs.push(ino);
            }
            if ino == ROOT {
                break;
            }
            match self.ns.get(ino) {
                Some(i) => ino = i.parent,
                None => break,
            }
        }
        dirs
    }

    /// Adds `plus` to, then takes `minus` from, the use of every quota'd directory
    /// among `dir` and its ancestors.
    fn charge(&mut self, dir: InodeId, plus: Usage, minus: Usage) {
        for q in self.quota_dirs(dir) {
            if let Some(quota) = self.quotas.get_mut(&q) {
                quota.used = quota.used.plus(plus).minus(minus);
            }
        }
    }

    /// What `rec` will change in the use of quota'd directories, read from the state
    /// before it applies (nothing when no directory has a quota).
    pub(super) fn quota_before(&self, rec: &Record) -> QuotaEffect {
        let mut e = QuotaEffect::default();
        if self.quotas.is_empty() {
            return e;
        }
        let usage_of = |parent: InodeId, name: &str| -> Usage {
            self.ns
                .child(parent, name)
                .map_or(Usage::ZERO, |c| self.subtree_usage(c))
        };
        match rec {
            Record::WithAttr { record, .. } => return self.quota_before(record),
            Record::Mkdir { parent, dirs, .. } => {
                e.added.push((*parent, Usage::names(dirs.len() as u64)));
            }
            Record::Symlink { parent, .. } => e.added.push((*parent, Usage::names(1))),
            Record::Create {
                parent, replaces, ..
            } => {
                if self.quota_dirs(*parent).is_empty() {
                    return e;
                }
                e.added.push((*parent, Usage::names(1)));
                if let Some(old) = replaces {
                    e.removed.push((*parent, self.subtree_usage(*old)));
                }
            }
            Record::Delete { parent, name, .. } => {
                // Whatever is above it: the subtree may hold quota'd directories.
                e.prune = true;
                if !self.quota_dirs(*parent).is_empty() {
                    e.removed.push((*parent, usage_of(*parent, name)));
                }
            }
            Record::Rename {
                src_parent,
                src_name,
                dst_parent,
                ..
            } => e.moved = self.quota_move(*src_parent, src_name, *dst_parent),
            Record::RenameOver {
                src_parent,
                src_name,
                dst_parent,
                replaced,
                ..
            } => {
                e.moved = self.quota_move(*src_parent, src_name, *dst_parent);
                // The replaced entry may be an empty quota'd directory.
                e.prune = true;
                if !self.quota_dirs(*dst_parent).is_empty() {
                    e.removed.push((*dst_parent, self.subtree_usage(*replaced)));
                }
            }
            Record::Reopen { inode, .. }
            | Record::AddChunk { inode, .. }
            | Record::AbandonChunk { inode, .. }
            | Record::ChunkOpened { inode, .. }
            | Record::ChunksDropped { inode, .. }
            | Record::CutChunk { inode, .. }
            | Record::Close { inode, .. }
            | Record::RecoveryStarted { inode, .. }
            | Record::RecoveryCommitted { inode, .. }
            | Record::RecoveryQueued { inode }
            | Record::Granted { inode, .. }
            | Record::GrantedPipeline { inode, .. }
            | Record::SetReplication { inode, .. } => {
                if let Some(f) = self.ns.file(*inode) {
                    if !self.quota_dirs(*inode).is_empty() {
                        e.file = Some((*inode, self.charged_bytes(f)));
                    }
                }
            }
            Record::SetVersion { .. }
            | Record::RegisterChunkserver { .. }
            | Record::SetXattr { .. }
            | Record::SetAttr { .. }
            | Record::UserAdded { .. }
            | Record::UserRemoved { .. }
            | Record::ClientOwner { .. }
            | Record::CallDone { .. }
            | Record::Decommission { .. }
            | Record::SetQuota { .. } => {}
        }
        e
    }

    /// A move of `src_parent/src_name` under `dst_parent`: the use it carries, when
    /// the quota'd directories above the two sides differ.
    fn quota_move(
        &self,
        src_parent: InodeId,
        src_name: &str,
        dst_parent: InodeId,
    ) -> Option<(InodeId, InodeId, Usage)> {
        if self.quota_dirs(src_parent) == self.quota_dirs(dst_parent) {
            return None;
        }
        let src = self.ns.child(src_parent, src_name)?;
        Some((src_parent, dst_parent, self.subtree_usage(src)))
    }

    /// Applies what [`MasterState::quota_before`] found, once the record has applied.
    pub(super) fn quota_after(&mut self, e: QuotaEffect) {
        if let Some((ino, before)) = e.file {
            let after = self.ns.file(ino).map_or(0, |f| self.charged_bytes(f));
            if after != before {
                let (plus, minus) = if after > before {
                    (Usage::bytes(after - before), Usage::ZERO)
                } else {
                    (Usage::ZERO, Usage::bytes(before - after))
                };
                self.charge(ino, plus, minus);
            }
        }
        for (dir, u) in e.added {
            self.charge(dir, u, Usage::ZERO);
        }
        if let Some((from, to, u)) = e.moved {
            self.charge(to, u, Usage::ZERO);
            self.charge(from, Usage::ZERO, u);
        }
        for (dir, u) in e.removed {
            self.charge(dir, Usage::ZERO, u);
        }
        if e.prune {
            // A removed subtree takes its quotas with it (a replaced entry is a file
            // or an empty directory; a `Create` replaces only files).
            let ns = &self.ns;
            self.quotas.retain(|ino, _| ns.get(*ino).is_some());
        }
    }

    /// `Record::SetQuota`: the limits of directory `ino` become `limits` (none: its
    /// quota goes); a new quota's use is its subtree's, walked now.
    pub(super) fn apply_set_quota(
        &mut self,
        ino: InodeId,
        limits: QuotaLimits,
    ) -> std::result::Result<(), String> {
        if self.ns.get(ino).and_then(|i| i.as_dir()).is_none() {
            return Err(format!("a quota on {ino}, not a directory"));
        }
        if limits.is_empty() {
            self.quotas.remove(&ino);
        } else if let Some(q) = self.quotas.get_mut(&ino) {
            q.limits = limits;
        } else {
            let used = self.subtree_usage(ino);
            self.quotas.insert(ino, Quota { limits, used });
        }
        Ok(())
    }

    /// Recomputes every quota'd directory's use from its subtree (after a checkpoint
    /// loads), dropping quotas whose directory is gone.
    pub(super) fn rebuild_quota_usage(&mut self) {
        let dirs: Vec<InodeId> = self.quotas.keys().copied().collect();
        for ino in dirs {
            if self.ns.get(ino).and_then(|i| i.as_dir()).is_none() {
                self.quotas.remove(&ino);
                continue;
            }
            let used = self.subtree_usage(ino);
            if let Some(q) = self.quotas.get_mut(&ino) {
                q.used = used;
            }
        }
    }

    /// Whether adding `add` under `dir` keeps every quota'd directory among it and its
    /// ancestors within its limits. A quota'd directory that holds `moved_from` (the
    /// entry a rename moves) already counts what moves, and is skipped. Refuses with
    /// [`Error::QuotaExceeded`], naming the nearest directory it would pass.
    pub(super) fn check_quota(
        &self,
        dir: InodeId,
        add: Usage,
        moved_from: Option<InodeId>,
    ) -> Result<()> {
        if add == Usage::ZERO {
            return Ok(());
        }
        for q in self.quota_dirs(dir) {
            if moved_from.is_some_and(|src| self.ns.is_within(src, q)) {
                continue;
            }
            let Some(quota) = self.quotas.get(&q) else {
                continue;
            };
            let over = |limit: Option<u64>, used: u64, requested: u64| {
                limit.filter(|l| requested > 0 && used.saturating_add(requested) > *l)
            };
            let (resource, limit, used, requested) =
                if let Some(l) = over(quota.limits.names, quota.used.names, add.names) {
                    (QuotaResource::Names, l, quota.used.names, add.names)
                } else if let Some(l) = over(quota.limits.bytes, quota.used.bytes, add.bytes) {
                    (QuotaResource::Bytes, l, quota.used.bytes, add.bytes)
                } else {
                    continue;
                };
            return Err(Error::QuotaExceeded {
                path: self.ns.path_of(q).unwrap_or_else(|| q.to_string()),
                resource,
                limit,
                used,
                requested,
            });
        }
        Ok(())
    }

    /// Whether a write that grows the charge of file `ino` by `bytes` fits the
    /// quotas above it.
    pub(super) fn check_file_growth(&self, ino: InodeId, bytes: u64) -> Result<()> {
        self.check_quota(ino, Usage::bytes(bytes), None)
    }

    /// Whether moving the entry `src` under `dst_parent` (over `replaced`) keeps the
    /// quota'd directories above `dst_parent` that do not hold it already within
    /// their limits. Walks the moved subtree only when there is such a directory.
    pub(super) fn check_move_quota(
        &self,
        src: InodeId,
        dst_parent: InodeId,
        replaced: Option<InodeId>,
    ) -> Result<()> {
        let gaining = self
            .quota_dirs(dst_parent)
            .into_iter()
            .any(|q| !self.ns.is_within(src, q));
        if !gaining {
            return Ok(());
        }
        let moved = self.subtree_usage(src);
        let freed = replaced.map_or(Usage::ZERO, |r| self.subtree_usage(r));
        self.check_quota(dst_parent, moved.minus(freed), Some(src))
    }

    /// `stampfs admin quota set|clear`: changes the limits of the directory at
    /// `req.path` (superusers only: the connection handler checks). A limit of 0 is
    /// refused (a directory counts itself, so a name quota of 0 could never hold).
    pub fn set_quota(&mut self, req: &SetQuota, now_ms: u64) -> Result<QuotaReport> {
        let comps = namespace::components(&req.path)?;
        let path = namespace::join(&comps);
        let ino = self.ns.resolve(&comps)?;
        if self.ns.get(ino).and_then(|i| i.as_dir()).is_none() {
            return Err(Error::NotADirectory { path });
        }
        let current = self.quotas.get(&ino).map(|q| q.limits).unwrap_or_default();
        let change = |now: Option<u64>, c: QuotaChange, what: &str| match c {
            QuotaChange::Keep => Ok(now),
            QuotaChange::Clear => Ok(None),
            QuotaChange::Set(0) => Err(Error::bad_request(format!(
                "a {what} quota must be at least 1 (clear it to remove the limit)"
            ))),
            QuotaChange::Set(n) => Ok(Some(n)),
        };
        let limits = QuotaLimits {
            names: change(current.names, req.names, "name")?,
            bytes: change(current.bytes, req.bytes, "space")?,
        };
        if limits != current {
            self.commit(Record::SetQuota { inode: ino, limits }, now_ms)?;
        }
        Ok(self.quota_report(path, ino))
    }

    /// `stampfs count -q`, `admin quota get`: the quotas of the entry at `req.path`
    /// (no limits for an entry without a quota). The caller must be able to look it up.
    pub fn get_quota(&self, req: &GetQuota) -> Result<QuotaReport> {
        self.check_access(&req.path, req.caller.as_ref(), 0)?;
        let comps = namespace::components(&req.path)?;
        let ino = self.ns.resolve(&comps)?;
        Ok(self.quota_report(namespace::join(&comps), ino))
    }

    /// Every quota'd directory, by inode.
    pub fn list_quotas(&self) -> Vec<QuotaReport> {
        self.quotas
            .keys()
            .filter_map(|ino| Some(self.quota_report(self.ns.path_of(*ino)?, *ino)))
            .collect()
    }

    fn quota_report(&self, path: String, ino: InodeId) -> QuotaReport {
        let q = self.quotas.get(&ino);
        let limit = |l: Option<u64>, used: u64| l.map(|limit| QuotaUse { limit, used });
        QuotaReport {
            path,
            names: q.and_then(|q| limit(q.limits.names, q.used.names)),
            bytes: q.and_then(|q| limit(q.limits.bytes, q.used.bytes)),
        }
    }
}
