//! Commands the master pushes to chunkservers and waits for: version bumps (before a
//! grant leaves, invariant 2), finalizes, and lease recovery's truncate, digest and
//! finalize.
//!
//! Each command is a [`Signed`] [`ChunkCommand`] (a digest request a [`Signed`]
//! [`DigestReplica`], under its own MAC domain) sent over a cached connection per
//! chunkserver address, with a timeout on connect and reply. A cached connection that
//! fails at the transport level is replaced once (the commands are idempotent, and a
//! resend is a new command: it is signed again with the next number).
//!
//! Every request is signed for one chunkserver's current registration session with
//! the next number of that session ([`stampfs_proto::replay`]), so the chunkserver
//! applies each at most once: [`CommandSender::registered`] learns the session at each
//! registration, [`CommandSender::sign`] numbers and signs (also for the commands of
//! heartbeat replies and replica verifications).

use crate::error::{Error, Result};
use crate::oplog::lock;
use crate::raft::leadership::Leadership;
use futures::future::join_all;
use stampfs_proto::net::Dialer;
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkVersion, ChunkserverAddr, ChunkserverId, ClusterKey,
    DigestReplica, Issue, RemoteError, ReplicaDigest, ReplicaReport, ReplicaState, Rpc, RpcClient,
    Signed, SignedBody,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Idle connections kept per chunkserver.
const MAX_IDLE_PER_SERVER: usize = 4;

/// Read and write buffers of a command connection: commands and most replies are a few
/// dozen bytes (a larger frame passes the buffer by), and a master keeps up to
/// [`MAX_IDLE_PER_SERVER`] connections to each of thousands of chunkservers.
const COMMAND_WRITE_BUFFER: usize = 1024;
/// The least time a replica's digest may take: it reads the whole replica (a 1 GiB
/// chunk at 20 MB/s), where a command only updates a header.
const DIGEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends signed commands to chunkservers.
pub struct CommandSender {
    key: ClusterKey,
    timeout: Duration,
    /// Plain TCP, or TLS checked against `--tls-ca`.
    dialer: Dialer,
    /// Idle connections by address, taken for one command and put back after a clean
    /// reply; a connection that failed is dropped.
    idle: std::sync::Mutex<HashMap<String, Vec<RpcClient>>>,
    /// Per chunkserver: the session of its latest registration with this master, and
    /// the number of the next request signed for it.
    sessions: std::sync::Mutex<HashMap<ChunkserverId, (u64, u64)>>,
    /// Where the epoch comes from, in a master group.
    leadership: Option<Arc<Leadership>>,
}

impl std::fmt::Debug for CommandSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandSender")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// One chunkserver's answer to a command.
pub type CommandResult = (ChunkserverId, Result<Option<ReplicaReport>>);

impl CommandSender {
    pub fn new(
        key: ClusterKey,
        timeout: Duration,
        dialer: Dialer,
        leadership: Option<Arc<Leadership>>,
    ) -> Self {
        Self {
            key,
            timeout,
            dialer,
            leadership,
            idle: std::sync::Mutex::new(HashMap::new()),
            sessions: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The epoch commands are signed under: the leader id of the group this master
    /// leads, `(0, 0)` for a master that keeps an operation log.
    pub fn epoch(&self) -> stampfs_proto::MasterEpoch {
        self.leadership
            .as_ref()
            .map(|l| l.epoch())
            .unwrap_or_default()
    }

    /// How chunkservers are dialed.
    pub fn dialer(&self) -> &Dialer {
        &self.dialer
    }

    /// Chunkserver `id` registered with `session`: requests signed for it from now on
    /// carry that session, numbered from 0 (it refuses those of earlier sessions).
    pub fn registered(&self, id: ChunkserverId, session: u64) {
        lock(&self.sessions).insert(id, (session, 0));
    }

    /// Signs `body` for chunkserver `to`'s current registration, with the next number.
    /// A chunkserver that has not registered with this master takes no command.
    pub fn sign<T: SignedBody>(&self, to: ChunkserverId, body: T) -> Result<Signed<T>> {
        let issue = {
            let mut sessions = lock(&self.sessions);
            let Some((session, next)) = sessions.get_mut(&to) else {
                return Err(RemoteError::Unavailable {
                    reason: format!("chunkserver {to} has not registered with this master"),
                }
                .into());
            };
            let seq = *next;
            *next += 1;
            Issue {
                chunkserver: to,
                session: *session,
                seq,
                epoch: self.epoch(),
            }
        };
        Ok(Signed::new(&self.key, issue, body)?)
    }

    fn take_idle(&self, addr: &str) -> Option<RpcClient> {
        lock(&self.idle).get_mut(addr).and_then(Vec::pop)
    }

    fn put_idle(&self, addr: &str, conn: RpcClient) {
        let mut idle = lock(&self.idle);
        let list = idle.entry(addr.to_string()).or_default();
        if list.len() < MAX_IDLE_PER_SERVER {
            list.push(conn);
        }
    }

    /// Sends `cmd` to chunkserver `to` and returns its reply.
    pub async fn send(
        &self,
        to: &ChunkserverAddr,
        cmd: ChunkCommand,
    ) -> Result<Option<ReplicaReport>> {
        self.call(to, || self.sign(to.id, cmd.clone()), self.timeout)
            .await
    }

    /// Asks chunkserver `to` for the digest of its replica of `handle` at exactly
    /// `version` (a signed `DigestReplica`).
    pub async fn digest(
        &self,
        to: &ChunkserverAddr,
        handle: ChunkHandle,
        version: ChunkVersion,
    ) -> Result<ReplicaDigest> {
        let req = || self.sign(to.id, DigestReplica { handle, version });
        // A digest reads the whole replica (up to 1 GiB): it gets more than a command.
        self.call(to, req, self.timeout.max(DIGEST_TIMEOUT)).await
    }

    /// One signed request to `to` over a cached connection, answered within `timeout`;
    /// a cached connection that fails at the transport level is replaced once, with
    /// the request signed anew (the chunkserver may have admitted the first one).
    async fn call<Q: Rpc>(
        &self,
        to: &ChunkserverAddr,
        req: impl Fn() -> Result<Q>,
        timeout: Duration,
    ) -> Result<Q::Response> {
        let addr = to.addr.as_str();
        for attempt in 0..2 {
            let req = req()?;
            let (mut conn, reused) = match self.take_idle(addr) {
                Some(c) if attempt == 0 => (c, true),
                _ => (
                    RpcClient::connect_buffered(
                        &self.dialer,
                        addr,
                        self.timeout,
                        COMMAND_WRITE_BUFFER,
                    )
                    .await?,
                    false,
                ),
            };
            match stampfs_proto::pause::timeout(timeout, conn.call(req)).await {
                Ok(Ok(reply)) => {
                    self.put_idle(addr, conn);
                    return Ok(reply);
                }
                Ok(Err(stampfs_proto::Error::Remote(e))) => {
                    // The chunkserver answered: the connection is fine, the request failed.
                    self.put_idle(addr, conn);
                    return Err(e.into());
                }
                Ok(Err(e)) if reused => {
                    tracing::debug!(%addr, error = %e, "cached chunkserver connection failed; reconnecting");
                    continue;
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    return Err(RemoteError::Unavailable {
                        reason: format!("{addr} did not answer within {timeout:?}"),
                    }
                    .into())
                }
            }
        }
        Err(Error::from(RemoteError::Unavailable {
            reason: format!("{addr} is unreachable"),
        }))
    }

    /// Sends one command per target concurrently; results in target order.
    pub async fn send_all(
        &self,
        targets: &[ChunkserverAddr],
        cmd: impl Fn() -> ChunkCommand,
    ) -> Vec<CommandResult> {
        let calls = targets.iter().map(|t| {
            let c = cmd();
            async move { (t.id, self.send(t, c).await) }
        });
        join_all(calls).await
    }

    /// Pushes `BumpVersion` to every target concurrently. Returns the targets that
    /// made `version` durable, in target order, with their reports; logs the others.
    pub async fn bump(
        &self,
        targets: &[ChunkserverAddr],
        handle: ChunkHandle,
        version: ChunkVersion,
        create: bool,
    ) -> Vec<(ChunkserverAddr, ReplicaReport)> {
        let results = self
            .send_all(targets, || ChunkCommand::BumpVersion {
                handle,
                version,
                create,
            })
            .await;
        let mut ok = Vec::with_capacity(targets.len());
        for (target, (_, result)) in targets.iter().zip(results) {
            match result {
                Ok(report) => {
                    // `None` is an acknowledgement without details: the bump is durable.
                    let report = report.unwrap_or(ReplicaReport {
                        handle,
                        version,
                        length: 0,
                        state: ReplicaState::Writing,
                    });
                    if report.handle == handle && report.version == version {
                        ok.push((target.clone(), report));
                    } else {
                        tracing::warn!(chunk = %handle, %version, chunkserver = %target.id, reported = %report.version, "bump acknowledged with another version; dropping the replica");
                    }
                }
                Err(e) => {
                    tracing::warn!(chunk = %handle, %version, chunkserver = %target.id, addr = %target.addr, error = %e, "version bump failed; the replica is stale");
                }
            }
        }
        ok
    }

    /// Asks every target for its replica's digest at `version`, concurrently; one
    /// result per target, in target order (lease recovery compares them).
    pub async fn digest_all(
        &self,
        targets: &[ChunkserverAddr],
        handle: ChunkHandle,
        version: ChunkVersion,
    ) -> Vec<(ChunkserverId, Result<ReplicaDigest>)> {
        let calls = targets
            .iter()
            .map(|t| async move { (t.id, self.digest(t, handle, version).await) });
        join_all(calls).await
    }

    /// Seals replicas at `length` (best effort); returns those that acknowledged.
    pub async fn finalize(
        &self,
        targets: &[ChunkserverAddr],
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    ) -> Vec<(ChunkserverId, ReplicaReport)> {
        let results = self
            .send_all(targets, || ChunkCommand::Finalize {
                handle,
                version,
                length,
            })
            .await;
        let mut ok = Vec::new();
        for (id, result) in results {
            match result {
                Ok(report) => ok.push((
                    id,
                    report.unwrap_or(ReplicaReport {
                        handle,
                        version,
                        length,
                        state: ReplicaState::Finalized,
                    }),
                )),
                Err(e) => {
                    tracing::warn!(chunk = %handle, %version, chunkserver = %id, error = %e, "finalize failed (best effort)");
                }
            }
        }
        ok
    }
}
