//! Writes to a peer that stopped reading: a bound on *progress*, not on transfers.
//!
//! A peer that stops reading (a frozen client, a dead VM, a receive window that stays
//! full) would otherwise hold a chunkserver task forever in a write: a reply, an ack, a
//! forwarded packet, a replica copy. [`StallGuard`] wraps the write half of a socket and
//! fails a write, flush or shutdown with [`std::io::ErrorKind::TimedOut`] once the peer
//! has taken **no byte** for its timeout while there were bytes to give it; the caller
//! then ends the connection exactly as on a broken socket, and the guard logs the
//! peer at info. After that every further operation fails at once, so a caller's
//! closing `shutdown` cannot block a second time.
//!
//! Why an adapter under the frame writers: `FrameWriter` and `FrameSink` (proto) send
//! a frame's header and data with `write_all` / vectored writes, so a timeout around a
//! whole `write_frame` would bound the *transfer* (and cut a slow but alive reader of a
//! 16 MiB read reply), while the adapter sees every underlying `poll_write` and can
//! restart the clock whenever the socket accepted some bytes. Only time spent blocked
//! counts: the clock starts when a write finds the socket full and stops at the next
//! accepted byte, so a connection that is quiet because *we* have nothing to send is
//! never at risk (silence from the peer is the idle timeout's business, on the read
//! side). The decision is the pure [`StallClock`]; the adapter only feeds it poll
//! outcomes and sleeps until the deadline it names. A stretch during which this process
//! itself was frozen (see [`stampfs_proto::pause`]) does not count against the peer: the
//! clock starts again.
//!
//! Granularity: the kernel wakes a blocked writer only once a good part of the send
//! buffer has drained (about a third of it: ~2 MiB on loopback), so "progress"
//! means that much. A reader slow enough to take longer than the timeout for that is
//! treated as gone, which is what the timeout (60 s by default) is for.

use stampfs_proto::net::{ConnRead, ConnWrite, Dialer};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};

/// The write half of a peer connection, under a [`StallGuard`].
pub type GuardedWriteHalf = StallGuard<ConnWrite>;

/// Dials `addr` through `dialer` within `timeout`; writes to it fail once it has taken
/// no byte for `stall`.
pub async fn dial(
    dialer: &Dialer,
    addr: &str,
    timeout: Duration,
    stall: Duration,
) -> stampfs_proto::Result<(ConnRead, GuardedWriteHalf)> {
    let conn = dialer.connect(addr, timeout).await?;
    Ok((conn.read, StallGuard::new(conn.write, conn.peer, stall)))
}

/// How far ahead the guard sleeps when its timeout is too large to add to an instant
/// (it then never expires).
const FAR_CHECK: Duration = Duration::from_secs(24 * 60 * 60);

/// What a blocked write should do (see [`StallClock::blocked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallVerdict {
    /// The peer took nothing for the whole timeout: it is gone.
    Expired,
    /// Keep waiting; look again at this instant at the latest.
    WaitUntil(Instant),
}

/// The pure part of a [`StallGuard`]: since when the writer has been blocked without
/// the peer taking a byte.
#[derive(Clone, Copy, Debug)]
pub struct StallClock {
    timeout: Duration,
    /// The start of the current stretch of blocked writes; `None` while not blocked
    /// (reset by every accepted byte).
    blocked_since: Option<Instant>,
}

impl StallClock {
    /// A clock that expires after `timeout` of blocked writes without progress.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            blocked_since: None,
        }
    }

    /// The peer accepted some bytes (or a flush completed): the clock stops.
    pub fn progressed(&mut self) {
        self.blocked_since = None;
    }

    /// A write found the socket full at `now`. The first such write after progress
    /// starts the clock; the peer is gone once it has run for the whole timeout.
    pub fn blocked(&mut self, now: Instant) -> StallVerdict {
        let since = *self.blocked_since.get_or_insert(now);
        match since.checked_add(self.timeout) {
            Some(deadline) if now >= deadline => StallVerdict::Expired,
            Some(deadline) => StallVerdict::WaitUntil(deadline),
            // Too large to represent: never expires; look again much later.
            None => StallVerdict::WaitUntil(now.checked_add(FAR_CHECK).unwrap_or(now)),
        }
    }
}

/// Whether this process resumed from a pause ([`stampfs_proto::pause`]) within the last
/// `d` of seen time.
fn paused_within(d: Duration) -> bool {
    let d = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    stampfs_proto::pause::since_pause_ms().is_some_and(|ms| ms < d)
}

/// An [`AsyncWrite`] that fails with `TimedOut` when the peer takes no byte for a
/// timeout while a write, flush or shutdown waits on it (see the module docs).
#[derive(Debug)]
pub struct StallGuard<W> {
    inner: W,
    clock: StallClock,
    /// Wakes the blocked task at the clock's deadline; created on the first block.
    timer: Option<Pin<Box<Sleep>>>,
    /// The peer, for the log line and the error.
    peer: SocketAddr,
    /// Set once the clock expired: every later operation fails at once.
    expired: bool,
}

impl<W> StallGuard<W> {
    /// Wraps `inner`, the write side of a connection to `peer`.
    pub fn new(inner: W, peer: SocketAddr, timeout: Duration) -> Self {
        Self {
            inner,
            clock: StallClock::new(timeout),
            timer: None,
            peer,
            expired: false,
        }
    }

    fn expired_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "{} took no bytes for {:?}; treated as gone",
                self.peer, self.clock.timeout
            ),
        )
    }

    /// The inner operation returned `Pending`: waits on the clock's deadline, or fails
    /// once it has passed.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        loop {
            match self.clock.blocked(Instant::now()) {
                StallVerdict::Expired if paused_within(self.clock.timeout) => {
                    // This process was itself frozen during the stretch: the peer is not
                    // judged by time we did not see; the clock starts again.
                    self.clock.progressed();
                }
                StallVerdict::Expired => {
                    self.expired = true;
                    tracing::info!(
                        peer = %self.peer,
                        timeout = ?self.clock.timeout,
                        "peer took no bytes for the timeout; closing the connection"
                    );
                    return Poll::Ready(Err(self.expired_error()));
                }
                StallVerdict::WaitUntil(at) => {
                    let timer = self
                        .timer
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                    if timer.deadline() != at {
                        timer.as_mut().reset(at);
                    }
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The deadline passed: the clock decides (again) with the new time.
                }
            }
        }
    }

    /// Records the outcome of an inner operation that is ready.
    fn ready<T>(
        &mut self,
        result: io::Result<T>,
        progress: impl FnOnce(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        if matches!(&result, Ok(v) if progress(v)) {
            self.clock.progressed();
        }
        Poll::Ready(result)
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for StallGuard<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(this.expired_error()));
        }
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => this.ready(r, |n| *n > 0),
            Poll::Pending => this.blocked(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(this.expired_error()));
        }
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => this.ready(r, |n| *n > 0),
            Poll::Pending => this.blocked(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(this.expired_error()));
        }
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(r) => this.ready(r, |_| true),
            Poll::Pending => this.blocked(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(this.expired_error()));
        }
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Ready(r) => this.ready(r, |_| true),
            Poll::Pending => this.blocked(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_that_never_blocks_never_expires() {
        let t = Duration::from_secs(60);
        let mut c = StallClock::new(t);
        let t0 = Instant::now();
        // Progress far apart in time is no stall: only blocked time counts.
        for k in 0..100u64 {
            c.progressed();
            let now = t0 + Duration::from_secs(3600 * k);
            assert_eq!(c.blocked(now), StallVerdict::WaitUntil(now + t));
        }
    }

    #[test]
    fn a_peer_that_takes_nothing_expires_after_the_whole_timeout() {
        let t = Duration::from_secs(60);
        let s = Duration::from_secs;
        let t0 = Instant::now();
        let mut c = StallClock::new(t);
        assert_eq!(c.blocked(t0), StallVerdict::WaitUntil(t0 + t));
        // Blocking again later does not move the start of the stall.
        assert_eq!(c.blocked(t0 + s(30)), StallVerdict::WaitUntil(t0 + t));
        assert_eq!(c.blocked(t0 + s(59)), StallVerdict::WaitUntil(t0 + t));
        assert_eq!(c.blocked(t0 + t), StallVerdict::Expired);
        assert_eq!(c.blocked(t0 + s(3600)), StallVerdict::Expired);
    }

    #[test]
    fn every_accepted_byte_restarts_the_clock() {
        let t = Duration::from_secs(60);
        let s = Duration::from_secs;
        let t0 = Instant::now();
        let mut c = StallClock::new(t);
        assert_eq!(c.blocked(t0), StallVerdict::WaitUntil(t0 + t));
        c.progressed();
        // Blocked again 50 s later: a whole new timeout from then.
        assert_eq!(c.blocked(t0 + s(50)), StallVerdict::WaitUntil(t0 + s(110)));
        assert_eq!(c.blocked(t0 + s(100)), StallVerdict::WaitUntil(t0 + s(110)));
        assert_eq!(c.blocked(t0 + s(110)), StallVerdict::Expired);
    }

    #[test]
    fn a_slow_reader_of_a_large_reply_is_never_cut() {
        // The peer takes some bytes every 5 s for an hour against a 6 s timeout: the
        // transfer takes 600 timeouts, no stretch without progress takes one.
        let t = Duration::from_secs(6);
        let t0 = Instant::now();
        let mut c = StallClock::new(t);
        for k in 0..720u64 {
            let start = t0 + Duration::from_secs(5 * k);
            for after in [0u64, 1, 4, 5] {
                let now = start + Duration::from_millis(999 * after);
                assert_eq!(c.blocked(now), StallVerdict::WaitUntil(start + t));
            }
            c.progressed();
        }
    }

    #[test]
    fn a_huge_timeout_never_expires_and_never_overflows() {
        let t0 = Instant::now();
        let mut c = StallClock::new(Duration::MAX);
        for h in [0u64, 1, 1000] {
            let now = t0 + Duration::from_secs(3600 * h);
            match c.blocked(now) {
                StallVerdict::WaitUntil(at) => assert!(at > now),
                StallVerdict::Expired => panic!("a huge timeout expired"),
            }
        }
    }

    #[tokio::test]
    async fn a_blocked_write_fails_and_everything_after_it_fails_at_once() {
        use tokio::io::AsyncWriteExt;
        // An in-memory pipe whose reader never reads: the write blocks after 64 bytes.
        let (a, _b) = tokio::io::duplex(64);
        let peer: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let timeout = Duration::from_millis(50);
        let mut w = StallGuard::new(a, peer, timeout);
        let t0 = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(10), w.write_all(&[7u8; 4096]))
            .await
            .expect("the guard gives up")
            .expect_err("times out");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("127.0.0.1:9"), "{err}");
        assert!(t0.elapsed() >= timeout);
        // Gone for good: even a shutdown (which would flush) fails without waiting.
        let err = tokio::time::timeout(Duration::from_secs(10), w.shutdown())
            .await
            .expect("no second wait")
            .expect_err("still gone");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_reader_that_keeps_taking_bytes_gets_everything() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut b) = tokio::io::duplex(1024);
        let peer: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        // 128 KiB through a 1 KiB pipe, read 1 KiB every 5 ms: over 640 ms in all,
        // more than three timeouts, but never one without progress.
        let mut w = StallGuard::new(a, peer, Duration::from_millis(200));
        let data: Vec<u8> = (0..128 << 10).map(|i: u32| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await?;
            w.shutdown().await
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = b.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        writer
            .await
            .expect("join")
            .expect("the slow reader was not cut");
        assert!(got == data);
    }
}
