//! `cargo xtask bench impl`: implementation choices (docs/IMPLEMENTATIONS.md) with measured
//! costs. Per model, at sizes this machine trains: `checkmate profile --granularity op` times
//! every convolution's default (1 MiB chunks) and whole-sample kernels; a copy of the table
//! without the alternatives stands for default kernels only. `milp` then solves both graphs at
//! the same budgets (percent of the checkpoint-all peak, which the two share), and `checkmate
//! train` runs both plans at one budget: measured step time, heap against the prediction,
//! weights against checkpoint-all. Writes its section of `docs/RESULTS.md` (between the
//! `impl-choices` markers; `cargo xtask bench results` keeps it).
//!
//! Options: `--out FILE` (default docs/RESULTS.md).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::bench_op::checkmate;
use crate::bench_results::mib;

/// Markers of this bench's section in docs/RESULTS.md.
pub const BEGIN: &str = "<!-- impl-choices:begin -->";
/// End marker.
pub const END: &str = "<!-- impl-choices:end -->";

/// `milp`'s time limit per solve, seconds.
const MILP_LIMIT: &str = "60";

/// Budgets (percent of the checkpoint-all activation peak) solved; the middle one is trained.
const BUDGETS: &[&str] = &["100%", "85%", "75%"];

/// The budget trained with both tables.
const TRAINED: &str = "85%";

/// Models at sizes this machine trains in seconds per step.
const MODELS: &[(&str, &[&str])] = &[
    (
        "vgg16 64x64, batch 8",
        &[
            "--model",
            "vgg16",
            "--image-size",
            "64",
            "--classes",
            "10",
            "--width",
            "512",
            "--batch",
            "8",
        ],
    ),
    // (At 64x64 no ResNet50 convolution's sample exceeds a chunk: 128x128.)
    (
        "resnet50 128x128, batch 2",
        &[
            "--model",
            "resnet50",
            "--image-size",
            "128",
            "--classes",
            "10",
            "--batch",
            "2",
        ],
    ),
    (
        "unet 128x128, batch 2",
        &["--model", "unet", "--image-size", "128", "--batch", "2"],
    ),
];

/// `checkmate COMMAND FLAGS --granularity op MORE --json`.
fn op_level(bin: &Path, command: &str, flags: &[&str], more: &[&str]) -> Result<Value, String> {
    let args: Vec<String> = [command]
        .iter()
        .chain(flags)
        .chain(&["--granularity", "op"])
        .chain(more)
        .chain(&["--json"])
        .map(|s| s.to_string())
        .collect();
    checkmate(bin, &args)
}

/// What `solve` and `train` share: `milp` on the graph with the costs at `costs`, at `budget`.
fn milp_at<'a>(costs: &'a str, budget: &'a str) -> [&'a str; 8] {
    [
        "--costs",
        costs,
        "--strategy",
        "milp",
        "--time-limit",
        MILP_LIMIT,
        "--budget",
        budget,
    ]
}

/// Computes of the plan file at `path` that name a non-default implementation.
fn alternative_computes(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches("\"impl\"").count())
        .unwrap_or(0)
}

/// Median of the steady steps (all but the first, when there are more than two).
fn median_step(v: &Value) -> Option<f64> {
    let mut s: Vec<f64> = v["step_seconds"]
        .as_array()?
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    if s.len() > 2 {
        s.remove(0);
    }
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied()
}

/// Runs the bench.
pub fn run(args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    let mut out = root.join("docs/RESULTS.md");
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--out" => out = PathBuf::from(it.next().context("--out needs a file")?),
            other => bail!("unknown option {other}; see xtask/src/bench_impl.rs"),
        }
    }
    let t0 = Instant::now();
    let bin = root.join("target/release/checkmate");
    let dir = root.join("target/bench-impl");
    std::fs::create_dir_all(&dir)?;
    let mut kernels = String::new();
    let mut solves = String::new();
    let mut trains = String::new();
    for (label, flags) in MODELS {
        let model = flags[1];
        let with = dir.join(format!("{model}.json"));
        let without = dir.join(format!("{model}-default.json"));
        let profiled = op_level(
            &bin,
            "profile",
            flags,
            &["--output", &with.display().to_string()],
        );
        if let Err(e) = profiled {
            writeln!(kernels, "| {label} | {e} | | | |")?;
            continue;
        }
        let mut table: Value = serde_json::from_str(&std::fs::read_to_string(&with)?)?;
        // The kernels: how many nodes have a second one, how many are faster, by how much.
        let (mut nodes, mut faster, mut saved, mut total) = (0, 0, 0.0, 0.0);
        for n in table["nodes"].as_array().into_iter().flatten() {
            let s = n["seconds"].as_f64().unwrap_or(0.0);
            total += s;
            if let Some(a) = n["alternatives"].as_array().and_then(|a| a.first()) {
                nodes += 1;
                let t = a["seconds"].as_f64().unwrap_or(s);
                if t < s {
                    faster += 1;
                    saved += s - t;
                }
            }
        }
        writeln!(
            kernels,
            "| {label} | {nodes} | {faster} | {:.1} ms of {:.1} ms ({:.1}%) |",
            1e3 * saved,
            1e3 * total,
            100.0 * saved / total.max(f64::MIN_POSITIVE)
        )?;
        for n in table["nodes"].as_array_mut().into_iter().flatten() {
            if let Some(o) = n.as_object_mut() {
                o.remove("alternatives");
            }
        }
        std::fs::write(&without, serde_json::to_string(&table)?)?;
        for budget in BUDGETS {
            let mut cells = Vec::new();
            for costs in [&without, &with] {
                let plan = dir.join(format!(
                    "{model}-{}-{}.plan.json",
                    budget.trim_end_matches('%'),
                    if costs == &with { "alt" } else { "default" }
                ));
                let costs = costs.display().to_string();
                let plan_out = plan.display().to_string();
                let more = [&milp_at(&costs, budget)[..], &["--plan-out", &plan_out]].concat();
                let r = op_level(&bin, "solve", flags, &more);
                cells.push(match r {
                    Ok(v) => (
                        v["cost"].as_f64(),
                        v["status"].as_str().unwrap_or("?").to_string(),
                        alternative_computes(&plan),
                    ),
                    Err(e) => (None, e, 0),
                });
            }
            let fmt = |c: &(Option<f64>, String, usize)| match c.0 {
                Some(s) => format!("{:.1} ms ({})", 1e3 * s, c.1),
                None => c.1.clone(),
            };
            let ratio = match (cells[0].0, cells[1].0) {
                (Some(a), Some(b)) => format!("{:.3}", b / a),
                _ => "-".into(),
            };
            writeln!(
                solves,
                "| {label} | {budget} | {} | {} | {} | {ratio} |",
                fmt(&cells[0]),
                fmt(&cells[1]),
                cells[1].2
            )?;
        }
        let mut runs = Vec::new();
        for costs in [&without, &with] {
            let costs = costs.display().to_string();
            let more = [
                &milp_at(&costs, TRAINED)[..],
                &["--steps", "5", "--baseline-steps", "2"],
            ]
            .concat();
            runs.push(op_level(&bin, "train", flags, &more));
        }
        let cell = |r: &Result<Value, String>| match r {
            Ok(v) => format!(
                "{:.1} ms, heap {} (predicted {}), weights {}",
                1e3 * median_step(v).unwrap_or(f64::NAN),
                mib(v["heap_peak_bytes"].as_f64().unwrap_or(f64::NAN)),
                mib(v["predicted_peak_bytes"].as_f64().unwrap_or(f64::NAN)
                    + v["static_bytes"].as_f64().unwrap_or(f64::NAN)),
                match v["params_match_checkpoint_all"].as_bool() {
                    Some(true) => "bitwise equal",
                    Some(false) => "DIFFER",
                    None => "-",
                }
            ),
            Err(e) => e.clone(),
        };
        let speedup = match (&runs[0], &runs[1]) {
            (Ok(a), Ok(b)) => match (median_step(a), median_step(b)) {
                (Some(a), Some(b)) => format!("{:.3}", b / a),
                _ => "-".into(),
            },
            _ => "-".into(),
        };
        writeln!(
            trains,
            "| {label} | {} | {} | {speedup} |",
            cell(&runs[0]),
            cell(&runs[1])
        )?;
    }

    let mut md = String::new();
    writeln!(md, "{BEGIN}")?;
    writeln!(md, "## 8. Implementation choices with measured costs\n")?;
    writeln!(
        md,
        "- machine: {}\n- date: {}\n- command: `cargo xtask bench impl` (xtask/src/bench_impl.rs)\n- \
         wall time: {:.0} s\n",
        crate::bench_results::machine(),
        crate::bench_results::date(),
        t0.elapsed().as_secs_f64()
    )?;
    writeln!(
        md,
        "At operator level a convolution whose sample's unfolded windows exceed the 1 MiB chunk \
         has a second kernel, `whole-sample` (docs/IMPLEMENTATIONS.md): same bits, a larger \
         workspace. `checkmate profile --granularity op` times both; a copy of the table without \
         the alternatives stands for default kernels only.\n"
    )?;
    writeln!(
        md,
        "| model | nodes with a second kernel | of them faster | time saved per checkpoint-all \
         step (of the profiled total) |\n|---|---|---|---|"
    )?;
    md.push_str(&kernels);
    writeln!(
        md,
        "\n`milp` ({MILP_LIMIT} s, 1 thread) on both graphs at the same budgets (percent of the \
         checkpoint-all activation peak, the same on both): predicted seconds per step (status), \
         the whole-sample computes the plan chooses, and the ratio:\n"
    )?;
    writeln!(
        md,
        "| model | budget | default kernels only | with the choice | whole-sample computes | \
         ratio |\n|---|---|---|---|---|---|"
    )?;
    md.push_str(&solves);
    writeln!(
        md,
        "\nReal training at {TRAINED} (`checkmate train --granularity op --costs TABLE --strategy \
         milp`, 5 plan steps; median step time over steps 2-5, process heap by the counting \
         allocator, weights against the layer graph's checkpoint-all). The two runs are separate \
         processes on a shared machine: where both plans are the same, the ratio is that \
         noise:\n"
    )?;
    writeln!(
        md,
        "| model | default kernels only | with the choice | step time ratio |\n|---|---|---|---|"
    )?;
    md.push_str(&trains);
    writeln!(md, "{END}")?;
    crate::bench_op::write_marked(&out, BEGIN, END, &md)?;
    eprintln!(
        "bench impl: {:.0} s; wrote {}",
        t0.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// The marked section of `path`, if any (for `cargo xtask bench results`).
pub fn section(path: &Path) -> Option<String> {
    crate::bench_op::marked(path, BEGIN, END)
}
