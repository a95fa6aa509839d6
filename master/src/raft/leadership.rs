//! Who serves: the member that leads, once it holds everything committed before it.
//!
//! A member's **role** is the state machine's: `Following` applies the records of
//! committed entries to the master's state; `Leading(L)` serves requests, applies
//! their records speculatively when it queues them (as the operation log does) and
//! lets nothing derived from them leave before their entry commits.
//!
//! [`decide`] is the pure rule the leadership watcher follows, from openraft's
//! metrics:
//! - a member leading under `L` whose metrics show it is no longer the leader under
//!   `L` steps down (the state machine also steps down by itself when it is asked to
//!   apply an entry of another leader while it leads);
//! - a member openraft made leader under `L` takes the lead once it has applied an
//!   entry of `L` and every entry its log holds: then its state holds everything
//!   committed before `L` (openraft commits the entries of earlier leaders only
//!   together with one of `L`'s), and nothing that may not commit;
//! - a leader that has no entry of its own (openraft restarts a member whose vote
//!   was committed and its own as leader without appending one) proposes an empty
//!   batch, once, to get one.
//!
//! [`Leadership`] is what the master's requests see: whether this member serves
//! (changed only under the master's state lock, so a request that mutates the state
//! checks it under that lock), and the address of the leader to send clients to.

use super::{MasterNode, NodeId};
use openraft::{CommittedLeaderId, LogId, RaftMetrics, ServerState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// A member's role in the state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Applies committed entries' records to the master's state.
    Following,
    /// Serves, under this leader id: its own entries' records are in the state already.
    Leading(CommittedLeaderId<NodeId>),
}

/// What the watcher sees of openraft's metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// openraft has this member lead, under this leader id.
    pub leader_as: Option<CommittedLeaderId<NodeId>>,
    pub last_applied: Option<LogId<NodeId>>,
    /// The last entry in this member's log.
    pub last_log_index: Option<u64>,
}

impl Seen {
    pub fn from_metrics(id: NodeId, m: &RaftMetrics<NodeId, MasterNode>) -> Self {
        let leads = m.state == ServerState::Leader
            && m.vote.is_committed()
            && m.vote.leader_id().voted_for() == Some(id);
        Seen {
            leader_as: leads.then(|| *m.vote.leader_id()),
            last_applied: m.last_applied,
            last_log_index: m.last_log_index,
        }
    }
}

/// What the watcher does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    StepDown,
    TakeLead(CommittedLeaderId<NodeId>),
    /// Propose an empty batch under this leader id (it has no entry of its own yet).
    Nudge(CommittedLeaderId<NodeId>),
}

/// The rule (see the module doc).
pub fn decide(role: Role, seen: Seen) -> Step {
    match (role, seen.leader_as) {
        (Role::Leading(l), Some(now)) if l == now => Step::Nothing,
        (Role::Leading(_), _) => Step::StepDown,
        (Role::Following, None) => Step::Nothing,
        (Role::Following, Some(l)) => {
            let applied_all = seen.last_applied.map(|a| a.index) == seen.last_log_index;
            let own = seen.last_applied.is_some_and(|a| a.leader_id == l);
            match (own, applied_all) {
                (true, true) => Step::TakeLead(l),
                (false, true) => Step::Nudge(l),
                // Entries still to apply (committed ones arrive, or its own await
                // a quorum): wait for the metrics to move.
                _ => Step::Nothing,
            }
        }
    }
}

/// Whether this member serves, and where the leader is (shared by the group and the
/// master's requests).
#[derive(Debug, Default)]
pub struct Leadership {
    serving: AtomicBool,
    leader: Mutex<Option<String>>,
    /// The leader id this member leads (or last led) under: the epoch its commands
    /// carry.
    epoch: Mutex<stampfs_proto::MasterEpoch>,
    /// When (the master's clock, ms) this member last took the lead.
    led_since_ms: AtomicU64,
}

impl Leadership {
    /// Whether this member serves now. Read under the master's state lock by a
    /// request that mutates the state; set under it by the state machine.
    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Called with the master's state locked.
    pub(super) fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
    }

    /// The epoch this member signs commands under.
    pub fn epoch(&self) -> stampfs_proto::MasterEpoch {
        *self.epoch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When (the master's clock, ms) this member last took the lead.
    pub fn led_since_ms(&self) -> u64 {
        self.led_since_ms.load(Ordering::Acquire)
    }

    pub(super) fn set_led_since(&self, now_ms: u64) {
        self.led_since_ms.store(now_ms, Ordering::Release);
    }

    pub(super) fn set_epoch(&self, leader: CommittedLeaderId<NodeId>) {
        *self.epoch.lock().unwrap_or_else(|e| e.into_inner()) = stampfs_proto::MasterEpoch {
            term: leader.term,
            leader: leader.node_id,
        };
    }

    /// The leader's address, when known.
    pub fn leader(&self) -> Option<String> {
        self.leader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn set_leader(&self, addr: Option<String>) {
        *self.leader.lock().unwrap_or_else(|e| e.into_inner()) = addr;
    }

    /// `Ok` when this member serves, else the error that sends the caller to the
    /// leader.
    pub fn check(&self) -> crate::Result<()> {
        if self.serving() {
            Ok(())
        } else {
            Err(crate::Error::NotLeader {
                leader: self.leader(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lid(term: u64, node: u64) -> CommittedLeaderId<NodeId> {
        CommittedLeaderId::new(term, node)
    }

    fn log(term: u64, node: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(lid(term, node), index))
    }

    fn seen(
        leader_as: Option<CommittedLeaderId<NodeId>>,
        applied: Option<LogId<NodeId>>,
        last: u64,
    ) -> Seen {
        Seen {
            leader_as,
            last_applied: applied,
            last_log_index: Some(last),
        }
    }

    #[test]
    fn a_leader_keeps_leading_while_openraft_says_so() {
        let l = lid(3, 1);
        assert_eq!(
            decide(Role::Leading(l), seen(Some(l), log(3, 1, 9), 12)),
            Step::Nothing
        );
    }

    #[test]
    fn a_leader_steps_down_when_deposed_or_in_a_newer_term() {
        let l = lid(3, 1);
        assert_eq!(
            decide(Role::Leading(l), seen(None, log(3, 1, 9), 9)),
            Step::StepDown
        );
        // Re-elected in a later term: its state may hold records of the old term that
        // never committed, so it steps down and rebuilds before it leads again.
        assert_eq!(
            decide(Role::Leading(l), seen(Some(lid(4, 1)), log(3, 1, 9), 10)),
            Step::StepDown
        );
    }

    #[test]
    fn a_new_leader_takes_the_lead_only_once_it_applied_its_own_entry_and_all_before() {
        let l = lid(4, 2);
        // The blank entry of term 4 is not applied yet.
        assert_eq!(
            decide(Role::Following, seen(Some(l), log(3, 1, 9), 10)),
            Step::Nothing
        );
        // Applied, with more in the log (its own entries awaiting a quorum).
        assert_eq!(
            decide(Role::Following, seen(Some(l), log(4, 2, 10), 11)),
            Step::Nothing
        );
        assert_eq!(
            decide(Role::Following, seen(Some(l), log(4, 2, 10), 10)),
            Step::TakeLead(l)
        );
    }

    #[test]
    fn a_leader_without_an_entry_of_its_own_proposes_one() {
        let l = lid(4, 2);
        assert_eq!(
            decide(Role::Following, seen(Some(l), log(3, 1, 9), 9)),
            Step::Nudge(l)
        );
    }

    #[test]
    fn a_follower_stays_one() {
        assert_eq!(
            decide(Role::Following, seen(None, log(3, 1, 9), 9)),
            Step::Nothing
        );
    }
}
