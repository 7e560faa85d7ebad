//! `checkpoint-all` and `checkpoint-last`.

use checkmate_graph::{Graph, Schedule};
use fixedbitset::FixedBitSet;

use crate::baselines::schedule_from_checkpoints;
use crate::error::Result;
use crate::peak_of;
use crate::strategy::{Outcome, SolveOptions, Status, Strategy};

/// Keep every tensor until its last use: no recomputation, the most memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckpointAll;

impl CheckpointAll {
    /// The checkpoint-all schedule.
    pub fn schedule(graph: &Graph) -> Schedule {
        schedule_from_checkpoints(graph, &vec![true; graph.len()])
    }

    /// Activation peak of the checkpoint-all plan: what `100%` means in a budget.
    pub fn peak_bytes(graph: &Graph) -> u64 {
        peak_of(graph, &Self::schedule(graph))
    }
}

impl Strategy for CheckpointAll {
    fn name(&self) -> &'static str {
        "checkpoint-all"
    }

    fn plan(&self, graph: &Graph, _budget_bytes: u64, _options: &SolveOptions) -> Result<Outcome> {
        Ok(Outcome {
            exact_model: false,
            plan: Some(Self::schedule(graph).to_plan(graph)),
            // Every node computed once: no plan is cheaper.
            status: Status::Optimal,
            lower_bound: Some(graph.total_cost()),
            limit: None,
        })
    }

    fn least_feasible_budget(&self, graph: &Graph, _options: &SolveOptions) -> Result<Option<u64>> {
        Ok(Some(Self::peak_bytes(graph)))
    }
}

/// Keep only the previous stage's node between stages (Checkmate's "checkpoint last node"): little
/// memory, quadratic recomputation.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckpointLast;

impl CheckpointLast {
    /// The checkpoint-last schedule.
    pub fn schedule(graph: &Graph) -> Schedule {
        let n = graph.len();
        let keep = (0..n)
            .map(|t| {
                let mut row = FixedBitSet::with_capacity(n);
                if t > 0 {
                    row.insert(t - 1);
                }
                row
            })
            .collect();
        Schedule::cheapest_given_keeps(graph, keep).expect("keeps only the previous node")
    }
}

impl Strategy for CheckpointLast {
    fn name(&self) -> &'static str {
        "checkpoint-last"
    }

    fn plan(&self, graph: &Graph, _budget_bytes: u64, _options: &SolveOptions) -> Result<Outcome> {
        Ok(Outcome {
            exact_model: false,
            plan: Some(Self::schedule(graph).to_plan(graph)),
            status: Status::Feasible,
            lower_bound: None,
            limit: None,
        })
    }

    fn least_feasible_budget(&self, graph: &Graph, _options: &SolveOptions) -> Result<Option<u64>> {
        Ok(Some(peak_of(graph, &Self::schedule(graph))))
    }
}
