//! The network between members: openraft's RPCs over stampfs's frames.
//!
//! Each member keeps one connection to each other member, made on first use: it dials
//! the member's address (through the master's [`Dialer`], so TLS applies), proves the
//! cluster key with the handshake chunkservers use, and then sends one
//! [`RaftCall`] at a time, the openraft message as the frame's data ([`super::wire`]).
//! The answer's data is openraft's answer or its error. A failed or timed-out call
//! drops the connection; the next call dials again. A group of one has no peers:
//! [`Network::none`] answers any call with `Unreachable`, naming why.
//!
//! The receiving side is [`serve`]: the master's connection handler passes it every
//! `RaftCall` from a connection that proved the cluster key.

use super::wire::{
    self, AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
    InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use super::{MasterNode, NodeId, TypeConfig};
use crate::error::{Error, Result};
use bytes::Bytes;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::Raft;
use serde::de::DeserializeOwned;
use serde::Serialize;
use stampfs_proto::codec::MAX_DATA_LEN;
use stampfs_proto::net::Dialer;
use stampfs_proto::rpc::RpcClient;
use stampfs_proto::token::ClusterKey;
use stampfs_proto::{RaftCall, RaftKind, RaftReply};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long dialing a member and proving the key may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Makes [`Peer`]s.
#[derive(Clone, Debug)]
pub struct Network {
    ctx: Option<Arc<Ctx>>,
}

struct Ctx {
    me: NodeId,
    dialer: Dialer,
    key: ClusterKey,
    /// Idle connections by member: openraft makes a new client for every read-index
    /// round, which takes one from here instead of dialing and proving the key again.
    idle: Mutex<HashMap<NodeId, Vec<RpcClient>>>,
}

/// Idle connections kept per member.
const IDLE_PER_MEMBER: usize = 4;

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Network {
    /// Member `me`'s connections to the others, dialed with `dialer`, proving `key`.
    pub fn new(me: NodeId, dialer: Dialer, key: ClusterKey) -> Self {
        Network {
            ctx: Some(Arc::new(Ctx {
                me,
                dialer,
                key,
                idle: Mutex::new(HashMap::new()),
            })),
        }
    }

    /// No connections: a group of one.
    pub fn none() -> Self {
        Network { ctx: None }
    }
}

/// A connection to another member.
pub struct Peer {
    target: NodeId,
    addr: String,
    ctx: Option<Arc<Ctx>>,
    conn: Option<RpcClient>,
}

impl Network {
    /// Tells member `target` at `addr` to campaign now (the leader handing its lead
    /// over, `admin masters transfer-leader`).
    pub async fn elect_now(&self, target: NodeId, addr: &str) -> Result<()> {
        let mut peer = Peer {
            target,
            addr: addr.to_string(),
            ctx: self.ctx.clone(),
            conn: None,
        };
        let answer: std::result::Result<(), String> = peer
            .call(RaftKind::ElectNow, &(), CONNECT_TIMEOUT)
            .await
            .map_err(|e| match e {
                CallError::Unreachable(e) | CallError::Network(e) => e,
                CallError::TooLarge => Error::bad_request("an empty message too large"),
            })?;
        answer.map_err(|reason| Error::LogFailed { reason })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let (Some(ctx), Some(conn)) = (&self.ctx, self.conn.take()) {
            let mut idle = ctx.idle.lock().unwrap_or_else(|e| e.into_inner());
            let conns = idle.entry(self.target).or_default();
            if conns.len() < IDLE_PER_MEMBER {
                conns.push(conn);
            }
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &MasterNode) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            ctx: self.ctx.clone(),
            conn: None,
        }
    }
}

/// Why a call failed before an answer came.
enum CallError {
    /// No connection could be made (openraft backs off).
    Unreachable(Error),
    /// The connection failed or timed out during the call.
    Network(Error),
    /// The message is over the frame's data limit.
    TooLarge,
}

impl CallError {
    fn into_rpc<E: std::error::Error>(self, entries: usize) -> RPCError<NodeId, MasterNode, E> {
        match self {
            CallError::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
            CallError::Network(e) => RPCError::Network(NetworkError::new(&e)),
            CallError::TooLarge => RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(
                (entries / 2).max(1) as u64,
            )),
        }
    }
}

impl Peer {
    fn err(&self, what: impl std::fmt::Display) -> Error {
        stampfs_proto::RemoteError::Unavailable {
            reason: format!("member {} at {}: {what}", self.target, self.addr),
        }
        .into()
    }

    async fn connect(&mut self) -> std::result::Result<&mut RpcClient, CallError> {
        let Some(ctx) = self.ctx.clone() else {
            return Err(CallError::Unreachable(self.err(
                "this master serves a group of one and talks to no other member",
            )));
        };
        if self.conn.is_none() {
            let pooled = {
                let mut idle = ctx.idle.lock().unwrap_or_else(|e| e.into_inner());
                let mut found = None;
                if let Some(conns) = idle.get_mut(&self.target) {
                    while let Some(mut c) = conns.pop() {
                        if !c.unusable_while_idle() {
                            found = Some(c);
                            break;
                        }
                    }
                }
                found
            };
            if let Some(c) = pooled {
                self.conn = Some(c);
            }
        }
        if self.conn.is_none() {
            let dialed = tokio::time::timeout(CONNECT_TIMEOUT, async {
                let mut c = RpcClient::connect(&ctx.dialer, &self.addr, CONNECT_TIMEOUT)
                    .await
                    .map_err(|e| self.err(format!("cannot connect: {e}")))?;
                stampfs_proto::auth::authenticate_chunkserver(&mut c, &ctx.key)
                    .await
                    .map_err(|e| self.err(format!("cannot prove the cluster key: {e}")))?;
                Ok::<_, Error>(c)
            })
            .await
            .map_err(|_| self.err("connecting timed out"))
            .and_then(|r| r)
            .map_err(CallError::Unreachable)?;
            self.conn = Some(dialed);
        }
        match self.conn.as_mut() {
            Some(c) => Ok(c),
            None => Err(CallError::Unreachable(Error::LogFailed {
                reason: "no connection".into(),
            })),
        }
    }

    /// Sends `msg` as a `kind` call within `ttl` and decodes openraft's answer.
    async fn call<Q: Serialize, A: DeserializeOwned>(
        &mut self,
        kind: RaftKind,
        msg: &Q,
        ttl: Duration,
    ) -> std::result::Result<A, CallError> {
        let body = wire::encode(msg).map_err(CallError::Network)?;
        if body.len() > MAX_DATA_LEN {
            return Err(CallError::TooLarge);
        }
        let from = self.ctx.as_ref().map_or(0, |c| c.me);
        let target = self.target;
        let conn = self.connect().await?;
        let sent = tokio::time::timeout(
            ttl,
            conn.call_with_data(RaftCall { from, kind }, Bytes::from(body)),
        )
        .await;
        let (_, data) = match sent {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                self.conn = None;
                return Err(CallError::Network(
                    self.err(format!("{kind:?} failed: {e}")),
                ));
            }
            Err(_) => {
                self.conn = None;
                return Err(CallError::Network(self.err(format!(
                    "{kind:?} to member {target} timed out after {ttl:?}"
                ))));
            }
        };
        wire::decode(&data).map_err(|e| {
            self.conn = None;
            CallError::Network(e)
        })
    }
}

type Answer<A, E> = std::result::Result<A, RaftError<NodeId, E>>;

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest,
        option: RPCOption,
    ) -> std::result::Result<AppendEntriesResponse, RPCError<NodeId, MasterNode, RaftError<NodeId>>>
    {
        let entries = rpc.entries.len();
        match self
            .call::<_, Answer<AppendEntriesResponse, openraft::error::Infallible>>(
                RaftKind::AppendEntries,
                &rpc,
                option.hard_ttl(),
            )
            .await
        {
            Ok(a) => a.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            Err(e) => Err(e.into_rpc(entries)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest,
        option: RPCOption,
    ) -> std::result::Result<
        InstallSnapshotResponse,
        RPCError<NodeId, MasterNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .call::<_, Answer<InstallSnapshotResponse, InstallSnapshotError>>(
                RaftKind::InstallSnapshot,
                &rpc,
                option.hard_ttl(),
            )
            .await
        {
            Ok(a) => a.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            Err(e) => Err(e.into_rpc(1)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest,
        option: RPCOption,
    ) -> std::result::Result<VoteResponse, RPCError<NodeId, MasterNode, RaftError<NodeId>>> {
        match self
            .call::<_, Answer<VoteResponse, openraft::error::Infallible>>(
                RaftKind::Vote,
                &rpc,
                option.hard_ttl(),
            )
            .await
        {
            Ok(a) => a.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            Err(e) => Err(e.into_rpc(1)),
        }
    }
}

/// Serves one Raft call from member `call.from` to `raft`: decodes the message in
/// `data`, hands it to openraft, and returns the answer (or openraft's error) encoded,
/// for the reply's data. The connection proved the cluster key. A vote request from a
/// node that is not a voter of the membership this member knows is refused: openraft
/// does not check who campaigns, and a removed member must not depose the leader.
/// Entries and snapshots are taken from anyone holding the key (a joining member
/// knows no membership yet; openraft refuses a stale leader by its vote).
pub async fn serve(
    raft: &Raft<TypeConfig>,
    call: RaftCall,
    data: &[u8],
) -> Result<(RaftReply, Bytes)> {
    if matches!(call.kind, RaftKind::Vote | RaftKind::ElectNow) {
        let m = raft.metrics().borrow().membership_config.clone();
        let voters: Vec<NodeId> = m.membership().voter_ids().collect();
        if !voters.is_empty() && !voters.contains(&call.from) {
            return Err(Error::Unauthenticated {
                reason: format!(
                    "member {} is not a voter of this master group; its vote request is refused",
                    call.from
                ),
            });
        }
    }
    let body = match call.kind {
        RaftKind::AppendEntries => {
            let req: AppendEntriesRequest = wire::decode(data)?;
            wire::encode(&raft.append_entries(req).await)?
        }
        RaftKind::Vote => {
            let req: VoteRequest = wire::decode(data)?;
            wire::encode(&raft.vote(req).await)?
        }
        RaftKind::InstallSnapshot => {
            let req: InstallSnapshotRequest = wire::decode(data)?;
            wire::encode(&raft.install_snapshot(req).await)?
        }
        RaftKind::ElectNow => {
            tracing::info!(
                from = call.from,
                "the leader hands the lead over: campaigning now"
            );
            let started = raft.trigger().elect().await.map_err(|e| Error::LogFailed {
                reason: format!("cannot campaign: {e}"),
            });
            wire::encode(&started.map_err(|e| e.to_string()))?
        }
    };
    Ok((RaftReply {}, Bytes::from(body)))
}
