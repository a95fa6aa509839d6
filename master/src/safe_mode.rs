//! Safe mode, as HDFS's NameNode has it: a master that just started (or just took
//! the lead of its group) knows the namespace and the chunks, but not yet where the
//! replicas are. Until enough of them have been reported it orders no replica
//! deletions (stale, surplus, short, corrupt, orphans) and no re-replication: a
//! decision made on half the reports would copy chunks whose other replicas are about
//! to report, or drop replicas it cannot yet count. Writes, reads, namespace changes
//! and the deletion of removed files' replicas go on as usual.
//!
//! **Leaving it on its own** (*automatic* safe mode): after each whole health pass,
//! once at least [`Threshold::ppm`] of the chunks examined have a live replica at the
//! master's version (every chunk, with none at all), and then once the threshold has
//! held for the extension (`--safemode-extension`, so that the rest of the reports
//! arrive: a chunk with one replica reported of three is reported, not healthy). A
//! chunk whose every replica is gone keeps the master in safe mode, as in HDFS: an
//! operator looks (`stampfs fsck`) and leaves it by hand.
//!
//! **By hand** (`stampfs admin safemode enter|leave|get|wait`): `enter` turns it on
//! until `leave` (it never ends on its own); `leave` ends either kind at once.
//! Safe mode is soft state: a restart, or a new leader, starts in automatic safe mode.

use stampfs_proto::SafeModeStatus;

/// When automatic safe mode may end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threshold {
    /// Chunks with a replica reported, in parts per million of the chunks examined.
    pub ppm: u32,
    /// How long the threshold must hold before safe mode ends.
    pub extension_ms: u64,
}

/// Safe mode's state (see the module doc). Off until [`SafeMode::enter_auto`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SafeMode {
    /// On until the threshold holds for the extension.
    auto: bool,
    /// On until an operator says `leave`.
    manual: bool,
    /// When the threshold was first found met in this automatic safe mode.
    met_since_ms: Option<u64>,
    /// What the last whole pass found: chunks examined, and with a replica reported.
    chunks: u64,
    reported: u64,
    /// A whole pass ran since automatic safe mode was entered (until then `chunks`
    /// and `reported` say nothing).
    passed: bool,
    /// The leadership the automatic safe mode was entered for (`None`: a master
    /// without a group, or none yet).
    lead: Option<u64>,
}

/// What [`SafeMode::after_pass`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Nothing changed.
    Stay,
    /// The threshold is met: safe mode ends once the extension has passed.
    Met,
    /// Automatic safe mode ended.
    Left,
}

impl SafeMode {
    /// Whether replica deletions and copies wait.
    pub fn is_on(&self) -> bool {
        self.auto || self.manual
    }

    /// Turns automatic safe mode on (a master's start, or a new lead `lead`).
    pub fn enter_auto(&mut self, lead: Option<u64>) {
        self.auto = true;
        self.met_since_ms = None;
        self.chunks = 0;
        self.reported = 0;
        self.passed = false;
        self.lead = lead;
    }

    /// Whether the master leads under another lead than the one safe mode was
    /// entered for (so it must start over).
    pub fn new_lead(&self, lead: Option<u64>) -> bool {
        lead.is_some() && lead != self.lead
    }

    /// `stampfs admin safemode enter`.
    pub fn enter_manual(&mut self) {
        self.manual = true;
    }

    /// `stampfs admin safemode leave`: both kinds end.
    pub fn leave(&mut self) {
        self.auto = false;
        self.manual = false;
        self.met_since_ms = None;
    }

    /// A whole health pass examined `chunks` chunks, `reported` of them with a live
    /// replica at the master's version. Pure in its inputs.
    pub fn after_pass(
        &mut self,
        chunks: u64,
        reported: u64,
        now_ms: u64,
        t: Threshold,
    ) -> Transition {
        self.chunks = chunks;
        self.reported = reported;
        self.passed = true;
        if !self.auto {
            return Transition::Stay;
        }
        if !met(chunks, reported, t.ppm) {
            self.met_since_ms = None;
            return Transition::Stay;
        }
        // Nothing to wait for with no chunks at all.
        let since = *self.met_since_ms.get_or_insert(now_ms);
        if chunks == 0 || now_ms.saturating_sub(since) >= t.extension_ms {
            self.auto = false;
            self.met_since_ms = None;
            return Transition::Left;
        }
        Transition::Met
    }

    /// For `admin safemode get` and the report.
    pub fn status(&self, t: Threshold, now_ms: u64) -> SafeModeStatus {
        let left_ms = match self.met_since_ms {
            Some(since) if self.auto => {
                Some(t.extension_ms.saturating_sub(now_ms.saturating_sub(since)))
            }
            _ => None,
        };
        SafeModeStatus {
            on: self.is_on(),
            manual: self.manual,
            chunks: self.chunks,
            reported: self.reported,
            threshold_ppm: t.ppm,
            extension_left_ms: left_ms,
            first_pass_pending: self.auto && !self.passed,
        }
    }
}

/// Whether `reported` of `chunks` reaches `ppm` parts per million.
fn met(chunks: u64, reported: u64, ppm: u32) -> bool {
    u128::from(reported) * 1_000_000 >= u128::from(chunks) * u128::from(ppm)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Threshold = Threshold {
        ppm: 999_000,
        extension_ms: 5_000,
    };

    #[test]
    fn automatic_safe_mode_ends_once_the_threshold_held_for_the_extension() {
        let mut s = SafeMode::default();
        assert!(!s.is_on(), "off until a master enters it");
        s.enter_auto(None);
        assert!(s.is_on());
        let first = s.status(T, 0);
        assert!(first.first_pass_pending, "no pass yet: nothing counted");
        assert!(
            first.describe().contains("waiting for the first"),
            "{}",
            first.describe()
        );
        assert_eq!(s.after_pass(1000, 500, 0, T), Transition::Stay);
        assert!(!s.status(T, 0).first_pass_pending);
        assert!(s.status(T, 0).describe().contains("500 of 1000"));
        assert_eq!(s.after_pass(1000, 999, 1_000, T), Transition::Met);
        assert_eq!(s.status(T, 2_000).extension_left_ms, Some(4_000));
        // A pass below the threshold starts the extension over.
        assert_eq!(s.after_pass(1000, 998, 3_000, T), Transition::Stay);
        assert_eq!(s.after_pass(1000, 1000, 4_000, T), Transition::Met);
        assert_eq!(s.after_pass(1000, 1000, 8_999, T), Transition::Met);
        assert_eq!(s.after_pass(1000, 1000, 9_000, T), Transition::Left);
        assert!(!s.is_on());
        assert_eq!(
            s.after_pass(1000, 0, 10_000, T),
            Transition::Stay,
            "stays off"
        );
    }

    #[test]
    fn no_chunks_means_nothing_to_wait_for_and_a_lost_chunk_keeps_it_on() {
        let mut s = SafeMode::default();
        s.enter_auto(None);
        assert_eq!(s.after_pass(0, 0, 0, T), Transition::Left);
        s.enter_auto(None);
        // One chunk of 100 with no replica anywhere: 99% < 99.9%.
        for now in [0, 10_000, 100_000] {
            assert_eq!(s.after_pass(100, 99, now, T), Transition::Stay);
        }
        assert!(s.is_on());
        s.leave();
        assert!(!s.is_on(), "an operator ends it");
    }

    #[test]
    fn manual_safe_mode_only_ends_by_hand_and_a_new_lead_starts_over() {
        let mut s = SafeMode::default();
        s.enter_manual();
        assert_eq!(s.after_pass(10, 10, 0, T), Transition::Stay);
        assert_eq!(s.after_pass(10, 10, 60_000, T), Transition::Stay);
        assert!(s.is_on() && s.status(T, 0).manual);
        s.leave();
        assert!(!s.is_on());
        s.enter_auto(Some(7));
        assert!(!s.new_lead(Some(7)) && s.new_lead(Some(9)) && !s.new_lead(None));
    }
}
