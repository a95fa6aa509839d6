//! Users, as methods of [`Core`]: the superuser a master creates at its first start,
//! the keys connections prove, and the administration of users (superusers only; the
//! connection handler checks that before these run).

use super::Core;
use crate::error::Result;
use stampfs_proto::credentials::{Credentials, ADMIN_CREDENTIALS_FILE, ADMIN_USER};
use stampfs_proto::{AddUser, AddUserReply, ListUsers, RemoveUser, UserInfo};
use std::sync::atomic::Ordering;

impl Core {
    /// At a master's first start (no users yet): creates the superuser. Its
    /// credentials are `DIR/admin.credentials`: read from there when the file exists
    /// (an operator's or a test harness's key, or one written by a start that crashed
    /// before its record was durable), else drawn and written there (mode 0600)
    /// before the record, so a crash in between never leaves a superuser nobody has
    /// the key of.
    pub async fn bootstrap_admin(&self) -> Result<()> {
        if !self.state().user_list().is_empty() {
            return Ok(());
        }
        let path = self.config.dir.join(ADMIN_CREDENTIALS_FILE);
        let creds = if path.exists() {
            let c = Credentials::load(&path)?;
            tracing::info!(file = %path.display(), user = %c.user, "no users yet: the superuser takes the credentials already in the directory");
            c
        } else {
            let c = Credentials::generate(ADMIN_USER)?;
            c.write(&path, true)?;
            c
        };
        let added = self
            .mutate_durable(|st, now, _| st.bootstrap_admin(&creds.user, creds.key_bytes(), now))
            .await?;
        if added.is_some() {
            tracing::info!(user = %creds.user, file = %path.display(), "created the superuser; clients present its credentials with --credentials FILE or STAMPFS_CREDENTIALS");
        }
        Ok(())
    }

    /// The user table's epoch: raised after every change of it.
    pub fn users_epoch(&self) -> u64 {
        self.users_epoch.load(Ordering::Acquire)
    }

    fn users_changed(&self) {
        self.users_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The key and identity of user `name`, for a connection's handshake.
    pub fn user_key(&self, name: &str) -> Option<([u8; 32], UserInfo)> {
        self.state().user(name).map(|u| (u.key, u.info(name)))
    }

    #[tracing::instrument(skip_all, fields(user = %req.name))]
    pub async fn add_user(&self, req: AddUser) -> Result<AddUserReply> {
        let key: [u8; 32] = rand::random();
        let user = self
            .mutate_durable(|st, now, _| st.add_user(&req, key, now))
            .await?;
        self.users_changed();
        tracing::info!(uid = user.uid, superuser = user.superuser, "user added");
        Ok(AddUserReply { user, key })
    }

    pub async fn list_users(&self, _req: ListUsers) -> Result<Vec<UserInfo>> {
        self.read(|st, _| Ok(st.user_list())).await
    }

    #[tracing::instrument(skip_all, fields(user = %req.name))]
    pub async fn remove_user(&self, req: RemoveUser) -> Result<()> {
        self.mutate_durable(|st, now, _| st.remove_user(&req.name, now))
            .await?;
        self.users_changed();
        tracing::info!("user removed");
        Ok(())
    }
}
