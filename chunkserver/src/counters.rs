//! Process-wide event counters the chunkserver's metrics read (`metrics.rs`): raised
//! where the event happens, with no state to pass around. The fenced refusals are
//! the gate's own (`gate::fenced_total`).

use stampfs_metrics::prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::sync::atomic::{AtomicU64, Ordering};

/// Payload bytes of write packets taken into replicas (pipeline writes).
pub static BYTES_WRITTEN: AtomicU64 = AtomicU64::new(0);
/// Bytes read out of replicas for clients.
pub static BYTES_READ: AtomicU64 = AtomicU64::new(0);
/// Replicas deleted (garbage collection, the master's deletions).
pub static REPLICAS_DELETED: AtomicU64 = AtomicU64::new(0);
/// Replicas the scrubber found corrupt.
pub static CORRUPT_FOUND: AtomicU64 = AtomicU64::new(0);
/// Bytes the scrubber read back and verified.
pub static SCRUB_BYTES: AtomicU64 = AtomicU64::new(0);
/// Replicas the scrubber went through.
pub static SCRUB_REPLICAS: AtomicU64 = AtomicU64::new(0);
/// Whole scrub passes over every replica.
pub static SCRUB_PASSES: AtomicU64 = AtomicU64::new(0);
/// Pipeline acks sent upstream that reported a failure of this replica or one
/// behind it.
pub static ACKS_FAILED: AtomicU64 = AtomicU64::new(0);

/// I/O operations the engine has handed to the kernel and not yet seen complete
/// (io_uring: SQEs in flight; threads: blocking jobs running).
pub static IO_IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
/// I/O jobs waiting for room before they go to the kernel (io_uring only).
pub static IO_WAITING: AtomicU64 = AtomicU64::new(0);

/// Sets `c` to `v` (a gauge kept here).
pub fn set(c: &AtomicU64, v: u64) {
    c.store(v, Ordering::Relaxed);
}

/// Subtracts `n` from `c`, stopping at zero.
pub fn sub(c: &AtomicU64, n: u64) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

/// Seconds from a write packet's arrival to its ack going upstream (this replica's
/// write and every replica's behind it).
pub fn ack_seconds() -> &'static Histogram {
    static H: std::sync::OnceLock<Histogram> = std::sync::OnceLock::new();
    // 20 µs to about 0.65 s.
    H.get_or_init(|| Histogram::new(exponential_buckets(20e-6, 2.0, 16)))
}

/// One ack sent upstream, `took` after its packet arrived.
pub fn ack_sent(took: std::time::Duration, failed: bool) {
    ack_seconds().observe(took.as_secs_f64());
    if failed {
        add(&ACKS_FAILED, 1);
    }
}

/// Adds `n` to `c`.
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// `c`'s value.
pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}
