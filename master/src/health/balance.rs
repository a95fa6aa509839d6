//! The balancer (`stampfs admin balance`), as HDFS's: while it runs, each health
//! pass moves replicas from chunkservers whose use (used / capacity) is more than
//! the threshold above the cluster's to those more than the threshold below it, a
//! move being a copy (the re-replication machinery, under its per-chunkserver stream
//! caps: that bounds the rate) and then, once the copy is reported, the deletion of
//! the source's replica by the over-replication rule, which prefers the replica the
//! move came from ([`super::Tracker::moved_from`]). With nobody over (or nobody
//! under) by more than the threshold, the pass says the cluster is balanced and the
//! balancer stops.
//!
//! When nobody is over by the threshold but someone is under (a new, empty
//! chunkserver in a cluster evenly used), the sources are every chunkserver above
//! the average; the other way round, the targets are every one below it.
//!
//! Only chunks that are quiet move: every replica current, finalized and on a live
//! chunkserver, exactly the replication factor of them, no copy or deletion in
//! flight. Chunkservers being decommissioned are neither sources nor targets. Soft
//! state: a restarted master (or a new leader) does not balance until asked again.

use crate::registry::Chunkserver;
use crate::state::MasterState;
use stampfs_proto::{BalanceStatus, ChunkserverId};

/// Most moves one pass orders (besides the stream caps).
pub const MAX_MOVES_PER_PASS: usize = 64;
/// Replicas of one source looked at per pass for a chunk that can move.
pub const SCAN_PER_SOURCE: usize = 4096;

/// A running balancer (soft state in [`MasterState::balancer`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Balancer {
    pub threshold_pct: u8,
    pub moves_ordered: u64,
    /// A pass found nothing to move: it orders no more (copies in flight finish).
    pub done: bool,
    /// What the last pass found.
    pub last: Option<Spread>,
}

/// How the live chunkservers' use spreads around the cluster's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spread {
    /// The cluster's use, in parts per million.
    pub average_ppm: u32,
    /// Sources, most used first, and targets, least used first.
    pub sources: Vec<ChunkserverId>,
    pub targets: Vec<ChunkserverId>,
    /// Over and under the average by more than the threshold.
    pub over: u32,
    pub under: u32,
}

impl Spread {
    /// Nothing to move.
    pub fn balanced(&self) -> bool {
        self.over == 0 && self.under == 0
    }
}

fn use_ppm(c: &Chunkserver) -> u64 {
    if c.capacity == 0 {
        return 0;
    }
    (u128::from(c.used) * 1_000_000 / u128::from(c.capacity)) as u64
}

/// Where replicas should move from and to, with `threshold_pct` points of slack.
/// Pure. Chunkservers that report no capacity, are dead or are being
/// decommissioned take no part.
pub fn spread(st: &MasterState, now_ms: u64, threshold_pct: u8) -> Spread {
    let dead_after = st.settings.dead_after_ms;
    let servers: Vec<&Chunkserver> = st
        .registry
        .iter()
        .filter(|c| c.capacity > 0 && c.is_live(now_ms, dead_after))
        .filter(|c| !st.decommissioning.contains(&c.id))
        .collect();
    let used: u128 = servers.iter().map(|c| u128::from(c.used)).sum();
    let capacity: u128 = servers.iter().map(|c| u128::from(c.capacity)).sum();
    if capacity == 0 {
        return Spread::default();
    }
    let average = (used * 1_000_000 / capacity) as u64;
    let slack = u64::from(threshold_pct) * 10_000;
    let mut above: Vec<(u64, ChunkserverId)> = Vec::new();
    let mut below: Vec<(u64, ChunkserverId)> = Vec::new();
    let (mut over, mut under) = (0u32, 0u32);
    for c in &servers {
        let u = use_ppm(c);
        if u > average {
            above.push((u, c.id));
            if u > average + slack {
                over += 1;
            }
        } else if u < average {
            below.push((u, c.id));
            if u + slack < average {
                under += 1;
            }
        }
    }
    if over == 0 && under == 0 {
        return Spread {
            average_ppm: average as u32,
            ..Spread::default()
        };
    }
    // Most used sources first, least used targets first; with somebody over the
    // threshold only those are sources, with somebody under only those are targets.
    above.sort_by(|a, b| b.cmp(a));
    below.sort();
    let sources = above
        .iter()
        .filter(|(u, _)| over == 0 || *u > average + slack)
        .map(|(_, id)| *id)
        .collect();
    let targets = below
        .iter()
        .filter(|(u, _)| under == 0 || u + slack < average)
        .map(|(_, id)| *id)
        .collect();
    Spread {
        average_ppm: average as u32,
        sources,
        targets,
        over,
        under,
    }
}

impl Balancer {
    /// For `admin balance` and the report (`None`: not running).
    pub fn status(b: Option<&Balancer>) -> BalanceStatus {
        match b {
            None => BalanceStatus::default(),
            Some(b) => {
                let last = b.last.clone().unwrap_or_default();
                BalanceStatus {
                    running: !b.done,
                    threshold_pct: b.threshold_pct,
                    moves_ordered: b.moves_ordered,
                    average_ppm: last.average_ppm,
                    over: last.over,
                    under: last.under,
                    balanced: b.last.as_ref().is_some_and(Spread::balanced),
                }
            }
        }
    }
}
