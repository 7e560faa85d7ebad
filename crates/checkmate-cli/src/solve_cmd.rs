//! `checkmate solve`.

use std::path::PathBuf;

use anyhow::Result;
use checkmate_graph::{format_bytes, Budget, PlanFile, Prediction};
use checkmate_solver::{solve, strategy_by_name, Limit};
use clap::Args;
use serde_json::json;

use crate::common::{print_json, resolve_budget, GraphArgs, SolverArgs};

/// Arguments of `checkmate solve`.
#[derive(Debug, Args)]
pub struct SolveArgs {
    #[command(flatten)]
    pub graph: GraphArgs,
    /// Total memory budget: bytes, units (6GiB, 500MB) or percent of the checkpoint-all activation peak (50%).
    #[arg(long, short = 'b')]
    pub budget: Budget,
    /// Strategy name (checkpoint-all, checkpoint-last, chen-sqrtn, chen-greedy, ap-sqrtn, ap-greedy, griewank, lp-round, milp).
    #[arg(long, short = 's', default_value = "milp")]
    pub strategy: String,
    #[command(flatten)]
    pub solver: SolverArgs,
    /// Seed for randomized rounding.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the plan (checkmate-plan/1) here.
    #[arg(long)]
    pub plan_out: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `checkmate solve`.
pub fn run(args: SolveArgs) -> Result<()> {
    let graph = args.graph.load()?;
    let strategy = strategy_by_name(&args.strategy)?;
    let options = args.solver.options(args.seed)?;
    let budget = resolve_budget(&graph, args.budget)?;
    let solution = match solve(&graph, strategy.as_ref(), budget.activation_bytes, &options) {
        Ok(s) => s,
        Err(e) => {
            if args.json {
                use checkmate_solver::Error as E;
                // (status, the strategy's least budget, the proven floor), activation bytes.
                let known = match &e {
                    E::NoPlanFound {
                        known_plan_bytes,
                        known_plan_by,
                        ..
                    } => Some((*known_plan_bytes, known_plan_by.clone())),
                    _ => None,
                };
                let (status, least, proven_floor) = match &e {
                    E::BudgetTooSmall {
                        least_feasible_bytes,
                        proven_lower_bound_bytes,
                        ..
                    } => (
                        "infeasible",
                        *least_feasible_bytes,
                        *proven_lower_bound_bytes,
                    ),
                    E::NoPlanFound {
                        least_feasible_bytes,
                        proven_floor_bytes,
                        ..
                    } => (
                        "no-plan-found",
                        *least_feasible_bytes,
                        Some(*proven_floor_bytes),
                    ),
                    E::BelowStatic { .. } => ("infeasible", None, None),
                    _ => ("error", None, None),
                };
                let total = |b: Option<u64>| b.map(|b| b + graph.static_bytes());
                print_json(&json!({
                    "strategy": args.strategy,
                    "status": status,
                    "error": e.to_string(),
                    "least_feasible_budget_bytes": total(least),
                    "proven_lower_bound_bytes": total(proven_floor),
                    "known_plan_bytes": total(known.as_ref().map(|k| k.0)),
                    "known_plan_by": known.map(|k| k.1),
                    "budget_bytes": budget.total_bytes,
                    "cost": null, "lower_bound": null, "peak_bytes": null,
                    "peak_resident_bytes": checkmate_solver::peak_resident_bytes(),
                }));
            }
            return Err(e.into());
        }
    };
    let sim = solution.simulation.as_ref();
    if let (Some(path), Some(plan)) = (&args.plan_out, &solution.plan) {
        let file = PlanFile {
            graph: graph.name().to_string(),
            strategy: solution.strategy.clone(),
            budget_bytes: Some(budget.total_bytes),
            predicted: sim.map(|s| Prediction {
                peak_bytes: s.peak_bytes,
                cost: s.cost,
            }),
            plan: plan.clone(),
        };
        file.write(path, &graph)?;
    }
    if args.json {
        print_json(&json!({
            "graph": graph.name(),
            "strategy": solution.strategy,
            "status": solution.status.as_str(),
            "cost": sim.map(|s| s.cost),
            "lower_bound": solution.lower_bound,
            "peak_bytes": sim.map(|s| s.peak_bytes),
            "total_peak_bytes": sim.map(|s| s.peak_bytes + graph.static_bytes()),
            "budget_bytes": budget.total_bytes,
            "activation_budget_bytes": budget.activation_bytes,
            "static_bytes": graph.static_bytes(),
            "checkpoint_all_peak_bytes": budget.checkpoint_all_peak,
            "overhead": sim.map(|s| s.overhead(&graph)),
            "computes": sim.map(|s| s.computes),
            "solve_seconds": solution.solve_seconds,
            "exact_model": solution.exact_model,
            "peak_resident_bytes": checkmate_solver::peak_resident_bytes(),
            "limit": solution.limit.map(|l| match l {
                Limit::Time => json!({"kind": "time"}),
                Limit::Memory { model_bytes, limit_bytes } => json!({
                    "kind": "memory", "model_bytes": model_bytes, "limit_bytes": limit_bytes,
                }),
                Limit::Startup { startup_seconds, limit_seconds } => json!({
                    "kind": "startup", "startup_seconds": startup_seconds,
                    "limit_seconds": limit_seconds,
                }),
                Limit::LargeModel { rows } => json!({"kind": "large-model", "rows": rows}),
            }),
            "plan_out": args.plan_out.as_ref().map(|p| p.display().to_string()),
        }));
    } else {
        println!("graph        {} ({} nodes)", graph.name(), graph.len());
        println!("strategy     {}", solution.strategy);
        println!("status       {}", solution.status);
        println!(
            "budget       {} total, {} for activations ({} static)",
            format_bytes(budget.total_bytes),
            format_bytes(budget.activation_bytes),
            format_bytes(graph.static_bytes())
        );
        if let Some(s) = sim {
            println!(
                "peak         {} activations ({:.1}% of checkpoint-all)",
                format_bytes(s.peak_bytes),
                100.0 * s.peak_bytes as f64 / budget.checkpoint_all_peak.max(1) as f64
            );
            println!(
                "cost         {} {} ({:+.2}% vs no recomputation, {} computes for {} nodes)",
                s.cost,
                graph.cost_unit(),
                100.0 * s.overhead(&graph),
                s.computes,
                graph.len()
            );
        }
        if let Some(lb) = solution.lower_bound {
            println!("lower bound  {lb}");
        }
        println!("solve time   {:.3} s", solution.solve_seconds);
        if let Some(rss) = checkmate_solver::peak_resident_bytes() {
            println!(
                "memory       {} peak resident (the whole process)",
                format_bytes(rss)
            );
        }
        match solution.limit {
            // Beside a proven optimum the limit only says which model was not built or run.
            Some(l) if solution.status == checkmate_solver::Status::Optimal => {
                println!("exact model  not used ({l}); optimality proven without it")
            }
            Some(l) => println!("stopped by   {l}"),
            None => {}
        }
        if let Some(p) = &args.plan_out {
            println!("plan         {}", p.display());
        }
    }
    Ok(())
}
