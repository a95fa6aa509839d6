//! Whether a directory may be mounted on: what [`super::Mount::start`] checks before
//! it asks the kernel for a mount.
//!
//! | the mount point                                   | outcome                      |
//! | ------------------------------------------------- | ---------------------------- |
//! | does not exist / is not a directory               | refused                      |
//! | `stat` fails with `ENOTCONN` (a FUSE server died) | refused: stale, `umount -l`  |
//! | `stat` does not answer within [`PROBE_TIMEOUT`]   | refused: a hung server       |
//! | topmost mount there is a stampfs one ([`is_stampfs`]) | refused: already mounted |
//! | a directory with entries                          | refused unless `nonempty`    |
//! | an empty directory (another file system's too)    | mounted                      |
//!
//! libfuse 2's `fusermount` refuses a non-empty mount point unless `-o nonempty`, as
//! here: mounting there hides what the directory holds until the unmount. A live
//! stampfs mount is refused even with `nonempty`: stacking a second mount of a cluster
//! over the first is never what was meant. The facts are gathered by [`probe`] and
//! [`mount_entry_at`] (`/proc/self/mountinfo`); [`decide`] is pure.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The source our mounts have in `/proc/self/mountinfo` ([`super::MountConfig`]'s
/// `fsname`: `stampfs`, or `stampfs:MASTER` as `stampfs mount` names it).
pub(crate) const SOURCE: &str = "stampfs";
/// How long the `stat` and listing of the mount point may take: a hung FUSE server
/// underneath must not hang `stampfs mount`.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How many of a non-empty mount point's entries the refusal names.
const SAMPLE: usize = 3;

/// Why a directory cannot be mounted on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountpointProblem {
    /// Nothing is there.
    Missing,
    /// It is not a directory.
    NotADirectory,
    /// It holds entries (the first few of them, by name) and `nonempty` was not given.
    NotEmpty { sample: Vec<String>, more: bool },
    /// A stampfs mount (of `source`) serves it already.
    AlreadyMounted { source: String },
    /// A FUSE mount (of `source`, when mountinfo lists it) whose server is gone:
    /// the kernel answers `ENOTCONN`.
    Stale { source: Option<String> },
    /// Its `stat` or listing did not finish within `waited` (2 s).
    NoAnswer { waited: Duration },
    /// It could not be examined (`errno` when the OS gave one).
    Unreadable { errno: Option<i32> },
}

impl std::fmt::Display for MountpointProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => write!(f, "does not exist"),
            Self::NotADirectory => write!(f, "is not a directory"),
            Self::NotEmpty { sample, more } => {
                let names: Vec<String> = sample.iter().map(|n| format!("`{n}`")).collect();
                let more = if *more { ", ..." } else { "" };
                write!(
                    f,
                    "is not empty (holds {}{more}); mounting there would hide its contents \
                     until the unmount (pass --nonempty to mount anyway)",
                    names.join(", ")
                )
            }
            Self::AlreadyMounted { source } => write!(
                f,
                "is already a live stampfs mount (of {source}); unmount it first"
            ),
            Self::Stale { source } => write!(
                f,
                "is a stale FUSE mount{}: its server is gone (transport endpoint is not \
                 connected); detach it with `umount -l` first",
                source
                    .as_ref()
                    .map(|s| format!(" (of {s})"))
                    .unwrap_or_default()
            ),
            Self::NoAnswer { waited } => write!(
                f,
                "did not answer within {waited:?} (a hung FUSE server there?); \
                 detach it with `umount -l` first"
            ),
            Self::Unreadable { errno: Some(e) } => {
                write!(
                    f,
                    "cannot be examined: {}",
                    std::io::Error::from_raw_os_error(*e)
                )
            }
            Self::Unreadable { errno: None } => write!(f, "cannot be examined"),
        }
    }
}

/// One line of `/proc/self/mountinfo`, the fields the decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MountEntry {
    pub(crate) mount_point: PathBuf,
    pub(crate) fstype: String,
    pub(crate) source: String,
}

impl MountEntry {
    /// Parses a mountinfo line: `id parent major:minor root mount_point options
    /// [optional fields...] - fstype source super_options`, with spaces, tabs,
    /// newlines and backslashes in paths escaped as `\ooo`. `None` if malformed.
    pub(crate) fn parse(line: &str) -> Option<MountEntry> {
        let (left, right) = line.split_once(" - ")?;
        let mount_point = left.split(' ').nth(4)?;
        let mut right = right.split(' ');
        let fstype = right.next()?;
        let source = right.next()?;
        Some(MountEntry {
            mount_point: PathBuf::from(unescape(mount_point)),
            fstype: unescape(fstype).to_string_lossy().into_owned(),
            source: unescape(source).to_string_lossy().into_owned(),
        })
    }
}

/// Undoes mountinfo's `\ooo` escapes.
fn unescape(field: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')));
        match octal.and_then(|v| u8::try_from(v).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    OsString::from_vec(out)
}

/// Whether `e` is a stampfs mount: a FUSE file system (`fuse`, as fuser's mount
/// without fusermount makes it, or `fuse.stampfs` with a subtype) whose source is
/// [`SOURCE`] or `SOURCE:...`.
pub(crate) fn is_stampfs(e: &MountEntry) -> bool {
    let fuse = e.fstype == "fuse" || e.fstype == "fuse.stampfs";
    let ours = e.source == SOURCE
        || e.source
            .strip_prefix(SOURCE)
            .is_some_and(|rest| rest.starts_with(':'));
    fuse && ours
}

/// The topmost mount at `point` in mountinfo `text` (the last line naming it: later
/// mounts are listed later), if any.
pub(crate) fn mount_entry_at(text: &str, point: &Path) -> Option<MountEntry> {
    text.lines()
        .filter_map(MountEntry::parse)
        .rfind(|e| e.mount_point == point)
}

/// What looking at the mount point found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// A directory, with its first few entries (at most [`SAMPLE`] + 1).
    Directory {
        entries: Vec<String>,
    },
    NotADirectory,
    Missing,
    /// `ENOTCONN`: a FUSE mount whose server died.
    Disconnected,
    /// The `stat` or listing did not finish in time.
    NoAnswer,
    /// Any other failure.
    Failed {
        errno: Option<i32>,
    },
}

impl Probe {
    fn of_error(e: &std::io::Error) -> Probe {
        match e.raw_os_error() {
            Some(libc::ENOTCONN) => Probe::Disconnected,
            Some(libc::ENOENT) => Probe::Missing,
            Some(libc::ENOTDIR) => Probe::NotADirectory,
            errno => Probe::Failed { errno },
        }
    }
}

/// The decision: `Ok` when `point` may be mounted on. `top` is the topmost mount at
/// the point, `probe` what a `stat` and a listing found, `nonempty` whether hiding a
/// directory's contents was asked for.
pub(crate) fn decide(
    top: Option<&MountEntry>,
    probe: &Probe,
    nonempty: bool,
) -> Result<(), MountpointProblem> {
    let stampfs = top.filter(|e| is_stampfs(e));
    match probe {
        Probe::Disconnected => Err(MountpointProblem::Stale {
            source: top.map(|e| e.source.clone()),
        }),
        Probe::NoAnswer => Err(MountpointProblem::NoAnswer {
            waited: PROBE_TIMEOUT,
        }),
        _ if stampfs.is_some() => Err(MountpointProblem::AlreadyMounted {
            source: stampfs.map(|e| e.source.clone()).unwrap_or_default(),
        }),
        Probe::Missing => Err(MountpointProblem::Missing),
        Probe::NotADirectory => Err(MountpointProblem::NotADirectory),
        Probe::Failed { errno } => Err(MountpointProblem::Unreadable { errno: *errno }),
        Probe::Directory { entries } if !entries.is_empty() && !nonempty => {
            Err(MountpointProblem::NotEmpty {
                sample: entries.iter().take(SAMPLE).cloned().collect(),
                more: entries.len() > SAMPLE,
            })
        }
        Probe::Directory { .. } => Ok(()),
    }
}

/// `path` made absolute with its directories resolved, without touching `path`
/// itself when it cannot be resolved (a stale mount answers `ENOTCONN` to any
/// `stat`): the form `/proc/self/mountinfo` names mount points by.
pub fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    if let Ok(p) = std::fs::canonicalize(path) {
        return Ok(p);
    }
    let abs = std::path::absolute(path)?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(std::fs::canonicalize(parent)
            .unwrap_or_else(|_| parent.to_path_buf())
            .join(name)),
        _ => Ok(abs),
    }
}

/// Looks at `point` (blocking): `stat`, `opendir` (never cached by the kernel, so a
/// dead FUSE server shows as `ENOTCONN` even while its attributes are still cached),
/// then the first few entries, unless a stampfs mount is there (a live one would have
/// to ask the cluster; a dead one already failed the `opendir`).
pub(crate) fn probe(point: &Path, stampfs_there: bool) -> Probe {
    match std::fs::metadata(point) {
        Err(e) => return Probe::of_error(&e),
        Ok(m) if !m.is_dir() => return Probe::NotADirectory,
        Ok(_) => {}
    }
    let dir = match std::fs::read_dir(point) {
        Ok(_) if stampfs_there => {
            return Probe::Directory {
                entries: Vec::new(),
            }
        }
        Ok(d) => d,
        Err(e) => return Probe::of_error(&e),
    };
    let mut entries = Vec::new();
    for entry in dir.take(SAMPLE + 1) {
        match entry {
            Ok(e) => entries.push(e.file_name().to_string_lossy().into_owned()),
            Err(e) => return Probe::of_error(&e),
        }
    }
    entries.sort();
    Probe::Directory { entries }
}

/// Checks `point` (already [`resolve`]d) as the table above says, the `stat` and
/// listing on a blocking thread for at most [`PROBE_TIMEOUT`].
pub(crate) async fn check(point: &Path, nonempty: bool) -> Result<(), MountpointProblem> {
    let info = tokio::fs::read_to_string("/proc/self/mountinfo")
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read /proc/self/mountinfo; not checking for a mount there");
            String::new()
        });
    let top = mount_entry_at(&info, point);
    let stampfs_there = top.as_ref().is_some_and(is_stampfs);
    let p = point.to_path_buf();
    let looked = tokio::time::timeout(
        PROBE_TIMEOUT,
        tokio::task::spawn_blocking(move || probe(&p, stampfs_there)),
    )
    .await;
    let found = match looked {
        Ok(Ok(found)) => found,
        Ok(Err(_)) => Probe::Failed { errno: None },
        // The blocked thread stays behind; the caller gives up on mounting.
        Err(_) => Probe::NoAnswer,
    };
    decide(top.as_ref(), &found, nonempty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fstype: &str) -> MountEntry {
        MountEntry {
            mount_point: PathBuf::from("/mnt/x"),
            fstype: fstype.into(),
            source: "stampfs:127.0.0.1:7070".into(),
        }
    }

    fn dir(names: &[&str]) -> Probe {
        Probe::Directory {
            entries: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    /// A line as the kernel writes it for `stampfs mount` (fuser mounts type `fuse`).
    const STAMPFS_LINE: &str = "812 29 0:77 / /tmp/stampfs-mnt-x/mnt rw,nosuid,nodev,noatime \
         shared:441 - fuse stampfs:127.0.0.1:7070 rw,user_id=0,group_id=0,default_permissions";

    #[test]
    fn a_mountinfo_line_gives_its_mount_point_type_and_source() {
        let e = MountEntry::parse(STAMPFS_LINE).expect("parses");
        assert_eq!(e.mount_point, PathBuf::from("/tmp/stampfs-mnt-x/mnt"));
        assert_eq!(e.fstype, "fuse");
        assert_eq!(e.source, "stampfs:127.0.0.1:7070");
        assert!(is_stampfs(&e));
    }

    #[test]
    fn only_fuse_mounts_named_stampfs_are_stampfs_mounts() {
        let with = |fstype: &str, source: &str| MountEntry {
            source: source.into(),
            ..entry(fstype)
        };
        assert!(is_stampfs(&with("fuse", "stampfs")));
        assert!(is_stampfs(&with("fuse.stampfs", "stampfs:10.0.0.1:7070")));
        assert!(!is_stampfs(&with("fuse", "sshfs#host:/")));
        assert!(!is_stampfs(&with("fuse", "stampfsX")));
        assert!(!is_stampfs(&with("tmpfs", "stampfs")));
    }

    #[test]
    fn escaped_spaces_in_a_mount_point_are_decoded() {
        let line = "30 1 0:5 / /mnt/my\\040dir\\134x rw - tmpfs tmpfs rw";
        let e = MountEntry::parse(line).expect("parses");
        assert_eq!(e.mount_point, PathBuf::from("/mnt/my dir\\x"));
        assert_eq!(e.fstype, "tmpfs");
    }

    #[test]
    fn a_malformed_line_is_skipped() {
        assert_eq!(MountEntry::parse("garbage"), None);
        assert_eq!(MountEntry::parse("1 2 3 - x"), None);
    }

    #[test]
    fn the_topmost_mount_at_a_point_is_the_last_listed() {
        let text = format!(
            "25 1 8:1 / / rw - ext4 /dev/vda rw\n\
             700 25 0:60 / /mnt/x rw - tmpfs tmpfs rw\n\
             {}\n",
            STAMPFS_LINE.replace("/tmp/stampfs-mnt-x/mnt", "/mnt/x")
        );
        let top = mount_entry_at(&text, Path::new("/mnt/x")).expect("mounted");
        assert!(is_stampfs(&top), "{top:?}");
        assert_eq!(mount_entry_at(&text, Path::new("/mnt")), None);
    }

    #[test]
    fn an_empty_directory_is_accepted() {
        assert_eq!(decide(None, &dir(&[]), false), Ok(()));
    }

    #[test]
    fn an_empty_mount_of_another_file_system_is_accepted() {
        assert_eq!(decide(Some(&entry("tmpfs")), &dir(&[]), false), Ok(()));
    }

    #[test]
    fn a_non_empty_directory_is_refused_naming_a_few_entries() {
        let got = decide(None, &dir(&["a", "b", "c", "d"]), false);
        assert_eq!(
            got,
            Err(MountpointProblem::NotEmpty {
                sample: vec!["a".into(), "b".into(), "c".into()],
                more: true
            })
        );
        let text = got.expect_err("refused").to_string();
        assert!(text.contains("--nonempty"), "{text}");
    }

    #[test]
    fn a_non_empty_directory_is_accepted_with_nonempty() {
        assert_eq!(decide(None, &dir(&["a"]), true), Ok(()));
    }

    #[test]
    fn a_live_stampfs_mount_is_refused_even_with_nonempty() {
        for nonempty in [false, true] {
            assert_eq!(
                decide(Some(&entry("fuse")), &dir(&[]), nonempty),
                Err(MountpointProblem::AlreadyMounted {
                    source: "stampfs:127.0.0.1:7070".into()
                })
            );
        }
    }

    #[test]
    fn a_disconnected_mount_is_stale() {
        assert_eq!(
            decide(Some(&entry("fuse")), &Probe::Disconnected, true),
            Err(MountpointProblem::Stale {
                source: Some("stampfs:127.0.0.1:7070".into())
            })
        );
        assert_eq!(
            decide(None, &Probe::Disconnected, false),
            Err(MountpointProblem::Stale { source: None })
        );
    }

    #[test]
    fn a_mount_point_that_does_not_answer_is_refused() {
        assert!(matches!(
            decide(Some(&entry("fuse.other")), &Probe::NoAnswer, true),
            Err(MountpointProblem::NoAnswer { .. })
        ));
    }

    #[test]
    fn a_missing_path_or_a_file_is_refused() {
        assert_eq!(
            decide(None, &Probe::Missing, true),
            Err(MountpointProblem::Missing)
        );
        assert_eq!(
            decide(None, &Probe::NotADirectory, true),
            Err(MountpointProblem::NotADirectory)
        );
    }

    #[test]
    fn probing_a_real_directory_lists_its_first_entries() {
        let d = tempfile::tempdir().expect("tempdir");
        assert_eq!(probe(d.path(), false), dir(&[]));
        for n in ["e", "d", "c", "b", "a"] {
            std::fs::write(d.path().join(n), b"").expect("file");
        }
        let Probe::Directory { entries } = probe(d.path(), false) else {
            panic!("a directory");
        };
        assert_eq!(entries.len(), SAMPLE + 1);
        assert_eq!(probe(&d.path().join("a"), false), Probe::NotADirectory);
        assert_eq!(probe(&d.path().join("zz"), false), Probe::Missing);
    }

    #[test]
    fn resolving_a_missing_leaf_keeps_its_name_under_the_resolved_parent() {
        let d = tempfile::tempdir().expect("tempdir");
        let parent = d.path().canonicalize().expect("canonical");
        assert_eq!(
            resolve(&d.path().join("nope")).expect("resolves"),
            parent.join("nope")
        );
        assert_eq!(resolve(d.path()).expect("resolves"), parent);
    }
}
