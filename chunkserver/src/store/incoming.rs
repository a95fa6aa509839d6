//! A replica being received from another chunkserver (re-replication): built in a
//! temporary file, sealed and renamed into place.

use super::files::blocking;
use super::replica::Replica;
use super::{sync_dir, SlotState, Store};
use super::{Error, Result};
use crate::checksum::TableRun;
use crate::header::{self, Header, DATA_OFFSET};
use crate::io::{sparse, IoEngine, IoOp};
use bytes::Bytes;
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaReport, ReplicaState};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

/// A replica being received from another chunkserver (re-replication). It is built in
/// a temporary file and renamed into place by [`Incoming::finish`]; dropped unfinished,
/// the temporary file is removed.
pub struct Incoming {
    pub(super) handle: ChunkHandle,
    pub(super) version: ChunkVersion,
    pub(super) expected: u64,
    pub(super) file: Arc<File>,
    pub(super) tmp: PathBuf,
    pub(super) received: u64,
    /// The checksum entries from block 0 on, and the tail CRC.
    pub(super) table: TableRun,
    pub(super) engine: Arc<dyn IoEngine>,
    /// Runs of zeros go in as holes (`io::sparse`), as they did on the source.
    pub(super) sparse: bool,
    pub(super) finished: bool,
}

impl Incoming {
    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Bytes announced by the sender.
    pub fn expected(&self) -> u64 {
        self.expected
    }

    /// Appends the next bytes.
    pub async fn append(&mut self, data: Bytes) -> Result<u64> {
        let end = self.received + data.len() as u64;
        if end > self.expected {
            return Err(Error::bad_request(format!(
                "replica of chunk {} announced {} bytes, received {end}",
                self.handle, self.expected
            )));
        }
        self.table.append(self.received, &data, None);
        let mut ops = vec![IoOp::Write {
            offset: DATA_OFFSET + self.received,
            data,
        }];
        if self.sparse {
            ops = sparse::elide_zeros(ops, 8);
        }
        self.engine
            .run(self.file.clone(), ops)
            .await
            .map_err(|e| Error::io("write", &self.tmp, e))?;
        self.received = end;
        Ok(end)
    }

    /// Seals the replica (finalized at the announced length) and puts it in place,
    /// replacing an older-version replica of the same chunk.
    pub async fn finish(mut self, store: &Store) -> Result<ReplicaReport> {
        if self.received != self.expected {
            return Err(Error::bad_request(format!(
                "replica of chunk {} ended after {} of {} bytes",
                self.handle, self.received, self.expected
            )));
        }
        let header = Header::new(
            self.handle,
            self.version,
            ReplicaState::Finalized,
            self.received,
        )
        .with_tail(self.table.tail());
        self.engine
            .run(
                self.file.clone(),
                vec![
                    IoOp::Write {
                        offset: header::TABLE_OFFSET,
                        data: Bytes::from(self.table.encode()),
                    },
                    IoOp::Write {
                        offset: header.slot_offset(),
                        data: Bytes::from(header.encode_head()),
                    },
                    IoOp::SyncAll,
                ],
            )
            .await
            .map_err(|e| Error::io("seal received replica", &self.tmp, e))?;
        // Sealed and durable, but only as a temporary file: start-up removes it.
        stampfs_proto::crash_point!("copy-before-rename");
        let replica = Replica {
            disk: store.disk.clone(),
            id: store.disk.cache.next_id(),
            header,
            header_durable: true,
            durable_length: self.received,
            length: self.received,
            tail_crc: self.table.tail(),
            behind: self.received,
            padded: self.received,
        };
        let report = replica.report();
        loop {
            let slot = store.slot_or_insert(self.handle);
            let mut guard = slot.write().await;
            match &*guard {
                SlotState::Removed => continue,
                SlotState::Live(r) if r.header.version >= self.version => {
                    return Err(Error::bad_request(format!(
                        "already holds chunk {} at version {}",
                        self.handle, r.header.version
                    )));
                }
                SlotState::Live(_) | SlotState::Creating => {}
            }
            let (tmp, dst) = (self.tmp.clone(), replica.path());
            let dir = store.disk.layout.dir_of(self.handle);
            blocking(move || {
                std::fs::rename(&tmp, &dst).map_err(|e| Error::io("rename", &tmp, e))?;
                sync_dir(&dir)
            })
            .await?;
            self.finished = true;
            // The new inode under a new identity; the replaced replica's entry goes
            // with it (dropped here, under the lock).
            store.disk.cache.insert(replica.id, self.file.clone());
            *guard = SlotState::Live(replica);
            store.changed.notify_one();
            return Ok(report);
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
