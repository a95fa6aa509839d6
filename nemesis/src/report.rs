//! What a run found, as the CLI prints it and `--json` writes it.

use crate::checker::Violation;
use crate::schedule::Fault;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    pub seed: u64,
    pub duration_ms: u64,
    pub clients: usize,
    /// Of the clients, those writing through a FUSE mount.
    #[serde(default)]
    pub mount_clients: usize,
    pub chunkservers: usize,
    /// Masters: 1, or the members of a master group.
    #[serde(default = "one")]
    pub masters: usize,
    /// Times a member of the master group took the lead (the first election included;
    /// 0 without a group).
    #[serde(default)]
    pub leaderships: u64,
    /// Loopback or a namespace per process (only the latter partitions).
    pub net: crate::net::NetMode,
    /// Chunkservers on small file systems (only then are disks filled).
    pub small_disks: bool,
    /// Crash points armed in the servers.
    #[serde(default)]
    pub crash_points: bool,
    /// How late the latest step of the schedule was carried out (each step waits for
    /// the one before it, e.g. a restart for its server to listen).
    #[serde(default)]
    pub max_step_lag_ms: u64,
    /// Faults injected, by kind name (`kill_master`, ...).
    pub faults: BTreeMap<String, u64>,
    /// The fault schedule, for reproducing.
    pub schedule: Vec<Fault>,
    pub sessions: u64,
    pub fenced_sessions: u64,
    pub acknowledged_records: u64,
    /// Acknowledged overwrites of the slot file's slots (of `slot_writes` attempted).
    #[serde(default)]
    pub acknowledged_overwrites: u64,
    #[serde(default)]
    pub slot_writes: u64,
    pub reads_checked: u64,
    /// Final length of each shared file.
    pub file_lengths: BTreeMap<u32, u64>,
    pub fsck_healthy: bool,
    /// Client processes that exited without being killed (restarted), with status.
    pub unexpected_exits: Vec<String>,
    /// With `--admin`: what the comparison of the run directory's quota use with a
    /// walk found.
    #[serde(default)]
    pub quota_check: Option<String>,
    pub violations: Vec<Violation>,
    /// The kept data dir and logs (always for a failing run).
    pub dir: Option<PathBuf>,
}

fn one() -> usize {
    1
}

impl RunReport {
    /// Faults injected in all.
    pub fn total_faults(&self) -> u64 {
        self.faults.values().sum()
    }

    /// True when nothing was violated.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// One paragraph for a person.
    pub fn summary(&self) -> String {
        let faults = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut s = format!(
            "seed {}: {} faults ({faults}); {} sessions ({} fenced), {} acknowledged records, \
             {} acknowledged overwrites, {} reads checked, fsck {}; {} violations",
            self.seed,
            self.total_faults(),
            self.sessions,
            self.fenced_sessions,
            self.acknowledged_records,
            self.acknowledged_overwrites,
            self.reads_checked,
            if self.fsck_healthy {
                "healthy"
            } else {
                "UNHEALTHY"
            },
            self.violations.len()
        );
        if self.masters > 1 {
            s += &format!(
                "\n  master group of {}: a member took the lead {} times",
                self.masters, self.leaderships
            );
        }
        if self.max_step_lag_ms >= 1000 {
            s += &format!(
                "\n  note: the schedule ran up to {:.1} s late",
                self.max_step_lag_ms as f64 / 1000.0
            );
        }
        if let Some(q) = &self.quota_check {
            s += &format!("\n  quota: {q}");
        }
        for note in &self.unexpected_exits {
            s += &format!("\n  note: {note}");
        }
        for v in self.violations.iter().take(20) {
            s += &format!("\n  {v}");
        }
        if self.violations.len() > 20 {
            s += &format!("\n  ... {} more", self.violations.len() - 20);
        }
        if let Some(d) = &self.dir {
            s += &format!("\n  data dir and logs kept in {}", d.display());
        }
        s
    }
}

/// Every run of one invocation.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub runs: Vec<RunReport>,
    /// Runs that found at least one violation.
    pub failed_runs: usize,
    pub violations: usize,
}

impl Report {
    /// Adds a run.
    pub fn push(&mut self, r: RunReport) {
        if !r.passed() {
            self.failed_runs += 1;
        }
        self.violations += r.violations.len();
        self.runs.push(r);
    }
}
