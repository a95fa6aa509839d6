//! Process limits a server adjusts at start-up.
//!
//! Many systems start services with a soft limit of 1024 open descriptors and a much
//! higher hard limit. A chunkserver holds descriptors for replica files and sockets, a
//! master for client and chunkserver connections: both raise the soft limit to the hard
//! one at start ([`raise_open_files`]) and log both, so the soft default is never what
//! they run out of.

/// The open-file limits before and after [`raise_open_files`] (`None`: unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit the process started with.
    pub was: Option<u64>,
    /// The soft limit now.
    pub soft: Option<u64>,
    /// The hard limit.
    pub hard: Option<u64>,
}

/// Asked for when the hard limit is unlimited (Linux refuses an unlimited soft limit
/// for descriptors; its default ceiling, `fs.nr_open`, is 2^20).
pub const UNLIMITED_WANT: u64 = 1 << 20;

/// The soft limit to ask for: the hard one, unless the soft one is already at least
/// as high. `None` is unlimited.
pub fn wanted_soft(soft: Option<u64>, hard: Option<u64>) -> Option<u64> {
    match (soft, hard) {
        (None, _) => None,
        (Some(s), None) => Some(s.max(UNLIMITED_WANT)),
        (Some(s), Some(h)) => Some(s.max(h)),
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. A refusal leaves the soft limit
/// as it was (the result says which).
pub fn raise_open_files() -> OpenFiles {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let want = wanted_soft(before.current, before.maximum);
    if want != before.current {
        // Refused (a container that caps it): keep going with what we have.
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: want,
                maximum: before.maximum,
            },
        );
    }
    let after = getrlimit(Resource::Nofile);
    OpenFiles {
        was: before.current,
        soft: after.current,
        hard: after.maximum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_goes_up_to_the_hard_one_and_never_down() {
        assert_eq!(wanted_soft(Some(1024), Some(524_288)), Some(524_288));
        assert_eq!(wanted_soft(Some(4096), Some(4096)), Some(4096));
        assert_eq!(
            wanted_soft(Some(1024), None),
            Some(UNLIMITED_WANT),
            "unlimited hard"
        );
        assert_eq!(wanted_soft(None, None), None);
    }

    #[test]
    fn raising_never_lowers_the_soft_limit() {
        let l = raise_open_files();
        assert!(l.soft.is_none() || l.soft >= l.was, "{l:?}");
        if l.hard.is_some() {
            assert_eq!(l.soft, wanted_soft(l.was, l.hard), "{l:?}");
        }
    }
}
