//! Many replicas through a small descriptor cache, with both I/O engines: every
//! operation still works on the right file, the data and headers survive a restart,
//! and the process's open descriptors stay bounded by the cache's capacity.
//!
//! Its own test binary (one test) so that no other test's files count in
//! `/proc/self/fd`.

mod common;

use bytes::Bytes;
use common::{engine, engines, init_tracing, pattern};
use stampfs_chunkserver::header::{Header, SLOT_SIZE};
use stampfs_chunkserver::store::{PacketWrite, Store, SCAN_THREADS};
use stampfs_chunkserver::Error;
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaState};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

const REPLICAS: u64 = 300;
const CAPACITY: usize = 16;
/// Reads run at once in the concurrent pass.
const CONCURRENT: usize = 8;
/// Descriptors beyond the capacity that are allowed: operations in flight (the
/// concurrent pass), a directory fsync, and a write-behind hint.
const SLACK: usize = CONCURRENT + 4;
/// Descriptors a store's open may hold at once, before the cache holds any: each scan
/// thread's directory and the replica it loads, and a directory fsync or two.
const SCAN_SLACK: usize = 2 * SCAN_THREADS + 2;

fn v(n: u64) -> ChunkVersion {
    ChunkVersion(n)
}

fn handle(i: u64) -> ChunkHandle {
    ChunkHandle(0x5000 + i)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("list /proc/self/fd")
        .count()
}

/// Samples the process's descriptor count every millisecond and keeps the largest.
struct FdWatch {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdWatch {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicUsize::new(0));
        let (s, m) = (stop.clone(), max.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(open_fds(), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        Self {
            stop,
            max,
            thread: Some(thread),
        }
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// The largest count since the last call; the count now starts the next span.
    fn take_max(&self) -> usize {
        std::thread::sleep(std::time::Duration::from_millis(3));
        self.max.swap(open_fds(), Ordering::Relaxed)
    }
}

impl Drop for FdWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What replica `i` should hold at the end: (version, state, data), or `None` once
/// deleted.
type Expected = BTreeMap<u64, Option<(u64, ReplicaState, Vec<u8>)>>;

fn data_of(i: u64) -> Vec<u8> {
    pattern(1000 + ((i * 7919) % 150_000) as usize, i)
}

/// Visits every replica in an order that differs from round to round, so the cache
/// keeps evicting.
fn order(round: u64) -> impl Iterator<Item = u64> {
    let step = [7, 11, 13, 17, 19][round as usize % 5];
    (0..REPLICAS).map(move |k| (k * step + round) % REPLICAS)
}

fn newest_header(dir: &Path, h: ChunkHandle) -> Header {
    let bytes =
        std::fs::read(stampfs_chunkserver::layout::replica_path(dir, h)).expect("read replica");
    let slot = SLOT_SIZE as usize;
    Header::newest(&bytes[..slot], &bytes[slot..2 * slot]).expect("a valid header")
}

async fn check_all(s: &Store, expected: &Expected) {
    for (&i, want) in expected {
        let h = handle(i);
        match want {
            None => assert!(
                matches!(s.info(h).await, Err(Error::NotFound { .. })),
                "replica {i} was deleted"
            ),
            Some((version, state, data)) => {
                let (report, got) = s
                    .read(h, v(*version), 0, 1 << 20)
                    .await
                    .unwrap_or_else(|e| panic!("read replica {i}: {e}"));
                assert_eq!(
                    (report.version, report.state, report.length),
                    (v(*version), *state, data.len() as u64),
                    "replica {i}"
                );
                assert!(got[..] == data[..], "replica {i}'s data");
            }
        }
        assert!(s.open_files() <= CAPACITY);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundreds_of_replicas_through_a_small_descriptor_cache() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = engine(kind);
        let baseline = open_fds();
        let watch = FdWatch::start();
        let s = Arc::new(
            Store::open(dir.path(), engine.clone())
                .await
                .expect("open")
                .with_max_open_files(CAPACITY),
        );
        assert!(
            watch.take_max() <= baseline + SCAN_SLACK,
            "{kind:?}: the open"
        );
        assert_eq!(s.max_open_files(), CAPACITY);
        let mut expected: Expected = BTreeMap::new();

        // Create and write every replica; every third write is an hsync, every fifth
        // goes as a two-packet batch.
        for i in order(0) {
            s.bump_version(handle(i), v(1), true).await.expect("create");
        }
        for i in order(1) {
            let data = data_of(i);
            if i % 5 == 0 {
                let half = data.len() / 2;
                let out = s
                    .write_batch(
                        handle(i),
                        stampfs_chunkserver::store::WriteMode::Append,
                        vec![
                            PacketWrite {
                                version: v(1),
                                offset: 0,
                                data: Bytes::copy_from_slice(&data[..half]),
                                crc: None,
                                sync: false,
                            },
                            PacketWrite {
                                version: v(1),
                                offset: half as u64,
                                data: Bytes::copy_from_slice(&data[half..]),
                                crc: None,
                                sync: i % 3 == 0,
                            },
                        ],
                    )
                    .await;
                assert!(out.error.is_none(), "batch {i}: {:?}", out.error);
            } else {
                s.write(handle(i), v(1), 0, Bytes::from(data.clone()), i % 3 == 0)
                    .await
                    .expect("write");
            }
            expected.insert(i, Some((1, ReplicaState::Writing, data)));
            assert!(s.open_files() <= CAPACITY);
        }
        check_all(&s, &expected).await;

        // Then one of five fates each, interleaved over the replicas.
        for i in order(2) {
            let h = handle(i);
            let Some(Some((_, _, data))) = expected.get(&i).cloned() else {
                unreachable!()
            };
            let len = data.len() as u64;
            let fate = match i % 5 {
                0 => {
                    s.finalize(h, v(1), len).await.expect("finalize");
                    (1, ReplicaState::Finalized, data)
                }
                1 => {
                    s.truncate(h, v(1), len / 2).await.expect("truncate");
                    (
                        1,
                        ReplicaState::Writing,
                        data[..(len / 2) as usize].to_vec(),
                    )
                }
                2 => {
                    s.bump_version(h, v(2), false).await.expect("bump");
                    let more = pattern(5000, 99);
                    s.write(h, v(2), len, Bytes::from(more.clone()), true)
                        .await
                        .expect("append after bump");
                    let mut all = data;
                    all.extend_from_slice(&more);
                    (2, ReplicaState::Writing, all)
                }
                3 => {
                    assert!(s.delete(h, v(1)).await.expect("delete").is_none());
                    expected.insert(i, None);
                    continue;
                }
                _ => {
                    s.finalize(h, v(1), len).await.expect("finalize");
                    s.bump_version(h, v(2), false).await.expect("bump");
                    s.finalize(h, v(2), len - 1)
                        .await
                        .expect("refinalize shorter");
                    (
                        2,
                        ReplicaState::Finalized,
                        data[..(len - 1) as usize].to_vec(),
                    )
                }
            };
            expected.insert(i, Some(fate));
            assert!(s.open_files() <= CAPACITY);
        }
        check_all(&s, &expected).await;

        // Reads in flight at once: each holds its file until it completes.
        for chunk in expected
            .keys()
            .copied()
            .collect::<Vec<_>>()
            .chunks(CONCURRENT)
        {
            let mut tasks = tokio::task::JoinSet::new();
            for &i in chunk {
                let Some(Some((version, _, data))) = expected.get(&i).cloned() else {
                    continue;
                };
                let s = s.clone();
                tasks.spawn(async move {
                    let (_, got) = s
                        .read(handle(i), v(version), 0, 1 << 20)
                        .await
                        .expect("concurrent read");
                    assert!(got[..] == data[..], "replica {i}'s data");
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.expect("read task");
            }
        }

        // Restart: nothing is open until used, and every replica is as left.
        drop(s);
        let working = watch.take_max();
        let s = Store::open(dir.path(), engine.clone())
            .await
            .expect("reopen")
            .with_max_open_files(CAPACITY);
        let reopen = watch.take_max();
        assert!(
            reopen <= baseline + SCAN_SLACK,
            "{kind:?}: {reopen} descriptors open at most during the scan, {baseline} before"
        );
        assert_eq!(
            s.open_files(),
            0,
            "a replica not in use costs no descriptor"
        );
        assert!(
            open_fds() <= baseline + 2,
            "{} descriptors open after the restart, {baseline} before the store",
            open_fds()
        );
        assert!(s.take_corrupt().is_empty());
        let live = expected.values().filter(|e| e.is_some()).count();
        assert_eq!(s.reports().await.len(), live);
        check_all(&s, &expected).await;
        drop(s);
        for (&i, want) in &expected {
            let path = stampfs_chunkserver::layout::replica_path(dir.path(), handle(i));
            match want {
                None => assert!(!path.exists(), "replica {i} deleted"),
                Some((version, state, data)) => {
                    let h = newest_header(dir.path(), handle(i));
                    assert_eq!(
                        (h.handle, h.version, h.state, h.length),
                        (handle(i), v(*version), *state, data.len() as u64),
                        "replica {i}'s header"
                    );
                }
            }
        }
        let max = watch.max().max(working);
        drop(watch);
        println!(
            "{kind:?}: {REPLICAS} replicas, cache of {CAPACITY}: at most {} descriptors above the {baseline} before the store",
            max.saturating_sub(baseline)
        );
        assert!(
            max <= baseline + CAPACITY + SLACK,
            "{kind:?}: {max} descriptors open at most, {baseline} before the store, capacity {CAPACITY}"
        );
    }
}
