//! The network of a run: plain loopback, or one network namespace per process so the
//! run can partition it.
//!
//! With [`Net::namespaces`] every process of the run (the master, each chunkserver,
//! each client) and the runner's own admin calls live in a network namespace of their
//! own, named `stampfs-nemesis-PID-RUN-HOST`. Each has one veth interface `eth0` with
//! an address in 10.77.0.0/24 whose peer is a port of a bridge in the run's hub
//! namespace. Nothing is added to the machine's own namespace, and the namespaces of
//! one run see nothing of another's, so every run can use the same addresses.
//!
//! A [`Cut`] is carried out by nftables rules in the namespace of every member of both
//! groups that drop the packets *arriving* from the other group: silently, like a real
//! partition (senders get no error; their connections stall and time out). Healing
//! flushes the rules. Dropping the [`Net`] deletes the namespaces; namespaces left by a
//! nemesis process that no longer exists are deleted at the next start.
//!
//! A process enters its namespace between fork and exec ([`enter_on_exec`]); the
//! runner's calls run on a thread of their own that entered the runner's namespace
//! ([`Net::admin`]).

use crate::schedule::{Cut, Target};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::future::Future;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The prefix of every namespace a nemesis run creates.
const PREFIX: &str = "stampfs-nemesis-";
/// The nftables table in each process's namespace.
const TABLE: &str = "stampfs_nemesis";

/// Runs of this process so far (part of the namespace names).
static RUNS: AtomicU32 = AtomicU32::new(0);

/// How the run's processes reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetMode {
    /// Everything on 127.0.0.1: no partitions.
    Loopback,
    /// A network namespace per process: partitions.
    Namespaces,
}

impl std::str::FromStr for NetMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "loopback" => Ok(NetMode::Loopback),
            "namespaces" | "netns" => Ok(NetMode::Namespaces),
            other => Err(format!(
                "unknown network mode {other:?} (loopback, namespaces)"
            )),
        }
    }
}

impl NetMode {
    /// Namespaces when this process is root and `ip` and `nft` are installed;
    /// otherwise loopback, with the reason.
    pub fn detect() -> (NetMode, Option<String>) {
        if !nix::unistd::geteuid().is_root() {
            return (
                NetMode::Loopback,
                Some("not root: no network namespaces, so no partitions".into()),
            );
        }
        for tool in ["ip", "nft"] {
            let found = Command::new(tool)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                return (
                    NetMode::Loopback,
                    Some(format!(
                        "`{tool}` not found (install iproute2 and nftables): no partitions"
                    )),
                );
            }
        }
        (NetMode::Namespaces, None)
    }
}

/// One process's place in the network.
#[derive(Clone, Debug)]
struct Host {
    ns: String,
    ip: Ipv4Addr,
}

/// The run's network; see the module docs.
pub struct Net {
    mode: NetMode,
    hosts: BTreeMap<Target, Host>,
    runner: Option<Host>,
    /// Every namespace created, deleted on drop.
    created: Vec<String>,
}

/// The address of a host of the run in namespace mode.
fn address(t: Target) -> Option<Ipv4Addr> {
    let last = match t {
        Target::Master(0) => 2,
        Target::Master(i) if i < crate::schedule::MAX_MASTERS => 4 + i as u8,
        Target::Chunkserver(i) if i < 90 => 10 + i as u8,
        Target::Client(i) if i < 100 => 100 + i as u8,
        _ => return None,
    };
    Some(Ipv4Addr::new(10, 77, 0, last))
}

/// The runner's own address.
const RUNNER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);

/// Runs `ip`/`nft` with `args`, `stdin` fed in; an error with its stderr otherwise.
fn tool(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<()> {
    use std::io::Write;
    let mut c = Command::new(cmd);
    c.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let what = format!("{cmd} {}", args.join(" "));
    let mut child = c.spawn().map_err(|e| Error::Net {
        what: what.clone(),
        detail: e.to_string(),
    })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(|e| Error::Net {
            what: what.clone(),
            detail: e.to_string(),
        })?;
    }
    let out = child.wait_with_output().map_err(|e| Error::Net {
        what: what.clone(),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Net {
            what,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Runs `args` of `ip`.
fn ip(args: &[&str]) -> Result<()> {
    tool("ip", args, None)
}

/// The nftables ruleset of a host's namespace before any partition.
fn base_ruleset() -> String {
    format!(
        "table inet {TABLE} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n  }}\n}}\n"
    )
}

/// The rule that drops what arrives from `from`.
fn drop_rule(from: &[Ipv4Addr]) -> String {
    let set: Vec<String> = from.iter().map(|a| a.to_string()).collect();
    format!(
        "add rule inet {TABLE} input ip saddr {{ {} }} drop\n",
        set.join(", ")
    )
}

/// The pid a namespace name of ours carries, if it is one.
fn owner_pid(ns: &str) -> Option<i32> {
    ns.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Deletes the namespaces left by nemesis processes that no longer exist.
fn delete_orphans() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = owner_pid(name) else {
            continue;
        };
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if !alive {
            tracing::info!(ns = name, "deleting the namespace of an ended nemesis run");
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Net {
    /// Everything on loopback.
    pub fn loopback() -> Net {
        Net {
            mode: NetMode::Loopback,
            hosts: BTreeMap::new(),
            runner: None,
            created: Vec::new(),
        }
    }

    /// A namespace per host of `hosts` and one for the runner, wired to one bridge.
    pub fn namespaces(hosts: &[Target]) -> Result<Net> {
        delete_orphans();
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{PREFIX}{}-{run}", std::process::id());
        let mut net = Net {
            mode: NetMode::Namespaces,
            hosts: BTreeMap::new(),
            runner: None,
            created: Vec::new(),
        };
        let hub = format!("{tag}-hub");
        net.add_ns(&hub)?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for &t in hosts {
            let Some(addr) = address(t) else {
                return Err(Error::Net {
                    what: format!("an address for {t}"),
                    detail: "too many processes for 10.77.0.0/24".into(),
                });
            };
            let host = net.add_host(&tag, &hub, &t.to_string(), addr)?;
            net.hosts.insert(t, host);
        }
        net.runner = Some(net.add_host(&tag, &hub, "runner", RUNNER_IP)?);
        tracing::info!(%tag, hosts = hosts.len(), "network namespaces ready");
        Ok(net)
    }

    fn add_ns(&mut self, name: &str) -> Result<()> {
        ip(&["netns", "add", name])?;
        self.created.push(name.to_string());
        Ok(())
    }

    /// A namespace `TAG-NAME` with `eth0` at `addr`, its peer on the hub's bridge.
    fn add_host(&mut self, tag: &str, hub: &str, name: &str, addr: Ipv4Addr) -> Result<Host> {
        let ns = format!("{tag}-{name}");
        self.add_ns(&ns)?;
        let port = format!("v-{name}");
        ip(&[
            "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port, "netns",
            hub,
        ])?;
        ip(&["-n", hub, "link", "set", &port, "master", "br0"])?;
        ip(&["-n", hub, "link", "set", &port, "up"])?;
        let cidr = format!("{addr}/24");
        ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        tool(
            "ip",
            &["netns", "exec", &ns, "nft", "-f", "-"],
            Some(&base_ruleset()),
        )?;
        Ok(Host { ns, ip: addr })
    }

    pub fn mode(&self) -> NetMode {
        self.mode
    }

    /// The address `t` listens on (without a port).
    pub fn ip(&self, t: Target) -> Ipv4Addr {
        self.hosts.get(&t).map_or(Ipv4Addr::LOCALHOST, |h| h.ip)
    }

    /// The namespace file `t`'s process enters, if any.
    pub fn netns_of(&self, t: Target) -> Option<PathBuf> {
        self.hosts.get(&t).map(|h| netns_path(&h.ns))
    }

    /// The namespace file of the runner's calls, if any.
    pub fn runner_netns(&self) -> Option<PathBuf> {
        self.runner.as_ref().map(|h| netns_path(&h.ns))
    }

    /// Drops all traffic between the groups of `cut`.
    pub fn partition(&self, cut: &Cut) -> Result<()> {
        if self.mode == NetMode::Loopback {
            return Err(Error::Net {
                what: format!("partition {cut}"),
                detail: "the run is on loopback".into(),
            });
        }
        let ips = |g: crate::schedule::Group| -> Vec<Ipv4Addr> {
            g.members()
                .into_iter()
                .filter_map(|t| self.hosts.get(&t).map(|h| h.ip))
                .collect()
        };
        let (a, b) = (ips(cut.a), ips(cut.b));
        for (members, others) in [(cut.a, &b), (cut.b, &a)] {
            for t in members.members() {
                if let Some(h) = self.hosts.get(&t) {
                    tool(
                        "ip",
                        &["netns", "exec", &h.ns, "nft", "-f", "-"],
                        Some(&drop_rule(others)),
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Drops, in `at`'s namespace only, what arrives from `from`: a one-way fault, in
    /// which `at`'s packets still reach them and their answers (TCP acknowledgements
    /// included) are lost. Healed by [`Net::heal`] like a partition.
    pub fn drop_arriving(&self, at: Target, from: &[Target]) -> Result<()> {
        let what = || format!("drop what {at} receives from {from:?}");
        let Some(h) = self.hosts.get(&at) else {
            return Err(Error::Net {
                what: what(),
                detail: format!("{at} has no namespace of its own in this run"),
            });
        };
        let ips: Vec<Ipv4Addr> = from
            .iter()
            .filter_map(|t| self.hosts.get(t).map(|h| h.ip))
            .collect();
        if ips.len() != from.len() {
            return Err(Error::Net {
                what: what(),
                detail: "a sender has no namespace of its own in this run".into(),
            });
        }
        tool(
            "ip",
            &["netns", "exec", &h.ns, "nft", "-f", "-"],
            Some(&drop_rule(&ips)),
        )
    }

    /// Lets all traffic through again.
    pub fn heal(&self) -> Result<()> {
        for h in self.hosts.values() {
            tool(
                "ip",
                &[
                    "netns", "exec", &h.ns, "nft", "flush", "chain", "inet", TABLE, "input",
                ],
                None,
            )?;
        }
        Ok(())
    }

    /// Runs `f` on a thread of its own inside the runner's namespace (on a runtime of
    /// its own: sockets belong to the namespace of the thread that opened them).
    pub async fn admin<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>>,
        T: Send + 'static,
    {
        let ns = match self.runner_netns() {
            Some(p) => Some(File::open(&p).map_err(Error::io(&p))?),
            None => None,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("nemesis-admin".into())
            .spawn(move || {
                let result = (|| {
                    if let Some(ns) = &ns {
                        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(
                            |e| Error::Net {
                                what: "enter the runner's namespace".into(),
                                detail: e.to_string(),
                            },
                        )?;
                    }
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(Error::io("tokio runtime"))?;
                    rt.block_on(f())
                })();
                let _ = tx.send(result);
            })
            .map_err(|source| Error::Spawn {
                name: "nemesis-admin thread".into(),
                source,
            })?;
        rx.await.map_err(|_| Error::Net {
            what: "an admin call".into(),
            detail: "its thread ended without an answer".into(),
        })?
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.created.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                tracing::warn!(%ns, error = %e, "cannot delete a network namespace");
            }
        }
    }
}

fn netns_path(ns: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(ns)
}

/// Makes `cmd`'s process enter the network namespace `netns` before it executes.
pub fn enter_on_exec(cmd: &mut Command, netns: &std::path::Path) -> Result<()> {
    let ns = File::open(netns).map_err(Error::io(netns))?;
    // SAFETY: between fork and exec the closure only calls setns(2), which is
    // async-signal-safe, on a descriptor opened before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_get_distinct_addresses_in_one_subnet() {
        let mut seen = std::collections::HashSet::new();
        let hosts = (0..crate::schedule::MAX_MASTERS)
            .map(Target::Master)
            .chain((0..8).map(Target::Chunkserver))
            .chain((0..8).map(Target::Client));
        for t in hosts {
            let a = address(t).expect("an address");
            assert_eq!(a.octets()[..3], [10, 77, 0]);
            assert_ne!(a, RUNNER_IP);
            assert!(seen.insert(a), "{t} shares {a}");
        }
        assert_eq!(address(Target::Network), None);
    }

    #[test]
    fn the_owner_of_a_namespace_is_read_from_its_name_only_if_it_is_ours() {
        assert_eq!(owner_pid("stampfs-nemesis-4242-0-cs1"), Some(4242));
        assert_eq!(owner_pid("stampfs-nemesis-x-0-cs1"), None);
        assert_eq!(owner_pid("other-4242"), None);
    }

    #[test]
    fn a_drop_rule_names_every_source() {
        let r = drop_rule(&[Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 11)]);
        assert_eq!(
            r,
            "add rule inet stampfs_nemesis input ip saddr { 10.77.0.2, 10.77.0.11 } drop\n"
        );
        assert!(base_ruleset().contains("hook input"));
    }

    #[test]
    fn network_modes_parse() {
        assert_eq!("loopback".parse::<NetMode>(), Ok(NetMode::Loopback));
        assert_eq!("namespaces".parse::<NetMode>(), Ok(NetMode::Namespaces));
        assert!("wifi".parse::<NetMode>().is_err());
    }
}
