//! `checkmate max-batch`: the largest batch whose training step fits a memory size, per strategy,
//! confirmed by running a real step at that batch.

use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::DType;
use checkmate_executor::{Executor, Optimizer, OptimizerKind, SyntheticData};
use checkmate_graph::{format_bytes, simulate, Budget, Graph, Plan};
use checkmate_models::{model_by_name, Granularity};
use checkmate_solver::{strategy_by_name, SolveOptions, Strategy};
use clap::Args;
use serde_json::json;

use crate::common::{print_json, ModelArgs, SolverArgs};
use crate::train_cmd::parse_device;
use checkmate_executor::heap;

/// Arguments of `checkmate max-batch`.
#[derive(Debug, Clone, Args)]
pub struct MaxBatchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Memory for the whole step (static + activations): bytes or units (16GB, 6GiB).
    #[arg(long)]
    pub memory: Budget,
    /// Comma-separated strategies.
    #[arg(
        long,
        short = 's',
        value_delimiter = ',',
        default_value = "checkpoint-all,chen-greedy,lp-round,milp"
    )]
    pub strategies: Vec<String>,
    /// Largest batch to try.
    #[arg(long, default_value_t = 4096)]
    pub limit: usize,
    /// Accept only plans whose cost is at most checkpoint-all's plus this many forward passes
    /// (the paper's Figure 6 allows one).
    #[arg(long)]
    pub max_extra_forwards: Option<f64>,
    #[command(flatten)]
    pub solver: SolverArgs,
    /// Do not confirm by running a real training step at the batch found.
    #[arg(long)]
    pub no_confirm: bool,
    /// Device for the confirming step: cpu or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A feasible batch: its plan and what it costs.
struct Fit {
    batch: usize,
    plan: Plan,
    peak_bytes: u64,
    static_bytes: u64,
    cost: f64,
    checkpoint_all_cost: f64,
    status: String,
}

/// What running one step at the batch found measured.
struct Confirmation {
    measured_live_peak: u64,
    predicted_live_peak: u64,
    heap_peak: u64,
    seconds: f64,
}

impl MaxBatchArgs {
    fn graph(&self, name: &str, batch: usize) -> Result<Graph> {
        let mut model = self.model.clone();
        model.batch = Some(batch);
        model.build(name)
    }

    /// The plan at `batch` when the strategy fits the memory (and the overhead cap).
    fn fit(
        &self,
        name: &str,
        strategy: &dyn Strategy,
        memory: u64,
        batch: usize,
        options: &SolveOptions,
    ) -> Result<Option<Fit>> {
        let graph = self.graph(name, batch)?;
        // The heap confirms the batch: leave room for the bytes no node models.
        let Some(activation) = memory
            .checked_sub(graph.static_bytes())
            .and_then(|a| a.checked_sub(checkmate_executor::heap::RESERVE_BYTES))
        else {
            return Ok(None);
        };
        // The strategy itself, not `solve`: an infeasible probe must not pay for a search of the
        // least feasible budget.
        if activation < graph.min_feasible_activation_bytes() {
            return Ok(None);
        }
        let outcome = match strategy.plan(&graph, activation, options) {
            Ok(o) => o,
            Err(checkmate_solver::Error::NotApplicable { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let Some(plan) = outcome.plan else {
            return Ok(None);
        };
        let sim = simulate(&graph, &plan)?;
        if sim.peak_bytes > activation {
            return Ok(None);
        }
        // With fused convolutions and poolings the graph computes more than the unfused one:
        // the overhead counts from the unfused graph, what training without the fusion computes.
        let unfused = if self.model.fuse_conv_pool {
            let mut model = self.model.clone();
            model.batch = Some(batch);
            model.fuse_conv_pool = false;
            Some(model.build(name)?)
        } else {
            None
        };
        let reference = unfused.as_ref().unwrap_or(&graph);
        let checkpoint_all_cost = reference.total_cost();
        if let Some(extra) = self.max_extra_forwards {
            let forward: f64 = reference
                .forward_nodes()
                .map(|i| reference.node(i).cost)
                .sum();
            if sim.cost > checkpoint_all_cost + extra * forward + 1e-9 * checkpoint_all_cost {
                return Ok(None);
            }
        }
        Ok(Some(Fit {
            batch,
            plan,
            peak_bytes: sim.peak_bytes,
            static_bytes: graph.static_bytes(),
            cost: sim.cost,
            checkpoint_all_cost,
            status: outcome.status.as_str().into(),
        }))
    }

    /// Galloping then bisection for the largest batch that fits (feasibility taken as monotone in
    /// the batch, which it is for every strategy's memory model here up to solver time limits).
    /// The search starts at `hint` (for `milp`: the best batch of the strategies searched
    /// before) when the strategy fits there, else at batch 1; from there it tries
    /// `+1, +2, +4, ...` until a batch does not fit (from 1 that is plain doubling), then bisects.
    /// With a good hint `milp` needs two probes instead of a dozen.
    fn search(
        &self,
        name: &str,
        strategy: &dyn Strategy,
        memory: u64,
        options: &SolveOptions,
        hint: usize,
    ) -> Result<Option<Fit>> {
        let hint = hint.clamp(1, self.limit);
        let from_hint = if hint > 1 {
            self.fit(name, strategy, memory, hint, options)?
        } else {
            None
        };
        let mut best = match from_hint {
            Some(f) => f,
            None => match self.fit(name, strategy, memory, 1, options)? {
                Some(f) => f,
                None => return Ok(None),
            },
        };
        let mut hi = None;
        let mut step = 1;
        while hi.is_none() && best.batch < self.limit {
            let b = (best.batch + step).min(self.limit);
            match self.fit(name, strategy, memory, b, options)? {
                Some(f) => {
                    best = f;
                    step *= 2;
                }
                None => hi = Some(b),
            }
        }
        if let Some(mut hi) = hi {
            while hi - best.batch > 1 {
                let mid = best.batch + (hi - best.batch) / 2;
                match self.fit(name, strategy, memory, mid, options)? {
                    Some(f) => best = f,
                    None => hi = mid,
                }
            }
        }
        Ok(Some(best))
    }

    /// Runs one training step of `fit`'s plan at its batch.
    fn confirm(&self, name: &str, fit: &Fit) -> Result<Confirmation> {
        let device = parse_device(&self.device)?;
        let mut model = self.model.clone();
        model.batch = Some(fit.batch);
        let config = model.model_config()?;
        let net = model_by_name(name, &config)?;
        let training = self.model.training_config()?;
        if device.is_cpu() {
            // gemm's per-thread buffers live as long as the process: part of the baseline.
            heap::warm_up_cpu()?;
        }
        // The process heap on the CPU, the device's memory pool on CUDA.
        let meter = checkmate_executor::Meter::for_device(&device)?;
        let base = meter.current()?;
        let mut exec = Executor::new(net, &training, &device, DType::F32, 0)?;
        let data = SyntheticData::new(&exec, 0.5, 0)?;
        let batch = data.batch(&exec, 0)?;
        meter.reset_peak()?;
        let started = Instant::now();
        let report = exec
            .run_plan(&fit.plan, &batch)
            .with_context(|| format!("confirming step at batch {}", fit.batch))?;
        Optimizer::new(OptimizerKind::sgd(0.01))?.step(&mut exec)?;
        Ok(Confirmation {
            measured_live_peak: report.measured_peak,
            predicted_live_peak: report.predicted_live.iter().copied().max().unwrap_or(0),
            heap_peak: meter.peak()?.saturating_sub(base),
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// Runs `checkmate max-batch`.
pub fn run(mut args: MaxBatchArgs) -> Result<()> {
    // Operator-level graphs by default on the CPU (docs/OP_GRAPHS.md).
    args.model.settle_granularity(&args.device)?;
    let name = args
        .model
        .model
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--model is required (vgg16, resnet50, mlp, ...)"))?;
    anyhow::ensure!(
        args.model.batch.is_none(),
        "max-batch searches the batch size itself; drop --batch"
    );
    let memory = match args.memory {
        Budget::Bytes(b) => b,
        Budget::PercentOfCheckpointAll(_) => {
            anyhow::bail!("--memory takes bytes or units such as 16GB or 6GiB, not a percentage")
        }
    };
    anyhow::ensure!(args.limit >= 1, "--limit must be at least 1");
    let options = args.solver.options(0)?;
    let mut rows = Vec::new();
    // At operator level checkpoint-all also runs on the layer graph: the batch training without
    // any of this reaches, the reference for the others.
    if args.model.granularity == Some(Granularity::Op)
        && args.strategies.iter().any(|s| s.trim() == "checkpoint-all")
    {
        let mut layer = args.clone();
        layer.model.granularity = Some(Granularity::Layer);
        let strategy = strategy_by_name("checkpoint-all")?;
        let started = Instant::now();
        let fit = layer.search(&name, strategy.as_ref(), memory, &options, 1)?;
        let search_seconds = started.elapsed().as_secs_f64();
        let confirmation = match (&fit, args.no_confirm) {
            (Some(f), false) => Some(layer.confirm(&name, f)?),
            _ => None,
        };
        rows.push((
            "checkpoint-all (layer graph)".to_string(),
            fit,
            confirmation,
            search_seconds,
        ));
    }
    for s in &args.strategies {
        let strategy = strategy_by_name(s.trim())?;
        let started = Instant::now();
        // Only `milp` starts from the batches found before: its probes are the expensive ones
        // (each may run to the time limit) and it starts from `lp-round`'s plan anyway. The
        // heuristics search from 1: their time-limited answers are not exactly monotone in the
        // batch, and a search from another strategy's batch can stop at a dip (mobilenet:
        // lp-round 1133 from chen-greedy's 1133, 1227 from 1).
        let hint = if strategy.name() == checkmate_solver::milp::NAME {
            rows.iter()
                .filter_map(|(_, fit, _, _): &(String, Option<Fit>, _, f64)| {
                    fit.as_ref().map(|f| f.batch)
                })
                .max()
                .unwrap_or(1)
        } else {
            1
        };
        let fit = args.search(&name, strategy.as_ref(), memory, &options, hint)?;
        let search_seconds = started.elapsed().as_secs_f64();
        let confirmation = match (&fit, args.no_confirm) {
            (Some(f), false) => Some(args.confirm(&name, f)?),
            _ => None,
        };
        rows.push((
            strategy.name().to_string(),
            fit,
            confirmation,
            search_seconds,
        ));
    }
    if args.json {
        let items: Vec<_> = rows
            .iter()
            .map(|(s, fit, c, secs)| {
                json!({
                    "strategy": s,
                    "max_batch": fit.as_ref().map(|f| f.batch),
                    "status": fit.as_ref().map(|f| f.status.clone()),
                    "peak_bytes": fit.as_ref().map(|f| f.peak_bytes),
                    "static_bytes": fit.as_ref().map(|f| f.static_bytes),
                    "total_bytes": fit.as_ref().map(|f| f.peak_bytes + f.static_bytes),
                    "overhead": fit.as_ref().map(|f| f.cost / f.checkpoint_all_cost.max(f64::MIN_POSITIVE)),
                    "confirmed": c.as_ref().map(|c| c.measured_live_peak == c.predicted_live_peak && c.heap_peak <= memory),
                    "registers_match": c.as_ref().map(|c| c.measured_live_peak == c.predicted_live_peak),
                    "heap_within_memory": c.as_ref().map(|c| c.heap_peak <= memory),
                    "measured_live_peak_bytes": c.as_ref().map(|c| c.measured_live_peak),
                    "heap_peak_bytes": c.as_ref().map(|c| c.heap_peak),
                    "step_seconds": c.as_ref().map(|c| c.seconds),
                    "search_seconds": secs,
                })
            })
            .collect();
        print_json(&json!({
            "model": name,
            "memory_bytes": memory,
            "limit": args.limit,
            "max_extra_forwards": args.max_extra_forwards,
            "strategies": items,
        }));
        return Ok(());
    }
    println!(
        "model {name}, memory {} (static + activations), batches 1..={}",
        format_bytes(memory),
        args.limit
    );
    println!(
        "{:<28} {:>9} {:>12} {:>12} {:>9} {:>24} {:>8}",
        "strategy",
        "max batch",
        "activations",
        "static",
        "overhead",
        "confirmed (heap peak)",
        "search"
    );
    for (s, fit, c, secs) in &rows {
        match fit {
            Some(f) => println!(
                "{:<28} {:>9} {:>12} {:>12} {:>8.1}% {:>24} {:>7.1}s",
                s,
                f.batch,
                format_bytes(f.peak_bytes),
                format_bytes(f.static_bytes),
                100.0 * (f.cost / f.checkpoint_all_cost.max(f64::MIN_POSITIVE) - 1.0),
                match c {
                    // Confirmed by the process: the registers as predicted and the heap (step
                    // and update, above the program's own) within --memory.
                    Some(c)
                        if c.measured_live_peak == c.predicted_live_peak
                            && c.heap_peak <= memory =>
                        format!("yes ({})", format_bytes(c.heap_peak)),
                    Some(c) if c.measured_live_peak == c.predicted_live_peak =>
                        format!("NO: heap {} > memory", format_bytes(c.heap_peak)),
                    Some(c) => format!(
                        "NO: live {} vs {}",
                        format_bytes(c.measured_live_peak),
                        format_bytes(c.predicted_live_peak)
                    ),
                    None => "not run".into(),
                },
                secs
            ),
            None => println!("{s:<28} {:>9}  (not even batch 1 fits)", "-"),
        }
    }
    Ok(())
}
