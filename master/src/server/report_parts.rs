//! The parts of a long chunk report a connection sends ([`stampfs_proto::ReportPart`]),
//! kept until the message that completes them.

use crate::error::{Error, Result};
use stampfs_proto::MasterRequest;

/// Most replicas one connection's report may hold (its parts and the message that
/// completes them): 16 Mi reports, 512 MiB while they are applied.
pub const MAX_REPORT_REPLICAS: usize = 16 << 20;

/// The parts of a long chunk report a connection sent so far
/// ([`stampfs_proto::ReportPart`]): kept until the `Register` or `ChunkReport` that
/// completes them, which then carries the whole report; dropped with the connection.
#[derive(Debug)]
pub(super) struct ReportParts {
    replicas: Vec<stampfs_proto::ReplicaReport>,
    /// [`MAX_REPORT_REPLICAS`] (lower in tests).
    limit: usize,
}

impl Default for ReportParts {
    fn default() -> Self {
        Self {
            replicas: Vec::new(),
            limit: MAX_REPORT_REPLICAS,
        }
    }
}

impl ReportParts {
    /// Keeps a part (`Ok(None)`: nothing to dispatch), completes a report with the
    /// parts kept, or passes any other request through.
    pub(super) fn take(&mut self, req: MasterRequest) -> Result<Option<MasterRequest>> {
        let tail = match &req {
            MasterRequest::ReportPart(p) => &p.replicas,
            MasterRequest::Register(r) => &r.replicas,
            MasterRequest::ChunkReport(r) => &r.replicas,
            _ => return Ok(Some(req)),
        };
        if self.replicas.len() + tail.len() > self.limit {
            let held = self.replicas.len() + tail.len();
            self.replicas = Vec::new();
            return Err(Error::bad_request(format!(
                "a chunk report of {held} replicas or more exceeds the limit of {}",
                self.limit
            )));
        }
        Ok(match req {
            MasterRequest::ReportPart(mut p) => {
                self.replicas.append(&mut p.replicas);
                None
            }
            MasterRequest::Register(mut r) => {
                r.replicas = self.complete(r.replicas);
                Some(MasterRequest::Register(r))
            }
            MasterRequest::ChunkReport(mut r) => {
                r.replicas = self.complete(r.replicas);
                Some(MasterRequest::ChunkReport(r))
            }
            other => Some(other),
        })
    }

    /// The parts kept, then `last`; nothing is kept afterwards.
    fn complete(
        &mut self,
        mut last: Vec<stampfs_proto::ReplicaReport>,
    ) -> Vec<stampfs_proto::ReplicaReport> {
        if self.replicas.is_empty() {
            return last;
        }
        let mut all = std::mem::take(&mut self.replicas);
        all.append(&mut last);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{
        ChunkHandle, ChunkReport, ChunkVersion, ChunkserverId, Register, ReplicaReport,
        ReplicaState, ReportPart, Stat,
    };

    fn reps(from: u64, n: u64) -> Vec<ReplicaReport> {
        (from..from + n)
            .map(|h| ReplicaReport {
                handle: ChunkHandle(h),
                version: ChunkVersion(1),
                length: 0,
                state: ReplicaState::Finalized,
            })
            .collect()
    }

    fn part(from: u64, n: u64) -> MasterRequest {
        MasterRequest::ReportPart(ReportPart {
            replicas: reps(from, n),
        })
    }

    #[test]
    fn parts_are_kept_until_the_report_they_complete() {
        let mut parts = ReportParts::default();
        assert_eq!(parts.take(part(0, 3)).expect("part"), None);
        assert_eq!(parts.take(part(3, 2)).expect("part"), None);
        let done = parts
            .take(MasterRequest::ChunkReport(ChunkReport {
                id: ChunkserverId(4),
                replicas: reps(5, 1),
            }))
            .expect("report");
        assert_eq!(
            done,
            Some(MasterRequest::ChunkReport(ChunkReport {
                id: ChunkserverId(4),
                replicas: reps(0, 6),
            }))
        );
        // Nothing is left for the next report.
        let register = MasterRequest::Register(Register {
            id: None,
            addr: "a".into(),
            capacity: 0,
            used: 0,
            replicas: reps(9, 1),
            session: 0,
        });
        assert_eq!(
            parts.take(register.clone()).expect("register"),
            Some(register)
        );
    }

    #[test]
    fn a_report_without_parts_and_other_requests_pass_unchanged() {
        let mut parts = ReportParts::default();
        let stat = MasterRequest::Stat(Stat {
            path: "/".into(),
            caller: None,
        });
        assert_eq!(parts.take(stat.clone()).expect("stat"), Some(stat));
        parts.take(part(0, 2)).expect("part");
        // A request between the parts and their report changes nothing.
        let stat = MasterRequest::Stat(Stat {
            path: "/x".into(),
            caller: None,
        });
        assert_eq!(parts.take(stat.clone()).expect("stat"), Some(stat));
        let Some(MasterRequest::Register(r)) = parts
            .take(MasterRequest::Register(Register {
                id: None,
                addr: "a".into(),
                capacity: 0,
                used: 0,
                replicas: Vec::new(),
                session: 0,
            }))
            .expect("register")
        else {
            panic!("a register")
        };
        assert_eq!(r.replicas, reps(0, 2));
    }

    #[test]
    fn a_report_over_the_limit_is_refused_and_forgotten() {
        let mut parts = ReportParts {
            limit: 5,
            ..ReportParts::default()
        };
        parts.take(part(0, 5)).expect("at the limit");
        let err = parts.take(part(0, 1)).expect_err("over the limit");
        assert!(matches!(err, Error::BadRequest { .. }), "{err}");
        assert!(parts.replicas.is_empty(), "forgotten");
    }
}
