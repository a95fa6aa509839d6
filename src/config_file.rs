//! Server settings from a TOML file: `stampfs master --config FILE` and
//! `stampfs chunkserver --config FILE`.
//!
//! A config file's keys are the server's long flags, with `-` or `_` (`chunk-size` or
//! `chunk_size`), and each value is what the flag takes, read by the flag's own parser:
//! a file sets exactly what the command line can, spelled the same way.
//!
//! ```toml
//! dir = "/var/lib/stampfs/master"     # --dir
//! listen = "10.0.0.1:7070"            # --listen
//! chunk-size = "64MiB"                # sizes and durations as strings, as on the command line
//! replication = 3                     # numbers as numbers (or strings)
//! join = false                        # a switch: true or false
//! peers = ["1=10.0.0.1:7070"]         # a flag given more than once: an array
//! log-format = "json"                 # logging too (crate::logging)
//! ```
//!
//! Each setting comes from the first of: the command line, the environment, the file,
//! the default. Every flag of `stampfs master` reads `STAMPFS_MASTER_<FLAG>` and every
//! flag of `stampfs chunkserver` reads `STAMPFS_CHUNKSERVER_<FLAG>` (`--chunk-size`:
//! `STAMPFS_MASTER_CHUNK_SIZE`), except those both servers (or clients) share:
//! `STAMPFS_MASTER` (a chunkserver's `--master`, as for every client),
//! `STAMPFS_METRICS_LISTEN`, `STAMPFS_LOG_FORMAT` and `STAMPFS_LOG_FILE`. A key that is
//! no flag, a value of the wrong kind (a list for a flag given once, a string for a
//! switch, a table) and a value the flag's parser refuses are errors naming the file
//! and the key: a typo never goes unnoticed.
//!
//! How [`parse`] does it: it parses the command line once leniently, only to learn the
//! config file and where each flag's value came from (`ArgMatches::value_source`); then
//! [`file_args`] (pure: no disk, no environment) turns every key whose flag came
//! neither from the command line nor from the environment into `--key=value`; then the
//! command line with those added is parsed strictly, so every check clap makes
//! (required flags, value parsers, `requires`) applies to the merged settings. The
//! server's config structs stay plain clap structs: a new flag is a new config key.

use crate::cli::Cli;
use crate::logging::LogArgs;
use clap::builder::Resettable;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, CommandFactory, FromArgMatches};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Why the command line or a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line itself (or `--help` / `--version`, which clap reports this way).
    #[error(transparent)]
    Args(#[from] clap::Error),
    #[error("cannot read the config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the config file {} is not valid TOML: {reason}", path.display())]
    Syntax { path: PathBuf, reason: String },
    #[error(
        "the config file {} sets `{key}`, which is no flag of `stampfs {command}`{}; its keys \
         are the command's long flags (`stampfs {command} --help`)",
        path.display(),
        suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default()
    )]
    UnknownKey {
        path: PathBuf,
        command: &'static str,
        key: String,
        /// The flag the key is closest to, when one is close.
        suggestion: Option<String>,
    },
    #[error("the config file {} sets `{key}`, which a config file cannot set: {reason}", path.display())]
    NotInFile {
        path: PathBuf,
        key: String,
        reason: &'static str,
    },
    #[error("the config file {} sets --{flag} twice, as `{first}` and as `{second}`", path.display())]
    Duplicate {
        path: PathBuf,
        flag: String,
        first: String,
        second: String,
    },
    #[error("the config file {}: `{key}` must be {expected}, not {found}", path.display())]
    WrongType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("the config file {}: `{key} = {value}`: {reason}", path.display())]
    BadValue {
        path: PathBuf,
        key: String,
        value: String,
        reason: String,
    },
}

/// This module's results.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Ends the process as the error asks: clap's own errors (and `--help`) print as
    /// clap prints them; a config file's error prints on stderr with status 2 (usage).
    pub fn exit(self) -> ExitCode {
        match self {
            Error::Args(e) => e.exit(),
            e => {
                eprintln!("stampfs: {e}");
                ExitCode::from(crate::EXIT_UNAVAILABLE)
            }
        }
    }
}

/// The flags every server process takes besides its own configuration: its config
/// file, and how it logs.
#[derive(Args, Clone, Debug, Default)]
pub struct ServerArgs {
    /// TOML file of settings: each key is one of this command's long flags
    /// (`chunk-size = "64MiB"`, `join = true`, `peers = ["1=HOST:PORT"]`); flags and
    /// environment variables override it. Unknown keys are an error.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub log: LogArgs,
}

/// A parsed command line.
#[derive(Debug)]
pub struct Invocation {
    pub cli: Cli,
    /// A server's config file and logging flags (all defaults for other commands).
    pub server: ServerArgs,
}

/// A server subcommand that takes [`ServerArgs`], with the environment variables of
/// the flags its config struct does not name itself.
struct Server {
    name: &'static str,
    /// `--config`'s variable.
    config_env: &'static str,
    /// The TLS flags, flattened in from `stampfs_proto::net::TlsFiles` (shared with
    /// other commands, so it names no variable): (arg id, variable).
    tls_env: [(&'static str, &'static str); 3],
}

const SERVERS: [Server; 2] = [
    Server {
        name: "master",
        config_env: "STAMPFS_MASTER_CONFIG",
        tls_env: [
            ("tls_cert", "STAMPFS_MASTER_TLS_CERT"),
            ("tls_key", "STAMPFS_MASTER_TLS_KEY"),
            ("tls_ca", "STAMPFS_MASTER_TLS_CA"),
        ],
    },
    Server {
        name: "chunkserver",
        config_env: "STAMPFS_CHUNKSERVER_CONFIG",
        tls_env: [
            ("tls_cert", "STAMPFS_CHUNKSERVER_TLS_CERT"),
            ("tls_key", "STAMPFS_CHUNKSERVER_TLS_KEY"),
            ("tls_ca", "STAMPFS_CHUNKSERVER_TLS_CA"),
        ],
    },
];

/// The `stampfs` command: [`Cli`] with [`ServerArgs`] added to each server.
pub fn command() -> Command {
    let mut cmd = Cli::command();
    for server in &SERVERS {
        cmd = cmd.mut_subcommand(server.name, |sub| {
            // The derive sets the command's description from the struct's doc: keep
            // the server's own.
            let (about, long_about) = (sub.get_about().cloned(), sub.get_long_about().cloned());
            ServerArgs::augment_args(sub)
                .about(Resettable::from(about))
                .long_about(Resettable::from(long_about))
                .mut_args(|arg| {
                    let id = arg.get_id().as_str();
                    let env = if id == "config" {
                        Some(server.config_env)
                    } else {
                        server
                            .tls_env
                            .iter()
                            .find(|(i, _)| *i == id)
                            .map(|(_, e)| *e)
                    };
                    match env {
                        Some(env) if arg.get_env().is_none() => arg.env(env),
                        _ => arg,
                    }
                })
        });
    }
    cmd
}

/// Parses `args` (the program name first), reading a server's `--config` file.
pub fn parse<I, T>(args: I) -> Result<Invocation>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args = args.into_iter().map(Into::into).collect();
    parse_with(command(), args, &|path| std::fs::read_to_string(path))
}

/// [`parse`] with `cmd` for the command and `read` for the file system.
fn parse_with(
    mut cmd: Command,
    mut args: Vec<OsString>,
    read: &dyn Fn(&Path) -> std::io::Result<String>,
) -> Result<Invocation> {
    // Where the file's settings go does not matter: a server takes no positional
    // arguments, and only flags the command line does not give are added.
    args.extend(file_settings(&cmd, &args, read)?);
    let mut matches = cmd.try_get_matches_from_mut(&args)?;
    let server = match matches.subcommand() {
        Some((name, sub)) if SERVERS.iter().any(|s| s.name == name) => {
            ServerArgs::from_arg_matches(sub).map_err(|e| e.format(&mut cmd))?
        }
        _ => ServerArgs::default(),
    };
    let cli = Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))?;
    Ok(Invocation { cli, server })
}

/// The arguments a server's config file adds to `args`; none for another command, or
/// without `--config`, or when the command line is wrong anyway (the strict parse says
/// how).
fn file_settings(
    cmd: &Command,
    args: &[OsString],
    read: &dyn Fn(&Path) -> std::io::Result<String>,
) -> Result<Vec<OsString>> {
    let Ok(lenient) = cmd.clone().ignore_errors(true).try_get_matches_from(args) else {
        return Ok(Vec::new());
    };
    let Some((name, given)) = lenient.subcommand() else {
        return Ok(Vec::new());
    };
    let Some(server) = SERVERS.iter().find(|s| s.name == name) else {
        return Ok(Vec::new());
    };
    let Some(path) = given.try_get_one::<PathBuf>("config").ok().flatten() else {
        return Ok(Vec::new());
    };
    let Some(sub) = cmd.find_subcommand(server.name) else {
        return Ok(Vec::new());
    };
    let text = read(path).map_err(|source| Error::Read {
        path: path.clone(),
        source,
    })?;
    file_args(sub, server.name, given, path, &text)
}

/// The `--flag=value` arguments that config file `path` (its contents `text`) adds to
/// the command line of `cmd` (`stampfs NAME`), whose lenient parse is `given`: one per
/// key (one per element of an array; a switch set to `true` is `--flag`) whose flag
/// `given` has neither from the command line nor from the environment. Every key is
/// checked, overridden or not: unknown keys, values of the wrong kind and values the
/// flag's parser refuses are errors.
pub fn file_args(
    cmd: &Command,
    name: &'static str,
    given: &ArgMatches,
    path: &Path,
    text: &str,
) -> Result<Vec<OsString>> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Syntax {
        path: path.to_path_buf(),
        reason: e.to_string().trim().to_string(),
    })?;
    let flags: Vec<&Arg> = cmd.get_arguments().filter(|a| settable(a)).collect();
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    let mut out = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let Some(arg) = flags.iter().find(|a| a.get_long() == Some(long.as_str())) else {
            let longs = || flags.iter().filter_map(|a| a.get_long());
            // A section (`[tls]` with `cert = ...`) for flags that share a prefix.
            let in_section = match value {
                toml::Value::Table(t) => t
                    .keys()
                    .map(|k| format!("{long}-{}", k.replace('_', "-")))
                    .find(|f| longs().any(|l| l == f)),
                _ => None,
            };
            return Err(Error::UnknownKey {
                path: path.to_path_buf(),
                command: name,
                key: key.clone(),
                suggestion: in_section.or_else(|| closest(&long, longs())),
            });
        };
        if arg.get_id() == "config" {
            return Err(Error::NotInFile {
                path: path.to_path_buf(),
                key: key.clone(),
                reason: "it names the config file itself",
            });
        }
        let flag = arg.get_long().unwrap_or_default();
        if let Some(first) = seen.insert(flag, key) {
            return Err(Error::Duplicate {
                path: path.to_path_buf(),
                flag: flag.to_string(),
                first: first.to_string(),
                second: key.clone(),
            });
        }
        let wrong = |expected, found| Error::WrongType {
            path: path.to_path_buf(),
            key: key.clone(),
            expected,
            found,
        };
        let setting = match arg.get_action() {
            ArgAction::SetTrue | ArgAction::SetFalse => match value {
                toml::Value::Boolean(on) => {
                    // `--flag` when the value is the one the flag sets.
                    let sets = matches!(arg.get_action(), ArgAction::SetTrue);
                    if *on == sets {
                        vec![OsString::from(format!("--{flag}"))]
                    } else {
                        Vec::new()
                    }
                }
                other => return Err(wrong("true or false", kind(other))),
            },
            action if action.takes_values() => {
                let values = match value {
                    toml::Value::Array(items) if takes_many(arg) => items
                        .iter()
                        .map(|v| scalar(v).ok_or_else(|| wrong("a list of values", kind(v))))
                        .collect::<Result<Vec<_>>>()?,
                    toml::Value::Array(_) => return Err(wrong("one value", "a list")),
                    v => vec![scalar(v).ok_or_else(|| wrong("a value", kind(v)))?],
                };
                for v in &values {
                    check(arg, v).map_err(|reason| Error::BadValue {
                        path: path.to_path_buf(),
                        key: key.clone(),
                        value: value.to_string(),
                        reason,
                    })?;
                }
                values
                    .into_iter()
                    .map(|v| OsString::from(format!("--{flag}={v}")))
                    .collect()
            }
            _ => {
                return Err(Error::NotInFile {
                    path: path.to_path_buf(),
                    key: key.clone(),
                    reason: "it is no setting",
                })
            }
        };
        let overridden = matches!(
            given.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !overridden {
            out.extend(setting);
        }
    }
    Ok(out)
}

/// Whether a config file may name `arg`: a long flag that is no `--help`/`--version`.
fn settable(arg: &Arg) -> bool {
    arg.get_long().is_some()
        && !matches!(
            arg.get_action(),
            ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
        )
}

/// Whether `arg` takes several values: given more than once, or a delimited list.
fn takes_many(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
        || arg.get_value_delimiter().is_some()
        || arg.get_num_args().is_some_and(|n| n.max_values() > 1)
}

/// A TOML scalar as the text a flag would take; `None` for an array or a table.
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Datetime(d) => Some(d.to_string()),
        toml::Value::Array(_) | toml::Value::Table(_) => None,
    }
}

/// What kind of TOML value `value` is, for an error.
fn kind(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "a list",
        toml::Value::Table(_) => "a table",
    }
}

/// Runs `arg`'s value parser on `value` (each element, for a delimited list), as the
/// command line would, on a copy of `arg` alone (without its relations to other flags);
/// the error is clap's message, on one line.
fn check(arg: &Arg, value: &str) -> std::result::Result<(), String> {
    let flag = arg.get_long().unwrap_or_default();
    let alone = arg
        .clone()
        .required(false)
        .requires(Resettable::Reset)
        .conflicts_with(Resettable::Reset)
        .overrides_with(Resettable::Reset)
        .env(None);
    let probe = Command::new("stampfs")
        .no_binary_name(true)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(alone);
    match probe.try_get_matches_from([format!("--{flag}={value}")]) {
        Ok(_) => Ok(()),
        Err(e) => {
            let text = e.to_string();
            let text = text.split("\n\nFor more information").next().unwrap_or("");
            let text = text.trim().trim_start_matches("error: ");
            Err(text.split_whitespace().collect::<Vec<_>>().join(" "))
        }
    }
}

/// The flag among `flags` within a few edits of `key`, for "did you mean".
fn closest<'a>(key: &str, flags: impl Iterator<Item = &'a str>) -> Option<String> {
    flags
        .map(|f| (edit_distance(key, f), f))
        .filter(|(d, f)| *d <= 2.max(f.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f.to_string())
}

/// Levenshtein distance between `a` and `b`, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(above + 1)
                .min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command as Sub;
    use crate::logging::LogFormat;
    use std::time::Duration;

    /// Parses `args` with `file` as the contents of every config file.
    fn parse_file(args: &[&str], file: &str) -> Result<Invocation> {
        parse_in(command(), args, file)
    }

    fn parse_in(cmd: Command, args: &[&str], file: &str) -> Result<Invocation> {
        let file = file.to_string();
        let mut all = vec![OsString::from("stampfs")];
        all.extend(args.iter().map(OsString::from));
        parse_with(cmd, all, &move |_| Ok(file.clone()))
    }

    fn master(inv: Invocation) -> stampfs_master::MasterConfig {
        match inv.cli.command {
            Sub::Master(cfg) => cfg,
            other => panic!("not a master: {other:?}"),
        }
    }

    fn chunkserver(inv: Invocation) -> stampfs_chunkserver::ChunkserverConfig {
        match inv.cli.command {
            Sub::Chunkserver(cfg) => cfg,
            other => panic!("not a chunkserver: {other:?}"),
        }
    }

    const MASTER_FILE: &str = r#"
        dir = "/from/file"
        listen = "10.0.0.1:7070"
        replication = 2
        chunk-size = "1MiB"
        lease_soft = "2s"
        lease-hard = "4s"
        peers = ["1=10.0.0.1:7070", "2=10.0.0.2:7070,3=10.0.0.3:7070"]
        join = false
        log-format = "json"
        log-file = "/var/log/stampfs/master.log"
    "#;

    #[test]
    fn the_file_sets_what_the_flags_would() {
        let inv = parse_file(&["master", "--config", "/etc/m.toml"], MASTER_FILE).expect("ok");
        assert_eq!(inv.server.config, Some(PathBuf::from("/etc/m.toml")));
        assert_eq!(inv.server.log.log_format, LogFormat::Json);
        assert_eq!(
            inv.server.log.log_file,
            Some(PathBuf::from("/var/log/stampfs/master.log"))
        );
        let m = master(inv);
        assert_eq!(m.dir, PathBuf::from("/from/file"));
        assert_eq!(m.listen, "10.0.0.1:7070");
        assert_eq!(m.replication, 2);
        assert_eq!(m.chunk_size, 1 << 20);
        assert_eq!(m.lease_soft, Duration::from_secs(2));
        assert_eq!(m.lease_hard, Duration::from_secs(4));
        let peers: Vec<u64> = m.peers.iter().map(|p| p.id).collect();
        assert_eq!(peers, [1, 2, 3], "an array, each element a delimited list");
        assert!(!m.join);
    }

    #[test]
    fn a_flag_overrides_the_file() {
        let inv = parse_file(
            &[
                "master",
                "--replication",
                "5",
                "--config",
                "/etc/m.toml",
                "--peers",
                "1=10.0.0.1:7070",
                "--log-format",
                "text",
            ],
            MASTER_FILE,
        )
        .expect("ok");
        assert_eq!(inv.server.log.log_format, LogFormat::Text);
        let m = master(inv);
        assert_eq!(m.replication, 5);
        assert_eq!(
            m.peers.len(),
            1,
            "the command line's list replaces the file's"
        );
        assert_eq!(m.chunk_size, 1 << 20, "the rest still from the file");
    }

    /// The environment as it is (no test changes it): `--listen` reads PATH here,
    /// which every process has, to stand for a set STAMPFS_* variable.
    fn listen_from_path() -> Command {
        command().mut_subcommand("master", |c| c.mut_arg("listen", |a| a.env("PATH")))
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let path = std::env::var("PATH").expect("PATH is set");
        let inv = parse_in(
            listen_from_path(),
            &["master", "--config", "/etc/m.toml"],
            MASTER_FILE,
        )
        .expect("ok");
        let m = master(inv);
        assert_eq!(m.listen, path);
        assert_eq!(m.replication, 2, "the rest still from the file");
    }

    #[test]
    fn a_flag_overrides_the_environment() {
        let inv = parse_in(
            listen_from_path(),
            &["master", "--config", "/m", "--listen", "127.0.0.1:1"],
            MASTER_FILE,
        )
        .expect("ok");
        assert_eq!(master(inv).listen, "127.0.0.1:1");
    }

    #[test]
    fn defaults_stand_where_the_file_is_silent() {
        let m = master(parse_file(&["master", "--config", "/m"], "dir = \"/d\"").expect("ok"));
        assert_eq!(m.replication, 3);
        assert_eq!(m.dead_after, Duration::from_secs(10));
        assert!(m.peers.is_empty());
    }

    #[test]
    fn a_required_flag_may_come_from_the_file_or_not_at_all() {
        let cs = chunkserver(
            parse_file(
                &["chunkserver", "--config", "/c", "--dir", "/cs"],
                "cluster-key-file = \"/etc/stampfs/cluster.key\"\nheartbeat = \"250ms\"",
            )
            .expect("ok"),
        );
        assert_eq!(cs.dir, PathBuf::from("/cs"));
        assert_eq!(
            cs.cluster_key_file,
            PathBuf::from("/etc/stampfs/cluster.key")
        );
        assert_eq!(cs.heartbeat, Duration::from_millis(250));
        let Err(Error::Args(e)) = parse_file(&["chunkserver", "--config", "/c"], "dir = \"/d\"")
        else {
            panic!("started without --cluster-key-file");
        };
        assert!(e.to_string().contains("--cluster-key-file"), "{e}");
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_it_and_the_file() {
        let Err(e) = parse_file(
            &["master", "--config", "/etc/stampfs/master.toml"],
            "dir = \"/d\"\nreplicaton = 2",
        ) else {
            panic!("a typo was accepted");
        };
        assert!(matches!(&e, Error::UnknownKey { key, .. } if key == "replicaton"));
        let text = e.to_string();
        assert!(text.contains("`replicaton`"), "{text}");
        assert!(text.contains("/etc/stampfs/master.toml"), "{text}");
        assert!(text.contains("did you mean `replication`"), "{text}");
        let Err(e) = parse_file(&["master", "--config", "/m"], "[tls]\ncert = \"c.pem\"") else {
            panic!("a section was accepted");
        };
        assert!(e.to_string().contains("did you mean `tls-cert`"), "{e}");
        let Err(e) = parse_file(&["master", "--config", "/m"], "frobnicate = 1") else {
            panic!("accepted");
        };
        assert!(!e.to_string().contains("did you mean"), "{e}");
    }

    #[test]
    fn a_value_of_the_wrong_kind_is_an_error_naming_the_key() {
        for (file, key, expected) in [
            ("join = \"yes\"", "join", "true or false"),
            ("replication = [2, 3]", "replication", "one value"),
            ("listen = { host = \"a\" }", "listen", "a value"),
            ("peers = [[\"1=a:1\"]]", "peers", "a list of values"),
        ] {
            let Err(e) = parse_file(&["master", "--config", "/m", "--dir", "/d"], file) else {
                panic!("{file} accepted");
            };
            assert!(
                matches!(&e, Error::WrongType { key: k, expected: x, .. } if k == key && *x == expected),
                "{file}: {e}"
            );
            assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
        }
    }

    #[test]
    fn a_value_the_flag_refuses_is_an_error_naming_the_key() {
        for (file, key, says) in [
            ("replication = \"three\"", "replication", "invalid digit"),
            ("dead-after = 10", "dead-after", "time unit"),
            ("chunk_size = \"lots\"", "chunk_size", "lots"),
            ("log = \"raft\"", "log", "oplog"),
            ("peers = [\"1=a:1,x\"]", "peers", "ID=HOST:PORT"),
        ] {
            let Err(e) = parse_file(&["master", "--config", "/m", "--dir", "/d"], file) else {
                panic!("{file} accepted");
            };
            assert!(
                matches!(&e, Error::BadValue { key: k, .. } if k == key),
                "{file}: {e}"
            );
            let text = e.to_string();
            assert!(text.contains(&format!("`{key} = ")), "{text}");
            assert!(text.contains(says), "{file}: {text}");
            assert!(!text.contains('\n'), "one line: {text}");
        }
    }

    #[test]
    fn an_overridden_key_is_still_checked() {
        let Err(e) = parse_file(
            &[
                "master",
                "--config",
                "/m",
                "--dir",
                "/d",
                "--replication",
                "2",
            ],
            "replication = \"three\"",
        ) else {
            panic!("accepted");
        };
        assert!(matches!(e, Error::BadValue { .. }), "{e}");
    }

    #[test]
    fn dashes_and_underscores_name_the_same_flag_but_only_once() {
        let m = master(
            parse_file(
                &["master", "--config", "/m"],
                "dir = \"/d\"\nmin_replication = 2\nmax-connections = 7",
            )
            .expect("ok"),
        );
        assert_eq!((m.min_replication, m.max_connections), (2, 7));
        let Err(e) = parse_file(
            &["master", "--config", "/m"],
            "dir = \"/d\"\nchunk-size = \"1MiB\"\nchunk_size = \"2MiB\"",
        ) else {
            panic!("accepted");
        };
        assert!(
            matches!(&e, Error::Duplicate { flag, .. } if flag == "chunk-size"),
            "{e}"
        );
    }

    #[test]
    fn the_file_cannot_name_another_config_file() {
        let Err(e) = parse_file(&["master", "--config", "/m"], "config = \"/other.toml\"") else {
            panic!("accepted");
        };
        assert!(
            matches!(&e, Error::NotInFile { key, .. } if key == "config"),
            "{e}"
        );
    }

    #[test]
    fn help_and_version_are_no_keys() {
        for key in ["help", "version"] {
            let Err(e) = parse_file(&["master", "--config", "/m"], &format!("{key} = true")) else {
                panic!("{key} accepted");
            };
            assert!(matches!(e, Error::UnknownKey { .. }), "{key}: {e}");
        }
    }

    #[test]
    fn bad_toml_and_a_missing_file_name_the_file() {
        let Err(e) = parse_file(&["master", "--config", "/etc/m.toml"], "dir = ") else {
            panic!("accepted");
        };
        assert!(matches!(e, Error::Syntax { .. }), "{e}");
        assert!(e.to_string().contains("/etc/m.toml"), "{e}");
        let Err(e) = parse(["stampfs", "master", "--config", "/nonexistent/stampfs.toml"]) else {
            panic!("accepted");
        };
        assert!(matches!(e, Error::Read { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/stampfs.toml"), "{e}");
    }

    #[test]
    fn other_commands_take_no_config_file() {
        let inv = parse_file(&["ls", "/"], "").expect("ok");
        assert!(inv.server.config.is_none());
        assert!(matches!(
            parse_file(&["ls", "--config", "/c", "/"], ""),
            Err(Error::Args(_))
        ));
        // Without --config a server is what the flags say.
        let m = master(parse_file(&["master", "--dir", "/d"], "replication = 1").expect("ok"));
        assert_eq!(m.replication, 3);
    }

    /// `STAMPFS_MASTER_<FLAG>`, `STAMPFS_CHUNKSERVER_<FLAG>`, but for the variables
    /// the servers share with each other and with clients.
    #[test]
    fn every_server_flag_reads_an_environment_variable() {
        let shared = [
            ("log-format", "STAMPFS_LOG_FORMAT"),
            ("log-file", "STAMPFS_LOG_FILE"),
            ("metrics-listen", "STAMPFS_METRICS_LISTEN"),
            ("metrics-token-file", "STAMPFS_METRICS_TOKEN_FILE"),
        ];
        let cmd = command();
        for (name, prefix, own) in [
            ("master", "STAMPFS_MASTER_", &[][..]),
            (
                "chunkserver",
                "STAMPFS_CHUNKSERVER_",
                &[("master", "STAMPFS_MASTER")][..],
            ),
        ] {
            let sub = cmd.find_subcommand(name).expect("a server");
            for arg in sub.get_arguments().filter(|a| settable(a)) {
                let long = arg.get_long().unwrap_or_default();
                let want = shared
                    .iter()
                    .chain(own)
                    .find(|(l, _)| *l == long)
                    .map(|(_, v)| v.to_string())
                    .unwrap_or_else(|| {
                        format!("{prefix}{}", long.replace('-', "_").to_uppercase())
                    });
                assert_eq!(
                    arg.get_env().and_then(|e| e.to_str()),
                    Some(want.as_str()),
                    "`stampfs {name} --{long}` should read {want} (add `env = \"{want}\"`)"
                );
            }
        }
    }

    #[test]
    fn the_contrib_examples_load_and_validate() {
        let contrib = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib");
        let inv = parse([
            OsString::from("stampfs"),
            "master".into(),
            "--config".into(),
            contrib.join("master.toml").into(),
        ])
        .expect("contrib/master.toml loads");
        assert_eq!(inv.server.log.log_format, LogFormat::Text);
        let m = master(inv);
        m.validate().expect("contrib/master.toml validates");
        assert_eq!(m.dir, PathBuf::from("/var/lib/stampfs/master"));
        let inv = parse([
            OsString::from("stampfs"),
            "chunkserver".into(),
            "--config".into(),
            contrib.join("chunkserver.toml").into(),
        ])
        .expect("contrib/chunkserver.toml loads");
        let cs = chunkserver(inv);
        cs.validate().expect("contrib/chunkserver.toml validates");
        assert_eq!(
            cs.cluster_key_file,
            PathBuf::from("/etc/stampfs/cluster.key")
        );
    }

    #[test]
    fn the_servers_keep_their_own_description() {
        let cmd = command();
        for (name, about) in [
            ("master", "Run the master"),
            ("chunkserver", "Run a chunkserver"),
        ] {
            let sub = cmd.find_subcommand(name).expect("a server");
            let said = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            assert!(said.starts_with(about), "{name}: {said}");
        }
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("replicaton", "replication"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(
            closest("heartbeet", ["heartbeat", "dir"].into_iter()),
            Some("heartbeat".into())
        );
        assert_eq!(closest("zzz", ["heartbeat", "dir"].into_iter()), None);
    }
}
