//! Process-wide event counters the chunkserver's metrics read (`metrics.rs`): raised
//! where the event happens, with no state to pass around. The fenced refusals are
//! the gate's own (`gate::fenced_total`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Payload bytes of write packets taken into replicas (pipeline writes).
pub static BYTES_WRITTEN: AtomicU64 = AtomicU64::new(0);
/// Bytes read out of replicas for clients.
pub static BYTES_READ: AtomicU64 = AtomicU64::new(0);
/// Replicas deleted (garbage collection, the master's deletions).
pub static REPLICAS_DELETED: AtomicU64 = AtomicU64::new(0);
/// Replicas the scrubber found corrupt.
pub static CORRUPT_FOUND: AtomicU64 = AtomicU64::new(0);

/// Adds `n` to `c`.
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// `c`'s value.
pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}
