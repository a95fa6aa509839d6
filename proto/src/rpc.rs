//! Request/reply over frames.
//!
//! A request frame's header is `(id: u64, request enum)`; its reply's header is
//! `(id: u64, Result<Response, RemoteError>)`. Each request struct implements [`Rpc`],
//! which names its response type and the enum it travels in, so a caller can not
//! decode a reply as the wrong type. [`RpcClient`] runs one request at a time on one
//! connection; callers that want concurrency use several connections.

use crate::codec::{decode_prefix, decode_value, Frame, FrameReader, FrameWriter};
use crate::error::{Error, RemoteError, Result};
use crate::ids::ClientId;
use crate::msg::*;
use crate::net::{ConnRead, ConnWrite, Dialer, IdleState};
use crate::token::Signed;
use bincode::{Decode, Encode};
use bytes::Bytes;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// A request type and the reply it gets.
pub trait Rpc: Sized {
    /// The enum the request travels in.
    type Request: Encode + Decode<()>;
    /// What a successful call returns.
    type Response: Encode + Decode<()>;
    /// Whether the request may be sent a second time after a first whose reply was
    /// lost (the connection ended before it), without a second effect and without an
    /// error for what the first did: reads, and writes that set a state again.
    const RESEND_SAFE: bool = false;
    /// Whether the request may be asked again after its answer was lost because the
    /// master failed over or its connection broke: the master recognizes a request it
    /// made already and makes it again without harm (a writer's `AddChunk`,
    /// `OpenChunk` and `UpdatePipeline`: DESIGN.md "A writer through a failover").
    /// Every [`Rpc::RESEND_SAFE`] request is.
    const ASK_AGAIN: bool = Self::RESEND_SAFE;
    /// Whether a master group keeps the answer of the request, sent as a [`Once`]
    /// call, for a repeat of it (namespace changes made in one step: `Mkdir`,
    /// `Create`, `MakeFile`, `Rename`, `Delete`, `Symlink`, `SetXattr`, `DeleteNow`,
    /// `RestoreTrash`).
    const CACHED: bool = false;
    /// Wraps the request in its enum.
    fn into_request(self) -> Self::Request;
}

macro_rules! rpc {
    (@resend resend) => { true };
    (@resend again) => { false };
    (@resend once) => { false };
    (@cached once) => { true };
    (@cached $other:ident) => { false };
    ($($enum:ident :: $variant:ident ( $req:ty ) -> $resp:ty $([$flag:ident])?;)*) => {$(
        impl Rpc for $req {
            type Request = $enum;
            type Response = $resp;
            $(
                const RESEND_SAFE: bool = rpc!(@resend $flag);
                const ASK_AGAIN: bool = !rpc!(@cached $flag);
                const CACHED: bool = rpc!(@cached $flag);
            )?
            fn into_request(self) -> $enum {
                $enum::$variant(self)
            }
        }
    )*};
}

// `[resend]`: the request is [`Rpc::RESEND_SAFE`]; `[again]`: it is [`Rpc::ASK_AGAIN`]
// only; `[once]`: it is [`Rpc::CACHED`] (asked again only as a [`Once`] call).
rpc! {
    MasterRequest::Mkdir(Mkdir) -> FileStatus [once];
    MasterRequest::Create(Create) -> FileStatus [once];
    MasterRequest::Append(Append) -> AppendReply;
    MasterRequest::AddChunk(AddChunk) -> WriteGrant [again];
    MasterRequest::UpdatePipeline(UpdatePipeline) -> WriteGrant [again];
    MasterRequest::Close(Close) -> FileStatus [resend];
    MasterRequest::RenewLease(RenewLease) -> LeaseTerms [resend];
    MasterRequest::GetLocations(GetLocations) -> FileLocations [resend];
    MasterRequest::List(List) -> Vec<FileStatus> [resend];
    MasterRequest::Stat(Stat) -> FileStatus [resend];
    MasterRequest::Rename(Rename) -> () [once];
    MasterRequest::Delete(Delete) -> () [once];
    MasterRequest::RecoverLease(RecoverLease) -> RecoveryOutcome;
    MasterRequest::ReportCorrupt(ReportCorrupt) -> ();
    MasterRequest::Register(Register) -> RegisterReply;
    MasterRequest::Heartbeat(Heartbeat) -> HeartbeatReply;
    MasterRequest::ChunkReport(ChunkReport) -> ();
    MasterRequest::Fsck(Fsck) -> FsckReport [resend];
    MasterRequest::ClusterReport(ClusterReportRequest) -> ClusterReport [resend];
    MasterRequest::ReportPart(ReportPart) -> ();
    MasterRequest::MakeFile(MakeFile) -> FileStatus [once];
    MasterRequest::CutLastChunk(CutLastChunk) -> () [resend];
    MasterRequest::OpenChunk(OpenChunk) -> WriteGrant [again];
    MasterRequest::DropChunks(DropChunks) -> ();
    MasterRequest::Symlink(Symlink) -> FileStatus [once];
    MasterRequest::ReadLink(ReadLink) -> String [resend];
    MasterRequest::SetAttr(SetAttr) -> FileStatus [resend];
    MasterRequest::GetXattr(GetXattr) -> Option<Vec<u8>> [resend];
    MasterRequest::ListXattr(ListXattr) -> Vec<String> [resend];
    MasterRequest::SetXattr(SetXattr) -> bool [once];
    MasterRequest::ServerHello(ServerHello) -> ServerChallenge;
    MasterRequest::ServerProve(ServerProve) -> ServerProveReply;
    MasterRequest::ClientHello(ClientHello) -> ClientChallenge;
    MasterRequest::ClientProve(ClientProve) -> ClientProveReply;
    MasterRequest::AddUser(AddUser) -> AddUserReply;
    MasterRequest::ListUsers(ListUsers) -> Vec<UserInfo> [resend];
    MasterRequest::RemoveUser(RemoveUser) -> ();
    MasterRequest::Raft(RaftCall) -> RaftReply;
    MasterRequest::AddMaster(AddMaster) -> ();
    MasterRequest::RemoveMaster(RemoveMaster) -> ();
    MasterRequest::TransferLeader(TransferLeader) -> ();
    MasterRequest::SetReplication(SetReplication) -> FileStatus [resend];
    MasterRequest::Decommission(Decommission) -> DecommissionState [resend];
    MasterRequest::SafeMode(SafeModeRequest) -> SafeModeStatus [resend];
    MasterRequest::DeleteNow(DeleteNow) -> () [once];
    MasterRequest::RestoreTrash(RestoreTrash) -> FileStatus [once];
    MasterRequest::Balance(BalanceRequest) -> BalanceStatus [resend];
    MasterRequest::SetQuota(SetQuota) -> QuotaReport [resend];
    MasterRequest::GetQuota(GetQuota) -> QuotaReport [resend];
    MasterRequest::ListQuotas(ListQuotas) -> Vec<QuotaReport> [resend];
    ChunkRequest::WriteSetup(WriteSetup) -> WriteSetupReply;
    ChunkRequest::Read(Read) -> ReadReply;
    ChunkRequest::ReplicaInfo(ReplicaInfo) -> ReplicaReport;
    ChunkRequest::ReceiveReplica(ReceiveReplica) -> WriteSetupReply;
    ChunkRequest::Command(Signed<ChunkCommand>) -> Option<ReplicaReport>;
    ChunkRequest::Verify(Signed<VerifyReplica>) -> Verification;
    ChunkRequest::OverwriteSetup(OverwriteSetup) -> WriteSetupReply;
    ChunkRequest::Digest(Signed<DigestReplica>) -> ReplicaDigest;
}

/// Builds a request frame.
pub fn request_frame<R: Rpc>(id: u64, req: R, data: Bytes) -> Result<Frame> {
    Frame::new(&(id, req.into_request()), data)
}

/// Splits a request frame into its id and request.
pub fn parse_request<Q: Decode<()>>(frame: &Frame) -> Result<(u64, Q)> {
    decode_value(&frame.header)
}

/// Builds a reply frame.
pub fn reply_frame<T: Encode>(
    id: u64,
    result: &std::result::Result<T, RemoteError>,
    data: Bytes,
) -> Result<Frame> {
    Frame::new(&(id, result), data)
}

/// Decodes a reply frame for request `id`.
pub fn parse_reply<T: Decode<()>>(id: u64, frame: &Frame) -> Result<T> {
    let (got, used): (u64, usize) = decode_prefix(&frame.header)?;
    if got != id {
        return Err(Error::UnexpectedReply { expected: id, got });
    }
    let result: std::result::Result<T, RemoteError> = decode_value(&frame.header[used..])?;
    Ok(result?)
}

/// One connection, one request at a time.
#[derive(Debug)]
pub struct RpcClient<R = ConnRead, W: AsyncWrite = ConnWrite> {
    reader: FrameReader<R>,
    writer: FrameWriter<W>,
    next_id: u64,
}

impl RpcClient {
    /// Whether this connection, idle between calls, can no longer carry one: the peer
    /// closed it (a restarted server), it failed, or it holds bytes nobody asked for.
    /// Checked without waiting, before a pooled connection is reused, so a request is
    /// not sent into a connection that is already dead (whether such a request reached
    /// the old server could not be told afterwards).
    pub fn unusable_while_idle(&mut self) -> bool {
        let (stream, buffered) = self.reader.get_mut();
        buffered || stream.idle_state() == IdleState::Unusable
    }

    /// Connects to `addr` through `dialer` within `timeout`.
    pub async fn connect(dialer: &Dialer, addr: &str, timeout: Duration) -> Result<Self> {
        let conn = dialer.connect(addr, timeout).await?;
        Ok(Self::new(conn.read, conn.write))
    }

    /// [`Self::connect`] with read and write buffers of `buffer` bytes each: a
    /// connection that carries small requests and replies (a master's commands) need
    /// not hold 72 KiB for its life; larger frames pass the buffers by.
    pub async fn connect_buffered(
        dialer: &Dialer,
        addr: &str,
        timeout: Duration,
        buffer: usize,
    ) -> Result<Self> {
        let conn = dialer.connect(addr, timeout).await?;
        Ok(Self {
            reader: FrameReader::with_capacity(buffer, conn.read),
            writer: FrameWriter::with_capacity(buffer, conn.write),
            next_id: 1,
        })
    }
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> RpcClient<R, W> {
    pub fn new(reader: R, writer: W) -> Self {
        Self {
            reader: FrameReader::new(reader),
            writer: FrameWriter::new(writer),
            next_id: 1,
        }
    }

    /// Sends `req` with `data` and waits for its reply and the reply's data.
    pub async fn call_with_data<Q: Rpc>(
        &mut self,
        req: Q,
        data: Bytes,
    ) -> Result<(Q::Response, Bytes)> {
        let id = self.next_id;
        self.next_id += 1;
        self.writer
            .write_frame(&request_frame(id, req, data)?)
            .await?;
        let frame = self.reader.read_frame().await?.ok_or(Error::Truncated)?;
        let resp = parse_reply(id, &frame)?;
        Ok((resp, frame.data))
    }

    /// Sends `req` and waits for its reply.
    pub async fn call<Q: Rpc>(&mut self, req: Q) -> Result<Q::Response> {
        Ok(self.call_with_data(req, Bytes::new()).await?.0)
    }

    /// Takes the connection apart (a pipeline stream continues on it).
    pub fn into_parts(self) -> (FrameReader<R>, FrameWriter<W>) {
        (self.reader, self.writer)
    }
}

/// A request the master caches ([`Rpc::CACHED`]) under the call id `call` of
/// `client`: its answer is the request's, and it may be asked again (the same call
/// id) after a lost answer.
#[derive(Clone, Debug)]
pub struct Once<R> {
    pub client: ClientId,
    pub call: u64,
    pub inner: R,
}

impl<R: Rpc<Request = MasterRequest>> Rpc for Once<R> {
    type Request = MasterRequest;
    type Response = R::Response;
    const ASK_AGAIN: bool = true;
    fn into_request(self) -> MasterRequest {
        MasterRequest::Once(OnceCall {
            client: self.client,
            call: self.call,
            request: Box::new(self.inner.into_request()),
        })
    }
}

// Checked when the crate builds: only requests whose second copy has no second effect
// and answers as the first did are resent after a lost reply (DESIGN.md, "Master
// requests on a closed connection"); the ones that mint, create, move or remove never
// are.
const _: () = {
    assert!(Stat::RESEND_SAFE && List::RESEND_SAFE && GetLocations::RESEND_SAFE);
    assert!(RenewLease::RESEND_SAFE && Close::RESEND_SAFE && CutLastChunk::RESEND_SAFE);
    assert!(SetAttr::RESEND_SAFE);
    assert!(AddChunk::ASK_AGAIN && OpenChunk::ASK_AGAIN && UpdatePipeline::ASK_AGAIN);
    assert!(Close::ASK_AGAIN && Stat::ASK_AGAIN);
    assert!(!Create::ASK_AGAIN && !Append::ASK_AGAIN && !DropChunks::ASK_AGAIN);
    assert!(Mkdir::CACHED && Create::CACHED && MakeFile::CACHED && Rename::CACHED);
    assert!(Delete::CACHED && Symlink::CACHED && SetXattr::CACHED && !Append::CACHED);
    assert!(!Create::RESEND_SAFE && !MakeFile::RESEND_SAFE && !Mkdir::RESEND_SAFE);
    assert!(!AddChunk::RESEND_SAFE && !OpenChunk::RESEND_SAFE && !DropChunks::RESEND_SAFE);
    assert!(!UpdatePipeline::RESEND_SAFE && !Append::RESEND_SAFE);
    assert!(!Rename::RESEND_SAFE && !Delete::RESEND_SAFE && !Symlink::RESEND_SAFE);
    assert!(!SetXattr::RESEND_SAFE && !AddUser::RESEND_SAFE && !RemoveUser::RESEND_SAFE);
};
