//! `Once` calls: a namespace change made with its answer kept for a repeat of the call
//! (`retry_cache.rs` says why; DESIGN.md "A writer through a failover").
//!
//! The server serves a `Once` call by looking its `(client, call)` up: made, the kept
//! answer, once a read confirms it (what it saw is committed and, in a group, this
//! member still leads); being made right now (its first ask is still under way here),
//! `Unavailable` so the client asks again; otherwise the request is made under
//! [`ONCE`], and its mutation logs `Record::CallDone` with the answer in the same batch
//! as the change ([`Core::mutate_once`]), unless it changed nothing.

use super::Core;
use crate::error::{Error, Result};
use crate::retry_cache::{CachedReply, CallKind, Lookup};
use crate::state::{MasterState, Record};
use stampfs_proto::{ClientId, FileStatus};
use std::collections::HashSet;
use std::sync::Mutex;

tokio::task_local! {
    /// Set while a `Once` call's request is made: its client, call id and kind.
    pub static ONCE: (ClientId, u64, CallKind);
}

/// The answer of a change that returns a status.
pub(super) fn status(s: &FileStatus) -> CachedReply {
    CachedReply::Status(s.clone())
}

/// The answer of a change that returns nothing.
pub(super) fn unit(_: &()) -> CachedReply {
    CachedReply::Unit
}

/// The `Once` calls being made on this member.
#[derive(Debug, Default)]
pub(super) struct CallsInFlight(Mutex<HashSet<(ClientId, u64)>>);

/// Removes its call from the set when the making ends (or is dropped).
pub struct InFlight<'a> {
    calls: &'a CallsInFlight,
    key: (ClientId, u64),
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.calls
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

impl Core {
    /// What call `call` of `client`, a `kind`, made: `Some` answer when it was made
    /// (and committed), `None` when it is to be made now (the returned guard marks it
    /// under way until dropped).
    pub async fn begin_call(
        &self,
        client: ClientId,
        call: u64,
        kind: CallKind,
    ) -> Result<std::result::Result<CachedReply, InFlight<'_>>> {
        // Looked up in the state; only an answer found waits for a read's
        // confirmation (what it saw committed, this member still leading). An absent
        // one is made next, and a mutation of a deposed leader never commits.
        let found = self.state().retry.lookup(client, call, kind);
        match found {
            Lookup::Absent => {}
            Lookup::Made(r) => {
                self.read(|_, _| Ok(())).await?;
                tracing::info!(%client, call, kind = ?kind, "a call asked again: answering what it made");
                return Ok(Ok(r));
            }
            Lookup::OtherKind(k) => {
                return Err(Error::bad_request(format!(
                "call {call} of {client} was a {k:?}, not a {kind:?}: a call id names one request"
            )))
            }
        }
        let key = (client, call);
        let fresh = self
            .calls
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key);
        if !fresh {
            return Err(stampfs_proto::RemoteError::Unavailable {
                reason: format!("call {call} of {client} is being made; ask again"),
            }
            .into());
        }
        // Made between the lookup and the mark (by a request that has just ended)?
        let guard = InFlight {
            calls: &self.calls,
            key,
        };
        let again = self.state().retry.lookup(client, call, kind);
        if let Lookup::Made(r) = again {
            drop(guard);
            return self.read(|_, _| Ok(())).await.map(|()| Ok(r));
        }
        Ok(Err(guard))
    }

    /// [`Core::mutate_durable`] for a change that a `Once` call may make: under
    /// [`ONCE`], its answer (`reply` of its result) is logged with it, in the same
    /// batch, as `Record::CallDone`.
    pub(super) async fn mutate_once<T>(
        &self,
        f: impl FnOnce(&mut MasterState, u64, u64) -> Result<T>,
        reply: impl FnOnce(&T) -> CachedReply,
    ) -> Result<T> {
        let call = ONCE.try_with(|c| *c).ok();
        self.mutate_durable(|st, now, mt| {
            let before = st.outbox_len();
            let v = f(st, now, mt)?;
            // A change that changed nothing (`mkdir -p` of a directory that exists)
            // answers the same when asked again: nothing to keep.
            let changed = st.outbox_len() > before;
            if let (Some((client, call, kind)), true) = (call, changed) {
                st.commit(
                    Record::CallDone {
                        client,
                        call,
                        kind,
                        reply: reply(&v),
                    },
                    now,
                )?;
            }
            Ok(v)
        })
        .await
    }
}
