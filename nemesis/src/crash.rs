//! Crash points armed in the run's servers and library writers (a binary built with
//! the `fault-injection` feature; see `stampfs_proto::crash`).
//!
//! [`arming`] picks, from the run's seed, the points a process is started with
//! and their probabilities: pure, so a seed arms the same points. A point's
//! probability is scaled to how often it is hit (lease recovery and replica copies a
//! few times a run; version bumps on every append), so that a run crashes a server a
//! few times, not every second. A server that dies at one of them is seen by
//! [`crash_point_hit`] in its log, counted as an injected fault and started again; a
//! server that dies otherwise is a violation of its own. The heal restarts every
//! server without crash points, so the checks run on a quiet cluster. A library writer
//! (`nemesis-client`) that dies at one is counted and started again the same way; the
//! heal disarms the writers' later starts.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stampfs_proto::crash::{self, Process, CATALOGUE};

/// How likely one hit of `name` is to fire when it is armed: rare hits more.
fn weight(name: &str) -> f64 {
    if name.starts_with("recovery-") || name.starts_with("copy-") || name.starts_with("writer-") {
        // Rare: a few lease recoveries, replica copies and pipeline recoveries a run.
        0.3
    } else if name == "replica-bump-before-reply" {
        // Every bump on every chunkserver.
        0.01
    } else {
        // A bump of the master's: every append, pipeline update or new chunk.
        0.03
    }
}

/// The value of `STAMPFS_CRASH_POINTS` for the `incarnation`-th start of `process`
/// number `index` in the run with `seed`, and the seed of its draws; `None` when this
/// start arms nothing (about one start in three, so some runs crash little).
pub fn arming(
    seed: u64,
    process: Process,
    index: usize,
    incarnation: u64,
) -> Option<(String, u64)> {
    let tag = match process {
        Process::Master => 0u64,
        Process::Chunkserver => 1 + index as u64,
        Process::Client => 1000 + index as u64,
    };
    let mut rng = StdRng::seed_from_u64(seed ^ (tag << 40) ^ (incarnation << 56) ^ 0xC4A5_4000);
    if rng.gen_ratio(1, 3) {
        return None;
    }
    let points: Vec<&'static str> = CATALOGUE
        .iter()
        .filter(|p| p.process == process)
        .map(|p| p.name)
        .collect();
    let mut chosen: Vec<String> = Vec::new();
    for name in points {
        if rng.gen_ratio(1, 2) {
            chosen.push(format!("{name}={:.3}", weight(name)));
        }
    }
    if chosen.is_empty() {
        return None;
    }
    Some((chosen.join(","), rng.gen()))
}

/// The crash point a log (of one process start) says was hit, if any.
pub fn crash_point_hit(log: &str) -> Option<String> {
    log.lines().rev().find_map(|l| {
        let at = l.find("crash point ")?;
        let rest = &l[at + "crash point ".len()..];
        let name = rest.split_whitespace().next()?;
        crash::is_point(name).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn armings_are_valid_for_the_servers_and_a_function_of_the_seed() {
        let mut armed = 0;
        for seed in 0..100 {
            for (process, index) in [
                (Process::Master, 0),
                (Process::Chunkserver, 2),
                (Process::Client, 1),
            ] {
                let a = arming(seed, process, index, 1);
                assert_eq!(a, arming(seed, process, index, 1));
                if let Some((value, s)) = a {
                    armed += 1;
                    let parsed = crash::Arming::parse(&value, s).expect("a valid value");
                    for (name, p) in parsed.armed() {
                        let point = CATALOGUE.iter().find(|c| c.name == name).expect("known");
                        assert_eq!(point.process, process, "{name} armed in the wrong process");
                        assert!(p > 0.0 && p <= 0.3, "{name}={p}");
                    }
                }
            }
        }
        // Most starts arm something, some arm nothing.
        assert!(armed > 100 && armed < 250, "{armed} of 300 starts armed");
    }

    #[test]
    fn the_hit_point_is_read_from_the_log_line() {
        let log = "INFO ready\nERROR stampfs_proto::crash: crash point recovery-after-bump hit; killing the process\n";
        assert_eq!(crash_point_hit(log).as_deref(), Some("recovery-after-bump"));
        assert_eq!(crash_point_hit("INFO crash point nonsense hit\n"), None);
        assert_eq!(crash_point_hit("INFO all well\n"), None);
    }
}
