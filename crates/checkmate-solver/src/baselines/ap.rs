//! `ap-sqrtn` and `ap-greedy`: Chen et al.'s rules restricted to articulation points.
//!
//! Candidates are the articulation points of the undirected forward graph (forward nodes and the
//! edges between them), computed as Checkmate does: a virtual source is joined to the first forward
//! node and a virtual sink to the last one, so those two (and every node of a chain) count as
//! articulation points. The virtual nodes themselves are never candidates.

use std::sync::Arc;

use checkmate_graph::{Graph, NodeIdx, NodeKind};
use petgraph::graph::{NodeIndex, UnGraph};

use super::{
    best_set_within, best_within, evaluate_checkpoints, greedy_frontier, least_set_peak,
    sqrtn_checkpoints, Evaluated, GreedySet,
};
use crate::error::Result;
use crate::strategy::{Outcome, SolveOptions, Strategy};

/// The articulation points of the undirected forward graph, in topological order.
///
/// Uses `petgraph::algo::articulation_points` (Tarjan, iterative) on the forward nodes plus a
/// virtual source joined to the first forward node and a virtual sink joined to the last.
pub fn articulation_points(graph: &Graph) -> Vec<NodeIdx> {
    let fwd: Vec<NodeIdx> = graph.forward_nodes().collect();
    if fwd.is_empty() {
        return Vec::new();
    }
    let mut local = vec![usize::MAX; graph.len()];
    for (k, &v) in fwd.iter().enumerate() {
        local[v] = k;
    }
    let m = fwd.len();
    let mut ug: UnGraph<(), ()> = UnGraph::with_capacity(m + 2, 0);
    for _ in 0..m + 2 {
        ug.add_node(());
    }
    for (k, &v) in fwd.iter().enumerate() {
        for &p in graph.preds(v) {
            if graph.node(p).kind == NodeKind::Forward {
                ug.add_edge(NodeIndex::new(local[p]), NodeIndex::new(k), ());
            }
        }
    }
    let (source, sink) = (NodeIndex::new(m), NodeIndex::new(m + 1));
    ug.add_edge(source, NodeIndex::new(0), ());
    ug.add_edge(NodeIndex::new(m - 1), sink, ());
    let mut points: Vec<NodeIdx> = petgraph::algo::articulation_points::articulation_points(&ug)
        .into_iter()
        .map(|n| n.index())
        .filter(|&k| k < m)
        .map(|k| fwd[k])
        .collect();
    points.sort_unstable();
    points
}

/// `ap-sqrtn`: every `floor(sqrt(n))`-th of the `n` articulation points is a checkpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApSqrtN;

impl ApSqrtN {
    fn evaluated(graph: &Graph) -> Evaluated {
        let cands = articulation_points(graph);
        evaluate_checkpoints(graph, &sqrtn_checkpoints(graph.len(), &cands))
    }
}

impl Strategy for ApSqrtN {
    fn name(&self) -> &'static str {
        "ap-sqrtn"
    }

    fn plan(&self, graph: &Graph, budget_bytes: u64, _options: &SolveOptions) -> Result<Outcome> {
        Ok(best_within(graph, &[Self::evaluated(graph)], budget_bytes))
    }

    fn least_feasible_budget(&self, graph: &Graph, _options: &SolveOptions) -> Result<Option<u64>> {
        Ok(Some(Self::evaluated(graph).peak))
    }
}

/// `ap-greedy`: the greedy segment rule with articulation points as the only candidates, its
/// threshold swept; the cheapest plan within the budget wins.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApGreedy;

impl ApGreedy {
    fn frontier(graph: &Graph) -> Arc<Vec<GreedySet>> {
        let mut is_candidate = vec![false; graph.len()];
        for v in articulation_points(graph) {
            is_candidate[v] = true;
        }
        greedy_frontier(graph, &is_candidate)
    }
}

impl Strategy for ApGreedy {
    fn name(&self) -> &'static str {
        "ap-greedy"
    }

    fn plan(&self, graph: &Graph, budget_bytes: u64, _options: &SolveOptions) -> Result<Outcome> {
        Ok(best_set_within(graph, &Self::frontier(graph), budget_bytes))
    }

    fn least_feasible_budget(&self, graph: &Graph, _options: &SolveOptions) -> Result<Option<u64>> {
        Ok(least_set_peak(&Self::frontier(graph)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkmate_graph::NodeSpec;
    use std::collections::HashSet;

    fn forward_graph(m: usize, edges: &[(usize, usize)]) -> Graph {
        let nodes = (0..m)
            .map(|j| NodeSpec {
                alternatives: Vec::new(),
                id: j as u64,
                name: format!("f{j}"),
                kind: NodeKind::Forward,
                cost: 1.0,
                bytes: 1,
                workspace_bytes: 0,
                deps: edges
                    .iter()
                    .filter(|e| e.1 == j)
                    .map(|e| e.0 as u64)
                    .collect(),
            })
            .collect();
        Graph::new("fwd", "flops", 0, nodes).unwrap()
    }

    /// Components of the undirected forward graph plus virtual ends, without `removed`.
    fn components(g: &Graph, removed: Option<usize>) -> usize {
        let m = g.len();
        let mut adj = vec![Vec::new(); m + 2];
        let mut add = |a: usize, b: usize| {
            adj[a].push(b);
            adj[b].push(a);
        };
        for v in 0..m {
            for &p in g.preds(v) {
                add(p, v);
            }
        }
        add(m, 0);
        add(m - 1, m + 1);
        let mut seen = vec![false; m + 2];
        let mut count = 0;
        for s in 0..m + 2 {
            if Some(s) == removed || seen[s] {
                continue;
            }
            count += 1;
            let mut stack = vec![s];
            seen[s] = true;
            while let Some(u) = stack.pop() {
                for &w in &adj[u] {
                    if Some(w) != removed && !seen[w] {
                        seen[w] = true;
                        stack.push(w);
                    }
                }
            }
        }
        count
    }

    #[test]
    fn matches_brute_force_on_small_dags() {
        let cases: Vec<(usize, Vec<(usize, usize)>)> = vec![
            (5, vec![(0, 1), (1, 2), (2, 3), (3, 4)]),
            (5, vec![(0, 1), (1, 2), (0, 2), (2, 3), (3, 4)]),
            (
                6,
                vec![(0, 1), (1, 2), (2, 3), (1, 3), (3, 4), (4, 5), (2, 5)],
            ),
            (
                7,
                vec![
                    (0, 1),
                    (0, 2),
                    (1, 3),
                    (2, 3),
                    (3, 4),
                    (4, 5),
                    (4, 6),
                    (5, 6),
                ],
            ),
        ];
        for (m, edges) in cases {
            let g = forward_graph(m, &edges);
            let base = components(&g, None);
            let brute: HashSet<usize> =
                (0..m).filter(|&v| components(&g, Some(v)) > base).collect();
            let got: HashSet<usize> = articulation_points(&g).into_iter().collect();
            assert_eq!(got, brute, "edges {edges:?}");
        }
    }
}
