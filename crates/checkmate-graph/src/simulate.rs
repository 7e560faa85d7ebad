//! The simulator: the single judge of a plan's validity, peak memory and cost (SPEC.md section 2).

use crate::error::PlanError;
use crate::graph::Graph;
use crate::plan::{Plan, Step};

/// What replaying a plan gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// Peak activation bytes: the maximum, over the moments right after each compute, of live bytes
    /// plus the workspace of the implementation the step uses.
    pub peak_bytes: u64,
    /// Index of the step where the peak is reached.
    pub peak_step: usize,
    /// Sum of the costs of all compute steps.
    pub cost: f64,
    /// Number of compute steps.
    pub computes: usize,
    /// Live activation bytes after every step (workspace not included).
    pub live_after_step: Vec<u64>,
}

impl Simulation {
    /// The cost beyond one compute of each node, relative to it (0.25 = 25% extra compute).
    pub fn overhead(&self, graph: &Graph) -> f64 {
        let base = graph.total_cost();
        if base > 0.0 {
            self.cost / base - 1.0
        } else {
            0.0
        }
    }
}

/// Replays `plan` on `graph`: checks every rule of the memory model and measures peak and cost.
///
/// Errors name the first offending step. Runs in time linear in the plan's steps and the inputs of
/// the computed nodes.
pub fn simulate(graph: &Graph, plan: &Plan) -> Result<Simulation, PlanError> {
    let n = graph.len();
    let mut live = vec![false; n];
    let mut computed = vec![false; n];
    let mut mem: u64 = 0;
    let mut peak: u64 = 0;
    let mut peak_step = 0;
    let mut cost = 0.0;
    let mut computes = 0;
    let mut live_after_step = Vec::with_capacity(plan.steps.len());
    if !plan.implementations.is_empty() && plan.implementations.len() != plan.steps.len() {
        return Err(PlanError::Implementations {
            steps: plan.steps.len(),
            entries: plan.implementations.len(),
        });
    }
    for (k, step) in plan.steps.iter().enumerate() {
        let (Step::Compute(v) | Step::Free(v)) = *step;
        if v >= n {
            return Err(PlanError::OutOfRange {
                step: k,
                index: v,
                len: n,
            });
        }
        let imp = plan.implementation(k);
        if imp != 0
            && (matches!(step, Step::Free(_)) || imp >= graph.node(v).implementation_count())
        {
            return Err(PlanError::UnknownImplementation {
                step: k,
                node: graph.label(v),
                implementation: imp,
                count: graph.node(v).implementation_count(),
            });
        }
        match *step {
            Step::Compute(v) => {
                if live[v] {
                    return Err(PlanError::AlreadyLive {
                        step: k,
                        node: graph.label(v),
                    });
                }
                if let Some(&p) = graph.preds(v).iter().find(|&&p| !live[p]) {
                    return Err(PlanError::InputNotLive {
                        step: k,
                        node: graph.label(v),
                        input: graph.label(p),
                    });
                }
                let node = graph.node(v);
                live[v] = true;
                computed[v] = true;
                mem += node.bytes;
                let during = mem + node.workspace_with(imp);
                if during > peak {
                    peak = during;
                    peak_step = k;
                }
                cost += node.cost_with(imp);
                computes += 1;
            }
            Step::Free(v) => {
                if !live[v] {
                    return Err(PlanError::FreeDead {
                        step: k,
                        node: graph.label(v),
                    });
                }
                live[v] = false;
                mem -= graph.node(v).bytes;
            }
        }
        live_after_step.push(mem);
    }
    if let Some(v) = computed.iter().position(|&c| !c) {
        return Err(PlanError::NeverComputed {
            node: graph.label(v),
        });
    }
    Ok(Simulation {
        peak_bytes: peak,
        peak_step,
        cost,
        computes,
        live_after_step,
    })
}
