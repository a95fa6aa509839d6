//! Group commit through openraft: the master's requests queue their records and the
//! first one that must wait for its record submits everything queued as one entry.
//!
//! openraft makes one log entry per `client_write` and flushes each entry on its own
//! (docs/openraft-plan.md 1.4.1), so the batching is ours, as the operation log's is:
//! - [`Proposer::append`] queues a record under the master's state lock; it never
//!   touches the disk or openraft.
//! - [`Proposer::wait_committed`] returns once the record is committed. If no batch is
//!   in flight it first submits the whole queue (up to [`MAX_BATCH_BYTES`]) as one
//!   [`Batch`] with `client_write_ff`, which only hands it to openraft's core; the
//!   state machine publishes the commit ([`Progress`]) when it applies the entry.
//!   Whatever queues while a batch is in flight is the next batch.
//! - A record nobody waits for (its request was dropped) is submitted by the sweeper
//!   task once it has been queued for [`SWEEP_AFTER`].
//!
//! Batches are handed to openraft in LSN order (drained and sent under one lock), so
//! entries and LSNs rise together. A group of one has one batch in flight at a time:
//! what queues during its `fdatasync` is the next batch. A leader with followers has
//! up to [`PIPELINED_BATCHES`] in flight, so that its own flush, the followers'
//! flushes and the round trips to them overlap instead of following one another.
//!
//! The proposer takes records only while this member leads: [`Proposer::lead`] starts a
//! generation (the [`Progress`]'s) after the committed LSN, [`Proposer::follow`] drops
//! what is queued. A record is waited for in the generation it was queued in; once the
//! generation moved on, its waiters fail ([`Error::LeadershipLost`]) whatever LSNs
//! commit later, since another leader's records may carry the same ones.

use super::state_machine::Progress;
use super::{Batch, TypeConfig};
use crate::error::{Error, Result};
use openraft::Raft;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// The most record bytes one batch carries (a record larger than this goes alone).
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// Batches in flight at once on a leader with followers.
pub const PIPELINED_BATCHES: usize = 2;
/// How long a record may stay queued before the sweeper submits it.
pub const SWEEP_AFTER: Duration = Duration::from_millis(5);

/// Queues the master's records and submits them to the group in batches.
pub struct Proposer {
    raft: Raft<TypeConfig>,
    queue: Mutex<Queue>,
    progress: Arc<watch::Sender<Progress>>,
    /// Woken when a record is queued into an empty queue, at a stop and at the end.
    queued: Arc<Notify>,
    /// Held from draining a batch until openraft has it: batches reach openraft in
    /// LSN order.
    sending: tokio::sync::Mutex<()>,
}

impl Drop for Proposer {
    fn drop(&mut self) {
        self.queued.notify_one();
    }
}

impl std::fmt::Debug for Proposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proposer")
            .field("progress", &*self.progress.borrow())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Queue {
    /// The LSN of `records[0]`.
    first_lsn: u64,
    records: Vec<serde_bytes::ByteBuf>,
    /// Per record of `records`: the next one belongs to the same request's mutation
    /// (queued by one [`Proposer::append_all`]), so no batch ends between them.
    joined: Vec<bool>,
    /// The last LSN queued (or submitted, or committed before the start).
    last_queued: u64,
    /// The last LSN handed to openraft.
    submitted: u64,
    /// The last LSN of each batch handed to openraft and not known committed.
    in_flight: std::collections::VecDeque<u64>,
    /// How many batches may be in flight.
    max_in_flight: usize,
    /// Set while the lead is being handed over: nothing is submitted (records queue).
    paused: bool,
    /// What each batch drained in this generation holds, in order, until the state
    /// machine claims it as its own ([`Proposer::claim`]).
    sent: std::collections::VecDeque<(u64, usize, u32)>,
    /// The generation this member leads in, if it leads.
    leading: Option<u64>,
    stopped: bool,
}

fn lock(m: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Proposer {
    /// A proposer submitting to `raft` once this member leads ([`Proposer::lead`]);
    /// starts its sweeper on the current runtime.
    pub fn start(raft: Raft<TypeConfig>, progress: Arc<watch::Sender<Progress>>) -> Arc<Self> {
        let committed = progress.borrow().committed_lsn;
        let p = Arc::new(Proposer {
            raft,
            queue: Mutex::new(Queue {
                first_lsn: committed + 1,
                last_queued: committed,
                submitted: committed,
                ..Queue::default()
            }),
            progress,
            queued: Arc::new(Notify::new()),
            sending: tokio::sync::Mutex::new(()),
        });
        tokio::spawn(sweeper(Arc::downgrade(&p), p.queued.clone()));
        p
    }

    /// Takes records from now on, in `generation`, the first at LSN `committed + 1`,
    /// with one batch in flight at a time (a group of one) or several (`pipelined`).
    pub fn lead(&self, generation: u64, committed: u64, pipelined: bool) {
        let mut q = lock(&self.queue);
        q.records.clear();
        q.joined.clear();
        q.in_flight.clear();
        q.sent.clear();
        q.paused = false;
        q.max_in_flight = if pipelined { PIPELINED_BATCHES } else { 1 };
        q.first_lsn = committed + 1;
        q.last_queued = committed;
        q.submitted = committed;
        q.leading = Some(generation);
    }

    /// Takes no more records and drops those queued (their waiters fail: the
    /// generation moved on).
    pub fn follow(&self) {
        let mut q = lock(&self.queue);
        q.records.clear();
        q.joined.clear();
        q.sent.clear();
        q.leading = None;
    }

    /// Whether `batch`, in an entry of the leader id this member leads under, is the
    /// next batch this generation drained (its records in the state already). A batch
    /// drained in an earlier generation that reached openraft only after this member
    /// led again is not: the state machine then applies it as another leader's.
    pub fn claim(&self, batch: &Batch) -> bool {
        let mut q = lock(&self.queue);
        let mine = q.sent.front().is_some_and(|&(first, n, crc)| {
            first == batch.first_lsn && n == batch.records.len() && crc == batch_crc(batch)
        });
        if mine {
            q.sent.pop_front();
        }
        mine
    }

    /// Stops (`true`) or resumes submitting batches; records queue meanwhile.
    pub fn pause(&self, paused: bool) {
        lock(&self.queue).paused = paused;
        if !paused {
            self.queued.notify_one();
        }
    }

    /// The generation records are queued in now (`None`: this member does not lead).
    pub fn generation(&self) -> Option<u64> {
        lock(&self.queue).leading
    }

    /// Queues record `lsn` (which must follow the previous one). Never waits; call
    /// [`Proposer::wait_committed`] before anything depending on it leaves.
    pub fn append(&self, lsn: u64, record: &[u8]) -> Result<()> {
        self.append_all(&[(lsn, record)])
    }

    /// Queues `records` (LSNs in a row, following the previous one) together: they go
    /// into one batch, so they commit together or not at all (a change and the answer
    /// kept for a repeat of its request, `Record::CallDone`).
    pub fn append_all(&self, records: &[(u64, &[u8])]) -> Result<()> {
        let Some(&(last_lsn, _)) = records.last() else {
            return Ok(());
        };
        let mut q = lock(&self.queue);
        if q.stopped {
            return Err(Error::ShuttingDown);
        }
        if q.leading.is_none() {
            return Err(Error::NotLeader { leader: None });
        }
        if let Some(reason) = &self.progress.borrow().failed {
            return Err(Error::LogFailed {
                reason: reason.clone(),
            });
        }
        for (i, &(lsn, _)) in records.iter().enumerate() {
            if lsn != q.last_queued + 1 + i as u64 {
                return Err(Error::Codec {
                    reason: format!("log record {lsn} queued after {}", q.last_queued + i as u64),
                });
            }
        }
        let was_empty = q.records.is_empty();
        if was_empty {
            q.first_lsn = records[0].0;
        }
        for (i, (_, record)) in records.iter().enumerate() {
            q.records.push(serde_bytes::ByteBuf::from(record.to_vec()));
            q.joined.push(i + 1 < records.len());
        }
        q.last_queued = last_lsn;
        drop(q);
        if was_empty {
            self.queued.notify_one();
        }
        Ok(())
    }

    /// Waits until record `lsn`, queued in `generation`, and every record before it
    /// are committed, submitting the queue first when no batch is in flight.
    pub async fn wait_committed(&self, lsn: u64, generation: u64) -> Result<()> {
        let mut rx = self.progress.subscribe();
        loop {
            {
                let p = rx.borrow_and_update();
                if p.generation != generation {
                    return Err(Error::LeadershipLost { lsn });
                }
                if p.committed_lsn >= lsn {
                    return Ok(());
                }
                if let Some(reason) = &p.failed {
                    return Err(Error::LogFailed {
                        reason: reason.clone(),
                    });
                }
            }
            // Seen before submitting: a commit published meanwhile wakes `changed`.
            self.submit().await;
            if rx.changed().await.is_err() {
                return Err(Error::LogFailed {
                    reason: "the master group's state machine is gone".into(),
                });
            }
        }
    }

    /// The highest committed LSN.
    pub fn committed_lsn(&self) -> u64 {
        self.progress.borrow().committed_lsn
    }

    /// The last LSN queued (or committed before the start).
    pub fn last_queued(&self) -> u64 {
        lock(&self.queue).last_queued
    }

    /// Refuses records from now on (shutdown).
    pub fn stop(&self) {
        lock(&self.queue).stopped = true;
        self.queued.notify_one();
    }

    /// Submits the queue as one batch unless as many batches as may be are in flight or
    /// nothing is queued.
    async fn submit(&self) {
        let _sending = self.sending.lock().await;
        let batch = {
            let mut q = lock(&self.queue);
            let (committed, generation) = {
                let p = self.progress.borrow();
                (p.committed_lsn, p.generation)
            };
            while q.in_flight.front().is_some_and(|&last| last <= committed) {
                q.in_flight.pop_front();
            }
            if q.records.is_empty()
                || q.paused
                || q.in_flight.len() >= q.max_in_flight.max(1)
                || q.leading != Some(generation)
            {
                return;
            }
            let mut bytes = 0usize;
            let mut n = q
                .records
                .iter()
                .take_while(|r| {
                    bytes += r.len();
                    bytes <= MAX_BATCH_BYTES
                })
                .count()
                .max(1);
            // Records queued together stay together, past the size if need be.
            while n < q.records.len() && q.joined[n - 1] {
                n += 1;
            }
            let records: Vec<_> = q.records.drain(..n).collect();
            q.joined.drain(..n);
            let first_lsn = q.first_lsn;
            q.first_lsn += n as u64;
            q.submitted = first_lsn + n as u64 - 1;
            let submitted = q.submitted;
            q.in_flight.push_back(submitted);
            let batch = Batch { first_lsn, records };
            q.sent.push_back((first_lsn, n, batch_crc(&batch)));
            batch
        };
        let last = batch.last_lsn();
        match self.raft.client_write_ff(batch).await {
            Ok(rx) => {
                // The commit is published by the state machine; this only learns of a
                // batch the group refused (it would never commit).
                let progress = self.progress.clone();
                tokio::spawn(async move {
                    let refused = match rx.await {
                        Ok(Ok(_)) => return,
                        // Deposed: the batch's waiters fail with the generation.
                        Ok(Err(openraft::error::ClientWriteError::ForwardToLeader(f))) => {
                            tracing::debug!(last_lsn = ?last, leader = ?f.leader_id, "a batch was refused: this member no longer leads");
                            return;
                        }
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => "the group dropped the batch".to_string(),
                    };
                    fail(
                        &progress,
                        format!("the batch up to LSN {last:?} was refused: {refused}"),
                    );
                });
            }
            Err(fatal) => fail(&self.progress, format!("the master group stopped: {fatal}")),
        }
    }
}

/// A checksum of a batch's records, to tell two batches at the same LSNs apart.
fn batch_crc(batch: &Batch) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for r in &batch.records {
        h.update(&(r.len() as u64).to_le_bytes());
        h.update(r);
    }
    h.finalize()
}

/// Publishes why the log stopped; waiters wake and fail.
fn fail(progress: &watch::Sender<Progress>, reason: String) {
    tracing::error!(%reason, "the master group's log stopped");
    progress.send_modify(|p| {
        if p.failed.is_none() {
            p.failed = Some(reason);
        }
    });
}

/// Submits records nobody waits for, [`SWEEP_AFTER`] after they were queued.
async fn sweeper(p: Weak<Proposer>, queued: Arc<Notify>) {
    loop {
        let Some(proposer) = p.upgrade() else { return };
        let waiting = {
            let q = lock(&proposer.queue);
            if q.stopped {
                return;
            }
            match q.leading {
                Some(generation) if !q.records.is_empty() => Some((q.last_queued, generation)),
                _ => None,
            }
        };
        match waiting {
            Some((lsn, generation)) => {
                drop(proposer);
                tokio::time::sleep(SWEEP_AFTER).await;
                let Some(proposer) = p.upgrade() else { return };
                match proposer.wait_committed(lsn, generation).await {
                    Ok(()) => {}
                    Err(Error::LeadershipLost { .. }) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "the sweeper's records were not committed");
                        return;
                    }
                }
            }
            None => {
                // Registered before the proposer is let go, so a record queued in
                // between still wakes it.
                let notified = queued.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                drop(proposer);
                notified.await;
            }
        }
    }
}
