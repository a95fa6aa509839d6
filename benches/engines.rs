//! Micro-benchmarks of the chunkserver's disk side: a replica header's version update
//! (in memory, and durably through each I/O engine), 64 KiB writes through each I/O
//! engine (io_uring and threads), one at a time and as a batch, and the small-write
//! path: 4 KiB + its checksum entry + fdatasync, raw and through each engine, into a
//! growing file and over blocks already written.
//!
//! `cargo bench --bench engines`
//!
//! Files live in a temporary directory under the current directory (the disk being
//! measured). The write benchmarks overwrite a 64 MiB region in place, so they measure
//! the engines' per-operation cost into the page cache rather than the disk; the
//! durable version update ends in an fsync and measures the disk's flush latency.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use stampfs_chunkserver::header::Header;
use stampfs_chunkserver::io::{open_engine, IoEngine, IoOp};
use stampfs_chunkserver::store::Store;
use stampfs_chunkserver::IoEngineKind;
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WRITE: usize = 64 << 10;
/// The region the write benchmarks cycle through (rewritten in place).
const REGION: u64 = 64 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The engines that can run here (io_uring is skipped, with a note, when unavailable),
/// started on `rt` (the io_uring engine's reaper runs there).
fn engines(rt: &tokio::runtime::Runtime) -> Vec<(&'static str, Arc<dyn IoEngine>)> {
    let _runtime = rt.enter();
    let mut out = Vec::new();
    match open_engine(IoEngineKind::Uring) {
        Ok(e) => out.push(("uring", e)),
        Err(e) => eprintln!("SKIPPED io_uring benchmarks: {e}"),
    }
    if let Ok(e) = open_engine(IoEngineKind::Threads) {
        out.push(("threads", e));
    }
    out
}

fn bench_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(".stampfs-bench-")
        .tempdir_in(".")
        .expect("tempdir")
}

fn header_update(c: &mut Criterion) {
    let mut g = c.benchmark_group("header version update");
    let h = Header::new(
        ChunkHandle(7),
        ChunkVersion(1),
        ReplicaState::Writing,
        1 << 20,
    );
    g.bench_function("encode next + verify", |b| {
        b.iter(|| {
            let next = h.next(ChunkVersion(2), ReplicaState::Writing, 1 << 20);
            let slot = next.encode();
            Header::decode(std::hint::black_box(&slot)).expect("decodes")
        })
    });
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    let rt = runtime();
    for (name, engine) in engines(&rt) {
        let dir = bench_dir();
        let store = rt
            .block_on(Store::open(dir.path(), engine))
            .expect("store opens");
        let handle = ChunkHandle(1);
        rt.block_on(store.bump_version(handle, ChunkVersion(1), true))
            .expect("create");
        let version = AtomicU64::new(1);
        g.bench_function(
            BenchmarkId::new("durable bump (header + fsync)", name),
            |b| {
                b.to_async(&rt).iter(|| async {
                    let v = version.fetch_add(1, Ordering::Relaxed) + 1;
                    store
                        .bump_version(handle, ChunkVersion(v), false)
                        .await
                        .expect("bump")
                })
            },
        );
    }
    g.finish();
}

fn engine_writes(c: &mut Criterion) {
    let rt = runtime();
    let data = Bytes::from((0..WRITE).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let mut g = c.benchmark_group("64 KiB writes");
    g.measurement_time(Duration::from_secs(5));
    for (name, engine) in engines(&rt) {
        let dir = bench_dir();
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.path().join("writes.bin"))
                .expect("open"),
        );
        file.set_len(REGION).expect("size");
        let at = AtomicU64::new(0);
        let next = || at.fetch_add(WRITE as u64, Ordering::Relaxed) % REGION;
        g.throughput(Throughput::Bytes(WRITE as u64));
        g.bench_function(BenchmarkId::new("one per chain", name), |b| {
            b.to_async(&rt).iter(|| {
                let (engine, file, data) = (engine.clone(), file.clone(), data.clone());
                let offset = next();
                async move {
                    engine
                        .run(file, vec![IoOp::Write { offset, data }])
                        .await
                        .expect("write")
                }
            })
        });
        // What the pipeline does with packets that queued up while the disk was busy:
        // 16 packets (1 MiB) as one vectored write.
        g.throughput(Throughput::Bytes(16 * WRITE as u64));
        g.bench_function(BenchmarkId::new("16 as one writev chain", name), |b| {
            b.to_async(&rt).iter(|| {
                let (engine, file) = (engine.clone(), file.clone());
                let bufs = vec![data.clone(); 16];
                let offset = next() % (REGION - 16 * WRITE as u64);
                async move {
                    engine
                        .run(file, vec![IoOp::Writev { offset, bufs }])
                        .await
                        .expect("writev")
                }
            })
        });
    }
    g.finish();
}

/// The small-write (hsync) path on the disk: 4 KiB of data plus its 4-byte checksum
/// entry, then `fdatasync`, through each engine and raw on the calling thread. "append"
/// grows the file (so every flush also commits the new size to the journal);
/// "overwrite" writes into blocks that were already written and flushed, so the flush
/// carries only the data pages. Files are reset outside the timed part.
fn small_syncs(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("4 KiB + fdatasync");
    g.sample_size(30).measurement_time(Duration::from_secs(4));
    let dir = bench_dir();
    for layout in [SmallLayout::Append, SmallLayout::Overwrite] {
        let small = SmallFile::new(
            &dir.path().join(format!("small-{}.bin", layout.name())),
            layout,
        );
        g.bench_function(
            BenchmarkId::new(format!("raw {}", layout.name()), "pwrite"),
            |b| {
                b.iter_custom(|iters| {
                    let offsets = small.reserve(iters);
                    let start = Instant::now();
                    for (offset, entry) in offsets {
                        small.write_raw(offset, entry);
                    }
                    start.elapsed()
                })
            },
        );
        for (name, engine) in engines(&rt) {
            g.bench_function(
                BenchmarkId::new(format!("chain {}", layout.name()), name),
                |b| {
                    b.to_async(&rt).iter_custom(|iters| {
                        let offsets = small.reserve(iters);
                        let (engine, file, data) =
                            (engine.clone(), small.file.clone(), small.data.clone());
                        async move {
                            let start = Instant::now();
                            for (offset, entry) in offsets {
                                let ops = vec![
                                    IoOp::Write {
                                        offset,
                                        data: data.clone(),
                                    },
                                    IoOp::Write {
                                        offset: entry,
                                        data: Bytes::from_static(&[1, 2, 3, 4]),
                                    },
                                    IoOp::SyncData,
                                ];
                                engine.run(file.clone(), ops).await.expect("chain");
                            }
                            start.elapsed()
                        }
                    })
                },
            );
        }
    }
    g.finish();
}

#[derive(Clone, Copy, PartialEq)]
enum SmallLayout {
    Append,
    Overwrite,
}

impl SmallLayout {
    fn name(self) -> &'static str {
        match self {
            SmallLayout::Append => "append",
            SmallLayout::Overwrite => "overwrite",
        }
    }
}

/// A file the small-write benchmark appends 4 KiB records to, restarted (untimed)
/// whenever a batch of iterations would run past its end.
struct SmallFile {
    file: Arc<std::fs::File>,
    data: Bytes,
    layout: SmallLayout,
    next: AtomicU64,
}

impl SmallFile {
    const RECORD: u64 = 4096;
    /// Where the records start (the checksum entries live below).
    const BASE: u64 = 1 << 20;
    const CAPACITY: u64 = 1 << 16;

    fn new(path: &std::path::Path, layout: SmallLayout) -> Self {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .expect("open");
        let small = SmallFile {
            file: Arc::new(file),
            data: Bytes::from(vec![0x5au8; Self::RECORD as usize]),
            layout,
            next: AtomicU64::new(0),
        };
        small.reset(0);
        small
    }

    /// Rewrites the file so that `records` appends fit (pre-written for overwrites).
    fn reset(&self, records: u64) {
        let end = match self.layout {
            SmallLayout::Append => Self::BASE,
            SmallLayout::Overwrite => Self::BASE + records.max(Self::CAPACITY) * Self::RECORD,
        };
        self.file.set_len(0).expect("truncate");
        std::os::unix::fs::FileExt::write_all_at(&*self.file, &vec![0u8; end as usize], 0)
            .expect("fill");
        self.file.sync_all().expect("sync");
        self.next.store(0, Ordering::Relaxed);
    }

    /// The (record offset, checksum entry offset) of the next `iters` appends.
    fn reserve(&self, iters: u64) -> Vec<(u64, u64)> {
        let mut first = self.next.load(Ordering::Relaxed);
        if first + iters > Self::CAPACITY.max(iters)
            || self.layout == SmallLayout::Overwrite && first + iters > Self::CAPACITY
        {
            self.reset(iters);
            first = 0;
        }
        self.next.store(first + iters, Ordering::Relaxed);
        (first..first + iters)
            .map(|i| (Self::BASE + i * Self::RECORD, 64 * 1024 + 4 * i))
            .collect()
    }

    fn write_raw(&self, offset: u64, entry: u64) {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(&self.data, offset).expect("write");
        self.file.write_all_at(&[1, 2, 3, 4], entry).expect("entry");
        self.file.sync_data().expect("fdatasync");
    }
}

criterion_group!(benches, header_update, engine_writes, small_syncs);
criterion_main!(benches);
