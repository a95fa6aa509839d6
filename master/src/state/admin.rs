//! Administration of the data, as methods of [`MasterState`]: a file's replication
//! factor (`stampfs setrep`) and the decommission of chunkservers.
//!
//! **Replication factor.** `Record::SetReplication` sets the factor of the file and of
//! every chunk it has; the replica-health pass then copies (under-replicated) or trims
//! (over-replicated, from the fullest chunkservers) as it does for any chunk. Chunks
//! the file gets later take the file's factor.
//!
//! **Decommission** (as HDFS's): a chunkserver in [`MasterState::decommissioning`]
//! (persisted, `Record::Decommission`) is no candidate for new replicas (placement
//! of new chunks, targets of copies), and its replicas do not count toward their
//! chunk's factor, so the health pass copies each of its chunks elsewhere. Its
//! replicas stay where they are, readable and usable as copy sources, and are never
//! trimmed as surplus: an operator stops the chunkserver once it is
//! [`DecommissionState::Decommissioned`] (every chunk it holds has its factor on other
//! live chunkservers). Recommissioning (`on: false`) makes it a candidate again and
//! its replicas count again; chunks then over-replicated are trimmed as usual.

use super::{MasterState, Record};
use crate::chunk_table::ReplicaClass;
use crate::config::MAX_REPLICATION;
use crate::error::{Error, Result};
use crate::health::is_live;
use crate::namespace;
use crate::placement::Candidate;
use stampfs_proto::{ChunkserverId, DecommissionState, FileStatus, ReplicaState, SetReplication};

impl MasterState {
    /// `stampfs setrep`: the replication factor of the file at `req.path` (and of its
    /// chunks) becomes `req.replication`. Needs write permission on the file.
    pub fn set_replication(&mut self, req: &SetReplication, now_ms: u64) -> Result<FileStatus> {
        let comps = namespace::components(&req.path)?;
        let path = namespace::join(&comps);
        if req.replication == 0 || req.replication > MAX_REPLICATION {
            return Err(Error::bad_request(format!(
                "replication factor {} is not between 1 and {MAX_REPLICATION}",
                req.replication
            )));
        }
        self.check_access(&path, req.caller.as_ref(), crate::perm::WRITE)?;
        let ino = self.ns.resolve(&comps)?;
        let (current, per_replica) = match self
            .ns
            .get(ino)
            .map(|i| (i.as_file(), i.as_dir().is_some()))
        {
            Some((Some(f), _)) => (
                f.replication,
                self.charged_bytes(f) / u64::from(f.replication.max(1)),
            ),
            Some((None, true)) => return Err(Error::IsADirectory { path }),
            _ => {
                return Err(Error::NotSupported {
                    reason: format!("{path} is not a file: only files have a replication factor"),
                })
            }
        };
        if req.replication > current {
            let more = u64::from(req.replication - current);
            self.check_file_growth(ino, per_replica.saturating_mul(more))?;
        }
        if current != req.replication {
            self.commit(
                Record::SetReplication {
                    inode: ino,
                    replication: req.replication,
                },
                now_ms,
            )?;
        }
        self.status(path, ino)
    }

    /// Starts (`on`) or ends the decommission of chunkserver `server`; answers its
    /// state after the change. A chunkserver the master never gave an id is an error.
    pub fn decommission(
        &mut self,
        server: ChunkserverId,
        on: bool,
        now_ms: u64,
    ) -> Result<DecommissionState> {
        if !self.servers.contains_key(&server) {
            return Err(Error::NotFound {
                path: format!("chunkserver {server}"),
            });
        }
        if self.decommissioning.contains(&server) != on {
            self.commit(Record::Decommission { server, on }, now_ms)?;
        }
        Ok(self.decommission_state(server, now_ms))
    }

    /// Live chunkservers that may take a new replica of `size` bytes: those
    /// [`crate::registry::Registry::candidates`] names, less the ones being
    /// decommissioned.
    pub fn placement_candidates(&self, now_ms: u64, size: u64) -> Vec<Candidate> {
        let mut c = self
            .registry
            .candidates(now_ms, self.settings.dead_after_ms, size);
        if !self.decommissioning.is_empty() {
            c.retain(|c| !self.decommissioning.contains(&c.id));
        }
        c
    }

    /// Where chunkserver `server` stands in its decommission. Walks its replicas
    /// (under the state lock: O(its replicas), paid by each report and status page
    /// while it is being decommissioned): a chunk counts as waiting while fewer than
    /// its factor of good replicas sit on other live chunkservers that are not being
    /// decommissioned, good as the health pass counts them (current, finalized, no
    /// deletion in flight, no corrupt mark).
    pub fn decommission_state(&self, server: ChunkserverId, now_ms: u64) -> DecommissionState {
        if !self.decommissioning.contains(&server) {
            return DecommissionState::InService;
        }
        let Some(cs) = self.registry.get(server) else {
            // Not heard from since this master started: which chunks it holds is not
            // known, so it cannot be called safe to stop.
            return DecommissionState::Unreported;
        };
        let dead_after = self.settings.dead_after_ms;
        let mut waiting = 0u64;
        for h in cs.replicas.iter() {
            let Some(info) = self.chunks.get(h) else {
                continue;
            };
            let elsewhere = info
                .replicas
                .iter()
                .filter(|r| {
                    let id = r.server_id();
                    id != server
                        && !self.decommissioning.contains(&id)
                        && info.class_of(r) == ReplicaClass::Current
                        && r.state == ReplicaState::Finalized
                        && is_live(&self.registry, id, now_ms, dead_after)
                        && !self.health.deleting(id, h)
                        && !self.health.is_corrupt(h, id, r.version)
                })
                .count();
            if elsewhere < usize::from(info.replication.max(1)) {
                waiting += 1;
            }
        }
        if waiting == 0 {
            DecommissionState::Decommissioned
        } else {
            DecommissionState::Decommissioning { waiting }
        }
    }
}
