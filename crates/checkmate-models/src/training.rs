//! From a [`Network`] to its training graph: forward nodes, the loss, backward nodes.

use checkmate_graph::{Graph, Implementation, NodeIdx, NodeKind, NodeSpec};

use crate::costs::Costs;
use crate::error::Result;
use crate::network::{LayerId, Network, TensorRef};
use crate::op::{Activation, Op, WHOLE_SAMPLE};

/// The optimizer whose state counts in static memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one buffer per trainable parameter.
    #[default]
    SgdMomentum,
    /// Adam: two buffers (first and second moments) per trainable parameter.
    Adam,
}

impl Optimizer {
    /// State buffers per trainable parameter.
    pub fn state_per_param(self) -> u64 {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::SgdMomentum => 1,
            Optimizer::Adam => 2,
        }
    }
}

/// How finely a training graph splits the computation (docs/OP_GRAPHS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Granularity {
    /// One forward and one backward node per layer (Checkmate's graphs).
    #[default]
    Layer,
    /// Operator level: a ReLU's or max pooling's backward reads a compact saved state of its own
    /// ([`NodeRole::Saved`]: a 1-bit mask, a byte per pooling window) instead of the layer's
    /// output or input, and a convolution's or dense layer's parameter gradient is a node of its
    /// own ([`NodeRole::WeightGrad`], reading the layer's input) beside its input gradient (which
    /// does not read it).
    Op,
}

impl Granularity {
    /// `"layer"` or `"op"`.
    pub fn name(self) -> &'static str {
        match self {
            Granularity::Layer => "layer",
            Granularity::Op => "op",
        }
    }
}

impl std::str::FromStr for Granularity {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Granularity, String> {
        match s {
            "layer" => Ok(Granularity::Layer),
            "op" => Ok(Granularity::Op),
            other => Err(format!(
                "unknown granularity `{other}`: expected `op` or `layer`"
            )),
        }
    }
}

/// The compact state an operator-level graph saves for a layer's backward rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SavedKind {
    /// One bit per output element: where a ReLU (or ReLU6) passes its gradient (`0 < y`, and
    /// `y < 6` for ReLU6), packed 8 to a byte, `ceil(elements / 8)` bytes.
    ActivationMask,
    /// One byte per output element of a max pooling: the offset of the winning cell in its window
    /// (row-major), 255 for a window of padding only.
    PoolIndex,
}

/// How to build a training graph.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingConfig {
    /// Optimizer (static memory only).
    pub optimizer: Optimizer,
    /// Node costs: FLOPs or a measured table.
    pub costs: Costs,
    /// Whether nodes carry `workspace_bytes` for their temporaries (see docs/MODELS.md); `false`
    /// gives Checkmate's model, where only outputs count.
    pub workspace: bool,
    /// Layer or operator nodes.
    pub granularity: Granularity,
    /// Operator level: a convolution with a fused ReLU whose only consumer is a max pooling with
    /// non-overlapping, unpadded windows never holds its output. Its forward node computes the
    /// ReLU mask and the pooling's winners chunk by chunk (its output: those two, as one
    /// node), and the pooling's forward node recomputes the convolution at the winning cells
    /// only (`1 / window` of its FLOPs) from the convolution's input and the winners.
    /// docs/OP_GRAPHS.md, "Fused convolution and pooling".
    pub fuse_conv_pool: bool,
    /// Operator level: a standalone ReLU (or ReLU6) whose input nothing else reads overwrites
    /// that input in the input's forward node ([`TrainingGraph::relu_in_place`]). Off by
    /// default: in conv-BN-ReLU and add-ReLU chains it removes a transient the producer's own
    /// step already exceeds, and `lp-round` plans ResNet50's changed graph worse
    /// (docs/OP_GRAPHS.md, "In-place ReLU").
    pub relu_in_place: bool,
}

impl Default for TrainingConfig {
    /// SGD with momentum, FLOP costs, workspace counted.
    fn default() -> TrainingConfig {
        TrainingConfig {
            optimizer: Optimizer::SgdMomentum,
            costs: Costs::Flops,
            workspace: true,
            granularity: Granularity::Layer,
            fuse_conv_pool: false,
            relu_in_place: false,
        }
    }
}

/// What a training-graph node computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeRole {
    /// The forward computation of a layer.
    Forward(LayerId),
    /// The loss (per-example losses).
    Loss,
    /// The backward computation of a layer: its input gradients, and its parameter gradients
    /// unless the layer has a [`NodeRole::WeightGrad`] node.
    Backward(LayerId),
    /// Operator level: the compact state a layer's backward reads instead of a whole tensor.
    Saved(LayerId, SavedKind),
    /// Operator level: a layer's parameter gradients, apart from its input gradients.
    WeightGrad(LayerId),
    /// Operator level: the gradient of one input (`.1`, the slot) of a concatenation, apart from
    /// the others ([`BackwardNode::input_nodes`]).
    InputGrad(LayerId, usize),
}

/// A contribution to the gradient of a layer's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GradSource {
    /// The loss: the layer is the prediction; its backward node forms `dLoss/dprediction` itself
    /// from its output and the labels.
    Loss,
    /// Layer `layer`'s backward node, the gradient of its input `slot`.
    Layer {
        /// The consuming layer.
        layer: LayerId,
        /// Which of its inputs.
        slot: usize,
    },
}

/// What a layer's backward node reads and produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackwardNode {
    /// The layer.
    pub layer: LayerId,
    /// Its node in the graph.
    pub node: NodeIdx,
    /// Per input of the layer: whether this node outputs that input's gradient (inputs that are
    /// the network input, or that no parameter depends on, get none). Outputs come in input order;
    /// for [`Op::Add`] one tensor serves every input.
    pub input_grads: Vec<bool>,
    /// The contributions summed into the gradient of the layer's output.
    pub upstream: Vec<GradSource>,
    /// Forward tensors the gradient rule reads (`TensorRef::Layer(self)` is its own output;
    /// `TensorRef::Input` is the static input batch).
    pub reads: Vec<TensorRef>,
    /// Operator level: the node of the layer's compact saved state, read instead of its output
    /// (ReLU mask) or input (max-pooling indices).
    pub saved: Option<(NodeIdx, SavedKind)>,
    /// Operator level: the node computing the layer's parameter gradients (reading `reads` and
    /// the upstream gradient); then `node` computes input gradients only and reads no inputs.
    pub weight_node: Option<NodeIdx>,
    /// Operator level: the max pooling (non-overlapping windows) that is this convolution's only
    /// consumer and whose gradient this layer's gradient kernels form themselves, chunk by
    /// chunk, from the pooling's upstream gradient and winners: the pooling has no backward
    /// node, `upstream` is the pooling's, and the full-size gradient of this layer's output is
    /// never held. With the pooling's winners node ([`NodeRole::Saved`], read by this node).
    /// The third field is the index among that node's outputs (1 for a fused convolution's own
    /// forward node, [`TrainingConfig::fuse_conv_pool`]; else 0).
    pub pooled: Option<(LayerId, NodeIdx, usize)>,
    /// Operator level: the upstream gradients are several and the activation's saved mask
    /// applies to them outside a convolution's kernel, so the node adds them and masks the sum
    /// in one pass, holding no summed temporary.
    pub sum_masked: bool,
    /// Operator level, a concatenation: per input, the node writing only that input's gradient
    /// (`None` where the input gets none), so that each gradient's reader holds its slice, not
    /// the whole concatenated gradient; `node` is the first of them. Empty when `node` writes
    /// every input gradient.
    pub input_nodes: Vec<Option<NodeIdx>>,
}

impl BackwardNode {
    /// Where the gradient of input `slot` lives: the node and the index among its outputs.
    /// `shared` is [`Op::shares_input_gradient`] of the layer (one output serves every input).
    pub fn input_grad(&self, slot: usize, shared: bool) -> (NodeIdx, usize) {
        if let Some(Some(node)) = self.input_nodes.get(slot) {
            return (*node, 0);
        }
        let index = if shared {
            0
        } else {
            self.input_grads[..slot].iter().filter(|&&g| g).count()
        };
        (self.node, index)
    }
}

/// Static memory of a training step, in bytes: never freed, not part of any plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StaticMemory {
    /// Every parameter (batch-norm running statistics included).
    pub params: u64,
    /// Gradients of the trainable parameters.
    pub param_grads: u64,
    /// Optimizer state.
    pub optimizer_state: u64,
    /// The input batch.
    pub input: u64,
    /// The labels.
    pub labels: u64,
}

impl StaticMemory {
    /// The sum.
    pub fn total(&self) -> u64 {
        self.params + self.param_grads + self.optimizer_state + self.input + self.labels
    }
}

/// A training graph with the mapping from its nodes back to the network.
///
/// Node ids equal node indices: the forward nodes in layer order (at operator level each followed
/// by its layer's saved-state node, if any), the loss, then the backward nodes in reverse layer
/// order (at operator level a layer's parameter-gradient node just before its input-gradient node).
/// At layer granularity layer `l`'s forward node is `l`.
#[derive(Debug, Clone)]
pub struct TrainingGraph {
    /// The graph (`checkmate-graph`).
    pub graph: Graph,
    /// How the graph was split.
    pub granularity: Granularity,
    /// Per layer, its forward node.
    pub forward: Vec<NodeIdx>,
    /// Role of each node, by node index.
    pub roles: Vec<NodeRole>,
    /// Per layer, its backward node (`None` when the layer needs no gradient: no parameter at or
    /// before it, e.g. a padding of the input image; or, at operator level, for a max pooling
    /// whose gradient its input convolution's kernels form, [`BackwardNode::pooled`]).
    pub backward: Vec<Option<BackwardNode>>,
    /// The loss node.
    pub loss_node: NodeIdx,
    /// Per layer, [`TrainingConfig::fuse_conv_pool`]: for a convolution whose forward node
    /// computes its mask and its pooling's winners, that pooling; for that pooling, whose forward
    /// node recomputes the convolution at the winners, the convolution.
    pub fused_with: Vec<Option<LayerId>>,
    /// Operator level, per layer: the standalone ReLU (or ReLU6) applied in place to this
    /// layer's output, in this layer's forward node (which is then also the ReLU's,
    /// [`TrainingGraph::forward_node`]): the layer's output is read by that ReLU alone and by no
    /// gradient rule, so it and the ReLU's output are one tensor (docs/OP_GRAPHS.md, "In-place
    /// ReLU").
    pub relu_in_place: Vec<Option<LayerId>>,
    /// Static memory, whose total is `graph.static_bytes()`.
    pub static_memory: StaticMemory,
}

impl TrainingGraph {
    /// The forward node of a layer.
    pub fn forward_node(&self, layer: LayerId) -> NodeIdx {
        self.forward[layer]
    }

    /// The backward node of a layer, if it has one.
    pub fn backward_node(&self, layer: LayerId) -> Option<NodeIdx> {
        self.backward[layer].as_ref().map(|b| b.node)
    }

    /// What node `i` computes.
    pub fn role(&self, i: NodeIdx) -> NodeRole {
        self.roles[i]
    }
}

impl Network {
    /// Which layers need a backward node: those with trainable parameters at or before them.
    pub fn needs_gradient(&self) -> Vec<bool> {
        let mut needs = vec![false; self.layers().len()];
        for (id, l) in self.layers().iter().enumerate() {
            needs[id] = l.trainable_param_count() > 0
                || l.inputs
                    .iter()
                    .any(|t| matches!(t, TensorRef::Layer(p) if needs[*p]));
        }
        needs
    }

    /// What operator granularity saves for layer `id`'s backward rule instead of a whole tensor:
    /// a ReLU/ReLU6 mask of its output (fused or standalone, unless the loss reads the output) or
    /// the winning cells of a max pooling.
    fn saved_kind(&self, id: LayerId) -> Option<SavedKind> {
        let l = self.layer(id);
        if id == self.loss().input {
            return None;
        }
        match &l.op {
            Op::MaxPool2d(p) if p.pool[0] * p.pool[1] < 255 && l.output.shape.rank() == 4 => {
                Some(SavedKind::PoolIndex)
            }
            Op::Conv2d(_) | Op::ConvTranspose2d(_) | Op::Dense(_) | Op::Activation(_)
                if matches!(l.op.activation(), Activation::Relu | Activation::Relu6) =>
            {
                Some(SavedKind::ActivationMask)
            }
            _ => None,
        }
    }

    /// The max pooling whose gradient operator granularity forms inside the gradient kernels of
    /// convolution `id`: `id` is a convolution with a fused ReLU whose only consumer is a max
    /// pooling with non-overlapping, unpadded windows (neither feeding the loss).
    fn pool_after(&self, id: LayerId) -> Option<LayerId> {
        let l = self.layer(id);
        let loss = self.loss().input;
        if id == loss
            || !matches!(l.op, Op::Conv2d(_))
            || l.op.activation() != Activation::Relu
            || l.output.shape.rank() != 4
        {
            return None;
        }
        let &[(p, 0)] = self.consumers(id) else {
            return None;
        };
        let pl = self.layer(p);
        let Op::MaxPool2d(pool) = &pl.op else {
            return None;
        };
        let hw = [l.output.shape.dim(2), l.output.shape.dim(3)];
        let fits = pool.pool == pool.stride
            && pool.padding_for(hw) == [0; 4]
            && pool.pool[0] * pool.pool[1] < 255
            && p != loss;
        fits.then_some(p)
    }

    /// Operator level: the layer whose output standalone ReLU/ReLU6 `id` may overwrite in place:
    /// its only input, read by `id` alone, produced by a batch norm, an addition, a linear
    /// convolution or dense layer, or a max pooling whose backward reads its winners, none of
    /// which reads its own output to form its gradient; `id` keeps a mask (so its own backward
    /// does not read the output either), and neither feeds the loss.
    fn in_place_producer(
        &self,
        id: LayerId,
        saved_kind: &[Option<SavedKind>],
        fused_with: &[Option<LayerId>],
    ) -> Option<LayerId> {
        let l = self.layer(id);
        let loss = self.loss().input;
        if !matches!(l.op, Op::Activation(Activation::Relu | Activation::Relu6))
            || saved_kind[id] != Some(SavedKind::ActivationMask)
            || id == loss
        {
            return None;
        }
        let &[TensorRef::Layer(p)] = l.inputs.as_slice() else {
            return None;
        };
        let pl = self.layer(p);
        let produces = match &pl.op {
            Op::BatchNorm(_) => true,
            // (One input: the sum is that input itself, not a tensor of its own.)
            Op::Add => pl.inputs.len() >= 2,
            Op::Conv2d(_) | Op::Dense(_) => pl.op.activation() == Activation::Linear,
            Op::MaxPool2d(_) => saved_kind[p] == Some(SavedKind::PoolIndex),
            _ => false,
        };
        let alone = matches!(self.consumers(p), [(c, 0)] if *c == id);
        (produces && alone && p != loss && fused_with[p].is_none()).then_some(p)
    }

    /// Builds the training graph: one forward node per layer, the loss, and one backward node per
    /// layer that needs a gradient, with the dependencies and sizes described in docs/MODELS.md;
    /// at [`Granularity::Op`] also the saved-state and parameter-gradient nodes of
    /// docs/OP_GRAPHS.md.
    pub fn training_graph(&self, config: &TrainingConfig) -> Result<TrainingGraph> {
        let layers = self.layers();
        let n_layers = layers.len();
        let loss = self.loss();
        let needs = self.needs_gradient();
        let op_level = config.granularity == Granularity::Op;
        let workspace = |bytes: u64| if config.workspace { bytes } else { 0 };

        // Node ids: forward nodes (each followed by its saved state), the loss, backward nodes.
        let mut saved_kind: Vec<Option<SavedKind>> = (0..n_layers)
            .map(|id| {
                if op_level && needs[id] {
                    self.saved_kind(id)
                } else {
                    None
                }
            })
            .collect();
        let split: Vec<bool> = (0..n_layers)
            .map(|id| {
                let l = &layers[id];
                op_level
                    && needs[id]
                    && matches!(l.op, Op::Conv2d(_) | Op::Dense(_))
                    && l.trainable_param_count() > 0
                    && l.inputs
                        .iter()
                        .any(|t| matches!(t, TensorRef::Layer(p) if needs[*p]))
            })
            .collect();
        // Convolution -> the pooling whose gradient its kernels form; the pooling's backward node
        // goes.
        let pooled: Vec<Option<LayerId>> = (0..n_layers)
            .map(|id| {
                if op_level && needs[id] {
                    self.pool_after(id)
                        .filter(|&p| saved_kind[p] == Some(SavedKind::PoolIndex))
                } else {
                    None
                }
            })
            .collect();
        // A concatenation whose inputs' gradients go to different readers: one node per input
        // gradient, each holding its slice only (not when the loss reads it: that gradient is
        // formed from the prediction as a whole).
        let split_inputs: Vec<bool> = (0..n_layers)
            .map(|id| {
                let l = &layers[id];
                op_level
                    && needs[id]
                    && matches!(l.op, Op::Concat { .. })
                    && id != loss.input
                    && l.inputs
                        .iter()
                        .filter(|t| matches!(t, TensorRef::Layer(p) if needs[*p]))
                        .count()
                        >= 2
            })
            .collect();
        let mut fused_pool = vec![false; n_layers];
        for p in pooled.iter().flatten() {
            fused_pool[*p] = true;
        }
        // Convolution -> pooling computed together in the forward pass: neither has a saved-state
        // node (the convolution's forward node outputs its mask and the winners).
        let fused: Vec<Option<LayerId>> = (0..n_layers)
            .map(|id| pooled[id].filter(|_| config.fuse_conv_pool))
            .collect();
        let mut fused_with = fused.clone();
        for (c, p) in fused.iter().enumerate() {
            if let Some(p) = *p {
                fused_with[p] = Some(c);
                saved_kind[c] = None;
                saved_kind[p] = None;
            }
        }
        // A standalone ReLU whose input is read by nothing else, forward or backward: applied in
        // place in its input's forward node (ReLU -> producer, producer -> ReLU).
        let mut in_place_of: Vec<Option<LayerId>> = vec![None; n_layers];
        let mut relu_in_place: Vec<Option<LayerId>> = vec![None; n_layers];
        if op_level && config.relu_in_place {
            for (id, l) in layers.iter().enumerate() {
                if let Some(p) = self.in_place_producer(id, &saved_kind, &fused_with) {
                    debug_assert!(matches!(l.op, Op::Activation(_)));
                    in_place_of[id] = Some(p);
                    relu_in_place[p] = Some(id);
                }
            }
        }
        let mut next = 0;
        let mut forward = vec![0; n_layers];
        let mut saved_node = vec![None; n_layers];
        for id in 0..n_layers {
            if let Some(p) = in_place_of[id] {
                forward[id] = forward[p];
            } else {
                forward[id] = next;
                next += 1;
            }
            if saved_kind[id].is_some() {
                saved_node[id] = Some(next);
                next += 1;
            }
        }
        let loss_node = next;
        next += 1;
        let mut node_of = vec![usize::MAX; n_layers];
        let mut weight_node = vec![None; n_layers];
        let mut input_nodes: Vec<Vec<Option<usize>>> = vec![Vec::new(); n_layers];
        for id in (0..n_layers).rev() {
            if needs[id] && !fused_pool[id] {
                if split[id] {
                    weight_node[id] = Some(next);
                    next += 1;
                }
                if split_inputs[id] {
                    for t in &layers[id].inputs {
                        input_nodes[id].push(match t {
                            TensorRef::Layer(p) if needs[*p] => {
                                next += 1;
                                Some(next - 1)
                            }
                            _ => None,
                        });
                    }
                    node_of[id] = input_nodes[id]
                        .iter()
                        .flatten()
                        .copied()
                        .min()
                        .unwrap_or(next);
                    continue;
                }
                node_of[id] = next;
                next += 1;
            }
        }
        let n_nodes = next;
        let mut specs: Vec<Option<NodeSpec>> = vec![None; n_nodes];
        let mut roles: Vec<Option<NodeRole>> = vec![None; n_nodes];
        let layer_deps = |ts: &[TensorRef]| -> Vec<u64> {
            ts.iter()
                .filter_map(|t| match t {
                    TensorRef::Layer(p) => Some(forward[*p] as u64),
                    TensorRef::Input => None,
                })
                .collect()
        };

        // At operator level a convolution has a second kernel (docs/IMPLEMENTATIONS.md): the
        // same FLOPs, so with FLOP costs it is never chosen; a profile's times decide.
        let whole_sample = |cost: f64, ws: u64, extra: Option<u64>| -> Vec<Implementation> {
            match extra {
                Some(extra) if op_level => vec![Implementation {
                    name: WHOLE_SAMPLE.to_string(),
                    cost,
                    workspace_bytes: ws + workspace(extra),
                }],
                _ => Vec::new(),
            }
        };
        for (id, l) in layers.iter().enumerate() {
            let v = forward[id];
            let ws = workspace(l.op.forward_workspace(&l.input_types, &l.output.shape));
            if let Some(other) = fused_with[id] {
                let (c, p) = if fused[id].is_some() {
                    (id, other)
                } else {
                    (other, id)
                };
                let (cl, pl) = (&layers[c], &layers[p]);
                let Op::MaxPool2d(pool) = &pl.op else {
                    unreachable!("a fused pooling pools (pool_after)")
                };
                let window = (pool.pool[0] * pool.pool[1]) as u64;
                let (ws_conv, ws_pool) = cl.op.fused_pool_workspace(
                    &cl.input_types,
                    &cl.output.shape,
                    &pl.output.shape,
                    pool.pool,
                );
                let out_elems = cl.output.shape.elements();
                let pooled_elems = pl.output.shape.elements();
                let spec = if id == c {
                    // The mask (a bit per output element) and the winners (a byte per window).
                    NodeSpec {
                        alternatives: Vec::new(),
                        id: v as u64,
                        name: l.name.clone(),
                        kind: NodeKind::Forward,
                        cost: l.forward_flops + out_elems as f64 + (pooled_elems * window) as f64,
                        bytes: out_elems.div_ceil(8) + pooled_elems,
                        workspace_bytes: workspace(ws_conv),
                        deps: layer_deps(&l.inputs),
                    }
                } else {
                    // The convolution at each window's winner only, from its input.
                    let mut deps = layer_deps(&cl.inputs);
                    deps.push(forward[c] as u64);
                    NodeSpec {
                        alternatives: Vec::new(),
                        id: v as u64,
                        name: l.name.clone(),
                        kind: NodeKind::Forward,
                        cost: cl.forward_flops / window as f64 + pooled_elems as f64,
                        bytes: l.output_bytes(),
                        workspace_bytes: workspace(ws_pool),
                        deps,
                    }
                };
                specs[v] = Some(spec);
                roles[v] = Some(NodeRole::Forward(id));
                continue;
            }
            // A ReLU applied in place is computed by its producer's node (which `v` is); only its
            // mask, below, is a node of its own.
            if in_place_of[id].is_none() {
                let relu_flops = relu_in_place[id].map_or(0.0, |r| layers[r].forward_flops);
                specs[v] = Some(NodeSpec {
                    alternatives: whole_sample(
                        l.forward_flops,
                        ws,
                        l.op.whole_sample_extra(&l.input_types, &l.output.shape, false, false),
                    ),
                    id: v as u64,
                    name: l.name.clone(),
                    kind: NodeKind::Forward,
                    cost: l.forward_flops + relu_flops,
                    bytes: l.output_bytes(),
                    workspace_bytes: ws,
                    deps: layer_deps(&l.inputs),
                });
                roles[v] = Some(NodeRole::Forward(id));
            }
            if let (Some(s), Some(kind)) = (saved_node[id], saved_kind[id]) {
                let out_elems = l.output.shape.elements();
                let (name, bytes, deps, cost) = match kind {
                    SavedKind::ActivationMask => (
                        format!("{}_mask", l.name),
                        out_elems.div_ceil(8),
                        vec![v as u64],
                        out_elems as f64,
                    ),
                    SavedKind::PoolIndex => {
                        let window = match &l.op {
                            Op::MaxPool2d(p) => (p.pool[0] * p.pool[1]) as f64,
                            _ => 1.0,
                        };
                        (
                            format!("{}_indices", l.name),
                            out_elems,
                            layer_deps(&l.inputs),
                            out_elems as f64 * window,
                        )
                    }
                };
                specs[s] = Some(NodeSpec {
                    alternatives: Vec::new(),
                    id: s as u64,
                    name,
                    kind: NodeKind::Forward,
                    cost,
                    bytes,
                    workspace_bytes: 0,
                    deps,
                });
                roles[s] = Some(NodeRole::Saved(id, kind));
            }
        }

        let pred = &layers[loss.input];
        let pred_elems = pred.output.shape.elements() as f64;
        specs[loss_node] = Some(NodeSpec {
            alternatives: Vec::new(),
            id: loss_node as u64,
            name: loss.name.clone(),
            kind: NodeKind::Loss,
            cost: if loss.from_logits { 6.0 } else { 2.0 } * pred_elems,
            bytes: loss.output.bytes(),
            workspace_bytes: workspace(if loss.from_logits {
                pred.output_bytes()
            } else {
                0
            }),
            deps: vec![forward[loss.input] as u64],
        });
        roles[loss_node] = Some(NodeRole::Loss);

        let mut backward: Vec<Option<BackwardNode>> = vec![None; n_layers];
        for id in (0..n_layers).rev() {
            if !needs[id] || fused_pool[id] {
                continue;
            }
            let l = &layers[id];
            let input_grads: Vec<bool> = l
                .inputs
                .iter()
                .map(|t| matches!(t, TensorRef::Layer(p) if needs[*p]))
                .collect();
            let any_input_grad = input_grads.iter().any(|&g| g);
            let feeds_loss = id == loss.input;
            // A fused pooling's gradient comes from the pooling's consumers.
            let grad_of = pooled[id].unwrap_or(id);
            let mut upstream: Vec<GradSource> = self
                .consumers(grad_of)
                .iter()
                .map(|&(layer, slot)| GradSource::Layer { layer, slot })
                .collect();
            if feeds_loss {
                upstream.insert(0, GradSource::Loss);
            }
            // A fused convolution's mask is output 0 of its own forward node.
            let saved = match fused[id] {
                Some(_) => Some((forward[id], SavedKind::ActivationMask)),
                None => saved_node[id].zip(saved_kind[id]),
            };
            let grad_needs = l.op.grad_needs();
            let mut reads = Vec::new();
            // At operator level a max pooling reads its indices, not its input.
            let reads_inputs = grad_needs.inputs && saved_kind[id] != Some(SavedKind::PoolIndex);
            if reads_inputs {
                for t in &l.inputs {
                    if !reads.contains(t) {
                        reads.push(*t);
                    }
                }
            }
            if (grad_needs.output && saved.is_none()) || feeds_loss {
                reads.push(TensorRef::Layer(id));
            }
            let mut upstream_deps: Vec<u64> = upstream
                .iter()
                .map(|u| match *u {
                    GradSource::Loss => loss_node as u64,
                    GradSource::Layer { layer, slot } => match input_nodes[layer].get(slot) {
                        Some(Some(node)) => *node as u64,
                        _ => node_of[layer] as u64,
                    },
                })
                .collect();
            if let Some((s, _)) = saved {
                upstream_deps.push(s as u64);
            }
            if let Some(s) = pooled[id].and_then(|p| saved_node[p]) {
                upstream_deps.push(s as u64);
            }
            let bytes = if !any_input_grad {
                0
            } else if l.op.shares_input_gradient() {
                l.output_bytes()
            } else {
                l.input_types
                    .iter()
                    .zip(&input_grads)
                    .filter(|(_, &g)| g)
                    .map(|(t, _)| t.bytes())
                    .sum()
            };
            let out_elems = l.output.shape.elements() as f64;
            // A convolution followed by ReLU masks its gradient inside its kernel (chunk by
            // chunk, `Op::backward_workspace`) unless the loss adds to it.
            let masked_in_kernel = matches!(l.op, Op::Conv2d(_))
                && l.op.activation() == Activation::Relu
                && !feeds_loss;
            let fused_activation =
                matches!(l.op, Op::Conv2d(_) | Op::ConvTranspose2d(_) | Op::Dense(_))
                    && l.op.activation() != Activation::Linear
                    && !masked_in_kernel;
            // A standalone softmax that is the prediction (the loss reads probabilities) gets
            // its input gradient from the loss directly, `p - onehot`, formed as its output: no
            // temporary beside it.
            let loss_grad_is_output = feeds_loss
                && upstream.len() == 1
                && matches!(l.op, Op::Activation(_))
                && !loss.from_logits;
            // Several upstream gradients of an activation with a saved mask (not masked inside
            // a convolution's kernel) are summed and masked in one pass: the sum is no
            // temporary of its own (a standalone ReLU's gradient is then the output alone).
            let sum_masked = saved.map(|(_, k)| k) == Some(SavedKind::ActivationMask)
                && upstream.len() > 1
                && !feeds_loss
                && !masked_in_kernel;
            let upstream_temp =
                (upstream.len() > 1 && !sum_masked || fused_activation || feeds_loss)
                    && !loss_grad_is_output;
            // The summed upstream gradient of a fused pooling has the pooling's size.
            let upstream_bytes = match pooled[id] {
                Some(p) => layers[p].output_bytes(),
                None => l.output_bytes(),
            };
            // Expanding the pooled gradient: what the pooling's backward did.
            let pool_cost = pooled[id].map_or(0.0, |p| {
                let pl = &layers[p];
                pl.op
                    .backward_flops(&pl.input_types, &pl.output.shape, true)
            });
            let upstream_elems = match pooled[id] {
                Some(p) => layers[p].output.shape.elements() as f64,
                None => out_elems,
            };
            let extra = (upstream.len().saturating_sub(1)) as f64 * upstream_elems
                + if feeds_loss { 3.0 * out_elems } else { 0.0 }
                + pool_cost;
            let ws = workspace(
                if upstream_temp { upstream_bytes } else { 0 }
                    + l.op.backward_workspace(&l.input_types, &l.output.shape),
            );
            let full_cost =
                l.op.backward_flops(&l.input_types, &l.output.shape, any_input_grad);
            let mut deps: Vec<u64> = layer_deps(&reads);
            let mut cost = full_cost + extra;
            if let Some(w) = weight_node[id] {
                // Parameter gradients: everything the rule reads. Input gradients: the saved
                // state or own output only (a convolution's or dense layer's input gradient
                // does not read its input), and the rest of the work, masking again included.
                let param_cost = l.op.backward_flops(&l.input_types, &l.output.shape, false);
                cost = full_cost - param_cost
                    + out_elems * l.op.activation().backward_flops_per_element()
                    + extra;
                let mut wdeps = deps.clone();
                wdeps.extend(&upstream_deps);
                specs[w] = Some(NodeSpec {
                    alternatives: Vec::new(),
                    id: w as u64,
                    name: format!("{}_backward_weight", l.name),
                    kind: NodeKind::Backward,
                    cost: param_cost + extra,
                    bytes: 0,
                    workspace_bytes: ws,
                    deps: wdeps,
                });
                roles[w] = Some(NodeRole::WeightGrad(id));
                reads.retain(|t| *t == TensorRef::Layer(id));
                deps = layer_deps(&reads);
            }
            deps.extend(&upstream_deps);
            // The input-gradient part of a split convolution: its windows' gradients per chunk
            // fold onto the input in position order, so a whole sample at once gives the same
            // bits. (The parameter gradient sums over positions chunk by chunk: a different
            // chunk would change its rounding, so it has no second kernel.)
            let alternatives = if weight_node[id].is_some() {
                whole_sample(
                    cost,
                    ws,
                    l.op.whole_sample_extra(
                        &l.input_types,
                        &l.output.shape,
                        true,
                        masked_in_kernel,
                    ),
                )
            } else {
                Vec::new()
            };
            if split_inputs[id] {
                // One node per input gradient: the slice of each upstream gradient, summed in
                // the graph's order (the same sums as the whole gradient's, so the same bits).
                // Two slice-sized temporaries while summing several.
                for (slot, node) in input_nodes[id].iter().enumerate() {
                    let Some(node) = *node else { continue };
                    let t = &l.input_types[slot];
                    let slice_bytes = t.bytes();
                    let sums = upstream.len().saturating_sub(1);
                    specs[node] = Some(NodeSpec {
                        alternatives: Vec::new(),
                        id: node as u64,
                        name: format!("{}_backward_{slot}", l.name),
                        kind: NodeKind::Backward,
                        cost: sums as f64 * t.shape.elements() as f64,
                        bytes: slice_bytes,
                        workspace_bytes: workspace(if sums > 0 { 2 * slice_bytes } else { 0 }),
                        deps: deps.clone(),
                    });
                    roles[node] = Some(NodeRole::InputGrad(id, slot));
                }
            } else {
                specs[node_of[id]] = Some(NodeSpec {
                    alternatives,
                    id: node_of[id] as u64,
                    name: format!("{}_backward", l.name),
                    kind: NodeKind::Backward,
                    cost,
                    bytes,
                    workspace_bytes: ws,
                    deps,
                });
                roles[node_of[id]] = Some(NodeRole::Backward(id));
            }
            backward[id] = Some(BackwardNode {
                layer: id,
                node: node_of[id],
                input_grads,
                upstream,
                reads,
                saved,
                weight_node: weight_node[id],
                pooled: match fused[id] {
                    Some(p) => Some((p, forward[id], 1)),
                    None => pooled[id].and_then(|p| Some((p, saved_node[p]?, 0))),
                },
                sum_masked,
                input_nodes: input_nodes[id].clone(),
            });
        }
        let mut specs: Vec<NodeSpec> = specs.into_iter().flatten().collect();
        let roles: Vec<NodeRole> = roles.into_iter().flatten().collect();
        debug_assert_eq!(specs.len(), n_nodes);
        debug_assert_eq!(roles.len(), n_nodes);

        if let Costs::Measured(table) = &config.costs {
            table.apply(&mut specs, self.batch())?;
        }
        let trainable = self.trainable_param_count();
        let static_memory = StaticMemory {
            params: 4 * self.param_count(),
            param_grads: 4 * trainable,
            optimizer_state: 4 * trainable * config.optimizer.state_per_param(),
            input: self.input().bytes(),
            labels: loss.labels.bytes(),
        };
        let graph = Graph::new(
            self.name(),
            config.costs.unit(),
            static_memory.total(),
            specs,
        )?;
        debug_assert!(graph
            .nodes()
            .iter()
            .enumerate()
            .all(|(i, n)| n.id == i as u64));
        tracing::debug!(
            network = self.name(),
            nodes = graph.len(),
            static_bytes = static_memory.total(),
            "built training graph"
        );
        Ok(TrainingGraph {
            graph,
            granularity: config.granularity,
            forward,
            roles,
            backward,
            loss_node,
            fused_with,
            relu_in_place,
            static_memory,
        })
    }
}
