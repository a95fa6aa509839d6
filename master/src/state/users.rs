//! Users: the names and keys clients authenticate with, and the identity each one's
//! requests act as. Persisted like the namespace (records `UserAdded`,
//! `UserRemoved`; the checkpoint holds the table), so every master that replays the
//! log knows the same users.
//!
//! The first start of a master creates the superuser `admin` ([`MasterState::bootstrap_admin`]);
//! superusers add the others. A user's key is drawn by the master and handed out once,
//! in the reply that creates it.

use super::{MasterState, Record};
use crate::error::{Error, Result};
use bincode::{Decode, Encode};
use stampfs_proto::credentials::check_user_name;
use stampfs_proto::{AddUser, Caller, UserInfo, MAX_GROUPS};

/// A user as the master stores it. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq, Encode, Decode)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub superuser: bool,
    pub key: [u8; 32],
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("groups", &self.groups)
            .field("superuser", &self.superuser)
            .finish_non_exhaustive()
    }
}

impl User {
    pub fn info(&self, name: &str) -> UserInfo {
        UserInfo {
            name: name.to_string(),
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
            superuser: self.superuser,
        }
    }

    pub fn caller(&self) -> Caller {
        Caller {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

fn bad(reason: String) -> Error {
    Error::BadRequest { reason }
}

impl MasterState {
    /// The user called `name`.
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// The identity of the user whose uid is `uid`, if one is.
    pub fn user_by_uid(&self, uid: u32) -> Option<Caller> {
        self.users.values().find(|u| u.uid == uid).map(User::caller)
    }

    /// Every user, by name.
    pub fn user_list(&self) -> Vec<UserInfo> {
        self.users.iter().map(|(n, u)| u.info(n)).collect()
    }

    /// Creates the user `req` describes with `key`.
    pub fn add_user(&mut self, req: &AddUser, key: [u8; 32], now_ms: u64) -> Result<UserInfo> {
        check_user_name(&req.name).map_err(|e| bad(e.to_string()))?;
        if req.groups.len() > MAX_GROUPS {
            return Err(bad(format!(
                "{} supplementary groups, past {MAX_GROUPS}",
                req.groups.len()
            )));
        }
        if self.users.contains_key(&req.name) {
            return Err(Error::AlreadyExists {
                path: format!("user {}", req.name),
            });
        }
        if let Some((other, _)) = self.users.iter().find(|(_, u)| u.uid == req.uid) {
            return Err(bad(format!("uid {} belongs to user {other}", req.uid)));
        }
        let mut groups = req.groups.clone();
        groups.sort_unstable();
        groups.dedup();
        let user = User {
            uid: req.uid,
            gid: req.gid,
            groups,
            superuser: req.superuser,
            key,
        };
        let info = user.info(&req.name);
        self.commit(
            Record::UserAdded {
                name: req.name.clone(),
                user,
            },
            now_ms,
        )?;
        Ok(info)
    }

    /// Removes the user `name`; never the last superuser.
    pub fn remove_user(&mut self, name: &str, now_ms: u64) -> Result<()> {
        let Some(user) = self.users.get(name) else {
            return Err(Error::NotFound {
                path: format!("user {name}"),
            });
        };
        if user.superuser && self.users.values().filter(|u| u.superuser).count() == 1 {
            return Err(Error::NotPermitted {
                path: format!("user {name}"),
                reason: "the last superuser cannot be removed".into(),
            });
        }
        self.commit(
            Record::UserRemoved {
                name: name.to_string(),
            },
            now_ms,
        )?;
        Ok(())
    }

    /// At a master's first start (no users at all): the superuser `name` (uid 0,
    /// gid 0) with `key`. `None` when there are users already.
    pub fn bootstrap_admin(
        &mut self,
        name: &str,
        key: [u8; 32],
        now_ms: u64,
    ) -> Result<Option<UserInfo>> {
        if !self.users.is_empty() {
            return Ok(None);
        }
        let req = AddUser {
            name: name.to_string(),
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            superuser: true,
        };
        self.add_user(&req, key, now_ms).map(Some)
    }

    /// Applies `UserAdded`.
    pub(super) fn apply_user_added(
        &mut self,
        name: &str,
        user: &User,
    ) -> std::result::Result<(), String> {
        if self.users.contains_key(name) {
            return Err(format!("user {name} already exists"));
        }
        self.users.insert(name.to_string(), user.clone());
        Ok(())
    }

    /// Applies `UserRemoved`.
    pub(super) fn apply_user_removed(&mut self, name: &str) -> std::result::Result<(), String> {
        self.users
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| format!("no user {name}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Settings;

    fn add(name: &str, uid: u32, superuser: bool) -> AddUser {
        AddUser {
            name: name.into(),
            uid,
            gid: uid,
            groups: vec![7, 3, 7],
            superuser,
        }
    }

    #[test]
    fn users_are_added_once_removed_and_survive_replay_and_checkpoints() {
        let mut st = MasterState::new(Settings::for_tests());
        let admin = st.bootstrap_admin("admin", [1; 32], 0).expect("admin");
        assert!(admin.is_some_and(|a| a.superuser && a.uid == 0));
        assert_eq!(
            st.bootstrap_admin("admin", [2; 32], 0).expect("again"),
            None
        );
        let alice = st
            .add_user(&add("alice", 1000, false), [3; 32], 0)
            .expect("alice");
        assert_eq!(alice.groups, vec![3, 7], "sorted, without duplicates");
        assert!(matches!(
            st.add_user(&add("alice", 1001, false), [4; 32], 0),
            Err(Error::AlreadyExists { .. })
        ));
        assert!(matches!(
            st.add_user(&add("bob", 1000, false), [4; 32], 0),
            Err(Error::BadRequest { .. })
        ));
        assert!(matches!(
            st.add_user(&add("-x", 5, false), [4; 32], 0),
            Err(Error::BadRequest { .. })
        ));
        assert!(matches!(
            st.remove_user("admin", 0),
            Err(Error::NotPermitted { .. })
        ));
        st.add_user(&add("bob", 1002, false), [5; 32], 0)
            .expect("bob");
        st.remove_user("bob", 0).expect("remove");
        assert!(matches!(
            st.remove_user("bob", 0),
            Err(Error::NotFound { .. })
        ));
        assert!(!format!("{:?}", st.user("alice")).contains("3, 3"));

        // Replay of the log rebuilds the same table.
        let mut replayed = MasterState::new(Settings::for_tests());
        for (lsn, bytes) in st.take_outbox() {
            let rec = crate::state::decode_record(&bytes).expect("decode");
            replayed.apply(lsn, &rec, 0).expect("apply");
        }
        assert_eq!(replayed.user_list(), st.user_list());
        assert_eq!(replayed.user("alice").map(|u| u.key), Some([3; 32]));
        // And so does a checkpoint.
        let snap = st.encode_snapshot().expect("encode");
        let back = MasterState::decode_snapshot(Settings::for_tests(), &snap, 0).expect("decode");
        assert_eq!(back.user_list(), st.user_list());
        assert_eq!(back.user("admin").map(|u| u.key), Some([1; 32]));
    }
}
