//! `MountGuard`: `stampfs mount --foreground` of a [`TestCluster`] as a child process,
//! waited for until the kernel lists the mount, unmounted and reaped on drop; and
//! [`fuse_or_skip`], the rule for tests that need FUSE (a failure in CI, `SKIPPED:`
//! elsewhere); [`sh_in`], a shell script run where a test says.

use super::TestCluster;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Why FUSE mounts cannot work here, if they cannot.
pub use stampfs_nemesis::clients::fuse_unavailable;

/// True when the test can run; panics in CI when it cannot.
pub fn fuse_or_skip(test: &str) -> bool {
    let Some(why) = fuse_unavailable() else {
        return true;
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: FUSE is required in CI: {why}");
    }
    println!("SKIPPED: {test}: {why}");
    // Straight to stderr, past the test harness's capture, so a skip is never silent.
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
    false
}

/// Runs a shell script in `dir` and asserts it succeeded; its stdout.
pub fn sh_in(dir: &std::path::Path, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `path` is a FUSE mount point, from /proc/self/mountinfo.
pub use stampfs_nemesis::clients::is_fuse_mount;

/// `stampfs mount --foreground` on a fresh temp dir. Dropping it unmounts (SIGTERM,
/// then SIGKILL and `umount -l` if needed) and reaps the process.
pub struct MountGuard {
    /// Holds the mount point; removed after `drop` has unmounted it.
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl MountGuard {
    pub fn start(c: &TestCluster) -> Self {
        Self::start_with(c, &[])
    }

    /// [`MountGuard::start`] with more `stampfs mount` arguments. With
    /// `--allow-other` the temp dir above the mount point is opened to everyone, so
    /// that other users reach it.
    pub fn start_with(c: &TestCluster, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("stampfs-mnt-")
            .tempdir()
            .expect("tempdir");
        if extra.contains(&"--allow-other") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
                .expect("chmod the mount's temp dir");
        }
        let root = dir.path().join("mnt");
        std::fs::create_dir(&root).expect("mount point");
        let root = root.canonicalize().expect("canonical mount point");
        let log = dir.path().join("mount.log");
        let log_file = File::create(&log).expect("mount log");
        let mut args = vec!["mount", "--foreground"];
        args.extend_from_slice(extra);
        args.push(root.to_str().expect("utf8 path"));
        let child = c
            .cmd(&args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn stampfs mount");
        let mut m = MountGuard {
            _dir: dir,
            root,
            log,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_fuse_mount(&m.root) {
            if let Some(Ok(Some(status))) = m.child.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "stampfs mount exited with {status} before mounting:\n{}",
                    m.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "not mounted within 30 s:\n{}",
                m.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn p(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("mount running").id() as i32)
    }

    /// Sends `sig` and waits for the process to exit.
    pub fn stop_with(&mut self, sig: Signal) -> ExitStatus {
        let mut child = self.child.take().expect("mount running");
        let _ = kill(Pid::from_raw(child.id() as i32), sig);
        wait_exit(&mut child, Duration::from_secs(30))
    }

    /// Waits for the process to exit by itself (after an external `umount`).
    pub fn wait(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("mount running");
        wait_exit(&mut child, Duration::from_secs(30))
    }

    /// Detaches a mount whose server died.
    pub fn lazy_umount(&self) {
        if is_fuse_mount(&self.root) {
            let out = Command::new("umount")
                .arg("-l")
                .arg(&self.root)
                .output()
                .expect("run umount");
            assert!(out.status.success(), "umount -l: {out:?}");
        }
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("stampfs mount did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("==== mount log\n{}", self.log_text());
        }
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if is_fuse_mount(&self.root) {
            let _ = Command::new("umount").arg("-l").arg(&self.root).output();
        }
        // `self._dir` is removed after this, when nothing is mounted on it any more.
    }
}
