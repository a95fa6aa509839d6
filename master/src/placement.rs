//! Replica placement: which chunkservers get a new chunk.
//!
//! A pure function of the live chunkservers' free space and a random source: distinct
//! servers, most free space first, chosen at random among near-equals (within
//! [`NEAR_EQUAL_PERCENT`] of the emptiest remaining server), so that servers of similar
//! fill share the load instead of one taking every chunk until its next heartbeat.

use rand::Rng;
use stampfs_proto::ChunkserverId;

/// Servers whose free space is within this percentage of the best remaining one are
/// treated as equals.
pub const NEAR_EQUAL_PERCENT: u64 = 10;

/// A live chunkserver that may receive a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: ChunkserverId,
    /// Free bytes (capacity minus used minus space promised to recent placements).
    pub free: u64,
}

/// The chosen servers, in pipeline order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub targets: Vec<ChunkserverId>,
    /// Fewer targets than the replication factor (but at least the minimum).
    pub under_replicated: bool,
}

/// Too few live chunkservers for the minimum replication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotEnough {
    pub live: u32,
    pub needed: u32,
}

/// Chooses up to `replication` distinct servers among `candidates`; fails when fewer
/// than `min` distinct servers are available. `min` is capped at `replication`.
pub fn choose<R: Rng + ?Sized>(
    candidates: &[Candidate],
    replication: usize,
    min: usize,
    rng: &mut R,
) -> Result<Placement, NotEnough> {
    // Distinct servers, the first entry of each kept (the sort is stable). Sorting,
    // not a scan of what was kept so far: that was quadratic in the number of
    // chunkservers, and with a thousand of them the largest cost of `add_chunk`.
    let mut pool: Vec<Candidate> = candidates.to_vec();
    pool.sort_by_key(|c| c.id);
    pool.dedup_by_key(|c| c.id);
    let min = min.min(replication);
    if pool.len() < min || replication == 0 {
        return Err(NotEnough {
            live: u32::try_from(pool.len()).unwrap_or(u32::MAX),
            needed: u32::try_from(min.max(1)).unwrap_or(u32::MAX),
        });
    }
    // Most free first; ties broken by id so the order is a function of the input.
    pool.sort_by(|a, b| b.free.cmp(&a.free).then(a.id.cmp(&b.id)));
    let mut targets = Vec::with_capacity(replication.min(pool.len()));
    while targets.len() < replication && !pool.is_empty() {
        let best = pool[0].free;
        let floor = best - best / 100 * NEAR_EQUAL_PERCENT;
        let equals = pool.iter().take_while(|c| c.free >= floor).count().max(1);
        let pick = rng.gen_range(0..equals);
        targets.push(pool.remove(pick).id);
    }
    Ok(Placement {
        under_replicated: targets.len() < replication,
        targets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::collections::HashSet;

    const GIB: u64 = 1 << 30;

    fn cand(id: u64, free_gib: u64) -> Candidate {
        Candidate {
            id: ChunkserverId(id),
            free: free_gib * GIB,
        }
    }

    #[test]
    fn picks_distinct_servers_most_free_first() {
        let cs = [cand(1, 10), cand(2, 100), cand(3, 50), cand(4, 1)];
        for seed in 0..50 {
            let p = choose(&cs, 3, 1, &mut StdRng::seed_from_u64(seed)).expect("enough");
            assert_eq!(
                p.targets,
                vec![ChunkserverId(2), ChunkserverId(3), ChunkserverId(1)]
            );
            assert!(!p.under_replicated);
        }
    }

    #[test]
    fn near_equals_are_randomized() {
        let cs = [cand(1, 100), cand(2, 95), cand(3, 99), cand(4, 10)];
        let mut firsts = HashSet::new();
        for seed in 0..200 {
            let p = choose(&cs, 3, 1, &mut StdRng::seed_from_u64(seed)).expect("enough");
            let set: HashSet<_> = p.targets.iter().copied().collect();
            assert_eq!(set.len(), 3, "distinct");
            assert!(
                !set.contains(&ChunkserverId(4)),
                "the full one is never chosen"
            );
            firsts.insert(p.targets[0]);
        }
        assert_eq!(firsts.len(), 3, "each near-equal server leads sometimes");
    }

    #[test]
    fn duplicates_in_the_input_count_once() {
        let cs = [cand(1, 10), cand(1, 10), cand(2, 5)];
        let p = choose(&cs, 3, 2, &mut StdRng::seed_from_u64(1)).expect("two distinct");
        assert_eq!(p.targets.len(), 2);
        assert!(p.under_replicated);
    }

    #[test]
    fn a_duplicate_counts_with_its_first_entry() {
        // Server 1 listed first as nearly full, then as empty: the first entry stands,
        // so server 2 (more free space) leads.
        let cs = [cand(1, 1), cand(2, 50), cand(1, 100)];
        for seed in 0..20 {
            let p = choose(&cs, 2, 1, &mut StdRng::seed_from_u64(seed)).expect("enough");
            assert_eq!(p.targets, vec![ChunkserverId(2), ChunkserverId(1)]);
        }
    }

    #[test]
    fn fewer_than_replication_but_at_least_min_is_under_replicated() {
        let cs = [cand(1, 10), cand(2, 10)];
        let p = choose(&cs, 3, 2, &mut StdRng::seed_from_u64(1)).expect("min met");
        assert_eq!(p.targets.len(), 2);
        assert!(p.under_replicated);
    }

    #[test]
    fn fewer_than_min_is_not_enough() {
        let cs = [cand(1, 10)];
        assert_eq!(
            choose(&cs, 3, 2, &mut StdRng::seed_from_u64(1)),
            Err(NotEnough { live: 1, needed: 2 })
        );
        assert_eq!(
            choose(&[], 3, 1, &mut StdRng::seed_from_u64(1)),
            Err(NotEnough { live: 0, needed: 1 })
        );
    }

    #[test]
    fn min_is_capped_at_replication() {
        let cs = [cand(1, 10)];
        let p = choose(&cs, 1, 3, &mut StdRng::seed_from_u64(1)).expect("replication 1");
        assert_eq!(p.targets, vec![ChunkserverId(1)]);
        assert!(!p.under_replicated);
    }

    #[test]
    fn zero_free_space_servers_still_form_a_group() {
        let cs = [cand(1, 0), cand(2, 0)];
        let p = choose(&cs, 2, 1, &mut StdRng::seed_from_u64(3)).expect("enough");
        assert_eq!(p.targets.len(), 2);
    }
}
