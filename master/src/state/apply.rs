//! What each [`Record`] does to the [`MasterState`]: validation against the state it
//! finds, the mutation, and its soft effects (lease timers, the recovery index, granted
//! pipelines, deletions queued for the chunk's replicas). The same function serves a
//! fresh commit and replay, so replay rebuilds exactly what was committed.

use super::{MasterState, Pipeline, Record};
use crate::chunk_table::{server_index, ChunkInfo};
use crate::namespace::{FileMeta, Inode, InodeKind, WriteState};
use stampfs_proto::{ChunkHandle, ChunkVersion, ChunkserverId, InodeId, MODE_BITS};
use std::collections::BTreeSet;
use thin_vec::ThinVec;

impl MasterState {
    /// Applies record `lsn`. Used by [`MasterState::commit`] and by replay; lease timers
    /// of files it opens start at `now_ms`.
    pub fn apply(
        &mut self,
        lsn: u64,
        rec: &Record,
        now_ms: u64,
    ) -> std::result::Result<(), String> {
        if lsn != self.last_lsn + 1 {
            return Err(format!("record {lsn} applied after {}", self.last_lsn));
        }
        let quota = self.quota_before(rec);
        self.apply_one(rec, now_ms)?;
        self.quota_after(quota);
        self.last_lsn = lsn;
        Ok(())
    }

    /// What `rec` does, without the LSN bookkeeping.
    fn apply_one(&mut self, rec: &Record, now_ms: u64) -> std::result::Result<(), String> {
        match rec {
            Record::Mkdir {
                parent,
                dirs,
                mtime_ms,
            } => {
                if let Some((name, _)) = dirs.first() {
                    if self.ns.child(*parent, name).is_some() {
                        return Err(format!("{name:?} already exists in {parent}"));
                    }
                }
                if dirs.iter().any(|(_, ino)| self.ns.get(*ino).is_some()) {
                    return Err("mkdir reuses an inode".into());
                }
                let mut p = *parent;
                for (name, ino) in dirs {
                    self.ns.insert(p, name, *ino, Inode::dir(p, *mtime_ms))?;
                    p = *ino;
                }
            }
            Record::Create {
                parent,
                name,
                inode,
                replication,
                chunk_size,
                client,
                replaces,
                mtime_ms,
            } => {
                if self.ns.get(*inode).is_some() {
                    return Err(format!("create reuses inode {inode}"));
                }
                let existing = self.ns.child(*parent, name);
                if existing != *replaces {
                    return Err(format!(
                        "create of {name:?} expected {replaces:?}, found {existing:?}"
                    ));
                }
                if replaces.is_some() {
                    self.remove_entry(*parent, name, *mtime_ms)?;
                }
                let file = Inode::new(
                    *parent,
                    *mtime_ms,
                    InodeKind::File(FileMeta {
                        replication: *replication,
                        chunk_size: *chunk_size,
                        chunks: ThinVec::new(),
                        write: WriteState::Open {
                            client: *client,
                            granted: ChunkVersion(0),
                        },
                    }),
                );
                self.ns.insert(*parent, name, *inode, file)?;
                self.leases.acquire(*inode, *client, now_ms);
            }
            Record::Symlink {
                parent,
                name,
                inode,
                target,
                mtime_ms,
            } => self.ns.insert(
                *parent,
                name,
                *inode,
                Inode::symlink(*parent, *mtime_ms, target.clone()),
            )?,
            Record::Reopen {
                inode,
                client,
                last,
                mtime_ms,
            } => {
                let f = self
                    .ns
                    .file(*inode)
                    .ok_or(format!("{inode} is not a file"))?;
                if f.write != WriteState::Closed {
                    return Err(format!("{inode} is already open"));
                }
                // Until the reopen's grant goes out, the floor is the version the closed
                // file's replicas hold.
                let granted = self.last_version(f);
                if let Some((h, v)) = last {
                    if f.chunks.last() != Some(h) {
                        return Err(format!("{h} is not the last chunk of {inode}"));
                    }
                    self.set_version(*h, *v)?;
                }
                self.touch_file(*inode, *mtime_ms, |f| {
                    f.write = WriteState::Open {
                        client: *client,
                        granted,
                    }
                });
                self.pipelines.remove(inode);
                self.open_chunks.remove(inode);
                self.leases.acquire(*inode, *client, now_ms);
            }
            Record::AddChunk {
                inode,
                previous,
                handle,
                version,
                mtime_ms,
            } => {
                let f = self.open_file_of(*inode)?;
                let replication = f.replication;
                if let Some(c) = previous {
                    self.check_open_chunk(*inode, f, c.handle)?;
                }
                if version.0 == 0 {
                    return Err("chunk version 0".into());
                }
                self.chunks
                    .insert(*handle, ChunkInfo::new(*version, replication))?;
                if let Some(c) = previous {
                    if let Some(info) = self.chunks.get_mut(c.handle) {
                        info.length = c.length;
                    }
                }
                self.touch_file(*inode, *mtime_ms, |f| {
                    f.chunks.push(*handle);
                    if let WriteState::Open { granted, .. } = &mut f.write {
                        *granted = *version;
                    }
                });
                self.pipelines.remove(inode);
                self.open_chunks.remove(inode);
            }
            Record::ChunkOpened {
                inode,
                previous,
                handle,
                version,
                mtime_ms,
            } => {
                let f = self.open_file_of(*inode)?;
                if let Some(c) = previous {
                    self.check_open_chunk(*inode, f, c.handle)?;
                    if c.handle == *handle {
                        return Err(format!("{inode} is written in {handle} already"));
                    }
                }
                if !f.chunks.contains(handle) {
                    return Err(format!("{handle} is not a chunk of {inode}"));
                }
                let last = f.chunks.last() == Some(handle);
                let chunk_size = f.chunk_size;
                let info = self
                    .chunks
                    .get(*handle)
                    .ok_or(format!("unknown chunk {handle}"))?;
                if !last && info.length != chunk_size {
                    return Err(format!(
                        "{handle} of {inode} is before the last chunk but holds {} of {chunk_size} bytes",
                        info.length
                    ));
                }
                // Until the grant goes out, the floor is the version its replicas hold;
                // a move asked again to the chunk the writer is in already (its first
                // answer lost) keeps the floor the first one set.
                let again = self.open_chunks.get(inode) == Some(handle);
                let floor = match f.write {
                    WriteState::Open { granted, .. } if again => granted.min(info.version),
                    _ => info.version,
                };
                if let Some(c) = previous {
                    if let Some(info) = self.chunks.get_mut(c.handle) {
                        info.length = c.length;
                    }
                }
                self.set_version(*handle, *version)?;
                self.touch_file(*inode, *mtime_ms, |f| {
                    if let WriteState::Open { granted, .. } = &mut f.write {
                        *granted = floor;
                    }
                });
                self.pipelines.remove(inode);
                // The last chunk too: full, it is written all the same (see
                // `open_chunks`).
                self.open_chunks.insert(*inode, *handle);
            }
            Record::ChunksDropped {
                inode,
                previous,
                keep,
                mtime_ms,
            } => {
                let f = self.open_file_of(*inode)?;
                if let Some(c) = previous {
                    self.check_open_chunk(*inode, f, c.handle)?;
                }
                let keep = usize::try_from(*keep)
                    .ok()
                    .filter(|k| *k < f.chunks.len())
                    .ok_or(format!(
                        "keeping {keep} of the {} chunks of {inode}",
                        f.chunks.len()
                    ))?;
                let chunk_size = f.chunk_size;
                let dropped = f.chunks[keep..].to_vec();
                let last = keep.checked_sub(1).map(|i| f.chunks[i]);
                if let Some(h) = last {
                    let length = match previous {
                        Some(c) if c.handle == h => c.length,
                        _ => self.chunks.get(h).map_or(0, |i| i.length),
                    };
                    if length != chunk_size {
                        return Err(format!(
                            "the chunk {h} left last in {inode} holds {length} of {chunk_size} bytes"
                        ));
                    }
                }
                if let Some(c) = previous {
                    if let Some(info) = self.chunks.get_mut(c.handle) {
                        info.length = c.length;
                    }
                }
                for h in dropped {
                    self.forget_chunk(h);
                }
                let granted = last
                    .and_then(|h| self.chunks.get(h))
                    .map_or(ChunkVersion(0), |i| i.version);
                self.touch_file(*inode, *mtime_ms, |f| {
                    f.chunks.truncate(keep);
                    if let WriteState::Open { granted: g, .. } = &mut f.write {
                        *g = granted;
                    }
                });
                self.open_chunks.remove(inode);
                self.pipelines.remove(inode);
            }
            Record::CutChunk {
                inode,
                handle,
                length,
                mtime_ms,
            } => {
                let f = self.open_file_of(*inode)?;
                if f.chunks.last() != Some(handle) {
                    return Err(format!("{handle} is not the last chunk of {inode}"));
                }
                self.check_open_chunk(*inode, f, *handle)?;
                let info = self
                    .chunks
                    .get_mut(*handle)
                    .ok_or(format!("chunk {handle} is unknown"))?;
                if *length > info.length {
                    return Err(format!(
                        "a cut of {handle} to {length} is above its committed {}",
                        info.length
                    ));
                }
                info.length = *length;
                self.touch_file(*inode, *mtime_ms, |_| {});
            }
            Record::AbandonChunk { inode, handle } => {
                let f = self
                    .ns
                    .file(*inode)
                    .ok_or(format!("{inode} is not a file"))?;
                if f.chunks.last() != Some(handle) {
                    return Err(format!("{handle} is not the last chunk of {inode}"));
                }
                if let Some(f) = self.ns.file_mut(*inode) {
                    f.chunks.pop();
                }
                self.forget_chunk(*handle);
                self.open_chunks.remove(inode);
                // The previous chunk is the last again, at the version its writer held.
                let granted = self
                    .ns
                    .file(*inode)
                    .map_or(ChunkVersion(0), |f| self.last_version(f));
                self.touch_file(*inode, 0, |f| {
                    if let WriteState::Open { granted: g, .. } = &mut f.write {
                        *g = granted;
                    }
                });
                self.pipelines.remove(inode);
            }
            Record::SetVersion { handle, version } => self.set_version(*handle, *version)?,
            Record::Close {
                inode,
                last,
                mtime_ms,
            } => {
                let f = self
                    .ns
                    .file(*inode)
                    .ok_or(format!("{inode} is not a file"))?;
                if let Some(c) = last {
                    self.check_open_chunk(*inode, f, c.handle)?;
                    if let Some(info) = self.chunks.get_mut(c.handle) {
                        info.length = c.length;
                    }
                }
                self.touch_file(*inode, *mtime_ms, close_file);
                self.leases.release(*inode);
                self.recovering.remove(inode);
                self.pipelines.remove(inode);
                self.open_chunks.remove(inode);
            }
            Record::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                mtime_ms,
            } => self
                .ns
                .rename(*src_parent, src_name, *dst_parent, dst_name, *mtime_ms)?,
            Record::Delete {
                parent,
                name,
                mtime_ms,
            } => self.remove_entry(*parent, name, *mtime_ms)?,
            Record::RegisterChunkserver { id, addr } => {
                if server_index(*id).is_none() {
                    return Err(format!("chunkserver id {id} does not fit 32 bits"));
                }
                self.servers.insert(*id, addr.clone());
                self.next_server = self.next_server.max(id.0.saturating_add(1));
            }
            Record::RecoveryStarted {
                inode,
                handle,
                old_version,
                version,
            } => {
                let f = self
                    .ns
                    .file(*inode)
                    .ok_or(format!("{inode} is not a file"))?;
                let holder = match f.write {
                    WriteState::Open { client, .. } => client,
                    WriteState::Recovering { holder, .. } => holder,
                    WriteState::Closed => return Err(format!("{inode} is closed")),
                };
                self.check_open_chunk(*inode, f, *handle)?;
                self.set_version(*handle, *version)?;
                self.touch_file(*inode, 0, |f| {
                    f.write = WriteState::Recovering {
                        holder,
                        old_version: *old_version,
                    }
                });
                self.leases.release(*inode);
                self.recovering.insert(*inode);
            }
            Record::RecoveryCommitted {
                inode,
                handle,
                version,
                length,
                mtime_ms,
            } => {
                let f = self
                    .ns
                    .file(*inode)
                    .ok_or(format!("{inode} is not a file"))?;
                if !f.is_recovering() {
                    return Err(format!("{inode} is not in lease recovery"));
                }
                self.check_open_chunk(*inode, f, *handle)?;
                if *length > f.chunk_size {
                    return Err(format!("length {length} exceeds the chunk size"));
                }
                if f.chunks.last() != Some(handle) && *length != f.chunk_size {
                    return Err(format!(
                        "{handle} of {inode} is before the last chunk: its length stays the chunk size, not {length}"
                    ));
                }
                let info = self
                    .chunks
                    .get_mut(*handle)
                    .ok_or(format!("unknown chunk {handle}"))?;
                if info.version != *version {
                    return Err(format!(
                        "chunk {handle} is at version {}, not {version}",
                        info.version
                    ));
                }
                info.length = *length;
                self.touch_file(*inode, *mtime_ms, close_file);
                self.leases.release(*inode);
                self.recovering.remove(inode);
                self.pipelines.remove(inode);
                self.open_chunks.remove(inode);
            }
            Record::Granted {
                inode,
                handle,
                version,
            } => {
                self.apply_grant(*inode, *handle, *version)?;
                // A grant from before pipelines were logged: its pipeline is unknown.
                self.pipelines.remove(inode);
            }
            Record::RecoveryQueued { inode } => {
                let f = self
                    .ns
                    .file(*inode)
                    .ok_or(format!("{inode} is not a file"))?;
                let WriteState::Open { client, granted } = f.write else {
                    return Err(format!("{inode} is not open"));
                };
                self.touch_file(*inode, 0, |f| {
                    f.write = WriteState::Recovering {
                        holder: client,
                        old_version: granted,
                    }
                });
                self.leases.release(*inode);
                self.recovering.insert(*inode);
            }
            Record::GrantedPipeline {
                inode,
                handle,
                version,
                servers,
            } => {
                if servers.is_empty() || servers.len() > usize::from(u8::MAX) {
                    return Err(format!("a pipeline of {} chunkservers", servers.len()));
                }
                let distinct: BTreeSet<&ChunkserverId> = servers.iter().collect();
                if distinct.len() != servers.len()
                    || servers.iter().any(|id| !self.servers.contains_key(id))
                {
                    return Err(format!(
                        "pipeline {servers:?} names a chunkserver twice or one never registered"
                    ));
                }
                self.apply_grant(*inode, *handle, *version)?;
                self.pipelines.insert(
                    *inode,
                    Pipeline {
                        handle: *handle,
                        version: *version,
                        servers: servers.clone(),
                    },
                );
            }
            Record::RenameOver {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                replaced,
                mtime_ms,
            } => {
                let src = self
                    .ns
                    .child(*src_parent, src_name)
                    .ok_or(format!("{src_name:?} is not in {src_parent}"))?;
                if self.ns.child(*dst_parent, dst_name) != Some(*replaced) || src == *replaced {
                    return Err(format!("{dst_name:?} in {dst_parent} is not {replaced}"));
                }
                let (src_dir, dst_dir) = match (self.ns.get(src), self.ns.get(*replaced)) {
                    (Some(s), Some(d)) => (s.as_dir().is_some(), d.as_dir()),
                    _ => return Err("rename over an unknown inode".into()),
                };
                match (src_dir, dst_dir) {
                    (true, Some(d)) if d.children.is_empty() => {}
                    (false, None) => {}
                    _ => return Err(format!("{src} cannot replace {replaced}")),
                }
                if self.ns.is_within(*dst_parent, src) {
                    return Err(format!("cannot move {src} into itself"));
                }
                self.remove_entry(*dst_parent, dst_name, *mtime_ms)?;
                self.ns
                    .rename(*src_parent, src_name, *dst_parent, dst_name, *mtime_ms)?;
            }
            Record::SetXattr {
                inode,
                name,
                value,
                mtime_ms,
            } => {
                if !self.ns.set_xattr(*inode, name, value.as_deref()) {
                    return Err(format!("extended attribute of unknown inode {inode}"));
                }
                let i = self
                    .ns
                    .get_mut(*inode)
                    .ok_or(format!("extended attribute of unknown inode {inode}"))?;
                i.changed(*mtime_ms);
            }
            Record::WithAttr { record, attr } => {
                let created: Vec<InodeId> = match &**record {
                    Record::Create { inode, .. } | Record::Symlink { inode, .. } => vec![*inode],
                    Record::Mkdir { dirs, .. } => dirs.iter().map(|d| d.1).collect(),
                    other => return Err(format!("attributes around {other:?}")),
                };
                if attr.mode & !MODE_BITS != 0 {
                    return Err(format!("mode {:o} has bits past 0o7777", attr.mode));
                }
                self.apply_one(record, now_ms)?;
                for ino in created {
                    if let Some(i) = self.ns.get_mut(ino) {
                        if !matches!(i.kind, InodeKind::Symlink(_)) {
                            i.attr.mode = attr.mode;
                        }
                        i.attr.uid = attr.uid;
                        i.attr.gid = attr.gid;
                    }
                }
            }
            Record::UserAdded { name, user } => self.apply_user_added(name, user)?,
            Record::UserRemoved { name } => self.apply_user_removed(name)?,
            Record::ClientOwner { client, user } => self.apply_client_owner(*client, user),
            Record::CallDone {
                client,
                call,
                kind,
                reply,
            } => {
                // `last_lsn` moves past this record once it is applied.
                let lsn = self.last_lsn + 1;
                self.retry.insert(*client, *call, *kind, reply.clone(), lsn)
            }
            Record::SetAttr {
                inode,
                mode,
                uid,
                gid,
                atime_ns,
                mtime_ns,
                ctime_ns,
            } => {
                if mode.is_some_and(|m| m & !MODE_BITS != 0) {
                    return Err(format!("mode {mode:?} has bits past 0o7777"));
                }
                let i = self
                    .ns
                    .get_mut(*inode)
                    .ok_or(format!("set attributes of unknown inode {inode}"))?;
                let a = &mut i.attr;
                if let Some(m) = mode {
                    a.mode = *m;
                }
                if let Some(u) = uid {
                    a.uid = *u;
                }
                if let Some(g) = gid {
                    a.gid = *g;
                }
                if let Some(t) = atime_ns {
                    a.atime_ns = *t;
                }
                if let Some(t) = mtime_ns {
                    a.mtime_ns = *t;
                }
                if let Some(t) = ctime_ns {
                    a.ctime_ns = *t;
                }
            }
            Record::SetReplication { inode, replication } => {
                if *replication == 0 || *replication > crate::config::MAX_REPLICATION {
                    return Err(format!("replication factor {replication} out of range"));
                }
                let chunks: Vec<ChunkHandle> = match self.ns.get_mut(*inode) {
                    Some(Inode {
                        kind: InodeKind::File(f),
                        ..
                    }) => {
                        f.replication = *replication;
                        f.chunks.iter().copied().collect()
                    }
                    _ => return Err(format!("set the replication of {inode}, not a file")),
                };
                for h in chunks {
                    if let Some(c) = self.chunks.get_mut(h) {
                        c.replication = *replication;
                    }
                }
            }
            Record::Decommission { server, on } => {
                if !self.servers.contains_key(server) {
                    return Err(format!("decommission of unknown chunkserver {server}"));
                }
                if *on {
                    self.decommissioning.insert(*server);
                } else {
                    self.decommissioning.remove(server);
                }
            }
            Record::SetQuota { inode, limits } => self.apply_set_quota(*inode, *limits)?,
        }
        Ok(())
    }

    /// The shared part of `Granted` and `GrantedPipeline`: `version` of the open chunk
    /// `handle` of the open file `inode` becomes the floor of lease recovery.
    pub(super) fn apply_grant(
        &mut self,
        inode: InodeId,
        handle: ChunkHandle,
        version: ChunkVersion,
    ) -> std::result::Result<(), String> {
        let f = self
            .ns
            .file(inode)
            .ok_or(format!("{inode} is not a file"))?;
        let WriteState::Open { granted, .. } = f.write else {
            return Err(format!("{inode} is not open"));
        };
        self.check_open_chunk(inode, f, handle)?;
        let current = self
            .chunks
            .get(handle)
            .map_or(ChunkVersion(0), |c| c.version);
        if version < granted || version > current {
            return Err(format!(
                "granted version {version} of chunk {handle} is outside [{granted}, {current}]"
            ));
        }
        self.touch_file(inode, 0, |f| {
            if let WriteState::Open { granted, .. } = &mut f.write {
                *granted = version;
            }
        });
        Ok(())
    }

    /// The file `ino`, which a client holds open for writing.
    fn open_file_of(&self, ino: InodeId) -> std::result::Result<&FileMeta, String> {
        let f = self.ns.file(ino).ok_or(format!("{ino} is not a file"))?;
        if f.writer().is_none() {
            return Err(format!("{ino} is not open"));
        }
        Ok(f)
    }

    pub(super) fn touch_file(
        &mut self,
        ino: InodeId,
        mtime_ms: u64,
        f: impl FnOnce(&mut FileMeta),
    ) {
        if let Some(i) = self.ns.get_mut(ino) {
            i.touch(mtime_ms);
            if let InodeKind::File(meta) = &mut i.kind {
                f(meta);
            }
        }
    }

    /// The chunk the open (or recovering) file `ino` is written in: the one a
    /// `Record::ChunkOpened` moved its writer to, else its last chunk (`None` without
    /// chunks). Meaningless for a closed file.
    pub fn open_chunk_of(&self, ino: InodeId, f: &FileMeta) -> Option<ChunkHandle> {
        self.open_chunks
            .get(&ino)
            .copied()
            .or_else(|| f.chunks.last().copied())
    }

    /// The index of [`MasterState::open_chunk_of`] in the file.
    pub fn open_index_of(&self, ino: InodeId, f: &FileMeta) -> Option<usize> {
        match self.open_chunks.get(&ino) {
            Some(h) => f.chunks.iter().position(|c| c == h),
            None => f.chunks.len().checked_sub(1),
        }
    }

    /// `handle` is the chunk the file `ino` is written in.
    pub(super) fn check_open_chunk(
        &self,
        ino: InodeId,
        f: &FileMeta,
        handle: ChunkHandle,
    ) -> std::result::Result<(), String> {
        if self.open_chunk_of(ino, f) != Some(handle) {
            return Err(format!("{handle} is not the chunk {ino} is written in"));
        }
        Ok(())
    }

    /// The current version of `f`'s last chunk (zero without one).
    pub(super) fn last_version(&self, f: &FileMeta) -> ChunkVersion {
        f.chunks
            .last()
            .and_then(|h| self.chunks.get(*h))
            .map_or(ChunkVersion(0), |c| c.version)
    }

    pub(super) fn set_version(
        &mut self,
        h: ChunkHandle,
        v: ChunkVersion,
    ) -> std::result::Result<(), String> {
        let info = self.chunks.get_mut(h).ok_or(format!("unknown chunk {h}"))?;
        if v <= info.version {
            return Err(format!(
                "chunk {h}: version {v} does not exceed the current {}",
                info.version
            ));
        }
        info.version = v;
        Ok(())
    }

    pub(super) fn remove_entry(
        &mut self,
        parent: InodeId,
        name: &str,
        mtime_ms: u64,
    ) -> std::result::Result<(), String> {
        for (ino, inode) in self.ns.remove(parent, name, mtime_ms)? {
            if let InodeKind::File(f) = inode.kind {
                self.leases.release(ino);
                self.recovering.remove(&ino);
                self.pipelines.remove(&ino);
                self.open_chunks.remove(&ino);
                for h in f.chunks {
                    self.forget_chunk(h);
                }
            }
        }
        Ok(())
    }

    /// Drops a deleted chunk, ordering the deletion of every replica the master knows
    /// (the commands leave once the record is durable).
    pub(super) fn forget_chunk(&mut self, h: ChunkHandle) {
        self.missing_chunks.remove(&h);
        if let Some(info) = self.chunks.remove(h) {
            let mut servers: Vec<ChunkserverId> =
                info.replicas.iter().map(|r| r.server_id()).collect();
            servers.extend(self.health.corrupt_of(h).map(|(s, _)| s));
            for s in &servers {
                if let Some(cs) = self.registry.get_mut(*s) {
                    cs.replicas.remove(&h);
                }
            }
            // Ahead replicas stay (a bound of the master's version keeps them); they
            // become orphans once reported again.
            self.health.forget_chunk(h, info.version, &servers);
        }
    }
}

/// A file's close: no writer, and its chunk list trimmed to its length (it grew by
/// doubling while the file was written; a closed file rarely grows again).
fn close_file(f: &mut FileMeta) {
    f.write = WriteState::Closed;
    f.chunks.shrink_to_fit();
}
