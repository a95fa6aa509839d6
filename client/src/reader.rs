//! [`FileReader`]: `AsyncRead + AsyncSeek` over a file's chunks, and `read_at`.
//!
//! Locations are fetched once at open and refreshed when a replica says the version
//! moved on. Only replicas at the master's current version are ever listed (the
//! master filters stale ones); a replica that fails, is stale or corrupt is skipped
//! for the next one, and corruption is reported to the master.
//!
//! A reader that reads on where its last fetch ended is sequential: it then keeps
//! [`AHEAD`] fetches of the bytes that follow in flight (tasks on the runtime), so the
//! chunkservers' disks and the network work while the program consumes what it has.
//! A prefetched piece is used only when the reader arrives exactly at its offset and no
//! newer locations were fetched since it started (so pieces never go back in time); a
//! seek elsewhere drops them (their tasks aborted), and one that failed or came back
//! empty is fetched again directly (so a prefetch never turns a read that would have
//! succeeded into an error, nor ends the file early).

use crate::client::Client;
use crate::error::{Error, Result};
use bytes::Bytes;
use futures::future::BoxFuture;
use stampfs_proto::{
    FileLocations, FileState, LocatedChunk, Read, RemoteError, ReplicaInfo, ReportCorrupt,
};
use std::collections::VecDeque;
use std::io::SeekFrom;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncSeek, ReadBuf};

/// Bytes fetched per request (and read ahead by the `AsyncRead` impl).
const READ_SIZE: u64 = 1 << 20;
/// How many times more a read no replica could serve asks for the locations again,
/// and the first wait before it (doubled each time: 0.25 + 0.5 + 1 + 2 s).
const NO_REPLICA_RETRIES: u32 = 4;
const NO_REPLICA_WAIT: Duration = Duration::from_millis(250);
/// Fetches a sequential reader keeps in flight past its buffer.
pub(crate) const AHEAD: usize = 4;

struct Shared {
    client: Client,
    path: String,
    /// The file's chunks; replaced when a read learns that a version moved on.
    locations: Mutex<View>,
    /// Counts the replacements of `locations`: a piece fetched ahead under an older
    /// view is not used after a newer one was seen (its bytes could be older than those
    /// of the pieces before it).
    epoch: AtomicU64,
}

#[derive(Clone)]
struct View {
    locations: FileLocations,
    /// Readable length: committed chunks plus what the last open chunk's replica has.
    length: u64,
}

/// Reads one file.
pub struct FileReader {
    shared: Arc<Shared>,
    pos: u64,
    /// Bytes read ahead, starting at file offset `buf_at`.
    buf: Bytes,
    buf_at: u64,
    /// A fetch in progress inside `poll_read`.
    fetch: Option<BoxFuture<'static, Result<Bytes>>>,
    /// Whether `fetch` is a prefetched piece (retried directly when it failed).
    fetch_prefetched: bool,
    /// Whether the read that started `fetch` continued where the buffer ended.
    sequential: bool,
    /// Fetches running ahead of a sequential reader, in file order, each with the
    /// offset it reads at and the length it asked for.
    ahead: VecDeque<Prefetch>,
}

/// One fetch running ahead of the reader.
struct Prefetch {
    at: u64,
    len: u64,
    /// `Shared::epoch` when it was started.
    epoch: u64,
    task: AbortOnDrop,
}

/// A read-ahead task, aborted when its handle is dropped (a seek, a dropped reader,
/// a dropped read future): nothing keeps fetching for a reader that moved on.
struct AbortOnDrop(tokio::task::JoinHandle<Result<Bytes>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::fmt::Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader")
            .field("path", &self.shared.path)
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

impl FileReader {
    /// A reader of `path`; `access`: it reads (the master may move the access time).
    pub(crate) async fn open(client: Client, path: String, access: bool) -> Result<Self> {
        let view = load_view(&client, &path, access).await?;
        Ok(Self {
            shared: Arc::new(Shared {
                client,
                path,
                locations: Mutex::new(view),
                epoch: AtomicU64::new(0),
            }),
            pos: 0,
            buf: Bytes::new(),
            buf_at: 0,
            fetch: None,
            fetch_prefetched: false,
            sequential: false,
            ahead: VecDeque::new(),
        })
    }

    /// Readable length when the reader was opened (or last refreshed).
    pub fn len(&self) -> u64 {
        self.shared.view().length
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads up to `len` bytes at `offset`; fewer only at the end of the file.
    pub async fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        let mut out = bytes::BytesMut::new();
        let mut at = offset;
        while out.len() < len {
            let piece = self
                .shared
                .clone()
                .fetch(at, (len - out.len()) as u64)
                .await?;
            if piece.is_empty() {
                break;
            }
            at += piece.len() as u64;
            out.extend_from_slice(&piece);
        }
        Ok(out.freeze())
    }
}

impl Shared {
    fn view(&self) -> View {
        match self.locations.lock() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    async fn refresh(&self) -> Result<View> {
        let view = load_view(&self.client, &self.path, false).await?;
        if let Ok(mut v) = self.locations.lock() {
            *v = view.clone();
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        Ok(view)
    }

    /// Reads at most `max` bytes at `offset` from one chunk. A failed read is tried
    /// again on fresh locations; when no replica could serve it (a master that just
    /// restarted lists none until the chunkservers register again, a chunkserver
    /// moving), up to [`NO_REPLICA_RETRIES`] times more, waiting longer each time, as
    /// HDFS's readers fetch block locations again before giving up.
    async fn fetch(self: Arc<Self>, offset: u64, max: u64) -> Result<Bytes> {
        let mut view = self.view();
        let mut refreshed = false;
        let mut waits = 0;
        loop {
            if offset >= view.length {
                return Ok(Bytes::new());
            }
            let Some(chunk) = chunk_at(&view.locations, offset) else {
                return Ok(Bytes::new());
            };
            let in_chunk = offset - chunk.file_offset;
            let want = fetch_len(&view, offset, max);
            if want == 0 {
                return Ok(Bytes::new());
            }
            match self.read_chunk(chunk, in_chunk, want as u32).await {
                Ok(b) => return Ok(b),
                Err(e) if !refreshed => {
                    tracing::debug!(error = %e, "read failed; refreshing locations");
                    view = self.refresh().await?;
                    refreshed = true;
                }
                Err(e @ Error::NoReplica { .. }) if waits < NO_REPLICA_RETRIES => {
                    let wait = NO_REPLICA_WAIT * 2u32.pow(waits);
                    tracing::info!(error = %e, ?wait, "no replica could be read; asking for the locations again after a wait");
                    tokio::time::sleep(wait).await;
                    waits += 1;
                    view = self.refresh().await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn read_chunk(&self, chunk: &LocatedChunk, offset: u64, len: u32) -> Result<Bytes> {
        let mut last = String::from("no replica at the current version");
        for replica in &chunk.replicas {
            let req = Read {
                token: chunk.token,
                offset,
                len,
            };
            match self.client.call_chunkserver(&replica.addr, req).await {
                // A committed chunk must come back whole: a short replica is as bad as
                // a failed one. The open last chunk may legitimately end earlier on one
                // replica than another (beyond what was hflushed).
                Ok((_reply, data)) if data.len() == len as usize => return Ok(data),
                Ok((_reply, data)) if !chunk.complete && !data.is_empty() => return Ok(data),
                Ok((reply, data)) => {
                    tracing::warn!(
                        chunkserver = %replica.chunkserver,
                        got = data.len(),
                        want = len,
                        replica_length = reply.replica.length,
                        "replica returned a short read; trying the next one"
                    );
                    last = format!(
                        "{} returned {} of {len} bytes",
                        replica.chunkserver,
                        data.len()
                    );
                }
                Err(e) => {
                    if let Error::Remote(RemoteError::ChecksumMismatch { .. }) = &e {
                        let report = ReportCorrupt {
                            handle: chunk.handle,
                            chunkserver: replica.chunkserver,
                        };
                        if let Err(err) = self.client.call(report).await {
                            tracing::warn!(error = %err, "could not report a corrupt replica");
                        }
                    }
                    tracing::debug!(chunkserver = %replica.chunkserver, error = %e, "replica read failed");
                    last = e.to_string();
                }
            }
        }
        Err(Error::NoReplica {
            handle: chunk.handle,
            last,
        })
    }
}

/// How many bytes a fetch of at most `max` at `offset` asks for: no more than
/// [`READ_SIZE`], the readable length, and (of a complete chunk) the chunk's committed
/// end, whatever a replica holds. Zero at or past the end.
fn fetch_len(view: &View, offset: u64, max: u64) -> u64 {
    if offset >= view.length {
        return 0;
    }
    let Some(chunk) = chunk_at(&view.locations, offset) else {
        return 0;
    };
    let mut want = max.min(READ_SIZE).min(view.length - offset);
    if chunk.complete {
        want = want.min(chunk.length.saturating_sub(offset - chunk.file_offset));
    }
    want
}

fn chunk_at(locs: &FileLocations, offset: u64) -> Option<&LocatedChunk> {
    let idx = locs
        .chunks
        .partition_point(|c| c.file_offset <= offset)
        .checked_sub(1)?;
    locs.chunks.get(idx)
}

/// Fetches locations and works out the readable length. For an incomplete last chunk
/// every replica handed out (the granted pipeline's live members) is asked how much it
/// holds, and the reader may read the least of them ([`visible_length`]).
async fn load_view(client: &Client, path: &str, access: bool) -> Result<View> {
    let locations = client.locations_for(path, access).await?;
    let mut length = locations
        .chunks
        .iter()
        .filter(|c| c.complete)
        .map(|c| c.file_offset + c.length)
        .max()
        .unwrap_or(0);
    let recovering = locations.status.state == FileState::Recovering;
    if let Some(last) = locations.chunks.last().filter(|c| !c.complete) {
        if recovering || last.unconfirmed {
            // See `visible_length`: during recovery, or while a member of the writer's
            // pipeline is not listed, only the committed length is sure.
            length = length.max(last.file_offset + last.length);
            return Ok(View { locations, length });
        }
        let mut answers = Vec::with_capacity(last.replicas.len());
        for r in &last.replicas {
            match client
                .call_chunkserver(&r.addr, ReplicaInfo { token: last.token })
                .await
            {
                Ok((report, _)) => answers.push(Some(report.length)),
                Err(e) => {
                    tracing::debug!(chunkserver = %r.chunkserver, error = %e, "replica info failed");
                    answers.push(None);
                }
            }
        }
        length = length.max(last.file_offset + visible_length(last.length, &answers));
    }
    if locations.chunks.is_empty() {
        length = locations.status.length;
    }
    Ok(View { locations, length })
}

/// The readable length of an open chunk whose committed length is `committed`, from
/// each replica's answer (`None`: it did not answer). A replica may hold bytes the
/// others do not have yet (in flight down the pipeline, or never acknowledged to the
/// writer); if the writer dies, lease recovery keeps only what *every* replica holds,
/// and a reader must never have seen bytes that recovery then cuts. So: the least that
/// every replica holds, and only the committed length when one of them did not answer.
///
/// A file in lease recovery is read only to the committed length, without asking
/// (see `load_view`): the master then hands out only the replicas that already took
/// the recovery's version, and one of them may be the longest of the pipeline while
/// the others, still at the writer's version and unreachable for the moment, decide
/// the length recovery keeps (the nemesis saw a reader read 116 KiB that recovery
/// then cut, this way). The same while the master lists only some members of the
/// writer's pipeline (`LocatedChunk::unconfirmed`): one that is down may come back
/// holding less than the others, and recovery keeps the least.
pub(crate) fn visible_length(committed: u64, answers: &[Option<u64>]) -> u64 {
    if answers.iter().any(Option::is_none) {
        return committed;
    }
    answers
        .iter()
        .flatten()
        .min()
        .copied()
        .unwrap_or(committed)
        .max(committed)
}

impl AsyncRead for FileReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            let buf_end = this.buf_at + this.buf.len() as u64;
            if this.pos >= this.buf_at && this.pos < buf_end {
                let start = (this.pos - this.buf_at) as usize;
                let n = out.remaining().min(this.buf.len() - start);
                out.put_slice(&this.buf[start..start + n]);
                this.pos += n as u64;
                return Poll::Ready(Ok(()));
            }
            if this.fetch.is_none() {
                this.start_fetch(buf_end);
            }
            let res = match this.fetch.as_mut() {
                Some(f) => ready!(f.as_mut().poll(cx)),
                None => Ok(Bytes::new()),
            };
            this.fetch = None;
            let data = match res {
                // A piece fetched ahead that came back empty is read again: the end of
                // the file is decided by a direct fetch only.
                Ok(data) if !(data.is_empty() && this.fetch_prefetched) => data,
                Ok(_) => {
                    this.drop_ahead();
                    this.fetch_prefetched = false;
                    let shared = this.shared.clone();
                    this.fetch = Some(Box::pin(shared.fetch(this.pos, READ_SIZE)));
                    continue;
                }
                Err(e) if this.fetch_prefetched => {
                    tracing::debug!(error = %e, "a prefetched read failed; reading again");
                    this.drop_ahead();
                    this.fetch_prefetched = false;
                    let shared = this.shared.clone();
                    this.fetch = Some(Box::pin(shared.fetch(this.pos, READ_SIZE)));
                    continue;
                }
                Err(e) => return Poll::Ready(Err(e.into_io())),
            };
            if data.is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.buf_at = this.pos;
            this.buf = data;
            if this.sequential {
                this.read_ahead();
            }
        }
    }
}

impl FileReader {
    /// Starts the fetch at `pos`: the prefetched piece there if one runs, a direct
    /// fetch otherwise (and then the prefetches, all elsewhere, are dropped).
    fn start_fetch(&mut self, buf_end: u64) {
        self.sequential = !self.buf.is_empty() && self.pos == buf_end;
        let epoch = self.shared.epoch.load(Ordering::SeqCst);
        if self
            .ahead
            .front()
            .is_some_and(|p| p.at != self.pos || p.epoch != epoch)
        {
            self.drop_ahead();
        }
        if let Some(p) = self.ahead.pop_front() {
            let path = self.shared.path.clone();
            self.fetch_prefetched = true;
            let mut task = p.task;
            self.fetch = Some(Box::pin(async move {
                (&mut task.0).await.map_err(|e| Error::Pipeline {
                    path,
                    reason: format!("a read-ahead task ended: {e}"),
                })?
            }));
            return;
        }
        self.fetch_prefetched = false;
        let shared = self.shared.clone();
        self.fetch = Some(Box::pin(shared.fetch(self.pos, READ_SIZE)));
    }

    /// Tops the fetches running ahead up to [`AHEAD`], from where the buffer (or the
    /// last of them) ends. Outside a tokio runtime nothing is read ahead.
    fn read_ahead(&mut self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let view = self.shared.view();
        let epoch = self.shared.epoch.load(Ordering::SeqCst);
        // The identity of the request this read serves (a mount task's), for a refresh
        // of the locations inside a task.
        let caller = crate::client::REQUEST_CALLER.try_with(Clone::clone).ok();
        let mut next = self
            .ahead
            .back()
            .map_or(self.buf_at + self.buf.len() as u64, |p| p.at + p.len);
        while self.ahead.len() < AHEAD {
            let len = fetch_len(&view, next, READ_SIZE);
            if len == 0 {
                break;
            }
            let shared = self.shared.clone();
            let task = match caller.clone() {
                Some(c) => {
                    rt.spawn(crate::client::REQUEST_CALLER.scope(c, shared.fetch(next, len)))
                }
                None => rt.spawn(shared.fetch(next, len)),
            };
            self.ahead.push_back(Prefetch {
                at: next,
                len,
                epoch,
                task: AbortOnDrop(task),
            });
            next += len;
        }
    }

    fn drop_ahead(&mut self) {
        self.ahead.clear();
    }
}

impl AsyncSeek for FileReader {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> std::io::Result<()> {
        let this = self.get_mut();
        let len = this.len() as i128;
        let target = match position {
            SeekFrom::Start(n) => n as i128,
            SeekFrom::End(d) => len + d as i128,
            SeekFrom::Current(d) => this.pos as i128 + d as i128,
        };
        if target < 0 || target > u64::MAX as i128 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "seek before the start of the file",
            ));
        }
        this.pos = target as u64;
        this.fetch = None;
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        Poll::Ready(Ok(self.pos))
    }
}

#[cfg(test)]
mod tests {
    use super::visible_length;

    #[test]
    fn an_open_chunk_reads_only_what_every_replica_holds() {
        // One replica is ahead with bytes the others have not got (or never acked):
        // lease recovery would cut them, so a reader must not see them.
        assert_eq!(visible_length(0, &[Some(103_056), Some(124_431)]), 103_056);
        assert_eq!(visible_length(10, &[Some(50), Some(50), Some(50)]), 50);
        // A replica that does not answer could be the shortest.
        assert_eq!(visible_length(10, &[Some(50), None]), 10);
        // Never below what is committed, and the committed length without replicas.
        assert_eq!(visible_length(10, &[Some(5)]), 10);
        assert_eq!(visible_length(7, &[]), 7);
    }
}
