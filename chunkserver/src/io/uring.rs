//! The io_uring engine (io-uring 0.7).
//!
//! The ring is driven from the tokio runtime itself, with no thread of its own: a
//! caller pushes its job's SQEs and enters the kernel (`io_uring_enter`) on its own
//! thread, and the ring's file descriptor is registered with tokio's reactor
//! ([`AsyncFd`]), so a *reaper* task wakes when completions are posted, settles them
//! and wakes the callers. A completion therefore costs one wake-up (the reactor's),
//! not two (a ring thread's, then the caller's), which is most of the engine's
//! overhead on a small hsync. Completions that the kernel posts during the submitting
//! call itself (buffered writes done inline) are reaped right there.
//!
//! A job's ops are linked (`IO_LINK`): a header write followed by an fsync runs strictly
//! in that order. Large writes are marked `ASYNC`, so their copy into the page cache
//! runs on the kernel's io-wq workers instead of holding up the runtime thread that
//! submitted them. Short reads and writes are continued by resubmitting the rest of the
//! chain from the short op. The ring state owns every buffer and file handle of a job
//! until all of its completions are reaped, and dropping the engine waits for the jobs
//! still in the kernel, so a caller that stops waiting can never leave the kernel
//! writing from or into freed memory. No buffers are registered (locked memory is
//! scarce).
//!
//! The kernel ties a request to the thread that submitted it, and a thread that exits
//! cancels (or waits for) its requests. Submitting on the runtime's worker threads,
//! which live as long as the runtime, is therefore fine; a job submitted from a
//! short-lived thread could end with `ECANCELED` (an I/O error for its caller, never a
//! silent loss), which is why nothing here submits from the blocking pool.

use super::{IoEngine, IoOp};
use bytes::Bytes;
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Submission queue entries of the ring.
const RING_ENTRIES: u32 = 256;
/// SQEs in the kernel at once (the completion queue holds twice the ring entries, so
/// this can never overflow it).
const MAX_INFLIGHT: usize = 256;
/// Ops per job: the op index lives in the low 8 bits of the user data.
const MAX_CHAIN: usize = 255;
/// `SYNC_FILE_RANGE_WRITE` from `<linux/fs.h>`: start writeback, do not wait.
const SYNC_FILE_RANGE_WRITE: u32 = 2;
/// `FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE` from `<linux/falloc.h>`.
const FALLOC_PUNCH_HOLE_KEEP_SIZE: i32 = 0x01 | 0x02;
/// Largest single read or write SQE; longer transfers continue as short ones.
const MAX_XFER: usize = 1 << 30;
/// Most iovecs in one vectored write (the kernel's `UIO_MAXIOV`); the rest continue
/// as a short write.
const MAX_IOVECS: usize = 1024;
/// How soon the reaper retries a submission the kernel refused for the moment.
const SUBMIT_RETRY: std::time::Duration = std::time::Duration::from_millis(1);
/// Writes larger than this go to the kernel's workers (`IOSQE_ASYNC`) instead of being
/// copied inline on the submitting runtime thread.
const INLINE_WRITE_MAX: usize = 256 << 10;

/// Checks that a ring can be built and runs a NOP.
pub(super) fn probe() -> io::Result<()> {
    let mut ring = IoUring::new(2)?;
    let nop = opcode::Nop::new().build().user_data(7);
    // SAFETY: a NOP references no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
    ring.submit_and_wait(1)?;
    let cqe = ring
        .completion()
        .next()
        .ok_or_else(|| io::Error::other("io_uring NOP produced no completion"))?;
    if cqe.result() < 0 {
        return Err(io::Error::from_raw_os_error(-cqe.result()));
    }
    Ok(())
}

/// The io_uring engine handle; cheap to share behind an `Arc`. Must be created inside
/// a tokio runtime (its reaper task runs there) and used on that runtime.
#[derive(Debug)]
pub struct UringEngine {
    shared: Arc<Shared>,
    /// Stops the reaper task when the engine is dropped.
    stop: CancellationToken,
}

/// What the engine handle and the reaper task share.
#[derive(Debug)]
struct Shared {
    /// The ring's descriptor in tokio's reactor: readable when completions wait.
    /// Declared before `ring` so it is deregistered before the ring is closed.
    fd: AsyncFd<RingFd>,
    /// The ring, its jobs and its queues. A std mutex: held only to push, enter the
    /// kernel without waiting, and reap; never across an `.await`.
    ring: Mutex<Ring>,
    /// False once the reaper task has ended (engine dropped or its runtime shut
    /// down): new jobs are refused instead of waiting forever.
    reaping: AtomicBool,
    /// Wakes the reaper to retry a submission the kernel refused for the moment
    /// (nothing may be in flight to produce a completion that would wake it).
    retry: tokio::sync::Notify,
}

/// The ring's raw descriptor, for the reactor (the ring itself owns it).
#[derive(Debug)]
struct RingFd(RawFd);

impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl UringEngine {
    /// Probes io_uring, builds the ring and starts its reaper on the current tokio
    /// runtime.
    pub fn new() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            io::Error::other("the io_uring engine must be started inside a tokio runtime")
        })?;
        probe()?;
        let ring = IoUring::new(RING_ENTRIES)?;
        let _enter = runtime.enter();
        // SAFETY: the descriptor belongs to `ring`, which lives in the same `Shared` as
        // this registration, is never closed or replaced while it is registered, and
        // is dropped after it (field order of `Shared`).
        let fd = unsafe {
            AsyncFd::register_with_interest(RingFd(ring.as_raw_fd()), tokio::io::Interest::READABLE)
        }?;
        let shared = Arc::new(Shared {
            fd,
            ring: Mutex::new(Ring {
                ring,
                jobs: HashMap::new(),
                pending: VecDeque::new(),
                next_id: 0,
                inflight: 0,
            }),
            reaping: AtomicBool::new(true),
            retry: tokio::sync::Notify::new(),
        });
        let stop = CancellationToken::new();
        runtime.spawn(reap(shared.clone(), stop.clone()));
        Ok(Self { shared, stop })
    }

    fn submit(&self, file: Arc<File>, ops: Vec<Op>, reply: Reply) -> io::Result<()> {
        if ops.len() > MAX_CHAIN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many operations in one chain",
            ));
        }
        if !self.shared.reaping.load(Ordering::Acquire) {
            return Err(stopped());
        }
        let results = vec![None; ops.len()];
        let job = Job {
            file,
            ops,
            next: 0,
            inflight: 0,
            results,
            reply: Some(reply),
        };
        let mut ring = self.shared.lock();
        let id = ring.next_id;
        ring.next_id += 1;
        ring.jobs.insert(id, job);
        ring.pending.push_back(id);
        if ring.pump() == Pumped::Stuck {
            self.shared.retry.notify_one();
        }
        Ok(())
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding the lock cannot leave the ring half-updated in a way
        // that matters more than stopping would: keep serving.
        self.ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Reaps completions whenever the reactor says the ring has some, until stopped.
async fn reap(shared: Arc<Shared>, stop: CancellationToken) {
    /// Marks the engine as no longer reaping when this task ends for any reason,
    /// including its runtime shutting down.
    struct Reaping<'a>(&'a AtomicBool);
    impl Drop for Reaping<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }
    let _reaping = Reaping(&shared.reaping);
    let mut stuck = false;
    loop {
        let ready = tokio::select! {
            _ = stop.cancelled() => break,
            ready = shared.fd.readable() => match ready {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::error!(error = %e, "io_uring descriptor failed in the reactor");
                    break;
                }
            },
            () = shared.retry.notified() => None,
            () = tokio::time::sleep(SUBMIT_RETRY), if stuck => None,
        };
        let mut ring = shared.lock();
        stuck = ring.pump() == Pumped::Stuck;
        // Clear readiness only when nothing is left to reap; tokio keeps readiness
        // that arrived after it was observed, so no completion can be missed.
        if let Some(mut ready) = ready {
            if ring.ring.completion().is_empty() {
                ready.clear_ready();
            }
        }
    }
    tracing::debug!("io_uring reaper stopped");
    // Jobs still in the kernel are waited for when the last handle drops the ring.
}

fn stopped() -> io::Error {
    io::Error::other("the io_uring engine has stopped")
}

#[async_trait::async_trait]
impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "uring"
    }

    async fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let (tx, rx) = oneshot::channel();
        let op = Op::Read {
            offset,
            buf: vec![0u8; len],
            filled: 0,
        };
        self.submit(file, vec![op], Reply::Read(tx))?;
        rx.await.map_err(|_| stopped())?
    }

    async fn run(&self, file: Arc<File>, ops: Vec<IoOp>) -> io::Result<()> {
        let ops: Vec<Op> = ops
            .into_iter()
            .filter_map(|op| match op {
                IoOp::Write { data, .. } if data.is_empty() => None,
                IoOp::Write { offset, data } => Some(Op::Write {
                    offset,
                    data,
                    done: 0,
                }),
                IoOp::Writev { offset, bufs } => {
                    let bufs: Vec<Bytes> = bufs.into_iter().filter(|b| !b.is_empty()).collect();
                    let total = bufs.iter().map(Bytes::len).sum();
                    (total > 0).then(|| Op::Writev {
                        offset,
                        bufs,
                        total,
                        done: 0,
                        iov: Vec::new(),
                    })
                }
                IoOp::WriteBehind { len: 0, .. } => None,
                IoOp::WriteBehind { offset, len } => Some(Op::WriteBehind { offset, len }),
                IoOp::PunchHole { len: 0, .. } => None,
                IoOp::PunchHole { offset, len } => Some(Op::PunchHole { offset, len }),
                IoOp::SyncData => Some(Op::Sync { data_only: true }),
                IoOp::SyncAll => Some(Op::Sync { data_only: false }),
            })
            .collect();
        if ops.is_empty() {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        self.submit(file, ops, Reply::Run(tx))?;
        rx.await.map_err(|_| stopped())?
    }
}

/// One operation of a job, with its progress.
#[derive(Debug)]
enum Op {
    Write {
        offset: u64,
        data: Bytes,
        done: usize,
    },
    Writev {
        offset: u64,
        bufs: Vec<Bytes>,
        total: usize,
        done: usize,
        /// The iovecs of the submission in flight, pointing into `bufs`; rebuilt for
        /// each (re)submission, never touched while the kernel may read them.
        iov: Vec<IoSlice<'static>>,
    },
    Read {
        offset: u64,
        buf: Vec<u8>,
        filled: usize,
    },
    Sync {
        data_only: bool,
    },
    WriteBehind {
        offset: u64,
        len: u64,
    },
    PunchHole {
        offset: u64,
        len: u64,
    },
}

#[derive(Debug)]
enum Reply {
    Run(oneshot::Sender<io::Result<()>>),
    Read(oneshot::Sender<io::Result<Vec<u8>>>),
}

/// A chain of ops on one file, owned by the ring until all of its completions are in.
#[derive(Debug)]
struct Job {
    /// Keeps the descriptor open while SQEs reference it.
    file: Arc<File>,
    ops: Vec<Op>,
    /// First op not yet completed in full.
    next: usize,
    /// SQEs of this job currently in the kernel.
    inflight: usize,
    /// Completion results of the current submission, by op index.
    results: Vec<Option<i32>>,
    /// Where the outcome goes (a oneshot to the waiting caller); taken when replying.
    reply: Option<Reply>,
}

impl Job {
    /// SQEs for `ops[next..]`, linked in order.
    fn entries(&mut self, id: u64) -> Vec<squeue::Entry> {
        let fd = types::Fd(self.file.as_raw_fd());
        let last = self.ops.len() - 1;
        let next = self.next;
        self.ops[next..]
            .iter_mut()
            .enumerate()
            .map(|(k, op)| {
                let i = next + k;
                let mut large = false;
                let entry = match op {
                    Op::Write { offset, data, done } => {
                        let rest = &data[*done..];
                        large = rest.len() > INLINE_WRITE_MAX;
                        opcode::Write::new(fd, rest.as_ptr(), rest.len().min(MAX_XFER) as u32)
                            .offset(*offset + *done as u64)
                            .build()
                    }
                    Op::Writev {
                        offset,
                        bufs,
                        done,
                        iov,
                        total,
                    } => {
                        large = *total - *done > INLINE_WRITE_MAX;
                        iov.clear();
                        let mut skip = *done;
                        for b in bufs.iter() {
                            if iov.len() == MAX_IOVECS {
                                break;
                            }
                            if skip >= b.len() {
                                skip -= b.len();
                                continue;
                            }
                            let rest = &b[skip..];
                            skip = 0;
                            // SAFETY: the slice points into a `Bytes` owned by this op,
                            // which the job keeps alive and unmodified until every
                            // completion of this submission is reaped; the `'static`
                            // slice never leaves the op and is cleared before the next
                            // submission.
                            let rest: &'static [u8] =
                                unsafe { std::slice::from_raw_parts(rest.as_ptr(), rest.len()) };
                            iov.push(IoSlice::new(rest));
                        }
                        // `IoSlice` is ABI compatible with `struct iovec` on Unix.
                        opcode::Writev::new(fd, iov.as_ptr().cast(), iov.len() as u32)
                            .offset(*offset + *done as u64)
                            .build()
                    }
                    Op::Read {
                        offset,
                        buf,
                        filled,
                    } => {
                        let at = *offset + *filled as u64;
                        let rest = &mut buf[*filled..];
                        opcode::Read::new(fd, rest.as_mut_ptr(), rest.len().min(MAX_XFER) as u32)
                            .offset(at)
                            .build()
                    }
                    Op::WriteBehind { offset, len } => {
                        opcode::SyncFileRange::new(fd, (*len).min(u64::from(u32::MAX)) as u32)
                            .offset(*offset)
                            .flags(SYNC_FILE_RANGE_WRITE)
                            .build()
                    }
                    Op::PunchHole { offset, len } => opcode::Fallocate::new(fd, *len)
                        .offset(*offset)
                        .mode(FALLOC_PUNCH_HOLE_KEEP_SIZE)
                        .build(),
                    Op::Sync { data_only } => {
                        let flags = if *data_only {
                            types::FsyncFlags::DATASYNC
                        } else {
                            types::FsyncFlags::empty()
                        };
                        opcode::Fsync::new(fd).flags(flags).build()
                    }
                };
                let mut entry = entry.user_data((id << 8) | i as u64);
                if large {
                    entry = entry.flags(squeue::Flags::ASYNC);
                }
                if i < last {
                    entry.flags(squeue::Flags::IO_LINK)
                } else {
                    entry
                }
            })
            .collect()
    }

    /// Applies the results of a finished submission: `Some(result)` when the job is
    /// done, `None` when the rest of the chain must be resubmitted (a short transfer).
    fn settle(&mut self) -> Option<io::Result<()>> {
        let from = self.next;
        let mut outcome = Some(Ok(()));
        for i in from..self.ops.len() {
            let res = self.results[i].take().unwrap_or(-libc_ecanceled());
            if res < 0 {
                outcome = Some(Err(io::Error::from_raw_os_error(-res)));
                break;
            }
            let n = res as usize;
            match &mut self.ops[i] {
                Op::Write { data, done, .. } => {
                    *done += n;
                    if *done < data.len() {
                        if n == 0 {
                            outcome = Some(Err(io::ErrorKind::WriteZero.into()));
                        } else {
                            self.next = i;
                            outcome = None;
                        }
                        break;
                    }
                }
                Op::Writev {
                    total, done, iov, ..
                } => {
                    iov.clear();
                    *done += n;
                    if *done < *total {
                        if n == 0 {
                            outcome = Some(Err(io::ErrorKind::WriteZero.into()));
                        } else {
                            self.next = i;
                            outcome = None;
                        }
                        break;
                    }
                }
                Op::Read { buf, filled, .. } => {
                    *filled += n;
                    if n == 0 {
                        buf.truncate(*filled);
                    } else if *filled < buf.len() {
                        self.next = i;
                        outcome = None;
                        break;
                    }
                }
                Op::Sync { .. } | Op::WriteBehind { .. } | Op::PunchHole { .. } => {}
            }
        }
        for r in &mut self.results {
            *r = None;
        }
        outcome
    }

    fn reply(mut self, result: io::Result<()>) {
        match self.reply.take() {
            Some(Reply::Run(tx)) => {
                let _ = tx.send(result);
            }
            Some(Reply::Read(tx)) => {
                let out = result.map(|()| match self.ops.pop() {
                    Some(Op::Read {
                        mut buf, filled, ..
                    }) => {
                        buf.truncate(filled);
                        buf
                    }
                    _ => Vec::new(),
                });
                let _ = tx.send(out);
            }
            None => {}
        }
    }
}

fn libc_ecanceled() -> i32 {
    rustix::io::Errno::CANCELED.raw_os_error()
}

/// What [`Ring::pump`] left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pumped {
    /// Everything queued went to the kernel.
    Done,
    /// The kernel refused the submission for now; entries wait in the queue.
    Stuck,
}

/// The ring and the jobs it owns.
struct Ring {
    ring: IoUring,
    /// Jobs in the kernel or waiting for room, by id.
    jobs: HashMap<u64, Job>,
    /// Jobs (ids) waiting to be pushed, oldest first.
    pending: VecDeque<u64>,
    next_id: u64,
    /// SQEs in the kernel.
    inflight: usize,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("jobs", &self.jobs.len())
            .field("pending", &self.pending.len())
            .field("inflight", &self.inflight)
            .finish()
    }
}

impl Ring {
    /// Pushes what is waiting, enters the kernel without waiting, and settles every
    /// completion that is there; repeats while settling made more work (a short
    /// transfer's continuation) that can be submitted. `Stuck` when the kernel refused
    /// the submission and entries are left in the queue: the caller must make sure it
    /// is retried, since no completion may come to trigger that.
    fn pump(&mut self) -> Pumped {
        loop {
            self.push_pending();
            let mut outcome = Pumped::Done;
            if let Err(e) = self.ring.submit() {
                let code = e.raw_os_error();
                let transient = code == Some(rustix::io::Errno::INTR.raw_os_error())
                    || code == Some(rustix::io::Errno::BUSY.raw_os_error())
                    || code == Some(rustix::io::Errno::AGAIN.raw_os_error());
                if !transient {
                    tracing::error!(error = %e, "io_uring submit failed; retrying");
                }
                if !self.ring.submission().is_empty() {
                    outcome = Pumped::Stuck;
                }
            }
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            if done.is_empty() {
                return outcome;
            }
            for (user_data, result) in done {
                self.complete(user_data, result);
            }
            if self.pending.is_empty() {
                return outcome;
            }
        }
    }

    /// Pushes waiting jobs while there is room in flight.
    fn push_pending(&mut self) {
        while let Some(&id) = self.pending.front() {
            let Some(job) = self.jobs.get_mut(&id) else {
                self.pending.pop_front();
                continue;
            };
            let n = job.ops.len() - job.next;
            if self.inflight > 0 && self.inflight + n > MAX_INFLIGHT {
                break;
            }
            let entries = job.entries(id);
            {
                let sq = self.ring.submission();
                let room = sq.capacity() - sq.len();
                drop(sq);
                if room < n {
                    let _ = self.ring.submit();
                }
            }
            // SAFETY: every buffer and descriptor these entries point to is owned by the
            // job, which stays in `self.jobs` (heap buffers do not move when the map
            // does) until all of its completions have been reaped in `complete`.
            if unsafe { self.ring.submission().push_multiple(&entries) }.is_err() {
                // The queue is still full: try again after the next submit.
                break;
            }
            job.inflight = n;
            self.inflight += n;
            self.pending.pop_front();
        }
        self.publish_depths();
    }

    /// The queue depths, for the metrics (`counters.rs`).
    fn publish_depths(&self) {
        use crate::counters::{set, IO_IN_FLIGHT, IO_WAITING};
        set(&IO_IN_FLIGHT, self.inflight as u64);
        set(&IO_WAITING, self.pending.len() as u64);
    }

    fn complete(&mut self, user_data: u64, result: i32) {
        let id = user_data >> 8;
        let idx = (user_data & 0xff) as usize;
        let Some(job) = self.jobs.get_mut(&id) else {
            tracing::error!(user_data, "io_uring completion for an unknown job");
            return;
        };
        if let Some(slot) = job.results.get_mut(idx) {
            *slot = Some(result);
        }
        job.inflight = job.inflight.saturating_sub(1);
        let job_done = job.inflight == 0;
        self.inflight = self.inflight.saturating_sub(1);
        self.publish_depths();
        if !job_done {
            return;
        }
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        match job.settle() {
            None => self.pending.push_back(id),
            Some(outcome) => {
                if let Some(job) = self.jobs.remove(&id) {
                    job.reply(outcome);
                }
            }
        }
    }
}

impl Drop for Ring {
    /// Waits for every job still in the kernel: their buffers must outlive the kernel's
    /// use of them.
    fn drop(&mut self) {
        self.pending.clear();
        while self.inflight > 0 {
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.raw_os_error() != Some(rustix::io::Errno::INTR.raw_os_error()) {
                    tracing::error!(error = %e, jobs = self.jobs.len(), "cannot wait for io_uring jobs at shutdown");
                    // Leak the jobs rather than free memory the kernel may still use.
                    std::mem::forget(std::mem::take(&mut self.jobs));
                    return;
                }
            }
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (user_data, result) in done {
                self.complete(user_data, result);
            }
            self.pending.clear();
        }
    }
}
