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
/// Replicas looked at per pass for chunks that can move (all sources together; each
/// source's scan goes on where the last pass left it).
pub const SCAN_PER_PASS: usize = 4096;
/// Passes in a row that moved nothing, with no copy in flight and the cluster not
/// balanced, after which the balancer gives up (nothing it may move would help).
pub const IDLE_PASSES: u32 = 5;

/// A running balancer (soft state in [`MasterState::balancer`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Balancer {
    pub threshold_pct: u8,
    pub moves_ordered: u64,
    /// It orders no more (copies in flight finish): the cluster is balanced, or it
    /// gave up (`stuck`).
    pub done: bool,
    /// It gave up: [`IDLE_PASSES`] passes in a row could move nothing.
    pub stuck: bool,
    /// Passes in a row that moved nothing.
    pub idle: u32,
    /// Where each source's next scan starts: after this handle (0: from its first).
    pub after: std::collections::BTreeMap<ChunkserverId, u64>,
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
    // More used than its capacity (a report of an overfull disk) is full.
    let used = c.used.min(c.capacity);
    u64::try_from(u128::from(used) * 1_000_000 / u128::from(c.capacity)).unwrap_or(1_000_000)
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
    let used: u128 = servers
        .iter()
        .map(|c| u128::from(c.used.min(c.capacity)))
        .sum();
    let capacity: u128 = servers.iter().map(|c| u128::from(c.capacity)).sum();
    if capacity == 0 {
        return Spread::default();
    }
    let average = u64::try_from(used * 1_000_000 / capacity).unwrap_or(1_000_000);
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
            average_ppm: u32::try_from(average).unwrap_or(1_000_000),
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
        average_ppm: u32::try_from(average).unwrap_or(1_000_000),
        sources,
        targets,
        over,
        under,
    }
}

/// What one pass's balancing phase found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub spread: Spread,
    /// Moves ordered.
    pub moves: u64,
    /// Where each source's next scan starts (see [`Balancer::after`]).
    pub cursors: Vec<(ChunkserverId, u64)>,
    /// Copies (any) were in flight when the phase began.
    pub copies_in_flight: bool,
}

/// What [`Balancer::after_pass`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Running,
    Balanced,
    Stuck,
}

impl Balancer {
    /// Takes in what a pass's balancing phase did. Pure.
    pub fn after_pass(&mut self, step: &Step) -> Outcome {
        self.moves_ordered += step.moves;
        for (src, after) in &step.cursors {
            self.after.insert(*src, *after);
        }
        self.last = Some(step.spread.clone());
        if step.spread.balanced() {
            self.done = true;
            return Outcome::Balanced;
        }
        if step.moves == 0 && !step.copies_in_flight {
            self.idle += 1;
        } else {
            self.idle = 0;
        }
        if self.idle >= IDLE_PASSES {
            self.done = true;
            self.stuck = true;
            return Outcome::Stuck;
        }
        Outcome::Running
    }

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
                    stuck: b.stuck,
                }
            }
        }
    }
}
