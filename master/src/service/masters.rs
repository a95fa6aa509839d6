//! The master group's membership, as methods of [`Core`] (superusers only; the
//! connection handler checks that before these run).

use super::Core;
use crate::error::{Error, Result};
use stampfs_proto::{AddMaster, RemoveMaster, TransferLeader};

impl Core {
    fn group_or_refuse(&self) -> Result<&crate::raft::group::Group> {
        self.log.group().ok_or_else(|| Error::NotSupported {
            reason: "this master keeps an operation log and is no member of a master group \
                     (start it with --log group, or form a group with --peers)"
                .into(),
        })
    }

    #[tracing::instrument(skip_all, fields(member = req.id, addr = %req.addr))]
    pub async fn add_master(&self, req: AddMaster) -> Result<()> {
        self.group_or_refuse()?.add_member(req.id, req.addr).await
    }

    #[tracing::instrument(skip_all, fields(member = req.id))]
    pub async fn remove_master(&self, req: RemoveMaster) -> Result<()> {
        self.group_or_refuse()?.remove_member(req.id).await
    }
}

impl Core {
    #[tracing::instrument(skip_all, fields(to = req.to))]
    pub async fn transfer_leader(&self, req: TransferLeader) -> Result<()> {
        self.group_or_refuse()?.transfer_leader(req.to).await
    }
}
