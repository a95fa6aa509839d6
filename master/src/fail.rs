//! Fault injection for tests, behind the cargo feature `fail-points`.
//!
//! [`fail_point!`](crate::fail_point) names a point in an operation; a test enables
//! it with [`enable`] and the operation fails there with `Unavailable`, as if the
//! master had crashed at that point (the records logged before it are durable, the
//! rest never happens). Without the feature the macro expands to nothing and this
//! module does not exist.

use std::collections::HashSet;
use std::sync::Mutex;

/// Enabled points (process-wide: tests that use them run in their own binary).
static ACTIVE: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut HashSet<String>) -> T) -> T {
    let mut guard = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(HashSet::new))
}

/// Makes the point `name` fail from now on.
pub fn enable(name: &str) {
    with(|s| s.insert(name.to_string()));
}

/// Lets the point `name` pass again.
pub fn disable(name: &str) {
    with(|s| s.remove(name));
}

/// Whether `name` is enabled.
pub fn is_enabled(name: &str) -> bool {
    with(|s| s.contains(name))
}

/// The error an enabled point returns.
pub fn error(name: &str) -> crate::Error {
    stampfs_proto::RemoteError::Unavailable {
        reason: format!("fail point {name} is enabled"),
    }
    .into()
}
