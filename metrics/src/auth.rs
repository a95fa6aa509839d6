//! The metrics port's credentials (`--metrics-token-file FILE`): with a token, every
//! request must present it, as `Authorization: Bearer TOKEN` (Prometheus's
//! `authorization: { credentials_file: FILE }`) or as the password of HTTP basic
//! authentication (any user name; what a browser asks for, and Prometheus's
//! `basic_auth`). Anything else gets `401` with a `WWW-Authenticate` challenge, so a
//! browser prompts. Without a token the port answers everyone: bind it where only the
//! operator's scraper and browser reach.

use crate::{Error, Result};
use base64::Engine;
use std::path::Path;

/// The longest token read from a file (a token is a secret, not a document).
const MAX_TOKEN: usize = 4096;

/// A token requests must present.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// The token in `path`: its text without surrounding whitespace, at least 16 and
    /// at most 4096 bytes, no control characters (it travels in a header).
    pub fn read(path: &Path) -> Result<Token> {
        let bad = |reason: String| Error::TokenFile {
            path: path.display().to_string(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        if bytes.len() > MAX_TOKEN {
            return Err(bad(format!("longer than {MAX_TOKEN} bytes")));
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| bad("not UTF-8 text".into()))?;
        Token::new(text.trim()).map_err(bad)
    }

    /// `text` as a token (see [`Token::read`]).
    pub fn new(text: &str) -> std::result::Result<Token, String> {
        if text.len() < 16 {
            return Err(format!(
                "a token of {} bytes is too short (16 at least)",
                text.len()
            ));
        }
        if text.chars().any(char::is_control) {
            return Err("the token holds a control character".into());
        }
        Ok(Token(text.as_bytes().to_vec()))
    }

    /// Whether the `Authorization` header value `header` presents this token.
    pub fn admits(&self, header: Option<&[u8]>) -> bool {
        let Some(h) = header.and_then(|h| std::str::from_utf8(h).ok()) else {
            return false;
        };
        let (scheme, rest) = h.trim().split_once(' ').unwrap_or((h, ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return same(rest.as_bytes(), &self.0);
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(rest) else {
                return false;
            };
            // `user:password`: the user name is not checked, the password is the token.
            return match decoded.iter().position(|b| *b == b':') {
                Some(colon) => same(&decoded[colon + 1..], &self.0),
                None => false,
            };
        }
        false
    }
}

/// `a == b`, in time that depends neither on where they differ nor on their lengths:
/// their SHA-256 digests are compared, every byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    use sha2::Digest;
    let (x, y) = (sha2::Sha256::digest(a), sha2::Sha256::digest(b));
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "0123456789abcdef-secret";

    fn basic(user_pass: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_pass)
        )
    }

    #[test]
    fn a_token_is_admitted_as_bearer_or_basic_password_and_nothing_else_is() {
        let t = Token::new(T).expect("token");
        let ok = |h: &str| t.admits(Some(h.as_bytes()));
        assert!(ok(&format!("Bearer {T}")));
        assert!(ok(&format!("bearer  {T} ")));
        assert!(ok(&basic(&format!("prometheus:{T}"))));
        assert!(ok(&basic(&format!(":{T}"))));
        assert!(!t.admits(None));
        assert!(!ok(""));
        assert!(!ok("Bearer"));
        assert!(!ok(&format!("Bearer {T}x")));
        assert!(!ok(&format!("Bearer {}", &T[1..])));
        assert!(!ok(&basic(T)), "no colon: no password");
        assert!(
            !ok(&basic(&format!("{T}:x"))),
            "the user name is not the token"
        );
        assert!(!ok("Basic %%%not-base64"));
        assert!(!ok(&format!("Token {T}")));
        assert!(!t.admits(Some(&[0xff, 0xfe])));
    }

    #[test]
    fn token_files_are_trimmed_and_short_or_odd_tokens_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("token");
        std::fs::write(&p, format!("  {T}\n")).expect("write");
        assert!(Token::read(&p)
            .expect("read")
            .admits(Some(format!("Bearer {T}").as_bytes())));
        for bad in ["short", "0123456789abcdef\u{1}x", ""] {
            std::fs::write(&p, bad).expect("write");
            assert!(Token::read(&p).is_err(), "{bad:?}");
        }
        std::fs::write(&p, vec![b'a'; MAX_TOKEN + 1]).expect("write");
        assert!(Token::read(&p).is_err());
        std::fs::write(&p, [0xffu8; 20]).expect("write");
        assert!(Token::read(&p).is_err());
        assert!(Token::read(&dir.path().join("missing")).is_err());
    }
}
