//! `TestCluster`: real `stampfs` processes (a master and chunkservers) on ephemeral
//! loopback ports in a temp dir. Each process logs to a file; the logs are printed when
//! a test fails. Processes can be SIGKILLed, SIGSTOPped, SIGCONTed and restarted, and
//! every child is killed and reaped on drop. [`mount::MountGuard`] mounts such a
//! cluster through FUSE; [`writer::Writer`] is a writer of its files in a process of
//! its own. And small helpers: [`wait_for`] a state, [`common_prefix`], [`runtime`].
//!
//! Every client authenticates to the master: a [`TestCluster`]'s master adopts
//! [`test_credentials`] (the superuser's, one per test process) at its first start,
//! its [`TestCluster::cmd`]s present them through `STAMPFS_CREDENTIALS`, and
//! in-process clients connect through [`connect`] and [`connect_with`].

#![allow(dead_code)]

pub mod files;
pub mod group;
pub mod mount;
pub mod writer;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_stampfs");

pub use stampfs_proto::credentials::CREDENTIALS_ENV;

/// The superuser's credentials of this test process: every [`TestCluster`]'s master
/// adopts them at its first start (they are in its directory before it starts).
pub fn test_credentials() -> stampfs_proto::Credentials {
    static CREDS: std::sync::OnceLock<stampfs_proto::Credentials> = std::sync::OnceLock::new();
    CREDS
        .get_or_init(|| {
            stampfs_proto::Credentials::generate(stampfs_proto::credentials::ADMIN_USER)
                .expect("generate the test credentials")
        })
        .clone()
}

/// A client of the master at `addr`, as [`test_credentials`]' superuser.
pub async fn connect(addr: &str) -> stampfs_client::Result<stampfs_client::Client> {
    connect_with(addr, stampfs_client::ClientConfig::default()).await
}

/// A client of the master at `addr` with `config`: as [`test_credentials`]' superuser
/// unless `config` names credentials of its own (a cluster the test did not start
/// through [`TestCluster`], whose master wrote its own).
pub async fn connect_with(
    addr: &str,
    mut config: stampfs_client::ClientConfig,
) -> stampfs_client::Result<stampfs_client::Client> {
    if config.credentials.is_none() {
        config.credentials = Some(test_credentials());
    }
    stampfs_client::Client::connect_with(addr, config).await
}

/// Waits (at most 60 s) until the credentials file `path` a master writes at its first
/// start exists, and returns it.
pub fn wait_credentials_file(path: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} was not written within 60 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    path.to_path_buf()
}

/// One server process.
pub struct Proc {
    pub name: String,
    pub dir: PathBuf,
    /// A program (and its arguments) that runs `stampfs` (e.g. `prlimit --nofile=..`);
    /// empty: `stampfs` itself.
    launcher: Vec<String>,
    args: Vec<String>,
    /// Environment variables set on the process at every (re)start.
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    pub addr: String,
}

impl Proc {
    pub fn spawn(name: &str, dir: &Path, args: Vec<String>, logs: &Path) -> Proc {
        Self::spawn_under(&[], name, dir, args, logs)
    }

    fn spawn_under(
        launcher: &[&str],
        name: &str,
        dir: &Path,
        args: Vec<String>,
        logs: &Path,
    ) -> Proc {
        std::fs::create_dir_all(dir).expect("create server dir");
        let _ = std::fs::remove_file(dir.join("addr"));
        let log = logs.join(format!("{name}.log"));
        let mut p = Proc {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            launcher: launcher.iter().map(|a| a.to_string()).collect(),
            args,
            env: Vec::new(),
            log,
            child: None,
            addr: String::new(),
        };
        p.start();
        p
    }

    fn start(&mut self) {
        let _ = std::fs::remove_file(self.dir.join("addr"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open log");
        let mut command = match self.launcher.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = command
            .args(&self.args)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("spawn stampfs");
        self.child = Some(child);
        self.addr = self.wait_addr();
        // Restarts come back on the same address, as a real server would (a member
        // of a master group writes its own first, then the other members').
        if let Some(i) = self.args.iter().position(|a| a == "--listen") {
            if let Some(v) = self.args.get_mut(i + 1) {
                *v = self.addr.split(',').next().unwrap_or_default().to_string();
            }
        }
    }

    fn wait_addr(&mut self) -> String {
        let path = self.dir.join("addr");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = std::fs::read_to_string(&path) {
                let s = s.trim().to_string();
                if !s.is_empty() {
                    return s;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "{} exited with {status} before it was ready:\n{}",
                        self.name,
                        std::fs::read_to_string(&self.log).unwrap_or_default()
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "{} did not write {} within 30 s:\n{}",
                self.name,
                path.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .map(|c| c.id() as i32)
            .expect("process is running")
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig).expect("kill");
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn stop(&self) {
        self.signal(Signal::SIGSTOP);
    }

    pub fn cont(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// SIGTERM and wait for a clean exit; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = c.try_wait() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the process again with the same arguments and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.start();
    }

    /// Sets (`Some`) or removes (`None`) an environment variable of the process from
    /// its next start on.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// Waits at most `limit` for the process to exit by itself and reaps it; `None`
    /// (the process still running) when it did not.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_ref() {
            // SIGKILL ends a stopped process too; continuing it first is harmless.
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
        }
        self.kill();
    }
}

/// Options for a [`TestCluster`].
#[derive(Clone)]
pub struct Opts {
    pub chunkservers: usize,
    pub master_args: Vec<String>,
    pub chunkserver_args: Vec<String>,
    /// Environment of every command [`TestCluster::cmd`] makes (e.g. `STAMPFS_TLS_CA`).
    pub client_env: Vec<(String, String)>,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            chunkservers: 3,
            master_args: Vec::new(),
            chunkserver_args: vec!["--heartbeat".into(), "200ms".into()],
            client_env: Vec::new(),
        }
    }
}

pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub master: Proc,
    pub chunkservers: Vec<Proc>,
    opts: Opts,
}

impl TestCluster {
    pub fn start() -> Self {
        Self::with(Opts::default())
    }

    pub fn with(opts: Opts) -> Self {
        remember_panics();
        let dir = tempfile::Builder::new()
            .prefix("stampfs-test-")
            .tempdir()
            .expect("tempdir");
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("logs dir");
        let mdir = dir.path().join("master");
        // The master adopts these as its superuser's at its first start.
        test_credentials()
            .write(
                &mdir.join(stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE),
                false,
            )
            .expect("write the superuser's credentials into the master's directory");
        let mut margs: Vec<String> = vec![
            "master".into(),
            "--dir".into(),
            mdir.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ];
        // `--dead-after 2s` unless the test sets its own (clap refuses a flag twice).
        if !opts.master_args.iter().any(|a| a == "--dead-after") {
            margs.extend(["--dead-after".into(), "2s".into()]);
        }
        margs.extend(opts.master_args.iter().cloned());
        let master = Proc::spawn("master", &mdir, margs, &logs);
        let mut cluster = TestCluster {
            dir,
            master,
            chunkservers: Vec::new(),
            opts: opts.clone(),
        };
        for _ in 0..opts.chunkservers {
            cluster.add_chunkserver();
        }
        cluster.wait_live(opts.chunkservers);
        cluster
    }

    pub fn key_file(&self) -> PathBuf {
        self.dir.path().join("master").join("cluster.key")
    }

    /// The superuser's credentials file ([`test_credentials`]), in the master's
    /// directory.
    pub fn credentials_file(&self) -> PathBuf {
        self.dir
            .path()
            .join("master")
            .join(stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE)
    }

    /// Starts one more chunkserver and returns its index.
    pub fn add_chunkserver(&mut self) -> usize {
        self.add_chunkserver_under(&[])
    }

    /// Starts one more chunkserver through `launcher` (a program that runs the
    /// `stampfs` command line it is given, e.g. `prlimit --nofile=256:256`; it is used
    /// again at every restart) and returns its index.
    pub fn add_chunkserver_under(&mut self, launcher: &[&str]) -> usize {
        self.add_chunkserver_with(launcher, &[])
    }

    /// Starts one more chunkserver through `launcher` with `extra` arguments after the
    /// cluster's own, and returns its index.
    pub fn add_chunkserver_with(&mut self, launcher: &[&str], extra: &[&str]) -> usize {
        let i = self.chunkservers.len();
        let cdir = self.dir.path().join(format!("cs{i}"));
        let mut args: Vec<String> = vec![
            "chunkserver".into(),
            "--dir".into(),
            cdir.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--master".into(),
            self.master.addr.clone(),
            "--cluster-key-file".into(),
            self.key_file().display().to_string(),
        ];
        args.extend(self.opts.chunkserver_args.iter().cloned());
        args.extend(extra.iter().map(|a| a.to_string()));
        let logs = self.dir.path().join("logs");
        self.chunkservers.push(Proc::spawn_under(
            launcher,
            &format!("cs{i}"),
            &cdir,
            args,
            &logs,
        ));
        i
    }

    /// Waits until `n` chunkservers have registered (their id file exists).
    pub fn wait_live(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let registered = self
                .chunkservers
                .iter()
                .filter(|c| c.dir.join("chunkserver.id").exists())
                .count();
            if registered >= n {
                // One more heartbeat round so the master sees them live.
                std::thread::sleep(Duration::from_millis(300));
                return;
            }
            assert!(Instant::now() < deadline, "chunkservers did not register");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A `stampfs` command aimed at this cluster's master, presenting the superuser's
    /// credentials.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("STAMPFS_MASTER", &self.master.addr)
            .env(CREDENTIALS_ENV, self.credentials_file())
            .env("RUST_LOG", "warn")
            .envs(self.opts.client_env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Runs a `stampfs` command to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run stampfs")
    }

    /// Runs a command and asserts success, returning stdout.
    /// The failure names how long the command ran (a request timeout shows as such).
    pub fn ok(&self, args: &[&str]) -> Vec<u8> {
        let started = Instant::now();
        let out = self.run(args);
        assert!(
            out.status.success(),
            "stampfs {args:?} failed ({}) after {:.1?}:\n{}",
            out.status,
            started.elapsed(),
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Runs a command with `input` on stdin.
    pub fn run_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut stdin = child.stdin.take().expect("stdin");
        let data = input.to_vec();
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let out = child.wait_with_output().expect("wait");
        let _ = feeder.join();
        out
    }

    /// Writes `data` to a local temp file and `put`s it.
    pub fn put_bytes(&self, remote: &str, data: &[u8], extra: &[&str]) {
        let local = self
            .dir
            .path()
            .join(format!("put-{}", remote.replace('/', "_")));
        std::fs::write(&local, data).expect("write local file");
        let local_s = local.display().to_string();
        let mut args = vec!["put", local_s.as_str(), remote];
        args.extend_from_slice(extra);
        self.ok(&args);
    }

    /// `cat` of a remote file.
    pub fn cat(&self, remote: &str) -> Vec<u8> {
        self.ok(&["cat", remote])
    }

    /// `stat --json`.
    pub fn stat_json(&self, remote: &str) -> serde_json::Value {
        let out = self.ok(&["stat", "--json", remote]);
        serde_json::from_slice(&out).expect("stat json")
    }

    /// Every process's log, for a failing test.
    pub fn logs(&self) -> String {
        let mut s = format!("==== master log\n{}", self.master.log_text());
        for c in &self.chunkservers {
            s += &format!("==== {} log\n{}", c.name, c.log_text());
        }
        s
    }

    /// The last [`WARNINGS_SHOWN`] WARN and ERROR lines of each process's log: printed
    /// after the logs of a failing test, since a CI report shows only their end (the
    /// last chunkserver's log), and a master's warning would be lost above it.
    pub fn warnings(&self) -> String {
        let mut s = String::new();
        for p in std::iter::once(&self.master).chain(&self.chunkservers) {
            let text = p.log_text();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                .collect();
            s += &format!("==== {}: {} WARN/ERROR lines", p.name, lines.len());
            if lines.len() > WARNINGS_SHOWN {
                s += &format!(", the last {WARNINGS_SHOWN}");
            }
            s += "\n";
            for l in &lines[lines.len().saturating_sub(WARNINGS_SHOWN)..] {
                s += l;
                s += "\n";
            }
        }
        s
    }
}

/// WARN and ERROR lines of each log repeated after a failing test's logs.
const WARNINGS_SHOWN: usize = 20;

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
            eprint!("{}", self.warnings());
            // The logs can be long and a CI report shows only their end: the failure
            // again, after them.
            if let Some(why) = last_panic() {
                eprintln!("==== the test failed (above the logs too): {why}");
            }
        }
    }
}

thread_local! {
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Installs (once per test binary) a panic hook that remembers, per thread, the
/// message and place of the last panic before the default hook prints it.
fn remember_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            // The first lines of the message: a message that embeds a log is long.
            let short: String = msg.lines().take(20).collect::<Vec<_>>().join("\n");
            let place = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("at {place}: {short}")));
            default(info);
        }));
    });
}

/// The message of this thread's last panic, if [`remember_panics`] saw one.
fn last_panic() -> Option<String> {
    LAST_PANIC.with(|p| p.borrow().clone())
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The chunkserver id persisted in a chunkserver's directory.
pub fn id_of(p: &Proc) -> u64 {
    std::fs::read_to_string(p.dir.join("chunkserver.id"))
        .expect("id file")
        .trim()
        .parse()
        .expect("id")
}

/// The chunkserver process with id `id`.
pub fn proc_of(c: &TestCluster, id: u64) -> &Proc {
    c.chunkservers
        .iter()
        .find(|p| id_of(p) == id)
        .expect("a chunkserver with that id")
}

/// The replica file of chunk `handle` (16 hex digits) in a chunkserver's directory.
pub fn replica_file(p: &Proc, handle: &str) -> PathBuf {
    let h = u64::from_str_radix(handle, 16).expect("a chunk handle in hex");
    stampfs_chunkserver::layout::replica_path(&p.dir, stampfs_proto::ChunkHandle(h))
}

/// [`replica_file`] with `suffix` appended (`.corrupt`: the replica moved aside).
pub fn replica_file_with(p: &Proc, handle: &str, suffix: &str) -> PathBuf {
    let mut path = replica_file(p, handle).into_os_string();
    path.push(suffix);
    path.into()
}

/// The files in a chunkserver's data directory and its replica subdirectories whose
/// names end with `suffix`.
pub fn data_files_ending(p: &Proc, suffix: &str) -> Vec<PathBuf> {
    let subdirs = std::fs::read_dir(&p.dir)
        .expect("chunkserver dir")
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path());
    std::iter::once(p.dir.clone())
        .chain(subdirs)
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().ends_with(suffix))
        .map(|e| e.path())
        .collect()
}

/// Flips one byte of a replica's data (at data offset `at`) and syncs it.
pub fn flip(p: &Proc, handle: &str, at: u64) {
    use std::os::unix::fs::FileExt;
    let at = stampfs_chunkserver::header::DATA_OFFSET + at;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(replica_file(p, handle))
        .expect("open replica");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    b[0] ^= 0x5a;
    f.write_all_at(&b, at).expect("flip");
    f.sync_all().expect("sync");
}

/// `stampfs fsck --json ARGS`: its exit code and its JSON.
pub fn fsck_json(c: &TestCluster, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = vec!["fsck", "--json"];
    all.extend_from_slice(args);
    let out = c.run(&all);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "fsck --json is not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

/// The cap of [`wait_for`] and [`writer::Writer::wait_for_line`].
pub const WAIT: Duration = Duration::from_secs(30);

/// Waits until `f` holds (at most [`WAIT`], polling every 50 ms); `what` names the
/// state in the failure.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How many leading bytes `a` and `b` share.
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A current-thread tokio runtime, for a test's `block_on`s.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The request was refused as unauthenticated, and the master closed the connection
/// after it (a request sent next fails with a transport error, not an answer).
pub async fn refused_and_closed<T: std::fmt::Debug>(
    what: &str,
    res: stampfs_proto::Result<T>,
    conn: &mut stampfs_proto::RpcClient,
) {
    use stampfs_proto::{Error, RemoteError};
    match res {
        Err(Error::Remote(RemoteError::Unauthenticated { reason })) => {
            assert!(!reason.is_empty(), "{what}: the refusal says why");
        }
        other => panic!("{what}: expected Unauthenticated, got {other:?}"),
    }
    let after = conn
        .call(stampfs_proto::Stat {
            path: "/".into(),
            caller: None,
        })
        .await;
    assert!(
        matches!(after, Err(ref e) if !matches!(e, Error::Remote(_))),
        "{what}: the master closes the connection after refusing it, got {after:?}"
    );
}

/// A writer of a new file `path` in chunks of 256 KiB that wrote and hflushed `data`
/// (in a cluster of three chunkservers, each holds a replica of the open last chunk).
pub async fn hflushed_writer(
    client: &stampfs_client::Client,
    path: &str,
    data: &[u8],
) -> stampfs_client::FileWriter {
    use tokio::io::AsyncWriteExt;
    let opts = stampfs_client::CreateOptions {
        chunk_size: Some(256 << 10),
        ..Default::default()
    };
    let mut w = client.create(path, opts).await.expect("create");
    w.write_all(data).await.expect("write");
    w.hflush().await.expect("hflush");
    w
}
