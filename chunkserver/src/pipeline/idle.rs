//! The idle clock of a write stream: when an upstream has been silent too long.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How far ahead the idle check looks when the idle timeout is too large to add to an
/// instant (it then never expires).
const FAR_CHECK: Duration = Duration::from_secs(24 * 60 * 60);

/// What the idle check of a write stream decides (see [`idle_check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idleness {
    /// Silent for the whole idle timeout with nothing outstanding: end the stream.
    Expired,
    /// Not idle (yet): check again at this instant.
    CheckAt(Instant),
}

/// Whether a write stream has been silent too long at `now`. `last_activity` is the
/// later of the last frame its upstream sent (or the set-up) and the last ack sent
/// back; `outstanding` is whether a packet has been received and not yet acknowledged.
/// Silence counts only while nothing is outstanding: a packet in flight is the ack
/// timeout's business, so a slow disk or a slow downstream never makes a stream idle,
/// and the quiet time starts again when its ack goes out.
pub fn idle_check(
    now: Instant,
    last_activity: Instant,
    outstanding: bool,
    timeout: Duration,
) -> Idleness {
    let far = || now + FAR_CHECK;
    if outstanding {
        return Idleness::CheckAt(now.checked_add(timeout).unwrap_or_else(far));
    }
    match last_activity.checked_add(timeout) {
        Some(deadline) if now >= deadline => Idleness::Expired,
        Some(deadline) => Idleness::CheckAt(deadline),
        None => Idleness::CheckAt(far()),
    }
}

/// When a stream last heard from its upstream or answered it: the idle clock. Kept as
/// nanoseconds since `base` in an atomic, so the reading and the acking parts of the
/// stream both move it forward without a lock.
pub(super) struct Activity {
    base: Instant,
    nanos: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            base: Instant::now(),
            nanos: AtomicU64::new(0),
        }
    }

    /// Records activity now.
    pub(super) fn touch(&self) {
        let n = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_max(n, Ordering::Relaxed);
    }

    pub(super) fn last(&self) -> Instant {
        self.base + Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_stream_is_idle_only_after_a_whole_quiet_timeout() {
        let t = Duration::from_secs(60);
        let s = Duration::from_secs;
        let t0 = Instant::now();
        assert_eq!(idle_check(t0, t0, false, t), Idleness::CheckAt(t0 + t));
        assert_eq!(
            idle_check(t0 + s(59), t0, false, t),
            Idleness::CheckAt(t0 + t)
        );
        assert_eq!(idle_check(t0 + t, t0, false, t), Idleness::Expired);
        assert_eq!(idle_check(t0 + s(3600), t0, false, t), Idleness::Expired);
        // Activity (a frame in, an ack out) restarts the clock.
        assert_eq!(
            idle_check(t0 + t, t0 + s(30), false, t),
            Idleness::CheckAt(t0 + s(90))
        );
    }

    #[test]
    fn a_stream_with_a_packet_outstanding_is_never_idle() {
        let t = Duration::from_secs(60);
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(3600);
        assert_eq!(idle_check(late, t0, true, t), Idleness::CheckAt(late + t));
    }

    #[test]
    fn a_slow_writer_is_never_idle() {
        // A packet (and its ack) every 5 s for an hour against a 6 s timeout: every
        // check the timer could make finds it busy.
        let t = Duration::from_secs(6);
        let t0 = Instant::now();
        for k in 0..720u64 {
            let last = t0 + Duration::from_secs(5 * k);
            for after in [0u64, 1, 4, 5] {
                let now = last + Duration::from_secs(after);
                assert_eq!(idle_check(now, last, false, t), Idleness::CheckAt(last + t));
            }
        }
    }

    #[test]
    fn a_huge_idle_timeout_never_expires_and_never_overflows() {
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(3600);
        for outstanding in [false, true] {
            match idle_check(late, t0, outstanding, Duration::MAX) {
                Idleness::CheckAt(at) => assert!(at > late),
                Idleness::Expired => panic!("a huge timeout expired"),
            }
        }
    }

    #[test]
    fn activity_starts_at_creation_and_only_moves_forward() {
        let a = Activity::new();
        let first = a.last();
        assert_eq!(first, a.base);
        a.touch();
        let second = a.last();
        assert!(second >= first);
        a.touch();
        assert!(a.last() >= second);
    }
}
