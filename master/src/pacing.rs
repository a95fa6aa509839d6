//! Pacing for long background work done in slices under the state lock (the health
//! pass, a full chunk report applied in batches).
//!
//! Releasing the lock between slices is not enough on its own: a task that only
//! yields (`tokio::task::yield_now`) keeps its worker thread busy, and a tokio worker
//! polls its I/O and timer driver only every few dozen scheduler ticks. At a few
//! milliseconds per slice, requests whose sockets or timers became ready meanwhile
//! would wait a few hundred milliseconds for that poll even though the lock was free.
//! So a [`Pacer`] yields between slices and, once [`PARK_EVERY`] of work has passed
//! since it last did, sleeps for a millisecond instead: the worker parks, polls the
//! drivers and runs whatever they woke.

use std::time::{Duration, Instant};

/// Work between two parks of the worker.
pub const PARK_EVERY: Duration = Duration::from_millis(8);

/// See the module docs.
#[derive(Debug)]
pub struct Pacer {
    since: Instant,
}

impl Default for Pacer {
    fn default() -> Self {
        Self::new()
    }
}

impl Pacer {
    pub fn new() -> Self {
        Self {
            since: Instant::now(),
        }
    }

    /// Whether the next pause should park the worker (pure, for tests).
    pub fn due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) >= PARK_EVERY
    }

    /// Between two slices.
    pub async fn pause(&mut self) {
        if self.due(Instant::now()) {
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.since = Instant::now();
        } else {
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_is_parked_only_after_enough_work() {
        let p = Pacer::new();
        assert!(!p.due(p.since));
        assert!(!p.due(p.since + PARK_EVERY / 2));
        assert!(p.due(p.since + PARK_EVERY));
    }

    #[tokio::test]
    async fn a_pause_after_enough_work_resets_the_clock() {
        let mut p = Pacer::new();
        p.since = Instant::now() - PARK_EVERY * 2;
        p.pause().await;
        assert!(!p.due(Instant::now() - Duration::from_millis(1)));
    }
}
