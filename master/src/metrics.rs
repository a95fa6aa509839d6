//! The master's Prometheus metrics (`--metrics-listen ADDR`, served by
//! `stampfs-metrics`): requests and their latency by operation, observed where the
//! server dispatches them; and, read from the state and the log at each scrape, the
//! lease recoveries and re-replications done (counted as they happen); the
//! namespace and chunk counts, the chunkservers live, the files open for writing and
//! in lease recovery, the log's records, fsyncs and swept batches, the answers kept
//! for repeated calls, safe mode, the chunkservers being decommissioned, and, in a
//! master group, whether this member leads and its term. The log's durable writes are
//! observed as they happen (`oplog::LogTimings`): their seconds and their records.
//! The status page (`status_page.rs`) is served at `/` of the same port.

use crate::service::Core;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use stampfs_metrics::{prometheus_client, Exporter, Registry, Requests};
use std::sync::{Arc, Mutex, Weak};

/// Events the master counts as they happen (served when metrics are).
#[derive(Debug, Default)]
pub struct Events {
    /// Lease recoveries that closed their file.
    pub recoveries_committed: Counter,
    /// Replica copies (re-replication) that completed.
    pub replications_done: Counter,
    /// The latest lease recoveries, newest last (at most [`RECENT_RECOVERIES`]), for
    /// the status page.
    pub recent_recoveries: Mutex<std::collections::VecDeque<RecoveryNote>>,
}

/// Lease recoveries the status page lists.
pub const RECENT_RECOVERIES: usize = 20;

/// One lease recovery that closed its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryNote {
    pub path: String,
    /// When it committed (wall clock, ms since the epoch).
    pub at_ms: u64,
    /// The version the writer held, and the one its replicas were sealed at: the
    /// writer's late writes are refused (fenced) from then on.
    pub old_version: u64,
    pub new_version: u64,
    /// The length the file was closed at.
    pub length: u64,
}

impl Events {
    /// Counts a lease recovery and keeps it for the status page.
    pub fn recovered(&self, note: RecoveryNote) {
        self.recoveries_committed.inc();
        let mut r = self
            .recent_recoveries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if r.len() == RECENT_RECOVERIES {
            r.pop_front();
        }
        r.push_back(note);
    }

    /// The latest lease recoveries, newest first.
    pub fn recent(&self) -> Vec<RecoveryNote> {
        let r = self
            .recent_recoveries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        r.iter().rev().cloned().collect()
    }
}

/// Counters copied from the log's own at each scrape.
#[derive(Default)]
struct LogCounters {
    records: Counter,
    fsyncs: Counter,
    swept: Counter,
    /// What was copied last: the counters rise by the difference.
    last: Mutex<crate::oplog::LogStats>,
}

impl LogCounters {
    fn copy(&self, now: crate::oplog::LogStats) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        self.records
            .inc_by(now.records.saturating_sub(last.records));
        self.fsyncs.inc_by(now.fsyncs.saturating_sub(last.fsyncs));
        self.swept.inc_by(now.swept.saturating_sub(last.swept));
        *last = now;
    }
}

/// Builds the master's registry and exporter; the returned [`Requests`] is what the
/// server observes its requests into.
pub fn exporter(core: &Arc<Core>) -> (Arc<Exporter>, Requests) {
    let mut registry = Registry::with_prefix("stampfs_master");
    let requests = Requests::register(&mut registry);
    let gauge = |registry: &mut Registry, name: &str, help: &str| {
        let g = Gauge::<i64>::default();
        registry.register(name, help, g.clone());
        g
    };
    let inodes = gauge(&mut registry, "inodes", "Files, directories and links");
    let chunks = gauge(&mut registry, "chunks", "Chunks");
    let known = gauge(
        &mut registry,
        "chunkservers",
        "Chunkservers ever registered",
    );
    let live = gauge(
        &mut registry,
        "chunkservers_live",
        "Chunkservers heard from within the dead-after period",
    );
    let open = gauge(
        &mut registry,
        "files_open",
        "Files open for writing (leases held)",
    );
    let recovering = gauge(&mut registry, "files_recovering", "Files in lease recovery");
    let safe_mode = gauge(
        &mut registry,
        "safe_mode",
        "1 while in safe mode (no replica deletions or re-replication)",
    );
    let decommissioning = gauge(
        &mut registry,
        "chunkservers_decommissioning",
        "Chunkservers being decommissioned (or decommissioned and not yet recommissioned)",
    );
    let missing = gauge(
        &mut registry,
        "chunks_missing",
        "Last chunks closed by lease recovery with no replica at their version",
    );
    let kept = gauge(
        &mut registry,
        "calls_kept",
        "Answers kept for repeated calls (the retry cache)",
    );
    let leading = gauge(
        &mut registry,
        "leading",
        "1 while this master serves (a group's leader, or a master on its own log)",
    );
    let term = gauge(
        &mut registry,
        "term",
        "The term this member leads or last led in (group)",
    );
    let log = Arc::new(LogCounters::default());
    registry.register(
        "log_records",
        "Records written to the log",
        log.records.clone(),
    );
    registry.register(
        "log_fsyncs",
        "fdatasync calls of the operation log",
        log.fsyncs.clone(),
    );
    registry.register(
        "log_swept_batches",
        "Batches written without a waiter (by the sweeper)",
        log.swept.clone(),
    );
    registry.register(
        "lease_recoveries",
        "Lease recoveries that closed their file",
        core.events.recoveries_committed.clone(),
    );
    registry.register(
        "replications_done",
        "Replica copies (re-replication) completed",
        core.events.replications_done.clone(),
    );
    let timings = core.log.timings();
    registry.register(
        "log_sync_seconds",
        "Each durable write of the log (write and fdatasync)",
        timings.sync_seconds,
    );
    registry.register(
        "log_batch_records",
        "Records per durable write of the log (group commit's batch sizes)",
        timings.batch_records,
    );
    let weak: Weak<Core> = Arc::downgrade(core);
    let refresh = move || {
        let Some(core) = weak.upgrade() else {
            return;
        };
        {
            let st = core.state();
            let now = core.clock.now_ms();
            inodes.set(st.ns.len() as i64);
            chunks.set(st.chunks.len() as i64);
            known.set(st.servers.len() as i64);
            live.set(st.registry.live_count(now, st.settings.dead_after_ms) as i64);
            open.set(st.leases.len() as i64);
            recovering.set(st.recovering.len() as i64);
            safe_mode.set(i64::from(st.safe_mode.is_on()));
            decommissioning.set(st.decommissioning.len() as i64);
            missing.set(st.missing_chunks.len() as i64);
            kept.set(st.retry.len() as i64);
        }
        leading.set(i64::from(core.log.serving().is_ok()));
        if let Some(g) = core.log.group() {
            term.set(i64::try_from(g.leadership.epoch().term).unwrap_or(i64::MAX));
        }
        log.copy(core.log.stats());
    };
    let page_core = Arc::downgrade(core);
    let page = move || match page_core.upgrade() {
        Some(core) => crate::status_page::Page::gather(&core).render(),
        None => "<!doctype html><p>stampfs master: stopping</p>\n".to_string(),
    };
    (
        Arc::new(Exporter::new("master", registry, refresh).with_page(page)),
        requests,
    )
}
