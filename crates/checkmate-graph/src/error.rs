//! The one error type of `checkmate-graph`.

use thiserror::Error;

/// Everything that can go wrong while reading, building or checking graphs and plans.
///
/// Every variant names what is wrong (node, field, value) and, where it helps, what would be accepted.
#[derive(Debug, Error)]
pub enum Error {
    /// The file is not valid JSON, or a field has the wrong JSON type.
    #[error("{context}: malformed JSON: {source}")]
    Json {
        /// Where the JSON came from (a path or "input").
        context: String,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// The JSON object has no recognised `format` and does not look like networkx node-link data.
    #[error("unknown graph/plan format {found:?}: expected {expected}")]
    UnknownFormat {
        /// The format string found (or a description of what was found).
        found: String,
        /// What would be accepted.
        expected: String,
    },
    /// A required field is absent.
    #[error("{location}: missing field `{field}`")]
    MissingField {
        /// Which node or object lacks it.
        location: String,
        /// The field name.
        field: String,
    },
    /// A field holds a value that is not allowed.
    #[error("{location}: field `{field}` has invalid value {value}: {expected}")]
    InvalidField {
        /// Which node or object.
        location: String,
        /// The field name.
        field: String,
        /// The value found, rendered.
        value: String,
        /// What would be accepted.
        expected: String,
    },
    /// Two nodes share an id.
    #[error("duplicate node id {id} (nodes {first:?} and {second:?}); ids must be unique")]
    DuplicateId {
        /// The repeated id.
        id: u64,
        /// Name of the first node with it.
        first: String,
        /// Name of the second node with it.
        second: String,
    },
    /// A dependency names an id that no node has.
    #[error("node {id} ({name:?}) depends on id {dep}, which is not a node of the graph")]
    DanglingDep {
        /// The node with the bad dependency.
        id: u64,
        /// Its name.
        name: String,
        /// The missing id.
        dep: u64,
    },
    /// The dependencies form a cycle.
    #[error("the graph has a cycle through nodes {}; a training graph must be acyclic", .nodes.join(" -> "))]
    Cycle {
        /// The nodes on one cycle, as `id (name)`.
        nodes: Vec<String>,
    },
    /// A plan names a node id the graph does not have.
    #[error("plan step {step}: node id {id} is not in graph {graph:?}")]
    UnknownPlanNode {
        /// Index of the step.
        step: usize,
        /// The unknown id.
        id: u64,
        /// The graph's name.
        graph: String,
    },
    /// A plan breaks the memory model's rules.
    #[error("invalid plan: {0}")]
    InvalidPlan(#[from] PlanError),
    /// A budget string could not be parsed.
    #[error("cannot parse budget {input:?}: {reason}; write bytes (6442450944), units (6GiB, 500MB) or a percentage of the checkpoint-all activation peak (50%)")]
    Budget {
        /// The text given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A schedule's matrices are inconsistent.
    #[error("invalid schedule: {0}")]
    InvalidSchedule(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Why the simulator rejected a plan; each names the step and the node.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    /// `compute v` while an input of `v` is not live.
    #[error("step {step}: compute {node} needs input {input}, which is not live (compute it first or do not free it earlier)")]
    InputNotLive {
        /// Step index.
        step: usize,
        /// The node computed, as `id (name)`.
        node: String,
        /// The missing input, as `id (name)`.
        input: String,
    },
    /// `compute v` while `v` is already live.
    #[error("step {step}: compute {node}, which is already live (free it first)")]
    AlreadyLive {
        /// Step index.
        step: usize,
        /// The node, as `id (name)`.
        node: String,
    },
    /// `free v` while `v` is not live.
    #[error("step {step}: free {node}, which is not live")]
    FreeDead {
        /// Step index.
        step: usize,
        /// The node, as `id (name)`.
        node: String,
    },
    /// A step names a position outside the graph.
    #[error("step {step}: node index {index} is out of range (the graph has {len} nodes)")]
    OutOfRange {
        /// Step index.
        step: usize,
        /// The bad index.
        index: usize,
        /// Number of nodes.
        len: usize,
    },
    /// The plan's implementation list does not match its steps.
    #[error(
        "the plan lists {entries} implementations for {steps} steps; give one per step or none"
    )]
    Implementations {
        /// Steps in the plan.
        steps: usize,
        /// Entries in its implementation list.
        entries: usize,
    },
    /// A step names an implementation its node does not have (or a free names one).
    #[error("step {step}: {node} has no implementation {implementation} (it has {count}; a free step takes none)")]
    UnknownImplementation {
        /// Step index.
        step: usize,
        /// The node, as `id (name)`.
        node: String,
        /// The implementation number given.
        implementation: usize,
        /// How many the node has.
        count: usize,
    },
    /// Some node is never computed.
    #[error(
        "node {node} is never computed; every node of the graph must be computed at least once"
    )]
    NeverComputed {
        /// The node, as `id (name)`.
        node: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
