//! Who a connection to the master has proven to be (see [`stampfs_proto::auth`]).
//!
//! Pure per-connection state, driven by the connection handler: a chunkserver's
//! connection must complete the challenge-response with the cluster key before it may
//! register, heartbeat or report. A wrong proof is refused (`Unauthenticated`) and the
//! handler closes the connection, so a chunkserver with another cluster's key is never
//! registered, listed or given chunks.

use crate::error::{Error, Result};
use stampfs_proto::auth;
use stampfs_proto::{ClusterKey, MasterRequest, ServerChallenge, ServerProveReply};

/// What a connection has proven.
#[derive(Debug, Default)]
pub struct ConnAuth {
    /// The challenges of a handshake under way (the chunkserver's, then ours).
    pending: Option<([u8; 32], [u8; 32])>,
    /// It proved the cluster key: it may speak as a chunkserver.
    chunkserver: bool,
}

impl ConnAuth {
    /// Whether the connection may send `req`: chunkserver messages need a proven
    /// chunkserver; the rest is for anyone (clients are not authenticated yet).
    pub fn admits(&self, req: &MasterRequest) -> Result<()> {
        let chunkserver_only = matches!(
            req,
            MasterRequest::Register(_)
                | MasterRequest::Heartbeat(_)
                | MasterRequest::ChunkReport(_)
                | MasterRequest::ReportPart(_)
        );
        if chunkserver_only && !self.chunkserver {
            return Err(Error::Unauthenticated {
                reason: "a chunkserver must prove the cluster key on this connection before it registers, heartbeats or reports".into(),
            });
        }
        Ok(())
    }

    /// A chunkserver's hello: our challenge (`ours`, fresh) back. Starts the handshake
    /// over (a connection proven before stays proven only until it fails a new one).
    pub fn hello(&mut self, theirs: [u8; 32], ours: [u8; 32]) -> ServerChallenge {
        self.pending = Some((theirs, ours));
        ServerChallenge { nonce: ours }
    }

    /// The chunkserver's proof: ours back when it holds `key`, `Unauthenticated`
    /// otherwise (no handshake under way, or a wrong proof). Either way the challenges
    /// are spent.
    pub fn prove(&mut self, key: &ClusterKey, proof: &[u8; 32]) -> Result<ServerProveReply> {
        let Some((theirs, ours)) = self.pending.take() else {
            self.chunkserver = false;
            return Err(Error::Unauthenticated {
                reason: "a proof without a challenge (send ServerHello first)".into(),
            });
        };
        if !auth::verify_server_proof(key, &theirs, &ours, proof) {
            self.chunkserver = false;
            return Err(Error::Unauthenticated {
                reason: "the proof does not match the master's cluster key (is --cluster-key-file the master's DIR/cluster.key?)".into(),
            });
        }
        self.chunkserver = true;
        Ok(ServerProveReply {
            proof: auth::master_proof(key, &theirs, &ours),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{ChunkserverId, Heartbeat, Stat};

    fn heartbeat() -> MasterRequest {
        MasterRequest::Heartbeat(Heartbeat {
            id: ChunkserverId(1),
            capacity: 0,
            used: 0,
            replica_count: 0,
            active_streams: 0,
        })
    }

    fn stat() -> MasterRequest {
        MasterRequest::Stat(Stat {
            path: "/".into(),
            caller: None,
        })
    }

    #[test]
    fn a_chunkserver_is_admitted_only_after_a_good_proof_of_fresh_challenges() {
        let key = ClusterKey::from_bytes([9; 32]);
        let mut a = ConnAuth::default();
        assert!(a.admits(&heartbeat()).is_err(), "nothing proven yet");
        assert!(
            a.admits(&stat()).is_ok(),
            "clients are not authenticated yet"
        );
        // A proof before any challenge is refused.
        assert!(a.prove(&key, &[0; 32]).is_err());
        let (c, m) = ([1; 32], [2; 32]);
        assert_eq!(a.hello(c, m).nonce, m);
        let reply = a
            .prove(&key, &auth::server_proof(&key, &c, &m))
            .expect("a good proof");
        assert!(auth::verify_master_proof(&key, &c, &m, &reply.proof));
        assert!(a.admits(&heartbeat()).is_ok());
        // The challenges are spent: the same proof again is refused, and a failed
        // handshake takes the admission away.
        assert!(a.prove(&key, &auth::server_proof(&key, &c, &m)).is_err());
        assert!(a.admits(&heartbeat()).is_err());
    }

    #[test]
    fn a_proof_with_another_key_or_other_challenges_is_refused() {
        let key = ClusterKey::from_bytes([9; 32]);
        let wrong = ClusterKey::from_bytes([8; 32]);
        let mut a = ConnAuth::default();
        let (c, m) = ([1; 32], [2; 32]);
        a.hello(c, m);
        let err = a
            .prove(&key, &auth::server_proof(&wrong, &c, &m))
            .unwrap_err();
        assert!(matches!(err, Error::Unauthenticated { .. }), "{err}");
        // A proof recorded on another connection (other challenges) is worthless.
        a.hello(c, [3; 32]);
        assert!(a.prove(&key, &auth::server_proof(&key, &c, &m)).is_err());
        // Nor does the master's own proof pass as a chunkserver's (reflection).
        a.hello(c, m);
        assert!(a.prove(&key, &auth::master_proof(&key, &c, &m)).is_err());
        assert!(a.admits(&heartbeat()).is_err());
    }
}
