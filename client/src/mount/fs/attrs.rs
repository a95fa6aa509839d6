//! What the mount makes of a FUSE request for the master: the calling process's
//! identity ([`caller_of`]) and the mode and owner of what it creates ([`new_attr`]),
//! and times between the kernel's `SystemTime` and the master's nanoseconds.

use fuser::{Errno, Request};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The instant `ns` nanoseconds from the Unix epoch (before it when negative).
pub(super) fn system_time(ns: i64) -> SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

/// Nanoseconds from the Unix epoch of `t` (`EINVAL` outside about 1677 to 2262).
pub(super) fn epoch_ns(t: SystemTime) -> Result<i64, Errno> {
    let ns = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).ok(),
        Err(e) => i64::try_from(e.duration().as_nanos()).ok().map(|n| -n),
    };
    ns.ok_or(Errno::EINVAL)
}

/// The identity of the process that made `req`: its uid and gid as the kernel gives
/// them, and its supplementary groups from `/proc/PID/status` (none when it is gone,
/// or for the kernel's own requests, pid 0).
pub(super) fn caller_of(req: &Request) -> stampfs_proto::Caller {
    let groups = std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .take(stampfs_proto::MAX_GROUPS)
                    .collect()
            })
        })
        .unwrap_or_default();
    stampfs_proto::Caller {
        uid: req.uid(),
        gid: req.gid(),
        groups,
    }
}

/// Mode and owner of an entry `req`'s caller creates with `mode` under `umask`.
pub(super) fn new_attr(req: &Request, mode: u32, umask: u32) -> stampfs_proto::NewAttr {
    stampfs_proto::NewAttr {
        mode: mode & !umask & stampfs_proto::MODE_BITS,
        uid: req.uid(),
        gid: req.gid(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_convert_both_ways_before_and_after_the_epoch() {
        for ns in [0, 1, 981_173_106_123_456_789, -14_182_940_000_000_001, -1] {
            assert_eq!(epoch_ns(system_time(ns)), Ok(ns), "{ns}");
        }
        let far = UNIX_EPOCH + Duration::from_secs(400 * 365 * 86_400);
        assert_eq!(epoch_ns(far), Err(Errno::EINVAL), "past 2262");
    }
}
