//! `stampfs bench pipeline` (being built).

use crate::cli::BenchPipelineArgs;

/// Runs the write-pipeline benchmark.
pub async fn run(_args: BenchPipelineArgs) -> u8 {
    eprintln!("stampfs bench pipeline: not built yet (the benchmark issue). Nothing was done.");
    crate::EXIT_UNAVAILABLE
}
