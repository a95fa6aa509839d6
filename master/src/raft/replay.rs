//! The master's state from the group's directory: the snapshot, then the records of
//! the log entries after it, with the same `apply` the operation log's replay uses.
//!
//! Two callers: the start-up, which replays every entry the log holds (in a group of
//! one, every entry on the sole voter's disk is committed), and the snapshot builder,
//! which replays up to the entry the state machine had applied and writes the result
//! as the next snapshot, off the master's state lock (as `checkpoint::build` does for
//! the operation log).

use super::log_store::LogStore;
use super::snapshot::{self, Loaded};
use super::{Entry, MasterNode, NodeId};
use crate::error::{Error, Result};
use crate::state::{replay_records, MasterState, Settings};
use openraft::{EntryPayload, LogId, SnapshotMeta, StoredMembership};
use std::path::Path;

/// Entries read from the log at a time.
const CHUNK: u64 = 1024;

/// A state rebuilt from the group's directory.
#[derive(Debug)]
pub struct Rebuilt {
    pub state: MasterState,
    /// The snapshot it started from (`None`: the directory has none).
    pub snapshot: Option<SnapshotMeta<NodeId, MasterNode>>,
    /// The LSN of that snapshot's checkpoint.
    pub snapshot_lsn: u64,
    /// The last entry replayed (or the snapshot's, when none was).
    pub last_log_id: Option<LogId<NodeId>>,
    /// Entries replayed after the snapshot.
    pub entries: u64,
}

/// The snapshot in `dir` and the entries of `log` after it, up to entry `upto`
/// (`None`: every entry held), applied to the snapshot's state. Entries must follow
/// the snapshot without a gap and their records must follow its LSN without one.
pub fn rebuild(
    dir: &Path,
    log: &LogStore,
    settings: Settings,
    upto: Option<u64>,
    now_ms: u64,
) -> Result<Rebuilt> {
    let (mut state, snapshot, snapshot_lsn) = match snapshot::read(dir)? {
        Some(Loaded { meta, lsn, payload }) => {
            let st = MasterState::decode_snapshot(settings, &payload, now_ms)?;
            if st.last_lsn != lsn {
                return Err(Error::CorruptCheckpoint {
                    path: snapshot::path(dir),
                    reason: format!("header says LSN {lsn}, contents say {}", st.last_lsn),
                });
            }
            (st, Some(meta), lsn)
        }
        None => (MasterState::new(settings), None, 0),
    };
    let mut last_log_id = snapshot.as_ref().and_then(|m| m.last_log_id);
    let mut next = last_log_id.map_or(0, |l| l.index + 1);
    let mut entries = 0u64;
    loop {
        let end = match upto {
            Some(u) if next > u => break,
            Some(u) => (next + CHUNK).min(u + 1),
            None => next + CHUNK,
        };
        let chunk = log.read_entries(next, Some(end))?;
        let Some(first) = chunk.first() else { break };
        if first.log_id.index != next {
            return Err(gap(
                dir,
                format!(
                    "the log resumes at entry {} where {next} was expected",
                    first.log_id.index
                ),
            ));
        }
        for e in chunk {
            next = e.log_id.index + 1;
            last_log_id = Some(e.log_id);
            entries += 1;
            apply_entry(&mut state, e, now_ms)?;
        }
    }
    if let Some(u) = upto {
        if next <= u {
            return Err(gap(
                dir,
                format!(
                    "the log ends at entry {} before {u}",
                    next.saturating_sub(1)
                ),
            ));
        }
    }
    Ok(Rebuilt {
        state,
        snapshot,
        snapshot_lsn,
        last_log_id,
        entries,
    })
}

fn gap(dir: &Path, reason: String) -> Error {
    Error::CorruptLog {
        path: dir.to_path_buf(),
        offset: 0,
        reason,
    }
}

/// Applies the records of one entry that the state does not hold yet.
fn apply_entry(st: &mut MasterState, e: Entry, now_ms: u64) -> Result<()> {
    let EntryPayload::Normal(batch) = e.payload else {
        return Ok(());
    };
    if batch.first_lsn > st.last_lsn + 1 {
        return Err(Error::Replay {
            lsn: batch.first_lsn,
            reason: format!(
                "entry {} starts at LSN {} after LSN {}",
                e.log_id, batch.first_lsn, st.last_lsn
            ),
        });
    }
    let held = st.last_lsn;
    let records = (batch.first_lsn..)
        .zip(batch.records.iter())
        .filter(|(lsn, _)| *lsn > held)
        .map(|(lsn, bytes)| (lsn, bytes.as_slice()));
    replay_records(st, records, now_ms)
}

/// Builds the snapshot at entry `at` (with `membership` as of it) from the snapshot in
/// `dir` and the log, writes it over the old one, and returns its metadata and LSN.
pub fn build(
    dir: &Path,
    log: &LogStore,
    settings: Settings,
    at: LogId<NodeId>,
    membership: StoredMembership<NodeId, MasterNode>,
) -> Result<(SnapshotMeta<NodeId, MasterNode>, u64)> {
    let r = rebuild(dir, log, settings, Some(at.index), 0)?;
    if let Some(prev) = &r.snapshot {
        if prev.last_log_id >= Some(at) {
            // Nothing applied since: the snapshot there is the one.
            return Ok((prev.clone(), r.snapshot_lsn));
        }
    }
    let lsn = r.state.last_lsn;
    let meta = SnapshotMeta {
        last_log_id: Some(at),
        last_membership: membership,
        snapshot_id: format!("{}-{}-{lsn}", at.leader_id.term, at.index),
    };
    let payload = r.state.encode_snapshot()?;
    snapshot::write(dir, &meta, lsn, &payload)?;
    Ok((meta, lsn))
}
