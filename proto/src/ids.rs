//! Identifier newtypes shared by every stampfs process.
//!
//! They are plain integers on the wire; the newtypes keep a chunk handle from being
//! passed where a version is expected. [`ChunkVersion`] is ordered: it is the fencing
//! token's payload and only ever grows.

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $fmt:literal) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord,
            Encode, Decode, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.0)
            }
        }

        impl From<u64> for $name {
            fn from(v: u64) -> Self {
                Self(v)
            }
        }
    };
}

id_type!(
    /// A chunk's cluster-wide identity, minted by the master, never reused.
    /// Displayed as 16 hex digits, which is also its replica file name.
    ChunkHandle,
    "{:016x}"
);
id_type!(
    /// The chunk version (generation stamp): the fencing token. Strictly increasing per
    /// chunk; every new write lease on a chunk gets a new, higher one.
    ChunkVersion,
    "{}"
);
id_type!(
    /// A chunkserver's identity, assigned by the master at first registration and
    /// persisted in the chunkserver's data directory.
    ChunkserverId,
    "cs{}"
);
id_type!(
    /// A client session's identity; file write leases are held by a client id.
    ClientId,
    "client-{:x}"
);
id_type!(
    /// A namespace entry (file or directory) in the master.
    InodeId,
    "ino{}"
);

impl ChunkVersion {
    /// The version after this one.
    #[must_use]
    pub fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl ClientId {
    /// The id the master signs its own tokens with (replication, recovery).
    pub const MASTER: ClientId = ClientId(0);

    /// A fresh random client id (never [`ClientId::MASTER`]).
    pub fn random() -> Self {
        loop {
            let v: u64 = rand::random();
            if v != 0 {
                return Self(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_displays_as_sixteen_hex_digits() {
        assert_eq!(ChunkHandle(0x2a).to_string(), "000000000000002a");
    }

    #[test]
    fn versions_are_ordered_and_next_grows() {
        assert!(ChunkVersion(3) < ChunkVersion(4));
        assert_eq!(ChunkVersion(3).next(), ChunkVersion(4));
        assert_eq!(ChunkVersion(u64::MAX).next(), ChunkVersion(u64::MAX));
    }

    #[test]
    fn random_client_is_never_master() {
        for _ in 0..1000 {
            assert_ne!(ClientId::random(), ClientId::MASTER);
        }
    }
}
