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
        read_from(reader, &h.path, offset, size).await
    }
}
