//! The report as text (tables and verdicts) and as an SVG plot.

use super::{ConfigResult, Report};
use stampfs_chunkserver::store::DEFAULT_WRITE_BEHIND;
use stampfs_proto::units::format_size;
use std::fmt::Write as _;

pub(super) fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

pub(super) fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

/// Renders rows as an aligned table (first column left-aligned, the rest right).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            let pad = width[i].saturating_sub(cell.chars().count());
            if i > 0 {
                out.push_str("  ");
            }
            if i == 0 {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            }
        }
        out.trim_end().to_string()
    };
    let mut out = line(&mut header.iter().copied());
    out.push('\n');
    out.push_str(&"-".repeat(width.iter().sum::<usize>() + 2 * cols.saturating_sub(1)));
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
        out.push('\n');
    }
    out
}

pub(super) fn config_name(r: &ConfigResult) -> String {
    format!("r{} {}", r.replication, r.engine)
}

/// The terminal report: a throughput table, a small-write table and the targets.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "write pipeline: {} per configuration, packet {}, window {}, chunk {}, {} core(s)",
        format_size(report.size),
        format_size(report.packet),
        format_size(report.window),
        report
            .chunk_size
            .map_or_else(|| "master default".to_string(), format_size),
        report.cores,
    );
    let _ = writeln!(out, "disk: {}\n", report.dir);
    let rows: Vec<Vec<String>> = report
        .results
        .iter()
        .map(|r| {
            let t = &r.throughput;
            vec![
                config_name(r),
                format!("{:.0}", t.mb_per_s),
                fmt_us(t.ack_p50_us),
                fmt_us(t.ack_p99_us),
                format!("{:.0}", t.raw_mb_per_s),
                format!("{:.0}", t.limit_mb_per_s),
                format!("{:.0}%", t.ratio * 100.0),
                format!("≥{:.0}%", t.target * 100.0),
                verdict(t.met).to_string(),
                t.cpu_seconds_per_gib
                    .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                t.other_load
                    .map_or_else(|| "-".into(), |o| format!("{:.0}%", o * 100.0)),
                t.raw_wb_mb_per_s
                    .map_or_else(|| "-".into(), |v| format!("{v:.0}")),
                t.ratio_wb
                    .map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0)),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "config",
            "MB/s",
            "ack p50",
            "ack p99",
            "raw MB/s",
            "limit",
            "ratio",
            "target",
            "",
            "cpu s/GiB",
            "others",
            "raw+wb",
            "ratio wb",
        ],
        &rows,
    ));
    let small: Vec<Vec<String>> = report
        .results
        .iter()
        .filter_map(|r| {
            r.small.as_ref().map(|s| {
                vec![
                    config_name(r),
                    s.count.to_string(),
                    fmt_us(s.p50_us),
                    fmt_us(s.p99_us),
                    fmt_us(s.ack_p50_us),
                    fmt_us(s.raw_p50_us),
                    fmt_us(s.raw_p99_us),
                    format!("{:.2}×", s.ratio),
                    format!("≤{:.1}×", s.target),
                    verdict(s.met).to_string(),
                    s.raw_parallel_p50_us.map_or_else(|| "-".into(), fmt_us),
                    s.ratio_parallel
                        .map_or_else(|| "-".into(), |r| format!("{r:.2}×")),
                    s.met_parallel
                        .map_or_else(|| "-".into(), |m| verdict(m).to_string()),
                ]
            })
        })
        .collect();
    if !small.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "4 KiB + hsync",
                "n",
                "p50",
                "p99",
                "ack p50",
                "raw p50",
                "raw p99",
                "p50/raw",
                "target",
                "",
                "raw×r p50",
                "p50/raw×r",
                "≤1.5×",
            ],
            &small,
        ));
    }
    let _ = write!(
        out,
        "\nlimit = raw sequential pwrite+fdatasync bandwidth of size×replication bytes on the same disk, \
         divided by the replication; ratio = pipeline / limit. raw p50/p99: 4 KiB pwrite + fdatasync.\n\
         cpu s/GiB = CPU time of this process (client + embedded cluster) per GiB written; \
         others = CPU used by other processes (and stolen by the hypervisor) during the pipeline run, as a share of the machine.\n\
         raw+wb = the same raw write starting writeback every {} as the chunkserver does (a stricter \
         baseline than the target's); ratio wb = pipeline / (raw+wb / replication).\n\
         raw×r: r raw files each appended 4 KiB and fdatasynced side by side per round \
         (what r replicas on one disk do per hsync, the same-disk limit for r copies); \
         the first verdict judges against one raw write, the second against that limit.\n",
        format_size(DEFAULT_WRITE_BEHIND)
    );
    let tls = tls_rows(report);
    if !tls.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "TLS cost",
                "MB/s plain",
                "MB/s TLS",
                "change",
                "cpu s/GiB plain",
                "cpu s/GiB TLS",
                "ack p50 plain",
                "ack p50 TLS",
                "hsync p50 plain",
                "hsync p50 TLS",
            ],
            &tls,
        ));
        out.push_str(
            "TLS: every connection (client, master, chunkservers, the pipeline between \
             replicas) under TLS 1.3 with the same configuration otherwise, measured in the \
             same run.\n",
        );
    }
    let patterns: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.overwrite.is_some() || r.random.is_some())
        .map(|r| (config_name(r), r.overwrite.as_ref(), r.random.as_ref()))
        .collect();
    if !patterns.is_empty() {
        out.push('\n');
        out.push_str(&crate::bench_patterns::render(&patterns));
    }
    out
}

/// Each TLS configuration next to the same one in plain TCP.
fn tls_rows(report: &Report) -> Vec<Vec<String>> {
    let opt = |v: Option<f64>, f: fn(f64) -> String| v.map_or_else(|| "-".into(), f);
    let secs = |v: f64| format!("{v:.2}");
    report
        .results
        .iter()
        .filter(|r| r.tls)
        .filter_map(|t| {
            let base = t.engine.strip_suffix(super::TLS_SUFFIX)?;
            let p = report
                .results
                .iter()
                .find(|p| !p.tls && p.replication == t.replication && p.engine == base)?;
            let (pt, tt) = (&p.throughput, &t.throughput);
            let change = if pt.mb_per_s > 0.0 {
                format!("{:+.0}%", (tt.mb_per_s / pt.mb_per_s - 1.0) * 100.0)
            } else {
                "-".into()
            };
            Some(vec![
                format!("r{} {base}", t.replication),
                format!("{:.0}", pt.mb_per_s),
                format!("{:.0}", tt.mb_per_s),
                change,
                opt(pt.cpu_seconds_per_gib, secs),
                opt(tt.cpu_seconds_per_gib, secs),
                fmt_us(pt.ack_p50_us),
                fmt_us(tt.ack_p50_us),
                opt(p.small.as_ref().map(|s| s.p50_us), fmt_us),
                opt(t.small.as_ref().map(|s| s.p50_us), fmt_us),
            ])
        })
        .collect()
}

/// The stricter baseline's limit for a configuration, MB/s.
pub(super) fn wb_limit(r: &ConfigResult) -> Option<f64> {
    r.throughput
        .raw_wb_mb_per_s
        .map(|v| v / f64::from(r.replication.max(1)))
}

pub(super) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A hand-written SVG: left, pipeline throughput next to the raw limit per
/// configuration; right, the ratio with its target marked.
pub fn render_svg(report: &Report) -> String {
    const W: f64 = 900.0;
    const H: f64 = 420.0;
    const TOP: f64 = 60.0;
    const BOTTOM: f64 = 340.0;
    let n = report.results.len().max(1) as f64;
    let plot_h = BOTTOM - TOP;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        xml_escape(&format!(
            "stampfs write pipeline: {} per configuration, packet {}, window {}",
            format_size(report.size),
            format_size(report.packet),
            format_size(report.window)
        ))
    );
    // Left panel: MB/s.
    let (lx, lw) = (60.0, 470.0);
    let max_mb = report
        .results
        .iter()
        .flat_map(|r| {
            [
                r.throughput.mb_per_s,
                r.throughput.limit_mb_per_s,
                wb_limit(r).unwrap_or(0.0),
            ]
        })
        .fold(1.0f64, f64::max)
        * 1.15;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="48" text-anchor="middle">throughput (MB/s): pipeline vs raw-disk limit</text>"#,
        lx + lw / 2.0
    );
    for i in 0..=4 {
        let v = max_mb * f64::from(i) / 4.0;
        let y = BOTTOM - plot_h * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{lx}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            lx + lw,
            lx - 4.0,
            y + 4.0
        );
    }
    let group = lw / n;
    let bar = (group * 0.27).min(45.0);
    for (i, r) in report.results.iter().enumerate() {
        let gx = lx + group * i as f64 + group / 2.0;
        let bars = [
            Some((r.throughput.mb_per_s, "#3b7dd8")),
            Some((r.throughput.limit_mb_per_s, "#aaaaaa")),
            wb_limit(r).map(|v| (v, "#dddddd")),
        ];
        for (k, (v, color)) in bars
            .into_iter()
            .enumerate()
            .filter_map(|(k, b)| Some((k, b?)))
        {
            let h = plot_h * v / max_mb;
            let x = gx - 1.5 * bar + bar * k as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{bar:.1}" height="{h:.1}" fill="{color}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{v:.0}</text>"#,
                BOTTOM - h,
                x + bar / 2.0,
                BOTTOM - h - 3.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{gx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            BOTTOM + 16.0,
            xml_escape(&config_name(r))
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{lx}" y="{}" width="10" height="10" fill="#3b7dd8"/><text x="{}" y="{}">pipeline</text><rect x="{}" y="{}" width="10" height="10" fill="#aaaaaa"/><text x="{}" y="{}">raw limit (raw / replication)</text><rect x="{}" y="{}" width="10" height="10" fill="#dddddd"/><text x="{}" y="{}">raw with write-behind / replication</text>"##,
        BOTTOM + 32.0,
        lx + 14.0,
        BOTTOM + 41.0,
        lx + 90.0,
        BOTTOM + 32.0,
        lx + 104.0,
        BOTTOM + 41.0,
        lx + 290.0,
        BOTTOM + 32.0,
        lx + 304.0,
        BOTTOM + 41.0
    );
    // Right panel: ratio.
    let (rx, rw) = (600.0, 270.0);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="48" text-anchor="middle">ratio to the limit (target marked)</text>"#,
        rx + rw / 2.0
    );
    let max_ratio = report
        .results
        .iter()
        .map(|r| r.throughput.ratio)
        .fold(1.0f64, f64::max)
        * 1.1;
    for pct in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let y = BOTTOM - plot_h * pct / max_ratio;
        let _ = writeln!(
            s,
            r##"<line x1="{rx}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{:.0}%</text>"##,
            rx + rw,
            rx - 4.0,
            y + 4.0,
            pct * 100.0
        );
    }
    let group = rw / n;
    let bar = (group * 0.5).min(50.0);
    for (i, r) in report.results.iter().enumerate() {
        let t = &r.throughput;
        let gx = rx + group * i as f64 + group / 2.0;
        let h = plot_h * t.ratio / max_ratio;
        let color = if t.met { "#2e9e5b" } else { "#d8613b" };
        let ty = BOTTOM - plot_h * t.target / max_ratio;
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{bar:.1}" height="{h:.1}" fill="{color}"/><line x1="{:.1}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#000" stroke-dasharray="4 2"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.0}%</text><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            gx - bar / 2.0,
            BOTTOM - h,
            gx - bar * 0.8,
            gx + bar * 0.8,
            BOTTOM - h - 3.0,
            t.ratio * 100.0,
            BOTTOM + 16.0,
            xml_escape(&config_name(r))
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{SmallWrites, Throughput};
    use std::time::Duration;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["config", "MB/s"],
            &[
                vec!["r1 uring".into(), "5".into()],
                vec!["r3 threads".into(), "123".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "config      MB/s");
        assert_eq!(lines[2], "r1 uring       5");
        assert_eq!(lines[3], "r3 threads   123");
    }

    fn sample_report() -> Report {
        let t = Throughput::new(3, 1 << 30, ms(10_000), &[ms(1), ms(2)], &[ms(9_000)]);
        Report {
            command: "stampfs bench pipeline".into(),
            size: 1 << 30,
            packet: 64 << 10,
            window: 8 << 20,
            chunk_size: None,
            small_writes: 1,
            cores: 2,
            dir: "/tmp/<x>".into(),
            results: vec![ConfigResult {
                replication: 3,
                engine: "uring".into(),
                tls: false,
                throughput: t,
                small: Some(SmallWrites::new(&[ms(1)], &[ms(1)], Some(&[ms(2)]))),
                overwrite: Some(crate::bench_patterns::Overwrite::new(
                    80_000_000,
                    ms(1_000),
                    100.0,
                )),
                random: None,
            }],
        }
    }

    #[test]
    fn text_report_names_every_configuration_and_verdict() {
        let text = render_text(&sample_report());
        assert!(text.contains("r3 uring"), "{text}");
        assert!(text.contains("90%"), "{text}");
        assert!(text.contains("met"), "{text}");
        assert!(text.contains("4 KiB + hsync"), "{text}");
        assert!(
            text.contains("r3 uring: sequential overwrite 80 MB/s against append 100 MB/s: 80%"),
            "{text}"
        );
    }

    #[test]
    fn tls_configurations_are_set_next_to_their_plain_twin() {
        let mut report = sample_report();
        assert!(
            !render_text(&report).contains("TLS cost"),
            "no TLS run, no section"
        );
        let mut tls = report.results[0].clone();
        tls.tls = true;
        tls.engine = format!("uring{}", crate::bench::TLS_SUFFIX);
        tls.throughput = Throughput::new(3, 1 << 30, ms(12_500), &[ms(2)], &[ms(9_000)]);
        report.results.push(tls);
        let text = render_text(&report);
        let row = text
            .lines()
            .find(|l| l.starts_with("r3 uring ") && l.contains("-20%"))
            .unwrap_or_else(|| panic!("a TLS cost row for r3 uring, 20% slower:\n{text}"));
        assert!(row.contains("107") && row.contains("86"), "{row}");
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let svg = render_svg(&sample_report());
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("r3 uring"));
        assert!(!svg.contains("NaN"));
        assert_eq!(svg.matches("<svg").count(), 1);
        let empty = Report {
            results: Vec::new(),
            ..sample_report()
        };
        assert!(!render_svg(&empty).contains("NaN"));
    }
}
