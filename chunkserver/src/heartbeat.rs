//! The conversation with the master: registration, heartbeats, chunk reports,
//! corruption reports, and carrying out the commands heartbeat replies bring.
//!
//! One background task owns one [`RpcClient`] connection to the master. Every
//! `--heartbeat` (or at once when the store signals a change) it:
//! 1. connects if needed, and registers (with a full chunk report) if not yet
//!    registered — the assigned id is persisted atomically in `DIR/chunkserver.id`;
//! 2. reports replicas found corrupt since the last beat (`ReportCorrupt`);
//! 3. sends a `Heartbeat` (capacity, used, replica count, open streams) and runs every
//!    command of the reply (each verified with the cluster key; `Replicate` runs in the
//!    background, `Delete` is paced by [`crate::deletion`]); `reregister` makes it
//!    register again with a full report;
//! 4. sends a full `ChunkReport` every `--report-every`, or after a change (at most
//!    every `--heartbeat` per 64 Ki replicas held, see [`report_due`]).
//!
//! A full report (in `Register` and `ChunkReport`) is read from the store page by
//! page ([`Store::report_page`](crate::store::Store::report_page), 64 Ki replicas) and
//! sent as it is read: every page but the last as a [`ReportPart`], the last in the
//! message that completes the report. At most two pages are held, whatever the
//! number of replicas; a store of one page sends the same messages as before parts
//! existed.
//!
//! Any failure drops the connection and retries with exponential backoff (100 ms up to
//! 5 s, jittered), logging each failure; the data path never depends on the master.

use crate::error::{Error, Result};
use crate::server::{execute, Shared};
use crate::store::REPORT_PAGE;
use rand::Rng;
use stampfs_proto::auth::AuthFailure;
use stampfs_proto::RemoteError;
use stampfs_proto::{
    ChunkReport, Heartbeat, Register, ReplicaReport, ReportCorrupt, ReportPart, Rpc, RpcClient,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Exponential backoff with jitter.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    failures: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_MIN,
            failures: 0,
        }
    }
}

impl Backoff {
    /// The delay before the next attempt (grows each time).
    pub fn fail(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        self.failures += 1;
        base.mul_f64(rand::thread_rng().gen_range(0.5..1.0))
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// After a success.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// Space to report: `--capacity` (used = `replica_bytes`, the bytes of replica data)
/// or the file system's.
pub fn space(dir: &std::path::Path, capacity: Option<u64>, replica_bytes: u64) -> (u64, u64) {
    match capacity {
        Some(cap) => (cap, replica_bytes),
        None => match rustix::fs::statvfs(dir) {
            Ok(s) => {
                let total = s.f_blocks.saturating_mul(s.f_frsize);
                let avail = s.f_bavail.saturating_mul(s.f_frsize);
                (total, total.saturating_sub(avail))
            }
            Err(e) => {
                tracing::warn!(error = %e, "statvfs failed; reporting no capacity");
                (0, 0)
            }
        },
    }
}

struct Session {
    client: Option<RpcClient>,
    /// The master this session talks to: the leader of the master group as far as it
    /// knows (`--master` may name the group's members, separated by commas).
    target: String,
    registered: bool,
    last_report: Instant,
    /// A change the master has not had a full report of yet.
    changed: bool,
}

/// Runs until shutdown.
pub(crate) async fn run(shared: Arc<Shared>) {
    let masters = stampfs_proto::net::master_addrs(&shared.config.master);
    let mut session = Session {
        client: None,
        target: masters.first().cloned().unwrap_or_default(),
        registered: false,
        last_report: Instant::now(),
        changed: false,
    };
    let mut backoff = Backoff::default();
    let mut redirected = false;
    let mut ticker = tokio::time::interval(shared.config.heartbeat);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let changed = tokio::select! {
            _ = ticker.tick() => false,
            _ = shared.store.changed().notified() => true,
            _ = shared.cancel.cancelled() => return,
        };
        let outcome = tokio::select! {
            r = beat(&shared, &mut session, changed) => r,
            _ = shared.cancel.cancelled() => return,
        };
        match outcome {
            Ok(()) => {
                redirected = false;
                if backoff.failures() > 0 {
                    tracing::info!(master = %shared.config.master, "master reachable again");
                }
                backoff.reset();
            }
            Err(e) => {
                session.client = None;
                if masters.len() > 1 {
                    // Another member may lead: register with it.
                    let before = std::mem::take(&mut session.target);
                    session.target = next_master(&masters, &before, &e);
                    session.registered = false;
                    let named_another = matches!(
                        &e,
                        Error::Proto(stampfs_proto::Error::Remote(RemoteError::NotLeader {
                            leader: Some(l)
                        })) if *l != before
                    );
                    // Straight to the leader named, once in a row: members that
                    // name one another (an election settling) wait the backoff.
                    if named_another && !std::mem::replace(&mut redirected, true) {
                        tracing::info!(leader = %session.target, "following the master group's leader");
                        ticker.reset_immediately();
                        continue;
                    }
                }
                redirected = false;
                let delay = backoff.fail();
                tracing::warn!(
                    master = %session.target,
                    error = %e,
                    failures = backoff.failures(),
                    retry_in_ms = delay.as_millis() as u64,
                    "master unreachable"
                );
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shared.cancel.cancelled() => return,
                }
                ticker.reset_immediately();
            }
        }
    }
}

async fn call<Q: Rpc>(shared: &Shared, client: &mut RpcClient, req: Q) -> Result<Q::Response> {
    let limit = (shared.config.connect_timeout * 2).max(Duration::from_secs(10));
    stampfs_proto::pause::timeout(limit, client.call(req))
        .await
        .map_err(|_| Error::Unavailable {
            reason: "the master did not answer in time".into(),
        })?
        .map_err(Error::from)
}

/// What a full report held.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    replicas: u64,
    bytes: u64,
}

/// Sends every page of the full report but the last as a [`ReportPart`] and returns
/// the last, for the message that completes the report, with the totals.
async fn report_parts(
    shared: &Shared,
    client: &mut RpcClient,
) -> Result<(Vec<ReplicaReport>, Totals)> {
    let store = &shared.store;
    let mut totals = Totals::default();
    let mut page = store.report_page(None, REPORT_PAGE).await;
    loop {
        totals.replicas += page.replicas.len() as u64;
        totals.bytes += page.replicas.iter().map(|r| r.length).sum::<u64>();
        let Some(after) = page.next else {
            return Ok((page.replicas, totals));
        };
        let following = store.report_page(Some(after), REPORT_PAGE).await;
        if following.replicas.is_empty() && following.next.is_none() {
            return Ok((page.replicas, totals));
        }
        call(
            shared,
            client,
            ReportPart {
                replicas: page.replicas,
            },
        )
        .await?;
        page = following;
    }
}

/// Whether a full report is due: `--report-every` after the last one, or after a
/// change: at once for a store of one page (64 Ki replicas), otherwise once
/// `--heartbeat` has passed since the last report for every page held (a large store
/// changes every second while it deletes; its full report must not go out that
/// often: about one page per heartbeat on average).
pub fn report_due(
    changed: bool,
    since_last: Duration,
    report_every: Duration,
    heartbeat: Duration,
    replicas: u64,
) -> bool {
    if since_last >= report_every {
        return true;
    }
    let pages = replicas.div_ceil(REPORT_PAGE as u64);
    if pages <= 1 {
        return changed;
    }
    let spacing = heartbeat.saturating_mul(u32::try_from(pages).unwrap_or(u32::MAX));
    changed && since_last >= spacing
}

/// A new connection to the master, authenticated both ways with the cluster key (see
/// [`stampfs_proto::auth`]). A key mismatch stops the chunkserver
/// ([`Shared::fail`]): retrying cannot mend it, and a chunkserver the master refuses
/// must not look merely "unreachable" to whoever runs it.
/// The master to try after `current` failed with `e`: the leader a `NotLeader` names,
/// else the next member of the group.
fn next_master(masters: &[String], current: &str, e: &Error) -> String {
    if let Error::Proto(stampfs_proto::Error::Remote(RemoteError::NotLeader {
        leader: Some(addr),
    })) = e
    {
        // A member that names itself does not serve yet: try the others.
        if addr != current {
            return addr.clone();
        }
    }
    stampfs_proto::net::next_master(masters, current)
}

async fn connect(shared: &Shared, master: &str) -> Result<RpcClient> {
    let mut client =
        RpcClient::connect(&shared.dialer, master, shared.config.connect_timeout).await?;
    let limit = (shared.config.connect_timeout * 2).max(Duration::from_secs(10));
    let outcome = stampfs_proto::pause::timeout(
        limit,
        stampfs_proto::auth::authenticate_chunkserver(&mut client, &shared.key),
    )
    .await
    .map_err(|_| Error::Unavailable {
        reason: "the master did not answer the handshake in time".into(),
    })?;
    match outcome {
        Ok(()) => Ok(client),
        Err(AuthFailure::Transport(e)) => Err(e.into()),
        Err(e) => {
            let reason = format!(
                "{e}: the master at {master} and this chunkserver hold different cluster keys (--cluster-key-file must be a copy of the master's DIR/cluster.key)"
            );
            shared.fail(reason.clone());
            Err(Error::Config {
                field: "cluster-key-file",
                reason,
            })
        }
    }
}

async fn register(shared: &Shared, client: &mut RpcClient) -> Result<()> {
    // The new session first (the old one's commands are refused from here), then the
    // old one's commands still running finish: the report shows what every command
    // answered before the `Register` arrives did, as the master assumes.
    let session = shared.begin_registration();
    shared.settle_commands().await?;
    let (replicas, totals) = report_parts(shared, client).await?;
    let (capacity, used) = space(&shared.config.dir, shared.config.capacity, totals.bytes);
    let count = totals.replicas;
    let reply = call(
        shared,
        client,
        Register {
            id: shared.id(),
            addr: shared.advertised.clone(),
            capacity,
            used,
            replicas,
            session,
        },
    )
    .await?;
    if let Some(old) = shared.id() {
        if old != reply.id {
            tracing::warn!(old = %old, new = %reply.id, "the master assigned a different id");
        }
    }
    shared.set_id(reply.id)?;
    tracing::info!(id = %reply.id, replicas = count, addr = %shared.advertised, "registered with the master");
    Ok(())
}

async fn beat(shared: &Arc<Shared>, session: &mut Session, changed: bool) -> Result<()> {
    let client = match &mut session.client {
        Some(c) => c,
        None => session
            .client
            .insert(connect(shared, &session.target).await?),
    };
    if !session.registered {
        register(shared, client).await?;
        session.registered = true;
        session.last_report = Instant::now();
    }
    let Some(id) = shared.id() else {
        session.registered = false;
        return Err(Error::Unavailable {
            reason: "registered without an id".into(),
        });
    };
    let corrupt = shared.store.take_corrupt();
    for (i, handle) in corrupt.iter().enumerate() {
        let sent = call(
            shared,
            client,
            ReportCorrupt {
                handle: *handle,
                chunkserver: id,
            },
        )
        .await;
        match sent {
            Ok(()) => tracing::info!(chunk = %handle, "corrupt replica reported to the master"),
            Err(e) => {
                shared.store.requeue_corrupt(corrupt[i..].to_vec());
                return Err(e);
            }
        }
    }
    // Summing every replica's length is only needed for `--capacity`.
    let bytes = match shared.config.capacity {
        Some(_) => shared.store.replica_bytes().await,
        None => 0,
    };
    let (capacity, used) = space(&shared.config.dir, shared.config.capacity, bytes);
    let replica_count = shared.store.replica_count();
    let reply = call(
        shared,
        client,
        Heartbeat {
            id,
            capacity,
            used,
            replica_count,
            active_streams: shared.active_streams.load(Ordering::Relaxed),
        },
    )
    .await?;
    if reply.reregister {
        tracing::info!("the master asks this chunkserver to register again");
        register(shared, client).await?;
        session.last_report = Instant::now();
    }
    for command in reply.commands {
        // Admitted here, in the order the master signed them; deletions are then paced
        // in the background, the rest run here. Refusals and failures are logged and
        // show in the next report.
        let Ok(command) = shared.admit(command, "master command") else {
            continue;
        };
        if let Some(command) = shared.deletions.offer(command) {
            let _ = execute(shared, command).await;
        }
    }
    session.changed |= changed;
    let due = report_due(
        session.changed,
        session.last_report.elapsed(),
        shared.config.report_every,
        shared.config.heartbeat,
        replica_count,
    );
    if due {
        let (replicas, totals) = report_parts(shared, client).await?;
        call(shared, client, ChunkReport { id, replicas }).await?;
        session.last_report = Instant::now();
        session.changed = false;
        tracing::debug!(replicas = totals.replicas, "chunk report sent");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunkserver_follows_the_named_leader_else_the_next_member() {
        let masters = stampfs_proto::net::master_addrs("a:1,b:2,c:3");
        let named = Error::from(RemoteError::NotLeader {
            leader: Some("c:3".into()),
        });
        assert_eq!(next_master(&masters, "a:1", &named), "c:3");
        let unknown = Error::from(RemoteError::NotLeader { leader: None });
        assert_eq!(next_master(&masters, "a:1", &unknown), "b:2");
        let gone = Error::Unavailable {
            reason: "refused".into(),
        };
        assert_eq!(next_master(&masters, "c:3", &gone), "a:1");
        // A leader named outside the list: after it, the list from its start.
        assert_eq!(next_master(&masters, "z:9", &gone), "a:1");
        // A member that names itself (elected, not serving yet): the next one.
        let itself = Error::from(RemoteError::NotLeader {
            leader: Some("b:2".into()),
        });
        assert_eq!(next_master(&masters, "b:2", &itself), "c:3");
    }

    #[test]
    fn backoff_grows_to_a_cap_and_resets() {
        let mut b = Backoff::default();
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            last = b.fail();
            assert!(last <= BACKOFF_MAX);
        }
        assert!(last >= BACKOFF_MAX / 2);
        assert_eq!(b.failures(), 20);
        b.reset();
        assert!(b.fail() <= BACKOFF_MIN);
    }

    #[test]
    fn capacity_override_reports_replica_bytes() {
        assert_eq!(
            space(std::path::Path::new("/"), Some(1000), 200),
            (1000, 200)
        );
        let (total, used) = space(std::path::Path::new("/"), None, 200);
        assert!(total >= used);
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_full_report_is_due_every_report_interval() {
        assert!(report_due(false, 60 * S, 60 * S, S, 0));
        assert!(report_due(false, 60 * S, 60 * S, S, 10_000_000));
        assert!(!report_due(false, 59 * S, 60 * S, S, 0));
    }

    #[test]
    fn a_store_of_one_page_reports_a_change_at_once() {
        assert!(report_due(true, Duration::ZERO, 60 * S, S, 0));
        assert!(report_due(true, S / 10, 60 * S, S, REPORT_PAGE as u64));
        assert!(!report_due(false, S / 10, 60 * S, S, 10));
    }

    #[test]
    fn a_large_store_reports_a_change_after_a_beat_per_page() {
        let million = 1_000_000;
        // 16 pages of 64 Ki replicas.
        assert!(!report_due(true, 15 * S, 60 * S, S, million));
        assert!(report_due(true, 16 * S, 60 * S, S, million));
        // Never later than the report interval.
        assert!(report_due(true, 60 * S, 60 * S, S, 1 << 40));
        assert!(!report_due(true, 59 * S, 60 * S, S, 1 << 40));
    }
}
