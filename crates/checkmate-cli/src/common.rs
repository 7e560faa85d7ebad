//! Arguments and helpers shared by the subcommands.

use std::path::PathBuf;

use anyhow::{Context, Result};
use checkmate_graph::{Budget, Graph};
use checkmate_solver::baselines::CheckpointAll;
use clap::Args;

/// Where the training graph comes from.
#[derive(Debug, Clone, Args)]
pub struct GraphArgs {
    /// Training graph file (checkmate-graph/1 or networkx node-link JSON).
    #[arg(long, short = 'g')]
    pub graph: PathBuf,
}

impl GraphArgs {
    /// Loads the graph.
    pub fn load(&self) -> Result<Graph> {
        Graph::read(&self.graph).with_context(|| format!("cannot load graph {}", self.graph.display()))
    }
}

/// A budget resolved against a graph.
#[derive(Debug, Clone, Copy)]
pub struct ResolvedBudget {
    /// Total bytes (static + activations).
    pub total_bytes: u64,
    /// Bytes left for activations.
    pub activation_bytes: u64,
    /// Activation peak of checkpoint-all, the reference for percentages.
    pub checkpoint_all_peak: u64,
}

/// Resolves `budget` for `graph`; a total below static memory is an error.
pub fn resolve_budget(graph: &Graph, budget: Budget) -> Result<ResolvedBudget> {
    let checkpoint_all_peak = CheckpointAll::peak_bytes(graph);
    let total_bytes = budget.total_bytes(graph.static_bytes(), checkpoint_all_peak);
    let activation_bytes = total_bytes.checked_sub(graph.static_bytes()).ok_or(
        checkmate_solver::Error::BelowStatic { total_bytes, static_bytes: graph.static_bytes() },
    )?;
    Ok(ResolvedBudget { total_bytes, activation_bytes, checkpoint_all_peak })
}

/// Prints one JSON object on stdout as the last line.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}
