//! A writer in a process of its own, for tests that stop or kill the writer of a file
//! while it is open, and what such a test asks while it does.
//!
//! The process is the test binary itself again, running one ignored test (the
//! [`WriterProcess`]): the client library, so it can hsync and say when it has. That
//! test ([`WriterProcess::run`]) creates a file, writes and hsyncs some bytes, prints a
//! line, then on a line on its stdin ([`MORE`]) writes more bytes and hflushes them.
//! [`Writer`] is the test's handle on it: it starts the process, waits for its lines
//! (read by a thread from its stdout), writes to its stdin, SIGSTOPs it, and SIGKILLs
//! and reaps it, on drop too.
//!
//! Then what the test asks of the file meanwhile: [`locations`] (and their
//! [`last_chunk`]), [`replica_info`] and [`replica_length`] of one replica
//! (`ReplicaInfo`), and [`read_all`], everything a new reader sees.

use super::{connect, connect_with, pattern, TestCluster, CREDENTIALS_ENV, WAIT};
use stampfs_client::{ClientConfig, CreateOptions};
use stampfs_proto::{
    ChunkToken, FileLocations, LocatedChunk, ReplicaInfo, ReplicaReport, RpcClient,
};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the test sends the writer process for the unacknowledged bytes.
pub const MORE: &str = "more";

/// A test binary's writer process: one of its ignored tests, which [`Writer::start`]
/// runs (this binary again), and what it writes and prints.
pub struct WriterProcess {
    /// The ignored test's name: [`Writer::start`] runs this binary with
    /// `TEST --exact --ignored`.
    pub test: &'static str,
    /// The test that starts it, named when the ignored test is run on its own.
    pub started_by: &'static str,
    /// The environment variable that names the master to the writer process; without it
    /// the ignored test is not the writer and does nothing.
    pub master_env: &'static str,
    /// The file it creates (replication 3).
    pub path: &'static str,
    /// How many bytes it writes and hsyncs first.
    pub synced: usize,
    /// The seed of their [`pattern`].
    pub synced_seed: u64,
    /// The line it prints once the hsync returned.
    pub hsynced: &'static str,
    /// How many bytes it writes and hflushes on a line on its stdin.
    pub unacked: usize,
    /// The seed of their [`pattern`].
    pub unacked_seed: u64,
    /// What the line it prints when the hflush returns starts with (the result follows).
    pub hflushed: &'static str,
}

impl WriterProcess {
    /// The bytes the writer hsyncs.
    pub fn synced_bytes(&self) -> Vec<u8> {
        pattern(self.synced, self.synced_seed)
    }

    /// The bytes the writer hflushes after the line on its stdin.
    pub fn unacked_bytes(&self) -> Vec<u8> {
        pattern(self.unacked, self.unacked_seed)
    }

    /// The ignored test's body. In the writer process (the master named in
    /// [`master_env`](Self::master_env)) it creates [`path`](Self::path), writes and
    /// hsyncs the [`synced_bytes`](Self::synced_bytes), prints
    /// [`hsynced`](Self::hsynced), and on a line on its stdin writes the
    /// [`unacked_bytes`](Self::unacked_bytes) and hflushes them, which does not return
    /// while a replica of the pipeline is stopped. Run on its own, the ignored test is
    /// not the writer: it prints `SKIPPED: …` and returns.
    pub fn run(&self) {
        let Ok(master) = std::env::var(self.master_env) else {
            eprintln!(
                "SKIPPED: {} is the writer of {} and runs only under it",
                self.test, self.started_by
            );
            return;
        };
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        // The cluster's superuser, whose credentials file [`Writer::start`] names (this
        // process's own `test_credentials` are not the cluster's).
        let creds = std::env::var_os(CREDENTIALS_ENV).expect("the writer is given credentials");
        let creds = stampfs_proto::Credentials::load(creds.as_ref()).expect("load credentials");
        // Acks that do not come must not make this writer recover its pipeline before
        // the test stops or kills it (the chunkservers' --ack-timeout is raised to
        // match).
        let config = ClientConfig {
            ack_timeout: Duration::from_secs(600),
            credentials: Some(creds),
            ..ClientConfig::default()
        };
        let (_client, mut writer) = rt.block_on(async {
            let client = connect_with(&master, config)
                .await
                .expect("connect to the master");
            let opts = CreateOptions {
                replication: Some(3),
                ..CreateOptions::default()
            };
            let mut writer = client.create(self.path, opts).await.expect("create");
            writer.write_all(&self.synced_bytes()).await.expect("write");
            writer.hsync().await.expect("hsync");
            (client, writer)
        });
        println!("{}", self.hsynced);
        std::io::stdout().flush().expect("stdout");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).expect("stdin");
        rt.block_on(async {
            writer
                .write_all(&self.unacked_bytes())
                .await
                .expect("write");
            let flushed = writer.hflush().await;
            println!("{} {flushed:?}", self.hflushed);
        });
    }
}

/// The writer process, killed and reaped on drop.
pub struct Writer {
    child: Child,
    stdin: ChildStdin,
    /// Lines the writer printed, from a thread reading its stdout (it ends at the
    /// writer's EOF).
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
}

impl Writer {
    /// Starts `process` (this test binary again) on `c`'s master, its stderr in a file
    /// of `c`'s directory.
    pub fn start(c: &TestCluster, process: &WriterProcess) -> Writer {
        let stderr = c.dir.path().join("writer.stderr");
        let file = std::fs::File::create(&stderr).expect("writer stderr file");
        let exe = std::env::current_exe().expect("this test binary");
        let mut child = Command::new(exe)
            .args([process.test, "--exact", "--ignored", "--nocapture"])
            .env(process.master_env, &c.master.addr)
            .env(CREDENTIALS_ENV, c.credentials_file())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn the writer process");
        let stdin = child.stdin.take().expect("writer stdin");
        let stdout = child.stdout.take().expect("writer stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Writer {
            child,
            stdin,
            lines,
            stderr,
        }
    }

    /// Waits until the writer prints a line containing `what` (at most [`WAIT`]).
    pub fn wait_for_line(&self, what: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(what) => return,
                Ok(_) => {}
                Err(e) => panic!(
                    "the writer did not print {what:?} within {WAIT:?} ({e}); its stderr:\n{}",
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                ),
            }
        }
    }

    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .expect("write to the writer's stdin");
    }

    pub fn stop(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the replica at `addr` says of itself under `token` (`ReplicaInfo`): its
/// version and length, or the error (a replica at another version refuses the token,
/// one that does not answer within `timeout` is an error too).
pub async fn replica_info(
    addr: &str,
    token: ChunkToken,
    timeout: Duration,
) -> Result<ReplicaReport, String> {
    let ask = async {
        let mut conn = RpcClient::connect(&stampfs_proto::net::Dialer::plain(), addr, timeout)
            .await
            .map_err(|e| e.to_string())?;
        conn.call(ReplicaInfo { token })
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// How many bytes the replica at `addr` holds under `token`, `None` when it does not
/// answer with a length within `timeout`.
pub async fn replica_length(addr: &str, token: ChunkToken, timeout: Duration) -> Option<u64> {
    replica_info(addr, token, timeout)
        .await
        .ok()
        .map(|r| r.length)
}

/// Everything a new reader (a client with `config`) sees of the file at `path` now.
pub async fn read_all(c: &TestCluster, config: ClientConfig, path: &str) -> Vec<u8> {
    let client = connect_with(&c.master.addr, config)
        .await
        .expect("connect to the master");
    let mut reader = client.open(path).await.expect("open for reading");
    let mut got = Vec::new();
    reader.read_to_end(&mut got).await.expect("read");
    got
}

/// The file `path` as the master hands it to readers now.
pub async fn locations(c: &TestCluster, path: &str) -> FileLocations {
    connect(&c.master.addr)
        .await
        .expect("connect to the master")
        .locations(path)
        .await
        .expect("locations")
}

/// The last chunk of `locs`.
pub fn last_chunk(locs: &FileLocations) -> LocatedChunk {
    locs.chunks.last().cloned().expect("the file has a chunk")
}

/// Recovers the lease of `path` (which must close the file) and reads it whole; fails
/// unless it still begins with `synced`, the bytes the writer hsynced.
pub async fn recover_and_read(c: &TestCluster, path: &str, synced: &[u8]) -> Vec<u8> {
    let outcome = async { connect(&c.master.addr).await?.recover_lease(path).await }
        .await
        .expect("recover");
    assert!(outcome.closed, "recovery closed the file: {outcome:?}");
    let recovered = read_all(c, ClientConfig::default(), path).await;
    assert!(
        recovered.starts_with(synced),
        "the recovered file ({} bytes) lost hsynced bytes: it keeps {} of the {}",
        recovered.len(),
        super::common_prefix(&recovered, synced),
        synced.len()
    );
    recovered
}
