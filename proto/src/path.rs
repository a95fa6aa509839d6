//! Namespace path validation, shared by the client (to fail early) and the master
//! (which never trusts the client).

use crate::error::{Error, Result};

/// Longest path accepted, in bytes.
pub const MAX_PATH_LEN: usize = 4096;
/// Longest single component, in bytes.
pub const MAX_COMPONENT_LEN: usize = 255;

/// Checks that `path` is absolute, has no empty, `.` or `..` components and no NUL,
/// and fits the length limits. A single trailing `/` is accepted and dropped. Returns
/// the components (empty for `/`).
pub fn components(path: &str) -> Result<Vec<&str>> {
    let bad = |reason: &str| Error::InvalidPath {
        path: path.chars().take(256).collect(),
        reason: reason.to_string(),
    };
    if path.len() > MAX_PATH_LEN {
        return Err(bad("longer than 4096 bytes"));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(bad("must be absolute (start with /)"));
    };
    if path.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for c in rest.split('/') {
        match c {
            "" => return Err(bad("has an empty component (//)")),
            "." | ".." => return Err(bad("has a . or .. component")),
            c if c.len() > MAX_COMPONENT_LEN => {
                return Err(bad("has a component longer than 255 bytes"))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The canonical form of a valid path (no trailing slash except for `/`).
pub fn normalize(path: &str) -> Result<String> {
    let parts = components(path)?;
    Ok(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_good_paths() {
        assert_eq!(components("/").expect("root"), Vec::<&str>::new());
        assert_eq!(components("/a/b").expect("ok"), vec!["a", "b"]);
        assert_eq!(normalize("/a/b/").expect("ok"), "/a/b");
    }

    #[test]
    fn rejects_bad_paths_with_a_reason() {
        for (p, why) in [
            ("a/b", "absolute"),
            ("", "absolute"),
            ("/a//b", "empty"),
            ("/a/./b", ". or .."),
            ("/a/../b", ". or .."),
            ("/a\0b", "NUL"),
        ] {
            let err = components(p).unwrap_err().to_string();
            assert!(err.contains(why), "{p:?}: {err}");
        }
        let long = format!("/{}", "x".repeat(300));
        assert!(components(&long).is_err());
        let huge = "/a".repeat(3000);
        assert!(components(&huge).is_err());
    }
}
