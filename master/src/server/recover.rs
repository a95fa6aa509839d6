//! Start-up recovery: the master's state and its log, from either kind of directory.
//!
//! - An **operation-log directory** (`DIR/checkpoint`, `DIR/oplog.*`): the checkpoint,
//!   then every record after it ([`oplog::replay`], which cuts a torn tail).
//! - A **master group's directory** (`DIR/raft`): its snapshot, then every entry of
//!   its log after it ([`group::recover`]), and the group started as a group of one.
//!
//! **Moving to the group** (`--log group` on a directory without `DIR/raft`, new or
//! not): the operation log is recovered as above, the state is written as the first
//! snapshot of a group formed in `DIR/raft.tmp` ([`group::form`]), which is renamed to
//! `DIR/raft` (the step that decides: a crash before it redoes the move, after it the
//! directory is a group's). Then the operation log's files move to `DIR/pre-raft`
//! and `DIR/checkpoint` becomes the marker [`oplog::RAFT_MARKER`], which a binary that
//! knows only the operation log refuses instead of starting empty. A crash in
//! between leaves files that the next start moves. Going back is a manual move of
//! `pre-raft` that loses everything written since.

use crate::config::{LogKind, MasterConfig};
use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::lease::Clock;
use crate::oplog::{self, DirLock, Oplog};
use crate::raft::group::{self, Group, StartWith};
use crate::raft::network::Network;
use crate::state::{decode_record, MasterState, Settings};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The group's directory inside the master's.
pub const RAFT_DIR: &str = "raft";
const RAFT_TMP: &str = "raft.tmp";
/// Where the operation log's files go once the directory moved to the group.
const PRE_RAFT: &str = "pre-raft";
/// The member id of a group of one.
const SOLE_MEMBER: u64 = 1;
/// This member's id, in the group's directory.
const MEMBER_ID_FILE: &str = "member-id";

/// What start-up recovered: the state, the LSN its checkpoint (or snapshot) covers,
/// and the log to append to.
pub struct Recovered {
    pub state: Arc<Mutex<MasterState>>,
    pub checkpoint_lsn: u64,
    pub log: Journal,
}

/// Recovers the state and opens the log `config` asks for (a group's directory stays
/// a group's). Replay may truncate a torn tail: the blocking work holds `dir_lock`.
pub async fn recover(
    config: &MasterConfig,
    dir_lock: &Arc<DirLock>,
    settings: Settings,
    clock: Clock,
    network: Network,
) -> Result<Recovered> {
    let now_ms = clock.now_ms();
    let dir = config.dir.clone();
    let raft_dir = dir.join(RAFT_DIR);
    let is_group = raft_dir.exists();
    if !is_group && !config.uses_group() && !config.join {
        let (state, checkpoint_lsn) = blocking(dir_lock, {
            let dir = dir.clone();
            move || recover_oplog(&dir, settings, now_ms)
        })
        .await?;
        let log = Oplog::open(&dir, state.last_lsn + 1)?;
        return Ok(Recovered {
            state: Arc::new(Mutex::new(state)),
            checkpoint_lsn,
            log: Journal::Oplog(log),
        });
    }
    if is_group && config.log == LogKind::Oplog {
        tracing::warn!(dir = %dir.display(), "this directory keeps its records in the master group's log (DIR/raft): --log oplog does not apply");
    }
    let members: BTreeMap<u64, String> = if config.peers.is_empty() {
        BTreeMap::from([(SOLE_MEMBER, config.listen.clone())])
    } else {
        config
            .peers
            .iter()
            .map(|p| (p.id, p.addr.clone()))
            .collect()
    };
    let join = config.join;
    let wanted_id = if config.peers.is_empty() && !join {
        None
    } else {
        Some(config.id)
    };
    let (recovered, id) = blocking(dir_lock, {
        let dir = dir.clone();
        move || {
            let raft = dir.join(RAFT_DIR);
            if !is_group {
                if join {
                    join_group(&dir, wanted_id.unwrap_or(SOLE_MEMBER))?;
                } else {
                    move_to_group(&dir, settings, now_ms, &members, wanted_id)?;
                }
            }
            set_aside_oplog(&dir)?;
            let id = member_id(&raft, wanted_id)?;
            Ok((group::recover(&raft, settings, now_ms, join)?, id))
        }
    })
    .await?;
    let r = &recovered.rebuilt;
    tracing::info!(
        snapshot_lsn = r.snapshot_lsn,
        replayed_entries = r.entries,
        last_entry = ?r.last_log_id,
        last_lsn = r.state.last_lsn,
        inodes = r.state.ns.len(),
        chunks = r.state.chunks.len(),
        open_files = r.state.leases.len(),
        "metadata recovered from the master group's log"
    );
    let mut recovered = recovered;
    let state = std::mem::replace(&mut recovered.rebuilt.state, MasterState::new(settings));
    let state = Arc::new(Mutex::new(state));
    let g = Group::start(
        &raft_dir,
        &recovered,
        StartWith {
            id,
            settings,
            dir_lock: Arc::downgrade(dir_lock),
            master: state.clone(),
            clock,
            network,
            keep_entries: config.group_log_keep,
            joining: join,
        },
    )
    .await?;
    let checkpoint_lsn = recovered.rebuilt.snapshot_lsn;
    Ok(Recovered {
        state,
        checkpoint_lsn,
        log: Journal::Group(Box::new(g)),
    })
}

/// Runs `f` on a blocking thread holding the directory lock, so that even a start
/// abandoned midway (its future dropped) keeps the directory locked until it ends.
async fn blocking<T: Send + 'static>(
    dir_lock: &Arc<DirLock>,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let lock = dir_lock.clone();
    tokio::task::spawn_blocking(move || {
        let _dir_lock = lock;
        f()
    })
    .await
    .map_err(|e| Error::Replay {
        lsn: 0,
        reason: format!("recovery task failed: {e}"),
    })?
}

/// Loads the checkpoint and replays the operation log after it.
pub fn recover_oplog(dir: &Path, settings: Settings, now_ms: u64) -> Result<(MasterState, u64)> {
    let mut st = match oplog::read_checkpoint(dir)? {
        Some((lsn, bytes)) => {
            let st = MasterState::decode_snapshot(settings, &bytes, now_ms)?;
            if st.last_lsn != lsn {
                return Err(Error::CorruptCheckpoint {
                    path: dir.join("checkpoint"),
                    reason: format!("header says LSN {lsn}, contents say {}", st.last_lsn),
                });
            }
            st
        }
        None => MasterState::new(settings),
    };
    let checkpoint_lsn = st.last_lsn;
    let stats = oplog::replay(dir, checkpoint_lsn, |lsn, bytes| {
        let rec = decode_record(bytes).map_err(|e| Error::Replay {
            lsn,
            reason: e.to_string(),
        })?;
        st.apply(lsn, &rec, now_ms)
            .map_err(|reason| Error::Replay { lsn, reason })
    })?;
    tracing::info!(
        checkpoint_lsn,
        replayed = stats.applied,
        last_lsn = st.last_lsn,
        segments = stats.segments,
        truncated_bytes = stats.truncated_bytes,
        inodes = st.ns.len(),
        chunks = st.chunks.len(),
        open_files = st.leases.len(),
        "metadata recovered"
    );
    Ok((st, checkpoint_lsn))
}

/// This member's id in the group whose directory is `raft` (`DIR/raft/member-id`,
/// written when the directory was formed or joined; a group of one formed before
/// that file existed is member 1). `wanted`: the `--id` given with `--peers` or
/// `--join`, which must agree with it.
fn member_id(raft: &Path, wanted: Option<u64>) -> Result<u64> {
    let path = raft.join(MEMBER_ID_FILE);
    let kept = match std::fs::read_to_string(&path) {
        Ok(text) => Some(
            text.trim()
                .parse::<u64>()
                .map_err(|_| Error::CorruptCheckpoint {
                    path: path.clone(),
                    reason: "it does not hold a member id".into(),
                })?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    match (kept, wanted) {
        (Some(k), Some(w)) if k != w => Err(Error::Config {
            field: "id",
            reason: format!(
                "this directory is member {k} of its group, not {w}: a member keeps its id"
            ),
        }),
        (Some(k), _) => Ok(k),
        (None, Some(w)) => Ok(w),
        (None, None) => Ok(SOLE_MEMBER),
    }
}

fn write_member_id(raft: &Path, id: u64) -> Result<()> {
    oplog::write_durably(
        raft,
        MEMBER_ID_FILE,
        "member-id.tmp",
        &[format!("{id}\n").as_bytes()],
    )
}

/// `DIR/raft.tmp`, emptied of what a crashed start left there.
fn fresh_tmp(dir: &Path) -> Result<PathBuf> {
    let tmp = dir.join(RAFT_TMP);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .map_err(|e| Error::io(format!("remove {}", tmp.display()), e))?;
    }
    Ok(tmp)
}

/// Makes the group's directory prepared in `tmp` the directory's (`DIR/raft`): the
/// rename is the step that decides.
fn install_group_dir(dir: &Path, tmp: &Path) -> Result<()> {
    oplog::sync_dir(tmp)?;
    let raft = dir.join(RAFT_DIR);
    std::fs::rename(tmp, &raft)
        .map_err(|e| Error::io(format!("rename {} to {}", tmp.display(), raft.display()), e))?;
    oplog::sync_dir(dir)
}

/// Makes `DIR/raft` for a member started with `--join` on a new directory: an empty
/// log, no snapshot, no vote. It serves nothing until the leader adds it
/// (`admin masters add`) and sends it the group's state.
fn join_group(dir: &Path, id: u64) -> Result<()> {
    let holds_metadata =
        dir.join(oplog::CHECKPOINT_FILE).exists() || !oplog::segments(dir)?.is_empty();
    if holds_metadata {
        return Err(Error::Config {
            field: "join",
            reason: format!(
                "{} holds metadata of its own: a member joins a group on a new directory",
                dir.display()
            ),
        });
    }
    let tmp = fresh_tmp(dir)?;
    crate::raft::log_store::LogStore::open(&tmp)?;
    write_member_id(&tmp, id)?;
    install_group_dir(dir, &tmp)?;
    tracing::info!(
        member = id,
        "a new member's directory: waiting to be added to the group (stampfs admin masters add)"
    );
    Ok(())
}

/// Forms the group of `members` in `DIR/raft` from the operation log's state (see the
/// module doc). Only a new directory may form a group of several: each member forms
/// the same first snapshot, which holds nothing.
fn move_to_group(
    dir: &Path,
    settings: Settings,
    now_ms: u64,
    members: &BTreeMap<u64, String>,
    me: Option<u64>,
) -> Result<()> {
    let tmp = fresh_tmp(dir)?;
    let (st, _) = recover_oplog(dir, settings, now_ms)?;
    if members.len() > 1 && st.last_lsn > 0 {
        return Err(Error::Config {
            field: "peers",
            reason: format!(
                "{} holds metadata (up to log record {}): only a new directory forms a group \
                 of several members",
                dir.display(),
                st.last_lsn
            ),
        });
    }
    let payload = st.encode_snapshot()?;
    group::form(&tmp, members, st.last_lsn, &payload)?;
    if let Some(me) = me {
        write_member_id(&tmp, me)?;
    }
    install_group_dir(dir, &tmp)?;
    tracing::info!(
        lsn = st.last_lsn,
        inodes = st.ns.len(),
        chunks = st.chunks.len(),
        "the metadata moved to the master group's log (DIR/raft)"
    );
    Ok(())
}

/// Moves the operation log's files out of a group's directory (into `DIR/pre-raft`)
/// and leaves the marker in `DIR/checkpoint`. Nothing to do when that was done.
fn set_aside_oplog(dir: &Path) -> Result<()> {
    let mut files: Vec<PathBuf> = oplog::segments(dir)?.into_iter().map(|(_, p)| p).collect();
    let checkpoint = dir.join(oplog::CHECKPOINT_FILE);
    let marked = std::fs::read(&checkpoint).is_ok_and(|b| b == oplog::RAFT_MARKER);
    if checkpoint.exists() && !marked {
        files.push(checkpoint);
    }
    if !files.is_empty() {
        let aside = free_name(dir);
        std::fs::create_dir(&aside)
            .map_err(|e| Error::io(format!("create {}", aside.display()), e))?;
        for f in &files {
            let name = f.file_name().unwrap_or_default();
            std::fs::rename(f, aside.join(name))
                .map_err(|e| Error::io(format!("move {} aside", f.display()), e))?;
        }
        oplog::sync_dir(&aside)?;
        oplog::sync_dir(dir)?;
        tracing::info!(to = %aside.display(), files = files.len(), "the operation log's files were set aside");
    }
    if !marked {
        oplog::write_durably(
            dir,
            oplog::CHECKPOINT_FILE,
            "checkpoint.tmp",
            &[oplog::RAFT_MARKER],
        )?;
    }
    Ok(())
}

/// `DIR/pre-raft`, or `DIR/pre-raft.N` when that exists already.
fn free_name(dir: &Path) -> PathBuf {
    let first = dir.join(PRE_RAFT);
    if !first.exists() {
        return first;
    }
    (1u32..)
        .map(|n| dir.join(format!("{PRE_RAFT}.{n}")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}
