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
//!
//! **Verification on request** ([`verify_replica`]): when someone reports a replica
//! corrupt, the master does not take the report's word for it; it sends this
//! chunkserver a signed [`VerifyReplica`], and the replica is checked at once, whole,
//! with the same reads (so a failing block is moved aside and reported the same way).
//! The master only drops the replica when the answer is
//! [`Verification::Corrupt`] (or [`Verification::Absent`]); a clean replica stays. The
//! master keeps at most a few verifications running per chunkserver, so they are not
//! paced here.

use crate::error::{Error, Result};
use crate::header::BLOCK;
use crate::server::Shared;
use crate::store::Store;
use stampfs_proto::{ChunkHandle, RemoteError, ReplicaState, Signed, Verification, VerifyReplica};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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
        crate::counters::add(&crate::counters::SCRUB_PASSES, 1);
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
    // Page by page, so a pass over millions of replicas holds one page of reports.
    let mut page = store.report_page(None, SCRUB_PAGE).await;
    loop {
        for replica in page
            .replicas
            .iter()
            .filter(|r| r.state == ReplicaState::Finalized)
        {
            scrub_one(shared, rate, step, replica.handle, &mut stats).await?;
        }
        match page.next {
            Some(after) => page = store.report_page(Some(after), SCRUB_PAGE).await,
            None => return Some(stats),
        }
    }
}

/// Replicas per page of a scrub pass.
const SCRUB_PAGE: usize = 4096;

/// Reads one replica whole at the scrub rate; `None` at shutdown.
async fn scrub_one(
    shared: &Shared,
    rate: u64,
    step: u64,
    handle: ChunkHandle,
    stats: &mut PassStats,
) -> Option<()> {
    let store = &shared.store;
    stats.replicas += 1;
    crate::counters::add(&crate::counters::SCRUB_REPLICAS, 1);
    let mut offset = 0u64;
    loop {
        // Version and length as they are now: the replica may have been bumped,
        // grown or deleted since the last piece.
        let Ok(info) = store.info(handle).await else {
            return Some(());
        };
        if offset >= info.length || info.state != ReplicaState::Finalized {
            return Some(());
        }
        let want = step.min(info.length - offset);
        match store.read(handle, info.version, offset, want).await {
            Ok((_, data)) if data.is_empty() => return Some(()),
            Ok((_, data)) => {
                offset += data.len() as u64;
                stats.bytes += data.len() as u64;
                crate::counters::add(&crate::counters::SCRUB_BYTES, data.len() as u64);
            }
            Err(Error::ChecksumMismatch { offset: bad, .. }) => {
                tracing::error!(chunk = %handle, version = %info.version, offset = bad, "scrub found a corrupt replica; it was moved aside and is reported to the master");
                stats.corrupt += 1;
                crate::counters::add(&crate::counters::CORRUPT_FOUND, 1);
                return Some(());
            }
            // Bumped or deleted meanwhile: the next pass sees it again.
            Err(e) => {
                tracing::debug!(chunk = %handle, error = %e, "scrub skipped a replica");
                return Some(());
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(pace(want, rate)) => {}
            _ = shared.cancel.cancelled() => return None,
        }
    }
}

/// Version changes tolerated while verifying one replica (a bump between two pieces
/// makes the next read fail the gate; the check goes on under the new version).
const VERIFY_RETRIES: u32 = 8;

/// Authenticates and runs one [`VerifyReplica`] from the master.
#[tracing::instrument(skip_all)]
pub(crate) async fn verify_request(
    shared: &Shared,
    req: Signed<VerifyReplica>,
) -> std::result::Result<Verification, RemoteError> {
    let req = shared
        .admit(req, "verification request")
        .map_err(|e| e.to_remote())?;
    let handle = req.handle;
    let found = verify_replica(&shared.store, &shared.cancel, handle).await;
    match &found {
        Ok(Verification::Clean { replica }) => {
            tracing::info!(chunk = %handle, version = %replica.version, length = replica.length, "replica reported corrupt verified clean")
        }
        Ok(Verification::Corrupt { version, offset }) => {
            tracing::error!(chunk = %handle, %version, offset, "verification found a corrupt replica; it was moved aside and is reported to the master")
        }
        Ok(Verification::Absent) => {
            tracing::info!(chunk = %handle, "verification of a replica this chunkserver does not hold")
        }
        Err(e) => tracing::warn!(chunk = %handle, error = %e, "verification did not finish"),
    }
    found.map_err(|e| e.to_remote())
}

/// Reads every block of the replica of `handle` through the store, which checks each
/// block's CRC and moves the replica aside (queueing its corruption report) when one
/// fails. Reads go one [`MAX_PIECE`] at a time under the replica's shared lock, up to
/// the length the replica had when the check began (a replica still being written is
/// checked as far as it was then). Stops with [`Error::Unavailable`] when `cancel`
/// fires.
pub async fn verify_replica(
    store: &Store,
    cancel: &CancellationToken,
    handle: ChunkHandle,
) -> Result<Verification> {
    let first = match store.info(handle).await {
        Ok(info) => info,
        Err(Error::NotFound { .. }) => return Ok(Verification::Absent),
        Err(e) => return Err(e),
    };
    let end = first.length;
    let mut offset = 0u64;
    let mut retries = 0u32;
    loop {
        if cancel.is_cancelled() {
            return Err(Error::Unavailable {
                reason: "the chunkserver is shutting down".into(),
            });
        }
        // Version and length as they are now: the replica may have been bumped, cut or
        // deleted since the last piece.
        let info = match store.info(handle).await {
            Ok(info) => info,
            Err(Error::NotFound { .. }) => return Ok(Verification::Absent),
            Err(e) => return Err(e),
        };
        let stop = end.min(info.length);
        if offset >= stop {
            return Ok(Verification::Clean { replica: info });
        }
        let want = MAX_PIECE.min(stop - offset);
        match store.read(handle, info.version, offset, want).await {
            Ok((_, data)) if data.is_empty() => return Ok(Verification::Clean { replica: info }),
            Ok((_, data)) => offset += data.len() as u64,
            Err(Error::ChecksumMismatch { offset: bad, .. }) => {
                return Ok(Verification::Corrupt {
                    version: info.version,
                    offset: bad,
                })
            }
            Err(Error::NotFound { .. }) => return Ok(Verification::Absent),
            Err(e @ (Error::StaleToken { .. } | Error::ReplicaStale { .. })) => {
                retries += 1;
                if retries > VERIFY_RETRIES {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
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

    use crate::header::DATA_OFFSET;
    use bytes::Bytes;
    use stampfs_proto::ChunkVersion;
    use std::os::unix::fs::FileExt;

    const H: ChunkHandle = ChunkHandle(0x77);

    /// A store in `dir` holding one finalized replica of `H` at version 1 with `len`
    /// bytes spanning several pieces.
    async fn store_with_replica(dir: &std::path::Path, len: usize) -> Store {
        let engine: Arc<dyn crate::io::IoEngine> = Arc::new(crate::io::ThreadsEngine::new());
        let store = Store::open(dir, engine).await.expect("store opens");
        let v = ChunkVersion(1);
        store.bump_version(H, v, true).await.expect("create");
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        store
            .write(H, v, 0, Bytes::from(data), true)
            .await
            .expect("write");
        store.finalize(H, v, len as u64).await.expect("finalize");
        store
    }

    #[tokio::test]
    async fn verification_keeps_a_clean_replica_and_moves_a_corrupt_one_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let len = 2 * MAX_PIECE as usize + 12_345;
        let store = store_with_replica(dir.path(), len).await;
        let cancel = CancellationToken::new();
        let clean = verify_replica(&store, &cancel, H).await.expect("verify");
        assert!(
            matches!(&clean, Verification::Clean { replica } if replica.length == len as u64
                && replica.version == ChunkVersion(1)),
            "{clean:?}"
        );
        assert!(
            store.take_corrupt().is_empty(),
            "a clean replica is not reported"
        );
        assert!(store.info(H).await.is_ok(), "and stays");

        // One byte flipped in the last piece: found, moved aside, queued for the report.
        let path = store.replica_path(H);
        let at = 2 * MAX_PIECE + 100;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open replica");
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, DATA_OFFSET + at).expect("read");
        b[0] ^= 0x5a;
        f.write_all_at(&b, DATA_OFFSET + at).expect("flip");
        f.sync_all().expect("sync");
        drop(f);
        let found = verify_replica(&store, &cancel, H).await.expect("verify");
        assert_eq!(
            found,
            Verification::Corrupt {
                version: ChunkVersion(1),
                offset: at / BLOCK * BLOCK
            }
        );
        assert_eq!(
            store.take_corrupt(),
            vec![H],
            "reported like any corruption"
        );
        assert!(!path.exists(), "moved aside");
        assert!(
            std::fs::read_dir(path.parent().expect("its subdirectory"))
                .expect("ls")
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().ends_with(".corrupt")),
            "never deleted"
        );
        // Asked again (a late or repeated report): nothing there any more.
        assert_eq!(
            verify_replica(&store, &cancel, H).await.expect("verify"),
            Verification::Absent
        );
        assert_eq!(
            verify_replica(&store, &cancel, ChunkHandle(0x78))
                .await
                .expect("verify"),
            Verification::Absent
        );
    }

    #[tokio::test]
    async fn verification_stops_at_shutdown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_with_replica(dir.path(), 1000).await;
        let cancel = CancellationToken::new();
        cancel.cancel();
        let err = verify_replica(&store, &cancel, H).await.unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        assert!(store.info(H).await.is_ok());
    }

    #[test]
    fn pacing_spreads_bytes_over_the_rate() {
        assert_eq!(pace(8 << 20, 8 << 20), Duration::from_secs(1));
        assert_eq!(pace(1 << 20, 8 << 20), Duration::from_millis(125));
        assert_eq!(pace(5, 0), Duration::ZERO);
    }
}
