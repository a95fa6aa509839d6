//! Where replica files live in the data directory, and how files left anywhere else
//! (the flat layout of earlier versions, a file moved by hand) are put in place.
//!
//! ```text
//! DIR/LOCK, DIR/chunkserver.id, DIR/addr           the server's own files (never touched here)
//! DIR/<hh>/                                        256 subdirectories, hh = 00 .. ff
//! DIR/<hh>/<handle>.chunk                          a replica; hh = the handle's low byte,
//!                                                  i.e. the last two of its 16 hex digits
//! DIR/<hh>/<handle>.chunk.recv-<tag>.tmp           a copy being received (removed at start)
//! DIR/<hh>/<handle>.chunk.tmp                      a replica being created (removed at start)
//! DIR/<hh>/<handle>.chunk.corrupt[.N]              moved aside as corrupt (kept, never read)
//! DIR/<hh>/<handle>.chunk.duplicate[.N]            a second file for a handle (kept, never read)
//! ```
//!
//! The master hands out handles in sequence, so the low byte spreads replicas evenly:
//! a million replicas are about 3 900 per directory, a hundred million about 390 000,
//! and no directory is ever listed whole into memory (see [`crate::store`]'s scan).
//!
//! **Names.** A replica's name is exactly its handle's 16 lowercase hex digits and
//! `.chunk` ([`classify`]); a name that merely looks like one (upper case, too short, a
//! directory) is someone else's file and is left alone, as is anything not named by
//! this table.
//!
//! **Placing files ([`prepare`]).** At start-up, before the scan, every replica in
//! `DIR` itself (the flat layout) is renamed into its subdirectory, and so are its
//! moved-aside files; temporary files there are removed. The scan does the same for a
//! replica it finds in the wrong subdirectory. A rename never replaces a file
//! (`RENAME_NOREPLACE`): when the destination exists already, the same inode (a rename
//! whose removal of the old name was lost) has its old name removed, and a different
//! file is renamed aside as `.duplicate` next to the one in place, which wins. Every
//! directory that gained or lost a name is fsynced (both sides of each rename) before
//! the store serves anything, so a replica deleted later cannot come back from an old
//! name after a crash.
//!
//! **Crash safety.** Each step is one atomic rename, and the start-up scan looks in
//! `DIR` and every subdirectory, so a crash at any point of a migration leaves every
//! replica under one of its two names, where the next start finds it and goes on.

use crate::error::{Error, Result};
use stampfs_proto::ChunkHandle;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Suffix of replica files.
pub const REPLICA_SUFFIX: &str = ".chunk";
/// Suffix appended to a replica file that was moved aside as corrupt.
pub const CORRUPT_SUFFIX: &str = ".corrupt";
/// Suffix appended to a second file found for a handle that already has one in place.
pub const DUPLICATE_SUFFIX: &str = ".duplicate";
/// Suffix of temporary files (removed at start-up).
pub const TEMP_SUFFIX: &str = ".tmp";
/// Subdirectories of a data directory (`00` .. `ff`).
pub const SUBDIRS: usize = 256;

/// What a directory entry's name says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Name {
    /// `<16 lowercase hex>.chunk`: the replica of that handle.
    Replica(ChunkHandle),
    /// Ends in `.tmp`: a creation or a received copy that did not finish.
    Temp,
    /// `<16 lowercase hex>.chunk.<more>`: a file moved aside for that handle
    /// (`.corrupt`, `.duplicate`), kept for an operator.
    Aside(ChunkHandle),
    /// Anything else: not this store's.
    Other,
}

/// Reads an entry's name (pure).
pub fn classify(name: &OsStr) -> Name {
    let Some(name) = name.to_str() else {
        return Name::Other;
    };
    if name.ends_with(TEMP_SUFFIX) {
        return Name::Temp;
    }
    let Some(handle) = name.get(..16).and_then(parse_hex16) else {
        return Name::Other;
    };
    match name[16..].strip_prefix(REPLICA_SUFFIX) {
        Some("") => Name::Replica(handle),
        Some(rest) if rest.starts_with('.') => Name::Aside(handle),
        _ => Name::Other,
    }
}

/// Exactly 16 lowercase hex digits (the form [`ChunkHandle`] displays).
fn parse_hex16(s: &str) -> Option<ChunkHandle> {
    if s.len() != 16 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(s, 16).ok().map(ChunkHandle)
}

/// The subdirectory index of `handle`: its low byte.
pub fn subdir_of(handle: ChunkHandle) -> usize {
    (handle.0 & 0xff) as usize
}

/// The name of subdirectory `index` (`00` .. `ff`).
pub fn subdir_name(index: usize) -> String {
    format!("{:02x}", index & 0xff)
}

/// The subdirectory index a name stands for, if it is one of the 256 (two lowercase
/// hex digits).
pub fn parse_subdir(name: &OsStr) -> Option<usize> {
    let s = name.to_str()?;
    if s.len() != 2 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    usize::from_str_radix(s, 16).ok()
}

/// The file name of `handle`'s replica.
pub fn replica_name(handle: ChunkHandle) -> String {
    format!("{handle}{REPLICA_SUFFIX}")
}

/// Where `handle`'s replica lives under the data directory `root`.
pub fn replica_path(root: &Path, handle: ChunkHandle) -> PathBuf {
    root.join(subdir_name(subdir_of(handle)))
        .join(replica_name(handle))
}

/// The paths of one data directory.
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Subdirectory `index`.
    pub fn subdir(&self, index: usize) -> PathBuf {
        self.root.join(subdir_name(index))
    }

    /// The subdirectory of `handle`'s replica (and of its temporary files).
    pub fn dir_of(&self, handle: ChunkHandle) -> PathBuf {
        self.subdir(subdir_of(handle))
    }

    /// Where `handle`'s replica lives.
    pub fn replica_path(&self, handle: ChunkHandle) -> PathBuf {
        replica_path(&self.root, handle)
    }

    /// The temporary file a new replica of `handle` is created in.
    pub fn create_path(&self, handle: ChunkHandle) -> PathBuf {
        self.dir_of(handle)
            .join(format!("{handle}{REPLICA_SUFFIX}{TEMP_SUFFIX}"))
    }

    /// A temporary file for a copy of `handle` being received (`tag` makes it unique).
    pub fn receive_path(&self, handle: ChunkHandle, tag: u64) -> PathBuf {
        self.dir_of(handle).join(format!(
            "{handle}{REPLICA_SUFFIX}.recv-{tag:016x}{TEMP_SUFFIX}"
        ))
    }
}

/// fsyncs a directory, making renames and unlinks in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync directory", dir, e))
}

/// Directories that gained or lost a name and must be fsynced before the store serves.
#[derive(Debug)]
pub struct Dirty {
    subdirs: Vec<bool>,
    root: bool,
}

impl Default for Dirty {
    fn default() -> Self {
        Self {
            subdirs: vec![false; SUBDIRS],
            root: false,
        }
    }
}

impl Dirty {
    /// Marks subdirectory `index`.
    pub fn subdir(&mut self, index: usize) {
        if let Some(d) = self.subdirs.get_mut(index) {
            *d = true;
        }
    }

    /// Marks the data directory itself.
    pub fn root(&mut self) {
        self.root = true;
    }

    /// Adds `other`'s marks.
    pub fn merge(&mut self, other: &Dirty) {
        for (mine, theirs) in self.subdirs.iter_mut().zip(&other.subdirs) {
            *mine |= *theirs;
        }
        self.root |= other.root;
    }

    /// fsyncs every marked directory (subdirectories first, then the root) and clears
    /// the marks.
    pub fn sync(&mut self, layout: &Layout) -> Result<()> {
        for (index, dirty) in self.subdirs.iter_mut().enumerate() {
            if std::mem::take(dirty) {
                sync_dir(&layout.subdir(index))?;
            }
        }
        if std::mem::take(&mut self.root) {
            sync_dir(layout.root())?;
        }
        Ok(())
    }
}

/// What [`prepare`] and the scan did to put files in place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    /// Replicas renamed into their subdirectory.
    pub moved: u64,
    /// Moved-aside files renamed into their subdirectory.
    pub moved_aside: u64,
    /// Second names of a replica already in place, removed.
    pub links_removed: u64,
    /// Files renamed aside as `.duplicate`.
    pub duplicates: u64,
    /// Temporary files removed.
    pub temps_removed: u64,
}

/// The outcome of putting one file in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Renamed to the destination.
    Moved,
    /// The destination is the same inode: the old name was removed.
    SameFile,
    /// The destination is another file: the source went aside as `.duplicate`.
    Duplicate,
    /// The source had gone meanwhile (nothing to do).
    Gone,
}

/// Renames `src` to `dst` without ever replacing `dst` (see the module docs for what
/// happens when it exists). Blocking; the caller fsyncs both directories.
pub fn place(src: &Path, dst: &Path) -> Result<Placement> {
    match rename_no_replace(src, dst) {
        Ok(()) => return Ok(Placement::Moved),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !src.exists() => {
            return Ok(Placement::Gone)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("rename into place", src, e)),
    }
    let (a, b) = (
        std::fs::symlink_metadata(src).map_err(|e| Error::io("stat", src, e))?,
        std::fs::symlink_metadata(dst).map_err(|e| Error::io("stat", dst, e))?,
    );
    if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
        std::fs::remove_file(src).map_err(|e| Error::io("remove", src, e))?;
        return Ok(Placement::SameFile);
    }
    let mut n = 0u32;
    loop {
        let mut name = dst.as_os_str().to_owned();
        name.push(DUPLICATE_SUFFIX);
        if n > 0 {
            name.push(format!(".{n}"));
        }
        match rename_no_replace(src, Path::new(&name)) {
            Ok(()) => return Ok(Placement::Duplicate),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(Error::io("rename aside", src, e)),
        }
    }
}

/// `rename(2)` that fails with `AlreadyExists` instead of replacing `dst`:
/// `RENAME_NOREPLACE`, or where the file system lacks it, a check first (the directory
/// lock keeps other stampfs processes out, so nothing races the check).
fn rename_no_replace(src: &Path, dst: &Path) -> std::io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    match renameat_with(CWD, src, CWD, dst, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOSYS => {
            if std::fs::symlink_metadata(dst).is_ok() {
                return Err(std::io::ErrorKind::AlreadyExists.into());
            }
            std::fs::rename(src, dst)
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether the entry is a regular file (not following symlinks; `false` when unknown).
fn is_file(entry: &std::fs::DirEntry) -> bool {
    entry.file_type().is_ok_and(|t| t.is_file())
}

/// Creates the 256 subdirectories that are missing (making them durable) and puts
/// every file in `DIR` itself that belongs in one (the flat layout) in place, without
/// fsyncing: the caller syncs `dirty` once the scan is done, before the store serves.
/// Streams `DIR`: no list of its entries is ever held.
pub fn prepare(layout: &Layout, dirty: &mut Dirty) -> Result<Placed> {
    let root = layout.root();
    std::fs::create_dir_all(root).map_err(|e| Error::io("create", root, e))?;
    let mut created = false;
    for index in 0..SUBDIRS {
        let sub = layout.subdir(index);
        match std::fs::create_dir(&sub) {
            Ok(()) => created = true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let meta = std::fs::metadata(&sub).map_err(|e| Error::io("stat", &sub, e))?;
                if !meta.is_dir() {
                    return Err(Error::io(
                        "use as a replica directory",
                        &sub,
                        std::io::Error::other("exists and is not a directory"),
                    ));
                }
            }
            Err(e) => return Err(Error::io("create", &sub, e)),
        }
    }
    if created {
        // The subdirectories must be durable before anything is renamed into them.
        sync_dir(root)?;
    }
    let mut placed = Placed::default();
    let entries = std::fs::read_dir(root).map_err(|e| Error::io("list", root, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", root, e))?;
        let name = entry.file_name();
        if parse_subdir(&name).is_some() || !is_file(&entry) {
            continue;
        }
        let src = entry.path();
        match classify(&name) {
            Name::Temp => {
                tracing::info!(path = %src.display(), "removing leftover temporary file");
                remove_temp(&src)?;
                placed.temps_removed += 1;
                dirty.root();
            }
            Name::Replica(handle) => {
                let dst = layout.replica_path(handle);
                match place(&src, &dst)? {
                    Placement::Moved => placed.moved += 1,
                    Placement::SameFile => placed.links_removed += 1,
                    Placement::Duplicate => {
                        tracing::error!(chunk = %handle, path = %src.display(), kept = %dst.display(), "a second replica file for a chunk already in place; renamed aside as .duplicate");
                        placed.duplicates += 1;
                    }
                    Placement::Gone => continue,
                }
                dirty.root();
                dirty.subdir(subdir_of(handle));
            }
            Name::Aside(handle) => {
                let dst = layout.dir_of(handle).join(&name);
                match rename_no_replace(&src, &dst) {
                    Ok(()) => {
                        placed.moved_aside += 1;
                        dirty.root();
                        dirty.subdir(subdir_of(handle));
                    }
                    // Nothing reads these files: one that cannot move stays.
                    Err(e) => {
                        tracing::warn!(path = %src.display(), error = %e, "a moved-aside file stays in the data directory")
                    }
                }
            }
            Name::Other => {}
        }
    }
    if placed != Placed::default() {
        tracing::info!(
            moved = placed.moved,
            moved_aside = placed.moved_aside,
            links_removed = placed.links_removed,
            duplicates = placed.duplicates,
            temps_removed = placed.temps_removed,
            "replica files put in their subdirectories"
        );
    }
    Ok(placed)
}

/// Removes a leftover temporary file (already gone is fine).
pub fn remove_temp(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Name {
        classify(OsStr::new(s))
    }

    #[test]
    fn a_replica_is_exactly_sixteen_lowercase_hex_digits_and_chunk() {
        assert_eq!(
            name("000000000000002a.chunk"),
            Name::Replica(ChunkHandle(42))
        );
        assert_eq!(
            name("ffffffffffffffff.chunk"),
            Name::Replica(ChunkHandle(u64::MAX))
        );
        for other in [
            "2a.chunk",
            "000000000000002A.chunk",
            "zzzzzzzzzzzzzzzz.chunk",
            "000000000000002a.chunks",
            "000000000000002a",
            "+00000000000002a.chunk",
            "LOCK",
            "chunkserver.id",
            "",
            "é000000000000002a.chunk",
        ] {
            assert_eq!(name(other), Name::Other, "{other}");
        }
    }

    #[test]
    fn moved_aside_and_temporary_files_are_told_apart() {
        let h = ChunkHandle(0x2a);
        assert_eq!(name("000000000000002a.chunk.corrupt"), Name::Aside(h));
        assert_eq!(name("000000000000002a.chunk.corrupt.3"), Name::Aside(h));
        assert_eq!(name("000000000000002a.chunk.duplicate"), Name::Aside(h));
        assert_eq!(name("000000000000002a.chunk.tmp"), Name::Temp);
        assert_eq!(
            name("000000000000002a.chunk.recv-00000000deadbeef.tmp"),
            Name::Temp
        );
        assert_eq!(name("anything.tmp"), Name::Temp);
    }

    #[test]
    fn a_name_that_is_not_utf8_is_someone_elses() {
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(
            classify(OsStr::from_bytes(b"\xff\xfe000000000000.chunk")),
            Name::Other
        );
    }

    #[test]
    fn the_subdirectory_is_the_handles_low_byte() {
        let l = Layout::new("/d");
        assert_eq!(
            l.replica_path(ChunkHandle(0x1234)),
            Path::new("/d/34/0000000000001234.chunk")
        );
        assert_eq!(
            replica_path(Path::new("/d"), ChunkHandle(0xff)),
            Path::new("/d/ff/00000000000000ff.chunk")
        );
        assert_eq!(subdir_of(ChunkHandle(0x100)), 0);
        assert_eq!(
            l.receive_path(ChunkHandle(0x100), 0xbeef),
            Path::new("/d/00/0000000000000100.chunk.recv-000000000000beef.tmp")
        );
        assert_eq!(
            classify(l.create_path(ChunkHandle(7)).as_os_str()),
            Name::Temp
        );
        for i in 0..SUBDIRS {
            assert_eq!(parse_subdir(OsStr::new(&subdir_name(i))), Some(i));
        }
        for other in ["0", "000", "FF", "g0", "-1"] {
            assert_eq!(parse_subdir(OsStr::new(other)), None, "{other}");
        }
    }

    #[test]
    fn placing_never_replaces_a_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"new").expect("a");
        assert_eq!(place(&a, &b).expect("place"), Placement::Moved);
        assert_eq!(std::fs::read(&b).expect("b"), b"new");
        // A second name of the same inode goes.
        std::fs::hard_link(&b, &a).expect("link");
        assert_eq!(place(&a, &b).expect("place"), Placement::SameFile);
        assert!(!a.exists());
        // Another file goes aside, twice over.
        for (i, want) in [(0, "b.duplicate"), (1, "b.duplicate.1")] {
            std::fs::write(&a, format!("other {i}")).expect("a");
            assert_eq!(place(&a, &b).expect("place"), Placement::Duplicate);
            assert_eq!(
                std::fs::read(dir.path().join(want)).expect("aside"),
                format!("other {i}").as_bytes()
            );
        }
        assert_eq!(
            std::fs::read(&b).expect("b"),
            b"new",
            "the one in place wins"
        );
        assert_eq!(place(&a, &b).expect("gone"), Placement::Gone);
    }
}
