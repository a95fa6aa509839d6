//! One nemesis run, step by step:
//!
//! 1. start the [`Cluster`] (1 master, 4 chunkservers, replication 3, short leases,
//!    256 KiB chunks) and create the shared files;
//! 2. start the client processes (`stampfs nemesis-client`);
//! 3. inject the seeded [`schedule`] for the run's duration (a client that exits by
//!    itself is noted and restarted);
//! 4. heal: SIGCONT everything stopped, restart everything killed;
//! 5. create the stop file and let the writers finish their sessions (a client that
//!    does not stop in time is killed);
//! 6. recover the lease of every file still open, read the final files (kept as
//!    `DIR/final/fN`); a file that cannot be closed or read is
//!    [`ViolationKind::Unavailable`];
//! 7. check them against the histories ([`checker::check`]);
//! 8. `stampfs fsck --json` must turn healthy within a bounded wait (re-replication),
//!    and then every replica the master hands out must be byte-identical at its
//!    version ([`check_replicas`]);
//! 9. no process log may contain a panic.
//!
//! Every process runs in its place of the run's [`Net`] (loopback, or a network
//! namespace of its own so the schedule can partition it); the runner's own calls run
//! in a namespace of the runner. Each step the run carries out is logged to
//! `DIR/logs/nemesis-steps.log` with its time.
//!
//! The run's directory is removed unless the run failed or `keep_dir` was given.

use crate::admin_churn::{self, Churn};
use crate::checker::{self, Violation, ViolationKind};
use crate::clients::{ClientSpec, Clients};
use crate::cluster::{arm, Cluster, ClusterConfig, ProcState};
use crate::finish::{
    read_final, recover, scan_logs, wait_all_live, wait_fsck_healthy, FSCK_TIMEOUT,
};
use crate::history::History;
use crate::net::{Net, NetMode};
use crate::replicas::check_replicas;
use crate::report::{Report, RunReport};
use crate::schedule::{self, Action, ScheduleConfig, Target};
use crate::workload::{self, file_path};
use crate::{Error, Result};
use stampfs_client::{Client, CreateOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The directory of the shared files in stampfs.
const DIR: &str = "/nemesis";
/// Shared files the clients contend for.
const FILES: u32 = 2;
/// How long the writers get to finish after the heal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(45);

/// What to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The `stampfs` binary to spawn for every process.
    pub bin: PathBuf,
    pub seed: u64,
    pub duration: Duration,
    pub clients: usize,
    /// How many of the clients write through a FUSE mount (the last ones).
    pub mounts: usize,
    /// Keep every run's directory under this one (failing runs are always kept).
    pub keep_dir: Option<PathBuf>,
    pub cluster: ClusterConfig,
    /// Loopback, or a namespace per process (partitions).
    pub net: NetMode,
    /// Arm crash points in the servers (the binary must be built with them).
    pub crash_points: bool,
    /// Administration under the faults ([`crate::admin_churn`]).
    pub admin: bool,
}

/// How a sequence of runs ended: the reports of the runs that finished, and what
/// stopped it early (an interruption, or a run the harness itself could not carry
/// out), if anything did.
#[derive(Debug)]
pub struct Many {
    pub report: Report,
    pub stopped: Option<Error>,
}

/// Runs `runs` runs with seeds `cfg.seed`, `cfg.seed + 1`, ...; `on_run` sees each
/// report as it is done. When `interrupt` completes (a signal), the run under way is
/// torn down (its processes killed, its namespaces and disks removed), its data dir is
/// kept, and no further run starts: [`Error::Interrupted`].
pub async fn run_many(
    cfg: &RunConfig,
    runs: u64,
    interrupt: impl std::future::Future<Output = ()>,
    mut on_run: impl FnMut(&RunReport),
) -> Many {
    let mut report = Report::default();
    let mut interrupt = std::pin::pin!(interrupt);
    for i in 0..runs {
        let mut c = cfg.clone();
        c.seed = cfg.seed.wrapping_add(i);
        match run_once(&c, interrupt.as_mut()).await {
            Ok(r) => {
                on_run(&r);
                report.push(r);
            }
            Err(e) => {
                return Many {
                    report,
                    stopped: Some(e),
                }
            }
        }
    }
    Many {
        report,
        stopped: None,
    }
}

/// One run; see the module docs. `interrupt` ends it early (see [`run_many`]).
pub async fn run_once(
    cfg: &RunConfig,
    interrupt: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<RunReport> {
    let prefix = format!("stampfs-nemesis-seed-{}-", cfg.seed);
    let base = cfg.keep_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).map_err(Error::io(&base))?;
    let tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .tempdir_in(&base)
        .map_err(Error::io(&base))?;
    let dir = tmp.path().to_path_buf();
    // On an interruption the run's future is dropped here, and with it the cluster,
    // the clients, the network and the disks (each tears itself down on drop) before
    // the directory is kept.
    let outcome = tokio::select! {
        r = run_in(cfg, &dir) => Some(r),
        () = interrupt => None,
    };
    match outcome {
        Some(Ok(mut report)) => {
            if cfg.keep_dir.is_some() || !report.passed() {
                let _ = tmp.keep();
                report.dir = Some(dir);
            }
            Ok(report)
        }
        Some(Err(e)) => {
            let _ = tmp.keep();
            Err(Error::RunFailed {
                seed: cfg.seed,
                dir,
                source: Box::new(e),
            })
        }
        None => {
            let _ = tmp.keep();
            Err(Error::Interrupted {
                seed: cfg.seed,
                dir,
            })
        }
    }
}

async fn apply(
    step: &schedule::Step,
    cluster: &mut Cluster,
    clients: &mut Clients,
    net: &Net,
) -> Result<()> {
    tracing::info!(
        target_proc = %step.target,
        action = ?step.action,
        kind = step.kind.name(),
        cut = %step.cut.map(|c| c.to_string()).unwrap_or_default(),
        "nemesis step"
    );
    match (step.target, step.action) {
        (_, Action::Partition) => {
            if let Some(cut) = &step.cut {
                net.partition(cut)?;
            }
        }
        (_, Action::HealNetwork) => net.heal()?,
        (Target::Chunkserver(i), Action::FillDisk) => {
            if let Some(d) = cluster.disks.get(i) {
                let took = d.fill()?;
                tracing::info!(chunkserver = i, bytes = took, "disk filled");
            }
        }
        (Target::Chunkserver(i), Action::FreeDisk) => {
            if let Some(d) = cluster.disks.get(i) {
                d.free()?;
            }
        }
        (Target::Client(i), Action::Kill) => clients.kill(i),
        (Target::Client(i), Action::Restart) => clients.restart(i).await?,
        (Target::Client(i), Action::Stop) => clients.stop(i)?,
        (Target::Client(i), Action::Cont) => clients.cont(i)?,
        (server, action) => {
            let cluster_crash_seed = cluster.crash_seed;
            let p = match server {
                Target::Master(i) => &mut cluster.masters[i],
                Target::Chunkserver(i) => &mut cluster.chunkservers[i],
                Target::Client(_) | Target::Network => return Ok(()),
            };
            match action {
                Action::Kill => p.kill(),
                Action::Restart => {
                    if p.state() == ProcState::Dead {
                        arm(p, cluster_crash_seed, server);
                        p.start().await?;
                    }
                }
                Action::Stop => p.stop()?,
                Action::Cont => p.cont()?,
                Action::Partition | Action::HealNetwork | Action::FillDisk | Action::FreeDisk => {}
            }
        }
    }
    Ok(())
}

/// The master's address and the superuser's credentials file: what the run's own
/// client needs.
#[derive(Clone, Debug)]
pub(crate) struct MasterAccess {
    pub(crate) addr: String,
    pub(crate) creds: PathBuf,
}

/// How long one administrative action under the faults may hold the schedule up (a
/// master that is down or cut off: the action is dropped).
const CHURN_TIMEOUT: Duration = Duration::from_secs(3);

/// Carries out the administration's next action if one is due, noting it in the
/// steps log; a failed or timed-out one is noted and dropped.
async fn churn_step(
    churn: &mut Churn,
    t0: Instant,
    access: &MasterAccess,
    net: &Net,
    steps_out: &mut std::fs::File,
    injected: &mut BTreeMap<String, u64>,
) {
    use std::io::Write;
    let Some(act) = churn.next(t0.elapsed()) else {
        return;
    };
    let (m, a) = (access.clone(), act.clone());
    let done = tokio::time::timeout(
        CHURN_TIMEOUT,
        net.admin(move || async move {
            let admin = tokio::time::timeout(
                CHURN_TIMEOUT,
                Client::connect_with(&m.addr, superuser_config(&m)?),
            )
            .await
            .map_err(|_| Error::Timeout {
                what: "a connection to the master".into(),
                secs: CHURN_TIMEOUT.as_secs(),
            })??;
            Ok(admin_churn::perform(&admin, &a).await?)
        }),
    )
    .await;
    let said = match done {
        Ok(Ok(said)) => {
            *injected.entry(act.name().to_string()).or_default() += 1;
            said
        }
        Ok(Err(e)) => format!("failed: {e}"),
        Err(_) => "timed out".into(),
    };
    let _ = writeln!(
        steps_out,
        "{:>8.3}s {} {act:?}: {said}",
        t0.elapsed().as_secs_f64(),
        act.name()
    );
}

/// The client configuration of the superuser.
fn superuser_config(m: &MasterAccess) -> Result<stampfs_client::ClientConfig> {
    let creds = stampfs_proto::Credentials::load(&m.creds)?;
    Ok(stampfs_client::ClientConfig {
        credentials: Some(creds),
        ..workload::client_config()
    })
}

/// Connects to the master as the superuser, retrying while it starts.
async fn connect(m: &MasterAccess) -> Result<Client> {
    let config = superuser_config(m)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect_with(&m.addr, config.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn run_in(cfg: &RunConfig, root: &Path) -> Result<RunReport> {
    let started = Instant::now();
    let net = match cfg.net {
        NetMode::Loopback => Net::loopback(),
        NetMode::Namespaces => {
            let mut hosts: Vec<Target> = (0..cfg.cluster.masters.max(1))
                .map(Target::Master)
                .collect();
            hosts.extend((0..cfg.cluster.chunkservers).map(Target::Chunkserver));
            hosts.extend((0..cfg.clients).map(Target::Client));
            Net::namespaces(&hosts)?
        }
    };
    let cluster_cfg = ClusterConfig {
        crash_seed: cfg.crash_points.then_some(cfg.seed),
        ..cfg.cluster.clone()
    };
    let mut cluster = Cluster::start(&cfg.bin, root, &cluster_cfg, &net).await?;
    let master = cluster.master_addr();
    let access = MasterAccess {
        addr: master.clone(),
        creds: crate::cluster::credentials_file(root),
    };
    tracing::info!(seed = cfg.seed, %master, dir = %root.display(), net = ?net.mode(), "nemesis run starting");

    // 1. The shared files, created empty and closed; with `--admin`, under a quota
    // set first, whose use the master keeps through everything that follows.
    let (m, replication, quota) = (access.clone(), cfg.cluster.replication, cfg.admin);
    net.admin(move || async move {
        let admin = connect(&m).await?;
        admin.mkdir(DIR, true).await?;
        if quota {
            let act = admin_churn::Act::Quota {
                path: DIR.to_string(),
                on: true,
            };
            admin_churn::perform(&admin, &act).await?;
        }
        for f in 0..FILES {
            let mut w = admin
                .create(
                    &file_path(DIR, f),
                    CreateOptions {
                        replication: Some(replication),
                        ..CreateOptions::default()
                    },
                )
                .await?;
            w.close().await?;
        }
        // The slot file (overwrites), in small chunks.
        let mut w = admin
            .create(
                &crate::slots::path(DIR),
                CreateOptions {
                    replication: Some(replication),
                    chunk_size: Some(crate::slots::SLOT_CHUNK),
                    ..CreateOptions::default()
                },
            )
            .await?;
        w.close().await?;
        Ok(())
    })
    .await?;

    // 2. Clients.
    let logs = cluster.logs.clone();
    let spec = ClientSpec {
        bin: &cfg.bin,
        root,
        logs: &logs,
        master: &master,
        seed: cfg.seed,
        clients: cfg.clients,
        mounts: cfg.mounts,
        files: FILES,
        dir: DIR,
        crash_seed: cfg.crash_points.then_some(cfg.seed),
    };
    let mut clients = Clients::new(&spec, &net);
    let mut injected: BTreeMap<String, u64> = BTreeMap::new();
    // Servers that exited by themselves, not at a crash point.
    let mut exits: Vec<Violation> = Vec::new();
    // A server may die at a crash point while the clients start (the first writes
    // come at once): it is started again meanwhile, or a mount waiting for the
    // master would never come up.
    clients.request_all();
    loop {
        clients.progress().await?;
        if clients.all_started() {
            break;
        }
        restart_crashed(&mut cluster, &mut injected, &mut exits).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 3. Faults.
    let faults = schedule::plan(
        cfg.seed,
        ScheduleConfig {
            duration: cfg.duration,
            masters: cfg.cluster.masters.max(1),
            chunkservers: cluster.chunkservers.len(),
            clients: cfg.clients,
            lease_hard: cfg.cluster.lease_hard,
            partitions: net.mode() == NetMode::Namespaces,
            disk_faults: !cluster.disks.is_empty(),
        },
    );
    let steps_log = logs.join("nemesis-steps.log");
    let mut steps_out = std::fs::File::create(&steps_log).map_err(Error::io(&steps_log))?;
    let mut churn = cfg.admin.then(|| {
        let mut files: Vec<String> = (0..FILES).map(|f| file_path(DIR, f)).collect();
        files.push(crate::slots::path(DIR));
        Churn::new(
            cfg.seed,
            files,
            cfg.cluster.replication,
            cluster.chunkservers.len(),
        )
    });
    let t0 = Instant::now();
    // How late the latest step ran (a step waits for the one before it).
    let mut max_lag = Duration::ZERO;
    for step in schedule::steps(&faults) {
        while t0.elapsed() < step.at {
            if let Some(c) = churn.as_mut() {
                churn_step(c, t0, &access, &net, &mut steps_out, &mut injected).await;
            }
            clients.restart_exited().await?;
            restart_crashed(&mut cluster, &mut injected, &mut exits).await?;
            let left = step.at.saturating_sub(t0.elapsed());
            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
        }
        max_lag = max_lag.max(t0.elapsed().saturating_sub(step.at));
        {
            use std::io::Write;
            let cut = step.cut.map(|c| format!(" {c}")).unwrap_or_default();
            writeln!(
                steps_out,
                "{:>8.3}s {:?} {}{cut} ({})",
                t0.elapsed().as_secs_f64(),
                step.action,
                step.target,
                step.kind.name()
            )
            .map_err(Error::io(&steps_log))?;
        }
        apply(&step, &mut cluster, &mut clients, &net).await?;
        if step.action.starts_fault() {
            *injected.entry(step.kind.name().to_string()).or_default() += 1;
        }
    }
    while t0.elapsed() < cfg.duration {
        if let Some(c) = churn.as_mut() {
            churn_step(c, t0, &access, &net, &mut steps_out, &mut injected).await;
        }
        clients.restart_exited().await?;
        restart_crashed(&mut cluster, &mut injected, &mut exits).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 4. Heal (the schedule healed every fault already; this is the safety net).
    if net.mode() == NetMode::Namespaces {
        net.heal()?;
    }
    for d in &cluster.disks {
        d.free()?;
    }
    restart_crashed(&mut cluster, &mut injected, &mut exits).await?;
    for (_, p) in cluster.servers() {
        p.cont()?;
        // Crash points end with the faults: a server still armed starts again without.
        if p.has_env() && p.state() != ProcState::Dead {
            p.kill();
        }
        p.set_env(Vec::new());
        if p.state() == ProcState::Dead {
            p.start().await?;
        }
    }
    clients.heal().await?;

    // Every chunkserver registered with the (perhaps just restarted) master: until
    // then the only replica of a chunk may be unknown to it.
    let (m, n) = (access.clone(), cluster.chunkservers.len());
    net.admin(move || async move { wait_all_live(&connect(&m).await?, n).await })
        .await?;
    // What the administration changed is undone (the files' factor back, nobody
    // drained, no balancer, no safe mode) before the final checks.
    if let Some(c) = &churn {
        let (m, acts) = (access.clone(), c.undo());
        net.admin(move || async move {
            let admin = connect(&m).await?;
            for act in &acts {
                admin_churn::perform(&admin, act).await?;
            }
            Ok(())
        })
        .await?;
    }

    // 5. Drain.
    let stop = clients.stop_file();
    std::fs::write(&stop, b"stop\n").map_err(Error::io(&stop))?;
    clients.drain(DRAIN_TIMEOUT).await;

    // 6. Recover what is still open, read the final files. A file that cannot be
    // closed or read is a violation of its own; its records are not checked.
    let m = access.clone();
    let outcomes = net
        .admin(move || async move {
            let admin = connect(&m).await?;
            let mut out = BTreeMap::new();
            for f in 0..FILES {
                let path = file_path(DIR, f);
                let got = match recover(&admin, &path).await {
                    Ok(()) => read_final(&admin, &path).await,
                    Err(e) => Err(e),
                };
                out.insert(f, got.map_err(|e| e.to_string()));
            }
            let path = crate::slots::path(DIR);
            let slots = match recover(&admin, &path).await {
                Ok(()) => read_final(&admin, &path).await,
                Err(e) => Err(e),
            };
            Ok((out, slots.map_err(|e| e.to_string())))
        })
        .await?;
    let (outcomes, slot_bytes) = outcomes;
    let mut files = BTreeMap::new();
    let mut violations = std::mem::take(&mut exits);
    for (f, got) in outcomes {
        match got {
            Ok(bytes) => {
                files.insert(f, bytes);
            }
            Err(e) => violations.push(Violation {
                kind: ViolationKind::Unavailable,
                file: Some(f),
                offset: None,
                session: None,
                seq: None,
                message: format!("{} after the heal: {e}", file_path(DIR, f)),
            }),
        }
    }
    // Kept for the evidence of a failing run.
    let final_dir = root.join("final");
    std::fs::create_dir_all(&final_dir).map_err(Error::io(&final_dir))?;
    for (f, bytes) in &files {
        let p = final_dir.join(format!("f{f}"));
        std::fs::write(&p, bytes).map_err(Error::io(&p))?;
    }
    let slot_bytes = match slot_bytes {
        Ok(bytes) => {
            let p = final_dir.join("s0");
            std::fs::write(&p, &bytes).map_err(Error::io(&p))?;
            Some(bytes)
        }
        Err(e) => {
            violations.push(Violation {
                kind: ViolationKind::Unavailable,
                file: Some(crate::slots::SLOT_FILE),
                offset: None,
                session: None,
                seq: None,
                message: format!("{} after the heal: {e}", crate::slots::path(DIR)),
            });
            None
        }
    };

    // 6b. The quota the administration left on the run's directory: the use the
    // master kept through the faults (replayed by restarted masters, carried across
    // failovers) equals what a walk of the directory counts.
    let mut quota_check = None;
    if cfg.admin {
        let m = access.clone();
        let (said, found) = net
            .admin(
                move || async move { admin_churn::quota_use_check(&connect(&m).await?, DIR).await },
            )
            .await?;
        quota_check = Some(said);
        violations.extend(found);
    }

    // 7. Check.
    let history = History::load_dir(&clients.history_dir())?;
    let acks: Vec<_> = history
        .acks
        .iter()
        .filter(|a| files.contains_key(&a.file))
        .copied()
        .collect();
    let reads: Vec<_> = history
        .reads
        .iter()
        .filter(|r| files.contains_key(&r.file))
        .copied()
        .collect();
    violations.extend(checker::check(&files, &acks, &reads));
    if let Some(bytes) = &slot_bytes {
        violations.extend(crate::slots::check(
            bytes,
            &history.slot_writes,
            &history.session_starts,
        ));
    }

    // 8. fsck.
    let fsck_healthy = match wait_fsck_healthy(&cfg.bin, &access, &net).await {
        Ok(()) => true,
        Err(last) => {
            violations.push(Violation {
                kind: ViolationKind::FsckUnhealthy,
                file: None,
                offset: None,
                session: None,
                seq: None,
                message: format!(
                    "fsck not healthy {} s after the heal: {last}",
                    FSCK_TIMEOUT.as_secs()
                ),
            });
            false
        }
    };

    // 8b. Every replica the master hands out is byte-identical at its version (once
    // re-replication is done: fsck healthy).
    if fsck_healthy {
        let m = access.clone();
        let names: Vec<u32> = files.keys().copied().collect();
        let slots_read = slot_bytes.is_some();
        let found = net
            .admin(move || async move {
                let admin = connect(&m).await?;
                let mut out = Vec::new();
                for f in names {
                    out.extend(check_replicas(&admin, &file_path(DIR, f), Some(f)).await?);
                }
                if slots_read {
                    let (path, id) = (crate::slots::path(DIR), crate::slots::SLOT_FILE);
                    out.extend(check_replicas(&admin, &path, Some(id)).await?);
                }
                Ok(out)
            })
            .await?;
        violations.extend(found);
    }

    // 9. Panics.
    violations.extend(scan_logs(&logs)?);
    // No server may have died after the heal (no crash point was armed any more).
    restart_crashed(&mut cluster, &mut injected, &mut violations).await?;

    let unexpected_exits = std::mem::take(&mut clients.unexpected_exits);
    for point in clients.crash_hits.drain(..) {
        *injected.entry(format!("crash:{point}")).or_default() += 1;
    }
    // How often the lead moved: every member logs each time it takes it.
    let leaderships = if cluster.masters.len() > 1 {
        cluster
            .masters
            .iter()
            .map(|m| {
                std::fs::read_to_string(m.log_path())
                    .map(|t| t.matches("this master leads the group").count() as u64)
                    .unwrap_or(0)
            })
            .sum()
    } else {
        0
    };
    drop(clients);
    if violations.is_empty() && cfg.keep_dir.is_none() {
        // Otherwise the replicas on small disks are copied out before the unmount.
        for d in &cluster.disks {
            d.discard();
        }
    }
    drop(cluster);
    drop(net);
    tracing::info!(
        seed = cfg.seed,
        secs = started.elapsed().as_secs(),
        "nemesis run done"
    );
    Ok(RunReport {
        seed: cfg.seed,
        duration_ms: cfg.duration.as_millis() as u64,
        clients: cfg.clients,
        mount_clients: cfg.mounts.min(cfg.clients),
        chunkservers: cfg.cluster.chunkservers,
        masters: cfg.cluster.masters.max(1),
        leaderships,
        net: cfg.net,
        small_disks: cfg.cluster.small_disk_mib.is_some(),
        crash_points: cfg.crash_points,
        max_step_lag_ms: max_lag.as_millis() as u64,
        faults: injected,
        schedule: faults,
        sessions: history.sessions,
        fenced_sessions: history.fenced_sessions,
        acknowledged_records: history.acks.len() as u64,
        acknowledged_overwrites: history.slot_writes.iter().filter(|w| w.acked).count() as u64,
        slot_writes: history.slot_writes.len() as u64,
        reads_checked: history.reads.len() as u64,
        file_lengths: files.iter().map(|(&k, v)| (k, v.len() as u64)).collect(),
        fsck_healthy,
        unexpected_exits,
        quota_check,
        violations,
        dir: None,
    })
}

/// Starts again every server that died by itself: at a crash point (counted as a
/// fault, `crash:NAME`, and started with a fresh arming) or not (a
/// [`ViolationKind::ServerExited`] in `exits`, and started again).
async fn restart_crashed(
    cluster: &mut Cluster,
    injected: &mut BTreeMap<String, u64>,
    exits: &mut Vec<Violation>,
) -> Result<()> {
    let seed = cluster.crash_seed;
    for (t, p) in cluster.servers() {
        let Some(status) = p.exited() else {
            continue;
        };
        match crate::crash::crash_point_hit(&p.log_since_start()) {
            Some(point) => {
                tracing::info!(server = %t, %point, "server died at a crash point; restarting it");
                *injected.entry(format!("crash:{point}")).or_default() += 1;
            }
            None => {
                tracing::warn!(server = %t, %status, "server exited by itself");
                exits.push(Violation {
                    kind: ViolationKind::ServerExited,
                    file: None,
                    offset: None,
                    session: None,
                    seq: None,
                    message: format!(
                        "{t} (start {}) exited by itself: {status}; see {}",
                        p.incarnation,
                        p.log_path().display()
                    ),
                });
            }
        }
        if p.has_env() {
            arm(p, seed, t);
        }
        p.start().await?;
    }
    Ok(())
}
