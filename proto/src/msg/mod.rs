//! Every message stampfs processes exchange.
//!
//! Three conversations:
//! - **client → master** and **chunkserver → master**: [`MasterRequest`], one variant
//!   per request struct; each struct names its reply through [`crate::rpc::Rpc`].
//! - **client / peer / master → chunkserver**: [`ChunkRequest`]. A [`WriteSetup`] turns
//!   its connection into a pipeline stream of [`Packet`]s answered by [`Ack`]s.
//! - **master → master**: [`RaftCall`], the master group's Raft RPCs.
//! - **master → chunkserver commands**: [`ChunkCommand`], always inside a
//!   [`Signed`] envelope, sent directly when the master must wait
//!   for the result (version bumps) or in a [`HeartbeatReply`] otherwise. A
//!   [`VerifyReplica`] (signed the same way) asks a chunkserver to check a replica
//!   someone reported corrupt, and answers with a [`Verification`].
//!
//! Bulk bytes (packet payloads, read results) never appear here: they travel as the
//! frame's raw data section.

mod admin;
mod chunk;
mod chunkserver;
mod client;
mod health;
mod peer;
mod quota;
mod shared;
mod trash;
mod users;

pub use admin::*;
pub use chunk::*;
pub use chunkserver::*;
pub use client::*;
pub use health::*;
pub use peer::*;
pub use quota::*;
pub use shared::*;
pub use trash::*;
pub use users::*;

use crate::ids::ClientId;
use crate::token::Signed;
use bincode::{Decode, Encode};

/// Every request the master serves.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum MasterRequest {
    Mkdir(Mkdir),
    Create(Create),
    Append(Append),
    AddChunk(AddChunk),
    UpdatePipeline(UpdatePipeline),
    Close(Close),
    RenewLease(RenewLease),
    GetLocations(GetLocations),
    List(List),
    Stat(Stat),
    Rename(Rename),
    Delete(Delete),
    RecoverLease(RecoverLease),
    ReportCorrupt(ReportCorrupt),
    Register(Register),
    Heartbeat(Heartbeat),
    ChunkReport(ChunkReport),
    Fsck(Fsck),
    ClusterReport(ClusterReportRequest),
    /// After every older variant, so that each keeps its wire index.
    ReportPart(ReportPart),
    /// After every older variant, so that each keeps its wire index.
    MakeFile(MakeFile),
    /// After every older variant, so that each keeps its wire index.
    CutLastChunk(CutLastChunk),
    /// After every older variant, so that each keeps its wire index.
    OpenChunk(OpenChunk),
    /// After every older variant, so that each keeps its wire index.
    DropChunks(DropChunks),
    /// After every older variant, so that each keeps its wire index.
    Symlink(Symlink),
    /// After every older variant, so that each keeps its wire index.
    ReadLink(ReadLink),
    /// After every older variant, so that each keeps its wire index.
    SetAttr(SetAttr),
    /// After every older variant, so that each keeps its wire index.
    GetXattr(GetXattr),
    /// After every older variant, so that each keeps its wire index.
    ListXattr(ListXattr),
    /// After every older variant, so that each keeps its wire index.
    SetXattr(SetXattr),
    /// After every older variant, so that each keeps its wire index.
    ServerHello(ServerHello),
    /// After every older variant, so that each keeps its wire index.
    ServerProve(ServerProve),
    /// After every older variant, so that each keeps its wire index.
    ClientHello(ClientHello),
    /// After every older variant, so that each keeps its wire index.
    ClientProve(ClientProve),
    /// After every older variant, so that each keeps its wire index.
    AddUser(AddUser),
    /// After every older variant, so that each keeps its wire index.
    ListUsers(ListUsers),
    /// After every older variant, so that each keeps its wire index.
    RemoveUser(RemoveUser),
    /// After every older variant, so that each keeps its wire index.
    Raft(RaftCall),
    /// After every older variant, so that each keeps its wire index.
    AddMaster(AddMaster),
    /// After every older variant, so that each keeps its wire index.
    RemoveMaster(RemoveMaster),
    /// After every older variant, so that each keeps its wire index.
    TransferLeader(TransferLeader),
    /// After every older variant, so that each keeps its wire index.
    Once(OnceCall),
    /// After every older variant, so that each keeps its wire index.
    SetReplication(SetReplication),
    /// After every older variant, so that each keeps its wire index.
    Decommission(Decommission),
    /// After every older variant, so that each keeps its wire index.
    SafeMode(SafeModeRequest),
    /// After every older variant, so that each keeps its wire index.
    DeleteNow(DeleteNow),
    /// After every older variant, so that each keeps its wire index.
    RestoreTrash(RestoreTrash),
    /// After every older variant, so that each keeps its wire index.
    Balance(BalanceRequest),
    /// After every older variant, so that each keeps its wire index.
    SetQuota(SetQuota),
    /// After every older variant, so that each keeps its wire index.
    GetQuota(GetQuota),
    /// After every older variant, so that each keeps its wire index.
    ListQuotas(ListQuotas),
}

/// A client's namespace request under a call id of its own, so that the master of a
/// group answers a repeat of it (its first answer lost in a failover) with what it
/// made the first time, instead of making it twice (`AlreadyExists` for a mkdir that
/// was made). The master keeps the answers of the requests it caches
/// ([`crate::rpc::Rpc::CACHED`]) for a while, keyed by `(client, call)`; the client id
/// is bound to the connection's user like any other.
///
/// Decoded by hand: a call inside a call is refused while decoding, before it could
/// nest deeper (a frame of nested calls would otherwise recurse once per level).
#[derive(Clone, Debug, PartialEq, Eq, Encode)]
pub struct OnceCall {
    pub client: ClientId,
    /// Unique among the calls of `client` (a counter).
    pub call: u64,
    pub request: Box<MasterRequest>,
}

std::thread_local! {
    /// Set while a [`OnceCall`]'s request decodes on this thread.
    static DECODING_ONCE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl<C> bincode::Decode<C> for OnceCall {
    fn decode<D: bincode::de::Decoder<Context = C>>(
        d: &mut D,
    ) -> Result<Self, bincode::error::DecodeError> {
        /// Clears the flag when the decode ends, however it ends.
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                DECODING_ONCE.with(|c| c.set(false));
            }
        }
        if DECODING_ONCE.with(|c| c.replace(true)) {
            return Err(bincode::error::DecodeError::Other(
                "a call inside a call (a Once request wraps one request, never another)",
            ));
        }
        let _reset = Reset;
        Ok(OnceCall {
            client: ClientId::decode(d)?,
            call: u64::decode(d)?,
            request: Box::new(MasterRequest::decode(d)?),
        })
    }
}

bincode::impl_borrow_decode!(OnceCall);

/// Who may send a [`MasterRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestClass {
    /// A step of a handshake: any connection.
    Handshake,
    /// A chunkserver's message: a connection that proved the cluster key.
    Chunkserver,
    /// A client's request: a connection that proved a user's key.
    Client,
    /// Administration: a connection that proved a superuser's key.
    Admin,
    /// A report a reader or a chunkserver sends: either kind of proven connection.
    ClientOrChunkserver,
    /// Another member of the master group: a connection that proved the cluster key.
    Peer,
}

impl MasterRequest {
    /// The request's name, for metrics and logs (`add_chunk`, `once`, ...).
    pub fn name(&self) -> &'static str {
        use MasterRequest as R;
        match self {
            R::Mkdir(_) => "mkdir",
            R::Create(_) => "create",
            R::Append(_) => "append",
            R::AddChunk(_) => "add_chunk",
            R::UpdatePipeline(_) => "update_pipeline",
            R::Close(_) => "close",
            R::RenewLease(_) => "renew_lease",
            R::GetLocations(_) => "get_locations",
            R::List(_) => "list",
            R::Stat(_) => "stat",
            R::Rename(_) => "rename",
            R::Delete(_) => "delete",
            R::RecoverLease(_) => "recover_lease",
            R::ReportCorrupt(_) => "report_corrupt",
            R::Register(_) => "register",
            R::Heartbeat(_) => "heartbeat",
            R::ChunkReport(_) => "chunk_report",
            R::Fsck(_) => "fsck",
            R::ClusterReport(_) => "cluster_report",
            R::ReportPart(_) => "report_part",
            R::MakeFile(_) => "make_file",
            R::CutLastChunk(_) => "cut_last_chunk",
            R::OpenChunk(_) => "open_chunk",
            R::DropChunks(_) => "drop_chunks",
            R::Symlink(_) => "symlink",
            R::ReadLink(_) => "read_link",
            R::SetAttr(_) => "set_attr",
            R::GetXattr(_) => "get_xattr",
            R::ListXattr(_) => "list_xattr",
            R::SetXattr(_) => "set_xattr",
            R::ServerHello(_) => "server_hello",
            R::ServerProve(_) => "server_prove",
            R::ClientHello(_) => "client_hello",
            R::ClientProve(_) => "client_prove",
            R::AddUser(_) => "add_user",
            R::ListUsers(_) => "list_users",
            R::RemoveUser(_) => "remove_user",
            R::Raft(_) => "raft",
            R::AddMaster(_) => "add_master",
            R::RemoveMaster(_) => "remove_master",
            R::TransferLeader(_) => "transfer_leader",
            R::Once(_) => "once",
            R::SetReplication(_) => "set_replication",
            R::Decommission(_) => "decommission",
            R::SafeMode(_) => "safe_mode",
            R::DeleteNow(_) => "delete_now",
            R::RestoreTrash(_) => "restore_trash",
            R::Balance(_) => "balance",
            R::SetQuota(_) => "set_quota",
            R::GetQuota(_) => "get_quota",
            R::ListQuotas(_) => "list_quotas",
        }
    }

    /// Who may send it.
    pub fn class(&self) -> RequestClass {
        use MasterRequest as R;
        match self {
            R::ServerHello(_) | R::ServerProve(_) | R::ClientHello(_) | R::ClientProve(_) => {
                RequestClass::Handshake
            }
            R::Register(_) | R::Heartbeat(_) | R::ChunkReport(_) | R::ReportPart(_) => {
                RequestClass::Chunkserver
            }
            R::ReportCorrupt(_) => RequestClass::ClientOrChunkserver,
            R::Raft(_) => RequestClass::Peer,
            R::Fsck(_)
            | R::ClusterReport(_)
            | R::AddUser(_)
            | R::ListUsers(_)
            | R::RemoveUser(_)
            | R::AddMaster(_)
            | R::RemoveMaster(_)
            | R::TransferLeader(_)
            | R::Decommission(_)
            | R::SafeMode(_)
            | R::Balance(_)
            | R::SetQuota(_)
            | R::ListQuotas(_) => RequestClass::Admin,
            R::Mkdir(_)
            | R::Create(_)
            | R::Append(_)
            | R::AddChunk(_)
            | R::UpdatePipeline(_)
            | R::Close(_)
            | R::RenewLease(_)
            | R::GetLocations(_)
            | R::List(_)
            | R::Stat(_)
            | R::Rename(_)
            | R::Delete(_)
            | R::RecoverLease(_)
            | R::MakeFile(_)
            | R::CutLastChunk(_)
            | R::OpenChunk(_)
            | R::DropChunks(_)
            | R::Symlink(_)
            | R::ReadLink(_)
            | R::SetAttr(_)
            | R::GetXattr(_)
            | R::ListXattr(_)
            | R::SetXattr(_)
            | R::SetReplication(_)
            | R::DeleteNow(_)
            | R::RestoreTrash(_)
            | R::GetQuota(_) => RequestClass::Client,
            // The master refuses to wrap anything but a client's request.
            R::Once(o) => match o.request.class() {
                RequestClass::Client => RequestClass::Client,
                _ => RequestClass::Admin,
            },
        }
    }

    /// The identity a namespace request says it acts as, for the master to check
    /// against (and fill in from) the connection's user.
    pub fn caller_mut(&mut self) -> Option<&mut Option<Caller>> {
        use MasterRequest as R;
        Some(match self {
            R::Mkdir(r) => &mut r.caller,
            R::Create(r) => &mut r.caller,
            R::Append(r) => &mut r.caller,
            R::GetLocations(r) => &mut r.caller,
            R::List(r) => &mut r.caller,
            R::Stat(r) => &mut r.caller,
            R::Rename(r) => &mut r.caller,
            R::Delete(r) => &mut r.caller,
            R::RecoverLease(r) => &mut r.caller,
            R::MakeFile(r) => &mut r.caller,
            R::Symlink(r) => &mut r.caller,
            R::ReadLink(r) => &mut r.caller,
            R::SetAttr(r) => &mut r.caller,
            R::GetXattr(r) => &mut r.caller,
            R::ListXattr(r) => &mut r.caller,
            R::SetXattr(r) => &mut r.caller,
            R::SetReplication(r) => &mut r.caller,
            R::DeleteNow(r) => &mut r.caller,
            R::RestoreTrash(r) => &mut r.caller,
            R::GetQuota(r) => &mut r.caller,
            R::Once(o) => return o.request.caller_mut(),
            _ => return None,
        })
    }

    /// The client id a request speaks for (the holder of write leases and tokens).
    pub fn client_id(&self) -> Option<ClientId> {
        use MasterRequest as R;
        Some(match self {
            R::Create(r) => r.client,
            R::Append(r) => r.client,
            R::AddChunk(r) => r.client,
            R::UpdatePipeline(r) => r.client,
            R::Close(r) => r.client,
            R::RenewLease(r) => r.client,
            R::GetLocations(r) => r.client,
            R::RecoverLease(r) => r.client,
            R::MakeFile(r) => r.client,
            R::CutLastChunk(r) => r.client,
            R::OpenChunk(r) => r.client,
            R::DropChunks(r) => r.client,
            R::Once(o) => o.client,
            _ => return None,
        })
    }
}

/// Every request a chunkserver serves.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum ChunkRequest {
    WriteSetup(WriteSetup),
    Read(Read),
    ReplicaInfo(ReplicaInfo),
    ReceiveReplica(ReceiveReplica),
    Command(Signed<ChunkCommand>),
    Verify(Signed<VerifyReplica>),
    /// After every older variant, so that each keeps its wire index.
    OverwriteSetup(OverwriteSetup),
    /// After every older variant, so that each keeps its wire index.
    Digest(Signed<DigestReplica>),
}

impl ChunkRequest {
    /// The request's name, for metrics and logs (`write_setup`, `read`, ...).
    pub fn name(&self) -> &'static str {
        use ChunkRequest as R;
        match self {
            R::WriteSetup(_) => "write_setup",
            R::Read(_) => "read",
            R::ReplicaInfo(_) => "replica_info",
            R::ReceiveReplica(_) => "receive_replica",
            R::Command(_) => "command",
            R::Verify(_) => "verify",
            R::OverwriteSetup(_) => "overwrite_setup",
            R::Digest(_) => "digest",
        }
    }

    /// Whether it turns its connection into a stream (a write pipeline, a replica
    /// copy) rather than getting one answer.
    pub fn is_stream(&self) -> bool {
        matches!(
            self,
            ChunkRequest::WriteSetup(_)
                | ChunkRequest::OverwriteSetup(_)
                | ChunkRequest::ReceiveReplica(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_value, encode_value};

    fn mkdir() -> MasterRequest {
        MasterRequest::Mkdir(Mkdir {
            path: "/a".into(),
            parents: false,
            attr: None,
            caller: None,
        })
    }

    #[test]
    fn a_once_call_round_trips_and_speaks_for_its_client() {
        let once = MasterRequest::Once(OnceCall {
            client: ClientId(7),
            call: 3,
            request: Box::new(mkdir()),
        });
        let bytes = encode_value(&once).expect("encode");
        assert_eq!(decode_value::<MasterRequest>(&bytes).expect("decode"), once);
        assert_eq!(once.class(), RequestClass::Client);
        assert_eq!(once.client_id(), Some(ClientId(7)));
    }

    #[test]
    fn a_call_inside_a_call_is_refused_while_decoding() {
        // 100 000 levels of calls, as bytes (each level is the same prefix): the
        // second level is refused at once, with no recursion per level.
        let one = encode_value(&MasterRequest::Once(OnceCall {
            client: ClientId(1),
            call: 0,
            request: Box::new(mkdir()),
        }))
        .expect("encode");
        let inner = encode_value(&mkdir()).expect("encode");
        let prefix = &one[..one.len() - inner.len()];
        let mut deep = Vec::new();
        for _ in 0..100_000 {
            deep.extend_from_slice(prefix);
        }
        deep.extend_from_slice(&inner);
        let e = decode_value::<MasterRequest>(&deep).unwrap_err();
        assert!(e.to_string().contains("a call inside a call"), "{e}");
        // The guard is reset: a single call decodes on this thread afterwards.
        assert!(decode_value::<MasterRequest>(&one).is_ok());
    }
}
