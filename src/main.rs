//! The `stampfs` binary: parses arguments and hands them to the library.

fn main() -> std::process::ExitCode {
    use clap::Parser;
    stampfs::run(stampfs::cli::Cli::parse())
}
