//! `stampfs bench master`: the master's throughput, latency and memory, measured the
//! way HDFS's NNThroughputBenchmark measures the NameNode.
//!
//! An in-process master (the real `stampfs-master`: its operation log and checkpoints
//! on the real disk, in a temp dir under `--dir`, with every record durable before its
//! reply) is driven by `--threads` client tasks and `--chunkservers` simulated
//! chunkservers ([`sim`]: each registers, heartbeats every second, answers the
//! master's signed commands over loopback with the real protocol, and sends full chunk
//! reports, without storing data). Client tasks call the master's request layer
//! directly by default ([`driver`] says why), or speak the wire protocol (`--via rpc`).
//!
//! Phases, in order (each operation measured on its own; a latency is one call, or
//! for create+close the two calls):
//!
//! 1. **register** every simulated chunkserver; a warm-up of untimed chunks opens the
//!    master's command connections to them;
//! 2. **mkdirs**: `--ops` directories;
//! 3. memory baseline; **create+close**: `--files` empty files, `--files-per-dir` per
//!    directory; memory again: the difference per file;
//! 4. **append** (reopen) each file, **add chunk** `--chunks-per-file` times (new
//!    handle and version logged, placed, `BumpVersion` pushed to the replicas and
//!    awaited, the previous chunk finalized), **close**; memory again: the difference
//!    per chunk. Memory is read after a checkpoint (so no checkpoint is in flight),
//!    as the allocator's bytes in use and as RSS;
//! 5. a **checkpoint** and a **health pass** over everything built, each with
//!    requests timed meanwhile (how long they stall the master);
//! 6. **stat**, **open** (locations with read tokens), **list** of random built
//!    files and directories; **rename** and **delete** of `--ops` files made for it;
//!    **heartbeat** of random chunkservers;
//! 7. **report**: every chunkserver's full chunk report, then the dense chunkserver's
//!    (`--report-replicas` replicas) three times, with stats timed meanwhile.
//!
//! Trash is off (`--trash-for 0`): a delete is a delete. Everything else is the
//! master's default configuration (health pass every 2 s, checkpoint every 64 MiB of
//! log, 64 MiB chunks).

mod driver;
mod measure;
mod report;
mod sim;
mod stats;
mod workload;

use crate::cli::{BenchMasterArgs, BenchVia};
use anyhow::{bail, Context, Result};
use driver::Driver;
use measure::{measure, probed, run_ops, timed, OpStats, Progress};
use report::*;
use sim::Sims;
use stampfs_master::{MasterConfig, MasterHandle};
use stampfs_proto::{Delete, GetLocations, List, Mkdir, Rename, Stat};
use stats::{CpuSplit, Memory};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::*;

/// Chunks of the untimed warm-up, at least (and two per chunkserver).
const WARMUP_CHUNKS: u64 = 1000;
const WARMUP_CHUNKS_PER_FILE: u64 = 10;

/// Runs the master benchmark.
pub async fn run(args: BenchMasterArgs) -> u8 {
    match run_inner(args).await {
        Ok(report) if report.operations.iter().all(|o| o.errors == 0) => crate::EXIT_OK,
        Ok(_) => {
            eprintln!("stampfs bench master: some operations failed (see the errors column)");
            crate::EXIT_ERROR
        }
        Err(e) => {
            eprintln!("stampfs bench master: {e:#}");
            crate::EXIT_ERROR
        }
    }
}

// ---------------------------------------------------------------- the run

fn validate(args: &BenchMasterArgs) -> Result<()> {
    if !(1..=sim::MAX_REPLICATION as u8).contains(&args.replication) {
        bail!("--replication must be 1 to {}", sim::MAX_REPLICATION);
    }
    if args.chunkservers < usize::from(args.replication) {
        bail!("--chunkservers must be at least the replication factor");
    }
    if args.files == 0 || args.chunks_per_file == 0 || args.ops == 0 {
        bail!("--files, --chunks-per-file and --ops must be above zero");
    }
    if args.threads == 0 || args.files_per_dir == 0 {
        bail!("--threads and --files-per-dir must be above zero");
    }
    if ![1, 3, 5].contains(&args.masters) {
        bail!("--masters must be 1, 3 or 5");
    }
    Ok(())
}

/// Starts the master, or (`--masters` above 1) a group of masters on loopback in this
/// process, and returns the one that serves (the leader) and the others.
async fn start_masters(
    work: &std::path::Path,
    args: &BenchMasterArgs,
) -> Result<(MasterHandle, Vec<MasterHandle>)> {
    let config = |dir: std::path::PathBuf| {
        let mut c = MasterConfig::new(dir);
        c.trash_for = Duration::ZERO;
        c.replication = args.replication;
        c.health_interval = args.health_interval;
        c
    };
    if args.masters == 1 {
        let master = stampfs_master::start(config(work.join("master")))
            .await
            .context("starting the master")?;
        return Ok((master, Vec::new()));
    }
    let n = usize::from(args.masters);
    let addrs: Vec<String> = {
        let held = (0..n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()
            .context("finding free loopback ports for the masters")?;
        held.iter()
            .map(|l| l.local_addr().map(|a| a.to_string()))
            .collect::<std::io::Result<_>>()?
    };
    let key = work.join("cluster.key");
    stampfs_proto::ClusterKey::load_or_create(&key)?;
    let creds = stampfs_proto::Credentials::generate(stampfs_proto::credentials::ADMIN_USER)?;
    let mut members = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let dir = work.join(format!("master{}", i + 1));
        std::fs::create_dir_all(&dir)?;
        creds.write(
            &dir.join(stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE),
            true,
        )?;
        let mut c = config(dir);
        c.id = i as u64 + 1;
        c.listen = addr.clone();
        c.cluster_key_file = Some(key.clone());
        c.peers = addrs
            .iter()
            .enumerate()
            .map(|(j, a)| stampfs_master::config::PeerArg {
                id: j as u64 + 1,
                addr: a.clone(),
            })
            .collect();
        members.push(
            stampfs_master::start(c)
                .await
                .with_context(|| format!("starting master {}", i + 1))?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leads = members.iter().position(|m| {
            m.core().log.serving().is_ok() && !m.core().state().user_list().is_empty()
        });
        if let Some(i) = leads {
            let leader = members.remove(i);
            return Ok((leader, members));
        }
        if Instant::now() > deadline {
            bail!("the group of {n} masters elected no leader within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no checkpoint is in flight and writes one (so the next memory reading
/// holds no checkpoint buffer), returning how long it took.
async fn quiesce(master: &MasterHandle) -> Result<Duration> {
    let t = Instant::now();
    master.checkpoint().await.context("checkpoint")?;
    Ok(t.elapsed())
}

fn per(after: Option<u64>, before: Option<u64>, n: u64) -> Option<f64> {
    match (after, before) {
        (Some(a), Some(b)) if n > 0 => Some((a as f64 - b as f64) / n as f64),
        _ => None,
    }
}

async fn run_inner(args: BenchMasterArgs) -> Result<Report> {
    validate(&args)?;
    let base = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("finding the current directory")?,
    };
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".stampfs-bench-master-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a temporary directory in {}", base.display()))?;
    let progress = Progress::new();
    let mut ops: Vec<OpResult> = Vec::new();
    let mut stalls = Vec::new();

    // The master first: it raises the open-file limit the listeners need.
    let (master, _followers) = start_masters(work.path(), &args).await?;
    let sim_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("stampfs-sim")
        .enable_all()
        .build()
        .context("starting the simulated chunkservers' runtime")?;
    let built = args.files * args.chunks_per_file;
    let warmup = WARMUP_CHUNKS
        .max(2 * args.chunkservers as u64)
        .div_ceil(WARMUP_CHUNKS_PER_FILE);
    let arena = warmup * WARMUP_CHUNKS_PER_FILE + built + built / 100 + 1024;
    let sims = Sims::start(
        sim_rt.handle(),
        args.chunkservers,
        args.report_replicas > 0,
        usize::try_from(arena)?,
    )
    .await
    .context("starting the simulated chunkservers")?;
    let driver = match args.via {
        BenchVia::Service => Driver::Service(master.core().clone()),
        BenchVia::Rpc => {
            let path = master
                .core()
                .config
                .dir
                .join(stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE);
            let creds = stampfs_proto::Credentials::load(&path)?;
            Driver::rpc(
                master.addr().to_string(),
                master.core().key().clone(),
                creds,
            )
        }
    };
    let ctx = Arc::new(Ctx {
        driver: driver.clone(),
        sims: sims.clone(),
        threads: args.threads,
        files: args.files,
        files_per_dir: args.files_per_dir,
        chunks_per_file: args.chunks_per_file,
        replication: args.replication,
    });
    let log_before = master.log_stats();

    // 1. Registration, background heartbeats, warm-up.
    let n_sims = sims.servers.len();
    let c = ctx.clone();
    let mut r = measure(
        "register",
        args.threads,
        n_sims as u64,
        &progress,
        move |i| {
            let c = c.clone();
            async move { register(&c, i as usize).await }
        },
    )
    .await;
    r.note = Some("a new chunkserver with an empty report (its id logged)".into());
    ops.push(r);
    let stop = Arc::new(AtomicBool::new(false));
    spawn_heartbeats(driver.clone(), sims.clone(), stop.clone());
    let c = ctx.clone();
    let warm_stats = Arc::new(BuildStats::default());
    progress.phase("warm-up", warmup);
    let bar = progress.bar.clone();
    run_ops(args.threads, warmup, move |i| {
        let (c, s, bar) = (c.clone(), warm_stats.clone(), bar.clone());
        async move {
            let path = format!("/bench/warmup/w{}/f{i}", i / PHASE_DIR_ENTRIES);
            let client = client_of(u64::MAX / 2 - i);
            let r = async {
                c.driver
                    .call(Mkdir {
                        path: format!("/bench/warmup/w{}", i / PHASE_DIR_ENTRIES),
                        parents: true,
                        attr: None,
                        caller: None,
                    })
                    .await?;
                create_close(&c.driver, path.clone(), client, c.replication).await?;
                build_file(&c.driver, &s, path, client, WARMUP_CHUNKS_PER_FILE).await
            }
            .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, "warm-up failed");
            }
            bar.inc(1);
        }
    })
    .await;

    // 2. mkdirs.
    mkdir_groups(&ctx, "/bench/mkdirs", args.ops.div_ceil(PHASE_DIR_ENTRIES)).await?;
    let c = ctx.clone();
    let mut r = measure("mkdirs", args.threads, args.ops, &progress, move |i| {
        let c = c.clone();
        async move {
            c.driver
                .call(Mkdir {
                    path: format!("/bench/mkdirs/g{}/d{i}", i / PHASE_DIR_ENTRIES),
                    parents: false,
                    attr: None,
                    caller: None,
                })
                .await
        }
    })
    .await;
    r.note = Some("one new directory".into());
    ops.push(r);

    // 3. create+close, and the memory per file.
    let groups = args.files.div_ceil(args.files_per_dir);
    progress.phase("directories", groups);
    let c = ctx.clone();
    let bar = progress.bar.clone();
    run_ops(args.threads, groups, move |g| {
        let (c, bar) = (c.clone(), bar.clone());
        async move {
            if let Err(e) = c
                .driver
                .call(Mkdir {
                    path: file_dir(g),
                    parents: true,
                    attr: None,
                    caller: None,
                })
                .await
            {
                tracing::warn!(error = %e, "mkdir failed");
            }
            bar.inc(1);
        }
    })
    .await;
    quiesce(&master).await?;
    let chunks_at = |m: &MasterHandle| m.core().state().chunks.len() as u64;
    let baseline = Memory::now();
    let c = ctx.clone();
    let mut r = measure(
        "create+close",
        args.threads,
        args.files,
        &progress,
        move |i| {
            let c = c.clone();
            async move {
                create_close(
                    &c.driver,
                    file_path(i, c.files_per_dir),
                    client_of(i),
                    c.replication,
                )
                .await
            }
        },
    )
    .await;
    r.note = Some("create, then close, of an empty file: two durable records".into());
    r.target_ops_per_s = Some(TARGET_CREATE_OPS);
    r.met = Some(r.ops_per_s >= TARGET_CREATE_OPS);
    ops.push(r);
    quiesce(&master).await?;
    let after_files = Memory::now();
    let chunks_before = chunks_at(&master);

    // 4. The chunks, and the memory per chunk.
    let build = Arc::new(BuildStats::default());
    let c = ctx.clone();
    let b = build.clone();
    progress.phase("append+add chunk+close", args.files);
    let bar = progress.bar.clone();
    let cpu = CpuSplit::now();
    let took = run_ops(args.threads, args.files, move |i| {
        let (c, b, bar) = (c.clone(), b.clone(), bar.clone());
        async move {
            let _ = build_file(
                &c.driver,
                &b,
                file_path(i, c.files_per_dir),
                client_of(i),
                c.chunks_per_file,
            )
            .await;
            bar.inc(1);
        }
    })
    .await;
    let cpu = CpuSplit::now().since(&cpu);
    let secs = took.as_secs_f64();
    let mut r = build.add_chunk.result("add chunk", secs, cpu);
    r.note = Some(format!(
        "handle and version logged, {} replicas placed and bumped over loopback, previous chunk finalized, grant logged; ops/s over the whole build (appends and closes included)",
        args.replication
    ));
    ops.push(r);
    let mut r = build.append.result("append", secs, cpu);
    r.note = Some("reopen of a closed empty file (no bump); during the build".into());
    ops.push(r);
    let mut r = build.close.result("close (chunks)", secs, cpu);
    r.note = Some("last chunk committed, file closed, replicas finalized; during the build".into());
    ops.push(r);
    let (_, s) = probed("checkpoint", &ctx, quiesce(&master)).await?;
    stalls.push(s);
    let after_chunks = Memory::now();
    let chunks = chunks_at(&master) - chunks_before;
    let replicas_per_chunk = {
        let st = master.core().state();
        let total: usize = st.chunks.iter().map(|(_, c)| c.replicas.len()).sum();
        total as f64 / st.chunks.len().max(1) as f64
    };
    let heap_per_file = per(after_files.heap, baseline.heap, args.files);
    let heap_per_chunk = per(after_chunks.heap, after_files.heap, chunks);
    let rss_per_file = per(after_files.rss, baseline.rss, args.files);
    let rss_per_chunk = per(after_chunks.rss, after_files.rss, chunks);
    let memory = MemoryReport {
        method: "differences of the allocator's bytes in use (glibc mallinfo2: arena bytes in use plus mmapped blocks, allocation headers included) and of RSS (after malloc_trim), each read after a checkpoint; per file over the create+close phase (closed, empty files), per chunk over the chunk build (every chunk with its replicas, its chunkservers' reverse index and its file's handle list); the simulated chunkservers' arena is allocated and written before the baseline".into(),
        files: args.files,
        chunks,
        replicas_per_chunk,
        baseline,
        after_files,
        after_chunks,
        heap_per_file,
        rss_per_file,
        heap_per_chunk,
        rss_per_chunk,
        target_per_file: TARGET_BYTES_PER_FILE,
        target_per_chunk: TARGET_BYTES_PER_CHUNK,
        met_per_file: heap_per_file
            .or(rss_per_file)
            .map(|b| b <= TARGET_BYTES_PER_FILE),
        met_per_chunk: heap_per_chunk
            .or(rss_per_chunk)
            .map(|b| b <= TARGET_BYTES_PER_CHUNK),
    };

    // 5. A health pass over everything: what the replica-health worker does every
    // `--health-interval` (it starts `--dead-after` after the master, which a short
    // run may not reach), in its slices.
    let core = master.core().clone();
    let (_, s) = probed("health pass", &ctx, async {
        let p = core.run_health_pass().await;
        tracing::info!(
            chunks = p.chunks,
            steps = p.steps,
            longest_step_us = p.longest_step.as_micros() as u64,
            took_ms = p.took.as_millis() as u64,
            "health pass"
        );
        if p.actions > 0 {
            tracing::warn!(actions = p.actions, "the health pass found work");
        }
        Ok(())
    })
    .await?;
    stalls.push(s);

    // 6. Reads, rename, delete, heartbeat.
    let c = ctx.clone();
    let mut r = measure("stat", args.threads, args.ops, &progress, move |i| {
        let c = c.clone();
        async move {
            let path = file_path(spread(i, c.files), c.files_per_dir);
            c.driver.call(Stat { path, caller: None }).await
        }
    })
    .await;
    r.target_ops_per_s = Some(TARGET_READ_OPS);
    r.met = Some(r.ops_per_s >= TARGET_READ_OPS);
    ops.push(r);
    let c = ctx.clone();
    let mut r = measure("open", args.threads, args.ops, &progress, move |i| {
        let c = c.clone();
        async move {
            let path = file_path(spread(i, c.files), c.files_per_dir);
            let loc = c
                .driver
                .call(GetLocations {
                    path,
                    client: client_of(i),
                    access: false,
                    caller: None,
                })
                .await?;
            if loc.chunks.len() as u64 != c.chunks_per_file {
                bail!(
                    "{} chunks located, {} built",
                    loc.chunks.len(),
                    c.chunks_per_file
                );
            }
            Ok(())
        }
    })
    .await;
    r.note = Some(format!(
        "locations of a file of {} chunks, a read token signed per chunk",
        args.chunks_per_file
    ));
    r.target_ops_per_s = Some(TARGET_READ_OPS);
    r.met = Some(r.ops_per_s >= TARGET_READ_OPS);
    ops.push(r);
    let c = ctx.clone();
    let mut r = measure("list", args.threads, args.ops, &progress, move |i| {
        let c = c.clone();
        async move {
            let g = spread(i, c.files.div_ceil(c.files_per_dir));
            c.driver
                .call(List {
                    path: file_dir(g),
                    caller: None,
                })
                .await
        }
    })
    .await;
    r.note = Some(format!(
        "a directory of {} files",
        args.files_per_dir.min(args.files)
    ));
    ops.push(r);

    mkdir_groups(&ctx, "/bench/rename", args.ops.div_ceil(PHASE_DIR_ENTRIES)).await?;
    progress.phase("rename: files", args.ops);
    let c = ctx.clone();
    let bar = progress.bar.clone();
    run_ops(args.threads, args.ops, move |i| {
        let (c, bar) = (c.clone(), bar.clone());
        async move {
            let path = format!("/bench/rename/g{}/f{i}", i / PHASE_DIR_ENTRIES);
            if let Err(e) = create_close(&c.driver, path, client_of(i), c.replication).await {
                tracing::warn!(error = %e, "create for rename failed");
            }
            bar.inc(1);
        }
    })
    .await;
    let c = ctx.clone();
    let mut r = measure("rename", args.threads, args.ops, &progress, move |i| {
        let c = c.clone();
        async move {
            let g = i / PHASE_DIR_ENTRIES;
            c.driver
                .call(Rename {
                    src: format!("/bench/rename/g{g}/f{i}"),
                    dst: format!("/bench/rename/g{g}/r{i}"),
                    caller: None,
                    replace: false,
                })
                .await
        }
    })
    .await;
    r.note = Some("an empty file, within its directory".into());
    ops.push(r);
    let c = ctx.clone();
    let mut r = measure("delete", args.threads, args.ops, &progress, move |i| {
        let c = c.clone();
        async move {
            c.driver
                .call(Delete {
                    path: format!("/bench/rename/g{}/r{i}", i / PHASE_DIR_ENTRIES),
                    recursive: false,
                    caller: None,
                })
                .await
        }
    })
    .await;
    r.note = Some("an empty file (no trash)".into());
    ops.push(r);
    let c = ctx.clone();
    let mut r = measure("heartbeat", args.threads, args.ops, &progress, move |i| {
        let c = c.clone();
        async move { heartbeat(&c.driver, &c.sims, spread(i, n_sims as u64) as usize).await }
    })
    .await;
    r.note = Some("of a random chunkserver (commands in the reply carried out)".into());
    ops.push(r);

    // 7. Full chunk reports.
    progress.phase("building reports", 0);
    sims.adopt(args.report_replicas);
    let reports = Arc::new(sims.full_reports());
    let normal: Vec<usize> = (0..args.chunkservers).collect();
    let held: u64 = normal.iter().map(|&i| reports[i].len() as u64).sum();
    let c = ctx.clone();
    let rep = reports.clone();
    let mut r = measure(
        "report",
        args.threads,
        normal.len() as u64,
        &progress,
        move |i| {
            let (c, rep) = (c.clone(), rep.clone());
            async move { send_report(&c, i as usize, rep[i as usize].clone()).await }
        },
    )
    .await;
    r.note = Some(format!(
        "one chunkserver's full report of {} replicas on average (nothing changed since the bumps)",
        held / normal.len().max(1) as u64
    ));
    ops.push(r);
    let big_report = match sims.dense {
        None => None,
        Some(d) => {
            let replicas = reports[d].len() as u64;
            let mut big = BigReport {
                replicas,
                new_ms: 0.0,
                known_ms: 0.0,
                new_stall_ms: 0.0,
                known_stall_ms: 0.0,
                target_ms: TARGET_REPORT_MS,
                stall_target_ms: TARGET_STALL_MS,
                met: false,
                stall_met: false,
            };
            for (name, calls) in [("report (dense, new)", 1), ("report (dense, known)", 2)] {
                let stats = OpStats::default();
                let cpu = CpuSplit::now();
                let (_, s) = probed(&format!("{name}: {replicas} replicas"), &ctx, async {
                    for _ in 0..calls {
                        timed(&stats, send_report(&ctx, d, reports[d].clone())).await?;
                    }
                    Ok(())
                })
                .await?;
                let mut r = stats.result(name, s.seconds, CpuSplit::now().since(&cpu));
                r.note = Some(if calls == 1 {
                    format!("the dense chunkserver's full report of {replicas} replicas the master did not know on it (as after a restart or re-replication)")
                } else {
                    format!("the same report again, {calls} times: every replica known (a periodic report)")
                });
                if calls == 1 {
                    big.new_ms = r.max_us / 1000.0;
                    big.new_stall_ms = s.max_us / 1000.0;
                } else {
                    big.known_ms = r.max_us / 1000.0;
                    big.known_stall_ms = s.max_us / 1000.0;
                }
                ops.push(r);
                stalls.push(s);
            }
            big.met = big.new_ms.max(big.known_ms) < TARGET_REPORT_MS;
            big.stall_met = big.new_stall_ms.max(big.known_stall_ms) <= TARGET_STALL_MS;
            Some(big)
        }
    };
    stop.store(true, Ordering::Relaxed);
    progress.bar.finish_and_clear();

    let log = master.log_stats();
    let counters = &sims.counters;
    let sim = SimCounters {
        bumps: counters.bumps.load(Ordering::Relaxed),
        finalizes: counters.finalizes.load(Ordering::Relaxed),
        truncates: counters.truncates.load(Ordering::Relaxed),
        deletes: counters.deletes.load(Ordering::Relaxed),
        other: counters.other.load(Ordering::Relaxed),
        arena_growths: counters.arena_growths.load(Ordering::Relaxed),
    };
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        via: args.via,
        via_why: match args.via {
            BenchVia::Service => WHY_SERVICE,
            BenchVia::Rpc => WHY_RPC,
        }
        .to_string(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        files: args.files,
        chunks_per_file: args.chunks_per_file,
        chunkservers: args.chunkservers,
        threads: args.threads,
        ops: args.ops,
        replication: args.replication,
        files_per_dir: args.files_per_dir,
        masters: args.masters,
        log: match &master.core().log {
            stampfs_master::journal::Journal::Oplog(_) => "oplog".into(),
            stampfs_master::journal::Journal::Group(_) => "group".into(),
        },
        health_interval_s: args.health_interval.as_secs_f64(),
        dir: base.display().to_string(),
        operations: ops,
        memory,
        stalls,
        big_report,
        log_fsyncs: log.fsyncs - log_before.fsyncs,
        log_records: log.records - log_before.records,
        sim,
    };
    print!("{}", render_text(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    master.shutdown().await.context("stopping the master")?;
    sim_rt.shutdown_background();
    work.close().context("removing the benchmark directory")?;
    Ok(report)
}
