//! The mount's read path: opening for read, and reads of a read handle (through its
//! [`FileReader`] and read-ahead, after hflushing this mount's writers of the file when
//! it wrote in place or the kernel asks past what the reader saw).

use super::*;

/// Reads up to `size` bytes at `offset` through the reader's read-ahead buffer
/// (fewer only at the end of the file).
pub(super) async fn read_from(
    reader: &mut FileReader,
    path: &str,
    offset: u64,
    size: u32,
) -> Result<Vec<u8>, Errno> {
    let io = |e: std::io::Error| errno_for(&Error::from_io(e), "read", path);
    reader.seek(SeekFrom::Start(offset)).await.map_err(io)?;
    let mut buf = vec![0u8; size.min(MAX_READ) as usize];
    let mut n = 0;
    while n < buf.len() {
        let got = reader.read(&mut buf[n..]).await.map_err(io)?;
        if got == 0 {
            break;
        }
        n += got;
    }
    buf.truncate(n);
    Ok(buf)
}

impl Shared {
    #[tracing::instrument(skip_all, fields(%path))]
    pub(super) async fn open_read(&self, ino: INodeNo, path: String) -> Result<u64, Errno> {
        let reader = self
            .client
            .open(&path)
            .await
            .map_err(|e| errno_for(&e, "open", &path))?;
        let generation = self.generation.load(Ordering::SeqCst);
        let h = ReadHandle {
            ino: ino.0,
            path,
            reader: tokio::sync::Mutex::new((reader, generation)),
        };
        Ok(lock(&self.handles).insert(Handle::Read(Arc::new(h))))
    }

    #[tracing::instrument(skip_all, fields(path = %h.path, offset = offset, size = size))]
    pub(super) async fn read(
        &self,
        h: &ReadHandle,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let mut guard = h.reader.lock().await;
        let (reader, seen) = &mut *guard;
        let want_end = offset.saturating_add(u64::from(size));
        // A program reads what it wrote through this mount, as on a local file system:
        // bytes written in place are hflushed first, and then what this reader read
        // ahead may be old.
        if lock(&self.handles).overwrote(h.ino) {
            self.flush_local_writers(h.ino).await;
        }
        let generation = self.generation.load(Ordering::SeqCst);
        if generation != *seen {
            if let Ok(fresh) = self.client.open(&h.path).await {
                *reader = fresh;
                *seen = generation;
            }
        }
        if want_end > reader.len() {
            // The kernel thinks the file is longer than when this reader looked: it
            // grew. If this mount wrote the bytes, hflush them first; then look again.
            if lock(&self.handles)
                .local_size(h.ino)
                .is_some_and(|n| n > reader.len())
            {
                self.flush_local_writers(h.ino).await;
            }
            if let Ok(fresh) = self.client.open(&h.path).await {
                if fresh.len() > reader.len() {
                    *reader = fresh;
                }
            }
        }
        let mut data = read_from(reader, &h.path, offset, size).await?;
        // A read that comes back short below the size the kernel was told would be
        // shown as zeros (the kernel fills the rest of its pages). The readable length
        // of a file being written can fall back for a moment (a master that restarted
        // and does not list every replica yet): look again a few times.
        for attempt in 0..=SHORT_READ_RETRIES {
            let told = lock(&self.told).get(&h.ino).copied();
            match short_read_verdict(offset, size, data.len(), told) {
                ShortRead::Fine => return Ok(data),
                ShortRead::Retry if attempt < SHORT_READ_RETRIES => {
                    tokio::time::sleep(SHORT_READ_WAIT).await;
                    if let Ok(fresh) = self.client.open(&h.path).await {
                        if fresh.len() > reader.len() {
                            *reader = fresh;
                        }
                    }
                    data = read_from(reader, &h.path, offset, size).await?;
                }
                ShortRead::Retry => break,
            }
        }
        // Still short. A closed file that is now shorter was cut: the short read is the
        // truth, and the kernel is told to drop what it holds of the file. Otherwise the
        // bytes the kernel was told of cannot be read now: an error, never zeros.
        let st = self
            .client
            .stat(&h.path)
            .await
            .map_err(|e| errno_for(&e, "stat", &h.path))?;
        let end = offset + data.len() as u64;
        if st.state == FileState::Closed && end >= st.length.min(offset + u64::from(size)) {
            lock(&self.told).insert(h.ino, st.length);
            drop(self.drop_page_cache(h.ino));
            return Ok(data);
        }
        tracing::warn!(
            path = %h.path,
            offset,
            got = data.len(),
            committed = st.length,
            "a read came back short below the size the kernel knows; failing it (EIO) rather than letting the kernel show zeros"
        );
        Err(Errno::EIO)
    }
}

/// How often a read that came back too short is tried again, and how long apart.
const SHORT_READ_RETRIES: u32 = 3;
const SHORT_READ_WAIT: Duration = Duration::from_millis(100);

/// What to do with a read of `size` bytes at `offset` that returned `got` bytes,
/// when the kernel was last told the file has `told` bytes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ShortRead {
    /// Whole, or short exactly at the size the kernel knows (its end of file).
    Fine,
    /// Short below the size the kernel knows: the kernel would show zeros.
    Retry,
}

pub(super) fn short_read_verdict(
    offset: u64,
    size: u32,
    got: usize,
    told: Option<u64>,
) -> ShortRead {
    let end = offset + got as u64;
    let asked_end = offset + u64::from(size);
    match told {
        Some(told) if got < size as usize && end < told.min(asked_end) => ShortRead::Retry,
        _ => ShortRead::Fine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_read_is_fine_only_at_the_size_the_kernel_knows() {
        // Whole reads, and short ones at the known end of the file.
        assert_eq!(
            short_read_verdict(0, 4096, 4096, Some(100)),
            ShortRead::Fine
        );
        assert_eq!(short_read_verdict(0, 4096, 100, Some(100)), ShortRead::Fine);
        assert_eq!(
            short_read_verdict(4096, 4096, 0, Some(4096)),
            ShortRead::Fine
        );
        // No size told yet: nothing to compare with.
        assert_eq!(short_read_verdict(0, 4096, 10, None), ShortRead::Fine);
        // Seed 9941: 128 KiB asked 40 bytes into the file's readable part, which the
        // kernel had been told was 208 108 bytes longer.
        let (offset, told) = (2_359_296, 2_567_404);
        assert_eq!(
            short_read_verdict(offset, 131_072, 40, Some(told)),
            ShortRead::Retry
        );
        // Short, but past what the read asked for is beyond the known size anyway.
        assert_eq!(short_read_verdict(0, 4096, 50, Some(50)), ShortRead::Fine);
        assert_eq!(
            short_read_verdict(100, 4096, 20, Some(130)),
            ShortRead::Retry
        );
    }
}
