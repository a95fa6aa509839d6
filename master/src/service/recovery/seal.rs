//! Step 4 of lease recovery, the seal, as a method of [`Core`]: cut the bumped
//! replicas to the recovered length, compare their digests, and finalize them all
//! (identical) or only the first of the granted pipeline at one more version
//! (diverged; DESIGN.md "Lease recovery compares content"). The rules are pure
//! functions in `crate::recovery` (`compare_content`, `after_seal`, `replica_at`).
//!
//! Between the extra version and its bump sit a fail point and a crash point of the
//! same name (`recovery-after-kept-version`).

use super::Core;
use crate::error::{Error, Result};
use crate::recovery::{
    after_seal, id_list, in_pipeline_order, replica_at, seal_decision, AfterSeal, SealDecision,
};
use crate::state::RecoveryPlan;
use stampfs_proto::{
    ChunkCommand, ChunkserverAddr, ChunkserverId, ReplicaDigest, ReplicaReport, ReplicaState,
};

/// What a seal left to commit.
#[derive(Debug)]
pub(super) struct Sealed {
    /// The plan the commit is made at: the attempt's own, or, when the replicas
    /// diverged, the kept replica's at one more version.
    pub plan: RecoveryPlan,
    /// The sealed replicas with their reports (finalized at `plan.version`).
    pub replicas: Vec<(ChunkserverId, ReplicaReport)>,
    /// Replicas whose truncate, digest or finalize failed: dropped from the chunk's
    /// replica list.
    pub dropped: Vec<ChunkserverId>,
    /// Replicas left at the attempt's version because they hold other bytes than the
    /// kept one, or because only one is kept: stale.
    pub left_stale: Vec<ChunkserverId>,
}

impl Core {
    /// Truncates `targets` (the bumped replicas, at `plan.version`) to `length`, asks
    /// each for its digest, and seals: every replica at `plan.version` when their
    /// digests are equal; otherwise the first of the granted pipeline among those that
    /// answered, alone, at a version minted (durably) for it. A replica whose truncate,
    /// digest or finalize fails is dropped when another one is sealed; when none is,
    /// every one stays listed and the attempt fails, to be retried.
    pub(super) async fn seal_recovery(
        &self,
        plan: &RecoveryPlan,
        targets: &[ChunkserverAddr],
        length: u64,
        unanswered: bool,
    ) -> Result<Sealed> {
        let (handle, version) = (plan.handle, plan.version);
        let mut failed: Vec<ChunkserverId> = Vec::new();

        // Cut every bumped replica to the recovered length.
        let results = self
            .commands
            .send_all(targets, || ChunkCommand::Truncate {
                handle,
                version,
                length,
            })
            .await;
        let mut cut: Vec<ChunkserverAddr> = Vec::new();
        for (target, (_, result)) in targets.iter().zip(results) {
            match result {
                Ok(rep) if replica_at(rep.as_ref(), handle, version, length) => {
                    cut.push(target.clone())
                }
                Ok(other) => {
                    tracing::warn!(path = %plan.path, handle = %handle, chunkserver = %target.id, report = ?other, "lease recovery: unexpected truncate reply; the replica is dropped");
                    failed.push(target.id);
                }
                Err(e) => {
                    tracing::warn!(path = %plan.path, handle = %handle, chunkserver = %target.id, error = %e, "lease recovery: truncate failed; the replica is dropped");
                    failed.push(target.id);
                }
            }
        }

        // Compare what they hold.
        let mut digests: Vec<(ChunkserverId, ReplicaDigest)> = Vec::new();
        for (id, result) in self.commands.digest_all(&cut, handle, version).await {
            match result {
                Ok(d) if replica_at(Some(&d.replica), handle, version, length) => {
                    digests.push((id, d))
                }
                Ok(d) => {
                    tracing::warn!(path = %plan.path, handle = %handle, chunkserver = %id, report = ?d.replica, "lease recovery: digest of another replica than the one cut; the replica is dropped");
                    failed.push(id);
                }
                Err(e) => {
                    tracing::warn!(path = %plan.path, handle = %handle, chunkserver = %id, error = %e, "lease recovery: digest failed; the replica is dropped");
                    failed.push(id);
                }
            }
        }
        in_pipeline_order(&mut digests, &plan.pipeline);
        let view: Vec<(ChunkserverId, &ReplicaDigest)> =
            digests.iter().map(|(id, d)| (*id, d)).collect();
        let answered: Vec<ChunkserverAddr> = digests
            .iter()
            .filter_map(|(id, _)| cut.iter().find(|t| t.id == *id).cloned())
            .collect();

        // A replica that failed a step (or never answered its bump) may hold the
        // attempt's version with bytes nobody compared: fence it below the commit.
        let must_fence = unanswered || !failed.is_empty();
        let (sealed_plan, to_seal, left_stale) = match seal_decision(&view, must_fence) {
            SealDecision::All => (plan.clone(), answered, Vec::new()),
            SealDecision::Fence { keep, stale } => {
                let kept: Vec<ChunkserverAddr> = answered
                    .iter()
                    .filter(|t| keep.contains(&t.id))
                    .cloned()
                    .collect();
                if kept.len() != keep.len() {
                    return Err(Error::bad_request(format!(
                        "the kept replicas {} of {handle} are not all among those that answered",
                        id_list(keep.iter())
                    )));
                }
                tracing::warn!(
                    path = %plan.path,
                    handle = %handle,
                    version = %version,
                    length,
                    kept = %id_list(keep.iter()),
                    diverged = %id_list(stale.iter()),
                    unknown = %id_list(failed.iter()),
                    unanswered_bump = unanswered,
                    "lease recovery: keeping the first of the granted pipeline and the replicas \
                     holding its bytes at a new version; the others (other bytes, or bytes \
                     nobody could compare) stay stale and are replaced by copies"
                );
                let kept_plan = self
                    .mutate_durable(|st, now, _| st.mint_kept_version(plan, &kept, now))
                    .await?;
                stampfs_proto::crash_point!("recovery-after-kept-version");
                fail_point!("recovery-after-kept-version");
                let mut to_seal = Vec::new();
                for k in &kept {
                    if self.bump_kept(&kept_plan, k, length).await {
                        to_seal.push(k.clone());
                    } else {
                        failed.push(k.id);
                    }
                }
                (kept_plan, to_seal, stale)
            }
        };

        // Finalize at the version the commit is made at.
        let sealed_version = sealed_plan.version;
        let results = self
            .commands
            .send_all(&to_seal, || ChunkCommand::Finalize {
                handle,
                version: sealed_version,
                length,
            })
            .await;
        let mut sealed: Vec<(ChunkserverId, ReplicaReport)> = Vec::new();
        for (id, result) in results {
            match result {
                Ok(Some(rep))
                    if replica_at(Some(&rep), handle, sealed_version, length)
                        && rep.state == ReplicaState::Finalized =>
                {
                    sealed.push((id, rep))
                }
                Ok(other) => {
                    tracing::warn!(path = %plan.path, handle = %handle, chunkserver = %id, report = ?other, "lease recovery: unexpected finalize reply; the replica is dropped");
                    failed.push(id);
                }
                Err(e) => {
                    tracing::warn!(path = %plan.path, handle = %handle, chunkserver = %id, error = %e, "lease recovery: finalize failed; the replica is dropped");
                    failed.push(id);
                }
            }
        }
        let sealed_ids: Vec<ChunkserverId> = sealed.iter().map(|(id, _)| *id).collect();
        match after_seal(&sealed_ids, &failed) {
            AfterSeal::Retry => {
                tracing::warn!(path = %plan.path, handle = %handle, new_version = %sealed_version, failed = %id_list(failed.iter()), "lease recovery: no replica could be sealed; they stay listed and the next attempt bumps them again");
                Err(Error::NotEnoughReplicas { live: 0, needed: 1 })
            }
            AfterSeal::Commit { drop } => {
                let mut st = self.state();
                let cut_reports: Vec<(ChunkserverId, ReplicaReport)> = digests
                    .iter()
                    .filter(|(id, _)| left_stale.contains(id))
                    .map(|(id, d)| (*id, d.replica))
                    .collect();
                st.record_replicas(handle, &cut_reports);
                st.record_replicas(handle, &sealed);
                st.drop_replicas(handle, &drop);
                Ok(Sealed {
                    plan: sealed_plan,
                    replicas: sealed,
                    dropped: drop,
                    left_stale,
                })
            }
        }
    }

    /// Pushes the kept replica's version (`kept_plan.version`, durable) to it; whether
    /// it took it at the recovered `length`.
    async fn bump_kept(
        &self,
        kept_plan: &RecoveryPlan,
        kept: &ChunkserverAddr,
        length: u64,
    ) -> bool {
        let (handle, version) = (kept_plan.handle, kept_plan.version);
        let bump = ChunkCommand::BumpVersion {
            handle,
            version,
            create: false,
        };
        match self.commands.send(kept, bump).await {
            Ok(rep) if replica_at(rep.as_ref(), handle, version, length) => {
                if let Some(rep) = rep {
                    self.state().record_replicas(handle, &[(kept.id, rep)]);
                }
                true
            }
            Ok(other) => {
                tracing::warn!(path = %kept_plan.path, handle = %handle, new_version = %version, chunkserver = %kept.id, report = ?other, "lease recovery: the kept replica answered its bump without the new version and length");
                false
            }
            Err(e) => {
                tracing::warn!(path = %kept_plan.path, handle = %handle, new_version = %version, chunkserver = %kept.id, error = %e, "lease recovery: the kept replica's bump failed");
                false
            }
        }
    }
}
