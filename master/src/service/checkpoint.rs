//! Checkpoints, as methods of [`Core`]: with the operation log, a checkpoint file
//! built off the state lock from the previous one and the durable log, then the log it
//! covers trimmed; with the master group's log, a snapshot built by the group's state
//! machine, after which openraft purges the entries it covers. Both are started by the
//! checkpoint worker ([`Core::maybe_checkpoint`]) and by the admin request.

use super::{stall_point, Core};
use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::oplog;
use crate::raft::group::Group;
use std::sync::atomic::Ordering;

impl Core {
    /// Waits until the log's rotation to `next_lsn` is done (or the master stopped
    /// serving).
    async fn rotated(&self, log: &oplog::Oplog, next_lsn: u64) -> Result<()> {
        tokio::select! {
            r = log.wait_rotated(next_lsn) => r,
            _ = self.halt.cancelled() => self.check_running(),
        }
    }

    /// Writes a checkpoint of the current state and trims the log it covers. Returns
    /// false when nothing changed since the last one. The state lock is held only to
    /// rotate the log; the checkpoint is built from the previous one and the durable
    /// log ([`crate::checkpoint::build`]) on a blocking thread. Should that fail, the
    /// state is encoded under the lock instead (logged).
    pub async fn checkpoint(&self) -> Result<bool> {
        let _one = self.checkpointing.lock().await;
        // Held from here until the trim is done: a master started on this directory
        // after the handle is dropped never replays under this checkpoint's trim.
        let dir_lock = self.dir_guard()?;
        let log = match &self.log {
            Journal::Oplog(log) => log,
            Journal::Group(g) => return self.snapshot_group(g).await,
        };
        let (lsn, settings) = {
            let st = self.state();
            // A halted master's state is ahead of its log: never checkpoint it.
            self.check_running()?;
            let lsn = st.last_lsn;
            if lsn <= self.checkpoint_lsn.load(Ordering::Acquire) {
                return Ok(false);
            }
            // Records after `lsn` go to a new segment, so older ones can be deleted
            // once the checkpoint is durable, and the build reads only up to `lsn`.
            log.rotate(lsn + 1)?;
            (lsn, st.settings)
        };
        self.durable(self.log.mark(lsn)).await?;
        self.rotated(log, lsn + 1).await?;
        let dir = self.config.dir.clone();
        let built = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || crate::checkpoint::build(&dir, settings, lsn))
                .await
                .map_err(|e| Error::LogFailed {
                    reason: format!("checkpoint task failed: {e}"),
                })?
        };
        let (lsn, bytes) = match built {
            Ok(bytes) => (lsn, bytes),
            Err(e) => {
                tracing::warn!(lsn, error = %e, "cannot build the checkpoint from the log; encoding the state under the lock instead");
                let (lsn, bytes) = {
                    let st = self.state();
                    self.check_running()?;
                    let lsn = st.last_lsn;
                    let bytes = st.encode_snapshot()?;
                    log.rotate(lsn + 1)?;
                    (lsn, bytes)
                };
                self.durable(self.log.mark(lsn)).await?;
                self.rotated(log, lsn + 1).await?;
                (lsn, bytes)
            }
        };
        let size = bytes.len();
        let removed = tokio::task::spawn_blocking(move || -> Result<usize> {
            let _dir_lock = dir_lock;
            oplog::write_checkpoint(&dir, lsn, &bytes)?;
            stall_point("checkpoint-before-trim");
            oplog::trim(&dir, lsn + 1)
        })
        .await
        .map_err(|e| Error::LogFailed {
            reason: format!("checkpoint task failed: {e}"),
        })??;
        self.checkpoint_done(lsn);
        tracing::info!(
            lsn,
            bytes = size,
            segments_removed = removed,
            "checkpoint written"
        );
        Ok(true)
    }

    /// The group's checkpoint: once everything the state holds is committed, a
    /// snapshot covering it, built by the group's state machine off the state lock;
    /// openraft purges the log it covers.
    async fn snapshot_group(&self, g: &Group) -> Result<bool> {
        let (lsn, mark, leads) = {
            let st = self.state();
            self.check_running()?;
            let leads = self.log.serving().is_ok();
            (st.last_lsn, self.log.mark(st.last_lsn), leads)
        };
        if lsn <= self.checkpoint_lsn.load(Ordering::Acquire) {
            return Ok(false);
        }
        // A follower's state holds only committed records; a leader's may hold some
        // still on their way.
        if leads {
            self.durable(mark).await?;
        }
        let covered = tokio::select! {
            r = g.snapshot() => r?,
            _ = self.halt.cancelled() => return self.check_running().map(|()| false),
        };
        self.checkpoint_done(covered);
        Ok(true)
    }

    fn checkpoint_done(&self, lsn: u64) {
        self.checkpoint_lsn.fetch_max(lsn, Ordering::AcqRel);
        self.last_checkpoint_ms
            .store(self.clock.now_ms(), Ordering::Relaxed);
    }

    /// Checkpoints when the log grew past the threshold or the interval passed.
    pub async fn maybe_checkpoint(&self) -> Result<bool> {
        if self.check_running().is_err() {
            return Ok(false);
        }
        let grown = self.log.stats().bytes_since_rotate >= self.config.checkpoint_log_size;
        let interval =
            u64::try_from(self.config.checkpoint_interval.as_millis()).unwrap_or(u64::MAX);
        let due = self
            .clock
            .now_ms()
            .saturating_sub(self.last_checkpoint_ms.load(Ordering::Relaxed))
            >= interval;
        if grown || due {
            self.checkpoint().await
        } else {
            Ok(false)
        }
    }
}
