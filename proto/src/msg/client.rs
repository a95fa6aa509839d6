//! Client → master: namespace, write and read requests and their replies.

#[cfg(doc)]
use super::chunk::VerifyReplica;
use super::shared::{Caller, ChunkCommit, FileStatus, NewAttr, WriteGrant};
use crate::ids::{ChunkHandle, ChunkVersion, ChunkserverId, ClientId};
use bincode::{Decode, Encode};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Mkdir {
    pub path: String,
    pub parents: bool,
    /// Mode and owner of every directory it creates.
    pub attr: Option<NewAttr>,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

/// Creates a symbolic link at `path` holding `target` (any text of 1 to
/// [`MAX_SYMLINK_TARGET`] bytes without NUL, not resolved: the mount's kernel follows
/// links, the master never does).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Symlink {
    pub path: String,
    pub target: String,
    /// The link's owner (its mode is always `0o777`).
    pub attr: Option<NewAttr>,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

/// The longest target a symbolic link may hold (PATH_MAX).
pub const MAX_SYMLINK_TARGET: usize = 4096;

/// The target of the symbolic link at `path`.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReadLink {
    pub path: String,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Create {
    pub path: String,
    pub client: ClientId,
    pub replication: Option<u8>,
    pub chunk_size: Option<u64>,
    pub overwrite: bool,
    pub attr: Option<NewAttr>,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

/// Creates an empty file that is closed at once, in one durable step and without a
/// write lease: `mknod`, and the FUSE mount's `create`, whose lease is taken by an
/// [`Append`] at the first write. A file with nothing written then costs one record
/// and no close; a crash at any point leaves it either absent or closed and empty.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct MakeFile {
    pub path: String,
    /// Who asks (logged; it holds no lease).
    pub client: ClientId,
    pub replication: Option<u8>,
    pub chunk_size: Option<u64>,
    pub attr: Option<NewAttr>,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

/// Reopens a closed file for writing at its end.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Append {
    pub path: String,
    pub client: ClientId,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct AppendReply {
    pub status: FileStatus,
    /// The last chunk re-leased under a new version when it is not full.
    pub last_chunk: Option<WriteGrant>,
}

/// Asks for the next chunk of a file being written, committing the previous one.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct AddChunk {
    pub path: String,
    pub client: ClientId,
    pub previous: Option<ChunkCommit>,
}

/// Pipeline recovery: a new version for `handle` over the surviving replicas.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct UpdatePipeline {
    pub path: String,
    pub client: ClientId,
    pub handle: ChunkHandle,
    pub survivors: Vec<ChunkserverId>,
    /// Bytes of the chunk acknowledged by every replica so far.
    pub acked_length: u64,
}

/// The lease holder shrinks the file's last chunk `handle` to `length` bytes: the
/// master lowers the chunk's committed length (durably) before the writer cuts the
/// replicas, so lease recovery never takes a cut replica for short. Answered once the
/// new length is durable; a length at or above the committed one changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct CutLastChunk {
    pub path: String,
    pub client: ClientId,
    pub handle: ChunkHandle,
    pub length: u64,
}

/// Moves a writer to an existing chunk of its file (a write into it): commits the
/// chunk it was writing (`previous`) and leases chunk `index` under a new version,
/// bumped on its replicas before the grant goes out, like a new chunk's. Chunk
/// `index` must be one of the file's chunks other than the one being written; every
/// chunk before the last is full, so its grant's `chunk_offset` is the chunk size.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct OpenChunk {
    pub path: String,
    pub client: ClientId,
    pub previous: Option<ChunkCommit>,
    pub index: u64,
}

/// Shrinks a file being written below its last chunk: commits the chunk the writer
/// was writing (`previous`) and drops every chunk from index `keep` on (their
/// replicas are deleted). Answered once that is durable. The chunk left last is full;
/// a shrink to within it is a `CutLastChunk` next.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct DropChunks {
    pub path: String,
    pub client: ClientId,
    pub previous: Option<ChunkCommit>,
    pub keep: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Close {
    pub path: String,
    pub client: ClientId,
    pub last: Option<ChunkCommit>,
    /// The writer wrote nothing since it opened the file or since its times were set
    /// (`futimens` before `close`, as `cp -p` does): the close leaves the modification
    /// time alone.
    pub keep_mtime: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RenewLease {
    pub client: ClientId,
}

/// The answer to [`RenewLease`]: how many of the client's leases were renewed, and
/// the master's limits, so that the client renews well within the soft limit
/// whatever it is configured to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub struct LeaseTerms {
    pub renewed: u32,
    pub soft_limit_ms: u64,
    pub hard_limit_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct GetLocations {
    pub path: String,
    pub client: ClientId,
    /// The caller opens the file to read it: the master moves its access time when
    /// the `relatime` rules say so (never for the file's own writer). False for
    /// `stat`, checkers and a reader's refresh.
    pub access: bool,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct List {
    pub path: String,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Stat {
    pub path: String,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Rename {
    pub src: String,
    pub dst: String,
    /// rename(2): an existing `dst` is replaced in the same step (a file or link by a
    /// file or link, an empty directory by a directory). Without it an existing `dst`
    /// is refused.
    pub replace: bool,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Delete {
    pub path: String,
    pub recursive: bool,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RecoverLease {
    pub path: String,
    pub client: ClientId,
    /// The operator declares the replicas that recovery waits for lost (`stampfs
    /// recover --accept-loss`): a file whose last chunk has no reachable replica is
    /// closed at its committed length instead of waiting. Bytes acknowledged past that
    /// length are lost; a replica that comes back later is stale.
    pub accept_loss: bool,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct RecoveryOutcome {
    pub path: String,
    /// True when the file is closed now; false when recovery is still running.
    pub closed: bool,
    pub old_version: Option<ChunkVersion>,
    pub new_version: Option<ChunkVersion>,
    pub length: u64,
}

/// A reader or chunkserver found a replica whose checksums do not match. A hint: the
/// master acts on it only once the replica's chunkserver has verified the replica
/// ([`VerifyReplica`]).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReportCorrupt {
    pub handle: ChunkHandle,
    pub chunkserver: ChunkserverId,
}
