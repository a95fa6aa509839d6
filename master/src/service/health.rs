//! The replica-health worker's pass and the health requests, as methods of [`Core`]:
//! the decisions are in [`crate::health`], the state changes in the state machine.
//! Commands reach chunkservers through their heartbeat replies
//! ([`Core::heartbeat`](super::Core::heartbeat)).

use super::Core;
use crate::error::Result;
use crate::health::{Action, Pruned};
use crate::lease::wall_ms;
use crate::state::CorruptReport;
use stampfs_proto::{ClusterReport, ClusterReportRequest, Fsck, FsckReport, ReportCorrupt};

impl Core {
    /// One pass of the replica-health worker. Nothing happens until the chunkservers
    /// had `dead_after` to register after a master start (before that, every chunk
    /// looks under-replicated).
    pub async fn health_pass(&self) {
        if self.check_running().is_err() {
            return;
        }
        let now = self.clock.now_ms();
        let (pruned, actions) = {
            let mut st = self.state();
            if now < st.settings.dead_after_ms {
                return;
            }
            st.health_pass(now, wall_ms(), &mut rand::thread_rng())
        };
        log_pruned(&pruned);
        for a in &actions {
            match a {
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
                } => {
                    tracing::info!(chunk = %handle, %version, source = %source, target = %target.id, live, replication, "re-replication ordered")
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

    #[tracing::instrument(skip_all, fields(chunk = %req.handle, chunkserver = %req.chunkserver))]
    pub async fn report_corrupt(&self, req: ReportCorrupt) -> Result<()> {
        let outcome = self.state().report_corrupt(req.handle, req.chunkserver);
        match outcome {
            CorruptReport::Excluded { version } => {
                tracing::warn!(%version, "replica reported corrupt: excluded; it will be replaced, then deleted")
            }
            CorruptReport::AlreadyMarked => tracing::debug!("replica already known corrupt"),
            CorruptReport::Gone => {
                tracing::info!("replica reported corrupt is already gone from its chunkserver")
            }
            CorruptReport::UnknownChunk => tracing::debug!("corrupt replica of an unknown chunk"),
        }
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(path = ?req.path))]
    pub async fn fsck(&self, req: Fsck) -> Result<FsckReport> {
        self.read(|st, now| st.fsck(req.path.as_deref(), now)).await
    }

    #[tracing::instrument(skip_all)]
    pub async fn cluster_report(&self, _req: ClusterReportRequest) -> Result<ClusterReport> {
        self.read(|st, now| Ok(st.cluster_report(now))).await
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
