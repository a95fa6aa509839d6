//! A new leader's first seconds: the chunkservers learn of it from the old leader's
//! silence and register with it over the next heartbeats. Until they have, it knows
//! none of them live and none of their replicas, so a write that needs them (a new
//! chunk placed, a version bump pushed to a chunk's replicas, a pipeline's survivors
//! checked) waits for them here instead of failing for want of chunkservers that are
//! about to call (DESIGN.md "A writer through a failover").

use super::Core;
use crate::error::Result;
use stampfs_proto::ChunkserverId;
use std::time::Duration;

/// How often a write waiting for the chunkservers looks again.
const POLL: Duration = Duration::from_millis(50);

/// What a write waits to have heard from.
pub(super) enum Needs<'a> {
    /// Places a new chunk: as many chunkservers as the file has replicas.
    Placement,
    /// Bumps an existing chunk of the file: its replicas, wherever they are, so every
    /// chunkserver the log knows (a holder that registered late would miss the bump).
    Replicas,
    /// A pipeline's survivors, by name.
    Survivors(&'a [ChunkserverId]),
}

impl Core {
    /// Returns once this master has heard, since it took the lead, from the
    /// chunkservers `needs` names (of the file at `path`); at once on a master that is
    /// not a new leader of a group of several, and in any case once the lead is older
    /// than the period after which a silent chunkserver is dead (it is not coming).
    pub(super) async fn await_chunkservers(&self, path: &str, needs: Needs<'_>) -> Result<()> {
        loop {
            let Some(since) = self.log.led_since_ms() else {
                return Ok(());
            };
            let ready = {
                let st = self.state();
                let now = self.clock.now_ms();
                if now.saturating_sub(since) >= st.settings.dead_after_ms {
                    return Ok(());
                }
                let known = st.servers.len();
                let replication = || {
                    st.resolve_path(path)
                        .ok()
                        .and_then(|ino| st.ns.file(ino))
                        .map_or(0, |f| usize::from(f.replication))
                };
                match needs {
                    Needs::Placement => st.registry.heard_since(since, replication(), known, &[]),
                    Needs::Replicas => st.registry.heard_since(since, known, known, &[]),
                    Needs::Survivors(named) => st.registry.heard_since(since, 0, known, named),
                }
            };
            if ready {
                return Ok(());
            }
            self.check_running()?;
            self.log.serving()?;
            tokio::time::sleep(POLL).await;
        }
    }
}
