//! Administration of the data, as methods of [`Core`]: `stampfs setrep` and the
//! decommission of chunkservers (decisions in `state/admin.rs`; the health worker
//! does the copying and trimming).

use super::Core;
use crate::error::Result;
use stampfs_proto::{
    Decommission, DecommissionState, FileStatus, GetQuota, ListQuotas, QuotaReport, SetQuota,
    SetReplication,
};

impl Core {
    #[tracing::instrument(skip_all, fields(path = %req.path, replication = req.replication))]
    pub async fn set_replication(&self, req: SetReplication) -> Result<FileStatus> {
        let status = self
            .mutate_durable(|st, now, _| st.set_replication(&req, now))
            .await?;
        tracing::info!("replication factor set");
        Ok(status)
    }

    /// Starts or ends a decommission (superusers only: the connection handler checks).
    #[tracing::instrument(skip_all, fields(chunkserver = %req.server, on = req.on))]
    pub async fn decommission(&self, req: Decommission) -> Result<DecommissionState> {
        let state = self
            .mutate_durable(|st, now, _| st.decommission(req.server, req.on, now))
            .await?;
        if req.on {
            tracing::info!(
                state = state.word(),
                "chunkserver decommission started: its chunks are copied elsewhere"
            );
        } else {
            tracing::info!("chunkserver recommissioned: it takes new replicas again");
        }
        Ok(state)
    }

    /// Sets or clears a directory's quotas (superusers only: the connection handler
    /// checks).
    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn set_quota(&self, req: SetQuota) -> Result<QuotaReport> {
        let report = self
            .mutate_durable(|st, now, _| st.set_quota(&req, now))
            .await?;
        tracing::info!(names = ?report.names, bytes = ?report.bytes, "directory quota set");
        Ok(report)
    }

    #[tracing::instrument(skip_all, fields(path = %req.path))]
    pub async fn get_quota(&self, req: GetQuota) -> Result<QuotaReport> {
        self.read(|st, _| st.get_quota(&req)).await
    }

    #[tracing::instrument(skip_all)]
    pub async fn list_quotas(&self, _req: ListQuotas) -> Result<Vec<QuotaReport>> {
        self.read(|st, _| Ok(st.list_quotas())).await
    }
}
