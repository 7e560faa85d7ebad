//! `checkmate profile`: time every node of a zoo model's training graph on a device and write a
//! `checkmate-costs/1` table; optionally fit costs over several batch sizes, compare with an
//! earlier profile, and check the table's predictions against real plan runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use checkmate_executor::Executor;
use checkmate_graph::{format_bytes, Budget, NodeKind};
use checkmate_models::{CostTable, Costs, ModelConfig, TrainingConfig};
use checkmate_profiler::{
    check_plans, compare_tables, fit, profile_executor, CostFit, Phase, PlanCheck, Profile,
    ProfileOptions, Progress,
};
use checkmate_solver::{solve, strategy_by_name};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::common::{print_json, resolve_budget, ModelArgs, SolverArgs};
use crate::train_cmd::parse_device;

/// Arguments of `checkmate profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Device: cpu or cuda:N (CUDA needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Timed steps, exactly (default: adaptive, from --min-repeats until the summed medians
    /// reach --target-error or --max-repeats).
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Adaptive mode: timed steps at least.
    #[arg(long, default_value_t = 15)]
    pub min_repeats: usize,
    /// Adaptive mode: timed steps at most.
    #[arg(long, default_value_t = 30)]
    pub max_repeats: usize,
    /// Adaptive mode: target relative standard error of the summed per-node medians.
    #[arg(long, default_value_t = 0.01)]
    pub target_error: f64,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Stop measuring a batch size after this many seconds (once the minimum repeats are done).
    #[arg(long)]
    pub max_seconds: Option<f64>,
    /// Profile these batch sizes and fit `seconds = a + b * batch` per node; the table written
    /// for --batch is the measured one when --batch is among them, else the fitted one.
    #[arg(long, value_delimiter = ',')]
    pub batches: Vec<usize>,
    /// Write the per-node fit (intercept, slope, R^2, residuals) here (with --batches).
    #[arg(long)]
    pub fit_out: Option<PathBuf>,
    /// Write the cost table (checkmate-costs/1 plus per-node spread) here.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Compare with an earlier profile of the same model and batch (repeatability).
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// Check predictions: run these plans (STRATEGY or STRATEGY@BUDGET, e.g. checkpoint-all,
    /// chen-sqrtn, lp-round@60%) at --batch, solved with the table's costs, and compare the sum
    /// of the table's costs over each plan's computes with the measured step time.
    #[arg(long, value_delimiter = ',')]
    pub check_plan: Vec<String>,
    /// Timed runs per checked plan (after one warm-up run).
    #[arg(long, default_value_t = 5)]
    pub check_repeats: usize,
    #[command(flatten)]
    pub solver: SolverArgs,
    /// Slowest nodes shown in the summary.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Seed of the random weights and batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl ProfileArgs {
    fn options(&self) -> Result<ProfileOptions> {
        let time_limit = match self.max_seconds {
            Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
            Some(s) => anyhow::bail!("--max-seconds {s}: give a positive number of seconds"),
            None => None,
        };
        let (min_repeats, max_repeats, target) = match self.repeats {
            Some(r) => {
                anyhow::ensure!(r >= 1, "--repeats must be at least 1");
                (r, r, 0.0)
            }
            None => (self.min_repeats, self.max_repeats, self.target_error),
        };
        anyhow::ensure!(min_repeats >= 1, "--min-repeats must be at least 1");
        anyhow::ensure!(
            max_repeats >= min_repeats,
            "--max-repeats {max_repeats} is below --min-repeats {min_repeats}"
        );
        anyhow::ensure!(
            target.is_finite() && target >= 0.0,
            "--target-error {target}: give a number >= 0 such as 0.01"
        );
        Ok(ProfileOptions {
            warmup: self.warmup,
            min_repeats,
            max_repeats,
            target_rel_error: target,
            time_limit,
            seed: self.seed,
        })
    }

    fn model_name(&self) -> Result<&str> {
        self.model
            .model
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("give --model NAME (one of the zoo models)"))
    }

    /// The profiling configuration (FLOP costs: the graph's costs play no part in profiling).
    fn training(&self) -> Result<TrainingConfig> {
        let mut t = self.model.training_config()?;
        t.costs = Costs::Flops;
        Ok(t)
    }

    fn config_at(&self, batch: usize) -> Result<ModelConfig> {
        let mut c = self.model.model_config()?;
        c.batch = batch;
        Ok(c)
    }
}

/// A progress bar on stderr, hidden with --json.
fn progress_bar(json: bool) -> ProgressBar {
    let bar = if json {
        ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::hidden())
    } else {
        ProgressBar::new(1)
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {pos}/{len} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

fn profile_batch(
    args: &ProfileArgs,
    name: &str,
    batch: usize,
    device: &Device,
    options: &ProfileOptions,
    bar: &ProgressBar,
) -> Result<Profile> {
    let training = args.training()?;
    let net = checkmate_models::model_by_name(name, &args.config_at(batch)?)
        .with_context(|| format!("cannot build model {name:?} at batch {batch}"))?;
    let mut exec = Executor::new(net, &training, device, DType::F32, options.seed)
        .with_context(|| format!("cannot set up {name} at batch {batch}"))?;
    let input = exec.random_batch(options.seed)?;
    bar.set_prefix(format!("{name} b{batch}"));
    bar.set_length((options.warmup + options.max_repeats) as u64);
    bar.set_position(0);
    let warmup = options.warmup;
    let mut profile = profile_executor(
        &mut exec,
        &input,
        name,
        options,
        &mut |p: &Progress| match p.phase {
            Phase::Warmup => {
                bar.set_position(p.done as u64);
                bar.set_message("warm-up");
            }
            Phase::Measure => {
                bar.set_position((warmup + p.done) as u64);
                match p.rel_error {
                    Some(e) => bar.set_message(format!("error {:.1}%", 100.0 * e)),
                    None => bar.set_message("measuring"),
                }
            }
        },
    )
    .with_context(|| format!("profiling {name} at batch {batch} failed"))?;
    // The rest of a training step: the optimizer update and the batch (`train` adds them to the
    // plan's kernels for its predicted step time).
    let kind = args.model.optimizer.kind(None)?;
    let (update, batch_s) = checkmate_profiler::time_update_and_batch(&mut exec, kind, 5)
        .with_context(|| format!("timing the update of {name} at batch {batch}"))?;
    profile.overheads.update_seconds = Some(update);
    profile.overheads.batch_seconds = Some(batch_s);
    Ok(profile)
}

/// One `--check-plan` entry: a strategy and its budget.
fn parse_check(spec: &str) -> Result<(String, Budget)> {
    let (name, budget) = match spec.split_once('@') {
        Some((n, b)) => (n.trim(), b.trim()),
        None => (spec.trim(), "100%"),
    };
    let budget: Budget = budget
        .parse()
        .map_err(|e| anyhow::anyhow!("--check-plan {spec:?}: bad budget: {e}"))?;
    Ok((name.to_string(), budget))
}

struct CheckResult {
    spec: String,
    strategy: String,
    budget_bytes: u64,
    /// The measurement, or why there is none (no plan within the budget).
    check: std::result::Result<PlanCheck, String>,
}

fn run_checks(
    args: &ProfileArgs,
    name: &str,
    device: &Device,
    table: &CostTable,
    bar: &ProgressBar,
) -> Result<Vec<CheckResult>> {
    if args.check_plan.is_empty() {
        return Ok(Vec::new());
    }
    let batch = table.batch;
    let training = args.training()?;
    let net = checkmate_models::model_by_name(name, &args.config_at(batch)?)?;
    // The solvers see the measured costs, so a recomputing plan recomputes cheap nodes.
    let costed = TrainingConfig {
        costs: Costs::Measured(table.clone()),
        ..training.clone()
    };
    let graph = net
        .training_graph(&costed)
        .context("cannot apply the measured costs to the training graph")?
        .graph;
    let mut exec = Executor::new(net, &training, device, DType::F32, args.seed)?;
    let input = exec.random_batch(args.seed)?;
    let options = args.solver.options(args.seed)?;
    let mut out = Vec::new();
    bar.set_prefix(format!("{name} b{batch}"));
    bar.set_length(args.check_plan.len() as u64);
    bar.set_position(0);
    // Solve every plan first, then run them interleaved (same load for all).
    let mut plans = Vec::new();
    for spec in &args.check_plan {
        bar.set_message(format!("solving {spec}"));
        let (strategy_name, budget) = parse_check(spec)?;
        let strategy = strategy_by_name(&strategy_name)?;
        let resolved = resolve_budget(&graph, budget)?;
        let plan = match solve(
            &graph,
            strategy.as_ref(),
            resolved.activation_bytes,
            &options,
        ) {
            Ok(solution) => solution
                .plan
                .ok_or_else(|| format!("{} found no plan", solution.status)),
            Err(e) => Err(e.to_string()),
        };
        out.push(CheckResult {
            spec: spec.clone(),
            strategy: strategy_name,
            budget_bytes: resolved.total_bytes,
            check: Err(String::new()),
        });
        plans.push(plan);
        bar.inc(1);
    }
    bar.set_message("running the plans");
    let runnable: Vec<checkmate_graph::Plan> = plans
        .iter()
        .filter_map(|p| p.as_ref().ok().cloned())
        .collect();
    let mut measured = check_plans(&mut exec, &input, &runnable, table, 1, args.check_repeats)
        .context("--check-plan: running the plans failed")?
        .into_iter();
    for (result, plan) in out.iter_mut().zip(plans) {
        result.check = match plan {
            Ok(_) => Ok(measured.next().expect("one check per runnable plan")),
            Err(e) => Err(e),
        };
    }
    Ok(out)
}

/// For each check, `(predicted / predicted_all) / (measured / measured_all) - 1`, where `_all` is
/// the checkpoint-all check run in the same interleaved rounds: the error of the predicted
/// *relative* cost, insensitive to a machine load that differs between profiling and checking.
fn rel_to_checkpoint_all(checks: &[CheckResult]) -> Vec<Option<f64>> {
    let base = checks.iter().find_map(|c| match &c.check {
        Ok(k) if c.strategy == "checkpoint-all" => Some(*k),
        _ => None,
    });
    checks
        .iter()
        .map(|c| match (&c.check, base) {
            (Ok(k), Some(b)) => Some(
                (k.predicted_seconds / b.predicted_seconds)
                    / (k.measured.median / b.measured.median)
                    - 1.0,
            ),
            _ => None,
        })
        .collect()
}

/// Runs `checkmate profile`.
pub fn run(mut args: ProfileArgs) -> Result<()> {
    let started = Instant::now();
    // The nodes `train` runs by default (operator level on the CPU), so that the cost table
    // names every one of them.
    args.model.settle_granularity(&args.device)?;
    let name = args.model_name()?.to_string();
    let batch = args
        .model
        .batch
        .ok_or_else(|| anyhow::anyhow!("--model {name} needs --batch B"))?;
    anyhow::ensure!(batch > 0, "--batch must be at least 1");
    let options = args.options()?;
    let device = parse_device(&args.device)?;
    let mut batches = args.batches.clone();
    batches.sort_unstable();
    batches.dedup();
    anyhow::ensure!(
        batches.iter().all(|&b| b > 0),
        "--batches: every batch size must be at least 1"
    );
    anyhow::ensure!(
        batches.is_empty() || batches.len() >= 2,
        "--batches needs two or more distinct batch sizes to fit a line"
    );
    anyhow::ensure!(
        args.fit_out.is_none() || !batches.is_empty(),
        "--fit-out needs --batches"
    );
    let to_profile = if batches.is_empty() {
        vec![batch]
    } else {
        batches.clone()
    };
    let bar = progress_bar(args.json);
    let mut profiles = Vec::with_capacity(to_profile.len());
    for &b in &to_profile {
        profiles.push(profile_batch(&args, &name, b, &device, &options, &bar)?);
    }
    let fitted: Option<CostFit> = if batches.is_empty() {
        None
    } else {
        Some(fit(&profiles)?)
    };
    let measured = profiles.iter().find(|p| p.batch == batch);
    let table: CostTable = match (measured, &fitted) {
        (Some(p), _) => p.cost_table(),
        (None, Some(f)) => f.predict(batch),
        (None, None) => unreachable!("--batch is profiled when --batches is empty"),
    };
    // The table must fit the training graph of --batch (names, count and bytes).
    let graph = checkmate_models::model_by_name(&name, &args.config_at(batch)?)?
        .training_graph(&TrainingConfig {
            costs: Costs::Measured(table.clone()),
            ..args.training()?
        })
        .context("the measured table does not fit the training graph")?
        .graph;
    if let Some(path) = &args.output {
        match measured {
            Some(p) => p.write(path),
            None => table.write(path).map_err(checkmate_profiler::Error::from),
        }
        .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let (Some(path), Some(f)) = (&args.fit_out, &fitted) {
        std::fs::write(path, serde_json::to_string_pretty(f)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let agreement = match (&args.compare, measured) {
        (Some(path), Some(p)) => {
            let other = Profile::read(path)
                .with_context(|| format!("cannot read profile {}", path.display()))?;
            Some(p.compare(&other).with_context(|| {
                format!(
                    "cannot compare with {} (another model or batch?)",
                    path.display()
                )
            })?)
        }
        (Some(_), None) => anyhow::bail!("--compare needs --batch to be profiled"),
        _ => None,
    };
    let checks = run_checks(&args, &name, &device, &table, &bar)?;
    let relative = rel_to_checkpoint_all(&checks);
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    // Fitted-vs-measured at every profiled batch (in-sample residuals of the totals).
    let fit_rows: Vec<(usize, f64, f64)> = match &fitted {
        Some(f) => profiles
            .iter()
            .map(|p| {
                let (rel, worst) = compare_tables(&f.predict(p.batch), &p.cost_table())
                    .unwrap_or((f64::NAN, f64::NAN));
                (p.batch, rel, worst)
            })
            .collect(),
        None => Vec::new(),
    };
    let kind_secs = |k: NodeKind| kind_seconds(&graph, &table, k);
    if args.json {
        print_json(&json!({
            "model": name,
            "batch": batch,
            "device": table.device,
            "nodes": table.nodes.len(),
            "measured": measured.is_some(),
            "output": args.output.as_ref().map(|p| p.display().to_string()),
            "total_seconds": table.nodes.iter().map(|n| n.seconds).sum::<f64>(),
            "forward_seconds": kind_secs(NodeKind::Forward),
            "loss_seconds": kind_secs(NodeKind::Loss),
            "backward_seconds": kind_secs(NodeKind::Backward),
            "profiles": profiles.iter().map(|p| json!({
                "batch": p.batch,
                "total_seconds": p.total_seconds(),
                "repeats": p.profile.repeats,
                "rel_error": p.profile.rel_error,
                "step_median_seconds": p.profile.step.median,
                "step_rel_spread": p.profile.step.iqr() / p.profile.step.median,
                "wall_seconds": p.profile.wall_seconds,
                "timer": p.profile.timer,
                "workspace": p.profile.workspace,
            })).collect::<Vec<_>>(),
            "slowest": measured.map(|p| p.slowest(args.top).iter().map(|n| json!({
                "name": n.name, "kind": n.kind, "seconds": n.seconds,
                "rel_spread": n.rel_spread(), "bytes": n.bytes,
            })).collect::<Vec<_>>()),
            "fit": fitted.as_ref().map(|f| json!({
                "batches": f.batches,
                "quality": f.quality,
                "total": f.total,
                "predicted_total_seconds": f.total_at(batch),
                "in_sample": fit_rows.iter().map(|&(b, rel, worst)| json!({
                    "batch": b, "total_rel_error": rel, "worst_major_node_rel_error": worst,
                })).collect::<Vec<_>>(),
            })),
            "compare": agreement,
            "checks": checks.iter().zip(&relative).map(|(c, rel)| match &c.check {
                Ok(k) => json!({
                    "rel_error_vs_checkpoint_all": rel,
                    "plan": c.spec,
                    "strategy": c.strategy,
                    "budget_bytes": c.budget_bytes,
                    "computes": k.computes,
                    "predicted_seconds": k.predicted_seconds,
                    "measured_seconds": k.measured.median,
                    "measured_q1_seconds": k.measured.q1,
                    "measured_q3_seconds": k.measured.q3,
                    "wall_seconds": k.wall.median,
                    "rel_error": k.rel_error,
                }),
                Err(e) => json!({
                    "plan": c.spec,
                    "strategy": c.strategy,
                    "budget_bytes": c.budget_bytes,
                    "error": e,
                }),
            }).collect::<Vec<_>>(),
            "wall_seconds": wall,
        }));
        return Ok(());
    }
    print_human(
        &args,
        &name,
        batch,
        &profiles,
        measured,
        &table,
        &graph,
        fitted.as_ref(),
    );
    for &(b, rel, worst) in &fit_rows {
        println!(
            "  fit at batch {b}: total {:+.1}%, worst node (>=1% of time) {:.1}%",
            100.0 * rel,
            100.0 * worst
        );
    }
    if let Some(a) = agreement {
        println!(
            "compared with {}: totals {:.4} s vs {:.4} s ({:.1}% apart, reported spread {:.1}%: {}); \
             {:.0}% of nodes ({:.0}% of time) within their quartiles",
            args.compare.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            a.total_seconds[0],
            a.total_seconds[1],
            100.0 * a.total_rel_diff,
            100.0 * a.total_rel_spread,
            if a.totals_agree { "agree" } else { "DISAGREE" },
            100.0 * a.nodes_within_spread,
            100.0 * a.time_within_spread
        );
    }
    if !checks.is_empty() {
        println!(
            "\n{:<24} {:>12} {:>9} {:>12} {:>12} {:>8}",
            "plan", "budget", "computes", "predicted", "measured", "error"
        );
        for (c, rel) in checks.iter().zip(&relative) {
            match &c.check {
                Ok(k) => println!(
                    "{:<24} {:>12} {:>9} {:>10.4} s {:>10.4} s {:>+7.1}%{}",
                    c.spec,
                    format_bytes(c.budget_bytes),
                    k.computes,
                    k.predicted_seconds,
                    k.measured.median,
                    100.0 * k.rel_error,
                    match rel {
                        Some(r) if c.strategy != "checkpoint-all" => {
                            format!("  (relative to checkpoint-all {:+.1}%)", 100.0 * r)
                        }
                        _ => String::new(),
                    }
                ),
                Err(e) => println!(
                    "{:<24} {:>12} no plan: {e}",
                    c.spec,
                    format_bytes(c.budget_bytes)
                ),
            }
        }
    }
    if let Some(path) = &args.output {
        println!("cost table   {}", path.display());
    }
    println!("{wall:.1} s");
    Ok(())
}

/// Seconds of one kind of node (forward, loss, backward) in `table`.
fn kind_seconds(graph: &checkmate_graph::Graph, table: &CostTable, kind: NodeKind) -> f64 {
    graph
        .nodes()
        .iter()
        .zip(&table.nodes)
        .filter(|(n, _)| n.kind == kind)
        .map(|(_, c)| c.seconds)
        .sum()
}

#[allow(clippy::too_many_arguments)]
fn print_human(
    args: &ProfileArgs,
    name: &str,
    batch: usize,
    profiles: &[Profile],
    measured: Option<&Profile>,
    table: &CostTable,
    graph: &checkmate_graph::Graph,
    fitted: Option<&CostFit>,
) {
    println!("{name} at batch {batch} on {}", table.device);
    for p in profiles {
        println!(
            "  batch {:>4}: {} timed steps after {} warm-up, step {:.4} s (IQR {:.1}%), summed \
             medians {:.4} s +- {:.1}%",
            p.batch,
            p.profile.repeats,
            p.profile.warmup,
            p.profile.step.median,
            100.0 * p.profile.step.iqr() / p.profile.step.median,
            p.total_seconds(),
            100.0 * p.profile.rel_error
        );
    }
    let total: f64 = table.nodes.iter().map(|n| n.seconds).sum();
    if let Some(p) = measured {
        println!(
            "\n{:<28} {:<8} {:>11} {:>7} {:>6} {:>11}",
            "slowest nodes", "kind", "median", "IQR", "share", "bytes"
        );
        for n in p.slowest(args.top) {
            println!(
                "{:<28} {:<8} {:>8.3} ms {:>6.1}% {:>5.1}% {:>11}",
                n.name,
                n.kind,
                1e3 * n.seconds,
                100.0 * n.rel_spread(),
                100.0 * n.seconds / total,
                format_bytes(n.bytes)
            );
        }
        println!("workspace: {}", p.profile.workspace);
    } else {
        println!("(batch {batch} was not profiled: costs from the fit)");
    }
    println!(
        "\nforward {:.4} s + loss {:.4} s + backward {:.4} s = {:.4} s per checkpoint-all step ({} nodes)",
        kind_seconds(graph, table, NodeKind::Forward),
        kind_seconds(graph, table, NodeKind::Loss),
        kind_seconds(graph, table, NodeKind::Backward),
        total,
        table.nodes.len()
    );
    if let Some(f) = fitted {
        println!(
            "fit over batches {:?}: step = {:.3e} + {:.3e} * batch s (R^2 {:.4}); per node median \
             R^2 {:.3}, time-weighted R^2 {:.3}, worst residual {:.1}% (nodes >= 1% of time), \
             {:.1}% (any)",
            f.batches,
            f.total.intercept,
            f.total.slope,
            f.quality.total_r2,
            f.quality.median_node_r2,
            f.quality.weighted_node_r2,
            100.0 * f.quality.max_rel_residual_major,
            100.0 * f.quality.max_rel_residual
        );
    }
}
