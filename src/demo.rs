//! `stampfs demo`: the story stampfs exists for, told on a local cluster with real
//! processes, and checked claim by claim.
//!
//! The timeline of the fencing-token argument, literally: writer A (a child process,
//! `stampfs demo-writer`) takes the lease and writes `value=0` at offset 0; A is
//! frozen with SIGSTOP; its lease expires and the master recovers the file (version
//! bump, close at the acknowledged length); writer B writes `value=100` at offset 0
//! under a newer version; A is resumed and writes `value=1` at offset 0, which a
//! chunkserver rejects with `StaleToken`: A exits fenced, and the file reads
//! `value=100`. Then a chunkserver
//! misses a bump, comes back with a stale replica, and the garbage collector deletes
//! it while re-replication restores three copies at the current version.

use crate::cluster::LocalCluster;
use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use stampfs_client::Client;
use stampfs_proto::{ChunkVersion, FileState};
use std::io::IsTerminal;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

const PATH: &str = "/demo/value";
const LEASE_SOFT: Duration = Duration::from_secs(2);
const LEASE_HARD: Duration = Duration::from_secs(4);

/// A log line from the embedded servers worth telling in the story.
struct Told {
    at: Instant,
    who: &'static str,
    text: String,
}

/// Forwards the master's lease-recovery steps and the chunkservers' rejections from
/// the embedded cluster's tracing events to the narrator.
struct Capture {
    tx: std::sync::mpsc::Sender<Told>,
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(String, String)>,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.rest
                .push((field.name().to_string(), value.to_string()));
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let meta = event.metadata();
        let mut f = Fields::default();
        event.record(&mut f);
        let pick = |names: &[&str]| -> String {
            f.rest
                .iter()
                .filter(|(k, _)| names.contains(&k.as_str()))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let told = if meta
            .target()
            .starts_with("stampfs_master::service::recovery")
            && *meta.level() <= tracing::Level::INFO
        {
            let detail = pick(&["old_version", "new_version", "length", "replicas"]);
            let text = if detail.is_empty() {
                f.message.clone()
            } else {
                format!("{} [{detail}]", f.message)
            };
            Some(Told {
                at: Instant::now(),
                who: "master",
                text,
            })
        } else if meta.target().starts_with("stampfs_master::service::health")
            && *meta.level() <= tracing::Level::INFO
        {
            let detail = pick(&[
                "chunkserver",
                "max_version",
                "reason",
                "version",
                "source",
                "target",
            ]);
            Some(Told {
                at: Instant::now(),
                who: "master",
                text: format!("{} [{detail}]", f.message),
            })
        } else if meta.target().starts_with("stampfs_chunkserver")
            && f.rest.iter().any(|(_, v)| v.contains("stale token"))
        {
            let err = pick(&["error"]);
            Some(Told {
                at: Instant::now(),
                who: "chunkserver",
                text: format!("{}: {}", f.message, err.trim_start_matches("error=")),
            })
        } else {
            None
        };
        if let Some(t) = told {
            let _ = self.tx.send(t);
        }
    }
}

struct Narrator {
    start: Instant,
    color: bool,
    failures: Vec<String>,
    /// Server log lines waiting to be told, from [`Capture`].
    heard: std::sync::mpsc::Receiver<Told>,
}

impl Narrator {
    fn new() -> Self {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        use tracing_subscriber::Layer;
        let (tx, heard) = std::sync::mpsc::channel();
        let errors = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(tracing_subscriber::filter::LevelFilter::ERROR);
        let _ = tracing_subscriber::registry()
            .with(Capture { tx })
            .with(errors)
            .try_init();
        Self {
            start: Instant::now(),
            color: std::io::stdout().is_terminal(),
            failures: Vec::new(),
            heard,
        }
    }

    /// Tells what the servers logged since the last call (each line once).
    fn retell(&self) {
        let mut seen = std::collections::HashSet::new();
        while let Ok(t) = self.heard.try_recv() {
            if seen.insert((t.who, t.text.clone())) {
                self.say_at(t.at, t.who, &t.text);
            }
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    fn say(&self, who: &str, text: &str) {
        self.say_at(Instant::now(), who, text);
    }

    fn say_at(&self, at: Instant, who: &str, text: &str) {
        let t = format!(
            "[{:>6.2}s]",
            at.saturating_duration_since(self.start).as_secs_f64()
        );
        println!(
            "{} {:<12} {text}",
            self.paint("2", &t),
            self.paint("1", who)
        );
    }

    fn check(&mut self, claim: &str, held: bool) {
        let mark = if held {
            self.paint("32", "ok  ")
        } else {
            self.paint("31", "FAIL")
        };
        println!("{:>10} {mark} {claim}", "");
        if !held {
            self.failures.push(claim.to_string());
        }
    }
}

/// Runs the demo; the exit status is 0 only if every claim held.
pub async fn run() -> u8 {
    let mut n = Narrator::new();
    n.heard.try_iter().for_each(drop);
    match story(&mut n).await {
        Ok(()) if n.failures.is_empty() => {
            println!();
            println!("{}", n.paint("32;1", "every claim of the story held."));
            crate::EXIT_OK
        }
        Ok(()) => {
            println!();
            println!("{}", n.paint("31;1", "these claims did NOT hold:"));
            for f in &n.failures {
                println!("  - {f}");
            }
            crate::EXIT_ERROR
        }
        Err(e) => {
            println!();
            println!("{} {e:#}", n.paint("31;1", "the demo could not continue:"));
            crate::EXIT_ERROR
        }
    }
}

async fn current_version(client: &Client) -> Result<(ChunkVersion, FileState, u64)> {
    let locs = client.locations(PATH).await?;
    let v = locs
        .chunks
        .last()
        .map(|c| c.version)
        .context("the file has no chunk")?;
    Ok((v, locs.status.state, locs.status.length))
}

async fn read_all(client: &Client) -> Result<Vec<u8>> {
    let mut r = client.open(PATH).await?;
    let mut out = Vec::new();
    r.read_to_end(&mut out).await?;
    Ok(out)
}

async fn story(n: &mut Narrator) -> Result<()> {
    let tmp = tempfile::Builder::new().prefix("stampfs-demo-").tempdir()?;
    println!("stampfs demo: a frozen writer is fenced by the storage");
    println!(
        "  settings: 3 chunkservers, replication 3, lease soft limit {}s, hard limit {}s",
        LEASE_SOFT.as_secs(),
        LEASE_HARD.as_secs()
    );
    println!("  data in {}", tmp.path().display());
    println!();
    let mut cluster = LocalCluster::builder(tmp.path())
        .chunkservers(3)
        .master_config(|m| {
            m.lease_soft = LEASE_SOFT;
            m.lease_hard = LEASE_HARD;
            m.dead_after = Duration::from_secs(3);
            m.health_interval = Duration::from_millis(300);
        })
        .chunkserver_config(|c| c.heartbeat = Duration::from_millis(200))
        .start()
        .await?;
    let master = cluster.master_addr();
    n.say(
        "cluster",
        &format!("master at {master}, 3 chunkservers registered"),
    );
    let client = cluster.client().await?;
    client.mkdir("/demo", true).await?;

    // Writer A: a real child process that writes what it is told where it is told,
    // each write hsynced.
    let exe = std::env::current_exe().context("locating the stampfs binary")?;
    let mut a = tokio::process::Command::new(exe)
        .args(["demo-writer", PATH, "--master", &master, "--credentials"])
        .arg(cluster.credentials_file())
        .env("RUST_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting writer A")?;
    let a_pid = a.id().context("writer A's pid")? as i32;
    let mut a_in = a.stdin.take().context("writer A's stdin")?;
    let mut a_out = tokio::io::BufReader::new(a.stdout.take().context("writer A's stdout")?);
    a_in.write_all(b"0 value=0\n").await?;
    a_in.flush().await?;
    let mut synced = String::new();
    tokio::time::timeout(Duration::from_secs(30), a_out.read_line(&mut synced))
        .await
        .context("writer A did not hsync its first write")??;
    if !synced.starts_with("synced 0 ") {
        bail!("writer A's first write failed: {synced:?}");
    }
    let (v_a, _, _) = current_version(&client).await?;
    n.say(
        "writer A",
        &format!(
            "pid {a_pid} holds the lease and wrote value=0 at offset 0, hsynced on every replica (version {v_a})"
        ),
    );

    // Freeze A.
    signal(a_pid, Signal::SIGSTOP)?;
    n.say(
        "writer A",
        "frozen with SIGSTOP (think: a long GC pause or a VM freeze)",
    );

    // The lease expires; the master recovers the file on its own at the hard limit.
    let deadline = Instant::now() + LEASE_HARD + Duration::from_secs(20);
    let (v_rec, len_rec) = loop {
        let (v, state, len) = current_version(&client).await?;
        if state == FileState::Closed {
            break (v, len);
        }
        if Instant::now() > deadline {
            bail!("the master did not recover the lease after the hard limit");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    n.retell();
    n.say(
        "master",
        &format!("lease expired; recovery bumped version {v_a} -> {v_rec} and closed the file at {len_rec} bytes"),
    );
    n.check(
        &format!("recovery raised the version ({v_a} -> {v_rec})"),
        v_rec > v_a,
    );
    n.check(
        "recovery kept writer A's acknowledged value=0",
        read_all(&client).await? == b"value=0\n",
    );

    // Writer B overwrites the value under a newer version.
    let mut b = client.open_options().write(true).open(PATH).await?;
    b.write_at(0, b"value=100\n").await?;
    b.hsync().await?;
    let (v_b, _, _) = current_version(&client).await?;
    b.close().await?;
    n.say(
        "writer B",
        &format!("wrote value=100 at offset 0 under version {v_b}, hsynced, and closed"),
    );
    n.check(
        &format!("B's version is newer ({v_rec} -> {v_b})"),
        v_b > v_rec,
    );

    // Resume A: its next write carries the old version.
    signal(a_pid, Signal::SIGCONT)?;
    n.say(
        "writer A",
        "resumed with SIGCONT; it still believes it holds the lease, and writes value=1 at offset 0",
    );
    let _ = a_in.write_all(b"0 value=1\n").await;
    let _ = a_in.flush().await;
    drop(a_in);
    let mut a_err = String::new();
    if let Some(mut e) = a.stderr.take() {
        let _ = tokio::time::timeout(Duration::from_secs(30), e.read_to_string(&mut a_err)).await;
    }
    let status = tokio::time::timeout(Duration::from_secs(30), a.wait())
        .await
        .context("writer A did not exit")??;
    n.retell();
    let a_line = a_err.lines().last().unwrap_or("").trim().to_string();
    n.say(
        "writer A",
        &format!("REJECTED by the chunkservers: {a_line}"),
    );
    n.check(
        "writer A exited with status 3 (fenced)",
        status.code() == Some(3),
    );
    let expected_msg = format!("presented version {v_a}, current version {v_b}");
    n.check(
        &format!("the rejection came from the storage with StaleToken ({expected_msg})"),
        a_err.contains(&expected_msg),
    );

    // The final contents.
    let got = read_all(&client).await?;
    n.say(
        "reader",
        &format!("the file reads {:?}", String::from_utf8_lossy(&got)),
    );
    n.check(
        "the file reads value=100 (B's write)",
        got == b"value=100\n",
    );
    n.check(
        "writer A's late value=1 did not land (unfenced, the file would read \"value=1\\n0\\n\")",
        !got.starts_with(b"value=1\n"),
    );
    gc_story(n, &client, &mut cluster).await?;
    cluster.shutdown().await?;
    Ok(())
}

/// The version in the replica header of `handle` in a chunkserver directory, if any.
fn version_on_disk(dir: &std::path::Path, handle: stampfs_proto::ChunkHandle) -> Option<u64> {
    let bytes = std::fs::read(stampfs_chunkserver::layout::replica_path(dir, handle)).ok()?;
    let slot = stampfs_chunkserver::header::SLOT_SIZE as usize;
    if bytes.len() < 2 * slot {
        return None;
    }
    stampfs_chunkserver::header::Header::newest(&bytes[..slot], &bytes[slot..2 * slot])
        .ok()
        .map(|h| h.version.0)
}

/// A chunkserver misses a version bump, comes back with a stale replica, and the
/// garbage collector deletes it while re-replication restores three copies.
async fn gc_story(n: &mut Narrator, client: &Client, cluster: &mut LocalCluster) -> Result<()> {
    const DOWN: usize = 2;
    println!();
    let handle = client
        .locations(PATH)
        .await?
        .chunks
        .last()
        .map(|c| c.handle)
        .context("the file has no chunk")?;
    let dir = cluster
        .chunkserver_dir(DOWN)
        .context("no third chunkserver")?
        .to_path_buf();
    let name = cluster
        .chunkserver_id(DOWN)
        .map_or_else(|| "chunkserver".to_string(), |id| id.to_string());
    cluster.stop_chunkserver(DOWN).await?;
    n.say(&name, "stopped: it will miss the next version bump");
    let c_data = b"C: appended while a chunkserver was down\n".repeat(20);
    let mut c = client.append(PATH).await?;
    c.write_all(&c_data).await?;
    c.close().await?;
    let (v_c, _, _) = current_version(client).await?;
    let old = version_on_disk(&dir, handle);
    n.say(
        "writer C",
        &format!(
            "appended {} bytes under version {v_c}; {name}'s replica still says version {}",
            c_data.len(),
            old.map_or("-".into(), |v| v.to_string())
        ),
    );
    n.check(
        &format!("{name} holds a stale replica (below the master's version)"),
        old.is_some_and(|v| v < v_c.0),
    );
    cluster.restart_chunkserver(DOWN).await?;
    n.say(&name, "back, reporting its replicas to the master");
    let deadline = Instant::now() + Duration::from_secs(40);
    let healed = loop {
        let stale_gone = version_on_disk(&dir, handle).is_none_or(|v| v >= v_c.0);
        let locs = client.locations(PATH).await?;
        let three = locs
            .chunks
            .last()
            .is_some_and(|ch| ch.version == v_c && ch.replicas.len() == 3);
        if stale_gone && three {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    n.retell();
    n.check(
        &format!("the garbage collector removed the stale replica from {name}'s disk"),
        version_on_disk(&dir, handle).is_none_or(|v| v >= v_c.0),
    );
    n.check(
        &format!("re-replication restored three replicas at version {v_c}"),
        healed,
    );
    Ok(())
}

fn signal(pid: i32, sig: Signal) -> Result<()> {
    kill(Pid::from_raw(pid), sig).with_context(|| format!("sending {sig} to {pid}"))
}

/// `stampfs demo-writer`: writer A of the demo. Opens PATH for writes anywhere and,
/// for each stdin line `OFFSET TEXT`, writes `TEXT` and a newline at OFFSET, hsyncs,
/// and prints `synced OFFSET LEN`; closes the file at the end of its input.
pub async fn writer(args: crate::cli::DemoWriterArgs) -> Result<()> {
    let config = crate::users::client_config(&args.master)?;
    let client = Client::connect_with(&args.master.master, config)
        .await
        .with_context(|| format!("cannot reach the master at {}", args.master.master))?;
    let mut w = client
        .open_options()
        .write(true)
        .create(true)
        .open(&args.path)
        .await
        .with_context(|| format!("cannot open {} for writing", args.path))?;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await.context("reading stdin")? {
        let (offset, text) = line
            .split_once(' ')
            .with_context(|| format!("{line:?} is not `OFFSET TEXT`"))?;
        let offset: u64 = offset
            .parse()
            .with_context(|| format!("{offset:?} is not an offset"))?;
        let mut data = text.as_bytes().to_vec();
        data.push(b'\n');
        w.write_at(offset, &data).await?;
        w.hsync().await?;
        out.write_all(format!("synced {offset} {}\n", data.len()).as_bytes())
            .await?;
        out.flush().await?;
    }
    w.close().await?;
    Ok(())
}
