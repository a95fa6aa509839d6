//! Group commit: today's operation log against the master group's log (a group of one
//! through openraft), on the same disk in the same run.
//!
//! `cargo bench --bench group_commit`
//!
//! - `lone`: one request at a time queues a 100-byte record and waits until it is
//!   durable (committed): the latency a single-threaded client sees on every mutation.
//! - `64 tasks`: 64 requests at a time, each queueing a record and waiting: how well
//!   the batching shares one `fdatasync` (and one entry) among many records.
//!
//! The directories are made under cargo's target directory, on the disk the master
//! would use (never tmpfs).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use stampfs_master::oplog::{DirLock, Oplog};
use stampfs_master::raft::group::Group as MasterGroup;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RECORD: [u8; 100] = [0x5a; 100];
const TASKS: u64 = 64;

fn dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("group-commit-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("bench dir")
}

/// What is measured: queue records (LSNs in order, under one lock as the master's
/// state lock) and wait for them.
trait Log: Send + Sync + 'static {
    fn queue(&self, lsn: u64);
    fn wait(&self, lsn: u64) -> impl std::future::Future<Output = ()> + Send;
}

impl Log for Oplog {
    fn queue(&self, lsn: u64) {
        self.append(lsn, &RECORD).expect("append");
    }
    async fn wait(&self, lsn: u64) {
        self.wait_durable(lsn).await.expect("durable");
    }
}

struct Group(MasterGroup);

impl Log for Group {
    fn queue(&self, lsn: u64) {
        self.0.append(lsn, &RECORD).expect("append");
    }
    async fn wait(&self, lsn: u64) {
        let generation = self.0.generation().expect("the group of one leads");
        self.0
            .wait_committed(lsn, generation)
            .await
            .expect("committed");
    }
}

/// `iters` records from `tasks` tasks at once; returns the time taken.
async fn run<L: Log>(log: &Arc<L>, next: &Arc<Mutex<u64>>, iters: u64, tasks: u64) -> Duration {
    let started = Instant::now();
    let left = Arc::new(AtomicU64::new(iters));
    let mut handles = Vec::new();
    for _ in 0..tasks.min(iters) {
        let (log, next, left) = (log.clone(), next.clone(), left.clone());
        handles.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                let lsn = {
                    let mut n = next.lock().expect("lock");
                    *n += 1;
                    log.queue(*n);
                    *n
                };
                log.wait(lsn).await;
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    started.elapsed()
}

fn group_commit(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let oplog_dir = dir();
    let group_dir = dir();
    let oplog = Arc::new(Oplog::open(oplog_dir.path(), 1).expect("oplog"));
    let group_lock = Arc::new(DirLock::acquire(group_dir.path()).expect("lock"));
    let group = Arc::new(Group(
        rt.block_on(MasterGroup::open(group_dir.path(), &group_lock))
            .expect("group of one")
            .0,
    ));
    let (oplog_next, group_next) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(0)));
    for (name, tasks) in [("lone", 1u64), ("64 tasks", TASKS)] {
        let mut g = c.benchmark_group(format!("group commit, {name}"));
        g.throughput(Throughput::Elements(1));
        g.measurement_time(Duration::from_secs(5));
        g.bench_function(BenchmarkId::new("oplog", name), |b| {
            b.iter_custom(|iters| rt.block_on(run(&oplog, &oplog_next, iters, tasks)))
        });
        g.bench_function(BenchmarkId::new("group of one", name), |b| {
            b.iter_custom(|iters| rt.block_on(run(&group, &group_next, iters, tasks)))
        });
        g.finish();
    }
    if let Ok(group) = Arc::try_unwrap(group) {
        rt.block_on(group.0.shutdown()).expect("shutdown");
    }
}

criterion_group!(benches, group_commit);
criterion_main!(benches);
