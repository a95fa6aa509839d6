//! A connection to a test master as its superuser: the credentials the master wrote
//! to `DIR/admin.credentials` at its first start, proven on the new connection.

#![allow(dead_code)]

use stampfs_proto::auth::authenticate_client;
use stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE;
use stampfs_proto::{Credentials, RpcClient};
use std::path::Path;
use std::time::Duration;

/// Connects to the master at `addr` (whose directory is `dir`) and proves its
/// superuser's key.
pub async fn connect(addr: &str, dir: &Path) -> RpcClient {
    let mut c = RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        addr,
        Duration::from_secs(10),
    )
    .await
    .expect("connect");
    let creds = Credentials::load(&dir.join(ADMIN_CREDENTIALS_FILE)).expect("admin credentials");
    authenticate_client(&mut c, &creds)
        .await
        .expect("authenticate as the superuser");
    c
}

/// [`connect`], or `None` when the master cannot be reached or refuses.
pub async fn try_connect(addr: &str, dir: &Path) -> Option<RpcClient> {
    let mut c = RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        addr,
        Duration::from_secs(10),
    )
    .await
    .ok()?;
    let creds = Credentials::load(&dir.join(ADMIN_CREDENTIALS_FILE)).ok()?;
    authenticate_client(&mut c, &creds).await.ok()?;
    Some(c)
}
