//! `checkmate train`: solve a plan, then train a zoo model step by step with it, measuring memory
//! (registers, heap) and time against the predictions and against checkpoint-all.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use checkmate_executor::{params_checksum, BatchSource, Dataset, Executor, Optimizer, StepReport};
use checkmate_graph::{format_bytes, simulate, Budget, Graph, Plan, PlanFile, Simulation};
use checkmate_models::{Granularity, TrainingConfig};
use checkmate_solver::{solve, strategy_by_name};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::common::{print_json, resolve_budget, ModelArgs, SolverArgs};
use checkmate_executor::heap;

/// Arguments of `checkmate train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Training steps.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Total memory budget: bytes, units (6GiB, 500MB) or percent of the checkpoint-all
    /// activation peak (50%).
    #[arg(long, short = 'b', default_value = "100%")]
    pub budget: Budget,
    /// Strategy that plans the step (see `checkmate solve --help`).
    #[arg(long, short = 's', default_value = "milp")]
    pub strategy: String,
    /// Use this plan (checkmate-plan/1 for the same model and batch) instead of solving; it
    /// overrides --strategy and --budget.
    #[arg(long)]
    pub plan: Option<PathBuf>,
    #[command(flatten)]
    pub solver: SolverArgs,
    /// Learning rate (default 0.01 for SGD, 0.001 for Adam).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Seed of the initial weights, the synthetic data and randomized rounding.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Real data: a CIFAR-10 binary batch (*.bin) or a directory with inputs.npy and labels.npy
    /// (default: synthetic class templates plus noise).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Device: cpu or cuda:N (CUDA needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Steps of the checkpoint-all plan run first, from the same weights and data, to measure the
    /// time overhead and to check that recomputation leaves the weights bitwise unchanged (0 skips).
    #[arg(long, default_value_t = 2)]
    pub baseline_steps: u64,
    /// Make the budget a hard cap on the process heap during the plan's steps: training stops
    /// with an error naming the first node whose step takes the heap (above the program's own)
    /// over the budget. On by default (`--enforce-budget false` turns it off); the solver then
    /// gets the activation budget less `heap::RESERVE_BYTES` (2 MiB) for what no node models
    /// (docs/MEMORY.md).
    #[arg(long, num_args = 0..=1, default_value_t = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub enforce_budget: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Parses `cpu` or `cuda:N`.
pub fn parse_device(text: &str) -> Result<Device> {
    match text {
        "cpu" => Ok(Device::Cpu),
        _ => {
            let ordinal = text
                .strip_prefix("cuda")
                .map(|r| r.strip_prefix(':').unwrap_or(r))
                .map(|r| {
                    if r.is_empty() {
                        Ok(0)
                    } else {
                        r.parse::<usize>()
                    }
                })
                .ok_or_else(|| anyhow::anyhow!("--device {text:?}: write cpu or cuda:0"))?
                .map_err(|_| anyhow::anyhow!("--device {text:?}: write cpu or cuda:0"))?;
            Device::new_cuda(ordinal).with_context(|| {
                format!(
                    "--device {text}: CUDA is unavailable (this binary needs `--features cuda` \
                     and a CUDA GPU)"
                )
            })
        }
    }
}

/// The plan a training run follows, with what the solver or file said about it.
struct ChosenPlan {
    plan: Plan,
    strategy: String,
    status: String,
    budget_bytes: Option<u64>,
    solve_seconds: f64,
}

fn choose_plan(args: &TrainArgs, graph: &Graph) -> Result<ChosenPlan> {
    if let Some(path) = &args.plan {
        let file = PlanFile::read(path, graph)
            .with_context(|| format!("cannot use plan {}", path.display()))?;
        return Ok(ChosenPlan {
            plan: file.plan,
            strategy: file.strategy,
            status: "from file".into(),
            budget_bytes: file.budget_bytes,
            solve_seconds: 0.0,
        });
    }
    let mut budget = resolve_budget(graph, args.budget)?;
    let strategy = strategy_by_name(&args.strategy)?;
    let options = args.solver.options(args.seed)?;
    // A hard cap leaves room for the bytes no node models: a byte budget gives the plan that much
    // less; a percentage means what that share of checkpoint-all's activations needs in a real
    // process, so the reserve is added to the total (`100%` still fits checkpoint-all).
    let reserve = if args.enforce_budget {
        checkmate_executor::heap::RESERVE_BYTES
    } else {
        0
    };
    if matches!(args.budget, Budget::PercentOfCheckpointAll(_)) {
        budget.total_bytes += reserve;
        budget.activation_bytes += reserve;
    }
    let activation = budget.activation_bytes.saturating_sub(reserve);
    let solution = solve(graph, strategy.as_ref(), activation, &options).with_context(|| {
        format!(
            "no {} plan trains {} within {} ({} static + {} for activations{})",
            args.strategy,
            graph.name(),
            format_bytes(budget.total_bytes),
            format_bytes(graph.static_bytes()),
            format_bytes(activation),
            if reserve > 0 {
                format!(", after a {} heap reserve", format_bytes(reserve))
            } else {
                String::new()
            }
        )
    })?;
    let plan = solution.plan.ok_or_else(|| {
        anyhow::anyhow!(
            "{} found no plan within {} ({}); raise --budget or --time-limit",
            args.strategy,
            format_bytes(budget.total_bytes),
            solution.status
        )
    })?;
    Ok(ChosenPlan {
        plan,
        strategy: solution.strategy,
        status: solution.status.as_str().into(),
        budget_bytes: Some(budget.total_bytes),
        solve_seconds: solution.solve_seconds,
    })
}

fn median(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    })
}

/// Step times without the first (warm-up) step when there are at least three.
fn steady(times: &[f64]) -> &[f64] {
    if times.len() >= 3 {
        &times[1..]
    } else {
        times
    }
}

/// One training run's measurements.
struct Run {
    reports: Vec<StepReport>,
    step_seconds: Vec<f64>,
    /// Heap high-water mark while the plans ran (forward, loss, backward).
    heap_peak: u64,
    /// Heap high-water mark including the optimizer updates.
    heap_peak_with_update: u64,
    /// The step whose heap most exceeded what the plan models there: (bytes, node label).
    worst_unmodelled: Option<(u64, String)>,
    checksum_at: Option<u64>,
}

/// The bytes of `report`'s steps that the plan does not model, worst first: the heap above
/// `heap_base` minus what the executor says the model holds there (`StepReport::heap_modelled`).
fn worst_unmodelled(
    graph: &Graph,
    plan: &Plan,
    report: &StepReport,
    heap_base: u64,
) -> Option<(u64, String)> {
    let start = report.heap_at_start.saturating_sub(heap_base);
    report
        .heap_during_step
        .iter()
        .zip(&report.heap_modelled)
        .zip(&plan.steps)
        .map(|((&h, &modelled), s)| {
            let (checkmate_graph::Step::Compute(v) | checkmate_graph::Step::Free(v)) = *s;
            ((start + h).saturating_sub(modelled), graph.label(v))
        })
        .max_by_key(|(b, _)| *b)
}

/// Trains `steps` steps of `plan`; `checksum_after` records the weights' checksum after that many
/// steps. `heap_base` is subtracted from the heap high-water mark.
#[allow(clippy::too_many_arguments)]
fn run_steps(
    exec: &mut Executor,
    plan: &Plan,
    data: &dyn BatchSource,
    optimizer: &mut Optimizer,
    steps: u64,
    checksum_after: Option<u64>,
    heap_base: u64,
    bar: &ProgressBar,
    verbose: bool,
) -> Result<Run> {
    let mut run = Run {
        reports: Vec::with_capacity(steps as usize),
        step_seconds: Vec::with_capacity(steps as usize),
        heap_peak: 0,
        heap_peak_with_update: 0,
        worst_unmodelled: None,
        checksum_at: None,
    };
    let meter = exec.meter().clone();
    for k in 0..steps {
        meter.reset_peak()?;
        let started = Instant::now();
        let batch = data.batch(exec, k)?;
        let report = exec
            .run_plan(plan, &batch)
            .with_context(|| format!("training step {k}"))?;
        run.heap_peak = run.heap_peak.max(meter.peak()?.saturating_sub(heap_base));
        if let Some(w) = worst_unmodelled(exec.graph(), plan, &report, heap_base) {
            if run
                .worst_unmodelled
                .as_ref()
                .map_or(true, |(b, _)| w.0 > *b)
            {
                run.worst_unmodelled = Some(w);
            }
        }
        optimizer.step(exec)?;
        drop(batch);
        let seconds = started.elapsed().as_secs_f64();
        run.heap_peak_with_update = run
            .heap_peak_with_update
            .max(meter.peak()?.saturating_sub(heap_base));
        if verbose {
            bar.suspend(|| {
                println!(
                    "step {k:>4}  loss {:>9.5}  {:>8.3} s  live peak {}",
                    report.loss,
                    seconds,
                    format_bytes(report.measured_peak)
                )
            });
        }
        bar.set_message(format!("loss {:.4}", report.loss));
        bar.inc(1);
        run.step_seconds.push(seconds);
        run.reports.push(report);
        if checksum_after == Some(k + 1) {
            run.checksum_at = Some(params_checksum(exec)?);
        }
    }
    Ok(run)
}

fn progress_bar(len: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {label} [{{bar:30}}] {{pos}}/{{len}} steps {{msg}} {{elapsed}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

/// Runs `checkmate train`.
pub fn run(mut args: TrainArgs) -> Result<()> {
    // Operator-level graphs by default on the CPU (docs/OP_GRAPHS.md).
    args.model.settle_granularity(&args.device)?;
    let name = args
        .model
        .model
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--model is required (vgg16, resnet50, mlp, ...)"))?;
    anyhow::ensure!(args.steps >= 1, "--steps must be at least 1");
    let device = parse_device(&args.device)?;
    let net = checkmate_models::model_by_name(&name, &args.model.model_config()?)?;
    let training = args.model.training_config()?;
    let new_exec = || Executor::new(net.clone(), &training, &device, DType::F32, args.seed);
    if device.is_cpu() {
        // gemm's per-thread buffers live as long as the process: part of the baseline.
        heap::warm_up_cpu()?;
    }
    // The process heap on the CPU, the device's memory pool on CUDA.
    let meter = checkmate_executor::Meter::for_device(&device)?;
    let heap_start = meter.current()?;
    let mut exec = new_exec()?;
    let graph = exec.graph().clone();
    let chosen = choose_plan(&args, &graph)?;
    let sim = simulate(&graph, &chosen.plan)?;
    let baseline_plan = checkpoint_all_plan(&graph)?;
    let baseline_sim = simulate(&graph, &baseline_plan)?;
    // With fused convolutions and poolings the graph computes more than the unfused one (each
    // pooling recomputes its convolution at the winners): overheads count from the unfused
    // graph's cost, what training without the fusion computes.
    let reference_cost = if training.fuse_conv_pool {
        let unfused = TrainingConfig {
            fuse_conv_pool: false,
            ..training.clone()
        };
        net.training_graph(&unfused)
            .map(|t| t.graph.total_cost())
            .unwrap_or(baseline_sim.cost)
    } else {
        baseline_sim.cost
    };
    let heap_before_data = meter.current()?;
    let data = Dataset::open(&exec, args.data.as_deref(), args.seed)?;
    // The heap high-water marks count what training holds, not the dataset or the graph.
    let heap_base = heap_start + meter.current()?.saturating_sub(heap_before_data);
    let kind = args.model.optimizer.kind(args.lr)?;
    if !args.json {
        println!(
            "model        {name} (batch {}, {} nodes), data {}",
            net.input().shape.dims()[0],
            graph.len(),
            data.describe()
        );
        println!(
            "plan         {} ({}), solved in {:.2} s",
            chosen.strategy, chosen.status, chosen.solve_seconds
        );
    }

    // Checkpoint-all first, then the plan from the same initial weights (a fresh executor), so
    // the two heap peaks are comparable and the weights can be compared bitwise.
    let baseline_steps = args.baseline_steps.min(args.steps);
    let mut baseline: Option<Run> = None;
    if baseline_steps > 0 {
        let bar = progress_bar(baseline_steps, "checkpoint-all");
        // The reference a user compares with is checkpoint-all of the layer graph (what training
        // without any of this holds): at operator level its steps run on the layer graph, FLOP
        // costs (only its heap, time and weights are reported).
        let (mut base_exec, base_plan) = if training.granularity == Granularity::Op {
            drop(exec);
            let layer = TrainingConfig {
                granularity: Granularity::Layer,
                costs: checkmate_models::Costs::Flops,
                ..training.clone()
            };
            let e = Executor::new(net.clone(), &layer, &device, DType::F32, args.seed)?;
            let plan = checkpoint_all_plan(e.graph())?;
            (e, plan)
        } else {
            (exec, baseline_plan)
        };
        baseline = Some(run_steps(
            &mut base_exec,
            &base_plan,
            &data,
            &mut Optimizer::new(kind)?,
            baseline_steps,
            Some(baseline_steps),
            heap_base,
            &bar,
            false,
        )?);
        bar.finish_and_clear();
        drop(base_exec);
        exec = new_exec()?;
    }

    if args.enforce_budget {
        let limit = chosen.budget_bytes.ok_or_else(|| {
            anyhow::anyhow!("--enforce-budget needs a budget: the plan file states none")
        })?;
        exec.set_heap_limit(Some(checkmate_executor::HeapLimit {
            base: heap_base,
            limit,
        }))?;
    }
    let bar = progress_bar(args.steps, &chosen.strategy);
    let run = run_steps(
        &mut exec,
        &chosen.plan,
        &data,
        &mut Optimizer::new(kind)?,
        args.steps,
        (baseline_steps > 0).then_some(baseline_steps),
        heap_base,
        &bar,
        !args.json,
    )?;
    bar.finish_and_clear();
    let checksum = params_checksum(&exec)?;
    report(
        &args,
        &name,
        &graph,
        &chosen,
        &sim,
        &baseline_sim,
        reference_cost,
        &run,
        baseline,
        checksum,
    );
    Ok(())
}

/// Checkpoint-all's plan for `graph`.
pub fn checkpoint_all_plan(graph: &Graph) -> Result<Plan> {
    use checkmate_solver::Strategy;
    let outcome = checkmate_solver::baselines::CheckpointAll.plan(
        graph,
        u64::MAX,
        &checkmate_solver::SolveOptions::default(),
    )?;
    outcome
        .plan
        .ok_or_else(|| anyhow::anyhow!("checkpoint-all produced no plan for {}", graph.name()))
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &TrainArgs,
    name: &str,
    graph: &Graph,
    chosen: &ChosenPlan,
    sim: &Simulation,
    baseline_sim: &Simulation,
    reference_cost: f64,
    run: &Run,
    baseline: Option<Run>,
    checksum: u64,
) {
    let losses: Vec<f64> = run.reports.iter().map(|r| r.loss).collect();
    let granularity = args.model.granularity.unwrap_or_default();
    // At operator level the reference steps are checkpoint-all of the layer graph.
    let reference = match granularity {
        Granularity::Op => "checkpoint-all (layer graph)",
        Granularity::Layer => "checkpoint-all",
    };
    let measured_peak = run
        .reports
        .iter()
        .map(|r| r.measured_peak)
        .max()
        .unwrap_or(0);
    let predicted_live_peak = sim.live_after_step.iter().copied().max().unwrap_or(0);
    let static_bytes = graph.static_bytes();
    let predicted_overhead = sim.cost / reference_cost.max(f64::MIN_POSITIVE);
    let step_time = median(steady(&run.step_seconds));
    let base_time = baseline
        .as_ref()
        .and_then(|b| median(steady(&b.step_seconds)));
    let measured_overhead = step_time.zip(base_time).map(|(a, b)| a / b);
    let params_match = baseline
        .as_ref()
        .and_then(|b| b.checksum_at.zip(run.checksum_at))
        .map(|(a, b)| a == b);
    // Measured costs are in seconds: the plan's predicted step time is its cost.
    let predicted_seconds = (graph.cost_unit() == "s").then_some(sim.cost);
    // The step a user waits for: the plan's kernels, the executor's own time per plan step, the
    // update and the batch, when the cost table has them (`checkmate profile` measures them).
    let overheads = match args.model.training_config().map(|t| t.costs) {
        Ok(checkmate_models::Costs::Measured(t)) => t.overheads.for_plan(chosen.plan.steps.len()),
        _ => None,
    };
    let interpreter = overheads.map_or(0.0, |o| o.2);
    let predicted_step_seconds = predicted_seconds
        .zip(overheads)
        .map(|(k, (u, b, e))| k + e + u + b);
    let kernel_seconds: Vec<f64> = run
        .reports
        .iter()
        .map(|r| r.step_seconds.iter().sum())
        .collect();
    if args.json {
        print_json(&json!({
            "model": name,
            "batch": args.model.batch,
            "device": args.device,
            "strategy": chosen.strategy,
            "status": chosen.status,
            "granularity": granularity.name(),
            "baseline_granularity": "layer",
            "steps": args.steps,
            "losses": losses,
            "step_seconds": run.step_seconds,
            "kernel_seconds": kernel_seconds,
            "predicted_seconds": predicted_seconds,
            "predicted_step_seconds": predicted_step_seconds,
            "predicted_update_seconds": overheads.map(|o| o.0),
            "predicted_batch_seconds": overheads.map(|o| o.1),
            "predicted_interpreter_seconds": overheads.map(|_| interpreter),
            "predicted_peak_bytes": sim.peak_bytes,
            "predicted_live_peak_bytes": predicted_live_peak,
            "measured_peak_bytes": measured_peak,
            "heap_peak_bytes": run.heap_peak,
            "heap_peak_with_update_bytes": run.heap_peak_with_update,
            "static_bytes": static_bytes,
            "budget_bytes": chosen.budget_bytes,
            "checkpoint_all_peak_bytes": baseline_sim.peak_bytes,
            "predicted_cost": sim.cost,
            "cost_unit": graph.cost_unit(),
            "computes": sim.computes,
            "nodes": graph.len(),
            "predicted_overhead": predicted_overhead,
            "measured_overhead": measured_overhead,
            "baseline_step_seconds": baseline.as_ref().map(|b| b.step_seconds.clone()),
            "baseline_heap_peak_bytes": baseline.as_ref().map(|b| b.heap_peak),
            "baseline_heap_peak_with_update_bytes": baseline.as_ref().map(|b| b.heap_peak_with_update),
            "unmodelled_bytes": run.worst_unmodelled.as_ref().map(|w| w.0),
            "unmodelled_node": run.worst_unmodelled.as_ref().map(|w| w.1.clone()),
            "budget_enforced": args.enforce_budget,
            "params_checksum": format!("{checksum:016x}"),
            "params_match_checkpoint_all": params_match,
            "params_bitwise_expected": !args.model.fuse_conv_pool,
            "solve_seconds": chosen.solve_seconds,
        }));
        return;
    }
    let pct = |a: u64, b: u64| 100.0 * a as f64 / b.max(1) as f64;
    println!("--- summary ---");
    println!("strategy     {} ({})", chosen.strategy, chosen.status);
    if let Some(b) = chosen.budget_bytes {
        println!(
            "budget       {} total ({} static, {} for activations{})",
            format_bytes(b),
            format_bytes(static_bytes),
            format_bytes(b.saturating_sub(static_bytes)),
            if args.enforce_budget && args.plan.is_none() {
                format!(
                    ", of which the plan may use all but a {} heap reserve",
                    format_bytes(checkmate_executor::heap::RESERVE_BYTES)
                )
            } else {
                String::new()
            }
        );
    }
    println!(
        "predicted    peak {} activations ({:.1}% of checkpoint-all's {}), live peak {}",
        format_bytes(sim.peak_bytes),
        pct(sim.peak_bytes, baseline_sim.peak_bytes),
        format_bytes(baseline_sim.peak_bytes),
        format_bytes(predicted_live_peak)
    );
    println!(
        "measured     live peak {} ({}), heap peak {} vs predicted + static {} \
         ({} with the optimizer update)",
        format_bytes(measured_peak),
        if measured_peak == predicted_live_peak {
            "equal to the prediction"
        } else {
            "DIFFERS from the prediction"
        },
        format_bytes(run.heap_peak),
        format_bytes(sim.peak_bytes + static_bytes),
        format_bytes(run.heap_peak_with_update)
    );
    if let Some(b) = &baseline {
        println!(
            "             {reference} heap peak {} (its reference steps run without the cap)",
            format_bytes(b.heap_peak)
        );
    }
    // The comparison a user came for: the process memory of the step, with and without the plan.
    let with_update = run.heap_peak_with_update;
    if let (Some(b), Some(budget)) = (&baseline, chosen.budget_bytes) {
        let side = |heap: u64| {
            if heap <= budget {
                format!("{} under", format_bytes(budget - heap))
            } else {
                format!("{} OVER", format_bytes(heap - budget))
            }
        };
        println!(
            "heap         {reference} {} ({} the budget) -> plan {} ({} the budget): {} less",
            format_bytes(b.heap_peak_with_update),
            side(b.heap_peak_with_update),
            format_bytes(with_update),
            side(with_update),
            format_bytes(b.heap_peak_with_update.saturating_sub(with_update)),
        );
    }
    if let Some((bytes, node)) = &run.worst_unmodelled {
        println!(
            "             unmodelled: at most {} above static + live + workspace (at {node}){}",
            format_bytes(*bytes),
            if args.enforce_budget {
                "; budget enforced on the heap"
            } else {
                ""
            }
        );
    }
    println!(
        "loss         {:.5} -> {:.5} over {} steps",
        losses.first().copied().unwrap_or(f64::NAN),
        losses.last().copied().unwrap_or(f64::NAN),
        args.steps
    );
    println!(
        "time         {} per step (median), predicted overhead {:+.1}% ({} computes for {} nodes)",
        step_time
            .map(|t| format!("{t:.3} s"))
            .unwrap_or_else(|| "-".into()),
        100.0 * (predicted_overhead - 1.0),
        sim.computes,
        graph.len()
    );
    match (predicted_step_seconds, predicted_seconds, overheads, step_time) {
        (Some(p), Some(k), Some((u, b, _)), Some(t)) => println!(
            "             predicted {p:.3} s per step (kernels {k:.3} + executor {interpreter:.3} + \
             update {u:.3} + batch {b:.3}, measured costs), measured {t:.3} s ({:.2}x)",
            t / p
        ),
        (_, Some(k), _, _) => println!(
            "             predicted {k:.3} s per step of kernels from measured costs (no update \
             or batch time in the table: profile again to add them)"
        ),
        _ => {}
    }
    match (measured_overhead, base_time) {
        (Some(o), Some(b)) => println!(
            "             measured overhead {:+.1}% vs {reference} ({b:.3} s per step)",
            100.0 * (o - 1.0)
        ),
        _ => println!("             (no checkpoint-all baseline run: --baseline-steps 0)"),
    }
    match params_match {
        Some(true) => println!(
            "weights      bitwise equal to {reference} after {} steps; checksum {checksum:016x}",
            args.baseline_steps.min(args.steps)
        ),
        Some(false) if args.model.fuse_conv_pool => println!(
            "weights      differ from {reference} after {} steps by rounding: the fused poolings' \
             values are dot products, not the convolution's matrix product (docs/OP_GRAPHS.md); \
             checksum {checksum:016x}",
            args.baseline_steps.min(args.steps)
        ),
        Some(false) => println!(
            "weights      DIFFER from {reference} after {} steps; checksum {checksum:016x}",
            args.baseline_steps.min(args.steps)
        ),
        None => println!("weights      checksum {checksum:016x}"),
    }
}
