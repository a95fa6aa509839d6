//! `stampfs admin decommission|recommission|safemode|balance`: the operator's side
//! of the data (the decisions are the master's: `master/src/state/admin.rs`,
//! `master/src/safe_mode.rs`, `master/src/health/balance.rs`).

use crate::cli::{MasterAddr, SafemodeArg};
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

/// The exit status of an admin command that ended with `result`, saying why on a
/// failure.
fn finish(what: &str, result: Result<()>) -> u8 {
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("stampfs: error: {what}: {e:#}");
            EXIT_ERROR
        }
    }
}

/// `stampfs admin decommission` (`on`) or `recommission`.
pub async fn run_decommission(master: MasterAddr, server: String, on: bool, wait: bool) -> u8 {
    let what = if on {
        "admin decommission"
    } else {
        "admin recommission"
    };
    finish(what, decommission(&master, &server, on, wait).await)
}

/// `stampfs admin safemode`.
pub async fn run_safemode(master: MasterAddr, action: SafemodeArg) -> u8 {
    finish("admin safemode", safemode(&master, action).await)
}

/// `stampfs admin balance`.
pub async fn run_balance(
    master: MasterAddr,
    threshold_pct: u8,
    stop: bool,
    status: bool,
    no_wait: bool,
) -> u8 {
    finish(
        "admin balance",
        balance(&master, threshold_pct, stop, status, no_wait).await,
    )
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
        DecommissionState::Unreported => format!(
            "chunkserver {id}: decommissioning; the master has not heard from it since it started, so which chunks it holds is not known (not safe to stop yet)"
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
    if b.stuck {
        return format!(
            "Balancer: gave up after {} moves: no replica it may move would help (every target holds the chunks, or none is quiet); average use {avg:.1}%",
            b.moves_ordered
        );
    }
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
        if b.stuck {
            return Err(anyhow!(
                "the balancer gave up before the cluster was balanced"
            ));
        }
        if !b.running && !b.balanced {
            return Err(anyhow!(
                "the balancer was stopped before the cluster was balanced"
            ));
        }
    }
    Ok(())
}
