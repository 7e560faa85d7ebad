//! Timing every node of a training graph with the executor's own kernels.

use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use checkmate_executor::{Batch, Executor};
use checkmate_graph::{Graph, NodeKind, Plan, Step};
use checkmate_models::{
    AlternativeCost, CostTable, ModelConfig, Network, NodeCost, StepOverheads, TrainingConfig,
    COSTS_FORMAT,
};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::stats::Summary;

/// How long and how carefully to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileOptions {
    /// Whole training steps run and thrown away first (allocator, caches, lazy initialization).
    pub warmup: usize,
    /// Timed steps at least.
    pub min_repeats: usize,
    /// Timed steps at most.
    pub max_repeats: usize,
    /// Stop once the estimated relative standard error of the summed per-node medians is at most
    /// this (see [`Profile::rel_error`]); `0` always runs `max_repeats`.
    pub target_rel_error: f64,
    /// Stop after this much measuring (once `min_repeats` are done), whatever the error.
    pub time_limit: Option<Duration>,
    /// Seed of the parameters and of the random batch.
    pub seed: u64,
}

impl Default for ProfileOptions {
    /// 5 warm-up steps, 15 to 30 timed steps, 1% target error, no time limit, seed 0 (fewer
    /// warm-up or timed steps left ResNet50's predictions 20% off on a CPU; docs/PROFILER.md).
    fn default() -> ProfileOptions {
        ProfileOptions {
            warmup: 5,
            min_repeats: 15,
            max_repeats: 30,
            target_rel_error: 0.01,
            time_limit: None,
            seed: 0,
        }
    }
}

impl ProfileOptions {
    /// Exactly `repeats` timed steps after the default warm-up.
    pub fn fixed(repeats: usize) -> ProfileOptions {
        ProfileOptions {
            min_repeats: repeats,
            max_repeats: repeats,
            target_rel_error: 0.0,
            ..ProfileOptions::default()
        }
    }

    fn validate(&self) -> Result<()> {
        if self.min_repeats == 0 {
            return Err(Error::Options("min_repeats must be at least 1".into()));
        }
        if self.max_repeats < self.min_repeats {
            return Err(Error::Options(format!(
                "max_repeats {} is below min_repeats {}",
                self.max_repeats, self.min_repeats
            )));
        }
        if !(self.target_rel_error >= 0.0 && self.target_rel_error.is_finite()) {
            return Err(Error::Options(format!(
                "target_rel_error {} must be a finite number >= 0",
                self.target_rel_error
            )));
        }
        Ok(())
    }
}

/// What the profiler is doing, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Untimed warm-up steps.
    Warmup,
    /// Timed steps.
    Measure,
}

/// One progress report, sent after every step (warm-up or timed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Warm-up or measurement.
    pub phase: Phase,
    /// Steps of this phase done.
    pub done: usize,
    /// Steps of this phase at most (`max_repeats` when measuring).
    pub total: usize,
    /// Relative standard error of the summed medians so far (measurement, from 2 steps on).
    pub rel_error: Option<f64>,
    /// Seconds since profiling started.
    pub elapsed: f64,
}

/// One node's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeProfile {
    /// Node name in the training graph.
    pub name: String,
    /// Median seconds of one compute (the cost).
    pub seconds: f64,
    /// Bytes of the node's output, measured from the executor's registers.
    pub bytes: u64,
    /// `forward`, `loss` or `backward`.
    pub kind: String,
    /// First quartile of the samples (seconds).
    pub q1_seconds: f64,
    /// Third quartile of the samples (seconds).
    pub q3_seconds: f64,
    /// Fastest sample (seconds).
    pub min_seconds: f64,
    /// Number of timed samples.
    pub samples: usize,
    /// Temporary bytes the node's kernels needed beyond inputs and outputs, where the device can
    /// tell (`None` on CPU: the host allocator does not report a high-water mark per kernel).
    pub workspace_bytes: Option<u64>,
    /// The node's other implementations, timed on alternate steps (docs/IMPLEMENTATIONS.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<AlternativeProfile>,
}

/// One alternative implementation's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlternativeProfile {
    /// The implementation's name.
    pub name: String,
    /// Median seconds of one compute with it.
    pub seconds: f64,
    /// Number of timed samples.
    pub samples: usize,
}

impl NodeProfile {
    /// Interquartile range over the median, the node's reported relative spread.
    pub fn rel_spread(&self) -> f64 {
        if self.seconds > 0.0 {
            (self.q3_seconds - self.q1_seconds) / self.seconds
        } else {
            0.0
        }
    }
}

/// How a profile was measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileMeta {
    /// Warm-up steps run.
    pub warmup: usize,
    /// Timed steps run (samples per node).
    pub repeats: usize,
    /// The target relative error the run aimed for.
    pub target_rel_error: f64,
    /// Achieved relative standard error of the summed per-node medians.
    pub rel_error: f64,
    /// Per timed step, the summed seconds of all plan steps (the whole training step).
    pub step: Summary,
    /// Wall-clock seconds of the whole profile, warm-up included.
    pub wall_seconds: f64,
    /// How the time of one node was taken.
    pub timer: String,
    /// How workspace was measured, or why not.
    pub workspace: String,
    /// Device memory high-water mark of one profiling step (CUDA memory pool), when known.
    pub peak_device_bytes: Option<u64>,
    /// The plan's total seconds timed with device events around whole steps, when available (a
    /// cross-check of the per-step host timings).
    pub event_step_seconds: Option<f64>,
}

/// Measured per-node costs of one model at one batch size on one device.
///
/// Serializes to a superset of `checkmate-costs/1` ([`Profile::to_json`]): the spec's fields plus
/// per-node `kind`, quartiles, sample count and `workspace_bytes`, and a `profile` object; every
/// reader of cost tables ([`CostTable::read`], `--costs`) takes it as is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Always `checkmate-costs/1`.
    pub format: String,
    /// The device, e.g. `cpu (AMD EPYC 7B13, 2 threads)`.
    pub device: String,
    /// The model name.
    pub model: String,
    /// Batch size.
    pub batch: usize,
    /// One entry per training-graph node, in graph order.
    pub nodes: Vec<NodeProfile>,
    /// The rest of a training step: the executor's time per plan step (the median over timed
    /// steps of `run_plan`'s wall time minus its steps' times, over the number of steps), and
    /// the update and the batch when [`time_update_and_batch`] measured them.
    #[serde(flatten)]
    pub overheads: StepOverheads,
    /// How it was measured.
    pub profile: ProfileMeta,
}

impl Profile {
    /// The `checkmate-costs/1` table: per node, median seconds and measured bytes.
    pub fn cost_table(&self) -> CostTable {
        let mut table = CostTable::new(
            self.device.clone(),
            self.model.clone(),
            self.batch,
            self.nodes
                .iter()
                .map(|n| NodeCost {
                    name: n.name.clone(),
                    seconds: n.seconds,
                    bytes: n.bytes,
                    alternatives: n
                        .alternatives
                        .iter()
                        .map(|a| AlternativeCost {
                            name: a.name.clone(),
                            seconds: a.seconds,
                        })
                        .collect(),
                })
                .collect(),
        );
        table.overheads = self.overheads;
        table
    }

    /// Sum of every node's median: the predicted time of one checkpoint-all training step.
    pub fn total_seconds(&self) -> f64 {
        self.nodes.iter().map(|n| n.seconds).sum()
    }

    /// Sum of the medians of the nodes of one kind (`forward`, `loss`, `backward`).
    pub fn seconds_of_kind(&self, kind: NodeKind) -> f64 {
        self.nodes
            .iter()
            .filter(|n| n.kind == kind.as_str())
            .map(|n| n.seconds)
            .sum()
    }

    /// The achieved relative standard error of [`Profile::total_seconds`].
    pub fn rel_error(&self) -> f64 {
        self.profile.rel_error
    }

    /// The `count` slowest nodes, slowest first.
    pub fn slowest(&self, count: usize) -> Vec<&NodeProfile> {
        let mut v: Vec<&NodeProfile> = self.nodes.iter().collect();
        v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        v.truncate(count);
        v
    }

    /// Compares two profiles of the same graph (see [`Agreement`]).
    pub fn compare(&self, other: &Profile) -> Result<Agreement> {
        same_nodes(self, other)?;
        let (a, b) = (self.total_seconds(), other.total_seconds());
        let total_rel_diff = (a - b).abs() / (0.5 * (a + b)).max(f64::MIN_POSITIVE);
        let spread = |p: &Profile| p.profile.step.iqr() / p.profile.step.median;
        let total_rel_spread = spread(self).max(spread(other));
        let mut within = 0usize;
        let mut weight_within = 0.0;
        let mut weight = 0.0;
        for (x, y) in self.nodes.iter().zip(&other.nodes) {
            let tol = (x.q3_seconds - x.q1_seconds).max(y.q3_seconds - y.q1_seconds);
            let w = 0.5 * (x.seconds + y.seconds);
            weight += w;
            if (x.seconds - y.seconds).abs() <= tol {
                within += 1;
                weight_within += w;
            }
        }
        Ok(Agreement {
            total_seconds: [a, b],
            total_rel_diff,
            total_rel_spread,
            totals_agree: total_rel_diff <= total_rel_spread,
            nodes_within_spread: within as f64 / self.nodes.len().max(1) as f64,
            time_within_spread: if weight > 0.0 {
                weight_within / weight
            } else {
                1.0
            },
        })
    }

    /// The profile as JSON (a superset of `checkmate-costs/1`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a profile always serializes")
    }

    /// Parses a profile written by [`Profile::to_json`]; `context` names it in errors.
    pub fn from_json_str(text: &str, context: &str) -> Result<Profile> {
        let p: Profile = serde_json::from_str(text).map_err(|source| Error::Json {
            context: context.into(),
            source,
        })?;
        if p.format != COSTS_FORMAT {
            return Err(Error::Fit(format!(
                "{context}: format is {:?}, expected {COSTS_FORMAT:?}",
                p.format
            )));
        }
        Ok(p)
    }

    /// Reads a profile file.
    pub fn read(path: impl AsRef<Path>) -> Result<Profile> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        Profile::from_json_str(&text, &path.display().to_string())
    }

    /// Writes the profile (readable as a cost table by every `--costs` option).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json() + "\n").map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

pub(crate) fn same_nodes(a: &Profile, b: &Profile) -> Result<()> {
    if a.nodes.len() != b.nodes.len() || a.nodes.iter().zip(&b.nodes).any(|(x, y)| x.name != y.name)
    {
        return Err(Error::Fit(format!(
            "profiles of {} (batch {}, {} nodes) and {} (batch {}, {} nodes) are of different graphs",
            a.model,
            a.batch,
            a.nodes.len(),
            b.model,
            b.batch,
            b.nodes.len()
        )));
    }
    Ok(())
}

/// How well two profiles of the same graph agree.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Agreement {
    /// Each profile's summed medians.
    pub total_seconds: [f64; 2],
    /// `|a - b| / mean(a, b)` of the summed medians.
    pub total_rel_diff: f64,
    /// The larger of the two profiles' reported step spread (IQR / median of whole steps).
    pub total_rel_spread: f64,
    /// Whether the totals differ by at most the reported spread.
    pub totals_agree: bool,
    /// Fraction of nodes whose medians differ by at most the larger of their two IQRs.
    pub nodes_within_spread: f64,
    /// The same, weighted by the nodes' times.
    pub time_within_spread: f64,
}

/// The plan the profiler times: every node computed once in graph order, each tensor freed right
/// after its last reader (checkpoint-all with eager frees), so every kernel sees inputs of the
/// right shapes and output bytes are the live-bytes increase at its compute step.
pub fn profiling_plan(graph: &Graph) -> Plan {
    let n = graph.len();
    let last_reader: Vec<usize> = (0..n).map(|i| graph.last_reader(i).unwrap_or(i)).collect();
    let mut frees_after: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, &r) in last_reader.iter().enumerate() {
        frees_after[r].push(i);
    }
    let mut steps = Vec::with_capacity(2 * n);
    for (v, frees) in frees_after.iter().enumerate() {
        steps.push(Step::Compute(v));
        steps.extend(frees.iter().map(|&i| Step::Free(i)));
    }
    Plan::new(steps)
}

/// A readable name of `device`: `cpu (<processor>, <threads> threads)` or `cuda:<n> (<GPU>)`.
pub fn device_label(device: &Device) -> String {
    match device {
        Device::Cpu => {
            let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            });
            let threads = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
            match model {
                Some(m) => format!("cpu ({m}, {threads} threads)"),
                None => format!("cpu ({threads} threads)"),
            }
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => crate::cuda::device_label(device),
        other => format!("{:?}", other.location()),
    }
}

/// Profiles zoo model `name` (see `checkmate_models::MODEL_NAMES`) at `config` on `device`.
pub fn profile_model(
    name: &str,
    config: &ModelConfig,
    training: &TrainingConfig,
    device: &Device,
    options: &ProfileOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Profile> {
    let net = checkmate_models::model_by_name(name, config)?;
    profile_network(net, name, training, device, options, progress)
}

/// Profiles `net` (reported as `model`) on `device` with random parameters and a random batch.
pub fn profile_network(
    net: Network,
    model: &str,
    training: &TrainingConfig,
    device: &Device,
    options: &ProfileOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Profile> {
    options.validate()?;
    let mut exec = Executor::new(net, training, device, DType::F32, options.seed)?;
    let batch = exec.random_batch(options.seed)?;
    profile_executor(&mut exec, &batch, model, options, progress)
}

/// Profiles the training graph of `exec` on `batch`: runs [`profiling_plan`] `options.warmup`
/// times untimed, then repeatedly, taking every compute step's time as one sample of its node,
/// until the summed medians are stable (`options.target_rel_error`) or `options.max_repeats` is
/// reached. Calls `progress` after every step.
pub fn profile_executor(
    exec: &mut Executor,
    batch: &Batch,
    model: &str,
    options: &ProfileOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Profile> {
    options.validate()?;
    let started = Instant::now();
    let graph = exec.graph().clone();
    let n = graph.len();
    let plan = profiling_plan(&graph);
    // Nodes with other implementations run implementation `r % count` on timed step `r`: one
    // plan per implementation number (a node with fewer runs its default).
    let impl_count = graph
        .nodes()
        .iter()
        .map(|n| n.implementation_count())
        .max()
        .unwrap_or(1);
    let plans: Vec<Plan> = (0..impl_count)
        .map(|k| {
            let mut p = plan.clone();
            if k > 0 {
                p.implementations = p
                    .steps
                    .iter()
                    .map(|s| match *s {
                        Step::Compute(v) if graph.node(v).implementation_count() > k => k as u16,
                        _ => 0,
                    })
                    .collect();
            }
            p
        })
        .collect();
    let computes: Vec<(usize, usize)> = plan
        .steps
        .iter()
        .enumerate()
        .filter_map(|(s, &step)| match step {
            Step::Compute(v) => Some((s, v)),
            Step::Free(_) => None,
        })
        .collect();
    #[cfg(feature = "cuda")]
    let cuda = crate::cuda::Probe::new(exec.device())?;
    for w in 0..options.warmup {
        exec.run_plan(&plan, batch)?;
        progress(&Progress {
            phase: Phase::Warmup,
            done: w + 1,
            total: options.warmup,
            rel_error: None,
            elapsed: started.elapsed().as_secs_f64(),
        });
    }
    let measure_start = Instant::now();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(options.max_repeats); n];
    // Samples of implementation k >= 1 of node v: alt_samples[v][k - 1].
    let mut alt_samples: Vec<Vec<Vec<f64>>> = graph
        .nodes()
        .iter()
        .map(|node| vec![Vec::new(); node.alternatives.len()])
        .collect();
    let mut bytes: Vec<Option<u64>> = vec![None; n];
    let mut step_totals = Vec::with_capacity(options.max_repeats);
    let mut overheads = Vec::with_capacity(options.max_repeats);
    let mut rel_error = f64::INFINITY;
    #[allow(unused_mut)]
    let mut peak_device_bytes: Option<u64> = None;
    #[allow(unused_mut)]
    let mut event_seconds: Vec<f64> = Vec::new();
    for r in 0..options.max_repeats {
        #[cfg(feature = "cuda")]
        let mark = cuda.as_ref().map(|c| c.start()).transpose()?;
        let wall = Instant::now();
        let timed = &plans[r % plans.len()];
        let report = exec.run_plan(timed, batch)?;
        let wall = wall.elapsed().as_secs_f64();
        let kernels: f64 = report.step_seconds.iter().sum();
        overheads.push((wall - kernels).max(0.0) / plan.steps.len().max(1) as f64);
        #[cfg(feature = "cuda")]
        if let (Some(c), Some(mark)) = (cuda.as_ref(), mark) {
            let (secs, peak) = c.stop(mark)?;
            event_seconds.push(secs);
            if let Some(p) = peak {
                peak_device_bytes = Some(peak_device_bytes.unwrap_or(0).max(p));
            }
        }
        for &(s, v) in &computes {
            match timed.implementation(s) {
                0 => samples[v].push(report.step_seconds[s]),
                k => alt_samples[v][k - 1].push(report.step_seconds[s]),
            }
            let before = if s == 0 {
                0
            } else {
                report.measured_live[s - 1]
            };
            let delta = report.measured_live[s].saturating_sub(before);
            bytes[v].get_or_insert(delta);
        }
        step_totals.push(report.step_seconds.iter().sum::<f64>());
        let done = r + 1;
        if done >= 2 {
            rel_error = summed_median_rel_error(&samples);
        }
        progress(&Progress {
            phase: Phase::Measure,
            done,
            total: options.max_repeats,
            rel_error: (done >= 2).then_some(rel_error),
            elapsed: started.elapsed().as_secs_f64(),
        });
        if done >= options.min_repeats {
            if rel_error <= options.target_rel_error {
                break;
            }
            if let Some(limit) = options.time_limit {
                if measure_start.elapsed() >= limit {
                    break;
                }
            }
        }
    }
    let repeats = samples.first().map(Vec::len).unwrap_or(0);
    if repeats < 2 {
        rel_error = f64::NAN;
    }
    let nodes = graph
        .nodes()
        .iter()
        .enumerate()
        .map(|(v, node)| {
            let s = Summary::of(&samples[v]);
            NodeProfile {
                name: node.name.clone(),
                seconds: s.median,
                bytes: bytes[v].unwrap_or(0),
                kind: node.kind.as_str().to_string(),
                q1_seconds: s.q1,
                q3_seconds: s.q3,
                min_seconds: s.min,
                samples: s.count,
                workspace_bytes: None,
                alternatives: node
                    .alternatives
                    .iter()
                    .zip(&alt_samples[v])
                    .filter(|(_, t)| !t.is_empty())
                    .map(|(a, t)| AlternativeProfile {
                        name: a.name.clone(),
                        seconds: Summary::of(t).median,
                        samples: t.len(),
                    })
                    .collect(),
            }
        })
        .collect();
    let on_cpu = exec.device().is_cpu();
    Ok(Profile {
        format: COSTS_FORMAT.into(),
        device: device_label(exec.device()),
        model: model.into(),
        batch: exec.network().input().shape.dim(0),
        nodes,
        overheads: StepOverheads {
            plan_step_overhead_seconds: (!overheads.is_empty())
                .then(|| Summary::of(&overheads).median),
            ..StepOverheads::default()
        },
        profile: ProfileMeta {
            warmup: options.warmup,
            repeats,
            target_rel_error: options.target_rel_error,
            rel_error,
            step: Summary::of(&step_totals),
            wall_seconds: started.elapsed().as_secs_f64(),
            timer: if on_cpu {
                "host monotonic clock around each plan step (the executor's step_seconds)".into()
            } else {
                "device synchronize after each plan step + host monotonic clock (the executor's \
                 step_seconds); device events time whole steps only"
                    .into()
            },
            workspace: if on_cpu {
                "none: the CPU allocator reports no per-kernel high-water mark".into()
            } else {
                "not per node: needs a per-step hook in the executor; peak_device_bytes is the \
                 memory pool's high-water mark over one whole step"
                    .into()
            },
            peak_device_bytes,
            event_step_seconds: (!event_seconds.is_empty())
                .then(|| Summary::of(&event_seconds).median),
        },
    })
}

/// Median seconds of one `kind` optimizer update of `exec` (after one untimed update, which
/// allocates the optimizer state) and of making one batch of the synthetic data source that
/// `checkmate train` uses by default, over `repeats` samples each: the parts of a training step
/// outside the plan. The updates change `exec`'s parameters (a gradient is needed: run a plan
/// first).
pub fn time_update_and_batch(
    exec: &mut Executor,
    kind: checkmate_executor::OptimizerKind,
    repeats: usize,
) -> Result<(f64, f64)> {
    let mut opt = checkmate_executor::Optimizer::new(kind)?;
    opt.step(exec)?;
    let sync = |exec: &Executor| {
        exec.device()
            .synchronize()
            .map_err(|source| crate::Error::Tensor {
                context: "synchronizing the device".into(),
                source,
            })
    };
    let mut updates = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        opt.step(exec)?;
        sync(exec)?;
        updates.push(t.elapsed().as_secs_f64());
    }
    let data = checkmate_executor::SyntheticData::new(exec, 0.1, 0)?;
    let mut batches = Vec::with_capacity(repeats);
    for k in 0..repeats.max(1) {
        let t = Instant::now();
        let b = data.batch(exec, k as u64)?;
        sync(exec)?;
        batches.push(t.elapsed().as_secs_f64());
        drop(b);
    }
    Ok((Summary::of(&updates).median, Summary::of(&batches).median))
}

/// Relative standard error of the sum of the per-node medians, nodes taken as independent.
fn summed_median_rel_error(samples: &[Vec<f64>]) -> f64 {
    let mut total = 0.0;
    let mut var = 0.0;
    for s in samples {
        let sum = Summary::of(s);
        total += sum.median;
        let se = sum.median_standard_error();
        var += se * se;
    }
    if total > 0.0 {
        var.sqrt() / total
    } else {
        f64::INFINITY
    }
}
