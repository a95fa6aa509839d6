//! What the client tasks and the simulated chunkservers send: the built namespace's
//! paths, the write sequence of a file, registration, heartbeats and reports.

use super::driver::Driver;
use super::measure::{timed, OpStats};
use super::sim::Sims;
use anyhow::{bail, Result};
use stampfs_proto::{
    AddChunk, Append, ChunkCommit, ChunkReport, ClientId, Close, Create, Heartbeat, Mkdir, Register,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Directories of the mkdirs, rename and delete phases hold this many entries.
pub const PHASE_DIR_ENTRIES: u64 = 1000;
/// How often each simulated chunkserver heartbeats in the background.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// The `i`-th built file.
pub fn file_path(i: u64, files_per_dir: u64) -> String {
    format!("/bench/files/g{}/f{i}", i / files_per_dir)
}

pub fn file_dir(g: u64) -> String {
    format!("/bench/files/g{g}")
}

/// A pseudo-random permutation-ish index in `0..n` for the `i`-th request, so that
/// concurrent readers do not walk the namespace in order.
pub fn spread(i: u64, n: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) % n.max(1)
}

/// What the phases share.
pub struct Ctx {
    pub driver: Driver,
    pub sims: Arc<Sims>,
    pub threads: usize,
    pub files: u64,
    pub files_per_dir: u64,
    pub chunks_per_file: u64,
    pub replication: u8,
}

pub fn client_of(i: u64) -> ClientId {
    // One writer per file: distinct, stable client ids.
    ClientId(i.wrapping_mul(2).wrapping_add(0x5EED_0000_0000_0001))
}

/// create + close of an empty file.
pub async fn create_close(driver: &Driver, path: String, client: ClientId, r: u8) -> Result<()> {
    driver
        .call(Create {
            path: path.clone(),
            client,
            replication: Some(r),
            chunk_size: None,
            overwrite: false,
            attr: None,
            caller: None,
        })
        .await?;
    driver
        .call(Close {
            path,
            client,
            last: None,
            keep_mtime: false,
        })
        .await?;
    Ok(())
}

/// Sub-operation latencies of the chunk build.
#[derive(Default)]
pub struct BuildStats {
    pub append: OpStats,
    pub add_chunk: OpStats,
    pub close: OpStats,
}

/// Reopens `path` and gives it `chunks` full chunks, then closes it.
pub async fn build_file(
    driver: &Driver,
    stats: &BuildStats,
    path: String,
    client: ClientId,
    chunks: u64,
) -> Result<()> {
    timed(
        &stats.append,
        driver.call(Append {
            path: path.clone(),
            client,
            caller: None,
        }),
    )
    .await?;
    let mut previous: Option<ChunkCommit> = None;
    for _ in 0..chunks {
        let grant = timed(
            &stats.add_chunk,
            driver.call(AddChunk {
                path: path.clone(),
                client,
                previous,
            }),
        )
        .await?;
        previous = Some(ChunkCommit {
            handle: grant.token.handle,
            length: grant.chunk_size,
        });
    }
    timed(
        &stats.close,
        driver.call(Close {
            path,
            client,
            last: previous,
            keep_mtime: false,
        }),
    )
    .await?;
    Ok(())
}

pub async fn register(ctx: &Ctx, i: usize) -> Result<()> {
    let s = &ctx.sims.servers[i];
    let (capacity, used) = ctx.sims.space(i);
    let reply = ctx
        .driver
        .call(Register {
            id: s.id.get().copied(),
            addr: s.addr.to_string(),
            capacity,
            used,
            replicas: Vec::new(),
            session: rand::random(),
        })
        .await?;
    let _ = s.id.set(reply.id);
    Ok(())
}

pub async fn heartbeat(driver: &Driver, sims: &Sims, i: usize) -> Result<()> {
    let Some(id) = sims.servers[i].id.get().copied() else {
        bail!("simulated chunkserver {i} is not registered");
    };
    let (capacity, used) = sims.space(i);
    let replica_count = if sims.dense == Some(i) {
        sims.dense_held()
    } else {
        0
    };
    let reply = driver
        .call(Heartbeat {
            id,
            capacity,
            used,
            replica_count,
            active_streams: 0,
        })
        .await?;
    if reply.reregister {
        bail!("the master asked simulated chunkserver {i} to register again");
    }
    for cmd in reply.commands {
        let _ = sims.command(i as u32, cmd.body);
    }
    Ok(())
}

/// Every simulated chunkserver heartbeats every [`HEARTBEAT_EVERY`], spread over the
/// interval, until `stop`.
pub fn spawn_heartbeats(driver: Driver, sims: Arc<Sims>, stop: Arc<AtomicBool>) {
    tokio::spawn(async move {
        const SLICES: usize = 50;
        let n = sims.servers.len();
        let per_slice = n.div_ceil(SLICES);
        let mut tick = tokio::time::interval(HEARTBEAT_EVERY / SLICES as u32);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next = 0;
        // Each chunkserver beats on its own (a real one has its own loop): a beat
        // that waits (the master answers once its log is durable) holds up no other.
        let busy: Arc<Vec<AtomicBool>> = Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            for _ in 0..per_slice {
                let i = next;
                next = (next + 1) % n;
                if busy[i].swap(true, Ordering::Relaxed) {
                    continue; // its previous beat is still waiting
                }
                let (driver, sims, busy, stop) =
                    (driver.clone(), sims.clone(), busy.clone(), stop.clone());
                tokio::spawn(async move {
                    match heartbeat(&driver, &sims, i).await {
                        // The master is stopping: a beat in flight may be cut.
                        Err(_) if stop.load(Ordering::Relaxed) => {}
                        Err(e) => tracing::warn!(error = %e, "simulated heartbeat failed"),
                        Ok(()) => {}
                    }
                    busy[i].store(false, Ordering::Relaxed);
                });
            }
        }
    });
}

/// Creates `prefix/g0 .. prefix/g{groups-1}` (untimed).
pub async fn mkdir_groups(ctx: &Arc<Ctx>, prefix: &str, groups: u64) -> Result<()> {
    for g in 0..groups {
        ctx.driver
            .call(Mkdir {
                path: format!("{prefix}/g{g}"),
                parents: true,
                attr: None,
                caller: None,
            })
            .await?;
    }
    Ok(())
}

pub async fn send_report(
    ctx: &Ctx,
    i: usize,
    replicas: Vec<stampfs_proto::ReplicaReport>,
) -> Result<()> {
    let Some(id) = ctx.sims.servers[i].id.get().copied() else {
        bail!("simulated chunkserver {i} is not registered");
    };
    ctx.driver.call(ChunkReport { id, replicas }).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_stays_in_range_and_covers_it() {
        let n = 1000;
        let seen: std::collections::HashSet<u64> = (0..10 * n).map(|i| spread(i, n)).collect();
        assert!(seen.iter().all(|&v| v < n));
        assert!(seen.len() as u64 > n * 9 / 10, "{}", seen.len());
        assert_eq!(spread(5, 0), 0);
    }

    #[test]
    fn built_files_are_grouped_by_directory() {
        assert_eq!(file_path(0, 100), "/bench/files/g0/f0");
        assert_eq!(file_path(250, 100), "/bench/files/g2/f250");
        assert_eq!(file_dir(2), "/bench/files/g2");
    }
}
