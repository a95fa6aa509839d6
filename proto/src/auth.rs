//! Mutual authentication with the master: of a chunkserver with the cluster key, of a
//! client with its user's key.
//!
//! A chunkserver's connection to the master starts with a challenge-response in both
//! directions, before it may register, heartbeat or report:
//!
//! ```text
//! chunkserver → master   ServerHello { nonce: C }            (32 random bytes)
//! master → chunkserver   ServerChallenge { nonce: M }        (32 random bytes)
//! chunkserver → master   ServerProve { proof: MAC(K, "server", C, M) }
//! master → chunkserver   ServerProveReply { proof: MAC(K, "master", C, M) }
//!                        or Unauthenticated (the master logs the peer's address)
//! ```
//!
//! Each side proves it holds the cluster key `K` over a challenge the other side chose
//! fresh for this connection, so a proof recorded on one connection is worthless on
//! the next; the two proofs are in MAC domains of their own (and apart from tokens'
//! and commands'), so neither side's proof can be reflected as the other's. The
//! chunkserver proves first, so that a wrong key is refused by the master, which logs
//! the address, and the chunkserver learns why and exits; a master that cannot prove
//! the key back is not one to take commands from or report to, and the chunkserver
//! exits too.
//!
//! A client proves a user's key the same way, on every connection, before any other
//! request ([`authenticate_client`]):
//!
//! ```text
//! client → master   ClientHello { user, nonce: C }
//! master → client   ClientChallenge { nonce: M }         (also for an unknown user)
//! client → master   ClientProve { proof: MAC(Ku, "client", user, C, M) }
//! master → client   ClientProveReply { proof: MAC(Ku, "master", user, C, M), identity }
//!                   or Unauthenticated (the same for an unknown user and a wrong key)
//! ```
//!
//! The user's name is under both MACs, so a proof for one user is no proof for
//! another who happens to share a key.
//!
//! Out of scope here: the connection is authenticated at its start, not protected
//! afterwards (an attacker who can rewrite traffic in flight can take it over once
//! authenticated); transport encryption (TLS) is what protects a channel. The pure
//! proof functions are below; [`authenticate_chunkserver`] runs the chunkserver's
//! side over an [`RpcClient`].

use crate::credentials::Credentials;
use crate::error::{Error, RemoteError};
use crate::msg::{ClientHello, ClientProve, ServerHello, ServerProve, UserInfo};
use crate::rpc::RpcClient;
use crate::token::ClusterKey;
use tokio::io::{AsyncRead, AsyncWrite};

const SERVER_PROOF_DOMAIN: &[u8] = b"stampfs/auth/chunkserver/v1";
const MASTER_PROOF_DOMAIN: &[u8] = b"stampfs/auth/master/v1";
const CLIENT_PROOF_DOMAIN: &[u8] = b"stampfs/auth/client/v1";
const MASTER_TO_CLIENT_DOMAIN: &[u8] = b"stampfs/auth/master-to-client/v2";

/// A fresh random challenge.
pub fn nonce() -> [u8; 32] {
    rand::random()
}

/// The chunkserver's proof over its challenge `server` and the master's `master`.
pub fn server_proof(key: &ClusterKey, server: &[u8; 32], master: &[u8; 32]) -> [u8; 32] {
    key.sign_parts(SERVER_PROOF_DOMAIN, &[server, master])
}

/// Whether `proof` is the chunkserver's proof over the two challenges.
pub fn verify_server_proof(
    key: &ClusterKey,
    server: &[u8; 32],
    master: &[u8; 32],
    proof: &[u8; 32],
) -> bool {
    key.verify_parts(SERVER_PROOF_DOMAIN, &[server, master], proof)
}

/// The master's proof over the same two challenges.
pub fn master_proof(key: &ClusterKey, server: &[u8; 32], master: &[u8; 32]) -> [u8; 32] {
    key.sign_parts(MASTER_PROOF_DOMAIN, &[server, master])
}

/// Whether `proof` is the master's proof over the two challenges.
pub fn verify_master_proof(
    key: &ClusterKey,
    server: &[u8; 32],
    master: &[u8; 32],
    proof: &[u8; 32],
) -> bool {
    key.verify_parts(MASTER_PROOF_DOMAIN, &[server, master], proof)
}

/// A client's proof of `user`'s key over its challenge `client` and the master's.
pub fn client_proof(
    key: &ClusterKey,
    user: &str,
    client: &[u8; 32],
    master: &[u8; 32],
) -> [u8; 32] {
    key.sign_parts(CLIENT_PROOF_DOMAIN, &[user.as_bytes(), client, master])
}

/// Whether `proof` is the client's proof for `user` over the two challenges.
pub fn verify_client_proof(
    key: &ClusterKey,
    user: &str,
    client: &[u8; 32],
    master: &[u8; 32],
    proof: &[u8; 32],
) -> bool {
    let parts: [&[u8]; 3] = [user.as_bytes(), client, master];
    key.verify_parts(CLIENT_PROOF_DOMAIN, &parts, proof)
}

/// The master's proof back to a client, with the same user key, over the two
/// challenges and the identity it tells the client (`identity`), so that nobody on
/// the way can alter the identity either.
pub fn master_to_client_proof(
    key: &ClusterKey,
    user: &str,
    client: &[u8; 32],
    master: &[u8; 32],
    identity: &UserInfo,
) -> [u8; 32] {
    let told = identity_bytes(identity);
    key.sign_parts(
        MASTER_TO_CLIENT_DOMAIN,
        &[user.as_bytes(), client, master, &told],
    )
}

/// Whether `proof` is the master's proof to a client of `user` telling it `identity`.
pub fn verify_master_to_client_proof(
    key: &ClusterKey,
    user: &str,
    client: &[u8; 32],
    master: &[u8; 32],
    identity: &UserInfo,
    proof: &[u8; 32],
) -> bool {
    let told = identity_bytes(identity);
    let parts: [&[u8]; 4] = [user.as_bytes(), client, master, &told];
    key.verify_parts(MASTER_TO_CLIENT_DOMAIN, &parts, proof)
}

/// `identity` as the master's proof covers it: every field, each length-prefixed or
/// of fixed width, so that no two identities give the same bytes.
fn identity_bytes(identity: &UserInfo) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + identity.name.len() + 4 * identity.groups.len());
    out.extend_from_slice(&(identity.name.len() as u64).to_be_bytes());
    out.extend_from_slice(identity.name.as_bytes());
    out.extend_from_slice(&identity.uid.to_be_bytes());
    out.extend_from_slice(&identity.gid.to_be_bytes());
    out.extend_from_slice(&(identity.groups.len() as u64).to_be_bytes());
    for g in &identity.groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
    out.push(u8::from(identity.superuser));
    out
}

/// Why [`authenticate_chunkserver`] failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthFailure {
    /// The master refused this chunkserver's proof: the keys differ. Retrying cannot
    /// help.
    #[error("the master refused this chunkserver's cluster key ({reason})")]
    Refused { reason: String },
    /// The master's proof is wrong: it does not hold this chunkserver's cluster key.
    /// Retrying cannot help.
    #[error("the master did not prove that it holds this chunkserver's cluster key")]
    MasterUnproven,
    /// The conversation failed (connection, timeout, a master that does not know the
    /// handshake): worth retrying.
    #[error("{0}")]
    Transport(Error),
}

impl AuthFailure {
    /// A key mismatch (as opposed to a failure worth retrying).
    pub fn is_key_mismatch(&self) -> bool {
        matches!(
            self,
            AuthFailure::Refused { .. } | AuthFailure::MasterUnproven
        )
    }
}

/// The chunkserver's side of the handshake on a new connection to the master.
pub async fn authenticate_chunkserver<R, W>(
    client: &mut RpcClient<R, W>,
    key: &ClusterKey,
) -> std::result::Result<(), AuthFailure>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mine = nonce();
    let challenge = client
        .call(ServerHello { nonce: mine })
        .await
        .map_err(AuthFailure::Transport)?;
    let reply = match client
        .call(ServerProve {
            proof: server_proof(key, &mine, &challenge.nonce),
        })
        .await
    {
        Ok(r) => r,
        Err(Error::Remote(RemoteError::Unauthenticated { reason })) => {
            return Err(AuthFailure::Refused { reason })
        }
        Err(e) => return Err(AuthFailure::Transport(e)),
    };
    if verify_master_proof(key, &mine, &challenge.nonce, &reply.proof) {
        Ok(())
    } else {
        Err(AuthFailure::MasterUnproven)
    }
}

/// The client's side of the handshake on a new connection to the master: who the
/// master says this connection is, once both sides proved `creds`' key. A refusal
/// ([`AuthFailure::Refused`]) names the user; retrying cannot help.
pub async fn authenticate_client<R, W>(
    client: &mut RpcClient<R, W>,
    creds: &Credentials,
) -> std::result::Result<UserInfo, AuthFailure>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mine = nonce();
    let challenge = client
        .call(ClientHello {
            user: creds.user.clone(),
            nonce: mine,
        })
        .await
        .map_err(AuthFailure::Transport)?;
    let reply = match client
        .call(ClientProve {
            proof: client_proof(creds.key(), &creds.user, &mine, &challenge.nonce),
        })
        .await
    {
        Ok(r) => r,
        Err(Error::Remote(RemoteError::Unauthenticated { reason })) => {
            return Err(AuthFailure::Refused { reason })
        }
        Err(e) => return Err(AuthFailure::Transport(e)),
    };
    if verify_master_to_client_proof(
        creds.key(),
        &creds.user,
        &mine,
        &challenge.nonce,
        &reply.identity,
        &reply.proof,
    ) {
        Ok(reply.identity)
    } else {
        Err(AuthFailure::MasterUnproven)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_hold_only_for_their_key_challenges_and_side() {
        let k = ClusterKey::from_bytes([1; 32]);
        let other = ClusterKey::from_bytes([2; 32]);
        let (c, m) = ([3; 32], [4; 32]);
        let p = server_proof(&k, &c, &m);
        assert!(verify_server_proof(&k, &c, &m, &p));
        assert!(!verify_server_proof(&other, &c, &m, &p), "another key");
        assert!(!verify_server_proof(&k, &m, &c, &p), "challenges swapped");
        assert!(
            !verify_server_proof(&k, &c, &[5; 32], &p),
            "another challenge"
        );
        // Neither side's proof passes as the other's (no reflection).
        assert!(!verify_master_proof(&k, &c, &m, &p));
        let q = master_proof(&k, &c, &m);
        assert!(verify_master_proof(&k, &c, &m, &q));
        assert!(!verify_server_proof(&k, &c, &m, &q));
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn client_proofs_bind_the_user_and_never_pass_for_the_master_or_a_chunkserver() {
        let k = ClusterKey::from_bytes([1; 32]);
        let (c, m) = ([3; 32], [4; 32]);
        let p = client_proof(&k, "alice", &c, &m);
        assert!(verify_client_proof(&k, "alice", &c, &m, &p));
        assert!(!verify_client_proof(&k, "bob", &c, &m, &p), "another user");
        assert!(!verify_client_proof(&k, "alice", &m, &c, &p), "swapped");
        let alice = UserInfo {
            name: "alice".into(),
            uid: 1000,
            gid: 100,
            groups: vec![200],
            superuser: false,
        };
        assert!(!verify_master_to_client_proof(
            &k, "alice", &c, &m, &alice, &p
        ));
        assert!(!verify_server_proof(&k, &c, &m, &p));
        let q = master_to_client_proof(&k, "alice", &c, &m, &alice);
        assert!(verify_master_to_client_proof(
            &k, "alice", &c, &m, &alice, &q
        ));
        // The identity is under the proof: none of its fields can be changed.
        for told in [
            UserInfo {
                superuser: true,
                ..alice.clone()
            },
            UserInfo {
                uid: 0,
                ..alice.clone()
            },
            UserInfo {
                groups: vec![200, 0],
                ..alice.clone()
            },
            UserInfo {
                gid: 0,
                ..alice.clone()
            },
        ] {
            assert!(
                !verify_master_to_client_proof(&k, "alice", &c, &m, &told, &q),
                "{told:?}"
            );
        }
        assert!(!verify_client_proof(&k, "alice", &c, &m, &q));
        assert!(!verify_master_proof(&k, &c, &m, &q));
    }
}
