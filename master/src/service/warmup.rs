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

impl Core {
    /// Returns once this master has heard, since it took the lead, from as many
    /// chunkservers as the file at `path` has replicas (or from every one it knows, if
    /// fewer) and from each of `named`; at once on a master that is not a new leader
    /// of a group of several, and in any case once the lead is older than the period
    /// after which a silent chunkserver is dead (it is not coming).
    pub(super) async fn await_chunkservers(
        &self,
        path: &str,
        named: &[ChunkserverId],
    ) -> Result<()> {
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
                let want = st
                    .resolve_path(path)
                    .ok()
                    .and_then(|ino| st.ns.file(ino))
                    .map_or(0, |f| usize::from(f.replication));
                st.registry
                    .heard_since(since, want, st.servers.len(), named)
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
