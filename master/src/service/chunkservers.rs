//! The chunkservers' requests, as methods of [`Core`]: registration (with its full
//! report), heartbeats (carrying the queued commands back), periodic chunk reports
//! applied in batches, and the report marks that keep an old report from taking away
//! a replica a command's answer recorded (DESIGN.md, "The report mark").

use super::Core;
use crate::error::{Error, Result};
use crate::oplog::lock;
use stampfs_proto::{ChunkReport, Heartbeat, HeartbeatReply, Register, RegisterReply};

impl Core {
    pub async fn register(&self, req: Register) -> Result<RegisterReply> {
        self.register_marked(req).await.map(|(reply, _)| reply)
    }

    /// [`Core::register`], with the registration report's mark (`state/report.rs`):
    /// the mark of a chunk report that follows it on the same connection.
    #[tracing::instrument(skip_all, fields(addr = %req.addr))]
    pub async fn register_marked(&self, req: Register) -> Result<(RegisterReply, u64)> {
        // The report's mark: the chunkserver built it in its new session, after the
        // commands of the old one were done; those of the new one are signed below.
        let covered = self.state().ack_mark();
        // The chunkserver refuses its previous session from the moment it sent this:
        // sign for the new one at once rather than after the durable registration.
        if let Some(id) = req.id {
            self.commands.registered(id, req.session);
        }
        let id = self
            .mutate_durable(|st, now, _| st.register(&req, now, covered))
            .await?;
        self.commands.registered(id, req.session);
        self.replicas_back(&[id]);
        Ok((RegisterReply { id }, covered))
    }

    /// Files waiting in lease recovery for a replica on one of `servers`, which just
    /// registered or came back to life, are retried at the recovery worker's next pass
    /// rather than after their back-off.
    pub(super) fn replicas_back(&self, servers: &[stampfs_proto::ChunkserverId]) {
        let waiting = self.state().recovering_with_replica_on(servers);
        if !waiting.is_empty() {
            let mut retries = lock(&self.recoveries.retries);
            for ino in waiting {
                retries.done(ino);
            }
        }
    }

    pub async fn heartbeat(&self, req: Heartbeat) -> Result<HeartbeatReply> {
        self.heartbeat_marked(req).await.map(|(reply, _)| reply)
    }

    /// [`Core::heartbeat`], with the mark of the chunk report that may follow it on the
    /// same connection (`state/report.rs`): the acknowledgement clock on its arrival.
    /// The command answers up to the mark are forgotten: that report, built after
    /// this reply, shows what they did.
    pub async fn heartbeat_marked(&self, req: Heartbeat) -> Result<(HeartbeatReply, u64)> {
        let now = self.clock.now_ms();
        let (known, mark) = {
            let mut st = self.state();
            let mark = st.ack_mark();
            let known = st.registry.heartbeat(
                req.id,
                req.capacity,
                req.used,
                req.replica_count,
                req.active_streams,
                now,
            );
            st.forget_acks(req.id, mark);
            (known, mark)
        };
        if !known {
            tracing::info!(chunkserver = %req.id, "heartbeat from an unregistered chunkserver; asking it to register");
            return Ok((
                HeartbeatReply {
                    commands: Vec::new(),
                    reregister: true,
                },
                mark,
            ));
        }
        let (queued, logged) = {
            let mut st = self.state();
            (
                st.health
                    .take_commands(req.id, crate::health::MAX_COMMANDS_PER_HEARTBEAT),
                self.log.mark(st.last_lsn),
            )
        };
        // Commands were decided on state that must be durable before they act on it
        // (a deleted chunk's replicas go only once the deletion is logged).
        self.durable(logged).await?;
        let mut commands = Vec::with_capacity(queued.len());
        for cmd in queued {
            match self.commands.sign(req.id, cmd) {
                Ok(c) => commands.push(c),
                Err(e) => {
                    tracing::error!(chunkserver = %req.id, error = %e, "cannot sign a command")
                }
            }
        }
        if !commands.is_empty() {
            tracing::debug!(chunkserver = %req.id, commands = commands.len(), "commands sent in a heartbeat reply");
        }
        Ok((
            HeartbeatReply {
                commands,
                reregister: false,
            },
            mark,
        ))
    }

    /// A periodic full report, applied in batches of [`crate::state::REPORT_BATCH`]
    /// replicas with the state lock released between them (`state/report.rs`), so a
    /// report of millions of replicas does not stall the master.
    ///
    /// `covered`: the report's mark (`state/report.rs`), from the last heartbeat or
    /// registration of this chunkserver on the report's connection; 0 when there was
    /// none (the report then takes no replica away).
    #[tracing::instrument(skip_all, fields(chunkserver = %req.id, replicas = req.replicas.len()))]
    pub async fn chunk_report(&self, req: ChunkReport, covered: u64) -> Result<()> {
        let mut reported: Vec<_> = req.replicas.iter().map(|r| r.handle).collect();
        reported.sort_unstable();
        reported.dedup();
        let Some(mut apply) =
            self.state()
                .begin_sorted_report(req.id, req.replicas, reported, covered)
        else {
            return Err(Error::NotFound {
                path: format!("chunkserver {} is not registered (register again)", req.id),
            });
        };
        let mut pacer = crate::pacing::Pacer::new();
        while !apply.done() {
            self.state()
                .report_step(&mut apply, crate::state::REPORT_BATCH);
            pacer.pause().await;
        }
        let s = apply.summary;
        tracing::debug!(
            current = s.current,
            stale = s.stale,
            ahead = s.ahead,
            short = s.short,
            orphans = s.orphans,
            superseded = apply.superseded,
            "chunk report"
        );
        Ok(())
    }

    /// The acknowledgement clock ([`crate::state::MasterState::ack_mark`]).
    pub fn ack_mark(&self) -> u64 {
        self.state().ack_mark()
    }
}
