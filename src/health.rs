//! `stampfs fsck` and `stampfs admin report`: replica health as the master sees it,
//! as aligned text for a person or JSON (`--json`) for scripts.
//!
//! `fsck` exits 0 only when every chunk under the path is healthy: enough live
//! replicas at the master's version and nothing pending (no stale, corrupt or
//! above-version replica). Open files are listed but are not a failure.

use crate::cli::{FsckArgs, MasterAddr};
use crate::{EXIT_ERROR, EXIT_OK};
use stampfs_proto::units::format_size;
use stampfs_proto::{
    ChunkserverState, ClusterReport, ClusterReportRequest, DecommissionState, FileState, Fsck,
    FsckReport, HealthCounts,
};

/// Writes `text` to stdout; a reader that went away (`| head`) is not an error, and
/// nothing here panics on a failed write.
fn show(text: &str) {
    use std::io::Write as _;
    if let Err(e) = std::io::stdout().write_all(text.as_bytes()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("stampfs: error: writing the output: {e}");
        }
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> bool {
    match serde_json::to_string_pretty(v) {
        Ok(s) => {
            show(&format!("{s}\n"));
            true
        }
        Err(e) => {
            eprintln!("stampfs: error: cannot encode JSON: {e}");
            false
        }
    }
}

fn state_word(s: FileState) -> &'static str {
    match s {
        FileState::Open => "open",
        FileState::Closed => "closed",
        FileState::Recovering => "recovering",
    }
}

/// `stampfs fsck [PATH] [--json]`.
pub async fn fsck(args: FsckArgs) -> u8 {
    let report = match crate::users::ask(&args.master, Fsck { path: args.path }).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stampfs: error: fsck: {e:#}");
            return EXIT_ERROR;
        }
    };
    if args.json {
        if !print_json(&report) {
            return EXIT_ERROR;
        }
    } else {
        show(&fsck_text(&report));
    }
    if report.healthy {
        EXIT_OK
    } else {
        EXIT_ERROR
    }
}

/// The human form of an fsck report.
pub fn fsck_text(r: &FsckReport) -> String {
    let mut out = String::new();
    if !r.files.is_empty() {
        let w = r
            .files
            .iter()
            .map(|f| f.path.len())
            .max()
            .unwrap_or(4)
            .max(4);
        out += &format!(
            "{:<w$}  {:<10}  {:>6}  {:>7}  {:>5}  {:>7}  {:>5}  {:>7}  {:>5}\n",
            "PATH", "STATE", "CHUNKS", "HEALTHY", "UNDER", "MISSING", "STALE", "CORRUPT", "AHEAD"
        );
        for f in &r.files {
            let c = &f.counts;
            out += &format!(
                "{:<w$}  {:<10}  {:>6}  {:>7}  {:>5}  {:>7}  {:>5}  {:>7}  {:>5}\n",
                f.path,
                state_word(f.state),
                c.chunks,
                c.healthy,
                c.under_replicated,
                c.missing,
                c.stale_replicas,
                c.corrupt_replicas,
                c.ahead_replicas
            );
            for p in &f.problems {
                let mut what = vec![format!("{}/{} live", p.live, p.replication)];
                if p.missing {
                    what.push("MISSING".into());
                }
                if p.stale > 0 {
                    what.push(format!("{} stale", p.stale));
                }
                if p.corrupt > 0 {
                    what.push(format!("{} corrupt", p.corrupt));
                }
                if p.ahead > 0 {
                    what.push(format!("{} above the master's version", p.ahead));
                }
                out += &format!(
                    "  chunk {} {} v{}: {}\n",
                    p.index,
                    p.handle,
                    p.version,
                    what.join(", ")
                );
            }
        }
        if r.truncated {
            out += "  (more files not listed)\n";
        }
        out += "\n";
    }
    let t = &r.total;
    out += &format!(
        "fsck {}: {}\n",
        r.path,
        if r.healthy { "HEALTHY" } else { "UNHEALTHY" }
    );
    out += &counts_text(t);
    out += &format!(
        "  {:<18}{:>8}   (pending deletion)\n",
        "orphan replicas", r.orphan_replicas
    );
    out += &format!(
        "  {:<18}{:>8}   (in flight)\n",
        "re-replications", r.replications_in_flight
    );
    out
}

fn counts_text(t: &HealthCounts) -> String {
    let row = |name: &str, n: u64, note: &str| {
        if note.is_empty() {
            format!("  {name:<18}{n:>8}\n")
        } else {
            format!("  {name:<18}{n:>8}   ({note})\n")
        }
    };
    let mut out = String::new();
    out += &row("files", t.files, "");
    out += &row("open for write", t.open_files, "");
    out += &row("in recovery", t.recovering_files, "");
    out += &row("chunks", t.chunks, "");
    out += &row("healthy", t.healthy, "");
    out += &row("under-replicated", t.under_replicated, "");
    out += &row(
        "missing",
        t.missing,
        "no live replica at the master's version",
    );
    out += &row("stale replicas", t.stale_replicas, "pending deletion");
    out += &row("corrupt replicas", t.corrupt_replicas, "being replaced");
    out += &row(
        "ahead replicas",
        t.ahead_replicas,
        "above the master's version: kept aside",
    );
    out
}

/// `stampfs admin report [--json]`.
pub async fn admin_report(master: &MasterAddr, json: bool) -> u8 {
    let report = match crate::users::ask(master, ClusterReportRequest {}).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stampfs: error: admin report: {e:#}");
            return EXIT_ERROR;
        }
    };
    if json {
        return if print_json(&report) {
            EXIT_OK
        } else {
            EXIT_ERROR
        };
    }
    show(&report_text(&report));
    EXIT_OK
}

fn ago(ms: Option<u64>) -> String {
    match ms {
        None => "never".into(),
        Some(ms) if ms < 60_000 => format!("{:.1}s ago", ms as f64 / 1000.0),
        Some(ms) => format!("{}m{}s ago", ms / 60_000, ms % 60_000 / 1000),
    }
}

/// The human form of a cluster report.
pub fn report_text(r: &ClusterReport) -> String {
    let w = r
        .chunkservers
        .iter()
        .map(|c| c.addr.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let mut out = format!(
        "{:<6}  {:<w$}  {:<5}  {:>14}  {:>10}  {:>10}  {:>8}  {:>7}  {:>6}  {}\n",
        "ID",
        "ADDRESS",
        "STATE",
        "LAST HEARTBEAT",
        "CAPACITY",
        "USED",
        "REPLICAS",
        "STREAMS",
        "QUEUED",
        "DECOMMISSION"
    );
    for c in &r.chunkservers {
        let decommission = match c.decommission {
            DecommissionState::Decommissioning { waiting } => {
                format!("decommissioning ({waiting} chunks waiting)")
            }
            d => d.word().to_string(),
        };
        out += &format!(
            "{:<6}  {:<w$}  {:<5}  {:>14}  {:>10}  {:>10}  {:>8}  {:>7}  {:>6}  {}\n",
            c.id.to_string(),
            c.addr,
            match c.state {
                ChunkserverState::Live => "live",
                ChunkserverState::Dead => "dead",
            },
            ago(c.last_heartbeat_ms_ago),
            format_size(c.capacity),
            format_size(c.used),
            c.replicas,
            c.active_streams,
            c.queued_commands,
            decommission
        );
    }
    let live = r
        .chunkservers
        .iter()
        .filter(|c| c.state == ChunkserverState::Live)
        .count();
    out += &format!(
        "\nchunkservers: {} ({live} live, {} dead)\n",
        r.chunkservers.len(),
        r.chunkservers.len() - live
    );
    out += "chunk health:\n";
    out += &counts_text(&r.chunks);
    out += &format!(
        "  {:<18}{:>8}   (pending deletion)\n",
        "orphan replicas", r.orphan_replicas
    );
    out += &format!(
        "  {:<18}{:>8}   (in flight)\n",
        "re-replications", r.replications_in_flight
    );
    out += &format!("\n{}\n", r.safe_mode.describe());
    out += &format!("{}\n", crate::admin::balance_text(&r.balancer));
    if let Some(g) = &r.masters {
        out += &group_text(g);
    }
    out
}

fn index(i: Option<u64>) -> String {
    i.map_or_else(|| "-".into(), |i| i.to_string())
}

/// The master group part of a cluster report.
fn group_text(g: &stampfs_proto::GroupStatus) -> String {
    let w = g
        .members
        .iter()
        .map(|m| m.addr.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let mut out = format!(
        "\nmaster group: term {}, leader {}, epoch {}; applied {}, last entry {}, snapshot at {}, purged to {}; quorum heard {}\n",
        g.term,
        g.leader.map_or_else(|| "unknown".into(), |l| l.to_string()),
        g.epoch,
        index(g.applied_index),
        index(g.last_log_index),
        index(g.snapshot_index),
        index(g.purged_index),
        ago(g.quorum_ack_ms_ago),
    );
    out += &format!(
        "{:<6}  {:<w$}  {:<8}  {:>9}  {:>6}\n",
        "ID", "ADDRESS", "ROLE", "MATCHED", "LAG"
    );
    for m in &g.members {
        out += &format!(
            "{:<6}  {:<w$}  {:<8}  {:>9}  {:>6}\n",
            m.id,
            m.addr,
            m.role,
            index(m.matched_index),
            index(m.lag)
        );
    }
    out
}
