//! Client → master: who. The client handshake and user administration.

use super::shared::Caller;
use bincode::{Decode, Encode};
use serde::Serialize;

/// The first message of a client's connection to the master: the user it speaks for
/// and its challenge (see [`crate::auth`]). Until the handshake is done the connection
/// may send nothing else.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClientHello {
    pub user: String,
    pub nonce: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClientChallenge {
    pub nonce: [u8; 32],
}

/// The client's proof of its user's key over both challenges; the reply is the
/// master's proof and who the connection now is ([`ClientProveReply`]), or
/// `Unauthenticated`.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClientProve {
    pub proof: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClientProveReply {
    pub proof: [u8; 32],
    pub identity: UserInfo,
}

/// A user as the master knows it (never its key). A superuser may do everything root
/// may, administer the cluster, and send requests as any [`Caller`] (a mount serving
/// other local users); anyone else's requests act as its own uid, gid and groups.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct UserInfo {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub superuser: bool,
}

impl UserInfo {
    /// The identity its requests act as.
    pub fn caller(&self) -> Caller {
        Caller {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

/// Creates a user (superusers only). The master draws its key and returns it once.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct AddUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub superuser: bool,
}

#[derive(Clone, PartialEq, Eq, Encode, Decode)]
pub struct AddUserReply {
    pub user: UserInfo,
    pub key: [u8; 32],
}

impl std::fmt::Debug for AddUserReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddUserReply")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Every user (superusers only).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ListUsers {}

/// Removes a user (superusers only): its connections stay open until they close, new
/// ones are refused. The last superuser cannot be removed.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RemoveUser {
    pub name: String,
}
