//! The fault schedule of one run: pure, a function of the seed and the cluster's shape.
//!
//! [`plan`] draws [`Fault`]s one after another (a random gap, a kind, a target, how
//! long it lasts) under two rules: a process has at most one fault at a time, and at
//! most one chunkserver is down or stopped at any moment, so with replication 3 on 4
//! chunkservers the cluster stays writable. Faults on different processes overlap
//! freely (the master down while a client is frozen and a chunkserver is killed: the
//! combinations are the point). Every fault ends within the run's duration.
//! [`steps`] turns the faults into the timeline of signals the run sends.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

/// A process of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Target {
    Master,
    Chunkserver(usize),
    Client(usize),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Master => write!(f, "master"),
            Target::Chunkserver(i) => write!(f, "cs{i}"),
            Target::Client(i) => write!(f, "client{i}"),
        }
    }
}

/// What happens to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    KillChunkserver,
    KillMaster,
    KillClient,
    StopChunkserver,
    StopMaster,
    StopClient,
    /// A client SIGSTOPped for longer than the hard lease limit: its lease is recovered
    /// while it sleeps, and it must be fenced when it wakes.
    FreezeClientPastHardLease,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 7] = [
        FaultKind::KillChunkserver,
        FaultKind::KillMaster,
        FaultKind::KillClient,
        FaultKind::StopChunkserver,
        FaultKind::StopMaster,
        FaultKind::StopClient,
        FaultKind::FreezeClientPastHardLease,
    ];

    /// The report's name of the kind.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillChunkserver => "kill_chunkserver",
            FaultKind::KillMaster => "kill_master",
            FaultKind::KillClient => "kill_client",
            FaultKind::StopChunkserver => "stop_chunkserver",
            FaultKind::StopMaster => "stop_master",
            FaultKind::StopClient => "stop_client",
            FaultKind::FreezeClientPastHardLease => "freeze_client_past_hard_lease",
        }
    }

    /// SIGKILL (then restart) rather than SIGSTOP (then SIGCONT).
    pub fn is_kill(self) -> bool {
        matches!(
            self,
            FaultKind::KillChunkserver | FaultKind::KillMaster | FaultKind::KillClient
        )
    }

    /// How often the kind is drawn, relative to the others.
    fn weight(self) -> u32 {
        match self {
            FaultKind::KillChunkserver => 3,
            FaultKind::KillMaster => 2,
            FaultKind::KillClient => 3,
            FaultKind::StopChunkserver => 3,
            FaultKind::StopMaster => 2,
            FaultKind::StopClient => 2,
            FaultKind::FreezeClientPastHardLease => 2,
        }
    }
}

/// One fault: from `at`, for `hold`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub at: Duration,
    pub hold: Duration,
    pub kind: FaultKind,
    pub target: Target,
}

impl Fault {
    /// When the fault is healed.
    pub fn end(&self) -> Duration {
        self.at + self.hold
    }
}

/// The shape of the cluster and the run.
#[derive(Clone, Copy, Debug)]
pub struct ScheduleConfig {
    pub duration: Duration,
    pub chunkservers: usize,
    pub clients: usize,
    /// The master's hard lease limit: a [`FaultKind::FreezeClientPastHardLease`] lasts
    /// longer than this.
    pub lease_hard: Duration,
}

fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.gen_range(lo..=hi))
}

fn draw_kind(rng: &mut StdRng) -> FaultKind {
    let total: u32 = FaultKind::ALL.iter().map(|k| k.weight()).sum();
    let mut x = rng.gen_range(0..total);
    for k in FaultKind::ALL {
        if x < k.weight() {
            return k;
        }
        x -= k.weight();
    }
    FaultKind::KillClient
}

/// The faults of the run with `seed`, in start order.
pub fn plan(seed: u64, cfg: ScheduleConfig) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let mut busy_until: HashMap<Target, Duration> = HashMap::new();
    let mut chunkserver_busy_until = Duration::ZERO;
    let mut t = ms(&mut rng, 300, 1000);
    while t < cfg.duration {
        let kind = draw_kind(&mut rng);
        let target = match kind {
            FaultKind::KillMaster | FaultKind::StopMaster => Target::Master,
            FaultKind::KillChunkserver | FaultKind::StopChunkserver => {
                if cfg.chunkservers == 0 {
                    t += Duration::from_millis(100);
                    continue;
                }
                Target::Chunkserver(rng.gen_range(0..cfg.chunkservers))
            }
            FaultKind::KillClient
            | FaultKind::StopClient
            | FaultKind::FreezeClientPastHardLease => {
                if cfg.clients == 0 {
                    t += Duration::from_millis(100);
                    continue;
                }
                Target::Client(rng.gen_range(0..cfg.clients))
            }
        };
        let hold = match kind {
            FaultKind::FreezeClientPastHardLease => cfg.lease_hard + ms(&mut rng, 1000, 2500),
            FaultKind::KillMaster | FaultKind::StopMaster => ms(&mut rng, 300, 2500),
            _ => ms(&mut rng, 300, 3000),
        };
        let free = busy_until.get(&target).is_none_or(|&u| u <= t);
        let chunkserver_free =
            !matches!(target, Target::Chunkserver(_)) || chunkserver_busy_until <= t;
        if free && chunkserver_free && t + hold <= cfg.duration {
            faults.push(Fault {
                at: t,
                hold,
                kind,
                target,
            });
            busy_until.insert(target, t + hold);
            if matches!(target, Target::Chunkserver(_)) {
                chunkserver_busy_until = t + hold;
            }
            t += ms(&mut rng, 200, 1200);
        } else {
            t += Duration::from_millis(100);
        }
    }
    faults
}

/// A signal the run sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// SIGKILL (and reap).
    Kill,
    /// Start the killed process again (a client: a new incarnation).
    Restart,
    /// SIGSTOP.
    Stop,
    /// SIGCONT.
    Cont,
}

/// One entry of the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub at: Duration,
    pub target: Target,
    pub action: Action,
    /// The fault this step starts or heals.
    pub kind: FaultKind,
}

/// The timeline of `faults`, by time; at the same instant heals come first.
pub fn steps(faults: &[Fault]) -> Vec<Step> {
    let mut out = Vec::with_capacity(faults.len() * 2);
    for f in faults {
        let (start, heal) = if f.kind.is_kill() {
            (Action::Kill, Action::Restart)
        } else {
            (Action::Stop, Action::Cont)
        };
        out.push(Step {
            at: f.at,
            target: f.target,
            action: start,
            kind: f.kind,
        });
        out.push(Step {
            at: f.end(),
            target: f.target,
            action: heal,
            kind: f.kind,
        });
    }
    let heals_first = |a: Action| u8::from(matches!(a, Action::Kill | Action::Stop));
    out.sort_by_key(|s| (s.at, heals_first(s.action)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(secs: u64) -> ScheduleConfig {
        ScheduleConfig {
            duration: Duration::from_secs(secs),
            chunkservers: 4,
            clients: 3,
            lease_hard: Duration::from_secs(3),
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_plan_and_another_seed_another() {
        assert_eq!(plan(7, cfg(30)), plan(7, cfg(30)));
        assert_ne!(plan(7, cfg(30)), plan(8, cfg(30)));
    }

    #[test]
    fn at_most_one_chunkserver_is_down_or_stopped_at_any_time() {
        for seed in 0..200 {
            let p = plan(seed, cfg(30));
            let cs: Vec<&Fault> = p
                .iter()
                .filter(|f| matches!(f.target, Target::Chunkserver(_)))
                .collect();
            for w in cs.windows(2) {
                assert!(
                    w[0].end() <= w[1].at,
                    "seed {seed}: {:?} overlaps {:?}",
                    w[0],
                    w[1]
                );
            }
        }
    }

    #[test]
    fn a_process_has_one_fault_at_a_time_and_every_fault_ends_in_the_run() {
        for seed in 0..200 {
            let p = plan(seed, cfg(20));
            let mut last_end: HashMap<Target, Duration> = HashMap::new();
            for f in &p {
                assert!(f.end() <= Duration::from_secs(20), "seed {seed}: {f:?}");
                if let Some(&e) = last_end.get(&f.target) {
                    assert!(e <= f.at, "seed {seed}: {f:?} overlaps the previous fault");
                }
                last_end.insert(f.target, f.end());
            }
        }
    }

    #[test]
    fn a_frozen_client_sleeps_past_the_hard_lease_limit() {
        let frozen: Vec<Fault> = (0..50)
            .flat_map(|s| plan(s, cfg(30)))
            .filter(|f| f.kind == FaultKind::FreezeClientPastHardLease)
            .collect();
        assert!(!frozen.is_empty());
        assert!(frozen
            .iter()
            .all(|f| f.hold > Duration::from_secs(3) && matches!(f.target, Target::Client(_))));
    }

    #[test]
    fn every_kind_is_drawn_over_a_few_seeds() {
        let drawn: std::collections::HashSet<FaultKind> = (0..20)
            .flat_map(|s| plan(s, cfg(30)))
            .map(|f| f.kind)
            .collect();
        for k in FaultKind::ALL {
            assert!(drawn.contains(&k), "{k:?} never drawn");
        }
    }

    #[test]
    fn a_short_run_still_gets_several_faults() {
        for seed in 0..50 {
            assert!(plan(seed, cfg(15)).len() >= 4, "seed {seed}");
        }
    }

    #[test]
    fn steps_start_and_heal_every_fault_in_time_order() {
        let p = plan(3, cfg(30));
        let s = steps(&p);
        assert_eq!(s.len(), 2 * p.len());
        assert!(s.windows(2).all(|w| w[0].at <= w[1].at));
        // Per target the actions alternate start, heal, start, heal.
        let mut down: HashMap<Target, bool> = HashMap::new();
        for step in &s {
            let d = down.entry(step.target).or_default();
            match step.action {
                Action::Kill | Action::Stop => {
                    assert!(!*d, "{step:?} while already faulted");
                    *d = true;
                }
                Action::Restart | Action::Cont => {
                    assert!(*d, "{step:?} heals nothing");
                    *d = false;
                }
            }
        }
        assert!(down.values().all(|d| !d));
    }

    #[test]
    fn a_heal_at_the_same_instant_as_a_new_fault_comes_first() {
        let a = Fault {
            at: Duration::from_secs(1),
            hold: Duration::from_secs(1),
            kind: FaultKind::StopChunkserver,
            target: Target::Chunkserver(0),
        };
        let b = Fault {
            at: Duration::from_secs(2),
            hold: Duration::from_secs(1),
            kind: FaultKind::KillChunkserver,
            target: Target::Chunkserver(1),
        };
        let s = steps(&[a, b]);
        assert_eq!(s[1].action, Action::Cont);
        assert_eq!(s[2].action, Action::Kill);
    }
}
