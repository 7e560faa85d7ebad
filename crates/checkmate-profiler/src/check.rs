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
    if repeats == 0 {
        return Err(Error::Options("repeats must be at least 1".into()));
    }
    let predicted = predicted_seconds(exec.graph(), plan, table)?;
    for _ in 0..warmup {
        exec.run_plan(plan, batch)?;
    }
    let mut measured = Vec::with_capacity(repeats);
    let mut wall = Vec::with_capacity(repeats);
    let mut computes = 0;
    for _ in 0..repeats {
        let t = Instant::now();
        let report = exec.run_plan(plan, batch)?;
        wall.push(t.elapsed().as_secs_f64());
        measured.push(report.step_seconds.iter().sum());
        computes = report.computes;
    }
    let measured = Summary::of(&measured);
    Ok(PlanCheck {
        computes,
        predicted_seconds: predicted,
        measured,
        wall: Summary::of(&wall),
        rel_error: (predicted - measured.median) / measured.median,
    })
}
