//! The chunk table: handle → current version, committed length and replicas.
//!
//! The version and length are persisted (log and checkpoint); the replica list is soft
//! state rebuilt from chunkserver registrations, reports and command replies. Each
//! replica carries the version its chunkserver last reported, so a replica that missed
//! a bump is recognisable as stale ([`classify`]) and never handed out; and whether
//! its reported length was below the chunk's committed length ([`Replica::short`]):
//! such a replica took a bump late (after the master gave up on it) and misses bytes
//! written under that version, so it is not served either.
//!
//! The record is kept small (the design budget is under 150 bytes per chunk in the
//! master): no strings, chunkservers as `u32`, up to three replicas inline. Records
//! live in a slab ([`crate::slab`]), so a chunk costs its slot (88 bytes) and an index
//! entry (16 bytes at the index's load factor) instead of a hash entry the size of the
//! record (half empty after each doubling) plus a separate allocation for its replicas.

use crate::slab::{Slab, SlabKey, SlabRefused, SlabValue};
use bincode::de::Decoder;
use bincode::enc::Encoder;
use bincode::error::{DecodeError, EncodeError};
use bincode::{Decode, Encode};
use smallvec::SmallVec;
use stampfs_proto::{ChunkHandle, ChunkVersion, ChunkserverId, ReplicaReport, ReplicaState};

/// One replica as the master knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica {
    /// The version the chunkserver last reported (or acknowledged a bump to).
    pub version: ChunkVersion,
    /// The chunkserver, as a compact index (chunkserver ids are minted by the master
    /// from a counter and always fit).
    pub server: u32,
    pub state: ReplicaState,
    /// The length last reported with `version` was below the chunk's committed length
    /// at the time. Every replica that took part in writing the committed bytes holds
    /// at least that many, so this one missed some: it is never handed out, copied
    /// from or used by lease recovery, and is replaced (see [`crate::health`]).
    pub short: bool,
}

impl Replica {
    pub fn server_id(&self) -> ChunkserverId {
        ChunkserverId(u64::from(self.server))
    }
}

/// The compact form of a chunkserver id, if it has one.
pub fn server_index(id: ChunkserverId) -> Option<u32> {
    u32::try_from(id.0).ok()
}

/// How a replica's version compares with the master's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaClass {
    /// At the master's version: may serve.
    Current,
    /// Below: it missed a bump; never served, to be deleted (invariant 4).
    Stale,
    /// Above: a version the master does not know, which means invariant 1 was broken.
    Ahead,
    /// At the master's version but shorter than the committed length
    /// ([`Replica::short`]): never served, replaced.
    Short,
}

/// Compares a replica's version with the master's.
pub fn classify(master: ChunkVersion, replica: ChunkVersion) -> ReplicaClass {
    use std::cmp::Ordering::*;
    match replica.cmp(&master) {
        Equal => ReplicaClass::Current,
        Less => ReplicaClass::Stale,
        Greater => ReplicaClass::Ahead,
    }
}

/// One chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    /// The current version: the highest ever minted for this chunk.
    pub version: ChunkVersion,
    /// Committed length (what the writer or recovery committed).
    pub length: u64,
    /// Replicas reported by chunkservers (soft state); three inline, more (an
    /// over-replicated chunk, a replication factor above three) on the heap.
    pub replicas: SmallVec<[Replica; 3]>,
    /// The owning file's replication factor (for under-replication checks).
    pub replication: u8,
}

impl ChunkInfo {
    pub fn new(version: ChunkVersion, replication: u8) -> Self {
        Self {
            version,
            length: 0,
            replicas: SmallVec::new(),
            replication,
        }
    }

    /// The replica on `server`.
    pub fn replica(&self, server: ChunkserverId) -> Option<&Replica> {
        self.replicas.iter().find(|r| r.server_id() == server)
    }

    /// How `r` compares with this chunk: its version, then its length.
    pub fn class_of(&self, r: &Replica) -> ReplicaClass {
        match classify(self.version, r.version) {
            ReplicaClass::Current if r.short => ReplicaClass::Short,
            c => c,
        }
    }

    /// Replicas at the current version that hold the committed length: the ones that
    /// may serve.
    pub fn current(&self) -> impl Iterator<Item = &Replica> {
        self.replicas
            .iter()
            .filter(move |r| self.class_of(r) == ReplicaClass::Current)
    }

    /// Replicas below the current version (to be deleted by the garbage collector).
    pub fn stale(&self) -> impl Iterator<Item = &Replica> {
        self.replicas
            .iter()
            .filter(move |r| classify(self.version, r.version) == ReplicaClass::Stale)
    }

    /// Records `server`'s replica at `version` (holding the committed length),
    /// replacing what was known.
    pub fn set_replica(&mut self, server: u32, version: ChunkVersion, state: ReplicaState) {
        self.put_replica(Replica {
            version,
            server,
            state,
            short: false,
        });
    }

    /// Records `server`'s replica as a report describes it, replacing what was known:
    /// short when its length is below the committed length.
    pub fn record_report(&mut self, server: u32, report: &ReplicaReport) {
        self.put_replica(Replica {
            version: report.version,
            server,
            state: report.state,
            short: report.length < self.length,
        });
    }

    fn put_replica(&mut self, r: Replica) {
        let server = r.server;
        if let Some(slot) = self.replicas.iter_mut().find(|x| x.server == server) {
            *slot = r;
        } else {
            self.replicas.push(r);
        }
    }

    /// Forgets `server`'s replica; returns whether there was one.
    pub fn remove_replica(&mut self, server: u32) -> bool {
        let before = self.replicas.len();
        self.replicas.retain(|x| x.server != server);
        if self.replicas.len() <= 3 {
            // Back inline once the extra replicas are gone.
            self.replicas.shrink_to_fit();
        }
        self.replicas.len() != before
    }
}

impl SlabKey for ChunkHandle {
    const VACANT: Self = ChunkHandle(0);
}

impl SlabValue for ChunkInfo {
    fn vacant() -> Self {
        ChunkInfo::new(ChunkVersion(0), 0)
    }
}

/// Every chunk, plus the handle counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkTable {
    chunks: Slab<ChunkHandle, ChunkInfo>,
    next_handle: u64,
}

impl Default for ChunkTable {
    fn default() -> Self {
        Self {
            chunks: Slab::default(),
            next_handle: 1,
        }
    }
}

impl ChunkTable {
    pub fn get(&self, h: ChunkHandle) -> Option<&ChunkInfo> {
        self.chunks.get(h)
    }

    pub fn get_mut(&mut self, h: ChunkHandle) -> Option<&mut ChunkInfo> {
        self.chunks.get_mut(h)
    }

    /// The handle the next new chunk gets. Never reused: the counter only grows, and
    /// it is restored from the log.
    pub fn next_handle(&self) -> ChunkHandle {
        ChunkHandle(self.next_handle)
    }

    /// Adds a chunk (advancing the handle counter past it).
    pub fn insert(&mut self, h: ChunkHandle, info: ChunkInfo) -> std::result::Result<(), String> {
        if h.0 != 0 && !self.chunks.contains_key(h) && h.0 < self.next_handle {
            // A handle below the counter was minted before: reusing it would be a bug.
            return Err(format!(
                "chunk {h} is below the handle counter {}",
                self.next_handle
            ));
        }
        self.place(h, info)?;
        self.next_handle = self.next_handle.max(h.0.saturating_add(1));
        Ok(())
    }

    /// Puts a new chunk into a free slot (the counter is the caller's business).
    fn place(&mut self, h: ChunkHandle, info: ChunkInfo) -> std::result::Result<(), String> {
        self.chunks.insert(h, info).map_err(|e| match e {
            SlabRefused::VacantKey => "chunk handle 0 is not a valid handle".to_string(),
            SlabRefused::Exists => format!("chunk {h} already exists"),
            SlabRefused::Full => "the chunk table is full (2^32 chunks)".to_string(),
        })
    }

    pub fn remove(&mut self, h: ChunkHandle) -> Option<ChunkInfo> {
        self.chunks.remove(h)
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Every chunk, in slot order (no particular order of handles).
    pub fn iter(&self) -> impl Iterator<Item = (&ChunkHandle, &ChunkInfo)> {
        self.chunks.iter()
    }
}

/// Checkpoint form: the counter, then `(handle, version, length, replication)` per
/// chunk. Replicas are soft state and are not written.
impl Encode for ChunkTable {
    fn encode<E: Encoder>(&self, e: &mut E) -> Result<(), EncodeError> {
        self.next_handle.encode(e)?;
        (self.len() as u64).encode(e)?;
        for (h, c) in self.iter() {
            h.encode(e)?;
            c.version.encode(e)?;
            c.length.encode(e)?;
            c.replication.encode(e)?;
        }
        Ok(())
    }
}

impl<C> Decode<C> for ChunkTable {
    fn decode<D: Decoder<Context = C>>(d: &mut D) -> Result<Self, DecodeError> {
        let next_handle = u64::decode(d)?;
        let n = u64::decode(d)?;
        let mut table = ChunkTable::default();
        table
            .chunks
            .reserve(usize::try_from(n.min(1 << 20)).unwrap_or(0));
        for _ in 0..n {
            let h = ChunkHandle::decode(d)?;
            let version = ChunkVersion::decode(d)?;
            let length = u64::decode(d)?;
            let replication = u8::decode(d)?;
            let info = ChunkInfo {
                version,
                length,
                replicas: SmallVec::new(),
                replication,
            };
            table
                .place(h, info)
                .map_err(|e| DecodeError::OtherString(format!("checkpoint chunk table: {e}")))?;
            // Never below a handle in use, whatever the counter says.
            table.next_handle = table.next_handle.max(h.0.saturating_add(1));
        }
        table.next_handle = table.next_handle.max(next_handle);
        Ok(table)
    }
}

bincode::impl_borrow_decode!(ChunkTable);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_chunk_record_is_compact() {
        assert!(
            std::mem::size_of::<ChunkInfo>() <= 80,
            "{}",
            std::mem::size_of::<ChunkInfo>()
        );
        assert_eq!(std::mem::size_of::<Replica>(), 16);
    }

    #[test]
    fn replicas_are_classified_by_version() {
        let mut c = ChunkInfo::new(ChunkVersion(5), 3);
        c.set_replica(1, ChunkVersion(5), ReplicaState::Writing);
        c.set_replica(2, ChunkVersion(4), ReplicaState::Finalized);
        c.set_replica(3, ChunkVersion(6), ReplicaState::Finalized);
        assert_eq!(c.current().map(|r| r.server).collect::<Vec<_>>(), vec![1]);
        assert_eq!(c.stale().map(|r| r.server).collect::<Vec<_>>(), vec![2]);
        assert_eq!(
            classify(ChunkVersion(5), ChunkVersion(6)),
            ReplicaClass::Ahead
        );
        c.set_replica(2, ChunkVersion(5), ReplicaState::Writing);
        assert_eq!(c.current().count(), 2);
        assert!(c.remove_replica(1));
        assert!(!c.remove_replica(1));
        assert_eq!(c.replicas.len(), 2);
    }

    #[test]
    fn handles_are_never_reused_and_the_table_round_trips() {
        let mut t = ChunkTable::default();
        assert_eq!(t.next_handle(), ChunkHandle(1));
        t.insert(ChunkHandle(1), ChunkInfo::new(ChunkVersion(1), 3))
            .expect("insert");
        t.insert(ChunkHandle(7), ChunkInfo::new(ChunkVersion(2), 2))
            .expect("insert");
        assert_eq!(t.next_handle(), ChunkHandle(8));
        t.remove(ChunkHandle(7));
        assert_eq!(t.next_handle(), ChunkHandle(8), "removal keeps the counter");
        assert!(t
            .insert(ChunkHandle(7), ChunkInfo::new(ChunkVersion(1), 1))
            .is_err());
        t.get_mut(ChunkHandle(1)).expect("c").length = 99;
        t.get_mut(ChunkHandle(1)).expect("c").set_replica(
            4,
            ChunkVersion(1),
            ReplicaState::Writing,
        );
        let bytes = bincode::encode_to_vec(&t, bincode::config::standard()).expect("encode");
        let (back, _): (ChunkTable, usize) =
            bincode::decode_from_slice(&bytes, bincode::config::standard()).expect("decode");
        assert_eq!(back.next_handle(), ChunkHandle(8));
        let c = back.get(ChunkHandle(1)).expect("chunk");
        assert_eq!(
            (c.version, c.length, c.replication),
            (ChunkVersion(1), 99, 3)
        );
        assert!(c.replicas.is_empty(), "replicas are soft state");
    }

    #[test]
    fn the_slab_reuses_freed_slots_and_compares_by_content() {
        let mut a = ChunkTable::default();
        let n = (crate::slab::PAGE + 10) as u64;
        for h in 1..=n {
            a.insert(ChunkHandle(h), ChunkInfo::new(ChunkVersion(h), 3))
                .expect("insert");
        }
        assert_eq!(a.chunks.pages(), 2);
        for h in (1..=n).filter(|h| h % 2 == 0) {
            assert_eq!(
                a.remove(ChunkHandle(h)).map(|c| c.version),
                Some(ChunkVersion(h))
            );
        }
        assert!(a.remove(ChunkHandle(2)).is_none());
        assert!(a.get(ChunkHandle(2)).is_none());
        // New chunks go into the freed slots: the slab does not grow.
        for h in n + 1..=n + n / 2 {
            a.insert(ChunkHandle(h), ChunkInfo::new(ChunkVersion(h), 3))
                .expect("insert");
        }
        assert_eq!(a.chunks.pages(), 2);
        assert_eq!(a.len(), n as usize);
        assert!(a
            .insert(ChunkHandle(0), ChunkInfo::new(ChunkVersion(1), 1))
            .is_err());
        let mut seen: Vec<u64> = a
            .iter()
            .map(|(h, c)| {
                assert_eq!(c.version.0, h.0);
                h.0
            })
            .collect();
        seen.sort_unstable();
        let mut want: Vec<u64> = (1..=n + n / 2).filter(|h| *h > n || h % 2 == 1).collect();
        want.sort_unstable();
        assert_eq!(seen, want);
        // The same chunks inserted in another order, in other slots: equal tables,
        // and the checkpoint form round-trips to an equal table.
        let mut b = ChunkTable::default();
        for h in want.iter().rev() {
            b.next_handle = 1;
            b.insert(ChunkHandle(*h), ChunkInfo::new(ChunkVersion(*h), 3))
                .expect("insert");
        }
        b.next_handle = a.next_handle;
        assert_eq!(a, b);
        b.get_mut(ChunkHandle(1)).expect("chunk").length = 5;
        assert_ne!(a, b);
        let bytes = bincode::encode_to_vec(&a, bincode::config::standard()).expect("encode");
        let (back, _): (ChunkTable, usize) =
            bincode::decode_from_slice(&bytes, bincode::config::standard()).expect("decode");
        assert_eq!(back, a);
        // Emptied, the table gives its pages back.
        for h in want {
            a.remove(ChunkHandle(h));
        }
        assert!(a.is_empty() && a.chunks.pages() == 0);
    }

    #[test]
    fn more_replicas_than_fit_inline_are_kept_and_dropped() {
        let mut c = ChunkInfo::new(ChunkVersion(3), 5);
        for s in 1..=5 {
            c.set_replica(s, ChunkVersion(3), ReplicaState::Finalized);
        }
        assert_eq!(c.current().count(), 5);
        assert!(c.replicas.spilled());
        for s in 1..=3 {
            assert!(c.remove_replica(s));
        }
        assert_eq!(
            c.replicas.iter().map(|r| r.server).collect::<Vec<_>>(),
            vec![4, 5]
        );
        assert!(!c.replicas.spilled(), "back inline");
    }
}
