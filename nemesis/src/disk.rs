//! Small data file systems for chunkservers, and filling them up.
//!
//! A [`SmallDisk`] is a tmpfs of a fixed size mounted on a chunkserver's data dir before
//! the chunkserver first starts (root only). [`SmallDisk::fill`] allocates a ballast
//! file over every free byte, so the chunkserver's next write, header update or new
//! replica fails with `ENOSPC`; [`SmallDisk::free`] deletes the ballast. The file
//! system outlives the chunkserver's restarts; it is unmounted on drop, after the run
//! has killed its processes, and its contents are first copied to `DIR.kept` unless the
//! run passed ([`SmallDisk::discard`]).

use crate::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The ballast file's name in the data dir (the chunkserver ignores unknown files).
const BALLAST: &str = "nemesis-ballast";

/// A tmpfs on a chunkserver's data dir.
pub struct SmallDisk {
    dir: PathBuf,
    /// Copy the contents out before unmounting (the evidence of a failing run); cleared
    /// by [`SmallDisk::discard`] once the run passed.
    keep: std::sync::atomic::AtomicBool,
}

fn err(dir: &Path, what: &str, detail: impl std::fmt::Display) -> Error {
    Error::Disk {
        dir: dir.to_path_buf(),
        what: what.into(),
        detail: detail.to_string(),
    }
}

impl SmallDisk {
    /// Mounts a tmpfs of `mib` MiB on `dir` (created if missing, must be empty).
    pub fn mount(dir: &Path, mib: u64) -> Result<SmallDisk> {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={mib}m,mode=0755"))
            .arg("stampfs-nemesis")
            .arg(dir)
            .output()
            .map_err(|e| err(dir, "mount", e))?;
        if !out.status.success() {
            return Err(err(
                dir,
                "mount",
                String::from_utf8_lossy(&out.stderr).trim(),
            ));
        }
        Ok(SmallDisk {
            dir: dir.to_path_buf(),
            keep: std::sync::atomic::AtomicBool::new(true),
        })
    }

    fn ballast(&self) -> PathBuf {
        self.dir.join(BALLAST)
    }

    /// Bytes still free for an unprivileged writer.
    fn available(&self) -> Result<u64> {
        let st = nix::sys::statvfs::statvfs(&self.dir).map_err(|e| err(&self.dir, "statvfs", e))?;
        Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
    }

    /// Takes every free byte; returns how many it took.
    pub fn fill(&self) -> Result<u64> {
        let path = self.ballast();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(Error::io(&path))?;
        let before = f.metadata().map_err(Error::io(&path))?.len();
        let free = self.available()?;
        if free > 0 {
            // Reserve the space at once, then take the last pages one by one.
            let _ = nix::fcntl::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                nix::fcntl::FallocateFlags::empty(),
                before as i64,
                free as i64,
            );
        }
        let page = [0u8; 4096];
        while f.write(&page).is_ok_and(|n| n > 0) {}
        let after = f.metadata().map_err(Error::io(&path))?.len();
        Ok(after.saturating_sub(before))
    }

    /// Copies what the file system holds (but the ballast) to `DIR.kept`, so a failing
    /// run's replicas outlive the unmount.
    pub fn keep_copy(&self) -> Result<PathBuf> {
        let _ = self.free();
        let mut to = self.dir.clone().into_os_string();
        to.push(".kept");
        let to = PathBuf::from(to);
        let out = Command::new("cp")
            .arg("-a")
            .arg(self.dir.join("."))
            .arg(&to)
            .output()
            .map_err(|e| err(&self.dir, "copy", e))?;
        if !out.status.success() {
            return Err(err(
                &self.dir,
                "copy",
                String::from_utf8_lossy(&out.stderr).trim(),
            ));
        }
        Ok(to)
    }

    /// Unmount without keeping a copy.
    pub fn discard(&self) {
        self.keep.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Deletes the ballast.
    pub fn free(&self) -> Result<()> {
        match std::fs::remove_file(self.ballast()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(self.ballast())(e)),
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.free();
        if self.keep.load(std::sync::atomic::Ordering::Relaxed) {
            match self.keep_copy() {
                Ok(to) => tracing::info!(kept = %to.display(), "replicas kept"),
                Err(e) => tracing::warn!(error = %e, "cannot keep the replicas"),
            }
        }
        let out = Command::new("umount").arg(&self.dir).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            // Still busy (a process that was not reaped): detach it.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        }
    }
}
