//! Lease recovery's steps that talk to chunkservers, as methods of [`Core`]: the
//! background runner (at most one recovery per file), the worker's pass, and
//! `RecoverLease`. The rules are in [`crate::recovery`], the records in the state.
//!
//! Between the steps sit a fail point and a crash point of the same name
//! (`recovery-after-start`, `recovery-after-bump`, `recovery-before-commit`, and in
//! the seal, `recovery-after-kept-version`): a test makes the attempt fail there, or
//! the process die there (`stampfs_proto::crash`). The seal (step 4: truncate,
//! compare the replicas' digests, finalize) is in `seal`.
//!
//! Every step logs one `info` line with structured fields (`path`, `handle`,
//! `old_version`, `new_version`, `replicas`, `length`) so the demo can narrate it.

use super::Core;
use crate::error::{Error, Result};
use crate::lease::RESUME_SETTLE;
use crate::namespace::{self, join};
use crate::oplog::lock;
use crate::recovery::{id_list, recovered_length, RetrySchedule, Trigger, RECOVER_WAIT};
use crate::state::{Closing, RecoveryBegin, RecoveryPlan};
use stampfs_proto::{
    ChunkCommand, ChunkserverAddr, ChunkserverId, InodeId, RecoverLease, RecoveryOutcome,
    RemoteError, ReplicaReport,
};

mod seal;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// How a background recovery ended, as every waiter sees it.
type Outcome = std::result::Result<RecoveryOutcome, RemoteError>;

/// The lease recoveries running in the background.
#[derive(Debug, Default)]
pub struct Recoveries {
    /// Running recoveries by file, each with the channel its outcome is published on;
    /// a task removes its own entry just before publishing.
    running: Mutex<HashMap<InodeId, watch::Receiver<Option<Outcome>>>>,
    /// When failed recoveries may be retried by the worker (a registration that brings
    /// a replica back clears a file's back-off).
    pub(super) retries: Mutex<RetrySchedule>,
}

impl Recoveries {
    /// Whether a recovery of `inode` is running.
    pub fn is_running(&self, inode: InodeId) -> bool {
        lock(&self.running).contains_key(&inode)
    }
}

impl Core {
    /// Starts the recovery of `inode` in the background unless one is running, and
    /// returns a receiver of its outcome.
    pub(crate) fn spawn_recovery(
        self: &Arc<Self>,
        inode: InodeId,
        trigger: Trigger,
    ) -> watch::Receiver<Option<Outcome>> {
        let mut running = lock(&self.recoveries.running);
        if let Some(rx) = running.get(&inode) {
            return rx.clone();
        }
        let (tx, rx) = watch::channel(None);
        running.insert(inode, rx.clone());
        drop(running);
        let core = self.clone();
        self.tasks.spawn(async move {
            let result = tokio::select! {
                _ = core.shutdown.cancelled() => Err(Error::ShuttingDown),
                r = core.recover(inode, trigger) => r,
            };
            let now = core.clock.now_ms();
            match &result {
                Ok(_) | Err(Error::NotFound { .. } | Error::IsADirectory { .. }) => {
                    lock(&core.recoveries.retries).done(inode)
                }
                Err(Error::ShuttingDown) => {}
                Err(e) => {
                    let delay = lock(&core.recoveries.retries).failed(inode, now);
                    let path = core.state().ns.path_of(inode).unwrap_or_default();
                    tracing::warn!(path = %path, error = %e, retry_in_ms = delay, "lease recovery did not finish; it will be retried");
                }
            }
            lock(&core.recoveries.running).remove(&inode);
            // Nobody waiting is fine.
            let _ = tx.send(Some(result.map_err(|e| e.to_remote())));
        });
        rx
    }

    /// The recovery worker's pass: starts recovery of every lease past its hard limit,
    /// and resumes files left in recovery (after a restart, once their chunkservers
    /// had `dead_after` to register; after a failed attempt, once its retry is due).
    /// A master that just resumed from a pause waits [`RESUME_SETTLE`] first: renewals
    /// that queued up while it was frozen are read before any lease is judged expired.
    pub fn recovery_pass(self: &Arc<Self>) {
        if self.check_running().is_err() || !self.clock.settled(RESUME_SETTLE) {
            return;
        }
        let now = self.clock.now_ms();
        let (due, paths) = {
            let mut st = self.state();
            let grace = st.settings.dead_after_ms;
            let due = st.recoveries_due(now, grace);
            let paths: Vec<Option<String>> =
                due.iter().map(|(ino, _)| st.ns.path_of(*ino)).collect();
            (due, paths)
        };
        for ((inode, trigger), path) in due.into_iter().zip(paths) {
            if self.recoveries.is_running(inode) {
                continue;
            }
            match trigger {
                Trigger::HardLimit { .. } => {
                    tracing::info!(path = path.as_deref().unwrap_or("?"), inode = %inode, "write lease passed its hard limit; starting lease recovery");
                }
                _ => {
                    if !lock(&self.recoveries.retries).may_start(inode, now) {
                        continue;
                    }
                }
            }
            self.spawn_recovery(inode, trigger);
        }
    }

    /// One recovery attempt on `inode`, under its file lock (so it never interleaves
    /// with the old writer's `AddChunk` / `UpdatePipeline` / `Close`).
    async fn recover(&self, inode: InodeId, trigger: Trigger) -> Result<RecoveryOutcome> {
        let _file = self.file_locks.lock(inode).await;
        // Step 1: decide; the new version is durable before any bump leaves.
        let begin = self
            .mutate_durable(|st, now, mt| st.begin_recovery(inode, trigger, now, mt))
            .await?;
        let plan = match begin {
            RecoveryBegin::Done { outcome, how } => {
                match how {
                    Closing::AlreadyClosed => {}
                    Closing::HolderChanged { holder } => tracing::info!(
                        path = %outcome.path,
                        %trigger,
                        holder = %holder,
                        "lease recovery not needed: the file changed hands"
                    ),
                    Closing::Renewed { holder } => tracing::info!(
                        path = %outcome.path,
                        %trigger,
                        holder = %holder,
                        "lease recovery not needed: the holder renewed its lease meanwhile"
                    ),
                    Closing::AtCommitted => tracing::info!(
                        path = %outcome.path,
                        %trigger,
                        length = outcome.length,
                        "lease recovery: no open chunk; file closed at its committed length"
                    ),
                    Closing::Missing { handle, version } => tracing::error!(
                        path = %outcome.path,
                        %trigger,
                        handle = %handle,
                        new_version = %version,
                        length = outcome.length,
                        "lease recovery: every replica of the last chunk is gone (each \
                         chunkserver reported without it); file closed at its committed \
                         length and the chunk is MISSING"
                    ),
                    Closing::DroppedEmpty { handle } => tracing::warn!(
                        path = %outcome.path,
                        %trigger,
                        handle = %handle,
                        length = outcome.length,
                        "lease recovery: the last chunk was never granted, is empty and no                          chunkserver ever held it (the master stopped before creating its                          replicas); dropped it, file closed at its committed length"
                    ),
                }
                return Ok(outcome);
            }
            RecoveryBegin::Waiting {
                outcome,
                handle,
                fenced,
            } => {
                if fenced {
                    tracing::warn!(
                        path = %outcome.path,
                        %trigger,
                        handle = %handle,
                        old_version = ?outcome.old_version,
                        new_version = ?outcome.new_version,
                        "lease recovery: no live replica holds the writer's version; the \
                         writer's lease is revoked under a new version and the file stays \
                         in recovery until a replica is reachable"
                    );
                } else {
                    tracing::warn!(
                        path = %outcome.path,
                        %trigger,
                        handle = %handle,
                        old_version = ?outcome.old_version,
                        version = ?outcome.new_version,
                        "lease recovery: no live replica holds the writer's version yet; \
                         the file stays in recovery until one is reachable"
                    );
                }
                return Err(Error::NotEnoughReplicas { live: 0, needed: 1 });
            }
            RecoveryBegin::Bump(plan) => plan,
        };
        tracing::info!(
            path = %plan.path,
            %trigger,
            handle = %plan.handle,
            holder = %plan.holder,
            old_version = %plan.old_version,
            previous_version = %plan.previous,
            new_version = %plan.version,
            replicas = %id_list(plan.targets.iter().map(|t| &t.id)),
            "lease recovery started: new version logged, the writer's lease released"
        );
        stampfs_proto::crash_point!("recovery-after-start");
        fail_point!("recovery-after-start");

        // Step 2: push the bump; each reply carries the replica's length.
        let (bumped, stale, unanswered) = self.push_recovery_bump(&plan).await;
        let Some(length) = recovered_length(bumped.iter().map(|(_, r)| r.length)) else {
            tracing::warn!(
                path = %plan.path,
                handle = %plan.handle,
                new_version = %plan.version,
                stale = %id_list(stale.iter()),
                "lease recovery: no replica took the new version"
            );
            return Err(Error::NotEnoughReplicas { live: 0, needed: 1 });
        };
        // Step 3: the shortest replica decides.
        tracing::info!(
            path = %plan.path,
            handle = %plan.handle,
            old_version = %plan.old_version,
            new_version = %plan.version,
            replicas = %id_list(bumped.iter().map(|(a, _)| &a.id)),
            stale = %id_list(stale.iter()),
            lengths = %bumped
                .iter()
                .map(|(a, r)| format!("{}={}", a.id, r.length))
                .collect::<Vec<_>>()
                .join(","),
            length,
            "lease recovery: replicas raised to the new version (the old writer is fenced); keeping the shortest length"
        );
        stampfs_proto::crash_point!("recovery-after-bump");
        fail_point!("recovery-after-bump");

        // Step 4: truncate, compare, finalize (all, or the kept one at a new version).
        let targets: Vec<ChunkserverAddr> = bumped.into_iter().map(|(a, _)| a).collect();
        let sealed = self
            .seal_recovery(&plan, &targets, length, unanswered)
            .await?;
        let plan = sealed.plan;
        tracing::info!(
            path = %plan.path,
            handle = %plan.handle,
            new_version = %plan.version,
            length,
            replicas = %id_list(sealed.replicas.iter().map(|(id, _)| id)),
            dropped = %id_list(sealed.dropped.iter()),
            stale = %id_list(sealed.left_stale.iter()),
            "lease recovery: replicas truncated and finalized"
        );
        stampfs_proto::crash_point!("recovery-before-commit");
        fail_point!("recovery-before-commit");

        // Step 5: commit the length and close the file.
        let outcome = self
            .mutate_durable(|st, now, mt| st.commit_recovery(&plan, length, now, mt))
            .await?;
        tracing::info!(
            path = %plan.path,
            handle = %plan.handle,
            old_version = %plan.old_version,
            new_version = %plan.version,
            length,
            file_length = outcome.length,
            replicas = %id_list(sealed.replicas.iter().map(|(id, _)| id)),
            "lease recovery committed: file closed"
        );
        self.events.recovered(crate::metrics::RecoveryNote {
            path: plan.path.clone(),
            at_ms: crate::lease::wall_ms(),
            old_version: plan.old_version.0,
            new_version: plan.version.0,
            length: outcome.length,
        });
        Ok(outcome)
    }

    /// Pushes the plan's version to its targets concurrently. Returns the replicas that
    /// made it durable, with their reports, and those that did not (now stale).
    async fn push_recovery_bump(
        &self,
        plan: &RecoveryPlan,
    ) -> (
        Vec<(ChunkserverAddr, ReplicaReport)>,
        Vec<ChunkserverId>,
        bool,
    ) {
        let (handle, version) = (plan.handle, plan.version);
        // A target that did not answer may have taken the version all the same.
        let mut unanswered = false;
        let results = self
            .commands
            .send_all(&plan.targets, || ChunkCommand::BumpVersion {
                handle,
                version,
                create: false,
            })
            .await;
        let mut bumped = Vec::new();
        let mut stale = Vec::new();
        let mut short = Vec::new();
        for (target, (_, result)) in plan.targets.iter().zip(results) {
            match result {
                // A replica below the committed length missed committed bytes (it took
                // a bump late): it must not vote on the length.
                Ok(Some(rep))
                    if rep.handle == handle
                        && rep.version == version
                        && rep.length < plan.committed =>
                {
                    tracing::warn!(path = %plan.path, handle = %handle, new_version = %version, chunkserver = %target.id, length = rep.length, committed = plan.committed, "lease recovery: replica is shorter than the committed length; it is left out");
                    short.push((target.id, rep));
                    stale.push(target.id);
                }
                // The length must come from the replica: a reply without a report
                // can not vote on it.
                Ok(Some(rep)) if rep.handle == handle && rep.version == version => {
                    bumped.push((target.clone(), rep))
                }
                Ok(other) => {
                    tracing::warn!(path = %plan.path, handle = %handle, new_version = %version, chunkserver = %target.id, report = ?other, "lease recovery: bump answered without the new version; the replica is stale");
                    stale.push(target.id);
                }
                Err(e) => {
                    tracing::warn!(path = %plan.path, handle = %handle, new_version = %version, chunkserver = %target.id, error = %e, "lease recovery: bump failed; the replica is stale");
                    stale.push(target.id);
                    unanswered = true;
                }
            }
        }
        let mut reports: Vec<_> = bumped.iter().map(|(a, r)| (a.id, *r)).collect();
        reports.extend(short);
        self.state().record_replicas(handle, &reports);
        (bumped, stale, unanswered)
    }

    /// `RecoverLease` (`stampfs recover PATH`): forces lease recovery of a file
    /// whatever its lease, and waits for it (at most [`RECOVER_WAIT`]). A closed file
    /// answers `closed: true` without versions; a recovery that did not finish in
    /// time answers `closed: false` with the versions (it goes on in the background).
    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client))]
    pub async fn recover_lease(self: &Arc<Self>, req: RecoverLease) -> Result<RecoveryOutcome> {
        let comps = namespace::components(&req.path)?;
        let path = join(&comps);
        let inode = {
            let st = self.state();
            st.check_access(&path, req.caller.as_ref(), crate::perm::WRITE)?;
            let inode = st.ns.resolve(&comps)?;
            if st.ns.file(inode).is_none() {
                return Err(st.not_a_file(&path, inode));
            }
            inode
        };
        let closed = self
            .read(|st, _| st.recovery_outcome(inode, path.clone()))
            .await?;
        if closed.closed {
            return Ok(closed);
        }
        tracing::info!(path = %path, client = %req.client, "lease recovery requested");
        if req.accept_loss {
            tracing::warn!(path = %path, client = %req.client, "lease recovery requested with --accept-loss: unreachable replicas will be given up");
        }
        let mut rx = self.spawn_recovery(
            inode,
            Trigger::Operator {
                client: req.client,
                accept_loss: req.accept_loss,
            },
        );
        let waited = tokio::time::timeout(RECOVER_WAIT, async {
            rx.wait_for(Option::is_some).await.map(|v| v.clone())
        })
        .await;
        match waited {
            Ok(Ok(Some(Ok(mut outcome)))) => {
                outcome.path = path;
                Ok(outcome)
            }
            Ok(Ok(Some(Err(e)))) => {
                // A failed attempt leaves the file in recovery for the worker to retry.
                match self
                    .read(|st, _| st.recovery_outcome(inode, path.clone()))
                    .await
                {
                    Ok(now) if !now.closed => Ok(now),
                    _ => Err(e.into()),
                }
            }
            Ok(Ok(None)) | Ok(Err(_)) => Err(Error::ShuttingDown),
            Err(_) => {
                tracing::info!(path = %path, waited_ms = RECOVER_WAIT.as_millis() as u64, "lease recovery still running; answering closed: false");
                self.read(|st, _| st.recovery_outcome(inode, path.clone()))
                    .await
            }
        }
    }
}
