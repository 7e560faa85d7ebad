//! Random graphs of our own, for tests and benchmarks that must not depend on files of unknown
//! licence: random layered DAGs of the family the Moccasin paper benchmarks on.
//!
//! The recipe follows the layered-graph family of Appendix A of "Neural Topological Ordering for
//! Computation Graphs" (Gagrani et al., NeurIPS 2022), as Moccasin (ICML 2023) used it, with
//! parameters named as in those graphs' file names (`w`, `nlv`, `ed`, `scd`). Our reading of it,
//! written down so that anyone can regenerate the same graphs ([`LayeredParams`] has the details):
//!
//! 1. Two input nodes (cost 0) form level 0.
//! 2. Levels of random width follow until `nodes` nodes exist: the mean width is
//!    `max(2, round(2 w sqrt(nodes)))`, each level's width uniform within `± nlv` of it.
//! 3. Every node of a level reads one uniformly chosen node of the level before, and every other
//!    node of that level with probability `ed`.
//! 4. Skip edges, from a node to one at least two levels later, are added uniformly at random
//!    until they are the fraction `scd` of all edges.
//! 5. A node of a non-final level that nothing reads gets a reader in the next level.
//! 6. Costs are uniform integers in `[0, 1000)`; output bytes are `10 * ceil(X)` with `X`
//!    exponential of mean 200 (mean about 2000 bytes).
//!
//! Graphs are deterministic functions of their parameters and seed on every platform (the
//! random numbers come from SplitMix64, implemented here).

use crate::error::{Error, Result};
use crate::graph::{Graph, NodeKind, NodeSpec};

/// A small deterministic random number generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x853c_49e6_748f_ea9b)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// Parameters of a random layered graph (see the module docs for the recipe).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayeredParams {
    /// Number of nodes (at least 3).
    pub nodes: usize,
    /// Width factor `w`: the mean level width is `max(2, round(2 w sqrt(nodes)))`.
    pub width: f64,
    /// Level-width variance `nlv` in `[0, 1)`: widths are uniform in `mean * (1 ± nlv)`.
    pub level_variance: f64,
    /// Edge density `ed`: probability of each edge between consecutive levels beyond the first.
    pub edge_density: f64,
    /// Skip-connection density `scd` in `[0, 1)`: the fraction of edges that skip levels.
    pub skip_density: f64,
}

impl LayeredParams {
    /// The parameters of Moccasin's benchmark family at `nodes` nodes with width factor `width`
    /// (its files use `nlv` 0.75, `ed` 0.2, `scd` 0.14).
    pub fn moccasin(nodes: usize, width: f64) -> LayeredParams {
        LayeredParams {
            nodes,
            width,
            level_variance: 0.75,
            edge_density: 0.2,
            skip_density: 0.14,
        }
    }

    /// The file-name form Moccasin uses, e.g. `random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14`.
    pub fn name(&self) -> String {
        format!(
            "random_layered_n{}_w{}_nlv{}_ed{}_scd{}",
            self.nodes, self.width, self.level_variance, self.edge_density, self.skip_density
        )
    }

    fn check(&self) -> Result<()> {
        let bad = |field: &str, value: String, expected: &str| {
            Err(Error::InvalidField {
                location: "random layered graph".into(),
                field: field.into(),
                value,
                expected: expected.into(),
            })
        };
        if self.nodes < 3 {
            return bad("nodes", self.nodes.to_string(), "at least 3");
        }
        if !(self.width > 0.0 && self.width.is_finite()) {
            return bad("width", self.width.to_string(), "a positive number");
        }
        if !(0.0..1.0).contains(&self.level_variance) {
            return bad(
                "level_variance",
                self.level_variance.to_string(),
                "in [0, 1)",
            );
        }
        if !(0.0..=1.0).contains(&self.edge_density) {
            return bad("edge_density", self.edge_density.to_string(), "in [0, 1]");
        }
        if !(0.0..1.0).contains(&self.skip_density) {
            return bad("skip_density", self.skip_density.to_string(), "in [0, 1)");
        }
        Ok(())
    }
}

/// A node's output bytes: `10 * ceil(X)`, `X` exponential of mean 200 (step 6 of the recipe).
fn output_bytes(rng: &mut Rng) -> u64 {
    let x = -200.0 * (1.0 - rng.unit()).ln();
    10 * (x.ceil() as u64).max(1)
}

/// A random layered graph: forward nodes only, cost unit `"duration"`, no static memory.
///
/// Errors: parameters out of range ([`Error::InvalidField`] naming the parameter).
pub fn random_layered(params: &LayeredParams, seed: u64) -> Result<Graph> {
    params.check()?;
    let mut rng = Rng::new(seed);
    let n = params.nodes;
    let mean = ((2.0 * params.width * (n as f64).sqrt()).round() as usize).max(2);
    let lo = ((mean as f64 * (1.0 - params.level_variance)).round() as usize).max(1);
    let hi = ((mean as f64 * (1.0 + params.level_variance)).round() as usize).max(lo);
    // Levels: node ranges, the first two input nodes alone.
    let mut levels: Vec<std::ops::Range<usize>> = Vec::new();
    levels.push(0..2);
    while levels.last().unwrap().end < n {
        let start = levels.last().unwrap().end;
        let w = rng.range(lo, hi).min(n - start);
        levels.push(start..start + w);
    }
    let level_of: Vec<usize> = levels
        .iter()
        .enumerate()
        .flat_map(|(l, r)| r.clone().map(move |_| l))
        .collect();
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut has_reader = vec![false; n];
    // Adds the edge `from -> to` unless it exists; whether it was new.
    let add = |deps: &mut Vec<Vec<usize>>, has_reader: &mut Vec<bool>, from: usize, to: usize| {
        if deps[to].contains(&from) {
            return false;
        }
        deps[to].push(from);
        has_reader[from] = true;
        true
    };
    let mut adjacent = 0usize;
    for l in 1..levels.len() {
        let prev = levels[l - 1].clone();
        for v in levels[l].clone() {
            let first = prev.start + rng.below(prev.len());
            adjacent += add(&mut deps, &mut has_reader, first, v) as usize;
            for u in prev.clone() {
                if u != first && rng.chance(params.edge_density) {
                    adjacent += add(&mut deps, &mut has_reader, u, v) as usize;
                }
            }
        }
    }
    // Readers for nodes of non-final levels that nothing reads yet.
    for l in 0..levels.len() - 1 {
        let next = levels[l + 1].clone();
        for u in levels[l].clone() {
            if !has_reader[u] {
                let v = next.start + rng.below(next.len());
                adjacent += add(&mut deps, &mut has_reader, u, v) as usize;
            }
        }
    }
    // Skip edges: the fraction `scd` of all edges, between levels at least two apart.
    if levels.len() >= 3 {
        let target =
            (params.skip_density / (1.0 - params.skip_density) * adjacent as f64).round() as usize;
        let first_reader = levels[2].start;
        let (mut added, mut tries) = (0usize, 0usize);
        while added < target && tries < 50 * target + 100 {
            tries += 1;
            let v = first_reader + rng.below(n - first_reader);
            let below = levels[level_of[v] - 1].start;
            let u = rng.below(below);
            added += add(&mut deps, &mut has_reader, u, v) as usize;
        }
    }
    let specs = (0..n)
        .map(|v| {
            let cost = if v < 2 { 0.0 } else { rng.below(1000) as f64 };
            let bytes = output_bytes(&mut rng);
            let mut d: Vec<u64> = deps[v].iter().map(|&u| u as u64).collect();
            d.sort_unstable();
            NodeSpec {
                alternatives: Vec::new(),
                id: v as u64,
                name: format!("n{v}"),
                kind: NodeKind::Forward,
                cost,
                bytes,
                workspace_bytes: 0,
                deps: d,
            }
        })
        .collect();
    Graph::new(format!("{}_s{seed}", params.name()), "duration", 0, specs)
}

/// Families of forward DAGs shaped like the networks rematerialization is used on, for property
/// tests on graphs nobody tuned a strategy to. [`Family::training`] turns one into a training graph
/// ([`with_backward`]). Sizes and costs are random (seeded): bytes `10 * ceil(X)`, `X` exponential
/// of mean 200, costs uniform in `[1, 1000)`, as in [`random_layered`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// A chain: every node reads the one before.
    Chain,
    /// A U-Net: an encoder of levels (a layer, then a downsampling node), a bottleneck, and a
    /// decoder whose levels read the level below and, through a skip edge, the encoder's layer of
    /// the same level.
    UNet,
    /// Residual blocks: two layers, then an add of their output and the block's input.
    Residual,
    /// Transformer blocks: a norm, query/key/value projections of it, scores of query and key,
    /// attention of scores and value, a projection, a residual add; then a norm, two MLP layers and
    /// a second residual add.
    Transformer,
    /// [`random_layered`] with Moccasin's parameters (`w` 0.27).
    Layered,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 5] = [
        Family::Chain,
        Family::UNet,
        Family::Residual,
        Family::Transformer,
        Family::Layered,
    ];

    /// `chain`, `unet`, `residual`, `transformer` or `layered`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Chain => "chain",
            Family::UNet => "unet",
            Family::Residual => "residual",
            Family::Transformer => "transformer",
            Family::Layered => "layered",
        }
    }

    /// A forward graph of this family with about `nodes` forward nodes (whole levels or blocks,
    /// at least one), sizes and costs drawn from `seed`.
    ///
    /// Errors: `nodes` below 3 ([`Error::InvalidField`]).
    pub fn forward(self, nodes: usize, seed: u64) -> Result<Graph> {
        if nodes < 3 {
            return Err(Error::InvalidField {
                location: format!("{} graph", self.name()),
                field: "nodes".into(),
                value: nodes.to_string(),
                expected: "at least 3".into(),
            });
        }
        if self == Family::Layered {
            return random_layered(&LayeredParams::moccasin(nodes, 0.27), seed);
        }
        let mut deps: Vec<Vec<usize>> = Vec::new();
        let mut add = |d: &[usize]| {
            deps.push(d.to_vec());
            deps.len() - 1
        };
        match self {
            Family::Chain => {
                for i in 0..nodes {
                    if i == 0 {
                        add(&[]);
                    } else {
                        add(&[i - 1]);
                    }
                }
            }
            Family::UNet => {
                let levels = ((nodes - 1) / 4).max(1);
                let mut x = add(&[]);
                let mut skips = Vec::new();
                for _ in 0..levels {
                    let layer = add(&[x]);
                    skips.push(layer);
                    x = add(&[layer]);
                }
                x = add(&[x]);
                for &skip in skips.iter().rev() {
                    let up = add(&[x]);
                    x = add(&[up, skip]);
                }
            }
            Family::Residual => {
                let blocks = ((nodes - 1) / 3).max(1);
                let mut x = add(&[]);
                for _ in 0..blocks {
                    let a = add(&[x]);
                    let b = add(&[a]);
                    x = add(&[b, x]);
                }
            }
            Family::Transformer => {
                let blocks = ((nodes - 1) / 11).max(1);
                let mut x = add(&[]);
                for _ in 0..blocks {
                    let norm = add(&[x]);
                    let q = add(&[norm]);
                    let k = add(&[norm]);
                    let v = add(&[norm]);
                    let scores = add(&[q, k]);
                    let attn = add(&[scores, v]);
                    let proj = add(&[attn]);
                    let r1 = add(&[proj, x]);
                    let norm2 = add(&[r1]);
                    let up = add(&[norm2]);
                    let down = add(&[up]);
                    x = add(&[down, r1]);
                }
            }
            Family::Layered => unreachable!("returned above"),
        }
        let mut rng = Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15);
        let specs = deps
            .iter()
            .enumerate()
            .map(|(v, d)| {
                let bytes = output_bytes(&mut rng);
                NodeSpec {
                    alternatives: Vec::new(),
                    id: v as u64,
                    name: format!("n{v}"),
                    kind: NodeKind::Forward,
                    cost: (1 + rng.below(999)) as f64,
                    bytes,
                    workspace_bytes: 0,
                    deps: d.iter().map(|&u| u as u64).collect(),
                }
            })
            .collect();
        Graph::new(
            format!("{}{}_s{seed}", self.name(), deps.len()),
            "flops",
            0,
            specs,
        )
    }

    /// The training graph of [`Family::forward`]: about `2 * nodes + 1` nodes.
    pub fn training(self, nodes: usize, seed: u64) -> Result<Graph> {
        with_backward(&self.forward(nodes, seed)?)
    }
}

/// A forward chain of `nodes` nodes named `n0, n1, ...`, each reading the one before it, costing 1
/// and holding `bytes` (graph name `chain<nodes>`, cost unit `flops`). With [`with_backward`], the
/// training graph of a chain; both are the long-graph cases of the solver's limits.
pub fn chain(nodes: usize, bytes: u64) -> Result<Graph> {
    let specs = (0..nodes)
        .map(|i| NodeSpec {
            alternatives: Vec::new(),
            id: i as u64,
            name: format!("n{i}"),
            kind: NodeKind::Forward,
            cost: 1.0,
            bytes,
            workspace_bytes: 0,
            deps: if i > 0 { vec![i as u64 - 1] } else { vec![] },
        })
        .collect();
    Graph::new(format!("chain{nodes}"), "flops", 0, specs)
}

/// The training graph of a forward-only DAG: `forward` as is, then a loss node that reads every
/// node nothing reads (its bytes: the smallest forward output, cost: 1), then one backward node
/// per forward node, in reverse order, that reads what a gradient rule needs: the node's output,
/// its inputs and the gradients of its consumers (the loss, for the nodes it reads). A backward
/// node costs twice its forward node and is as large as its output (the gradient of it).
///
/// Errors: `forward` has nodes that are not [`NodeKind::Forward`] ([`Error::InvalidField`]).
pub fn with_backward(forward: &Graph) -> Result<Graph> {
    let n = forward.len();
    if let Some(v) = (0..n).find(|&v| forward.node(v).kind != NodeKind::Forward) {
        return Err(Error::InvalidField {
            location: format!("graph {}", forward.name()),
            field: "kind".into(),
            value: format!("node {} is {:?}", forward.node(v).id, forward.node(v).kind),
            expected: "forward nodes only (with_backward adds the loss and backward nodes)".into(),
        });
    }
    let loss = n;
    let grad = |v: usize| n + 1 + (n - 1 - v);
    let sinks: Vec<usize> = (0..n).filter(|&v| forward.succs(v).is_empty()).collect();
    let mut specs: Vec<NodeSpec> = forward
        .nodes()
        .iter()
        .enumerate()
        .map(|(v, node)| NodeSpec {
            alternatives: Vec::new(),
            id: v as u64,
            name: node.name.clone(),
            kind: NodeKind::Forward,
            cost: node.cost,
            bytes: node.bytes,
            workspace_bytes: node.workspace_bytes,
            deps: forward.preds(v).iter().map(|&u| u as u64).collect(),
        })
        .collect();
    specs.push(NodeSpec {
        alternatives: Vec::new(),
        id: loss as u64,
        name: "loss".into(),
        kind: NodeKind::Loss,
        cost: 1.0,
        bytes: forward
            .nodes()
            .iter()
            .map(|x| x.bytes)
            .min()
            .unwrap_or(1)
            .max(1),
        workspace_bytes: 0,
        deps: sinks.iter().map(|&v| v as u64).collect(),
    });
    for v in (0..n).rev() {
        let mut deps: Vec<u64> = vec![v as u64];
        deps.extend(forward.preds(v).iter().map(|&u| u as u64));
        if forward.succs(v).is_empty() {
            deps.push(loss as u64);
        }
        deps.extend(forward.succs(v).iter().map(|&c| grad(c) as u64));
        deps.sort_unstable();
        deps.dedup();
        let node = forward.node(v);
        specs.push(NodeSpec {
            alternatives: Vec::new(),
            id: grad(v) as u64,
            name: format!("{}_grad", node.name),
            kind: NodeKind::Backward,
            cost: 2.0 * node.cost,
            bytes: node.bytes,
            workspace_bytes: 0,
            deps,
        });
    }
    Graph::new(
        format!("{}_train", forward.name()),
        forward.cost_unit(),
        forward.static_bytes(),
        specs,
    )
}

/// `g` as networkx node-link JSON in the random layered variant Moccasin's files use (`name` as id,
/// `duration`, `out_cost`, `param_cost`, links keyed `"0"`/`"1"`), which [`Graph::read`] imports.
pub fn to_layered_node_link(g: &Graph) -> String {
    let nodes: Vec<serde_json::Value> = g
        .nodes()
        .iter()
        .map(|n| {
            serde_json::json!({
                "out_cost": n.bytes, "param_cost": 0, "duration": n.cost, "name": n.id,
            })
        })
        .collect();
    let links: Vec<serde_json::Value> = (0..g.len())
        .flat_map(|v| g.preds(v).iter().map(move |&u| (u, v)))
        .map(|(u, v)| serde_json::json!({"0": g.node(u).id, "1": g.node(v).id}))
        .collect();
    serde_json::json!({
        "directed": true, "multigraph": false, "graph": {"name": g.name()},
        "nodes": nodes, "links": links,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_nodes_read_what_a_gradient_rule_needs() {
        let f = random_layered(&LayeredParams::moccasin(30, 0.3), 3).unwrap();
        let g = with_backward(&f).unwrap();
        let n = f.len();
        assert_eq!(g.len(), 2 * n + 1);
        assert_eq!(g.node(n).kind, NodeKind::Loss);
        for v in 0..n {
            let b = 2 * n - v;
            assert_eq!(g.node(b).kind, NodeKind::Backward);
            let reads = g.preds(b);
            assert!(reads.contains(&v));
            assert!(f.preds(v).iter().all(|u| reads.contains(u)));
            assert!(f.succs(v).iter().all(|&c| reads.contains(&(2 * n - c))));
            assert_eq!(reads.contains(&n), f.succs(v).is_empty());
        }
        // Backward graphs are refused as input.
        assert!(with_backward(&g).is_err());
    }

    #[test]
    fn layered_graphs_have_the_family_shape() {
        for (n, w) in [(100, 0.27), (250, 0.43), (500, 0.36), (1000, 0.31)] {
            let p = LayeredParams::moccasin(n, w);
            let g = random_layered(&p, 7).unwrap();
            assert_eq!(g.len(), n);
            // Two inputs; every other node reads something; sinks only in the last level.
            let sources = (0..n).filter(|&v| g.preds(v).is_empty()).count();
            assert_eq!(sources, 2, "n={n}");
            let edges = g.edge_count() as f64;
            let mean_in = edges / n as f64;
            assert!(
                (1.5..12.0).contains(&mean_in),
                "n={n}: mean in-degree {mean_in}"
            );
            let mean_bytes = g.nodes().iter().map(|x| x.bytes as f64).sum::<f64>() / n as f64;
            assert!(
                (1500.0..2500.0).contains(&mean_bytes),
                "n={n}: {mean_bytes}"
            );
            let mean_cost = g.total_cost() / n as f64;
            assert!((400.0..600.0).contains(&mean_cost), "n={n}: {mean_cost}");
            // Same seed, same graph; another seed, another graph.
            assert_eq!(random_layered(&p, 7).unwrap().to_json(), g.to_json());
            assert_ne!(random_layered(&p, 8).unwrap().to_json(), g.to_json());
        }
    }

    #[test]
    fn skip_edges_are_about_the_asked_fraction() {
        let p = LayeredParams::moccasin(1000, 0.31);
        let g = random_layered(&p, 1).unwrap();
        // Levels by longest path from the inputs; an edge spanning more than one is a skip.
        let mut level = vec![0usize; g.len()];
        for v in 0..g.len() {
            level[v] = g.preds(v).iter().map(|&u| level[u] + 1).max().unwrap_or(0);
        }
        let (mut skips, mut all) = (0, 0);
        for v in 0..g.len() {
            for &u in g.preds(v) {
                all += 1;
                skips += (level[v] - level[u] > 1) as usize;
            }
        }
        let frac = skips as f64 / all as f64;
        assert!((0.08..0.25).contains(&frac), "skip fraction {frac}");
    }

    #[test]
    fn node_link_form_reads_back_as_the_same_graph() {
        let g = random_layered(&LayeredParams::moccasin(250, 0.43), 2).unwrap();
        let back = Graph::from_json_str(&to_layered_node_link(&g), "generated").unwrap();
        assert_eq!(back.to_specs(), g.to_specs());
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let mut p = LayeredParams::moccasin(100, 0.27);
        p.skip_density = 1.0;
        let msg = random_layered(&p, 0).unwrap_err().to_string();
        assert!(msg.contains("skip_density"), "{msg}");
        p = LayeredParams::moccasin(2, 0.27);
        assert!(random_layered(&p, 0)
            .unwrap_err()
            .to_string()
            .contains("nodes"));
    }

    #[test]
    fn families_have_their_shape() {
        for family in Family::ALL {
            for seed in 0..3 {
                let g = family.training(25, seed).unwrap();
                let f = family.forward(25, seed).unwrap();
                assert_eq!(g.len(), 2 * f.len() + 1, "{}", family.name());
                assert!(f.len() >= 13, "{}: {} nodes", family.name(), f.len());
            }
        }
        // A U-Net's decoder reads the encoder (skip edges); a residual add reads its block input.
        let sorted = |g: &Graph, v: usize| {
            let mut p = g.preds(v).to_vec();
            p.sort_unstable();
            p
        };
        let u = Family::UNet.forward(9, 0).unwrap();
        assert_eq!(u.len(), 10);
        assert_eq!(sorted(&u, 9), [1, 8]);
        assert_eq!(sorted(&u, 7), [3, 6]);
        let r = Family::Residual.forward(4, 0).unwrap();
        assert_eq!(sorted(&r, 3), [0, 2]);
        let t = Family::Transformer.forward(12, 0).unwrap();
        assert_eq!(sorted(&t, 5), [2, 3], "scores read query and key");
        assert!(Family::Chain.forward(2, 0).is_err());
    }

    #[test]
    fn rng_is_uniform_enough() {
        let mut r = Rng::new(3);
        let mut counts = [0usize; 10];
        for _ in 0..100_000 {
            counts[r.below(10)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }
}
