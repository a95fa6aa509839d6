//! Where a process's log lines go and how they look.
//!
//! Every `stampfs` process logs through `tracing`. [`LogArgs`] are the flags a server
//! takes for it (`stampfs master` and `stampfs chunkserver`, also from their config
//! file): `--log-format text|json` and `--log-file PATH`. [`init`] installs the
//! subscriber once, at start-up:
//!
//! | format | to stderr | to `--log-file` (appended) |
//! | --- | --- | --- |
//! | `text` | one line per event, coloured on a terminal | the same, never coloured |
//! | `json` | one JSON object per line (`timestamp`, `level`, `fields`, `target`, spans) | the same |
//!
//! `RUST_LOG` overrides the default filter the caller passes (`info` for servers).

use std::path::PathBuf;

/// How log lines are written (`--log-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors (journald, Loki, Elasticsearch...).
    Json,
}

/// A server's logging flags.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LogArgs {
    /// How log lines are written: `text` for people, `json` (one object per line) for
    /// log collectors.
    #[arg(
        long,
        value_enum,
        env = "STAMPFS_LOG_FORMAT",
        default_value = "text",
        value_name = "FORMAT"
    )]
    pub log_format: LogFormat,
    /// Append the log to this file (created when missing; never coloured) instead of
    /// writing it to stderr. Errors that stop the server at start-up still go to
    /// stderr too.
    #[arg(long, env = "STAMPFS_LOG_FILE", value_name = "PATH")]
    pub log_file: Option<PathBuf>,
}

/// Installs the process's subscriber: `format` lines to `file` when given (appended,
/// no colours), else to stderr (coloured when it is a terminal and `format` is text).
/// `RUST_LOG` overrides `default`. A second call does nothing.
pub fn init(default: &str, format: LogFormat, file: Option<std::fs::File>) {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let to_terminal = file.is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let writer = match file {
        // One event is formatted whole and written in one call under the lock, so
        // lines from different threads never interleave.
        Some(f) => BoxMakeWriter::new(std::sync::Mutex::new(f)),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(to_terminal).try_init(),
        LogFormat::Json => builder.with_ansi(false).json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
    }

    #[test]
    fn text_to_stderr_by_default() {
        let cli = Cli::try_parse_from(["t"]).expect("parses");
        assert_eq!(cli.log.log_format, LogFormat::Text);
        assert_eq!(cli.log.log_file, None);
    }

    #[test]
    fn json_to_a_file_by_flags() {
        let cli =
            Cli::try_parse_from(["t", "--log-format", "json", "--log-file", "/l"]).expect("parses");
        assert_eq!(cli.log.log_format, LogFormat::Json);
        assert_eq!(cli.log.log_file, Some(PathBuf::from("/l")));
    }

    #[test]
    fn an_unknown_format_is_refused_naming_the_choices() {
        let Err(e) = Cli::try_parse_from(["t", "--log-format", "xml"]) else {
            panic!("xml accepted");
        };
        let e = e.to_string();
        assert!(e.contains("text") && e.contains("json"), "{e}");
    }
}
