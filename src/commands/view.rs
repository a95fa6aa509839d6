//! Commands that look at the file system, with `hdfs dfs`'s names: `df` (the cluster's
//! space), `tail [-f]` (a file's last kilobyte, then what is appended to it) and
//! `ls -R` (a recursive listing).
//!
//! - `df` asks the master for its [`ClusterReport`] (what `stampfs admin report` and a
//!   mount's `statfs` show) and adds up the capacity and used bytes of the live
//!   chunkservers: raw space, where every replica counts ([`Space`]).
//! - `tail -f` polls, as HDFS's does: every `--sleep-interval` (1 s) it asks for the
//!   file's readable length (for a file being written, what every replica of its
//!   writer's pipeline holds) and prints the bytes past what it printed. The file's
//!   removal (or a new file in its place) ends it with an error; Ctrl-C, SIGTERM and
//!   a closed stdout end it quietly.
//! - `ls -R` walks the tree depth first in name order ([`Walk`]); a directory that
//!   cannot be listed when its turn comes (removed meanwhile) is reported and skipped.

use super::{connect, entry_json, entry_line, output_error, EntryJson, StdoutClosed};
use crate::cli::{DfArgs, LsArgs, TailArgs};
use anyhow::{Context, Result};
use stampfs_client::{Client, FileReader};
use stampfs_proto::units::format_size;
use stampfs_proto::{ChunkserverState, ClusterReport, FileKind, FileStatus, InodeId, RemoteError};
use std::time::Duration;

/// Bytes `tail` prints first (as `hdfs dfs -tail`).
pub const TAIL_BYTES: u64 = 1024;
/// Bytes `tail -f` reads per request as it catches up.
const FOLLOW_READ: u64 = 1 << 20;

// ---------------------------------------------------------------------------------
// df

/// The cluster's raw space over its live chunkservers, as the mount's `statfs` counts
/// it: a dead chunkserver counts for nothing, and every replica is used space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    pub size: u64,
    pub used: u64,
}

impl Space {
    /// Sums `(state, capacity, used)` of each chunkserver (saturating).
    pub fn sum(chunkservers: impl IntoIterator<Item = (ChunkserverState, u64, u64)>) -> Space {
        chunkservers
            .into_iter()
            .filter(|(state, _, _)| *state == ChunkserverState::Live)
            .fold(Space::default(), |acc, (_, capacity, used)| Space {
                size: acc.size.saturating_add(capacity),
                used: acc.used.saturating_add(used),
            })
    }

    /// What a cluster report says.
    pub fn of(report: &ClusterReport) -> Space {
        Space::sum(
            report
                .chunkservers
                .iter()
                .map(|c| (c.state, c.capacity, c.used)),
        )
    }

    /// Bytes not used; zero when the chunkservers report more used than capacity.
    pub fn available(&self) -> u64 {
        self.size.saturating_sub(self.used)
    }

    /// Used space in percent of the size, rounded up (as df(1): a cluster that holds
    /// anything is never shown 0% used); `None` without any capacity.
    pub fn use_percent(&self) -> Option<u64> {
        if self.size == 0 {
            return None;
        }
        let pct = (u128::from(self.used) * 100).div_ceil(u128::from(self.size));
        Some(u64::try_from(pct).unwrap_or(u64::MAX))
    }
}

/// The lines `df` prints: a header and one row, columns right-aligned under it (the
/// first, the file system's name, left-aligned).
fn df_text(filesystem: &str, space: Space, human: bool) -> String {
    let size = |n: u64| {
        if human {
            format_size(n)
        } else {
            n.to_string()
        }
    };
    let header = ["Filesystem", "Size", "Used", "Available", "Use%"];
    let row = [
        filesystem.to_string(),
        size(space.size),
        size(space.used),
        size(space.available()),
        space
            .use_percent()
            .map_or_else(|| "-".to_string(), |p| format!("{p}%")),
    ];
    let width: Vec<usize> = header
        .iter()
        .zip(&row)
        .map(|(h, r)| h.len().max(r.len()))
        .collect();
    let line = |cells: [&str; 5]| {
        let mut out = format!("{:<w$}", cells[0], w = width[0]);
        for (cell, w) in cells.iter().zip(&width).skip(1) {
            out += &format!("  {cell:>w$}");
        }
        out
    };
    format!(
        "{}\n{}\n",
        line(header),
        line([&row[0], &row[1], &row[2], &row[3], &row[4]])
    )
}

/// `df`: the capacity, used and available space of the cluster (PATH must exist).
pub async fn df(args: DfArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    client
        .stat(&args.path)
        .await
        .with_context(|| format!("cannot stat {}", args.path))?;
    let report = client
        .cluster_report()
        .await
        .context("cannot get the chunkservers' space from the master")?;
    let text = df_text(
        &format!("stampfs://{}", args.master.master),
        Space::of(&report),
        args.human,
    );
    write_out(text.as_bytes())
}

// ---------------------------------------------------------------------------------
// tail

/// Writes `bytes` to stdout now (no line buffering: `tail -f` shows a partial line as
/// soon as it is there).
fn write_out(bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(bytes).map_err(output_error)?;
    out.flush().map_err(output_error)
}

/// Whether the reader of stdout went away (a pipe whose other end is closed), asked
/// without writing: `tail -f` on a file that does not grow writes nothing that would
/// fail, yet ends when its reader does (as GNU tail does).
fn stdout_closed() -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let out = std::io::stdout();
    let mut fds = [PollFd::new(&out, PollFlags::empty())];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&now)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP)
}

/// Writes `[from, to)` of the file `reader` reads, in pieces; returns where it ended
/// (before `to` only when the file turned out shorter).
async fn copy_range(reader: &FileReader, path: &str, from: u64, to: u64) -> Result<u64> {
    let mut at = from;
    while at < to {
        let want = (to - at).min(FOLLOW_READ) as usize;
        let piece = reader
            .read_at(at, want)
            .await
            .with_context(|| format!("cannot read {path}"))?;
        if piece.is_empty() {
            break;
        }
        write_out(&piece)?;
        at += piece.len() as u64;
    }
    Ok(at)
}

fn is_not_found(e: &stampfs_client::Error) -> bool {
    matches!(
        e,
        stampfs_client::Error::Remote(RemoteError::NotFound { .. })
    )
}

/// What `tail -f` does after a look at the file.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Print `[from, to)`.
    Print { from: u64, to: u64 },
    /// Nothing new.
    Wait,
    /// The file is shorter than what was printed: say so and go on from its new end.
    Truncated { to: u64 },
}

/// The decision of one look: `printed` bytes were printed, the file is `len` long now.
fn next_step(printed: u64, len: u64) -> Next {
    match len.cmp(&printed) {
        std::cmp::Ordering::Greater => Next::Print {
            from: printed,
            to: len,
        },
        std::cmp::Ordering::Equal => Next::Wait,
        std::cmp::Ordering::Less => Next::Truncated { to: len },
    }
}

/// `tail`: the last [`TAIL_BYTES`] of PATH; `-f`: then what is appended to it.
pub async fn tail(args: TailArgs) -> Result<()> {
    anyhow::ensure!(
        !args.sleep_interval.is_zero(),
        "--sleep-interval must be more than 0"
    );
    let client = connect(&args.master).await?;
    let st = client
        .stat(&args.path)
        .await
        .with_context(|| format!("cannot stat {}", args.path))?;
    match st.kind {
        FileKind::File => {}
        FileKind::Directory => anyhow::bail!("{}: is a directory", args.path),
        FileKind::Symlink => anyhow::bail!(
            "{}: is a symbolic link (stampfs does not follow links; tail its target)",
            args.path
        ),
    }
    // Ctrl-C and SIGTERM end `-f` quietly: its handlers are in place before anything
    // is printed, so a signal sent once output appears never finds the default action.
    let signals = if args.follow {
        use tokio::signal::unix::{signal, SignalKind};
        Some((
            signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        ))
    } else {
        None
    };
    let reader = client
        .open(&args.path)
        .await
        .with_context(|| format!("cannot open {}", args.path))?;
    let len = reader.len();
    let printed = copy_range(&reader, &args.path, len.saturating_sub(TAIL_BYTES), len).await?;
    drop(reader);
    let Some((mut int, mut term)) = signals else {
        return Ok(());
    };
    tokio::select! {
        r = follow(&client, &args.path, st.inode, printed, args.sleep_interval) => r,
        _ = int.recv() => Ok(()),
        _ = term.recv() => Ok(()),
    }
}

/// `tail -f` after the first print: runs until the file goes away (an error) or stdout
/// closes.
async fn follow(
    client: &Client,
    path: &str,
    inode: InodeId,
    mut printed: u64,
    every: Duration,
) -> Result<()> {
    let gone = |e: stampfs_client::Error| -> anyhow::Error {
        if is_not_found(&e) {
            anyhow::anyhow!("{path} was removed (or renamed away) while it was followed")
        } else {
            anyhow::Error::new(e).context(format!("cannot follow {path}"))
        }
    };
    loop {
        tokio::time::sleep(every).await;
        if stdout_closed() {
            return Err(anyhow::Error::new(StdoutClosed));
        }
        let st = client.stat(path).await.map_err(gone)?;
        anyhow::ensure!(
            st.inode == inode,
            "{path} was replaced (removed, and another entry made under its name) while it was followed"
        );
        let len = client.visible_length(path).await.map_err(gone)?;
        match next_step(printed, len) {
            Next::Wait => {}
            Next::Truncated { to } => {
                eprintln!("stampfs: tail: {path}: file truncated; following from its new end");
                printed = to;
            }
            Next::Print { .. } => {
                // Opened now: its length may have grown past `len` since; print up to
                // what it can read.
                let reader = client.open(path).await.map_err(gone)?;
                let to = reader.len();
                printed = copy_range(&reader, path, printed, to).await?;
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// ls -R

/// Whatever lists a directory (the client; a fake tree in the tests).
pub trait Lister {
    /// A directory's entries, or a file's (or link's) own status.
    fn list(
        &self,
        path: &str,
    ) -> impl std::future::Future<Output = stampfs_client::Result<Vec<FileStatus>>> + Send;
}

impl Lister for Client {
    async fn list(&self, path: &str) -> stampfs_client::Result<Vec<FileStatus>> {
        Client::list(self, path).await
    }
}

/// What a [`Walk`] meets, in order.
#[derive(Debug)]
pub enum Met {
    Entry(FileStatus),
    /// A directory whose entries are skipped: it could not be listed when its turn
    /// came.
    Skipped {
        path: String,
        why: Skip,
    },
}

/// Why a directory's entries were skipped.
#[derive(Debug)]
pub enum Skip {
    /// It was removed (or renamed away) after its parent was listed.
    Vanished,
    /// Something else took its name, and is not a directory.
    NoLongerADirectory,
    /// Listing it failed.
    Failed(stampfs_client::Error),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::Vanished => f.write_str("removed during the listing"),
            Skip::NoLongerADirectory => f.write_str("no longer a directory"),
            Skip::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// A recursive listing: the entries below a path, depth first (each directory
/// followed by its own entries), in name order within each directory. It holds the
/// entries not yet visited of each directory on the way down, nothing more.
pub struct Walk {
    /// The entries of each directory on the way down still to visit, deepest last.
    stack: Vec<std::vec::IntoIter<FileStatus>>,
    /// The directory last met, listed at the next step.
    descend: Option<String>,
}

fn by_name(mut entries: Vec<FileStatus>) -> std::vec::IntoIter<FileStatus> {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries.into_iter()
}

impl Walk {
    /// Lists `path` (an error when it cannot: nothing was walked yet). A file's walk
    /// meets the file alone.
    pub async fn start(lister: &impl Lister, path: &str) -> stampfs_client::Result<Walk> {
        let entries = lister.list(path).await?;
        Ok(Walk {
            stack: vec![by_name(entries)],
            descend: None,
        })
    }

    /// The next entry, or a directory skipped; `None` at the end.
    pub async fn next(&mut self, lister: &impl Lister) -> Option<Met> {
        if let Some(dir) = self.descend.take() {
            match lister.list(&dir).await {
                // Listing a file (or link) answers with the entry itself.
                Ok(entries)
                    if entries
                        .iter()
                        .any(|e| e.path == dir && e.kind != FileKind::Directory) =>
                {
                    return Some(Met::Skipped {
                        path: dir,
                        why: Skip::NoLongerADirectory,
                    })
                }
                Ok(entries) => self.stack.push(by_name(entries)),
                Err(e) => {
                    let why = if is_not_found(&e) {
                        Skip::Vanished
                    } else {
                        Skip::Failed(e)
                    };
                    return Some(Met::Skipped { path: dir, why });
                }
            }
        }
        loop {
            let top = self.stack.last_mut()?;
            match top.next() {
                Some(e) => {
                    if e.kind == FileKind::Directory {
                        self.descend = Some(e.path.clone());
                    }
                    return Some(Met::Entry(e));
                }
                None => {
                    self.stack.pop();
                }
            }
        }
    }
}

/// `ls -R`: every entry below PATH by its full path (with `-l`, `--json` as `ls`).
/// Directories that cannot be listed when their turn comes are named on stderr and
/// skipped; the walk goes on and then fails, saying how many there were.
pub async fn ls_recursive(args: LsArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let mut walk = Walk::start(&client, &args.path)
        .await
        .with_context(|| format!("cannot list {}", args.path))?;
    let mut json: Vec<FileStatus> = Vec::new();
    let mut skipped = 0usize;
    while let Some(met) = walk.next(&client).await {
        match met {
            Met::Entry(e) if args.json => json.push(e),
            Met::Entry(e) => {
                let line = entry_line(&client, &e, args.long, &e.path).await;
                outln!("{line}");
            }
            Met::Skipped { path, why } => {
                eprintln!("stampfs: ls: cannot list {path}: {why}; skipped");
                skipped += 1;
            }
        }
    }
    if args.json {
        let out: Vec<EntryJson> = json.iter().map(entry_json).collect();
        outln!("{}", serde_json::to_string_pretty(&out)?);
    }
    anyhow::ensure!(
        skipped == 0,
        "the listing of {} is incomplete: {skipped} {} could not be listed (named above)",
        args.path,
        if skipped == 1 {
            "directory"
        } else {
            "directories"
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    #[test]
    fn space_counts_live_chunkservers_only() {
        let s = Space::sum([
            (ChunkserverState::Live, 1000, 100),
            (ChunkserverState::Dead, 5000, 4000),
            (ChunkserverState::Live, 1000, 250),
        ]);
        assert_eq!(
            s,
            Space {
                size: 2000,
                used: 350
            }
        );
        assert_eq!(s.available(), 1650);
        assert_eq!(s.use_percent(), Some(18), "17.5% rounds up");
    }

    #[test]
    fn space_with_more_used_than_size_has_none_available() {
        let s = Space::sum([(ChunkserverState::Live, 100, 150)]);
        assert_eq!(s.available(), 0);
        assert_eq!(s.use_percent(), Some(150));
    }

    #[test]
    fn space_without_capacity_has_no_percentage() {
        assert_eq!(Space::default().use_percent(), None);
        assert_eq!(
            Space::sum([(ChunkserverState::Live, u64::MAX, u64::MAX)]).use_percent(),
            Some(100),
            "no overflow"
        );
    }

    #[test]
    fn df_prints_hdfs_columns_aligned() {
        let space = Space {
            size: 3 << 30,
            used: 3 << 20,
        };
        let text = df_text("stampfs://m:1", space, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["Filesystem", "Size", "Used", "Available", "Use%"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["stampfs://m:1", "3221225472", "3145728", "3218079744", "1%"]
        );
        assert_eq!(lines[0].len(), lines[1].len(), "{text}");
        assert!(df_text("x", space, true).contains("3.0 GiB"));
        assert!(df_text("x", Space::default(), false).ends_with("-\n"));
    }

    #[test]
    fn tail_follow_prints_what_grew_waits_and_notes_a_truncation() {
        assert_eq!(next_step(10, 25), Next::Print { from: 10, to: 25 });
        assert_eq!(next_step(25, 25), Next::Wait);
        assert_eq!(next_step(25, 4), Next::Truncated { to: 4 });
    }

    /// A namespace of paths; `vanish` removes a directory the first time it is asked
    /// for, as if removed between its parent's listing and its own.
    struct Fake {
        entries: BTreeMap<String, FileKind>,
        vanish: Mutex<Option<String>>,
    }

    fn status(path: &str, kind: FileKind) -> FileStatus {
        FileStatus {
            path: path.to_string(),
            inode: InodeId(2),
            kind,
            length: 0,
            replication: 3,
            chunk_size: 1 << 20,
            state: stampfs_proto::FileState::Closed,
            attr: stampfs_proto::Attr::default(),
        }
    }

    impl Fake {
        fn new(dirs: &[&str], files: &[&str]) -> Fake {
            let mut entries = BTreeMap::new();
            entries.insert("/".to_string(), FileKind::Directory);
            for d in dirs {
                entries.insert(d.to_string(), FileKind::Directory);
            }
            for f in files {
                entries.insert(f.to_string(), FileKind::File);
            }
            Fake {
                entries,
                vanish: Mutex::new(None),
            }
        }
    }

    impl Lister for Fake {
        async fn list(&self, path: &str) -> stampfs_client::Result<Vec<FileStatus>> {
            let vanished = self.vanish.lock().expect("lock").as_deref() == Some(path);
            let not_found = || {
                stampfs_client::Error::Remote(RemoteError::NotFound {
                    what: path.to_string(),
                })
            };
            let kind = match self.entries.get(path) {
                Some(k) if !vanished => *k,
                _ => return Err(not_found()),
            };
            if kind != FileKind::Directory {
                return Ok(vec![status(path, kind)]);
            }
            let prefix = if path == "/" {
                "/".to_string()
            } else {
                format!("{path}/")
            };
            // Reversed: the walk must not count on the lister's order.
            Ok(self
                .entries
                .iter()
                .rev()
                .filter(|(p, _)| {
                    p.strip_prefix(&prefix)
                        .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
                })
                .map(|(p, k)| status(p, *k))
                .collect())
        }
    }

    fn walk_all(lister: &impl Lister, root: &str) -> Vec<String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut walk = Walk::start(lister, root).await.expect("root lists");
            let mut out = Vec::new();
            while let Some(met) = walk.next(lister).await {
                out.push(match met {
                    Met::Entry(e) => e.path,
                    Met::Skipped { path, why } => format!("skipped {path}: {why}"),
                });
            }
            out
        })
    }

    #[test]
    fn walk_goes_depth_first_in_name_order() {
        let fake = Fake::new(
            &["/a", "/a/b", "/a/b/c", "/z"],
            &["/a/b/c/f", "/a/b/g", "/a/f", "/a/a", "/z/y", "/m"],
        );
        assert_eq!(
            walk_all(&fake, "/"),
            ["/a", "/a/a", "/a/b", "/a/b/c", "/a/b/c/f", "/a/b/g", "/a/f", "/m", "/z", "/z/y"]
        );
        assert_eq!(walk_all(&fake, "/a/b"), ["/a/b/c", "/a/b/c/f", "/a/b/g"]);
    }

    #[test]
    fn walk_of_a_file_meets_the_file_alone() {
        let fake = Fake::new(&["/a"], &["/a/f"]);
        assert_eq!(walk_all(&fake, "/a/f"), ["/a/f"]);
    }

    #[test]
    fn walk_skips_a_directory_that_vanished_and_goes_on() {
        let fake = Fake::new(&["/a", "/a/gone", "/b"], &["/a/gone/f", "/a/h", "/b/i"]);
        *fake.vanish.lock().expect("lock") = Some("/a/gone".into());
        assert_eq!(
            walk_all(&fake, "/"),
            [
                "/a",
                "/a/gone",
                "skipped /a/gone: removed during the listing",
                "/a/h",
                "/b",
                "/b/i"
            ]
        );
    }

    #[test]
    fn walk_skips_a_directory_replaced_by_a_file() {
        struct Swap(Fake);
        impl Lister for Swap {
            async fn list(&self, path: &str) -> stampfs_client::Result<Vec<FileStatus>> {
                if path == "/d" {
                    return Ok(vec![status("/d", FileKind::File)]);
                }
                self.0.list(path).await
            }
        }
        let swap = Swap(Fake::new(&["/d"], &["/d/f", "/e"]));
        assert_eq!(
            walk_all(&swap, "/"),
            ["/d", "skipped /d: no longer a directory", "/e"]
        );
    }
}
