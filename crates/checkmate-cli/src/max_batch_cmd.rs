//! `checkmate max-batch` (being built).

use clap::Args;

/// Arguments of `checkmate max-batch`.
#[derive(Debug, Args)]
pub struct MaxBatchArgs {}

pub fn run(_args: MaxBatchArgs) -> anyhow::Result<()> {
    anyhow::bail!("`checkmate max-batch` is not built yet")
}
