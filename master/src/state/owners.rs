//! Who owns a client id: the user whose connection gave that client a write lease.
//!
//! The master binds a client id to the first user that uses it (`auth::ClientBindings`),
//! so that nobody else can renew, write under or close that client's leases. The
//! bindings are memory; these owners are their durable part. A record that gives a
//! client a lease (`Create`, `Reopen`) is preceded, in the same batch, by a
//! `ClientOwner` record naming the user of the connection it came from, unless that
//! client already holds a lease under that owner ([`MasterState::commit`]). Only then
//! is the owner sure to be in every checkpoint, which is built by replay apart from the
//! live state and keeps the owners of lease holders alone. A restarted master seeds
//! its bindings from them ([`MasterState::owners`]), so that a client's leases are
//! still its user's alone after a restart, before the client speaks again.
//!
//! Owners of clients that hold no lease any more are forgotten when the table has
//! grown past twice the lease holders, and are not written to checkpoints.

use super::{MasterState, Record};
use stampfs_proto::ClientId;
use std::collections::BTreeMap;

/// The table is pruned once it holds more than this and twice the lease holders.
const PRUNE_ABOVE: usize = 1024;

tokio::task_local! {
    /// The user of the connection whose request is being served: the records it
    /// commits that give a client a lease name that user as the client's owner.
    pub static REQUEST_USER: String;
}

impl Record {
    /// The client a record gives a write lease to.
    pub fn leased_to(&self) -> Option<ClientId> {
        match self {
            Record::Create { client, .. } | Record::Reopen { client, .. } => Some(*client),
            Record::WithAttr { record, .. } => record.leased_to(),
            _ => None,
        }
    }
}

impl MasterState {
    /// The `ClientOwner` record to commit before `rec`, if `rec` gives a client a
    /// lease from a user's connection and that owner is not the one known.
    pub(super) fn owner_record(&self, rec: &Record) -> Option<Record> {
        let client = rec.leased_to()?;
        let user = REQUEST_USER.try_with(|u| u.clone()).ok()?;
        // Only an owner that every checkpoint keeps (the client holds a lease) may go
        // unrepeated; checkpoints are built by replay, apart from this state.
        if self.leases.holds_any(client) && self.owners.get(&client) == Some(&user) {
            return None;
        }
        Some(Record::ClientOwner { client, user })
    }

    /// Applies `ClientOwner`.
    pub(super) fn apply_client_owner(&mut self, client: ClientId, user: &str) {
        self.owners.insert(client, user.to_string());
        if self.owners.len() > PRUNE_ABOVE && self.owners.len() > 2 * self.leases.holders() {
            // The client just named keeps its owner: its lease comes with the next record.
            let leases = &self.leases;
            self.owners
                .retain(|c, _| *c == client || leases.holds_any(*c));
        }
    }

    /// The owners of the clients that hold leases: what a checkpoint keeps, and what a
    /// restarted master binds their ids to.
    pub fn owners(&self) -> BTreeMap<ClientId, String> {
        self.owners
            .iter()
            .filter(|(c, _)| self.leases.holds_any(**c))
            .map(|(c, u)| (*c, u.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_record, replay_records, Settings};
    use super::*;
    use stampfs_proto::{Close, Create, InodeId, NewAttr};

    const A: ClientId = ClientId(0xa);
    const B: ClientId = ClientId(0xb);
    const C: ClientId = ClientId(0xc);

    fn create_req(path: &str, client: ClientId) -> Create {
        Create {
            path: path.into(),
            client,
            replication: None,
            chunk_size: None,
            overwrite: false,
            attr: None,
            caller: None,
        }
    }

    fn create(st: &mut MasterState, path: &str, client: ClientId) -> InodeId {
        st.create(&create_req(path, client), 0, 1)
            .expect("create")
            .inode
    }

    fn close(st: &mut MasterState, path: &str, ino: InodeId, client: ClientId) {
        let req = Close {
            path: path.into(),
            client,
            last: None,
            keep_mtime: false,
        };
        st.close(&req, ino, 0, 1).expect("close");
    }

    fn as_user<T>(user: &str, f: impl FnOnce() -> T) -> T {
        REQUEST_USER.sync_scope(user.to_string(), f)
    }

    fn records(st: &mut MasterState) -> Vec<Record> {
        st.take_outbox()
            .iter()
            .map(|(_, b)| decode_record(b).expect("decode"))
            .collect()
    }

    #[test]
    fn a_lease_given_on_a_users_request_logs_its_owner_once_and_survives_restarts() {
        let mut st = MasterState::new(Settings::for_tests());
        let mut log = Vec::new();
        let f = as_user("alice", || create(&mut st, "/f", A));
        log.extend(st.outbox.clone());
        let recs = records(&mut st);
        assert_eq!(
            recs[0],
            Record::ClientOwner {
                client: A,
                user: "alice".into()
            }
        );
        assert!(
            matches!(recs[1], Record::Create { client: A, .. }),
            "{recs:?}"
        );
        let g = as_user("alice", || create(&mut st, "/g", A));
        log.extend(st.outbox.clone());
        assert_eq!(
            records(&mut st).len(),
            1,
            "the owner is known: no second record"
        );
        // A create that names the new file's mode and owner wraps its record.
        let attr = NewAttr {
            mode: 0o600,
            uid: 1000,
            gid: 1000,
        };
        let req = Create {
            attr: Some(attr),
            ..create_req("/c", C)
        };
        let c = as_user("carol", || st.create(&req, 0, 1).expect("create").inode);
        log.extend(st.outbox.clone());
        let recs = records(&mut st);
        assert_eq!(
            recs[0],
            Record::ClientOwner {
                client: C,
                user: "carol".into()
            }
        );
        assert!(matches!(recs[1], Record::WithAttr { .. }), "{recs:?}");
        close(&mut st, "/c", c, C);
        log.extend(st.outbox.clone());
        records(&mut st);
        // The master's own work (no connection) names no owner.
        create(&mut st, "/h", B);
        log.extend(st.outbox.clone());
        assert_eq!(records(&mut st).len(), 1);
        let alice = BTreeMap::from([(A, "alice".to_string())]);
        assert_eq!(st.owners(), alice);

        // Replayed from the log, and from a checkpoint.
        let mut back = MasterState::new(Settings::for_tests());
        let replay = log.iter().map(|(l, b)| (*l, b.as_slice()));
        replay_records(&mut back, replay, 0).expect("replay");
        assert_eq!(back.owners(), alice);
        let snap = st.encode_snapshot().expect("encode");
        let back = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
        assert_eq!(back.owners(), alice);

        // Another user's connection taking A over logs the new owner.
        close(&mut st, "/f", f, A);
        let bob = as_user("bob", || create(&mut st, "/bob", A));
        let recs = records(&mut st);
        assert!(recs.contains(&Record::ClientOwner {
            client: A,
            user: "bob".into()
        }));
        // Once A holds no lease, its owner is not kept.
        close(&mut st, "/g", g, A);
        close(&mut st, "/bob", bob, A);
        assert!(st.owners().is_empty(), "{:?}", st.owners());
        let snap = st.encode_snapshot().expect("encode");
        let back = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
        assert!(back.owners().is_empty());
    }

    #[test]
    fn a_format_7_checkpoint_is_read_without_owners() {
        let mut st = MasterState::new(Settings::for_tests());
        let _open = as_user("alice", || create(&mut st, "/f", A));
        st.bootstrap_admin("admin", [7; 32], 0).expect("a user");
        let v7 = bincode::encode_to_vec(
            (
                7u32,
                st.last_lsn,
                &st.ns,
                &st.chunks,
                &st.servers,
                st.next_server,
                &st.pipelines,
                &st.open_chunks,
                &st.users,
            ),
            bincode::config::standard(),
        )
        .expect("encode");
        let back = MasterState::decode_snapshot(Settings::for_tests(), &v7, 0).expect("decode");
        assert_eq!(back.users, st.users);
        assert_eq!(back.ns, st.ns);
        assert!(back.owners().is_empty(), "format 7 knew no owners");
        assert_eq!(
            back.leases.files_of(A).len(),
            1,
            "the open file's lease is back"
        );
    }

    #[test]
    fn an_owner_outlives_a_checkpoint_taken_while_its_client_held_no_lease() {
        // Live, a client creates and closes a file, a checkpoint is taken (built by
        // replay, as the master builds them), the client creates again: a restart
        // from that checkpoint and the log after it must still know the owner.
        let mut st = MasterState::new(Settings::for_tests());
        let mut log = Vec::new();
        let f = as_user("alice", || create(&mut st, "/f", A));
        close(&mut st, "/f", f, A);
        log.extend(st.take_outbox());
        let mut at_checkpoint = MasterState::new(Settings::for_tests());
        let replay = log.iter().map(|(l, b)| (*l, b.as_slice()));
        replay_records(&mut at_checkpoint, replay, 0).expect("replay");
        let checkpoint = at_checkpoint.encode_snapshot().expect("encode");
        let _g = as_user("alice", || create(&mut st, "/g", A));
        let tail = st.take_outbox();
        let mut back =
            MasterState::decode_snapshot(Settings::for_tests(), &checkpoint, 0).expect("decode");
        let replay = tail.iter().map(|(l, b)| (*l, b.as_slice()));
        replay_records(&mut back, replay, 0).expect("replay the tail");
        assert_eq!(back.owners(), st.owners());
        assert_eq!(back.owners().get(&A).map(String::as_str), Some("alice"));
    }

    #[test]
    fn pruning_keeps_the_owner_of_the_client_being_given_a_lease() {
        let mut st = MasterState::new(Settings::for_tests());
        for i in 0..PRUNE_ABOVE as u64 {
            let client = ClientId(0x1000 + i);
            let path = format!("/f{i}");
            let ino = as_user("alice", || create(&mut st, &path, client));
            close(&mut st, &path, ino, client);
        }
        st.take_outbox();
        let last = ClientId(0x9999);
        let _open = as_user("bob", || create(&mut st, "/last", last));
        assert_eq!(st.owners().get(&last).map(String::as_str), Some("bob"));
        assert!(
            st.owners.len() <= PRUNE_ABOVE,
            "pruned: {}",
            st.owners.len()
        );
    }
}
