//! Paced replica deletion. `Delete` commands from heartbeat replies are not run inline:
//! they wait in a bounded queue and a single task runs them, at most `--delete-rate`
//! per second, so a burst of garbage (a large file removed, a chunkserver back with
//! many stale replicas) never stalls the heartbeat or competes with client I/O for the
//! disk. Each deletion ends in a directory fsync; a full queue drops the command (the
//! master orders it again when its report still shows the replica).

use crate::server::{execute, Shared};
use stampfs_proto::{ChunkCommand, ChunkHandle};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Deletions waiting at most.
pub const QUEUE_LEN: usize = 4096;

/// The sending side of the deletion queue.
#[derive(Debug)]
pub(crate) struct Deletions {
    /// Commands for the deletion task (bounded; closed when `Shared` is dropped).
    tx: mpsc::Sender<(ChunkHandle, ChunkCommand)>,
    /// Chunks queued, so a deletion the master repeats is queued once.
    queued: Mutex<HashSet<ChunkHandle>>,
}

/// The receiving side, for [`run`].
pub(crate) type Queue = mpsc::Receiver<(ChunkHandle, ChunkCommand)>;

impl Deletions {
    pub fn new() -> (Self, Queue) {
        let (tx, rx) = mpsc::channel(QUEUE_LEN);
        (
            Self {
                tx,
                queued: Mutex::new(HashSet::new()),
            },
            rx,
        )
    }

    /// Queues `cmd` (admitted already: authentic, for this chunkserver, not seen
    /// before) when it is a deletion; gives any other command back.
    pub fn offer(&self, cmd: ChunkCommand) -> Option<ChunkCommand> {
        let ChunkCommand::Delete { handle, .. } = cmd else {
            return Some(cmd);
        };
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        if queued.contains(&handle) {
            return None;
        }
        match self.tx.try_send((handle, cmd)) {
            Ok(()) => {
                queued.insert(handle);
            }
            Err(_) => {
                tracing::debug!(chunk = %handle, "deletion queue full; the master will order it again")
            }
        }
        None
    }

    fn done(&self, handle: ChunkHandle) {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle);
    }
}

/// The gap between two deletions at `rate` per second.
pub fn gap(rate: u32) -> Duration {
    Duration::from_secs_f64(1.0 / f64::from(rate.max(1)))
}

/// Runs queued deletions, paced, until shutdown.
pub(crate) async fn run(shared: Arc<Shared>, mut queue: Queue) {
    let gap = gap(shared.config.delete_rate);
    loop {
        let next = tokio::select! {
            n = queue.recv() => n,
            _ = shared.cancel.cancelled() => return,
        };
        let Some((handle, cmd)) = next else {
            return;
        };
        shared.deletions.done(handle);
        let started = Instant::now();
        // Failures are logged by execute; the replica shows in the next report.
        let _ = execute(&shared, cmd).await;
        tokio::select! {
            _ = tokio::time::sleep(gap.saturating_sub(started.elapsed())) => {}
            _ = shared.cancel.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::ChunkVersion;

    fn signed(cmd: ChunkCommand) -> ChunkCommand {
        cmd
    }

    #[test]
    fn only_deletions_are_queued_and_each_chunk_once() {
        let (d, mut rx) = Deletions::new();
        let del = |h| {
            signed(ChunkCommand::Delete {
                handle: ChunkHandle(h),
                max_version: ChunkVersion(1),
            })
        };
        assert!(d.offer(del(1)).is_none());
        assert!(d.offer(del(1)).is_none(), "a repeat is absorbed");
        assert!(d.offer(del(2)).is_none());
        let info = signed(ChunkCommand::Info {
            handle: ChunkHandle(1),
        });
        assert_eq!(d.offer(info.clone()), Some(info), "others run inline");
        assert_eq!(rx.try_recv().expect("first").0, ChunkHandle(1));
        assert_eq!(rx.try_recv().expect("second").0, ChunkHandle(2));
        assert!(rx.try_recv().is_err());
        d.done(ChunkHandle(1));
        assert!(d.offer(del(1)).is_none());
        assert_eq!(rx.try_recv().expect("again after it ran").0, ChunkHandle(1));
    }

    #[test]
    fn the_gap_follows_the_rate() {
        assert_eq!(gap(50), Duration::from_millis(20));
        assert_eq!(gap(0), Duration::from_secs(1));
    }
}
