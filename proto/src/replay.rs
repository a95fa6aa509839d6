//! What makes a signed master→chunkserver command single-use: the [`Issue`] every
//! [`Signed`](crate::Signed) command carries under its MAC, and the chunkserver's
//! [`ReplayWindow`] that admits each one at most once.
//!
//! A chunkserver draws a random 64-bit **registration session** each time it registers
//! with a master (start-up, a master restart, a lost connection) and sends it in the
//! authenticated `Register`. The master numbers the commands it signs for that
//! registration 0, 1, 2, ... and puts `(chunkserver, session, seq)` under the MAC. The
//! chunkserver admits a command only when it names this chunkserver and its current
//! session, and its `seq` was not admitted before and is not older than the newest by
//! [`WINDOW`] or more. So:
//!
//! - a command captured on the wire and sent again (or delivered twice) is refused;
//! - a command signed for another chunkserver is refused;
//! - a command signed before the chunkserver's last registration is refused: after a
//!   restart of either process nothing signed earlier is accepted, and the chunkserver
//!   needs no durable state for it (the session is new at every registration);
//! - commands signed in one order and delivered in another (concurrent connections,
//!   the heartbeat reply and direct calls) are admitted as long as they are within the
//!   window, like IPsec's anti-replay window (RFC 4303, 3.4.3).
//!
//! The master's sessions play the part of the master's epoch: a master process only
//! knows the sessions of the registrations it took itself.

use bincode::{Decode, Encode};

use crate::ids::ChunkserverId;

/// How far behind the newest admitted sequence number a command may still be admitted.
pub const WINDOW: u64 = 4096;
const WORDS: usize = (WINDOW / 64) as usize;

/// Who a signed command is for and where it stands in that chunkserver's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Encode, Decode)]
pub struct Issue {
    /// The chunkserver the master signed the command for.
    pub chunkserver: ChunkserverId,
    /// That chunkserver's registration session the master signed it under.
    pub session: u64,
    /// The command's number in that session, from 0.
    pub seq: u64,
    /// The epoch of the master that signed it.
    pub epoch: MasterEpoch,
}

/// A master's epoch: the leader id `(term, member)` under which the leader of a master
/// group signs, ordered by term, then member (as openraft orders leader ids: two
/// leaders may share a term, never an epoch). A master that keeps an operation log
/// signs under `(0, 0)`. A chunkserver keeps the highest epoch it has seen, durably,
/// and refuses a command signed under a lower one: a deposed leader is fenced like a
/// paused writer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct MasterEpoch {
    pub term: u64,
    pub leader: u64,
}

impl std::fmt::Display for MasterEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.term, self.leader)
    }
}

/// Why a command was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the command is for chunkserver {for_server}, this is {this}")]
    OtherChunkserver {
        for_server: ChunkserverId,
        this: ChunkserverId,
    },
    #[error("the command was signed for an earlier registration of this chunkserver (session {presented:016x}, current {current:016x})")]
    OtherSession { presented: u64, current: u64 },
    #[error("this chunkserver is not registered yet: no command can be for it")]
    NotRegistered,
    #[error("command {seq} was already applied (a replay)")]
    Seen { seq: u64 },
    #[error("command {seq} is older than the replay window (newest {newest})")]
    TooOld { seq: u64, newest: u64 },
}

/// The chunkserver's memory of the commands it admitted in its current session.
#[derive(Clone, Debug, Default)]
pub struct ReplayWindow {
    /// `(id, session)` of the current registration, once one began.
    current: Option<(Option<ChunkserverId>, u64)>,
    /// The newest sequence number admitted in the session.
    newest: Option<u64>,
    /// Bit `seq % WINDOW` set: `seq` (within the window below `newest`) was admitted.
    bits: Vec<u64>,
}

impl ReplayWindow {
    /// Starts registration `session` (forgetting every earlier one); `id` is this
    /// chunkserver's id if it has one yet.
    pub fn begin(&mut self, id: Option<ChunkserverId>, session: u64) {
        self.current = Some((id, session));
        self.newest = None;
        self.bits = vec![0; WORDS];
    }

    /// Records the id the master assigned at registration.
    pub fn set_id(&mut self, id: ChunkserverId) {
        if let Some((known, _)) = &mut self.current {
            *known = Some(id);
        }
    }

    /// Admits `issue` once: `Ok` the first time a command within the window comes,
    /// a [`Refusal`] for anything else. A refused command changes nothing.
    pub fn admit(&mut self, issue: &Issue) -> Result<(), Refusal> {
        let Some((id, session)) = self.current else {
            return Err(Refusal::NotRegistered);
        };
        if let Some(this) = id {
            if issue.chunkserver != this {
                return Err(Refusal::OtherChunkserver {
                    for_server: issue.chunkserver,
                    this,
                });
            }
        }
        if issue.session != session {
            return Err(Refusal::OtherSession {
                presented: issue.session,
                current: session,
            });
        }
        let seq = issue.seq;
        match self.newest {
            Some(newest) if seq <= newest => {
                if newest - seq >= WINDOW {
                    return Err(Refusal::TooOld { seq, newest });
                }
                if self.bit(seq) {
                    return Err(Refusal::Seen { seq });
                }
            }
            Some(newest) => {
                // Slide: the slots of newest+1 ..= seq now stand for new numbers.
                let advance = (seq - newest).min(WINDOW);
                for s in seq - advance + 1..=seq {
                    self.clear(s);
                }
                self.newest = Some(seq);
            }
            None => self.newest = Some(seq),
        }
        self.set(seq);
        Ok(())
    }

    fn slot(seq: u64) -> (usize, u64) {
        let i = seq % WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    fn bit(&self, seq: u64) -> bool {
        let (w, m) = Self::slot(seq);
        self.bits.get(w).is_some_and(|b| b & m != 0)
    }

    fn set(&mut self, seq: u64) {
        let (w, m) = Self::slot(seq);
        if let Some(b) = self.bits.get_mut(w) {
            *b |= m;
        }
    }

    fn clear(&mut self, seq: u64) {
        let (w, m) = Self::slot(seq);
        if let Some(b) = self.bits.get_mut(w) {
            *b &= !m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CS: ChunkserverId = ChunkserverId(4);

    fn issue(session: u64, seq: u64) -> Issue {
        Issue {
            epoch: MasterEpoch::default(),
            chunkserver: CS,
            session,
            seq,
        }
    }

    fn window() -> ReplayWindow {
        let mut w = ReplayWindow::default();
        w.begin(Some(CS), 77);
        w
    }

    #[test]
    fn each_command_is_admitted_once() {
        let mut w = window();
        assert_eq!(w.admit(&issue(77, 0)), Ok(()));
        assert_eq!(w.admit(&issue(77, 0)), Err(Refusal::Seen { seq: 0 }));
        assert_eq!(w.admit(&issue(77, 1)), Ok(()));
        assert_eq!(w.admit(&issue(77, 0)), Err(Refusal::Seen { seq: 0 }));
    }

    #[test]
    fn out_of_order_within_the_window_is_admitted() {
        let mut w = window();
        assert_eq!(w.admit(&issue(77, 10)), Ok(()));
        assert_eq!(w.admit(&issue(77, 3)), Ok(()));
        assert_eq!(w.admit(&issue(77, 11)), Ok(()));
        assert_eq!(w.admit(&issue(77, 3)), Err(Refusal::Seen { seq: 3 }));
        assert_eq!(w.admit(&issue(77, 5)), Ok(()));
    }

    #[test]
    fn a_command_older_than_the_window_is_refused() {
        let mut w = window();
        assert_eq!(w.admit(&issue(77, 1)), Ok(()));
        assert_eq!(w.admit(&issue(77, WINDOW + 5)), Ok(()));
        assert_eq!(
            w.admit(&issue(77, 2)),
            Err(Refusal::TooOld {
                seq: 2,
                newest: WINDOW + 5
            })
        );
        // The slot of 1 now stands for WINDOW + 1, never admitted.
        assert_eq!(w.admit(&issue(77, WINDOW + 1)), Ok(()));
    }

    #[test]
    fn another_session_or_chunkserver_is_refused_and_a_new_registration_forgets() {
        let mut w = window();
        assert_eq!(w.admit(&issue(77, 0)), Ok(()));
        assert!(matches!(
            w.admit(&issue(78, 1)),
            Err(Refusal::OtherSession { .. })
        ));
        let other = Issue {
            epoch: MasterEpoch::default(),
            chunkserver: ChunkserverId(5),
            ..issue(77, 2)
        };
        assert!(matches!(
            w.admit(&other),
            Err(Refusal::OtherChunkserver { .. })
        ));
        w.begin(Some(CS), 90);
        assert!(matches!(
            w.admit(&issue(77, 3)),
            Err(Refusal::OtherSession { .. })
        ));
        assert_eq!(w.admit(&issue(90, 0)), Ok(()));
        assert_eq!(
            ReplayWindow::default().admit(&issue(77, 0)),
            Err(Refusal::NotRegistered)
        );
    }

    #[test]
    fn a_first_registration_learns_its_id() {
        let mut w = ReplayWindow::default();
        w.begin(None, 5);
        // Before the master answered, the id is not known: the session decides.
        assert_eq!(w.admit(&issue(5, 0)), Ok(()));
        w.set_id(ChunkserverId(9));
        assert!(matches!(
            w.admit(&issue(5, 1)),
            Err(Refusal::OtherChunkserver { .. })
        ));
    }

    proptest! {
        /// Against a model that remembers every admitted number: a number is admitted
        /// at most once, and always when it is new and within the window.
        #[test]
        fn matches_a_model(seqs in proptest::collection::vec(0u64..3 * WINDOW, 1..400)) {
            let mut w = window();
            let mut admitted = std::collections::HashSet::new();
            let mut newest: Option<u64> = None;
            for seq in seqs {
                let got = w.admit(&issue(77, seq));
                let fresh = !admitted.contains(&seq);
                let in_window = newest.is_none_or(|n| seq > n || n - seq < WINDOW);
                prop_assert_eq!(got.is_ok(), fresh && in_window, "seq {}", seq);
                if got.is_ok() {
                    admitted.insert(seq);
                    newest = Some(newest.map_or(seq, |n| n.max(seq)));
                }
            }
        }
    }
}
