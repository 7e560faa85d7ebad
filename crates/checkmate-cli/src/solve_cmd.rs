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
            println!(
                "{}",
                bound_line(
                    lb,
                    sim.map(|s| s.cost),
                    graph.total_cost(),
                    graph.cost_unit()
                )
            );
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

/// The `lower bound` line of `solve`: the bound in the graph's cost unit, against one compute per
/// node (`base`), and how far above it the plan is at most (the gap still open to the optimum).
fn bound_line(lb: f64, cost: Option<f64>, base: f64, unit: &str) -> String {
    let mut line = format!("lower bound  {} {unit}", format_cost(lb));
    if base > 0.0 {
        line.push_str(&format!(
            " ({:+.2}% vs no recomputation",
            100.0 * (lb / base - 1.0)
        ));
        match cost {
            Some(c) if lb > 0.0 => line.push_str(&format!(
                "; the plan is at most {:.2}% above the optimum)",
                100.0 * (c / lb - 1.0).max(0.0)
            )),
            _ => line.push(')'),
        }
    }
    line
}

/// A cost for reading: whole units when it is that large, six significant digits below
/// (`--json` has the exact value).
fn format_cost(c: f64) -> String {
    // Decimals for six significant digits: none from 1e5 up, at most 11 (tiny costs).
    let decimals = (5.0 - c.abs().max(1e-12).log10().floor().clamp(-6.0, 5.0)) as usize;
    let s = format!("{c:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_line_states_the_gap_left_to_the_optimum() {
        assert_eq!(
            bound_line(109098.9993711, Some(111725.0), 102810.0, "duration"),
            "lower bound  109099 duration (+6.12% vs no recomputation; \
             the plan is at most 2.41% above the optimum)"
        );
        assert_eq!(
            bound_line(15620.0, Some(15620.0), 15500.0, "ms"),
            "lower bound  15620 ms (+0.77% vs no recomputation; \
             the plan is at most 0.00% above the optimum)"
        );
        // Without a plan there is no gap to state; without a base cost no overhead.
        assert_eq!(
            bound_line(2.5, None, 2.0, "s"),
            "lower bound  2.5 s (+25.00% vs no recomputation)"
        );
        assert_eq!(bound_line(2.5, Some(3.0), 0.0, "s"), "lower bound  2.5 s");
    }

    #[test]
    fn costs_are_printed_to_six_significant_digits_or_whole_units() {
        assert_eq!(format_cost(109098.9993711), "109099");
        assert_eq!(format_cost(12345.67891), "12345.7");
        assert_eq!(format_cost(0.0123456789), "0.0123457");
        assert_eq!(format_cost(0.5), "0.5");
        assert_eq!(format_cost(0.0), "0");
    }
}
