//! The write path's checks and lookups, as methods of [`MasterState`] the requests
//! in `write.rs` share: the file a request names and its writer, a commit of the
//! chunk a writer leaves, the end a new chunk goes after, and a request asked again
//! after a lost answer (`retried_add`, `retried_open`).

use super::MasterState;
use crate::error::{Error, Result};
use crate::namespace::{self, join, FileMeta};
use stampfs_proto::{ChunkCommit, ChunkHandle, ClientId, InodeId, OpenChunk};

impl MasterState {
    /// Resolves `path` to a file, checking it is still `expect` (the inode the caller
    /// locked).
    pub(super) fn locked_file(&self, path: &str, expect: InodeId) -> Result<(String, &FileMeta)> {
        let comps = namespace::components(path)?;
        let p = join(&comps);
        let ino = self.ns.resolve(&comps)?;
        if ino != expect {
            return Err(Error::NotFound { path: p });
        }
        let f = self.ns.file(ino).ok_or_else(|| self.not_a_file(&p, ino))?;
        Ok((p, f))
    }

    /// Checks `client` holds the write lease on file `ino` and renews it.
    pub(super) fn check_writer(
        &mut self,
        path: &str,
        ino: InodeId,
        client: ClientId,
        now_ms: u64,
    ) -> Result<()> {
        let f = self
            .ns
            .file(ino)
            .ok_or_else(|| self.not_a_file(path, ino))?;
        if f.writer() != Some(client) {
            return Err(Error::LeaseExpired {
                path: path.to_string(),
                client,
            });
        }
        self.leases.renew(ino, client, now_ms);
        if self.leases.get(ino).is_none() {
            self.leases.acquire(ino, client, now_ms);
        }
        Ok(())
    }

    /// A writer's commit of the chunk it was writing: that chunk, within the chunk
    /// size, never below what is committed, and a chunk before the last stays full.
    pub(super) fn check_commit(
        &self,
        path: &str,
        ino: InodeId,
        f: &FileMeta,
        c: &ChunkCommit,
    ) -> Result<()> {
        if self.open_chunk_of(ino, f) != Some(c.handle) {
            return Err(Error::bad_request(format!(
                "chunk {} is not the chunk being written in {path}",
                c.handle
            )));
        }
        if f.chunks.last() != Some(&c.handle) && c.length != f.chunk_size {
            return Err(Error::bad_request(format!(
                "committed length {} of chunk {}, before the last chunk of {path}: it stays {}",
                c.length, c.handle, f.chunk_size
            )));
        }
        if c.length > f.chunk_size {
            return Err(Error::bad_request(format!(
                "committed length {} of chunk {} exceeds the chunk size {}",
                c.length, c.handle, f.chunk_size
            )));
        }
        let committed = self.chunks.get(c.handle).map(|i| i.length).unwrap_or(0);
        if c.length < committed {
            return Err(Error::bad_request(format!(
                "committed length {} of chunk {} is below the already committed {committed}",
                c.length, c.handle
            )));
        }
        Ok(())
    }

    /// The last chunk of `ino` when `req` asks again for it: its answer was lost (the
    /// master failed over, or the connection broke) and the writer, which never got
    /// the grant, sends the same `AddChunk` again. It is that when the last chunk is
    /// the one being written, holds no committed byte, and follows exactly what `req`
    /// commits: the chunk `previous` names, at that length (the first ask committed
    /// it), then only full chunks (a writer moved back to an earlier chunk asks for a
    /// new one after the full last chunk); or, without `previous`, only full chunks.
    /// A writer that was granted
    /// the chunk and wrote in it commits it as `previous` when it asks for the next,
    /// so the chunk is empty of this writer's bytes and is dropped for a new one.
    pub(super) fn retried_add(
        &self,
        ino: InodeId,
        f: &FileMeta,
        req: &stampfs_proto::AddChunk,
    ) -> Option<ChunkHandle> {
        let (&last, before) = f.chunks.split_last()?;
        if self.open_chunk_of(ino, f) != Some(last)
            || self.chunks.get(last).map_or(0, |c| c.length) != 0
        {
            return None;
        }
        let length = |h: &ChunkHandle| self.chunks.get(*h).map_or(0, |c| c.length);
        let full = |hs: &[ChunkHandle]| hs.iter().all(|h| length(h) >= f.chunk_size);
        let follows = match &req.previous {
            // The writer was in `previous`: the chunk before the last, or an earlier
            // (full) one it had moved back to, with every chunk after it full.
            Some(c) => before
                .iter()
                .position(|h| *h == c.handle)
                .is_some_and(|p| length(&c.handle) == c.length && full(&before[p + 1..])),
            None => full(before),
        };
        follows.then_some(last)
    }

    /// Whether `req` asks again for a move its first ask made (the answer was lost):
    /// the writer was moved to the chunk asked for already, and the chunk `previous`
    /// names (if any), another one, holds the committed length it names (the first ask
    /// committed it). A writer moves only to another chunk than its own, committing
    /// the one it leaves, so no first ask looks like this.
    pub(super) fn retried_open(&self, ino: InodeId, f: &FileMeta, req: &OpenChunk) -> bool {
        let Some(&asked) = usize::try_from(req.index)
            .ok()
            .and_then(|i| f.chunks.get(i))
        else {
            return false;
        };
        self.open_chunks.get(&ino) == Some(&asked)
            && req.previous.is_none_or(|c| {
                c.handle != asked && self.chunks.get(c.handle).map(|i| i.length) == Some(c.length)
            })
    }

    /// A new chunk that commits no chunk before it goes first, or after a full one:
    /// every chunk before the last stays full (a writer that filled the last chunk
    /// commits it in the same request, as `previous`). So an `AddChunk` applied twice
    /// (its reply lost, the request sent again) is refused instead of adding a chunk
    /// behind an empty one.
    pub(super) fn check_full_end(&self, path: &str, f: &FileMeta) -> Result<()> {
        let Some(last) = f.chunks.last() else {
            return Ok(());
        };
        let length = self.chunks.get(*last).map_or(0, |c| c.length);
        if length < f.chunk_size {
            return Err(Error::bad_request(format!(
                "a new chunk of {path} after chunk {last}, which holds {length} of {} \
                 bytes: commit it as the previous chunk",
                f.chunk_size
            )));
        }
        Ok(())
    }

    /// The open chunk of `ino`, when its writer was granted it (a `GrantedPipeline`
    /// names it): the writer may hold acknowledged bytes there.
    pub(super) fn granted_chunk(&self, ino: InodeId, f: &FileMeta) -> Option<ChunkHandle> {
        let open = self.open_chunk_of(ino, f)?;
        self.pipelines
            .get(&ino)
            .is_some_and(|p| p.handle == open)
            .then_some(open)
    }

    /// A writer that leaves the chunk it was granted commits it: a request that moves
    /// it elsewhere without `previous` would drop the commit of its acknowledged bytes.
    pub(super) fn check_leaving(
        &self,
        path: &str,
        ino: InodeId,
        f: &FileMeta,
        previous: Option<&ChunkCommit>,
    ) -> Result<()> {
        match (self.granted_chunk(ino, f), previous) {
            (Some(h), None) => Err(Error::bad_request(format!(
                "leaving chunk {h} of {path}, which it was granted, without committing it"
            ))),
            _ => Ok(()),
        }
    }

    pub(super) fn offset_of(&self, f: &FileMeta, index: usize) -> u64 {
        f.chunks[..index.min(f.chunks.len())]
            .iter()
            .filter_map(|h| self.chunks.get(*h))
            .map(|c| c.length)
            .sum()
    }
}
