//! Training graphs, rematerialization plans and the memory simulator of checkmate-rs.
//!
//! This crate knows nothing about solvers, tensors or devices. It defines:
//! - [`Graph`]: a validated training DAG in topological order, read from `checkmate-graph/1` or
//!   networkx node-link JSON ([`Graph::read`]);
//! - [`Plan`]: a sequence of [`Step`]s (compute / free) and its file form [`PlanFile`];
//! - [`simulate`]: the single judge of a plan's validity, peak activation bytes and cost;
//! - [`Schedule`]: the paper's `(R, S)` form, with Algorithm 1 ([`Schedule::to_plan`]) and
//!   Algorithm 2 ([`Schedule::cheapest_given_keeps`]);
//! - [`Budget`]: budgets as users write them (`6GiB`, `50%`);
//! - [`generate`]: random graphs of our own (random layered DAGs) for tests and benchmarks.
//!
//! ```
//! use checkmate_graph::{simulate, Graph, NodeKind, NodeSpec, Plan, Step};
//!
//! // A three-node chain: forward, loss, backward.
//! let spec = |id, kind, bytes, deps: &[u64]| NodeSpec {
//!     id, name: format!("n{id}"), kind, cost: 1.0, bytes, workspace_bytes: 0, deps: deps.to_vec(),
//!     alternatives: Vec::new(),
//! };
//! let g = Graph::new("tiny", "flops", 0, vec![
//!     spec(0, NodeKind::Forward, 100, &[]),
//!     spec(1, NodeKind::Loss, 4, &[0]),
//!     spec(2, NodeKind::Backward, 100, &[0, 1]),
//! ])?;
//! let plan = Plan::new(vec![
//!     Step::Compute(0), Step::Compute(1), Step::Compute(2), Step::Free(0), Step::Free(1),
//! ]);
//! let sim = simulate(&g, &plan)?;
//! assert_eq!(sim.peak_bytes, 204);
//! assert_eq!(sim.cost, 3.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod budget;
mod error;
pub mod generate;
mod graph;
mod io;
mod plan;
mod schedule;
mod simulate;

pub use fixedbitset::FixedBitSet;

pub use budget::{byte_unit, format_bytes, Budget};
pub use error::{Error, PlanError, Result};
pub use graph::{Graph, Implementation, Node, NodeIdx, NodeKind, NodeSpec, DEFAULT_IMPLEMENTATION};
pub use io::GRAPH_FORMAT;
pub use plan::{Plan, PlanFile, Prediction, Step, PLAN_FORMAT};
pub use schedule::{stage_computes, Schedule};
pub use simulate::{choose_implementations, simulate, Simulation};
