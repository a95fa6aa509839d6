//! Shapes several conversations share: replicas, files, attributes, chunk locations.

use crate::ids::{ChunkHandle, ChunkVersion, ChunkserverId, InodeId};
use crate::token::ChunkToken;
use bincode::{Decode, Encode};
use serde::Serialize;

/// The state of one replica on a chunkserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Encode, Decode, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaState {
    /// Open for a writer; its length may still grow.
    Writing,
    /// Sealed at a final length.
    Finalized,
}

/// Where a chunkserver listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Encode, Decode, Serialize)]
pub struct ChunkserverAddr {
    pub id: ChunkserverId,
    pub addr: String,
}

/// What a chunkserver says about one of its replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct ReplicaReport {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
    pub length: u64,
    pub state: ReplicaState,
}

/// Directory, file or symbolic link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Directory,
    /// After every older variant, so that each keeps its wire index. Its length is
    /// that of its target.
    Symlink,
}

/// Whether a file has a writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileState {
    /// A client holds the write lease.
    Open,
    /// No writer; the length is final until the next append.
    Closed,
    /// The master is recovering the lease of a writer that went away.
    Recovering,
}

/// A namespace entry as clients see it.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct FileStatus {
    pub path: String,
    pub inode: InodeId,
    pub kind: FileKind,
    /// Committed length (for an open file: up to the last committed chunk).
    pub length: u64,
    pub replication: u8,
    pub chunk_size: u64,
    pub state: FileState,
    /// Mode bits, owner and times.
    #[serde(flatten)]
    pub attr: Attr,
}

/// The POSIX attributes the master keeps for every entry. Times are nanoseconds since
/// the Unix epoch (negative before it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct Attr {
    /// Permission bits with set-uid, set-gid and sticky (`0o7777`); the kind is
    /// [`FileStatus::kind`]'s.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// The bits of [`Attr::mode`] the master stores: permissions, set-uid, set-gid, sticky.
pub const MODE_BITS: u32 = 0o7777;

/// Mode and owner of an entry being created: the caller's uid and gid, and the mode
/// it asked for with its umask applied. Without one the master uses uid 0, gid 0 and
/// `0o644` for files, `0o755` for directories. A symbolic link's mode is always
/// `0o777`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub struct NewAttr {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Who sends a namespace request, as the master checks permissions: user, primary
/// group and supplementary groups (at most [`MAX_GROUPS`]). Not authenticated yet:
/// any client may claim any identity. Without one a request acts as root (the
/// cluster's own tools).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The most supplementary groups a [`Caller`] may name (Linux's `NGROUPS_MAX`).
pub const MAX_GROUPS: usize = 65_536;

/// The longest extended attribute name, `user.` included (Linux's `XATTR_NAME_MAX`).
pub const MAX_XATTR_NAME: usize = 255;
/// The most bytes the extended attributes of one entry may hold, names and values
/// together (Linux's `XATTR_SIZE_MAX` for one value).
pub const MAX_XATTR_BYTES: usize = 64 << 10;

/// The value of the extended attribute `name` (in the `user.` namespace, the only one
/// stampfs stores) of the entry at `path`; `None` when it has none of that name.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct GetXattr {
    pub path: String,
    pub name: String,
    pub caller: Option<Caller>,
}

/// The names of the extended attributes of the entry at `path`, sorted.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ListXattr {
    pub path: String,
    pub caller: Option<Caller>,
}

/// How a [`SetXattr`] with a value treats an existing attribute (setxattr(2)'s flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum XattrSet {
    /// Create it or replace it.
    Any,
    /// Only create: an existing one is `AlreadyExists` (`XATTR_CREATE`).
    Create,
    /// Only replace: without one nothing is set (`XATTR_REPLACE`).
    Replace,
}

/// Sets (`value`) or removes (`None`) the extended attribute `name` of the entry at
/// `path`. Answers whether the attribute existed before: `false` for a removal or a
/// [`XattrSet::Replace`] means nothing was done (`ENODATA`).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct SetXattr {
    pub path: String,
    pub name: String,
    pub value: Option<Vec<u8>>,
    pub how: XattrSet,
    pub caller: Option<Caller>,
}

/// A time [`SetAttr`] sets: the master's clock, or a given instant in nanoseconds
/// since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum SetTime {
    Now,
    At(i64),
}

/// Changes the mode, owner or times of the entry at `path` (`chmod`, `chown`,
/// `utimensat`); the change time becomes the master's clock. A size change is a
/// writer's `set_len`, not this. Answers the new status.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct SetAttr {
    pub path: String,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

impl SetAttr {
    /// A change of nothing yet at `path`: set the fields to change
    /// (`SetAttr { mode: Some(0o755), ..SetAttr::new(path) }`).
    pub fn new(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            mode: None,
            uid: None,
            gid: None,
            atime: None,
            mtime: None,
            caller: None,
        }
    }
}

/// One replica of a chunk as the master knows it.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct ReplicaLocation {
    pub chunkserver: ChunkserverId,
    pub addr: String,
    pub version: ChunkVersion,
    pub state: ReplicaState,
    /// Its chunkserver is being decommissioned: readable, but it does not count
    /// toward the chunk's replication factor (`setrep -w` leaves it out). Last, but
    /// it changes the encoding of every reply listing replicas: clients and servers
    /// are upgraded together.
    pub decommissioning: bool,
}

/// A chunk of a file with the replicas a reader may use.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct LocatedChunk {
    pub handle: ChunkHandle,
    /// The master's current version: only replicas at this version are listed.
    pub version: ChunkVersion,
    /// Offset of the chunk's first byte in the file.
    pub file_offset: u64,
    /// Committed length; the last chunk of an open file may hold more on its replicas.
    pub length: u64,
    /// False for the last chunk of a file that is being written.
    pub complete: bool,
    /// For the chunk being written: a replica of the writer's granted pipeline is not
    /// listed (its chunkserver is dead, has not reported since the master started, or
    /// holds a short replica). What it holds is unknown, and lease recovery would take
    /// the shortest replica of the pipeline once it is back, so readers read only the
    /// committed length.
    pub unconfirmed: bool,
    /// Read token for this chunk at `version`.
    pub token: ChunkToken,
    pub replicas: Vec<ReplicaLocation>,
}

/// What `GetLocations` returns.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct FileLocations {
    pub status: FileStatus,
    pub chunks: Vec<LocatedChunk>,
}

/// Permission to write one chunk through a pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct WriteGrant {
    /// The fencing token: the chunk, its freshly minted version, this client.
    pub token: ChunkToken,
    /// Index of the chunk in the file.
    pub chunk_index: u64,
    /// File offset of the chunk's first byte.
    pub file_offset: u64,
    /// Where in the chunk writing starts (non-zero when appending to a partial chunk).
    pub chunk_offset: u64,
    pub chunk_size: u64,
    /// The replicas in pipeline order; the client connects to the first.
    pub pipeline: Vec<ChunkserverAddr>,
}

/// A chunk's final length, committed by the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ChunkCommit {
    pub handle: ChunkHandle,
    pub length: u64,
}
