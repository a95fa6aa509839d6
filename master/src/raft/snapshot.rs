//! The group's snapshot on disk: the checkpoint of the master's state at a log id.
//!
//! ```text
//! DIR/snapshot := "STMPSNP1" | meta_len u32be | crc32 | bincode(SnapshotMetaDisk)
//!                 | the checkpoint (oplog.rs: "STMPCKP1" | lsn | len | crc | payload)
//! ```
//!
//! Written as the checkpoint is (temp file, fsync, rename, directory fsync), so the
//! file is always a whole snapshot, the older or the newer. Its metadata says the last
//! log entry it covers and the membership then; its checkpoint says the last record
//! (LSN). A group's directory always has one: forming a group writes the first, at
//! log id `T1-N1-1` ([`FORMED_AT`]).

use super::disk::{decode_snapshot_header, encode_snapshot_header};
use super::{MasterNode, NodeId, SnapshotFile};
use crate::error::{Error, Result};
use crate::oplog::{checkpoint_header, parse_checkpoint, write_durably};
use openraft::{LogId, Membership, SnapshotMeta, StoredMembership};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The snapshot's file name in the group's directory.
pub const SNAPSHOT_FILE: &str = "snapshot";
const SNAPSHOT_TMP: &str = "snapshot.tmp";
/// Where a snapshot sent by the leader is received before it is checked and renamed
/// into place.
const SNAPSHOT_RECV: &str = "snapshot.recv";

/// The log id a group is formed at: term 1, node 1, index 1. The first snapshot covers
/// it (with the membership of node 1 alone) and the log starts after it, so the group
/// needs no `initialize` and its member leads at once (its vote is committed).
pub const FORMED_AT: LogId<NodeId> = LogId {
    leader_id: openraft::LeaderId {
        term: 1,
        node_id: 1,
    },
    index: 1,
};

/// A snapshot read back: its metadata, the LSN of its checkpoint, and the checkpoint's
/// payload (`MasterState::encode_snapshot`).
#[derive(Debug)]
pub struct Loaded {
    pub meta: SnapshotMeta<NodeId, MasterNode>,
    pub lsn: u64,
    pub payload: Vec<u8>,
}

/// The metadata of a group's first snapshot, at LSN `lsn`: `members` (id → address)
/// are its voters, from [`FORMED_AT`]. Every member of a group formed with
/// `--peers` writes the same one.
pub fn formed_meta(
    members: &BTreeMap<NodeId, String>,
    lsn: u64,
) -> SnapshotMeta<NodeId, MasterNode> {
    let nodes: BTreeMap<NodeId, MasterNode> = members
        .iter()
        .map(|(id, addr)| (*id, MasterNode { addr: addr.clone() }))
        .collect();
    let membership = Membership::new(vec![nodes.keys().copied().collect()], nodes);
    SnapshotMeta {
        last_log_id: Some(FORMED_AT),
        last_membership: StoredMembership::new(Some(FORMED_AT), membership),
        snapshot_id: format!("formed-{lsn}"),
    }
}

/// Writes `dir/snapshot` durably: `meta`, then the checkpoint of `payload` at `lsn`.
pub fn write(
    dir: &Path,
    meta: &SnapshotMeta<NodeId, MasterNode>,
    lsn: u64,
    payload: &[u8],
) -> Result<()> {
    let head = encode_snapshot_header(meta)?;
    let ckp = checkpoint_header(lsn, payload);
    write_durably(dir, SNAPSHOT_FILE, SNAPSHOT_TMP, &[&head, &ckp, payload])
}

/// The snapshot's path in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(SNAPSHOT_FILE)
}

/// Removes the temp file of a snapshot a crash left unfinished. Only at start, before
/// the group runs: while it runs, the file may be a snapshot being written.
pub fn remove_unfinished(dir: &Path) -> Result<()> {
    for name in [SNAPSHOT_TMP, SNAPSHOT_RECV] {
        let tmp = dir.join(name);
        match std::fs::remove_file(&tmp) {
            Ok(()) => {
                tracing::warn!(path = %tmp.display(), "removed a snapshot never finished")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("remove {}", tmp.display()), e)),
        }
    }
    Ok(())
}

/// A new, empty file in `dir` to receive a snapshot from the leader into.
pub async fn begin_receive(dir: &Path) -> Result<SnapshotFile> {
    let path = dir.join(SNAPSHOT_RECV);
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .await
        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    Ok(SnapshotFile { path, file })
}

/// Checks the snapshot received in `dir` (whole, undamaged, covering `expected`),
/// makes it durable and renames it over `dir/snapshot`: the member's snapshot from now
/// on. Returns it read back.
pub fn adopt_received(dir: &Path, expected: Option<LogId<NodeId>>) -> Result<Loaded> {
    let recv = dir.join(SNAPSHOT_RECV);
    let loaded = read_file(&recv)?.ok_or_else(|| Error::CorruptCheckpoint {
        path: recv.clone(),
        reason: "the received snapshot is gone".into(),
    })?;
    if loaded.meta.last_log_id != expected {
        return Err(Error::CorruptCheckpoint {
            path: recv,
            reason: format!(
                "it covers {:?}, the leader said {expected:?}",
                loaded.meta.last_log_id
            ),
        });
    }
    let io = |what: &str, e| Error::io(format!("{what} {}", recv.display()), e);
    std::fs::File::open(&recv)
        .and_then(|f| f.sync_all())
        .map_err(|e| io("sync", e))?;
    std::fs::rename(&recv, path(dir)).map_err(|e| io("rename", e))?;
    crate::oplog::sync_dir(dir)?;
    Ok(loaded)
}

/// Reads `dir/snapshot`: `None` when there is none; damage is an error (the log it
/// covers may be purged). Touches nothing: a snapshot may be being written meanwhile.
pub fn read(dir: &Path) -> Result<Option<Loaded>> {
    read_file(&path(dir))
}

fn read_file(path: &Path) -> Result<Option<Loaded>> {
    let path = path.to_path_buf();
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    let corrupt = |reason: String| Error::CorruptCheckpoint {
        path: path.clone(),
        reason,
    };
    let (meta, at) = decode_snapshot_header(&bytes)
        .map_err(|e| corrupt(e.to_string()))?
        .ok_or_else(|| corrupt("cut short inside its header".into()))?;
    let (lsn, payload) = parse_checkpoint(&bytes[at..], &path)?;
    Ok(Some(Loaded {
        meta,
        lsn,
        payload: payload.to_vec(),
    }))
}

/// The metadata of `dir/snapshot` and the file open for reading, for openraft to send.
pub async fn open(dir: &Path) -> Result<Option<(SnapshotMeta<NodeId, MasterNode>, SnapshotFile)>> {
    use tokio::io::AsyncReadExt;
    let path = path(dir);
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    let mut head = vec![0u8; 16];
    file.read_exact(&mut head)
        .await
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let corrupt = |reason: String| Error::CorruptCheckpoint {
        path: path.clone(),
        reason,
    };
    loop {
        match decode_snapshot_header(&head).map_err(|e| corrupt(e.to_string()))? {
            Some((meta, _)) => {
                use tokio::io::AsyncSeekExt;
                file.seek(std::io::SeekFrom::Start(0))
                    .await
                    .map_err(|e| Error::io(format!("seek {}", path.display()), e))?;
                return Ok(Some((meta, SnapshotFile { path, file })));
            }
            None => {
                let more = head.len() * 2;
                let have = head.len();
                head.resize(more, 0);
                let n = file
                    .read(&mut head[have..])
                    .await
                    .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
                if n == 0 {
                    return Err(corrupt("cut short inside its header".into()));
                }
                head.truncate(have + n);
            }
        }
    }
}
