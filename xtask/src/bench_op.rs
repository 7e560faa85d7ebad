//! `cargo xtask bench op`: operator-level training graphs (docs/OP_GRAPHS.md) against the
//! layer-level checkpoint-all that training without rematerialization holds, at MONeT's batch sizes
//! (Shah et al., ICLR 2021: VGG16 176, ResNet50 184, MobileNet 272 at 224x224; U-Net 11 at its
//! own 416x608), then confirmed by real training steps at sizes this machine holds. Writes its
//! section of `docs/RESULTS.md` (between the `op-graphs` markers; `cargo xtask bench results`
//! keeps it).
//!
//! Predicted part, per model: the layer graph's checkpoint-all total (static + activation peak,
//! workspace counted) is the reference `T`; the operator graph's checkpoint-all and least feasible
//! totals; `lp-round` (30 s per budget, 1 thread) at budgets of 0.25 to 0.70 of `T` and at
//! MONeT's ratio; at the target ratio also `milp` (120 s), the cheaper plan kept. Overhead: plan cost / the operator graph's cost with every node computed once
//! (FLOPs). The largest batch in 16 GiB (`checkmate max-batch`, at most one extra forward pass,
//! no confirming step): checkpoint-all of the layer graph against `lp-round` on the operator graph.
//!
//! Measured part: `checkmate train` (operator graph, `lp-round`, 2 plan steps after 2 reference
//! steps of the layer graph's checkpoint-all) at budgets of static memory plus fractions of the
//! layer graph's checkpoint-all activation peak, the process heap (optimizer update included)
//! measured by the counting allocator.
//! Options: `--quick` (fewer budgets, 10 s limits), `--train-only` (the measured part again, with
//! the predicted tables of the last run, kept in target/bench-op/predicted.json), `--out FILE`
//! (default docs/RESULTS.md).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use checkmate_graph::Graph;
use checkmate_models::{build_training_graph, Granularity, ImageSize, ModelConfig, TrainingConfig};
use checkmate_solver::baselines::CheckpointAll;
use serde_json::Value;

use crate::bench_results::{gib, mib};

/// `milp`'s time limit at the target ratio, seconds.
const MILP_LIMIT: u64 = 120;

/// Markers of this bench's section in docs/RESULTS.md.
pub const BEGIN: &str = "<!-- op-graphs:begin -->";
/// End marker.
pub const END: &str = "<!-- op-graphs:end -->";

/// One model at MONeT's size, with MONeT's reported point (its memory over PyTorch's, and its
/// compute overhead).
#[derive(Clone, Copy)]
struct Spec {
    model: &'static str,
    batch: usize,
    image: Option<usize>,
    monet_ratio: f64,
    monet_overhead: f64,
    /// The target: ratio and overhead bound.
    target: (f64, Option<f64>),
    /// Operator graph with each convolution fused with its max pooling
    /// (`TrainingConfig::fuse_conv_pool`, `--fuse-conv-pool`).
    fused: bool,
}

const SPECS: &[Spec] = &[
    Spec {
        model: "vgg16",
        batch: 176,
        image: Some(224),
        monet_ratio: 5.51 / 14.12,
        monet_overhead: 0.091,
        target: (0.39, Some(0.10)),
        fused: false,
    },
    Spec {
        model: "resnet50",
        batch: 184,
        image: Some(224),
        monet_ratio: 4.99 / 15.06,
        monet_overhead: 0.12,
        target: (0.33, Some(0.12)),
        fused: false,
    },
    Spec {
        model: "mobilenet",
        batch: 272,
        image: Some(224),
        monet_ratio: 5.01 / 14.46,
        monet_overhead: 0.087,
        target: (0.35, None),
        fused: false,
    },
    Spec {
        model: "unet",
        batch: 11,
        image: None,
        monet_ratio: 5.01 / 14.32,
        monet_overhead: 0.115,
        target: (0.35, Some(0.12)),
        fused: false,
    },
];

/// Models with a convolution that a max pooling alone follows: their operator graphs run a second
/// time with `--fuse-conv-pool` (ResNet50's and MobileNet's would be unchanged).
const FUSED_MODELS: &[&str] = &["vgg16", "unet"];

/// [`SPECS`], each followed by its fused variant where [`FUSED_MODELS`] has it.
fn specs() -> Vec<Spec> {
    SPECS
        .iter()
        .flat_map(|s| {
            let fused = FUSED_MODELS
                .contains(&s.model)
                .then_some(Spec { fused: true, ..*s });
            std::iter::once(*s).chain(fused)
        })
        .collect()
}

impl Spec {
    /// The model and batch, and whether fused.
    fn label(&self) -> String {
        format!(
            "{} b{}{}",
            self.model,
            self.batch,
            if self.fused { ", fused conv-pool" } else { "" }
        )
    }
}

/// Real training at sizes this machine holds: model flags and budgets (fractions of the layer
/// graph's checkpoint-all total).
const TRAIN: &[(&str, &[&str])] = &[
    (
        "vgg16 64x64, 512-unit classifier, batch 16",
        &[
            "--model",
            "vgg16",
            "--image-size",
            "64",
            "--width",
            "512",
            "--classes",
            "10",
            "--batch",
            "16",
        ],
    ),
    (
        "resnet50 64x64, batch 8",
        &[
            "--model",
            "resnet50",
            "--image-size",
            "64",
            "--classes",
            "10",
            "--batch",
            "8",
        ],
    ),
    (
        "mobilenet 64x64, batch 16",
        &[
            "--model",
            "mobilenet",
            "--image-size",
            "64",
            "--classes",
            "10",
            "--batch",
            "16",
        ],
    ),
    (
        "unet 128x128, batch 2",
        &["--model", "unet", "--image-size", "128", "--batch", "2"],
    ),
];

struct Args {
    quick: bool,
    train_only: bool,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<Args> {
    let root = crate::workspace_root();
    let mut a = Args {
        quick: false,
        train_only: false,
        out: root.join("docs/RESULTS.md"),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--train-only" => a.train_only = true,
            "--out" => a.out = PathBuf::from(it.next().context("--out needs a file")?),
            other => bail!("unknown option {other}; see xtask/src/bench_op.rs"),
        }
    }
    Ok(a)
}

/// Runs `checkmate ARGS`; the last stdout line as JSON, or the last stderr line as the error.
pub(crate) fn checkmate(bin: &Path, args: &[String]) -> Result<Value, String> {
    eprintln!("  $ checkmate {}", args.join(" "));
    let t0 = Instant::now();
    let out = Command::new(bin)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    eprintln!("    {:.1} s", t0.elapsed().as_secs_f64());
    let stdout = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str::<Value>(stdout.lines().last().unwrap_or("")) {
        Ok(v) if out.status.success() => Ok(v),
        _ => Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim()
            .to_string()),
    }
}

fn graph(spec: &Spec, granularity: Granularity) -> Result<Graph> {
    let mut c = ModelConfig::new(spec.batch);
    if let Some(s) = spec.image {
        c = c.with_image_size(ImageSize::square(s));
    }
    let t = TrainingConfig {
        granularity,
        fuse_conv_pool: spec.fused && granularity == Granularity::Op,
        ..TrainingConfig::default()
    };
    Ok(build_training_graph(spec.model, &c, &t)?)
}

/// The least total budget `lp-round` finds a plan for: from its refusal of a budget just above
/// static memory ("no schedule fits in less than N activation bytes").
fn least_feasible(bin: &Path, path: &Path, g: &Graph) -> Option<u64> {
    let args = lp_round_args(path, g.static_bytes() + (1 << 20), 30);
    let err = checkmate(bin, &args).err()?;
    let tail = err.split("no schedule fits in less than ").nth(1)?;
    let n: u64 = tail.split_whitespace().next()?.parse().ok()?;
    Some(n + g.static_bytes())
}

/// One point on the operator graph: `lp-round`'s, or at the target ratio the cheaper of
/// `lp-round`'s and `milp`'s.
struct Point {
    fraction: f64,
    /// The strategy whose plan this is.
    by: &'static str,
    total: Option<u64>,
    overhead: Option<f64>,
    seconds: Option<f64>,
    error: Option<String>,
}

/// `checkmate solve` arguments: `lp-round` on `path` at `total` bytes, one thread, JSON.
fn lp_round_args(path: &Path, total: u64, limit: u64) -> Vec<String> {
    solve_args("lp-round", path, total, limit)
}

/// `checkmate solve` arguments: `strategy` on `path` at `total` bytes, one thread, JSON.
fn solve_args(strategy: &str, path: &Path, total: u64, limit: u64) -> Vec<String> {
    [
        "solve",
        "--graph",
        &path.display().to_string(),
        "--strategy",
        strategy,
        "--budget",
        &total.to_string(),
        "--time-limit",
        &limit.to_string(),
        "--threads",
        "1",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `strategy`'s plan at `total` bytes; its overhead over `reference_cost` (the layer graph's
/// cost with every node computed once).
fn solve_point(
    bin: &Path,
    strategy: &'static str,
    path: &Path,
    (total, fraction): (u64, f64),
    limit: u64,
    reference_cost: f64,
) -> Point {
    let args = solve_args(strategy, path, total, limit);
    match checkmate(bin, &args) {
        Ok(v) => Point {
            fraction,
            by: strategy,
            total: v["total_peak_bytes"].as_u64(),
            overhead: v["cost"].as_f64().map(|c| c / reference_cost - 1.0),
            seconds: v["solve_seconds"].as_f64(),
            error: None,
        },
        Err(e) => Point {
            fraction,
            by: strategy,
            total: None,
            overhead: None,
            seconds: None,
            error: Some(e),
        },
    }
}

fn max_batch(
    bin: &Path,
    model: &str,
    granularity: &str,
    strategy: &str,
    fused: bool,
) -> Option<u64> {
    let mut args: Vec<String> = [
        "max-batch",
        "--model",
        model,
        "--memory",
        "16GiB",
        "--granularity",
        granularity,
        "--strategies",
        strategy,
        "--max-extra-forwards",
        "1",
        "--time-limit",
        "20",
        "--no-confirm",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if fused {
        args.push("--fuse-conv-pool".into());
    }
    let v = checkmate(bin, &args).ok()?;
    v["strategies"]
        .as_array()?
        .iter()
        .find(|s| s["strategy"] == strategy)?["max_batch"]
        .as_u64()
}

/// Runs the benchmark and writes its section.
pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let t0 = Instant::now();
    let root = crate::workspace_root();
    let bin = root.join("target/release/checkmate");
    let dir = root.join("target/bench-op");
    std::fs::create_dir_all(&dir)?;
    let limit = if a.quick { 10 } else { 30 };
    let milp_limit = if a.quick { 30 } else { MILP_LIMIT };
    let fractions: &[f64] = if a.quick {
        &[0.3, 0.4, 0.5]
    } else {
        &[0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7]
    };
    let mut summary = String::new();
    let mut frontiers = String::new();
    let mut batches = String::new();
    let stored = dir.join("predicted.json");
    let mut predicted_meta = format!(
        "{}, {}",
        crate::bench_results::machine(),
        crate::bench_results::date()
    );
    if a.train_only {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(&stored)
                .context("--train-only needs a full run first (target/bench-op/predicted.json)")?,
        )?;
        summary = v["summary"].as_str().unwrap_or_default().to_string();
        frontiers = v["frontiers"].as_str().unwrap_or_default().to_string();
        batches = v["batches"].as_str().unwrap_or_default().to_string();
        predicted_meta = v["meta"].as_str().unwrap_or_default().to_string();
    }
    let specs = if a.train_only { Vec::new() } else { specs() };
    for spec in &specs {
        let layer = graph(spec, Granularity::Layer)?;
        let op = graph(spec, Granularity::Op)?;
        let path = dir.join(format!(
            "{}-op{}.json",
            spec.model,
            if spec.fused { "-fused" } else { "" }
        ));
        op.write(&path)?;
        let reference = (layer.static_bytes() + CheckpointAll::peak_bytes(&layer)) as f64;
        let reference_cost = layer.total_cost();
        let op_all = (op.static_bytes() + CheckpointAll::peak_bytes(&op)) as f64;
        let floor = least_feasible(&bin, &path, &op);
        let mut points: Vec<Point> = Vec::new();
        let mut wanted: Vec<f64> = fractions.to_vec();
        wanted.push(spec.monet_ratio);
        wanted.push(spec.target.0);
        wanted.sort_by(f64::total_cmp);
        wanted.dedup_by(|x, y| (*x - *y).abs() < 1e-3);
        for f in wanted {
            let total = (reference * f) as u64;
            if floor.is_some_and(|fl| total < fl) {
                points.push(Point {
                    fraction: f,
                    by: "lp-round",
                    total: None,
                    overhead: None,
                    seconds: None,
                    error: Some("below the least feasible budget".into()),
                });
                continue;
            }
            let mut p = solve_point(&bin, "lp-round", &path, (total, f), limit, reference_cost);
            if (f - spec.target.0).abs() < 1e-3 {
                // At the target ratio `milp` too, with a longer limit (it starts from lp-round's
                // plan, and on op-level ResNet50 at 0.33 found +7.3% where lp-round had +19.6%).
                let m = solve_point(&bin, "milp", &path, (total, f), milp_limit, reference_cost);
                if m.overhead
                    .is_some_and(|o| p.overhead.is_none_or(|po| o < po))
                {
                    p = m;
                }
            }
            points.push(p);
        }
        let ratio = |p: &Point| p.total.map(|t| t as f64 / reference);
        // The least memory within MONeT's overhead, and the overhead at the ratio.
        let bound = spec.target.1.unwrap_or(spec.monet_overhead);
        let best = points
            .iter()
            .filter(|p| p.overhead.is_some_and(|o| o <= bound + 1e-9))
            .filter_map(|p| ratio(p).map(|r| (r, p.overhead.unwrap_or(0.0))))
            .min_by(|x, y| x.0.total_cmp(&y.0));
        let at_target = points
            .iter()
            .find(|p| (p.fraction - spec.target.0).abs() < 1e-3)
            .and_then(|p| p.overhead.zip(ratio(p)).map(|(o, r)| (o, r, p.by)));
        let met = match (at_target, spec.target.1) {
            (Some((o, r, _)), Some(b)) => r <= spec.target.0 + 1e-9 && o <= b + 1e-9,
            (Some((_, r, _)), None) => r <= spec.target.0 + 1e-9,
            (None, _) => false,
        };
        let max_t = points
            .iter()
            .filter(|p| p.by == "lp-round")
            .filter_map(|p| p.seconds)
            .fold(0.0, f64::max);
        writeln!(
            summary,
            "| {} | {} / {} | {} | {} ({:.3}x) | {} | {:.2}x at {:+.1}% | {} | {} | {:.0} s |",
            spec.label(),
            layer.len(),
            op.len(),
            gib(reference),
            gib(op_all),
            op_all / reference,
            floor.map_or("-".into(), |f| format!(
                "{} ({:.3}x)",
                gib(f as f64),
                f as f64 / reference
            )),
            spec.monet_ratio,
            100.0 * spec.monet_overhead,
            best.map_or("none".into(), |(r, o)| format!(
                "**{r:.3}x** at {:+.1}%",
                100.0 * o
            )),
            match at_target {
                Some((o, r, by)) => format!(
                    "{r:.3}x at {:+.1}% ({by}, {})",
                    100.0 * o,
                    if met { "met" } else { "missed" }
                ),
                None => "no plan (missed)".into(),
            },
            max_t
        )?;
        write!(frontiers, "| {} |", spec.label())?;
        for p in &points {
            match (ratio(p), p.overhead) {
                (Some(r), Some(o)) => write!(
                    frontiers,
                    " {:.2}: {r:.3}x {:+.1}%{} ·",
                    p.fraction,
                    100.0 * o,
                    if p.by == "lp-round" { "" } else { " (milp)" }
                )?,
                _ => write!(
                    frontiers,
                    " {:.2}: {} ·",
                    p.fraction,
                    if p.error
                        .as_deref()
                        .is_some_and(|e| e.contains("least feasible"))
                    {
                        "below floor"
                    } else {
                        "no plan"
                    }
                )?,
            }
        }
        writeln!(frontiers, " |")?;
        if !a.quick && !spec.fused && matches!(spec.model, "vgg16" | "resnet50") {
            let all = max_batch(&bin, spec.model, "layer", "checkpoint-all", false);
            let op_lp = max_batch(&bin, spec.model, "op", "lp-round", false);
            let layer_lp = max_batch(&bin, spec.model, "layer", "lp-round", false);
            // ResNet50 has no convolution a max pooling follows alone: nothing to fuse.
            let fused_lp = (spec.model == "vgg16")
                .then(|| max_batch(&bin, spec.model, "op", "lp-round", true))
                .flatten();
            let best = op_lp.max(fused_lp);
            writeln!(
                batches,
                "| {} | {} | {} | {} | {} | {} |",
                spec.model,
                all.map_or("-".into(), |b| b.to_string()),
                layer_lp.map_or("-".into(), |b| b.to_string()),
                op_lp.map_or("-".into(), |b| b.to_string()),
                fused_lp.map_or("-".into(), |b| b.to_string()),
                all.zip(best).map_or("-".into(), |(a, b)| format!(
                    "**{:.2}x**",
                    b as f64 / a as f64
                )),
            )?;
        }
    }

    if !a.train_only {
        std::fs::write(
            &stored,
            serde_json::json!({"summary": summary, "frontiers": frontiers, "batches": batches,
                               "meta": predicted_meta})
            .to_string(),
        )?;
    }

    // Real training steps.
    let mut train = String::new();
    let train_fractions: &[f64] = if a.quick { &[0.6] } else { &[0.6, 0.45, 0.35] };
    // Each size as it is, then fused where FUSED_MODELS has the model.
    let unfused = TRAIN.iter().map(|&(label, flags)| (label, flags, false));
    let fused = TRAIN
        .iter()
        .filter(|(_, flags)| {
            flags
                .windows(2)
                .any(|w| w[0] == "--model" && FUSED_MODELS.contains(&w[1]))
        })
        .map(|&(label, flags)| (label, flags, true));
    for (label, flags, fuse) in unfused.chain(fused) {
        let mut flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        if fuse {
            flags.push("--fuse-conv-pool".into());
        }
        let label = if fuse {
            format!("{label}, fused conv-pool")
        } else {
            label.to_string()
        };
        // The layer graph's checkpoint-all total at this size, from the library.
        let get = |k: &str| -> Option<&str> {
            flags
                .iter()
                .position(|f| f == k)
                .and_then(|i| flags.get(i + 1))
                .map(String::as_str)
        };
        let model = get("--model").unwrap_or("?");
        let mut c = ModelConfig::new(get("--batch").and_then(|b| b.parse().ok()).unwrap_or(1));
        if let Some(s) = get("--image-size").and_then(|s| s.parse().ok()) {
            c = c.with_image_size(ImageSize::square(s));
        }
        c.classes = get("--classes").and_then(|s| s.parse().ok());
        c.width = get("--width").and_then(|s| s.parse().ok());
        let layer = build_training_graph(model, &c, &TrainingConfig::default())?;
        let fixed = layer.static_bytes() as f64;
        let reference = fixed + CheckpointAll::peak_bytes(&layer) as f64;
        for &f in train_fractions {
            // At these sizes static memory is most of a step: the budget keeps it and a fraction
            // of the layer graph's checkpoint-all activation peak.
            let total = fixed + f * (reference - fixed);
            let budget = (total as u64).to_string();
            let mut args = vec!["train".to_string()];
            args.extend(flags.iter().cloned());
            args.extend(
                [
                    "--granularity",
                    "op",
                    "--budget",
                    &budget,
                    "--strategy",
                    "lp-round",
                    "--time-limit",
                    "10",
                    "--steps",
                    "2",
                    "--baseline-steps",
                    "2",
                    "--json",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            match checkmate(&bin, &args) {
                Ok(v) => {
                    let heap = v["heap_peak_with_update_bytes"]
                        .as_f64()
                        .unwrap_or(f64::NAN);
                    let base = v["baseline_heap_peak_with_update_bytes"]
                        .as_f64()
                        .unwrap_or(f64::NAN);
                    let predicted = v["predicted_peak_bytes"].as_f64().unwrap_or(f64::NAN)
                        + v["static_bytes"].as_f64().unwrap_or(f64::NAN);
                    writeln!(
                        train,
                        "| {label} | {f:.2} ({}) | {} | {} | {} ({:.3}x) | {:+.1}% | {} |",
                        mib(total),
                        mib(predicted),
                        mib(base),
                        mib(heap),
                        heap / base,
                        100.0 * (v["predicted_overhead"].as_f64().unwrap_or(f64::NAN) - 1.0),
                        match (
                            v["params_match_checkpoint_all"].as_bool(),
                            v["params_bitwise_expected"].as_bool(),
                        ) {
                            (Some(true), _) => "bitwise equal",
                            (Some(false), Some(false)) => "differ by rounding (fused)",
                            (Some(false), _) => "DIFFER",
                            (None, _) => "-",
                        }
                    )?;
                }
                Err(e) => writeln!(train, "| {label} | {f:.2} | {e} | | | | |")?,
            }
        }
    }

    let mut md = String::new();
    writeln!(md, "{BEGIN}")?;
    writeln!(md, "## 7. Operator-level graphs at MONeT's sizes\n")?;
    writeln!(
        md,
        "- machine: {}\n- date: {}\n- command: `cargo xtask bench op{}` (xtask/src/bench_op.rs)\n- \
         wall time: {:.0} s\n- predicted tables: {}\n",
        crate::bench_results::machine(),
        crate::bench_results::date(),
        if a.quick { " --quick" } else if a.train_only { " --train-only" } else { "" },
        t0.elapsed().as_secs_f64(),
        predicted_meta
    )?;
    writeln!(
        md,
        "Reference **T** = the layer graph's checkpoint-all total (static memory with SGD momentum \
         + activation peak, kernel workspace counted), the memory training without \
         rematerialization takes. Operator graphs (`--granularity op`, docs/OP_GRAPHS.md) with \
         `lp-round` ({limit} s per budget, 1 thread; at the target ratio also `milp`, \
         {milp_limit} s, which starts from lp-round's plan: the cheaper plan is shown, marked \
         `(milp)` where it is milp's); overhead = plan cost over the **layer** graph's cost \
         with every node computed once (FLOPs), so that it counts what an operator graph adds \
         itself (masks and winners; with fused convolutions and poolings, each pooling's \
         recomputation of its convolution at the winners, +4.2% for VGG16). Rows marked `fused \
         conv-pool` are operator graphs built with `--fuse-conv-pool` (docs/OP_GRAPHS.md). \
         MONeT's points (memory over \
         PyTorch's own at the same batch, compute overhead) are from its paper; its batch sizes \
         are ours. Target: the issue's ratio at its overhead bound.\n"
    )?;
    writeln!(
        md,
        "| model | nodes layer / op | T (layer checkpoint-all) | op checkpoint-all | op least \
         feasible | MONeT | ours, least memory within MONeT's overhead | ours at the target \
         ratio | slowest lp-round solve |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    md.push_str(&summary);
    writeln!(
        md,
        "\nEvery frontier point (budget as a fraction of T: predicted total / T, overhead):\n"
    )?;
    writeln!(md, "| model | points |\n|---|---|")?;
    md.push_str(&frontiers);
    if !batches.is_empty() {
        writeln!(
            md,
            "\nLargest batch in 16 GiB (predicted, FLOP costs, at most one extra forward pass; \
             `checkmate max-batch --no-confirm`, 20 s per solve):\n"
        )?;
        writeln!(
            md,
            "| model | checkpoint-all, layer graph | lp-round, layer graph | lp-round, op graph | \
             lp-round, op graph, fused conv-pool | best op / checkpoint-all |\n|---|---|---|---|---|---|"
        )?;
        md.push_str(&batches);
    }
    writeln!(
        md,
        "\nReal training steps on this CPU (`checkmate train --granularity op --strategy lp-round \
         --budget B`, 2 plan steps after 2 reference steps of the layer graph's checkpoint-all; \
         budget B = static memory + f x the layer graph's checkpoint-all activation peak (at these \
         sizes static memory is most of a step); heap = the process's peak above its start, \
         counting allocator, optimizer update included):\n"
    )?;
    writeln!(
        md,
        "| model | f (budget B) | predicted total | heap, layer checkpoint-all | heap, op plan (/ \
         layer) | predicted overhead | weights |\n|---|---|---|---|---|---|---|"
    )?;
    md.push_str(&train);
    writeln!(md, "{END}")?;
    write_section(&a.out, &md)?;
    eprintln!(
        "bench op: {:.0} s; wrote {}",
        t0.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}

/// Replaces the marked section of `path` with `section` (appends it when absent).
fn write_section(path: &Path, section: &str) -> Result<()> {
    write_marked(path, BEGIN, END, section)
}

/// The marked section of `path`, if any (for `cargo xtask bench results`, which re-renders the
/// rest of the file).
pub fn section(path: &Path) -> Option<String> {
    marked(path, BEGIN, END)
}

/// Replaces what lies between `begin` and `end` in `path` (markers included) with `section`,
/// which carries them; appends it when the markers are absent.
pub(crate) fn write_marked(path: &Path, begin: &str, end: &str, section: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if e > b => {
            format!(
                "{}{}{}",
                &old[..b],
                section,
                &old[e + end.len()..].trim_start_matches('\n')
            )
        }
        _ => format!("{}\n\n{section}", old.trim_end()),
    };
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}

/// What lies between `begin` and `end` in `path`, markers included.
pub(crate) fn marked(path: &Path, begin: &str, end: &str) -> Option<String> {
    let old = std::fs::read_to_string(path).ok()?;
    let b = old.find(begin)?;
    let e = old.find(end)?;
    (e > b).then(|| format!("{}\n", &old[b..e + end.len()]))
}
