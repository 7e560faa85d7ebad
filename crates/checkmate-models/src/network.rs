//! Networks: a DAG of layers with inferred shapes, built by [`NetworkBuilder`], ending in a loss.

use std::collections::HashSet;

use crate::error::{Error, Result};
use crate::op::{Activation, Op, OpError, ParamSpec};
use crate::shape::{DType, Shape, TensorType};

/// Index of a layer in [`Network::layers`] (a topological order).
pub type LayerId = usize;

/// A tensor a layer reads: the network input or an earlier layer's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorRef {
    /// The input batch (images or token ids).
    Input,
    /// The output of a layer.
    Layer(LayerId),
}

/// One layer: operation, inputs and everything shape inference derived.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Unique name (Keras names for the zoo's models, e.g. `block1_conv1`).
    pub name: String,
    /// The operation and its hyperparameters.
    pub op: Op,
    /// The tensors it reads, in order.
    pub inputs: Vec<TensorRef>,
    /// Types of those tensors.
    pub input_types: Vec<TensorType>,
    /// Type of its output (always `f32`).
    pub output: TensorType,
    /// Its parameters.
    pub params: Vec<ParamSpec>,
    /// FLOPs of one forward computation.
    pub forward_flops: f64,
}

impl Layer {
    /// Bytes of the output tensor.
    pub fn output_bytes(&self) -> u64 {
        self.output.bytes()
    }

    /// Number of parameter elements, trainable or not.
    pub fn param_count(&self) -> u64 {
        self.params.iter().map(|p| p.shape.elements()).sum()
    }

    /// Number of trainable parameter elements.
    pub fn trainable_param_count(&self) -> u64 {
        self.params
            .iter()
            .filter(|p| p.trainable)
            .map(|p| p.shape.elements())
            .sum()
    }
}

/// The loss: categorical cross-entropy of a prediction against integer labels, averaged over every
/// position (pixels, tokens) and the batch.
#[derive(Debug, Clone)]
pub struct Loss {
    /// Node name in training graphs: `Loss`, as in Checkmate's graphs.
    pub name: String,
    /// The layer whose output is the prediction.
    pub input: LayerId,
    /// The class axis of the prediction (1 for `[N, C]` and `[N, C, positions]`, 2 for `[N, T, V]`).
    pub class_axis: usize,
    /// `true` when the prediction is logits (the loss applies the softmax); `false` when the
    /// predicting layer already ends in a softmax over `class_axis`.
    pub from_logits: bool,
    /// Labels: `u32` class ids, the prediction's shape without `class_axis`.
    pub labels: TensorType,
    /// The loss node's output: the per-example loss, `f32 [N]`.
    pub output: TensorType,
}

/// A forward network: input, layers in topological order, loss.
#[derive(Debug, Clone)]
pub struct Network {
    name: String,
    input: TensorType,
    layers: Vec<Layer>,
    consumers: Vec<Vec<(LayerId, usize)>>,
    loss: Loss,
}

impl Network {
    /// The network's name (the zoo uses `model-bBATCH-SIZE`, e.g. `vgg16-b256-224`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The input batch.
    pub fn input(&self) -> &TensorType {
        &self.input
    }

    /// The batch size (the input's first dimension).
    pub fn batch(&self) -> usize {
        self.input.shape.dim(0)
    }

    /// Layers in topological order.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// Layer `id`.
    pub fn layer(&self, id: LayerId) -> &Layer {
        &self.layers[id]
    }

    /// The layer with this name.
    pub fn layer_by_name(&self, name: &str) -> Option<LayerId> {
        self.layers.iter().position(|l| l.name == name)
    }

    /// Layers reading layer `id`'s output, each with the input slot it is read into.
    pub fn consumers(&self, id: LayerId) -> &[(LayerId, usize)] {
        &self.consumers[id]
    }

    /// The loss.
    pub fn loss(&self) -> &Loss {
        &self.loss
    }

    /// Parameter elements, trainable or not (Keras' "Total params").
    pub fn param_count(&self) -> u64 {
        self.layers.iter().map(Layer::param_count).sum()
    }

    /// Trainable parameter elements.
    pub fn trainable_param_count(&self) -> u64 {
        self.layers.iter().map(Layer::trainable_param_count).sum()
    }

    /// Sum of forward FLOPs of all layers.
    pub fn forward_flops(&self) -> f64 {
        self.layers.iter().map(|l| l.forward_flops).sum()
    }

    /// The type of a tensor reference.
    pub fn tensor_type(&self, t: TensorRef) -> &TensorType {
        match t {
            TensorRef::Input => &self.input,
            TensorRef::Layer(l) => &self.layers[l].output,
        }
    }
}

/// Builds a [`Network`] layer by layer, inferring shapes as it goes.
///
/// ```
/// use checkmate_models::{Conv2d, Dense, NetworkBuilder, Op, Shape};
///
/// let mut b = NetworkBuilder::new("tiny", Shape::new([8, 3, 32, 32]));
/// let x = b.layer("conv", Op::Conv2d(Conv2d::new(16, 3).same().relu()), b.input())?;
/// let x = b.layer("flatten", Op::Flatten, x)?;
/// let x = b.layer("predictions", Op::Dense(Dense::new(10).softmax()), x)?;
/// let net = b.finish(x, 1)?;
/// assert_eq!(net.layer(0).output.shape, Shape::new([8, 16, 32, 32]));
/// assert_eq!(net.param_count(), 3 * 16 * 9 + 16 + 16 * 32 * 32 * 10 + 10);
/// # Ok::<(), checkmate_models::Error>(())
/// ```
#[derive(Debug)]
pub struct NetworkBuilder {
    name: String,
    input: TensorType,
    layers: Vec<Layer>,
    names: HashSet<String>,
}

impl NetworkBuilder {
    /// Starts a network whose input is an `f32` batch of this shape (batch first).
    pub fn new(name: impl Into<String>, input: Shape) -> NetworkBuilder {
        NetworkBuilder::with_input(
            name,
            TensorType {
                shape: input,
                dtype: DType::F32,
            },
        )
    }

    /// Starts a network with an input of any type (`u32` token ids for language models).
    pub fn with_input(name: impl Into<String>, input: TensorType) -> NetworkBuilder {
        NetworkBuilder {
            name: name.into(),
            input,
            layers: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// The network input.
    pub fn input(&self) -> TensorRef {
        TensorRef::Input
    }

    /// The type of a tensor already in the network.
    pub fn tensor_type(&self, t: TensorRef) -> Option<&TensorType> {
        match t {
            TensorRef::Input => Some(&self.input),
            TensorRef::Layer(l) => self.layers.get(l).map(|l| &l.output),
        }
    }

    /// The shape of a tensor already in the network.
    pub fn shape(&self, t: TensorRef) -> Option<&Shape> {
        self.tensor_type(t).map(|t| &t.shape)
    }

    /// Adds a single-input layer.
    pub fn layer(
        &mut self,
        name: impl Into<String>,
        op: Op,
        input: TensorRef,
    ) -> Result<TensorRef> {
        self.add(name, op, &[input])
    }

    /// Adds a layer reading `inputs`; checks its shapes and returns its output.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: &[TensorRef],
    ) -> Result<TensorRef> {
        let name = name.into();
        if self.names.contains(&name) {
            return Err(Error::DuplicateLayer(name));
        }
        let mut input_types = Vec::with_capacity(inputs.len());
        for (index, &t) in inputs.iter().enumerate() {
            match self.tensor_type(t) {
                Some(ty) => input_types.push(ty.clone()),
                None => return Err(Error::UnknownInput { layer: name, index }),
            }
        }
        let shape = match op.infer(&input_types) {
            Ok(s) => s,
            Err(OpError::Shape(message)) => {
                return Err(Error::Shape {
                    layer: name,
                    op: op.kind(),
                    message,
                })
            }
            Err(OpError::Hyper(message)) => {
                return Err(Error::Hyperparameter {
                    layer: name,
                    op: op.kind(),
                    message,
                })
            }
        };
        let params = op.params(&input_types);
        let forward_flops = op.forward_flops(&input_types, &shape);
        self.names.insert(name.clone());
        self.layers.push(Layer {
            name,
            op,
            inputs: inputs.to_vec(),
            input_types,
            output: TensorType::f32(shape),
            params,
            forward_flops,
        });
        Ok(TensorRef::Layer(self.layers.len() - 1))
    }

    /// Ends the network with a cross-entropy loss on `prediction` over `class_axis`.
    ///
    /// Whether the prediction is logits or probabilities follows from its layer (a fused or
    /// standalone softmax must run over `class_axis`). Fails if a layer does not reach the loss.
    pub fn finish(self, prediction: TensorRef, class_axis: usize) -> Result<Network> {
        let net_err = |message: String| Error::Network {
            network: self.name.clone(),
            message,
        };
        let TensorRef::Layer(pred) = prediction else {
            return Err(net_err(
                "the loss must take a layer's output, not the input".into(),
            ));
        };
        let Some(layer) = self.layers.get(pred) else {
            return Err(net_err(format!("the loss reads unknown layer #{pred}")));
        };
        let shape = layer.output.shape.clone();
        if class_axis == 0 || class_axis >= shape.rank() {
            return Err(net_err(format!(
                "class axis {class_axis} of prediction `{}` {shape} must be in 1..{}",
                layer.name,
                shape.rank()
            )));
        }
        let from_logits = match layer.op.softmax_axis(shape.rank()) {
            None => true,
            Some(a) if a == class_axis => false,
            Some(a) => {
                return Err(net_err(format!(
                "prediction `{}` ends in a softmax over axis {a}, the loss uses axis {class_axis}",
                layer.name
            )))
            }
        };
        if layer.op.activation() != Activation::Softmax
            && layer.op.activation() != Activation::Linear
        {
            return Err(net_err(format!(
                "prediction `{}` ends in {}; the loss takes logits or softmax probabilities",
                layer.name,
                layer.op.activation().name()
            )));
        }
        for l in &self.layers {
            if l.name == "Loss" || self.names.contains(&format!("{}_backward", l.name)) {
                return Err(net_err(format!(
                    "layer name `{}` collides with a training-graph node name (`Loss`, `<layer>_backward`)",
                    l.name
                )));
            }
        }
        let mut label_dims = shape.dims().to_vec();
        label_dims.remove(class_axis);
        let batch = self.input.shape.dim(0);
        let mut consumers: Vec<Vec<(LayerId, usize)>> = vec![Vec::new(); self.layers.len()];
        for (id, l) in self.layers.iter().enumerate() {
            for (slot, t) in l.inputs.iter().enumerate() {
                if let TensorRef::Layer(p) = t {
                    consumers[*p].push((id, slot));
                }
            }
        }
        // Every layer must reach the prediction (reverse reachability; layers are topological).
        let mut reaches = vec![false; self.layers.len()];
        reaches[pred] = true;
        for id in (0..self.layers.len()).rev() {
            if consumers[id].iter().any(|&(c, _)| reaches[c]) {
                reaches[id] = true;
            }
            if !reaches[id] {
                return Err(Error::Unused(self.layers[id].name.clone()));
            }
        }
        let loss = Loss {
            name: "Loss".into(),
            input: pred,
            class_axis,
            from_logits,
            labels: TensorType {
                shape: Shape::new(label_dims),
                dtype: DType::U32,
            },
            output: TensorType::f32(Shape::new([batch])),
        };
        Ok(Network {
            name: self.name,
            input: self.input,
            layers: self.layers,
            consumers,
            loss,
        })
    }
}
