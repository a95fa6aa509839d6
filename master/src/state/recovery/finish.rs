//! The end of a recovery attempt, as methods of [`MasterState`]: the extra version for
//! the one replica kept when the bumped replicas hold different bytes, the commit,
//! and the replicas a seal could not reach. The rules are pure functions in
//! `crate::recovery` (its `seal` module); the steps that talk to chunkservers are in
//! the service.

use super::RecoveryPlan;
use crate::error::Result;
use crate::state::{MasterState, Record};
use stampfs_proto::{ChunkHandle, ChunkserverAddr, ChunkserverId, RecoveryOutcome, RemoteError};

impl MasterState {
    /// The bumped replicas of `plan` hold different bytes (DESIGN.md, "Lease recovery
    /// compares content"): logs one more version of its chunk (`SetVersion`; the caller
    /// waits until it is durable before the bump leaves, invariant 1) and returns the
    /// plan that pushes it to `keep` alone and commits at it. The file stays
    /// `Recovering` until that commit: a restart in between resumes the recovery over
    /// every pipeline replica from the writer's version up to this one, at yet another
    /// version. Refused, like the commit, when the file moved on meanwhile.
    pub fn mint_kept_version(
        &mut self,
        plan: &RecoveryPlan,
        keep: &[ChunkserverAddr],
        now_ms: u64,
    ) -> Result<RecoveryPlan> {
        self.plan_is_current(plan)?;
        let version = plan.version.next();
        self.commit(
            Record::SetVersion {
                handle: plan.handle,
                version,
            },
            now_ms,
        )?;
        Ok(RecoveryPlan {
            previous: plan.version,
            version,
            targets: keep.to_vec(),
            ..plan.clone()
        })
    }

    /// The file of `plan` is still in recovery with the plan's chunk open, at the
    /// plan's version (no other attempt minted past it, nothing deleted it); returns
    /// its path.
    fn plan_is_current(&self, plan: &RecoveryPlan) -> Result<String> {
        let (path, f) = self.recovery_file(plan.inode)?;
        let at = self.chunks.get(plan.handle).map(|i| i.version);
        let open = self.open_chunk_of(plan.inode, f);
        if !f.is_recovering() || open != Some(plan.handle) || at != Some(plan.version) {
            return Err(RemoteError::Unavailable {
                reason: format!(
                    "{path} changed during lease recovery (chunk {} is at {at:?}, not {})",
                    plan.handle, plan.version
                ),
            }
            .into());
        }
        Ok(path)
    }

    /// Step 5: commits the recovered `length` of the plan's chunk and closes the file.
    /// Refused when the file moved on meanwhile (deleted, or another attempt minted a
    /// newer version).
    pub fn commit_recovery(
        &mut self,
        plan: &RecoveryPlan,
        length: u64,
        now_ms: u64,
        mtime_ms: u64,
    ) -> Result<RecoveryOutcome> {
        let path = self.plan_is_current(plan)?;
        self.commit(
            Record::RecoveryCommitted {
                inode: plan.inode,
                handle: plan.handle,
                version: plan.version,
                length,
                mtime_ms,
            },
            now_ms,
        )?;
        let mut outcome = self.recovery_outcome(plan.inode, path)?;
        outcome.old_version = Some(plan.old_version);
        outcome.new_version = Some(plan.version);
        Ok(outcome)
    }

    /// Forgets replicas of `handle` that failed to be sealed by a recovery: they are
    /// not handed out (a later report at the sealed version brings them back; they
    /// hold at least the committed length).
    pub fn drop_replicas(&mut self, handle: ChunkHandle, ids: &[ChunkserverId]) {
        let Some(info) = self.chunks.get_mut(handle) else {
            return;
        };
        for id in ids {
            if let Some(idx) = crate::chunk_table::server_index(*id) {
                info.remove_replica(idx);
            }
            if let Some(cs) = self.registry.get_mut(*id) {
                cs.replicas.remove(&handle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{open_file, replay, report, state_with_servers};
    use super::super::RecoveryBegin;
    use crate::recovery::Trigger;
    use crate::state::{MasterState, Record};
    use stampfs_proto::{
        ChunkHandle, ChunkVersion, ChunkserverId, FileState, InodeId, Register, ReplicaState,
    };

    /// An open file whose recovery bumped all three replicas to 2 and cut them to
    /// 1000 bytes.
    fn bumped() -> (
        MasterState,
        InodeId,
        ChunkHandle,
        Vec<ChunkserverId>,
        super::RecoveryPlan,
    ) {
        let mut st = state_with_servers(3);
        let (ino, h, ids) = open_file(&mut st);
        let RecoveryBegin::Bump(plan) = st
            .begin_recovery(ino, Trigger::Resume, 1_000, 2)
            .expect("begin")
        else {
            panic!("expected a bump");
        };
        assert_eq!(plan.version, ChunkVersion(2));
        assert_eq!(
            plan.pipeline, ids,
            "the plan knows the granted pipeline's order"
        );
        let cut: Vec<_> = ids
            .iter()
            .map(|id| (*id, report(h, 2, 1000, ReplicaState::Writing)))
            .collect();
        st.record_replicas(h, &cut);
        (st, ino, h, ids, plan)
    }

    #[test]
    fn diverged_replicas_commit_at_one_more_version_on_the_kept_one_alone() {
        let (mut st, ino, h, ids, plan) = bumped();
        let keep = plan
            .targets
            .iter()
            .find(|t| t.id == ids[0])
            .expect("the head is a target")
            .clone();
        let kept = st
            .mint_kept_version(&plan, std::slice::from_ref(&keep), 1_000)
            .expect("mint");
        assert_eq!(
            (kept.previous, kept.version, kept.old_version),
            (ChunkVersion(2), ChunkVersion(3), ChunkVersion(1))
        );
        assert_eq!(kept.targets, vec![keep.clone()]);
        // The version is logged as versions are, and the file is still in recovery.
        let log = st.take_outbox();
        assert!(log.iter().any(|(_, bytes)| matches!(
            crate::state::decode_record(bytes),
            Ok(Record::SetVersion { handle, version: ChunkVersion(3) }) if handle == h
        )));
        assert_eq!(st.stat("/f").expect("stat").state, FileState::Recovering);
        // The attempt's own plan can no longer commit, nor mint again.
        assert!(st.commit_recovery(&plan, 1000, 1_000, 3).is_err());
        assert!(st
            .mint_kept_version(&plan, std::slice::from_ref(&keep), 1_000)
            .is_err());

        st.record_replicas(h, &[(keep.id, report(h, 3, 1000, ReplicaState::Finalized))]);
        let out = st.commit_recovery(&kept, 1000, 1_000, 3).expect("commit");
        assert_eq!(
            (out.closed, out.old_version, out.new_version, out.length),
            (true, Some(ChunkVersion(1)), Some(ChunkVersion(3)), 1000)
        );
        // Only the kept replica is served; the others are stale.
        let key = stampfs_proto::ClusterKey::from_bytes([1; 32]);
        let loc = st
            .locations("/f", super::super::tests::B, &key, 1_000)
            .expect("locations");
        let served: Vec<_> = loc.chunks[0]
            .replicas
            .iter()
            .map(|r| r.chunkserver)
            .collect();
        assert_eq!(served, vec![keep.id]);
        let fsck = st.fsck(None, 1_000).expect("fsck");
        assert_eq!(fsck.total.stale_replicas, 2, "{fsck:?}");
        assert_eq!(fsck.total.under_replicated, 1, "{fsck:?}");
        let mut log = log;
        log.extend(st.take_outbox());
        let back = replay(&st, &log);
        assert_eq!(back.chunks.get(h).expect("chunk").version, ChunkVersion(3));
        assert_eq!(back.stat("/f").expect("stat").state, FileState::Closed);
        let _ = ino;
    }

    #[test]
    fn a_restart_between_the_kept_version_and_the_commit_resumes_over_every_replica() {
        // The kept replica took the extra version or did not: either way the resumed
        // attempt bumps all three again, above everything minted.
        for kept_bumped in [false, true] {
            let (mut st, ino, h, ids, plan) = bumped();
            let keep = plan.targets[0].clone();
            st.mint_kept_version(&plan, std::slice::from_ref(&keep), 1_000)
                .expect("mint");
            let log = st.take_outbox();
            let mut back = replay(&st, &log);
            assert_eq!(back.stat("/f").expect("stat").state, FileState::Recovering);
            assert_eq!(back.chunks.get(h).expect("chunk").version, ChunkVersion(3));
            for (i, id) in ids.iter().enumerate() {
                let v = if kept_bumped && *id == keep.id { 3 } else { 2 };
                back.register(
                    &Register {
                        id: Some(*id),
                        addr: format!("127.0.0.1:{}", 9100 + i),
                        capacity: 1 << 40,
                        used: 0,
                        replicas: vec![report(h, v, 1000, ReplicaState::Writing)],
                        session: 0,
                    },
                    100,
                    back.ack_mark(),
                )
                .expect("register");
            }
            assert_eq!(back.recoveries_due(800, 800), vec![(ino, Trigger::Resume)]);
            let RecoveryBegin::Bump(again) = back
                .begin_recovery(ino, Trigger::Resume, 800, 3)
                .expect("resume")
            else {
                panic!("expected a bump");
            };
            assert_eq!(
                (again.old_version, again.previous, again.version),
                (ChunkVersion(1), ChunkVersion(3), ChunkVersion(4)),
                "a fresh version above the kept one's"
            );
            let mut targets: Vec<_> = again.targets.iter().map(|t| t.id).collect();
            targets.sort();
            let mut want = ids.clone();
            want.sort();
            assert_eq!(targets, want, "every pipeline replica takes part again");
            assert_eq!(again.pipeline, ids);
        }
    }
}
