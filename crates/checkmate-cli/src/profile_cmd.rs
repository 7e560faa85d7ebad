//! `checkmate profile` (being built).

use clap::Args;

/// Arguments of `checkmate profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {}

pub fn run(_args: ProfileArgs) -> anyhow::Result<()> {
    anyhow::bail!("`checkmate profile` is not built yet")
}
