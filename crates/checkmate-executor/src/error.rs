//! The executor's error type.

use checkmate_graph::PlanError;

/// Everything that can go wrong while running a plan or training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A candle kernel failed.
    #[error("tensor operation failed in {context}: {source}")]
    Tensor {
        /// Where (layer or node name).
        context: String,
        /// candle's error.
        #[source]
        source: candle_core::Error,
    },
    /// The plan breaks the memory model (judged by the simulator before running).
    #[error("invalid plan: {0}")]
    Plan(#[from] PlanError),
    /// A layer type or hyperparameter the executor has no kernel for yet.
    #[error("layer `{layer}` ({op}): not supported by the executor: {reason}")]
    Unsupported {
        /// Layer name.
        layer: String,
        /// Operation kind.
        op: &'static str,
        /// What is missing.
        reason: String,
    },
    /// A register the step needs is empty (the plan and the executor disagree).
    #[error("step {step}: node `{node}` reads `{input}`, which holds no tensor")]
    MissingInput {
        /// Step index.
        step: usize,
        /// Node being computed.
        node: String,
        /// The empty register.
        input: String,
    },
    /// Measured live bytes differ from the simulator's prediction.
    #[error(
        "step {step} ({node}): registers hold {measured} bytes, the simulator predicts {predicted}"
    )]
    MemoryMismatch {
        /// Step index.
        step: usize,
        /// Node of that step.
        node: String,
        /// Bytes measured from the registers' storages.
        measured: u64,
        /// Bytes from `simulate(...).live_after_step`.
        predicted: u64,
    },
    /// A step took the process heap over the [`HeapLimit`](crate::HeapLimit): memory the
    /// training graph does not model (a model bug), or a limit below static memory.
    #[error(
        "step {step} ({node}): the {memory} reached {seen} bytes above the base, over the limit of \
         {limit}; the plan models {modelled} bytes at this step (static + live + workspace), so \
         {unmodelled} bytes are not in the model"
    )]
    OverHeapLimit {
        /// Step index.
        step: usize,
        /// Node of that step.
        node: String,
        /// What was measured: `process heap` or `CUDA memory pool` ([`crate::Meter::describe`]).
        memory: &'static str,
        /// The limit, bytes above the base.
        limit: u64,
        /// Heap bytes above the base measured during the step.
        seen: u64,
        /// Static memory plus the simulator's live bytes and the node's workspace at this step.
        modelled: u64,
        /// `seen - modelled` (0 when the model covers what was seen).
        unmodelled: u64,
    },
    /// The batch does not fit the network.
    #[error("bad batch: {0}")]
    Batch(String),
    /// Invalid configuration (optimizer, dataset, budget).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The device's memory could not be measured (a CUDA driver call failed).
    #[error("device memory: {0}")]
    Device(String),
    /// The models crate rejected the network.
    #[error(transparent)]
    Model(#[from] checkmate_models::Error),
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches a context to candle errors.
pub(crate) trait TensorContext<T> {
    /// Wraps a candle error with `context`.
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> TensorContext<T> for candle_core::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Tensor {
            context: context(),
            source,
        })
    }
}
