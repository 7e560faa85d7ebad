//! The profiler's error type.

/// Everything that can go wrong while profiling, fitting or checking a plan.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The executor failed (kernel, unsupported layer, memory mismatch, bad plan).
    #[error(transparent)]
    Executor(#[from] checkmate_executor::Error),
    /// The models crate rejected the model or its configuration.
    #[error(transparent)]
    Model(#[from] checkmate_models::Error),
    /// A plan is invalid for the graph (judged by the simulator).
    #[error("invalid plan: {0}")]
    Plan(#[from] checkmate_graph::PlanError),
    /// A candle operation outside the executor failed (device setup, CUDA timing).
    #[error("tensor operation failed in {context}: {source}")]
    Tensor {
        /// What was being done.
        context: String,
        /// candle's error.
        #[source]
        source: candle_core::Error,
    },
    /// Options out of range (no repeats, a non-positive spread target, ...).
    #[error("invalid profiler options: {0}")]
    Options(String),
    /// Profiles that cannot be fitted or compared together (different models, devices or nodes,
    /// too few distinct batch sizes).
    #[error("cannot fit profiles: {0}")]
    Fit(String),
    /// A profile file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A profile file is not valid JSON of the expected shape.
    #[error("{context}: {source}")]
    Json {
        /// The file or string it came from.
        context: String,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// The CUDA driver failed (events, memory pool queries); only with the `cuda` feature.
    #[error("CUDA: {0}")]
    Cuda(String),
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
