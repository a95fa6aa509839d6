//! The io_uring engine (io-uring 0.7).
//!
//! One dedicated thread owns the ring. Async callers send [`Job`]s through a bounded
//! channel and poke an eventfd; the thread keeps a read armed on that eventfd, so a
//! single `submit_and_wait(1)` sleeps until either a completion or a new job arrives.
//! Every loop it drains all queued jobs and pushes them as one batch of SQEs before
//! entering the kernel once. A job's ops are linked (`IO_LINK`): a header write followed
//! by an fsync runs strictly in that order. Results go back through oneshot channels.
//!
//! Short reads and writes are continued by resubmitting the rest of the chain from the
//! short op. The thread owns every buffer and file handle of a job until all of its
//! completions are reaped, so a caller that stops waiting can never leave the kernel
//! writing into freed memory. No buffers are registered (locked memory is scarce).

use super::{IoEngine, IoOp};
use bytes::Bytes;
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Submission queue entries of the ring.
const RING_ENTRIES: u32 = 256;
/// SQEs in the kernel at once (the completion queue holds twice the ring entries, so
/// this plus the eventfd read can never overflow it).
const MAX_INFLIGHT: usize = 256;
/// Jobs queued for the ring thread before callers wait.
const QUEUE_DEPTH: usize = 1024;
/// Ops per job: the op index lives in the low 8 bits of the user data.
const MAX_CHAIN: usize = 255;
/// `SYNC_FILE_RANGE_WRITE` from `<linux/fs.h>`: start writeback, do not wait.
const SYNC_FILE_RANGE_WRITE: u32 = 2;
/// User data of the eventfd read.
const WAKE: u64 = u64::MAX;
/// Largest single read or write SQE; longer transfers continue as short ones.
const MAX_XFER: usize = 1 << 30;
/// Most iovecs in one vectored write (the kernel's `UIO_MAXIOV`); the rest continue
/// as a short write.
const MAX_IOVECS: usize = 1024;

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

/// The io_uring engine handle; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct UringEngine {
    /// Jobs for the ring thread; bounded so callers wait when the ring is saturated.
    /// Dropped (with a wake-up) when the engine is dropped, which ends the thread.
    tx: Option<mpsc::Sender<Job>>,
    /// The eventfd the ring thread keeps a read armed on; writing it wakes the thread.
    wake: Arc<File>,
}

impl UringEngine {
    /// Probes io_uring, builds the ring and starts its thread.
    pub fn new() -> io::Result<Self> {
        probe()?;
        let ring = IoUring::new(RING_ENTRIES)?;
        let wake = Arc::new(File::from(rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC,
        )?));
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let thread = RingThread {
            ring,
            rx,
            wake: wake.clone(),
            jobs: HashMap::new(),
            pending: VecDeque::new(),
            next_id: 0,
            inflight: 0,
        };
        std::thread::Builder::new()
            .name("stampfs-uring".into())
            .spawn(move || thread.run())?;
        Ok(Self { tx: Some(tx), wake })
    }

    fn signal(&self) {
        // An eventfd write only fails if the counter would overflow, which a wake-up
        // that is already pending makes harmless.
        let _ = (&*self.wake).write(&1u64.to_ne_bytes());
    }

    async fn submit(&self, file: Arc<File>, ops: Vec<Op>, reply: Reply) -> io::Result<()> {
        let tx = self.tx.as_ref().ok_or_else(closed)?;
        if ops.len() > MAX_CHAIN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many operations in one chain",
            ));
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
        tx.send(job).await.map_err(|_| closed())?;
        self.signal();
        Ok(())
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.tx.take();
        self.signal();
    }
}

fn closed() -> io::Error {
    io::Error::other("the io_uring thread has stopped")
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
        self.submit(file, vec![op], Reply::Read(tx)).await?;
        rx.await.map_err(|_| closed())?
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
                IoOp::SyncData => Some(Op::Sync { data_only: true }),
                IoOp::SyncAll => Some(Op::Sync { data_only: false }),
            })
            .collect();
        if ops.is_empty() {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        self.submit(file, ops, Reply::Run(tx)).await?;
        rx.await.map_err(|_| closed())?
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
}

#[derive(Debug)]
enum Reply {
    Run(oneshot::Sender<io::Result<()>>),
    Read(oneshot::Sender<io::Result<Vec<u8>>>),
}

/// A chain of ops on one file, owned by the ring thread until it completes.
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
                let entry = match op {
                    Op::Write { offset, data, done } => {
                        let rest = &data[*done..];
                        opcode::Write::new(fd, rest.as_ptr(), rest.len().min(MAX_XFER) as u32)
                            .offset(*offset + *done as u64)
                            .build()
                    }
                    Op::Writev {
                        offset,
                        bufs,
                        done,
                        iov,
                        ..
                    } => {
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
                    Op::Sync { data_only } => {
                        let flags = if *data_only {
                            types::FsyncFlags::DATASYNC
                        } else {
                            types::FsyncFlags::empty()
                        };
                        opcode::Fsync::new(fd).flags(flags).build()
                    }
                };
                let entry = entry.user_data((id << 8) | i as u64);
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
                Op::Sync { .. } | Op::WriteBehind { .. } => {}
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

/// The thread that owns the ring.
struct RingThread {
    ring: IoUring,
    /// Jobs from async callers; closed when the engine is dropped.
    rx: mpsc::Receiver<Job>,
    /// The eventfd callers write to wake this thread.
    wake: Arc<File>,
    /// Jobs in the kernel or waiting for room, by id.
    jobs: HashMap<u64, Job>,
    /// Jobs (ids) waiting to be pushed, oldest first.
    pending: VecDeque<u64>,
    next_id: u64,
    /// SQEs in the kernel (eventfd read excluded).
    inflight: usize,
}

impl RingThread {
    fn run(mut self) {
        // The eventfd read lands here; it lives until the loop has reaped that read.
        let mut wake_buf = Box::new([0u8; 8]);
        let mut wake_armed = self.arm_wake(&mut wake_buf);
        let mut closed = false;
        let mut self_signalled = false;
        loop {
            if !wake_armed && !closed {
                wake_armed = self.arm_wake(&mut wake_buf);
            }
            if !closed {
                loop {
                    match self.rx.try_recv() {
                        Ok(job) => {
                            let id = self.next_id;
                            self.next_id += 1;
                            self.jobs.insert(id, job);
                            self.pending.push_back(id);
                        }
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                }
            }
            self.push_pending();
            if closed && self.jobs.is_empty() {
                if !wake_armed {
                    break;
                }
                if !self_signalled {
                    // Complete our own eventfd read so nothing is left in the kernel.
                    let _ = (&*self.wake).write(&1u64.to_ne_bytes());
                    self_signalled = true;
                }
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                let code = e.raw_os_error();
                match code {
                    Some(c)
                        if c == rustix::io::Errno::INTR.raw_os_error()
                            || c == rustix::io::Errno::BUSY.raw_os_error() => {} // reap and go on
                    _ => {
                        tracing::error!(error = %e, "io_uring submit failed; retrying");
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
            }
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (user_data, result) in done {
                if user_data == WAKE {
                    wake_armed = false;
                    if !closed {
                        wake_armed = self.arm_wake(&mut wake_buf);
                    }
                } else {
                    self.complete(user_data, result);
                }
            }
        }
        tracing::debug!("io_uring thread stopped");
    }

    /// Arms a read on the eventfd; false if it could not be queued.
    fn arm_wake(&mut self, buf: &mut [u8; 8]) -> bool {
        let entry = opcode::Read::new(types::Fd(self.wake.as_raw_fd()), buf.as_mut_ptr(), 8)
            .build()
            .user_data(WAKE);
        for _ in 0..2 {
            // SAFETY: `buf` is the boxed buffer owned by `run`, which does not return (or
            // free it) before this read's completion has been reaped; the eventfd is kept
            // open by `self.wake`.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return true;
            }
            let _ = self.ring.submit();
        }
        tracing::error!("cannot arm the io_uring wake-up read");
        false
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
        self.inflight = self.inflight.saturating_sub(1);
        if job.inflight > 0 {
            return;
        }
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
