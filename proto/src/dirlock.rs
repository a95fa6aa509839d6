//! One server per data directory: an exclusive advisory lock on `DIR/LOCK`.
//!
//! A master and a chunkserver each take a [`DirLock`] on their directory at start-up,
//! before they read or change anything in it, and hold it for as long as they serve
//! from it. A second server on the same directory fails at once with
//! [`DirLockError::Locked`], naming the directory and the pid of the holder.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file in a server's directory (see [`DirLock`]).
pub const LOCK_FILE: &str = "LOCK";

/// An exclusive advisory lock on a server's directory: `flock(LOCK_EX | LOCK_NB)` on
/// `DIR/LOCK`, with the holder's pid written into the file once it is locked (for the
/// error a second server reports). The lock belongs to the open file description, so
/// it excludes a second server in another process and in this one alike; it is
/// released when this value is dropped or the process ends, however it ends. The file
/// itself stays (removing it would let two processes lock two different files).
#[derive(Debug)]
pub struct DirLock {
    /// The open `DIR/LOCK`; the lock lives exactly as long as this descriptor.
    _file: File,
}

/// Why a [`DirLock`] could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    /// Another holder (in any process) has the directory.
    #[error(
        "directory {} is locked by another process ({})",
        .dir.display(),
        describe_holder(.holder)
    )]
    Locked {
        dir: PathBuf,
        /// The pid the holder wrote into `DIR/LOCK`, if it has written it yet.
        holder: Option<u32>,
    },
    /// The lock file could not be opened, locked or written.
    #[error("lock {}: {source}", .path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl DirLock {
    /// Locks `dir` (which must exist), or fails with [`DirLockError::Locked`] naming
    /// the directory and, when it has written it, the pid of the process holding it.
    pub fn acquire(dir: &Path) -> Result<Self, DirLockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| DirLockError::Io {
            path: path.clone(),
            source,
        };
        // No truncation on open: the file may hold the current holder's pid.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                return Err(DirLockError::Locked {
                    dir: dir.to_path_buf(),
                    holder: holder_pid(&mut file),
                });
            }
            Err(e) => return Err(io(e.into())),
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(io)?;
        Ok(Self { _file: file })
    }
}

/// How an error names the holder of a lock: `pid N`, or that it has not written its
/// pid yet. Servers use it in their own "directory in use" messages.
pub fn describe_holder(holder: &Option<u32>) -> String {
    match holder {
        Some(pid) => format!("pid {pid}"),
        None => "pid not recorded yet".into(),
    }
}

/// The pid in a lock file; `None` when the holder has not written it yet.
fn holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_locked_once_and_released_on_drop() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pid = std::process::id();
        let first = DirLock::acquire(tmp.path()).expect("first lock");
        let written = std::fs::read_to_string(tmp.path().join(LOCK_FILE)).expect("read");
        assert_eq!(written, format!("{pid}\n"));
        for _ in 0..2 {
            match DirLock::acquire(tmp.path()) {
                Err(DirLockError::Locked { dir, holder }) => {
                    assert_eq!(dir, tmp.path());
                    assert_eq!(holder, Some(pid));
                }
                other => panic!("a second lock must fail, got {other:?}"),
            }
        }
        // A failed attempt leaves the holder's pid alone.
        let written = std::fs::read_to_string(tmp.path().join(LOCK_FILE)).expect("read");
        assert_eq!(written, format!("{pid}\n"));
        drop(first);
        let again = DirLock::acquire(tmp.path()).expect("lock after release");
        drop(again);
        // A stale file (a longer pid from a dead holder) does not confuse the next one.
        std::fs::write(tmp.path().join(LOCK_FILE), "4294967295\n").expect("write");
        let _held = DirLock::acquire(tmp.path()).expect("lock over a stale file");
        let written = std::fs::read_to_string(tmp.path().join(LOCK_FILE)).expect("read");
        assert_eq!(written, format!("{pid}\n"));
    }

    #[test]
    fn a_holder_without_a_pid_yet_is_reported_as_such() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join(LOCK_FILE);
        // Locked by hand, with nothing written: a holder caught between lock and write.
        let f = File::create(&path).expect("create");
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("flock");
        let e = DirLock::acquire(tmp.path()).expect_err("locked");
        assert!(
            matches!(e, DirLockError::Locked { holder: None, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("pid not recorded yet"), "{e}");
    }

    #[test]
    fn the_error_names_the_directory_and_the_holder() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let _held = DirLock::acquire(tmp.path()).expect("lock");
        let e = DirLock::acquire(tmp.path()).expect_err("locked");
        let text = e.to_string();
        assert!(text.contains(&tmp.path().display().to_string()), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
    }

    #[test]
    fn a_missing_directory_is_an_io_error_naming_the_lock_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("missing");
        match DirLock::acquire(&missing) {
            Err(e @ DirLockError::Io { .. }) => {
                assert!(e
                    .to_string()
                    .contains(&missing.join(LOCK_FILE).display().to_string()));
            }
            other => panic!("expected an I/O error, got {other:?}"),
        }
        assert!(!missing.exists(), "acquire never creates the directory");
    }
}
