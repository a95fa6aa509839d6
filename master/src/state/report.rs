//! Full chunk reports as methods of [`MasterState`]: a chunkserver's report replaces
//! what the master knows of its replicas.
//!
//! A registration's report is applied in one piece ([`MasterState::apply_report`]):
//! lease recovery counts a chunkserver registered since the start as fully reported
//! (DESIGN.md, "No reachable replica"), so its report must be whole the moment it is
//! registered. A periodic report ([`MasterState::apply_periodic_report`], the
//! `ChunkReport` request) of a million replicas is applied in **batches**
//! ([`ReportApply`], at most [`REPORT_BATCH`] replicas per hold of the state lock):
//!
//! 1. `begin`: the chunkserver's replica set as it is now is copied aside (the *old*
//!    set) and its report epoch raised;
//! 2. each batch of reported replicas is applied as before (versions never lowered, a
//!    finalized replica never reopened, corrupt marks kept or cleared) and joins the
//!    chunkserver's set;
//! 3. each batch of the old set: a replica the report omits leaves its chunk, unless
//!    the report may predate it: the master recorded it from the chunkserver's answer
//!    to a command after the report's *mark* (below), or it is in an open file's
//!    granted pipeline (judged on the pipelines of that batch's hold);
//! 4. `finish`: corrupt marks of replicas no longer reported go, the orphans are set.
//!
//! **The mark.** A report is built at one moment and applied at a later one, while
//! commands reach the chunkserver on other connections: a report built just before a
//! bump created a replica may arrive after the bump's answer was recorded. Every
//! recorded answer raises the master's acknowledgement clock and is kept with its
//! value ([`crate::registry::Chunkserver::acked`]); each report gets a *mark*: a value
//! the clock had before the chunkserver started building it, so every answer at or
//! below the mark was sent (its command had run) before the report was built. A
//! periodic report's mark is the clock read when the heartbeat that precedes it on
//! the same connection arrived (the chunkserver builds its report only after that
//! heartbeat's reply); a registration's is the clock read when its `Register` arrived
//! (the chunkserver takes its new session, which refuses the old one's commands, and
//! waits for the commands still running before it builds the report). An omitted
//! replica recorded from an answer above the mark stays. Answers at or below a mark
//! are forgotten as soon as the mark is read ([`MasterState::forget_acks`]): every
//! later report on that connection is marked at least as high. A report marked below
//! what was forgotten ([`crate::registry::Chunkserver::covered`]: one from an older
//! connection, or with no heartbeat before it) takes nothing away. (A replica
//! recorded before the grant that names it in a pipeline was the window the fsx test
//! found: readers of the new chunk saw its pipeline short a member, so only its
//! committed length, 0, was readable.)
//!
//! Between batches each chunk shows either what the master knew before the report or
//! what the report says, both states the master could have had had the report come a
//! little earlier or later; a replica is only ever dropped in step 3, after every
//! replica of the report is in. A registration, or a newer report, raises the epoch:
//! the older report stops at its next batch and the newer one decides (it is whole).

use super::{MasterState, ReportSummary};
use crate::chunk_table::{server_index, ReplicaClass};
use crate::handle_set::HandleSet;
use stampfs_proto::{ChunkHandle, ChunkserverId, ReplicaReport, ReplicaState};
use std::collections::HashSet;

/// Replicas applied (or old replicas checked) per hold of the state lock.
pub const REPORT_BATCH: usize = 4096;

/// A periodic full report being applied in batches (see the module docs).
#[derive(Debug)]
pub struct ReportApply {
    id: ChunkserverId,
    idx: u32,
    epoch: u64,
    /// Command answers recorded at or below this clock are covered by the report.
    covered: u64,
    reports: Vec<ReplicaReport>,
    /// The reported handles, sorted.
    reported: Vec<ChunkHandle>,
    next: usize,
    /// The chunkserver's replicas when the report began.
    old: Vec<ChunkHandle>,
    next_old: usize,
    orphans: Vec<ReplicaReport>,
    pub summary: ReportSummary,
    /// Stopped by a newer report or a registration.
    pub superseded: bool,
    done: bool,
}

impl ReportApply {
    pub fn done(&self) -> bool {
        self.done
    }
}

/// What applying one reported replica found.
enum Applied {
    /// The master does not know the chunk.
    Orphan,
    /// The chunkserver holds it (a replica, or one still marked corrupt).
    Held,
}

impl MasterState {
    /// A periodic full report from a registered chunkserver, in one piece (the
    /// batches of [`Self::begin_report`] run back to back). Such a report may have
    /// been built before a bump that created a replica and arrive after the bump's
    /// reply: a replica of an open file's granted pipeline that it omits is kept (lease
    /// recovery must not take it for gone; the chunkserver's next report, or its
    /// registration after a restart, settles it). `covered`: the report's mark (see
    /// the module docs).
    pub fn apply_periodic_report(
        &mut self,
        id: ChunkserverId,
        reports: &[ReplicaReport],
        covered: u64,
    ) -> ReportSummary {
        let Some(mut apply) = self.begin_report(id, reports.to_vec(), covered) else {
            return ReportSummary::default();
        };
        while !apply.done() {
            self.report_step(&mut apply, usize::MAX);
        }
        apply.summary
    }

    /// Starts applying a periodic full report of `id` in batches; `None` when `id` is
    /// not registered. Sorting the reported handles is the caller's cost, not the
    /// lock's: pass them through [`ReportApply`] as built here.
    pub fn begin_report(
        &mut self,
        id: ChunkserverId,
        reports: Vec<ReplicaReport>,
        covered: u64,
    ) -> Option<ReportApply> {
        let mut reported: Vec<ChunkHandle> = reports.iter().map(|r| r.handle).collect();
        reported.sort_unstable();
        reported.dedup();
        self.begin_sorted_report(id, reports, reported, covered)
    }

    /// [`Self::begin_report`] with the reported handles already sorted and deduplicated
    /// (done outside the lock).
    pub fn begin_sorted_report(
        &mut self,
        id: ChunkserverId,
        reports: Vec<ReplicaReport>,
        reported: Vec<ChunkHandle>,
        covered: u64,
    ) -> Option<ReportApply> {
        let idx = server_index(id)?;
        let cs = self.registry.get_mut(id)?;
        cs.report_epoch += 1;
        let old: Vec<ChunkHandle> = cs.replicas.iter().collect();
        Some(ReportApply {
            id,
            idx,
            epoch: cs.report_epoch,
            covered,
            reports,
            reported,
            next: 0,
            old,
            next_old: 0,
            orphans: Vec::new(),
            summary: ReportSummary::default(),
            superseded: false,
            done: false,
        })
    }

    /// Applies up to `budget` replicas of `apply` (reported ones first, then the old
    /// set's), and finishes it once both are through.
    pub fn report_step(&mut self, apply: &mut ReportApply, budget: usize) {
        if apply.done {
            return;
        }
        let (id, idx) = (apply.id, apply.idx);
        if self.registry.get(id).map(|cs| cs.report_epoch) != Some(apply.epoch) {
            apply.superseded = true;
            apply.done = true;
            return;
        }
        let mut left = budget;
        while left > 0 && apply.next < apply.reports.len() {
            let r = apply.reports[apply.next];
            apply.next += 1;
            left -= 1;
            let applied = self.apply_reported(id, idx, &r, &mut apply.summary);
            let Some(cs) = self.registry.get_mut(id) else {
                continue;
            };
            match applied {
                Applied::Orphan => {
                    cs.replicas.remove(&r.handle);
                    apply.orphans.push(r);
                }
                Applied::Held => {
                    cs.replicas.insert(r.handle);
                }
            }
        }
        if left > 0 && apply.next_old < apply.old.len() {
            let keep = self.pipeline_chunks_on(id);
            while left > 0 && apply.next_old < apply.old.len() {
                let h = apply.old[apply.next_old];
                apply.next_old += 1;
                left -= 1;
                if apply.reported.binary_search(&h).is_ok()
                    || keep.contains(&h)
                    || !self.omission_counts(id, h, apply.covered)
                {
                    continue;
                }
                if let Some(info) = self.chunks.get_mut(h) {
                    info.remove_replica(idx);
                }
                if let Some(cs) = self.registry.get_mut(id) {
                    cs.replicas.remove(&h);
                }
            }
        }
        if apply.next == apply.reports.len() && apply.next_old == apply.old.len() {
            let reported = &apply.reported;
            self.health
                .retain_corrupt_reported(id, |h| reported.binary_search(&h).is_ok());
            apply.summary.orphans = apply.orphans.len();
            if let Some(cs) = self.registry.get_mut(id) {
                cs.orphans = std::mem::take(&mut apply.orphans);
            }
            self.forget_acks(id, apply.covered);
            apply.done = true;
        }
    }

    /// Whether a report of `id` marked `mark` that omits its replica of `h` shows it
    /// gone: not when the master recorded that replica from a command answer later
    /// than the mark, nor when answers above the mark were already forgotten.
    fn omission_counts(&self, id: ChunkserverId, h: ChunkHandle, mark: u64) -> bool {
        self.registry.get(id).is_some_and(|cs| {
            mark >= cs.covered && cs.acked.get(&h).is_none_or(|clock| *clock <= mark)
        })
    }

    /// Forgets `id`'s command answers up to `mark`: every report of it from now on
    /// (on its connection) was built after they were sent. See the module docs.
    pub fn forget_acks(&mut self, id: ChunkserverId, mark: u64) {
        if let Some(cs) = self.registry.get_mut(id) {
            if mark > cs.covered {
                cs.acked.retain(|_, clock| *clock > mark);
                cs.covered = mark;
            }
        }
    }

    /// Chunks of open files whose granted pipeline includes `id`.
    fn pipeline_chunks_on(&self, id: ChunkserverId) -> HashSet<ChunkHandle> {
        self.pipelines
            .values()
            .filter(|p| p.servers.contains(&id))
            .map(|p| p.handle)
            .collect()
    }

    /// Replaces `id`'s replica list with a full report, in one piece (a registration),
    /// but for the replicas recorded from command answers above `covered`, the
    /// report's mark (see the module docs).
    pub fn apply_report(
        &mut self,
        id: ChunkserverId,
        reports: &[ReplicaReport],
        covered: u64,
    ) -> ReportSummary {
        let mut summary = ReportSummary::default();
        let Some(idx) = server_index(id) else {
            return summary;
        };
        let Some(cs) = self.registry.get_mut(id) else {
            return summary;
        };
        let old = std::mem::take(&mut cs.replicas);
        cs.orphans.clear();
        let trusted = covered >= cs.covered;
        if trusted {
            cs.acked.retain(|_, clock| *clock > covered);
            cs.covered = covered;
        }
        let new: HashSet<ChunkHandle> = reports.iter().map(|r| r.handle).collect();
        let mut mine = HandleSet::new();
        for h in old.iter().filter(|h| !new.contains(h)) {
            if !trusted || cs.acked.contains_key(&h) {
                // Answered after the report was built, or it cannot tell: it stays.
                mine.insert(h);
                continue;
            }
            if let Some(info) = self.chunks.get_mut(h) {
                info.remove_replica(idx);
            }
        }
        self.health
            .retain_corrupt_reported(id, |h| new.contains(&h));
        let mut orphans = Vec::new();
        for r in reports {
            match self.apply_reported(id, idx, r, &mut summary) {
                Applied::Orphan => orphans.push(*r),
                Applied::Held => {
                    mine.insert(r.handle);
                }
            }
        }
        summary.orphans = orphans.len();
        if let Some(cs) = self.registry.get_mut(id) {
            cs.replicas = mine;
            cs.orphans = orphans;
        }
        summary
    }

    /// Records one reported replica of `id` (compact index `idx`) in the chunk table.
    fn apply_reported(
        &mut self,
        id: ChunkserverId,
        idx: u32,
        r: &ReplicaReport,
        summary: &mut ReportSummary,
    ) -> Applied {
        let Some(info) = self.chunks.get_mut(r.handle) else {
            return Applied::Orphan;
        };
        if self.health.is_corrupt(r.handle, id, r.version) {
            // Still the replica reported corrupt: held, but never a replica again.
            return Applied::Held;
        }
        self.health.clear_corrupt(r.handle, id);
        // A replica's version never goes down: a report built before a bump that
        // arrives after the bump's acknowledgement must not make it look stale.
        // Nor does a finalized replica reopen at the same version: a report that
        // still shows it `Writing` (and shorter) was built before its finalize.
        let outdated = info.replica(id).is_some_and(|known| {
            known.version > r.version
                || (known.version == r.version
                    && known.state == ReplicaState::Finalized
                    && r.state == ReplicaState::Writing)
        });
        let was_short = info
            .replica(id)
            .is_some_and(|k| k.short && k.version == r.version);
        if !outdated {
            info.record_report(idx, r);
        }
        let Some(known) = info.replica(id).copied() else {
            return Applied::Held;
        };
        match info.class_of(&known) {
            ReplicaClass::Current => {
                summary.current += 1;
                if self.missing_chunks.remove(&r.handle) {
                    tracing::info!(chunk = %r.handle, chunkserver = %id, version = %r.version, "a replica of a chunk lease recovery found missing is back");
                }
            }
            ReplicaClass::Stale => {
                summary.stale += 1;
                tracing::debug!(chunk = %r.handle, chunkserver = %id, replica = %r.version, master = %info.version, "stale replica");
            }
            ReplicaClass::Ahead => {
                summary.ahead += 1;
                tracing::error!(chunk = %r.handle, chunkserver = %id, replica = %r.version, master = %info.version, "replica is AHEAD of the master's version: invariant 1 was broken; it is never handed out");
            }
            ReplicaClass::Short if was_short => {
                summary.short += 1;
                tracing::debug!(chunk = %r.handle, chunkserver = %id, version = %r.version, length = r.length, committed = info.length, "short replica");
            }
            ReplicaClass::Short => {
                summary.short += 1;
                tracing::warn!(chunk = %r.handle, chunkserver = %id, version = %r.version, length = r.length, committed = info.length, "replica at the master's version is SHORTER than the committed length (it took a bump late); it is never handed out and will be replaced");
            }
        }
        Applied::Held
    }
}

#[cfg(test)]
mod tests;
