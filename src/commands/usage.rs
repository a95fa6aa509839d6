//! Commands about what a tree holds, with `hdfs dfs`'s names: `du`, `count`, `test`,
//! `touchz`.

use super::connect;
use crate::cli::{CountArgs, DuArgs, TestArgs, TouchzArgs};
use crate::{EXIT_OK, EXIT_UNAVAILABLE};
use anyhow::{Context, Result};
use stampfs_client::{Client, CreateOptions};
use stampfs_proto::units::format_size;
use stampfs_proto::{FileKind, FileStatus};

/// What a tree holds: directories (itself included), files and links, and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub dirs: u64,
    pub files: u64,
    pub bytes: u64,
}

impl Usage {
    /// One entry, not what is below it.
    fn of(st: &FileStatus) -> Usage {
        match st.kind {
            FileKind::Directory => Usage {
                dirs: 1,
                ..Usage::default()
            },
            FileKind::File => Usage {
                files: 1,
                bytes: st.length,
                ..Usage::default()
            },
            // A link counts as an entry; its target is not followed.
            FileKind::Symlink => Usage {
                files: 1,
                ..Usage::default()
            },
        }
    }

    fn add(&mut self, o: Usage) {
        self.dirs += o.dirs;
        self.files += o.files;
        self.bytes += o.bytes;
    }
}

/// What the tree at `st` holds, walking its directories (links are not followed).
async fn usage(client: &Client, st: &FileStatus) -> Result<Usage> {
    let mut total = Usage::default();
    let mut todo = vec![st.clone()];
    while let Some(e) = todo.pop() {
        total.add(Usage::of(&e));
        if e.kind == FileKind::Directory {
            let below = client
                .list(&e.path)
                .await
                .with_context(|| format!("cannot list {}", e.path))?;
            todo.extend(below);
        }
    }
    Ok(total)
}

fn bytes(n: u64, human: bool) -> String {
    if human {
        format_size(n)
    } else {
        n.to_string()
    }
}

/// `du`: the bytes under each entry of PATH (a file: itself), or (`-s`) PATH's total.
pub async fn du(args: DuArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let st = client
        .stat(&args.path)
        .await
        .with_context(|| format!("cannot stat {}", args.path))?;
    let entries = if args.summary || st.kind != FileKind::Directory {
        vec![st]
    } else {
        client
            .list(&args.path)
            .await
            .with_context(|| format!("cannot list {}", args.path))?
    };
    for e in &entries {
        let u = usage(&client, e).await?;
        outln!("{:>12}  {}", bytes(u.bytes, args.human), e.path);
    }
    Ok(())
}

/// `count`: directories, files and bytes under PATH.
pub async fn count(args: CountArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let st = client
        .stat(&args.path)
        .await
        .with_context(|| format!("cannot stat {}", args.path))?;
    let quota = if args.quotas || args.quota_use {
        Some(
            client
                .quota(&st.path)
                .await
                .with_context(|| format!("cannot read the quota of {}", st.path))?,
        )
    } else {
        None
    };
    let quota_cols = quota
        .as_ref()
        .map(|q| format!("{} ", super::quota_columns(&q.names, &q.bytes, args.human)));
    if args.quota_use {
        if args.header {
            outln!("{} PATHNAME", super::quota::quota_header());
        }
        outln!("{}{}", quota_cols.unwrap_or_default(), st.path);
        return Ok(());
    }
    if args.header {
        let q = if args.quotas {
            format!("{} ", super::quota::quota_header())
        } else {
            String::new()
        };
        outln!(
            "{q}{:>12} {:>12} {:>14} PATHNAME",
            "DIR_COUNT",
            "FILE_COUNT",
            "CONTENT_SIZE"
        );
    }
    let u = usage(&client, &st).await?;
    outln!(
        "{}{:>12} {:>12} {:>14} {}",
        quota_cols.unwrap_or_default(),
        u.dirs,
        u.files,
        bytes(u.bytes, args.human),
        st.path
    );
    Ok(())
}

/// `test`: the exit status says (0 yes, 1 no); a failure to ask says why on stderr
/// and exits with 2, so that it is never taken for a "no".
pub async fn test(args: TestArgs) -> u8 {
    let answer = async {
        let client = connect(&args.master).await?;
        match client.stat(&args.path).await {
            Ok(st) => Ok(if args.directory {
                st.kind == FileKind::Directory
            } else if args.file {
                st.kind == FileKind::File
            } else if args.empty {
                st.kind == FileKind::File && st.length == 0
            } else {
                true
            }),
            Err(stampfs_client::Error::Remote(stampfs_proto::RemoteError::NotFound { .. })) => {
                Ok(false)
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!("cannot stat {}", args.path))),
        }
    };
    match answer.await {
        Ok(true) => EXIT_OK,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("stampfs: error: {e:#}");
            EXIT_UNAVAILABLE
        }
    }
}

/// `touchz`: an empty file at PATH; nothing when an empty file is there already.
pub async fn touchz(args: TouchzArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    match client.stat(&args.path).await {
        Ok(st) if st.kind == FileKind::File && st.length == 0 => return Ok(()),
        Ok(st) if st.kind == FileKind::File => {
            anyhow::bail!("{} exists and holds {} bytes", args.path, st.length)
        }
        Ok(_) => anyhow::bail!("{} exists and is not a file", args.path),
        Err(stampfs_client::Error::Remote(stampfs_proto::RemoteError::NotFound { .. })) => {}
        Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot stat {}", args.path))),
    }
    client
        .make_file(&args.path, CreateOptions::default())
        .await
        .with_context(|| format!("cannot create {}", args.path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_entries_and_file_bytes_only() {
        let st = |kind, length| FileStatus {
            path: "/x".into(),
            inode: stampfs_proto::InodeId(2),
            kind,
            length,
            replication: 3,
            chunk_size: 1 << 20,
            state: stampfs_proto::FileState::Closed,
            attr: stampfs_proto::Attr::default(),
        };
        let mut u = Usage::default();
        u.add(Usage::of(&st(FileKind::Directory, 0)));
        u.add(Usage::of(&st(FileKind::File, 100)));
        u.add(Usage::of(&st(FileKind::Symlink, 9)));
        assert_eq!(
            u,
            Usage {
                dirs: 1,
                files: 2,
                bytes: 100
            }
        );
        assert_eq!(bytes(1536, true), "1.5 KiB");
        assert_eq!(bytes(1536, false), "1536");
    }
}
