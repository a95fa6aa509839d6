//! The subdirectory layout (`DIR/<hh>/<handle>.chunk`) and the migration of a flat
//! layout (`DIR/<handle>.chunk`, earlier versions) at start-up: every replica moved
//! into place and still served, moved-aside files moved along, temporary files
//! removed, other files left alone; a migration cut short by a crash (some files
//! moved, some not, a rename whose old name survived) finished by the next start;
//! bad input on disk an error or ignored, never a panic.

mod common;

use bytes::Bytes;
use common::{engine, engines, init_tracing, pattern};
use stampfs_chunkserver::layout::{self, replica_path, Placed};
use stampfs_chunkserver::store::{ScanStats, Store};
use stampfs_chunkserver::{Error, IoEngineKind};
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaReport};
use std::path::{Path, PathBuf};

fn v(n: u64) -> ChunkVersion {
    ChunkVersion(n)
}

/// Handles spread over several subdirectories, two of them sharing one.
const HANDLES: [u64; 6] = [0x1, 0x2a, 0x12a, 0xff, 0x100, 0xabcdef];

fn data_of(h: u64) -> Vec<u8> {
    pattern(1000 + (h % 97) as usize * 700, h)
}

/// A store holding every replica of [`HANDLES`]: finalized, written and hsynced, or
/// bumped twice; returns their reports.
async fn populate(dir: &Path, kind: IoEngineKind) -> Vec<ReplicaReport> {
    let s = Store::open(dir, engine(kind)).await.expect("open");
    for (i, h) in HANDLES.iter().map(|h| ChunkHandle(*h)).enumerate() {
        let data = data_of(h.0);
        s.bump_version(h, v(1), true).await.expect("create");
        s.write(h, v(1), 0, Bytes::from(data.clone()), true)
            .await
            .expect("write");
        match i % 3 {
            0 => {
                s.finalize(h, v(1), data.len() as u64)
                    .await
                    .expect("finalize");
            }
            1 => {}
            _ => {
                s.bump_version(h, v(3), false).await.expect("bump");
            }
        }
    }
    s.reports().await
}

/// The file of `h` with `suffix` appended, in `dir`.
fn flat(dir: &Path, h: u64, suffix: &str) -> PathBuf {
    dir.join(format!("{:016x}.chunk{suffix}", h))
}

fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// Moves every replica file back to `dir` itself and removes the subdirectories: the
/// layout of earlier versions (the file format is the same).
fn flatten(dir: &Path) {
    for index in 0..layout::SUBDIRS {
        let sub = dir.join(layout::subdir_name(index));
        for e in std::fs::read_dir(&sub).expect("subdir") {
            let e = e.expect("entry");
            std::fs::rename(e.path(), dir.join(e.file_name())).expect("flatten");
        }
        std::fs::remove_dir(&sub).expect("remove subdir");
    }
}

/// Reads every replica back and compares it with what was written.
async fn check_served(s: &Store, want: &[ReplicaReport]) {
    assert_eq!(s.reports().await, want);
    for r in want {
        let (got_report, got) = s.read(r.handle, r.version, 0, 1 << 20).await.expect("read");
        assert_eq!(got_report, *r);
        assert!(got[..] == data_of(r.handle.0)[..], "{}'s data", r.handle);
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn new_replicas_go_into_the_subdirectory_of_their_handles_low_byte() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let want = populate(dir.path(), IoEngineKind::Threads).await;
    assert_eq!(want.len(), HANDLES.len());
    for h in HANDLES {
        let path = replica_path(dir.path(), ChunkHandle(h));
        assert_eq!(
            path.parent().and_then(|p| p.file_name()),
            Some(std::ffi::OsStr::new(&format!("{:02x}", h & 0xff)))
        );
        assert!(path.exists(), "{}", path.display());
    }
    let subdirs = names_in(dir.path());
    assert_eq!(subdirs.len(), 256, "00 .. ff and nothing else");
    assert!(subdirs
        .iter()
        .all(|n| layout::parse_subdir(n.as_ref()).is_some()));
}

#[tokio::test]
async fn a_flat_layout_is_migrated_and_every_replica_still_serves() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let want = populate(d, kind).await;
        flatten(d);
        // What else a flat directory of an earlier version may hold.
        std::fs::write(flat(d, 0x77, ".corrupt"), b"moved aside long ago").expect("aside");
        std::fs::write(flat(d, 0x77, ".corrupt.1"), b"and again").expect("aside");
        std::fs::write(flat(d, 0x78, ".tmp"), b"creation cut short").expect("tmp");
        std::fs::write(flat(d, 0x79, ".recv-00000000000000aa.tmp"), b"copy").expect("tmp");
        std::fs::write(d.join("chunkserver.id"), b"7\n").expect("id");
        std::fs::write(d.join("notes.txt"), b"an operator's").expect("stray");
        std::fs::write(d.join("000000000000002A.chunk"), b"upper case").expect("odd");
        std::fs::create_dir(d.join("zz")).expect("odd dir");
        std::fs::create_dir(d.join("00000000000000aa.chunk")).expect("dir named a replica");
        {
            use std::os::unix::ffi::OsStrExt;
            let odd = std::ffi::OsStr::from_bytes(b"\xff\xfe.chunk");
            std::fs::write(d.join(odd), b"not utf-8").expect("non-utf8 name");
        }

        let (s, stats) = Store::open_with_stats(d, engine(kind))
            .await
            .expect("migrates");
        assert_eq!(
            stats.placed,
            Placed {
                moved: HANDLES.len() as u64,
                moved_aside: 2,
                links_removed: 0,
                duplicates: 0,
                temps_removed: 2,
            },
            "{kind:?}"
        );
        assert_eq!(stats.replicas, HANDLES.len() as u64);
        assert_eq!(stats.corrupt, 0);
        assert!(
            s.take_corrupt().is_empty(),
            "{kind:?}: nothing looks corrupt"
        );
        check_served(&s, &want).await;
        for h in HANDLES {
            assert!(replica_path(d, ChunkHandle(h)).exists());
            assert!(!flat(d, h, "").exists(), "{h:x} left the flat place");
        }
        let aside = replica_path(d, ChunkHandle(0x77));
        assert_eq!(
            std::fs::read(beside(&aside, ".corrupt")).expect("moved along"),
            b"moved aside long ago"
        );
        assert!(beside(&aside, ".corrupt.1").exists());
        // Not the store's: untouched, where they were.
        for stray in [
            "chunkserver.id",
            "notes.txt",
            "000000000000002A.chunk",
            "zz",
            "00000000000000aa.chunk",
        ] {
            assert!(d.join(stray).exists(), "{stray} stays");
        }
        // Writes after the migration go to the subdirectories; a restart moves nothing.
        let h = ChunkHandle(0x5555);
        s.bump_version(h, v(1), true).await.expect("create");
        drop(s);
        assert!(replica_path(d, h).exists());
        let (s, stats) = Store::open_with_stats(d, engine(kind))
            .await
            .expect("reopen");
        assert_eq!(
            stats.placed,
            Placed::default(),
            "{kind:?}: nothing left to move"
        );
        assert_eq!(s.reports().await.len(), HANDLES.len() + 1);
    }
}

#[tokio::test]
async fn a_migration_cut_short_by_a_crash_is_finished_by_the_next_start() {
    init_tracing();
    let kind = IoEngineKind::Threads;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let want = populate(d, kind).await;
    flatten(d);
    // The crash: the subdirectories exist, the first three replicas were renamed
    // into theirs, the rest were not; the fourth's rename reached the disk but the
    // removal of its old name did not (both names, one inode).
    for index in 0..layout::SUBDIRS {
        std::fs::create_dir(d.join(layout::subdir_name(index))).expect("subdir");
    }
    for h in &HANDLES[..3] {
        std::fs::rename(flat(d, *h, ""), replica_path(d, ChunkHandle(*h))).expect("moved");
    }
    let both = HANDLES[3];
    std::fs::hard_link(flat(d, both, ""), replica_path(d, ChunkHandle(both))).expect("link");

    let (s, stats) = Store::open_with_stats(d, engine(kind))
        .await
        .expect("finishes the migration");
    assert_eq!(stats.placed.moved, (HANDLES.len() - 4) as u64);
    assert_eq!(stats.placed.links_removed, 1);
    assert_eq!(stats.placed.duplicates, 0);
    assert!(s.take_corrupt().is_empty());
    check_served(&s, &want).await;
    assert!(!flat(d, both, "").exists(), "the second name is gone");
    assert_eq!(
        std::fs::metadata(replica_path(d, ChunkHandle(both)))
            .map(|m| std::os::unix::fs::MetadataExt::nlink(&m))
            .expect("in place"),
        1
    );
    drop(s);
    let (s, stats) = Store::open_with_stats(d, engine(kind))
        .await
        .expect("again");
    assert_eq!(stats.placed, Placed::default());
    check_served(&s, &want).await;
}

#[tokio::test]
async fn a_second_file_for_a_replica_in_place_goes_aside_and_the_one_in_place_wins() {
    init_tracing();
    let kind = IoEngineKind::Threads;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let want = populate(d, kind).await;
    let h = HANDLES[1];
    // An older copy of the replica under the flat name (an operator's restore, a
    // downgrade that wrote the flat layout again).
    std::fs::copy(replica_path(d, ChunkHandle(HANDLES[0])), flat(d, h, "")).expect("copy");
    let (s, stats) = Store::open_with_stats(d, engine(kind)).await.expect("open");
    assert_eq!(stats.placed.duplicates, 1);
    assert!(s.take_corrupt().is_empty());
    check_served(&s, &want).await;
    assert!(beside(&replica_path(d, ChunkHandle(h)), ".duplicate").exists());
    assert!(!flat(d, h, "").exists());
}

#[tokio::test]
async fn a_replica_in_the_wrong_subdirectory_is_put_in_place_and_served() {
    init_tracing();
    let kind = IoEngineKind::Threads;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let want = populate(d, kind).await;
    // One goes to a subdirectory read before its own, one to one read after it.
    let (early, late) = (ChunkHandle(0xff), ChunkHandle(0x1));
    let early_wrong = d.join("00").join(layout::replica_name(early));
    let late_wrong = d.join("fe").join(layout::replica_name(late));
    std::fs::rename(replica_path(d, early), &early_wrong).expect("misplace");
    std::fs::rename(replica_path(d, late), &late_wrong).expect("misplace");
    let (s, stats) = Store::open_with_stats(d, engine(kind)).await.expect("open");
    assert_eq!(stats.placed.moved, 2);
    assert_eq!(stats.replicas, HANDLES.len() as u64);
    check_served(&s, &want).await;
    assert!(!early_wrong.exists() && !late_wrong.exists());
    assert!(replica_path(d, early).exists() && replica_path(d, late).exists());
}

#[tokio::test]
async fn corrupt_and_temporary_files_in_the_subdirectories_keep_working() {
    init_tracing();
    let kind = IoEngineKind::Threads;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let want = populate(d, kind).await;
    let bad = ChunkHandle(0xbad);
    std::fs::write(replica_path(d, bad), pattern(100_000, 4)).expect("garbage");
    let tmp = beside(&replica_path(d, bad), ".recv-0000000000000001.tmp");
    std::fs::write(&tmp, b"a copy cut short").expect("tmp");
    let old_aside = beside(&replica_path(d, ChunkHandle(0x2a)), ".corrupt");
    std::fs::write(&old_aside, b"kept").expect("aside");
    let (s, stats) = Store::open_with_stats(d, engine(kind)).await.expect("open");
    assert_eq!(
        (stats.corrupt, stats.placed.temps_removed),
        (1, 1),
        "{stats:?}"
    );
    assert_eq!(s.take_corrupt(), vec![bad]);
    check_served(&s, &want).await;
    assert!(
        beside(&replica_path(d, bad), ".corrupt").exists(),
        "moved aside"
    );
    assert!(!tmp.exists(), "removed");
    assert_eq!(std::fs::read(&old_aside).expect("kept"), b"kept");
}

#[tokio::test]
async fn bad_input_on_disk_is_an_error_or_ignored_never_a_panic() {
    init_tracing();
    let kind = IoEngineKind::Threads;
    // A subdirectory's name taken by a file: the store does not open, and says why.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("3a"), b"not a directory").expect("file");
    let err = Store::open(dir.path(), engine(kind)).await.unwrap_err();
    assert!(
        matches!(&err, Error::Io { path, .. } if path.ends_with("3a")),
        "{err}"
    );

    // A subdirectory that is a dangling symlink: the same.
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join("7f")).expect("link");
    let err = Store::open(dir.path(), engine(kind)).await.unwrap_err();
    assert!(
        matches!(&err, Error::Io { path, .. } if path.ends_with("7f")),
        "{err}"
    );

    // Symlinks, directories and odd names inside a subdirectory are ignored.
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let want = populate(d, kind).await;
    let sub = d.join("2a");
    std::os::unix::fs::symlink("/etc/passwd", sub.join("000000000000082a.chunk")).expect("link");
    std::fs::create_dir(sub.join("000000000000092a.chunk")).expect("dir");
    std::fs::write(sub.join("0000000000000a2a.CHUNK"), b"x").expect("odd");
    std::fs::write(sub.join(".hidden"), b"x").expect("odd");
    let (s, stats): (Store, ScanStats) =
        Store::open_with_stats(d, engine(kind)).await.expect("open");
    assert_eq!(stats.ignored, 4, "{stats:?}");
    check_served(&s, &want).await;
    drop(s);

    // An unreadable subdirectory fails the start with its path (as root, permissions
    // do not stop reads).
    let sub = d.join("01");
    let mode = |m| {
        std::fs::set_permissions(&sub, std::os::unix::fs::PermissionsExt::from_mode(m))
            .expect("chmod")
    };
    mode(0o000);
    let unreadable = std::fs::read_dir(&sub).is_err();
    let res = Store::open(d, engine(kind)).await;
    mode(0o755);
    if unreadable {
        let err = res.unwrap_err();
        assert!(
            matches!(&err, Error::Io { path, .. } if path.ends_with("01")),
            "{err}"
        );
    } else {
        println!("SKIPPED: running as root, a mode of 000 does not make a directory unreadable");
        res.expect("opens");
    }
}
