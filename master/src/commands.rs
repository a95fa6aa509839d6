//! Commands the master pushes to chunkservers and waits for: version bumps (before a
//! grant leaves, invariant 2), finalizes, and lease recovery's truncate, digest and
//! finalize.
//!
//! Each command is a [`Signed`] [`ChunkCommand`] (a digest request a [`Signed`]
//! [`DigestReplica`], under its own MAC domain) sent over a cached connection per
//! chunkserver address, with a timeout on connect and reply. A cached connection that
//! fails at the transport level is replaced once (the commands are idempotent).

use crate::error::{Error, Result};
use crate::oplog::lock;
use futures::future::join_all;
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkVersion, ChunkserverAddr, ChunkserverId, ClusterKey,
    DigestReplica, RemoteError, ReplicaDigest, ReplicaReport, ReplicaState, Rpc, RpcClient, Signed,
};
use std::collections::HashMap;
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
    /// Idle connections by address, taken for one command and put back after a clean
    /// reply; a connection that failed is dropped.
    idle: std::sync::Mutex<HashMap<String, Vec<RpcClient>>>,
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
    pub fn new(key: ClusterKey, timeout: Duration) -> Self {
        Self {
            key,
            timeout,
            idle: std::sync::Mutex::new(HashMap::new()),
        }
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

    /// Sends `cmd` to the chunkserver at `addr` and returns its reply.
    pub async fn send(&self, addr: &str, cmd: ChunkCommand) -> Result<Option<ReplicaReport>> {
        self.call(addr, Signed::new(&self.key, cmd)?, self.timeout)
            .await
    }

    /// Asks the chunkserver at `addr` for the digest of its replica of `handle` at
    /// exactly `version` (a signed `DigestReplica`).
    pub async fn digest(
        &self,
        addr: &str,
        handle: ChunkHandle,
        version: ChunkVersion,
    ) -> Result<ReplicaDigest> {
        let req = Signed::new(&self.key, DigestReplica { handle, version })?;
        // A digest reads the whole replica (up to 1 GiB): it gets more than a command.
        self.call(addr, req, self.timeout.max(DIGEST_TIMEOUT)).await
    }

    /// One signed request to `addr` over a cached connection, answered within
    /// `timeout`; a cached connection that fails at the transport level is replaced once.
    async fn call<Q: Rpc + Clone>(
        &self,
        addr: &str,
        req: Q,
        timeout: Duration,
    ) -> Result<Q::Response> {
        for attempt in 0..2 {
            let (mut conn, reused) = match self.take_idle(addr) {
                Some(c) if attempt == 0 => (c, true),
                _ => (
                    RpcClient::connect_buffered(addr, self.timeout, COMMAND_WRITE_BUFFER).await?,
                    false,
                ),
            };
            match stampfs_proto::pause::timeout(timeout, conn.call(req.clone())).await {
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
            async move { (t.id, self.send(&t.addr, c).await) }
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
            .map(|t| async move { (t.id, self.digest(&t.addr, handle, version).await) });
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
