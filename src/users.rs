//! Credentials on the command line, and `stampfs admin user`: adding, listing and
//! removing the users clients authenticate as.

use crate::cli::{MasterAddr, UserCommand};
use crate::{EXIT_ERROR, EXIT_OK};
use anyhow::{anyhow, Context, Result};
use stampfs_proto::auth::{authenticate_client, AuthFailure};
use stampfs_proto::credentials::{ADMIN_CREDENTIALS_FILE, CREDENTIALS_ENV};
use stampfs_proto::net::Dialer;
use stampfs_proto::{AddUser, Credentials, ListUsers, RemoveUser, Rpc, RpcClient};
use std::path::PathBuf;
use std::time::Duration;

/// How long connecting to the master and waiting for its answer may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The credentials a command presents: `--credentials`, else `STAMPFS_CREDENTIALS`,
/// else `~/.config/stampfs/credentials`.
pub fn credentials(m: &MasterAddr) -> Result<Credentials> {
    match Credentials::discover(m.credentials.as_deref())? {
        Some((c, _)) => Ok(c),
        None => Err(anyhow!(
            "no credentials: pass --credentials FILE or set {CREDENTIALS_ENV} (a master writes its superuser's to DIR/{ADMIN_CREDENTIALS_FILE}; `stampfs admin user add` makes others)"
        )),
    }
}

/// How to dial the cluster: TLS with `--tls-ca`, plain TCP without.
pub fn dialer(m: &MasterAddr) -> Result<Dialer> {
    Ok(Dialer::from_ca(m.tls_ca.as_deref())?)
}

/// A client's configuration for `m`: its credentials and how to dial.
pub fn client_config(m: &MasterAddr) -> Result<stampfs_client::ClientConfig> {
    Ok(stampfs_client::ClientConfig {
        credentials: Some(credentials(m)?),
        dialer: dialer(m)?,
        ..Default::default()
    })
}

/// One request on a new, authenticated connection to the master.
pub async fn ask<R: Rpc<Request = stampfs_proto::MasterRequest>>(
    m: &MasterAddr,
    req: R,
) -> Result<R::Response> {
    let creds = credentials(m)?;
    let master = &m.master;
    let mut client = RpcClient::connect(&dialer(m)?, master, TIMEOUT)
        .await
        .with_context(|| format!("cannot reach the master at {master}"))?;
    match tokio::time::timeout(TIMEOUT, authenticate_client(&mut client, &creds)).await {
        Err(_) => {
            return Err(anyhow!(
                "the master at {master} did not answer the handshake within {TIMEOUT:?}"
            ))
        }
        Ok(Err(AuthFailure::Refused { reason })) => {
            return Err(anyhow!("the master refused user {}: {reason}", creds.user))
        }
        Ok(Err(AuthFailure::MasterUnproven)) => {
            return Err(anyhow!(
                "the master at {master} did not prove that it knows user {}'s key",
                creds.user
            ))
        }
        Ok(Err(AuthFailure::Transport(e))) => {
            return Err(anyhow!("handshake with the master at {master}: {e}"))
        }
        Ok(Ok(_)) => {}
    }
    tokio::time::timeout(TIMEOUT, client.call(req))
        .await
        .map_err(|_| anyhow!("the master at {master} did not answer within {TIMEOUT:?}"))?
        .map_err(|e| anyhow!("{e}"))
}

/// `stampfs admin user ...`.
pub async fn run(cmd: UserCommand) -> u8 {
    match user(cmd).await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("stampfs: error: {e:#}");
            EXIT_ERROR
        }
    }
}

async fn user(cmd: UserCommand) -> Result<()> {
    match cmd {
        UserCommand::Add {
            master,
            name,
            uid,
            gid,
            groups,
            superuser,
            output,
        } => {
            let path = output.unwrap_or_else(|| PathBuf::from(format!("{name}.credentials")));
            if path.exists() {
                return Err(anyhow!(
                    "{} already exists; pick another --output",
                    path.display()
                ));
            }
            let reply = ask(
                &master,
                AddUser {
                    name: name.clone(),
                    uid,
                    gid: gid.unwrap_or(uid),
                    groups,
                    superuser,
                },
            )
            .await?;
            let creds = Credentials::new(&reply.user.name, reply.key)?;
            creds.write(&path, true).with_context(|| {
                format!(
                    "user {name} was created but its credentials could not be written; remove it (`stampfs admin user remove {name}`) and add it again"
                )
            })?;
            println!(
                "created user {} (uid {}, gid {}{}); credentials in {}",
                reply.user.name,
                reply.user.uid,
                reply.user.gid,
                if reply.user.superuser {
                    ", superuser"
                } else {
                    ""
                },
                path.display()
            );
            Ok(())
        }
        UserCommand::List { master, json } => {
            let users = ask(&master, ListUsers {}).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&users)?);
                return Ok(());
            }
            println!(
                "{:<20} {:>8} {:>8}  {:<9} groups",
                "user", "uid", "gid", "superuser"
            );
            for u in users {
                let groups: Vec<String> = u.groups.iter().map(u32::to_string).collect();
                println!(
                    "{:<20} {:>8} {:>8}  {:<9} {}",
                    u.name,
                    u.uid,
                    u.gid,
                    if u.superuser { "yes" } else { "no" },
                    groups.join(",")
                );
            }
            Ok(())
        }
        UserCommand::Remove { master, name } => {
            ask(&master, RemoveUser { name: name.clone() }).await?;
            println!("removed user {name}");
            Ok(())
        }
    }
}
