//! Background scrub: every finalized replica is read back through the store, which
//! verifies the CRC of every block it reads, at a bounded rate (`--scrub-rate` bytes/s,
//! 0 = off). Replicas still `Writing` are left alone (as HDFS's block scanner does):
//! their tail moves, readers verify what they read, and start-up validates them block
//! by block.
//!
//! A block that fails verification makes the store move the replica aside as corrupt
//! and queue a report (the same path a client read takes); the heartbeat task tells
//! the master at once, which excludes the replica and re-replicates the chunk. The
//! scrub reads under the replica's shared lock, one piece at a time, so writers and
//! readers wait at most one piece; the pacing keeps it from competing with client I/O
//! for more than its budget.

use crate::error::Error;
use crate::header::BLOCK;
use crate::server::Shared;
use stampfs_proto::ReplicaState;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest piece read at once.
pub const MAX_PIECE: u64 = 1 << 20;
/// Pause between two passes.
pub const PASS_PAUSE: Duration = Duration::from_secs(1);

/// Bytes read at once at `rate` bytes/s: whole checksum blocks, about a second's worth,
/// between one block and [`MAX_PIECE`].
pub fn piece(rate: u64) -> u64 {
    (rate / BLOCK * BLOCK).clamp(BLOCK, MAX_PIECE)
}

/// How long reading `bytes` at `rate` bytes/s should take.
pub fn pace(bytes: u64, rate: u64) -> Duration {
    if rate == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(bytes as f64 / rate as f64)
}

/// What one pass found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassStats {
    pub replicas: u64,
    pub bytes: u64,
    pub corrupt: u64,
}

/// Runs passes until shutdown.
pub(crate) async fn run(shared: Arc<Shared>) {
    let rate = shared.config.scrub_rate;
    if rate == 0 {
        tracing::info!("scrub is off (--scrub-rate 0)");
        return;
    }
    tracing::info!(rate_bytes_per_sec = rate, "scrub running");
    loop {
        let started = Instant::now();
        let Some(stats) = pass(&shared, rate).await else {
            return;
        };
        tracing::debug!(
            replicas = stats.replicas,
            bytes = stats.bytes,
            corrupt = stats.corrupt,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "scrub pass done"
        );
        tokio::select! {
            _ = tokio::time::sleep(PASS_PAUSE) => {}
            _ = shared.cancel.cancelled() => return,
        }
    }
}

/// One pass over every replica; `None` at shutdown.
async fn pass(shared: &Shared, rate: u64) -> Option<PassStats> {
    let store = &shared.store;
    let step = piece(rate);
    let mut stats = PassStats::default();
    let finalized = store
        .reports()
        .await
        .into_iter()
        .filter(|r| r.state == ReplicaState::Finalized);
    for replica in finalized {
        let handle = replica.handle;
        stats.replicas += 1;
        let mut offset = 0u64;
        loop {
            // Version and length as they are now: the replica may have been bumped,
            // grown or deleted since the last piece.
            let Ok(info) = store.info(handle).await else {
                break;
            };
            if offset >= info.length || info.state != ReplicaState::Finalized {
                break;
            }
            let want = step.min(info.length - offset);
            match store.read(handle, info.version, offset, want).await {
                Ok((_, data)) if data.is_empty() => break,
                Ok((_, data)) => {
                    offset += data.len() as u64;
                    stats.bytes += data.len() as u64;
                }
                Err(Error::ChecksumMismatch { offset: bad, .. }) => {
                    tracing::error!(chunk = %handle, version = %info.version, offset = bad, "scrub found a corrupt replica; it was moved aside and is reported to the master");
                    stats.corrupt += 1;
                    break;
                }
                // Bumped or deleted meanwhile: the next pass sees it again.
                Err(e) => {
                    tracing::debug!(chunk = %handle, error = %e, "scrub skipped a replica");
                    break;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(pace(want, rate)) => {}
                _ = shared.cancel.cancelled() => return None,
            }
        }
    }
    Some(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_whole_blocks_within_bounds() {
        assert_eq!(piece(1), BLOCK);
        assert_eq!(piece(BLOCK * 3 + 5), BLOCK * 3);
        assert_eq!(piece(8 << 20), MAX_PIECE);
    }

    #[test]
    fn pacing_spreads_bytes_over_the_rate() {
        assert_eq!(pace(8 << 20, 8 << 20), Duration::from_secs(1));
        assert_eq!(pace(1 << 20, 8 << 20), Duration::from_millis(125));
        assert_eq!(pace(5, 0), Duration::ZERO);
    }
}
