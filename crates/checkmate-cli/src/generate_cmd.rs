//! `checkmate generate`: a random layered graph of Moccasin's benchmark family, of our own making.

use std::path::PathBuf;

use anyhow::{Context, Result};
use checkmate_graph::generate::{random_layered, to_layered_node_link, LayeredParams};
use clap::Args;
use serde_json::json;

use crate::common::print_json;

/// Arguments of `checkmate generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Width factor `w` (mean level width `2 w sqrt(nodes)`); Moccasin's files use 0.27-0.43.
    #[arg(long, default_value_t = 0.31)]
    pub width: f64,
    /// Level-width variance `nlv`.
    #[arg(long, default_value_t = 0.75)]
    pub level_variance: f64,
    /// Edge density `ed` between consecutive levels.
    #[arg(long, default_value_t = 0.2)]
    pub edge_density: f64,
    /// Fraction `scd` of edges that skip levels.
    #[arg(long, default_value_t = 0.14)]
    pub skip_density: f64,
    /// Random seed (the same seed and parameters give the same graph on every machine).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write Moccasin's node-link form instead of checkmate-graph/1.
    #[arg(long)]
    pub node_link: bool,
    /// Output file.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    pub json: bool,
}

/// Runs `checkmate generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let params = LayeredParams {
        nodes: args.nodes,
        width: args.width,
        level_variance: args.level_variance,
        edge_density: args.edge_density,
        skip_density: args.skip_density,
    };
    let g = random_layered(&params, args.seed)?;
    if args.node_link {
        std::fs::write(&args.out, to_layered_node_link(&g))
            .with_context(|| format!("cannot write {}", args.out.display()))?;
    } else {
        g.write(&args.out)?;
    }
    if args.json {
        print_json(&json!({
            "graph": g.name(), "nodes": g.len(), "edges": g.edge_count(),
            "out": args.out.display().to_string(),
        }));
    } else {
        println!(
            "wrote {} ({} nodes, {} edges) to {}",
            g.name(),
            g.len(),
            g.edge_count(),
            args.out.display()
        );
    }
    Ok(())
}
