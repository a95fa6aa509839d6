//! `stampfs admin decommission|recommission|safemode|balance`: the operator's side
//! of the data (the decisions are the master's: `master/src/state/admin.rs`,
//! `master/src/safe_mode.rs`, `master/src/health/balance.rs`).

use crate::cli::{AdminCommand, MasterAddr, SafemodeArg};
use crate::users::ask;
use crate::{EXIT_ERROR, EXIT_OK};
use anyhow::{anyhow, Result};
use stampfs_proto::{
    BalanceAction, BalanceRequest, BalanceStatus, ChunkserverId, ClusterReportRequest,
    Decommission, DecommissionState, SafeModeAction, SafeModeRequest,
};
use std::time::Duration;

/// How often a command that waits asks again.
const POLL: Duration = Duration::from_secs(1);

/// Runs one of the commands above; its exit status.
pub async fn run(cmd: AdminCommand) -> u8 {
    let what = match &cmd {
        AdminCommand::Decommission { .. } => "admin decommission",
        AdminCommand::Recommission { .. } => "admin recommission",
        AdminCommand::Safemode { .. } => "admin safemode",
        AdminCommand::Balance { .. } => "admin balance",
        _ => "admin",
    };
    match dispatch(cmd).await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("stampfs: error: {what}: {e:#}");
            EXIT_ERROR
        }
    }
}

async fn dispatch(cmd: AdminCommand) -> Result<()> {
    match cmd {
        AdminCommand::Decommission {
            master,
            server,
            wait,
        } => decommission(&master, &server, true, wait).await,
        AdminCommand::Recommission { master, server } => {
            decommission(&master, &server, false, false).await
        }
        AdminCommand::Safemode { master, action } => safemode(&master, action).await,
        AdminCommand::Balance {
            master,
            threshold,
            stop,
            status,
            no_wait,
        } => balance(&master, threshold, stop, status, no_wait).await,
        other => Err(anyhow!("{other:?} is not handled here")),
    }
}

/// The chunkserver `name` names: its id, or an address the master knows it by.
async fn resolve(master: &MasterAddr, name: &str) -> Result<ChunkserverId> {
    if let Ok(id) = name.parse::<u64>() {
        return Ok(ChunkserverId(id));
    }
    let report = ask(master, ClusterReportRequest {}).await?;
    report
        .chunkservers
        .iter()
        .find(|c| c.addr == name)
        .map(|c| c.id)
        .ok_or_else(|| {
            anyhow!(
                "no chunkserver has the id or address {name:?} (`stampfs admin report` lists them)"
            )
        })
}

fn decommission_text(id: ChunkserverId, s: &DecommissionState) -> String {
    match s {
        DecommissionState::InService => format!("chunkserver {id}: in service"),
        DecommissionState::Decommissioning { waiting } => format!(
            "chunkserver {id}: decommissioning; {waiting} of its chunks wait for copies elsewhere"
        ),
        DecommissionState::Decommissioned => format!(
            "chunkserver {id}: decommissioned; every chunk it holds has its replication factor elsewhere, so it can be stopped"
        ),
    }
}

async fn decommission(master: &MasterAddr, server: &str, on: bool, wait: bool) -> Result<()> {
    let id = resolve(master, server).await?;
    let mut state = ask(master, Decommission { server: id, on }).await?;
    println!("{}", decommission_text(id, &state));
    while wait && state != DecommissionState::Decommissioned {
        tokio::time::sleep(POLL).await;
        let report = ask(master, ClusterReportRequest {}).await?;
        let now = report
            .chunkservers
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.decommission)
            .ok_or_else(|| anyhow!("chunkserver {id} left the master's report"))?;
        if now != state {
            println!("{}", decommission_text(id, &now));
        }
        if now == DecommissionState::InService {
            return Err(anyhow!("chunkserver {id} was recommissioned meanwhile"));
        }
        state = now;
    }
    Ok(())
}

async fn safemode(master: &MasterAddr, action: SafemodeArg) -> Result<()> {
    let action_of = |a| match a {
        SafemodeArg::Enter => SafeModeAction::Enter,
        SafemodeArg::Leave => SafeModeAction::Leave,
        SafemodeArg::Get | SafemodeArg::Wait => SafeModeAction::Get,
    };
    let mut status = ask(
        master,
        SafeModeRequest {
            action: action_of(action),
        },
    )
    .await?;
    if action == SafemodeArg::Wait {
        let mut said = String::new();
        while status.on {
            let now = status.describe();
            if now != said {
                println!("{now}");
                said = now;
            }
            tokio::time::sleep(POLL).await;
            status = ask(
                master,
                SafeModeRequest {
                    action: SafeModeAction::Get,
                },
            )
            .await?;
        }
    }
    println!("{}", status.describe());
    Ok(())
}

/// One line about the balancer.
pub fn balance_text(b: &BalanceStatus) -> String {
    let avg = f64::from(b.average_ppm) / 10_000.0;
    if !b.running && !b.balanced {
        return "Balancer: not running".into();
    }
    if b.balanced {
        return format!(
            "Balancer: the cluster is balanced (every live chunkserver within {}% of the average use, {avg:.1}%); {} moves ordered",
            b.threshold_pct, b.moves_ordered
        );
    }
    format!(
        "Balancer: running, threshold {}%; average use {avg:.1}%, {} chunkservers over and {} under it by more than that; {} moves ordered",
        b.threshold_pct, b.over, b.under, b.moves_ordered
    )
}

async fn balance(
    master: &MasterAddr,
    threshold_pct: u8,
    stop: bool,
    status: bool,
    no_wait: bool,
) -> Result<()> {
    let action = if stop {
        BalanceAction::Stop
    } else if status {
        BalanceAction::Status
    } else {
        BalanceAction::Start { threshold_pct }
    };
    let mut b = ask(master, BalanceRequest { action }).await?;
    if stop {
        println!("Balancer stopped (copies in flight finish)");
        return Ok(());
    }
    let mut said = balance_text(&b);
    println!("{said}");
    if status || no_wait {
        return Ok(());
    }
    while b.running && !b.balanced {
        tokio::time::sleep(POLL).await;
        b = ask(
            master,
            BalanceRequest {
                action: BalanceAction::Status,
            },
        )
        .await?;
        let now = balance_text(&b);
        if now != said {
            println!("{now}");
            said = now;
        }
        if !b.running && !b.balanced {
            return Err(anyhow!(
                "the balancer was stopped before the cluster was balanced"
            ));
        }
    }
    Ok(())
}
