//! The `stampfs` binary: parses arguments (and a server's config file) and hands them
//! to the library.

fn main() -> std::process::ExitCode {
    match stampfs::config_file::parse(std::env::args_os()) {
        Ok(invocation) => stampfs::run(invocation.cli, invocation.server),
        Err(e) => e.exit(),
    }
}
