//! A slab of records by key: the master's tables of chunks and of inodes.
//!
//! Records live in fixed pages of slots, allocated whole as the table grows and never
//! moved, so growth copies nothing and a table is never half empty after a doubling
//! the way a hash map holding the records is. Freed slots are reused before the slab
//! grows. A hash index maps a key to its slot: a record costs its slot and an index
//! entry of 16 bytes (about 21 at the index's load factor).
//!
//! Keys are ids minted by the master from counters that start at 1, so the key 0
//! ([`SlabKey::VACANT`]) marks a free slot, whose value is [`SlabValue::vacant`].

use std::collections::HashMap;
use std::hash::Hash;

/// Slots per page: 4096 (352 KiB of 88-byte chunk slots, 416 KiB of 104-byte inode
/// slots).
pub const PAGE: usize = 4096;

/// A key of a slab: never [`Self::VACANT`] for a record.
pub trait SlabKey: Copy + Eq + Hash {
    const VACANT: Self;
}

/// The value a free slot holds (it should allocate nothing).
pub trait SlabValue {
    fn vacant() -> Self;
}

#[derive(Clone, Debug)]
struct Slot<K, V> {
    key: K,
    value: V,
}

/// Records by key in pages of slots. Two slabs are equal when they hold the same
/// records, wherever their slots are.
#[derive(Clone, Debug)]
pub struct Slab<K, V> {
    /// Key → slot number.
    index: HashMap<K, u32>,
    pages: Vec<Box<[Slot<K, V>]>>,
    /// Free slots below the high-water mark, reused before the slab grows.
    free: Vec<u32>,
    /// Slots ever used (the high-water mark).
    used: u32,
}

impl<K, V> Default for Slab<K, V> {
    fn default() -> Self {
        Self {
            index: HashMap::new(),
            pages: Vec::new(),
            free: Vec::new(),
            used: 0,
        }
    }
}

impl<K: SlabKey, V: SlabValue + PartialEq> PartialEq for Slab<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(k, v)| other.get(*k) == Some(v))
    }
}

impl<K: SlabKey, V: SlabValue + Eq> Eq for Slab<K, V> {}

impl<K: SlabKey, V: SlabValue> Slab<K, V> {
    fn slot(&self, n: u32) -> &Slot<K, V> {
        let n = n as usize;
        &self.pages[n / PAGE][n % PAGE]
    }

    fn slot_mut(&mut self, n: u32) -> &mut Slot<K, V> {
        let n = n as usize;
        &mut self.pages[n / PAGE][n % PAGE]
    }

    pub fn get(&self, k: K) -> Option<&V> {
        let n = *self.index.get(&k)?;
        Some(&self.slot(n).value)
    }

    pub fn get_mut(&mut self, k: K) -> Option<&mut V> {
        let n = *self.index.get(&k)?;
        Some(&mut self.slot_mut(n).value)
    }

    pub fn contains_key(&self, k: K) -> bool {
        self.index.contains_key(&k)
    }

    /// Adds a record under a new key; refuses the vacant key, a key in use, and a
    /// slab of 2^32 records.
    pub fn insert(&mut self, k: K, value: V) -> Result<(), SlabRefused> {
        if k == K::VACANT {
            return Err(SlabRefused::VacantKey);
        }
        if self.index.contains_key(&k) {
            return Err(SlabRefused::Exists);
        }
        let n = match self.free.pop() {
            Some(n) => n,
            None => {
                let n = self.used;
                let next = n.checked_add(1).ok_or(SlabRefused::Full)?;
                if n as usize == self.pages.len() * PAGE {
                    let page: Vec<Slot<K, V>> = (0..PAGE)
                        .map(|_| Slot {
                            key: K::VACANT,
                            value: V::vacant(),
                        })
                        .collect();
                    self.pages.push(page.into_boxed_slice());
                }
                self.used = next;
                n
            }
        };
        *self.slot_mut(n) = Slot { key: k, value };
        self.index.insert(k, n);
        Ok(())
    }

    pub fn remove(&mut self, k: K) -> Option<V> {
        let n = self.index.remove(&k)?;
        let slot = std::mem::replace(
            self.slot_mut(n),
            Slot {
                key: K::VACANT,
                value: V::vacant(),
            },
        );
        self.free.push(n);
        if self.index.is_empty() {
            // Nothing left: give the pages back.
            self.pages = Vec::new();
            self.free = Vec::new();
            self.used = 0;
        }
        Some(slot.value)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Every record, in slot order (no particular order of keys).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.pages
            .iter()
            .flat_map(|p| p.iter())
            .take(self.used as usize)
            .filter(|s| s.key != K::VACANT)
            .map(|s| (&s.key, &s.value))
    }

    /// Reserves room for `n` more records (a checkpoint being loaded).
    pub fn reserve(&mut self, n: usize) {
        self.index.reserve(n);
        let want = (self.used as usize).saturating_add(n);
        self.pages
            .reserve(want.div_ceil(PAGE).saturating_sub(self.pages.len()));
    }

    /// Pages allocated (tests).
    #[cfg(test)]
    pub fn pages(&self) -> usize {
        self.pages.len()
    }
}

/// Why [`Slab::insert`] refused a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlabRefused {
    VacantKey,
    Exists,
    Full,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct K(u64);
    impl SlabKey for K {
        const VACANT: Self = K(0);
    }
    impl SlabValue for String {
        fn vacant() -> Self {
            String::new()
        }
    }

    #[test]
    fn freed_slots_are_reused_and_slabs_compare_by_content() {
        let mut a: Slab<K, String> = Slab::default();
        let n = (PAGE + 10) as u64;
        for k in 1..=n {
            a.insert(K(k), k.to_string()).expect("insert");
        }
        assert_eq!(a.pages(), 2);
        assert_eq!(a.insert(K(3), "x".into()), Err(SlabRefused::Exists));
        assert_eq!(a.insert(K(0), "x".into()), Err(SlabRefused::VacantKey));
        for k in (1..=n).filter(|k| k % 2 == 0) {
            assert_eq!(a.remove(K(k)), Some(k.to_string()));
        }
        assert_eq!(a.remove(K(2)), None);
        for k in n + 1..=n + n / 2 {
            a.insert(K(k), k.to_string()).expect("insert");
        }
        assert_eq!(a.pages(), 2, "freed slots are filled before a new page");
        assert_eq!(a.iter().count(), a.len());
        let mut b: Slab<K, String> = Slab::default();
        for (k, v) in a.iter() {
            b.insert(*k, v.clone()).expect("insert");
        }
        assert_eq!(a, b);
        *b.get_mut(K(1)).expect("1") = "changed".into();
        assert_ne!(a, b);
        for k in a.iter().map(|(k, _)| *k).collect::<Vec<_>>() {
            a.remove(k);
        }
        assert!(a.is_empty());
        assert_eq!(a.pages(), 0, "an empty slab gives its pages back");
    }
}
