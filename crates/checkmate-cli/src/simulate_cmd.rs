//! `checkmate simulate`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use checkmate_graph::{format_bytes, simulate, PlanFile};
use clap::Args;
use serde_json::json;

use crate::common::{print_json, GraphArgs};

/// Arguments of `checkmate simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub graph: GraphArgs,
    /// Plan file (checkmate-plan/1) with the graph file's node ids.
    #[arg(long, short = 'p')]
    pub plan: PathBuf,
    /// Also print live activation bytes after every step.
    #[arg(long)]
    pub timeline: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `checkmate simulate`.
pub fn run(args: SimulateArgs) -> Result<()> {
    let graph = args.graph.load()?;
    let file = PlanFile::read(&args.plan, &graph)
        .with_context(|| format!("cannot load plan {}", args.plan.display()))?;
    if file.graph != graph.name() {
        tracing::warn!(plan_graph = %file.graph, graph = %graph.name(), "the plan names another graph");
    }
    let sim = simulate(&graph, &file.plan).with_context(|| {
        format!(
            "plan {} is not valid for graph {}",
            args.plan.display(),
            graph.name()
        )
    })?;
    let total_peak = sim.peak_bytes + graph.static_bytes();
    let within_budget = file.budget_bytes.map(|b| total_peak <= b);
    let matches_prediction = file
        .predicted
        .map(|p| p.peak_bytes == sim.peak_bytes && p.cost == sim.cost);
    if args.json {
        let mut v = json!({
            "graph": graph.name(),
            "strategy": file.strategy,
            "valid": true,
            "peak_bytes": sim.peak_bytes,
            "total_peak_bytes": total_peak,
            "static_bytes": graph.static_bytes(),
            "cost": sim.cost,
            "overhead": sim.overhead(&graph),
            "computes": sim.computes,
            "steps": file.plan.steps.len(),
            "budget_bytes": file.budget_bytes,
            "within_budget": within_budget,
            "matches_prediction": matches_prediction,
        });
        if args.timeline {
            v["live_after_step"] = json!(sim.live_after_step);
        }
        print_json(&v);
    } else {
        println!("graph        {} ({} nodes)", graph.name(), graph.len());
        println!(
            "plan         {} ({} steps, {} computes, strategy {})",
            args.plan.display(),
            file.plan.steps.len(),
            sim.computes,
            file.strategy
        );
        println!("valid        yes");
        println!(
            "peak         {} activations, {} with static",
            format_bytes(sim.peak_bytes),
            format_bytes(total_peak)
        );
        println!(
            "cost         {} {} ({:+.2}% vs no recomputation)",
            sim.cost,
            graph.cost_unit(),
            100.0 * sim.overhead(&graph)
        );
        if let (Some(b), Some(ok)) = (file.budget_bytes, within_budget) {
            println!(
                "budget       {} total: {}",
                format_bytes(b),
                if ok { "within" } else { "EXCEEDED" }
            );
        }
        if let Some(m) = matches_prediction {
            println!(
                "prediction   {}",
                if m {
                    "matches"
                } else {
                    "DIFFERS from the plan file's prediction"
                }
            );
        }
        if args.timeline {
            for (k, b) in sim.live_after_step.iter().enumerate() {
                println!("{k}\t{b}");
            }
        }
    }
    if within_budget == Some(false) {
        anyhow::bail!(
            "the plan's peak ({total_peak} bytes with static memory) exceeds its budget ({} bytes)",
            file.budget_bytes.unwrap_or(0)
        );
    }
    Ok(())
}
