//! Runs rematerialization plans for real: candle tensors, hand-written gradients, measured memory.
//!
//! - [`Executor`] holds a network's parameters and runs one training step's [`Plan`] with one
//!   register per training-graph node: `compute v` runs `v`'s kernel (forward layer, loss, or
//!   backward rule) on live registers, `free v` drops the register. Parameter gradients are set
//!   exactly once per step however often a backward node is recomputed, and upstream gradients are
//!   summed in the graph's fixed order, so a plan with recomputation produces bitwise the same
//!   gradients as checkpoint-all (SPEC.md section 3).
//! - After every step the bytes the registers hold are measured from their storages (a buffer
//!   shared by two registers counted once; a register never keeps a bigger buffer alive, see
//!   [`memory::owned`]) and compared with the simulator's `live_after_step`: they must be equal.
//! - [`kernels`]: forward kernels and backward rules for every layer of the IR (dense,
//!   activations, convolution incl. grouped/depthwise/dilated and transposed, pooling, batch norm,
//!   dropout, layer norm, embeddings, self-attention, per-position cross-entropy, shape ops), each
//!   checked against finite differences in the tests. Batch-norm running statistics are updated
//!   once per step; dropout replays its mask (seed, step, layer) on recompute.
//! - [`Optimizer`] (SGD with momentum, Adam) and a [`BatchSource`] ([`SyntheticData`]: class
//!   templates plus noise, segmentation masks, tokens; [`ArrayData`]: CIFAR-10 binary batches or
//!   `.npy` arrays) make a training loop.
//!
//! Running a plan from another project:
//!
//! ```
//! use candle_core::{DType, Device};
//! use checkmate_executor::{Executor, Optimizer, OptimizerKind, SyntheticData};
//! use checkmate_graph::{Plan, Step};
//! use checkmate_models::{ModelConfig, TrainingConfig};
//!
//! let mut config = ModelConfig::new(4).with_classes(3);
//! config.width = Some(8);
//! config.image_size = Some(checkmate_models::ImageSize::square(4));
//! let net = checkmate_models::mlp(&config)?;
//! let mut exec = Executor::new(net, &TrainingConfig::default(), &Device::Cpu, DType::F32, 0)?;
//! // The no-rematerialization plan: compute every node in order, free nothing.
//! let plan = Plan::new((0..exec.graph().len()).map(Step::Compute).collect());
//! let data = SyntheticData::new(&exec, 0.1, 7)?;
//! let mut opt = Optimizer::new(OptimizerKind::sgd(0.05))?;
//! let report = exec.run_plan(&plan, &data.batch(&exec, 0)?)?;
//! opt.step(&mut exec)?;
//! assert!(report.loss.is_finite());
//! assert_eq!(report.measured_live, report.predicted_live);
//! # Ok::<(), checkmate_executor::Error>(())
//! ```

#![warn(missing_docs)]

pub mod conv_cpu;
pub mod data;
pub mod dataset;
pub mod direct_cpu;
mod error;
mod executor;
pub mod heap;
pub mod kernels;
pub mod memory;
pub mod meter;
pub mod optim;
pub mod saved_cpu;

pub use checkmate_graph::Plan;
pub use data::SyntheticData;
pub use dataset::{ArrayData, BatchSource, Dataset, Npy};
pub use error::{Error, Result};
pub use executor::{Batch, Executor, HeapLimit, StepReport};
pub use meter::Meter;
pub use optim::{Optimizer, OptimizerKind};

/// Runs `steps` training steps of `plan` on batches `0..steps` of `data`, updating the parameters
/// with `optimizer` after each; returns each step's report.
pub fn train(
    exec: &mut Executor,
    plan: &Plan,
    data: &dyn BatchSource,
    optimizer: &mut Optimizer,
    steps: u64,
) -> Result<Vec<StepReport>> {
    let mut reports = Vec::with_capacity(steps as usize);
    for k in 0..steps {
        let batch = data.batch(exec, k)?;
        let report = exec.run_plan(plan, &batch)?;
        optimizer.step(exec)?;
        tracing::info!(step = k, loss = report.loss, "trained");
        reports.push(report);
    }
    Ok(reports)
}

/// A 64-bit FNV-1a hash of every parameter's bytes (layer order, then parameter order), to compare
/// the weights of two runs: equal training gives equal checksums.
pub fn params_checksum(exec: &Executor) -> Result<u64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in exec.params().iter().flatten() {
        let bytes: Vec<u8> = match t.dtype() {
            candle_core::DType::F64 => t
                .flatten_all()
                .and_then(|t| t.to_vec1::<f64>())
                .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            _ => t
                .flatten_all()
                .and_then(|t| t.to_dtype(candle_core::DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        }
        .map_err(|source| Error::Tensor {
            context: "params checksum".into(),
            source,
        })?;
        for b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(h)
}
