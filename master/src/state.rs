//! The replayable state machine: log [`Record`]s and the state they build.
//!
//! [`MasterState`] holds the persisted metadata (namespace, chunk table with versions
//! and committed lengths, id counters, known chunkservers) and the soft state derived
//! from the running cluster (chunkserver registry, replica locations, lease timers).
//!
//! Every mutation goes through [`MasterState::commit`]: the request is validated, a
//! [`Record`] describing its *result* (the inode, handle and version it minted) is
//! applied with [`MasterState::apply`] and queued in the outbox, from which the server
//! moves it to the operation log while still holding the state lock, so log order is
//! apply order. Replay applies the same records with the same function, which is what
//! makes the counters resume strictly above anything ever logged (invariant 1).
//!
//! Nothing that depends on a record may leave the master before the record is durable:
//! the server waits for the log before replying or sending a bump.
//!
//! This file holds the records, checkpoints, reads and registrations; full chunk
//! reports are in `state/report.rs`, `apply`
//! (what each record does) is in `state/apply.rs`, the requests that mutate the
//! namespace or start a write in `state/ops.rs`.

use crate::chunk_table::{server_index, ChunkInfo, ChunkTable};
use crate::config::MasterConfig;
use crate::error::{Error, Result};
use crate::health::Tracker;
use crate::lease::{LeaseLimits, LeaseTable};
use crate::namespace::{self, join, FileMeta, InodeKind, Namespace, WriteState};
use crate::registry::Registry;
use crate::retry_cache::{CachedReply, CallKind, RetryCache};
use bincode::{Decode, Encode};
use stampfs_proto::{
    ChunkCommit, ChunkHandle, ChunkToken, ChunkVersion, ChunkserverAddr, ChunkserverId, ClientId,
    ClusterKey, FileKind, FileLocations, FileState, FileStatus, InodeId, LocatedChunk, NewAttr,
    Register, ReplicaLocation,
};
use std::collections::{BTreeMap, BTreeSet};

mod access;
mod admin;
mod apply;
mod health;
mod ops;
mod owners;
mod quota;
mod recovery;
mod report;
mod snapshot;
mod users;
mod write;
mod write_checks;
mod xattr;
pub use health::{CorruptReport, MAX_FSCK_FILES};
pub use owners::REQUEST_USER;
pub use quota::{Quota, QuotaLimits, Usage};
pub use recovery::{AppendGate, Closing, RecoveryBegin, RecoveryPlan};
pub use report::{ReportApply, REPORT_BATCH};
pub use users::User;
pub use write::{AddChunkPlan, AppendPlan, BumpPlan, ClosePlan, FinalizePlan, OpenChunkPlan};

/// Version of the checkpoint payload layout. Format 1 (no granted version in open
/// files), format 2 (no granted pipelines), format 3 (no chunks opened before the
/// last), format 4 (no symbolic links: the same layout, which a master that knows
/// no links cannot read once one is in it) and format 5 (no attributes: an inode
/// held its modification time in milliseconds only, and no extended attributes) are
/// still read and upgraded, as is format 6 (no users: a master that reads it creates
/// its superuser at start, as on a first start), and format 7 (no client owners: a
/// restarted master binds the ids of open files' writers to the first user to use
/// them, as it did), format 8 (no chunkservers being decommissioned) and format 9 (no
/// directory quotas).
const SNAPSHOT_FORMAT: u32 = 10;

/// One durable state change. Records carry results (minted ids, versions), never
/// decisions left to replay. New variants go at the end.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum Record {
    /// Directories created in a chain: the first under `parent`, each next one under
    /// the previous.
    Mkdir {
        parent: InodeId,
        dirs: Vec<(String, InodeId)>,
        mtime_ms: u64,
    },
    /// A new file, open for writing by `client`; `replaces` is the file it overwrites.
    Create {
        parent: InodeId,
        name: String,
        inode: InodeId,
        replication: u8,
        chunk_size: u64,
        client: ClientId,
        replaces: Option<InodeId>,
        mtime_ms: u64,
    },
    /// A closed file reopened for append by `client`; `last` is its last chunk with the
    /// version minted for the new lease.
    Reopen {
        inode: InodeId,
        client: ClientId,
        last: Option<(ChunkHandle, ChunkVersion)>,
        mtime_ms: u64,
    },
    /// Commits the previous last chunk and adds a new chunk at `version`.
    AddChunk {
        inode: InodeId,
        previous: Option<ChunkCommit>,
        handle: ChunkHandle,
        version: ChunkVersion,
        mtime_ms: u64,
    },
    /// Removes a just-added chunk that could not be placed (its handle stays used).
    AbandonChunk { inode: InodeId, handle: ChunkHandle },
    /// A new version for an existing chunk (pipeline recovery).
    SetVersion {
        handle: ChunkHandle,
        version: ChunkVersion,
    },
    /// Commits the last chunk's length and closes the file.
    Close {
        inode: InodeId,
        last: Option<ChunkCommit>,
        mtime_ms: u64,
    },
    Rename {
        src_parent: InodeId,
        src_name: String,
        dst_parent: InodeId,
        dst_name: String,
        mtime_ms: u64,
    },
    /// Removes an entry and everything below it, with its chunks.
    Delete {
        parent: InodeId,
        name: String,
        mtime_ms: u64,
    },
    /// A chunkserver id handed out (or its address changed).
    RegisterChunkserver { id: ChunkserverId, addr: String },
    /// Lease recovery of `inode` started (or resumed): the holder's lease is gone and
    /// the last chunk `handle` moves to `version`, which is pushed to its replicas
    /// next. `old_version` is the version the holder wrote with.
    RecoveryStarted {
        inode: InodeId,
        handle: ChunkHandle,
        old_version: ChunkVersion,
        version: ChunkVersion,
    },
    /// Lease recovery of `inode` finished: the last chunk, sealed at `version`, has
    /// `length` committed bytes and the file is closed.
    RecoveryCommitted {
        inode: InodeId,
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
        mtime_ms: u64,
    },
    /// The bump of `version` on the last chunk `handle` of the open file `inode`
    /// reached enough replicas and the write grant carrying it goes out: from now on
    /// lease recovery considers only replicas at `version` or above (the writer may
    /// have bytes acknowledged by exactly those). Logged after the bump, before the
    /// grant; a version whose bump failed is never granted.
    Granted {
        inode: InodeId,
        handle: ChunkHandle,
        version: ChunkVersion,
    },
    /// The open file `inode` goes to lease recovery from its granted version: its
    /// writer's grant could not be completed (a reopen for append whose bump reached
    /// too few replicas) or no replica is reachable to recover it now. The recovery
    /// worker re-bumps and seals the replicas that hold the granted version once they
    /// are reachable; until then the file stays in recovery (nobody may write it, and
    /// replica health leaves its last chunk alone).
    RecoveryQueued { inode: InodeId },
    /// The grant of `version` on the last chunk `handle` of the open file `inode` goes
    /// out with exactly `servers` as its pipeline (the replicas that took the bump).
    /// Like `Granted` it raises the floor of lease recovery to `version`; it also names
    /// who may vote on the length: a replica outside the pipeline (a bump applied late,
    /// after the master gave up on it) never held the writer's acknowledged bytes.
    /// Logged after the bump, before the grant, for new chunks, reopens and pipeline
    /// updates alike.
    GrantedPipeline {
        inode: InodeId,
        handle: ChunkHandle,
        version: ChunkVersion,
        servers: Vec<ChunkserverId>,
    },
    /// The writer of the open file `inode` shrinks its last chunk `handle` to `length`
    /// bytes (below its committed length): logged before any replica is cut, so that
    /// lease recovery never takes a cut replica for short.
    CutChunk {
        inode: InodeId,
        handle: ChunkHandle,
        length: u64,
        mtime_ms: u64,
    },
    /// The writer of the open file `inode` moves to its existing chunk `handle` (a
    /// write into it): `previous`, the chunk it was writing, is committed, and
    /// `handle` becomes the chunk it writes, at `version` (pushed to its replicas
    /// next). Until its grant goes out, lease recovery starts from the version the
    /// chunk's replicas held before. A chunk before the last stays full: its
    /// committed length is the chunk size throughout.
    ChunkOpened {
        inode: InodeId,
        previous: Option<ChunkCommit>,
        handle: ChunkHandle,
        version: ChunkVersion,
        mtime_ms: u64,
    },
    /// The writer of the open file `inode` shrinks it below its last chunk:
    /// `previous`, the chunk it was writing, is committed, and every chunk from index
    /// `keep` on is dropped (its replicas deleted once this is durable). The chunk left
    /// last is full; the writer writes in it from now on, at its current version.
    ChunksDropped {
        inode: InodeId,
        previous: Option<ChunkCommit>,
        keep: u64,
        mtime_ms: u64,
    },
    /// A symbolic link `name` in `parent` holding `target`. After every older
    /// variant, so that each keeps its wire index.
    Symlink {
        parent: InodeId,
        name: String,
        inode: InodeId,
        target: String,
        mtime_ms: u64,
    },
    /// The entry (or chain of directories) that `record`, a `Create`, `Mkdir` or
    /// `Symlink`, creates, with its creator's mode and owner: one record, so that no
    /// replay sees the entry without them (a link keeps mode `0o777`).
    WithAttr { record: Box<Record>, attr: NewAttr },
    /// A rename over an existing entry (rename(2)): `replaced`, the entry at
    /// `dst_parent/dst_name` (a file, a link or an empty directory), is removed and
    /// the source takes its name, in one record, so no replay sees the name missing.
    RenameOver {
        src_parent: InodeId,
        src_name: String,
        dst_parent: InodeId,
        dst_name: String,
        replaced: InodeId,
        mtime_ms: u64,
    },
    /// Sets (`value`) or removes (`None`) the extended attribute `name` of `inode`;
    /// the change time moves up to `mtime_ms`.
    SetXattr {
        inode: InodeId,
        name: String,
        value: Option<Vec<u8>>,
        mtime_ms: u64,
    },
    /// `chmod`, `chown`, `utimensat` of `inode`, or a read's access time: each given
    /// attribute is set as it is; the change time becomes `ctime_ns` (an access alone
    /// leaves it).
    SetAttr {
        inode: InodeId,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime_ns: Option<i64>,
        mtime_ns: Option<i64>,
        ctime_ns: Option<i64>,
    },
    /// A user clients may authenticate as. After every older variant, so that each
    /// keeps its wire index.
    UserAdded { name: String, user: User },
    /// A user removed.
    UserRemoved { name: String },
    /// `client` belongs to `user`: committed, in the same batch, before a record that
    /// gives `client` a lease on a request of that user's (see `state/owners.rs`).
    ClientOwner { client: ClientId, user: String },
    /// The answer of a `Once` call, logged with the change it made (in the same
    /// batch) and kept in the [`RetryCache`] for a repeat of the call.
    CallDone {
        client: ClientId,
        call: u64,
        kind: CallKind,
        reply: CachedReply,
    },
    /// The replication factor of the file `inode` and of each of its chunks becomes
    /// `replication` (`stampfs setrep`). After every older variant, so that each
    /// keeps its wire index.
    SetReplication { inode: InodeId, replication: u8 },
    /// Chunkserver `server` starts (`on`) or ends its decommission.
    Decommission { server: ChunkserverId, on: bool },
    /// The quota limits of the directory `inode` become `limits` (neither set: it
    /// has no quota any more). See `state/quota.rs`.
    SetQuota { inode: InodeId, limits: QuotaLimits },
}

/// The pipeline an open file's last chunk was granted with (see
/// `Record::GrantedPipeline`): persisted, so that lease recovery after a master
/// restart still knows which replicas hold the writer's acknowledged bytes.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Pipeline {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
    pub servers: Vec<ChunkserverId>,
}

/// The configuration the state machine's decisions use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub replication: u8,
    pub chunk_size: u64,
    pub min_replication: u8,
    pub dead_after_ms: u64,
    pub limits: LeaseLimits,
    /// `--trash-for`: how long `rm` keeps entries in the trash (0: delete at once).
    pub trash_ms: u64,
    /// `--orphan-grace`.
    pub orphan_grace_ms: u64,
    /// `--replication-timeout`.
    pub replication_timeout_ms: u64,
    /// When automatic safe mode ends (`--safemode-threshold`, `--safemode-extension`).
    pub safe_mode: crate::safe_mode::Threshold,
    /// `--max-replication-streams`.
    pub max_replication_streams: usize,
}

impl Settings {
    pub fn from_config(c: &MasterConfig) -> Self {
        Self {
            replication: c.replication,
            chunk_size: c.chunk_size,
            min_replication: c.min_replication,
            dead_after_ms: ms(c.dead_after),
            limits: LeaseLimits::new(c.lease_soft, c.lease_hard),
            trash_ms: ms(c.trash_for),
            orphan_grace_ms: ms(c.orphan_grace),
            replication_timeout_ms: ms(c.replication_timeout),
            max_replication_streams: c.max_replication_streams,
            safe_mode: crate::safe_mode::Threshold {
                ppm: (c.safemode_threshold.clamp(0.0, 1.0) * 1e6).round() as u32,
                extension_ms: ms(c.safemode_extension),
            },
        }
    }

    /// The settings the master's unit tests start from: replication 3, 1 MiB chunks,
    /// leases of 60 s / 300 s, no trash, 5 s orphan grace, 2 copy streams per server.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self {
            replication: 3,
            chunk_size: 1 << 20,
            min_replication: 1,
            dead_after_ms: 10_000,
            limits: LeaseLimits::new(
                std::time::Duration::from_secs(60),
                std::time::Duration::from_secs(300),
            ),
            trash_ms: 0,
            orphan_grace_ms: 5_000,
            replication_timeout_ms: 30_000,
            max_replication_streams: 2,
            safe_mode: crate::safe_mode::Threshold {
                ppm: 999_000,
                extension_ms: 0,
            },
        }
    }

    /// Fewest replicas a write on a file of `replication` may proceed with.
    pub fn needed(&self, replication: u8) -> usize {
        usize::from(self.min_replication.min(replication).max(1))
    }
}

/// A duration in whole milliseconds (saturating).
fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a replica report changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportSummary {
    pub current: usize,
    pub stale: usize,
    pub ahead: usize,
    /// At the master's version but shorter than the committed length.
    pub short: usize,
    pub orphans: usize,
}

/// The master's whole state. See the module docs.
#[derive(Debug)]
pub struct MasterState {
    pub settings: Settings,
    /// LSN of the last applied record.
    pub last_lsn: u64,
    pub ns: Namespace,
    pub chunks: ChunkTable,
    /// Chunkserver ids ever handed out, with their last registered address.
    pub servers: BTreeMap<ChunkserverId, String>,
    next_server: u64,
    /// The granted pipeline of each open file's last chunk (persisted; an entry goes
    /// when its file closes, gets a new last chunk or is deleted).
    pub pipelines: BTreeMap<InodeId, Pipeline>,
    /// The chunk each open (or recovering) file is written in since a
    /// `Record::ChunkOpened` moved its writer there, its last chunk included: a full
    /// last chunk is written only when an entry says so (persisted; an entry goes when
    /// its file closes, gets a new chunk, or is deleted). Without an entry a file is
    /// written in its last chunk. See [`MasterState::open_chunk_of`].
    pub open_chunks: BTreeMap<InodeId, ChunkHandle>,
    /// The users clients authenticate as, by name (persisted; see `state/users.rs`).
    users: BTreeMap<String, User>,
    /// The user each lease-holding client belongs to (persisted; see
    /// `state/owners.rs`).
    owners: BTreeMap<ClientId, String>,
    /// Chunkservers being decommissioned (persisted; `Record::Decommission`): they
    /// get no new replicas, and their replicas do not count toward a chunk's
    /// replication factor (see `state/admin.rs`).
    pub decommissioning: BTreeSet<ChunkserverId>,
    /// The directories with a quota: their limits (persisted) and what their
    /// subtrees use (soft, kept current by every record; see `state/quota.rs`).
    pub quotas: BTreeMap<InodeId, Quota>,
    /// Soft: safe mode (off until the serving master enters it; see `safe_mode.rs`).
    pub safe_mode: crate::safe_mode::SafeMode,
    /// Soft: the balancer, while asked to run (`health/balance.rs`).
    pub balancer: Option<crate::health::balance::Balancer>,
    /// Soft: registered chunkservers.
    pub registry: Registry,
    /// Soft: lease timers of open files.
    pub leases: LeaseTable,
    /// Soft index of the files in lease recovery (rebuilt by replay and checkpoint
    /// loading), so the recovery worker does not scan the namespace.
    pub recovering: BTreeSet<InodeId>,
    /// Soft: last chunks that lease recovery closed while no live replica held their
    /// version. fsck reports them as missing; an entry goes when a replica at the
    /// chunk's version is reported (or the chunk is deleted).
    pub missing_chunks: BTreeSet<ChunkHandle>,
    /// Soft: the replica-health worker's state (corrupt replicas, commands in flight,
    /// per-chunkserver command queues).
    pub health: Tracker,
    /// Soft: the acknowledgement clock, raised by every command answer recorded
    /// ([`MasterState::record_replicas`]); see [`MasterState::ack_mark`].
    acks: u64,
    /// Committed records not yet handed to the log: `(lsn, encoded record)`.
    outbox: Vec<(u64, Vec<u8>)>,
    /// Soft (rebuilt from the records after the snapshot): the answers of recent
    /// `Once` calls.
    pub retry: RetryCache,
}

/// The bincode configuration of records and checkpoints (no wire limit: their size is
/// checked by the log framing).
fn codec_config() -> impl bincode::config::Config {
    bincode::config::standard()
}

/// Encodes a record for the log.
pub fn encode_record(rec: &Record) -> Result<Vec<u8>> {
    bincode::encode_to_vec(rec, codec_config()).map_err(|e| Error::Codec {
        reason: e.to_string(),
    })
}

/// Decodes a record from the log.
pub fn decode_record(bytes: &[u8]) -> Result<Record> {
    let (rec, used) =
        bincode::decode_from_slice(bytes, codec_config()).map_err(|e| Error::Codec {
            reason: e.to_string(),
        })?;
    if used != bytes.len() {
        return Err(Error::Codec {
            reason: format!("{} trailing bytes after a log record", bytes.len() - used),
        });
    }
    Ok(rec)
}

impl MasterState {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            last_lsn: 0,
            ns: Namespace::default(),
            chunks: ChunkTable::default(),
            servers: BTreeMap::new(),
            next_server: 1,
            pipelines: BTreeMap::new(),
            open_chunks: BTreeMap::new(),
            users: BTreeMap::new(),
            owners: BTreeMap::new(),
            decommissioning: BTreeSet::new(),
            quotas: BTreeMap::new(),
            safe_mode: Default::default(),
            balancer: None,
            registry: Registry::default(),
            leases: LeaseTable::default(),
            recovering: BTreeSet::new(),
            missing_chunks: BTreeSet::new(),
            health: Tracker::default(),
            acks: 0,
            outbox: Vec::new(),
            retry: RetryCache::default(),
        }
    }

    /// Applies a committed record: validation, the mutation, its soft effects.
    pub fn commit(&mut self, rec: Record, now_ms: u64) -> Result<u64> {
        if let Some(owner) = self.owner_record(&rec) {
            self.commit(owner, now_ms)?;
        }
        let bytes = encode_record(&rec)?;
        let lsn = self.last_lsn + 1;
        self.apply(lsn, &rec, now_ms)
            .map_err(|reason| Error::Replay { lsn, reason })?;
        self.outbox.push((lsn, bytes));
        Ok(lsn)
    }

    /// How many records were committed since the outbox was last taken.
    pub fn outbox_len(&self) -> usize {
        self.outbox.len()
    }

    /// Records committed since the last call, for the log.
    pub fn take_outbox(&mut self) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut self.outbox)
    }

    // ------------------------------------------------------------ reads

    /// Length of a file: the sum of its chunks' committed lengths.
    pub fn file_length(&self, f: &FileMeta) -> u64 {
        f.chunks
            .iter()
            .filter_map(|h| self.chunks.get(*h))
            .map(|c| c.length)
            .sum()
    }

    /// The status of `ino`, reported under `path`.
    pub fn status(&self, path: String, ino: InodeId) -> Result<FileStatus> {
        let inode = self
            .ns
            .get(ino)
            .ok_or_else(|| Error::NotFound { path: path.clone() })?;
        Ok(match &inode.kind {
            InodeKind::Dir(_) => FileStatus {
                path,
                inode: ino,
                kind: FileKind::Directory,
                length: 0,
                replication: 0,
                chunk_size: 0,
                state: FileState::Closed,
                attr: inode.attr,
            },
            InodeKind::File(f) => FileStatus {
                path,
                inode: ino,
                kind: FileKind::File,
                length: self.file_length(f),
                replication: f.replication,
                chunk_size: f.chunk_size,
                state: match f.write {
                    WriteState::Closed => FileState::Closed,
                    WriteState::Open { .. } => FileState::Open,
                    WriteState::Recovering { .. } => FileState::Recovering,
                },
                attr: inode.attr,
            },
            InodeKind::Symlink(target) => FileStatus {
                path,
                inode: ino,
                kind: FileKind::Symlink,
                length: target.len() as u64,
                replication: 0,
                chunk_size: 0,
                state: FileState::Closed,
                attr: inode.attr,
            },
        })
    }

    /// The error for a file operation on `path`, whose inode `ino` is not a file: a
    /// directory, or a symbolic link (which the master never follows).
    pub fn not_a_file(&self, path: &str, ino: InodeId) -> Error {
        match self.ns.get(ino).map(|i| &i.kind) {
            Some(InodeKind::Symlink(_)) => Error::NotSupported {
                reason: format!(
                    "{path} is a symbolic link: stampfs does not follow links (a mount's \
                     kernel does)"
                ),
            },
            _ => Error::IsADirectory {
                path: path.to_string(),
            },
        }
    }

    /// Resolves a path to its inode.
    pub fn resolve_path(&self, path: &str) -> Result<InodeId> {
        self.ns.resolve(&namespace::components(path)?)
    }

    pub fn stat(&self, path: &str) -> Result<FileStatus> {
        let comps = namespace::components(path)?;
        let ino = self.ns.resolve(&comps)?;
        self.status(join(&comps), ino)
    }

    /// A directory's entries sorted by name, or a file's own status.
    pub fn list(&self, path: &str) -> Result<Vec<FileStatus>> {
        let comps = namespace::components(path)?;
        let ino = self.ns.resolve(&comps)?;
        let inode = self
            .ns
            .get(ino)
            .ok_or_else(|| Error::NotFound { path: join(&comps) })?;
        match &inode.kind {
            InodeKind::File(_) | InodeKind::Symlink(_) => Ok(vec![self.status(join(&comps), ino)?]),
            InodeKind::Dir(d) => {
                let base = join(&comps);
                d.children
                    .iter()
                    // The trash is hidden from listings of `/` (list it by name).
                    .filter(|(name, _)| !(comps.is_empty() && name.as_ref() == crate::trash::DIR))
                    .map(|(name, child)| {
                        let p = if base == "/" {
                            format!("/{name}")
                        } else {
                            format!("{base}/{name}")
                        };
                        self.status(p, *child)
                    })
                    .collect()
            }
        }
    }

    /// Live chunkserver addresses for the current replicas of `info`.
    fn current_locations(&self, info: &ChunkInfo, now_ms: u64) -> Vec<ReplicaLocation> {
        info.current()
            .filter_map(|r| {
                let addr =
                    self.registry
                        .live_addr(r.server_id(), now_ms, self.settings.dead_after_ms)?;
                Some(ReplicaLocation {
                    chunkserver: r.server_id(),
                    addr: addr.to_string(),
                    version: r.version,
                    state: r.state,
                    decommissioning: self.decommissioning.contains(&r.server_id()),
                })
            })
            .collect()
    }

    pub(crate) fn current_targets(&self, info: &ChunkInfo, now_ms: u64) -> Vec<ChunkserverAddr> {
        self.current_locations(info, now_ms)
            .into_iter()
            .map(|l| ChunkserverAddr {
                id: l.chunkserver,
                addr: l.addr,
            })
            .collect()
    }

    /// The targets of a bump for a chunk whose writer holds version `floor`: replicas
    /// on live chunkservers from `floor` up to the chunk's version (a version minted
    /// above the writer's whose bump reached some of them or none: its answer was
    /// lost, and the writer asks again).
    pub(crate) fn targets_since(
        &self,
        info: &ChunkInfo,
        floor: ChunkVersion,
        now_ms: u64,
    ) -> Vec<ChunkserverAddr> {
        info.replicas
            .iter()
            .filter(|r| r.version >= floor && r.version <= info.version && !r.short)
            .filter_map(|r| {
                let addr =
                    self.registry
                        .live_addr(r.server_id(), now_ms, self.settings.dead_after_ms)?;
                Some(ChunkserverAddr {
                    id: r.server_id(),
                    addr: addr.to_string(),
                })
            })
            .collect()
    }

    /// Where a file's chunks can be read, with read tokens for `client`. Only replicas
    /// on live chunkservers at the master's version are listed (invariant 4).
    pub fn locations(
        &self,
        path: &str,
        client: ClientId,
        key: &ClusterKey,
        now_ms: u64,
    ) -> Result<FileLocations> {
        let comps = namespace::components(path)?;
        let ino = self.ns.resolve(&comps)?;
        let status = self.status(join(&comps), ino)?;
        let f = self
            .ns
            .file(ino)
            .ok_or_else(|| self.not_a_file(&join(&comps), ino))?;
        // The chunk being written (the last one unless the writer moved).
        let open = match f.write {
            WriteState::Closed => None,
            _ => self.open_index_of(ino, f),
        };
        let mut chunks = Vec::with_capacity(f.chunks.len());
        let mut offset = 0u64;
        for (i, h) in f.chunks.iter().enumerate() {
            let Some(info) = self.chunks.get(*h) else {
                continue;
            };
            let complete = open != Some(i);
            let mut replicas = self.current_locations(info, now_ms);
            let mut unconfirmed = false;
            // The chunk being written: only the granted pipeline holds what the writer
            // hflushed. A replica that applied the grant's bump late is at the same
            // version without those bytes, and would hide them from the reader.
            // Listed in pipeline order (head first), whatever order the bumps were
            // acknowledged in. A member that cannot be listed may hold fewer bytes than
            // the others (a chunkserver that died before the writer's last packets
            // reached it), and lease recovery would cut to it once it is back: readers
            // then read only the committed length (the nemesis found a reader reading
            // bytes that recovery cut so, seed 9009).
            if let WriteState::Open { granted, .. } = f.write {
                if !complete && granted == info.version {
                    if let Some(p) = self.pipeline_of(ino, *h, granted) {
                        replicas.retain(|r| p.contains(&r.chunkserver));
                        replicas.sort_by_key(|r| p.iter().position(|s| *s == r.chunkserver));
                        // A short member is left out by recovery too: it decides
                        // nothing, and hiding bytes for it would only blind readers.
                        unconfirmed = p.iter().any(|id| {
                            !replicas.iter().any(|r| r.chunkserver == *id)
                                && info.replica(*id).is_none_or(|r| !r.short)
                        });
                    }
                }
            }
            chunks.push(LocatedChunk {
                handle: *h,
                version: info.version,
                file_offset: offset,
                length: info.length,
                complete,
                unconfirmed,
                token: ChunkToken::sign_read(key, *h, info.version, client),
                replicas,
            });
            offset += info.length;
        }
        Ok(FileLocations { status, chunks })
    }

    // ------------------------------------------------------------ chunkservers

    /// `register`: keeps a known id, otherwise hands out a new one (logged), then
    /// records the server and its replicas. `covered`: the report's mark, the
    /// acknowledgement clock when the `Register` arrived ([`Self::ack_mark`]).
    pub fn register(&mut self, req: &Register, now_ms: u64, covered: u64) -> Result<ChunkserverId> {
        let id = match req.id {
            Some(id) if self.servers.contains_key(&id) => {
                if self.servers.get(&id) != Some(&req.addr) {
                    self.commit(
                        Record::RegisterChunkserver {
                            id,
                            addr: req.addr.clone(),
                        },
                        now_ms,
                    )?;
                }
                id
            }
            claimed => {
                let id = ChunkserverId(self.next_server);
                if server_index(id).is_none() {
                    return Err(Error::bad_request("chunkserver ids are exhausted"));
                }
                if let Some(old) = claimed {
                    tracing::warn!(claimed = %old, assigned = %id, addr = %req.addr, "chunkserver claims an id this master never handed out; assigning a new one");
                }
                self.commit(
                    Record::RegisterChunkserver {
                        id,
                        addr: req.addr.clone(),
                    },
                    now_ms,
                )?;
                id
            }
        };
        self.registry
            .register(id, &req.addr, req.capacity, req.used, now_ms);
        let s = self.apply_report(id, &req.replicas, covered);
        self.health.forget_server(id);
        tracing::info!(chunkserver = %id, addr = %req.addr, replicas = req.replicas.len(), current = s.current, stale = s.stale, ahead = s.ahead, short = s.short, orphans = s.orphans, "chunkserver registered");
        Ok(id)
    }

    /// Every persisted field equal (replay checks).
    pub fn same_persisted(&self, other: &MasterState) -> bool {
        self.last_lsn == other.last_lsn
            && self.ns == other.ns
            && self.chunks.len() == other.chunks.len()
            && self.chunks.iter().all(|(h, c)| {
                other.chunks.get(*h).is_some_and(|o| {
                    (o.version, o.length, o.replication) == (c.version, c.length, c.replication)
                })
            })
            && self.chunks.next_handle() == other.chunks.next_handle()
            && self.servers == other.servers
            && self.next_server == other.next_server
            && self.pipelines == other.pipelines
            && self.open_chunks == other.open_chunks
            && self.owners() == other.owners()
            && self.decommissioning == other.decommissioning
            && self.quotas == other.quotas
    }

    /// The servers of the granted pipeline of `inode`'s last chunk `handle` at
    /// `floor` (the granted version, or the holder's version in recovery); `None`
    /// when the master does not know it (a grant logged before pipelines were, or one
    /// not made yet).
    pub fn pipeline_of(
        &self,
        inode: InodeId,
        handle: ChunkHandle,
        floor: ChunkVersion,
    ) -> Option<&[ChunkserverId]> {
        self.pipelines
            .get(&inode)
            .filter(|p| p.handle == handle && p.version == floor)
            .map(|p| p.servers.as_slice())
    }

    /// The id the next registering chunkserver gets.
    pub fn next_server_id(&self) -> ChunkserverId {
        ChunkserverId(self.next_server)
    }
}

/// Replays a checkpoint payload (if any) and log records into a state.
pub fn replay_records<'a>(
    st: &mut MasterState,
    records: impl IntoIterator<Item = (u64, &'a [u8])>,
    now_ms: u64,
) -> Result<()> {
    for (lsn, bytes) in records {
        let rec = decode_record(bytes).map_err(|e| Error::Replay {
            lsn,
            reason: e.to_string(),
        })?;
        st.apply(lsn, &rec, now_ms)
            .map_err(|reason| Error::Replay { lsn, reason })?;
    }
    Ok(())
}

#[cfg(test)]
mod attr_tests;

#[cfg(test)]
mod open_chunk_tests;

#[cfg(test)]
mod perm_tests;

#[cfg(test)]
mod rename_tests;

#[cfg(test)]
mod symlink_tests;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod xattr_tests;

#[cfg(test)]
mod quota_tests;
