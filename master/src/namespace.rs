//! The namespace: directories and files as a tree of inodes.
//!
//! A directory maps child names to inodes; a file is an ordered list of chunk handles
//! with its replication factor, chunk size and write state (which client has it open).
//! Lookups return typed errors naming the offending path. Mutations here are the
//! low-level steps the state machine's records apply; validation of requests happens
//! before a record is written (see [`crate::state`]).

use bincode::de::Decoder;
use bincode::enc::Encoder;
use bincode::error::{DecodeError, EncodeError};
use bincode::{Decode, Encode};
use ecow::EcoString;
use stampfs_proto::{Attr, ChunkHandle, ChunkVersion, ClientId, InodeId};
use std::collections::{BTreeMap, HashMap};
use thin_vec::ThinVec;

use crate::error::{Error, Result};
use crate::slab::{Slab, SlabKey, SlabRefused, SlabValue};

/// The root directory's inode.
pub const ROOT: InodeId = InodeId(1);

/// Whether a file has a writer. New variants go at the end (checkpoints hold it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum WriteState {
    Closed,
    /// Open for writing by `client` (its lease timer is soft state, see [`crate::lease`]).
    /// `granted` is the floor lease recovery starts from: the version of the last chunk
    /// that `client` was last granted (replicas at or above it may hold bytes it had
    /// acknowledged), or, after a reopen whose grant has not gone out yet, the version
    /// the closed file's replicas hold. A version minted for a pipeline update whose
    /// bump failed never raises it (see `Record::Granted`). Zero without a chunk.
    Open {
        client: ClientId,
        granted: ChunkVersion,
    },
    /// Lease recovery is taking the file away from `holder`, whose lease is gone: the
    /// last chunk's version was raised above `old_version` (the version the holder
    /// wrote with; the chunk table holds the target) and the file closes when the
    /// replicas are sealed (see [`crate::recovery`]).
    Recovering {
        holder: ClientId,
        old_version: ChunkVersion,
    },
}

impl WriteState {
    /// The version lease recovery starts from: the granted one of an open file, the
    /// holder's of a file in recovery; `None` when closed.
    pub fn floor(&self) -> Option<ChunkVersion> {
        match self {
            WriteState::Open { granted, .. } => Some(*granted),
            WriteState::Recovering { old_version, .. } => Some(*old_version),
            WriteState::Closed => None,
        }
    }
}

/// A file's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    pub replication: u8,
    pub chunk_size: u64,
    /// One pointer (no allocation while empty) instead of a `Vec`'s three words.
    pub chunks: ThinVec<ChunkHandle>,
    pub write: WriteState,
}

/// Encoded as it was while `chunks` was a `Vec` (the checkpoint keeps its format).
impl Encode for FileMeta {
    fn encode<E: Encoder>(&self, e: &mut E) -> std::result::Result<(), EncodeError> {
        self.replication.encode(e)?;
        self.chunk_size.encode(e)?;
        self.chunks.as_slice().encode(e)?;
        self.write.encode(e)
    }
}

impl<C> Decode<C> for FileMeta {
    fn decode<D: Decoder<Context = C>>(d: &mut D) -> std::result::Result<Self, DecodeError> {
        let replication = u8::decode(d)?;
        let chunk_size = u64::decode(d)?;
        let n = u64::decode(d)?;
        // Reserved up to a bound only: the length comes from the input.
        let mut chunks = ThinVec::with_capacity(usize::try_from(n.min(1 << 12)).unwrap_or(0));
        for _ in 0..n {
            chunks.push(ChunkHandle::decode(d)?);
        }
        let write = WriteState::decode(d)?;
        Ok(Self {
            replication,
            chunk_size,
            chunks,
            write,
        })
    }
}

bincode::impl_borrow_decode!(FileMeta);

impl FileMeta {
    /// The client holding the file open, if any.
    pub fn writer(&self) -> Option<ClientId> {
        match self.write {
            WriteState::Open { client, .. } => Some(client),
            WriteState::Closed | WriteState::Recovering { .. } => None,
        }
    }

    /// Lease recovery is under way.
    pub fn is_recovering(&self) -> bool {
        matches!(self.write, WriteState::Recovering { .. })
    }
}

/// A directory's entries. A name of up to 15 bytes is kept inside its entry
/// ([`EcoString`], 16 bytes), so most names cost no allocation of their own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirMeta {
    pub children: BTreeMap<EcoString, InodeId>,
}

/// Encoded as a map of strings to inodes, as it always was.
impl Encode for DirMeta {
    fn encode<E: Encoder>(&self, e: &mut E) -> std::result::Result<(), EncodeError> {
        (self.children.len() as u64).encode(e)?;
        for (name, ino) in &self.children {
            name.as_str().encode(e)?;
            ino.encode(e)?;
        }
        Ok(())
    }
}

impl<C> Decode<C> for DirMeta {
    fn decode<D: Decoder<Context = C>>(d: &mut D) -> std::result::Result<Self, DecodeError> {
        let n = u64::decode(d)?;
        let mut children = BTreeMap::new();
        for _ in 0..n {
            let name = String::decode(d)?;
            let ino = InodeId::decode(d)?;
            children.insert(EcoString::from(name), ino);
        }
        Ok(Self { children })
    }
}

bincode::impl_borrow_decode!(DirMeta);

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum InodeKind {
    Dir(DirMeta),
    File(FileMeta),
    /// A symbolic link and its target, kept as given and never followed by the
    /// master (the mount's kernel resolves links). After the older variants, so that
    /// each keeps its encoding in checkpoints.
    Symlink(String),
}

/// One namespace entry. Names live only in the parent's children map, extended
/// attributes in the namespace's side table ([`Namespace::xattrs`]: few entries have
/// any, so none of them pays for a pointer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub parent: InodeId,
    pub attr: Attr,
    pub kind: InodeKind,
}

/// Extended attributes (`user.*`) of one entry, by name.
pub type Xattrs = BTreeMap<String, Vec<u8>>;

/// Nanoseconds of a wall-clock time in milliseconds (saturating).
pub fn ms_to_ns(ms: u64) -> i64 {
    i64::try_from(ms)
        .unwrap_or(i64::MAX)
        .saturating_mul(1_000_000)
}

/// The mode an entry of `kind` gets when its creator gave none (and that entries
/// from before attributes were stored get): `0o755` for directories, `0o644` for
/// files, `0o777` for symbolic links.
pub fn default_mode(kind: &InodeKind) -> u32 {
    match kind {
        InodeKind::Dir(_) => 0o755,
        InodeKind::File(_) => 0o644,
        InodeKind::Symlink(_) => 0o777,
    }
}

impl Inode {
    /// A new entry created at `mtime_ms`, owned by uid 0 and gid 0 with the default
    /// mode of its kind, all three times at its creation.
    pub fn new(parent: InodeId, mtime_ms: u64, kind: InodeKind) -> Self {
        let t = ms_to_ns(mtime_ms);
        Self {
            parent,
            attr: Attr {
                mode: default_mode(&kind),
                uid: 0,
                gid: 0,
                atime_ns: t,
                mtime_ns: t,
                ctime_ns: t,
            },
            kind,
        }
    }

    pub fn dir(parent: InodeId, mtime_ms: u64) -> Self {
        Self::new(parent, mtime_ms, InodeKind::Dir(DirMeta::default()))
    }

    pub fn symlink(parent: InodeId, mtime_ms: u64, target: String) -> Self {
        Self::new(parent, mtime_ms, InodeKind::Symlink(target))
    }

    /// The contents changed at `mtime_ms`: the modification and change times become
    /// it, as a write sets them on Linux (also back from a future time `touch -d`
    /// set, which `make` relies on). Zero changes nothing (a close that keeps them).
    pub fn touch(&mut self, mtime_ms: u64) {
        if mtime_ms == 0 {
            return;
        }
        let t = ms_to_ns(mtime_ms);
        self.attr.mtime_ns = t;
        self.attr.ctime_ns = t;
    }

    /// The modification time in whole milliseconds (zero before the epoch).
    pub fn mtime_ms(&self) -> u64 {
        u64::try_from(self.attr.mtime_ns / 1_000_000).unwrap_or(0)
    }

    /// The entry itself changed at `ms` (renamed, its attributes set): the change time
    /// becomes it (zero changes nothing).
    pub fn changed(&mut self, ms: u64) {
        if ms != 0 {
            self.attr.ctime_ns = ms_to_ns(ms);
        }
    }

    pub fn as_file(&self) -> Option<&FileMeta> {
        match &self.kind {
            InodeKind::File(f) => Some(f),
            InodeKind::Dir(_) | InodeKind::Symlink(_) => None,
        }
    }

    pub fn as_dir(&self) -> Option<&DirMeta> {
        match &self.kind {
            InodeKind::Dir(d) => Some(d),
            InodeKind::File(_) | InodeKind::Symlink(_) => None,
        }
    }

    /// The target of a symbolic link.
    pub fn as_symlink(&self) -> Option<&str> {
        match &self.kind {
            InodeKind::Symlink(t) => Some(t),
            InodeKind::Dir(_) | InodeKind::File(_) => None,
        }
    }
}

/// Joins path components into the canonical absolute form.
pub fn join(components: &[&str]) -> String {
    format!("/{}", components.join("/"))
}

/// Validates a path and returns its components, mapping the proto error.
pub fn components(path: &str) -> Result<Vec<&str>> {
    stampfs_proto::path::components(path).map_err(|e| match e {
        stampfs_proto::Error::InvalidPath { path, reason } => Error::InvalidPath { path, reason },
        other => Error::Proto(other),
    })
}

impl SlabKey for InodeId {
    const VACANT: Self = InodeId(0);
}

impl SlabValue for Inode {
    fn vacant() -> Self {
        Inode::dir(InodeId(0), 0)
    }
}

/// The tree of inodes, kept in a slab ([`crate::slab`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    inodes: Slab<InodeId, Inode>,
    /// The extended attributes of the entries that have any (never an empty map).
    xattrs: HashMap<InodeId, Xattrs>,
    next_inode: u64,
}

impl Default for Namespace {
    fn default() -> Self {
        let mut inodes = Slab::default();
        // A fresh slab takes any key but 0.
        let _ = inodes.insert(ROOT, Inode::dir(ROOT, 0));
        Self {
            inodes,
            xattrs: HashMap::new(),
            next_inode: ROOT.0 + 1,
        }
    }
}

/// Checkpoint form: a map of inode ids to inodes (as the hash map it was, in slot
/// order), each inode its parent, attributes, kind and optional extended attributes
/// (as the inode held them), then the counter.
impl Encode for Namespace {
    fn encode<E: Encoder>(&self, e: &mut E) -> std::result::Result<(), EncodeError> {
        (self.inodes.len() as u64).encode(e)?;
        for (ino, inode) in self.inodes.iter() {
            ino.encode(e)?;
            inode.parent.encode(e)?;
            inode.attr.encode(e)?;
            inode.kind.encode(e)?;
            self.xattrs.get(ino).encode(e)?;
        }
        self.next_inode.encode(e)
    }
}

impl<C> Decode<C> for Namespace {
    fn decode<D: Decoder<Context = C>>(d: &mut D) -> std::result::Result<Self, DecodeError> {
        let n = u64::decode(d)?;
        let mut ns = Namespace {
            inodes: Slab::default(),
            xattrs: HashMap::new(),
            next_inode: 0,
        };
        ns.inodes
            .reserve(usize::try_from(n.min(1 << 20)).unwrap_or(0));
        for _ in 0..n {
            let ino = InodeId::decode(d)?;
            let inode = Inode {
                parent: InodeId::decode(d)?,
                attr: Attr::decode(d)?,
                kind: InodeKind::decode(d)?,
            };
            let xattrs = Option::<Xattrs>::decode(d)?;
            ns.add(ino, inode)
                .map_err(|e| DecodeError::OtherString(format!("checkpoint namespace: {e}")))?;
            if let Some(x) = xattrs.filter(|x| !x.is_empty()) {
                ns.xattrs.insert(ino, x);
            }
        }
        ns.next_inode = ns.next_inode.max(u64::decode(d)?);
        Ok(ns)
    }
}

bincode::impl_borrow_decode!(Namespace);

impl Namespace {
    /// A namespace of `inodes` (a checkpoint's, or an older format's upgraded); the
    /// counter never below an inode in use.
    pub(crate) fn from_inodes(
        inodes: impl IntoIterator<Item = (InodeId, Inode)>,
        next_inode: u64,
    ) -> std::result::Result<Self, String> {
        let mut ns = Namespace {
            inodes: Slab::default(),
            xattrs: HashMap::new(),
            next_inode,
        };
        for (ino, inode) in inodes {
            ns.add(ino, inode)?;
        }
        Ok(ns)
    }

    /// Adds a decoded inode (its parent's entry comes with the parent), keeping the
    /// counter above it.
    fn add(&mut self, ino: InodeId, inode: Inode) -> std::result::Result<(), String> {
        self.inodes
            .insert(ino, inode)
            .map_err(|e| refused(ino, e))?;
        self.next_inode = self.next_inode.max(ino.0.saturating_add(1));
        Ok(())
    }

    pub fn get(&self, ino: InodeId) -> Option<&Inode> {
        self.inodes.get(ino)
    }

    /// The extended attributes of `ino`, `None` without any.
    pub fn xattrs(&self, ino: InodeId) -> Option<&Xattrs> {
        self.xattrs.get(&ino)
    }

    /// Sets (`Some`) or removes (`None`) the extended attribute `name` of an existing
    /// `ino`; false when there is no such inode.
    pub fn set_xattr(&mut self, ino: InodeId, name: &str, value: Option<&[u8]>) -> bool {
        if !self.inodes.contains_key(ino) {
            return false;
        }
        match value {
            Some(v) => {
                self.xattrs
                    .entry(ino)
                    .or_default()
                    .insert(name.to_string(), v.to_vec());
            }
            None => {
                if let Some(map) = self.xattrs.get_mut(&ino) {
                    map.remove(name);
                    if map.is_empty() {
                        self.xattrs.remove(&ino);
                    }
                }
            }
        }
        true
    }

    pub fn get_mut(&mut self, ino: InodeId) -> Option<&mut Inode> {
        self.inodes.get_mut(ino)
    }

    pub fn file(&self, ino: InodeId) -> Option<&FileMeta> {
        self.inodes.get(ino).and_then(Inode::as_file)
    }

    pub fn file_mut(&mut self, ino: InodeId) -> Option<&mut FileMeta> {
        match self.inodes.get_mut(ino).map(|i| &mut i.kind) {
            Some(InodeKind::File(f)) => Some(f),
            _ => None,
        }
    }

    /// Number of inodes (root included).
    pub fn len(&self) -> usize {
        self.inodes.len()
    }

    /// Only the root exists.
    pub fn is_empty(&self) -> bool {
        self.inodes.len() <= 1
    }

    /// The inode the next mkdir or create gets.
    pub fn next_inode(&self) -> InodeId {
        InodeId(self.next_inode)
    }

    /// Every inode (checkpoint checks, tests).
    pub fn iter(&self) -> impl Iterator<Item = (&InodeId, &Inode)> {
        self.inodes.iter()
    }

    /// The child `name` of directory `dir`.
    pub fn child(&self, dir: InodeId, name: &str) -> Option<InodeId> {
        self.inodes
            .get(dir)
            .and_then(Inode::as_dir)
            .and_then(|d| d.children.get(name).copied())
    }

    /// Resolves validated components to an inode.
    pub fn resolve(&self, comps: &[&str]) -> Result<InodeId> {
        let mut cur = ROOT;
        for (i, name) in comps.iter().enumerate() {
            let Some(dir) = self.inodes.get(cur).and_then(Inode::as_dir) else {
                return Err(Error::NotADirectory {
                    path: join(&comps[..i]),
                });
            };
            cur = dir
                .children
                .get(*name)
                .copied()
                .ok_or_else(|| Error::NotFound { path: join(comps) })?;
        }
        Ok(cur)
    }

    /// Resolves the parent directory of a non-root path: `(parent, name)`.
    pub fn resolve_parent<'a>(&self, comps: &[&'a str]) -> Result<(InodeId, &'a str)> {
        let Some((name, dir_comps)) = comps.split_last() else {
            return Err(Error::bad_request("the root has no parent"));
        };
        let parent = self.resolve(dir_comps).map_err(|e| match e {
            Error::NotFound { .. } => Error::NotFound {
                path: join(dir_comps),
            },
            other => other,
        })?;
        if self.inodes.get(parent).and_then(Inode::as_dir).is_none() {
            return Err(Error::NotADirectory {
                path: join(dir_comps),
            });
        }
        Ok((parent, name))
    }

    /// The path of `ino`, walking up through its parents (`None` once it is unlinked).
    pub fn path_of(&self, mut ino: InodeId) -> Option<String> {
        let mut names = Vec::new();
        while ino != ROOT {
            let parent = self.inodes.get(ino)?.parent;
            let dir = self.inodes.get(parent).and_then(Inode::as_dir)?;
            let name = dir
                .children
                .iter()
                .find(|(_, child)| **child == ino)
                .map(|(name, _)| &**name)?;
            names.push(name);
            ino = parent;
        }
        names.reverse();
        Some(join(&names))
    }

    /// Whether `ino` is `ancestor` or lies below it.
    pub fn is_within(&self, mut ino: InodeId, ancestor: InodeId) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            if ino == ROOT {
                return false;
            }
            match self.inodes.get(ino) {
                Some(i) => ino = i.parent,
                None => return false,
            }
        }
    }

    /// Inserts a new inode under `parent` as `name`.
    pub fn insert(
        &mut self,
        parent: InodeId,
        name: &str,
        ino: InodeId,
        inode: Inode,
    ) -> std::result::Result<(), String> {
        if self.inodes.contains_key(ino) {
            return Err(format!("inode {ino} already exists"));
        }
        match self.inodes.get(parent) {
            Some(Inode {
                kind: InodeKind::Dir(d),
                ..
            }) => {
                if d.children.contains_key(name) {
                    return Err(format!("{name:?} already exists in {parent}"));
                }
            }
            _ => return Err(format!("parent {parent} is not a directory")),
        }
        // The inode first: when the slab refuses it, nothing has changed.
        let mtime_ns = inode.attr.mtime_ns;
        self.inodes
            .insert(ino, inode)
            .map_err(|e| refused(ino, e))?;
        if let Some(Inode {
            kind: InodeKind::Dir(d),
            attr,
            ..
        }) = self.inodes.get_mut(parent)
        {
            d.children.insert(name.into(), ino);
            attr.mtime_ns = mtime_ns;
            attr.ctime_ns = mtime_ns;
        }
        self.next_inode = self.next_inode.max(ino.0.saturating_add(1));
        Ok(())
    }

    /// Unlinks `name` from `parent` and removes its whole subtree; returns the removed
    /// inodes (so their chunks and leases can be dropped).
    pub fn remove(
        &mut self,
        parent: InodeId,
        name: &str,
        mtime_ms: u64,
    ) -> std::result::Result<Vec<(InodeId, Inode)>, String> {
        let not_dir = || format!("parent {parent} is not a directory");
        let p = self.inodes.get_mut(parent).ok_or_else(not_dir)?;
        let InodeKind::Dir(d) = &mut p.kind else {
            return Err(not_dir());
        };
        let ino = d
            .children
            .remove(name)
            .ok_or_else(|| format!("{name:?} is not in {parent}"))?;
        p.touch(mtime_ms);
        let mut removed = Vec::new();
        let mut stack = vec![ino];
        while let Some(i) = stack.pop() {
            if let Some(inode) = self.inodes.remove(i) {
                self.xattrs.remove(&i);
                if let InodeKind::Dir(d) = &inode.kind {
                    stack.extend(d.children.values().copied());
                }
                removed.push((i, inode));
            }
        }
        Ok(removed)
    }

    /// Moves `src_parent/src_name` to `dst_parent/dst_name` (which must be free).
    pub fn rename(
        &mut self,
        src_parent: InodeId,
        src_name: &str,
        dst_parent: InodeId,
        dst_name: &str,
        mtime_ms: u64,
    ) -> std::result::Result<(), String> {
        let ino = self
            .child(src_parent, src_name)
            .ok_or_else(|| format!("{src_name:?} is not in {src_parent}"))?;
        if self.child(dst_parent, dst_name).is_some() {
            return Err(format!("{dst_name:?} already exists in {dst_parent}"));
        }
        if self
            .inodes
            .get(dst_parent)
            .and_then(Inode::as_dir)
            .is_none()
        {
            return Err(format!("{dst_parent} is not a directory"));
        }
        if self.is_within(dst_parent, ino) {
            return Err(format!("cannot move {ino} into itself"));
        }
        for (dir, add) in [(src_parent, false), (dst_parent, true)] {
            if let Some(p) = self.inodes.get_mut(dir) {
                if let InodeKind::Dir(d) = &mut p.kind {
                    if add {
                        d.children.insert(dst_name.into(), ino);
                    } else {
                        d.children.remove(src_name);
                    }
                    p.touch(mtime_ms);
                }
            }
        }
        if let Some(i) = self.inodes.get_mut(ino) {
            i.parent = dst_parent;
            i.changed(mtime_ms);
        }
        Ok(())
    }
}

/// Why an inode could not be added.
fn refused(ino: InodeId, e: SlabRefused) -> String {
    match e {
        SlabRefused::VacantKey => "inode 0 is not a valid inode".to_string(),
        SlabRefused::Exists => format!("inode {ino} already exists"),
        SlabRefused::Full => "the namespace is full (2^32 inodes)".to_string(),
    }
}

pub(crate) mod v1;
pub(crate) mod v5;

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Inode {
        Inode::new(
            ROOT,
            5,
            InodeKind::File(FileMeta {
                replication: 3,
                chunk_size: 1 << 20,
                chunks: ThinVec::new(),
                write: WriteState::Closed,
            }),
        )
    }

    #[test]
    fn resolve_names_the_failing_path() {
        let mut ns = Namespace::default();
        ns.insert(ROOT, "a", InodeId(2), Inode::dir(ROOT, 1))
            .expect("a");
        let mut f = file();
        f.parent = InodeId(2);
        ns.insert(InodeId(2), "f", InodeId(3), f).expect("f");
        assert_eq!(ns.resolve(&["a", "f"]).expect("found"), InodeId(3));
        assert_eq!(ns.resolve(&[]).expect("root"), ROOT);
        assert_eq!(ns.path_of(InodeId(3)).as_deref(), Some("/a/f"));
        assert_eq!(ns.path_of(ROOT).as_deref(), Some("/"));
        assert_eq!(ns.path_of(InodeId(99)), None);
        let e = ns.resolve(&["a", "nope"]).unwrap_err();
        assert!(
            matches!(e, Error::NotFound { ref path } if path == "/a/nope"),
            "{e}"
        );
        let e = ns.resolve(&["a", "f", "x"]).unwrap_err();
        assert!(
            matches!(e, Error::NotADirectory { ref path } if path == "/a/f"),
            "{e}"
        );
        let e = ns.resolve_parent(&["b", "c"]).unwrap_err();
        assert!(
            matches!(e, Error::NotFound { ref path } if path == "/b"),
            "{e}"
        );
        let e = ns.resolve_parent(&["a", "f", "c"]).unwrap_err();
        assert!(matches!(e, Error::NotADirectory { .. }), "{e}");
        assert_eq!(ns.next_inode(), InodeId(4));
    }

    #[test]
    fn remove_takes_the_subtree_and_rename_refuses_cycles() {
        let mut ns = Namespace::default();
        ns.insert(ROOT, "a", InodeId(2), Inode::dir(ROOT, 1))
            .expect("a");
        ns.insert(InodeId(2), "b", InodeId(3), Inode::dir(InodeId(2), 1))
            .expect("b");
        assert!(ns.rename(ROOT, "a", InodeId(3), "x", 2).is_err());
        ns.rename(InodeId(2), "b", ROOT, "b2", 2).expect("move up");
        assert_eq!(ns.resolve(&["b2"]).expect("moved"), InodeId(3));
        assert_eq!(ns.get(InodeId(3)).expect("b").parent, ROOT);
        ns.insert(ROOT, "f", InodeId(4), file()).expect("f");
        let removed = ns.remove(ROOT, "a", 3).expect("remove");
        assert_eq!(removed.len(), 1);
        ns.rename(ROOT, "f", InodeId(3), "g", 4)
            .expect("file into dir");
        let removed = ns.remove(ROOT, "b2", 5).expect("remove");
        assert_eq!(removed.len(), 2);
        assert!(ns.is_empty());
        assert!(ns.insert(ROOT, "z", InodeId(9), file()).is_ok());
        assert!(
            ns.insert(ROOT, "z", InodeId(10), file()).is_err(),
            "name taken"
        );
        assert!(
            ns.insert(ROOT, "y", InodeId(9), file()).is_err(),
            "inode taken"
        );
    }
}

/// The namespace's checkpoint form is the one the derived encoding of its earlier
/// types wrote.
#[cfg(test)]
mod format_tests;
