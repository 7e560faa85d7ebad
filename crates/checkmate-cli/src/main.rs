//! `checkmate`: schedule, simulate, sweep, profile and train with tensor-rematerialization plans.

mod common;
mod generate_cmd;
mod graph_cmd;
mod max_batch_cmd;
mod profile_cmd;
mod simulate_cmd;
mod solve_cmd;
mod sweep_cmd;
mod train_cmd;

use clap::{Parser, Subcommand};

/// Counts heap bytes so `train` and `max-batch` can report the process's real peak.
#[global_allocator]
static HEAP: checkmate_executor::heap::Counting = checkmate_executor::heap::Counting;

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
    /// Write a random layered graph (Moccasin's benchmark family) of our own making.
    Generate(generate_cmd::GenerateArgs),
    /// Schedule a training graph under a memory budget.
    Solve(solve_cmd::SolveArgs),
    /// Replay a plan: validity, peak memory and cost.
    Simulate(simulate_cmd::SimulateArgs),
    /// Cost/memory frontier of every strategy at evenly spaced budgets.
    Sweep(sweep_cmd::SweepArgs),
    /// Train a zoo model step by step with a rematerialization plan, measuring memory and time.
    Train(train_cmd::TrainArgs),
    /// Largest batch that trains within a memory size, per strategy, confirmed by a real step.
    MaxBatch(max_batch_cmd::MaxBatchArgs),
    /// Measure every node's cost on a device and write a checkmate-costs/1 table.
    Profile(profile_cmd::ProfileArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // The highs crate warns on every solve stopped by its time limit, which
                // `checkmate` reports itself (status `feasible` / `timeout`).
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,highs=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Graph(args) => graph_cmd::run(args),
        Command::Generate(args) => generate_cmd::run(args),
        Command::Solve(args) => solve_cmd::run(args),
        Command::Simulate(args) => simulate_cmd::run(args),
        Command::Sweep(args) => sweep_cmd::run(args),
        Command::Train(args) => train_cmd::run(args),
        Command::MaxBatch(args) => max_batch_cmd::run(args),
        Command::Profile(args) => profile_cmd::run(args),
    };
    let code = match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e)
        }
    };
    exit(code);
}

/// Ends the process with `code`. While a MILP solve abandoned at its time limit still runs
/// (`checkmate_solver::milp::abandoned_solves`), HiGHS's thread may use its static objects, which
/// a normal exit destroys: then the output is flushed and the process ends at once.
fn exit(code: i32) -> ! {
    #[cfg(unix)]
    if checkmate_solver::milp::abandoned_solves() > 0 {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: `_exit` ends the process without running destructors or atexit handlers;
        // nothing of ours needs them after the flushes above.
        unsafe { libc::_exit(code) }
    }
    std::process::exit(code)
}

/// The exit status of a failed command: 2 when no plan can fit the budget (proven), 3 when the
/// strategy found none but none is proven impossible, 1 for every other error.
fn exit_code(e: &anyhow::Error) -> i32 {
    use checkmate_solver::Error;
    match e.downcast_ref::<Error>() {
        Some(Error::BudgetTooSmall { .. } | Error::BelowStatic { .. }) => 2,
        Some(Error::NoPlanFound { .. }) => 3,
        _ => 1,
    }
}
