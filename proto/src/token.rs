//! Fencing tokens and the cluster key that authenticates them.
//!
//! A [`ChunkToken`] is `(chunk handle, chunk version, client, HMAC-SHA256)`. The master
//! signs it with the [`ClusterKey`] it shares with the chunkservers; a client holds it
//! but cannot forge one or raise its version, because it does not know the key.
//! Chunkservers verify the MAC, then compare the version with the replica header's.
//!
//! Commands the master sends to chunkservers travel as [`Signed`] values, authenticated
//! with the same key under a different domain string, so a token can never be replayed
//! as a command or the other way round.

use crate::error::{Error, Result};
use crate::ids::{ChunkHandle, ChunkVersion, ClientId};
use crate::replay::Issue;
use bincode::{Decode, Encode};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::io::Write;
use std::path::Path;

type HmacSha256 = Hmac<Sha256>;

/// Length of the cluster key in bytes.
pub const CLUSTER_KEY_LEN: usize = 32;

/// Write tokens (pipeline writes, replica pushes, recovery): the write domain.
const TOKEN_DOMAIN: &[u8] = b"stampfs/chunk-token/v1";
/// Read tokens (what `GetLocations` hands to readers): good for reads only.
const READ_TOKEN_DOMAIN: &[u8] = b"stampfs/chunk-token/read/v1";
const COMMAND_DOMAIN: &[u8] = b"stampfs/master-command/v3";
const VERIFY_DOMAIN: &[u8] = b"stampfs/master-command/verify/v3";
const DIGEST_DOMAIN: &[u8] = b"stampfs/master-command/digest/v3";

/// What the master signs, each under its MAC domain of its own (commands, replica
/// verifications and digest requests), so that no body can pass for another whose
/// encoding happens to be the same bytes. (The `v1` domains signed a body without an
/// [`Issue`]; nothing signed under them verifies now.)
pub trait SignedBody: Encode {
    const DOMAIN: &'static [u8];
}

impl SignedBody for crate::msg::ChunkCommand {
    const DOMAIN: &'static [u8] = COMMAND_DOMAIN;
}

impl SignedBody for crate::msg::VerifyReplica {
    const DOMAIN: &'static [u8] = VERIFY_DOMAIN;
}

impl SignedBody for crate::msg::DigestReplica {
    const DOMAIN: &'static [u8] = DIGEST_DOMAIN;
}

/// The secret shared by the master and every chunkserver. Its `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterKey {
    bytes: [u8; CLUSTER_KEY_LEN],
    /// HMAC-SHA256 with the key already absorbed (its inner and outer pads hashed):
    /// each MAC clones it instead of keying afresh, two SHA-256 blocks fewer.
    keyed: HmacSha256,
}

impl PartialEq for ClusterKey {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for ClusterKey {}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

impl ClusterKey {
    /// A key from raw bytes.
    pub fn from_bytes(bytes: [u8; CLUSTER_KEY_LEN]) -> Self {
        // HMAC accepts keys of any length; 32 bytes can never be rejected.
        let keyed = <HmacSha256 as Mac>::new_from_slice(&bytes)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        Self { bytes, keyed }
    }

    /// A new random key.
    pub fn generate() -> Self {
        Self::from_bytes(rand::random())
    }

    /// Parses the key file format: 64 hex digits, surrounding whitespace ignored.
    pub fn from_hex(text: &str) -> Result<Self> {
        let text = text.trim();
        let mut out = [0u8; CLUSTER_KEY_LEN];
        hex::decode_to_slice(text, &mut out).map_err(|_| Error::InvalidKey {
            reason: format!("expected {} hex digits", CLUSTER_KEY_LEN * 2),
        })?;
        Ok(Self::from_bytes(out))
    }

    /// The raw key.
    pub(crate) fn bytes(&self) -> [u8; CLUSTER_KEY_LEN] {
        self.bytes
    }

    /// The key file format.
    pub fn to_hex(&self) -> String {
        hex::encode(self.bytes)
    }

    /// Reads a key file; the error says which file and why.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::KeyFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_hex(&text).map_err(|e| Error::KeyFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    }

    /// Reads the key file, or creates it (mode 0600, written atomically) with a fresh
    /// random key when it does not exist. Returns the key and whether it was created.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool)> {
        if path.exists() {
            return Ok((Self::load(path)?, false));
        }
        let key = Self::generate();
        write_private_file(path, format!("{}\n", key.to_hex()).as_bytes(), true).map_err(|e| {
            Error::KeyFile {
                path: path.display().to_string(),
                reason: e.to_string(),
            }
        })?;
        Ok((key, true))
    }

    fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(domain);
        for p in parts {
            mac.update(&(p.len() as u64).to_be_bytes());
            mac.update(p);
        }
        mac
    }

    pub(crate) fn sign_parts(&self, domain: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        self.mac(domain, parts).finalize().into_bytes().into()
    }

    pub(crate) fn verify_parts(&self, domain: &[u8], parts: &[&[u8]], tag: &[u8; 32]) -> bool {
        self.mac(domain, parts).verify_slice(tag).is_ok()
    }
}

/// Writes a secret file durably with mode 0600: `contents` to a new temp file of a
/// random name next to `path` (created exclusively, so neither a file nor a symbolic
/// link someone put there is reused), fsynced, then moved to `path` and the directory
/// fsynced. `exclusive`: an existing `path` is never replaced (the move is a hard
/// link, which fails on an existing name). Creates the directory when missing.
pub fn write_private_file(path: &Path, contents: &[u8], exclusive: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)?;
    }
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{:016x}.tmp", rand::random::<u64>()));
    let tmp = path.with_file_name(name);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        if exclusive {
            std::fs::hard_link(&tmp, path)
        } else {
            std::fs::rename(&tmp, path)
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    written?;
    if let Some(dir) = dir {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The fencing token carried by every data-path request: it names a chunk, the chunk
/// version the master granted, and the client it was granted to, and is signed by the
/// master with the cluster key.
#[derive(Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct ChunkToken {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
    pub client: ClientId,
    pub mac: [u8; 32],
}

impl fmt::Debug for ChunkToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkToken")
            .field("handle", &self.handle)
            .field("version", &self.version)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl ChunkToken {
    fn parts(handle: ChunkHandle, version: ChunkVersion, client: ClientId) -> [[u8; 8]; 3] {
        [
            handle.0.to_be_bytes(),
            version.0.to_be_bytes(),
            client.0.to_be_bytes(),
        ]
    }

    /// Signs a token. Only the master calls this.
    pub fn sign(
        key: &ClusterKey,
        handle: ChunkHandle,
        version: ChunkVersion,
        client: ClientId,
    ) -> Self {
        let p = Self::parts(handle, version, client);
        let mac = key.sign_parts(TOKEN_DOMAIN, &[&p[0], &p[1], &p[2]]);
        Self {
            handle,
            version,
            client,
            mac,
        }
    }

    /// Signs a read-only token: it passes [`ChunkToken::verify_read`] but not
    /// [`ChunkToken::verify`], so a reader can never write, truncate or replace a
    /// replica with it. Only the master calls this.
    pub fn sign_read(
        key: &ClusterKey,
        handle: ChunkHandle,
        version: ChunkVersion,
        client: ClientId,
    ) -> Self {
        let p = Self::parts(handle, version, client);
        let mac = key.sign_parts(READ_TOKEN_DOMAIN, &[&p[0], &p[1], &p[2]]);
        Self {
            handle,
            version,
            client,
            mac,
        }
    }

    /// Checks the MAC of a write token: any altered field, a token signed with another
    /// key, or a read-only token fails with [`Error::BadToken`].
    pub fn verify(&self, key: &ClusterKey) -> Result<()> {
        self.verify_in(key, &[TOKEN_DOMAIN])
    }

    /// Checks the MAC of a token presented for a read: read and write tokens pass.
    pub fn verify_read(&self, key: &ClusterKey) -> Result<()> {
        self.verify_in(key, &[READ_TOKEN_DOMAIN, TOKEN_DOMAIN])
    }

    fn verify_in(&self, key: &ClusterKey, domains: &[&[u8]]) -> Result<()> {
        let p = Self::parts(self.handle, self.version, self.client);
        let ok = domains
            .iter()
            .any(|d| key.verify_parts(d, &[&p[0], &p[1], &p[2]], &self.mac));
        if ok {
            Ok(())
        } else {
            Err(Error::BadToken {
                handle: self.handle,
            })
        }
    }
}

/// A master command authenticated with the cluster key, for one chunkserver and
/// usable once ([`crate::replay`]). The MAC covers the canonical bincode encodings of
/// the [`Issue`] and of the command.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Signed<T> {
    pub issue: Issue,
    pub body: T,
    pub mac: [u8; 32],
}

impl<T: SignedBody> Signed<T> {
    /// Signs `body` as `issue`. Only the master calls this.
    pub fn new(key: &ClusterKey, issue: Issue, body: T) -> Result<Self> {
        let mac = Self::mac(key, &issue, &body)?;
        Ok(Self { issue, body, mac })
    }

    fn mac(key: &ClusterKey, issue: &Issue, body: &T) -> Result<[u8; 32]> {
        let issue = crate::codec::encode_value(issue)?;
        let body = crate::codec::encode_value(body)?;
        Ok(key.sign_parts(T::DOMAIN, &[&issue, &body]))
    }

    /// Returns the issue and the body when the MAC is valid, [`Error::BadCommandMac`]
    /// otherwise. Whether the issue is admitted is the receiver's
    /// [`ReplayWindow`](crate::replay::ReplayWindow)'s to say.
    pub fn verify(self, key: &ClusterKey) -> Result<(Issue, T)> {
        let issue = crate::codec::encode_value(&self.issue)?;
        let body = crate::codec::encode_value(&self.body)?;
        if key.verify_parts(T::DOMAIN, &[&issue, &body], &self.mac) {
            Ok((self.issue, self.body))
        } else {
            Err(Error::BadCommandMac)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ClusterKey {
        ClusterKey::from_bytes([7u8; 32])
    }

    fn token() -> ChunkToken {
        ChunkToken::sign(&key(), ChunkHandle(10), ChunkVersion(3), ClientId(99))
    }

    #[test]
    fn signed_token_verifies() {
        token().verify(&key()).expect("genuine token");
    }

    #[test]
    fn altering_any_field_breaks_the_mac() {
        let mut t = token();
        t.version = ChunkVersion(4);
        assert!(matches!(t.verify(&key()), Err(Error::BadToken { .. })));
        let mut t = token();
        t.handle = ChunkHandle(11);
        assert!(t.verify(&key()).is_err());
        let mut t = token();
        t.client = ClientId(98);
        assert!(t.verify(&key()).is_err());
        let mut t = token();
        t.mac[31] ^= 1;
        assert!(t.verify(&key()).is_err());
    }

    #[test]
    fn a_read_token_reads_but_never_writes() {
        let r = ChunkToken::sign_read(&key(), ChunkHandle(10), ChunkVersion(3), ClientId(99));
        r.verify_read(&key()).expect("read token reads");
        assert!(matches!(r.verify(&key()), Err(Error::BadToken { .. })));
        token()
            .verify_read(&key())
            .expect("a write token may read too");
        let mut forged = r;
        forged.version = ChunkVersion(4);
        assert!(forged.verify_read(&key()).is_err());
    }

    #[test]
    fn another_key_is_rejected() {
        let other = ClusterKey::from_bytes([8u8; 32]);
        assert!(token().verify(&other).is_err());
    }

    use crate::ids::ChunkserverId;

    fn issue(seq: u64) -> Issue {
        Issue {
            chunkserver: ChunkserverId(3),
            session: 0x5e55,
            seq,
            epoch: crate::replay::MasterEpoch { term: 4, leader: 2 },
        }
    }

    #[test]
    fn signed_commands_verify_and_reject_tampering() {
        use crate::msg::ChunkCommand;
        let cmd = ChunkCommand::Info {
            handle: ChunkHandle(1),
        };
        let s = Signed::new(&key(), issue(1), cmd.clone()).expect("sign");
        assert_eq!(s.clone().verify(&key()).expect("valid"), (issue(1), cmd));
        let mut bad = s.clone();
        bad.body = ChunkCommand::Info {
            handle: ChunkHandle(2),
        };
        assert!(matches!(bad.verify(&key()), Err(Error::BadCommandMac)));
        // The issue is under the MAC: a command cannot be renumbered or readdressed.
        for forged_issue in [
            issue(2),
            Issue {
                session: 1,
                ..issue(1)
            },
            Issue {
                chunkserver: ChunkserverId(4),
                ..issue(1)
            },
            // Nor moved to another master's epoch.
            Issue {
                epoch: crate::replay::MasterEpoch { term: 5, leader: 2 },
                ..issue(1)
            },
        ] {
            let mut forged = s.clone();
            forged.issue = forged_issue;
            assert!(matches!(forged.verify(&key()), Err(Error::BadCommandMac)));
        }
    }

    #[test]
    fn a_token_mac_is_not_a_command_mac() {
        use crate::msg::DigestReplica;
        let t = token();
        // A digest request has the same fields as a token's first two.
        let forged = Signed {
            issue: issue(0),
            body: DigestReplica {
                handle: t.handle,
                version: t.version,
            },
            mac: t.mac,
        };
        assert!(forged.verify(&key()).is_err());
    }

    #[test]
    fn bodies_with_the_same_bytes_do_not_pass_for_each_other() {
        use crate::msg::{ChunkCommand, DigestReplica, VerifyReplica};
        // `Info { handle: 9 }` encodes as the bytes of `DigestReplica { 5, 9 }`
        // (variant index 5, then the handle): only the domain tells them apart.
        let info = Signed::new(
            &key(),
            issue(0),
            ChunkCommand::Info {
                handle: ChunkHandle(9),
            },
        )
        .expect("sign");
        let body = DigestReplica {
            handle: ChunkHandle(5),
            version: ChunkVersion(9),
        };
        assert_eq!(
            crate::codec::encode_value(&body).expect("encode"),
            crate::codec::encode_value(&info.body).expect("encode")
        );
        let forged = Signed {
            issue: info.issue,
            body,
            mac: info.mac,
        };
        assert!(matches!(forged.verify(&key()), Err(Error::BadCommandMac)));
        // Nor a verification for a command, nor the other way round.
        let verify = Signed::new(
            &key(),
            issue(1),
            VerifyReplica {
                handle: ChunkHandle(5),
            },
        )
        .expect("sign");
        let as_command = Signed {
            issue: verify.issue,
            body: ChunkCommand::Info {
                handle: ChunkHandle(5),
            },
            mac: verify.mac,
        };
        assert!(matches!(
            as_command.verify(&key()),
            Err(Error::BadCommandMac)
        ));
    }

    #[test]
    fn key_file_is_created_with_mode_0600_and_reloads() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/cluster.key");
        let (k1, created) = ClusterKey::load_or_create(&path).expect("create");
        assert!(created);
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (k2, created) = ClusterKey::load_or_create(&path).expect("load");
        assert!(!created);
        assert_eq!(k1, k2);
        assert_eq!(ClusterKey::load(&path).expect("load"), k1);
    }

    #[test]
    fn bad_key_files_say_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope.key");
        let err = ClusterKey::load(&missing).unwrap_err().to_string();
        assert!(err.contains("nope.key"), "{err}");
        let garbage = dir.path().join("garbage.key");
        std::fs::write(&garbage, "not hex").expect("write");
        let err = ClusterKey::load(&garbage).unwrap_err().to_string();
        assert!(err.contains("hex"), "{err}");
    }
}
