//! A log file appended to over zeros written ahead ("Records overwrite zeros" in the
//! module doc of `oplog.rs`): the operation log's segments and the master group's
//! (`raft/log_store.rs`) both write this way.

use super::{sync_dir, PREALLOC, PREALLOC_MARGIN};
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// An open log file: records end at `pos`, zeros run from there to `allocated` (the
/// file's size).
#[derive(Debug)]
pub(crate) struct ZeroAhead {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    pub(crate) pos: u64,
    pub(crate) allocated: u64,
}

impl ZeroAhead {
    /// Creates `path` (replacing what was there) with `header` and [`PREALLOC`] zeros
    /// after it, all durable, and the directory entry too.
    pub(crate) fn create(dir: &Path, path: PathBuf, header: &[u8]) -> Result<ZeroAhead> {
        let what = format!("create {}", path.display());
        let io = |e| Error::io(what.clone(), e);
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .map_err(io)?;
        file.write_all(header).map_err(io)?;
        let mut z = ZeroAhead {
            path,
            file,
            pos: header.len() as u64,
            allocated: header.len() as u64,
        };
        z.pad()?;
        z.file.sync_all().map_err(io)?;
        sync_dir(dir)?;
        Ok(z)
    }

    /// An error of an operation `what` on this file.
    pub(crate) fn io(&self, what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
        let what = format!("{what} {}", self.path.display());
        move |e| Error::io(what.clone(), e)
    }

    /// Writes [`PREALLOC`] more zeros past the allocated end (not synced).
    pub(crate) fn pad(&mut self) -> Result<()> {
        let zeros = vec![0u8; PREALLOC as usize];
        self.file
            .write_all_at(&zeros, self.allocated)
            .map_err(self.io("preallocate"))?;
        self.allocated += PREALLOC;
        Ok(())
    }

    /// Writes `buf` after the last record and makes it durable: padding first when the
    /// zeros run short, so the `fdatasync` of a small write finds the file's size
    /// unchanged.
    pub(crate) fn write_durably(&mut self, buf: &[u8]) -> Result<()> {
        let end = self.pos + buf.len() as u64;
        while end + PREALLOC_MARGIN > self.allocated {
            self.pad()?;
        }
        self.file
            .write_all_at(buf, self.pos)
            .and_then(|()| self.file.sync_data())
            .map_err(self.io("append to"))?;
        self.pos = end;
        Ok(())
    }

    /// Cuts the zeros off, durably: a file that is no longer appended to holds only
    /// records.
    pub(crate) fn seal(&mut self) -> Result<()> {
        self.file
            .set_len(self.pos)
            .and_then(|()| self.file.sync_all())
            .map_err(self.io("truncate"))?;
        self.allocated = self.pos;
        Ok(())
    }

    /// Cuts the file to `at` (dropping every record from there), writes zeros ahead
    /// again and syncs, size included.
    pub(crate) fn cut(&mut self, at: u64) -> Result<()> {
        self.file.set_len(at).map_err(self.io("truncate"))?;
        self.pos = at;
        self.allocated = at;
        self.pad()?;
        self.file.sync_all().map_err(self.io("sync"))
    }
}
