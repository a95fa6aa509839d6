//! The client loop through a FUSE mount (`stampfs nemesis-client --mount DIR`): the
//! same sessions and records as [`workload`](crate::workload), written with plain
//! file system calls on a `stampfs mount` of the cluster that the run started next to
//! this process.
//!
//! A **session** is `open(O_WRONLY|O_APPEND)` (the mount takes the file's lease;
//! `EBUSY` while another client holds it), records each written with `write(2)` and
//! made durable with `fsync(2)` (hsync) before [`Event::Ack`] is logged, then
//! `close(2)` (hflush; the last close commits the length). Contention is resolved as
//! the library writer does: back off, and now and then take the file over with
//! `recover_lease` through the client library.
//!
//! A third of the sessions are **slot sessions** ([`crate::slots`]): the slot file
//! opened `O_RDWR` (no `O_APPEND`), whole records written over random slots with
//! `pwrite(2)`, each followed by `fsync(2)`, each intent logged before its write and
//! each acknowledgement after its `fsync`, as the library's slot sessions do. The mount
//! takes the lease at the first write, so such a session logs its start only once that
//! write returned: a start logged late only weakens the checker's rule against stale
//! writes, a start logged before the lease was taken would make it wrong.
//!
//! The **reader** reads every file through the mount with `read(2)` from offset 0 and
//! logs what it saw, except a file this process's writer has open or opened while the
//! read went on: the kernel's page cache of this mount holds what that writer wrote
//! before it was acknowledged (as any local file system shows a writer's own unsynced
//! bytes), which is not a read of stampfs's data. A file opened afresh is read from the
//! mount (it keeps no cache across opens).

use crate::history::{digest, Event, HistoryWriter};
use crate::workload::{
    begin_session, client_config, file_path, log_start, new_session, record, records_of_a_session,
    WorkloadConfig,
};
use crate::{Error, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stampfs_client::Client;
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the reader must know of the writer's open file.
struct Busy {
    /// Per file: the writer has it open.
    open: Vec<AtomicBool>,
    /// Per file: sessions opened so far (a read spanning a change is discarded).
    opened: Vec<AtomicU64>,
}

impl Busy {
    fn new(files: u32) -> Self {
        Self {
            open: (0..files).map(|_| AtomicBool::new(false)).collect(),
            opened: (0..files).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A token for a read of `file`, `None` while the writer has it open.
    fn before_read(&self, file: u32) -> Option<u64> {
        let i = file as usize;
        if self.open[i].load(Ordering::SeqCst) {
            return None;
        }
        Some(self.opened[i].load(Ordering::SeqCst))
    }

    /// Whether the read that took `token` saw no session of the writer on `file`.
    fn read_was_clean(&self, file: u32, token: u64) -> bool {
        let i = file as usize;
        !self.open[i].load(Ordering::SeqCst) && self.opened[i].load(Ordering::SeqCst) == token
    }
}

/// The path of shared file `id` under the mount.
fn mounted(cfg: &WorkloadConfig, mount: &Path, id: u32) -> PathBuf {
    mount.join(file_path(&cfg.dir, id).trim_start_matches('/'))
}

/// Runs the loop until the stop file exists.
pub async fn run(cfg: WorkloadConfig, mount: PathBuf) -> Result<()> {
    let history = Arc::new(HistoryWriter::open(&cfg.history)?);
    tracing::info!(client = cfg.client, nonce = cfg.nonce, mount = %mount.display(), "nemesis mount client starting");
    let busy = Arc::new(Busy::new(cfg.files.max(1)));
    let reader = {
        let (cfg, mount, history, busy) =
            (cfg.clone(), mount.clone(), history.clone(), busy.clone());
        tokio::task::spawn_blocking(move || read_loop(&cfg, &mount, &history, &busy))
    };
    let handle = tokio::runtime::Handle::current();
    let writer = {
        let (cfg, mount, history, busy) =
            (cfg.clone(), mount.clone(), history.clone(), busy.clone());
        tokio::task::spawn_blocking(move || write_loop(&cfg, &mount, &history, &busy, &handle))
    };
    let written = writer.await.map_err(|e| Error::Net {
        what: "the mount writer".into(),
        detail: e.to_string(),
    })?;
    let _ = reader.await;
    tracing::info!(client = cfg.client, "nemesis mount client stopping");
    written
}

fn write_loop(
    cfg: &WorkloadConfig,
    mount: &Path,
    history: &HistoryWriter,
    busy: &Busy,
    rt: &tokio::runtime::Handle,
) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut counter = 0u32;
    while !cfg.stop_file.exists() {
        if rng.gen_ratio(1, 3) {
            slot_session(cfg, mount, history, &mut counter, &mut rng)?;
            continue;
        }
        let file = rng.gen_range(0..cfg.files.max(1));
        let path = mounted(cfg, mount, file);
        let i = file as usize;
        busy.open[i].store(true, Ordering::SeqCst);
        busy.opened[i].fetch_add(1, Ordering::SeqCst);
        let opened = std::fs::OpenOptions::new().append(true).open(&path);
        let mut f = match opened {
            Ok(f) => f,
            Err(e) => {
                busy.open[i].store(false, Ordering::SeqCst);
                let contended = e.raw_os_error() == Some(nix::errno::Errno::EBUSY as i32);
                tracing::info!(path = %path.display(), error = %e, contended, "open for append refused");
                if contended && rng.gen_ratio(1, 4) {
                    take_over(cfg, file, rt);
                }
                std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
                continue;
            }
        };
        let (session, n) = begin_session(cfg, file, &mut counter, history, &mut rng)?;
        let mut failure = None;
        for seq in 0..n {
            let header = record(file, session, seq, &mut rng);
            let res = f.write_all(&header.encode()).and_then(|()| f.sync_all());
            match res {
                Ok(()) => history.log(&Event::Ack {
                    file,
                    session,
                    seq,
                    payload_len: header.payload_len,
                })?,
                Err(e) => {
                    failure = Some(format!("error: {e}"));
                    break;
                }
            }
            if rng.gen_ratio(1, 3) {
                std::thread::sleep(Duration::from_millis(rng.gen_range(1..40)));
            }
        }
        // close(2) is hflush, and its error is the session's last word.
        let fd = f.into_raw_fd();
        let closed = nix::unistd::close(fd);
        busy.open[i].store(false, Ordering::SeqCst);
        let outcome = match (failure, closed) {
            (Some(f), _) => f,
            (None, Ok(())) => "closed".to_string(),
            (None, Err(e)) => format!("error: close: {e}"),
        };
        tracing::info!(%session, file, %outcome, "session ended");
        let failed = outcome != "closed";
        history.log(&Event::SessionEnd {
            file,
            session,
            outcome,
        })?;
        if failed {
            // The master or the pipeline is down: do not spin through sessions.
            std::thread::sleep(Duration::from_millis(rng.gen_range(50..300)));
        }
    }
    Ok(())
}

/// One slot session through the mount (see the module docs).
fn slot_session(
    cfg: &WorkloadConfig,
    mount: &Path,
    history: &HistoryWriter,
    counter: &mut u32,
    rng: &mut StdRng,
) -> Result<()> {
    use crate::slots;
    use std::os::unix::fs::FileExt;
    let path = mount.join(slots::path(&cfg.dir).trim_start_matches('/'));
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => {
            tracing::info!(path = %path.display(), error = %e, "open of the slot file refused");
            std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
            return Ok(());
        }
    };
    let session = new_session(cfg, counter);
    let n = records_of_a_session(rng);
    let mut failure = None;
    for seq in 0..n {
        let slot = rng.gen_range(0..slots::SLOTS);
        history.log(&Event::SlotWrite {
            session,
            seq,
            slot,
            at_us: crate::history::now_us(),
        })?;
        let bytes = slots::record(session, seq).encode();
        let res = f
            .write_all_at(&bytes, slots::offset(slot))
            .and_then(|()| f.sync_all());
        if seq == 0 {
            // The first write took the lease (or failed to).
            log_start(history, slots::SLOT_FILE, session)?;
        }
        match res {
            Ok(()) => history.log(&Event::SlotAck { session, seq, slot })?,
            Err(e) => {
                failure = Some(format!("error: {e}"));
                break;
            }
        }
        if rng.gen_ratio(1, 3) {
            std::thread::sleep(Duration::from_millis(rng.gen_range(1..40)));
        }
    }
    let closed = nix::unistd::close(f.into_raw_fd());
    let outcome = match (failure, closed) {
        (Some(f), _) => f,
        (None, Ok(())) => "closed".to_string(),
        (None, Err(e)) => format!("error: close: {e}"),
    };
    tracing::info!(%session, file = slots::SLOT_FILE, %outcome, "slot session ended");
    let failed = outcome != "closed";
    history.log(&Event::SessionEnd {
        file: slots::SLOT_FILE,
        session,
        outcome,
    })?;
    if failed {
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..300)));
    }
    Ok(())
}

/// Takes `file` over from its holder through the client library.
fn take_over(cfg: &WorkloadConfig, file: u32, rt: &tokio::runtime::Handle) {
    let path = file_path(&cfg.dir, file);
    let master = cfg.master.clone();
    rt.block_on(async move {
        match Client::connect_with(&master, client_config()).await {
            Ok(c) => match c.recover_lease(&path).await {
                Ok(out) => tracing::info!(%path, closed = out.closed, "took the file over"),
                Err(e) => tracing::info!(%path, error = %e, "recover_lease failed"),
            },
            Err(e) => tracing::info!(error = %e, "cannot reach the master"),
        }
    });
}

fn read_loop(cfg: &WorkloadConfig, mount: &Path, history: &HistoryWriter, busy: &Busy) {
    let mut watch = crate::workload::read_watch_of(cfg);
    while !cfg.stop_file.exists() {
        for file in 0..cfg.files {
            let Some(token) = busy.before_read(file) else {
                continue;
            };
            match std::fs::read(mounted(cfg, mount, file)) {
                Ok(bytes) if busy.read_was_clean(file, token) => {
                    watch.observe(file, &bytes);
                    let e = Event::Read {
                        file,
                        len: bytes.len() as u64,
                        digest: digest(&bytes),
                    };
                    if let Err(e) = history.log(&e) {
                        tracing::error!(error = %e, "cannot log a read");
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::info!(file, error = %e, "read through the mount failed"),
            }
        }
        std::thread::sleep(cfg.read_every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_clean_only_if_the_writer_never_had_the_file_open_meanwhile() {
        let b = Busy::new(2);
        let t = b.before_read(0).expect("not open");
        assert!(b.read_was_clean(0, t));
        // The writer opened (and maybe closed) the file during the read.
        b.opened[0].fetch_add(1, Ordering::SeqCst);
        assert!(!b.read_was_clean(0, t));
        // While it has it open, no read is taken at all; the other file is unaffected.
        b.open[0].store(true, Ordering::SeqCst);
        assert_eq!(b.before_read(0), None);
        let t1 = b.before_read(1).expect("file 1 is free");
        assert!(b.read_was_clean(1, t1));
    }
}
