//! Measured per-node costs of a training graph on a device.
//!
//! Work in progress (issue 6): this crate will time every node of a model's training graph with
//! the executor's own kernels and write `checkmate-costs/1` tables.

#![warn(missing_docs)]
