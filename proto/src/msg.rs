//! Every message stampfs processes exchange.
//!
//! Three conversations:
//! - **client → master** and **chunkserver → master**: [`MasterRequest`], one variant
//!   per request struct; each struct names its reply through [`crate::rpc::Rpc`].
//! - **client / peer / master → chunkserver**: [`ChunkRequest`]. A [`WriteSetup`] turns
//!   its connection into a pipeline stream of [`Packet`]s answered by [`Ack`]s.
//! - **master → chunkserver commands**: [`ChunkCommand`], always inside a
//!   [`Signed`] envelope, sent directly when the master must wait
//!   for the result (version bumps) or in a [`HeartbeatReply`] otherwise. A
//!   [`VerifyReplica`] (signed the same way) asks a chunkserver to check a replica
//!   someone reported corrupt, and answers with a [`Verification`].
//!
//! Bulk bytes (packet payloads, read results) never appear here: they travel as the
//! frame's raw data section.

use crate::error::RemoteError;
use crate::ids::{ChunkHandle, ChunkVersion, ChunkserverId, ClientId, InodeId};
use crate::token::{ChunkToken, Signed};
use bincode::{Decode, Encode};
use serde::Serialize;

// ---------------------------------------------------------------- shared shapes

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

// ---------------------------------------------------------------- client → master

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

// ---------------------------------------------------------------- chunkserver → master

/// The first message of a chunkserver's connection to the master: the chunkserver's
/// challenge. The master answers with its own ([`ServerChallenge`]); the chunkserver
/// then proves it holds the cluster key ([`ServerProve`]) and the master proves it
/// back (see [`crate::auth`]). Until then the connection may not register, heartbeat
/// or report.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ServerHello {
    pub nonce: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ServerChallenge {
    pub nonce: [u8; 32],
}

/// The chunkserver's proof of the cluster key over both challenges; the reply is the
/// master's ([`ServerProveReply`]), or `Unauthenticated`.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ServerProve {
    pub proof: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ServerProveReply {
    pub proof: [u8; 32],
}

// ---------------------------------------------------------------- client → master: who

/// The first message of a client's connection to the master: the user it speaks for
/// and its challenge (see [`crate::auth`]). Until the handshake is done the connection
/// may send nothing else.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClientHello {
    pub user: String,
    pub nonce: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClientChallenge {
    pub nonce: [u8; 32],
}

/// The client's proof of its user's key over both challenges; the reply is the
/// master's proof and who the connection now is ([`ClientProveReply`]), or
/// `Unauthenticated`.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClientProve {
    pub proof: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClientProveReply {
    pub proof: [u8; 32],
    pub identity: UserInfo,
}

/// A user as the master knows it (never its key). A superuser may do everything root
/// may, administer the cluster, and send requests as any [`Caller`] (a mount serving
/// other local users); anyone else's requests act as its own uid, gid and groups.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct UserInfo {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub superuser: bool,
}

impl UserInfo {
    /// The identity its requests act as.
    pub fn caller(&self) -> Caller {
        Caller {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

/// Creates a user (superusers only). The master draws its key and returns it once.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct AddUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub superuser: bool,
}

#[derive(Clone, PartialEq, Eq, Encode, Decode)]
pub struct AddUserReply {
    pub user: UserInfo,
    pub key: [u8; 32],
}

impl std::fmt::Debug for AddUserReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddUserReply")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Every user (superusers only).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ListUsers {}

/// Removes a user (superusers only): its connections stay open until they close, new
/// ones are refused. The last superuser cannot be removed.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RemoveUser {
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Register {
    /// The id persisted in the chunkserver's directory, if it has one.
    pub id: Option<ChunkserverId>,
    pub addr: String,
    pub capacity: u64,
    pub used: u64,
    pub replicas: Vec<ReplicaReport>,
    /// A random number the chunkserver draws for this registration: the master signs
    /// every command for it under this session ([`crate::replay`]).
    pub session: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RegisterReply {
    pub id: ChunkserverId,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Heartbeat {
    pub id: ChunkserverId,
    pub capacity: u64,
    pub used: u64,
    pub replica_count: u64,
    pub active_streams: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct HeartbeatReply {
    /// Work for the chunkserver: deletions, replications.
    pub commands: Vec<Signed<ChunkCommand>>,
    /// The master does not know this chunkserver (it restarted): register again.
    pub reregister: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ChunkReport {
    pub id: ChunkserverId,
    pub replicas: Vec<ReplicaReport>,
}

/// One part of a full report too long for one message (a chunkserver sends at most
/// 64 Ki replicas per message). The master keeps the parts a connection sends, in
/// order, and puts them before the replicas of the next [`Register`] or
/// [`ChunkReport`] on the same connection, which completes the report; parts not
/// completed when the connection closes are forgotten. A report that fits in one
/// message has no parts, so a master that predates this message still serves a
/// chunkserver of up to 64 Ki replicas (upgrade masters first).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReportPart {
    pub replicas: Vec<ReplicaReport>,
}

// ---------------------------------------------------------------- replica health

/// `stampfs fsck [PATH]`: replica health of the files under `path` (`/` when absent).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Fsck {
    pub path: Option<String>,
}

/// Serializes a chunk handle as its 16 hex digits (the replica file name).
fn handle_hex<S: serde::Serializer>(h: &ChunkHandle, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&h.to_string())
}

/// Counts by health, for one file or a whole tree. Chunk counts (`chunks`, `healthy`,
/// `under_replicated`, `missing`) are per chunk; the `*_replicas` counts are per replica.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct HealthCounts {
    pub files: u64,
    pub chunks: u64,
    /// At least `replication` live replicas at the master's version, nothing pending.
    pub healthy: u64,
    /// Some, but fewer than `replication`, live replicas at the master's version.
    pub under_replicated: u64,
    /// No live replica at the master's version (includes chunks lease recovery found
    /// missing).
    pub missing: u64,
    /// Replicas below the master's version, pending deletion (never handed out).
    pub stale_replicas: u64,
    /// Replicas reported corrupt, excluded and pending replacement and deletion.
    pub corrupt_replicas: u64,
    /// Replicas ABOVE the master's version: invariant 1 was broken; kept aside.
    pub ahead_replicas: u64,
    /// Files open for writing.
    pub open_files: u64,
    /// Files in lease recovery.
    pub recovering_files: u64,
}

/// One chunk that is not healthy.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct ChunkProblem {
    #[serde(serialize_with = "handle_hex")]
    pub handle: ChunkHandle,
    pub index: u64,
    pub version: ChunkVersion,
    pub replication: u8,
    /// Live replicas at the master's version.
    pub live: u64,
    pub stale: u64,
    pub corrupt: u64,
    pub ahead: u64,
    pub missing: bool,
}

/// One file that is not healthy, or is open or in recovery.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct FileHealth {
    pub path: String,
    pub state: FileState,
    pub length: u64,
    pub replication: u8,
    pub healthy: bool,
    pub counts: HealthCounts,
    pub problems: Vec<ChunkProblem>,
}

/// What `Fsck` returns.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct FsckReport {
    /// The tree that was checked.
    pub path: String,
    /// True when nothing under `path` needs attention (open files are fine).
    pub healthy: bool,
    pub total: HealthCounts,
    /// Files that are unhealthy, open or in recovery (healthy closed files are only
    /// counted).
    pub files: Vec<FileHealth>,
    /// `files` was cut at the reply's limit.
    pub truncated: bool,
    /// Replicas of chunks the master does not know, pending deletion (whole cluster).
    pub orphan_replicas: u64,
    /// Re-replications running (whole cluster).
    pub replications_in_flight: u64,
}

/// `stampfs admin report`.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClusterReportRequest {}

/// Whether the master hears from a chunkserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChunkserverState {
    Live,
    Dead,
}

/// One chunkserver as the master sees it.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct ChunkserverStatus {
    pub id: ChunkserverId,
    pub addr: String,
    pub state: ChunkserverState,
    /// Milliseconds since its last heartbeat; `None` when it has not registered since
    /// the master started.
    pub last_heartbeat_ms_ago: Option<u64>,
    pub capacity: u64,
    pub used: u64,
    /// Replicas it reported.
    pub replicas: u64,
    /// Open write and replication streams it reported.
    pub active_streams: u32,
    /// Commands queued for its next heartbeat reply.
    pub queued_commands: u64,
}

/// What `ClusterReportRequest` returns.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct ClusterReport {
    pub chunkservers: Vec<ChunkserverStatus>,
    /// Chunk totals by health over the whole namespace.
    pub chunks: HealthCounts,
    pub orphan_replicas: u64,
    pub replications_in_flight: u64,
}

/// Every request the master serves.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum MasterRequest {
    Mkdir(Mkdir),
    Create(Create),
    Append(Append),
    AddChunk(AddChunk),
    UpdatePipeline(UpdatePipeline),
    Close(Close),
    RenewLease(RenewLease),
    GetLocations(GetLocations),
    List(List),
    Stat(Stat),
    Rename(Rename),
    Delete(Delete),
    RecoverLease(RecoverLease),
    ReportCorrupt(ReportCorrupt),
    Register(Register),
    Heartbeat(Heartbeat),
    ChunkReport(ChunkReport),
    Fsck(Fsck),
    ClusterReport(ClusterReportRequest),
    /// After every older variant, so that each keeps its wire index.
    ReportPart(ReportPart),
    /// After every older variant, so that each keeps its wire index.
    MakeFile(MakeFile),
    /// After every older variant, so that each keeps its wire index.
    CutLastChunk(CutLastChunk),
    /// After every older variant, so that each keeps its wire index.
    OpenChunk(OpenChunk),
    /// After every older variant, so that each keeps its wire index.
    DropChunks(DropChunks),
    /// After every older variant, so that each keeps its wire index.
    Symlink(Symlink),
    /// After every older variant, so that each keeps its wire index.
    ReadLink(ReadLink),
    /// After every older variant, so that each keeps its wire index.
    SetAttr(SetAttr),
    /// After every older variant, so that each keeps its wire index.
    GetXattr(GetXattr),
    /// After every older variant, so that each keeps its wire index.
    ListXattr(ListXattr),
    /// After every older variant, so that each keeps its wire index.
    SetXattr(SetXattr),
    /// After every older variant, so that each keeps its wire index.
    ServerHello(ServerHello),
    /// After every older variant, so that each keeps its wire index.
    ServerProve(ServerProve),
    /// After every older variant, so that each keeps its wire index.
    ClientHello(ClientHello),
    /// After every older variant, so that each keeps its wire index.
    ClientProve(ClientProve),
    /// After every older variant, so that each keeps its wire index.
    AddUser(AddUser),
    /// After every older variant, so that each keeps its wire index.
    ListUsers(ListUsers),
    /// After every older variant, so that each keeps its wire index.
    RemoveUser(RemoveUser),
}

/// Who may send a [`MasterRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestClass {
    /// A step of a handshake: any connection.
    Handshake,
    /// A chunkserver's message: a connection that proved the cluster key.
    Chunkserver,
    /// A client's request: a connection that proved a user's key.
    Client,
    /// Administration: a connection that proved a superuser's key.
    Admin,
    /// A report a reader or a chunkserver sends: either kind of proven connection.
    ClientOrChunkserver,
}

impl MasterRequest {
    /// Who may send it.
    pub fn class(&self) -> RequestClass {
        use MasterRequest as R;
        match self {
            R::ServerHello(_) | R::ServerProve(_) | R::ClientHello(_) | R::ClientProve(_) => {
                RequestClass::Handshake
            }
            R::Register(_) | R::Heartbeat(_) | R::ChunkReport(_) | R::ReportPart(_) => {
                RequestClass::Chunkserver
            }
            R::ReportCorrupt(_) => RequestClass::ClientOrChunkserver,
            R::Fsck(_)
            | R::ClusterReport(_)
            | R::AddUser(_)
            | R::ListUsers(_)
            | R::RemoveUser(_) => RequestClass::Admin,
            R::Mkdir(_)
            | R::Create(_)
            | R::Append(_)
            | R::AddChunk(_)
            | R::UpdatePipeline(_)
            | R::Close(_)
            | R::RenewLease(_)
            | R::GetLocations(_)
            | R::List(_)
            | R::Stat(_)
            | R::Rename(_)
            | R::Delete(_)
            | R::RecoverLease(_)
            | R::MakeFile(_)
            | R::CutLastChunk(_)
            | R::OpenChunk(_)
            | R::DropChunks(_)
            | R::Symlink(_)
            | R::ReadLink(_)
            | R::SetAttr(_)
            | R::GetXattr(_)
            | R::ListXattr(_)
            | R::SetXattr(_) => RequestClass::Client,
        }
    }

    /// The identity a namespace request says it acts as, for the master to check
    /// against (and fill in from) the connection's user.
    pub fn caller_mut(&mut self) -> Option<&mut Option<Caller>> {
        use MasterRequest as R;
        Some(match self {
            R::Mkdir(r) => &mut r.caller,
            R::Create(r) => &mut r.caller,
            R::Append(r) => &mut r.caller,
            R::GetLocations(r) => &mut r.caller,
            R::List(r) => &mut r.caller,
            R::Stat(r) => &mut r.caller,
            R::Rename(r) => &mut r.caller,
            R::Delete(r) => &mut r.caller,
            R::RecoverLease(r) => &mut r.caller,
            R::MakeFile(r) => &mut r.caller,
            R::Symlink(r) => &mut r.caller,
            R::ReadLink(r) => &mut r.caller,
            R::SetAttr(r) => &mut r.caller,
            R::GetXattr(r) => &mut r.caller,
            R::ListXattr(r) => &mut r.caller,
            R::SetXattr(r) => &mut r.caller,
            _ => return None,
        })
    }

    /// The client id a request speaks for (the holder of write leases and tokens).
    pub fn client_id(&self) -> Option<ClientId> {
        use MasterRequest as R;
        Some(match self {
            R::Create(r) => r.client,
            R::Append(r) => r.client,
            R::AddChunk(r) => r.client,
            R::UpdatePipeline(r) => r.client,
            R::Close(r) => r.client,
            R::RenewLease(r) => r.client,
            R::GetLocations(r) => r.client,
            R::RecoverLease(r) => r.client,
            R::MakeFile(r) => r.client,
            R::CutLastChunk(r) => r.client,
            R::OpenChunk(r) => r.client,
            R::DropChunks(r) => r.client,
            _ => return None,
        })
    }
}

// ---------------------------------------------------------------- → chunkserver

/// Opens a pipeline stream: from here on the connection carries [`Packet`]s one way
/// and [`Ack`]s the other.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct WriteSetup {
    pub token: ChunkToken,
    /// Chunk offset of the first packet.
    pub offset: u64,
    /// The rest of the pipeline, in order.
    pub downstream: Vec<ChunkserverAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct WriteSetupReply {
    /// Replicas that accepted the stream, this one first.
    pub accepted: Vec<ChunkserverId>,
    /// Replicas that refused or could not be reached, with the reason.
    pub failed: Vec<(ChunkserverId, RemoteError)>,
}

/// One packet of a pipeline stream; its payload is the frame's data section.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Packet {
    pub token: ChunkToken,
    pub seq: u64,
    /// Chunk offset of the payload's first byte.
    pub offset: u64,
    /// CRC32 of the payload, computed by the client.
    pub crc: u32,
    /// fdatasync before acknowledging (hsync).
    pub sync: bool,
}

/// One replica's outcome for a packet.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReplicaAck {
    pub chunkserver: ChunkserverId,
    /// The replica's length after the packet, or why it failed.
    pub result: Result<u64, RemoteError>,
}

/// Acknowledgement of a packet, with a status for every replica of the pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Ack {
    pub seq: u64,
    pub replicas: Vec<ReplicaAck>,
}

/// Reads a byte range of a replica; the bytes come back as the reply's data section.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Read {
    pub token: ChunkToken,
    pub offset: u64,
    pub len: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReadReply {
    /// The replica's length and state at the time of the read.
    pub replica: ReplicaReport,
}

/// Asks a replica for its version, length and state (readers of open files use it to
/// learn how much has been acknowledged).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReplicaInfo {
    pub token: ChunkToken,
}

/// Pushes a finalized replica to another chunkserver (re-replication). The bytes follow
/// as [`Packet`]s on the same connection, then a final [`Ack`] confirms.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReceiveReplica {
    /// Signed by the master for the chunk's current version.
    pub token: ChunkToken,
    pub length: u64,
}

/// A command the master authenticates with the cluster key.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum ChunkCommand {
    /// Raise the replica to `version` durably (header write + fsync), creating an empty
    /// replica when `create` is set and none exists.
    BumpVersion {
        handle: ChunkHandle,
        version: ChunkVersion,
        create: bool,
    },
    /// Delete the replica if its version is at most `max_version`.
    Delete {
        handle: ChunkHandle,
        max_version: ChunkVersion,
    },
    /// Copy the finalized replica at `version` to `target`.
    Replicate {
        handle: ChunkHandle,
        version: ChunkVersion,
        target: ChunkserverAddr,
    },
    /// Cut the replica at `version` to `length`.
    Truncate {
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    },
    /// Seal the replica at `version` with `length`.
    Finalize {
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    },
    /// Report version, length and state.
    Info { handle: ChunkHandle },
}

/// Asks a chunkserver to check every block of its replica of `handle` against its
/// checksums now (the check the background scrub makes), because someone reported the
/// replica corrupt. Sent by the master inside a [`Signed`] envelope. A block that fails
/// is handled like any corruption the chunkserver finds itself: the replica is moved
/// aside and reported.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct VerifyReplica {
    pub handle: ChunkHandle,
}

/// What a [`VerifyReplica`] found.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum Verification {
    /// Every block matched its checksum; the replica as it is now.
    Clean { replica: ReplicaReport },
    /// The block at `offset` did not: the replica (at `version`) was moved aside.
    Corrupt { version: ChunkVersion, offset: u64 },
    /// No such replica here (never held, deleted, or moved aside already).
    Absent,
}

/// Opens a pipeline stream for writes at any offset of the chunk (overwrites), in
/// place of [`WriteSetup`]'s append stream. The set-up never cuts the replica; each
/// packet is written at its own offset, which may be anywhere up to the replica's
/// length (bytes below it are overwritten in place, bytes past it appended), so a
/// resend of the same packets in the same order is an idempotent retry. Forwarded
/// downstream as an `OverwriteSetup` too. See DESIGN.md, "Writes at any offset".
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct OverwriteSetup {
    pub setup: WriteSetup,
}

/// Asks a chunkserver for the checksum table of its replica of `handle` at exactly
/// `version` (lease recovery compares the replicas of a chunk that may have been
/// overwritten unevenly). Sent by the master inside a [`Signed`] envelope.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct DigestReplica {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
}

/// What a [`DigestReplica`] found: the replica, and the XXH3-64 hash of each 64 KiB
/// block of its data up to its length (the last entry covers a partial block up to
/// the length), read from the data and verified against its checksums. Two replicas
/// with equal lengths and equal hashes hold the same bytes. Not the blocks' CRC32s:
/// CRC is linear, and data made of fixed-length records that each end with their own
/// CRC32 (a common log layout, and the nemesis's slot file) has the same CRC32 whatever
/// the records say, so two replicas holding different records would look the same.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReplicaDigest {
    pub replica: ReplicaReport,
    pub blocks: Vec<u64>,
}

/// Every request a chunkserver serves.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum ChunkRequest {
    WriteSetup(WriteSetup),
    Read(Read),
    ReplicaInfo(ReplicaInfo),
    ReceiveReplica(ReceiveReplica),
    Command(Signed<ChunkCommand>),
    Verify(Signed<VerifyReplica>),
    /// After every older variant, so that each keeps its wire index.
    OverwriteSetup(OverwriteSetup),
    /// After every older variant, so that each keeps its wire index.
    Digest(Signed<DigestReplica>),
}
