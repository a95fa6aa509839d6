//! The write path's requests, as methods of [`Core`]: append (a reopen), new chunks,
//! moves between chunks, dropped chunks, cuts, pipeline updates and close. Each waits
//! for a new leader's chunkservers where it needs them (`warmup.rs`), takes the
//! file's lock, makes its records durable before any bump goes out (invariant 1),
//! pushes the bumps, and grants.

use super::warmup::Needs;
use super::Core;
use crate::error::{Error, Result};
use crate::state::{AppendGate, BumpPlan};
use stampfs_proto::{
    AddChunk, Append, AppendReply, Close, DropChunks, FileStatus, InodeId, LeaseTerms, OpenChunk,
    RenewLease, UpdatePipeline, WriteGrant,
};
use std::sync::Arc;

impl Core {
    /// `append`. A file whose writer passed its soft limit gets lease recovery started
    /// and the caller `RecoveryInProgress` (it retries); within the limit the caller
    /// gets `LeaseConflict`. Both are decided before the file lock, so a running
    /// recovery does not hold the caller up.
    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client))]
    pub async fn append(self: &Arc<Self>, req: Append) -> Result<AppendReply> {
        let gate = {
            let now = self.clock.now_ms();
            let st = self.state();
            st.check_access(&req.path, req.caller.as_ref(), crate::perm::WRITE)?;
            st.append_gate(&req.path, now)?
        };
        if let AppendGate::Recover { inode, holder } = gate {
            let path = self
                .state()
                .ns
                .path_of(inode)
                .unwrap_or_else(|| req.path.clone());
            tracing::info!(path = %path, holder = %holder, client = %req.client, "append found the write lease past its soft limit; starting lease recovery");
            self.spawn_recovery(
                inode,
                crate::recovery::Trigger::Append {
                    client: req.client,
                    holder,
                },
            );
            return Err(Error::RecoveryInProgress { path });
        }
        self.await_chunkservers(&req.path, Needs::Replicas).await?;
        let (ino, _file) = self.lock_file(&req.path).await?;
        let plan = self
            .mutate_durable(|st, now, mt| st.append(&req, ino, now, mt))
            .await?;
        let Some(bump) = plan.bump else {
            return Ok(AppendReply {
                status: plan.status,
                last_chunk: None,
            });
        };
        stampfs_proto::crash_point!("reopen-before-bump");
        let (bump, pipeline) = self.push_bump_fenced(&bump, req.client).await?;
        stampfs_proto::crash_point!("reopen-after-bump");
        if pipeline.len() < bump.needed {
            return Err(self
                .bump_fell_short(ino, req.client, &bump, pipeline.len())
                .await);
        }
        let ids: Vec<_> = pipeline.iter().map(|a| a.id).collect();
        self.mutate_durable(|st, now, _| st.grant_made(&bump, req.client, &ids, now))
            .await?;
        Ok(AppendReply {
            status: plan.status,
            last_chunk: Some(self.grant(&bump, req.client, pipeline)),
        })
    }

    /// The bump of a reopen or a move to an existing chunk reached `acked` replicas,
    /// fewer than needed: its version is logged and may have reached some replicas,
    /// so the file cannot simply go on (or close) at it: readers would find no current
    /// replica and replica health leaves the chunk being written alone. The file goes to
    /// lease recovery ([`MasterState::abandon_reopen`]), which re-bumps whichever
    /// replicas are reachable (now or when they come back), from the version they
    /// held, and seals them. Returns the error for the writer.
    async fn bump_fell_short(
        &self,
        ino: InodeId,
        client: stampfs_proto::ClientId,
        bump: &BumpPlan,
        acked: usize,
    ) -> Error {
        let queued = self
            .mutate_durable(|st, now, _| st.abandon_reopen(ino, client, now))
            .await;
        match queued {
            Ok(true) => tracing::warn!(
                path = %bump.path,
                chunk = %bump.handle,
                version = %bump.version,
                acked,
                needed = bump.needed,
                "the version bump reached too few replicas; the file goes to lease recovery"
            ),
            Ok(false) => {}
            Err(e) => return e,
        }
        Error::NotEnoughReplicas {
            live: acked as u32,
            needed: bump.needed as u32,
        }
    }

    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client))]
    pub async fn add_chunk(&self, req: AddChunk) -> Result<WriteGrant> {
        self.await_chunkservers(&req.path, Needs::Placement).await?;
        let (ino, _file) = self.lock_file(&req.path).await?;
        // The new handle and version are durable before any bump goes out (invariant 1).
        let plan = self
            .mutate_durable(|st, now, mt| st.add_chunk(&req, ino, now, mt))
            .await?;
        let finalize = async {
            if let Some(f) = &plan.finalize {
                self.finalize(f).await;
            }
        };
        stampfs_proto::crash_point!("new-chunk-before-bump");
        let ((), fenced) = tokio::join!(finalize, self.push_bump_fenced(&plan.bump, req.client));
        let (bump, pipeline) = fenced?;
        stampfs_proto::crash_point!("new-chunk-after-bump");
        if pipeline.len() < plan.bump.needed {
            let handle = plan.bump.handle;
            self.mutate_durable(|st, now, _| st.abandon_chunk(ino, handle, now))
                .await?;
            return Err(Error::NotEnoughReplicas {
                live: pipeline.len() as u32,
                needed: plan.bump.needed as u32,
            });
        }
        let ids: Vec<_> = pipeline.iter().map(|a| a.id).collect();
        self.mutate_durable(|st, now, _| st.grant_made(&bump, req.client, &ids, now))
            .await?;
        Ok(self.grant(&bump, req.client, pipeline))
    }

    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client, chunk = %req.handle))]
    pub async fn update_pipeline(&self, req: UpdatePipeline) -> Result<WriteGrant> {
        self.await_chunkservers(&req.path, Needs::Survivors(&req.survivors))
            .await?;
        let (ino, _file) = self.lock_file(&req.path).await?;
        let plan = self
            .mutate_durable(|st, now, _| st.update_pipeline(&req, ino, now))
            .await?;
        stampfs_proto::crash_point!("pipeline-before-bump");
        let (plan, pipeline) = self.push_bump_fenced(&plan, req.client).await?;
        stampfs_proto::crash_point!("pipeline-after-bump");
        if pipeline.len() < plan.needed {
            // The version stays minted but is not granted: lease recovery still starts
            // from the version the writer holds (its replicas hold its bytes).
            return Err(Error::NotEnoughReplicas {
                live: pipeline.len() as u32,
                needed: plan.needed as u32,
            });
        }
        let ids: Vec<_> = pipeline.iter().map(|a| a.id).collect();
        self.mutate_durable(|st, now, _| st.grant_made(&plan, req.client, &ids, now))
            .await?;
        Ok(self.grant(&plan, req.client, pipeline))
    }

    /// `OpenChunk`: like a new chunk's grant, for an existing chunk of the file. The
    /// new version is durable before any bump goes out; the chunk left is finalized
    /// meanwhile. A bump that reaches too few replicas leaves the version minted and
    /// ungranted, and the file goes to lease recovery, which starts from the version
    /// the chunk's replicas held.
    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client, index = req.index))]
    pub async fn open_chunk(&self, req: OpenChunk) -> Result<WriteGrant> {
        self.await_chunkservers(&req.path, Needs::Replicas).await?;
        let (ino, _file) = self.lock_file(&req.path).await?;
        let plan = self
            .mutate_durable(|st, now, mt| st.open_chunk(&req, ino, now, mt))
            .await?;
        let finalize = async {
            if let Some(f) = &plan.finalize {
                self.finalize(f).await;
            }
        };
        stampfs_proto::crash_point!("open-chunk-before-bump");
        let ((), fenced) = tokio::join!(finalize, self.push_bump_fenced(&plan.bump, req.client));
        let (bump, pipeline) = fenced?;
        if pipeline.len() < bump.needed {
            return Err(self
                .bump_fell_short(ino, req.client, &bump, pipeline.len())
                .await);
        }
        let ids: Vec<_> = pipeline.iter().map(|a| a.id).collect();
        self.mutate_durable(|st, now, _| st.grant_made(&bump, req.client, &ids, now))
            .await?;
        Ok(self.grant(&bump, req.client, pipeline))
    }

    /// `DropChunks`: durable before the answer; the deletions of the dropped chunks'
    /// replicas go out with the record, the finalize of a kept chunk the writer left
    /// before the answer.
    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client, keep = req.keep))]
    pub async fn drop_chunks(&self, req: DropChunks) -> Result<()> {
        let (ino, _file) = self.lock_file(&req.path).await?;
        let finalize = self
            .mutate_durable(|st, now, mt| st.drop_chunks(&req, ino, now, mt))
            .await?;
        if let Some(f) = &finalize {
            self.finalize(f).await;
        }
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client, chunk = %req.handle, length = req.length))]
    pub async fn cut_last_chunk(&self, req: stampfs_proto::CutLastChunk) -> Result<()> {
        let (ino, _file) = self.lock_file(&req.path).await?;
        self.mutate_durable(|st, now, mt| st.cut_last_chunk(&req, ino, now, mt))
            .await
    }

    #[tracing::instrument(skip_all, fields(path = %req.path, client = %req.client))]
    pub async fn close(&self, req: Close) -> Result<FileStatus> {
        let (ino, _file) = self.lock_file(&req.path).await?;
        let plan = self
            .mutate_durable(|st, now, mt| st.close(&req, ino, now, mt))
            .await?;
        if let Some(f) = &plan.finalize {
            self.finalize(f).await;
        }
        Ok(plan.status)
    }

    #[tracing::instrument(skip_all, fields(client = %req.client))]
    pub async fn renew_lease(&self, req: RenewLease) -> Result<LeaseTerms> {
        let now = self.clock.now_ms();
        let mut st = self.state();
        let renewed = st.renew(req.client, now);
        let limits = st.settings.limits;
        Ok(LeaseTerms {
            renewed: u32::try_from(renewed).unwrap_or(u32::MAX),
            soft_limit_ms: limits.soft_ms,
            hard_limit_ms: limits.hard_ms,
        })
    }
}
