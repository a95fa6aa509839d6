//! `stampfs admin quota set|clear|get|list`, and the quota columns of `count -q`
//! (the decisions are the master's: `master/src/state/quota.rs`).

use super::connect;
use crate::cli::QuotaCommand;
use anyhow::{anyhow, Context, Result};
use stampfs_proto::units::format_size;
use stampfs_proto::{QuotaChange, QuotaReport, QuotaUse};

/// `stampfs admin quota ...`.
pub async fn quota(cmd: QuotaCommand) -> Result<()> {
    match cmd {
        QuotaCommand::Set {
            master,
            path,
            names,
            bytes,
        } => {
            if names.is_none() && bytes.is_none() {
                return Err(anyhow!(
                    "say which quota to set: --names N, --bytes SIZE, or both"
                ));
            }
            let change = |v: Option<u64>| v.map_or(QuotaChange::Keep, QuotaChange::Set);
            let client = connect(&master).await?;
            let report = client
                .set_quota(&path, change(names), change(bytes))
                .await
                .with_context(|| format!("cannot set the quota of {path}"))?;
            outln!("{}", describe(&report));
        }
        QuotaCommand::Clear {
            master,
            path,
            names,
            bytes,
        } => {
            let both = !names && !bytes;
            let change = |asked: bool| {
                if asked || both {
                    QuotaChange::Clear
                } else {
                    QuotaChange::Keep
                }
            };
            let client = connect(&master).await?;
            let report = client
                .set_quota(&path, change(names), change(bytes))
                .await
                .with_context(|| format!("cannot clear the quota of {path}"))?;
            outln!("{}", describe(&report));
        }
        QuotaCommand::Get { master, path, json } => {
            let client = connect(&master).await?;
            let report = client
                .quota(&path)
                .await
                .with_context(|| format!("cannot read the quota of {path}"))?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                outln!("{}", describe(&report));
            }
        }
        QuotaCommand::List { master, json } => {
            let client = connect(&master).await?;
            let reports = client
                .list_quotas()
                .await
                .context("cannot list the quotas")?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&reports)?);
            } else if reports.is_empty() {
                outln!("No directory has a quota.");
            } else {
                outln!("{}", quota_header());
                for r in &reports {
                    outln!("{} {}", quota_columns(&r.names, &r.bytes, false), r.path);
                }
            }
        }
    }
    Ok(())
}

/// One line for people: `/d: names 3 of 10 (7 left); space 1.0 MiB of 3.0 MiB (...)`.
fn describe(r: &QuotaReport) -> String {
    let names = match r.names {
        Some(q) => format!("names {} of {} ({} left)", q.used, q.limit, q.remaining()),
        None => "no name quota".into(),
    };
    let bytes = match r.bytes {
        Some(q) => format!(
            "space {} of {} ({} left; every replica counts)",
            format_size(q.used),
            format_size(q.limit),
            format_size(q.remaining())
        ),
        None => "no space quota".into(),
    };
    format!("{}: {names}; {bytes}", r.path)
}

/// The header of [`quota_columns`].
pub fn quota_header() -> String {
    format!(
        "{:>12} {:>12} {:>14} {:>14}",
        "QUOTA", "REM_QUOTA", "SPACE_QUOTA", "REM_SPACE_QUOTA"
    )
}

/// `count -q`'s first four columns, as HDFS prints them: `none` and `inf` where
/// there is no limit, and what is left negative past a limit (which a limit set below
/// the use allows).
pub fn quota_columns(names: &Option<QuotaUse>, bytes: &Option<QuotaUse>, human: bool) -> String {
    let left = |u: &QuotaUse| i128::from(u.limit) - i128::from(u.used);
    let size = |n: i128| {
        let abs = u64::try_from(n.unsigned_abs()).unwrap_or(u64::MAX);
        let sign = if n < 0 { "-" } else { "" };
        if human {
            format!("{sign}{}", format_size(abs))
        } else {
            format!("{sign}{abs}")
        }
    };
    let (q, rq) = match names {
        Some(u) => (u.limit.to_string(), left(u).to_string()),
        None => ("none".into(), "inf".into()),
    };
    let (s, rs) = match bytes {
        Some(u) => (size(i128::from(u.limit)), size(left(u))),
        None => ("none".into(), "inf".into()),
    };
    format!("{q:>12} {rq:>12} {s:>14} {rs:>14}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_say_none_and_inf_without_a_limit() {
        let line = quota_columns(&None, &None, false);
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols, ["none", "inf", "none", "inf"]);
    }

    #[test]
    fn columns_show_limit_and_what_is_left() {
        let names = Some(QuotaUse { limit: 10, used: 4 });
        let bytes = Some(QuotaUse {
            limit: 3 << 20,
            used: 4 << 20,
        });
        let line = quota_columns(&names, &bytes, true);
        let cols: Vec<&str> = line.split_whitespace().collect();
        // Past its limit, what is left is negative, as HDFS shows it.
        assert_eq!(cols, ["10", "6", "3.0", "MiB", "-1.0", "MiB"]);
    }

    #[test]
    fn description_names_both_limits() {
        let r = QuotaReport {
            path: "/d".into(),
            names: Some(QuotaUse { limit: 5, used: 2 }),
            bytes: None,
        };
        assert_eq!(describe(&r), "/d: names 2 of 5 (3 left); no space quota");
    }
}
