//! `stampfs mount`: wiring for the FUSE mount (being built).

use crate::cli::MountArgs;

/// Mounts stampfs at the mount point.
pub async fn run(_args: MountArgs) -> u8 {
    eprintln!("stampfs mount: not built yet (the FUSE issue). Nothing was done.");
    crate::EXIT_UNAVAILABLE
}
