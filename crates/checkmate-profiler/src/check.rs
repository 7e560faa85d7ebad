//! Does a cost table predict real step times? Runs a plan and compares.

use std::collections::HashMap;
use std::time::Instant;

use checkmate_executor::{Batch, Executor};
use checkmate_graph::{Graph, Plan, Step};
use checkmate_models::CostTable;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::stats::Summary;

/// The predicted and measured time of one plan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PlanCheck {
    /// Compute steps of the plan (the graph's node count for checkpoint-all).
    pub computes: usize,
    /// Sum over the plan's compute steps of the table's seconds.
    pub predicted_seconds: f64,
    /// Per run, the sum of the executor's `step_seconds` (kernels, frees and bookkeeping).
    pub measured: Summary,
    /// Per run, the wall time of `run_plan` (adds the simulator's check and setup).
    pub wall: Summary,
    /// `(predicted - measured median) / measured median`.
    pub rel_error: f64,
}

/// Sum over the compute steps of `plan` of the seconds `table` gives each node of `graph`.
pub fn predicted_seconds(graph: &Graph, plan: &Plan, table: &CostTable) -> Result<f64> {
    let by_name: HashMap<&str, f64> = table
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.seconds))
        .collect();
    let mut per_node = Vec::with_capacity(graph.len());
    for node in graph.nodes() {
        per_node.push(*by_name.get(node.name.as_str()).ok_or_else(|| {
            Error::Fit(format!(
                "the cost table ({} at batch {}) has no node `{}`",
                table.model, table.batch, node.name
            ))
        })?);
    }
    Ok(plan
        .steps
        .iter()
        .map(|s| match *s {
            Step::Compute(v) => per_node[v],
            Step::Free(_) => 0.0,
        })
        .sum())
}

/// Runs `plan` `warmup` times untimed and `repeats` times timed on `batch`, and compares the
/// measured step time with the one `table` predicts.
pub fn check_plan(
    exec: &mut Executor,
    batch: &Batch,
    plan: &Plan,
    table: &CostTable,
    warmup: usize,
    repeats: usize,
) -> Result<PlanCheck> {
    let mut v = check_plans(
        exec,
        batch,
        std::slice::from_ref(plan),
        table,
        warmup,
        repeats,
    )?;
    Ok(v.remove(0))
}

/// [`check_plan`] for several plans, their runs interleaved round-robin (`warmup` untimed rounds,
/// then `repeats` timed rounds), so that a change in machine load affects every plan alike.
pub fn check_plans(
    exec: &mut Executor,
    batch: &Batch,
    plans: &[Plan],
    table: &CostTable,
    warmup: usize,
    repeats: usize,
) -> Result<Vec<PlanCheck>> {
    if repeats == 0 {
        return Err(Error::Options("repeats must be at least 1".into()));
    }
    let predicted = plans
        .iter()
        .map(|p| predicted_seconds(exec.graph(), p, table))
        .collect::<Result<Vec<f64>>>()?;
    for _ in 0..warmup {
        for plan in plans {
            exec.run_plan(plan, batch)?;
        }
    }
    let mut measured = vec![Vec::with_capacity(repeats); plans.len()];
    let mut wall = vec![Vec::with_capacity(repeats); plans.len()];
    let mut computes = vec![0; plans.len()];
    for _ in 0..repeats {
        for (i, plan) in plans.iter().enumerate() {
            let t = Instant::now();
            let report = exec.run_plan(plan, batch)?;
            wall[i].push(t.elapsed().as_secs_f64());
            measured[i].push(report.step_seconds.iter().sum());
            computes[i] = report.computes;
        }
    }
    Ok((0..plans.len())
        .map(|i| {
            let m = Summary::of(&measured[i]);
            PlanCheck {
                computes: computes[i],
                predicted_seconds: predicted[i],
                measured: m,
                wall: Summary::of(&wall[i]),
                rel_error: (predicted[i] - m.median) / m.median,
            }
        })
        .collect())
}
