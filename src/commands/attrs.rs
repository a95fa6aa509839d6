//! The attribute commands: `chmod` and `chown` (with `-R`), and how `ls -l` and
//! `stat` print modes and times.

use super::connect;
use crate::cli::{ChmodArgs, ChownArgs};
use anyhow::{Context, Result};
use stampfs_client::Client;
use stampfs_proto::FileKind;

/// `rwxr-xr-x` for the permission bits of `mode`, with `s`/`S` and `t`/`T` for
/// set-uid, set-gid and sticky as `ls -l` shows them.
pub(super) fn mode_string(mode: u32) -> String {
    let mut out = String::with_capacity(9);
    for (shift, special, lower, upper) in [
        (6, 0o4000, 's', 'S'),
        (3, 0o2000, 's', 'S'),
        (0, 0o1000, 't', 'T'),
    ] {
        let bits = (mode >> shift) & 7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(match (mode & special != 0, bits & 1 != 0) {
            (true, true) => lower,
            (true, false) => upper,
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    out
}

/// A time in nanoseconds since the epoch as RFC 3339 in UTC to the second.
pub(super) fn time_string(ns: i64) -> String {
    match u64::try_from(ns) {
        Ok(ns) => humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns),
        )
        .to_string(),
        Err(_) => format!("{ns}ns"),
    }
}

pub async fn chmod(args: ChmodArgs) -> Result<()> {
    let mode = u32::from_str_radix(&args.mode, 8)
        .ok()
        .filter(|m| *m <= stampfs_proto::MODE_BITS)
        .with_context(|| format!("{:?} is not an octal mode of at most 7777", args.mode))?;
    let client = connect(&args.master).await?;
    let change = stampfs_proto::SetAttr {
        mode: Some(mode),
        ..stampfs_proto::SetAttr::new(&args.path)
    };
    set_attr_tree(&client, change, args.recursive, false, "mode").await
}

/// Applies `change` to its path and, `recursive`, to every entry below it (a
/// directory before what it holds; links never followed, and left out unless
/// `links`). The first failure stops it, naming the path.
async fn set_attr_tree(
    client: &Client,
    change: stampfs_proto::SetAttr,
    recursive: bool,
    links: bool,
    what: &str,
) -> Result<()> {
    let mut todo = vec![change.path.clone()];
    while let Some(path) = todo.pop() {
        client
            .set_attr(stampfs_proto::SetAttr {
                path: path.clone(),
                ..change.clone()
            })
            .await
            .with_context(|| format!("cannot change the {what} of {path}"))?;
        if !recursive {
            continue;
        }
        let st = client
            .stat(&path)
            .await
            .with_context(|| format!("cannot stat {path}"))?;
        if st.kind != FileKind::Directory {
            continue;
        }
        let entries = client
            .list(&path)
            .await
            .with_context(|| format!("cannot list {path}"))?;
        for e in entries.into_iter().rev() {
            if e.kind == FileKind::Symlink && !links {
                continue;
            }
            todo.push(e.path);
        }
    }
    Ok(())
}

/// `UID`, `UID:GID` or `:GID` as numbers.
fn parse_owner(s: &str) -> Result<(Option<u32>, Option<u32>)> {
    let num = |v: &str| -> Result<Option<u32>> {
        if v.is_empty() {
            return Ok(None);
        }
        v.parse()
            .map(Some)
            .with_context(|| format!("{v:?} is not a numeric uid or gid"))
    };
    let (uid, gid) = match s.split_once(':') {
        Some((u, g)) => (num(u)?, num(g)?),
        None => (num(s)?, None),
    };
    if uid.is_none() && gid.is_none() {
        anyhow::bail!("{s:?} names neither a uid nor a gid");
    }
    Ok((uid, gid))
}

pub async fn chown(args: ChownArgs) -> Result<()> {
    let (uid, gid) = parse_owner(&args.owner)?;
    let client = connect(&args.master).await?;
    let change = stampfs_proto::SetAttr {
        uid,
        gid,
        ..stampfs_proto::SetAttr::new(&args.path)
    };
    set_attr_tree(&client, change, args.recursive, true, "owner").await
}
