//! The run's client processes: library clients (one `stampfs nemesis-client`
//! process each) and FUSE clients (a `stampfs mount --foreground` process plus a
//! `stampfs nemesis-client --mount DIR` process writing through it).
//!
//! A fault on client `i` hits the whole client, as a crash or freeze of its machine
//! would: SIGKILL takes the writer and the mount (the dead mount is detached with
//! its FUSE connection aborted and `umount -l`), SIGSTOP freezes both, and both run in the client's network namespace.
//! A client that exits by itself (or whose mount dies) is noted and started again.

use crate::cluster::{Proc, ProcState};
use crate::net::Net;
use crate::schedule::Target;
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a client may take to start (a FUSE client's mount to appear in the mount
/// table, the master perhaps down meanwhile).
const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long after a failed start of `stampfs mount` it is started again.
const MOUNT_RETRY: Duration = Duration::from_millis(300);

/// Why FUSE mounts cannot run here, if they cannot.
pub fn fuse_unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("not root (the pure-Rust mount needs /dev/fuse as root)".into());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!("cannot open /dev/fuse: {e}"));
    }
    None
}

/// Whether `path` is a FUSE mount point now.
pub fn is_fuse_mount(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_string_lossy();
    info.lines().any(|line| {
        let mut halves = line.splitn(2, " - ");
        let (Some(left), Some(right)) = (halves.next(), halves.next()) else {
            return false;
        };
        left.split_whitespace().nth(4) == Some(&*want) && right.starts_with("fuse")
    })
}

/// Detaches whatever is mounted on `point` (a dead FUSE server's mount included),
/// aborting its FUSE connection first.
fn detach(point: &Path) {
    if is_fuse_mount(point) {
        abort_fuse(point);
        let _ = Command::new("umount").arg("-l").arg(point).output();
    }
}

/// Where the kernel lists FUSE connections (the `fusectl` file system).
const FUSE_CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// Aborts the FUSE connection of the mount on `point`: every request waiting for its
/// server fails at once. A server SIGKILLed while one of its threads was inside the
/// kernel, dropping cached pages that an unanswered read of its own held locked, can
/// otherwise never exit: its `/dev/fuse` descriptor, whose release would abort the
/// connection, stays open in the stuck thread (seen with seed 9929). Mounts `fusectl`
/// when it is not mounted yet.
fn abort_fuse(point: &Path) {
    let Some(conn) = fuse_connection(point) else {
        return;
    };
    let dir = Path::new(FUSE_CONNECTIONS).join(conn.to_string());
    if !dir.exists() {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none", FUSE_CONNECTIONS])
            .output();
    }
    if let Err(e) = std::fs::write(dir.join("abort"), "1") {
        tracing::debug!(point = %point.display(), error = %e, "could not abort the FUSE connection");
    }
}

/// The FUSE connection number of the mount on `point`: the minor number of its
/// device, from the mount table (looking at the mount itself could hang).
fn fuse_connection(point: &Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    fuse_connection_in(&info, point)
}

/// [`fuse_connection`] in the mount table `info` (`/proc/self/mountinfo`'s format).
fn fuse_connection_in(info: &str, point: &Path) -> Option<u32> {
    let want = point.to_string_lossy();
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split_whitespace().collect();
        if fields.get(4) != Some(&&*want) || !right.starts_with("fuse") {
            return None;
        }
        fields.get(2)?.split_once(':')?.1.parse().ok()
    })
}

/// Ends a FUSE client's mount server: SIGKILL, then the connection aborted and the
/// mount detached before waiting for the process (see [`abort_fuse`]).
fn kill_mount(m: &mut MountProc) {
    m.proc.sigkill();
    detach(&m.point);
    m.proc.kill();
}

/// A FUSE client's mount.
struct MountProc {
    proc: Proc,
    point: PathBuf,
    /// When it was last started (starts are spaced by `MOUNT_RETRY`).
    last_start: Option<Instant>,
}

/// What the run started its client processes with.
pub struct ClientSpec<'a> {
    pub bin: &'a Path,
    pub root: &'a Path,
    pub logs: &'a Path,
    pub master: &'a str,
    pub seed: u64,
    pub clients: usize,
    /// The last `mounts` clients write through a FUSE mount.
    pub mounts: usize,
    pub files: u32,
    pub dir: &'a str,
    /// Arm the library writers' crash points, drawn from this seed, until the heal.
    pub crash_seed: Option<u64>,
}

/// The client processes and their bookkeeping.
pub struct Clients {
    pub procs: Vec<Proc>,
    /// Per client: its mount (FUSE clients) or `None` (library clients).
    mounts: Vec<Option<MountProc>>,
    root: PathBuf,
    master: String,
    seed: u64,
    files: u32,
    dir: String,
    /// Per client: killed by the schedule and not restarted yet.
    killed: Vec<bool>,
    /// Per client: a start asked for and not done yet, since when.
    pending: Vec<Option<Instant>>,
    /// Exits nobody asked for, noted for the report.
    pub unexpected_exits: Vec<String>,
    /// The seed of the library writers' crash points; `None` once healed.
    crash_seed: Option<u64>,
    /// The crash points library writers died at (each one an injected fault).
    pub crash_hits: Vec<String>,
}

impl Clients {
    pub fn new(spec: &ClientSpec<'_>, net: &Net) -> Self {
        let mut procs = Vec::new();
        let mut mounts = Vec::new();
        for i in 0..spec.clients {
            let ns = net.netns_of(Target::Client(i));
            let mut p = Proc::new(
                &format!("client{i}"),
                spec.bin,
                &spec.root.join("clients"),
                spec.logs,
                false,
            );
            p.set_netns(ns.clone());
            procs.push(p);
            let fuse = i >= spec.clients.saturating_sub(spec.mounts);
            mounts.push(fuse.then(|| {
                let point = spec.root.join(format!("mnt{i}"));
                let mut m = Proc::new(
                    &format!("client{i}-mount"),
                    spec.bin,
                    &spec.root.join("clients"),
                    spec.logs,
                    false,
                );
                m.set_netns(ns);
                m.set_args(vec![
                    "mount".into(),
                    "--foreground".into(),
                    "--master".into(),
                    spec.master.to_string(),
                    point.display().to_string(),
                ]);
                MountProc {
                    proc: m,
                    point,
                    last_start: None,
                }
            }));
        }
        Self {
            killed: vec![false; procs.len()],
            pending: vec![None; procs.len()],
            procs,
            mounts,
            root: spec.root.to_path_buf(),
            master: spec.master.to_string(),
            seed: spec.seed,
            files: spec.files,
            dir: spec.dir.to_string(),
            unexpected_exits: Vec::new(),
            crash_seed: spec.crash_seed,
            crash_hits: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// How many clients write through a mount.
    pub fn mounts(&self) -> usize {
        self.mounts.iter().flatten().count()
    }

    pub fn stop_file(&self) -> PathBuf {
        self.root.join("stop")
    }

    pub fn history_dir(&self) -> PathBuf {
        self.root.join("history")
    }

    /// Asks for client `i` to be started (again); [`Clients::progress`] does it.
    fn request_start(&mut self, i: usize) {
        self.pending[i].get_or_insert_with(Instant::now);
    }

    /// Moves every requested start on without waiting: a library client is started;
    /// a FUSE client first gets its mount started (again, if `stampfs mount` gave up
    /// because the master did not answer, which the schedule may well cause) and its
    /// writer once the kernel lists the mount. Never blocks the schedule.
    pub async fn progress(&mut self) -> Result<()> {
        for i in 0..self.procs.len() {
            let Some(since) = self.pending[i] else {
                continue;
            };
            if since.elapsed() > MOUNT_TIMEOUT {
                let m = self.mounts[i]
                    .as_ref()
                    .map(|m| m.proc.log_path().display().to_string());
                return Err(Error::Timeout {
                    what: format!(
                        "client{i} started (mount log: {})",
                        m.unwrap_or_else(|| "none".into())
                    ),
                    secs: MOUNT_TIMEOUT.as_secs(),
                });
            }
            let mount = match self.mounts[i].as_mut() {
                None => None,
                Some(m) => {
                    if m.proc.state() == ProcState::Dead {
                        let throttled = m.last_start.is_some_and(|t| t.elapsed() < MOUNT_RETRY);
                        if !throttled {
                            detach(&m.point);
                            std::fs::create_dir_all(&m.point).map_err(Error::io(&m.point))?;
                            m.last_start = Some(Instant::now());
                            m.proc.start().await?;
                        }
                        continue;
                    }
                    if !is_fuse_mount(&m.point) {
                        continue;
                    }
                    Some(m.point.clone())
                }
            };
            self.start_writer(i, mount).await?;
            self.pending[i] = None;
        }
        Ok(())
    }

    /// Calls [`Clients::progress`] until every requested start is done.
    pub async fn wait_started(&mut self) -> Result<()> {
        loop {
            self.progress().await?;
            if self.pending.iter().all(Option::is_none) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Asks for every client to be started; [`Clients::progress`] does it.
    pub fn request_all(&mut self) {
        for i in 0..self.procs.len() {
            self.request_start(i);
        }
    }

    /// No start is pending.
    pub fn all_started(&self) -> bool {
        self.pending.iter().all(Option::is_none)
    }

    /// Starts client `i` and waits until it runs.
    pub async fn start(&mut self, i: usize) -> Result<()> {
        self.request_start(i);
        self.wait_started().await
    }

    /// Starts client `i`'s writer process as a new incarnation.
    async fn start_writer(&mut self, i: usize, mount: Option<PathBuf>) -> Result<()> {
        let history_dir = self.history_dir();
        std::fs::create_dir_all(&history_dir).map_err(Error::io(&history_dir))?;
        let stop = self.stop_file();
        let (master, seed) = (self.master.clone(), self.seed);
        let (files, dir) = (self.files, self.dir.clone());
        let p = &mut self.procs[i];
        let nonce = p.incarnation + 1;
        let mut args = vec![
            "nemesis-client".into(),
            "--master".into(),
            master,
            "--client".into(),
            i.to_string(),
            "--nonce".into(),
            nonce.to_string(),
            "--seed".into(),
            (seed ^ ((i as u64) << 32) ^ (nonce << 48)).to_string(),
            "--history".into(),
            history_dir
                .join(format!("client{i}-{nonce}.jsonl"))
                .display()
                .to_string(),
            "--stop-file".into(),
            stop.display().to_string(),
            "--files".into(),
            files.to_string(),
            "--dir".into(),
            dir,
        ];
        if let Some(point) = &mount {
            args.push("--mount".into());
            args.push(point.display().to_string());
        }
        // The mount's writer uses no client library of its own: nothing to arm there.
        let seed = if mount.is_none() {
            self.crash_seed
        } else {
            None
        };
        crate::cluster::arm(p, seed, Target::Client(i));
        p.set_args(args);
        p.start().await
    }

    /// SIGKILL client `i` (and its mount). The mount goes first: its death aborts the
    /// FUSE connection, which releases the writer from any request it is blocked in
    /// (a `close` waits for its flush uninterruptibly, and reaping a writer stuck
    /// there would hold up the whole schedule).
    pub fn kill(&mut self, i: usize) {
        self.killed[i] = true;
        self.pending[i] = None;
        if let Some(m) = self.mounts[i].as_mut() {
            kill_mount(m);
        }
        self.procs[i].kill();
    }

    /// Starts client `i` again after [`Clients::kill`] (without waiting for it).
    pub async fn restart(&mut self, i: usize) -> Result<()> {
        self.killed[i] = false;
        if self.procs[i].state() == ProcState::Dead {
            self.request_start(i);
        }
        self.progress().await
    }

    /// SIGSTOP client `i` (its mount first).
    pub fn stop(&mut self, i: usize) -> Result<()> {
        if let Some(m) = self.mounts[i].as_mut() {
            m.proc.stop()?;
        }
        self.procs[i].stop()
    }

    /// SIGCONT client `i`.
    pub fn cont(&mut self, i: usize) -> Result<()> {
        if let Some(m) = self.mounts[i].as_mut() {
            m.proc.cont()?;
        }
        self.procs[i].cont()
    }

    /// Restarts every client that exited (or whose mount died) without being killed
    /// (without waiting for it), and moves pending starts on.
    pub async fn restart_exited(&mut self) -> Result<()> {
        for i in 0..self.procs.len() {
            if self.killed[i] || self.pending[i].is_some() {
                continue;
            }
            let mount_died = self.mounts[i]
                .as_mut()
                .and_then(|m| m.proc.exited().map(|s| (m.proc.incarnation, s)));
            if let Some((incarnation, status)) = mount_died {
                let note = format!(
                    "client{i}'s mount (incarnation {incarnation}) exited by itself: {status}"
                );
                tracing::warn!(%note);
                self.unexpected_exits.push(note);
                self.procs[i].kill();
                self.request_start(i);
                continue;
            }
            if let Some(status) = self.procs[i].exited() {
                if let Some(point) = crate::crash::crash_point_hit(&self.procs[i].log_since_start())
                {
                    tracing::info!(client = i, %point, "client died at a crash point; restarting it");
                    self.crash_hits.push(point);
                    self.request_start(i);
                    continue;
                }
                let note = format!(
                    "client{i} (incarnation {}) exited by itself: {status}",
                    self.procs[i].incarnation
                );
                tracing::warn!(%note);
                self.unexpected_exits.push(note);
                self.request_start(i);
            }
        }
        self.progress().await
    }

    /// The heal: every client continued, and started again if it is down; waits until
    /// all run.
    pub async fn heal(&mut self) -> Result<()> {
        // Crash points end with the faults, as the servers' do.
        self.crash_seed = None;
        for i in 0..self.procs.len() {
            self.cont(i)?;
        }
        for i in 0..self.procs.len() {
            if self.killed[i] {
                self.restart(i).await?;
            }
        }
        self.restart_exited().await?;
        self.wait_started().await
    }

    /// After the stop file: waits for every writer to finish (killing those that do
    /// not within `timeout`), then unmounts every mount (its last closes commit).
    pub async fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for i in 0..self.procs.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.procs[i].wait_exit(left).await {
                let note = format!(
                    "client{i} did not stop within {} s of the heal; killed",
                    timeout.as_secs()
                );
                tracing::warn!(%note);
                self.unexpected_exits.push(note);
                self.kill(i);
            }
        }
        for m in self.mounts.iter_mut().flatten() {
            let _ = Command::new("umount").arg(&m.point).output();
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_secs(5));
            if !m.proc.wait_exit(left).await {
                let note = format!("{} did not end after umount; killed", m.proc.name);
                tracing::warn!(%note);
                self.unexpected_exits.push(note);
                kill_mount(m);
            }
            detach(&m.point);
        }
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        // Mounts first (see `Clients::kill`).
        for m in self.mounts.iter_mut().flatten() {
            kill_mount(m);
        }
        for p in &mut self.procs {
            p.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuse_connection_is_the_mounts_minor_number() {
        let info = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                    60 27 0:44 / /tmp/n/mnt2 rw,nosuid,nodev,relatime - fuse \
                    stampfs:10.77.0.2:35491 rw,user_id=0,group_id=0,default_permissions\n";
        assert_eq!(fuse_connection_in(info, Path::new("/tmp/n/mnt2")), Some(44));
        // The root is mounted but is not FUSE; another path is not mounted at all.
        assert_eq!(fuse_connection_in(info, Path::new("/")), None);
        assert_eq!(fuse_connection_in(info, Path::new("/tmp/n")), None);
        assert_eq!(fuse_connection(Path::new("/nonexistent/mnt")), None);
    }
}
