//! Connections: to the master (authenticated on every new one, pooled), and to
//! chunkservers (pooled per address for requests that change nothing).

use super::{inline, Client};
use crate::error::{Error, Result};
use stampfs_proto::auth::{authenticate_client, AuthFailure};
use stampfs_proto::net::Dialer;
use stampfs_proto::rpc::Rpc;
use stampfs_proto::{
    ChunkRequest, Credentials, MasterRequest, Read, RemoteError, ReplicaInfo, RpcClient, UserInfo,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a client waits between rounds of asking the masters of a group for one
/// that leads (an election takes about a second).
const FAILOVER_POLL: Duration = Duration::from_millis(100);

/// Why one attempt at a master request failed.
enum Failed {
    /// Before the request was sent: no connection could be made.
    Unsent(Error),
    /// After it was sent (or possibly sent).
    Sent(Error),
}

impl Client {
    /// Sends one request to the master (the leader, when `--master` names a group's
    /// members). A pooled connection the master closed while it sat idle is found
    /// closed before it is used; one closed in the moment between that check and the
    /// request fails without a reply: a request that is [`Rpc::RESEND_SAFE`] then goes
    /// once more on a new connection (see [`retry_on_fresh`]; DESIGN.md "Master
    /// requests on a closed connection"), and the other pooled connections are dropped
    /// either way.
    ///
    /// With several masters, the client follows the leader: a `NotLeader` answer (the
    /// request was not applied) sends it again to the leader it names, or, while none is
    /// known, around the members until one leads; a member that cannot be reached is
    /// passed over, as is one that failed, lost the lead or did not answer in time
    /// while a request the master recognizes when asked again ([`Rpc::ASK_AGAIN`]:
    /// reads, and the writer's requests) was in flight. It gives up after the request
    /// timeout (twice that for such a request in a group, so that one attempt may time
    /// out on a frozen or cut-off leader and another go to the next one; no attempt
    /// waits past the end). Any other failure after a request was sent is returned:
    /// whether it was applied is not known.
    pub(crate) async fn call<R>(&self, req: R) -> Result<R::Response>
    where
        R: Rpc<Request = MasterRequest> + Clone,
    {
        // A namespace change sent to a group goes under a call id of its own, so that
        // whichever member leads answers a repeat of it with what it made
        // (`stampfs_proto::rpc::Once`).
        if R::CACHED && self.inner.masters.len() > 1 {
            let call = self
                .inner
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            let once = stampfs_proto::rpc::Once {
                client: self.inner.id,
                call,
                inner: req,
            };
            return self.call_following(once).await;
        }
        self.call_following(req).await
    }

    /// [`Client::call`], without the `Once` wrapping.
    async fn call_following<R>(&self, req: R) -> Result<R::Response>
    where
        R: Rpc<Request = MasterRequest> + Clone,
    {
        if inline::inside() {
            // This thread's runtime is not driven between its requests: let it see
            // what happened to its idle connections (a TLS connection's close is
            // learned from the runtime, not asked of the kernel).
            tokio::task::yield_now().await;
        }
        let group = self.inner.masters.len() > 1;
        let timeout = self.inner.config.request_timeout;
        // A request asked again after a failover has the time for one attempt that
        // timed out (a frozen or cut-off leader) and another on the next leader.
        let budget = if group && R::ASK_AGAIN {
            timeout.saturating_mul(2)
        } else {
            timeout
        };
        let deadline = Instant::now() + budget;
        let mut passed_over = 0usize;
        let mut redirects = 0usize;
        loop {
            let limit = deadline
                .saturating_duration_since(Instant::now())
                .min(timeout);
            let failed = match self.call_leader(req.clone(), limit).await {
                Ok(v) => return Ok(v),
                Err(f) => f,
            };
            let e = match failed {
                Failed::Sent(Error::Remote(RemoteError::NotLeader { leader })) if group => {
                    // A member that names itself was just elected and does not serve
                    // yet: like no name at all, wait and try the members in turn.
                    let current = self.leader_addr();
                    let leader = leader.filter(|l| *l != current);
                    let named = leader.is_some();
                    self.follow(leader);
                    if Instant::now() >= deadline {
                        return Err(Error::Remote(RemoteError::NotLeader { leader: None }));
                    }
                    redirects += 1;
                    // Members that name one another without serving (a leader not
                    // ready yet) are not asked again at once.
                    if !named || redirects > self.inner.masters.len() {
                        tokio::time::sleep(FAILOVER_POLL).await;
                    }
                    continue;
                }
                Failed::Unsent(e) if group => e,
                Failed::Sent(Error::Proto(e)) if group && R::ASK_AGAIN && transport(&e) => {
                    Error::Proto(e)
                }
                // The member lost the lead with the request under way, or did not
                // answer in time (frozen, or cut off from the others): a request the
                // master recognizes when asked again goes to the next leader.
                Failed::Sent(Error::Remote(e @ RemoteError::Unavailable { .. }))
                    if group && R::ASK_AGAIN =>
                {
                    Error::Remote(e)
                }
                Failed::Sent(e) | Failed::Unsent(e) => return Err(e),
            };
            if Instant::now() >= deadline {
                return Err(e);
            }
            tracing::debug!(error = %e, master = %self.leader_addr(), "master unreachable; trying the next member of the group");
            self.follow(None);
            passed_over += 1;
            if passed_over % self.inner.masters.len() == 0 {
                tokio::time::sleep(FAILOVER_POLL).await;
            }
        }
    }

    /// One attempt at `req` on the master this client takes for the leader.
    /// `limit`: how long the attempt may wait for its answer.
    async fn call_leader<R>(
        &self,
        req: R,
        limit: Duration,
    ) -> std::result::Result<R::Response, Failed>
    where
        R: Rpc<Request = MasterRequest> + Clone,
    {
        let pooled = self.take_master();
        let reused = pooled.is_some();
        let conn = match pooled {
            Some(c) => c,
            None => self.dial_master_conn().await.map_err(Failed::Unsent)?,
        };
        match self.call_on(conn, req.clone(), limit).await {
            Err(Error::Proto(e)) if retry_on_fresh(reused, &e) => {
                // The master closed its connections (it restarted): so it did with
                // the others in the pool.
                self.drop_master_conns();
                if !R::RESEND_SAFE {
                    return Err(Failed::Sent(Error::Proto(e)));
                }
                tracing::debug!(error = %e, "pooled master connection was closed; sending the request again on a new one");
                let conn = self.dial_master_conn().await.map_err(Failed::Unsent)?;
                self.call_on(conn, req, limit).await.map_err(Failed::Sent)
            }
            other => other.map_err(Failed::Sent),
        }
    }

    /// The address of the master this client sends its requests to.
    pub(crate) fn leader_addr(&self) -> String {
        self.inner
            .leader
            .lock()
            .map(|l| l.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Sends the next requests to `leader`, or (`None`) to the member after the
    /// current one; the idle connections to the old one go.
    fn follow(&self, leader: Option<String>) {
        let mut l = self.inner.leader.lock().unwrap_or_else(|e| e.into_inner());
        let next = match leader {
            Some(addr) => addr,
            None => stampfs_proto::net::next_master(&self.inner.masters, &l),
        };
        if *l != next {
            tracing::debug!(from = %*l, to = %next, "following the master group's leader");
            *l = next;
            drop(l);
            self.drop_master_conns();
        }
    }

    fn drop_master_conns(&self) {
        if inline::inside() {
            inline::clear_master();
        } else if let Ok(mut p) = self.inner.master_pool.lock() {
            p.clear();
        }
    }

    async fn dial_master_conn(&self) -> Result<RpcClient> {
        Ok(dial_master(
            &self.inner.config.dialer,
            &self.leader_addr(),
            self.inner.config.connect_timeout,
            &self.inner.creds,
        )
        .await?
        .0)
    }

    /// One request on `conn`, which goes back to the pool unless the transport failed.
    async fn call_on<R>(&self, mut conn: RpcClient, req: R, limit: Duration) -> Result<R::Response>
    where
        R: Rpc<Request = MasterRequest>,
    {
        let reply = stampfs_proto::pause::timeout(limit, conn.call(req))
            .await
            .map_err(|_| {
                Error::Remote(RemoteError::Unavailable {
                    reason: format!("master {} did not answer in time", self.leader_addr()),
                })
            })?;
        match reply {
            Ok(resp) => {
                self.put_master(conn);
                Ok(resp)
            }
            // A typed error leaves the connection in a good state.
            Err(stampfs_proto::Error::Remote(r)) => {
                self.put_master(conn);
                Err(Error::Remote(r))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// An idle master connection the master has not closed: this thread's own when
    /// it serves inline ([`inline`]), else one from the shared pool.
    fn take_master(&self) -> Option<RpcClient> {
        // Connections the master closed while they were idle (it restarted) go.
        if inline::inside() {
            while let Some(mut c) = inline::take_master() {
                if !c.unusable_while_idle() {
                    return Some(c);
                }
            }
            return None;
        }
        let mut p = self.inner.master_pool.lock().ok()?;
        while let Some(mut c) = p.pop() {
            if !c.unusable_while_idle() {
                return Some(c);
            }
        }
        None
    }

    fn put_master(&self, conn: RpcClient) {
        if inline::inside() {
            return inline::put_master(conn);
        }
        if let Ok(mut p) = self.inner.master_pool.lock() {
            if p.len() < 8 {
                p.push(conn);
            }
        }
    }

    /// Sends one request to a chunkserver and returns its reply and the reply's data,
    /// reusing a pooled connection when one has not been idle too long. A transport
    /// failure on a pooled connection (it may have been closed for idleness while it
    /// waited) is retried once on a fresh connection; see [`retry_on_fresh`].
    #[tracing::instrument(level = "debug", skip_all, fields(chunkserver = %addr))]
    pub(crate) async fn call_chunkserver<R>(
        &self,
        addr: &str,
        req: R,
    ) -> Result<(R::Response, bytes::Bytes)>
    where
        R: PooledChunkRequest,
    {
        let config = &self.inner.config;
        let mut pooled_allowed = true;
        loop {
            let pooled = if pooled_allowed {
                self.take_chunk(addr)
            } else {
                None
            };
            let reused = pooled.is_some();
            let (mut conn, idle_since) = match pooled {
                Some((c, since)) => (c, Some(since)),
                None => (
                    RpcClient::connect(&config.dialer, addr, config.connect_timeout).await?,
                    None,
                ),
            };
            let reply = stampfs_proto::pause::timeout(
                config.request_timeout,
                conn.call_with_data(req.clone(), bytes::Bytes::new()),
            )
            .await
            .map_err(|_| {
                Error::Remote(RemoteError::Unavailable {
                    reason: format!("chunkserver {addr} did not answer in time"),
                })
            })?;
            match reply {
                Ok(r) => {
                    self.put_chunk(addr, conn);
                    return Ok(r);
                }
                // A typed error leaves the connection in a good state.
                Err(stampfs_proto::Error::Remote(r)) => {
                    self.put_chunk(addr, conn);
                    return Err(Error::Remote(r));
                }
                Err(e) if retry_on_fresh(reused, &e) => {
                    tracing::debug!(error = %e, "pooled chunkserver connection was closed; retrying on a new one");
                    // Connections that waited at least as long are likely closed too.
                    if let (Some(since), Ok(mut pool)) = (idle_since, self.inner.chunk_pool.lock())
                    {
                        pool.forget_idle_since(addr, since);
                    }
                    pooled_allowed = false;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A pooled connection to `addr` that has not been idle too long, with the instant
    /// it went idle.
    fn take_chunk(&self, addr: &str) -> Option<(RpcClient, Instant)> {
        if inline::inside() {
            // A pooled connection may be bound to another thread's runtime.
            return None;
        }
        let max_idle = self.inner.config.pooled_connection_max_idle;
        let mut pool = self.inner.chunk_pool.lock().ok()?;
        pool.take(addr, Instant::now(), max_idle)
    }

    fn put_chunk(&self, addr: &str, conn: RpcClient) {
        if inline::inside() {
            // Bound to this thread's runtime: no use to the shared pool's users.
            return;
        }
        if let Ok(mut pool) = self.inner.chunk_pool.lock() {
            pool.put(addr, conn, Instant::now());
        }
    }
}

/// Chunkserver requests allowed through the connection pool, and so retried once on a
/// fresh connection after a transport failure: they read and change nothing, so a
/// request the chunkserver may have served before the connection failed can be sent
/// again. Today: [`Read`] and [`ReplicaInfo`]. Requests that change a replica
/// (`WriteSetup` streams, `ReceiveReplica`, master `Command`s) never implement it.
pub(crate) trait PooledChunkRequest: Rpc<Request = ChunkRequest> + Clone {}

impl PooledChunkRequest for Read {}
impl PooledChunkRequest for ReplicaInfo {}

/// A new, authenticated connection to the master at `addr`, and who the master says
/// `creds` are.
pub(super) async fn dial_master(
    dialer: &Dialer,
    addr: &str,
    timeout: Duration,
    creds: &Credentials,
) -> Result<(RpcClient, UserInfo)> {
    let mut conn = RpcClient::connect(dialer, addr, timeout).await?;
    match stampfs_proto::pause::timeout(timeout, authenticate_client(&mut conn, creds)).await {
        Err(_) => Err(Error::Remote(RemoteError::Unavailable {
            reason: format!("master {addr} did not answer the handshake in time"),
        })),
        Ok(Ok(identity)) => Ok((conn, identity)),
        Ok(Err(AuthFailure::Transport(e))) => Err(e.into()),
        Ok(Err(AuthFailure::Refused { reason })) => {
            Err(Error::Remote(RemoteError::Unauthenticated {
                reason: format!("the master refused user {}: {reason}", creds.user),
            }))
        }
        Ok(Err(AuthFailure::MasterUnproven)) => Err(Error::Remote(RemoteError::Unauthenticated {
            reason: format!(
                "the master at {addr} did not prove that it knows user {}'s key: not the master these credentials are for",
                creds.user
            ),
        })),
    }
}

/// True for I/O errors that mean the peer closed the connection (EOF, reset, broken
/// pipe), as a chunkserver does to a connection or stream that stayed idle.
pub(crate) fn connection_closed(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected
    )
}

/// Whether a pooled request that failed with `e` is sent again on a fresh connection:
/// only when the connection came from the pool (it may have been closed for idleness
/// while it waited there) and the failure is the connection being closed: an EOF where
/// the reply should start (`Truncated`: `RpcClient` does not tell an EOF before the
/// reply from one inside it; both are harmless to retry for a [`PooledChunkRequest`],
/// which changes nothing; for a master request see [`Client::call`]), a reset or a
/// broken pipe. A typed error, a malformed reply or a timeout is never retried, and a
/// fresh connection is never retried (the caller tries once).
/// Whether `e` is a failure of the connection (the master went away), not an answer.
fn transport(e: &stampfs_proto::Error) -> bool {
    match e {
        stampfs_proto::Error::Truncated => true,
        stampfs_proto::Error::Io(io) => connection_closed(io.kind()),
        _ => false,
    }
}

pub(crate) fn retry_on_fresh(reused: bool, e: &stampfs_proto::Error) -> bool {
    let closed = match e {
        stampfs_proto::Error::Truncated => true,
        stampfs_proto::Error::Io(io) => connection_closed(io.kind()),
        _ => false,
    };
    reused && closed
}

/// Idle connections by address, each with the instant it went idle (its last reply:
/// a chunkserver's idle clock starts then too). The most recently used is reused
/// first; connections idle for `max_idle` or more are dropped instead of reused.
#[derive(Debug)]
pub(crate) struct IdlePool<C> {
    by_addr: HashMap<String, Vec<(C, Instant)>>,
    per_addr: usize,
}

impl<C> IdlePool<C> {
    pub(crate) fn new(per_addr: usize) -> Self {
        Self {
            by_addr: HashMap::new(),
            per_addr,
        }
    }

    /// The freshest connection to `addr` idle for less than `max_idle` at `now`;
    /// older ones are dropped.
    pub(crate) fn take(
        &mut self,
        addr: &str,
        now: Instant,
        max_idle: Duration,
    ) -> Option<(C, Instant)> {
        let list = self.by_addr.get_mut(addr)?;
        list.retain(|(_, since)| now.saturating_duration_since(*since) < max_idle);
        let got = list.pop();
        if list.is_empty() {
            self.by_addr.remove(addr);
        }
        got
    }

    /// Keeps `conn` (idle from `now`) unless `addr` already has enough.
    pub(crate) fn put(&mut self, addr: &str, conn: C, now: Instant) {
        let list = self.by_addr.entry(addr.to_string()).or_default();
        if list.len() < self.per_addr {
            list.push((conn, now));
        }
    }

    /// Drops the connections to `addr` that went idle at or before `since` (one of
    /// that age was found closed).
    pub(crate) fn forget_idle_since(&mut self, addr: &str, since: Instant) {
        if let Some(list) = self.by_addr.get_mut(addr) {
            list.retain(|(_, s)| *s > since);
            if list.is_empty() {
                self.by_addr.remove(addr);
            }
        }
    }

    #[cfg(test)]
    fn len(&self, addr: &str) -> usize {
        self.by_addr.get(addr).map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    fn io(kind: ErrorKind) -> stampfs_proto::Error {
        stampfs_proto::Error::Io(std::io::Error::from(kind))
    }

    #[test]
    fn a_closed_pooled_connection_is_retried_once_on_a_fresh_one() {
        for e in [
            stampfs_proto::Error::Truncated,
            io(ErrorKind::UnexpectedEof),
            io(ErrorKind::ConnectionReset),
            io(ErrorKind::ConnectionAborted),
            io(ErrorKind::BrokenPipe),
        ] {
            assert!(retry_on_fresh(true, &e), "{e}");
            // A fresh connection that fails is not retried: the chunkserver is gone.
            assert!(!retry_on_fresh(false, &e), "{e}");
        }
    }

    #[test]
    fn answers_and_other_failures_are_never_retried() {
        for e in [
            stampfs_proto::Error::Remote(RemoteError::Unavailable { reason: "x".into() }),
            stampfs_proto::Error::Malformed { reason: "x".into() },
            stampfs_proto::Error::FrameChecksum {
                expected: 1,
                actual: 2,
            },
            stampfs_proto::Error::UnexpectedReply {
                expected: 1,
                got: 2,
            },
            io(ErrorKind::TimedOut),
            io(ErrorKind::PermissionDenied),
        ] {
            assert!(!retry_on_fresh(true, &e), "{e}");
        }
    }

    #[test]
    fn pooled_connections_idle_too_long_are_not_reused() {
        let max = Duration::from_secs(20);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut pool = IdlePool::new(4);
        pool.put("a", 1u32, t0);
        pool.put("a", 2u32, t0 + s(10));
        // The freshest first.
        assert_eq!(pool.take("a", t0 + s(15), max), Some((2, t0 + s(10))));
        pool.put("a", 3u32, t0 + s(15));
        // At t0 + 20 s connection 1 has been idle for the whole bound: dropped.
        assert_eq!(pool.take("a", t0 + s(20), max), Some((3, t0 + s(15))));
        assert_eq!(pool.len("a"), 0);
        assert_eq!(pool.take("a", t0 + s(20), max), None);
        // Everything older than the bound goes at once.
        pool.put("b", 4u32, t0);
        pool.put("b", 5u32, t0 + s(1));
        assert_eq!(pool.take("b", t0 + s(60), max), None);
        assert_eq!(pool.len("b"), 0);
        // A zero bound never reuses anything.
        pool.put("c", 6u32, t0);
        assert_eq!(pool.take("c", t0, Duration::ZERO), None);
    }

    #[test]
    fn the_pool_is_bounded_per_address_and_forgets_what_is_as_old_as_a_closed_one() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut pool = IdlePool::new(2);
        for i in 0..5u32 {
            pool.put("a", i, t0 + s(i as u64));
        }
        assert_eq!(pool.len("a"), 2);
        pool.put("b", 9u32, t0);
        pool.put("a", 7u32, t0);
        assert_eq!(pool.len("a"), 2, "full: the extra one is dropped");
        // Connection 1 (idle since t0 + 1 s) was found closed: 0 and 1 go, not 2+.
        let mut pool = IdlePool::new(4);
        for i in 0..4u32 {
            pool.put("a", i, t0 + s(i as u64));
        }
        pool.put("b", 9u32, t0);
        pool.forget_idle_since("a", t0 + s(1));
        assert_eq!(pool.len("a"), 2);
        assert_eq!(pool.take("a", t0 + s(4), s(20)), Some((3, t0 + s(3))));
        assert_eq!(pool.take("a", t0 + s(4), s(20)), Some((2, t0 + s(2))));
        assert_eq!(pool.take("a", t0 + s(4), s(20)), None);
        assert_eq!(pool.len("b"), 1, "other addresses are untouched");
    }
}
