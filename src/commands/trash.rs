//! `stampfs setrep` and `stampfs trash list|restore`, as `hdfs dfs -setrep` and the
//! HDFS trash (`/.trash/<user>/Current/<original path>`, checkpoints named by the
//! millisecond they were taken; the master's side is `master/src/trash.rs`).

use super::{connect, output_error, Client};
use crate::cli::{SetrepArgs, TrashCommand};
use anyhow::{anyhow, Context, Result};
use serde::Serialize;
use stampfs_proto::{FileKind, FileStatus};
use std::io::Write;
use std::time::Duration;

/// The master's trash directory (see `master/src/trash.rs`).
const TRASH: &str = "/.trash";
const CURRENT: &str = "Current";

/// Every file under `path` (itself when it is a file), in name order; links are not
/// followed.
async fn files_under(client: &Client, path: &str) -> Result<Vec<String>> {
    let st = client
        .stat(path)
        .await
        .with_context(|| format!("cannot set the replication of {path}"))?;
    match st.kind {
        FileKind::File => return Ok(vec![st.path]),
        FileKind::Directory => {}
        _ => {
            return Err(anyhow!(
                "{path} is a symbolic link: only files have a replication factor"
            ))
        }
    }
    Ok(walk(client, &st.path)
        .await?
        .into_iter()
        .filter(|e| e.kind == FileKind::File)
        .map(|e| e.path)
        .collect())
}

/// `stampfs setrep [-R] [-w] N PATH`.
/// Polls of `setrep -w` (one a second) before it says why it may still be waiting.
const HINT_AFTER: u32 = 10;

pub async fn setrep(args: SetrepArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let n = args.replication;
    let files = files_under(&client, &args.path).await?;
    let mut out = std::io::stdout().lock();
    for f in &files {
        client
            .set_replication(f, n)
            .await
            .with_context(|| format!("cannot set the replication of {f}"))?;
        writeln!(out, "Replication {n} set: {f}").map_err(output_error)?;
    }
    if !args.wait {
        return Ok(());
    }
    for f in &files {
        write!(out, "Waiting for {f} ...").map_err(output_error)?;
        out.flush().map_err(output_error)?;
        let mut waited = 0u32;
        loop {
            let locs = client
                .locations(f)
                .await
                .with_context(|| format!("cannot see the replicas of {f}"))?;
            // Replicas on a chunkserver being decommissioned do not count (the master
            // copies them elsewhere and keeps them until it is stopped).
            if locs
                .chunks
                .iter()
                .all(|c| c.replicas.iter().filter(|r| !r.decommissioning).count() == usize::from(n))
            {
                break;
            }
            write!(out, ".").map_err(output_error)?;
            waited += 1;
            if waited == HINT_AFTER {
                write!(
                    out,
                    " (still short of {n} replicas per chunk; replicas on chunkservers being \
                     decommissioned do not count, and `stampfs admin report` shows how many \
                     chunkservers are live) "
                )
                .map_err(output_error)?;
            }
            out.flush().map_err(output_error)?;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        writeln!(out, " done").map_err(output_error)?;
    }
    Ok(())
}

/// One entry of a trash listing.
#[derive(Serialize)]
struct Kept {
    /// `Current`, or the checkpoint's name (the millisecond it was taken).
    bucket: String,
    /// When the checkpoint was taken (ms since the epoch); `None` for `Current`.
    checkpoint_ms: Option<u64>,
    /// Where it was removed from.
    original: String,
    /// Where it is now.
    trash_path: String,
    kind: FileKind,
    length: u64,
}

/// The buckets of `user`'s trash: `Current` first, then the checkpoints, newest
/// first. Empty when the user has no trash.
async fn buckets(client: &Client, user: &str) -> Result<Vec<(String, Option<u64>)>> {
    let dir = format!("{TRASH}/{user}");
    let entries = match client.list(&dir).await {
        Ok(e) => e,
        Err(stampfs_client::Error::Remote(stampfs_proto::RemoteError::NotFound { .. })) => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot list {dir}"))),
    };
    let mut current = Vec::new();
    let mut checkpoints = Vec::new();
    for e in entries {
        let name = e.path.rsplit('/').next().unwrap_or_default().to_string();
        if name == CURRENT {
            current.push((name, None));
        } else if let Ok(ms) = name.parse::<u64>() {
            checkpoints.push((name, Some(ms)));
        }
    }
    checkpoints.sort_by_key(|c| std::cmp::Reverse(c.1));
    current.extend(checkpoints);
    Ok(current)
}

/// Everything under `dir`, depth first in name order.
async fn walk(client: &Client, dir: &str) -> Result<Vec<FileStatus>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_string()];
    while let Some(d) = todo.pop() {
        let mut entries = client
            .list(&d)
            .await
            .with_context(|| format!("cannot list {d}"))?;
        entries.sort_by(|a, b| b.path.cmp(&a.path));
        for e in entries {
            if e.kind == FileKind::Directory {
                todo.push(e.path.clone());
            }
            out.push(e);
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The trash directory of the user a command looks at (`--user`, else the
/// connection's user), as the master names it: `stampfs_master::trash::user_dir`, or
/// that with `.<uid>` appended when the name is taken by another uid's directory (a
/// user removed and added again under another uid).
async fn trash_user(
    client: &Client,
    master: &crate::cli::MasterAddr,
    user: Option<String>,
) -> Result<String> {
    let me = client.identity();
    let (name, uid) = match user {
        None => (me.name.clone(), me.uid),
        Some(u) if u == me.name => (u, me.uid),
        Some(u) => {
            if u.is_empty() || u.contains('/') || u == "." || u == ".." {
                return Err(anyhow!("{u:?} is not a user's name"));
            }
            let users = crate::users::ask(master, stampfs_proto::ListUsers {})
                .await
                .context("another user's trash needs a superuser (to look up their uid)")?;
            let uid = users
                .iter()
                .find(|i| i.name == u)
                .map(|i| i.uid)
                .ok_or_else(|| anyhow!("no user is called {u:?}"))?;
            (u, uid)
        }
    };
    let dir = stampfs_master::trash::user_dir(Some(&name), uid);
    let path = format!("{TRASH}/{dir}");
    match client.stat(&path).await {
        Ok(st) if st.kind == FileKind::Directory && st.attr.uid == uid => Ok(dir),
        Ok(_) => Ok(format!("{dir}.{uid}")),
        Err(stampfs_client::Error::Remote(stampfs_proto::RemoteError::NotFound { .. })) => Ok(dir),
        Err(e) => Err(anyhow::Error::from(e).context(format!("cannot stat {path}"))),
    }
}

/// A time for people: `YYYY-MM-DD HH:MM:SS` UTC.
fn when(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_string()
        + " UTC"
}

/// `stampfs trash list|restore`.
pub async fn trash(cmd: TrashCommand) -> Result<()> {
    match cmd {
        TrashCommand::List { master, user, json } => {
            let client = connect(&master).await?;
            let user = trash_user(&client, &master, user).await?;
            let mut kept = Vec::new();
            for (bucket, at) in buckets(&client, &user).await? {
                let root = format!("{TRASH}/{user}/{bucket}");
                for e in walk(&client, &root).await? {
                    let Some(original) = e.path.strip_prefix(&root) else {
                        continue;
                    };
                    kept.push(Kept {
                        original: original.to_string(),
                        bucket: bucket.clone(),
                        checkpoint_ms: at,
                        trash_path: e.path,
                        kind: e.kind,
                        length: e.length,
                    });
                }
            }
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &kept)?;
                return writeln!(out).map_err(output_error);
            }
            if kept.is_empty() {
                return writeln!(out, "The trash of {user} is empty").map_err(output_error);
            }
            for k in &kept {
                let bucket = match k.checkpoint_ms {
                    None => "Current (not yet checkpointed)".to_string(),
                    Some(ms) => format!("checkpoint of {}", when(ms)),
                };
                let slash = if k.kind == FileKind::Directory {
                    "/"
                } else {
                    ""
                };
                writeln!(
                    out,
                    "{}{slash}\t{}\t{bucket}\t{}",
                    k.original, k.length, k.trash_path
                )
                .map_err(output_error)?;
            }
            Ok(())
        }
        TrashCommand::Restore {
            master,
            path,
            to,
            user,
        } => {
            let client = connect(&master).await?;
            let (trash_path, original) = if path.starts_with(&format!("{TRASH}/")) {
                let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
                if parts.len() < 4 {
                    return Err(anyhow!(
                        "{path} is not an entry of the trash ({TRASH}/<user>/{CURRENT}/<path>)"
                    ));
                }
                (path.clone(), format!("/{}", parts[3..].join("/")))
            } else {
                let original = format!("/{}", path.trim_matches('/'));
                let user = trash_user(&client, &master, user).await?;
                let mut found = None;
                for (bucket, _) in buckets(&client, &user).await? {
                    let p = format!("{TRASH}/{user}/{bucket}{original}");
                    if client.stat(&p).await.is_ok() {
                        found = Some(p);
                        break;
                    }
                }
                let Some(p) = found else {
                    return Err(anyhow!(
                        "{original} is not in the trash of {user} (`stampfs trash list` shows what is)"
                    ));
                };
                (p, original)
            };
            let dest = to.unwrap_or(original);
            client
                .restore_trash(&trash_path, &dest)
                .await
                .with_context(|| format!("cannot restore {trash_path} to {dest}"))?;
            println!("Restored {trash_path} to {dest}");
            Ok(())
        }
    }
}
