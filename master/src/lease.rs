//! File write leases: who may write a file, and until when.
//!
//! Pure bookkeeping: every function takes `now` as milliseconds on the master's
//! monotonic [`Clock`], so the decisions are tested without sleeping. Leases are soft
//! state: which client has a file open is in the operation log, but the timers are
//! not; after a restart every open file gets a fresh lease for its recorded holder.
//!
//! - before the **soft limit** the holder owns the file; anyone else gets a conflict
//!   naming the holder and how long until the soft limit;
//! - after the soft limit an append starts lease recovery ([`crate::recovery`]);
//!   `RecoverLease` forces it at any time;
//! - after the **hard limit** the master recovers the file on its own.

use stampfs_proto::{ClientId, InodeId};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// How long a master that resumed from a pause runs before it judges anyone: the
/// heartbeats and renewals that queued up in its sockets while it was frozen are read
/// first. (Seen time already leaves the pause out; this covers the messages that were
/// due during it.)
pub const RESUME_SETTLE: Duration = Duration::from_secs(1);

/// Milliseconds since the master started, in *seen* time ([`stampfs_proto::pause`]):
/// the time base of leases, heartbeats and every other deadline the master judges.
/// A stretch during which the master itself was not running (SIGSTOP, a VM freeze) is
/// not counted, so a master that wakes up does not find every chunkserver silent and
/// every lease expired by time it never saw.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin_ms: u64,
}

impl Clock {
    pub fn new() -> Self {
        Self {
            origin_ms: stampfs_proto::pause::seen_ms(),
        }
    }

    /// Seen milliseconds since [`Clock::new`].
    pub fn now_ms(&self) -> u64 {
        stampfs_proto::pause::seen_ms().saturating_sub(self.origin_ms)
    }

    /// Whether the master ran without a pause for at least `settle`: judgements that
    /// take something away (a chunkserver declared dead, a lease expired) wait until
    /// what queued up during a pause (heartbeats, renewals) has been read.
    pub fn settled(&self, settle: Duration) -> bool {
        stampfs_proto::pause::settled(settle)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Wall-clock milliseconds since the Unix epoch (file modification times).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The soft and hard limits in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseLimits {
    pub soft_ms: u64,
    pub hard_ms: u64,
}

impl LeaseLimits {
    pub fn new(soft: Duration, hard: Duration) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            soft_ms: ms(soft),
            hard_ms: ms(hard),
        }
    }
}

/// One file's write lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub holder: ClientId,
    /// When the holder last renewed it (master clock, ms).
    pub renewed_ms: u64,
    /// The hard-limit expiry was already reported (so the recovery worker starts one
    /// recovery per expiry).
    pub hard_reported: bool,
}

impl Lease {
    /// Past the soft limit: another client may take the file over.
    pub fn soft_expired(&self, now_ms: u64, limits: LeaseLimits) -> bool {
        now_ms.saturating_sub(self.renewed_ms) >= limits.soft_ms
    }

    /// Past the hard limit: the master recovers the file on its own.
    pub fn hard_expired(&self, now_ms: u64, limits: LeaseLimits) -> bool {
        now_ms.saturating_sub(self.renewed_ms) >= limits.hard_ms
    }

    /// Milliseconds until the soft limit (0 once passed).
    pub fn expires_in_ms(&self, now_ms: u64, limits: LeaseLimits) -> u64 {
        (self.renewed_ms.saturating_add(limits.soft_ms)).saturating_sub(now_ms)
    }
}

/// What another client asking for a file (append, recover) runs into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takeover {
    /// Nobody holds a lease on the file.
    Free,
    /// The holder's lease is within its soft limit.
    Conflict {
        holder: ClientId,
        expires_in_ms: u64,
    },
    /// The holder passed the soft limit: the lease may be recovered.
    SoftExpired { holder: ClientId },
    /// The holder passed the hard limit.
    HardExpired { holder: ClientId },
}

/// Every write lease, by file and by client.
#[derive(Debug, Default)]
pub struct LeaseTable {
    by_file: HashMap<InodeId, Lease>,
    by_client: HashMap<ClientId, HashSet<InodeId>>,
}

impl LeaseTable {
    /// Gives `client` the lease on `file` (replacing any other holder), starting now.
    pub fn acquire(&mut self, file: InodeId, client: ClientId, now_ms: u64) {
        self.release(file);
        self.by_file.insert(
            file,
            Lease {
                holder: client,
                renewed_ms: now_ms,
                hard_reported: false,
            },
        );
        self.by_client.entry(client).or_default().insert(file);
    }

    /// Drops the lease on `file`, returning it.
    pub fn release(&mut self, file: InodeId) -> Option<Lease> {
        let lease = self.by_file.remove(&file)?;
        if let Some(files) = self.by_client.get_mut(&lease.holder) {
            files.remove(&file);
            if files.is_empty() {
                self.by_client.remove(&lease.holder);
            }
        }
        Some(lease)
    }

    /// The lease on `file`.
    pub fn get(&self, file: InodeId) -> Option<&Lease> {
        self.by_file.get(&file)
    }

    /// Every lease, by file (in no order).
    pub fn iter(&self) -> impl Iterator<Item = (InodeId, &Lease)> {
        self.by_file.iter().map(|(f, l)| (*f, l))
    }

    /// Renews `file`'s lease when `client` holds it; returns whether it does.
    pub fn renew(&mut self, file: InodeId, client: ClientId, now_ms: u64) -> bool {
        match self.by_file.get_mut(&file) {
            Some(lease) if lease.holder == client => {
                lease.renewed_ms = lease.renewed_ms.max(now_ms);
                lease.hard_reported = false;
                true
            }
            _ => false,
        }
    }

    /// Renews every lease `client` holds; returns how many.
    pub fn renew_client(&mut self, client: ClientId, now_ms: u64) -> usize {
        let Some(files) = self.by_client.get(&client) else {
            return 0;
        };
        let mut n = 0;
        for file in files {
            if let Some(lease) = self.by_file.get_mut(file) {
                lease.renewed_ms = lease.renewed_ms.max(now_ms);
                lease.hard_reported = false;
                n += 1;
            }
        }
        n
    }

    /// Whether `client` holds any lease.
    pub fn holds_any(&self, client: ClientId) -> bool {
        self.by_client.contains_key(&client)
    }

    /// How many clients hold leases.
    pub fn holders(&self) -> usize {
        self.by_client.len()
    }

    /// Files `client` holds leases on.
    pub fn files_of(&self, client: ClientId) -> Vec<InodeId> {
        self.by_client
            .get(&client)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// What another client asking for `file` now runs into.
    pub fn takeover(&self, file: InodeId, now_ms: u64, limits: LeaseLimits) -> Takeover {
        match self.by_file.get(&file) {
            None => Takeover::Free,
            Some(l) if l.hard_expired(now_ms, limits) => Takeover::HardExpired { holder: l.holder },
            Some(l) if l.soft_expired(now_ms, limits) => Takeover::SoftExpired { holder: l.holder },
            Some(l) => Takeover::Conflict {
                holder: l.holder,
                expires_in_ms: l.expires_in_ms(now_ms, limits),
            },
        }
    }

    /// Leases past the hard limit that were not reported yet; marks them reported.
    pub fn take_hard_expired(&mut self, now_ms: u64, limits: LeaseLimits) -> Vec<(InodeId, Lease)> {
        let mut out = Vec::new();
        for (file, lease) in self.by_file.iter_mut() {
            if !lease.hard_reported && lease.hard_expired(now_ms, limits) {
                lease.hard_reported = true;
                out.push((*file, *lease));
            }
        }
        out.sort_by_key(|(f, _)| *f);
        out
    }

    /// Restarts every lease's timer at `now_ms` (a master that starts to lead: the
    /// writers renewed with the leader before it, which kept no record of that).
    pub fn renew_all(&mut self, now_ms: u64) {
        for lease in self.by_file.values_mut() {
            lease.renewed_ms = lease.renewed_ms.max(now_ms);
        }
    }

    /// Number of leases.
    pub fn len(&self) -> usize {
        self.by_file.len()
    }

    /// No leases at all.
    pub fn is_empty(&self) -> bool {
        self.by_file.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: LeaseLimits = LeaseLimits {
        soft_ms: 1_000,
        hard_ms: 5_000,
    };
    const A: ClientId = ClientId(1);
    const B: ClientId = ClientId(2);
    const F: InodeId = InodeId(10);
    const G: InodeId = InodeId(11);

    #[test]
    fn holder_conflicts_until_soft_limit_then_expires() {
        let mut t = LeaseTable::default();
        assert_eq!(t.takeover(F, 0, LIMITS), Takeover::Free);
        t.acquire(F, A, 100);
        assert_eq!(
            t.takeover(F, 100, LIMITS),
            Takeover::Conflict {
                holder: A,
                expires_in_ms: 1_000
            }
        );
        assert_eq!(
            t.takeover(F, 850, LIMITS),
            Takeover::Conflict {
                holder: A,
                expires_in_ms: 250
            }
        );
        assert_eq!(
            t.takeover(F, 1_100, LIMITS),
            Takeover::SoftExpired { holder: A }
        );
        assert_eq!(
            t.takeover(F, 5_099, LIMITS),
            Takeover::SoftExpired { holder: A }
        );
        assert_eq!(
            t.takeover(F, 5_100, LIMITS),
            Takeover::HardExpired { holder: A }
        );
    }

    #[test]
    fn renewal_pushes_expiry_back_for_every_file_of_the_client() {
        let mut t = LeaseTable::default();
        t.acquire(F, A, 0);
        t.acquire(G, A, 0);
        assert_eq!(t.renew_client(A, 900), 2);
        assert_eq!(
            t.takeover(F, 1_500, LIMITS),
            Takeover::Conflict {
                holder: A,
                expires_in_ms: 400
            }
        );
        assert_eq!(t.renew_client(B, 900), 0, "unknown client renews nothing");
        assert!(!t.renew(F, B, 1_000), "only the holder renews");
        assert!(t.renew(F, A, 1_000));
        // A clock that goes nowhere never shortens a lease.
        assert!(t.renew(F, A, 10));
        assert_eq!(t.get(F).expect("lease").renewed_ms, 1_000);
    }

    #[test]
    fn release_and_reacquire_by_another_client() {
        let mut t = LeaseTable::default();
        t.acquire(F, A, 0);
        t.acquire(F, B, 10);
        assert_eq!(t.get(F).expect("lease").holder, B);
        assert!(t.files_of(A).is_empty());
        assert_eq!(t.files_of(B), vec![F]);
        assert_eq!(t.release(F).expect("held").holder, B);
        assert!(t.is_empty());
        assert!(t.files_of(B).is_empty());
        assert_eq!(t.release(F), None);
    }

    #[test]
    fn hard_expiry_is_reported_once_per_expiry() {
        let mut t = LeaseTable::default();
        t.acquire(F, A, 0);
        t.acquire(G, B, 3_000);
        assert!(t.take_hard_expired(4_999, LIMITS).is_empty());
        let got = t.take_hard_expired(5_000, LIMITS);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, F);
        assert!(
            t.take_hard_expired(6_000, LIMITS).is_empty(),
            "reported once"
        );
        assert!(t.renew(F, A, 6_000));
        assert_eq!(t.take_hard_expired(11_000, LIMITS).len(), 2);
    }

    #[test]
    fn fresh_timers_after_restart_start_at_now() {
        // After replay the master acquires a lease per open file at its own "now".
        let mut t = LeaseTable::default();
        t.acquire(F, A, 0);
        assert!(matches!(
            t.takeover(F, 999, LIMITS),
            Takeover::Conflict { .. }
        ));
    }

    #[test]
    fn limits_from_durations() {
        let l = LeaseLimits::new(Duration::from_secs(60), Duration::from_secs(300));
        assert_eq!(l.soft_ms, 60_000);
        assert_eq!(l.hard_ms, 300_000);
    }
}
