//! The plan interpreter: one register per training-graph node, measured memory after every step.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use checkmate_graph::{simulate, Graph, Plan, Step};
use checkmate_models::{
    Activation, BackwardNode, GradSource, Network, NodeRole, Op, SavedKind, TensorRef,
    TrainingConfig, TrainingGraph,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::conv_cpu::ReluMask;
use crate::error::{Error, Result, TensorContext};
use crate::kernels as k;
use crate::memory::{owned, storage_of};
use crate::meter::Meter;

/// One training batch: the input and the `u32` labels, on the executor's device.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The network input (`[N, ...]`, the executor's dtype).
    pub input: Tensor,
    /// Class ids, `u32`, the loss's label shape.
    pub labels: Tensor,
}

/// What running one plan measured.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Mean loss over the batch.
    pub loss: f64,
    /// Bytes the registers held after every step, measured from their storages.
    pub measured_live: Vec<u64>,
    /// The simulator's live bytes after every step (`simulate(..).live_after_step`).
    pub predicted_live: Vec<u64>,
    /// Maximum of `measured_live`.
    pub measured_peak: u64,
    /// The simulator's peak (includes per-node workspace when the graph has it).
    pub predicted_peak: u64,
    /// Compute steps run.
    pub computes: usize,
    /// Heap bytes in use at the high-water mark of every plan step, above the heap in use when
    /// the plan started (it already held the parameters, gradients, optimizer state and batch);
    /// empty unless the device's memory is measured ([`Meter`]: on the CPU the process heap, when
    /// [`crate::heap::Counting`] is the global allocator; on CUDA the device's memory pool).
    pub heap_during_step: Vec<u64>,
    /// The heap (or CUDA pool) in use when the plan started, bytes (0 when unmeasured).
    pub heap_at_start: u64,
    /// What the model says the heap holds at the high-water mark of every plan step: static
    /// memory + the simulator's live bytes + the node's workspace (for a free, the live bytes
    /// before it: its high-water mark is the heap before it frees). Empty when the device's
    /// memory is not measured.
    pub heap_modelled: Vec<u64>,
    /// Wall-clock seconds of every plan step (the kernel of a `compute`, ~0 for a `free`); on an
    /// asynchronous device the device is synchronized after each step first.
    pub step_seconds: Vec<f64>,
}

/// A hard cap on the process heap (on CUDA: the device's memory pool) during a plan (on the CPU it
/// needs [`crate::heap::Counting`] as the global allocator): [`Executor::run_plan`] fails with
/// [`Error::OverHeapLimit`] at the first step whose high-water mark, above `base`, exceeds
/// `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapLimit {
    /// Heap bytes that do not count (in use before the executor was built: the program itself).
    pub base: u64,
    /// The budget above `base`: static memory, activations and workspace together.
    pub limit: u64,
}

/// Runs plans of a network's training graph on candle tensors.
///
/// Holds the parameters and their gradients (static memory); activations live only in the
/// registers of [`Executor::run_plan`], one per graph node. [`Executor::try_clone`] copies it.
#[derive(Debug)]
pub struct Executor {
    net: Network,
    tg: TrainingGraph,
    device: Device,
    dtype: DType,
    params: Vec<Vec<Tensor>>,
    grads: Vec<Vec<Option<Tensor>>>,
    check_memory: bool,
    heap_limit: Option<HeapLimit>,
    meter: Meter,
    seed: u64,
    steps_run: u64,
}

impl Executor {
    /// A copy that trains independently from here: the parameters and gradients are copied into
    /// fresh storages (the optimizer updates them in place).
    pub fn try_clone(&self) -> Result<Executor> {
        // Fresh storages, so that an in-place update of one copy leaves the other unchanged.
        let copy = |t: &Tensor| t.copy().ctx(|| "copying the executor's tensors".into());
        Ok(Executor {
            net: self.net.clone(),
            tg: self.tg.clone(),
            device: self.device.clone(),
            dtype: self.dtype,
            params: self
                .params
                .iter()
                .map(|ps| ps.iter().map(copy).collect::<Result<Vec<_>>>())
                .collect::<Result<Vec<_>>>()?,
            grads: self
                .grads
                .iter()
                .map(|gs| {
                    gs.iter()
                        .map(|g| g.as_ref().map(copy).transpose())
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?,
            check_memory: self.check_memory,
            heap_limit: self.heap_limit,
            meter: self.meter.clone(),
            seed: self.seed,
            steps_run: self.steps_run,
        })
    }
}

impl Executor {
    /// An executor for `net` with parameters initialized from `seed` (He-uniform kernels, zero
    /// biases), in `dtype` (`F32` to train, `F64` for gradient checks) on `device`.
    pub fn new(
        net: Network,
        config: &TrainingConfig,
        device: &Device,
        dtype: DType,
        seed: u64,
    ) -> Result<Executor> {
        let tg = net.training_graph(config)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = Vec::with_capacity(net.layers().len());
        let mut grads = Vec::with_capacity(net.layers().len());
        for layer in net.layers() {
            let mut ps = Vec::new();
            let mut gs = Vec::new();
            for spec in &layer.params {
                let dims = spec.shape.dims().to_vec();
                let count = spec.shape.elements() as usize;
                let t = match spec.name {
                    "kernel" | "weight" | "qkv_kernel" | "out_kernel" => {
                        let fan_in = (count / dims[0].max(1)).max(1) as f64;
                        let a = (6.0 / fan_in).sqrt();
                        // Uniform in [-a, a) from the seeded stream, converted in bulk.
                        let mut bits = vec![0u32; count];
                        rng.fill(&mut bits[..]);
                        Tensor::from_vec(bits, dims, device)
                            .and_then(|t| t.to_dtype(dtype))
                            .and_then(|t| t.affine(2.0 * a / 4_294_967_296.0, -a))
                    }
                    "gamma" | "running_var" => Tensor::ones(dims, dtype, device),
                    _ => Tensor::zeros(dims, dtype, device),
                }
                .ctx(|| format!("initializing {}.{}", layer.name, spec.name))?;
                // Gradients are static memory (SPEC.md section 2): allocated here, held for the
                // executor's life, replaced by each step's backward node (`Executor::backward`).
                gs.push(if spec.trainable {
                    Some(
                        Tensor::zeros(spec.shape.dims(), dtype, device)
                            .ctx(|| format!("gradient of {}.{}", layer.name, spec.name))?,
                    )
                } else {
                    None
                });
                ps.push(t);
            }
            params.push(ps);
            grads.push(gs);
        }
        tracing::debug!(
            network = net.name(),
            nodes = tg.graph.len(),
            "executor ready"
        );
        Ok(Executor {
            net,
            tg,
            device: device.clone(),
            dtype,
            params,
            grads,
            check_memory: true,
            heap_limit: None,
            meter: Meter::for_device(device)?,
            seed,
            steps_run: 0,
        })
    }

    /// Whether [`Executor::run_plan`] fails as soon as measured live bytes differ from the
    /// simulator's (default `true`); when off, both series are still reported.
    pub fn set_check_memory(&mut self, on: bool) {
        self.check_memory = on;
    }

    /// Sets or clears the hard cap on the device's memory (the process heap on the CPU, the
    /// memory pool on CUDA) during [`Executor::run_plan`]; fails when that memory is not measured
    /// (on the CPU: the counting allocator is not installed).
    pub fn set_heap_limit(&mut self, limit: Option<HeapLimit>) -> Result<()> {
        if limit.is_some() && !self.meter.measures() {
            return Err(Error::Config(if self.device.is_cpu() {
                "a heap limit needs checkmate_executor::heap::Counting as the global allocator"
                    .into()
            } else {
                "a memory limit on this device needs a CUDA context that allocates from a \
                 memory pool (cuMemAllocAsync)"
                    .into()
            }));
        }
        self.heap_limit = limit;
        Ok(())
    }

    /// What measures this executor's device memory ([`Meter`]): the process heap on the CPU,
    /// the default memory pool on CUDA.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Training steps run so far (successful [`Executor::run_plan`] calls): with the seed, it picks
    /// the dropout masks of the next step.
    pub fn steps_run(&self) -> u64 {
        self.steps_run
    }

    /// The training graph plans refer to.
    pub fn graph(&self) -> &Graph {
        &self.tg.graph
    }

    /// The training graph with its mapping to layers.
    pub fn training_graph(&self) -> &TrainingGraph {
        &self.tg
    }

    /// The network.
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// The device tensors live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The float dtype of parameters and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Parameters per layer, in `Layer::params` order.
    pub fn params(&self) -> &[Vec<Tensor>] {
        &self.params
    }

    /// Mutable parameters (for optimizers and tests).
    pub fn params_mut(&mut self) -> &mut [Vec<Tensor>] {
        &mut self.params
    }

    /// Gradients of the last [`Executor::run_plan`] per layer and parameter (zeros before the
    /// first; `None` for non-trainable parameters). They are static memory: held between steps,
    /// each replaced by its layer's backward node.
    pub fn grads(&self) -> &[Vec<Option<Tensor>>] {
        &self.grads
    }

    /// Bytes of every parameter, measured (static memory's parameter part).
    pub fn param_bytes(&self) -> u64 {
        self.params
            .iter()
            .flatten()
            .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
            .sum()
    }

    /// A deterministic batch of standard-normal inputs and labels `i % classes`, for tests.
    pub fn random_batch(&self, seed: u64) -> Result<Batch> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let shape = self.net.input().shape.dims().to_vec();
        let count: usize = shape.iter().product();
        let input = if let Some(vocab) = self.input_vocab() {
            let ids: Vec<u32> = (0..count).map(|_| rng.gen_range(0..vocab as u32)).collect();
            Tensor::from_vec(ids, shape, &self.device)
        } else {
            let v: Vec<f64> = (0..count)
                .map(|_| {
                    let u: f64 = rng.gen_range(-1.0..1.0);
                    let w: f64 = rng.gen_range(-1.0..1.0);
                    u + w
                })
                .collect();
            Tensor::from_vec(v, shape, &self.device).and_then(|t| t.to_dtype(self.dtype))
        };
        let classes = self.classes()?;
        let label_dims = self.net.loss().labels.shape.dims().to_vec();
        let labels: Vec<u32> = (0..label_dims.iter().product::<usize>())
            .map(|i| (i % classes) as u32)
            .collect();
        Ok(Batch {
            input: input.ctx(|| "random batch".into())?,
            labels: Tensor::from_vec(labels, label_dims, &self.device)
                .ctx(|| "random labels".into())?,
        })
    }

    /// The vocabulary of the embedding reading the input, when the input is `u32` token ids.
    pub fn input_vocab(&self) -> Option<usize> {
        if self.net.input().dtype != checkmate_models::DType::U32 {
            return None;
        }
        self.net.layers().iter().find_map(|l| match l.op {
            Op::Embedding { vocab, .. } if l.inputs.contains(&TensorRef::Input) => Some(vocab),
            _ => None,
        })
    }

    /// The candle dtype of the network input: `U32` for token ids, else the executor's dtype.
    pub fn input_dtype(&self) -> DType {
        if self.net.input().dtype == checkmate_models::DType::U32 {
            DType::U32
        } else {
            self.dtype
        }
    }

    /// Number of classes of the loss.
    pub fn classes(&self) -> Result<usize> {
        let loss = self.net.loss();
        Ok(self.net.layer(loss.input).output.shape.dim(loss.class_axis))
    }

    /// Checks a batch against the network's input and label shapes.
    pub fn check_batch(&self, batch: &Batch) -> Result<()> {
        let want = self.net.input().shape.dims();
        if batch.input.dims() != want || batch.input.dtype() != self.input_dtype() {
            return Err(Error::Batch(format!(
                "input is {:?} {:?}, the network takes {want:?} {:?}",
                batch.input.dims(),
                batch.input.dtype(),
                self.input_dtype()
            )));
        }
        let want = self.net.loss().labels.shape.dims();
        if batch.labels.dims() != want || batch.labels.dtype() != DType::U32 {
            return Err(Error::Batch(format!(
                "labels are {:?} {:?}, the loss takes u32 {want:?}",
                batch.labels.dims(),
                batch.labels.dtype()
            )));
        }
        Ok(())
    }

    /// Runs one training step's plan: forward, loss and backward nodes as the plan orders them.
    ///
    /// The plan is first judged by the simulator. Afterwards [`Executor::grads`] holds every
    /// trainable parameter's gradient, set exactly once however often its backward node ran.
    /// After every step the bytes held by the registers are measured (each storage once) and,
    /// unless disabled with [`Executor::set_check_memory`], must equal the simulator's.
    pub fn run_plan(&mut self, plan: &Plan, batch: &Batch) -> Result<StepReport> {
        self.check_batch(batch)?;
        let sim = simulate(&self.tg.graph, plan)?;
        // The kernels the plan names (docs/IMPLEMENTATIONS.md): a convolution's chunk bound.
        let mut conv_chunks = Vec::with_capacity(plan.steps.len());
        for (k, s) in plan.steps.iter().enumerate() {
            let (Step::Compute(v) | Step::Free(v)) = *s;
            let node = self.tg.graph.node(v);
            let name = node.implementation_name(plan.implementation(k));
            conv_chunks.push(checkmate_models::conv_chunk_bytes_of(name).ok_or_else(|| {
                Error::Unsupported {
                    layer: node.name.clone(),
                    op: "implementation",
                    reason: format!("step {k} names implementation {name:?}, which has no kernel"),
                }
            })?);
        }
        let n = self.tg.graph.len();
        let mut regs: Vec<Option<Vec<Tensor>>> = vec![None; n];
        let mut grads_done = vec![false; self.net.layers().len()];
        // Batch-norm running statistics of this step, from the first compute of each layer.
        let mut running: Vec<Option<(Tensor, Tensor)>> = vec![None; self.net.layers().len()];
        // Storages the registers hold: key -> (registers holding it, bytes).
        let mut held: HashMap<usize, (usize, u64)> = HashMap::new();
        let mut static_keys = HashSet::new();
        for t in self
            .params
            .iter()
            .flatten()
            .chain([&batch.input, &batch.labels])
        {
            static_keys.insert(storage_of(t).ctx(|| "static storage".into())?.0);
        }
        let mut live: u64 = 0;
        let mut measured_live = Vec::with_capacity(plan.steps.len());
        let mut step_seconds = Vec::with_capacity(plan.steps.len());
        let mut loss = f64::NAN;
        let sync = !self.device.is_cpu();
        let meter = self.meter.clone();
        let counting = meter.measures();
        let outer_peak = meter.peak()?;
        let heap_at_start = meter.current()?;
        let mut heap_during_step = Vec::new();
        let mut heap_modelled = Vec::new();
        let mut heap_high = 0;
        let static_bytes = self.tg.graph.static_bytes();
        for (step, &s) in plan.steps.iter().enumerate() {
            if counting {
                meter.reset_peak()?;
            }
            let started = Instant::now();
            match s {
                Step::Compute(v) => {
                    let outs = self.compute(
                        v,
                        step,
                        conv_chunks[step],
                        &regs,
                        batch,
                        &mut grads_done,
                        &mut running,
                    )?;
                    let mut taken: HashSet<usize> = static_keys.clone();
                    taken.extend(held.keys().copied());
                    let mut kept = Vec::with_capacity(outs.len());
                    for t in outs {
                        let t = owned(t, &taken).ctx(|| self.tg.graph.label(v))?;
                        let (key, bytes) = storage_of(&t).ctx(|| self.tg.graph.label(v))?;
                        taken.insert(key);
                        let e = held.entry(key).or_insert((0, bytes));
                        if e.0 == 0 {
                            live += bytes;
                        }
                        e.0 += 1;
                        kept.push(t);
                    }
                    if self.tg.role(v) == NodeRole::Loss {
                        loss = kept[0]
                            .mean_all()
                            .and_then(|m| m.to_dtype(DType::F64))
                            .and_then(|m| m.to_scalar::<f64>())
                            .ctx(|| "loss".into())?;
                    }
                    regs[v] = Some(kept);
                }
                Step::Free(v) => {
                    for t in regs[v].take().unwrap_or_default() {
                        let (key, bytes) = storage_of(&t).ctx(|| self.tg.graph.label(v))?;
                        if let Some(e) = held.get_mut(&key) {
                            e.0 -= 1;
                            if e.0 == 0 {
                                held.remove(&key);
                                live -= bytes;
                            }
                        }
                    }
                }
            }
            if sync {
                self.device
                    .synchronize()
                    .ctx(|| "synchronizing the device".into())?;
            }
            step_seconds.push(started.elapsed().as_secs_f64());
            if counting {
                let high = meter.peak()?;
                heap_high = heap_high.max(high);
                heap_during_step.push(high.saturating_sub(heap_at_start));
                let (v, ws, live_then) = match s {
                    Step::Compute(v) => (
                        v,
                        self.tg
                            .graph
                            .node(v)
                            .workspace_with(plan.implementation(step)),
                        sim.live_after_step[step],
                    ),
                    Step::Free(v) => (v, 0, sim.live_after_step[step.saturating_sub(1)]),
                };
                let modelled = static_bytes + live_then + ws;
                heap_modelled.push(modelled);
                if let Some(cap) = self.heap_limit {
                    let seen = high.saturating_sub(cap.base);
                    if seen > cap.limit {
                        meter.raise_peak(outer_peak.max(heap_high));
                        return Err(Error::OverHeapLimit {
                            step,
                            node: self.tg.graph.label(v),
                            memory: meter.describe(),
                            limit: cap.limit,
                            seen,
                            modelled,
                            unmodelled: seen.saturating_sub(modelled),
                        });
                    }
                }
            }
            let predicted = sim.live_after_step[step];
            if self.check_memory && live != predicted {
                let (Step::Compute(v) | Step::Free(v)) = s;
                return Err(Error::MemoryMismatch {
                    step,
                    node: self.tg.graph.label(v),
                    measured: live,
                    predicted,
                });
            }
            measured_live.push(live);
        }
        if counting {
            meter.raise_peak(outer_peak.max(heap_high));
        }
        // Side effects once per step: running statistics, then the step counter (dropout seeds).
        for (l, stats) in running.into_iter().enumerate() {
            if let Some((mean, var)) = stats {
                self.params[l][2] = mean;
                self.params[l][3] = var;
            }
        }
        self.steps_run += 1;
        let measured_peak = measured_live.iter().copied().max().unwrap_or(0);
        tracing::debug!(
            loss,
            measured_peak,
            predicted_peak = sim.peak_bytes,
            "plan ran"
        );
        Ok(StepReport {
            loss,
            measured_live,
            predicted_live: sim.live_after_step,
            measured_peak,
            predicted_peak: sim.peak_bytes,
            computes: sim.computes,
            heap_during_step,
            heap_at_start,
            heap_modelled,
            step_seconds,
        })
    }

    fn reg<'a>(
        &self,
        regs: &'a [Option<Vec<Tensor>>],
        node: usize,
        index: usize,
        step: usize,
        reader: usize,
    ) -> Result<&'a Tensor> {
        regs[node]
            .as_ref()
            .and_then(|r| r.get(index))
            .ok_or_else(|| Error::MissingInput {
                step,
                node: self.tg.graph.label(reader),
                input: self.tg.graph.label(node),
            })
    }

    fn tensor<'a>(
        &self,
        t: TensorRef,
        regs: &'a [Option<Vec<Tensor>>],
        batch: &'a Batch,
        step: usize,
        reader: usize,
    ) -> Result<&'a Tensor> {
        match t {
            TensorRef::Input => Ok(&batch.input),
            TensorRef::Layer(l) => self.reg(regs, self.tg.forward_node(l), 0, step, reader),
        }
    }

    fn unsupported(&self, layer: usize, reason: impl Into<String>) -> Error {
        let l = self.net.layer(layer);
        Error::Unsupported {
            layer: l.name.clone(),
            op: l.op.kind(),
            reason: reason.into(),
        }
    }

    /// Runs node `v` at plan step `step`; `conv_chunk` is the chunk bound of a convolution's CPU
    /// kernel, its implementation's (`checkmate_models::conv_chunk_bytes_of`).
    #[allow(clippy::too_many_arguments)]
    fn compute(
        &mut self,
        v: usize,
        step: usize,
        conv_chunk: usize,
        regs: &[Option<Vec<Tensor>>],
        batch: &Batch,
        grads_done: &mut [bool],
        running: &mut [Option<(Tensor, Tensor)>],
    ) -> Result<Vec<Tensor>> {
        let label = || self.tg.graph.label(v);
        match self.tg.role(v) {
            NodeRole::Forward(l) if self.tg.fused_with[l].is_some() => {
                self.fused_forward(l, v, step, conv_chunk, regs, batch)
            }
            NodeRole::Forward(l) => {
                let layer = self.net.layer(l);
                let mut xs = Vec::with_capacity(layer.inputs.len());
                for &t in &layer.inputs {
                    xs.push(self.tensor(t, regs, batch, step, v)?);
                }
                let (y, stats) = self.forward(l, &xs, conv_chunk)?;
                // Operator level: the ReLU after this layer, over its output (one tensor).
                if let Some(r) = self.tg.relu_in_place[l] {
                    k::activation_in_place(&y, self.net.layer(r).op.activation()).ctx(label)?;
                }
                if running[l].is_none() {
                    running[l] = stats;
                }
                Ok(vec![y])
            }
            NodeRole::Loss => {
                let loss = self.net.loss();
                let pred = self.reg(regs, self.tg.forward_node(loss.input), 0, step, v)?;
                let out =
                    k::cross_entropy_nd(pred, &batch.labels, loss.class_axis, loss.from_logits)
                        .ctx(label)?;
                Ok(vec![out])
            }
            NodeRole::Backward(l) => {
                let part = match self.tg.backward[l].as_ref().and_then(|b| b.weight_node) {
                    Some(_) => Part::Inputs,
                    None => Part::Whole,
                };
                self.backward(l, v, part, step, conv_chunk, regs, batch, grads_done)
            }
            NodeRole::InputGrad(l, slot) => {
                Ok(vec![self.concat_input_grad(l, slot, v, step, regs)?])
            }
            NodeRole::WeightGrad(l) => self.backward(
                l,
                v,
                Part::Params,
                step,
                conv_chunk,
                regs,
                batch,
                grads_done,
            ),
            NodeRole::Saved(l, kind) => {
                let layer = self.net.layer(l);
                let out = match (kind, &layer.op) {
                    (SavedKind::ActivationMask, op) => {
                        let y = self.reg(regs, self.tg.forward_node(l), 0, step, v)?;
                        crate::saved_cpu::activation_mask(y, op.activation()).ctx(label)?
                    }
                    (SavedKind::PoolIndex, Op::MaxPool2d(p)) => {
                        let x = self.tensor(layer.inputs[0], regs, batch, step, v)?;
                        k::max_pool2d_indices(x, p).ctx(label)?
                    }
                    (SavedKind::PoolIndex, _) => {
                        return Err(
                            self.unsupported(l, "pooling indices of a layer that does not pool")
                        )
                    }
                };
                Ok(vec![out])
            }
        }
    }

    /// Operator level, a convolution fused with its max pooling
    /// (`TrainingGraph::fused_with`): the convolution's node outputs its mask and the winners,
    /// the pooling's node the pooled output, recomputing the convolution at the winners.
    fn fused_forward(
        &self,
        l: usize,
        v: usize,
        step: usize,
        conv_chunk: usize,
        regs: &[Option<Vec<Tensor>>],
        batch: &Batch,
    ) -> Result<Vec<Tensor>> {
        let label = || self.tg.graph.label(v);
        let Some(other) = self.tg.fused_with[l] else {
            return Err(self.unsupported(l, "not fused with a pooling"));
        };
        let (c, p, is_conv) = match &self.net.layer(l).op {
            Op::Conv2d(_) => (l, other, true),
            _ => (other, l, false),
        };
        let (Op::Conv2d(conv), Op::MaxPool2d(pool)) =
            (&self.net.layer(c).op, &self.net.layer(p).op)
        else {
            return Err(self.unsupported(l, "fused pair is not a convolution and a max pooling"));
        };
        let x = self.tensor(self.net.layer(c).inputs[0], regs, batch, step, v)?;
        let ps = &self.params[c];
        if is_conv {
            let (mask, winners) =
                k::conv2d_pool_winners(x, &ps[0], ps.get(1), conv, pool, conv_chunk).ctx(label)?;
            Ok(vec![mask, winners])
        } else {
            let winners = self.reg(regs, self.tg.forward_node(c), 1, step, v)?;
            let y =
                k::conv2d_pool_at_winners(x, &ps[0], ps.get(1), conv, pool, winners).ctx(label)?;
            Ok(vec![y])
        }
    }

    /// The contributions to the gradient of `bn`'s layer output, in the graph's order, and
    /// whether the loss adds one.
    fn upstream(
        &self,
        bn: &BackwardNode,
        regs: &[Option<Vec<Tensor>>],
        step: usize,
        v: usize,
    ) -> Result<(Vec<Tensor>, bool)> {
        let mut parts = Vec::new();
        let mut from_loss = false;
        for u in &bn.upstream {
            match *u {
                GradSource::Loss => from_loss = true,
                GradSource::Layer { layer: c, slot } => {
                    let cb = self.tg.backward[c]
                        .as_ref()
                        .ok_or_else(|| self.unsupported(c, "consumer without backward node"))?;
                    let shared = self.net.layer(c).op.shares_input_gradient();
                    let (node, index) = cb.input_grad(slot, shared);
                    parts.push(self.reg(regs, node, index, step, v)?.clone());
                }
            }
        }
        Ok((parts, from_loss))
    }

    /// Operator level: the gradient of input `slot` of concatenation `l` alone, the slice of
    /// each upstream contribution summed in order (elementwise the same sums as the whole
    /// gradient's, so the same bits; at most two slice-sized temporaries).
    fn concat_input_grad(
        &self,
        l: usize,
        slot: usize,
        v: usize,
        step: usize,
        regs: &[Option<Vec<Tensor>>],
    ) -> Result<Tensor> {
        let layer = self.net.layer(l);
        let Op::Concat { axis } = layer.op else {
            return Err(self.unsupported(
                l,
                "an input-gradient node of a layer that does not concatenate",
            ));
        };
        let Some(bn) = self.tg.backward[l].as_ref() else {
            return Err(
                self.unsupported(l, "role says backward but the layer has no backward node")
            );
        };
        let label = || self.tg.graph.label(v);
        let start: usize = layer.input_types[..slot]
            .iter()
            .map(|t| t.shape.dim(axis))
            .sum();
        let len = layer.input_types[slot].shape.dim(axis);
        let (parts, from_loss) = self.upstream(bn, regs, step, v)?;
        if from_loss {
            return Err(self.unsupported(l, "a split concatenation the loss reads"));
        }
        let mut acc: Option<Tensor> = None;
        for g in &parts {
            let s = g
                .narrow(axis, start, len)
                .and_then(|t| t.force_contiguous())
                .ctx(label)?;
            acc = Some(match acc {
                None => s,
                Some(a) => a.add(&s).ctx(label)?,
            });
        }
        acc.ok_or_else(|| self.unsupported(l, "backward node without upstream gradient"))
    }

    /// Layer `l`'s output, and for batch norm the running statistics after this step.
    fn forward(
        &self,
        l: usize,
        xs: &[&Tensor],
        conv_chunk: usize,
    ) -> Result<(Tensor, Option<(Tensor, Tensor)>)> {
        let layer = self.net.layer(l);
        let ps = &self.params[l];
        let ctx = || layer.name.clone();
        let x = xs[0];
        let rank = layer.output.shape.rank();
        let y = match &layer.op {
            Op::BatchNorm(b) => {
                let (y, mean, var) =
                    k::batch_norm_forward(x, &ps[0], &ps[1], b.epsilon).ctx(ctx)?;
                let count = x.elem_count() / x.dim(1).ctx(ctx)?.max(1);
                let stats = k::batch_norm_running(&ps[2], &ps[3], &mean, &var, b.momentum, count)
                    .ctx(ctx)?;
                return Ok((y, Some(stats)));
            }
            Op::ConvTranspose2d(c) if c.stride[0] != c.stride[1] => {
                return Err(self.unsupported(l, "non-square transposed-convolution strides"));
            }
            Op::ConvTranspose2d(c) => {
                k::conv_transpose2d_forward_act(x, &ps[0], ps.get(1), c, c.activation).ctx(ctx)?
            }
            Op::LayerNorm { epsilon } => {
                k::layer_norm_forward(x, &ps[0], &ps[1], *epsilon).ctx(ctx)?
            }
            Op::Dropout { rate } => {
                let seed = k::dropout_seed(self.seed, self.steps_run, l);
                k::dropout_apply(x, *rate, seed).ctx(ctx)?
            }
            Op::Embedding { .. } => k::embedding_forward(x, &ps[0]).ctx(ctx)?,
            Op::PositionEmbedding { .. } => k::position_embedding_forward(x, &ps[0]).ctx(ctx)?,
            Op::SelfAttention(a) => {
                k::attention_forward(x, &ps[0], &ps[1], &ps[2], &ps[3], a.heads, a.causal)
                    .ctx(ctx)?
            }
            Op::Dense(d) => {
                let z = k::dense_forward(x, &ps[0], ps.get(1)).ctx(ctx)?;
                k::activation_forward(&z, d.activation, rank - 1).ctx(ctx)?
            }
            Op::Conv2d(c) => {
                k::conv2d_forward_act_chunked(x, &ps[0], ps.get(1), c, c.activation, conv_chunk)
                    .ctx(ctx)?
            }
            Op::Activation(a) => k::activation_forward(x, *a, 1).ctx(ctx)?,
            Op::Flatten | Op::Reshape { .. } => x.reshape(layer.output.shape.dims()).ctx(ctx)?,
            Op::MaxPool2d(p) => k::max_pool2d_forward(x, p).ctx(ctx)?,
            Op::AvgPool2d(p) => k::avg_pool2d_forward(x, p).ctx(ctx)?,
            Op::GlobalAvgPool2d => k::global_avg_pool_forward(x).ctx(ctx)?,
            Op::Add => {
                let owned: Vec<Tensor> = xs.iter().map(|t| (*t).clone()).collect();
                k::sum_in_order(&owned).ctx(ctx)?
            }
            Op::Concat { axis } => Tensor::cat(xs, *axis).ctx(ctx)?,
            Op::ZeroPadding2d { padding } => k::pad2d(x, *padding).ctx(ctx)?,
            Op::Cropping2d { cropping } => k::crop2d(x, *cropping).ctx(ctx)?,
            Op::UpSampling2d { scale } => {
                let (_, _, h, w) = x.dims4().ctx(ctx)?;
                x.upsample_nearest2d(h * scale[0], w * scale[1]).ctx(ctx)?
            }
        };
        Ok((y, None))
    }

    /// Stores layer `l`'s parameter gradients, in parameter order, the first time its backward
    /// node runs in a step (a recompute must not change them; SPEC.md section 3). Entries past the
    /// layer's parameters, and `None`s, are skipped.
    fn store_grads<const N: usize>(
        &mut self,
        l: usize,
        first_time: bool,
        grads: [Option<Tensor>; N],
    ) {
        if first_time {
            for (slot, g) in self.grads[l].iter_mut().zip(grads) {
                if g.is_some() {
                    *slot = g;
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        l: usize,
        v: usize,
        part: Part,
        step: usize,
        conv_chunk: usize,
        regs: &[Option<Vec<Tensor>>],
        batch: &Batch,
        grads_done: &mut [bool],
    ) -> Result<Vec<Tensor>> {
        let Some(bn) = self.tg.backward[l].clone() else {
            return Err(
                self.unsupported(l, "role says backward but the layer has no backward node")
            );
        };
        let layer = self.net.layer(l).clone();
        let label = self.tg.graph.label(v);
        let ctx = || label.clone();
        // A recomputed parameter-gradient node has nothing left to do.
        if part == Part::Params && grads_done[l] {
            return Ok(vec![]);
        }
        let saved = match bn.saved {
            Some((s, kind)) => Some((self.reg(regs, s, 0, step, v)?, kind)),
            None => None,
        };
        let saved_mask = match saved {
            Some((m, SavedKind::ActivationMask)) => Some(m),
            _ => None,
        };
        // Operator level: the gradient arrives through a max pooling this node expands itself.
        let pooled = match bn.pooled {
            Some((p, node, index)) => {
                let Op::MaxPool2d(pool) = &self.net.layer(p).op else {
                    return Err(self.unsupported(p, "fused pooling that does not pool"));
                };
                Some(crate::conv_cpu::Pooled {
                    indices: self.reg(regs, node, index, step, v)?,
                    window: pool.pool,
                })
            }
            None => None,
        };
        // Upstream gradient of the output, summed in the graph's fixed order.
        let (parts, from_loss) = self.upstream(&bn, regs, step, v)?;
        // Operator level: several upstream gradients summed and masked in one pass, without the
        // summed temporary (`BackwardNode::sum_masked`, which the graph models).
        let sum_masked = saved_mask.filter(|_| bn.sum_masked);
        let g_out = if parts.is_empty() {
            None
        } else if let Some(m) = sum_masked {
            Some(crate::saved_cpu::mask_backward_sum(&parts, m).ctx(ctx)?)
        } else {
            Some(k::sum_in_order(&parts).ctx(ctx)?)
        };
        let y = self.reg(regs, self.tg.forward_node(l), 0, step, v).ok();
        let loss = self.net.loss();
        let loss_grad = if from_loss {
            let y = y.ok_or_else(|| self.unsupported(l, "loss gradient needs the output"))?;
            Some(
                k::cross_entropy_nd_backward(y, &batch.labels, loss.class_axis, loss.from_logits)
                    .ctx(ctx)?,
            )
        } else {
            None
        };
        let mut xs = Vec::new();
        for &t in &layer.inputs {
            xs.push(self.tensor(t, regs, batch, step, v).ok());
        }
        let rank = layer.output.shape.rank();
        let act = layer.op.activation();
        let axis = k::softmax_axis_for(matches!(layer.op, Op::Dense(_)), rank);
        // Gradient at the activation's input (the op body's output).
        let add = |a: Option<Tensor>, b: Option<Tensor>| -> Result<Option<Tensor>> {
            Ok(match (a, b) {
                (Some(a), Some(b)) => Some(a.add(&b).ctx(ctx)?),
                (a, None) => a,
                (None, b) => b,
            })
        };
        let (g_out, post) = if loss.from_logits {
            (add(g_out, loss_grad)?, None)
        } else {
            (g_out, loss_grad)
        };
        // A convolution followed by ReLU masks the gradient inside its own kernel (chunk by
        // chunk on the CPU, no gradient-sized temporary): its output is the mask.
        let relu_mask = match (&layer.op, act, post.is_none() && !from_loss) {
            (Op::Conv2d(_), Activation::Relu, true) => match saved_mask {
                Some(m) => Some(ReluMask::Bits(m)),
                None => y.map(ReluMask::Output),
            },
            _ => None,
        };
        let g_pre = match (g_out, saved_mask) {
            (Some(g), _)
                if act == Activation::Linear || relu_mask.is_some() || sum_masked.is_some() =>
            {
                Some(g)
            }
            (Some(g), Some(m)) => Some(crate::saved_cpu::mask_backward(&g, m).ctx(ctx)?),
            (Some(g), None) => {
                // GELU reads its input only; the others read their output.
                let y = match (y, xs[0]) {
                    (Some(y), _) => y,
                    (None, Some(x)) if !act.grad_needs_output() => x,
                    _ => return Err(self.unsupported(l, "activation gradient needs the output")),
                };
                Some(k::activation_backward(xs[0], y, &g, act, axis).ctx(ctx)?)
            }
            (None, _) => None,
        };
        let Some(g) = add(g_pre, post)? else {
            return Err(self.unsupported(l, "backward node without upstream gradient"));
        };
        let need =
            |i: usize| bn.input_grads.get(i).copied().unwrap_or(false) && part != Part::Params;
        // Operator level: the input-gradient node leaves the parameter gradients to its own node.
        let first_time = !grads_done[l] && part != Part::Inputs;
        // A recomputed backward node (parameter gradients done this step) computes only its
        // input gradients: its parameter gradients would be allocated and dropped, memory the
        // graph does not model (a whole kernel's size) and products nobody reads.
        if first_time {
            // The last step's gradients are static memory until this node replaces them: they
            // go just before the kernel allocates the new ones, so the heap never holds both.
            for slot in &mut self.grads[l] {
                *slot = None;
            }
        }
        let x0 = || -> Result<&Tensor> {
            xs[0].ok_or_else(|| self.unsupported(l, "gradient rule needs the input"))
        };
        let mut outs: Vec<Option<Tensor>> = vec![None; layer.inputs.len()];
        let x_dims = layer.input_types[0].shape.dims().to_vec();
        match &layer.op {
            Op::Dense(_) if part == Part::Inputs => {
                outs[0] = Some(k::dense_backward_data(&self.params[l][0], &g, &x_dims).ctx(ctx)?);
            }
            Op::MaxPool2d(p) if saved.is_some() => {
                let Some((idx, SavedKind::PoolIndex)) = saved else {
                    return Err(self.unsupported(l, "max pooling without its indices"));
                };
                outs[0] = Some(k::max_pool2d_backward_indices(idx, &g, &x_dims, p).ctx(ctx)?);
            }
            Op::Dense(_) => {
                let (dx, dw, db) =
                    k::dense_backward(x0()?, &self.params[l][0], &g, need(0), first_time)
                        .ctx(ctx)?;
                self.store_grads(l, first_time, [dw, Some(db)]);
                outs[0] = dx;
            }
            Op::Conv2d(c) => {
                let w = &self.params[l][0];
                let (dx, dw, db) = match (relu_mask, part) {
                    (Some(ReluMask::Output(y)), Part::Whole) => {
                        k::conv2d_backward_relu(x0()?, w, y, &g, c, need(0), first_time, c.bias)
                    }
                    (None, Part::Whole) => {
                        k::conv2d_backward(x0()?, w, &g, c, need(0), first_time, c.bias)
                    }
                    // Operator level: a bit mask, a pooled gradient, or one part of the two (the
                    // input-gradient part does not read the input).
                    (mask, _) => k::conv2d_backward_split(
                        if part == Part::Inputs {
                            None
                        } else {
                            Some(x0()?)
                        },
                        &x_dims,
                        w,
                        mask,
                        pooled,
                        &g,
                        c,
                        need(0),
                        first_time,
                        conv_chunk,
                    ),
                }
                .ctx(ctx)?;
                self.store_grads(l, first_time, [dw, db]);
                outs[0] = dx;
            }
            Op::ConvTranspose2d(c) => {
                let w = &self.params[l][0];
                let (dx, dw, db) =
                    k::conv_transpose2d_backward(x0()?, w, &g, c, need(0), first_time, c.bias)
                        .ctx(ctx)?;
                self.store_grads(l, first_time, [dw, db]);
                outs[0] = dx;
            }
            Op::BatchNorm(b) => {
                let (dx, dgamma, dbeta) =
                    k::batch_norm_backward(x0()?, &self.params[l][0], &g, b.epsilon).ctx(ctx)?;
                self.store_grads(l, first_time, [Some(dgamma), Some(dbeta)]);
                outs[0] = Some(dx);
            }
            Op::LayerNorm { epsilon } => {
                let (dx, dgamma, dbeta) =
                    k::layer_norm_backward(x0()?, &self.params[l][0], &g, *epsilon).ctx(ctx)?;
                self.store_grads(l, first_time, [Some(dgamma), Some(dbeta)]);
                outs[0] = Some(dx);
            }
            Op::Dropout { rate } => {
                let seed = k::dropout_seed(self.seed, self.steps_run, l);
                outs[0] = Some(k::dropout_apply(&g, *rate, seed).ctx(ctx)?);
            }
            Op::Embedding { .. } => {
                if first_time {
                    let dw = k::embedding_backward(x0()?, &self.params[l][0], &g).ctx(ctx)?;
                    self.grads[l][0] = Some(dw);
                }
            }
            Op::PositionEmbedding { .. } => {
                if first_time {
                    let dw = k::position_embedding_backward(&self.params[l][0], &g).ctx(ctx)?;
                    self.grads[l][0] = Some(dw);
                }
                outs[0] = Some(g);
            }
            Op::SelfAttention(a) => {
                let ps = &self.params[l];
                let r = k::attention_backward(
                    x0()?,
                    &ps[0],
                    &ps[1],
                    &ps[2],
                    &g,
                    a.heads,
                    a.causal,
                    need(0),
                )
                .ctx(ctx)?;
                if first_time {
                    self.grads[l] =
                        vec![Some(r.dwqkv), Some(r.dbqkv), Some(r.dwout), Some(r.dbout)];
                }
                outs[0] = r.dx;
            }
            Op::Activation(_) => outs[0] = Some(g),
            Op::Flatten | Op::Reshape { .. } => {
                outs[0] = Some(g.reshape(layer.input_types[0].shape.dims()).ctx(ctx)?)
            }
            Op::MaxPool2d(p) => outs[0] = Some(k::max_pool2d_backward(x0()?, &g, p).ctx(ctx)?),
            Op::AvgPool2d(p) => {
                let dims = layer.input_types[0].shape.dims();
                outs[0] = Some(k::avg_pool2d_backward(dims, &g, p).ctx(ctx)?)
            }
            Op::GlobalAvgPool2d => {
                let dims = layer.input_types[0].shape.dims();
                outs[0] = Some(k::global_avg_pool_backward(dims, &g).ctx(ctx)?)
            }
            Op::Add => {
                grads_done[l] = part != Part::Inputs;
                return Ok(if bn.input_grads.iter().any(|&b| b) {
                    vec![g]
                } else {
                    vec![]
                });
            }
            Op::Concat { axis } => {
                let mut start = 0;
                for (i, t) in layer.input_types.iter().enumerate() {
                    let len = t.shape.dim(*axis);
                    if need(i) {
                        outs[i] = Some(
                            g.narrow(*axis, start, len)
                                .and_then(|t| t.force_contiguous())
                                .ctx(ctx)?,
                        );
                    }
                    start += len;
                }
            }
            Op::ZeroPadding2d { padding } => outs[0] = Some(k::crop2d(&g, *padding).ctx(ctx)?),
            Op::Cropping2d { cropping } => outs[0] = Some(k::pad2d(&g, *cropping).ctx(ctx)?),
            Op::UpSampling2d { scale } => {
                let (n, c, h, w) = layer_dims4(layer.input_types[0].shape.dims())
                    .ok_or_else(|| self.unsupported(l, "upsampling needs NCHW"))?;
                let dx = g
                    .reshape((n, c, h, scale[0], w, scale[1]))
                    .and_then(|t| t.sum((3, 5)))
                    .ctx(ctx)?;
                outs[0] = Some(dx);
            }
        }
        if part != Part::Inputs {
            grads_done[l] = true;
        }
        if part == Part::Params {
            return Ok(vec![]);
        }
        outs.into_iter()
            .enumerate()
            .filter(|(i, _)| need(*i))
            .map(|(_, t)| t)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.unsupported(l, "an input gradient was not produced"))
    }
}

/// Which gradients a backward node computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Input and parameter gradients (layer level, or a layer without a parameter-gradient node).
    Whole,
    /// Input gradients only ([`NodeRole::Backward`] of a layer with a [`NodeRole::WeightGrad`]).
    Inputs,
    /// Parameter gradients only ([`NodeRole::WeightGrad`]).
    Params,
}

fn layer_dims4(d: &[usize]) -> Option<(usize, usize, usize, usize)> {
    match *d {
        [n, c, h, w] => Some((n, c, h, w)),
        _ => None,
    }
}
