//! The replica-health worker's pass and the health requests, as methods of [`Core`]:
//! the decisions are in [`crate::health`], the state changes in the state machine.
//! Commands reach chunkservers through their heartbeat replies
//! ([`Core::heartbeat`](super::Core::heartbeat)); verifications of replicas reported
//! corrupt are asked directly, in the background, so the reporter is not kept waiting.

use super::Core;
use crate::error::{Error, Result};
use crate::health::{Action, CorruptHint, Pass, Pruned, Verified, VerifyRefusal, SLICE_BUDGET};
use crate::lease::wall_ms;
use crate::state::CorruptReport;
use stampfs_proto::{
    BalanceAction, BalanceRequest, BalanceStatus, ChunkHandle, ChunkserverId, ClusterReport,
    ClusterReportRequest, Fsck, FsckReport, RemoteError, ReportCorrupt, RpcClient, SafeModeAction,
    SafeModeRequest, SafeModeStatus, Verification, VerifyReplica,
};
use std::sync::Arc;
use std::time::Duration;

/// What one health pass did ([`Core::run_health_pass`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct PassSummary {
    /// Chunks examined.
    pub chunks: u64,
    /// Slices, each one hold of the state lock.
    pub steps: u64,
    /// Actions decided.
    pub actions: usize,
    /// The longest hold of the state lock by one slice.
    pub longest_step: Duration,
    /// The whole pass, slices and the time between them.
    pub took: Duration,
}

impl Core {
    /// One pass of the replica-health worker. Nothing happens until the chunkservers
    /// had `dead_after` to register after a master start or after this member took
    /// the lead of its group (before that, every chunk looks under-replicated), nor
    /// within [`crate::lease::RESUME_SETTLE`] of the master resuming from a pause
    /// (heartbeats queued meanwhile are read first).
    pub async fn health_pass(&self) {
        if self.check_running().is_err() || !self.clock.settled(crate::lease::RESUME_SETTLE) {
            return;
        }
        let now = self.clock.now_ms();
        let dead_after = self.state().settings.dead_after_ms;
        let led_since = self.log.led_since_ms().unwrap_or(0);
        if now < dead_after || now.saturating_sub(led_since) < dead_after {
            return;
        }
        self.run_health_pass().await;
    }

    /// A whole health pass now, in slices ([`crate::health::Pass`]): the state lock is
    /// held for one slice at a time (at most [`SLICE_BUDGET`] units of work) and
    /// released between them, so requests, heartbeats and reports go on meanwhile. A
    /// pass is abandoned (the next one starts over) at shutdown, when the master
    /// halts, and when the master resumes from a pause (the heartbeats that queued up
    /// are read before anyone is judged). Returns what it did.
    #[tracing::instrument(skip_all)]
    pub async fn run_health_pass(&self) -> PassSummary {
        let started = std::time::Instant::now();
        {
            // A new lead knows no replica yet: safe mode again.
            let lead = self.log.led_since_ms();
            let mut st = self.state();
            if st.safe_mode.new_lead(lead) {
                st.safe_mode.enter_auto(lead);
                tracing::info!("in safe mode until the chunkservers have reported to this leader");
            }
        }
        let mut pass = Pass::new();
        let mut summary = PassSummary::default();
        let mut pacer = crate::pacing::Pacer::new();
        while !pass.done() {
            if self.shutdown.is_cancelled()
                || self.check_running().is_err()
                || !self.clock.settled(crate::lease::RESUME_SETTLE)
            {
                tracing::debug!(steps = pass.steps, "health pass abandoned");
                return summary;
            }
            let (pruned, actions, held) = {
                let mut st = self.state();
                let t = std::time::Instant::now();
                let (pruned, actions) = st.health_step(
                    &mut pass,
                    self.clock.now_ms(),
                    wall_ms(),
                    &mut rand::thread_rng(),
                    SLICE_BUDGET,
                );
                (pruned, actions, t.elapsed())
            };
            summary.longest_step = summary.longest_step.max(held);
            summary.actions += actions.len();
            log_pruned(&pruned);
            self.events
                .replications_done
                .inc_by(pruned.copied.len() as u64);
            self.act(&actions).await;
            // Let the requests that waited for the lock run before the next slice.
            pacer.pause().await;
        }
        summary.steps = pass.steps;
        summary.chunks = pass.chunks;
        summary.took = started.elapsed();
        self.after_pass(&pass);
        tracing::debug!(
            chunks = summary.chunks,
            steps = summary.steps,
            actions = summary.actions,
            longest_step_us = summary.longest_step.as_micros() as u64,
            took_ms = summary.took.as_millis() as u64,
            "health pass done"
        );
        summary
    }

    /// Safe mode's look at a whole pass: it ends once enough chunks have a replica
    /// reported (`safe_mode.rs`).
    fn after_pass(&self, pass: &Pass) {
        use crate::safe_mode::Transition;
        let now = self.clock.now_ms();
        let mut st = self.state();
        if let (Some(b), Some(step)) = (st.balancer.as_mut(), pass.balance.as_ref()) {
            use crate::health::balance::Outcome;
            match b.after_pass(step) {
                Outcome::Running => {}
                Outcome::Balanced => tracing::info!(
                    moves = b.moves_ordered,
                    "the cluster is balanced: every live chunkserver is within the threshold of the average use; the balancer stops"
                ),
                Outcome::Stuck => tracing::warn!(
                    moves = b.moves_ordered,
                    passes = crate::health::balance::IDLE_PASSES,
                    "the balancer gives up: no replica it may move would help (every target holds the chunks, or none is quiet)"
                ),
            }
        }
        let t = st.settings.safe_mode;
        match st.safe_mode.after_pass(pass.chunks, pass.reported, now, t) {
            Transition::Left => tracing::info!(
                chunks = pass.chunks,
                reported = pass.reported,
                "leaving safe mode: enough chunks have a replica reported; replica deletions and re-replication start"
            ),
            Transition::Met => tracing::debug!(
                chunks = pass.chunks,
                reported = pass.reported,
                extension_ms = t.extension_ms,
                "safe mode threshold met; waiting for the extension"
            ),
            Transition::Stay if st.safe_mode.is_on() => tracing::debug!(
                chunks = pass.chunks,
                reported = pass.reported,
                "still in safe mode"
            ),
            Transition::Stay => {}
        }
    }

    /// `stampfs admin balance` (superusers only: the connection handler checks).
    #[tracing::instrument(skip_all, fields(action = ?req.action))]
    pub async fn balance(&self, req: BalanceRequest) -> Result<BalanceStatus> {
        use crate::health::balance::Balancer;
        self.log.serving()?;
        let mut st = self.state();
        match req.action {
            BalanceAction::Status => {}
            BalanceAction::Start { threshold_pct } => {
                if !(1..=99).contains(&threshold_pct) {
                    return Err(Error::BadRequest {
                        reason: format!(
                            "balance threshold {threshold_pct}% is not between 1% and 99%"
                        ),
                    });
                }
                st.balancer = Some(Balancer {
                    threshold_pct,
                    ..Balancer::default()
                });
                tracing::info!(threshold_pct, "balancer started");
            }
            BalanceAction::Stop => {
                if st.balancer.take().is_some() {
                    tracing::info!("balancer stopped; copies in flight finish");
                }
            }
        }
        Ok(Balancer::status(st.balancer.as_ref()))
    }

    /// `stampfs admin safemode` (superusers only: the connection handler checks).
    #[tracing::instrument(skip_all, fields(action = ?req.action))]
    pub async fn safe_mode(&self, req: SafeModeRequest) -> Result<SafeModeStatus> {
        self.log.serving()?;
        let now = self.clock.now_ms();
        let mut st = self.state();
        match req.action {
            SafeModeAction::Get => {}
            SafeModeAction::Enter => {
                st.safe_mode.enter_manual();
                tracing::info!("safe mode entered by hand: no replica deletions or re-replication until `admin safemode leave`");
            }
            SafeModeAction::Leave => {
                st.safe_mode.leave();
                tracing::info!("safe mode left by hand");
            }
        }
        Ok(st.safe_mode.status(st.settings.safe_mode, now))
    }

    /// Logs what a slice decided and runs its trash purges (logged records).
    async fn act(&self, actions: &[Action]) {
        for a in actions {
            match a {
                Action::CheckpointTrash { user } => {
                    let made = self
                        .mutate_durable(|st, now, mt| st.checkpoint_trash(user, now, mt))
                        .await;
                    match made {
                        Ok(Some(name)) => {
                            tracing::info!(user = %user, checkpoint = %name, "trash checkpoint taken")
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(user = %user, error = %e, "cannot take a trash checkpoint")
                        }
                    }
                }
                Action::PurgeTrash { name } => {
                    let purged = self
                        .mutate_durable(|st, now, mt| st.purge_trash(name, now, mt))
                        .await;
                    match purged {
                        Ok(true) => {
                            tracing::info!(entry = %name, "trash entry expired; deleted with its chunks")
                        }
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(entry = %name, error = %e, "cannot purge a trash entry")
                        }
                    }
                }
                Action::Delete {
                    server,
                    handle,
                    max_version,
                    reason,
                } => {
                    tracing::info!(chunk = %handle, chunkserver = %server, max_version = %max_version, %reason, "replica deletion ordered")
                }
                Action::Replicate {
                    handle,
                    version,
                    source,
                    target,
                    live,
                    replication,
                    moving_from: None,
                } => {
                    tracing::info!(chunk = %handle, %version, source = %source, target = %target.id, live, replication, "re-replication ordered")
                }
                Action::Replicate {
                    handle,
                    version,
                    source,
                    target,
                    moving_from: Some(_),
                    ..
                } => {
                    tracing::info!(chunk = %handle, %version, source = %source, target = %target.id, "balancer move ordered")
                }
                Action::Finalize {
                    server,
                    handle,
                    version,
                    length,
                } => {
                    tracing::info!(chunk = %handle, chunkserver = %server, %version, length, "finalize of a finished chunk ordered")
                }
            }
        }
    }

    /// `ReportCorrupt`: a hint from anyone (a reader, or the chunkserver itself). The
    /// replica is not touched; its chunkserver is asked, in the background, to verify
    /// it (within the limits of [`crate::health::Tracker::begin_verify`]).
    #[tracing::instrument(skip_all, fields(chunk = %req.handle, chunkserver = %req.chunkserver))]
    pub async fn report_corrupt(self: &Arc<Self>, req: ReportCorrupt) -> Result<()> {
        let now = self.clock.now_ms();
        let hint = self.state().corrupt_hint(req.handle, req.chunkserver, now);
        match hint {
            CorruptHint::Verify { addr, version } => {
                tracing::info!(%version, %addr, "replica reported corrupt: its chunkserver is asked to verify it");
                self.spawn_verify(req.handle, req.chunkserver, addr);
            }
            CorruptHint::Refused(VerifyRefusal::Running) => {
                tracing::debug!("replica reported corrupt: a verification is running")
            }
            CorruptHint::Refused(VerifyRefusal::Recent { ago_ms }) => {
                tracing::debug!(
                    ago_ms,
                    "replica reported corrupt: verified recently; ignored"
                )
            }
            // Debug only: a flood of reports must not become a flood of log lines.
            CorruptHint::Refused(VerifyRefusal::Busy) => tracing::debug!(
                "replica reported corrupt: its chunkserver has enough verifications; ignored"
            ),
            CorruptHint::AlreadyMarked => tracing::debug!("replica already known corrupt"),
            CorruptHint::NotAReplica => {
                tracing::debug!("replica reported corrupt is not listed on that chunkserver")
            }
            CorruptHint::NotLive => {
                tracing::debug!("replica reported corrupt is on a chunkserver that is not live")
            }
            CorruptHint::UnknownChunk => tracing::debug!("corrupt replica of an unknown chunk"),
        }
        Ok(())
    }

    /// Asks `server` (at `addr`) to verify its replica of `handle` and applies the
    /// answer, as a background task.
    fn spawn_verify(self: &Arc<Self>, handle: ChunkHandle, server: ChunkserverId, addr: String) {
        let core = self.clone();
        self.tasks.spawn(async move {
            let answer = tokio::select! {
                _ = core.shutdown.cancelled() => Err(Error::ShuttingDown),
                a = core.ask_verify(server, &addr, handle) => a,
            };
            if core.check_running().is_err() || matches!(answer, Err(Error::ShuttingDown)) {
                return;
            }
            let mut st = core.state();
            let found = match answer {
                Ok(found) => found,
                Err(e) => {
                    st.verify_failed(handle, server);
                    drop(st);
                    tracing::warn!(chunk = %handle, chunkserver = %server, %addr, error = %e, "verification of a replica reported corrupt failed; the replica stays");
                    return;
                }
            };
            let outcome = st.verified(handle, server, &found);
            drop(st);
            log_verified(handle, server, &addr, &found, outcome);
        });
    }

    /// One `VerifyReplica` round trip: connect within `--command-timeout`, answer within
    /// `--replication-timeout` (the replica is read whole).
    async fn ask_verify(
        &self,
        server: ChunkserverId,
        addr: &str,
        handle: ChunkHandle,
    ) -> Result<Verification> {
        let req = self.commands.sign(server, VerifyReplica { handle })?;
        let mut conn =
            RpcClient::connect(self.commands.dialer(), addr, self.config.command_timeout).await?;
        let limit = self
            .config
            .replication_timeout
            .max(self.config.command_timeout);
        match stampfs_proto::pause::timeout(limit, conn.call(req)).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(RemoteError::Unavailable {
                reason: format!("{addr} did not finish the verification within {limit:?}"),
            }
            .into()),
        }
    }

    #[tracing::instrument(skip_all, fields(path = ?req.path))]
    pub async fn fsck(&self, req: Fsck) -> Result<FsckReport> {
        self.read(|st, now| st.fsck(req.path.as_deref(), now)).await
    }

    #[tracing::instrument(skip_all)]
    pub async fn cluster_report(&self, _req: ClusterReportRequest) -> Result<ClusterReport> {
        let mut report = self.read(|st, now| Ok(st.cluster_report(now))).await?;
        report.masters = self.log.group().map(|g| g.status());
        Ok(report)
    }
}

fn log_verified(
    handle: ChunkHandle,
    server: ChunkserverId,
    addr: &str,
    found: &Verification,
    v: Verified,
) {
    let r = match (v, found) {
        (Verified::Clean, Verification::Clean { replica }) => {
            tracing::info!(chunk = %handle, chunkserver = %server, version = %replica.version, length = replica.length, "replica reported corrupt verified clean by its chunkserver; it stays");
            return;
        }
        (Verified::Clean, _) => return,
        (Verified::Ignored(why), _) => {
            // Debug only: the chunk reports and the scrub act on a replica that is
            // really gone or corrupt.
            tracing::debug!(chunk = %handle, chunkserver = %server, %addr, ?found, ?why, "answer to a verification ignored: it may not be about the replica asked about");
            return;
        }
        (Verified::Corrupt(r) | Verified::Absent(r), _) => r,
    };
    let found = match found {
        Verification::Corrupt { version, offset } => format!(
            "verified corrupt at offset {offset} (version {version}) and moved aside by its chunkserver"
        ),
        _ => "absent from its chunkserver (moved aside or deleted)".to_string(),
    };
    log_excluded(handle, server, r, &found);
}

fn log_excluded(handle: ChunkHandle, server: ChunkserverId, r: CorruptReport, found: &str) {
    match r {
        CorruptReport::Excluded { version } => {
            tracing::warn!(chunk = %handle, chunkserver = %server, %version, found, "replica reported corrupt: excluded; it will be replaced, then deleted")
        }
        CorruptReport::AlreadyMarked => {
            tracing::debug!(chunk = %handle, chunkserver = %server, found, "replica already known corrupt")
        }
        CorruptReport::Gone => {
            tracing::info!(chunk = %handle, chunkserver = %server, found, "replica reported corrupt is already gone from its chunkserver")
        }
        CorruptReport::UnknownChunk => {
            tracing::debug!(chunk = %handle, chunkserver = %server, found, "corrupt replica of an unknown chunk")
        }
    }
}

fn log_pruned(p: &Pruned) {
    for c in &p.copied {
        tracing::info!(chunk = %c.handle, version = %c.version, source = %c.source, target = %c.target, "re-replication done");
    }
    for (c, why) in &p.lost {
        tracing::warn!(chunk = %c.handle, version = %c.version, source = %c.source, target = %c.target, reason = why, "re-replication abandoned; it will be ordered again if still needed");
    }
    if p.expired > 0 {
        tracing::warn!(
            commands = p.expired,
            "deletions or finalizes were not confirmed in time; they will be ordered again if still needed"
        );
    }
}
