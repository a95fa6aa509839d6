//! The chunkserver's Prometheus metrics (`--metrics-listen ADDR`, served by
//! `stampfs-metrics`): requests and their latency by kind (a stream is counted when it
//! starts, not timed), observed where the server reads them; and, read at each scrape,
//! the requests refused as fenced (a version older than the replica's, counted by the
//! fencing gate), bytes written and read, replicas deleted and found corrupt, the
//! scrub's progress (bytes, replicas, passes) and the pipeline's acks (their latency,
//! and those reporting a failure) (`counters.rs`), the replicas held, the write
//! streams open, the I/O engine in use and its queue depths (operations in flight,
//! jobs waiting for room).

use crate::server::Shared;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use stampfs_metrics::{prometheus_client, Exporter, Registry, Requests};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Builds the chunkserver's registry and exporter; the returned [`Requests`] is what
/// the server observes its requests into.
pub(crate) fn exporter(shared: &Arc<Shared>, engine: &'static str) -> (Arc<Exporter>, Requests) {
    let mut registry = Registry::with_prefix("stampfs_chunkserver");
    let requests = Requests::register(&mut registry);
    let fenced = Counter::<u64>::default();
    registry.register(
        "fenced",
        "Requests refused for presenting an older chunk version than the replica's \
         (writes of a deposed writer, stale bumps)",
        fenced.clone(),
    );
    let replicas = Gauge::<i64>::default();
    registry.register("replicas", "Replicas held", replicas.clone());
    let streams = Gauge::<i64>::default();
    registry.register("write_streams", "Write streams open", streams.clone());
    let in_flight = Gauge::<i64>::default();
    registry.register(
        "io_in_flight",
        "I/O operations handed to the kernel and not yet complete (io_uring SQEs, or \
         blocking jobs of the threads engine)",
        in_flight.clone(),
    );
    let waiting = Gauge::<i64>::default();
    registry.register(
        "io_waiting",
        "I/O jobs waiting for room in the io_uring ring",
        waiting.clone(),
    );
    let engines = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
    registry.register("io_engine", "The I/O engine in use (1)", engines.clone());
    engines.get_or_create(&vec![("engine", engine)]).set(1);
    use crate::counters::{
        self, ACKS_FAILED, BYTES_READ, BYTES_WRITTEN, CORRUPT_FOUND, REPLICAS_DELETED, SCRUB_BYTES,
        SCRUB_PASSES, SCRUB_REPLICAS,
    };
    registry.register(
        "pipeline_ack_seconds",
        "From a write packet's arrival to its ack going upstream (every replica behind \
         this one included)",
        counters::ack_seconds().clone(),
    );
    let copied: Vec<(&'static AtomicU64, Counter)> = [
        (
            &BYTES_WRITTEN,
            "bytes_written",
            "Payload bytes of write packets taken into replicas",
        ),
        (
            &BYTES_READ,
            "bytes_read",
            "Bytes read out of replicas for clients",
        ),
        (
            &REPLICAS_DELETED,
            "replicas_deleted",
            "Replicas deleted (stale, orphans, the master's deletions)",
        ),
        (
            &CORRUPT_FOUND,
            "corrupt_found",
            "Replicas the scrubber found corrupt",
        ),
        (
            &SCRUB_BYTES,
            "scrub_bytes",
            "Bytes the scrubber read back and verified",
        ),
        (
            &SCRUB_REPLICAS,
            "scrub_replicas",
            "Replicas the scrubber went through",
        ),
        (
            &SCRUB_PASSES,
            "scrub_passes",
            "Whole scrub passes over every replica",
        ),
        (
            &ACKS_FAILED,
            "pipeline_acks_failed",
            "Pipeline acks sent upstream reporting a failed replica",
        ),
    ]
    .into_iter()
    .map(|(source, name, help)| {
        let c = Counter::<u64>::default();
        registry.register(name, help, c.clone());
        (source, c)
    })
    .collect();
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let fenced_seen = AtomicU64::new(0);
    let seen: Vec<AtomicU64> = copied.iter().map(|_| AtomicU64::new(0)).collect();
    let refresh = move || {
        let now = crate::gate::fenced_total();
        let before = fenced_seen.swap(now, Ordering::Relaxed);
        fenced.inc_by(now.saturating_sub(before));
        for ((source, c), last) in copied.iter().zip(&seen) {
            let now = counters::get(source);
            c.inc_by(now.saturating_sub(last.swap(now, Ordering::Relaxed)));
        }
        let gauge = |c| i64::try_from(counters::get(c)).unwrap_or(i64::MAX);
        in_flight.set(gauge(&counters::IO_IN_FLIGHT));
        waiting.set(gauge(&counters::IO_WAITING));
        if let Some(shared) = weak.upgrade() {
            replicas.set(i64::try_from(shared.store.replica_count()).unwrap_or(i64::MAX));
            streams.set(i64::from(shared.active_streams.load(Ordering::Relaxed)));
        }
    };
    (
        Arc::new(Exporter::new("chunkserver", registry, refresh)),
        requests,
    )
}
