//! The fault schedule of one run: pure, a function of the seed and the cluster's shape.
//!
//! [`plan`] draws [`Fault`]s one after another (a random gap, a kind, a target, how
//! long it lasts) under three rules: a process has at most one fault of its own at a
//! time; the network has at most one partition ([`Cut`]) at a time; and at most one
//! chunkserver is *impaired* at any moment (killed, stopped, its disk full, or cut off
//! from the master or from other chunkservers, see [`Cut::impaired_chunkservers`]), so
//! with replication 3 on 4 chunkservers the cluster stays writable. Faults on different
//! processes overlap freely (the master partitioned away while a client is frozen and a
//! chunkserver is killed: the combinations are the point). Every fault ends within the
//! run's duration. [`steps`] turns the faults into the timeline the run carries out.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

/// The most members of a master group a run has.
pub const MAX_MASTERS: usize = 5;

/// A process of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Target {
    /// Member `i` of the master group (0 the only master of a run without a group).
    Master(usize),
    Chunkserver(usize),
    Client(usize),
    /// The network between processes (the target of a partition).
    Network,
}

impl Target {
    /// This process's bit in a [`Group`] (`None` for [`Target::Network`]).
    fn bit(self) -> Option<u32> {
        match self {
            Target::Master(i) if i < MAX_MASTERS => Some(i as u32),
            Target::Chunkserver(i) if i < 32 - MAX_MASTERS => Some((MAX_MASTERS + i) as u32),
            Target::Client(i) if i < 32 => Some(32 + i as u32),
            _ => None,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Master(0) => write!(f, "master"),
            Target::Master(i) => write!(f, "master{}", i + 1),
            Target::Chunkserver(i) => write!(f, "cs{i}"),
            Target::Client(i) => write!(f, "client{i}"),
            Target::Network => write!(f, "network"),
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
    /// Traffic between two groups of processes dropped (both ways, silently).
    Partition,
    /// A chunkserver's data file system filled to the last byte.
    FillDisk,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::KillChunkserver,
        FaultKind::KillMaster,
        FaultKind::KillClient,
        FaultKind::StopChunkserver,
        FaultKind::StopMaster,
        FaultKind::StopClient,
        FaultKind::FreezeClientPastHardLease,
        FaultKind::Partition,
        FaultKind::FillDisk,
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
            FaultKind::Partition => "partition",
            FaultKind::FillDisk => "fill_disk",
        }
    }

    /// SIGKILL (then restart) rather than SIGSTOP (then SIGCONT).
    pub fn is_kill(self) -> bool {
        matches!(
            self,
            FaultKind::KillChunkserver | FaultKind::KillMaster | FaultKind::KillClient
        )
    }

    /// How often the kind is drawn, relative to the others (0: never, because the run
    /// cannot inject it).
    fn weight(self, cfg: &ScheduleConfig) -> u32 {
        match self {
            FaultKind::Partition if !cfg.partitions => 0,
            FaultKind::FillDisk if !cfg.disk_faults => 0,
            FaultKind::Partition => 4,
            FaultKind::FillDisk => 2,
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

/// A set of processes, as a bit set (see `Target::bit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Group(pub u64);

impl Group {
    /// The group of `members`.
    pub fn of(members: &[Target]) -> Group {
        let mut g = Group(0);
        for &m in members {
            g.insert(m);
        }
        g
    }

    pub fn insert(&mut self, t: Target) {
        if let Some(b) = t.bit() {
            self.0 |= 1 << b;
        }
    }

    pub fn contains(self, t: Target) -> bool {
        t.bit().is_some_and(|b| self.0 & (1 << b) != 0)
    }

    /// The members, masters first, then chunkservers, then clients.
    pub fn members(self) -> Vec<Target> {
        (0..64u32)
            .filter(|b| self.0 & (1 << b) != 0)
            .map(|b| match b as usize {
                b if b < MAX_MASTERS => Target::Master(b),
                b if b < 32 => Target::Chunkserver(b - MAX_MASTERS),
                b => Target::Client(b - 32),
            })
            .collect()
    }

    fn chunkservers(self) -> usize {
        self.members()
            .iter()
            .filter(|t| matches!(t, Target::Chunkserver(_)))
            .count()
    }

    fn masters(self) -> usize {
        self.members()
            .iter()
            .filter(|t| matches!(t, Target::Master(_)))
            .count()
    }
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.members().iter().map(|t| t.to_string()).collect();
        write!(f, "{{{}}}", names.join(","))
    }
}

/// A network partition: no packet from a member of `a` reaches a member of `b`, and no
/// packet from `b` reaches `a`. Processes in neither group talk to everyone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    pub a: Group,
    pub b: Group,
}

impl Cut {
    /// How many chunkservers the cut takes out of the cluster's write path: those on the
    /// side away from the master (of a group of `masters`: the side with most of its
    /// members, where the leader ends up), or, when no side has more members than the
    /// other, the smaller side's (a chunkserver cut from another cannot be in one
    /// pipeline with it). A cut that leaves the master no chunkserver at all counts as
    /// 0: it is a master outage (nobody can write), like stopping the master, not a
    /// loss of replicas.
    pub fn impaired_chunkservers(&self, chunkservers: usize) -> usize {
        let (a, b) = (self.a.chunkservers(), self.b.chunkservers());
        let (ma, mb) = (self.a.masters(), self.b.masters());
        if ma != mb {
            let (master_side, away) = if ma > mb { (a, b) } else { (b, a) };
            // Chunkservers in neither group still reach the master.
            let with_master = master_side + (chunkservers - a - b);
            if with_master == 0 {
                0
            } else {
                away
            }
        } else {
            a.min(b)
        }
    }

    /// How many members of a master group of `masters` the cut takes from the others:
    /// the smaller side's, when both sides hold members (members in neither group
    /// reach everyone). A cut with the members on one side only leaves them together.
    pub fn impaired_masters(&self) -> usize {
        let (ma, mb) = (self.a.masters(), self.b.masters());
        if ma > 0 && mb > 0 {
            ma.min(mb)
        } else {
            0
        }
    }
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} | {}", self.a, self.b)
    }
}

/// One fault: from `at`, for `hold`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub at: Duration,
    pub hold: Duration,
    pub kind: FaultKind,
    pub target: Target,
    /// The partition of a [`FaultKind::Partition`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
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
    /// Members of the master group (1: a single master).
    pub masters: usize,
    pub chunkservers: usize,
    pub clients: usize,
    /// The master's hard lease limit: a [`FaultKind::FreezeClientPastHardLease`] lasts
    /// longer than this.
    pub lease_hard: Duration,
    /// The run can partition the network (every process in its own namespace).
    pub partitions: bool,
    /// The run can fill a chunkserver's disk (its data dir is a small file system).
    pub disk_faults: bool,
}

fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.gen_range(lo..=hi))
}

fn draw_kind(rng: &mut StdRng, cfg: &ScheduleConfig) -> FaultKind {
    let total: u32 = FaultKind::ALL.iter().map(|k| k.weight(cfg)).sum();
    let mut x = rng.gen_range(0..total);
    for k in FaultKind::ALL {
        if x < k.weight(cfg) {
            return k;
        }
        x -= k.weight(cfg);
    }
    FaultKind::KillClient
}

/// A random partition of the run's processes: one process isolated from all others,
/// two halves, or one pair of processes cut from each other.
fn draw_cut(rng: &mut StdRng, cfg: &ScheduleConfig) -> Cut {
    let mut all: Vec<Target> = (0..cfg.masters.max(1)).map(Target::Master).collect();
    all.extend((0..cfg.chunkservers).map(Target::Chunkserver));
    all.extend((0..cfg.clients).map(Target::Client));
    let pick = |rng: &mut StdRng, from: &[Target]| from[rng.gen_range(0..from.len())];
    match rng.gen_range(0..3) {
        0 => {
            let x = pick(rng, &all);
            let rest: Vec<Target> = all.iter().copied().filter(|&t| t != x).collect();
            Cut {
                a: Group::of(&[x]),
                b: Group::of(&rest),
            }
        }
        1 => {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for &t in &all {
                if rng.gen_bool(0.5) {
                    a.push(t)
                } else {
                    b.push(t)
                }
            }
            if a.is_empty() {
                a.push(b.remove(0));
            } else if b.is_empty() {
                b.push(a.remove(0));
            }
            Cut {
                a: Group::of(&a),
                b: Group::of(&b),
            }
        }
        _ => {
            let x = pick(rng, &all);
            let rest: Vec<Target> = all.iter().copied().filter(|&t| t != x).collect();
            let y = pick(rng, &rest);
            Cut {
                a: Group::of(&[x]),
                b: Group::of(&[y]),
            }
        }
    }
}

/// The faults of the run with `seed`, in start order.
pub fn plan(seed: u64, cfg: ScheduleConfig) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let mut busy_until: HashMap<Target, Duration> = HashMap::new();
    // The one chunkserver that may be impaired at a time, by whatever fault.
    let mut chunkserver_busy_until = Duration::ZERO;
    // Likewise the one member of a master group (a group of 3 or 5 keeps a quorum).
    let mut master_busy_until = Duration::ZERO;
    let mut t = ms(&mut rng, 300, 1000);
    while t < cfg.duration {
        let kind = draw_kind(&mut rng, &cfg);
        let mut cut = None;
        let target = match kind {
            // A run without a group draws no number here: its plans stay as they were.
            FaultKind::KillMaster | FaultKind::StopMaster if cfg.masters > 1 => {
                Target::Master(rng.gen_range(0..cfg.masters))
            }
            FaultKind::KillMaster | FaultKind::StopMaster => Target::Master(0),
            FaultKind::KillChunkserver | FaultKind::StopChunkserver | FaultKind::FillDisk => {
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
            FaultKind::Partition => {
                cut = Some(draw_cut(&mut rng, &cfg));
                Target::Network
            }
        };
        let hold = match kind {
            FaultKind::FreezeClientPastHardLease => cfg.lease_hard + ms(&mut rng, 1000, 2500),
            FaultKind::KillMaster | FaultKind::StopMaster => ms(&mut rng, 300, 2500),
            FaultKind::Partition => ms(&mut rng, 500, 4000),
            _ => ms(&mut rng, 300, 3000),
        };
        let impaired = match (target, cut) {
            (_, Some(c)) => c.impaired_chunkservers(cfg.chunkservers),
            (Target::Chunkserver(_), None) => 1,
            _ => 0,
        };
        let members = match (target, cut) {
            (_, Some(c)) => c.impaired_masters(),
            (Target::Master(_), None) => 1,
            _ => 0,
        };
        let free = busy_until.get(&target).is_none_or(|&u| u <= t);
        let chunkserver_free = impaired == 0 || (impaired == 1 && chunkserver_busy_until <= t);
        let master_free = members == 0 || (members == 1 && master_busy_until <= t);
        if free && chunkserver_free && master_free && t + hold <= cfg.duration {
            faults.push(Fault {
                at: t,
                hold,
                kind,
                target,
                cut,
            });
            busy_until.insert(target, t + hold);
            if impaired > 0 {
                chunkserver_busy_until = t + hold;
            }
            if members > 0 {
                master_busy_until = t + hold;
            }
            t += ms(&mut rng, 200, 1200);
        } else {
            t += Duration::from_millis(100);
        }
    }
    faults
}

/// What the run does at a step.
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
    /// Drop the traffic of the step's cut.
    Partition,
    /// Let all traffic through again.
    HealNetwork,
    /// Fill the chunkserver's file system.
    FillDisk,
    /// Free what the fill took.
    FreeDisk,
}

impl Action {
    /// True for the step that starts a fault (false: it heals one).
    pub fn starts_fault(self) -> bool {
        matches!(
            self,
            Action::Kill | Action::Stop | Action::Partition | Action::FillDisk
        )
    }
}

/// One entry of the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub at: Duration,
    pub target: Target,
    pub action: Action,
    /// The fault this step starts or heals.
    pub kind: FaultKind,
    /// The partition a [`Action::Partition`] makes.
    pub cut: Option<Cut>,
}

/// The timeline of `faults`, by time; at the same instant heals come first.
pub fn steps(faults: &[Fault]) -> Vec<Step> {
    let mut out = Vec::with_capacity(faults.len() * 2);
    for f in faults {
        let (start, heal) = match f.kind {
            FaultKind::Partition => (Action::Partition, Action::HealNetwork),
            FaultKind::FillDisk => (Action::FillDisk, Action::FreeDisk),
            k if k.is_kill() => (Action::Kill, Action::Restart),
            _ => (Action::Stop, Action::Cont),
        };
        out.push(Step {
            at: f.at,
            target: f.target,
            action: start,
            kind: f.kind,
            cut: f.cut,
        });
        out.push(Step {
            at: f.end(),
            target: f.target,
            action: heal,
            kind: f.kind,
            cut: None,
        });
    }
    let heals_first = |a: Action| u8::from(a.starts_fault());
    out.sort_by_key(|s| (s.at, heals_first(s.action)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(secs: u64) -> ScheduleConfig {
        ScheduleConfig {
            duration: Duration::from_secs(secs),
            masters: 1,
            chunkservers: 4,
            clients: 3,
            lease_hard: Duration::from_secs(3),
            partitions: true,
            disk_faults: true,
        }
    }

    /// The chunkservers a fault takes out of the write path.
    fn impaired(f: &Fault) -> usize {
        match (f.target, f.cut) {
            (_, Some(c)) => c.impaired_chunkservers(4),
            (Target::Chunkserver(_), None) => 1,
            _ => 0,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_plan_and_another_seed_another() {
        assert_eq!(plan(7, cfg(30)), plan(7, cfg(30)));
        assert_ne!(plan(7, cfg(30)), plan(8, cfg(30)));
    }

    #[test]
    fn at_most_one_chunkserver_is_impaired_at_any_time() {
        for seed in 0..200 {
            let p = plan(seed, cfg(30));
            assert!(p.iter().all(|f| impaired(f) <= 1), "seed {seed}");
            let cs: Vec<&Fault> = p.iter().filter(|f| impaired(f) == 1).collect();
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
                a if a.starts_fault() => {
                    assert!(!*d, "{step:?} while already faulted");
                    assert_eq!(step.cut.is_some(), a == Action::Partition, "{step:?}");
                    *d = true;
                }
                _ => {
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
            cut: None,
        };
        let b = Fault {
            at: Duration::from_secs(2),
            hold: Duration::from_secs(1),
            kind: FaultKind::KillChunkserver,
            target: Target::Chunkserver(1),
            cut: None,
        };
        let s = steps(&[a, b]);
        assert_eq!(s[1].action, Action::Cont);
        assert_eq!(s[2].action, Action::Kill);
    }

    #[test]
    fn a_run_without_namespaces_or_small_disks_draws_neither_fault() {
        let c = ScheduleConfig {
            partitions: false,
            disk_faults: false,
            ..cfg(30)
        };
        let kinds: std::collections::HashSet<FaultKind> =
            (0..50).flat_map(|s| plan(s, c)).map(|f| f.kind).collect();
        assert!(!kinds.contains(&FaultKind::Partition));
        assert!(!kinds.contains(&FaultKind::FillDisk));
    }

    #[test]
    fn partitions_have_two_disjoint_nonempty_groups_of_real_processes() {
        let cuts: Vec<Cut> = (0..100)
            .flat_map(|s| plan(s, cfg(30)))
            .filter_map(|f| f.cut)
            .collect();
        assert!(cuts.len() > 50);
        for c in cuts {
            assert!(c.a.0 != 0 && c.b.0 != 0, "{c}");
            assert_eq!(c.a.0 & c.b.0, 0, "{c}");
            for t in c.a.members().into_iter().chain(c.b.members()) {
                match t {
                    Target::Chunkserver(i) => assert!(i < 4),
                    Target::Client(i) => assert!(i < 3),
                    Target::Master(_) => {}
                    Target::Network => panic!("{c}"),
                }
            }
        }
    }

    #[test]
    fn impaired_chunkservers_counts_those_cut_from_the_master_or_from_each_other() {
        let cs = Target::Chunkserver;
        let cut = |a: &[Target], b: &[Target]| Cut {
            a: Group::of(a),
            b: Group::of(b),
        };
        // One chunkserver isolated.
        let everyone_else = [Target::Master(0), cs(1), cs(2), cs(3), Target::Client(0)];
        assert_eq!(cut(&[cs(0)], &everyone_else).impaired_chunkservers(4), 1);
        // The master isolated: an outage of the master, no replica lost.
        assert_eq!(
            cut(&[Target::Master(0)], &[cs(0), cs(1), cs(2), cs(3)]).impaired_chunkservers(4),
            0
        );
        // Halves: two chunkservers away from the master.
        assert_eq!(
            cut(&[Target::Master(0), cs(0), cs(1)], &[cs(2), cs(3)]).impaired_chunkservers(4),
            2
        );
        // A pair of chunkservers cut from each other: one of them is out of the pipelines.
        assert_eq!(cut(&[cs(1)], &[cs(2)]).impaired_chunkservers(4), 1);
        // A client cut from a chunkserver, or from the master: no chunkserver impaired.
        assert_eq!(
            cut(&[Target::Client(0)], &[cs(2)]).impaired_chunkservers(4),
            0
        );
        assert_eq!(
            cut(&[Target::Client(0)], &[Target::Master(0)]).impaired_chunkservers(4),
            0
        );
        // The master with one chunkserver, cut from a client only: the others still
        // reach the master.
        assert_eq!(
            cut(&[Target::Master(0), cs(0)], &[Target::Client(1)]).impaired_chunkservers(4),
            0
        );
    }

    #[test]
    fn a_group_of_masters_loses_at_most_one_member_at_a_time_and_every_member_is_hit() {
        let group = |secs| ScheduleConfig {
            masters: 3,
            ..cfg(secs)
        };
        let mut hit = std::collections::HashSet::new();
        let mut split = 0;
        for seed in 0..200 {
            let p = plan(seed, group(30));
            let members = |f: &Fault| match (f.target, f.cut) {
                (_, Some(c)) => c.impaired_masters(),
                (Target::Master(_), None) => 1,
                _ => 0,
            };
            assert!(p.iter().all(|f| members(f) <= 1), "seed {seed}");
            let out: Vec<&Fault> = p.iter().filter(|f| members(f) == 1).collect();
            for w in out.windows(2) {
                assert!(
                    w[0].end() <= w[1].at,
                    "seed {seed}: {:?} overlaps {:?}",
                    w[0],
                    w[1]
                );
            }
            for f in &p {
                if let Target::Master(i) = f.target {
                    assert!(i < 3, "{f:?}");
                    hit.insert(i);
                }
                split += usize::from(f.cut.is_some_and(|c| c.impaired_masters() == 1));
            }
        }
        assert_eq!(
            hit.len(),
            3,
            "every member is killed or stopped in some run"
        );
        assert!(split > 0, "some partition cuts a member from the others");
        // A run without a group plans exactly as before: the same seed, the same faults.
        assert!(plan(5, cfg(30))
            .iter()
            .all(|f| !matches!(f.target, Target::Master(i) if i > 0)));
    }

    #[test]
    fn the_side_with_most_members_is_the_masters_side() {
        let (m, cs) = (Target::Master, Target::Chunkserver);
        let cut = |a: &[Target], b: &[Target]| Cut {
            a: Group::of(a),
            b: Group::of(b),
        };
        // One member cut off with a chunkserver: that chunkserver is away from the leader.
        let c = cut(&[m(0), cs(0)], &[m(1), m(2), cs(1), cs(2), cs(3)]);
        assert_eq!((c.impaired_masters(), c.impaired_chunkservers(4)), (1, 1));
        // Members on one side only: none cut from the others.
        let c = cut(&[m(0), m(1), m(2)], &[Target::Client(0)]);
        assert_eq!(c.impaired_masters(), 0);
        assert_eq!(
            Group::of(&[m(2), cs(0), m(0)]).to_string(),
            "{master,master3,cs0}"
        );
    }

    #[test]
    fn a_group_lists_its_members_and_prints_them() {
        let g = Group::of(&[Target::Client(2), Target::Master(0), Target::Chunkserver(3)]);
        assert_eq!(
            g.members(),
            vec![Target::Master(0), Target::Chunkserver(3), Target::Client(2)]
        );
        assert!(g.contains(Target::Chunkserver(3)) && !g.contains(Target::Chunkserver(0)));
        assert_eq!(g.to_string(), "{master,cs3,client2}");
    }
}
