//! POSIX permission decisions, pure: who may search, read or write an entry, remove
//! it from a sticky directory, change its mode, owner or times. The state's
//! operations ask these before they commit anything (`state/ops.rs`, `state/write.rs`).
//!
//! The caller is who the request says it is ([`Caller`]): not authenticated yet, so
//! these checks keep honest clients of different users apart, not a hostile one. A
//! request without a caller (a tool of the cluster, an older client) and uid 0 may do
//! everything, as root on a local filesystem (the master never executes anything, so
//! root's need of an exec bit does not arise here).

use stampfs_proto::{Attr, Caller};

/// Read permission.
pub const READ: u32 = 4;
/// Write permission.
pub const WRITE: u32 = 2;
/// Search (directories) or execute permission.
pub const EXEC: u32 = 1;

const SET_UID: u32 = 0o4000;
const SET_GID: u32 = 0o2000;
const STICKY: u32 = 0o1000;

/// The superuser: no caller, or uid 0.
pub fn is_root(who: Option<&Caller>) -> bool {
    who.is_none_or(|c| c.uid == 0)
}

/// `who` is in group `gid` (its primary group or a supplementary one).
pub fn in_group(who: &Caller, gid: u32) -> bool {
    who.gid == gid || who.groups.contains(&gid)
}

/// Whether `who` has every permission of `want` (a mask of [`READ`], [`WRITE`],
/// [`EXEC`]) on an entry with `attr`: the owner's bits for its owner, the group's for
/// a member of its group, the others' otherwise (never a union of them, as POSIX
/// says).
pub fn allows(attr: &Attr, who: Option<&Caller>, want: u32) -> bool {
    let Some(c) = who.filter(|c| c.uid != 0) else {
        return true;
    };
    let bits = if c.uid == attr.uid {
        attr.mode >> 6
    } else if in_group(c, attr.gid) {
        attr.mode >> 3
    } else {
        attr.mode
    };
    bits & want == want
}

/// Whether `who` may remove or rename `entry` out of the directory `dir`: always
/// unless `dir` is sticky, then only its owner, the entry's owner or root.
pub fn sticky_allows(dir: &Attr, entry: &Attr, who: Option<&Caller>) -> bool {
    match who.filter(|c| c.uid != 0) {
        None => true,
        Some(c) => dir.mode & STICKY == 0 || c.uid == dir.uid || c.uid == entry.uid,
    }
}

/// The owner of an entry, or root.
pub fn owns(attr: &Attr, who: Option<&Caller>) -> bool {
    who.is_none_or(|c| c.uid == 0 || c.uid == attr.uid)
}

/// Why a `chmod` to `mode` of an entry with `attr` is refused, or the mode it stores:
/// only the owner or root may (anyone who may write it may clear its set-uid and
/// set-gid bits); the set-gid bit of an entry whose group the (non-root) caller is not
/// in is dropped, as Linux drops it.
pub fn chmod(attr: &Attr, mode: u32, who: Option<&Caller>) -> Result<u32, &'static str> {
    if !owns(attr, who) {
        // The kernel clears set-uid and set-gid of a file a non-owner writes with a
        // mode change sent as the writer: that much a writer may do.
        let clears_only = mode & !(SET_UID | SET_GID) == attr.mode & !(SET_UID | SET_GID)
            && mode & !attr.mode == 0;
        if clears_only && allows(attr, who, WRITE) {
            return Ok(mode);
        }
        return Err("only the owner or root may change the mode");
    }
    match who.filter(|c| c.uid != 0) {
        Some(c) if !in_group(c, attr.gid) => Ok(mode & !SET_GID),
        _ => Ok(mode),
    }
}

/// Why a `chown` of an entry with `attr` to `uid` / `gid` is refused, or the mode it
/// leaves: root may give anything to anyone; an owner may only change the group, to
/// one it is in. A `chown` of a regular file drops its set-uid bit, and its set-gid bit
/// when the group may execute (Linux, for root too, even to the same ids).
pub fn chown(
    attr: &Attr,
    is_file: bool,
    uid: Option<u32>,
    gid: Option<u32>,
    who: Option<&Caller>,
) -> Result<u32, &'static str> {
    if let Some(c) = who.filter(|c| c.uid != 0) {
        if uid.is_some_and(|u| u != attr.uid) {
            return Err("only root may give an entry to another owner");
        }
        if c.uid != attr.uid {
            return Err("only the owner or root may change the group");
        }
        if gid.is_some_and(|g| g != attr.gid && !in_group(c, g)) {
            return Err("the owner may only give an entry to a group it is in");
        }
    }
    // Linux drops the bits whenever an owner or group is given, even the same one.
    let mut mode = attr.mode;
    if is_file && (uid.is_some() || gid.is_some()) {
        mode &= !SET_UID;
        if mode & 0o010 != 0 {
            mode &= !SET_GID;
        }
    }
    Ok(mode)
}

/// Why setting the times of an entry with `attr` is refused: explicit times only by
/// its owner or root; the current time also by whoever may write it (`touch` of a
/// file one may write).
pub fn set_times(attr: &Attr, explicit: bool, who: Option<&Caller>) -> Result<(), &'static str> {
    if owns(attr, who) || (!explicit && allows(attr, who, WRITE)) {
        return Ok(());
    }
    Err(if explicit {
        "only the owner or root may set times other than now"
    } else {
        "setting the times to now needs write permission or ownership"
    })
}

/// Why `who` may not create an entry owned by `uid` / `gid`: a non-root caller creates
/// entries of its own, in its own group or one it is in (the group of a set-gid
/// parent is applied afterwards, by [`inherited`]).
pub fn may_own(uid: u32, gid: u32, who: Option<&Caller>) -> Result<(), &'static str> {
    match who.filter(|c| c.uid != 0) {
        Some(c) if c.uid != uid => Err("an entry is created owned by its creator"),
        Some(c) if !in_group(c, gid) => Err("an entry is created in a group its creator is in"),
        _ => Ok(()),
    }
}

/// The group and mode of a new entry in a directory with `parent`: under a set-gid
/// directory it takes the directory's group, and a new directory the set-gid bit too.
pub fn inherited(parent: &Attr, gid: u32, mode: u32, is_dir: bool) -> (u32, u32) {
    if parent.mode & SET_GID == 0 {
        return (gid, mode);
    }
    (parent.gid, if is_dir { mode | SET_GID } else { mode })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            mode,
            uid,
            gid,
            ..Attr::default()
        }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        Caller {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn owner_group_and_others_each_get_their_own_bits() {
        let a = attr(0o640, 10, 20);
        let owner = user(10, 99, &[]);
        let member = user(11, 99, &[20]);
        let other = user(12, 30, &[31]);
        assert!(allows(&a, Some(&owner), READ | WRITE));
        assert!(!allows(&a, Some(&owner), EXEC));
        assert!(allows(&a, Some(&member), READ));
        assert!(!allows(&a, Some(&member), WRITE));
        assert!(!allows(&a, Some(&other), READ));
        // The owner's bits decide for the owner even when the group's allow more.
        let b = attr(0o070, 10, 20);
        assert!(!allows(&b, Some(&user(10, 20, &[])), READ));
        assert!(allows(&b, Some(&member), READ | WRITE | EXEC));
        // Root and a request without a caller may do everything.
        assert!(allows(
            &attr(0, 10, 20),
            Some(&user(0, 0, &[])),
            READ | WRITE | EXEC
        ));
        assert!(allows(&attr(0, 10, 20), None, WRITE));
    }

    #[test]
    fn a_sticky_directory_keeps_others_entries() {
        let dir = attr(0o1777, 1, 1);
        let mine = attr(0o644, 10, 10);
        assert!(sticky_allows(&dir, &mine, Some(&user(10, 10, &[]))));
        assert!(!sticky_allows(&dir, &mine, Some(&user(11, 10, &[]))));
        assert!(
            sticky_allows(&dir, &mine, Some(&user(1, 1, &[]))),
            "the dir's owner"
        );
        assert!(sticky_allows(&dir, &mine, Some(&user(0, 0, &[]))));
        assert!(sticky_allows(
            &attr(0o777, 1, 1),
            &mine,
            Some(&user(11, 10, &[]))
        ));
    }

    #[test]
    fn chmod_chown_and_times_follow_linux() {
        let f = attr(0o2755, 10, 20);
        let owner = user(10, 10, &[]);
        // The owner not in the entry's group loses set-gid (a directory too).
        assert_eq!(chmod(&f, 0o2750, Some(&owner)), Ok(0o0750));
        assert_eq!(chmod(&f, 0o2750, Some(&user(10, 20, &[]))), Ok(0o2750));
        assert!(chmod(&f, 0o777, Some(&user(11, 20, &[]))).is_err());
        assert_eq!(chmod(&f, 0o7777, None), Ok(0o7777));
        // A writer that is not the owner may only clear set-uid and set-gid.
        let shared = attr(0o6775, 10, 20);
        let member = user(11, 11, &[20]);
        assert_eq!(chmod(&shared, 0o0775, Some(&member)), Ok(0o0775));
        assert_eq!(chmod(&shared, 0o4775, Some(&member)), Ok(0o4775));
        assert!(chmod(&shared, 0o0777, Some(&member)).is_err(), "adds a bit");
        assert!(
            chmod(&shared, 0o0775, Some(&user(12, 12, &[]))).is_err(),
            "not a writer"
        );
        // chown: only root gives away; an owner changes the group to one of its own.
        let s = attr(0o6755, 10, 20);
        assert!(chown(&s, true, Some(11), None, Some(&owner)).is_err());
        assert!(chown(&s, true, None, Some(30), Some(&owner)).is_err());
        assert_eq!(
            chown(&s, true, None, Some(30), Some(&user(10, 10, &[30]))),
            Ok(0o0755),
            "set-uid and (group-exec) set-gid dropped"
        );
        assert_eq!(
            chown(&s, true, Some(10), Some(20), Some(&owner)),
            Ok(0o0755),
            "the same ids drop them too"
        );
        assert_eq!(chown(&s, true, None, None, Some(&owner)), Ok(0o6755));
        assert_eq!(
            chown(&s, false, Some(5), None, None),
            Ok(0o6755),
            "a directory keeps them"
        );
        assert_eq!(
            chown(&attr(0o2745, 1, 1), true, Some(2), None, None),
            Ok(0o2745)
        );
        assert!(chown(&s, true, None, Some(10), Some(&user(11, 10, &[]))).is_err());
        // Times: explicit ones by the owner; now also by a writer.
        let w = attr(0o666, 10, 20);
        let other = user(11, 30, &[]);
        assert!(set_times(&w, true, Some(&other)).is_err());
        assert!(set_times(&w, false, Some(&other)).is_ok());
        assert!(set_times(&attr(0o644, 10, 20), false, Some(&other)).is_err());
        assert!(set_times(&attr(0o000, 10, 20), true, Some(&owner)).is_ok());
    }

    #[test]
    fn new_entries_belong_to_their_creator_and_inherit_a_set_gid_group() {
        let c = user(10, 10, &[20]);
        assert!(may_own(10, 10, Some(&c)).is_ok());
        assert!(may_own(10, 20, Some(&c)).is_ok());
        assert!(may_own(11, 10, Some(&c)).is_err());
        assert!(may_own(10, 30, Some(&c)).is_err());
        assert!(may_own(5, 5, None).is_ok());
        let sgid = attr(0o2775, 1, 50);
        assert_eq!(inherited(&sgid, 10, 0o755, true), (50, 0o2755));
        assert_eq!(inherited(&sgid, 10, 0o644, false), (50, 0o644));
        assert_eq!(
            inherited(&attr(0o755, 1, 50), 10, 0o644, false),
            (10, 0o644)
        );
    }
}
