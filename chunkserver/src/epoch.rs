//! The master epoch fence: the highest master epoch this chunkserver has seen on a
//! command, kept in `DIR/master-epoch` (`TERM LEADER\n`, replaced atomically and
//! durably before the command that raised it is applied). A command signed under a
//! lower epoch comes from a master group's deposed leader (one that was paused or cut
//! off while another was elected) and is refused, whatever its session says. Masters
//! that keep an operation log sign under `(0, 0)`, which never raises the fence.

use crate::error::{Error, Result};
use crate::store::replace_file;
use stampfs_proto::MasterEpoch;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file the highest epoch is kept in.
pub const EPOCH_FILE: &str = "master-epoch";

/// The highest epoch seen, and where it is kept.
#[derive(Debug)]
pub struct EpochFence {
    path: PathBuf,
    highest: Mutex<MasterEpoch>,
}

impl EpochFence {
    /// Reads `dir/master-epoch` (none: `(0, 0)`); a file that does not hold an epoch
    /// is an error naming it (the fence must not silently drop to zero).
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(EPOCH_FILE);
        let highest = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text).ok_or_else(|| Error::Config {
                field: "dir",
                reason: format!(
                    "{} does not hold a master epoch (TERM LEADER)",
                    path.display()
                ),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => MasterEpoch::default(),
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        Ok(Self {
            path,
            highest: Mutex::new(highest),
        })
    }

    /// The highest epoch seen.
    pub fn highest(&self) -> MasterEpoch {
        *self.highest.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a command signed under `epoch`: refused below the highest seen; a higher
    /// one is made durable first.
    pub fn admit(&self, epoch: MasterEpoch) -> Result<()> {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if epoch < *highest {
            return Err(Error::CommandRefused {
                reason: format!(
                    "signed under master epoch {epoch}, below epoch {} that this chunkserver \
                     has seen: the master that signed it was deposed",
                    *highest
                ),
            });
        }
        if epoch > *highest {
            replace_file(
                &self.path,
                format!("{} {}\n", epoch.term, epoch.leader).as_bytes(),
            )?;
            tracing::info!(from = %*highest, to = %epoch, "a new master epoch: commands signed under older ones are refused from now on");
            *highest = epoch;
        }
        Ok(())
    }
}

fn parse(text: &str) -> Option<MasterEpoch> {
    let mut words = text.split_whitespace();
    let term = words.next()?.parse().ok()?;
    let leader = words.next()?.parse().ok()?;
    words
        .next()
        .is_none()
        .then_some(MasterEpoch { term, leader })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(term: u64, leader: u64) -> MasterEpoch {
        MasterEpoch { term, leader }
    }

    #[test]
    fn a_lower_epoch_is_refused_and_a_higher_one_raises_the_fence_durably() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fence = EpochFence::load(dir.path()).expect("load");
        assert_eq!(fence.highest(), e(0, 0));
        fence.admit(e(0, 0)).expect("an operation-log master");
        fence.admit(e(3, 2)).expect("a leader");
        fence.admit(e(3, 2)).expect("the same leader again");
        let refused = fence.admit(e(3, 1)).expect_err("same term, lower member");
        assert!(refused.to_string().contains("deposed"), "{refused}");
        assert!(fence.admit(e(2, 9)).is_err(), "an older term");
        assert!(
            fence.admit(e(0, 0)).is_err(),
            "an operation-log master after a group"
        );
        fence.admit(e(4, 1)).expect("a newer term");
        // Kept across a restart.
        let again = EpochFence::load(dir.path()).expect("reload");
        assert_eq!(again.highest(), e(4, 1));
        assert!(again.admit(e(3, 2)).is_err());
    }

    #[test]
    fn a_damaged_epoch_file_is_an_error_not_a_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        for junk in ["", "7", "7 x", "1 2 3", "-1 2"] {
            std::fs::write(dir.path().join(EPOCH_FILE), junk).expect("write");
            let err = EpochFence::load(dir.path()).expect_err(junk);
            assert!(err.to_string().contains("master-epoch"), "{err}");
        }
    }
}
