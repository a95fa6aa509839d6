//! File-system helpers of the store: blocking work off the async threads, durable
//! atomic replacement of a small file, and moving a replica aside.

use super::{sync_dir, CORRUPT_SUFFIX, TEMP_SUFFIX};
use super::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Runs blocking file-system work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io {
            op: "blocking task",
            path: String::new(),
            source: std::io::Error::other(e.to_string()),
        })?
}

/// Writes `contents` to `path` durably and atomically: temp file, fsync, rename, fsync
/// of the directory.
pub fn replace_file(path: &Path, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(TEMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
        f.write_all(contents)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io("write", &tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io("rename", &tmp, e))?;
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => sync_dir(dir),
        None => sync_dir(Path::new(".")),
    }
}

/// Renames `path` aside as `<name>.corrupt` (or `<name>.corrupt.N` if taken); returns
/// the new path.
pub(crate) fn move_aside(path: &Path) -> Result<PathBuf> {
    let mut n = 0u32;
    loop {
        let mut name = path.as_os_str().to_owned();
        name.push(CORRUPT_SUFFIX);
        if n > 0 {
            name.push(format!(".{n}"));
        }
        let dst = PathBuf::from(name);
        if !dst.exists() {
            std::fs::rename(path, &dst).map_err(|e| Error::io("rename aside", path, e))?;
            if let Some(dir) = path.parent() {
                sync_dir(dir)?;
            }
            return Ok(dst);
        }
        n += 1;
    }
}

/// Whether `dir`'s file system punches holes (`fallocate(PUNCH_HOLE | KEEP_SIZE)`), so
/// zeros in packets can be written as holes (`io::sparse`). Probed on a scratch file;
/// logged either way. A file system that cannot (or a probe that fails) gets zeros
/// written as they come.
pub(super) fn holes_work(dir: &Path) -> bool {
    let path = dir.join(format!("hole-probe{TEMP_SUFFIX}"));
    let probe = || -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        f.write_all_at(&[0xa5; 3 * 4096], 0)?;
        crate::io::punch_hole(&f, 4096, 4096)?;
        let mut page = [0xffu8; 4096];
        f.read_exact_at(&mut page, 4096)?;
        if page.iter().any(|b| *b != 0) {
            return Err(std::io::Error::other(
                "a punched range does not read as zeros",
            ));
        }
        Ok(())
    };
    let result = probe();
    let _ = std::fs::remove_file(&path);
    match result {
        Ok(()) => {
            tracing::info!(dir = %dir.display(), "zeros in packets are written as holes");
            true
        }
        Err(e) => {
            tracing::info!(dir = %dir.display(), error = %e, "the file system does not punch holes: zeros are written");
            false
        }
    }
}
