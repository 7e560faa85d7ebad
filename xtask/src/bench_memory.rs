//! `cargo xtask bench memory`: the process heap of real training steps against the plan's
//! prediction and the budget, for zoo models, batch sizes, strategies and budgets, written to
//! `docs/MEMORY_BENCH.md`.
//!
//! Each point is one `checkmate train --json` process (the budget enforced on the heap, as by
//! default): two checkpoint-all reference steps from the same weights, then `--steps` steps of the
//! plan. Reported per point: the budget, the predicted total (static + the plan's peak with
//! workspace), the measured heap peak of the plan's steps (update included) and of checkpoint-all,
//! and whether the heap stayed within the budget and within 3% + 1 MiB of the prediction. Points
//! where the strategy has no plan within the budget are listed as such.
//!
//! Options: `--models a,b` (default every zoo model), `--batches 2,4`, `--strategies ...`
//! (default checkpoint-all, chen-sqrtn, chen-greedy, ap-greedy, griewank, lp-round, milp),
//! `--budgets 100,80,60,40` (percent of checkpoint-all's activation peak), `--steps N` (2),
//! `--time-limit SEC` (10, for milp and lp-round), `--out FILE`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

struct Args {
    models: Vec<String>,
    batches: Vec<usize>,
    strategies: Vec<String>,
    budgets: Vec<u32>,
    steps: u32,
    time_limit: f64,
    out: PathBuf,
}

const STRATEGIES: &[&str] = &[
    "checkpoint-all",
    "chen-sqrtn",
    "chen-greedy",
    "ap-greedy",
    "griewank",
    "lp-round",
    "milp",
];

fn list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("{what}: cannot read {x:?}"))
        })
        .collect()
}

fn parse(args: &[String]) -> Result<Args> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut a = Args {
        models: checkmate_models::MODEL_NAMES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        batches: vec![2, 4],
        strategies: STRATEGIES.iter().map(|s| s.to_string()).collect(),
        budgets: vec![100, 80, 60, 40],
        steps: 2,
        time_limit: 10.0,
        out: root.join("docs/MEMORY_BENCH.md"),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--models" => a.models = list(&value()?, "--models")?,
            "--batches" => a.batches = list(&value()?, "--batches")?,
            "--strategies" => a.strategies = list(&value()?, "--strategies")?,
            "--budgets" => a.budgets = list(&value()?, "--budgets")?,
            "--steps" => a.steps = value()?.parse().context("--steps")?,
            "--time-limit" => a.time_limit = value()?.parse().context("--time-limit")?,
            "--out" => a.out = PathBuf::from(value()?),
            other => bail!(
                "unknown option {other:?}; known: --models, --batches, --strategies, --budgets, \
                 --steps, --time-limit, --out"
            ),
        }
    }
    Ok(a)
}

/// Size flags per model: small enough that a point takes seconds on 2 cores.
fn size_flags(model: &str) -> Vec<&'static str> {
    match model {
        "unet" | "fcn8" | "segnet" => vec!["--image-size", "64"],
        "mlp" => vec![],
        "transformer" => vec!["--seq-len", "64"],
        _ => vec!["--image-size", "32"],
    }
}

/// One point's outcome.
struct Point {
    model: String,
    batch: usize,
    strategy: String,
    budget_pct: u32,
    result: std::result::Result<Measured, String>,
}

struct Measured {
    budget: u64,
    predicted_total: u64,
    heap: u64,
    checkpoint_all_heap: Option<u64>,
    checkpoint_all_predicted: u64,
    unmodelled: Option<u64>,
}

impl Measured {
    /// Checkpoint-all's heap minus the plan's (negative when the plan's is higher) and the
    /// predicted saving, where the prediction is at least 1 MiB (smaller savings are within the
    /// measurement's slack) and checkpoint-all's reference steps ran.
    fn saving(&self) -> Option<(f64, u64)> {
        let predicted = self
            .checkpoint_all_predicted
            .checked_sub(self.predicted_total)?;
        let measured = self.checkpoint_all_heap? as f64 - self.heap as f64;
        (predicted >= 1 << 20).then_some((measured, predicted))
    }
}

/// " (met)" or " (**missed**)" after a target's figures.
fn verdict(met: bool) -> &'static str {
    if met {
        " (met)"
    } else {
        " (**missed**)"
    }
}

fn train(bin: &Path, a: &Args, model: &str, batch: usize, strategy: &str, pct: u32) -> Point {
    let mut cmd = Command::new(bin);
    cmd.args(["train", "--model", model, "--batch", &batch.to_string()])
        .args(size_flags(model))
        .args(["--classes", "10", "--strategy", strategy])
        .args(["--budget", &format!("{pct}%")])
        .args(["--steps", &a.steps.to_string(), "--baseline-steps", "2"])
        .args(["--time-limit", &a.time_limit.to_string(), "--threads", "1"])
        .arg("--json");
    let out = cmd.output();
    let result = match out {
        Err(e) => Err(format!("could not run: {e}")),
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).to_string();
            let parsed = text
                .lines()
                .last()
                .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
            match parsed {
                Some(v) if o.status.success() => {
                    let get = |k: &str| v[k].as_u64().unwrap_or(0);
                    Ok(Measured {
                        budget: get("budget_bytes"),
                        predicted_total: get("static_bytes") + get("predicted_peak_bytes"),
                        heap: get("heap_peak_with_update_bytes"),
                        checkpoint_all_heap: v["baseline_heap_peak_bytes"].as_u64(),
                        checkpoint_all_predicted: get("static_bytes")
                            + get("checkpoint_all_peak_bytes"),
                        unmodelled: v["unmodelled_bytes"].as_u64(),
                    })
                }
                _ => {
                    let err = String::from_utf8_lossy(&o.stderr);
                    let line = err
                        .lines()
                        .rev()
                        .find(|l| l.starts_with("error"))
                        .unwrap_or("failed");
                    Err(
                        if line.contains("too small") || line.contains("found no plan") {
                            "no plan within the budget".to_string()
                        } else {
                            line.chars().take(160).collect()
                        },
                    )
                }
            }
        }
    };
    Point {
        model: model.into(),
        batch,
        strategy: strategy.into(),
        budget_pct: pct,
        result,
    }
}

/// Runs the benchmark (see the module docs).
pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = root.join("target/release/checkmate");
    if !bin.exists() {
        bail!("{} is missing: cargo xtask bench builds it", bin.display());
    }
    let total = a.models.len() * a.batches.len() * a.strategies.len() * a.budgets.len();
    let mut points = Vec::with_capacity(total);
    for model in &a.models {
        for &batch in &a.batches {
            for strategy in &a.strategies {
                for &pct in &a.budgets {
                    let p = train(&bin, &a, model, batch, strategy, pct);
                    eprintln!(
                        "[{}/{total}] {model} batch {batch} {strategy} {pct}%: {}",
                        points.len() + 1,
                        match &p.result {
                            Ok(m) => format!("heap {} of budget {}", mib(m.heap), mib(m.budget)),
                            Err(e) => e.clone(),
                        }
                    );
                    points.push(p);
                }
            }
        }
    }
    write_report(&a, &points)
}

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / (1u64 << 20) as f64)
}

/// Within 3% + 1 MiB of the prediction.
fn close(heap: u64, predicted: u64) -> bool {
    (heap as f64 - predicted as f64).abs() <= 0.03 * predicted as f64 + (1u64 << 20) as f64
}

fn write_report(a: &Args, points: &[Point]) -> Result<()> {
    let ok: Vec<(&Point, &Measured)> = points
        .iter()
        .filter_map(|p| p.result.as_ref().ok().map(|m| (p, m)))
        .collect();
    let within = ok.iter().filter(|(_, m)| m.heap <= m.budget).count();
    let near = ok
        .iter()
        .filter(|(_, m)| close(m.heap, m.predicted_total))
        .count();
    let worst_over = ok
        .iter()
        .map(|(_, m)| m.heap as f64 / m.predicted_total.max(1) as f64)
        .fold(0.0, f64::max);
    // Saving: checkpoint-all's heap minus the plan's, against the predicted saving.
    let savings: Vec<(&Point, f64)> = ok
        .iter()
        .filter_map(|(p, m)| {
            m.saving()
                .map(|(measured, predicted)| (*p, measured / predicted as f64))
        })
        .collect();
    let saving_ok = savings
        .iter()
        .filter(|(_, r)| (r - 1.0).abs() <= 0.05)
        .count();
    // The four models, and the largest absolute miss (the heap's slack is fixed bytes, so
    // small savings miss in relative terms first).
    let four = ["vgg16", "resnet50", "mobilenet", "unet"];
    let on_four: Vec<f64> = savings
        .iter()
        .filter(|(p, _)| four.contains(&p.model.as_str()))
        .map(|(_, r)| *r)
        .collect();
    let four_ok = on_four.iter().filter(|r| (*r - 1.0).abs() <= 0.05).count();
    let worst_abs = ok
        .iter()
        .filter_map(|(_, m)| m.saving())
        .map(|(measured, predicted)| (measured - predicted as f64).abs())
        .fold(0.0, f64::max);
    let mut md = String::new();
    writeln!(md, "# Process heap of real training steps\n")?;
    writeln!(
        md,
        "Generated by `cargo xtask bench memory` (xtask/src/bench_memory.rs); do not edit by hand. \
         Run {} on {}. Each point is one `checkmate train --json` process: two checkpoint-all \
         reference steps (the second holds the optimizer state, as the plan's steps do), then {} \
         steps of the plan with the budget enforced on the heap (the \
         plan solved for the budget less the 2 MiB heap reserve; a percentage budget is static + \
         that share of checkpoint-all's activation peak + the reserve). `milp` and `lp-round`: \
         {} s, one thread. Heap: the high-water mark of the plan's steps and updates above the \
         program's own memory. Predicted: static + the plan's simulated peak with workspace.\n",
        crate::bench_results::date(),
        crate::bench_results::machine(),
        a.steps,
        a.time_limit
    )?;
    writeln!(md, "## Targets\n")?;
    writeln!(
        md,
        "- Heap within the budget: {within} of {} points with a plan{}.",
        ok.len(),
        verdict(within == ok.len())
    )?;
    writeln!(
        md,
        "- Heap within 3% + 1 MiB of the predicted total: {near} of {}{}; the largest heap / \
         prediction {worst_over:.3}.",
        ok.len(),
        verdict(near == ok.len())
    )?;
    writeln!(
        md,
        "- Checkpoint-all's heap minus the plan's within 5% of the predicted saving (where it is at \
         least 1 MiB): {saving_ok} of {}{}.",
        savings.len(),
        verdict(saving_ok == savings.len())
    )?;
    writeln!(
        md,
        "  On VGG16, ResNet50, MobileNet and U-Net: {four_ok} of {}; the largest absolute \
         difference anywhere {} MiB.",
        on_four.len(),
        mib(worst_abs as u64)
    )?;
    writeln!(
        md,
        "- Points without a plan within the budget: {} of {} (layer-level graphs leave little \
         room below checkpoint-all at these sizes: the lean-graphs issue).\n",
        points.len() - ok.len(),
        points.len()
    )?;
    writeln!(md, "## Every point (MiB)\n")?;
    writeln!(
        md,
        "| model | batch | strategy | budget | total budget | predicted | heap | heap / predicted | \
         checkpoint-all heap | saving measured / predicted | worst unmodelled |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for p in points {
        match &p.result {
            Ok(m) => {
                let saving = m.saving().map(|(measured, predicted)| {
                    format!("{} / {}", mib(measured.max(0.0) as u64), mib(predicted))
                });
                writeln!(
                    md,
                    "| {} | {} | {} | {}% | {} | {} | {}{} | {:.3} | {} | {} | {} |",
                    p.model,
                    p.batch,
                    p.strategy,
                    p.budget_pct,
                    mib(m.budget),
                    mib(m.predicted_total),
                    mib(m.heap),
                    if m.heap > m.budget { " (over)" } else { "" },
                    m.heap as f64 / m.predicted_total.max(1) as f64,
                    m.checkpoint_all_heap.map_or("-".into(), mib),
                    saving.unwrap_or_else(|| "-".into()),
                    m.unmodelled.map_or("-".into(), mib),
                )?;
            }
            Err(e) => writeln!(
                md,
                "| {} | {} | {} | {}% | {e} | | | | | | |",
                p.model, p.batch, p.strategy, p.budget_pct
            )?,
        }
    }
    std::fs::write(&a.out, md).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
