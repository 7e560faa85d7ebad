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

/// `plan` with the implementation of every compute chosen: the cheapest one whose workspace fits
/// beside the tensors live at that moment within `limit` activation bytes, else the one with the
/// least workspace. `limit` `None` means the peak the plan has with every compute in its leanest
/// implementation, so the choice never raises that peak.
///
/// A workspace lives only while its node computes, so each step's choice is independent of the
/// others: for a given sequence of computes and frees this is the cheapest choice within
/// `limit`. Graphs without alternatives get the plan back unchanged. The steps are not checked
/// here ([`simulate`] judges the result).
pub fn choose_implementations(graph: &Graph, plan: &Plan, limit: Option<u64>) -> Plan {
    if !graph.has_alternatives() {
        return Plan::new(plan.steps.clone());
    }
    let n = graph.len();
    let live_after_compute = |f: &mut dyn FnMut(usize, usize, u64)| {
        let mut mem: u64 = 0;
        for (k, step) in plan.steps.iter().enumerate() {
            match *step {
                Step::Compute(v) if v < n => {
                    mem += graph.node(v).bytes;
                    f(k, v, mem);
                }
                Step::Free(v) if v < n => mem = mem.saturating_sub(graph.node(v).bytes),
                _ => {}
            }
        }
    };
    let limit = limit.unwrap_or_else(|| {
        let mut peak = 0;
        live_after_compute(&mut |_, v, mem| {
            peak = peak.max(mem + graph.node(v).least_workspace());
        });
        peak
    });
    let mut implementations = vec![0u16; plan.steps.len()];
    live_after_compute(&mut |k, v, mem| {
        implementations[k] = graph
            .node(v)
            .cheapest_implementation(|ws| mem + ws <= limit) as u16;
    });
    let mut out = Plan::new(plan.steps.clone());
    if implementations.iter().any(|&i| i != 0) {
        out.implementations = implementations;
    }
    out
}
