//! Real `stampfs` processes: a master (or a group of masters) and chunkservers on
//! loopback ephemeral ports in a run's directory, and the client processes of the
//! workload.
//!
//! Each [`Proc`] is one child process, logging (stdout and stderr) to
//! `DIR/logs/NAME.log`, appended across restarts. Processes are signalled by the pid of
//! the child this run spawned, never by name, and every child is continued, killed and
//! reaped on drop. A restarted server comes back on the address it had.

use crate::disk::SmallDisk;
use crate::net::{enter_on_exec, Net};
use crate::schedule::Target;
use crate::{Error, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to write its address file.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a process is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcState {
    Running,
    Stopped,
    /// Killed, or exited by itself.
    Dead,
}

/// One child process.
pub struct Proc {
    pub name: String,
    /// Its data directory (servers) or working files (clients).
    pub dir: PathBuf,
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    state: ProcState,
    /// The address it listens on (servers; empty for clients).
    pub addr: String,
    /// Servers write `DIR/addr` when they listen; the start waits for it.
    server: bool,
    /// How many times it was started.
    pub incarnation: u64,
    /// The network namespace it runs in (none: the runner's own).
    netns: Option<PathBuf>,
    /// Environment variables of the next start (crash points).
    env: Vec<(String, String)>,
    /// Where the log ended when the process last started.
    log_start: u64,
    /// The credentials file its clients present (`STAMPFS_CREDENTIALS`).
    credentials: Option<PathBuf>,
}

impl Proc {
    /// A process not started yet.
    pub fn new(name: &str, bin: &Path, dir: &Path, logs: &Path, server: bool) -> Proc {
        // Every process of a run presents the superuser's credentials (the master
        // itself ignores them): `logs` is `ROOT/logs`.
        let credentials = logs.parent().map(credentials_file);
        Proc {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
            args: Vec::new(),
            log: logs.join(format!("{name}.log")),
            child: None,
            state: ProcState::Dead,
            addr: String::new(),
            server,
            incarnation: 0,
            netns: None,
            env: Vec::new(),
            log_start: 0,
            credentials,
        }
    }

    /// The environment variables of the next start (replacing earlier ones).
    pub fn set_env(&mut self, env: Vec<(String, String)>) {
        self.env = env;
    }

    /// Whether the next (or current) start has environment variables of its own.
    pub fn has_env(&self) -> bool {
        !self.env.is_empty()
    }

    /// What the process logged since it last started.
    pub fn log_since_start(&self) -> String {
        use std::io::{Read, Seek};
        let mut out = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            if f.seek(std::io::SeekFrom::Start(self.log_start)).is_ok() {
                let _ = f.read_to_end(&mut out);
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Runs the process in the network namespace `netns` from its next start.
    pub fn set_netns(&mut self, netns: Option<PathBuf>) {
        self.netns = netns;
    }

    /// The arguments of the next start.
    pub fn set_args(&mut self, args: Vec<String>) {
        self.args = args;
    }

    /// This process's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Starts the process; a server is waited for until it listens.
    pub async fn start(&mut self) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(Error::io(&self.dir))?;
        let addr_file = self.dir.join("addr");
        if self.server {
            let _ = std::fs::remove_file(&addr_file);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(Error::io(&self.log))?;
        let log2 = log.try_clone().map_err(Error::io(&self.log))?;
        self.log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut cmd = Command::new(&self.bin);
        if let Some(ns) = &self.netns {
            enter_on_exec(&mut cmd, ns)?;
        }
        let child = cmd
            .args(&self.args)
            .env("RUST_LOG", "info")
            .env_remove(stampfs_proto::crash::ENV_POINTS)
            .env_remove(stampfs_proto::crash::ENV_SEED)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(
                self.credentials
                    .iter()
                    .map(|c| (stampfs_proto::credentials::CREDENTIALS_ENV, c)),
            )
            .stdin(Stdio::null())
            .stdout(log2)
            .stderr(log)
            .spawn()
            .map_err(|source| Error::Spawn {
                name: self.name.clone(),
                source,
            })?;
        tracing::debug!(name = %self.name, pid = child.id(), "started");
        self.child = Some(child);
        self.state = ProcState::Running;
        self.incarnation += 1;
        if self.server {
            self.addr = self.wait_addr(&addr_file).await?;
            // Restarts come back on the same address, as a real server would.
            if let Some(i) = self.args.iter().position(|a| a == "--listen") {
                if let Some(v) = self.args.get_mut(i + 1) {
                    *v = self.addr.clone();
                }
            }
        }
        Ok(())
    }

    async fn wait_addr(&mut self, path: &Path) -> Result<String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(s) = std::fs::read_to_string(path) {
                // A member of a master group lists its own address first, then the
                // other members'.
                let own = s.trim().split(',').next().unwrap_or("").to_string();
                if !own.is_empty() {
                    return Ok(own);
                }
            }
            if let Some(status) = self.exited() {
                return Err(Error::EarlyExit {
                    name: self.name.clone(),
                    status,
                    log: self.log.clone(),
                });
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("{} listening", self.name),
                    secs: READY_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The exit status if the process has exited by itself (it is then `Dead`).
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                self.state = ProcState::Dead;
                Some(status.to_string())
            }
            _ => None,
        }
    }

    /// Where the process is (after reaping it if it exited).
    pub fn state(&mut self) -> ProcState {
        let _ = self.exited();
        self.state
    }

    fn signal(&self, sig: Signal) -> Result<()> {
        let Some(c) = self.child.as_ref() else {
            return Ok(());
        };
        kill(Pid::from_raw(c.id() as i32), sig).map_err(|source| Error::Signal {
            name: self.name.clone(),
            source,
        })
    }

    /// SIGKILL and reap.
    /// SIGKILL without waiting for the process to end (see [`Proc::kill`]).
    pub fn sigkill(&self) {
        let _ = self.signal(Signal::SIGKILL);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.state = ProcState::Dead;
    }

    /// SIGSTOP.
    pub fn stop(&mut self) -> Result<()> {
        if self.state() == ProcState::Running {
            self.signal(Signal::SIGSTOP)?;
            self.state = ProcState::Stopped;
        }
        Ok(())
    }

    /// SIGCONT.
    pub fn cont(&mut self) -> Result<()> {
        if self.state() == ProcState::Stopped {
            self.signal(Signal::SIGCONT)?;
            self.state = ProcState::Running;
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit by itself; true if it did.
    pub async fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.state() == ProcState::Dead {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too; continuing it first is harmless.
        let _ = self.signal(Signal::SIGCONT);
        self.kill();
    }
}

/// Timing and shape of the cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Members of the master group (1: a single master on the operation log).
    pub masters: usize,
    pub chunkservers: usize,
    pub replication: u8,
    pub chunk_size: String,
    pub lease_soft: Duration,
    pub lease_hard: Duration,
    pub dead_after: Duration,
    pub heartbeat: Duration,
    /// Put each chunkserver's data dir on a tmpfs of this many MiB (root only), so the
    /// run can fill it up.
    pub small_disk_mib: Option<u64>,
    /// Arm crash points in the servers, drawn from this seed (a binary built with
    /// crash points only).
    pub crash_seed: Option<u64>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            masters: 1,
            chunkservers: 4,
            replication: 3,
            chunk_size: "256KiB".into(),
            lease_soft: Duration::from_secs(1),
            lease_hard: Duration::from_secs(3),
            dead_after: Duration::from_secs(2),
            heartbeat: Duration::from_millis(200),
            small_disk_mib: None,
            crash_seed: None,
        }
    }
}

fn dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Sets the crash points of `p`'s next start (process `t` of a run whose crash seed is
/// `seed`; none without a seed).
pub fn arm(p: &mut Proc, seed: Option<u64>, t: Target) {
    use stampfs_proto::crash::{Process, ENV_POINTS, ENV_SEED};
    let (process, index) = match t {
        Target::Master(i) => (Process::Master, i),
        Target::Chunkserver(i) => (Process::Chunkserver, i),
        Target::Client(i) => (Process::Client, i),
        Target::Network => return,
    };
    let env = seed
        .and_then(|s| crate::crash::arming(s, process, index, p.incarnation + 1))
        .map(|(points, s)| {
            vec![
                (ENV_POINTS.to_string(), points),
                (ENV_SEED.to_string(), s.to_string()),
            ]
        })
        .unwrap_or_default();
    p.set_env(env);
}

/// The superuser's credentials of the run under `root`: the file its master writes
/// at its first start (a group's first member's, which the run wrote).
pub fn credentials_file(root: &Path) -> PathBuf {
    root.join("master")
        .join(stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE)
}

/// The directory of member `i` of the master group under `root`.
fn master_dir(root: &Path, i: usize) -> PathBuf {
    match i {
        0 => root.join("master"),
        i => root.join(format!("master{}", i + 1)),
    }
}

/// The address each member of a group of `n` listens on: a fixed port on its own
/// address in a namespace, a free loopback port otherwise (members must know each
/// other's addresses before they start).
fn member_addrs(n: usize, net: &Net) -> Result<Vec<String>> {
    if net.mode() == crate::net::NetMode::Namespaces {
        return Ok((0..n)
            .map(|i| format!("{}:7070", net.ip(Target::Master(i))))
            .collect());
    }
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(Error::io(Path::new("127.0.0.1:0")))?;
    held.iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.to_string())
                .map_err(Error::io(Path::new("127.0.0.1:0")))
        })
        .collect()
}

/// A master (or a master group) and chunkservers under one directory.
pub struct Cluster {
    pub root: PathBuf,
    pub logs: PathBuf,
    /// The master, or the members of the group (`Target::Master(i)` is `masters[i]`).
    pub masters: Vec<Proc>,
    pub chunkservers: Vec<Proc>,
    /// The chunkservers' small file systems (empty without `small_disk_mib`); declared
    /// after the processes so they are unmounted after the processes were killed.
    pub disks: Vec<SmallDisk>,
    /// The seed of the servers' crash points (none: not armed).
    pub crash_seed: Option<u64>,
}

impl Cluster {
    /// Starts the master (or the members of the group), then the chunkservers, and
    /// waits until all registered. Each process runs in its place of `net`.
    pub async fn start(bin: &Path, root: &Path, cfg: &ClusterConfig, net: &Net) -> Result<Cluster> {
        let logs = root.join("logs");
        std::fs::create_dir_all(&logs).map_err(Error::io(&logs))?;
        let n = cfg.masters.max(1);
        let common = vec![
            "--replication".into(),
            cfg.replication.to_string(),
            "--chunk-size".into(),
            cfg.chunk_size.clone(),
            "--lease-soft".into(),
            dur(cfg.lease_soft),
            "--lease-hard".into(),
            dur(cfg.lease_hard),
            "--dead-after".into(),
            dur(cfg.dead_after),
            "--health-interval".into(),
            "500ms".into(),
        ];
        let mut masters = Vec::with_capacity(n);
        let key = if n == 1 {
            master_dir(root, 0).join("cluster.key")
        } else {
            root.join("cluster.key")
        };
        let peers = if n == 1 {
            Vec::new()
        } else {
            // A group needs its key and the superuser's credentials in every member's
            // directory before it forms (its first leader creates the superuser).
            stampfs_proto::ClusterKey::load_or_create(&key)?;
            let creds =
                stampfs_proto::Credentials::generate(stampfs_proto::credentials::ADMIN_USER)?;
            for i in 0..n {
                let dir = master_dir(root, i);
                std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
                creds.write(
                    &dir.join(stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE),
                    true,
                )?;
            }
            member_addrs(n, net)?
        };
        let peer_list = peers
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        for i in 0..n {
            let t = Target::Master(i);
            let mdir = master_dir(root, i);
            let mut master = Proc::new(&t.to_string(), bin, &mdir, &logs, true);
            master.set_netns(net.netns_of(t));
            arm(&mut master, cfg.crash_seed, t);
            let mut args = vec![
                "master".into(),
                "--dir".into(),
                mdir.display().to_string(),
                "--listen".into(),
                peers
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| format!("{}:0", net.ip(t))),
            ];
            if n > 1 {
                args.extend([
                    "--id".into(),
                    (i + 1).to_string(),
                    "--peers".into(),
                    peer_list.clone(),
                    "--cluster-key-file".into(),
                    key.display().to_string(),
                ]);
            }
            args.extend(common.iter().cloned());
            master.set_args(args);
            masters.push(master);
        }
        // The members of a group start together (each waits for the others to elect).
        for m in masters.iter_mut() {
            m.start().await?;
        }
        let master_list = masters
            .iter()
            .map(|m| m.addr.clone())
            .collect::<Vec<_>>()
            .join(",");
        // Declared first so a failed start drops (kills) the processes before unmounting.
        let mut disks = Vec::new();
        let mut chunkservers = Vec::new();
        for i in 0..cfg.chunkservers {
            let cdir = root.join(format!("cs{i}"));
            if let Some(mib) = cfg.small_disk_mib {
                disks.push(SmallDisk::mount(&cdir, mib)?);
            }
            let mut cs = Proc::new(&format!("cs{i}"), bin, &cdir, &logs, true);
            cs.set_netns(net.netns_of(Target::Chunkserver(i)));
            arm(&mut cs, cfg.crash_seed, Target::Chunkserver(i));
            cs.set_args(vec![
                "chunkserver".into(),
                "--dir".into(),
                cdir.display().to_string(),
                "--listen".into(),
                format!("{}:0", net.ip(Target::Chunkserver(i))),
                "--master".into(),
                master_list.clone(),
                "--cluster-key-file".into(),
                key.display().to_string(),
                "--heartbeat".into(),
                dur(cfg.heartbeat),
            ]);
            cs.start().await?;
            chunkservers.push(cs);
        }
        let cluster = Cluster {
            root: root.to_path_buf(),
            logs,
            masters,
            chunkservers,
            disks,
            crash_seed: cfg.crash_seed,
        };
        cluster.wait_registered().await?;
        Ok(cluster)
    }

    /// Waits until every chunkserver has its id file (it registered with the master).
    async fn wait_registered(&self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while !self
            .chunkservers
            .iter()
            .all(|c| c.dir.join("chunkserver.id").exists())
        {
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "chunkservers registering".into(),
                    secs: READY_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // One more heartbeat round so the master sees them live.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }

    /// The master's address, or the group members', comma-separated (what
    /// `--master` and `STAMPFS_MASTER` take).
    pub fn master_addr(&self) -> String {
        self.masters
            .iter()
            .map(|m| m.addr.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The master processes and chunkservers, as targets.
    pub fn servers(&mut self) -> impl Iterator<Item = (Target, &mut Proc)> {
        let masters = self
            .masters
            .iter_mut()
            .enumerate()
            .map(|(i, p)| (Target::Master(i), p));
        let chunkservers = self
            .chunkservers
            .iter_mut()
            .enumerate()
            .map(|(i, p)| (Target::Chunkserver(i), p));
        masters.chain(chunkservers)
    }
}
