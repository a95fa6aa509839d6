//! The data entry points of [`Client`]: writers (`create`, `append`, `open_options`
//! and the reopen behind them), empty files (`make_file`), readers (`open`), and the
//! whole-replica read of checkers (`read_replica`).

use super::{normalized, Client, CreateOptions, REPLICA_READ_PIECE};
use crate::error::{Error, Result};
use crate::reader::FileReader;
use crate::writer::FileWriter;
use stampfs_proto::{
    Append, ChunkToken, Create, FileStatus, MakeFile, Read, RemoteError, ReplicaReport,
};
use std::time::Duration;

impl Client {
    /// Creates a file and returns its writer (the client now holds its write lease).
    pub async fn create(&self, path: &str, opts: CreateOptions) -> Result<FileWriter> {
        self.create_with(path, opts, crate::writer::WriteMode::Append)
            .await
    }

    /// An [`OpenOptions`](crate::OpenOptions) builder for a writer of this cluster
    /// (`std::fs::OpenOptions` style: append, create, create_new, truncate).
    pub fn open_options(&self) -> crate::OpenOptions {
        crate::OpenOptions::new(self.clone())
    }

    /// Creates `path` and starts a writer of `mode` (the lease is the client's).
    pub(crate) async fn create_with(
        &self,
        path: &str,
        opts: CreateOptions,
        mode: crate::writer::WriteMode,
    ) -> Result<FileWriter> {
        let path = normalized(path)?;
        let status = self
            .call(Create {
                path: path.clone(),
                client: self.inner.id,
                replication: opts.replication,
                chunk_size: opts.chunk_size,
                overwrite: opts.overwrite,
                attr: Some(opts.attr.unwrap_or_else(|| self.new_attr(0o666))),
                caller: self.caller(),
            })
            .await?;
        self.hold_lease(&path);
        Ok(FileWriter::start(self.clone(), status, None, mode))
    }

    /// Creates an empty file that is closed at once (one durable step at the master,
    /// no lease): what `touch` or `mknod` wants, and cheaper than `create` then `close`
    /// when nothing may be written. Write to it later with [`Client::append`].
    /// `opts.overwrite` is ignored: an existing name is refused.
    pub async fn make_file(&self, path: &str, opts: CreateOptions) -> Result<FileStatus> {
        let path = normalized(path)?;
        self.call(MakeFile {
            path,
            client: self.inner.id,
            replication: opts.replication,
            chunk_size: opts.chunk_size,
            attr: Some(opts.attr.unwrap_or_else(|| self.new_attr(0o666))),
            caller: self.caller(),
        })
        .await
    }

    /// Reopens a closed file for writing at its end. When the master is recovering the
    /// lease of a previous writer, waits (up to the configured bound) and retries.
    pub async fn append(&self, path: &str) -> Result<FileWriter> {
        self.reopen(path, crate::writer::WriteMode::Append).await
    }

    /// Takes the write lease of the closed file `path` (`Append` at the master, which
    /// re-leases its partial last chunk under a new version), waiting out a lease
    /// recovery of the previous writer, and starts a writer of `mode`.
    pub(crate) async fn reopen(
        &self,
        path: &str,
        mode: crate::writer::WriteMode,
    ) -> Result<FileWriter> {
        let path = normalized(path)?;
        let deadline = tokio::time::Instant::now() + self.inner.config.recovery_wait;
        let mut warned = false;
        loop {
            let res = self
                .call(Append {
                    path: path.clone(),
                    client: self.inner.id,
                    caller: self.caller(),
                })
                .await;
            match res {
                Ok(reply) => {
                    self.hold_lease(&path);
                    return Ok(FileWriter::start(
                        self.clone(),
                        reply.status,
                        reply.last_chunk,
                        mode,
                    ));
                }
                Err(Error::Remote(RemoteError::RecoveryInProgress { .. }))
                    if tokio::time::Instant::now() < deadline =>
                {
                    if !warned {
                        tracing::info!(%path, "waiting for lease recovery of the previous writer");
                        warned = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens a file for reading (a read: its access time moves by the `relatime`
    /// rules).
    pub async fn open(&self, path: &str) -> Result<FileReader> {
        FileReader::open(self.clone(), normalized(path)?, true).await
    }

    /// The length a reader of `path` may read now (for a file being written: what
    /// every replica of its pipeline holds), without reading: the access time stays.
    pub async fn visible_length(&self, path: &str) -> Result<u64> {
        Ok(FileReader::open(self.clone(), normalized(path)?, false)
            .await?
            .len())
    }

    /// Reads one replica straight from the chunkserver at `addr`, as that chunkserver
    /// holds it: from offset 0 up to the replica's length as the chunkserver reports it,
    /// but at most `max_len` bytes. Returns the chunkserver's report of the replica
    /// (version, length, state; from its last reply) and the bytes.
    ///
    /// For tools that compare replicas (the nemesis replica check); applications read
    /// through [`Client::open`]. Unlike a [`FileReader`] it never falls back to another
    /// replica, never stops at the master's committed length and never reports a
    /// corrupt replica to the master (the chunkserver itself still moves a replica
    /// that fails its checksums aside, as on every read). `token` is the chunk's read
    /// token from [`Client::locations`]: a replica at another version refuses it with
    /// `StaleToken` or `ReplicaStale`, naming its own version. The bytes are fewer than
    /// the reported length (capped at `max_len`) only when the chunkserver stopped
    /// sending early; the caller judges that.
    pub async fn read_replica(
        &self,
        addr: &str,
        token: ChunkToken,
        max_len: u64,
    ) -> Result<(ReplicaReport, bytes::Bytes)> {
        let mut out = bytes::BytesMut::new();
        // The replica's length is unknown until the first reply.
        let mut want = max_len.min(REPLICA_READ_PIECE);
        loop {
            let req = Read {
                token,
                offset: out.len() as u64,
                len: want as u32,
            };
            let (reply, data) = self.call_chunkserver(addr, req).await?;
            let report = reply.replica;
            // A chunkserver that sends more than was asked for is not believed.
            out.extend_from_slice(&data[..data.len().min(want as usize)]);
            let end = report.length.min(max_len);
            let at = out.len() as u64;
            if data.is_empty() || want == 0 || at >= end {
                // Never more than the replica says it holds.
                out.truncate(usize::try_from(end).unwrap_or(usize::MAX));
                return Ok((report, out.freeze()));
            }
            want = (end - at).min(REPLICA_READ_PIECE);
        }
    }
}
