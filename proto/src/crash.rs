//! Crash points: places in the master and the chunkserver where a process may kill
//! itself on purpose, so that a test or the nemesis can crash a real server exactly
//! between two steps of a protocol (lease recovery, a version bump, a replica copy).
//!
//! **Compiled out by default.** [`crash_point!`](crate::crash_point) expands to nothing
//! unless this crate is built with the cargo feature `crash-points` (the root package's
//! `fault-injection` turns it on; production builds leave it off). [`CRASH_POINTS`]
//! says which build this is; [`CATALOGUE`] and [`POINTS`] list every point either way.
//!
//! **Armed from outside**, once, at server start-up ([`arm_from_env`]):
//!
//! ```text
//! STAMPFS_CRASH_POINTS = entry ("," entry)*        entry := NAME "=" P | "*" "=" P
//! STAMPFS_CRASH_SEED   = u64 (decimal)             P     := probability in [0, 1]
//! ```
//!
//! e.g. `STAMPFS_CRASH_POINTS="recovery-after-bump=0.2,copy-mid-stream=0.1"`. `*` sets
//! every point (a named entry overrides it, in any order); a name not in [`POINTS`], a
//! repeated name, or a probability outside `[0, 1]` is an error at start-up, as is the
//! variable set on a build without the feature. Unset or empty means nothing is armed.
//! Without a seed one is drawn at random; [`Arming`] reports it, so the server logs it.
//!
//! **Decided purely.** The `n`-th hit (from 0) of point `name` fires when
//! [`fires`]`(seed, name, n, p)`: a hash of the three, mapped to `[0, 1)`, below `p`.
//! So a given seed fires the same hits of each point whatever the interleaving of
//! threads and other points, and `p = 1` fires at the first hit.
//!
//! **Dies like SIGKILL.** A point that fires logs `crash point NAME hit` at error
//! level to stderr (written through before going on), then sends the process
//! `SIGKILL`: no destructor, no flush of any buffer, no clean shutdown.

/// Whether this build has crash points (cargo feature `crash-points`).
pub const CRASH_POINTS: bool = cfg!(feature = "crash-points");

/// The environment variable that arms crash points (see the module docs).
pub const ENV_POINTS: &str = "STAMPFS_CRASH_POINTS";
/// The environment variable holding the seed of the draws.
pub const ENV_SEED: &str = "STAMPFS_CRASH_SEED";

/// The process a crash point is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Process {
    Master,
    Chunkserver,
    /// A client library writer (armed by the processes that call [`arm_from_env`]:
    /// `stampfs nemesis-client` and test writer processes).
    Client,
}

/// One crash point: its name, the process it is in and where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub name: &'static str,
    pub process: Process,
    /// Where it sits: what has happened (and is durable) when it fires, and what not.
    pub what: &'static str,
}

const fn point(name: &'static str, process: Process, what: &'static str) -> Point {
    Point {
        name,
        process,
        what,
    }
}

/// Every crash point. DESIGN.md ("Fault injection") lists the same table.
#[rustfmt::skip]
pub const CATALOGUE: &[Point] = &[
    // Lease recovery (master/src/service/recovery.rs), beside its fail points.
    point("recovery-after-start", Process::Master,
          "lease recovery: RecoveryStarted (new version) is durable; no bump sent yet"),
    point("recovery-after-bump", Process::Master,
          "lease recovery: the replicas took the new version; none truncated or finalized"),
    point("recovery-after-kept-version", Process::Master,
          "lease recovery: the replicas differ; the version for the kept one is durable, no bump sent to it"),
    point("recovery-before-commit", Process::Master,
          "lease recovery: replicas truncated and finalized; RecoveryCommitted not logged"),
    // Version bumps of a write lease (master/src/service.rs).
    point("reopen-before-bump", Process::Master,
          "append of a closed file: the new version is durable; no bump sent yet"),
    point("reopen-after-bump", Process::Master,
          "append of a closed file: the bump was answered; GrantedPipeline not logged, no grant"),
    point("new-chunk-before-bump", Process::Master,
          "AddChunk: the new handle and version are durable; no bump sent yet"),
    point("new-chunk-after-bump", Process::Master,
          "AddChunk: the bump was answered; GrantedPipeline not logged, no grant"),
    point("open-chunk-before-bump", Process::Master,
          "OpenChunk: the version for the chunk moved to is durable; no bump sent yet"),
    point("pipeline-before-bump", Process::Master,
          "UpdatePipeline: the new version is durable; no bump sent to the survivors yet"),
    point("pipeline-after-bump", Process::Master,
          "UpdatePipeline: the bump was answered; GrantedPipeline not logged, no grant"),
    // The chunkserver's side of a bump (chunkserver/src/server.rs).
    point("replica-bump-before-reply", Process::Chunkserver,
          "BumpVersion: the new header is written and fsynced; the master has no answer"),
    // Re-replication (chunkserver/src/replication.rs, store.rs).
    point("copy-mid-stream", Process::Chunkserver,
          "copy source: about half of the packets sent (none of a one-packet replica), never the last"),
    point("copy-before-rename", Process::Chunkserver,
          "copy target: every byte received and the temp file sealed and fsynced; not renamed into place"),
    point("copy-before-ack", Process::Chunkserver,
          "copy target: the replica renamed into place and durable; the source has no answer"),
    // A writer's pipeline recovery (client/src/writer/runtime.rs, the engine's `Resend`).
    point("writer-reopen-before-resend", Process::Client,
          "pipeline recovery: the new stream is open at its start offset; no unacknowledged packet resent"),
    // A writer's shrink (client/src/writer/runtime.rs, the engine's `CutLastChunk`).
    point("writer-cut-before-setup", Process::Client,
          "shrink: the master lowered the committed length durably; no replica cut yet"),
];

const N: usize = CATALOGUE.len();

const NAMES: [&str; N] = {
    let mut names = [""; N];
    let mut i = 0;
    while i < N {
        names[i] = CATALOGUE[i].name;
        i += 1;
    }
    names
};

/// The name of every crash point, in [`CATALOGUE`] order.
pub const POINTS: &[&str] = &NAMES;

/// The names of the crash points in `process`.
pub fn points_of(process: Process) -> impl Iterator<Item = &'static str> {
    CATALOGUE
        .iter()
        .filter(move |p| p.process == process)
        .map(|p| p.name)
}

/// The position of `name` in [`POINTS`] (usable in constants: the macro checks its
/// name at compile time with it).
pub const fn index_of(name: &str) -> Option<usize> {
    let mut i = 0;
    while i < N {
        if str_eq(NAMES[i], name) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Whether `name` is a crash point.
pub const fn is_point(name: &str) -> bool {
    index_of(name).is_some()
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Why the crash point variables could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "{var} is set, but this stampfs was built without crash points \
         (build with `--features fault-injection`)"
    )]
    NotBuilt { var: &'static str },
    #[error("{var} is not valid unicode")]
    NotUnicode { var: &'static str },
    #[error("{ENV_POINTS}: entry {entry:?} is not NAME=PROBABILITY")]
    Malformed { entry: String },
    #[error("{ENV_POINTS}: no crash point is called {name:?} (known: {})", POINTS.join(", "))]
    UnknownPoint { name: String },
    #[error("{ENV_POINTS}: {name} is given twice")]
    Duplicate { name: String },
    #[error("{ENV_POINTS}: probability {value:?} of {name} is not a number in [0, 1]")]
    BadProbability { name: String, value: String },
    #[error("{ENV_SEED}: {value:?} is not an unsigned 64-bit decimal number")]
    BadSeed { value: String },
    #[error("crash points are already armed in this process")]
    AlreadyArmed,
}

/// What is armed: a probability per crash point, and the seed of the draws.
#[derive(Clone, Debug, PartialEq)]
pub struct Arming {
    /// Per point, in [`POINTS`] order; 0 is disarmed.
    probabilities: [f64; N],
    pub seed: u64,
}

impl Arming {
    /// Parses the value of [`ENV_POINTS`] (see the module docs for the format).
    pub fn parse(points: &str, seed: u64) -> Result<Arming, ConfigError> {
        let mut all: Option<f64> = None;
        let mut named: [Option<f64>; N] = [None; N];
        for entry in points.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((name, value)) = entry.split_once('=') else {
                return Err(ConfigError::Malformed {
                    entry: entry.to_string(),
                });
            };
            let (name, value) = (name.trim(), value.trim());
            if name.is_empty() {
                return Err(ConfigError::Malformed {
                    entry: entry.to_string(),
                });
            }
            let p = parse_probability(value).ok_or_else(|| ConfigError::BadProbability {
                name: name.to_string(),
                value: value.to_string(),
            })?;
            let slot = if name == "*" {
                &mut all
            } else {
                let i = index_of(name).ok_or_else(|| ConfigError::UnknownPoint {
                    name: name.to_string(),
                })?;
                &mut named[i]
            };
            if slot.replace(p).is_some() {
                return Err(ConfigError::Duplicate {
                    name: name.to_string(),
                });
            }
        }
        let mut probabilities = [0.0; N];
        for (p, n) in probabilities.iter_mut().zip(named) {
            *p = n.or(all).unwrap_or(0.0);
        }
        Ok(Arming {
            probabilities,
            seed,
        })
    }

    /// The probability that a hit of `name` fires (0 for an unknown name).
    pub fn probability(&self, name: &str) -> f64 {
        index_of(name).map_or(0.0, |i| self.probabilities[i])
    }

    /// The armed points (probability above 0) with their probabilities.
    pub fn armed(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        POINTS
            .iter()
            .zip(self.probabilities)
            .filter(|(_, p)| *p > 0.0)
            .map(|(n, p)| (*n, p))
    }

    /// Whether no point is armed.
    pub fn is_empty(&self) -> bool {
        self.armed().next().is_none()
    }
}

/// `name=p,name=p` of the armed points: a valid [`ENV_POINTS`] value.
impl std::fmt::Display for Arming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, p)) in self.armed().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}={p}")?;
        }
        Ok(())
    }
}

fn parse_probability(value: &str) -> Option<f64> {
    let p: f64 = value.parse().ok()?;
    (0.0..=1.0).contains(&p).then_some(p)
}

/// Parses the value of [`ENV_SEED`].
pub fn parse_seed(value: &str) -> Result<u64, ConfigError> {
    value.trim().parse().map_err(|_| ConfigError::BadSeed {
        value: value.to_string(),
    })
}

/// Whether the `hit`-th hit (from 0) of point `name` fires, for `seed` and
/// probability `p`: a hash of `(seed, name, hit)` mapped to `[0, 1)` is below `p`.
pub fn fires(seed: u64, name: &str, hit: u64, p: f64) -> bool {
    // FNV-1a of the name, then the splitmix64 finaliser over the three.
    let name_hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut z =
        seed ^ name_hash.rotate_left(17) ^ hit.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    unit < p
}

/// Reads [`ENV_POINTS`] and [`ENV_SEED`] and arms the points they name, for the rest
/// of the process's life. `Ok(None)`: nothing armed (the variable is unset or
/// empty). Called once by a server at start-up, before it touches its directory, so a
/// malformed value stops it there. On a build without crash points a set variable
/// is [`ConfigError::NotBuilt`]: whoever set it expects crashes that cannot happen.
pub fn arm_from_env() -> Result<Option<Arming>, ConfigError> {
    let points = match std::env::var(ENV_POINTS) {
        Ok(v) if v.trim().is_empty() => return Ok(None),
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(ConfigError::NotUnicode { var: ENV_POINTS })
        }
    };
    #[cfg(not(feature = "crash-points"))]
    {
        let _ = points;
        Err(ConfigError::NotBuilt { var: ENV_POINTS })
    }
    #[cfg(feature = "crash-points")]
    {
        let seed = match std::env::var(ENV_SEED) {
            Ok(v) => parse_seed(&v)?,
            Err(std::env::VarError::NotPresent) => rand::random(),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(ConfigError::NotUnicode { var: ENV_SEED })
            }
        };
        let arming = Arming::parse(&points, seed)?;
        armed::set(arming.clone())?;
        Ok(Some(arming))
    }
}

#[cfg(feature = "crash-points")]
pub use armed::hit;

#[cfg(feature = "crash-points")]
mod armed {
    use super::{fires, index_of, Arming, ConfigError, N};
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    struct Armed {
        arming: Arming,
        /// Hits so far per point: the `n` of [`fires`].
        hits: [AtomicU64; N],
    }

    /// Set once by [`super::arm_from_env`]; never while unarmed, so a process that
    /// never arms (every in-process test) passes every point at the cost of a load.
    static ARMED: OnceLock<Armed> = OnceLock::new();

    pub(super) fn set(arming: Arming) -> Result<(), ConfigError> {
        let armed = Armed {
            arming,
            hits: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        ARMED.set(armed).map_err(|_| ConfigError::AlreadyArmed)
    }

    /// A crash point was reached (what [`crate::crash_point!`] calls): kills the
    /// process when the point is armed and this hit's draw fires.
    pub fn hit(name: &'static str) {
        let Some(armed) = ARMED.get() else { return };
        let Some(i) = index_of(name) else { return };
        let p = armed.arming.probabilities[i];
        if p <= 0.0 {
            return;
        }
        let n = armed.hits[i].fetch_add(1, Ordering::Relaxed);
        if fires(armed.arming.seed, name, n, p) {
            die(name, n, armed.arming.seed);
        }
    }

    fn die(name: &str, hit: u64, seed: u64) -> ! {
        if tracing::enabled!(tracing::Level::ERROR) {
            tracing::error!(point = name, hit, seed, "crash point {name} hit");
        } else {
            eprintln!("stampfs: crash point {name} hit (hit {hit}, seed {seed})");
        }
        let _ = std::io::stderr().flush();
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught, so this is not reached; abort is as abrupt.
        std::process::abort()
    }
}

/// A crash point: with the cargo feature `crash-points`, kills the process here when
/// the point `NAME` is armed and its draw fires (see [`crate::crash`]); the name must
/// be in [`crash::POINTS`](crate::crash::POINTS) (checked at compile time).
/// `crash_point!(NAME, if COND)` is only hit when `COND` holds. Without the feature
/// it expands to nothing, the condition included.
#[cfg(feature = "crash-points")]
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {{
        const _: () = assert!(
            $crate::crash::is_point($name),
            concat!(
                "not a crash point (see stampfs_proto::crash::CATALOGUE): ",
                $name
            )
        );
        $crate::crash::hit($name)
    }};
    ($name:literal, if $cond:expr) => {
        if $cond {
            $crate::crash_point!($name)
        }
    };
}

/// A crash point: with the cargo feature `crash-points`, kills the process here when
/// the point `NAME` is armed and its draw fires (see [`crate::crash`]). Without the
/// feature (this build) it does nothing: the condition is type-checked (so what it
/// reads counts as used) but never evaluated.
#[cfg(not(feature = "crash-points"))]
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {};
    ($name:literal, if $cond:expr) => {
        if false && $cond {}
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_unique_and_lowercase_with_dashes() {
        for (i, a) in POINTS.iter().enumerate() {
            assert!(
                a.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{a}"
            );
            assert!(!POINTS[i + 1..].contains(a), "{a} is listed twice");
            assert_eq!(index_of(a), Some(i));
        }
        assert_eq!(POINTS.len(), CATALOGUE.len());
        assert!(!is_point("recovery-after"));
        assert!(!is_point("*"));
    }

    #[test]
    fn named_points_are_armed_with_their_probabilities() {
        let a = Arming::parse("recovery-after-bump=0.2, copy-mid-stream = 1", 7).unwrap();
        assert_eq!(a.probability("recovery-after-bump"), 0.2);
        assert_eq!(a.probability("copy-mid-stream"), 1.0);
        assert_eq!(a.probability("reopen-before-bump"), 0.0);
        assert_eq!(a.seed, 7);
        assert_eq!(a.to_string(), "recovery-after-bump=0.2,copy-mid-stream=1");
    }

    #[test]
    fn a_star_arms_every_point_and_a_name_overrides_it_in_any_order() {
        for value in ["*=0.5,copy-before-ack=0", "copy-before-ack=0,*=0.5"] {
            let a = Arming::parse(value, 0).unwrap();
            assert_eq!(a.probability("copy-before-ack"), 0.0, "{value}");
            for name in POINTS.iter().filter(|n| **n != "copy-before-ack") {
                assert_eq!(a.probability(name), 0.5, "{value}: {name}");
            }
        }
    }

    #[test]
    fn an_empty_value_arms_nothing() {
        for value in ["", " ", ",", " , ,"] {
            assert!(Arming::parse(value, 0).unwrap().is_empty(), "{value:?}");
        }
    }

    #[test]
    fn a_display_parses_back_to_the_same_arming() {
        let a = Arming::parse("*=0.125,recovery-before-commit=1", 3).unwrap();
        assert_eq!(Arming::parse(&a.to_string(), 3).unwrap(), a);
    }

    #[test]
    fn an_entry_without_a_probability_is_malformed() {
        for value in ["recovery-after-bump", "=0.5", "recovery-after-bump;0.5"] {
            assert!(
                matches!(Arming::parse(value, 0), Err(ConfigError::Malformed { .. })),
                "{value}"
            );
        }
    }

    #[test]
    fn an_unknown_name_is_an_error_naming_it() {
        let e = Arming::parse("recovery-after-bmup=1", 0).unwrap_err();
        assert_eq!(
            e,
            ConfigError::UnknownPoint {
                name: "recovery-after-bmup".into()
            }
        );
        assert!(
            e.to_string().contains("recovery-after-bump"),
            "lists the known: {e}"
        );
    }

    #[test]
    fn a_probability_outside_zero_to_one_is_an_error() {
        for value in ["-0.1", "1.5", "NaN", "inf", "half", ""] {
            assert!(
                matches!(
                    Arming::parse(&format!("copy-mid-stream={value}"), 0),
                    Err(ConfigError::BadProbability { .. })
                ),
                "{value:?}"
            );
        }
    }

    #[test]
    fn a_repeated_name_is_an_error() {
        for value in ["copy-mid-stream=1,copy-mid-stream=0", "*=1,*=0"] {
            assert!(
                matches!(Arming::parse(value, 0), Err(ConfigError::Duplicate { .. })),
                "{value}"
            );
        }
    }

    #[test]
    fn a_seed_is_a_decimal_u64() {
        assert_eq!(parse_seed(" 42 "), Ok(42));
        assert_eq!(parse_seed("18446744073709551615"), Ok(u64::MAX));
        for value in ["", "-1", "0x10", "18446744073709551616"] {
            assert!(matches!(
                parse_seed(value),
                Err(ConfigError::BadSeed { .. })
            ));
        }
    }

    #[test]
    fn probability_one_fires_every_hit_and_zero_never() {
        for hit in 0..1000 {
            assert!(fires(9, "copy-mid-stream", hit, 1.0));
            assert!(!fires(9, "copy-mid-stream", hit, 0.0));
        }
    }

    #[test]
    fn the_same_seed_fires_the_same_hits_and_another_seed_others() {
        let draws = |seed| -> Vec<bool> {
            (0..256)
                .map(|n| fires(seed, "recovery-after-bump", n, 0.5))
                .collect()
        };
        assert_eq!(draws(1), draws(1));
        assert_ne!(draws(1), draws(2));
        let other_point: Vec<bool> = (0..256)
            .map(|n| fires(1, "recovery-after-start", n, 0.5))
            .collect();
        assert_ne!(draws(1), other_point, "points draw independently");
    }

    #[test]
    fn the_share_of_hits_that_fire_is_about_the_probability() {
        for p in [0.01, 0.2, 0.5, 0.9] {
            let fired = (0..20_000)
                .filter(|&n| fires(12345, "copy-before-rename", n, p))
                .count() as f64
                / 20_000.0;
            assert!((fired - p).abs() < 0.02, "p {p}: fired {fired}");
        }
    }

    #[test]
    fn every_point_is_in_a_master_a_chunkserver_or_a_client() {
        let master = points_of(Process::Master).count();
        let chunkserver = points_of(Process::Chunkserver).count();
        let client = points_of(Process::Client).count();
        assert_eq!(master + chunkserver + client, POINTS.len());
        assert!(points_of(Process::Client).any(|n| n == "writer-reopen-before-resend"));
        assert!(points_of(Process::Master).any(|n| n == "recovery-after-bump"));
        assert!(points_of(Process::Chunkserver).any(|n| n == "copy-mid-stream"));
    }
}
