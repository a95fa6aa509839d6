//! Changing the group's membership (`stampfs admin masters add|remove`), on the
//! leader: openraft's two steps for an addition (the new member is sent the group's
//! state as a learner, then made a voter) and one for a removal.

use super::group::Group;
use super::{MasterNode, NodeId};
use crate::error::{Error, Result};
use std::collections::BTreeSet;

fn refused(e: impl std::fmt::Display) -> Error {
    Error::bad_request(format!("the membership change was refused: {e}"))
}

impl Group {
    fn voters(&self) -> BTreeSet<NodeId> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// Adds member `id` at `addr` (a master started with `--join` on a new
    /// directory): it catches up as a learner (from the leader's snapshot), then
    /// becomes a voter. Returns once the new membership is committed.
    pub async fn add_member(&self, id: NodeId, addr: String) -> Result<()> {
        if id == 0 || addr.trim().is_empty() {
            return Err(Error::bad_request(
                "a member needs an id above 0 and an address",
            ));
        }
        let mut voters = self.voters();
        if voters.contains(&id) {
            return Err(Error::bad_request(format!(
                "member {id} is a voter already"
            )));
        }
        tracing::info!(member = id, %addr, "adding a member to the master group: catching it up as a learner");
        self.raft
            .add_learner(id, MasterNode { addr }, true)
            .await
            .map_err(|e| match e.forward_to_leader::<MasterNode>() {
                Some(f) => Error::NotLeader {
                    leader: f.leader_node.as_ref().map(|n| n.addr.clone()),
                },
                None => refused(e),
            })?;
        voters.insert(id);
        self.change_voters(voters).await?;
        tracing::info!(member = id, "member added to the master group");
        Ok(())
    }

    /// Removes member `id`; the group must keep a voter.
    pub async fn remove_member(&self, id: NodeId) -> Result<()> {
        let mut voters = self.voters();
        if !voters.remove(&id) {
            return Err(Error::NotFound {
                path: format!("master group member {id}"),
            });
        }
        if voters.is_empty() {
            return Err(Error::bad_request(
                "the last member of a group cannot be removed",
            ));
        }
        self.change_voters(voters).await?;
        tracing::info!(member = id, "member removed from the master group");
        Ok(())
    }

    async fn change_voters(&self, voters: BTreeSet<NodeId>) -> Result<()> {
        self.raft
            .change_membership(voters, false)
            .await
            .map(|_| ())
            .map_err(|e| match e.forward_to_leader::<MasterNode>() {
                Some(f) => Error::NotLeader {
                    leader: f.leader_node.as_ref().map(|n| n.addr.clone()),
                },
                None => refused(e),
            })
    }
}
