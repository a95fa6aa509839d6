//! The append side of the operation log: group commit led by the requests themselves.
//!
//! Mutations queue their encoded records under the master's state lock
//! ([`Oplog::append`], which never touches the disk). A request that must wait for its
//! record ([`Oplog::wait_durable`]) first tries to take the segment. If nobody is
//! writing, it becomes the **leader**: it takes everything queued, writes it, calls
//! `fdatasync` once, lets the segment go and publishes the new durable LSN. A request
//! that finds a leader at work waits for that publication and tries again; the first
//! one to wake leads the batch queued meanwhile. Concurrent mutations so still share
//! one `fdatasync` per batch, and a lone one writes its own record on its own thread:
//! no hand-off to a writer thread and back, two wake-ups of sleeping threads that cost
//! more than the `fdatasync` itself on a virtual machine.
//!
//! The leader blocks its runtime worker for the write (and, when its batch rotates,
//! for sealing one segment and creating the next). Only one task writes at a time
//! (the segment's mutex), so on the master's multi-thread runtime the other workers
//! keep serving; on a current-thread runtime (unit tests) everything waits for it.
//!
//! A record no request waits for (its task was dropped) is written by the **sweeper**
//! thread once it has been queued for [`SWEEP_AFTER`]; the sweeper sleeps without a
//! deadline only after the queue has stayed empty for a while, so a steady stream of
//! requests does not wake it once per record.
//!
//! **Ordering.** Records are taken from the queue only by whoever holds the segment, and
//! a batch is durable before the segment is let go, so a published LSN covers every
//! record before it. A failed write closes the segment and publishes the failure
//! before letting it go: no later batch is written or published after a lost one.

use super::zeros::ZeroAhead;
use super::{encode_record, lock, segment_name};
use super::{Error, Result, SEGMENT_MAGIC};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a record may stay queued before the sweeper writes it.
pub const SWEEP_AFTER: Duration = Duration::from_millis(5);
/// Empty looks (one per [`SWEEP_AFTER`]) before the sweeper sleeps without a deadline.
const SWEEPS_BEFORE_PARKING: u32 = 20;

/// The highest durable LSN, or why the log stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    pub lsn: u64,
    pub failed: Option<String>,
    /// The first LSN of the segment being appended to (moves at each rotation).
    pub segment: u64,
}

/// Counters about the log writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// `fdatasync` calls on segments.
    pub fsyncs: u64,
    /// Records written.
    pub records: u64,
    /// Bytes written since the last rotation.
    pub bytes_since_rotate: u64,
    /// Batches written by the sweeper (records nobody waited for).
    pub swept: u64,
}

enum Item {
    Record { lsn: u64, bytes: Vec<u8> },
    Rotate { next_lsn: u64 },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Write everything queued, then stop.
    Drain,
    /// Stop now, dropping what is queued (a simulated crash).
    Halt,
}

#[derive(Default)]
struct Queue {
    /// Records and rotations not yet written, in LSN order.
    items: Vec<Item>,
    /// When the oldest of `items` was queued.
    oldest: Option<Instant>,
    stop: Option<Stop>,
    last_queued: u64,
    /// The sweeper sleeps without a deadline: the next append wakes it.
    sweeper_parked: bool,
}

impl Queue {
    fn take(&mut self) -> Vec<Item> {
        self.oldest = None;
        std::mem::take(&mut self.items)
    }

    fn push(&mut self, item: Item) {
        self.oldest.get_or_insert_with(Instant::now);
        self.items.push(item);
    }
}

/// What a batch wrote: its last record, and the segment it rotated to.
#[derive(Clone, Copy, Debug, Default)]
struct Written {
    lsn: Option<u64>,
    segment: Option<u64>,
}

impl Written {
    fn publish(self, d: &mut Durable) {
        if let Some(lsn) = self.lsn {
            d.lsn = d.lsn.max(lsn);
        }
        if let Some(first) = self.segment {
            d.segment = d.segment.max(first);
        }
    }
}

/// What [`Shared::lead`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Led {
    /// Wrote a batch (or failed to, and published the failure).
    Wrote,
    /// Held the segment but found nothing to write, or the log is stopped.
    Nothing,
    /// Someone else holds the segment.
    Busy,
}

struct Shared {
    dir: PathBuf,
    queue: Mutex<Queue>,
    /// Wakes the sweeper (a parked one on append, any on stop).
    wake: Condvar,
    /// The segment being appended to; `None` once the log is closed, halted or failed.
    /// Whoever holds this lock is the only writer.
    segment: Mutex<Option<Segment>>,
    /// The highest durable LSN; waiters watch it.
    durable: watch::Sender<Durable>,
    fsyncs: AtomicU64,
    records: AtomicU64,
    bytes_since_rotate: AtomicU64,
    swept: AtomicU64,
    timings: super::LogTimings,
}

/// The append side of the operation log, with group commit.
pub struct Oplog {
    shared: Arc<Shared>,
    /// The sweeper thread; taken and joined when the log stops.
    sweeper: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Oplog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oplog")
            .field("dir", &self.shared.dir)
            .field("durable", &*self.shared.durable.borrow())
            .finish_non_exhaustive()
    }
}

/// The segment being appended to.
type Segment = ZeroAhead;

/// Creates segment `first_lsn`: the magic and [`PREALLOC`](super::PREALLOC) zeros,
/// durable, and the directory entry too.
fn create_segment(dir: &Path, first_lsn: u64) -> Result<Segment> {
    ZeroAhead::create(dir, dir.join(segment_name(first_lsn)), SEGMENT_MAGIC)
}

impl Oplog {
    /// Opens the log for appending after replay: a new segment whose first record will
    /// be `next_lsn`.
    pub fn open(dir: &Path, next_lsn: u64) -> Result<Self> {
        let next_lsn = next_lsn.max(1);
        let segment = create_segment(dir, next_lsn)?;
        let (durable, _) = watch::channel(Durable {
            lsn: next_lsn - 1,
            failed: None,
            segment: next_lsn,
        });
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            queue: Mutex::new(Queue {
                last_queued: next_lsn - 1,
                ..Default::default()
            }),
            wake: Condvar::new(),
            segment: Mutex::new(Some(segment)),
            durable,
            fsyncs: AtomicU64::new(0),
            records: AtomicU64::new(0),
            bytes_since_rotate: AtomicU64::new(0),
            swept: AtomicU64::new(0),
            timings: super::LogTimings::default(),
        });
        let s = shared.clone();
        let sweeper = std::thread::Builder::new()
            .name("stampfs-oplog".into())
            .spawn(move || sweeper(&s))
            .map_err(|e| Error::io("spawn the log sweeper thread", e))?;
        Ok(Self {
            shared,
            sweeper: Mutex::new(Some(sweeper)),
        })
    }

    /// Queues record `lsn` (which must follow the previous one). Never blocks on disk;
    /// call [`Oplog::wait_durable`] before acknowledging.
    pub fn append(&self, lsn: u64, payload: &[u8]) -> Result<()> {
        let bytes = encode_record(lsn, payload)?;
        let mut q = lock(&self.shared.queue);
        if q.stop.is_some() {
            return Err(Error::ShuttingDown);
        }
        if let Some(reason) = &self.shared.durable.borrow().failed {
            return Err(Error::LogFailed {
                reason: reason.clone(),
            });
        }
        if lsn != q.last_queued + 1 {
            return Err(Error::Codec {
                reason: format!("log record {lsn} appended after {}", q.last_queued),
            });
        }
        q.last_queued = lsn;
        q.push(Item::Record { lsn, bytes });
        let wake = q.sweeper_parked;
        drop(q);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Starts a new segment for the records from `next_lsn` on (which must be the next
    /// LSN to be appended): the step before a checkpoint up to `next_lsn - 1`. Takes
    /// effect with the next batch; wait for `next_lsn - 1` to be durable.
    pub fn rotate(&self, next_lsn: u64) -> Result<()> {
        let mut q = lock(&self.shared.queue);
        if q.stop.is_some() {
            return Err(Error::ShuttingDown);
        }
        if next_lsn != q.last_queued + 1 {
            return Err(Error::Codec {
                reason: format!("rotation at {next_lsn} after record {}", q.last_queued),
            });
        }
        q.push(Item::Rotate { next_lsn });
        let wake = q.sweeper_parked;
        drop(q);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Waits until record `lsn` (and all before it) is on disk, writing the queued
    /// records itself when nobody else is (see the module doc).
    pub async fn wait_durable(&self, lsn: u64) -> Result<()> {
        self.wait_until(|d| d.lsn >= lsn).await
    }

    /// Waits until the rotation to `next_lsn` ([`Oplog::rotate`]) is done: the
    /// segment before it sealed, the new one created. A checkpoint waits for it before
    /// it reads the sealed segments and trims them.
    pub async fn wait_rotated(&self, next_lsn: u64) -> Result<()> {
        self.wait_until(|d| d.segment >= next_lsn).await
    }

    async fn wait_until(&self, done: impl Fn(&Durable) -> bool) -> Result<()> {
        let mut rx = self.shared.durable.subscribe();
        loop {
            {
                let d = rx.borrow_and_update();
                if done(&d) {
                    return Ok(());
                }
                if let Some(reason) = &d.failed {
                    return Err(Error::LogFailed {
                        reason: reason.clone(),
                    });
                }
            }
            // Marked seen before trying: a leader busy now publishes after it lets the
            // segment go, and that wakes `changed` below.
            if self.shared.lead(false, false) != Led::Wrote && rx.changed().await.is_err() {
                return Err(Error::LogFailed {
                    reason: "the operation log is gone".into(),
                });
            }
        }
    }

    /// The highest durable LSN.
    pub fn durable_lsn(&self) -> u64 {
        self.shared.durable.borrow().lsn
    }

    /// Why the log stopped, if it did.
    pub fn failure(&self) -> Option<String> {
        self.shared.durable.borrow().failed.clone()
    }

    pub fn stats(&self) -> LogStats {
        let s = &self.shared;
        LogStats {
            fsyncs: s.fsyncs.load(Ordering::Relaxed),
            records: s.records.load(Ordering::Relaxed),
            bytes_since_rotate: s.bytes_since_rotate.load(Ordering::Relaxed),
            swept: s.swept.load(Ordering::Relaxed),
        }
    }

    /// The histograms of its durable writes (shared).
    pub fn timings(&self) -> super::LogTimings {
        self.shared.timings.clone()
    }

    /// Refuses further appends, stops the sweeper and, under the segment (after any
    /// batch being written), ends the log: `Drain` writes what is queued and cuts the
    /// zeros, `Halt` drops it.
    fn stop(&self, how: Stop) {
        // The first stop asked for is the one carried out (a halt that raced a close
        // still drops what was queued).
        let how = *lock(&self.shared.queue).stop.get_or_insert(how);
        self.shared.wake.notify_all();
        if let Some(t) = lock(&self.sweeper).take() {
            if t.join().is_err() {
                tracing::error!("the log sweeper thread panicked");
            }
        }
        let s = &self.shared;
        let Some(mut seg) = s.segment_guard(true) else {
            return;
        };
        let Some(mut segment) = seg.take() else {
            return;
        };
        if how == Stop::Halt {
            s.fail("the operation log was halted".into());
            return;
        }
        let items = lock(&s.queue).take();
        match s.write_batch(&mut segment, items) {
            Ok(written) => {
                s.durable.send_modify(|d| written.publish(d));
                if let Err(e) = segment.seal() {
                    tracing::warn!(error = %e, "cutting the log's preallocated zeros at close failed; the next start cuts them");
                }
                s.fail(CLOSED.into());
            }
            Err(e) => {
                tracing::error!(error = %e, "writing the operation log at close failed");
                s.fail(e.to_string());
            }
        }
    }

    /// Writes and fsyncs everything queued, then stops the log (blocking).
    pub fn close(&self) -> Result<()> {
        self.stop(Stop::Drain);
        let d = self.shared.durable.borrow().clone();
        match d.failed {
            Some(reason) if reason != CLOSED => Err(Error::LogFailed { reason }),
            _ => Ok(()),
        }
    }

    /// Stops the log at once, dropping queued records (what a crash does).
    pub fn halt(&self) {
        self.stop(Stop::Halt);
    }
}

impl Drop for Oplog {
    fn drop(&mut self) {
        self.halt();
    }
}

const CLOSED: &str = "the operation log is closed";

impl Shared {
    /// Publishes why the log stopped; waiters fail with it.
    fn fail(&self, reason: String) {
        self.durable.send_modify(|d| {
            d.failed.get_or_insert(reason);
        });
    }

    /// The segment, locked (`wait`: blocking until it is free). `None` when it is
    /// busy, or poisoned: a writer panicked with a batch taken from the queue and
    /// perhaps half written, so the log is failed (nothing after that batch may ever
    /// be published).
    fn segment_guard(&self, wait: bool) -> Option<MutexGuard<'_, Option<Segment>>> {
        let poisoned = match self.segment.try_lock() {
            Ok(g) => return Some(g),
            Err(TryLockError::WouldBlock) if !wait => return None,
            Err(TryLockError::WouldBlock) => match self.segment.lock() {
                Ok(g) => return Some(g),
                Err(p) => p,
            },
            Err(TryLockError::Poisoned(p)) => p,
        };
        let mut g = poisoned.into_inner();
        if g.take().is_some() {
            tracing::error!(
                "a log writer panicked in the middle of a batch; refusing further mutations"
            );
            self.fail("a log writer panicked in the middle of a batch".into());
        }
        self.segment.clear_poison();
        Some(g)
    }

    /// Writes everything queued as one batch if the segment is free (`wait`: once it
    /// is). A failure is published before the segment is let go. `sweeper`: counted
    /// as a sweep.
    fn lead(&self, wait: bool, sweeper: bool) -> Led {
        let Some(mut seg) = self.segment_guard(wait) else {
            return Led::Busy;
        };
        let Some(segment) = seg.as_mut() else {
            // Closed, halted or failed: what is queued can never be written.
            drop(lock(&self.queue).take());
            return Led::Nothing;
        };
        let items = {
            let mut q = lock(&self.queue);
            if q.stop == Some(Stop::Halt) {
                return Led::Nothing;
            }
            q.take()
        };
        if items.is_empty() {
            drop(seg);
            // A task may have found the segment busy while this one held it for
            // nothing, and be waiting for a change: its records are queued now, and
            // nobody else would wake it before the sweeper.
            if !lock(&self.queue).items.is_empty() {
                self.durable.send_modify(|_| {});
            }
            return Led::Nothing;
        }
        match self.write_batch(segment, items) {
            Ok(written) => {
                drop(seg);
                if sweeper {
                    self.swept.fetch_add(1, Ordering::Relaxed);
                }
                // Always published, even for a rotation alone: a task that found the
                // segment busy waits for a change.
                self.durable.send_modify(|d| written.publish(d));
            }
            Err(e) => {
                tracing::error!(error = %e, "writing the operation log failed; refusing further mutations");
                *seg = None;
                self.fail(e.to_string());
            }
        }
        Led::Wrote
    }

    /// Writes `items` to the segment (rotating where they say), each run of records
    /// with one `fdatasync`. Returns what to publish.
    fn write_batch(&self, segment: &mut Segment, items: Vec<Item>) -> Result<Written> {
        let mut buf = Vec::new();
        let mut pending: Option<u64> = None;
        let mut written: Option<u64> = None;
        let mut rotated: Option<u64> = None;
        let mut count = 0u64;
        let flush = |segment: &mut Segment, buf: &mut Vec<u8>, count: &mut u64| -> Result<()> {
            if *count == 0 {
                return Ok(());
            }
            let started = Instant::now();
            segment.write_durably(buf)?;
            self.timings.observe(*count, started.elapsed());
            self.fsyncs.fetch_add(1, Ordering::Relaxed);
            self.records.fetch_add(*count, Ordering::Relaxed);
            self.bytes_since_rotate
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
            buf.clear();
            *count = 0;
            Ok(())
        };
        for item in items {
            match item {
                Item::Record { lsn, bytes } => {
                    buf.extend_from_slice(&bytes);
                    pending = Some(lsn);
                    count += 1;
                }
                Item::Rotate { next_lsn } => {
                    flush(segment, &mut buf, &mut count)?;
                    written = pending.or(written);
                    // Sealed before the next segment exists: only the newest segment
                    // may end in zeros.
                    segment.seal()?;
                    *segment = create_segment(&self.dir, next_lsn)?;
                    rotated = Some(next_lsn);
                    self.bytes_since_rotate.store(0, Ordering::Relaxed);
                }
            }
        }
        flush(segment, &mut buf, &mut count)?;
        Ok(Written {
            lsn: pending.or(written),
            segment: rotated,
        })
    }
}

/// The sweeper thread: writes records that stayed queued for [`SWEEP_AFTER`].
fn sweeper(shared: &Shared) {
    let mut q = lock(&shared.queue);
    let mut empty_looks = 0u32;
    loop {
        if q.stop.is_some() {
            return;
        }
        match q.oldest {
            None if empty_looks >= SWEEPS_BEFORE_PARKING => {
                q.sweeper_parked = true;
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                q.sweeper_parked = false;
                empty_looks = 0;
            }
            None => {
                empty_looks += 1;
                q = wait_for(shared, q, SWEEP_AFTER);
            }
            Some(t) if t.elapsed() < SWEEP_AFTER => {
                empty_looks = 0;
                let left = SWEEP_AFTER.saturating_sub(t.elapsed());
                q = wait_for(shared, q, left);
            }
            Some(_) => {
                drop(q);
                shared.lead(true, true);
                q = lock(&shared.queue);
            }
        }
    }
}

fn wait_for<'a>(shared: &Shared, q: MutexGuard<'a, Queue>, d: Duration) -> MutexGuard<'a, Queue> {
    match shared.wake.wait_timeout(q, d) {
        Ok((q, _)) => q,
        Err(e) => e.into_inner().0,
    }
}
