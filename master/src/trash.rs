//! The trash, laid out as HDFS's: `rm` (when `--trash-for` is not zero) moves an
//! entry to `/.trash/<user>/Current/<its original path>`, the directories on the way
//! created for it. The replica-health worker turns each user's `Current` into a
//! **checkpoint** named by the wall-clock millisecond it was taken
//! (`/.trash/<user>/<ms>`) at most once per [`checkpoint_interval`], and deletes a
//! checkpoint for good once `--trash-for` has passed since it was taken; only then do
//! its chunks become garbage. So an entry stays in the trash between `--trash-for`
//! and one and a half times that.
//!
//! - `/.trash` belongs to root, mode 0711: anyone may pass through it to their own
//!   directory, nobody but root may list it. `/.trash/<user>` and the directories
//!   made under it belong to the user who removed the entry, mode 0700; the entries
//!   keep their own owners and modes. `<user>` is the name of the user with the
//!   caller's uid (`uid-<n>` when no user has it).
//! - A name already taken in the trash gets the removal's millisecond appended
//!   (`name.<ms>`), as HDFS does; so does a directory on the way that is taken by
//!   something else.
//! - Entries leave the trash only by `stampfs trash restore` (`RestoreTrash`), or
//!   when they expire; a rename out of it is refused. Removing something that is
//!   already in the trash deletes it at once, as does `rm --skip-trash`.
//! - Entries of the flat layout of older versions (`/.trash/<ms>-<inode>-<name>`)
//!   still expire by the time in their name.
//!
//! Pure naming rules only; the records are written by the state machine.

use stampfs_proto::path::MAX_COMPONENT_LEN;

/// Name of the trash directory under the root.
pub const DIR: &str = ".trash";
/// The directory of a user's trash that `rm` moves entries into.
pub const CURRENT: &str = "Current";

/// How often a user's `Current` becomes a checkpoint, for a trash that keeps
/// entries `keep_ms`: half of it (at least a second).
pub fn checkpoint_interval(keep_ms: u64) -> u64 {
    (keep_ms / 2).max(1_000)
}

/// The name of a checkpoint taken at `wall_ms`.
pub fn checkpoint_name(wall_ms: u64) -> String {
    wall_ms.to_string()
}

/// When a checkpoint was taken, from its name; `None` for any other name.
pub fn checkpoint_at(name: &str) -> Option<u64> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// The name of the trash directory of the user called `user` (`None`: no user has
/// the caller's uid `uid`).
pub fn user_dir(user: Option<&str>, uid: u32) -> String {
    match user {
        // A name that reads as an entry of the flat layout (`<ms>-<inode>-...`, a
        // valid user name) would expire as one: `user.` keeps it apart.
        Some(u) if deleted_at(u).is_some() => format!("user.{u}"),
        Some(u) => u.to_string(),
        None => format!("uid-{uid}"),
    }
}

/// `name` made unique with the removal's millisecond, as HDFS does (`name.<ms>`,
/// then `name.<ms>.<n>` for the `n`th more in the same millisecond); a long name is
/// cut (at a character boundary) so the result fits a component.
pub fn taken_name(name: &str, deleted_at_ms: u64, n: u32) -> String {
    let suffix = if n == 0 {
        format!(".{deleted_at_ms}")
    } else {
        format!(".{deleted_at_ms}.{n}")
    };
    let room = MAX_COMPONENT_LEN.saturating_sub(suffix.len());
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &name[..cut])
}

/// When an entry of the older flat layout (`<ms>-<inode>-<name>`) was removed, from
/// its name; `None` for any other name.
pub fn deleted_at(entry: &str) -> Option<u64> {
    let (ms, rest) = entry.split_once('-')?;
    let (ino, _) = rest.split_once('-')?;
    ino.parse::<u64>().ok()?;
    ms.parse().ok()
}

/// Whether something removed (or checkpointed) at `at_ms` is due for deletion at
/// `wall_ms`.
pub fn expired(at_ms: u64, keep_ms: u64, wall_ms: u64) -> bool {
    wall_ms.saturating_sub(at_ms) >= keep_ms
}

/// Where an entry at `trash_path` (the components of a path in the trash:
/// `.trash`, the user, the bucket, then the original path) came from: the original
/// path's components. `None` for a path that is not inside a bucket.
pub fn original<'a>(trash_path: &[&'a str]) -> Option<Vec<&'a str>> {
    match trash_path {
        [dir, _user, bucket, rest @ ..]
            if *dir == DIR
                && !rest.is_empty()
                && (*bucket == CURRENT || checkpoint_at(bucket).is_some()) =>
        {
            Some(rest.to_vec())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_and_flat_entries_carry_their_time() {
        assert_eq!(
            checkpoint_at(&checkpoint_name(1_700_000_000_123)),
            Some(1_700_000_000_123)
        );
        assert_eq!(checkpoint_at("Current"), None);
        assert_eq!(checkpoint_at("12a"), None);
        assert_eq!(checkpoint_at(""), None);
        assert_eq!(
            deleted_at("1700000000123-42-report.csv"),
            Some(1_700_000_000_123)
        );
        assert_eq!(deleted_at("my-own-file"), None);
        assert_eq!(deleted_at("12-x-y"), None);
        assert_eq!(deleted_at("12-3"), None);
        assert_eq!(checkpoint_interval(60_000), 30_000);
        assert_eq!(checkpoint_interval(10), 1_000);
    }

    #[test]
    fn taken_names_get_the_time_and_fit_a_component() {
        assert_eq!(taken_name("report.csv", 17, 0), "report.csv.17");
        assert_eq!(taken_name("report.csv", 17, 2), "report.csv.17.2");
        let long = "é".repeat(200);
        let n = taken_name(&long, 1_700_000_000_000, 0);
        assert!(n.len() <= MAX_COMPONENT_LEN);
        assert!(n.ends_with(".1700000000000"));
        stampfs_proto::path::components(&format!("/{DIR}/u/{CURRENT}/{n}")).expect("valid");
        assert_eq!(user_dir(Some("alice"), 1000), "alice");
        assert_eq!(user_dir(Some("1-2-x"), 1000), "user.1-2-x");
        assert_eq!(deleted_at(&user_dir(Some("1-2-x"), 1000)), None);
        assert_eq!(
            deleted_at(&format!("{}.1000", user_dir(Some("1-2-x"), 1000))),
            None
        );
        assert_eq!(user_dir(None, 1000), "uid-1000");
    }

    #[test]
    fn the_original_path_is_what_follows_the_bucket() {
        assert_eq!(
            original(&[DIR, "alice", CURRENT, "a", "b"]),
            Some(vec!["a", "b"])
        );
        assert_eq!(original(&[DIR, "alice", "1700", "f"]), Some(vec!["f"]));
        assert_eq!(original(&[DIR, "alice", CURRENT]), None);
        assert_eq!(original(&[DIR, "alice", "Other", "f"]), None);
        assert_eq!(original(&["a", "alice", CURRENT, "f"]), None);
    }

    #[test]
    fn expiry_uses_the_wall_clock_and_tolerates_skew() {
        assert!(!expired(1_000, 500, 1_499));
        assert!(expired(1_000, 500, 1_500));
        assert!(expired(1_000, 0, 1_000));
        assert!(!expired(2_000, 500, 1_000), "a clock that went back waits");
    }
}
