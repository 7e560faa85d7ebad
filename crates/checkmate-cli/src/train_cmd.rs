//! `checkmate train` (being built).

use clap::Args;

/// Arguments of `checkmate train`.
#[derive(Debug, Args)]
pub struct TrainArgs {}

pub fn run(_args: TrainArgs) -> anyhow::Result<()> {
    anyhow::bail!("`checkmate train` is not built yet")
}
