//! A user's credentials: the name and secret key a client proves to the master on
//! every connection (see [`crate::auth`]), and the file that holds them.
//!
//! ```text
//! # stampfs credentials (keep this file private: mode 0600)
//! user = alice
//! key = 64 hex digits
//! ```
//!
//! Blank lines and lines starting with `#` are ignored; any other line must be one of
//! the two settings, each given once. A client finds its file in this order: an
//! explicit path (`--credentials FILE`), the `STAMPFS_CREDENTIALS` environment
//! variable, then `~/.config/stampfs/credentials` ([`Credentials::discover`]).

use crate::error::{Error, Result};
use crate::token::{write_private_file, ClusterKey};
use std::path::{Path, PathBuf};

/// The environment variable naming a credentials file.
pub const CREDENTIALS_ENV: &str = "STAMPFS_CREDENTIALS";
/// Where a client looks last, under `$HOME`.
pub const DEFAULT_CREDENTIALS: &str = ".config/stampfs/credentials";
/// The longest user name.
pub const MAX_USER_NAME: usize = 64;
/// The user the master creates at its first start, a superuser.
pub const ADMIN_USER: &str = "admin";
/// The file in the master's directory holding [`ADMIN_USER`]'s credentials.
pub const ADMIN_CREDENTIALS_FILE: &str = "admin.credentials";

/// A user's name and secret key. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    key: ClusterKey,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Whether `name` may name a user: 1 to [`MAX_USER_NAME`] ASCII letters, digits, `_`,
/// `-` and `.`, not starting with `-` or `.`.
pub fn check_user_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_USER_NAME
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        // Quoted only in part: a hostile name may be megabytes long.
        let shown: String = name.chars().take(MAX_USER_NAME).collect();
        let more = if shown.len() < name.len() { "..." } else { "" };
        Err(Error::InvalidKey {
            reason: format!(
                "bad user name {shown:?}{more} ({} bytes): 1 to {MAX_USER_NAME} letters, digits, '_', '-' or '.', not starting with '-' or '.'",
                name.len()
            ),
        })
    }
}

impl Credentials {
    /// Credentials of `user` with the raw key `key`.
    pub fn new(user: &str, key: [u8; 32]) -> Result<Self> {
        check_user_name(user)?;
        Ok(Self {
            user: user.to_string(),
            key: ClusterKey::from_bytes(key),
        })
    }

    /// New credentials of `user` with a fresh random key.
    pub fn generate(user: &str) -> Result<Self> {
        Self::new(user, rand::random())
    }

    /// The key, as the HMAC key of the handshake's proofs.
    pub fn key(&self) -> &ClusterKey {
        &self.key
    }

    /// The raw key (what the master stores).
    pub fn key_bytes(&self) -> [u8; 32] {
        self.key.bytes()
    }

    /// Parses the file format (see the module doc).
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |reason: String| Error::InvalidKey { reason };
        let (mut user, mut key) = (None, None);
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(bad(format!("line {}: expected `NAME = VALUE`", n + 1)));
            };
            let slot = match k.trim() {
                "user" => &mut user,
                "key" => &mut key,
                other => return Err(bad(format!("line {}: unknown setting {other:?}", n + 1))),
            };
            if slot.replace(v.trim().to_string()).is_some() {
                return Err(bad(format!("line {}: {} given twice", n + 1, k.trim())));
            }
        }
        let user = user.ok_or_else(|| bad("no `user = ...` line".into()))?;
        let key = key.ok_or_else(|| bad("no `key = ...` line".into()))?;
        check_user_name(&user)?;
        Ok(Self {
            user,
            key: ClusterKey::from_hex(&key)?,
        })
    }

    /// The file format.
    pub fn to_file_text(&self) -> String {
        format!(
            "# stampfs credentials (keep this file private: mode 0600)\nuser = {}\nkey = {}\n",
            self.user,
            self.key.to_hex()
        )
    }

    /// Reads a credentials file; the error names the file.
    pub fn load(path: &Path) -> Result<Self> {
        let err = |reason: String| Error::KeyFile {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Self::parse(&text).map_err(|e| err(e.to_string()))
    }

    /// Writes the file durably with mode 0600 (a temp file renamed over `path`).
    /// `exclusive`: fail rather than replace an existing file.
    pub fn write(&self, path: &Path, exclusive: bool) -> Result<()> {
        let err = |e: std::io::Error| Error::KeyFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        write_private_file(path, self.to_file_text().as_bytes(), exclusive).map_err(err)
    }

    /// Finds and reads the credentials a client presents: `explicit`, else the file
    /// named by [`CREDENTIALS_ENV`], else `~/.config/stampfs/credentials` when it
    /// exists. `Ok(None)`: none anywhere. A file named but unreadable is an error.
    pub fn discover(explicit: Option<&Path>) -> Result<Option<(Self, PathBuf)>> {
        let named = explicit.map(Path::to_path_buf).or_else(|| {
            std::env::var_os(CREDENTIALS_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        if let Some(path) = named {
            return Ok(Some((Self::load(&path)?, path)));
        }
        let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
            return Ok(None);
        };
        let path = Path::new(&home).join(DEFAULT_CREDENTIALS);
        if !path.exists() {
            return Ok(None);
        }
        Ok(Some((Self::load(&path)?, path)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_bad_files_are_refused_clearly() {
        let c = Credentials::new("alice", [7; 32]).expect("new");
        let back = Credentials::parse(&c.to_file_text()).expect("parse");
        assert_eq!(back, c);
        assert_eq!(back.key_bytes(), [7; 32]);
        assert!(!format!("{c:?}").contains("0707"), "Debug shows no key");

        let key = "07".repeat(32);
        for (text, why) in [
            ("user = alice\n", "no `key"),
            (&format!("key = {key}\n") as &str, "no `user"),
            (&format!("user = a\nuser = b\nkey = {key}\n"), "twice"),
            (
                &format!("user = a\nkey = {key}\ncolor = red\n"),
                "unknown setting",
            ),
            ("user = a\nkey = 12\n", "hex digits"),
            (&format!("user = -x\nkey = {key}\n"), "bad user name"),
            (&format!("user = a b\nkey = {key}\n"), "bad user name"),
            ("just garbage", "expected `NAME = VALUE`"),
        ] {
            let e = Credentials::parse(text).expect_err(text).to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        let ok = format!("# comment\n\n  user=bob  \nkey= {key}\n");
        assert_eq!(Credentials::parse(&ok).expect("parse").user, "bob");
    }

    #[test]
    fn written_files_are_private_and_exclusive_writes_keep_the_old_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/alice.credentials");
        let c = Credentials::generate("alice").expect("generate");
        c.write(&path, true).expect("write");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(Credentials::load(&path).expect("load"), c);
        let other = Credentials::generate("alice").expect("generate");
        assert!(other.write(&path, true).is_err());
        assert_eq!(Credentials::load(&path).expect("load"), c);
        let missing = Credentials::load(&dir.path().join("nope")).expect_err("missing");
        assert!(missing.to_string().contains("nope"), "{missing}");
    }
}
