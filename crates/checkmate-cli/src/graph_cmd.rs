//! `checkmate graph`: export a zoo model's training graph.

use std::path::PathBuf;

use anyhow::{Context, Result};
use checkmate_graph::{format_bytes, NodeKind};
use checkmate_solver::baselines::CheckpointAll;
use clap::Args;
use serde_json::json;

use crate::common::{print_json, ModelArgs};

/// Arguments of `checkmate graph`.
#[derive(Debug, Args)]
pub struct GraphCmdArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Where to write the checkmate-graph/1 file.
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// Runs `checkmate graph`.
pub fn run(args: GraphCmdArgs) -> Result<()> {
    let name = args.model.model.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "give --model NAME (one of {})",
            checkmate_models::MODEL_NAMES.join(", ")
        )
    })?;
    let graph = args.model.build(&name)?;
    graph
        .write(&args.output)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let peak = CheckpointAll::peak_bytes(&graph);
    let count = |k| graph.nodes().iter().filter(|n| n.kind == k).count();
    if args.json {
        print_json(&json!({
            "graph": graph.name(),
            "output": args.output.display().to_string(),
            "nodes": graph.len(),
            "forward_nodes": count(NodeKind::Forward),
            "backward_nodes": count(NodeKind::Backward),
            "edges": graph.edge_count(),
            "static_bytes": graph.static_bytes(),
            "checkpoint_all_peak_bytes": peak,
            "min_feasible_activation_bytes": graph.min_feasible_activation_bytes(),
            "total_cost": graph.total_cost(),
            "cost_unit": graph.cost_unit(),
        }));
    } else {
        println!("graph        {} -> {}", graph.name(), args.output.display());
        println!(
            "nodes        {} ({} forward, 1 loss, {} backward), {} edges",
            graph.len(),
            count(NodeKind::Forward),
            count(NodeKind::Backward),
            graph.edge_count()
        );
        println!("static       {}", format_bytes(graph.static_bytes()));
        println!(
            "activations  {} peak without rematerialization",
            format_bytes(peak)
        );
        println!(
            "cost         {} {} per step",
            graph.total_cost(),
            graph.cost_unit()
        );
    }
    Ok(())
}
