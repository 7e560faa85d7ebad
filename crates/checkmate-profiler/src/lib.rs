//! Measured per-node costs of a training graph on a device.
//!
//! Checkmate's schedules are hardware-aware because node costs are measured on the device that
//! will train. This crate times every node of a model's training graph with the executor's own
//! kernels (forward kernels, the loss, and the hand-written backward rules, each on inputs of the
//! right shapes) and writes `checkmate-costs/1` tables (SPEC.md section 4):
//!
//! - [`profile_model`] / [`profile_network`] / [`profile_executor`]: run [`profiling_plan`]
//!   (checkpoint-all with eager frees) a few times untimed, then repeatedly, each compute step's
//!   time being one sample of its node, until the summed per-node medians are stable
//!   ([`ProfileOptions::target_rel_error`]). The result, a [`Profile`], has per node the median,
//!   quartiles, fastest sample and the output bytes measured from the executor's registers; it
//!   converts to a [`checkmate_models::CostTable`] and serializes to a superset of
//!   `checkmate-costs/1` that every `--costs` option reads.
//! - [`fit()`]: per-node least-squares lines `seconds = a + b * batch` over profiles at several
//!   batch sizes, with R^2 and residuals ([`FitQuality`]); [`CostFit::predict`] gives the table
//!   of a batch that was not profiled.
//! - [`check_plan`]: runs a plan and compares its measured step time with the sum of the table's
//!   costs over the plan's computes (what `checkmate train` reports as `predicted_seconds`).
//!
//! Progress goes to a callback ([`Progress`]); the crate prints nothing. On CPU, time is the host
//! clock around each plan step; with the `cuda` feature, the executor synchronizes the device
//! after each step, and CUDA events on candle's stream plus the memory pool's high-water mark
//! time and size whole steps (see docs/PROFILER.md for what is and is not measured per node).
//!
//! ```
//! use candle_core::Device;
//! use checkmate_models::{ImageSize, ModelConfig, TrainingConfig};
//! use checkmate_profiler::{profile_model, ProfileOptions};
//!
//! let mut config = ModelConfig::new(4).with_image_size(ImageSize::square(4));
//! config.width = Some(8);
//! let training = TrainingConfig::default();
//! let options = ProfileOptions::fixed(3);
//! let profile = profile_model("mlp", &config, &training, &Device::Cpu, &options, &mut |_| {})?;
//! let table = profile.cost_table();
//! // One entry per training-graph node, with the graph's exact output bytes.
//! let graph = checkmate_models::build_training_graph("mlp", &config, &training)?;
//! assert_eq!(table.nodes.len(), graph.len());
//! let mut specs = graph.to_specs();
//! table.apply(&mut specs, 4)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod check;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod fit;
mod profile;
pub mod stats;

pub use check::{check_plan, check_plans, predicted_seconds, PlanCheck};
pub use error::{Error, Result};
pub use fit::{compare_tables, fit, CostFit, FitQuality, NodeFit};
pub use profile::{
    device_label, profile_executor, profile_model, profile_network, profiling_plan,
    time_update_and_batch, Agreement, AlternativeProfile, NodeProfile, Phase, Profile, ProfileMeta,
    ProfileOptions, Progress,
};
