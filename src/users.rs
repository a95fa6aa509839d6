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

/// One request on a new, authenticated connection to the master. With several
/// addresses (a master group's members), it goes to the leader: a member that answers
/// `NotLeader` (the request was not applied) sends it to the leader it names, or while
/// none is known (an election) to the next member, as does one that cannot be reached.
pub async fn ask<R>(m: &MasterAddr, req: R) -> Result<R::Response>
where
    R: Rpc<Request = stampfs_proto::MasterRequest> + Clone,
{
    let members = stampfs_proto::net::master_addrs(&m.master);
    let Some(first) = members.first() else {
        return Err(anyhow!("`{}` names no master address", m.master));
    };
    let next = |current: &str| stampfs_proto::net::next_master(&members, current);
    let mut target = first.clone();
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let outcome = ask_one(m, &target, req.clone()).await;
        let last_chance = members.len() == 1 || std::time::Instant::now() >= deadline;
        match outcome {
            Ok(v) => return Ok(v),
            Err(Asked::Answered(stampfs_proto::Error::Remote(
                stampfs_proto::RemoteError::NotLeader { leader },
            ))) if !last_chance => match leader {
                Some(addr) => target = addr,
                None => {
                    target = next(&target);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Err(Asked::Unreached(_)) if !last_chance => {
                target = next(&target);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(Asked::Unreached(e) | Asked::Fatal(e)) => return Err(e),
            Err(Asked::Answered(e)) => return Err(anyhow!("{e}")),
        }
    }
}

/// Why one attempt failed.
enum Asked {
    /// Before the request was sent.
    Unreached(anyhow::Error),
    /// The master's answer, or the failure after sending.
    Answered(stampfs_proto::Error),
    /// Nothing another member would change (the credentials were refused).
    Fatal(anyhow::Error),
}

async fn ask_one<R: Rpc<Request = stampfs_proto::MasterRequest>>(
    m: &MasterAddr,
    master: &str,
    req: R,
) -> std::result::Result<R::Response, Asked> {
    let creds = credentials(m).map_err(Asked::Fatal)?;
    let mut client = RpcClient::connect(&dialer(m).map_err(Asked::Unreached)?, master, TIMEOUT)
        .await
        .with_context(|| format!("cannot reach the master at {master}"))
        .map_err(Asked::Unreached)?;
    let refused = |e: anyhow::Error| Err(Asked::Unreached(e));
    match tokio::time::timeout(TIMEOUT, authenticate_client(&mut client, &creds)).await {
        Err(_) => {
            return refused(anyhow!(
                "the master at {master} did not answer the handshake within {TIMEOUT:?}"
            ))
        }
        Ok(Err(AuthFailure::Refused { reason })) => {
            return Err(Asked::Fatal(anyhow!(
                "the master refused user {}: {reason}",
                creds.user
            )))
        }
        Ok(Err(AuthFailure::MasterUnproven)) => {
            return Err(Asked::Fatal(anyhow!(
                "the master at {master} did not prove that it knows user {}'s key",
                creds.user
            )))
        }
        Ok(Err(AuthFailure::Transport(e))) => {
            return refused(anyhow!("handshake with the master at {master}: {e}"))
        }
        Ok(Ok(_)) => {}
    }
    match tokio::time::timeout(TIMEOUT, client.call(req)).await {
        Err(_) => Err(Asked::Answered(stampfs_proto::Error::Remote(
            stampfs_proto::RemoteError::Unavailable {
                reason: format!("the master at {master} did not answer within {TIMEOUT:?}"),
            },
        ))),
        Ok(r) => r.map_err(Asked::Answered),
    }
}

/// `stampfs admin masters ...`.
pub async fn masters(cmd: crate::cli::MastersCommand) -> u8 {
    use crate::cli::MastersCommand;
    let done = match cmd {
        MastersCommand::Add { master, id, addr } => ask(
            &master,
            stampfs_proto::AddMaster {
                id,
                addr: addr.clone(),
            },
        )
        .await
        .map(|()| format!("member {id} at {addr} added: it votes in the group now")),
        MastersCommand::Remove { master, id } => ask(&master, stampfs_proto::RemoveMaster { id })
            .await
            .map(|()| format!("member {id} removed from the group; stop its process")),
        MastersCommand::TransferLeader { master, id } => {
            ask(&master, stampfs_proto::TransferLeader { to: id })
                .await
                .map(|()| format!("member {id} leads the group"))
        }
    };
    match done {
        Ok(said) => {
            println!("{said}");
            EXIT_OK
        }
        Err(e) => {
            eprintln!("stampfs: error: admin masters: {e:#}");
            EXIT_ERROR
        }
    }
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
