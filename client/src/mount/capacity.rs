//! The cluster's space as `statfs` (and so `df`) reports it: pure bookkeeping, no I/O.
//!
//! Like HDFS's `dfs -df` and a MooseFS mount, the mount shows the cluster's *raw*
//! space: [`Capacity::from_report`] adds up the capacity and the used bytes that the
//! live chunkservers report in the master's [`ClusterReport`]. Every replica counts,
//! so a 1 MiB file with three replicas uses 3 MiB; dead chunkservers count for
//! nothing. [`Capacity::blocks`] turns that into statfs block counts.
//!
//! [`CapacityCache`] decides, from the clock alone, whether a `statfs` is answered
//! from memory or asks the master: an answer (or a failure) is reused for a TTL, so
//! `df` in a loop costs the master at most one `ClusterReport` per TTL per mount; and
//! while one request is on its way, others answer with the last known values instead
//! of sending their own.

use stampfs_proto::{ChunkserverState, ClusterReport};
use std::time::{Duration, Instant};

/// Raw bytes of the cluster: total and used, over its live chunkservers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Capacity {
    pub(crate) total: u64,
    pub(crate) used: u64,
}

/// A [`Capacity`] in statfs blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocks {
    /// `f_blocks`.
    pub(crate) total: u64,
    /// `f_bfree`.
    pub(crate) free: u64,
    /// `f_bavail`: the same as `free`, nothing is reserved for root.
    pub(crate) avail: u64,
}

impl Capacity {
    /// Sums what the live chunkservers report (saturating: a report can not make the
    /// sums wrap).
    pub(crate) fn from_report(report: &ClusterReport) -> Self {
        report
            .chunkservers
            .iter()
            .filter(|cs| cs.state == ChunkserverState::Live)
            .fold(Capacity::default(), |acc, cs| Capacity {
                total: acc.total.saturating_add(cs.capacity),
                used: acc.used.saturating_add(cs.used),
            })
    }

    /// Bytes not used; zero when the chunkservers report more used than capacity.
    pub(crate) fn free(&self) -> u64 {
        self.total.saturating_sub(self.used)
    }

    /// In blocks of `block_size` bytes, rounded down (so free space is never
    /// overstated). A zero block size counts as one byte instead of dividing by zero.
    pub(crate) fn blocks(&self, block_size: u32) -> Blocks {
        let bs = u64::from(block_size.max(1));
        let free = self.free() / bs;
        Blocks {
            total: self.total / bs,
            free,
            avail: free,
        }
    }
}

/// What a `statfs` does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Answer with this without asking the master: it is fresh, a request for newer
    /// values is already on its way, or the master failed less than a TTL ago (then it
    /// is the last known values, or zeros when there are none).
    Answer(Capacity),
    /// Ask the master (within the fetch timeout), then report the outcome with
    /// [`CapacityCache::fetched`] or [`CapacityCache::failed`] and answer with what
    /// that returns.
    Fetch,
}

/// When to ask the master for the cluster's capacity again.
#[derive(Debug)]
pub(crate) struct CapacityCache {
    ttl: Duration,
    fetch_timeout: Duration,
    /// The last values the master gave.
    last: Option<Capacity>,
    /// When the last request ended, answered or failed: the next is due a TTL later.
    checked: Option<Instant>,
    /// When the request on its way started; one older than the fetch timeout was
    /// abandoned (its task timed out or went away) and no longer holds others back.
    fetching: Option<Instant>,
}

impl CapacityCache {
    /// Reuses an answer (or a failure) for `ttl`; a request is given `fetch_timeout`.
    pub(crate) fn new(ttl: Duration, fetch_timeout: Duration) -> Self {
        Self {
            ttl,
            fetch_timeout,
            last: None,
            checked: None,
            fetching: None,
        }
    }

    /// Decides how the `statfs` arriving at `now` is answered. A [`Lookup::Fetch`]
    /// marks a request as on its way from `now`.
    pub(crate) fn lookup(&mut self, now: Instant) -> Lookup {
        let known = self.last.unwrap_or_default();
        if self
            .checked
            .is_some_and(|t| now.saturating_duration_since(t) < self.ttl)
        {
            return Lookup::Answer(known);
        }
        let on_its_way = self
            .fetching
            .is_some_and(|t| now.saturating_duration_since(t) < self.fetch_timeout);
        if on_its_way && self.last.is_some() {
            return Lookup::Answer(known);
        }
        // Nothing known yet: this caller asks too rather than answer zeros while the
        // first answer is on its way (only ever before the first answer).
        if !on_its_way {
            self.fetching = Some(now);
        }
        Lookup::Fetch
    }

    /// The master answered with `capacity` at `now`; returns what to reply.
    pub(crate) fn fetched(&mut self, capacity: Capacity, now: Instant) -> Capacity {
        self.last = Some(capacity);
        self.checked = Some(now);
        self.fetching = None;
        capacity
    }

    /// The master could not be asked (unreachable, an error, too slow) at `now`;
    /// returns what to reply: the last known values, or zeros. The next attempt is a
    /// TTL later, so a `df` loop against a dead master does not wait on every call.
    pub(crate) fn failed(&mut self, now: Instant) -> Capacity {
        self.checked = Some(now);
        self.fetching = None;
        self.last.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{ChunkserverId, ChunkserverStatus, HealthCounts};

    fn cs(id: u64, state: ChunkserverState, capacity: u64, used: u64) -> ChunkserverStatus {
        ChunkserverStatus {
            id: ChunkserverId(id),
            addr: format!("127.0.0.1:{id}"),
            state,
            last_heartbeat_ms_ago: Some(100),
            capacity,
            used,
            replicas: 0,
            active_streams: 0,
            queued_commands: 0,
            decommission: stampfs_proto::DecommissionState::InService,
        }
    }

    fn report(chunkservers: Vec<ChunkserverStatus>) -> ClusterReport {
        ClusterReport {
            chunkservers,
            chunks: HealthCounts::default(),
            orphan_replicas: 0,
            replications_in_flight: 0,
            masters: None,
            safe_mode: Default::default(),
            balancer: Default::default(),
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn only_live_chunkservers_count() {
        let r = report(vec![
            cs(1, ChunkserverState::Live, 100 * MIB, 10 * MIB),
            cs(2, ChunkserverState::Dead, 500 * MIB, 1),
            cs(3, ChunkserverState::Live, 50 * MIB, 5 * MIB),
        ]);
        let c = Capacity::from_report(&r);
        assert_eq!(
            c,
            Capacity {
                total: 150 * MIB,
                used: 15 * MIB
            }
        );
        assert_eq!(c.free(), 135 * MIB);
        assert_eq!(Capacity::from_report(&report(vec![])), Capacity::default());
    }

    #[test]
    fn sums_saturate_and_free_never_goes_negative() {
        let r = report(vec![
            cs(1, ChunkserverState::Live, u64::MAX, 3),
            cs(2, ChunkserverState::Live, 7, u64::MAX),
        ]);
        let c = Capacity::from_report(&r);
        assert_eq!((c.total, c.used), (u64::MAX, u64::MAX));
        assert_eq!(c.free(), 0);
        // A chunkserver that reports more used than capacity: nothing is free.
        let c = Capacity::from_report(&report(vec![cs(1, ChunkserverState::Live, 10, 20)]));
        assert_eq!(c.free(), 0);
        assert_eq!(c.blocks(1).free, 0);
    }

    #[test]
    fn blocks_round_down() {
        let c = Capacity {
            total: 10 * MIB + 5,
            used: 3 * MIB + 7,
        };
        let b = c.blocks(MIB as u32);
        assert_eq!(b.total, 10);
        // 7 MiB - 2 bytes free: 6 whole blocks, never overstated.
        assert_eq!(b.free, 6);
        assert_eq!(b.avail, b.free);
        assert_eq!(
            c.blocks(0).total,
            c.total,
            "a zero block size does not panic"
        );
        let none = Capacity::default().blocks(MIB as u32);
        assert_eq!((none.total, none.free, none.avail), (0, 0, 0));
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn cap(total: u64, used: u64) -> Capacity {
        Capacity { total, used }
    }

    #[test]
    fn answers_are_reused_for_the_ttl() {
        let t0 = Instant::now();
        let mut cache = CapacityCache::new(secs(2.0), secs(1.0));
        assert_eq!(cache.lookup(t0), Lookup::Fetch);
        assert_eq!(cache.fetched(cap(100, 10), t0 + secs(0.1)), cap(100, 10));
        assert_eq!(cache.lookup(t0 + secs(0.2)), Lookup::Answer(cap(100, 10)));
        assert_eq!(cache.lookup(t0 + secs(2.0)), Lookup::Answer(cap(100, 10)));
        // Two seconds after the answer arrived: ask again.
        assert_eq!(cache.lookup(t0 + secs(2.1)), Lookup::Fetch);
        assert_eq!(cache.fetched(cap(100, 20), t0 + secs(2.2)), cap(100, 20));
        assert_eq!(cache.lookup(t0 + secs(2.3)), Lookup::Answer(cap(100, 20)));
    }

    #[test]
    fn one_request_at_a_time_once_something_is_known() {
        let t0 = Instant::now();
        let mut cache = CapacityCache::new(secs(2.0), secs(1.0));
        // Nothing known yet: concurrent callers each ask rather than answer zeros.
        assert_eq!(cache.lookup(t0), Lookup::Fetch);
        assert_eq!(cache.lookup(t0 + secs(0.1)), Lookup::Fetch);
        cache.fetched(cap(100, 10), t0 + secs(0.2));
        // Stale: the first caller asks, the others answer with the last values
        // while it is on its way.
        assert_eq!(cache.lookup(t0 + secs(3.0)), Lookup::Fetch);
        assert_eq!(cache.lookup(t0 + secs(3.1)), Lookup::Answer(cap(100, 10)));
        assert_eq!(cache.lookup(t0 + secs(3.9)), Lookup::Answer(cap(100, 10)));
        // That request was abandoned (no outcome within the fetch timeout): ask anew.
        assert_eq!(cache.lookup(t0 + secs(4.0)), Lookup::Fetch);
        assert_eq!(cache.lookup(t0 + secs(4.1)), Lookup::Answer(cap(100, 10)));
        cache.fetched(cap(100, 30), t0 + secs(4.2));
        assert_eq!(cache.lookup(t0 + secs(4.3)), Lookup::Answer(cap(100, 30)));
    }

    #[test]
    fn failures_answer_the_last_values_and_are_retried_after_the_ttl() {
        let t0 = Instant::now();
        let mut cache = CapacityCache::new(secs(2.0), secs(1.0));
        assert_eq!(cache.lookup(t0), Lookup::Fetch);
        cache.fetched(cap(100, 10), t0);
        assert_eq!(cache.lookup(t0 + secs(5.0)), Lookup::Fetch);
        assert_eq!(cache.failed(t0 + secs(6.0)), cap(100, 10));
        // The failure is remembered for a TTL: no new attempt, the last values.
        assert_eq!(cache.lookup(t0 + secs(6.5)), Lookup::Answer(cap(100, 10)));
        assert_eq!(cache.lookup(t0 + secs(7.9)), Lookup::Answer(cap(100, 10)));
        assert_eq!(cache.lookup(t0 + secs(8.1)), Lookup::Fetch);
        assert_eq!(cache.fetched(cap(200, 10), t0 + secs(8.2)), cap(200, 10));
    }

    #[test]
    fn failures_before_any_answer_report_zeros() {
        let t0 = Instant::now();
        let mut cache = CapacityCache::new(secs(2.0), secs(1.0));
        assert_eq!(cache.lookup(t0), Lookup::Fetch);
        assert_eq!(cache.failed(t0 + secs(1.0)), Capacity::default());
        assert_eq!(
            cache.lookup(t0 + secs(1.5)),
            Lookup::Answer(Capacity::default())
        );
        assert_eq!(cache.lookup(t0 + secs(3.0)), Lookup::Fetch);
    }

    #[test]
    fn a_clock_that_goes_backwards_does_not_panic() {
        let t0 = Instant::now() + secs(10.0);
        let mut cache = CapacityCache::new(secs(2.0), secs(1.0));
        assert_eq!(cache.lookup(t0), Lookup::Fetch);
        cache.fetched(cap(1, 0), t0);
        assert_eq!(cache.lookup(t0 - secs(5.0)), Lookup::Answer(cap(1, 0)));
    }
}
