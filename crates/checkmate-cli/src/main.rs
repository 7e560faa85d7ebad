//! `checkmate`: schedule, simulate and sweep tensor-rematerialization plans.

mod common;
mod graph_cmd;
mod simulate_cmd;
mod solve_cmd;
mod sweep_cmd;

use clap::{Parser, Subcommand};

/// Tensor rematerialization: train with less memory by recomputing activations.
#[derive(Debug, Parser)]
#[command(name = "checkmate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Export a zoo model's training graph (checkmate-graph/1).
    Graph(graph_cmd::GraphCmdArgs),
    /// Schedule a training graph under a memory budget.
    Solve(solve_cmd::SolveArgs),
    /// Replay a plan: validity, peak memory and cost.
    Simulate(simulate_cmd::SimulateArgs),
    /// Cost/memory frontier of every strategy at evenly spaced budgets.
    Sweep(sweep_cmd::SweepArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Graph(args) => graph_cmd::run(args),
        Command::Solve(args) => solve_cmd::run(args),
        Command::Simulate(args) => simulate_cmd::run(args),
        Command::Sweep(args) => sweep_cmd::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
