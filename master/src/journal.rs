//! Where the master's committed records go: the operation log ([`Oplog`]) or the
//! master group's log ([`Group`]), chosen at start (`--log`, [`LogKind`]).
//!
//! [`Core`](crate::service::Core) talks to either through the same calls: check that
//! this master serves ([`Journal::serving`]: a member of a group serves only while it
//! leads) and queue a record under the state lock ([`Journal::append`]), noting the
//! [`Mark`] to wait for; wait until it is durable (the operation log) or committed
//! (the group) before anything depending on it leaves ([`Journal::wait_durable`]),
//! counters, and stopping. Checkpoints differ: the
//! operation log is rotated and trimmed by the master (`Core::checkpoint`); the
//! group's checkpoints are openraft snapshots, built by its state machine and
//! followed by openraft's purge of the log ([`Group::snapshot`]).
//!
//! [`LogKind`]: crate::config::LogKind

use crate::error::{Error, Result};
use crate::oplog::{LogStats, Oplog};
use crate::raft::group::Group;

/// What a request waits for: the LSN of its last record (or of the last record its
/// read saw), and the group's generation it was queued in (0 for the operation log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub lsn: u64,
    pub generation: u64,
}

/// The master's log.
#[derive(Debug)]
pub enum Journal {
    Oplog(Oplog),
    Group(Box<Group>),
}

impl Journal {
    /// Queues committed record `lsn` (which must follow the previous one). Never waits.
    pub fn append(&self, lsn: u64, bytes: &[u8]) -> Result<()> {
        match self {
            Journal::Oplog(log) => log.append(lsn, bytes),
            Journal::Group(g) => g.append(lsn, bytes),
        }
    }

    /// Queues the records of one mutation (LSNs in a row) together: in a group they
    /// commit in one entry or not at all; the operation log writes them in order.
    pub fn append_all(&self, records: &[(u64, &[u8])]) -> Result<()> {
        match self {
            Journal::Oplog(log) => records.iter().try_for_each(|(l, b)| log.append(*l, b)),
            Journal::Group(g) => g.append_all(records),
        }
    }

    /// `Ok` when this master serves requests (always, with the operation log; while it
    /// leads, in a group). Check it under the state lock before changing the state.
    pub fn serving(&self) -> Result<()> {
        match self {
            Journal::Oplog(_) => Ok(()),
            Journal::Group(g) => g.leadership.check(),
        }
    }

    /// The mark of record `lsn`, the last one queued (call it under the state lock).
    pub fn mark(&self, lsn: u64) -> Mark {
        let generation = match self {
            Journal::Oplog(_) => 0,
            Journal::Group(g) => g.generation().unwrap_or(0),
        };
        Mark { lsn, generation }
    }

    /// Waits until the marked record and every one before it are durable (committed,
    /// for the group, in the generation it was queued in).
    pub async fn wait_durable(&self, mark: Mark) -> Result<()> {
        match self {
            Journal::Oplog(log) => log.wait_durable(mark.lsn).await,
            Journal::Group(g) => g.wait_committed(mark.lsn, mark.generation).await,
        }
    }

    /// After a read of the state: waits until what it saw is committed and, in a group
    /// of several, confirms this member still led after the read (a quorum answered
    /// its heartbeats), so the read saw everything committed before it.
    pub async fn wait_readable(&self, mark: Mark) -> Result<()> {
        self.wait_durable(mark).await?;
        match self {
            Journal::Group(g) if g.has_peers() => {
                g.confirm_leading().await?;
                // The round confirmed the leadership it ran under: the one the read
                // was made under, or the read is not confirmed.
                if g.generation() != Some(mark.generation) {
                    return Err(Error::NotLeader {
                        leader: g.leadership.leader(),
                    });
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// When this member took the lead of a group with other members (the master's
    /// clock, ms): the chunkservers register with it over the next heartbeats. `None`
    /// for the operation log and a group of one.
    pub fn led_since_ms(&self) -> Option<u64> {
        match self {
            Journal::Group(g) if g.has_peers() => Some(g.leadership.led_since_ms()),
            _ => None,
        }
    }

    /// The histograms of the durable writes.
    pub fn timings(&self) -> crate::oplog::LogTimings {
        match self {
            Journal::Oplog(log) => log.timings(),
            Journal::Group(g) => g.timings(),
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
    pub fn group(&self) -> Option<&Group> {
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
