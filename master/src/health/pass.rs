//! One pass of the replica-health rules over the whole state, in **slices**.
//!
//! A pass at a million chunks is a few hundred milliseconds to seconds of work; done
//! under the state lock in one piece it stalls every request for that long. A
//! [`Pass`] is a cursor instead: each [`Pass::step`] examines at most a budget of
//! work ([`SLICE_BUDGET`] units: an inode visited, a chunk examined, a need ordered,
//! an orphan or trash entry looked at), returns the actions it decided, and remembers
//! where it stopped. The caller holds the state lock for one step, records the
//! actions (so the next slice sees them in flight and orders nothing twice) and
//! releases it before the next.
//!
//! ```text
//!  Chunks { inode, chunk }  files in inode order, each settled chunk examined
//!         │                 (stale, finalize, corrupt, short, over-replicated now;
//!         │                 under-replicated chunks go to a priority queue)
//!  Replicate                the queue, most urgent first: each need re-examined on
//!         │                 the state of its slice, then copies ordered
//!  Balance                  while a balancer runs: moves from the most used
//!         │                 chunkservers to the least used (`health/balance.rs`)
//!  Orphans { server, at }   replicas of unknown chunks past the grace
//!  Trash { after }          each user's Current checkpointed, checkpoints (and
//!         │                 entries of the older flat layout) past `--trash-for`
//!  Done
//! ```
//!
//! In safe mode (`safe_mode.rs`) the chunk phase only finalizes and counts the chunks
//! with a replica reported; no deletion, copy or move is decided.
//!
//! **What a sliced pass guarantees.** Inode numbers only grow (the namespace hands
//! them out from a counter) and a file's chunk list only changes at its end (a new
//! chunk, an abandoned last one), so a cursor `(inode, chunk index)` that moves
//! forward visits, exactly once, every chunk of every file that exists from the start
//! of the pass to its end, and each is judged on the state of the slice that visits
//! it (decision and record under the same lock hold). A file created during the pass
//! is visited when its inode is past the cursor (the pass runs until the cursor
//! reaches the namespace's counter as it is then); one deleted is simply not found. A
//! need is acted on only if its chunk is still at the version it was queued at (a
//! reopen for append, which makes a chunk unsettled again, always raises the
//! version), and its copies are recounted then. With an unlimited budget, one step
//! makes exactly the decisions of the one-piece pass [`plan`].

use super::{
    balance, examine, is_live, settled, Action, DeleteReason, MAX_PENDING_DELETES_PER_SERVER,
};
use crate::chunk_table::{ChunkInfo, ReplicaClass};
use crate::namespace::ROOT;
use crate::placement::{self, Candidate};
use crate::state::MasterState;
use crate::trash;
use rand::Rng;
use stampfs_proto::{ChunkHandle, ChunkVersion, ChunkserverId, InodeId, ReplicaState};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::ops::Bound;

/// Work units one [`Pass::step`] does at most (an inode visited, a chunk examined,
/// ...). About 1-4 ms of lock hold on this project's 2-core test machine.
pub const SLICE_BUDGET: usize = 4096;

/// What a copy ordered in the replicate phase costs from the budget (it looks at
/// every live chunkserver for a target).
const COPY_COST: usize = 64;

/// Where a pass is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Next: chunk `chunk` of inode `inode`.
    Chunks {
        inode: u64,
        chunk: usize,
    },
    Replicate,
    /// The balancer's moves, if it runs (`health/balance.rs`).
    Balance,
    /// Next: orphan `at` of the first live chunkserver with an id from `server`.
    Orphans {
        server: u64,
        at: usize,
    },
    /// Next: the first trash entry after `after` (all of them when `None`).
    Trash {
        after: Option<String>,
    },
    Done,
}

/// An under-replicated chunk found by the chunk phase, in priority order: a single
/// live replica first, then the most missing, then by handle.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Queued {
    not_single: bool,
    missing: Reverse<usize>,
    handle: ChunkHandle,
    /// The chunk's version when it was queued: acted on only while still at it.
    version: ChunkVersion,
}

/// A health pass in progress (see the module docs). Starts at the first inode.
#[derive(Clone, Debug)]
pub struct Pass {
    phase: Phase,
    queue: BinaryHeap<Reverse<Queued>>,
    /// Chunks examined so far (for logging, and safe mode).
    pub chunks: u64,
    /// What the balancer's phase found and did (`None`: no balancer, or safe mode).
    pub balance: Option<balance::Step>,
    /// Chunks examined so far with a live replica at the master's version (safe
    /// mode's measure: `safe_mode.rs`).
    pub reported: u64,
    /// Steps taken so far.
    pub steps: u64,
}

impl Default for Pass {
    fn default() -> Self {
        Self::new()
    }
}

impl Pass {
    pub fn new() -> Self {
        Self {
            phase: Phase::Chunks {
                inode: ROOT.0,
                chunk: 0,
            },
            queue: BinaryHeap::new(),
            chunks: 0,
            reported: 0,
            balance: None,
            steps: 0,
        }
    }

    /// Still walking the files (a file created now will be visited).
    pub fn scanning(&self) -> bool {
        matches!(self.phase, Phase::Chunks { .. })
    }

    /// Every phase is done.
    pub fn done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Decides on at most about `budget` units of work from where the pass stopped, and
    /// returns the actions. Pure in `st`: the caller records the actions
    /// ([`super::Tracker::record`]) before the next step, under the same lock hold.
    pub fn step<R: Rng + ?Sized>(
        &mut self,
        st: &MasterState,
        now_ms: u64,
        wall_ms: u64,
        rng: &mut R,
        budget: usize,
    ) -> Vec<Action> {
        self.steps += 1;
        let mut s = Slice::new(st, now_ms, budget);
        while s.left > 0 && !self.done() {
            match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Chunks { inode, chunk } => {
                    self.phase = self.chunks_phase(&mut s, inode, chunk);
                }
                Phase::Replicate => {
                    self.phase = self.replicate_phase(&mut s, rng);
                }
                Phase::Balance => {
                    self.phase = self.balance_phase(&mut s);
                }
                Phase::Orphans { server, at } => {
                    self.phase = orphans_phase(&mut s, server, at);
                }
                Phase::Trash { after } => {
                    self.phase = trash_phase(&mut s, after, wall_ms);
                }
                Phase::Done => {}
            }
        }
        s.actions
    }

    fn chunks_phase(&mut self, s: &mut Slice<'_>, mut inode: u64, mut chunk: usize) -> Phase {
        let st = s.st;
        let end = st.ns.next_inode().0;
        while inode < end {
            if s.left == 0 {
                return Phase::Chunks { inode, chunk };
            }
            let f = st.ns.get(InodeId(inode)).and_then(|i| i.as_file());
            let Some(f) = f.filter(|f| chunk < f.chunks.len()) else {
                s.spend(1);
                inode += 1;
                chunk = 0;
                continue;
            };
            while chunk < f.chunks.len() && s.left > 0 {
                let handle = f.chunks[chunk];
                let index = chunk;
                chunk += 1;
                s.spend(1);
                if !settled(st, InodeId(inode), f, index) {
                    continue;
                }
                let Some(info) = st.chunks.get(handle) else {
                    continue;
                };
                self.chunks += 1;
                if info
                    .replicas
                    .iter()
                    .any(|r| info.class_of(r) == ReplicaClass::Current && s.live(r.server_id()))
                {
                    self.reported += 1;
                }
                if let Some(q) = s.chunk(handle, info) {
                    self.queue.push(Reverse(q));
                }
            }
        }
        Phase::Replicate
    }

    fn replicate_phase<R: Rng + ?Sized>(&mut self, s: &mut Slice<'_>, rng: &mut R) -> Phase {
        while s.left > 0 {
            let Some(Reverse(q)) = self.queue.pop() else {
                return Phase::Balance;
            };
            s.spend(1);
            if s.all_busy() {
                // No copy can start anywhere this pass: the rest wait for the next.
                self.queue.clear();
                return Phase::Balance;
            }
            s.replicate(&q, rng);
        }
        Phase::Replicate
    }
}

impl Pass {
    /// The balancer's moves (`health/balance.rs`), in one step: at most
    /// [`balance::MAX_MOVES_PER_PASS`] moves and [`balance::SCAN_PER_PASS`] replicas
    /// looked at, each source's from where the last pass stopped, within the copy
    /// stream caps. Only quiet chunks of closed files (or complete chunks of open
    /// ones) move.
    fn balance_phase(&mut self, s: &mut Slice<'_>) -> Phase {
        let next = Phase::Orphans { server: 0, at: 0 };
        let st = s.st;
        let Some(b) = st.balancer.as_ref().filter(|b| !b.done) else {
            return next;
        };
        if st.safe_mode.is_on() {
            return next;
        }
        let sp = balance::spread(st, s.now_ms, b.threshold_pct);
        // The chunks being written (or recovered) belong to their writer.
        let unsettled: HashSet<ChunkHandle> = st
            .leases
            .iter()
            .map(|(ino, _)| ino)
            .chain(st.recovering.iter().copied())
            .filter_map(|ino| st.ns.file(ino).and_then(|f| st.open_chunk_of(ino, f)))
            .collect();
        let mut step = balance::Step {
            copies_in_flight: !s.in_flight.is_empty(),
            ..balance::Step::default()
        };
        let mut scanned = 0usize;
        for src in &sp.sources {
            let Some(cs) = st.registry.get(*src) else {
                continue;
            };
            if sp.targets.iter().all(|t| s.is_busy(*t)) {
                break;
            }
            let after = b.after.get(src).copied().unwrap_or(0);
            let mut last = None;
            let mut ended = true;
            for h in cs
                .replicas
                .iter()
                .skip_while(|h| h.0 <= after && after != 0)
            {
                if step.moves as usize >= balance::MAX_MOVES_PER_PASS
                    || scanned >= balance::SCAN_PER_PASS
                    || s.is_busy(*src)
                {
                    ended = false;
                    break;
                }
                scanned += 1;
                s.spend(1);
                last = Some(h.0);
                let Some(info) = st.chunks.get(h) else {
                    continue;
                };
                if unsettled.contains(&h)
                    || !s.quiet(h, info)
                    || s.in_flight.contains_key(&h)
                    || st.health.moved_from(h).is_some()
                {
                    continue;
                }
                let target = sp.targets.iter().copied().find(|t| {
                    info.replica(*t).is_none()
                        && !s.is_busy(*t)
                        && st.registry.get(*t).is_some_and(|c| c.free() >= info.length)
                });
                let Some(target) = target.and_then(|t| st.registry.get(t)) else {
                    continue;
                };
                s.add_stream(*src);
                s.add_stream(target.id);
                s.in_flight.entry(h).or_default().push(target.id);
                s.actions.push(Action::Replicate {
                    handle: h,
                    version: info.version,
                    source: *src,
                    target: target.addr(),
                    live: info.replicas.len(),
                    replication: info.replication,
                    moving_from: Some(*src),
                });
                step.moves += 1;
            }
            // Where this source's next scan starts: after the last replica looked
            // at, or from its first again once the scan reached its end.
            let resume = if ended { 0 } else { last.unwrap_or(after) };
            step.cursors.push((*src, resume));
        }
        step.spread = sp;
        self.balance = Some(step);
        next
    }
}

/// Decides in one piece (an unlimited budget): what the worker used to do under one
/// lock hold, kept for tests and tools. Pure: reads the state (including the tracker,
/// so nothing in flight is ordered twice) and returns the actions;
/// [`super::Tracker::record`] queues them. `wall_ms` dates trash entries; `rng`
/// breaks placement ties.
pub fn plan<R: Rng + ?Sized>(
    st: &MasterState,
    now_ms: u64,
    wall_ms: u64,
    rng: &mut R,
) -> Vec<Action> {
    let mut pass = Pass::new();
    let mut actions = Vec::new();
    while !pass.done() {
        actions.extend(pass.step(st, now_ms, wall_ms, rng, usize::MAX));
    }
    actions
}

/// One step's view: the state, what the tracker has in flight (plus what this step
/// decided), and the budget left.
struct Slice<'a> {
    st: &'a MasterState,
    now_ms: u64,
    left: usize,
    actions: Vec<Action>,
    /// Deletions ordered by this step, per chunkserver (the tracker has the rest).
    new_deletes: HashMap<ChunkserverId, usize>,
    /// Copies in flight per chunk.
    in_flight: HashMap<ChunkHandle, Vec<ChunkserverId>>,
    /// Copy streams per chunkserver, as source or target (in flight and ordered now).
    streams: HashMap<ChunkserverId, usize>,
    /// Chunkservers at the stream cap, and how many chunkservers are live.
    busy: usize,
    live: usize,
}

impl<'a> Slice<'a> {
    fn new(st: &'a MasterState, now_ms: u64, budget: usize) -> Self {
        let mut in_flight: HashMap<ChunkHandle, Vec<ChunkserverId>> = HashMap::new();
        let mut streams: HashMap<ChunkserverId, usize> = HashMap::new();
        for c in st.health.copies() {
            in_flight.entry(c.handle).or_default().push(c.target);
            *streams.entry(c.source).or_default() += 1;
            *streams.entry(c.target).or_default() += 1;
        }
        let cap = st.settings.max_replication_streams;
        // Only live servers count against `live` (a copy with a dead side is pruned at
        // the next slice, but must not make the live ones look all busy meanwhile).
        let dead_after = st.settings.dead_after_ms;
        let busy = streams
            .iter()
            .filter(|(id, n)| **n >= cap && is_live(&st.registry, **id, now_ms, dead_after))
            .count();
        let live = st.registry.live_count(now_ms, dead_after);
        Self {
            st,
            now_ms,
            left: budget,
            actions: Vec::new(),
            new_deletes: HashMap::new(),
            in_flight,
            streams,
            busy,
            live,
        }
    }

    fn spend(&mut self, n: usize) {
        self.left = self.left.saturating_sub(n);
    }

    fn live(&self, id: ChunkserverId) -> bool {
        is_live(
            &self.st.registry,
            id,
            self.now_ms,
            self.st.settings.dead_after_ms,
        )
    }

    /// Orders the deletion of `server`'s replica of `handle` up to `max_version`,
    /// unless a command on it is in flight or the chunkserver has its share of
    /// deletions unconfirmed.
    fn delete(
        &mut self,
        server: ChunkserverId,
        handle: ChunkHandle,
        max_version: ChunkVersion,
        reason: DeleteReason,
    ) {
        let tracker = &self.st.health;
        if tracker.pending.contains_key(&(server, handle)) {
            return;
        }
        let n = self.new_deletes.entry(server).or_default();
        if tracker.pending_deletes(server) + *n >= MAX_PENDING_DELETES_PER_SERVER {
            return;
        }
        *n += 1;
        self.actions.push(Action::Delete {
            server,
            handle,
            max_version,
            reason,
        });
    }

    /// Nothing to do for this chunk: exactly its replication factor of replicas, each
    /// current, finalized, live and with no command in flight, and no corrupt mark. The
    /// full rules would decide nothing for it; this is most chunks, most of the time.
    fn quiet(&self, handle: ChunkHandle, info: &ChunkInfo) -> bool {
        let tracker = &self.st.health;
        info.replicas.len() == usize::from(info.replication.max(1))
            && info.replicas.iter().all(|r| {
                info.class_of(r) == ReplicaClass::Current
                    && r.state == ReplicaState::Finalized
                    && self.live(r.server_id())
                    && (tracker.pending.is_empty()
                        || !tracker.pending.contains_key(&(r.server_id(), handle)))
            })
            && tracker.corrupt_of(handle).next().is_none()
            && (self.st.decommissioning.is_empty()
                || info
                    .replicas
                    .iter()
                    .all(|r| !self.st.decommissioning.contains(&r.server_id())))
    }

    /// The rules for one settled chunk: deletions and finalizes now; an
    /// under-replicated chunk is returned, to be queued for copies.
    fn chunk(&mut self, handle: ChunkHandle, info: &ChunkInfo) -> Option<Queued> {
        if self.quiet(handle, info) {
            return None;
        }
        let st = self.st;
        let tracker = &st.health;
        let ex = examine(st, handle, info, self.now_ms);
        let replication = usize::from(info.replication.max(1));
        // Stale replicas go only while an up-to-date one is live: the last remnants
        // of a missing chunk are left for an operator (and all of them while in safe
        // mode).
        if !ex.live.is_empty() && !st.safe_mode.is_on() {
            for (s, v) in &ex.stale {
                self.delete(*s, handle, *v, DeleteReason::Stale);
            }
        }
        for (s, state) in &ex.live {
            if *state == ReplicaState::Writing && !tracker.pending.contains_key(&(*s, handle)) {
                self.actions.push(Action::Finalize {
                    server: *s,
                    handle,
                    version: info.version,
                    length: info.length,
                });
            }
        }
        if st.safe_mode.is_on() {
            // Nothing deleted or copied until enough replicas are reported.
            return None;
        }
        let good = self.good(handle, &ex.live);
        let counted = self.counted(&good);
        let holders = self.holders(handle, info, &ex.corrupt);
        for (s, v, held) in &ex.corrupt {
            if !held || !self.live(*s) {
                continue;
            }
            let nowhere_else = target_candidates(st, &holders, info.length, self.now_ms).is_empty();
            if counted.len() >= replication || (!good.is_empty() && nowhere_else) {
                self.delete(*s, handle, *v, DeleteReason::Corrupt);
            }
        }
        // Short replicas go like corrupt ones: once the chunk has enough good
        // replicas again, or when their chunkserver is the only place left for a
        // new copy. The bound is their version: a raised replica is kept.
        for (s, v) in &ex.short {
            let nowhere_else = target_candidates(st, &holders, info.length, self.now_ms).is_empty();
            if counted.len() >= replication || (!good.is_empty() && nowhere_else) {
                self.delete(*s, handle, *v, DeleteReason::Short);
            }
        }
        let flying = self.in_flight.get(&handle).map_or(0, Vec::len);
        if !good.is_empty() && counted.len() + flying < replication {
            let missing = replication - counted.len() - flying;
            return Some(Queued {
                not_single: good.len() != 1,
                missing: Reverse(missing),
                handle,
                version: info.version,
            });
        }
        if flying == 0 && counted.len() > replication {
            // The fullest servers give up their replica (never one being
            // decommissioned: those are not counted, and stay until it stops); the
            // one a balancer's move came from goes first.
            let moved = tracker.moved_from(handle);
            let mut victims: Vec<(bool, u64, ChunkserverId)> = counted
                .iter()
                .map(|(s, _)| {
                    let free = st.registry.get(*s).map_or(0, |c| c.free());
                    (moved != Some(*s), free, *s)
                })
                .collect();
            victims.sort();
            let victims: Vec<(u64, ChunkserverId)> =
                victims.into_iter().map(|(_, f, s)| (f, s)).collect();
            for (_, s) in victims.into_iter().take(counted.len() - replication) {
                self.delete(s, handle, info.version, DeleteReason::OverReplicated);
            }
        }
        None
    }

    /// Live current replicas with no deletion in flight.
    fn good(
        &self,
        handle: ChunkHandle,
        live: &[(ChunkserverId, ReplicaState)],
    ) -> Vec<(ChunkserverId, ReplicaState)> {
        live.iter()
            .copied()
            .filter(|(s, _)| !self.st.health.deleting(*s, handle))
            .collect()
    }

    /// The replicas of `good` that count toward the replication factor: those not on
    /// a chunkserver being decommissioned (`state/admin.rs`).
    fn counted(
        &self,
        good: &[(ChunkserverId, ReplicaState)],
    ) -> Vec<(ChunkserverId, ReplicaState)> {
        let draining = &self.st.decommissioning;
        good.iter()
            .copied()
            .filter(|(s, _)| draining.is_empty() || !draining.contains(s))
            .collect()
    }

    /// Chunkservers holding any replica of the chunk, corrupt ones they still hold
    /// and the targets of copies in flight: never targets of a new copy.
    fn holders(
        &self,
        handle: ChunkHandle,
        info: &ChunkInfo,
        corrupt: &[(ChunkserverId, ChunkVersion, bool)],
    ) -> HashSet<ChunkserverId> {
        let mut holders: HashSet<ChunkserverId> =
            info.replicas.iter().map(|r| r.server_id()).collect();
        holders.extend(corrupt.iter().filter(|c| c.2).map(|c| c.0));
        if let Some(targets) = self.in_flight.get(&handle) {
            holders.extend(targets.iter().copied());
        }
        holders
    }

    fn is_busy(&self, s: ChunkserverId) -> bool {
        self.streams.get(&s).copied().unwrap_or(0) >= self.st.settings.max_replication_streams
    }

    /// Every live chunkserver is at the stream cap.
    fn all_busy(&self) -> bool {
        self.busy >= self.live
    }

    fn add_stream(&mut self, s: ChunkserverId) {
        let n = self.streams.entry(s).or_default();
        *n += 1;
        if *n == self.st.settings.max_replication_streams {
            self.busy += 1;
        }
    }

    /// Orders copies for a queued chunk, re-examined on this slice's state, within the
    /// per-server stream cap.
    fn replicate<R: Rng + ?Sized>(&mut self, q: &Queued, rng: &mut R) {
        let st = self.st;
        if st.safe_mode.is_on() {
            // Entered (by hand) while the pass was queueing.
            return;
        }
        let Some(info) = st.chunks.get(q.handle).filter(|i| i.version == q.version) else {
            return;
        };
        let ex = examine(st, q.handle, info, self.now_ms);
        let good = self.good(q.handle, &ex.live);
        let counted = self.counted(&good).len();
        let replication = usize::from(info.replication.max(1));
        let flying = self.in_flight.get(&q.handle).map_or(0, Vec::len);
        if good.is_empty() || counted + flying >= replication {
            return;
        }
        let sources: Vec<ChunkserverId> = good
            .iter()
            .filter(|(_, state)| *state == ReplicaState::Finalized)
            .map(|(s, _)| *s)
            .collect();
        let mut holders = self.holders(q.handle, info, &ex.corrupt);
        for _ in 0..replication - counted - flying {
            let Some(source) = sources
                .iter()
                .copied()
                .filter(|s| !self.is_busy(*s))
                .min_by_key(|s| (self.streams.get(s).copied().unwrap_or(0), *s))
            else {
                break;
            };
            self.spend(COPY_COST);
            let candidates: Vec<Candidate> =
                target_candidates(st, &holders, info.length, self.now_ms)
                    .into_iter()
                    .filter(|c| !self.is_busy(c.id))
                    .collect();
            let Ok(chosen) = placement::choose(&candidates, 1, 1, rng) else {
                break;
            };
            let Some(target) = chosen.targets.first().and_then(|t| st.registry.get(*t)) else {
                break;
            };
            self.add_stream(source);
            self.add_stream(target.id);
            holders.insert(target.id);
            self.in_flight.entry(q.handle).or_default().push(target.id);
            self.actions.push(Action::Replicate {
                handle: q.handle,
                version: info.version,
                source,
                target: target.addr(),
                live: good.len(),
                replication: info.replication,
                moving_from: None,
            });
        }
    }
}

/// Live chunkservers that could take a new replica of a chunk: room for `length`
/// bytes and no replica of it (`holders`).
fn target_candidates(
    st: &MasterState,
    holders: &HashSet<ChunkserverId>,
    length: u64,
    now_ms: u64,
) -> Vec<Candidate> {
    st.placement_candidates(now_ms, length)
        .into_iter()
        .filter(|c| !holders.contains(&c.id))
        .collect()
}

/// Orphans: replicas of chunks the master does not know, once past the grace; live
/// chunkservers in id order.
fn orphans_phase(s: &mut Slice<'_>, server: u64, mut at: usize) -> Phase {
    let st = s.st;
    if st.safe_mode.is_on() {
        return Phase::Trash { after: None };
    }
    let mut servers: Vec<_> = st
        .registry
        .iter()
        .filter(|c| c.id.0 >= server && c.is_live(s.now_ms, st.settings.dead_after_ms))
        .collect();
    servers.sort_by_key(|c| c.id);
    for cs in servers {
        if cs.id.0 > server {
            at = 0;
        }
        s.spend(1);
        while at < cs.orphans.len() {
            if s.left == 0 {
                return Phase::Orphans {
                    server: cs.id.0,
                    at,
                };
            }
            let o = cs.orphans[at];
            at += 1;
            s.spend(1);
            let seen = st.health.orphan_seen(cs.id, o.handle).unwrap_or(s.now_ms);
            if s.now_ms.saturating_sub(seen) >= st.settings.orphan_grace_ms {
                s.delete(cs.id, o.handle, o.version, DeleteReason::Orphan);
            }
        }
        if s.left == 0 {
            return Phase::Orphans {
                server: cs.id.0.saturating_add(1),
                at: 0,
            };
        }
    }
    Phase::Trash { after: None }
}

/// The trash, in name order: each user's `Current` checkpointed when its newest
/// checkpoint is older than [`trash::checkpoint_interval`], checkpoints and entries
/// of the older flat layout purged past `--trash-for`.
fn trash_phase(s: &mut Slice<'_>, after: Option<String>, wall_ms: u64) -> Phase {
    let st = s.st;
    let Some(dir) = st
        .ns
        .child(ROOT, trash::DIR)
        .and_then(|t| st.ns.get(t))
        .and_then(|t| t.as_dir())
    else {
        return Phase::Done;
    };
    let from = match &after {
        Some(name) => Bound::Excluded(name.as_str()),
        None => Bound::Unbounded,
    };
    let mut last = after.clone();
    for (name, ino) in dir.children.range::<str, _>((from, Bound::Unbounded)) {
        if s.left == 0 {
            return Phase::Trash { after: last };
        }
        s.spend(1);
        last = Some(name.to_string());
        let keep = st.settings.trash_ms;
        let flat = trash::deleted_at(name).filter(|_| st.user(name).is_none());
        let user_dir = st.ns.get(*ino).and_then(|i| i.as_dir());
        let (Some(d), None) = (user_dir, flat) else {
            // An entry of the flat layout (or anything else put there by hand).
            let at = flat
                .or_else(|| st.ns.get(*ino).map(|i| i.mtime_ms()))
                .unwrap_or(0);
            if trash::expired(at, keep, wall_ms) {
                s.actions.push(Action::PurgeTrash {
                    name: name.to_string(),
                });
            }
            continue;
        };
        s.spend(d.children.len());
        let mut newest: Option<u64> = None;
        for (bucket, _) in d.children.iter() {
            let Some(at) = trash::checkpoint_at(bucket) else {
                continue;
            };
            // A checkpoint named later than now (the clock went back) does not
            // hold the next one back.
            if at <= wall_ms {
                newest = newest.max(Some(at));
            }
            if trash::expired(at, keep, wall_ms) {
                s.actions.push(Action::PurgeTrash {
                    name: format!("{name}/{bucket}"),
                });
            }
        }
        let due =
            newest.is_none_or(|n| trash::expired(n, trash::checkpoint_interval(keep), wall_ms));
        if due && d.children.contains_key(trash::CURRENT) {
            s.actions.push(Action::CheckpointTrash {
                user: name.to_string(),
            });
        }
    }
    Phase::Done
}
