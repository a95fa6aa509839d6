//! Time this process saw: a monotonic clock that leaves out the stretches during which
//! the process itself was not running (SIGSTOP, a VM or container freeze, a host that
//! stopped scheduling it).
//!
//! **Why.** Every stampfs process judges others by deadlines: the master declares a
//! chunkserver dead after `--dead-after` without a heartbeat and takes a file from a
//! writer past its lease limits; a chunkserver blames a downstream that did not ack
//! within `--ack-timeout`; a client blames a pipeline head the same way. Measured on
//! the raw monotonic clock, a judge that was itself frozen wakes up and finds every
//! deadline passed at once: the messages that would have kept the others alive are
//! still queued in its sockets, unread. A frozen judge must not act on time it did not
//! see (DESIGN.md, "Time, pauses and deadlines").
//!
//! **How.** A watch thread observes the monotonic clock every [`TICK`]. An
//! observation that finds more than [`MAX_STEP`] since the previous one means the
//! process was not running for the excess: that excess is a *pause*, and seen time
//! advances by [`MAX_STEP`] only. Every reader observes too, so whichever thread runs
//! first after a pause counts it, exactly once. The counting is the pure [`Observer`],
//! tested with a clock that jumps. A loaded machine that delays the watch thread past
//! [`MAX_STEP`] makes seen time run slow, never fast: deadlines only ever get later.
//!
//! **What it gives.** [`seen_ms`] (the time base of every deadline), [`since_pause_ms`]
//! (how long since the process last resumed from a pause, so a judge can first drain
//! what queued up while it was gone), and [`sleep`] / [`timeout`]: tokio's, measured
//! in seen time.

use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the watch thread observes the clock.
pub const TICK: Duration = Duration::from_millis(20);
/// The most seen time one observation may add; anything beyond is a pause.
pub const MAX_STEP: Duration = Duration::from_millis(250);

/// What the pause accounting has seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PauseStats {
    /// Pauses detected since the process started.
    pub pauses: u64,
    /// Their total length (time not counted), ms.
    pub paused_ms: u64,
    /// The length of the most recent pause, ms.
    pub last_pause_ms: u64,
    /// Seen time at which the most recent pause ended; `None` before the first.
    pub last_resume_seen_ms: Option<u64>,
}

/// The pure pause accounting: raw monotonic milliseconds in, seen milliseconds out.
#[derive(Clone, Debug)]
pub struct Observer {
    max_step_ms: u64,
    last_raw_ms: u64,
    seen_ms: u64,
    stats: PauseStats,
}

impl Observer {
    /// Starts at raw time `raw_ms` (seen time 0); steps longer than `max_step_ms`
    /// between two observations count as pauses.
    pub fn new(raw_ms: u64, max_step_ms: u64) -> Self {
        Self {
            max_step_ms: max_step_ms.max(1),
            last_raw_ms: raw_ms,
            seen_ms: 0,
            stats: PauseStats::default(),
        }
    }

    /// Observes raw time `raw_ms` and returns seen time. A raw time older than the
    /// last observation (two threads racing to observe) changes nothing.
    pub fn observe(&mut self, raw_ms: u64) -> u64 {
        if raw_ms > self.last_raw_ms {
            let step = raw_ms - self.last_raw_ms;
            let counted = step.min(self.max_step_ms);
            self.seen_ms = self.seen_ms.saturating_add(counted);
            if step > counted {
                let paused = step - counted;
                self.stats.pauses += 1;
                self.stats.paused_ms = self.stats.paused_ms.saturating_add(paused);
                self.stats.last_pause_ms = paused;
                self.stats.last_resume_seen_ms = Some(self.seen_ms);
            }
            self.last_raw_ms = raw_ms;
        }
        self.seen_ms
    }

    /// Seen milliseconds since the last pause ended (`None`: no pause yet).
    pub fn since_pause_ms(&self) -> Option<u64> {
        self.stats
            .last_resume_seen_ms
            .map(|at| self.seen_ms.saturating_sub(at))
    }

    pub fn stats(&self) -> PauseStats {
        self.stats
    }
}

/// The process's pause-aware clock.
struct PauseClock {
    origin: Instant,
    /// Held only to observe; never across anything that blocks.
    observer: Mutex<Observer>,
}

impl PauseClock {
    fn raw_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Observer) -> T) -> T {
        let raw = self.raw_ms();
        let mut o = self
            .observer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        o.observe(raw);
        f(&mut o)
    }
}

fn clock() -> &'static PauseClock {
    static CLOCK: OnceLock<PauseClock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let origin = Instant::now();
        let max_step = u64::try_from(MAX_STEP.as_millis()).unwrap_or(u64::MAX);
        // The watch thread keeps observations frequent, so a gap means a pause and not
        // a quiet process. It lives as long as the process.
        let spawned = std::thread::Builder::new()
            .name("stampfs-pause-watch".into())
            .spawn(|| loop {
                std::thread::sleep(TICK);
                clock().with(|_| ());
            });
        if let Err(e) = spawned {
            // Without the thread, quiet stretches longer than MAX_STEP are not counted:
            // seen time runs slow, which only makes deadlines later.
            eprintln!("stampfs: could not start the pause watch thread: {e}");
        }
        PauseClock {
            origin,
            observer: Mutex::new(Observer::new(0, max_step)),
        }
    })
}

/// Milliseconds of seen time since the process's clock started (the first call).
pub fn seen_ms() -> u64 {
    clock().with(|o| o.seen_ms)
}

/// Seen milliseconds since the process last resumed from a pause; `None` if it never
/// paused.
pub fn since_pause_ms() -> Option<u64> {
    clock().with(|o| o.since_pause_ms())
}

/// Whether the process ran without a pause for at least `settle`: a judge that just
/// resumed first lets what queued up meanwhile (heartbeats, renewals, acks) in.
pub fn settled(settle: Duration) -> bool {
    settled_after(since_pause_ms(), settle)
}

/// [`settled`] for a process that resumed `since_pause_ms` ago (`None`: never paused).
pub fn settled_after(since_pause_ms: Option<u64>, settle: Duration) -> bool {
    let settle = u64::try_from(settle.as_millis()).unwrap_or(u64::MAX);
    since_pause_ms.is_none_or(|ms| ms >= settle)
}

/// What the pause accounting has seen.
pub fn stats() -> PauseStats {
    clock().with(|o| o.stats())
}

/// Sleeps until `d` of seen time has passed: a pause during the sleep does not count.
pub async fn sleep(d: Duration) {
    let total = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let start = seen_ms();
    let mut left = d;
    loop {
        tokio::time::sleep(left).await;
        let elapsed = seen_ms().saturating_sub(start);
        if elapsed >= total {
            return;
        }
        left = Duration::from_millis(total - elapsed);
    }
}

/// A [`timeout`] ran out: `d` of seen time passed without the future finishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed(pub Duration);

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no answer within {:?}", self.0)
    }
}

impl std::error::Error for Elapsed {}

/// Runs `fut` for at most `d` of seen time. The future is polled before the timer, so
/// an answer that arrived while this process was frozen wins over a timer that fired
/// at the same wake-up.
pub async fn timeout<F: Future>(d: Duration, fut: F) -> Result<F::Output, Elapsed> {
    tokio::select! {
        biased;
        out = fut => Ok(out),
        _ = sleep(d) => Err(Elapsed(d)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_observations_count_every_millisecond() {
        let mut o = Observer::new(1_000, 250);
        for t in (1_020..=3_000).step_by(20) {
            o.observe(t);
        }
        assert_eq!(o.observe(3_000), 2_000);
        assert_eq!(o.stats().pauses, 0);
        assert_eq!(o.since_pause_ms(), None);
    }

    #[test]
    fn a_jump_counts_only_the_longest_step_and_records_the_pause() {
        let mut o = Observer::new(0, 250);
        o.observe(100);
        // Frozen for four seconds: the next observation is 4 s later.
        assert_eq!(o.observe(4_100), 350);
        let s = o.stats();
        assert_eq!((s.pauses, s.paused_ms, s.last_pause_ms), (1, 3_750, 3_750));
        assert_eq!(s.last_resume_seen_ms, Some(350));
        assert_eq!(o.since_pause_ms(), Some(0));
        o.observe(4_350);
        assert_eq!(o.since_pause_ms(), Some(250));
        o.observe(4_900);
        assert_eq!(o.stats().pauses, 2, "a second jump is a second pause");
        assert_eq!(o.since_pause_ms(), Some(0));
    }

    #[test]
    fn a_deadline_judged_after_a_pause_sees_only_the_time_it_ran() {
        // A judge that heard from a peer at seen time 0, with a 2 s deadline, is frozen
        // for 10 s: on waking the deadline has not passed.
        let mut o = Observer::new(0, 250);
        let heard = o.observe(0);
        let now = o.observe(10_000);
        assert!(now - heard < 2_000, "seen {now} ms");
    }

    #[test]
    fn raw_time_that_goes_back_changes_nothing() {
        let mut o = Observer::new(500, 250);
        assert_eq!(o.observe(600), 100);
        assert_eq!(o.observe(550), 100);
        assert_eq!(o.observe(650), 150);
        assert_eq!(o.stats().pauses, 0);
    }

    #[test]
    fn the_process_clock_moves_and_sleeps_last_their_duration() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let start = seen_ms();
        rt.block_on(sleep(Duration::from_millis(60)));
        assert!(seen_ms() - start >= 60);
        let r = rt.block_on(timeout(
            Duration::from_millis(30),
            std::future::pending::<()>(),
        ));
        assert_eq!(r, Err(Elapsed(Duration::from_millis(30))));
        let r = rt.block_on(timeout(Duration::from_secs(5), async { 7 }));
        assert_eq!(r, Ok(7));
    }

    #[test]
    fn a_judge_waits_the_settle_time_after_a_pause_only() {
        let settle = Duration::from_secs(1);
        assert!(settled_after(None, settle), "never paused");
        let mut o = Observer::new(0, 250);
        o.observe(5_000); // frozen for almost 5 s
        assert!(!settled_after(o.since_pause_ms(), settle), "just resumed");
        for t in (5_020..=5_999).step_by(20) {
            o.observe(t);
        }
        assert!(!settled_after(o.since_pause_ms(), settle));
        o.observe(6_020);
        assert!(
            settled_after(o.since_pause_ms(), settle),
            "ran for 1 s since"
        );
    }
}
