//! `chen-sqrtn` and `chen-greedy`: Chen et al. (2016) on the linearized forward order.
//!
//! Every forward node is a candidate checkpoint (Checkmate's "linearized" variants). The checkpoint
//! set becomes a segment schedule ([`segment_schedule`](super::segment_schedule)).

use std::sync::Arc;

use checkmate_graph::{Graph, NodeIdx};

use super::{
    best_set_within, best_within, evaluate_checkpoints, greedy_frontier, least_set_peak,
    sqrtn_checkpoints, Evaluated, GreedySet,
};
use crate::error::Result;
use crate::strategy::{Outcome, SolveOptions, Strategy};

/// The candidates of the linearized variants: every forward node, in topological order.
fn linearized_candidates(graph: &Graph) -> Vec<NodeIdx> {
    graph.forward_nodes().collect()
}

/// `chen-sqrtn`: every `floor(sqrt(n))`-th of the `n` forward nodes is a checkpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChenSqrtN;

impl ChenSqrtN {
    fn evaluated(graph: &Graph) -> Evaluated {
        let cands = linearized_candidates(graph);
        evaluate_checkpoints(graph, &sqrtn_checkpoints(graph.len(), &cands))
    }
}

impl Strategy for ChenSqrtN {
    fn name(&self) -> &'static str {
        "chen-sqrtn"
    }

    fn plan(&self, graph: &Graph, budget_bytes: u64, _options: &SolveOptions) -> Result<Outcome> {
        Ok(best_within(graph, &[Self::evaluated(graph)], budget_bytes))
    }

    fn least_feasible_budget(&self, graph: &Graph, _options: &SolveOptions) -> Result<Option<u64>> {
        Ok(Some(Self::evaluated(graph).peak))
    }
}

/// `chen-greedy`: the greedy segment rule over every forward node, its threshold swept; the
/// cheapest plan within the budget wins.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChenGreedy;

impl ChenGreedy {
    fn frontier(graph: &Graph) -> Arc<Vec<GreedySet>> {
        let mut is_candidate = vec![false; graph.len()];
        for v in linearized_candidates(graph) {
            is_candidate[v] = true;
        }
        greedy_frontier(graph, &is_candidate)
    }
}

impl Strategy for ChenGreedy {
    fn name(&self) -> &'static str {
        "chen-greedy"
    }

    fn plan(&self, graph: &Graph, budget_bytes: u64, _options: &SolveOptions) -> Result<Outcome> {
        Ok(best_set_within(graph, &Self::frontier(graph), budget_bytes))
    }

    fn least_feasible_budget(&self, graph: &Graph, _options: &SolveOptions) -> Result<Option<u64>> {
        Ok(least_set_peak(&Self::frontier(graph)))
    }
}
