//! Administration under the faults (`stampfs nemesis --admin`): while the schedule
//! injects its faults, the run also changes the shared files' replication factor
//! (`setrep`), starts and stops the balancer, decommissions a chunkserver and
//! recommissions it, and enters and leaves safe mode, every few seconds, seeded. The
//! run also sets a quota on its directory before anything is in it ([`Act::Quota`],
//! limits far above what the run writes), kept to the end: the master keeps its use
//! record by record through every fault (restarts replay it, crash points cut records
//! short), and [`quota_use_check`] compares it with a walk after the heal. These
//! are the master's paths that delete replicas on purpose (surplus after a setrep down
//! or a balancer move, a drained chunkserver's chunks copied away), so the checker's
//! verdicts (no acknowledged record lost, replicas identical) cover them too. After
//! the heal everything is undone ([`Churn::undo`]) before the final checks.
//!
//! The decisions are pure ([`Churn::next`]); [`perform`] carries one out with the
//! client library. An action that fails (the master down or cut off) is only noted.

use crate::checker::{Violation, ViolationKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stampfs_client::Client;
use stampfs_proto::{
    BalanceAction, ChunkserverId, FileKind, FileState, QuotaChange, SafeModeAction,
};
use std::time::Duration;

/// Time between two actions.
pub const EVERY: Duration = Duration::from_secs(3);

/// One administrative action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Act {
    /// `setrep` of the shared file `path` to `replication`.
    SetRep { path: String, replication: u8 },
    /// Start (threshold 5%) or stop the balancer.
    Balance { start: bool },
    /// Decommission the `index`th chunkserver of the report (`on`), or end the
    /// decommission of the one that is.
    Decommission { index: usize, on: bool },
    /// Enter or leave safe mode.
    SafeMode { enter: bool },
    /// Set ([`QUOTA_NAMES`], [`QUOTA_BYTES`]) or clear the quota of the directory
    /// `path` (the run sets it before the faults; the churn never changes it).
    Quota { path: String, on: bool },
}

/// The name quota the churn sets: far above what a run creates.
pub const QUOTA_NAMES: u64 = 1 << 40;
/// The space quota the churn sets: far above what a run writes.
pub const QUOTA_BYTES: u64 = 1 << 60;

impl Act {
    /// The steps log's name of the action.
    pub fn name(&self) -> &'static str {
        match self {
            Act::SetRep { .. } => "admin_setrep",
            Act::Balance { .. } => "admin_balance",
            Act::Decommission { on: true, .. } => "admin_decommission",
            Act::Decommission { on: false, .. } => "admin_recommission",
            Act::SafeMode { .. } => "admin_safemode",
            Act::Quota { .. } => "admin_quota",
        }
    }
}

/// The churn's state: what is in effect, so each action can be undone.
#[derive(Debug)]
pub struct Churn {
    rng: StdRng,
    /// The files whose factor may change, and the run's factor.
    files: Vec<String>,
    replication: u8,
    chunkservers: usize,
    balancing: bool,
    decommissioned: Option<usize>,
    safe_mode: bool,
    /// When the next action is due (since the faults started).
    next_at: Duration,
}

impl Churn {
    pub fn new(seed: u64, files: Vec<String>, replication: u8, chunkservers: usize) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0xad31_c4a5),
            files,
            replication,
            chunkservers,
            balancing: false,
            decommissioned: None,
            safe_mode: false,
            next_at: EVERY,
        }
    }

    /// The next action if one is due at `elapsed`. Pure in its state. Safe mode is
    /// left by the action after the one that entered it, and a chunkserver is
    /// recommissioned before another is decommissioned, so at most one is drained at
    /// a time (the run's chunkservers can hold every chunk's replicas without it).
    pub fn next(&mut self, elapsed: Duration) -> Option<Act> {
        if elapsed < self.next_at {
            return None;
        }
        self.next_at = elapsed + EVERY;
        if self.safe_mode {
            self.safe_mode = false;
            return Some(Act::SafeMode { enter: false });
        }
        let act = match self.rng.gen_range(0..4) {
            0 if !self.files.is_empty() => {
                let path = self.files[self.rng.gen_range(0..self.files.len())].clone();
                let top =
                    u8::try_from(self.chunkservers.saturating_sub(1).max(1)).unwrap_or(u8::MAX);
                let replication = self.rng.gen_range(
                    self.replication.saturating_sub(1).max(1)..=top.max(self.replication),
                );
                Act::SetRep { path, replication }
            }
            1 => {
                self.balancing = !self.balancing;
                Act::Balance {
                    start: self.balancing,
                }
            }
            2 => match self.decommissioned.take() {
                Some(index) => Act::Decommission { index, on: false },
                None if self.chunkservers > usize::from(self.replication) => {
                    let index = self.rng.gen_range(0..self.chunkservers);
                    self.decommissioned = Some(index);
                    Act::Decommission { index, on: true }
                }
                None => Act::Balance { start: false },
            },
            _ => {
                self.safe_mode = true;
                Act::SafeMode { enter: true }
            }
        };
        Some(act)
    }

    /// What undoes everything in effect, then the run's factor on every file.
    pub fn undo(&self) -> Vec<Act> {
        let mut acts = vec![
            Act::SafeMode { enter: false },
            Act::Balance { start: false },
        ];
        if let Some(index) = self.decommissioned {
            acts.push(Act::Decommission { index, on: false });
        }
        acts.extend(self.files.iter().map(|path| Act::SetRep {
            path: path.clone(),
            replication: self.replication,
        }));
        acts
    }
}

/// Carries `act` out as the superuser's `admin`; says what happened.
pub async fn perform(admin: &Client, act: &Act) -> stampfs_client::Result<String> {
    Ok(match act {
        Act::SetRep { path, replication } => {
            admin.set_replication(path, *replication).await?;
            format!("{path} to {replication} replicas")
        }
        Act::Balance { start } => {
            let action = if *start {
                BalanceAction::Start { threshold_pct: 5 }
            } else {
                BalanceAction::Stop
            };
            let s = admin.balance(action).await?;
            format!("balancer running: {}", s.running)
        }
        Act::Decommission { index, on } => {
            let report = admin.cluster_report().await?;
            let mut ids: Vec<ChunkserverId> = report.chunkservers.iter().map(|c| c.id).collect();
            ids.sort();
            let Some(id) = ids.get(*index % ids.len().max(1)).copied() else {
                return Ok("no chunkserver known".into());
            };
            let s = admin.decommission(id, *on).await?;
            format!("chunkserver {id}: {}", s.word())
        }
        Act::SafeMode { enter } => {
            let action = if *enter {
                SafeModeAction::Enter
            } else {
                SafeModeAction::Leave
            };
            admin.safe_mode(action).await?.describe()
        }
        Act::Quota { path, on } => {
            let (names, bytes) = if *on {
                (QuotaChange::Set(QUOTA_NAMES), QuotaChange::Set(QUOTA_BYTES))
            } else {
                (QuotaChange::Clear, QuotaChange::Clear)
            };
            let r = admin.set_quota(path, names, bytes).await?;
            match (r.names, r.bytes) {
                (Some(n), Some(b)) => {
                    format!(
                        "{path}: quota set, {} names and {} bytes in use",
                        n.used, b.used
                    )
                }
                _ => format!("{path}: no quota"),
            }
        }
    })
}

/// After the heal, with every file closed: whether the use the master keeps for the
/// quota of `dir` equals what a walk of `dir` counts (names: every entry, `dir`
/// included; bytes: each file's length times its replication factor). Answers what
/// was compared, for the report, and the violation if they differ. No quota, or a
/// file still open (it counts its chunks whole, which a walk cannot see), is no
/// verdict.
pub async fn quota_use_check(
    admin: &Client,
    dir: &str,
) -> crate::Result<(String, Option<Violation>)> {
    let report = admin.quota(dir).await?;
    let (Some(names), Some(bytes)) = (report.names, report.bytes) else {
        return Ok((format!("{dir} has no quota: not compared"), None));
    };
    let (mut walked_names, mut walked_bytes) = (0u64, 0u64);
    let mut todo = vec![admin.stat(dir).await?];
    while let Some(e) = todo.pop() {
        walked_names += 1;
        match e.kind {
            FileKind::Directory => todo.extend(admin.list(&e.path).await?),
            FileKind::File if e.state != FileState::Closed => {
                return Ok((format!("{} is still open: not compared", e.path), None));
            }
            FileKind::File => {
                walked_bytes += e.length.saturating_mul(u64::from(e.replication));
            }
            FileKind::Symlink => {}
        }
    }
    let kept = format!("{} names and {} bytes", names.used, bytes.used);
    if (names.used, bytes.used) == (walked_names, walked_bytes) {
        return Ok((
            format!("the use of {dir}'s quota, {kept}, equals a walk"),
            None,
        ));
    }
    let message = format!(
        "the quota of {dir} counts {kept} in use; a walk finds {walked_names} and {walked_bytes}"
    );
    Ok((
        message.clone(),
        Some(Violation {
            kind: ViolationKind::QuotaUse,
            file: None,
            offset: None,
            session: None,
            seq: None,
            message,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_come_every_few_seconds_and_everything_is_undone() {
        let files = vec!["/n/a".to_string(), "/n/b".to_string()];
        let mut c = Churn::new(7, files, 3, 4);
        assert_eq!(c.next(Duration::from_secs(1)), None, "not due yet");
        let mut acts = Vec::new();
        for s in 1..200u64 {
            if let Some(a) = c.next(Duration::from_secs(3 * s)) {
                acts.push(a);
            }
        }
        assert_eq!(acts.len(), 199);
        assert!(
            acts.iter().all(|a| a.name() != "admin_quota"),
            "the quota is the run's, never churned"
        );
        // Safe mode never lasts past the next action; at most one drained at a time.
        for w in acts.windows(2) {
            if w[0] == (Act::SafeMode { enter: true }) {
                assert_eq!(w[1], Act::SafeMode { enter: false });
            }
        }
        let mut drained = 0i32;
        for a in &acts {
            match a {
                Act::Decommission { on: true, .. } => drained += 1,
                Act::Decommission { on: false, .. } => drained -= 1,
                Act::SetRep { replication, .. } => assert!((2..=3).contains(replication)),
                _ => {}
            }
            assert!((0..=1).contains(&drained));
        }
        for kind in [
            "admin_setrep",
            "admin_balance",
            "admin_decommission",
            "admin_safemode",
        ] {
            assert!(acts.iter().any(|a| a.name() == kind), "{kind}");
        }
        let undo = c.undo();
        assert_eq!(undo[0], Act::SafeMode { enter: false });
        assert_eq!(undo[1], Act::Balance { start: false });
        assert!(undo.contains(&Act::SetRep {
            path: "/n/a".into(),
            replication: 3
        }));
    }
}
