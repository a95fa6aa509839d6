//! `stampfs bench pipeline --pattern overwrite,random`: writes at any offset, measured
//! next to appends of the same configuration in the same run.
//!
//! - **overwrite**: the `size` bytes the append measurement wrote are written again
//!   from offset 0, in order, by a writer for writes anywhere, closed after an
//!   `hsync`; timed from the open to the end of the close. Goal: at least 80% of the
//!   append throughput. The file must be one partial chunk (`size` below
//!   `--chunk-size`): only a file's last chunk takes writes below its end so far.
//! - **random**: `N ×` (4 KiB written at a random 4 KiB-aligned offset of that file's
//!   last chunk + `hsync`), one untimed warm-up. Goal: p50 at most twice the p50 of the
//!   4 KiB append + `hsync` series of the same configuration.

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use serde::Serialize;
use stampfs_client::Client;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

use crate::bench::{percentile, SMALL_WRITE};

/// Sequential overwrite throughput against appends: at least this fraction.
pub const OVERWRITE_TARGET: f64 = 0.80;
/// Random 4 KiB + hsync p50 against the 4 KiB append + hsync p50: at most this.
pub const RANDOM_TARGET: f64 = 2.0;

/// Which write patterns a run measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Patterns {
    pub append: bool,
    pub overwrite: bool,
    pub random: bool,
}

impl Patterns {
    /// Parses `--pattern` values (`append`, `overwrite`, `random`).
    pub fn parse(names: &[String]) -> Result<Self> {
        let mut p = Patterns::default();
        for n in names {
            match n.trim().to_ascii_lowercase().as_str() {
                "append" => p.append = true,
                "overwrite" => p.overwrite = true,
                "random" => p.random = true,
                other => {
                    anyhow::bail!("unknown pattern {other:?} (use append, overwrite or random)")
                }
            }
        }
        Ok(p)
    }
}

/// Sequential overwrite next to the append of the same configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Overwrite {
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub append_mb_per_s: f64,
    /// `mb_per_s / append_mb_per_s`.
    pub ratio: f64,
    pub target: f64,
    pub met: bool,
}

impl Overwrite {
    pub fn new(bytes: u64, elapsed: Duration, append_mb_per_s: f64) -> Self {
        let seconds = elapsed.as_secs_f64();
        let mb_per_s = if seconds > 0.0 {
            bytes as f64 / seconds / 1e6
        } else {
            0.0
        };
        let ratio = if append_mb_per_s > 0.0 {
            mb_per_s / append_mb_per_s
        } else {
            0.0
        };
        Self {
            bytes,
            seconds,
            mb_per_s,
            append_mb_per_s,
            ratio,
            target: OVERWRITE_TARGET,
            met: ratio >= OVERWRITE_TARGET,
        }
    }
}

/// Random 4 KiB writes with hsync next to 4 KiB appends with hsync.
#[derive(Clone, Debug, Serialize)]
pub struct Random {
    pub count: usize,
    /// Bytes of the range the offsets were drawn from.
    pub span: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub append_p50_us: f64,
    /// `p50 / append p50`.
    pub ratio: f64,
    pub target: f64,
    pub met: bool,
}

impl Random {
    pub fn new(samples: &[Duration], span: u64, append_p50_us: f64) -> Self {
        let p50 = percentile(samples, 0.50).as_secs_f64() * 1e6;
        let ratio = if append_p50_us > 0.0 {
            p50 / append_p50_us
        } else {
            0.0
        };
        Self {
            count: samples.len(),
            span,
            p50_us: p50,
            p99_us: percentile(samples, 0.99).as_secs_f64() * 1e6,
            append_p50_us,
            ratio,
            target: RANDOM_TARGET,
            met: append_p50_us > 0.0 && ratio <= RANDOM_TARGET,
        }
    }
}

/// Writes `size` bytes over `path` from offset 0 and closes after an hsync, in a
/// task of the runtime. Returns the time from the open to the end of the close.
pub async fn overwrite(
    client: Client,
    path: String,
    size: u64,
    src: Arc<Vec<u8>>,
    bar: ProgressBar,
) -> Result<Duration> {
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut w = client
            .open_options()
            .write(true)
            .open(&path)
            .await
            .with_context(|| format!("opening {path} for writes anywhere"))?;
        let mut left = size;
        while left > 0 {
            let n = left.min(src.len() as u64) as usize;
            w.write_all(&src[..n])
                .await
                .with_context(|| format!("overwriting {path}"))?;
            left -= n as u64;
            bar.inc(n as u64);
        }
        w.hsync().await.with_context(|| format!("hsync {path}"))?;
        w.close().await.with_context(|| format!("closing {path}"))?;
        Ok(started.elapsed())
    });
    task.await.context("benchmark task failed")?
}

/// `count` × (4 KiB at a random 4 KiB-aligned offset below `span` of `path` + hsync),
/// after one untimed warm-up; the offsets come from a fixed-seed generator.
pub async fn random(
    client: Client,
    path: String,
    span: u64,
    count: usize,
    bar: ProgressBar,
) -> Result<Vec<Duration>> {
    let task = tokio::spawn(async move {
        let buf = vec![0x5au8; SMALL_WRITE];
        let slots = (span / SMALL_WRITE as u64).max(1);
        let mut w = client
            .open_options()
            .write(true)
            .open(&path)
            .await
            .with_context(|| format!("opening {path} for writes anywhere"))?;
        let from = w.writable_from().div_ceil(SMALL_WRITE as u64);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut out = Vec::with_capacity(count);
        for i in 0..=count {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let slot = from + x % slots.saturating_sub(from).max(1);
            let started = Instant::now();
            w.write_at(slot * SMALL_WRITE as u64, &buf)
                .await
                .with_context(|| format!("writing {path}"))?;
            w.hsync().await.with_context(|| format!("hsync {path}"))?;
            if i > 0 {
                out.push(started.elapsed());
            }
            bar.inc(SMALL_WRITE as u64);
        }
        w.close().await.with_context(|| format!("closing {path}"))?;
        Ok(out)
    });
    task.await.context("benchmark task failed")?
}

/// The text lines of the pattern results, one per configuration that has them.
pub fn render(rows: &[(String, Option<&Overwrite>, Option<&Random>)]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (name, ow, rnd) in rows {
        if let Some(o) = ow {
            let _ = writeln!(
                out,
                "{name}: sequential overwrite {:.0} MB/s against append {:.0} MB/s: {:.0}% (goal ≥{:.0}%) {}",
                o.mb_per_s,
                o.append_mb_per_s,
                o.ratio * 100.0,
                o.target * 100.0,
                if o.met { "met" } else { "MISSED" }
            );
        }
        if let Some(r) = rnd {
            let _ = writeln!(
                out,
                "{name}: random 4 KiB + hsync p50 {:.0} µs, p99 {:.0} µs, against 4 KiB append + hsync p50 {:.0} µs: {:.2}× (goal ≤{:.1}×) {}",
                r.p50_us,
                r.p99_us,
                r.append_p50_us,
                r.ratio,
                r.target,
                if r.met { "met" } else { "MISSED" }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_unknown_ones_are_refused() {
        let p = Patterns::parse(&["append".into(), " Random".into()]).expect("parse");
        assert_eq!(
            p,
            Patterns {
                append: true,
                overwrite: false,
                random: true
            }
        );
        assert!(Patterns::parse(&["sideways".into()]).is_err());
    }

    #[test]
    fn verdicts_follow_the_goals() {
        let o = Overwrite::new(80_000_000, Duration::from_secs(1), 100.0);
        assert!((o.ratio - 0.8).abs() < 1e-9 && o.met);
        let o = Overwrite::new(79_000_000, Duration::from_secs(1), 100.0);
        assert!(!o.met);
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let r = Random::new(&samples, 1 << 20, 25.0);
        assert_eq!((r.p50_us, r.met), (50.0, true));
        let r = Random::new(&samples, 1 << 20, 24.0);
        assert!(!r.met);
        assert!(!Random::new(&samples, 1 << 20, 0.0).met);
    }
}
