//! [`ReadWatch`]: keeps each reader's last read of every append file and saves the
//! bytes of two reads that contradict each other, so a dirty read can be explained.
//!
//! The checker judges a read by its length and digest against the final file, which
//! says *that* a reader saw other bytes, not *which*. Two reads of one append file are
//! always one a prefix of the other when stampfs keeps its promises (bytes are only
//! added at the end, and a reader is only shown bytes that recovery keeps), so a pair
//! that is not is saved whole next to the history: `diverged-c<client>-<nonce>-f<file>-<n>-{earlier,later}.bin`.
//! The run's directory is kept when the checker finds the dirty read.

use std::collections::HashMap;
use std::path::PathBuf;

/// How many contradicting pairs one client process saves at most.
const MAX_SAVED: u32 = 8;

/// One reader's memory of what it read last, per file.
pub struct ReadWatch {
    dir: PathBuf,
    prefix: String,
    last: HashMap<u32, Vec<u8>>,
    saved: u32,
}

impl ReadWatch {
    /// A watch saving into `dir` (the history directory), naming files after the client.
    pub fn new(dir: PathBuf, client: u32, nonce: u64) -> Self {
        Self {
            dir,
            prefix: format!("diverged-c{client}-{nonce}"),
            last: HashMap::new(),
            saved: 0,
        }
    }

    /// Records a read of `file`; saves it with the one before when neither is a
    /// prefix of the other. Returns whether they contradicted each other.
    pub fn observe(&mut self, file: u32, bytes: &[u8]) -> bool {
        let diverged = self
            .last
            .get(&file)
            .is_some_and(|before| !prefix_related(before, bytes));
        if diverged {
            let at = first_difference(&self.last[&file], bytes);
            tracing::error!(
                file,
                earlier = self.last[&file].len(),
                later = bytes.len(),
                first_difference = at,
                "two reads of an append file contradict each other"
            );
            if self.saved < MAX_SAVED {
                self.saved += 1;
                let n = self.saved;
                for (name, data) in [("earlier", &self.last[&file][..]), ("later", bytes)] {
                    let path = self
                        .dir
                        .join(format!("{}-f{file}-{n}-{name}.bin", self.prefix));
                    if let Err(e) = std::fs::write(&path, data) {
                        tracing::warn!(path = %path.display(), error = %e, "cannot save a read");
                    }
                }
            }
        }
        self.last.insert(file, bytes.to_vec());
        diverged
    }
}

/// Whether one of `a` and `b` is a prefix of the other.
fn prefix_related(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// The first offset where `a` and `b` differ (the shorter length when one is a
/// prefix of the other).
fn first_difference(a: &[u8], b: &[u8]) -> usize {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_and_shrinking_reads_are_consistent_but_other_bytes_are_saved() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = ReadWatch::new(dir.path().to_path_buf(), 2, 7);
        assert!(!w.observe(0, b"abc"));
        assert!(!w.observe(0, b"abcdef"));
        assert!(!w.observe(0, b"ab"), "a shorter read is a prefix");
        assert!(!w.observe(1, b"xyz"), "another file has its own memory");
        assert!(w.observe(0, b"aXc"));
        let earlier = dir.path().join("diverged-c2-7-f0-1-earlier.bin");
        let later = dir.path().join("diverged-c2-7-f0-1-later.bin");
        assert_eq!(std::fs::read(earlier).expect("saved"), b"ab");
        assert_eq!(std::fs::read(later).expect("saved"), b"aXc");
        assert_eq!(first_difference(b"ab", b"aXc"), 1);
    }
}
