//! The operation log and checkpoints: how the master's metadata survives a crash.
//!
//! ```text
//! DIR/oplog.<first lsn, 20 digits>   segment := magic "STMPLOG1" | record*
//! record  := len:u32be | crc:u32be | lsn:u64be | payload[len - 8]
//! crc     := crc32(lsn | payload)
//! DIR/checkpoint := magic "STMPCKP1" | lsn:u64be | len:u64be | crc:u32be | payload[len]
//! ```
//!
//! Records are numbered by a log sequence number (LSN), contiguous from 1. A single
//! writer thread drains the queue of pending records, writes them, calls `fdatasync`
//! once and then publishes the highest durable LSN: **group commit**, concurrent
//! mutations share one fsync, and each waits ([`Oplog::wait_durable`]) before it is
//! acknowledged.
//!
//! **Records overwrite zeros.** An `fdatasync` that grows a file must also commit the
//! new size (a journal commit on ext4); one that overwrites blocks already allocated
//! and written does not, and costs about half as much on this kind of disk (`stampfs
//! bench mount-metadata` measures both). A single-threaded client gets no batching, so
//! that is the cost of every namespace mutation it waits for. Segments are therefore
//! written ahead with zeros ([`PREALLOC`] at a time, synced) and records are written
//! over them: only the padding itself, once per [`PREALLOC`] of log, changes the size.
//! Replay reads a zero record header as the end of the written log
//! ([`ReplayStats::preallocated_bytes`]) and cuts the zeros of the newest segment
//! away, as it cuts a torn tail; a rotation and a clean close cut them too, so only
//! the newest segment of a crashed master ever has them.
//!
//! A checkpoint holds the whole state up to an LSN. It is written to a temp file,
//! fsynced, renamed over `DIR/checkpoint`, and the directory is fsynced. Before the
//! state is captured the log is rotated to a new segment starting at LSN+1
//! ([`Oplog::rotate`]), so once the checkpoint is durable every older segment can be
//! deleted ([`trim`]).
//!
//! [`replay`] reads the segments in order and hands every record after the checkpoint
//! to the caller. A torn tail (a short record or a CRC mismatch in the newest segment,
//! left by a crash in the middle of a write that was never acknowledged) is truncated
//! away with a warning; damage anywhere else is an error.
//!
//! One master at a time: [`DirLock`] holds an exclusive `flock` on `DIR/LOCK` for as
//! long as a master serves from `DIR`, so a second one fails at start
//! ([`Error::DirLocked`]) before it reads, truncates or appends to anything.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use tokio::sync::watch;

/// The one-master-per-directory lock, shared with the chunkserver (see
/// [`stampfs_proto::dirlock`]); [`Error`] maps its failure to [`Error::DirLocked`].
pub use stampfs_proto::dirlock::{DirLock, LOCK_FILE};

/// First bytes of every log segment.
pub const SEGMENT_MAGIC: &[u8; 8] = b"STMPLOG1";
/// First bytes of the checkpoint file.
pub const CHECKPOINT_MAGIC: &[u8; 8] = b"STMPCKP1";
/// Largest record payload accepted (checked before allocating on replay).
pub const MAX_RECORD_LEN: usize = 16 << 20;
/// Bytes before a record's payload: len, crc, lsn.
const RECORD_HEADER: usize = 16;
const SEGMENT_PREFIX: &str = "oplog.";
const CHECKPOINT_FILE: &str = "checkpoint";
const CHECKPOINT_TMP: &str = "checkpoint.tmp";
const CHECKPOINT_HEADER: usize = 8 + 8 + 8 + 4;
/// Zeros written ahead of the records at a time (see the module doc).
pub const PREALLOC: u64 = 1 << 20;
/// A batch that would come closer than this to the end of the zeros first writes
/// [`PREALLOC`] more.
const PREALLOC_MARGIN: u64 = 256 << 10;

/// Locks a mutex, recovering the data if a panicking thread poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fsyncs a directory, so that files created or renamed in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("fsync directory {}", dir.display()), e))
}

/// One record as it is written to a segment.
pub fn encode_record(lsn: u64, payload: &[u8]) -> Result<Vec<u8>> {
    if payload.len() > MAX_RECORD_LEN {
        return Err(Error::Codec {
            reason: format!(
                "log record of {} bytes exceeds {MAX_RECORD_LEN}",
                payload.len()
            ),
        });
    }
    let len = (8 + payload.len()) as u32;
    let lsn_bytes = lsn.to_be_bytes();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&lsn_bytes);
    crc.update(payload);
    let mut out = Vec::with_capacity(RECORD_HEADER + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&crc.finalize().to_be_bytes());
    out.extend_from_slice(&lsn_bytes);
    out.extend_from_slice(payload);
    Ok(out)
}

fn segment_name(first_lsn: u64) -> String {
    format!("{SEGMENT_PREFIX}{first_lsn:020}")
}

/// The log segments in `dir`, oldest first, with the first LSN in their name.
pub fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(num) = name.strip_prefix(SEGMENT_PREFIX) else {
            continue;
        };
        if let Ok(first) = num.parse::<u64>() {
            out.push((first, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// What [`replay`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// The highest LSN in the checkpoint or the log.
    pub last_lsn: u64,
    /// Records handed to the caller (after the checkpoint).
    pub applied: u64,
    /// Bytes cut off a torn tail.
    pub truncated_bytes: u64,
    /// Preallocated zeros cut off the newest segment (a master that stopped without
    /// closing its log; nothing torn).
    pub preallocated_bytes: u64,
    pub segments: usize,
}

/// Reads into `buf` until it is full or the file ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Replays every record with an LSN above `after_lsn` (the checkpoint's), in order.
/// A torn tail in the newest segment is truncated away and logged.
pub fn replay(
    dir: &Path,
    after_lsn: u64,
    mut apply: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<ReplayStats> {
    let segs = segments(dir)?;
    let mut stats = ReplayStats {
        last_lsn: after_lsn,
        segments: segs.len(),
        ..Default::default()
    };
    let mut prev: Option<u64> = None;
    for (i, (first, path)) in segs.iter().enumerate() {
        let last_segment = i + 1 == segs.len();
        let corrupt = |offset: u64, reason: String| Error::CorruptLog {
            path: path.clone(),
            offset,
            reason,
        };
        let file =
            File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        let file_len = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
            .len();
        let mut r = BufReader::with_capacity(1 << 20, file);
        let mut magic = [0u8; 8];
        let n = read_full(&mut r, &mut magic)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let mut offset = n as u64;
        // Why the rest of the segment (from `good`) cannot be used, if it cannot.
        let mut torn: Option<(u64, String)> = None;
        if n < magic.len() {
            torn = Some((0, "segment header is cut short".into()));
        } else if &magic != SEGMENT_MAGIC {
            return Err(corrupt(0, "not a stampfs log segment".into()));
        }
        let mut good = offset;
        let mut first_in_segment = true;
        // Where the preallocated zeros start, if the segment ends in them.
        let mut zeros: Option<u64> = None;
        while torn.is_none() {
            let mut head = [0u8; RECORD_HEADER];
            let n = read_full(&mut r, &mut head)
                .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            if n == 0 {
                break;
            }
            if head.iter().all(|&b| b == 0) && rest_is_zero(&mut r)? {
                // The zeros written ahead of the records: the end of the written log.
                zeros = Some(good);
                break;
            }
            if n < RECORD_HEADER {
                torn = Some((good, format!("record header cut short after {n} bytes")));
                break;
            }
            let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
            let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            let mut lsn_bytes = [0u8; 8];
            lsn_bytes.copy_from_slice(&head[8..16]);
            let lsn = u64::from_be_bytes(lsn_bytes);
            if !(8..=MAX_RECORD_LEN + 8).contains(&len) {
                torn = Some((good, format!("impossible record length {len}")));
                break;
            }
            let payload_len = len - 8;
            if offset + RECORD_HEADER as u64 + payload_len as u64 > file_len {
                torn = Some((good, format!("record of {len} bytes runs past the end")));
                break;
            }
            let mut payload = vec![0u8; payload_len];
            let n = read_full(&mut r, &mut payload)
                .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            if n < payload_len {
                torn = Some((good, "record payload cut short".into()));
                break;
            }
            let mut h = crc32fast::Hasher::new();
            h.update(&lsn_bytes);
            h.update(&payload);
            if h.finalize() != crc {
                torn = Some((good, "record checksum mismatch".into()));
                break;
            }
            offset += (RECORD_HEADER + payload_len) as u64;
            // Sequence checks: a well-framed record in the wrong place is corruption.
            if first_in_segment && lsn != *first {
                return Err(corrupt(
                    good,
                    format!("segment named for LSN {first} starts with LSN {lsn}"),
                ));
            }
            first_in_segment = false;
            match prev {
                Some(p) if lsn != p + 1 => {
                    return Err(corrupt(good, format!("LSN {lsn} follows LSN {p}")));
                }
                None if lsn > after_lsn + 1 => {
                    return Err(corrupt(
                        good,
                        format!(
                            "the log starts at LSN {lsn} but the checkpoint ends at {after_lsn}: records are missing"
                        ),
                    ));
                }
                _ => {}
            }
            prev = Some(lsn);
            if lsn > after_lsn {
                apply(lsn, &payload)?;
                stats.applied += 1;
                stats.last_lsn = lsn;
            }
            good = offset;
        }
        if let Some((at, reason)) = torn {
            if !last_segment {
                return Err(corrupt(at, reason));
            }
            let cut = file_len.saturating_sub(at);
            tracing::warn!(
                segment = %path.display(),
                offset = at,
                bytes = cut,
                %reason,
                "torn record at the tail of the operation log (never acknowledged); truncating it"
            );
            cut_at(path, at)?;
            stats.truncated_bytes += cut;
        } else if let Some(at) = zeros {
            if !last_segment {
                return Err(corrupt(
                    at,
                    "zeros where records should follow (only the newest segment may end in \
                     preallocated space)"
                        .into(),
                ));
            }
            tracing::debug!(segment = %path.display(), offset = at, "cutting the log's preallocated zeros");
            cut_at(path, at)?;
            stats.preallocated_bytes += file_len.saturating_sub(at);
        }
    }
    Ok(stats)
}

/// True when everything left in `r` is zero bytes (consumes it).
fn rest_is_zero(r: &mut impl Read) -> Result<bool> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| Error::io("read the operation log", e))?;
        if n == 0 {
            return Ok(true);
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

/// Truncates a segment to `at` bytes, durably.
fn cut_at(path: &Path, at: u64) -> Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    f.set_len(at)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(format!("truncate {}", path.display()), e))
}

/// Deletes the segments whose first LSN is below `keep_from` (they hold only records
/// a durable checkpoint covers), then fsyncs the directory.
pub fn trim(dir: &Path, keep_from: u64) -> Result<usize> {
    let mut removed = 0;
    for (first, path) in segments(dir)? {
        if first < keep_from {
            std::fs::remove_file(&path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
            removed += 1;
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// Writes the checkpoint durably: temp file, fsync, rename, directory fsync.
pub fn write_checkpoint(dir: &Path, lsn: u64, payload: &[u8]) -> Result<()> {
    let tmp = dir.join(CHECKPOINT_TMP);
    let dst = dir.join(CHECKPOINT_FILE);
    let io = |what: &str, e| Error::io(format!("{what} {}", tmp.display()), e);
    let mut f = File::create(&tmp).map_err(|e| io("create", e))?;
    let mut head = Vec::with_capacity(CHECKPOINT_HEADER);
    head.extend_from_slice(CHECKPOINT_MAGIC);
    head.extend_from_slice(&lsn.to_be_bytes());
    head.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    head.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
    f.write_all(&head)
        .and_then(|()| f.write_all(payload))
        .and_then(|()| f.sync_all())
        .map_err(|e| io("write", e))?;
    drop(f);
    std::fs::rename(&tmp, &dst).map_err(|e| io("rename", e))?;
    sync_dir(dir)
}

/// Reads the checkpoint: `None` when there is none. A damaged checkpoint is an error
/// (the log before it may already be trimmed).
pub fn read_checkpoint(dir: &Path) -> Result<Option<(u64, Vec<u8>)>> {
    let path = dir.join(CHECKPOINT_FILE);
    let tmp = dir.join(CHECKPOINT_TMP);
    if tmp.exists() {
        // A checkpoint that never got renamed into place: the log still covers it.
        std::fs::remove_file(&tmp)
            .map_err(|e| Error::io(format!("remove {}", tmp.display()), e))?;
    }
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    let corrupt = |reason: &str| Error::CorruptCheckpoint {
        path: path.clone(),
        reason: reason.to_string(),
    };
    if bytes.len() < CHECKPOINT_HEADER || &bytes[..8] != CHECKPOINT_MAGIC {
        return Err(corrupt("missing or wrong header"));
    }
    let num = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let lsn = num(8);
    let len = num(16);
    let crc = u32::from_be_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
    let payload = &bytes[CHECKPOINT_HEADER..];
    if payload.len() as u64 != len {
        return Err(corrupt("length does not match the file size"));
    }
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(Some((lsn, payload.to_vec())))
}

/// The highest durable LSN, or why the log stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    pub lsn: u64,
    pub failed: Option<String>,
}

/// Counters about the log writer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// `fdatasync` calls on segments.
    pub fsyncs: u64,
    /// Records written.
    pub records: u64,
    /// Bytes written since the last rotation.
    pub bytes_since_rotate: u64,
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
    items: Vec<Item>,
    stop: Option<Stop>,
    last_queued: u64,
}

struct Shared {
    dir: PathBuf,
    /// Records waiting for the writer thread, in LSN order; appenders push, the writer
    /// drains everything at once.
    queue: Mutex<Queue>,
    /// Wakes the writer when records arrive or the log is stopping.
    wake: Condvar,
    /// The highest durable LSN, published by the writer after each fsync; handlers wait
    /// on it before replying.
    durable: watch::Sender<Durable>,
    fsyncs: AtomicU64,
    records: AtomicU64,
    bytes_since_rotate: AtomicU64,
}

/// The append side of the operation log, with its group-commit writer thread.
pub struct Oplog {
    shared: Arc<Shared>,
    /// The writer thread; taken and joined by [`Oplog::close`] or [`Oplog::halt`].
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Oplog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oplog")
            .field("dir", &self.shared.dir)
            .field("durable", &*self.shared.durable.borrow())
            .finish_non_exhaustive()
    }
}

/// The segment being appended to: records end at `pos`, zeros run from there to
/// `allocated` (the file's size).
struct Segment {
    path: PathBuf,
    file: File,
    pos: u64,
    allocated: u64,
}

impl Segment {
    /// Creates segment `first_lsn`: the magic and [`PREALLOC`] zeros, durable, and
    /// the directory entry too.
    fn create(dir: &Path, first_lsn: u64) -> Result<Segment> {
        let path = dir.join(segment_name(first_lsn));
        let what = format!("create {}", path.display());
        let io = |e| Error::io(what.clone(), e);
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .map_err(io)?;
        f.write_all(SEGMENT_MAGIC).map_err(io)?;
        let mut seg = Segment {
            path,
            file: f,
            pos: SEGMENT_MAGIC.len() as u64,
            allocated: SEGMENT_MAGIC.len() as u64,
        };
        seg.pad()?;
        seg.file.sync_all().map_err(io)?;
        sync_dir(dir)?;
        Ok(seg)
    }

    /// Writes [`PREALLOC`] more zeros past the allocated end (not synced).
    fn pad(&mut self) -> Result<()> {
        let zeros = vec![0u8; PREALLOC as usize];
        self.file
            .write_all_at(&zeros, self.allocated)
            .map_err(|e| Error::io(format!("preallocate {}", self.path.display()), e))?;
        self.allocated += PREALLOC;
        Ok(())
    }

    /// Writes `buf` after the last record and makes it durable: padding first when
    /// the zeros run short, so the `fdatasync` of a small batch finds the file's size
    /// unchanged.
    fn write_durably(&mut self, buf: &[u8]) -> Result<()> {
        let end = self.pos + buf.len() as u64;
        while end + PREALLOC_MARGIN > self.allocated {
            self.pad()?;
        }
        self.file
            .write_all_at(buf, self.pos)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| Error::io("write the operation log", e))?;
        self.pos = end;
        Ok(())
    }

    /// Cuts the zeros off, durably: a segment that is no longer appended to holds only
    /// records.
    fn seal(&mut self) -> Result<()> {
        self.file
            .set_len(self.pos)
            .and_then(|()| self.file.sync_all())
            .map_err(|e| Error::io(format!("truncate {}", self.path.display()), e))?;
        self.allocated = self.pos;
        Ok(())
    }
}

impl Oplog {
    /// Opens the log for appending after replay: a new segment whose first record will
    /// be `next_lsn`.
    pub fn open(dir: &Path, next_lsn: u64) -> Result<Self> {
        let next_lsn = next_lsn.max(1);
        let segment = Segment::create(dir, next_lsn)?;
        let (durable, _) = watch::channel(Durable {
            lsn: next_lsn - 1,
            failed: None,
        });
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            queue: Mutex::new(Queue {
                last_queued: next_lsn - 1,
                ..Default::default()
            }),
            wake: Condvar::new(),
            durable,
            fsyncs: AtomicU64::new(0),
            records: AtomicU64::new(0),
            bytes_since_rotate: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("stampfs-oplog".into())
            .spawn(move || writer(s, segment))
            .map_err(|e| Error::io("spawn the log writer thread", e))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
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
        q.items.push(Item::Record { lsn, bytes });
        drop(q);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Starts a new segment for the records from `next_lsn` on (which must be the next
    /// LSN to be appended): the step before a checkpoint up to `next_lsn - 1`.
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
        q.items.push(Item::Rotate { next_lsn });
        drop(q);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Waits until record `lsn` (and all before it) is on disk.
    pub async fn wait_durable(&self, lsn: u64) -> Result<()> {
        let mut rx = self.shared.durable.subscribe();
        let d = rx
            .wait_for(|d| d.lsn >= lsn || d.failed.is_some())
            .await
            .map_err(|_| Error::LogFailed {
                reason: "log writer is gone".into(),
            })?;
        if d.lsn >= lsn {
            Ok(())
        } else {
            Err(Error::LogFailed {
                reason: d.failed.clone().unwrap_or_default(),
            })
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
        LogStats {
            fsyncs: self.shared.fsyncs.load(Ordering::Relaxed),
            records: self.shared.records.load(Ordering::Relaxed),
            bytes_since_rotate: self.shared.bytes_since_rotate.load(Ordering::Relaxed),
        }
    }

    fn stop(&self, how: Stop) {
        {
            let mut q = lock(&self.shared.queue);
            if q.stop.is_none() {
                q.stop = Some(how);
            }
        }
        self.shared.wake.notify_one();
        if let Some(t) = lock(&self.thread).take() {
            if t.join().is_err() {
                tracing::error!("the log writer thread panicked");
            }
        }
    }

    /// Writes and fsyncs everything queued, then stops the writer (blocking).
    pub fn close(&self) -> Result<()> {
        self.stop(Stop::Drain);
        let d = self.shared.durable.borrow().clone();
        match d.failed {
            Some(reason) if reason != CLOSED => Err(Error::LogFailed { reason }),
            _ => Ok(()),
        }
    }

    /// Stops the writer at once, dropping queued records (what a crash does).
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

fn writer(shared: Arc<Shared>, mut segment: Segment) {
    let fail = |reason: String| {
        shared.durable.send_modify(|d| d.failed = Some(reason));
    };
    loop {
        let items = {
            let mut q = lock(&shared.queue);
            while q.items.is_empty() && q.stop.is_none() {
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            match q.stop {
                Some(Stop::Halt) => {
                    fail("the operation log was halted".into());
                    return;
                }
                Some(Stop::Drain) if q.items.is_empty() => {
                    if let Err(e) = segment.seal() {
                        tracing::warn!(error = %e, "cutting the log's preallocated zeros at close failed; the next start cuts them");
                    }
                    fail(CLOSED.into());
                    return;
                }
                _ => std::mem::take(&mut q.items),
            }
        };
        if let Err(e) = write_batch(&shared, &mut segment, items) {
            tracing::error!(error = %e, "writing the operation log failed; refusing further mutations");
            fail(e.to_string());
            return;
        }
    }
}

fn write_batch(shared: &Shared, segment: &mut Segment, items: Vec<Item>) -> Result<()> {
    let mut buf = Vec::new();
    let mut last: Option<u64> = None;
    let mut count = 0u64;
    let flush =
        |segment: &mut Segment, buf: &mut Vec<u8>, last: Option<u64>, count: u64| -> Result<()> {
            let Some(lsn) = last else { return Ok(()) };
            segment.write_durably(buf)?;
            shared.fsyncs.fetch_add(1, Ordering::Relaxed);
            shared.records.fetch_add(count, Ordering::Relaxed);
            shared
                .bytes_since_rotate
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
            buf.clear();
            shared.durable.send_modify(|d| d.lsn = d.lsn.max(lsn));
            Ok(())
        };
    for item in items {
        match item {
            Item::Record { lsn, bytes } => {
                buf.extend_from_slice(&bytes);
                last = Some(lsn);
                count += 1;
            }
            Item::Rotate { next_lsn } => {
                flush(segment, &mut buf, last, count)?;
                last = None;
                count = 0;
                // Sealed before the next segment exists: only the newest segment
                // may end in zeros.
                segment.seal()?;
                *segment = Segment::create(&shared.dir, next_lsn)?;
                shared.bytes_since_rotate.store(0, Ordering::Relaxed);
            }
        }
    }
    flush(segment, &mut buf, last, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(lsn: u64) -> Vec<u8> {
        format!("record number {lsn}").into_bytes()
    }

    fn collect(dir: &Path, after: u64) -> (Vec<(u64, Vec<u8>)>, ReplayStats) {
        let mut got = Vec::new();
        let stats = replay(dir, after, |lsn, p| {
            got.push((lsn, p.to_vec()));
            Ok(())
        })
        .expect("replay");
        (got, stats)
    }

    async fn write_records(dir: &Path, from: u64, to: u64) {
        let log = Oplog::open(dir, from).expect("open");
        for lsn in from..=to {
            log.append(lsn, &payload(lsn)).expect("append");
        }
        log.wait_durable(to).await.expect("durable");
        log.close().expect("close");
    }

    #[tokio::test]
    async fn records_overwrite_preallocated_zeros_and_a_crash_leaves_them_to_replay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Oplog::open(dir.path(), 1).expect("open");
        let seg = last_segment(dir.path());
        let size = || std::fs::metadata(&seg).expect("stat").len();
        let prepared = size();
        assert_eq!(prepared, SEGMENT_MAGIC.len() as u64 + PREALLOC);
        for lsn in 1..=100 {
            log.append(lsn, &payload(lsn)).expect("append");
            log.wait_durable(lsn).await.expect("durable");
        }
        // Small batches never grow the file: each fdatasync overwrites zeros.
        assert_eq!(size(), prepared);
        log.halt(); // a crash: the zeros stay
        drop(log);
        let (got, stats) = collect(dir.path(), 0);
        assert_eq!(got.len(), 100);
        assert_eq!(got[99], (100, payload(100)));
        assert_eq!(stats.truncated_bytes, 0, "zeros are not a torn tail");
        assert!(stats.preallocated_bytes > 0);
        assert!(size() < prepared, "replay cut the zeros off");
        // The log goes on in a new segment; both replay.
        write_records(dir.path(), 101, 110).await;
        let (got, _) = collect(dir.path(), 0);
        assert_eq!(got.len(), 110);
    }

    #[tokio::test]
    async fn a_batch_past_the_zeros_pads_further_and_rotation_cuts_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Oplog::open(dir.path(), 1).expect("open");
        let big = vec![7u8; 600 << 10];
        for lsn in 1..=3 {
            log.append(lsn, &big).expect("append");
            log.wait_durable(lsn).await.expect("durable");
        }
        let first = last_segment(dir.path());
        let len = std::fs::metadata(&first).expect("stat").len();
        assert!(
            len >= 3 * (600 << 10) + PREALLOC_MARGIN,
            "padded ahead: {len}"
        );
        log.rotate(4).expect("rotate");
        log.append(4, b"after").expect("append");
        log.wait_durable(4).await.expect("durable");
        let sealed = std::fs::metadata(&first).expect("stat").len();
        assert_eq!(
            sealed,
            SEGMENT_MAGIC.len() as u64 + 3 * (RECORD_HEADER as u64 + (600 << 10)),
            "a rotated segment holds only records"
        );
        log.close().expect("close");
        let (got, stats) = collect(dir.path(), 0);
        assert_eq!(got.len(), 4);
        assert_eq!(stats.preallocated_bytes, 0, "close cut the zeros");
    }

    #[tokio::test]
    async fn zeros_in_an_older_segment_are_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_records(dir.path(), 1, 5).await;
        let seg = last_segment(dir.path());
        write_records(dir.path(), 6, 8).await;
        let mut f = OpenOptions::new().append(true).open(&seg).expect("open");
        f.write_all(&[0u8; 64]).expect("zeros");
        drop(f);
        let err = replay(dir.path(), 0, |_, _| Ok(())).expect_err("refused");
        assert!(matches!(err, Error::CorruptLog { .. }), "{err}");
    }

    #[tokio::test]
    async fn records_replay_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_records(dir.path(), 1, 20).await;
        let (got, stats) = collect(dir.path(), 0);
        assert_eq!(got.len(), 20);
        for (i, (lsn, p)) in got.iter().enumerate() {
            assert_eq!(*lsn, i as u64 + 1);
            assert_eq!(p, &payload(*lsn));
        }
        assert_eq!(stats.last_lsn, 20);
        assert_eq!(stats.truncated_bytes, 0);
        // A restart appends in a new segment; both replay.
        write_records(dir.path(), 21, 25).await;
        let (got, stats) = collect(dir.path(), 0);
        assert_eq!(got.len(), 25);
        assert_eq!(stats.segments, 2);
        // Records a checkpoint covers are skipped.
        let (got, _) = collect(dir.path(), 22);
        assert_eq!(
            got.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![23, 24, 25]
        );
    }

    fn last_segment(dir: &Path) -> PathBuf {
        segments(dir).expect("list").pop().expect("a segment").1
    }

    #[tokio::test]
    async fn torn_tail_half_record_is_truncated() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_records(dir.path(), 1, 5).await;
        let seg = last_segment(dir.path());
        let good_len = std::fs::metadata(&seg).expect("meta").len();
        let half = encode_record(6, &payload(6)).expect("encode");
        let mut f = OpenOptions::new().append(true).open(&seg).expect("open");
        f.write_all(&half[..half.len() / 2]).expect("write");
        drop(f);
        let (got, stats) = collect(dir.path(), 0);
        assert_eq!(got.len(), 5);
        assert_eq!(stats.truncated_bytes, (half.len() / 2) as u64);
        assert_eq!(std::fs::metadata(&seg).expect("meta").len(), good_len);
        // The log continues after the cut.
        write_records(dir.path(), 6, 7).await;
        let (got, _) = collect(dir.path(), 0);
        assert_eq!(got.len(), 7);
    }

    #[tokio::test]
    async fn torn_tail_garbage_and_bad_crc_are_truncated() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_records(dir.path(), 1, 3).await;
        let seg = last_segment(dir.path());
        let mut rec = encode_record(4, &payload(4)).expect("encode");
        let last = rec.len() - 1;
        rec[last] ^= 0xff; // bad CRC
        let mut f = OpenOptions::new().append(true).open(&seg).expect("open");
        f.write_all(&rec).expect("write");
        f.write_all(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3])
            .expect("write");
        drop(f);
        let (got, stats) = collect(dir.path(), 0);
        assert_eq!(got.len(), 3);
        assert_eq!(stats.truncated_bytes, rec.len() as u64 + 7);
        // Pure garbage after the header only.
        let dir = tempfile::tempdir().expect("tempdir");
        write_records(dir.path(), 1, 1).await;
        let seg = last_segment(dir.path());
        let mut f = OpenOptions::new().append(true).open(&seg).expect("open");
        f.write_all(&[0xff; 40]).expect("write");
        drop(f);
        let (got, _) = collect(dir.path(), 0);
        assert_eq!(got.len(), 1);
    }

    #[tokio::test]
    async fn damage_in_an_older_segment_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_records(dir.path(), 1, 3).await;
        write_records(dir.path(), 4, 6).await;
        let first = segments(dir.path()).expect("list")[0].1.clone();
        let mut bytes = std::fs::read(&first).expect("read");
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&first, bytes).expect("write");
        let err = replay(dir.path(), 0, |_, _| Ok(())).unwrap_err();
        assert!(matches!(err, Error::CorruptLog { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_gap_after_the_checkpoint_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_records(dir.path(), 10, 12).await;
        let err = replay(dir.path(), 5, |_, _| Ok(())).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        // With the checkpoint covering up to 9 it is fine.
        let (got, _) = collect(dir.path(), 9);
        assert_eq!(got.len(), 3);
    }

    #[tokio::test]
    async fn group_commit_shares_fsyncs_and_everything_is_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Arc::new(Oplog::open(dir.path(), 1).expect("open"));
        // The LSN counter stands in for the state lock: append order == LSN order.
        let next = Arc::new(Mutex::new(1u64));
        let mut tasks = Vec::new();
        for t in 0..32u64 {
            let log = log.clone();
            let next = next.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..20 {
                    let lsn = {
                        let mut n = lock(&next);
                        let lsn = *n;
                        log.append(lsn, &t.to_be_bytes()).expect("append");
                        *n += 1;
                        lsn
                    };
                    log.wait_durable(lsn).await.expect("durable");
                    assert!(log.durable_lsn() >= lsn);
                }
            }));
        }
        for t in tasks {
            t.await.expect("join");
        }
        let stats = log.stats();
        assert_eq!(stats.records, 640);
        assert!(
            stats.fsyncs < stats.records,
            "group commit: {} fsyncs for {} records",
            stats.fsyncs,
            stats.records
        );
        log.close().expect("close");
        let (got, _) = collect(dir.path(), 0);
        assert_eq!(got.len(), 640);
    }

    #[tokio::test]
    async fn rotation_checkpoint_and_trim() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Oplog::open(dir.path(), 1).expect("open");
        for lsn in 1..=4 {
            log.append(lsn, &payload(lsn)).expect("append");
        }
        log.rotate(5).expect("rotate");
        for lsn in 5..=6 {
            log.append(lsn, &payload(lsn)).expect("append");
        }
        log.wait_durable(6).await.expect("durable");
        assert_eq!(segments(dir.path()).expect("list").len(), 2);
        write_checkpoint(dir.path(), 4, b"state up to 4").expect("checkpoint");
        assert_eq!(trim(dir.path(), 5).expect("trim"), 1);
        log.close().expect("close");
        let (lsn, state) = read_checkpoint(dir.path()).expect("read").expect("some");
        assert_eq!((lsn, state.as_slice()), (4, &b"state up to 4"[..]));
        let (got, stats) = collect(dir.path(), lsn);
        assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![5, 6]);
        assert_eq!(stats.last_lsn, 6);
    }

    #[test]
    fn damaged_checkpoint_is_refused_and_stray_temp_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(read_checkpoint(dir.path()).expect("none").is_none());
        std::fs::write(dir.path().join(CHECKPOINT_TMP), b"half").expect("write");
        write_checkpoint(dir.path(), 9, b"hello").expect("write");
        let path = dir.path().join(CHECKPOINT_FILE);
        let mut bytes = std::fs::read(&path).expect("read");
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&path, bytes).expect("write");
        assert!(matches!(
            read_checkpoint(dir.path()),
            Err(Error::CorruptCheckpoint { .. })
        ));
        assert!(!dir.path().join(CHECKPOINT_TMP).exists());
    }

    #[tokio::test]
    async fn appends_are_refused_after_close_and_halt_fails_waiters() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Oplog::open(dir.path(), 1).expect("open");
        log.append(1, b"a").expect("append");
        log.close().expect("close");
        assert!(matches!(log.append(2, b"b"), Err(Error::ShuttingDown)));
        log.wait_durable(1)
            .await
            .expect("the drained record is durable");

        let dir = tempfile::tempdir().expect("tempdir");
        let log = Oplog::open(dir.path(), 1).expect("open");
        log.halt();
        assert!(log.wait_durable(1).await.is_err());
        assert!(log.append(3, b"x").is_err(), "out of order and stopped");
    }
}
