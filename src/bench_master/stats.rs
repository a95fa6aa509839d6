//! What the benchmark counts: latency histograms of fixed size, the master's memory
//! (allocator and RSS), and CPU time by thread group.
//!
//! Latencies go into a log-linear histogram of atomic counters (64 sub-buckets per
//! power of two: a value is known within 1/64 of itself), shared by every task of a
//! phase. Its memory is fixed, so recording ten million latencies does not show up in
//! the memory per chunk being measured at the same time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets for every `u64` of nanoseconds.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// A concurrent latency histogram (nanoseconds).
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    max: AtomicU64,
    sum: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            max: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros(); // >= SUB_BITS
    let sub = (ns >> (exp - SUB_BITS)) & (SUB - 1);
    ((exp - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// The lowest value of bucket `i`.
fn bucket_floor(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let exp = i / SUB + u64::from(SUB_BITS) - 1;
    let sub = i % SUB;
    (SUB + sub) << (exp - u64::from(SUB_BITS))
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max.load(Ordering::Relaxed))
    }

    pub fn mean(&self) -> Duration {
        let n = self.count();
        Duration::from_nanos(self.sum.load(Ordering::Relaxed).checked_div(n).unwrap_or(0))
    }

    /// The `p`-quantile (0..=1) by nearest rank, as the middle of its bucket (never
    /// above the maximum); zero when empty.
    pub fn quantile(&self, p: f64) -> Duration {
        let n = self.count();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((p.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                let lo = bucket_floor(i);
                let hi = if i + 1 < BUCKETS {
                    bucket_floor(i + 1).max(lo + 1)
                } else {
                    u64::MAX
                };
                let mid = lo + (hi - lo) / 2;
                return Duration::from_nanos(mid.min(self.max.load(Ordering::Relaxed)));
            }
        }
        self.max()
    }
}

/// The process's memory: what the allocator has handed out, and what is resident.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Memory {
    /// Bytes in use from glibc's malloc (`mallinfo2`: arena bytes in use plus
    /// mmapped blocks, allocation headers included); `None` without glibc.
    pub heap: Option<u64>,
    /// Resident set size (`VmRSS`), read after `malloc_trim(0)` gave free pages back.
    pub rss: Option<u64>,
    /// Open descriptors (sockets, mostly: the master's command connections and the
    /// simulated chunkservers' ends of them, each with its buffers on the heap).
    pub fds: Option<u64>,
}

impl Memory {
    pub fn now() -> Self {
        let heap = allocator::in_use();
        allocator::trim();
        Self {
            heap,
            rss: rss_bytes(),
            fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
        }
    }
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The allocator's own counters (glibc). Calling into the C library is the only
/// `unsafe` of this crate; it is confined here.
#[allow(unsafe_code)]
mod allocator {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn in_use() -> Option<u64> {
        // SAFETY: mallinfo2 takes no arguments, only reads the allocator's statistics
        // under its own locks, and returns a plain struct by value.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd) as u64)
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    pub fn in_use() -> Option<u64> {
        None
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn trim() {
        // SAFETY: malloc_trim only returns free memory to the system; it never touches
        // memory in use, and it locks each arena while it works.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    pub fn trim() {}
}

/// CPU seconds by thread group, from `/proc/self/task`: the simulated chunkservers'
/// runtime (`stampfs-sim`), the operation log's writer (`stampfs-oplog`), and the rest
/// (the master's request handling and workers, and the client tasks that call it).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CpuSplit {
    pub master_and_clients: f64,
    pub oplog_writer: f64,
    pub simulated_chunkservers: f64,
    /// Share of the machine's CPU time that *other* processes took (0..1): a figure
    /// measured on a shared machine is only as good as this is small.
    pub other_load: Option<f64>,
    #[serde(skip)]
    machine: Option<crate::bench::CpuSnapshot>,
}

impl CpuSplit {
    pub fn now() -> Self {
        let mut out = Self {
            machine: crate::bench::CpuSnapshot::now(),
            ..Self::default()
        };
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return out;
        };
        for t in tasks.flatten() {
            let p = t.path();
            let (Ok(comm), Ok(stat)) = (
                std::fs::read_to_string(p.join("comm")),
                std::fs::read_to_string(p.join("stat")),
            ) else {
                continue;
            };
            let Some(ticks) = crate::bench::parse_self_stat(&stat) else {
                continue;
            };
            let s = ticks as f64 / 100.0;
            match comm.trim() {
                c if c.starts_with("stampfs-sim") => out.simulated_chunkservers += s,
                c if c.starts_with("stampfs-oplog") => out.oplog_writer += s,
                _ => out.master_and_clients += s,
            }
        }
        out
    }

    pub fn since(&self, earlier: &Self) -> Self {
        let d = |a: f64, b: f64| (a - b).max(0.0);
        Self {
            master_and_clients: d(self.master_and_clients, earlier.master_and_clients),
            oplog_writer: d(self.oplog_writer, earlier.oplog_writer),
            simulated_chunkservers: d(self.simulated_chunkservers, earlier.simulated_chunkservers),
            other_load: match (&earlier.machine, &self.machine) {
                (Some(a), Some(b)) => a.until(b).map(|u| u.other_load),
                _ => None,
            },
            machine: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order_within_a_64th() {
        let mut last = 0;
        for v in (0..10_000u64).chain([1 << 20, 123_456_789, u64::MAX / 3, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b < BUCKETS, "{v}");
            assert!(bucket_floor(b) <= v, "{v}");
            assert!(v - bucket_floor(b) <= v / 64 + 1, "{v}");
            if v < 10_000 {
                assert!(b >= last);
                last = b;
            }
        }
    }

    #[test]
    fn quantiles_come_from_the_recorded_values() {
        let h = Histogram::default();
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.count(), 100);
        let p50 = h.quantile(0.5).as_micros() as i64;
        let p99 = h.quantile(0.99).as_micros() as i64;
        assert!((p50 - 50).abs() <= 1, "{p50}");
        assert!((p99 - 99).abs() <= 2, "{p99}");
        assert_eq!(h.max(), Duration::from_micros(100));
        assert_eq!(Histogram::default().quantile(0.5), Duration::ZERO);
    }
}
