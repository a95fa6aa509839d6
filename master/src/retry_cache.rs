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
//! within seconds); a member that steps down and rebuilds its state keeps the answers
//! it had up to the commit point ([`RetryCache::keep_up_to`]). Soft state, bounded by
//! [`CAPACITY_BYTES`] (an estimate of each answer's size), oldest evicted first.

use bincode::{Decode, Encode};
use stampfs_proto::{ClientId, FileStatus};
use std::collections::{HashMap, VecDeque};

/// How many bytes of answers are kept (estimated: [`ENTRY_BYTES`] each, plus the
/// path of a status).
pub const CAPACITY_BYTES: usize = 64 << 20;
/// The estimated size of an answer without its path.
pub const ENTRY_BYTES: usize = 160;

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
    /// After every older variant, so that each keeps its wire index.
    DeleteNow,
    RestoreTrash,
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
            R::DeleteNow(_) => CallKind::DeleteNow,
            R::RestoreTrash(_) => CallKind::RestoreTrash,
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

/// One kept answer.
#[derive(Clone, Debug)]
struct Entry {
    kind: CallKind,
    reply: CachedReply,
    /// The LSN of its `Record::CallDone`.
    lsn: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        ENTRY_BYTES
            + match &self.reply {
                CachedReply::Status(s) => s.path.len(),
                _ => 0,
            }
    }
}

/// The cache (see the module docs).
#[derive(Debug, Default)]
pub struct RetryCache {
    entries: HashMap<(ClientId, u64), Entry>,
    order: VecDeque<(ClientId, u64)>,
    bytes: usize,
}

impl RetryCache {
    /// Keeps the answer of call `call` of `client`, logged at `lsn`, evicting the
    /// oldest beyond [`CAPACITY_BYTES`].
    pub fn insert(
        &mut self,
        client: ClientId,
        call: u64,
        kind: CallKind,
        reply: CachedReply,
        lsn: u64,
    ) {
        let e = Entry { kind, reply, lsn };
        self.bytes += e.bytes();
        match self.entries.insert((client, call), e) {
            Some(old) => self.bytes -= old.bytes(),
            None => self.order.push_back((client, call)),
        }
        while self.bytes > CAPACITY_BYTES {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.entries.remove(&key) {
                self.bytes -= old.bytes();
            }
        }
    }

    /// Forgets the answers logged after `lsn` (records a deposed leader's rebuilt
    /// state does not hold), keeping the others.
    pub fn keep_up_to(&mut self, lsn: u64) {
        let entries = &mut self.entries;
        let mut bytes = self.bytes;
        self.order.retain(|key| match entries.get(key) {
            Some(e) if e.lsn > lsn => {
                bytes -= e.bytes();
                entries.remove(key);
                false
            }
            Some(_) => true,
            None => false,
        });
        self.bytes = bytes;
    }

    /// The answer of call `call` of `client`, asked again as a `kind`.
    pub fn lookup(&self, client: ClientId, call: u64, kind: CallKind) -> Lookup {
        match self.entries.get(&(client, call)) {
            None => Lookup::Absent,
            Some(e) if e.kind != kind => Lookup::OtherKind(e.kind),
            Some(e) => Lookup::Made(e.reply.clone()),
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
        c.insert(a, 1, CallKind::Rename, CachedReply::Unit, 10);
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
        let n = (CAPACITY_BYTES / ENTRY_BYTES) as u64;
        for call in 0..n + 10 {
            c.insert(
                ClientId(1),
                call,
                CallKind::SetXattr,
                CachedReply::Bool(true),
                call,
            );
        }
        assert_eq!(c.len() as u64, n);
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
            11,
        );
        assert_eq!(c.len() as u64, n);
        // Long paths take more room: fewer of them are kept.
        let long = FileStatus {
            path: "/".repeat(4000),
            inode: stampfs_proto::InodeId(9),
            kind: stampfs_proto::FileKind::Directory,
            length: 0,
            replication: 0,
            chunk_size: 0,
            state: stampfs_proto::FileState::Closed,
            attr: stampfs_proto::Attr::default(),
        };
        for call in 0..n {
            c.insert(
                ClientId(2),
                call,
                CallKind::Mkdir,
                CachedReply::Status(long.clone()),
                call,
            );
        }
        assert!(c.len() < (CAPACITY_BYTES / 4000) + 1, "{}", c.len());
    }

    #[test]
    fn a_rebuilt_state_keeps_the_answers_up_to_the_commit_point() {
        let mut c = RetryCache::default();
        for call in 1..=10 {
            c.insert(
                ClientId(1),
                call,
                CallKind::Delete,
                CachedReply::Unit,
                100 + call,
            );
        }
        c.keep_up_to(105);
        assert_eq!(c.len(), 5);
        assert!(matches!(
            c.lookup(ClientId(1), 5, CallKind::Delete),
            Lookup::Made(_)
        ));
        assert_eq!(c.lookup(ClientId(1), 6, CallKind::Delete), Lookup::Absent);
        // What was forgotten can be kept again.
        c.insert(ClientId(1), 6, CallKind::Delete, CachedReply::Unit, 106);
        assert_eq!(c.len(), 6);
    }
}
