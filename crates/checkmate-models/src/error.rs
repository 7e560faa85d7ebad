//! The one error type of `checkmate-models`.

use thiserror::Error;

/// Everything that can go wrong while building a network, its training graph or applying costs.
///
/// Variants name what a user has to fix: the layer, the model, the cost-table node.
#[derive(Debug, Error)]
pub enum Error {
    /// A layer's inputs do not fit its operation (rank, channels, sizes, kernel larger than input...).
    #[error("layer `{layer}` ({op}): {message}")]
    Shape {
        /// The layer's name.
        layer: String,
        /// The operation's kind, e.g. `conv2d`.
        op: &'static str,
        /// What is inconsistent, with the shapes involved.
        message: String,
    },
    /// A layer's hyperparameters are invalid on their own (zero kernel, zero stride, rate >= 1...).
    #[error("layer `{layer}` ({op}): invalid hyperparameter: {message}")]
    Hyperparameter {
        /// The layer's name.
        layer: String,
        /// The operation's kind.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A layer refers to a tensor that is not an output of an earlier layer of the same network.
    #[error("layer `{layer}`: input #{index} is not the network input or an earlier layer")]
    UnknownInput {
        /// The layer's name.
        layer: String,
        /// Position of the bad input.
        index: usize,
    },
    /// Two layers have the same name.
    #[error("duplicate layer name `{0}`: layer names must be unique")]
    DuplicateLayer(String),
    /// A layer's output never reaches the loss, so it has no gradient.
    #[error("layer `{0}` does not contribute to the loss; remove it")]
    Unused(String),
    /// The network has no layer, or the loss does not take a layer output.
    #[error("network `{network}`: {message}")]
    Network {
        /// The network's name.
        network: String,
        /// What is wrong.
        message: String,
    },
    /// `model_by_name` got a name outside [`crate::MODEL_NAMES`].
    #[error("unknown model `{name}`; known models: {known}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A model configuration value is out of range for that model.
    #[error("model `{model}`: {message}")]
    Config {
        /// The model's name.
        model: String,
        /// What is wrong and what would be accepted.
        message: String,
    },
    /// A measured cost table does not fit the training graph it is applied to.
    #[error("cost table {context}: {message}")]
    CostTable {
        /// Where the table came from (path or "input").
        context: String,
        /// What does not match (node name, bytes, batch, model).
        message: String,
    },
    /// A cost table file is not valid `checkmate-costs/1` JSON.
    #[error("cost table {context}: malformed JSON: {source}")]
    Json {
        /// Where the JSON came from.
        context: String,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The built graph was rejected by `checkmate-graph` (a bug in this crate if it ever happens).
    #[error(transparent)]
    Graph(#[from] checkmate_graph::Error),
}

/// `Result` with this crate's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
