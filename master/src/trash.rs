//! The trash: `rm` moves an entry to `/.trash/<deleted-at ms>-<inode>-<name>` (when
//! `--trash-for` is not zero), and the replica-health worker deletes it for good once
//! `--trash-for` has passed; only then do its chunks become garbage. Removing something
//! that is already in the trash deletes it at once.
//!
//! The deletion time is part of the entry's name, so it survives restarts without a new
//! record type and an operator can see it with `stampfs ls /.trash`. The trash
//! directory is hidden from listings of `/`. Pure naming rules only; the records are
//! written by the state machine.

use stampfs_proto::path::MAX_COMPONENT_LEN;
use stampfs_proto::InodeId;

/// Name of the trash directory under the root.
pub const DIR: &str = ".trash";

/// The name an entry called `name` (inode `ino`) gets in the trash when removed at
/// `deleted_at_ms` (wall clock). Long names are cut (at a character boundary) so the
/// result fits a path component.
pub fn entry_name(deleted_at_ms: u64, ino: InodeId, name: &str) -> String {
    let prefix = format!("{deleted_at_ms}-{}-", ino.0);
    let room = MAX_COMPONENT_LEN.saturating_sub(prefix.len());
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{prefix}{}", &name[..cut])
}

/// When a trash entry was removed, from its name; `None` for a name the trash did not
/// give (the caller falls back to the entry's mtime).
pub fn deleted_at(entry: &str) -> Option<u64> {
    let (ms, rest) = entry.split_once('-')?;
    let (ino, _) = rest.split_once('-')?;
    ino.parse::<u64>().ok()?;
    ms.parse().ok()
}

/// Whether an entry removed at `deleted_at_ms` is due for deletion at `wall_ms`.
pub fn expired(deleted_at_ms: u64, keep_ms: u64, wall_ms: u64) -> bool {
    wall_ms.saturating_sub(deleted_at_ms) >= keep_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_time_and_round_trip() {
        let n = entry_name(1_700_000_000_123, InodeId(42), "report.csv");
        assert_eq!(n, "1700000000123-42-report.csv");
        assert_eq!(deleted_at(&n), Some(1_700_000_000_123));
        assert_eq!(deleted_at("my-own-file"), None);
        assert_eq!(deleted_at("12-x-y"), None);
        assert_eq!(deleted_at("12-3"), None);
    }

    #[test]
    fn long_names_are_cut_to_a_component() {
        let long = "é".repeat(200);
        let n = entry_name(1, InodeId(2), &long);
        assert!(n.len() <= MAX_COMPONENT_LEN);
        assert!(n.starts_with("1-2-é"));
        stampfs_proto::path::components(&format!("/{DIR}/{n}")).expect("valid path");
    }

    #[test]
    fn expiry_uses_the_wall_clock_and_tolerates_skew() {
        assert!(!expired(1_000, 500, 1_499));
        assert!(expired(1_000, 500, 1_500));
        assert!(expired(1_000, 0, 1_000));
        assert!(!expired(2_000, 500, 1_000), "a clock that went back waits");
    }
}
