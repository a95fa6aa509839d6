//! The master's status page, served at `/` of `--metrics-listen` (in the spirit of the
//! NameNode's web page and mfscgi): the cluster summary (chunkservers, space, chunks by
//! health), every chunkserver, the files open for writing with their lease holders and
//! when the soft limit passes, the latest lease recoveries, the directory quotas and
//! the master group. Server-rendered HTML with its
//! style inline, no script and no external asset, laid out to read on a phone. Built
//! from the state at each request, under the state lock once.

use crate::service::Core;
use stampfs_proto::units::format_size as size;
use stampfs_proto::{ChunkserverState, ClusterReport, DecommissionState, QuotaReport, QuotaUse};
use std::fmt::Write;

/// Files open for writing listed at most.
pub const MAX_OPEN_FILES: usize = 200;

/// Quota'd directories listed at most.
pub const MAX_QUOTAS: usize = 200;

/// `s` with the characters HTML gives a meaning escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One file open for writing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenFile {
    pub path: String,
    pub holder: String,
    /// Until its soft limit passes (0: passed).
    pub soft_in_ms: u64,
}

/// What the page shows.
#[derive(Clone, Debug)]
pub struct Page {
    pub leading: bool,
    pub epoch: String,
    pub report: ClusterReport,
    pub open: Vec<OpenFile>,
    /// Files open beyond those listed.
    pub more_open: usize,
    /// The latest lease recoveries, newest first.
    pub recoveries: Vec<crate::metrics::RecoveryNote>,
    /// Directories with a quota (the first [`MAX_QUOTAS`] by path).
    pub quotas: Vec<QuotaReport>,
    /// Quota'd directories beyond those listed.
    pub more_quotas: usize,
}

impl Page {
    /// Gathers the page from the master.
    pub fn gather(core: &Core) -> Page {
        let now = core.clock.now_ms();
        let (report, open, more_open, quotas, more_quotas) = {
            let st = core.state();
            let report = st.cluster_report(now);
            let limits = st.settings.limits;
            let mut open: Vec<OpenFile> = st
                .leases
                .iter()
                .map(|(ino, l)| OpenFile {
                    path: st
                        .ns
                        .path_of(ino)
                        .unwrap_or_else(|| format!("(inode {ino})")),
                    holder: l.holder.to_string(),
                    soft_in_ms: l.expires_in_ms(now, limits),
                })
                .collect();
            open.sort_by(|a, b| a.path.cmp(&b.path));
            let more = open.len().saturating_sub(MAX_OPEN_FILES);
            open.truncate(MAX_OPEN_FILES);
            let mut quotas = st.list_quotas();
            quotas.sort_by(|a, b| a.path.cmp(&b.path));
            let more_quotas = quotas.len().saturating_sub(MAX_QUOTAS);
            quotas.truncate(MAX_QUOTAS);
            (report, open, more, quotas, more_quotas)
        };
        let mut report = report;
        report.masters = core.log.group().map(|g| g.status());
        let epoch = core
            .log
            .group()
            .map(|g| {
                let e = g.leadership.epoch();
                format!("{}/{}", e.term, e.leader)
            })
            .unwrap_or_else(|| "none (the operation log)".into());
        Page {
            leading: core.log.serving().is_ok(),
            epoch,
            report,
            open,
            more_open,
            recoveries: core.events.recent(),
            quotas,
            more_quotas,
        }
    }

    /// The page as HTML.
    pub fn render(&self) -> String {
        let r = &self.report;
        let live = r
            .chunkservers
            .iter()
            .filter(|c| c.state == ChunkserverState::Live)
            .count();
        let capacity: u64 = r.chunkservers.iter().map(|c| c.capacity).sum();
        let used: u64 = r.chunkservers.iter().map(|c| c.used).sum();
        let mut h = String::new();
        let _ = write!(
            h,
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>stampfs master</title><style>{STYLE}</style></head><body>\
             <h1>stampfs master</h1><p id=\"role\">{} &middot; epoch {}</p>",
            if self.leading {
                "serving"
            } else {
                "not serving (a follower: the leader serves)"
            },
            escape(&self.epoch),
        );
        let c = &r.chunks;
        let _ = write!(
            h,
            "<h2>Cluster</h2><table id=\"summary\"><tbody>\
             <tr><th>Chunkservers live</th><td>{live} of {}</td></tr>\
             <tr><th>Space used</th><td>{} of {}</td></tr>\
             <tr><th>Files</th><td>{}</td></tr>\
             <tr><th>Chunks</th><td>{}</td></tr>\
             <tr><th>Healthy</th><td>{}</td></tr>\
             <tr><th>Under-replicated</th><td{}>{}</td></tr>\
             <tr><th>Missing</th><td{}>{}</td></tr>\
             <tr><th>Stale / corrupt / ahead replicas</th><td>{} / {} / {}</td></tr>\
             <tr><th>Orphan replicas</th><td>{}</td></tr>\
             <tr><th>Re-replications in flight</th><td>{}</td></tr>\
             <tr><th>Safe mode</th><td id=\"safe-mode\"{}>{}</td></tr>\
             </tbody></table>",
            r.chunkservers.len(),
            size(used),
            size(capacity),
            c.files,
            c.chunks,
            c.healthy,
            class(c.under_replicated > 0, "warn"),
            c.under_replicated,
            class(c.missing > 0, "bad"),
            c.missing,
            c.stale_replicas,
            c.corrupt_replicas,
            c.ahead_replicas,
            r.orphan_replicas,
            r.replications_in_flight,
            class(r.safe_mode.on, "warn"),
            escape(&r.safe_mode.describe()),
        );
        h.push_str(
            "<h2>Chunkservers</h2><div class=\"scroll\"><table id=\"chunkservers\"><thead><tr>\
             <th>Id</th><th>Address</th><th>State</th><th>Last heartbeat</th><th>Used</th>\
             <th>Capacity</th><th>Replicas</th><th>Streams</th><th>Decommission</th></tr></thead><tbody>",
        );
        for s in &r.chunkservers {
            let (state, dead) = match s.state {
                ChunkserverState::Live => ("live", false),
                ChunkserverState::Dead => ("dead", true),
            };
            let heard = s.last_heartbeat_ms_ago.map_or_else(
                || "not since the start".into(),
                |ms| format!("{:.1} s ago", ms as f64 / 1000.0),
            );
            let decommission = match s.decommission {
                DecommissionState::Decommissioning { waiting } => {
                    format!("decommissioning: {waiting} chunks waiting")
                }
                d => d.word().to_string(),
            };
            let draining = s.decommission != DecommissionState::InService;
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td{}>{state}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td{}>{}</td></tr>",
                s.id,
                escape(&s.addr),
                class(dead, "bad"),
                escape(&heard),
                size(s.used),
                size(s.capacity),
                s.replicas,
                s.active_streams,
                class(draining, "warn"),
                escape(&decommission),
            );
        }
        h.push_str("</tbody></table></div>");
        let _ = write!(
            h,
            "<h2>Files open for writing</h2><div class=\"scroll\"><table id=\"open-files\">\
             <thead><tr><th>Path</th><th>Lease holder</th><th>Soft limit in</th></tr></thead><tbody>"
        );
        for f in &self.open {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&f.path),
                escape(&f.holder),
                if f.soft_in_ms == 0 {
                    "passed".to_string()
                } else {
                    format!("{:.1} s", f.soft_in_ms as f64 / 1000.0)
                },
            );
        }
        if self.open.is_empty() {
            h.push_str("<tr><td colspan=\"3\">none</td></tr>");
        }
        h.push_str("</tbody></table></div>");
        if self.more_open > 0 {
            let _ = write!(h, "<p>and {} more</p>", self.more_open);
        }
        h.push_str(
            "<h2>Recent lease recoveries</h2><p>The writer's version is fenced from then on: \
             the chunkservers refuse its late writes (their <code>fenced</code> counter).</p>\
             <div class=\"scroll\"><table id=\"recoveries\"><thead><tr><th>Path</th>\
             <th>When</th><th>Writer's version</th><th>Sealed at</th><th>Length</th></tr>\
             </thead><tbody>",
        );
        for r in &self.recoveries {
            let when = humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.at_ms),
            );
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{when}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&r.path),
                r.old_version,
                r.new_version,
                r.length,
            );
        }
        if self.recoveries.is_empty() {
            h.push_str("<tr><td colspan=\"5\">none since this master started</td></tr>");
        }
        h.push_str("</tbody></table></div>");
        if !self.quotas.is_empty() {
            h.push_str(
                "<h2>Quotas</h2><div class=\"scroll\"><table id=\"quotas\"><thead><tr>\
                 <th>Directory</th><th>Names</th><th>Space (every replica)</th></tr></thead>\
                 <tbody>",
            );
            for q in &self.quotas {
                let _ = write!(
                    h,
                    "<tr><td>{}</td>{}{}</tr>",
                    escape(&q.path),
                    quota_cell(q.names, |n| n.to_string()),
                    quota_cell(q.bytes, size),
                );
            }
            h.push_str("</tbody></table></div>");
            if self.more_quotas > 0 {
                let _ = write!(h, "<p>and {} more</p>", self.more_quotas);
            }
        }
        if let Some(g) = &r.masters {
            let _ = write!(
                h,
                "<h2>Master group</h2><p id=\"group\">term {} &middot; leader {} &middot; \
                 applied {} of {}</p><div class=\"scroll\"><table id=\"members\"><thead><tr>\
                 <th>Member</th><th>Address</th><th>Role</th><th>Matched</th><th>Lag</th>\
                 </tr></thead><tbody>",
                g.term,
                g.leader.map_or("none".into(), |l| l.to_string()),
                opt(g.applied_index),
                opt(g.last_log_index),
            );
            for m in &g.members {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    m.id,
                    escape(&m.addr),
                    escape(&m.role),
                    opt(m.matched_index),
                    opt(m.lag),
                );
            }
            h.push_str("</tbody></table></div>");
        }
        h.push_str(
            "<p class=\"foot\">Metrics: <a href=\"/metrics\">/metrics</a></p></body></html>\n",
        );
        h
    }
}

/// A quota's cell: `used of limit`, marked from 90% on and past the limit.
fn quota_cell(q: Option<QuotaUse>, show: impl Fn(u64) -> String) -> String {
    match q {
        None => "<td>no limit</td>".into(),
        Some(q) => {
            let full = q.used >= q.limit;
            let near = !full && q.used.saturating_mul(10) >= q.limit.saturating_mul(9);
            let mark = if full {
                class(true, "bad")
            } else {
                class(near, "warn")
            };
            format!("<td{mark}>{} of {}</td>", show(q.used), show(q.limit))
        }
    }
}

/// ` class="NAME"` when `on`, else nothing.
fn class(on: bool, name: &str) -> String {
    if on {
        format!(" class=\"{name}\"")
    } else {
        String::new()
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The page's style: readable on a phone (tables scroll sideways in their box).
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1em;max-width:60em;\
color:#222}h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.1em;margin-top:1.4em}\
table{border-collapse:collapse;font-size:.9em}th,td{padding:.3em .6em;\
border-bottom:1px solid #ddd;text-align:left;white-space:nowrap}\
#summary th,#summary td{white-space:normal}.scroll{overflow-x:auto}.warn{color:#a60}.bad{color:#c00;font-weight:bold}\
.foot{color:#666;font-size:.85em}";

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{ChunkserverId, ChunkserverStatus, HealthCounts};

    fn page() -> Page {
        Page {
            leading: true,
            epoch: "-".into(),
            report: ClusterReport {
                chunkservers: vec![ChunkserverStatus {
                    id: ChunkserverId(1),
                    addr: "127.0.0.1:9<1>".into(),
                    state: ChunkserverState::Dead,
                    last_heartbeat_ms_ago: Some(12_500),
                    capacity: 10 << 30,
                    used: 3 << 20,
                    replicas: 7,
                    active_streams: 0,
                    queued_commands: 0,
                    decommission: DecommissionState::Decommissioning { waiting: 4 },
                }],
                chunks: HealthCounts {
                    files: 2,
                    chunks: 7,
                    missing: 1,
                    ..HealthCounts::default()
                },
                orphan_replicas: 0,
                replications_in_flight: 0,
                masters: None,
                safe_mode: Default::default(),
                balancer: Default::default(),
            },
            open: vec![OpenFile {
                path: "/a&b".into(),
                holder: "client-1".into(),
                soft_in_ms: 0,
            }],
            more_open: 0,
            recoveries: vec![crate::metrics::RecoveryNote {
                path: "/w<x>".into(),
                at_ms: 1_700_000_000_000,
                old_version: 4,
                new_version: 5,
                length: 1000,
            }],
            quotas: vec![
                QuotaReport {
                    path: "/full".into(),
                    names: Some(QuotaUse { limit: 5, used: 5 }),
                    bytes: None,
                },
                QuotaReport {
                    path: "/near".into(),
                    names: None,
                    bytes: Some(QuotaUse {
                        limit: 10 << 20,
                        used: 9 << 20,
                    }),
                },
            ],
            more_quotas: 0,
        }
    }

    #[test]
    fn the_page_escapes_what_it_shows_and_marks_trouble() {
        let h = page().render();
        assert!(h.starts_with("<!doctype html>"));
        assert!(h.contains("127.0.0.1:9&lt;1&gt;"), "{h}");
        assert!(h.contains("<td>/a&amp;b</td>"), "{h}");
        assert!(h.contains("<td class=\"bad\">dead</td>"));
        assert!(
            h.contains("<td class=\"bad\">1</td>"),
            "missing chunks stand out"
        );
        assert!(h.contains("3.0 MiB of 10.0 GiB"));
        assert!(h.contains("12.5 s ago"));
        assert!(
            h.contains("<td>/w&lt;x&gt;</td><td>2023-11-14T22:13:20Z</td><td>4</td><td>5</td>"),
            "{h}"
        );
        assert!(h.contains("<td class=\"warn\">decommissioning: 4 chunks waiting</td>"));
        assert!(!h.contains("Master group"), "no group, no section");
        assert!(
            h.contains("<tr><td>/full</td><td class=\"bad\">5 of 5</td><td>no limit</td></tr>"),
            "{h}"
        );
        assert!(
            h.contains(
                "<td>/near</td><td>no limit</td><td class=\"warn\">9.0 MiB of 10.0 MiB</td>"
            ),
            "{h}"
        );
        assert!(!h.contains("<script"));
    }
}
