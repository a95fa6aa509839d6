//! Where the master's committed records go: the operation log ([`Oplog`]) or the
//! master group's log ([`GroupOfOne`]), chosen at start (`--log`, [`LogKind`]).
//!
//! [`Core`](crate::service::Core) talks to either through the same calls: queue a
//! record under the state lock ([`Journal::append`]), wait until it is durable (the
//! operation log) or committed (the group) before anything depending on it leaves
//! ([`Journal::wait_durable`]), counters, and stopping. Checkpoints differ: the
//! operation log is rotated and trimmed by the master (`Core::checkpoint`); the
//! group's checkpoints are openraft snapshots, built by its state machine and
//! followed by openraft's purge of the log ([`GroupOfOne::snapshot`]).
//!
//! [`LogKind`]: crate::config::LogKind

use crate::error::{Error, Result};
use crate::oplog::{LogStats, Oplog};
use crate::raft::group::GroupOfOne;

/// The master's log.
#[derive(Debug)]
pub enum Journal {
    Oplog(Oplog),
    Group(Box<GroupOfOne>),
}

impl Journal {
    /// Queues committed record `lsn` (which must follow the previous one). Never waits.
    pub fn append(&self, lsn: u64, bytes: &[u8]) -> Result<()> {
        match self {
            Journal::Oplog(log) => log.append(lsn, bytes),
            Journal::Group(g) => g.append(lsn, bytes),
        }
    }

    /// Waits until record `lsn` and every one before it are durable (committed, for
    /// the group).
    pub async fn wait_durable(&self, lsn: u64) -> Result<()> {
        match self {
            Journal::Oplog(log) => log.wait_durable(lsn).await,
            Journal::Group(g) => g.proposer.wait_committed(lsn).await,
        }
    }

    /// Counters about the writes.
    pub fn stats(&self) -> LogStats {
        match self {
            Journal::Oplog(log) => log.stats(),
            Journal::Group(g) => g.stats(),
        }
    }

    /// Stops at once, dropping what is queued (a crash, as far as the directory can
    /// tell): nothing is written into it after this returns but the write in progress.
    pub fn halt(&self) {
        match self {
            Journal::Oplog(log) => log.halt(),
            Journal::Group(g) => g.halt(),
        }
    }

    /// The group, if the master keeps its records in one.
    pub fn group(&self) -> Option<&GroupOfOne> {
        match self {
            Journal::Oplog(_) => None,
            Journal::Group(g) => Some(g),
        }
    }

    /// The operation log, if the master keeps its records in it.
    pub fn oplog(&self) -> Result<&Oplog> {
        match self {
            Journal::Oplog(log) => Ok(log),
            Journal::Group(_) => Err(Error::LogFailed {
                reason: "the master keeps its records in the group's log, not the operation log"
                    .into(),
            }),
        }
    }
}
