//! The chunkserver registry: who is up, where they listen, how full they are.
//!
//! Soft state fed by registrations and heartbeats (the ids themselves are persisted by
//! the state machine). A chunkserver with no heartbeat for `dead_after` is dead: its
//! replicas stay in the chunk table but are not handed out and it gets no new chunks.

use crate::handle_set::HandleSet;
use crate::placement::Candidate;
use stampfs_proto::{ChunkHandle, ChunkserverAddr, ChunkserverId, ReplicaReport};
use std::collections::HashMap;

/// One registered chunkserver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunkserver {
    pub id: ChunkserverId,
    pub addr: String,
    pub capacity: u64,
    pub used: u64,
    /// Bytes promised to chunks placed here since the last heartbeat, so that one
    /// server does not take every placement until it reports its new usage.
    pub reserved: u64,
    pub last_heartbeat_ms: u64,
    pub active_streams: u32,
    /// Replica count from the last heartbeat.
    pub reported_replicas: u64,
    /// Handles of the replicas it reported (the reverse of the chunk table's lists).
    pub replicas: HandleSet,
    /// Reported replicas of chunks the master does not know (for the garbage collector).
    pub orphans: Vec<ReplicaReport>,
    /// Whether the liveness monitor last saw it dead (to log transitions once).
    pub marked_dead: bool,
    /// Raised by every registration and by the start of every full report applied in
    /// batches: a batched report that finds it changed stops (a newer report, or the
    /// registration's, replaces it).
    pub report_epoch: u64,
    /// Replicas recorded from this chunkserver's own answers to commands (a bump, a
    /// finalize, a recovery's seal), each with the master's acknowledgement clock when
    /// recorded ([`crate::state::MasterState::ack_mark`]), until a report built after
    /// that answer covers them. A report built before the command ran may arrive
    /// after its answer: it must not take such a replica away for omitting it.
    pub acked: HashMap<ChunkHandle, u64>,
    /// The highest mark up to which `acked` was forgotten (at a heartbeat, or once a
    /// report was applied): a report marked below it cannot tell which of the replicas
    /// it omits it never saw, and takes none away.
    pub covered: u64,
}

impl Chunkserver {
    /// Heard from within `dead_after_ms`.
    pub fn is_live(&self, now_ms: u64, dead_after_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_heartbeat_ms) < dead_after_ms
    }

    /// Free bytes for placement.
    pub fn free(&self) -> u64 {
        self.capacity
            .saturating_sub(self.used.saturating_add(self.reserved))
    }

    pub fn addr(&self) -> ChunkserverAddr {
        ChunkserverAddr {
            id: self.id,
            addr: self.addr.clone(),
        }
    }
}

/// Every chunkserver registered since the master started.
#[derive(Debug, Default)]
pub struct Registry {
    servers: HashMap<ChunkserverId, Chunkserver>,
}

impl Registry {
    /// Registers (or re-registers) a chunkserver; its replica list starts empty.
    pub fn register(
        &mut self,
        id: ChunkserverId,
        addr: &str,
        capacity: u64,
        used: u64,
        now_ms: u64,
    ) {
        let cs = self.servers.entry(id).or_insert_with(|| Chunkserver {
            id,
            addr: String::new(),
            capacity: 0,
            used: 0,
            reserved: 0,
            last_heartbeat_ms: now_ms,
            active_streams: 0,
            reported_replicas: 0,
            replicas: HandleSet::new(),
            orphans: Vec::new(),
            marked_dead: false,
            report_epoch: 0,
            acked: HashMap::new(),
            covered: 0,
        });
        cs.addr = addr.to_string();
        cs.capacity = capacity;
        cs.used = used;
        cs.reserved = 0;
        cs.last_heartbeat_ms = now_ms;
        cs.marked_dead = false;
        cs.report_epoch += 1;
    }

    /// Records a heartbeat; false when the server is not registered (the master
    /// restarted and it must register again).
    pub fn heartbeat(
        &mut self,
        id: ChunkserverId,
        capacity: u64,
        used: u64,
        replica_count: u64,
        active_streams: u32,
        now_ms: u64,
    ) -> bool {
        let Some(cs) = self.servers.get_mut(&id) else {
            return false;
        };
        cs.capacity = capacity;
        cs.used = used;
        cs.reserved = 0;
        cs.reported_replicas = replica_count;
        cs.active_streams = active_streams;
        cs.last_heartbeat_ms = cs.last_heartbeat_ms.max(now_ms);
        true
    }

    pub fn get(&self, id: ChunkserverId) -> Option<&Chunkserver> {
        self.servers.get(&id)
    }

    pub fn get_mut(&mut self, id: ChunkserverId) -> Option<&mut Chunkserver> {
        self.servers.get_mut(&id)
    }

    /// The address of a live chunkserver.
    pub fn live_addr(&self, id: ChunkserverId, now_ms: u64, dead_after_ms: u64) -> Option<&str> {
        self.servers
            .get(&id)
            .filter(|c| c.is_live(now_ms, dead_after_ms))
            .map(|c| c.addr.as_str())
    }

    /// Live chunkservers that can take a chunk of `chunk_size` bytes. A server that
    /// reports a capacity but has less than a chunk free is left out; one that reports
    /// no capacity at all (unknown) is kept, with zero free space.
    pub fn candidates(&self, now_ms: u64, dead_after_ms: u64, chunk_size: u64) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = self
            .servers
            .values()
            .filter(|c| c.is_live(now_ms, dead_after_ms))
            .filter(|c| c.capacity == 0 || c.free() >= chunk_size)
            .map(|c| Candidate {
                id: c.id,
                free: c.free(),
            })
            .collect();
        out.sort_by_key(|c| c.id);
        out
    }

    /// Number of live chunkservers.
    pub fn live_count(&self, now_ms: u64, dead_after_ms: u64) -> usize {
        self.servers
            .values()
            .filter(|c| c.is_live(now_ms, dead_after_ms))
            .count()
    }

    /// Promises `bytes` of `id`'s free space to a new chunk until its next heartbeat.
    pub fn reserve(&mut self, id: ChunkserverId, bytes: u64) {
        if let Some(cs) = self.servers.get_mut(&id) {
            cs.reserved = cs.reserved.saturating_add(bytes);
        }
    }

    /// Liveness changes since the last call: `(id, now_live)`.
    pub fn liveness_changes(
        &mut self,
        now_ms: u64,
        dead_after_ms: u64,
    ) -> Vec<(ChunkserverId, bool)> {
        let mut out = Vec::new();
        for cs in self.servers.values_mut() {
            let live = cs.is_live(now_ms, dead_after_ms);
            if live == cs.marked_dead {
                cs.marked_dead = !live;
                out.push((cs.id, live));
            }
        }
        out.sort_by_key(|(id, _)| *id);
        out
    }

    pub fn iter(&self) -> impl Iterator<Item = &Chunkserver> {
        self.servers.values()
    }

    /// Whether a leader that took the lead at `since_ms` has heard from enough
    /// chunkservers to place a write: `want` of them (all `known` ones, the
    /// chunkservers the log ever registered, if there are fewer), and every one of
    /// `named` (a pipeline's survivors).
    pub fn heard_since(
        &self,
        since_ms: u64,
        want: usize,
        known: usize,
        named: &[ChunkserverId],
    ) -> bool {
        let heard = |c: &Chunkserver| c.last_heartbeat_ms >= since_ms;
        let count = self.servers.values().filter(|c| heard(c)).count();
        count >= want.min(known)
            && named
                .iter()
                .all(|id| self.servers.get(id).is_some_and(heard))
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEAD: u64 = 10_000;

    #[test]
    fn servers_die_without_heartbeats_and_come_back() {
        let mut r = Registry::default();
        let id = ChunkserverId(1);
        r.register(id, "127.0.0.1:1", 100, 10, 0);
        assert!(r.live_addr(id, 9_999, DEAD).is_some());
        assert!(r.live_addr(id, 10_000, DEAD).is_none());
        assert_eq!(r.liveness_changes(10_000, DEAD), vec![(id, false)]);
        assert!(r.liveness_changes(11_000, DEAD).is_empty(), "reported once");
        assert!(r.heartbeat(id, 100, 20, 3, 0, 12_000));
        assert_eq!(r.liveness_changes(12_000, DEAD), vec![(id, true)]);
        assert!(
            !r.heartbeat(ChunkserverId(2), 1, 1, 0, 0, 12_000),
            "unknown"
        );
    }

    #[test]
    fn a_new_leader_places_writes_once_it_heard_from_enough_chunkservers() {
        // Four chunkservers in the log; a new leader that heard from none of them.
        let empty = Registry::default();
        assert!(!empty.heard_since(5_000, 3, 4, &[]));
        assert!(empty.heard_since(5_000, 3, 0, &[]), "a cluster without any");
        let mut r = Registry::default();
        // Heard from before the lead was taken at 5 000.
        for id in 1..=4 {
            r.register(ChunkserverId(id), "a", 1000, 0, 1_000);
        }
        assert!(!r.heard_since(5_000, 3, 4, &[]));
        assert!(r.heard_since(5_000, 0, 4, &[]), "nothing wanted");
        r.heartbeat(ChunkserverId(1), 1000, 0, 0, 0, 5_000);
        r.heartbeat(ChunkserverId(2), 1000, 0, 0, 0, 5_200);
        assert!(!r.heard_since(5_000, 3, 4, &[]));
        assert!(r.heard_since(5_000, 2, 4, &[ChunkserverId(1)]));
        assert!(
            !r.heard_since(5_000, 2, 4, &[ChunkserverId(3)]),
            "a survivor not heard from yet"
        );
        assert!(!r.heard_since(5_000, 1, 4, &[ChunkserverId(9)]), "unknown");
        r.heartbeat(ChunkserverId(3), 1000, 0, 0, 0, 5_400);
        assert!(r.heard_since(5_000, 3, 4, &[ChunkserverId(3)]));
        // Wanting more than the log knows: all of them.
        let mut small = Registry::default();
        small.register(ChunkserverId(1), "a", 1000, 0, 6_000);
        assert!(small.heard_since(5_000, 3, 1, &[]));
        assert!(!small.heard_since(5_000, 3, 2, &[]));
    }

    #[test]
    fn candidates_are_live_with_room_and_reservations_count() {
        let mut r = Registry::default();
        r.register(ChunkserverId(1), "a", 1000, 100, 0);
        r.register(ChunkserverId(2), "b", 1000, 990, 0);
        r.register(ChunkserverId(3), "c", 0, 0, 0);
        r.register(ChunkserverId(4), "d", 1000, 0, 0);
        r.heartbeat(ChunkserverId(4), 1000, 0, 0, 0, 0);
        let c = r.candidates(5_000, DEAD, 64);
        let ids: Vec<_> = c.iter().map(|c| c.id.0).collect();
        assert_eq!(ids, vec![1, 3, 4], "b is full; c reports no capacity");
        r.reserve(ChunkserverId(1), 850);
        assert_eq!(r.candidates(5_000, DEAD, 64).len(), 2, "a is now full");
        r.heartbeat(ChunkserverId(1), 1000, 100, 0, 0, 6_000);
        assert_eq!(
            r.candidates(6_000, DEAD, 64).len(),
            3,
            "heartbeat clears it"
        );
        assert!(r.candidates(20_000, DEAD, 64).is_empty(), "all dead");
    }
}
