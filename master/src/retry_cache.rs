//! The answers of recent namespace changes, kept for a repeat of their request.
//!
//! A client of a master group sends a request that changes the namespace in one step
//! (mkdir, create, rename, delete, symlink, set-xattr) as a `Once` call, under a call
//! id of its own. When the master makes the change it logs, in the same batch as the
//! change, `Record::CallDone` with the answer; every member applies it here. If the
//! answer is lost (the leader died, the connection broke) the client asks again, and
//! whichever member leads by then finds the call and answers what was made, instead of
//! making it twice (`AlreadyExists` for the mkdir it made). HDFS keeps its RetryCache
//! the same way: rebuilt from the edits, not in the checkpoints, so a call whose
//! record went into a snapshot before the repeat is made again (rare: the repeat comes
//! within seconds). Soft state, bounded by [`CAPACITY`] entries, oldest evicted first.

use bincode::{Decode, Encode};
use stampfs_proto::{ClientId, FileStatus};
use std::collections::{HashMap, VecDeque};

/// How many answers are kept (a few hundred bytes each).
pub const CAPACITY: usize = 1 << 18;

/// The answer of a cached call.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum CachedReply {
    /// Mkdir, Create, MakeFile, Symlink.
    Status(FileStatus),
    /// Rename, Delete.
    Unit,
    /// SetXattr.
    Bool(bool),
}

/// The kind of request a call was (a call id reused for another kind is refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Encode, Decode)]
pub enum CallKind {
    Mkdir,
    Create,
    MakeFile,
    Rename,
    Delete,
    Symlink,
    SetXattr,
}

impl CallKind {
    /// The kind of `req`, if the master caches it.
    pub fn of(req: &stampfs_proto::MasterRequest) -> Option<CallKind> {
        use stampfs_proto::MasterRequest as R;
        Some(match req {
            R::Mkdir(_) => CallKind::Mkdir,
            R::Create(_) => CallKind::Create,
            R::MakeFile(_) => CallKind::MakeFile,
            R::Rename(_) => CallKind::Rename,
            R::Delete(_) => CallKind::Delete,
            R::Symlink(_) => CallKind::Symlink,
            R::SetXattr(_) => CallKind::SetXattr,
            _ => return None,
        })
    }
}

/// What a lookup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Not made (or forgotten): make it.
    Absent,
    /// Made: its answer.
    Made(CachedReply),
    /// The call id names a call of another kind.
    OtherKind(CallKind),
}

/// The cache (see the module docs).
#[derive(Debug, Default)]
pub struct RetryCache {
    entries: HashMap<(ClientId, u64), (CallKind, CachedReply)>,
    order: VecDeque<(ClientId, u64)>,
}

impl RetryCache {
    /// Keeps the answer of call `call` of `client`, evicting the oldest beyond
    /// [`CAPACITY`].
    pub fn insert(&mut self, client: ClientId, call: u64, kind: CallKind, reply: CachedReply) {
        if self.entries.insert((client, call), (kind, reply)).is_none() {
            self.order.push_back((client, call));
        }
        while self.order.len() > CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }

    /// The answer of call `call` of `client`, asked again as a `kind`.
    pub fn lookup(&self, client: ClientId, call: u64, kind: CallKind) -> Lookup {
        match self.entries.get(&(client, call)) {
            None => Lookup::Absent,
            Some((k, _)) if *k != kind => Lookup::OtherKind(*k),
            Some((_, r)) => Lookup::Made(r.clone()),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_answered_again_and_a_reused_id_of_another_kind_is_told() {
        let mut c = RetryCache::default();
        let (a, b) = (ClientId(1), ClientId(2));
        assert_eq!(c.lookup(a, 1, CallKind::Rename), Lookup::Absent);
        c.insert(a, 1, CallKind::Rename, CachedReply::Unit);
        assert_eq!(
            c.lookup(a, 1, CallKind::Rename),
            Lookup::Made(CachedReply::Unit)
        );
        assert_eq!(
            c.lookup(b, 1, CallKind::Rename),
            Lookup::Absent,
            "per client"
        );
        assert_eq!(
            c.lookup(a, 1, CallKind::Delete),
            Lookup::OtherKind(CallKind::Rename)
        );
    }

    #[test]
    fn the_oldest_answers_go_beyond_the_capacity() {
        let mut c = RetryCache::default();
        for call in 0..(CAPACITY as u64 + 10) {
            c.insert(
                ClientId(1),
                call,
                CallKind::SetXattr,
                CachedReply::Bool(true),
            );
        }
        assert_eq!(c.len(), CAPACITY);
        assert_eq!(c.lookup(ClientId(1), 9, CallKind::SetXattr), Lookup::Absent);
        assert!(matches!(
            c.lookup(ClientId(1), 10, CallKind::SetXattr),
            Lookup::Made(_)
        ));
        // The same call kept twice counts once.
        c.insert(
            ClientId(1),
            10,
            CallKind::SetXattr,
            CachedReply::Bool(false),
        );
        assert_eq!(c.len(), CAPACITY);
    }
}
