//! Changing the group's membership (`stampfs admin masters add|remove`), on the
//! leader: openraft's two steps for an addition (the new member is sent the group's
//! state as a learner, then made a voter) and one for a removal; and handing the lead
//! to another member (`transfer-leader`), which openraft 0.9 has no call for.

use super::group::Group;
use super::{MasterNode, NodeId};
use crate::error::{Error, Result};
use std::collections::BTreeSet;
use std::time::Duration;

fn refused(e: impl std::fmt::Display) -> Error {
    Error::bad_request(format!("the membership change was refused: {e}"))
}

impl Group {
    /// The voters of the latest membership.
    pub fn voters(&self) -> BTreeSet<NodeId> {
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

    /// Hands the lead to voter `to`: once it holds every entry, this leader stops
    /// submitting batches, sending heartbeats and campaigning; after an election
    /// timeout (when the followers' leader lease has run out) it tells `to` to
    /// campaign, and waits until `to` leads. Records queued meanwhile wait: they are
    /// committed if this member keeps the lead, and fail as not committed otherwise.
    pub async fn transfer_leader(&self, to: NodeId) -> Result<()> {
        let voters = self.voters();
        if !voters.contains(&to) {
            return Err(Error::NotFound {
                path: format!("master group voter {to}"),
            });
        }
        if to == self.id {
            return Ok(());
        }
        let addr = self
            .member_addrs()
            .into_iter()
            .find(|(id, _)| *id == to)
            .map(|(_, a)| a);
        let Some(addr) = addr else {
            return Err(Error::NotFound {
                path: format!("master group member {to}"),
            });
        };
        let timeout = Duration::from_millis(super::group::ELECTION_TIMEOUT_MAX_MS);
        self.proposer.pause(true);
        self.handing_over
            .store(true, std::sync::atomic::Ordering::Release);
        let outcome = async {
            // The target holds every entry.
            let last = self.raft.metrics().borrow().last_log_index;
            self.raft
                .wait(Some(timeout * 5))
                .metrics(
                    |m| {
                        m.replication
                            .as_ref()
                            .and_then(|r| r.get(&to).copied().flatten())
                            .map(|l| l.index)
                            >= last
                    },
                    "the target holds every entry",
                )
                .await
                .map_err(|e| refused(format!("member {to} did not catch up: {e}")))?;
            self.raft.runtime_config().heartbeat(false);
            self.raft.runtime_config().elect(false);
            tokio::time::sleep(timeout + Duration::from_millis(100)).await;
            self.network.elect_now(to, &addr).await?;
            self.raft
                .wait(Some(timeout * 3))
                .metrics(|m| m.current_leader == Some(to), "the target leads")
                .await
                .map_err(|e| refused(format!("member {to} did not take the lead: {e}")))
        }
        .await;
        self.raft.runtime_config().heartbeat(true);
        self.raft.runtime_config().elect(true);
        self.proposer.pause(false);
        self.handing_over
            .store(false, std::sync::atomic::Ordering::Release);
        outcome.map(|_| tracing::info!(to, "the lead was handed over"))
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
