//! From a [`Network`] to its training graph: forward nodes, the loss, backward nodes.

use checkmate_graph::{Graph, NodeIdx, NodeKind, NodeSpec};

use crate::costs::Costs;
use crate::error::Result;
use crate::network::{LayerId, Network, TensorRef};
use crate::op::{Activation, Op};

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
}

impl Default for TrainingConfig {
    /// SGD with momentum, FLOP costs, workspace counted.
    fn default() -> TrainingConfig {
        TrainingConfig {
            optimizer: Optimizer::SgdMomentum,
            costs: Costs::Flops,
            workspace: true,
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
    /// The backward computation of a layer.
    Backward(LayerId),
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
/// Node ids equal node indices: layer `l`'s forward node is `l`, the loss is `layers.len()`, then
/// the backward nodes follow in reverse layer order.
#[derive(Debug, Clone)]
pub struct TrainingGraph {
    /// The graph (`checkmate-graph`).
    pub graph: Graph,
    /// Role of each node, by node index.
    pub roles: Vec<NodeRole>,
    /// Per layer, its backward node (`None` when the layer needs no gradient: no parameter at or
    /// before it, e.g. a padding of the input image).
    pub backward: Vec<Option<BackwardNode>>,
    /// The loss node.
    pub loss_node: NodeIdx,
    /// Static memory, whose total is `graph.static_bytes()`.
    pub static_memory: StaticMemory,
}

impl TrainingGraph {
    /// The forward node of a layer.
    pub fn forward_node(&self, layer: LayerId) -> NodeIdx {
        layer
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

    /// Builds the training graph: one forward node per layer, the loss, and one backward node per
    /// layer that needs a gradient, with the dependencies and sizes described in docs/MODELS.md.
    pub fn training_graph(&self, config: &TrainingConfig) -> Result<TrainingGraph> {
        let layers = self.layers();
        let n_layers = layers.len();
        let loss = self.loss();
        let loss_node = n_layers;
        let needs = self.needs_gradient();
        let mut specs: Vec<NodeSpec> = Vec::with_capacity(2 * n_layers + 1);
        let mut roles = Vec::with_capacity(2 * n_layers + 1);
        let workspace = |bytes: u64| if config.workspace { bytes } else { 0 };

        for (id, l) in layers.iter().enumerate() {
            let deps = l
                .inputs
                .iter()
                .filter_map(|t| match t {
                    TensorRef::Layer(p) => Some(*p as u64),
                    TensorRef::Input => None,
                })
                .collect();
            specs.push(NodeSpec {
                id: id as u64,
                name: l.name.clone(),
                kind: NodeKind::Forward,
                cost: l.forward_flops,
                bytes: l.output_bytes(),
                workspace_bytes: workspace(l.op.forward_workspace(&l.input_types, &l.output.shape)),
                deps,
            });
            roles.push(NodeRole::Forward(id));
        }

        let pred = &layers[loss.input];
        let pred_elems = pred.output.shape.elements() as f64;
        specs.push(NodeSpec {
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
            deps: vec![loss.input as u64],
        });
        roles.push(NodeRole::Loss);

        let mut backward: Vec<Option<BackwardNode>> = vec![None; n_layers];
        // Backward node ids in reverse layer order, only for layers that need a gradient.
        let mut next = loss_node + 1;
        let mut node_of = vec![usize::MAX; n_layers];
        for id in (0..n_layers).rev() {
            if needs[id] {
                node_of[id] = next;
                next += 1;
            }
        }
        for id in (0..n_layers).rev() {
            if !needs[id] {
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
            let mut upstream: Vec<GradSource> = self
                .consumers(id)
                .iter()
                .map(|&(layer, slot)| GradSource::Layer { layer, slot })
                .collect();
            if feeds_loss {
                upstream.insert(0, GradSource::Loss);
            }
            let grad_needs = l.op.grad_needs();
            let mut reads = Vec::new();
            if grad_needs.inputs {
                for t in &l.inputs {
                    if !reads.contains(t) {
                        reads.push(*t);
                    }
                }
            }
            if grad_needs.output || feeds_loss {
                reads.push(TensorRef::Layer(id));
            }
            let mut deps: Vec<u64> = reads
                .iter()
                .filter_map(|t| match t {
                    TensorRef::Layer(p) => Some(*p as u64),
                    TensorRef::Input => None,
                })
                .collect();
            for u in &upstream {
                deps.push(match u {
                    GradSource::Loss => loss_node as u64,
                    GradSource::Layer { layer, .. } => node_of[*layer] as u64,
                });
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
            let upstream_temp =
                (upstream.len() > 1 || fused_activation || feeds_loss) && !loss_grad_is_output;
            let cost =
                l.op.backward_flops(&l.input_types, &l.output.shape, any_input_grad)
                    + (upstream.len().saturating_sub(1)) as f64 * out_elems
                    + if feeds_loss { 3.0 * out_elems } else { 0.0 };
            specs.push(NodeSpec {
                id: node_of[id] as u64,
                name: format!("{}_backward", l.name),
                kind: NodeKind::Backward,
                cost,
                bytes,
                workspace_bytes: workspace(
                    if upstream_temp { l.output_bytes() } else { 0 }
                        + l.op.backward_workspace(&l.input_types, &l.output.shape),
                ),
                deps,
            });
            roles.push(NodeRole::Backward(id));
            backward[id] = Some(BackwardNode {
                layer: id,
                node: node_of[id],
                input_grads,
                upstream,
                reads,
            });
        }

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
            roles,
            backward,
            loss_node,
            static_memory,
        })
    }
}
