//! A compact set of chunk handles: a chunkserver's replicas as the master knows them
//! (the reverse of the chunk table's replica lists).
//!
//! Handles come from one counter, so each chunkserver's set is a sample of a dense
//! range: a compressed bitmap (`roaring`) holds it in about two bytes a handle where
//! the sample is sparse and one bit a handle where it is dense, against about fifteen
//! bytes for a hash set at its usual load.

use roaring::RoaringTreemap;
use stampfs_proto::ChunkHandle;

/// A set of [`ChunkHandle`]s with the parts of `HashSet`'s interface the master uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandleSet(RoaringTreemap);

impl HandleSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `h`; false when it was there already.
    pub fn insert(&mut self, h: ChunkHandle) -> bool {
        self.0.insert(h.0)
    }

    /// Removes `h`; false when it was not there.
    pub fn remove(&mut self, h: &ChunkHandle) -> bool {
        self.0.remove(h.0)
    }

    pub fn contains(&self, h: &ChunkHandle) -> bool {
        self.0.contains(h.0)
    }

    pub fn len(&self) -> usize {
        usize::try_from(self.0.len()).unwrap_or(usize::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The handles in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = ChunkHandle> + '_ {
        self.0.iter().map(ChunkHandle)
    }
}

impl FromIterator<ChunkHandle> for HandleSet {
    fn from_iter<I: IntoIterator<Item = ChunkHandle>>(iter: I) -> Self {
        let mut s = Self::new();
        for h in iter {
            s.insert(h);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_set_of_handles() {
        let mut s = HandleSet::new();
        assert!(s.is_empty());
        assert!(s.insert(ChunkHandle(7)));
        assert!(!s.insert(ChunkHandle(7)));
        assert!(s.insert(ChunkHandle(u64::MAX - 1)), "handles past 2^32 too");
        assert!(s.insert(ChunkHandle(3)));
        assert_eq!(s.len(), 3);
        assert!(s.contains(&ChunkHandle(3)));
        assert!(!s.contains(&ChunkHandle(4)));
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            vec![ChunkHandle(3), ChunkHandle(7), ChunkHandle(u64::MAX - 1)]
        );
        assert!(s.remove(&ChunkHandle(7)));
        assert!(!s.remove(&ChunkHandle(7)));
        assert_eq!(s.len(), 2);
        let t: HandleSet = [ChunkHandle(3), ChunkHandle(u64::MAX - 1)]
            .into_iter()
            .collect();
        assert_eq!(s, t);
    }
}
