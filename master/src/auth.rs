//! Who a connection to the master has proven to be (see [`stampfs_proto::auth`]).
//!
//! Pure per-connection state, driven by the connection handler. A chunkserver's
//! connection must complete the challenge-response with the cluster key before it may
//! register, heartbeat or report; a client's must prove a user's key before any other
//! request, and administration needs a superuser. A wrong proof is refused
//! (`Unauthenticated`) and the handler closes the connection, so a chunkserver with
//! another cluster's key is never registered, listed or given chunks, and a client
//! without a valid credential reaches nothing.
//!
//! Once proven, a client's requests act as its user ([`ConnAuth::act_as`]): the
//! caller a request names is checked against the user and replaced by the user's
//! identity as the master knows it (uid, gid, groups). Only a superuser may name
//! another caller (a mount serving other local users). [`ClientBindings`] keeps a
//! client id to the user that first used it, so that nobody else can renew, close or
//! write under that client's leases.

use crate::error::{Error, Result};
use stampfs_proto::auth;
use stampfs_proto::credentials::check_user_name;
use stampfs_proto::{
    Caller, ClientChallenge, ClientId, ClientProveReply, ClusterKey, MasterRequest, RequestClass,
    ServerChallenge, ServerProveReply, UserInfo,
};
use std::collections::HashMap;
use std::sync::Mutex;

/// A client's handshake under way: the user it claims and both challenges.
#[derive(Debug)]
struct ClientPending {
    user: String,
    theirs: [u8; 32],
    ours: [u8; 32],
}

/// What a connection has proven.
#[derive(Debug, Default)]
pub struct ConnAuth {
    /// The challenges of a handshake under way (the chunkserver's, then ours).
    pending: Option<([u8; 32], [u8; 32])>,
    /// It proved the cluster key: it may speak as a chunkserver.
    chunkserver: bool,
    /// A client's handshake under way.
    client_pending: Option<ClientPending>,
    /// The user it proved to be, and its key (to tell it from a later user of the
    /// same name).
    user: Option<UserInfo>,
    key: [u8; 32],
    /// The user table's epoch when the user was last checked against it.
    epoch: u64,
}

impl ConnAuth {
    /// Whether the connection may send `req`: chunkserver messages need a proven
    /// chunkserver, client requests a proven user, administration a superuser.
    pub fn admits(&self, req: &MasterRequest) -> Result<()> {
        match req.class() {
            RequestClass::Handshake => Ok(()),
            RequestClass::Chunkserver | RequestClass::Peer if self.chunkserver => Ok(()),
            RequestClass::ClientOrChunkserver if self.chunkserver || self.user.is_some() => {
                Ok(())
            }
            RequestClass::ClientOrChunkserver => Err(Error::Unauthenticated {
                reason: "a corruption report needs a proven chunkserver or user on this connection".into(),
            }),
            RequestClass::Peer => Err(Error::Unauthenticated {
                reason: "a member of the master group must prove the cluster key on this connection before its Raft messages".into(),
            }),
            RequestClass::Chunkserver => Err(Error::Unauthenticated {
                reason: "a chunkserver must prove the cluster key on this connection before it registers, heartbeats or reports".into(),
            }),
            RequestClass::Client | RequestClass::Admin => {
                let Some(user) = &self.user else {
                    return Err(Error::Unauthenticated {
                        reason: "no credentials presented on this connection: a client proves a user's key first (--credentials FILE, STAMPFS_CREDENTIALS, or ~/.config/stampfs/credentials; a master writes its superuser's to DIR/admin.credentials)".into(),
                    });
                };
                if req.class() == RequestClass::Admin && !user.superuser {
                    return Err(Error::PermissionDenied {
                        path: "administration".into(),
                        reason: format!("user {} is not a superuser", user.name),
                    });
                }
                Ok(())
            }
        }
    }

    /// The user this connection proved to be.
    pub fn user(&self) -> Option<&UserInfo> {
        self.user.as_ref()
    }

    /// The user table's epoch this connection's user was last checked at.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// After the user table changed (epoch `epoch`): the connection stays its user
    /// only if `lookup` still finds that user with the same key, uid, gid, groups and
    /// rank; otherwise it is nobody, and `Unauthenticated` (its handler closes it). A
    /// removed user's open connections end here, and a new user who takes a removed
    /// one's name or uid inherits none of them.
    pub fn revalidate(
        &mut self,
        epoch: u64,
        lookup: impl FnOnce(&str) -> Option<([u8; 32], UserInfo)>,
    ) -> Result<()> {
        let Some(user) = &self.user else {
            return Ok(());
        };
        match lookup(&user.name) {
            Some((key, info)) if key == self.key && &info == user => {
                self.epoch = epoch;
                Ok(())
            }
            _ => {
                let name = user.name.clone();
                self.user = None;
                Err(Error::Unauthenticated {
                    reason: format!("user {name} was removed or changed; connect again"),
                })
            }
        }
    }

    /// Makes a client request act as the connection's user: a caller it does not
    /// name becomes the user; one it names must be the user's uid (then it gets the
    /// user's gid and groups as the master knows them), unless the user is a
    /// superuser, who may name anyone: a uid `known` finds is then that user, with its
    /// gid and groups (a mount serving other local users), any other as named.
    pub fn act_as(
        &self,
        req: &mut MasterRequest,
        known: impl FnOnce(u32) -> Option<Caller>,
    ) -> Result<()> {
        let Some(user) = &self.user else {
            return Err(Error::Unauthenticated {
                reason: "no credentials presented on this connection".into(),
            });
        };
        let Some(slot) = req.caller_mut() else {
            return Ok(());
        };
        match slot {
            Some(c) if user.superuser => {
                if let Some(k) = known(c.uid) {
                    *c = k;
                }
            }
            Some(c) if c.uid != user.uid => {
                return Err(Error::PermissionDenied {
                    path: "caller".into(),
                    reason: format!(
                        "user {} (uid {}) may not act as uid {}; only a superuser may",
                        user.name, user.uid, c.uid
                    ),
                })
            }
            _ => *slot = Some(user.caller()),
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

    /// A client's hello: our challenge back, for a user that exists or not (the
    /// answer is the same). Starts over: the connection is nobody until it proves. A
    /// name no user can have (too long, bad characters) is refused at once rather
    /// than kept for the connection's lifetime.
    pub fn client_hello(
        &mut self,
        user: String,
        theirs: [u8; 32],
        ours: [u8; 32],
    ) -> Result<ClientChallenge> {
        self.user = None;
        self.client_pending = None;
        if let Err(e) = check_user_name(&user) {
            return Err(Error::Unauthenticated {
                reason: e.to_string(),
            });
        }
        self.client_pending = Some(ClientPending { user, theirs, ours });
        Ok(ClientChallenge { nonce: ours })
    }

    /// The client's proof: the master's proof and the user's identity when it holds
    /// the key `lookup` finds for its user, `Unauthenticated` otherwise (the same for
    /// an unknown user). Either way the challenges are spent.
    pub fn client_prove(
        &mut self,
        epoch: u64,
        lookup: impl FnOnce(&str) -> Option<([u8; 32], UserInfo)>,
        proof: &[u8; 32],
    ) -> Result<ClientProveReply> {
        let Some(p) = self.client_pending.take() else {
            return Err(Error::Unauthenticated {
                reason: "a proof without a challenge (send ClientHello first)".into(),
            });
        };
        let refused = || Error::Unauthenticated {
            reason: format!(
                "unknown user {:?} or wrong key (check the credentials file)",
                p.user
            ),
        };
        // An unknown user's proof is checked against a key nobody has, so that the
        // refusal takes as long as a wrong key's.
        let found = lookup(&p.user);
        let raw = found.as_ref().map_or_else(rand::random, |(k, _)| *k);
        let key = ClusterKey::from_bytes(raw);
        let valid = auth::verify_client_proof(&key, &p.user, &p.theirs, &p.ours, proof);
        let Some((_, info)) = found.filter(|_| valid) else {
            return Err(refused());
        };
        let reply = ClientProveReply {
            proof: auth::master_to_client_proof(&key, &p.user, &p.theirs, &p.ours, &info),
            identity: info.clone(),
        };
        self.user = Some(info);
        self.key = raw;
        self.epoch = epoch;
        Ok(reply)
    }
}

/// Which user each client id belongs to: the first user to send a request with it.
/// Bounded: once [`MAX_BINDINGS`] are held, those unused for [`BINDING_IDLE_MS`] (the
/// client's leases expired long ago) are forgotten, at most once a minute, and a new
/// id finding no room is refused (`Unavailable`) rather than growing the table.
#[derive(Debug, Default)]
pub struct ClientBindings {
    inner: Mutex<Bindings>,
}

#[derive(Debug, Default)]
struct Bindings {
    by_client: HashMap<ClientId, (String, u64)>,
    /// No pruning before this time (ms): a full table is scanned at most once a minute.
    next_prune_ms: u64,
}

/// How long an unused binding is kept once the table is full.
pub const BINDING_IDLE_MS: u64 = 6 * 3600 * 1000;
/// The most bindings held (about 100 B each).
pub const MAX_BINDINGS: usize = 1 << 18;

impl ClientBindings {
    /// Binds `client` to `user` at its first use; refuses it to anyone else after.
    /// [`ClientId::MASTER`] is the master's own and nobody's.
    pub fn bind(&self, client: ClientId, user: &str, now_ms: u64) -> Result<()> {
        self.bind_within(client, user, now_ms, MAX_BINDINGS)
    }

    /// Binds the clients of `owners` to their users, as if each had just been used
    /// (a restarted master, from the owners its log and checkpoint hold).
    pub fn seed(&self, owners: impl IntoIterator<Item = (ClientId, String)>, now_ms: u64) {
        let mut b = crate::oplog::lock(&self.inner);
        for (client, user) in owners {
            if client != ClientId::MASTER {
                b.by_client.insert(client, (user, now_ms));
            }
        }
    }

    fn bind_within(&self, client: ClientId, user: &str, now_ms: u64, max: usize) -> Result<()> {
        if client == ClientId::MASTER {
            return Err(Error::Unauthenticated {
                reason: format!("client id {client} is reserved to the master"),
            });
        }
        let mut b = crate::oplog::lock(&self.inner);
        if b.by_client.len() >= max && !b.by_client.contains_key(&client) {
            if now_ms >= b.next_prune_ms {
                b.by_client
                    .retain(|_, (_, seen)| now_ms.saturating_sub(*seen) < BINDING_IDLE_MS);
                b.next_prune_ms = now_ms + 60_000;
            }
            if b.by_client.len() >= max {
                return Err(Error::from(stampfs_proto::RemoteError::Unavailable {
                    reason: format!("{max} client ids are in use; try again later"),
                }));
            }
        }
        let (owner, seen) = b
            .by_client
            .entry(client)
            .or_insert_with(|| (user.to_string(), now_ms));
        if owner != user {
            return Err(Error::Unauthenticated {
                reason: format!("client id {client} belongs to another user"),
            });
        }
        *seen = now_ms;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{ChunkserverId, Fsck, Heartbeat, Stat};

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
        assert!(a.admits(&stat()).is_err(), "no user proven either");
        // A proof before any challenge is refused.
        assert!(a.prove(&key, &[0; 32]).is_err());
        let (c, m) = ([1; 32], [2; 32]);
        assert_eq!(a.hello(c, m).nonce, m);
        let reply = a
            .prove(&key, &auth::server_proof(&key, &c, &m))
            .expect("a good proof");
        assert!(auth::verify_master_proof(&key, &c, &m, &reply.proof));
        assert!(a.admits(&heartbeat()).is_ok());
        // A chunkserver reports its corrupt replicas; a user may not speak for it.
        let corrupt = MasterRequest::ReportCorrupt(stampfs_proto::ReportCorrupt {
            handle: stampfs_proto::ChunkHandle(1),
            chunkserver: ChunkserverId(1),
        });
        assert!(a.admits(&corrupt).is_ok());
        assert!(ConnAuth::default().admits(&corrupt).is_err());
        assert!(a.admits(&stat()).is_err(), "a chunkserver is no user");
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

    fn alice() -> UserInfo {
        UserInfo {
            name: "alice".into(),
            uid: 1000,
            gid: 100,
            groups: vec![100, 200],
            superuser: false,
        }
    }

    fn lookup_alice(name: &str) -> Option<([u8; 32], UserInfo)> {
        (name == "alice").then(|| ([5; 32], alice()))
    }

    fn stat_as(caller: Option<Caller>) -> MasterRequest {
        MasterRequest::Stat(Stat {
            path: "/".into(),
            caller,
        })
    }

    fn caller_of(req: &mut MasterRequest) -> Option<Caller> {
        req.caller_mut().and_then(|c| c.clone())
    }

    #[test]
    fn a_client_is_admitted_only_after_proving_its_users_key() {
        let key = ClusterKey::from_bytes([5; 32]);
        let mut a = ConnAuth::default();
        let err = a.admits(&stat()).unwrap_err();
        assert!(matches!(err, Error::Unauthenticated { .. }), "{err}");
        assert!(
            a.client_prove(1, lookup_alice, &[0; 32]).is_err(),
            "no challenge"
        );
        let (c, m) = ([1; 32], [2; 32]);
        assert_eq!(
            a.client_hello("alice".into(), c, m).expect("hello").nonce,
            m
        );
        let reply = a
            .client_prove(1, lookup_alice, &auth::client_proof(&key, "alice", &c, &m))
            .expect("a good proof");
        assert!(auth::verify_master_to_client_proof(
            &key,
            "alice",
            &c,
            &m,
            &alice(),
            &reply.proof
        ));
        assert_eq!(reply.identity, alice());
        assert!(a.admits(&stat()).is_ok());
        assert!(a.admits(&heartbeat()).is_err(), "a user is no chunkserver");
        let admin = a
            .admits(&MasterRequest::Fsck(Fsck { path: None }))
            .unwrap_err();
        assert!(matches!(admin, Error::PermissionDenied { .. }), "{admin}");
        // Spent challenges; a new hello makes the connection nobody until it proves.
        assert!(a
            .client_prove(1, lookup_alice, &auth::client_proof(&key, "alice", &c, &m))
            .is_err());
        a.client_hello("alice".into(), c, [3; 32]).expect("hello");
        assert!(a.admits(&stat()).is_err());
    }

    #[test]
    fn wrong_keys_unknown_users_replays_and_reflections_are_refused_alike() {
        let key = ClusterKey::from_bytes([5; 32]);
        let wrong = ClusterKey::from_bytes([6; 32]);
        let (c, m) = ([1; 32], [2; 32]);
        let cases: Vec<(&str, [u8; 32], [u8; 32])> = vec![
            ("alice", auth::client_proof(&wrong, "alice", &c, &m), m),
            ("mallory", auth::client_proof(&key, "mallory", &c, &m), m),
            // Recorded on another connection (another challenge of ours).
            ("alice", auth::client_proof(&key, "alice", &c, &m), [9; 32]),
            // The master's own proof sent back.
            (
                "alice",
                auth::master_to_client_proof(&key, "alice", &c, &m, &alice()),
                m,
            ),
        ];
        for (user, proof, ours) in cases {
            let mut a = ConnAuth::default();
            a.client_hello(user.into(), c, ours).expect("a challenge");
            let err = a.client_prove(1, lookup_alice, &proof).unwrap_err();
            assert!(
                matches!(err, Error::Unauthenticated { .. }),
                "{user}: {err}"
            );
            assert!(a.user().is_none());
        }
    }

    #[test]
    fn a_name_no_user_can_have_is_refused_at_the_hello() {
        for name in ["bad name!", "", &"u".repeat(1 << 20)] {
            let mut a = ConnAuth::default();
            let err = a.client_hello(name.into(), [1; 32], [2; 32]).unwrap_err();
            assert!(matches!(err, Error::Unauthenticated { .. }), "{err}");
            assert!(a.client_pending.is_none(), "nothing kept");
        }
    }

    #[test]
    fn requests_act_as_the_user_and_only_a_superuser_names_another_caller() {
        let key = ClusterKey::from_bytes([5; 32]);
        let (c, m) = ([1; 32], [2; 32]);
        let mut a = ConnAuth::default();
        assert!(
            a.act_as(&mut stat_as(None), |_| None).is_err(),
            "nobody yet"
        );
        a.client_hello("alice".into(), c, m).expect("hello");
        a.client_prove(1, lookup_alice, &auth::client_proof(&key, "alice", &c, &m))
            .expect("proof");
        let me = Some(alice().caller());
        let mut r = stat_as(None);
        a.act_as(&mut r, |_| None).expect("none");
        assert_eq!(caller_of(&mut r), me);
        // Her own uid with other groups: the master's groups count.
        let mut r = stat_as(Some(Caller {
            uid: 1000,
            gid: 0,
            groups: vec![0],
        }));
        a.act_as(&mut r, |_| None).expect("own uid");
        assert_eq!(caller_of(&mut r), me);
        let root = Some(Caller {
            uid: 0,
            gid: 0,
            groups: vec![],
        });
        let err = a.act_as(&mut stat_as(root.clone()), |_| None).unwrap_err();
        assert!(matches!(err, Error::PermissionDenied { .. }), "{err}");

        let mut admin = ConnAuth::default();
        let boss = UserInfo {
            name: "admin".into(),
            uid: 0,
            gid: 0,
            groups: vec![],
            superuser: true,
        };
        admin.client_hello("admin".into(), c, m).expect("hello");
        admin
            .client_prove(
                1,
                |_| Some(([5; 32], boss.clone())),
                &auth::client_proof(&key, "admin", &c, &m),
            )
            .expect("proof");
        let bob = Some(Caller {
            uid: 1001,
            gid: 1001,
            groups: vec![],
        });
        let mut r = stat_as(bob.clone());
        admin
            .act_as(&mut r, |_| None)
            .expect("a superuser names anyone");
        assert_eq!(caller_of(&mut r), bob);
        // A uid the master knows is that user, with the groups it has there.
        let mut r = stat_as(Some(Caller {
            uid: 1000,
            gid: 1,
            groups: vec![1],
        }));
        admin
            .act_as(&mut r, |uid| (uid == 1000).then(|| alice().caller()))
            .expect("a known uid");
        assert_eq!(caller_of(&mut r), Some(alice().caller()));
        assert!(admin
            .admits(&MasterRequest::Fsck(Fsck { path: None }))
            .is_ok());
    }

    #[test]
    fn a_client_id_belongs_to_the_first_user_that_used_it() {
        let b = ClientBindings::default();
        b.bind(ClientId(7), "alice", 0).expect("first use");
        b.bind(ClientId(7), "alice", 1).expect("again");
        let err = b.bind(ClientId(7), "bob", 2).unwrap_err();
        assert!(matches!(err, Error::Unauthenticated { .. }), "{err}");
        b.bind(ClientId(8), "bob", 2).expect("another id");
        assert!(
            b.bind(ClientId::MASTER, "bob", 2).is_err(),
            "the master's id"
        );
    }

    #[test]
    fn a_full_binding_table_forgets_idle_ids_and_refuses_the_rest() {
        let b = ClientBindings::default();
        b.bind_within(ClientId(1), "a", 10, 2).expect("1");
        b.bind_within(ClientId(2), "a", 20, 2).expect("2");
        let full = b.bind_within(ClientId(3), "a", 30, 2).unwrap_err();
        assert!(
            matches!(full.code(), stampfs_proto::ErrorCode::Unavailable),
            "{full}"
        );
        // Known ids go on working.
        b.bind_within(ClientId(2), "a", 40, 2).expect("known");
        // Once id 1 has been idle long enough (and a minute after the last scan), it
        // is forgotten and a new id fits.
        b.bind_within(ClientId(3), "a", BINDING_IDLE_MS + 20, 2)
            .expect("room after pruning");
    }

    #[test]
    fn a_removed_or_changed_user_loses_its_connections() {
        let key = ClusterKey::from_bytes([5; 32]);
        let (c, m) = ([1; 32], [2; 32]);
        let mut a = ConnAuth::default();
        a.client_hello("alice".into(), c, m).expect("hello");
        a.client_prove(3, lookup_alice, &auth::client_proof(&key, "alice", &c, &m))
            .expect("proof");
        assert_eq!(a.epoch(), 3);
        // The table changed but alice did not: still alice.
        a.revalidate(4, lookup_alice).expect("unchanged");
        assert_eq!(a.epoch(), 4);
        // Another key under her name (removed, then added again): nobody.
        let err = a.revalidate(5, |_| Some(([6; 32], alice()))).unwrap_err();
        assert!(matches!(err, Error::Unauthenticated { .. }), "{err}");
        assert!(a.user().is_none());
        assert!(a.admits(&stat()).is_err());
        // Removed outright.
        let mut a = ConnAuth::default();
        a.client_hello("alice".into(), c, m).expect("hello");
        a.client_prove(3, lookup_alice, &auth::client_proof(&key, "alice", &c, &m))
            .expect("proof");
        assert!(a.revalidate(4, |_| None).is_err());
    }
}
