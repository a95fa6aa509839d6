//! The client process's loop (`stampfs nemesis-client`, started by the run).
//!
//! A **writer** repeatedly picks one of the shared files, opens it for append (one
//! [`Client`] per session, so a session is one lease holder), writes a random number of
//! [`record`](crate::record)s, each followed by `hsync`, logs each record as
//! [`Event::Ack`] only after its `hsync` returned, and closes the file. Contention is
//! the point: `LeaseConflict` and `RecoveryInProgress` are retried after a short
//! back-off, and now and then the writer runs `recover_lease` on the file to take it
//! over from its holder (who is then fenced). A session that fails (fenced or not) is
//! logged and abandoned; the next one starts fresh. A **reader** task reads every file
//! from offset 0 now and then and logs the length and digest of what it saw.
//!
//! The loop ends when the stop file exists (the run has healed the cluster): the
//! current session finishes and closes first.

use crate::history::{Event, HistoryWriter};
use crate::record::{RecordHeader, SessionId};
use crate::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stampfs_client::{Client, ClientConfig, Error as ClientError};
use stampfs_proto::RemoteError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Arguments of `stampfs nemesis-client`.
#[derive(clap::Args, Debug, Clone)]
pub struct WorkloadConfig {
    /// The master's address.
    #[arg(long)]
    pub master: String,
    /// This client's index in the run.
    #[arg(long)]
    pub client: u32,
    /// This process's incarnation (part of every session id, so sessions are unique
    /// across restarts).
    #[arg(long)]
    pub nonce: u64,
    /// Seed of this process's random choices.
    #[arg(long)]
    pub seed: u64,
    /// The JSON-lines history file to append to.
    #[arg(long)]
    pub history: PathBuf,
    /// Finish the current session and exit once this file exists.
    #[arg(long)]
    pub stop_file: PathBuf,
    /// How many shared files (`DIR/f0`, `DIR/f1`, ...).
    #[arg(long, default_value_t = 2)]
    pub files: u32,
    /// The directory of the shared files in stampfs.
    #[arg(long, default_value = "/nemesis")]
    pub dir: String,
    /// How often the reader reads every file.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "400ms")]
    pub read_every: Duration,
    /// Write and read through the `stampfs mount` at this directory instead of the
    /// client library (see `mount_workload`).
    #[arg(long)]
    pub mount: Option<PathBuf>,
}

/// The path of shared file `id` under `dir`.
pub fn file_path(dir: &str, id: u32) -> String {
    format!("{dir}/f{id}")
}

/// The client settings of the workload: short waits, so a stuck call gives way to the
/// next session instead of holding the client for a minute.
pub fn client_config() -> ClientConfig {
    ClientConfig {
        recovery_wait: Duration::from_secs(3),
        request_timeout: Duration::from_secs(10),
        ..ClientConfig::default()
    }
}

/// The most records a session writes.
const MAX_RECORDS: u32 = 8;

/// A record's payload length: mostly small, sometimes large enough that records
/// straddle the run's 256 KiB chunks.
fn payload_len(rng: &mut StdRng) -> u32 {
    if rng.gen_ratio(1, 8) {
        rng.gen_range(64 << 10..=200 << 10)
    } else {
        rng.gen_range(1..=24 << 10)
    }
}

/// Starts this process's next session on `file`: its id (logged as started) and how
/// many records it will write.
pub(crate) fn begin_session(
    cfg: &WorkloadConfig,
    file: u32,
    counter: &mut u32,
    history: &HistoryWriter,
    rng: &mut StdRng,
) -> Result<(SessionId, u32)> {
    let session = new_session(cfg, counter);
    log_start(history, file, session)?;
    Ok((session, records_of_a_session(rng)))
}

/// The next session id of this client (nothing logged).
pub(crate) fn new_session(cfg: &WorkloadConfig, counter: &mut u32) -> SessionId {
    let session = SessionId {
        client: cfg.client,
        nonce: cfg.nonce,
        counter: *counter,
    };
    *counter += 1;
    session
}

/// Logs that `session` holds the lease of `file` from now on (a start logged late
/// only makes the slot checker's rule 3 weaker, never wrong).
pub(crate) fn log_start(history: &HistoryWriter, file: u32, session: SessionId) -> Result<()> {
    history.log(&Event::SessionStart {
        file,
        session,
        at_us: crate::history::now_us(),
    })
}

/// How many records a session writes.
pub(crate) fn records_of_a_session(rng: &mut StdRng) -> u32 {
    rng.gen_range(1..=MAX_RECORDS)
}

/// Record `seq` of `session`, with a random payload length.
pub(crate) fn record(file: u32, session: SessionId, seq: u32, rng: &mut StdRng) -> RecordHeader {
    RecordHeader {
        file,
        session,
        seq,
        payload_len: payload_len(rng),
    }
}

/// Runs the client until the stop file exists.
pub async fn run(cfg: WorkloadConfig) -> Result<()> {
    if let Some(mount) = cfg.mount.clone() {
        return crate::mount_workload::run(cfg, mount).await;
    }
    let history = Arc::new(HistoryWriter::open(&cfg.history)?);
    tracing::info!(
        client = cfg.client,
        nonce = cfg.nonce,
        "nemesis client starting"
    );
    let reader = tokio::spawn(read_loop(cfg.clone(), history.clone()));
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut counter = 0u32;
    while !stopped(&cfg.stop_file) {
        if rng.gen_ratio(1, 3) {
            slot_session(&cfg, &history, &mut counter, &mut rng).await?;
            continue;
        }
        let file = rng.gen_range(0..cfg.files.max(1));
        let path = file_path(&cfg.dir, file);
        let Some((client, mut writer)) = open_writer(&cfg, &path, false, &mut rng).await else {
            continue;
        };
        let (session, n) = begin_session(&cfg, file, &mut counter, &history, &mut rng)?;
        let mut outcome = None;
        for seq in 0..n {
            let header = record(file, session, seq, &mut rng);
            let res = match writer.write_all(&header.encode()).await {
                Ok(()) => writer.hsync().await,
                Err(e) => Err(ClientError::from_io(e)),
            };
            match res {
                Ok(()) => history.log(&Event::Ack {
                    file,
                    session,
                    seq,
                    payload_len: header.payload_len,
                })?,
                Err(e) => {
                    outcome = Some(e);
                    break;
                }
            }
            if rng.gen_ratio(1, 3) {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(1..40))).await;
            }
        }
        end_session(&history, client, writer, &path, file, session, outcome).await?;
    }
    reader.abort();
    tracing::info!(client = cfg.client, "nemesis client stopping");
    Ok(())
}

/// One session on the slot file ([`crate::slots`]): opened for writes anywhere, a few
/// records each over a random slot with `hsync`, each intent logged before its write
/// and each acknowledgement after its `hsync`.
async fn slot_session(
    cfg: &WorkloadConfig,
    history: &HistoryWriter,
    counter: &mut u32,
    rng: &mut StdRng,
) -> Result<()> {
    use crate::slots;
    let path = slots::path(&cfg.dir);
    let Some((client, mut writer)) = open_writer(cfg, &path, true, rng).await else {
        return Ok(());
    };
    let (session, n) = begin_session(cfg, slots::SLOT_FILE, counter, history, rng)?;
    let mut outcome = None;
    for seq in 0..n {
        let slot = rng.gen_range(0..slots::SLOTS);
        history.log(&Event::SlotWrite {
            session,
            seq,
            slot,
            at_us: crate::history::now_us(),
        })?;
        let bytes = slots::record(session, seq).encode();
        let res = match writer.write_at(slots::offset(slot), &bytes).await {
            Ok(()) => writer.hsync().await,
            Err(e) => Err(e),
        };
        match res {
            Ok(()) => history.log(&Event::SlotAck { session, seq, slot })?,
            Err(e) => {
                outcome = Some(e);
                break;
            }
        }
        if rng.gen_ratio(1, 3) {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(1..40))).await;
        }
    }
    end_session(
        history,
        client,
        writer,
        &path,
        slots::SLOT_FILE,
        session,
        outcome,
    )
    .await
}

/// Ends a session: closes the writer (unless it failed: `outcome`), lets go of the file
/// of a writer that failed other than fenced rather than hold its lease until the
/// hard limit, and logs the end.
async fn end_session(
    history: &HistoryWriter,
    client: Client,
    mut writer: stampfs_client::FileWriter,
    path: &str,
    file: u32,
    session: SessionId,
    outcome: Option<ClientError>,
) -> Result<()> {
    let outcome = match outcome {
        None => match writer.close().await {
            Ok(_) => "closed".to_string(),
            Err(e) => describe(&e),
        },
        Some(e) => describe(&e),
    };
    tracing::info!(%session, file, %outcome, "session ended");
    if outcome != "closed" && outcome != "fenced" {
        drop(writer);
        let _ = client.recover_lease(path).await;
    }
    history.log(&Event::SessionEnd {
        file,
        session,
        outcome,
    })
}

fn describe(e: &ClientError) -> String {
    if e.is_fenced() {
        "fenced".into()
    } else {
        format!("error: {e}")
    }
}

fn stopped(stop_file: &Path) -> bool {
    stop_file.exists()
}

/// Opens `path` under a fresh client, for append or (`anywhere`) for writes anywhere,
/// taking it over now and then; `None` after a failed attempt (already backed off).
async fn open_writer(
    cfg: &WorkloadConfig,
    path: &str,
    anywhere: bool,
    rng: &mut StdRng,
) -> Option<(Client, stampfs_client::FileWriter)> {
    let client = match Client::connect_with(&cfg.master, client_config()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(error = %e, "cannot reach the master");
            tokio::time::sleep(Duration::from_millis(200)).await;
            return None;
        }
    };
    let opened = if anywhere {
        client.open_options().write(true).open(path).await
    } else {
        client.append(path).await
    };
    match opened {
        Ok(w) => Some((client, w)),
        Err(e) => {
            let contended = matches!(
                e,
                ClientError::Remote(
                    RemoteError::LeaseConflict { .. } | RemoteError::RecoveryInProgress { .. }
                )
            );
            tracing::info!(%path, error = %e, contended, anywhere, "open for writing refused");
            if contended && rng.gen_ratio(1, 4) {
                match client.recover_lease(path).await {
                    Ok(out) => tracing::info!(%path, closed = out.closed, "took the file over"),
                    Err(e) => tracing::info!(%path, error = %e, "recover_lease failed"),
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(20..200))).await;
            None
        }
    }
}

/// Reads every file from offset 0 until the stop file exists, logging what it saw.
async fn read_loop(cfg: WorkloadConfig, history: Arc<HistoryWriter>) {
    let mut client = None;
    let mut watch = read_watch_of(&cfg);
    while !stopped(&cfg.stop_file) {
        if client.is_none() {
            client = Client::connect_with(&cfg.master, client_config())
                .await
                .ok();
        }
        if let Some(c) = client.as_ref() {
            for file in 0..cfg.files {
                match read_file(c, &file_path(&cfg.dir, file)).await {
                    Ok(bytes) => {
                        watch.observe(file, &bytes);
                        let len = bytes.len() as u64;
                        let digest = crate::history::digest(&bytes);
                        if let Err(e) = history.log(&Event::Read { file, len, digest }) {
                            tracing::error!(error = %e, "cannot log a read");
                            return;
                        }
                    }
                    Err(e) => tracing::info!(file, error = %e, "read failed"),
                }
            }
        }
        tokio::time::sleep(cfg.read_every).await;
    }
}

/// The [`ReadWatch`](crate::read_watch::ReadWatch) of this client's reader, saving
/// next to its history file.
pub fn read_watch_of(cfg: &WorkloadConfig) -> crate::read_watch::ReadWatch {
    let dir = cfg
        .history
        .parent()
        .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf);
    crate::read_watch::ReadWatch::new(dir, cfg.client, cfg.nonce)
}

/// The bytes of `path` from offset 0 up to its readable length when opened.
pub async fn read_file(client: &Client, path: &str) -> stampfs_client::Result<Vec<u8>> {
    let mut reader = client.open(path).await?;
    let len = reader.len();
    let mut bytes = Vec::with_capacity(len as usize);
    (&mut reader)
        .take(len)
        .read_to_end(&mut bytes)
        .await
        .map_err(ClientError::from_io)?;
    Ok(bytes)
}
