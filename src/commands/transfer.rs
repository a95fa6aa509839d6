//! Moving bytes in and out: `put`, `append`, `write`, `truncate`, `get`, `cat`, with
//! a progress bar on a terminal, and what a failed or refused transfer leaves behind.

use super::{arm_crash_points, connect, output_error};
use crate::cli::{AppendArgs, CatArgs, GetArgs, PutArgs, TruncateArgs, WriteArgs};
use anyhow::{Context, Result};
use stampfs_client::{Client, CreateOptions, FileWriter};
use stampfs_proto::FileKind;
use std::io::IsTerminal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt};

/// A progress bar on a terminal for transfers of at least 8 MiB; hidden otherwise.
fn progress(total: Option<u64>) -> indicatif::ProgressBar {
    let big = total.is_none_or(|t| t >= 8 << 20);
    if !std::io::stderr().is_terminal() || !big {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match total {
        Some(t) => indicatif::ProgressBar::new(t),
        None => indicatif::ProgressBar::new_spinner(),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bytes}/{total_bytes} {wide_bar} {binary_bytes_per_sec} {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Copies `input` into `writer`. When the input pauses (a pipe with nothing more to
/// read right now), what was read is hflushed so it is acknowledged everywhere.
async fn pump<R: AsyncRead + Unpin>(
    mut input: R,
    writer: &mut FileWriter,
    total: Option<u64>,
    flush_on_pause: bool,
) -> Result<u64> {
    let bar = progress(total);
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    loop {
        let n = input.read(&mut buf).await.context("reading the input")?;
        if n == 0 {
            break;
        }
        writer
            .write_all(&buf[..n])
            .await
            .map_err(stampfs_client::Error::from_io)?;
        copied += n as u64;
        bar.set_position(copied);
        if flush_on_pause && n < buf.len() {
            writer.hflush().await?;
        }
    }
    bar.finish_and_clear();
    Ok(copied)
}

async fn open_input(local: &str) -> Result<(Box<dyn AsyncRead + Unpin + Send>, Option<u64>, bool)> {
    if local == "-" {
        return Ok((Box::new(tokio::io::stdin()), None, true));
    }
    let f = tokio::fs::File::open(local)
        .await
        .with_context(|| format!("cannot open {local}"))?;
    let meta = f.metadata().await.ok();
    anyhow::ensure!(
        !meta.as_ref().is_some_and(|m| m.is_dir()),
        "{local} is a directory (stampfs copies one file at a time)"
    );
    let len = meta.map(|m| m.len());
    Ok((Box::new(f), len, false))
}

pub async fn put(args: PutArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let (input, total, is_pipe) = open_input(&args.local).await?;
    let opts = CreateOptions {
        replication: args.replication,
        chunk_size: args.chunk_size,
        overwrite: args.force,
        attr: None,
    };
    let mut writer = client
        .create(&args.remote, opts)
        .await
        .with_context(|| format!("cannot create {}", args.remote))?;
    if let Err(e) = pump(input, &mut writer, total, is_pipe).await {
        if quota_refused(&e) {
            drop(writer);
            return Err(remove_refused(&client, &args.remote, e).await);
        }
        // A failure of the storage (the writer fenced, a pipeline that cannot go on)
        // leaves the file to lease recovery: it may be another writer's by now, and
        // removing it by name would destroy that writer's data.
        if e.chain()
            .any(|c| c.downcast_ref::<stampfs_client::Error>().is_some())
        {
            return Err(e);
        }
        // The input failed: close what was written (this writer held the lease up to
        // here, so the file is ours) and remove it, leaving no open, partial file to
        // block a retry for a whole lease.
        if let Err(c) = writer.close().await {
            return Err(e.context(format!(
                "{} holds a part of the input and could not be closed ({c}): \
                 `stampfs recover` then `stampfs rm` it",
                args.remote
            )));
        }
        return match client.delete(&args.remote, false).await {
            Ok(()) => Err(e.context(format!("{} was not stored", args.remote))),
            Err(d) => Err(e.context(format!(
                "{} holds a part of the input and could not be removed ({d})",
                args.remote
            ))),
        };
    }
    if let Err(e) = writer.close().await {
        let e = anyhow::Error::from(e);
        if quota_refused(&e) {
            return Err(remove_refused(&client, &args.remote, e).await);
        }
        return Err(e);
    }
    Ok(())
}

/// Whether `e` is a quota's refusal: the master's answer to a writer that held its
/// lease (never a fencing), which has closed the file at what fit.
fn quota_refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<stampfs_client::Error>()
            .is_some_and(stampfs_client::Error::is_quota_exceeded)
    })
}

/// `put` refused by a quota: removes the partial file at `remote`, as `hdfs dfs -put`
/// does, and says so. Into the trash: the writer closed the file before the refusal
/// reached here, so in between another client may have appended to it.
async fn remove_refused(client: &Client, remote: &str, e: anyhow::Error) -> anyhow::Error {
    match client.delete(remote, false).await {
        Ok(()) => e.context(format!("{remote} was not stored")),
        Err(d) => e.context(format!(
            "{remote} holds a part of the input and could not be removed ({d})"
        )),
    }
}

pub async fn append(args: AppendArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let (input, total, is_pipe) = open_input(&args.local).await?;
    let mut writer = client
        .append(&args.remote)
        .await
        .with_context(|| format!("cannot append to {}", args.remote))?;
    pump(input, &mut writer, total, is_pipe).await?;
    writer.close().await?;
    Ok(())
}

pub async fn write(args: WriteArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let (input, total, is_pipe) = open_input(&args.local).await?;
    let mut writer = client
        .open_options()
        .write(true)
        .create(args.create)
        .open(&args.remote)
        .await
        .with_context(|| format!("cannot open {} for writing", args.remote))?;
    writer
        .seek(std::io::SeekFrom::Start(args.offset))
        .await
        .map_err(stampfs_client::Error::from_io)?;
    pump(input, &mut writer, total, is_pipe).await?;
    writer.close().await?;
    Ok(())
}

pub async fn truncate(args: TruncateArgs) -> Result<()> {
    anyhow::ensure!(arm_crash_points("truncate"), "bad crash point settings");
    let client = connect(&args.master).await?;
    let status = client.stat(&args.remote).await?;
    anyhow::ensure!(
        status.kind == FileKind::File,
        "{}: is a directory",
        args.remote
    );
    if status.length == args.size {
        return Ok(());
    }
    let mut writer = client
        .open_options()
        .write(true)
        .open(&args.remote)
        .await
        .with_context(|| format!("cannot open {} for writing", args.remote))?;
    writer.set_len(args.size).await?;
    writer.close().await?;
    Ok(())
}

async fn copy_out(client: &Client, remote: &str, mut out: impl AsyncWrite + Unpin) -> Result<()> {
    let mut reader = client
        .open(remote)
        .await
        .with_context(|| format!("cannot open {remote}"))?;
    let bar = progress(Some(reader.len()));
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(stampfs_client::Error::from_io)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).await.map_err(output_error)?;
        copied += n as u64;
        bar.set_position(copied);
    }
    out.flush().await.map_err(output_error)?;
    bar.finish_and_clear();
    anyhow::ensure!(
        copied >= reader.len(),
        "{remote}: read {copied} bytes but the file holds {}",
        reader.len()
    );
    Ok(())
}

pub async fn get(args: GetArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    if args.local == "-" {
        return copy_out(&client, &args.remote, tokio::io::stdout()).await;
    }
    let local = local_target(&args.local, &args.remote);
    if !args.force && tokio::fs::symlink_metadata(&local).await.is_ok() {
        anyhow::bail!("{} exists (-f replaces it)", local.display());
    }
    // Written next to its destination under a temporary name and renamed into place
    // whole: a failed get leaves neither a partial file nor a damaged old one.
    let mut name = local.file_name().unwrap_or_default().to_os_string();
    name.push(".stampfs-partial");
    let tmp = local.with_file_name(name);
    let file = tokio::fs::File::create(&tmp)
        .await
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut res = copy_out(&client, &args.remote, file).await;
    if res.is_ok() {
        res = tokio::fs::rename(&tmp, &local)
            .await
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), local.display()));
    }
    if res.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    res
}

/// Where `get REMOTE LOCAL` writes: LOCAL, or REMOTE's name inside LOCAL when that is
/// an existing directory (as `cp` does).
fn local_target(local: &str, remote: &str) -> std::path::PathBuf {
    let path = std::path::PathBuf::from(local);
    let name = remote.rsplit('/').find(|c| !c.is_empty());
    match name {
        Some(name) if path.is_dir() => path.join(name),
        _ => path,
    }
}

pub async fn cat(args: CatArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    copy_out(&client, &args.remote, tokio::io::stdout()).await
}
