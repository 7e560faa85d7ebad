//! Layer IR, automatic training graphs and the model zoo of checkmate-rs.
//!
//! No tensor library: this crate describes networks precisely enough for the solvers (a
//! [`checkmate_graph::Graph`] with real tensor sizes and FLOP or measured costs) and for an executor
//! (every [`Layer`]'s [`Op`] with hyperparameters, input and output shapes, parameter shapes, and
//! [`TrainingGraph`]'s mapping from graph nodes back to layers).
//!
//! - [`NetworkBuilder`] builds a [`Network`] (a DAG of layers, NCHW `f32`), inferring shapes and
//!   rejecting inconsistent layers with an [`Error`] that names the layer;
//! - [`Network::training_graph`] derives the training graph: one forward node per layer, one loss
//!   node, one backward node per layer that needs a gradient (reverse topological order), each
//!   depending on exactly what its gradient rule reads (docs/MODELS.md);
//! - [`model_by_name`] / [`MODEL_NAMES`]: VGG16/19, MobileNet, ResNet50, U-Net, FCN8, SegNet, an MLP
//!   and a GPT-style transformer with Keras' parameter counts;
//! - [`CostTable`]: measured `checkmate-costs/1` costs applied by node name.
//!
//! Building a training graph from another crate:
//!
//! ```
//! use checkmate_graph::NodeKind;
//! use checkmate_models::{build_training_graph, ImageSize, ModelConfig, TrainingConfig};
//!
//! let model = ModelConfig::new(8).with_image_size(ImageSize::square(224));
//! let graph = build_training_graph("vgg16", &model, &TrainingConfig::default())?;
//! assert_eq!(graph.name(), "vgg16-b8-224");
//! assert_eq!(graph.len(), 22 + 1 + 22);
//! let first = &graph.nodes()[0];
//! assert_eq!((first.name.as_str(), first.kind, first.bytes), ("block1_conv1", NodeKind::Forward, 8 * 64 * 224 * 224 * 4));
//! // Parameters, their gradients and momentum, plus the input batch and labels.
//! assert_eq!(graph.static_bytes(), 3 * 4 * 138_357_544 + 8 * 3 * 224 * 224 * 4 + 8 * 4);
//! # Ok::<(), checkmate_models::Error>(())
//! ```
//!
//! For the executor, keep the [`Network`] and the [`TrainingGraph`]:
//!
//! ```
//! use checkmate_models::{model_by_name, ModelConfig, NodeRole, TrainingConfig};
//!
//! let net = model_by_name("resnet50", &ModelConfig::new(2))?;
//! let tg = net.training_graph(&TrainingConfig::default())?;
//! for (i, node) in tg.graph.nodes().iter().enumerate() {
//!     match tg.role(i) {
//!         NodeRole::Forward(l) => assert_eq!(node.name, net.layer(l).name),
//!         NodeRole::Loss => assert_eq!(i, tg.loss_node),
//!         NodeRole::Backward(l) => assert_eq!(tg.backward[l].as_ref().unwrap().node, i),
//!         NodeRole::Saved(..) | NodeRole::WeightGrad(_) | NodeRole::InputGrad(..) => {
//!             unreachable!("operator level only")
//!         }
//!     }
//! }
//! # Ok::<(), checkmate_models::Error>(())
//! ```

#![warn(missing_docs)]

mod costs;
mod error;
mod network;
mod op;
mod shape;
mod training;
mod zoo;

pub use costs::{AlternativeCost, CostTable, Costs, NodeCost, StepOverheads, COSTS_FORMAT};
pub use error::{Error, Result};
pub use network::{Layer, LayerId, Loss, Network, NetworkBuilder, TensorRef};
pub use op::{
    conv_chunk_bytes, conv_chunk_bytes_of, conv_chunk_rows, conv_chunk_rows_within,
    conv_masked_bytes, Activation, BatchNorm, Conv2d, ConvTranspose2d, Dense, GradNeeds, Op,
    Padding, ParamSpec, Pool2d, SelfAttention, CONV_CHUNK_BYTES, WHOLE_SAMPLE,
};
pub use shape::{DType, ImageSize, Shape, TensorType};
pub use training::{
    BackwardNode, GradSource, Granularity, NodeRole, Optimizer, SavedKind, StaticMemory,
    TrainingConfig, TrainingGraph,
};
pub use zoo::{
    fcn8, mlp, mobilenet, model_by_name, resnet50, segnet, transformer, unet, vgg16, vgg19,
    ModelConfig, MODEL_NAMES,
};

/// Builds the training graph of zoo model `name` (one of [`MODEL_NAMES`]): what
/// `checkmate graph --model` writes.
pub fn build_training_graph(
    name: &str,
    model: &ModelConfig,
    training: &TrainingConfig,
) -> Result<checkmate_graph::Graph> {
    Ok(model_by_name(name, model)?.training_graph(training)?.graph)
}
