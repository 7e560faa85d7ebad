//! The training DAG: nodes in topological order with their cost, output bytes and dependencies.

use std::collections::HashMap;
use std::fmt;

use petgraph::algo::{tarjan_scc, toposort};
use petgraph::graph::{DiGraph, NodeIndex};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Position of a node in the graph's topological order (`0..graph.len()`).
///
/// Plans, schedules and solvers work with these; files keep the ids they were read with
/// ([`Node::id`]).
pub type NodeIdx = usize;

/// What part of training a node belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// A layer of the forward pass.
    Forward,
    /// The loss.
    Loss,
    /// A gradient computation of the backward pass.
    Backward,
}

impl NodeKind {
    /// The name used in `checkmate-graph/1` files.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Forward => "forward",
            NodeKind::Loss => "loss",
            NodeKind::Backward => "backward",
        }
    }
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node as given by a file or a model builder, before validation.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Unique id (kept for plans and files).
    pub id: u64,
    /// Human-readable name, e.g. `block1_conv1`.
    pub name: String,
    /// Forward, loss or backward.
    pub kind: NodeKind,
    /// Cost of one compute, in the graph's cost unit; finite and non-negative.
    pub cost: f64,
    /// Bytes of the node's output tensor.
    pub bytes: u64,
    /// Bytes of scratch memory live only while the node computes.
    pub workspace_bytes: u64,
    /// Ids of the nodes whose outputs this node reads.
    pub deps: Vec<u64>,
    /// Other ways to compute the node (same inputs and output; empty for most nodes).
    pub alternatives: Vec<Implementation>,
}

/// One more implementation of a node: the same inputs and output, computed with its own cost and
/// scratch memory (e.g. a convolution in chunks with a bounded workspace against one with a
/// larger, faster one). A node's own `cost` and `workspace_bytes` are its default implementation
/// (number 0); `alternatives[k]` is implementation `k + 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Implementation {
    /// Name used by plan files (unique within the node, not `default`).
    pub name: String,
    /// Cost of one compute with this implementation.
    pub cost: f64,
    /// Scratch bytes live only while this implementation computes.
    pub workspace_bytes: u64,
}

/// The name of every node's implementation 0 in plan files.
pub const DEFAULT_IMPLEMENTATION: &str = "default";

/// A validated node of a [`Graph`].
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The id from the file or builder.
    pub id: u64,
    /// Human-readable name.
    pub name: String,
    /// Forward, loss or backward.
    pub kind: NodeKind,
    /// Cost of one compute.
    pub cost: f64,
    /// Bytes of the output tensor.
    pub bytes: u64,
    /// Scratch bytes live only during the compute.
    pub workspace_bytes: u64,
    /// Other implementations (implementation `k + 1` is `alternatives[k]`).
    pub alternatives: Vec<Implementation>,
}

impl Node {
    /// Number of implementations (1 + alternatives).
    pub fn implementation_count(&self) -> usize {
        1 + self.alternatives.len()
    }

    /// Cost of one compute with implementation `k` (0: the default).
    ///
    /// Panics if `k` is not below [`Node::implementation_count`].
    pub fn cost_with(&self, k: usize) -> f64 {
        if k == 0 {
            self.cost
        } else {
            self.alternatives[k - 1].cost
        }
    }

    /// Workspace of implementation `k` (0: the default).
    ///
    /// Panics if `k` is not below [`Node::implementation_count`].
    pub fn workspace_with(&self, k: usize) -> u64 {
        if k == 0 {
            self.workspace_bytes
        } else {
            self.alternatives[k - 1].workspace_bytes
        }
    }

    /// Name of implementation `k` in plan files.
    pub fn implementation_name(&self, k: usize) -> &str {
        if k == 0 {
            DEFAULT_IMPLEMENTATION
        } else {
            &self.alternatives[k - 1].name
        }
    }

    /// The implementation named `name`, if the node has one.
    pub fn implementation_named(&self, name: &str) -> Option<usize> {
        if name == DEFAULT_IMPLEMENTATION {
            return Some(0);
        }
        self.alternatives
            .iter()
            .position(|a| a.name == name)
            .map(|k| k + 1)
    }

    /// Whether alternative `a` (an index into [`Node::alternatives`]) can ever be chosen over the
    /// default: it is cheaper or needs less workspace. Others are inert: no strategy picks them,
    /// and `milp` builds no variables for them.
    pub fn alternative_matters(&self, a: usize) -> bool {
        let alt = &self.alternatives[a];
        alt.cost < self.cost || alt.workspace_bytes < self.workspace_bytes
    }

    /// The least workspace of any implementation (what bounds and memory-first heuristics use).
    pub fn least_workspace(&self) -> u64 {
        self.alternatives
            .iter()
            .map(|a| a.workspace_bytes)
            .fold(self.workspace_bytes, u64::min)
    }

    /// The least cost of any implementation (what lower bounds use).
    pub fn least_cost(&self) -> f64 {
        self.alternatives
            .iter()
            .map(|a| a.cost)
            .fold(self.cost, f64::min)
    }

    /// The cheapest implementation whose workspace `fits` (ties: the smaller workspace), else
    /// the [leanest](Node::leanest_implementation): the choice for one compute, given what else
    /// is live then.
    pub fn cheapest_implementation(&self, fits: impl Fn(u64) -> bool) -> usize {
        (0..self.implementation_count())
            .filter(|&i| fits(self.workspace_with(i)))
            .min_by(|&a, &b| {
                self.cost_with(a)
                    .total_cmp(&self.cost_with(b))
                    .then(self.workspace_with(a).cmp(&self.workspace_with(b)))
            })
            .unwrap_or_else(|| self.leanest_implementation())
    }

    /// The implementation a memory-first planner uses: least workspace, then least cost.
    pub fn leanest_implementation(&self) -> usize {
        (0..self.implementation_count())
            .min_by(|&a, &b| {
                self.workspace_with(a)
                    .cmp(&self.workspace_with(b))
                    .then(self.cost_with(a).total_cmp(&self.cost_with(b)))
            })
            .unwrap_or(0)
    }
}

/// A validated, acyclic training graph whose nodes are stored in topological order.
///
/// Invariants: every dependency of node `i` has an index smaller than `i`; ids are unique; costs are
/// finite and non-negative; the graph has at least one node.
#[derive(Debug, Clone)]
pub struct Graph {
    name: String,
    cost_unit: String,
    static_bytes: u64,
    nodes: Vec<Node>,
    preds: Vec<Vec<NodeIdx>>,
    succs: Vec<Vec<NodeIdx>>,
    index_of_id: HashMap<u64, NodeIdx>,
}

/// Names a node in messages: `id (name)`.
fn label(id: u64, name: &str) -> String {
    format!("{id} ({name})")
}

impl Graph {
    /// Validates `specs` and builds the graph.
    ///
    /// Nodes keep the given order when it is already topological (so a file's frontier order is
    /// preserved); otherwise they are ordered by `petgraph`'s topological sort.
    pub fn new(
        name: impl Into<String>,
        cost_unit: impl Into<String>,
        static_bytes: u64,
        specs: Vec<NodeSpec>,
    ) -> Result<Graph> {
        if specs.is_empty() {
            return Err(Error::InvalidField {
                location: "graph".into(),
                field: "nodes".into(),
                value: "[]".into(),
                expected: "at least one node".into(),
            });
        }
        let mut pos_of_id: HashMap<u64, usize> = HashMap::with_capacity(specs.len());
        for (pos, s) in specs.iter().enumerate() {
            if !s.cost.is_finite() || s.cost < 0.0 {
                return Err(Error::InvalidField {
                    location: format!("node {}", label(s.id, &s.name)),
                    field: "cost".into(),
                    value: s.cost.to_string(),
                    expected: "a finite, non-negative number".into(),
                });
            }
            let mut names: Vec<&str> = vec![DEFAULT_IMPLEMENTATION];
            for a in &s.alternatives {
                let location = format!("node {} implementation {:?}", label(s.id, &s.name), a.name);
                if a.name.is_empty() || names.contains(&a.name.as_str()) {
                    return Err(Error::InvalidField {
                        location,
                        field: "name".into(),
                        value: format!("{:?}", a.name),
                        expected: format!(
                            "a non-empty name, unique within the node and not {DEFAULT_IMPLEMENTATION:?}"
                        ),
                    });
                }
                names.push(&a.name);
                if !a.cost.is_finite() || a.cost < 0.0 {
                    return Err(Error::InvalidField {
                        location,
                        field: "cost".into(),
                        value: a.cost.to_string(),
                        expected: "a finite, non-negative number".into(),
                    });
                }
            }
            if let Some(&first) = pos_of_id.get(&s.id) {
                return Err(Error::DuplicateId {
                    id: s.id,
                    first: specs[first].name.clone(),
                    second: s.name.clone(),
                });
            }
            pos_of_id.insert(s.id, pos);
        }
        // Dependencies as file positions, deduplicated.
        let mut dep_pos: Vec<Vec<usize>> = Vec::with_capacity(specs.len());
        for s in &specs {
            let mut d = Vec::with_capacity(s.deps.len());
            for dep in &s.deps {
                match pos_of_id.get(dep) {
                    Some(&p) => d.push(p),
                    None => {
                        return Err(Error::DanglingDep {
                            id: s.id,
                            name: s.name.clone(),
                            dep: *dep,
                        })
                    }
                }
            }
            d.sort_unstable();
            d.dedup();
            dep_pos.push(d);
        }
        let given_is_topological = dep_pos
            .iter()
            .enumerate()
            .all(|(pos, deps)| deps.iter().all(|&d| d < pos));
        let order: Vec<usize> = if given_is_topological {
            (0..specs.len()).collect()
        } else {
            let mut dg: DiGraph<(), ()> = DiGraph::with_capacity(specs.len(), 0);
            for _ in &specs {
                dg.add_node(());
            }
            for (pos, deps) in dep_pos.iter().enumerate() {
                for &d in deps {
                    dg.add_edge(NodeIndex::new(d), NodeIndex::new(pos), ());
                }
            }
            match toposort(&dg, None) {
                Ok(order) => order.into_iter().map(|n| n.index()).collect(),
                Err(cycle) => {
                    let nodes = describe_cycle(&dg, cycle.node_id())
                        .into_iter()
                        .map(|p| label(specs[p].id, &specs[p].name))
                        .collect();
                    return Err(Error::Cycle { nodes });
                }
            }
        };
        let mut new_index = vec![0usize; specs.len()];
        for (idx, &pos) in order.iter().enumerate() {
            new_index[pos] = idx;
        }
        let mut preds: Vec<Vec<NodeIdx>> = vec![Vec::new(); specs.len()];
        let mut succs: Vec<Vec<NodeIdx>> = vec![Vec::new(); specs.len()];
        for (pos, deps) in dep_pos.iter().enumerate() {
            let i = new_index[pos];
            preds[i] = deps.iter().map(|&d| new_index[d]).collect();
            preds[i].sort_unstable();
            for &p in &preds[i] {
                succs[p].push(i);
            }
        }
        for s in &mut succs {
            s.sort_unstable();
        }
        let mut slots: Vec<Option<NodeSpec>> = specs.into_iter().map(Some).collect();
        let nodes: Vec<Node> = order
            .iter()
            .map(|&pos| {
                let s = slots[pos]
                    .take()
                    .expect("each position appears once in the order");
                Node {
                    id: s.id,
                    name: s.name,
                    kind: s.kind,
                    cost: s.cost,
                    bytes: s.bytes,
                    workspace_bytes: s.workspace_bytes,
                    alternatives: s.alternatives,
                }
            })
            .collect();
        let index_of_id = nodes.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
        Ok(Graph {
            name: name.into(),
            cost_unit: cost_unit.into(),
            static_bytes,
            nodes,
            preds,
            succs,
            index_of_id,
        })
    }

    /// The graph's name (plans refer to it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The unit of every node's cost (`us`, `flops`, `s`, ...).
    pub fn cost_unit(&self) -> &str {
        &self.cost_unit
    }

    /// Bytes that are live for the whole step and never freed (parameters, gradients, optimizer
    /// state, the input batch).
    pub fn static_bytes(&self) -> u64 {
        self.static_bytes
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a graph has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node at topological position `i`.
    pub fn node(&self, i: NodeIdx) -> &Node {
        &self.nodes[i]
    }

    /// All nodes in topological order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Inputs of node `i`, distinct and ascending (all before `i` in the topological order).
    pub fn preds(&self, i: NodeIdx) -> &[NodeIdx] {
        &self.preds[i]
    }

    /// Consumers of node `i`, distinct and ascending.
    pub fn succs(&self, i: NodeIdx) -> &[NodeIdx] {
        &self.succs[i]
    }

    /// The last consumer of node `i` in the topological order (`None` for an output): where
    /// checkpoint-all frees its tensor.
    pub fn last_reader(&self, i: NodeIdx) -> Option<NodeIdx> {
        self.succs[i].last().copied()
    }

    /// The position of the node with file id `id`.
    pub fn index_of(&self, id: u64) -> Option<NodeIdx> {
        self.index_of_id.get(&id).copied()
    }

    /// `id (name)` of node `i`, for messages.
    pub fn label(&self, i: NodeIdx) -> String {
        label(self.nodes[i].id, &self.nodes[i].name)
    }

    /// Number of edges.
    pub fn edge_count(&self) -> usize {
        self.preds.iter().map(Vec::len).sum()
    }

    /// Sum of all node costs: the cost of one pass without recomputation.
    pub fn total_cost(&self) -> f64 {
        self.nodes.iter().map(|n| n.cost).sum()
    }

    /// Sum of every node's least cost over its implementations: no plan costs less.
    pub fn least_total_cost(&self) -> f64 {
        self.nodes.iter().map(Node::least_cost).sum()
    }

    /// Positions of the forward nodes, in topological order.
    pub fn forward_nodes(&self) -> impl Iterator<Item = NodeIdx> + '_ {
        (0..self.len()).filter(|&i| self.nodes[i].kind == NodeKind::Forward)
    }

    /// Whether any node has an alternative implementation that can be chosen over its default
    /// ([`Node::alternative_matters`]); a graph whose alternatives are all slower and larger
    /// plans exactly like one without them.
    pub fn has_alternatives(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| (0..n.alternatives.len()).any(|a| n.alternative_matters(a)))
    }

    /// The graph with every node's leanest implementation as its only one (same positions and
    /// ids): what strategies that know nothing of implementations plan on; see
    /// `checkmate_solver`'s choice of implementations.
    pub fn leanest(&self) -> Graph {
        let mut g = self.clone();
        for n in &mut g.nodes {
            let k = n.leanest_implementation();
            n.cost = n.cost_with(k);
            n.workspace_bytes = n.workspace_with(k);
            n.alternatives.clear();
        }
        g
    }

    /// The graph with every node at the least cost and the least workspace of any of its
    /// implementations (which may be two different ones): no plan of this graph costs less or
    /// peaks lower than on the relaxed one, so lower bounds computed there hold here.
    pub fn relaxed(&self) -> Graph {
        let mut g = self.clone();
        for n in &mut g.nodes {
            n.cost = n.least_cost();
            n.workspace_bytes = n.least_workspace();
            n.alternatives.clear();
        }
        g
    }

    /// Returns a copy with static memory replaced (e.g. after adding optimizer state).
    pub fn with_static_bytes(mut self, static_bytes: u64) -> Graph {
        self.static_bytes = static_bytes;
        self
    }

    /// The graph as `petgraph` nodes `0..len` (same indices) and dependency edges.
    pub fn to_petgraph(&self) -> DiGraph<(), ()> {
        let mut dg = DiGraph::with_capacity(self.len(), self.edge_count());
        for _ in 0..self.len() {
            dg.add_node(());
        }
        for (i, ps) in self.preds.iter().enumerate() {
            for &p in ps {
                dg.add_edge(NodeIndex::new(p), NodeIndex::new(i), ());
            }
        }
        dg
    }

    /// The least activation memory any plan needs: every node must at some moment be live together
    /// with its inputs and the workspace of its leanest implementation.
    pub fn min_feasible_activation_bytes(&self) -> u64 {
        (0..self.len())
            .map(|i| {
                let n = &self.nodes[i];
                n.bytes
                    + n.least_workspace()
                    + self.preds[i]
                        .iter()
                        .map(|&p| self.nodes[p].bytes)
                        .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Node specs in topological order with ids as dependencies (the inverse of [`Graph::new`]).
    pub fn to_specs(&self) -> Vec<NodeSpec> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeSpec {
                id: n.id,
                name: n.name.clone(),
                kind: n.kind,
                cost: n.cost,
                bytes: n.bytes,
                workspace_bytes: n.workspace_bytes,
                deps: self.preds[i].iter().map(|&p| self.nodes[p].id).collect(),
                alternatives: n.alternatives.clone(),
            })
            .collect()
    }
}

/// One cycle through `start` (as graph positions), found inside its strongly connected component.
fn describe_cycle(dg: &DiGraph<(), ()>, start: NodeIndex) -> Vec<usize> {
    let scc: Vec<NodeIndex> = tarjan_scc(dg)
        .into_iter()
        .find(|c| c.contains(&start))
        .unwrap_or_else(|| vec![start]);
    // Breadth-first search from `start` back to `start`, staying inside the component.
    let mut parent: HashMap<NodeIndex, NodeIndex> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(u) = queue.pop_front() {
        for v in dg.neighbors(u) {
            if !scc.contains(&v) {
                continue;
            }
            if v == start {
                let mut path = vec![u.index()];
                let mut cur = u;
                while cur != start {
                    cur = parent[&cur];
                    path.push(cur.index());
                }
                path.reverse();
                path.push(start.index());
                return path;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = parent.entry(v) {
                e.insert(u);
                queue.push_back(v);
            }
        }
    }
    scc.iter().map(|n| n.index()).collect()
}
