//! `cargo xtask bench frontier|plan|max-batch|train|results [--quick]`: reproduces the paper's
//! experiments on our stack and writes `docs/RESULTS.md` with SVG figures under `docs/figures/`.
//!
//! Every part runs the release `checkmate` binary (built first) as a subprocess with a timeout and
//! stores what it measured, with the machine, date and command, as JSON under
//! `target/bench-results/`; a failed item becomes a row that says why. After every part,
//! `docs/RESULTS.md` is rendered from scratch from those JSON files, so each section states the run
//! it comes from. `results` runs every part (the solver benchmark included, written to
//! `target/bench-results/solver.md` and embedded) and then renders; `render` only re-renders.
//!
//! Parts:
//! - `results-solver`: the solver benchmark with short limits (section 3), alone;
//! - `frontier`: `checkmate sweep` with every baseline, `lp-round` and `milp` on the seven shared
//!   Checkmate graphs: Table 2 (geometric mean of cost / MILP cost) and Figure 5 (SVG per graph);
//! - `plan`: one MILP plan on VGG16: live bytes after every step, and its R and S matrices;
//! - `max-batch`: Figure 6, the largest batch per strategy under 16 GiB with FLOP costs and at
//!   most one extra forward pass, beside the limits our memory model allows;
//! - `train`: real training steps on this CPU at three budgets per strategy (predicted vs measured
//!   memory and time) and `checkmate max-batch` confirmed by a real step under a small memory cap.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench_plots;

/// Parts of the results benchmark (besides `solver`, which lives in `bench_solver`).
pub const PARTS: &[&str] = &[
    "results-solver",
    "frontier",
    "plan",
    "max-batch",
    "train",
    "results",
    "render",
];

const FRONTIER_STRATEGIES: &str =
    "checkpoint-all,chen-sqrtn,chen-greedy,ap-sqrtn,ap-greedy,griewank,lp-round,milp";
/// Strategies of Table 2 (cost / optimal), in column order.
const TABLE2_STRATEGIES: &[&str] = &[
    "ap-sqrtn",
    "ap-greedy",
    "chen-sqrtn",
    "chen-greedy",
    "griewank",
    "lp-round",
];
const MAX_BATCH_MODELS: &[&str] = &["vgg16", "vgg19", "mobilenet", "unet", "resnet50"];
const MAX_BATCH_STRATEGIES: &str = "checkpoint-all,chen-sqrtn,chen-greedy,lp-round,milp";
/// 16 GiB, the V100's memory.
const GPU_MEMORY: u64 = 16 << 30;

/// One part of the benchmark.
type Part = fn(&Ctx) -> Result<()>;

/// Options shared by the parts.
struct Ctx {
    quick: bool,
    root: PathBuf,
    bin: PathBuf,
    data: PathBuf,
    figures: PathBuf,
    graphs: PathBuf,
    /// The command line as the user typed it (for the tables).
    command: String,
}

impl Ctx {
    fn new(part: &str, args: &[String]) -> Result<Ctx> {
        let root = crate::workspace_root();
        let quick = args.iter().any(|a| a == "--quick");
        if let Some(bad) = args.iter().find(|a| *a != "--quick") {
            bail!("unknown option {bad}; bench {part} takes only --quick");
        }
        let data = root.join("target/bench-results");
        let figures = root.join("docs/figures");
        std::fs::create_dir_all(&data)?;
        std::fs::create_dir_all(&figures)?;
        let mut command = format!("cargo xtask bench {part}");
        if quick {
            command.push_str(" --quick");
        }
        Ok(Ctx {
            quick,
            bin: root.join("target/release/checkmate"),
            graphs: root.join("data/graphs/checkmate"),
            root,
            data,
            figures,
            command,
        })
    }

    /// Metadata every section prints.
    fn meta(&self, started: Instant, reps: &str) -> Value {
        json!({
            "machine": machine(),
            "date": date(),
            "command": self.command,
            "quick": self.quick,
            "repetitions": reps,
            "seconds": started.elapsed().as_secs_f64(),
        })
    }

    fn save(&self, name: &str, value: &Value) -> Result<()> {
        let path = self.data.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(value)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    fn load(&self, name: &str) -> Option<Value> {
        let text = std::fs::read_to_string(self.data.join(format!("{name}.json"))).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Runs `checkmate ARGS` with a timeout and parses its stdout as JSON. A non-zero exit with a
    /// JSON answer (e.g. `solve` on an infeasible budget) still returns the JSON.
    fn checkmate(&self, args: &[String], timeout: Duration) -> Result<Value, String> {
        let t0 = Instant::now();
        eprintln!("  $ checkmate {}", args.join(" "));
        // Per process, so that two parts can run at once.
        let out_path = self.data.join(format!("stdout-{}.txt", std::process::id()));
        let err_path = self.data.join(format!("stderr-{}.txt", std::process::id()));
        let out = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
        let err = std::fs::File::create(&err_path).map_err(|e| e.to_string())?;
        let mut child = Command::new(&self.bin)
            .args(args)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.bin.display()))?;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if t0.elapsed() > timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    eprintln!("    timed out after {:.0} s", timeout.as_secs_f64());
                    return Err(format!("timed out after {:.0} s", timeout.as_secs_f64()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(e.to_string()),
            }
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        eprintln!("    {:.1} s, {status}", t0.elapsed().as_secs_f64());
        match serde_json::from_str::<Value>(&stdout) {
            Ok(v) => Ok(v),
            Err(_) => {
                let why = stderr
                    .lines()
                    .rfind(|l| !l.trim().is_empty())
                    .unwrap_or("no output")
                    .trim()
                    .to_string();
                Err(format!("exit {status}: {}", clip(&why, 200)))
            }
        }
    }

    /// The seven shared graphs, smallest file first; `--quick` keeps VGG16 and MobileNet.
    fn graph_files(&self) -> Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.graphs)
            .with_context(|| format!("reading {}", self.graphs.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0));
        if self.quick {
            files.retain(|p| {
                let s = stem(p);
                s.starts_with("VGG16") || s.starts_with("MobileNet")
            });
        }
        Ok(files)
    }
}

fn stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}

/// CPU model name and the number of cores available.
pub fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{model}, {cores} cores (nproc)")
}

/// The current date and time, UTC, to the minute.
pub fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown date".into())
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// Runs a part (see the module docs).
pub fn run(part: &str, args: &[String]) -> Result<()> {
    let ctx = Ctx::new(part, args)?;
    let t0 = Instant::now();
    match part {
        // The solver part alone (`solver` names `cargo xtask bench solver`, the long benchmark).
        "results-solver" => solver(&ctx)?,
        "frontier" => frontier(&ctx)?,
        "plan" => plan(&ctx)?,
        "max-batch" => max_batch(&ctx)?,
        "train" => train(&ctx)?,
        // Only rewrite docs/RESULTS.md from the stored measurements.
        "render" => {}
        "results" => {
            // Each part is independent: one that fails leaves its section saying so.
            let parts: [(&str, Part); 5] = [
                ("solver", solver),
                ("frontier", frontier),
                ("plan", plan),
                ("max-batch", max_batch),
                ("train", train),
            ];
            let started = date();
            let mut seconds = serde_json::Map::new();
            for (name, f) in parts {
                eprintln!(
                    "== bench {name} ({:.0} s so far)",
                    t0.elapsed().as_secs_f64()
                );
                let part_t0 = Instant::now();
                if let Err(e) = f(&ctx) {
                    eprintln!("bench {name} failed: {e:#}");
                    ctx.save(
                        name,
                        &json!({"meta": ctx.meta(Instant::now(), "-"), "error": format!("{e:#}")}),
                    )?;
                }
                seconds.insert(name.into(), json!(part_t0.elapsed().as_secs_f64()));
            }
            ctx.save(
                "run",
                &json!({"machine": machine(), "started": started, "command": ctx.command,
                        "seconds": t0.elapsed().as_secs_f64(), "parts": seconds}),
            )?;
        }
        other => bail!("unknown bench part {other:?}"),
    }
    render(&ctx)?;
    eprintln!(
        "bench {part}: {:.0} s; wrote docs/RESULTS.md",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// solver

fn solver(ctx: &Ctx) -> Result<()> {
    let t0 = Instant::now();
    let out = ctx.data.join("solver.md");
    let mut args: Vec<String> = vec!["--out".into(), out.display().to_string()];
    let extra: &[&str] = if ctx.quick {
        &[
            "--only",
            "VGG16",
            "--time-limit",
            "5",
            "--lf-time-limit",
            "5",
        ]
    } else {
        &["--time-limit", "10", "--lf-time-limit", "5"]
    };
    args.extend(extra.iter().map(|s| s.to_string()));
    let result = crate::bench_solver::run(&args);
    let mut meta = ctx.meta(t0, "1 solve per (graph, budget, strategy)");
    meta["command"] = json!(format!(
        "{} (runs: cargo xtask bench solver {})",
        ctx.command,
        args.join(" ")
    ));
    ctx.save(
        "solver",
        &json!({
            "meta": meta,
            "file": out.display().to_string(),
            "error": result.err().map(|e| format!("{e:#}")),
        }),
    )
}

// ---------------------------------------------------------------------------------------------
// frontier (Table 2, Figure 5)

fn frontier(ctx: &Ctx) -> Result<()> {
    let t0 = Instant::now();
    let (points, limit) = if ctx.quick { (4, 4.0) } else { (6, 10.0) };
    // From scratch: no figure of an earlier run survives.
    for e in std::fs::read_dir(&ctx.figures)?.flatten() {
        if e.file_name().to_string_lossy().starts_with("frontier_") {
            std::fs::remove_file(e.path())?;
        }
    }
    let mut rows = Vec::new();
    for file in ctx.graph_files()? {
        let name = stem(&file);
        let svg = ctx.figures.join(format!("frontier_{name}.svg"));
        let args: Vec<String> = vec![
            s("sweep"),
            s("--graph"),
            file.display().to_string(),
            s("--points"),
            s(points),
            s("--strategies"),
            s(FRONTIER_STRATEGIES),
            s("--time-limit"),
            s(limit),
            s("--threads"),
            s(1),
            s("--json"),
            s("--svg"),
            svg.display().to_string(),
        ];
        // Every point may run into the MILP limit, plus lp-round and the least feasible search.
        let timeout = Duration::from_secs_f64(limit * (points as f64 * 2.0 + 4.0) + 120.0);
        let r = ctx.checkmate(&args, timeout);
        rows.push(json!({
            "graph": name,
            "svg": format!("figures/frontier_{name}.svg"),
            "sweep": r.as_ref().ok(),
            "error": r.as_ref().err(),
        }));
    }
    let meta = ctx.meta(t0, "1 solve per (budget, strategy)");
    ctx.save(
        "frontier",
        &json!({"meta": meta, "points": points, "time_limit": limit,
                "strategies": FRONTIER_STRATEGIES, "graphs": rows}),
    )
}

/// Paper Table 2 (geometric mean of cost / optimal): (AP sqrt(n), AP greedy, Griewank, LP rounding).
fn paper_table2(graph: &str) -> Option<[Option<f64>; 4]> {
    let g = graph.to_ascii_lowercase();
    Some(if g.starts_with("mobilenet") {
        [Some(1.14), Some(1.07), Some(7.07), Some(1.06)]
    } else if g.starts_with("vgg16") {
        [Some(1.28), Some(1.06), Some(1.44), Some(1.01)]
    } else if g.starts_with("vgg19") {
        [Some(1.54), Some(1.39), Some(1.75), Some(1.00)]
    } else if g.contains("unet") {
        [Some(1.27), Some(1.23), None, Some(1.03)]
    } else if g.starts_with("resnet50") {
        [Some(1.20), Some(1.25), None, Some(1.05)]
    } else {
        return None;
    })
}

/// One strategy's ratios against the MILP on one sweep.
struct Ratio {
    geomean: Option<f64>,
    used: usize,
    feasible_milp: usize,
    unproven: usize,
}

fn ratios(sweep: &Value, strategy: &str) -> Ratio {
    let points = sweep["points"].as_array().cloned().unwrap_or_default();
    let budgets: Vec<u64> = sweep["budgets"]
        .as_array()
        .map(|b| b.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let find = |b: u64, st: &str| {
        points
            .iter()
            .find(|p| p["budget_bytes"].as_u64() == Some(b) && p["strategy"] == st)
            .cloned()
    };
    let (mut logs, mut feasible_milp, mut unproven) = (Vec::new(), 0, 0);
    for b in budgets {
        let Some(m) = find(b, "milp") else { continue };
        let Some(mc) = m["cost"].as_f64() else {
            continue;
        };
        feasible_milp += 1;
        let Some(c) = find(b, strategy).and_then(|p| p["cost"].as_f64()) else {
            continue;
        };
        if m["status"] != "optimal" {
            unproven += 1;
        }
        logs.push((c / mc).ln());
    }
    Ratio {
        geomean: (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp()),
        used: logs.len(),
        feasible_milp,
        unproven,
    }
}

// ---------------------------------------------------------------------------------------------
// plan (memory over time, R and S)

fn plan(ctx: &Ctx) -> Result<()> {
    let t0 = Instant::now();
    let file = ctx.graphs.join("VGG16_256_224.json");
    let graph = checkmate_graph::Graph::read(&file)?;
    // Budget: 30% of the way from the least feasible budget to the checkpoint-all peak (from the
    // frontier sweep when it ran; else 90% of the checkpoint-all activation peak).
    let budget = ctx
        .load("frontier")
        .and_then(|f| {
            f["graphs"].as_array()?.iter().find_map(|g| {
                let sw = &g["sweep"];
                if g["graph"] != "VGG16_256_224" {
                    return None;
                }
                let lo = sw["least_feasible_bytes"].as_u64()?;
                let hi = sw["checkpoint_all_peak_bytes"].as_u64()?;
                let st = sw["static_bytes"].as_u64()?;
                Some((lo + (hi - lo) * 3 / 10 + st).to_string())
            })
        })
        .unwrap_or_else(|| "90%".into());
    let limit = if ctx.quick { 10 } else { 30 };
    let mut plans = Vec::new();
    for (strategy, budget) in [("milp", budget.as_str()), ("checkpoint-all", "100%")] {
        let plan_path = ctx.data.join(format!("plan_{strategy}.json"));
        let args: Vec<String> = vec![
            s("solve"),
            s("--graph"),
            file.display().to_string(),
            s("--strategy"),
            s(strategy),
            s("--budget"),
            s(budget),
            s("--time-limit"),
            s(limit),
            s("--threads"),
            s(1),
            s("--json"),
            s("--plan-out"),
            plan_path.display().to_string(),
        ];
        let solved = ctx.checkmate(&args, Duration::from_secs(limit * 3 + 60));
        let sim_args: Vec<String> = vec![
            s("simulate"),
            s("--graph"),
            file.display().to_string(),
            s("--plan"),
            plan_path.display().to_string(),
            s("--timeline"),
            s("--json"),
        ];
        let sim = match &solved {
            Ok(v) if v["status"] != "infeasible" => {
                ctx.checkmate(&sim_args, Duration::from_secs(60))
            }
            Ok(v) => Err(format!("no plan: {}", v["error"])),
            Err(e) => Err(e.clone()),
        };
        plans.push(json!({
            "strategy": strategy,
            "budget": budget,
            "solve": solved.as_ref().ok(),
            "timeline": sim.as_ref().ok().map(|s| s["live_after_step"].clone()),
            "error": sim.as_ref().err(),
            "plan_path": plan_path.display().to_string(),
        }));
    }
    let mut figures = json!({});
    if let Some(lines) = plans
        .iter()
        .map(|p| {
            let tl: Vec<f64> = p["timeline"]
                .as_array()?
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            Some((p["strategy"].as_str()?.to_string(), tl))
        })
        .collect::<Option<Vec<_>>>()
    {
        let budget_act = plans[0]["solve"]["activation_budget_bytes"].as_f64();
        let path = ctx.figures.join("memory_timeline.svg");
        bench_plots::timeline(
            &path,
            "VGG16_256_224: live activation bytes after each plan step",
            &lines,
            budget_act,
        )?;
        figures["timeline"] = json!("figures/memory_timeline.svg");
    }
    if plans[0]["timeline"].is_array() {
        let pf = checkmate_graph::PlanFile::read(ctx.data.join("plan_milp.json"), &graph)?;
        let (r, s_) = stages(graph.len(), &pf.plan.steps);
        let path = ctx.figures.join("rs_matrices.svg");
        bench_plots::matrices(&path, &r, &s_)?;
        figures["rs"] = json!("figures/rs_matrices.svg");
        figures["stages"] = json!(r.len());
        figures["recomputed_cells"] = json!(r
            .iter()
            .map(|row| row.iter().filter(|&&x| x).count())
            .sum::<usize>());
    }
    ctx.save(
        "plan",
        &json!({"meta": ctx.meta(t0, "1 solve"), "graph": "VGG16_256_224", "nodes": graph.len(),
                "plans": plans, "figures": figures}),
    )
}

/// R and S of a frontier-advancing plan: stage t ends at the first compute of node t; R[t][i]: i
/// computed in stage t; S[t][i]: i live right before the first compute of stage t.
fn stages(n: usize, steps: &[checkmate_graph::Step]) -> (Vec<Vec<bool>>, Vec<Vec<bool>>) {
    use checkmate_graph::Step;
    let mut r = vec![vec![false; n]; n];
    let mut s_ = vec![vec![false; n]; n];
    let mut live = vec![false; n];
    let mut seen = vec![false; n];
    let mut stage = 0usize;
    let mut stage_started = false;
    for step in steps {
        match *step {
            Step::Compute(v) => {
                if stage >= n {
                    break;
                }
                if !stage_started {
                    s_[stage].clone_from(&live);
                    stage_started = true;
                }
                r[stage][v] = true;
                live[v] = true;
                if !seen[v] {
                    seen[v] = true;
                    // The first compute of a node that is not the frontier would mean a plan
                    // that is not frontier-advancing; the stage still ends at the frontier.
                    if v >= stage {
                        stage = v + 1;
                        stage_started = false;
                    }
                }
            }
            Step::Free(v) => live[v] = false,
        }
    }
    (r, s_)
}

// ---------------------------------------------------------------------------------------------
// max-batch (Figure 6)

fn max_batch(ctx: &Ctx) -> Result<()> {
    let t0 = Instant::now();
    let (strategies, limit) = if ctx.quick {
        ("checkpoint-all,chen-sqrtn,chen-greedy,lp-round", 5.0)
    } else {
        (MAX_BATCH_STRATEGIES, 10.0)
    };
    let models: &[&str] = if ctx.quick {
        &["vgg19", "mobilenet"]
    } else {
        MAX_BATCH_MODELS
    };
    let mut rows = Vec::new();
    for &m in models {
        let args: Vec<String> = vec![
            s("max-batch"),
            s("--model"),
            s(m),
            s("--memory"),
            s(GPU_MEMORY),
            s("--strategies"),
            s(strategies),
            s("--max-extra-forwards"),
            s(1),
            s("--no-confirm"),
            s("--limit"),
            s(8192),
            s("--time-limit"),
            s(limit),
            s("--threads"),
            s(1),
            s("--json"),
        ];
        let timeout = Duration::from_secs(if ctx.quick { 150 } else { 420 });
        let r = ctx.checkmate(&args, timeout);
        let limits = model_limits(m);
        rows.push(json!({
            "model": m,
            "result": r.as_ref().ok(),
            "error": r.as_ref().err(),
            "limits": limits.as_ref().ok(),
            "limits_error": limits.as_ref().err().map(|e| format!("{e:#}")),
        }));
    }
    ctx.save(
        "max-batch",
        &json!({"meta": ctx.meta(t0, "1 search per (model, strategy)"), "memory_bytes": GPU_MEMORY,
                "strategies": strategies, "time_limit": limit, "models": rows}),
    )
}

/// Largest batch for which `fits(batch)` holds (monotone), up to `cap`.
fn largest(cap: usize, mut fits: impl FnMut(usize) -> Result<bool>) -> Result<usize> {
    if !fits(1)? {
        return Ok(0);
    }
    let mut lo = 1;
    while lo * 2 <= cap && fits(lo * 2)? {
        lo *= 2;
    }
    let mut hi = (lo * 2).min(cap + 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// What our memory model allows for `model` in 16 GiB: the least feasible budget's batch, and
/// checkpoint-all's batch with and without workspace (Checkmate's graphs count outputs only).
fn model_limits(model: &str) -> Result<Value> {
    use checkmate_models::{build_training_graph, ModelConfig, TrainingConfig};
    use checkmate_solver::baselines::CheckpointAll;
    let build = |b: usize, workspace: bool| {
        let training = TrainingConfig {
            workspace,
            ..TrainingConfig::default()
        };
        build_training_graph(model, &ModelConfig::new(b), &training)
    };
    let lf = largest(65536, |b| {
        let g = build(b, true)?;
        Ok(g.static_bytes() + g.min_feasible_activation_bytes() <= GPU_MEMORY)
    })?;
    let all = largest(65536, |b| {
        let g = build(b, true)?;
        Ok(g.static_bytes() + CheckpointAll::peak_bytes(&g) <= GPU_MEMORY)
    })?;
    let all_no_ws = largest(65536, |b| {
        let g = build(b, false)?;
        Ok(g.static_bytes() + CheckpointAll::peak_bytes(&g) <= GPU_MEMORY)
    })?;
    let lf_no_ws = largest(65536, |b| {
        let g = build(b, false)?;
        Ok(g.static_bytes() + g.min_feasible_activation_bytes() <= GPU_MEMORY)
    })?;
    let g1 = build(1, true)?;
    Ok(json!({
        "least_feasible_batch": lf,
        "checkpoint_all_batch": all,
        "checkpoint_all_batch_no_workspace": all_no_ws,
        "least_feasible_batch_no_workspace": lf_no_ws,
        "static_bytes_batch1": g1.static_bytes(),
        "checkpoint_all_peak_batch1": CheckpointAll::peak_bytes(&g1),
        "min_feasible_batch1": g1.min_feasible_activation_bytes(),
        "nodes": g1.len(),
    }))
}

// ---------------------------------------------------------------------------------------------
// train (real steps on this CPU)

/// A model trained by `bench train`: label and `checkmate train` model flags.
struct TrainModel {
    label: &'static str,
    args: &'static [&'static str],
}

const TRAIN_MODELS: &[TrainModel] = &[
    TrainModel {
        label: "mobilenet 32x32, 10 classes, batch 16",
        args: &[
            "--model",
            "mobilenet",
            "--image-size",
            "32",
            "--classes",
            "10",
            "--batch",
            "16",
        ],
    },
    TrainModel {
        label: "resnet50 32x32, 10 classes, batch 8",
        args: &[
            "--model",
            "resnet50",
            "--image-size",
            "32",
            "--classes",
            "10",
            "--batch",
            "8",
        ],
    },
];

/// Confirmed max-batch searches: label, memory cap, model flags.
const CAPS: &[(&str, &str, &[&str])] = &[
    (
        "mobilenet 32x32, 10 classes",
        "64MiB",
        &[
            "--model",
            "mobilenet",
            "--image-size",
            "32",
            "--classes",
            "10",
        ],
    ),
    (
        "mlp 28x28, 6 x 512",
        "32MiB",
        &["--model", "mlp", "--depth", "6"],
    ),
];

fn train(ctx: &Ctx) -> Result<()> {
    let t0 = Instant::now();
    let quick = ctx.quick;
    let budgets: &[&str] = if quick {
        &["70%", "40%"]
    } else {
        &["80%", "60%", "40%"]
    };
    let strategies: &[&str] = if quick {
        &["chen-greedy", "lp-round", "milp"]
    } else {
        &["chen-sqrtn", "chen-greedy", "lp-round", "milp"]
    };
    let models = if quick {
        &TRAIN_MODELS[..1]
    } else {
        TRAIN_MODELS
    };
    let caps = if quick { &CAPS[..1] } else { CAPS };
    let cap_strategies = if quick {
        "checkpoint-all,chen-greedy,lp-round"
    } else {
        "checkpoint-all,chen-sqrtn,chen-greedy,lp-round"
    };
    let (steps, baseline) = if ctx.quick { ("2", "1") } else { ("3", "2") };
    let mut runs = Vec::new();
    for m in models {
        let mut cases = vec![("checkpoint-all", "100%")];
        for b in budgets {
            for st in strategies {
                cases.push((*st, *b));
            }
        }
        for (st, b) in cases {
            let mut args: Vec<String> = vec![s("train")];
            args.extend(m.args.iter().map(|a| a.to_string()));
            args.extend(
                [
                    "--steps",
                    steps,
                    "--baseline-steps",
                    baseline,
                    "--budget",
                    b,
                    "--strategy",
                    st,
                    "--time-limit",
                    "5",
                    "--threads",
                    "1",
                    "--json",
                ]
                .iter()
                .map(|a| a.to_string()),
            );
            let r = ctx.checkmate(&args, Duration::from_secs(240));
            runs.push(json!({"model": m.label, "strategy": st, "budget": b,
                             "result": r.as_ref().ok(), "error": r.as_ref().err()}));
        }
    }
    let mut cap_rows = Vec::new();
    for (label, cap, model) in caps {
        let mut args: Vec<String> = vec![s("max-batch")];
        args.extend(model.iter().map(|a| a.to_string()));
        args.extend(
            [
                "--memory",
                cap,
                "--strategies",
                cap_strategies,
                "--limit",
                "1024",
                "--time-limit",
                "5",
                "--threads",
                "1",
                "--json",
            ]
            .iter()
            .map(|a| a.to_string()),
        );
        let r = ctx.checkmate(
            &args,
            Duration::from_secs(if ctx.quick { 120 } else { 300 }),
        );
        cap_rows.push(
            json!({"model": label, "memory": cap, "result": r.as_ref().ok(),
                             "error": r.as_ref().err()}),
        );
    }
    let reps =
        format!("{steps} plan steps after {baseline} checkpoint-all steps per run; 1 run per row");
    ctx.save(
        "train",
        &json!({"meta": ctx.meta(t0, &reps), "runs": runs, "caps": cap_rows,
                "cap_strategies": cap_strategies}),
    )
}

// ---------------------------------------------------------------------------------------------
// rendering

fn meta_lines(md: &mut String, v: &Value) -> Result<()> {
    let m = &v["meta"];
    writeln!(
        md,
        "- machine: {}\n- date: {}\n- command: `{}`{}\n- repetitions: {}\n- wall time of this part: {:.0} s\n",
        m["machine"].as_str().unwrap_or("?"),
        m["date"].as_str().unwrap_or("?"),
        m["command"].as_str().unwrap_or("?").replace('`', ""),
        if m["quick"] == true { " (quick mode: fewer graphs, points and shorter limits)" } else { "" },
        m["repetitions"].as_str().unwrap_or("?"),
        m["seconds"].as_f64().unwrap_or(0.0),
    )?;
    if let Some(e) = v["error"].as_str() {
        writeln!(md, "**This part failed:** {e}\n")?;
    }
    Ok(())
}

fn not_run(md: &mut String, part: &str) -> Result<()> {
    writeln!(
        md,
        "_Not run yet: `cargo xtask bench {part}` fills this section._\n"
    )?;
    Ok(())
}

pub(crate) fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / (1u64 << 30) as f64)
}

pub(crate) fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / (1u64 << 20) as f64)
}

fn opt_f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// Writes `docs/RESULTS.md` from the JSON files of the parts.
fn render(ctx: &Ctx) -> Result<()> {
    let mut md = String::new();
    writeln!(md, "# Results: the paper's experiments on our stack\n")?;
    writeln!(
        md,
        "Generated by `cargo xtask bench results` (xtask/src/bench_results.rs); do not edit by hand. \
         Every number below comes from the run named in its section; the paper's numbers are from \
         Jain et al., MLSys 2020 (arXiv:1910.02653, Table 2, Figure 6). \
         `cargo xtask bench results --quick` is a smaller run (fewer graphs, budgets, models and \
         shorter solver limits) meant to finish in a few minutes.\n"
    )?;
    if let Some(run) = ctx.load("run") {
        let parts = run["parts"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k} {:.0} s", v.as_f64().unwrap_or(0.0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        writeln!(
            md,
            "Last complete run: `{}` on {}, started {}, **{:.1} min** in all ({parts}; plus the \
             release build). A section whose date differs was regenerated on its own afterwards.\n",
            run["command"].as_str().unwrap_or("-"),
            run["machine"].as_str().unwrap_or("-"),
            run["started"].as_str().unwrap_or("-"),
            run["seconds"].as_f64().unwrap_or(0.0) / 60.0
        )?;
    }
    writeln!(md, "Contents: [1. Approximation quality](#1-approximation-quality-paper-table-2) · [2. Frontiers](#2-frontiers-paper-figure-5) · [3. Solve time](#3-solve-time) · [4. Largest batch](#4-largest-batch-paper-figure-6) · [5. Real training](#5-real-training-on-this-cpu) · [6. One plan](#6-one-plan-memory-over-time-and-the-r-and-s-matrices) · [7. Operator-level graphs](#7-operator-level-graphs-at-monets-sizes) · [8. Implementation choices](#8-implementation-choices-with-measured-costs)\n")?;
    let frontier = ctx.load("frontier");
    render_table2(&mut md, frontier.as_ref())?;
    render_frontiers(&mut md, frontier.as_ref())?;
    render_solver(&mut md, ctx.load("solver").as_ref())?;
    render_max_batch(&mut md, ctx.load("max-batch").as_ref())?;
    render_train(&mut md, ctx.load("train").as_ref())?;
    render_plan(&mut md, ctx.load("plan").as_ref())?;
    let path = ctx.root.join("docs/RESULTS.md");
    // Section 7 comes from `cargo xtask bench op`: kept as it is.
    if let Some(op) = crate::bench_op::section(&path) {
        md.push('\n');
        md.push_str(&op);
    }
    // Section 8 comes from `cargo xtask bench impl`: kept as it is.
    if let Some(choices) = crate::bench_impl::section(&path) {
        md.push('\n');
        md.push_str(&choices);
    }
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))
}

fn render_table2(md: &mut String, f: Option<&Value>) -> Result<()> {
    writeln!(md, "## 1. Approximation quality (paper Table 2)\n")?;
    let Some(f) = f else {
        return not_run(md, "frontier");
    };
    meta_lines(md, f)?;
    writeln!(
        md,
        "Geometric mean of cost / MILP cost over the sweep's budgets ({} evenly spaced activation \
         budgets from the least feasible one to the checkpoint-all peak) where both the strategy and \
         the MILP have a plan. The MILP (`milp`, HiGHS, {} s limit per budget, 1 thread) is the \
         optimum where it proved optimality; `†` marks a mean that includes budgets where it only \
         returned its best plan at the limit (then a ratio below 1 is possible). `(k/m)`: budgets \
         used / budgets with a MILP plan. Paper values in brackets (V100 profile costs; its \
         \"LP rounding\" is our `lp-round`; it has no Chen columns). Costs are the graphs' V100 \
         profile costs (`cost_cpu`).\n",
        f["points"], f["time_limit"]
    )?;
    write!(md, "| graph |")?;
    for s in TABLE2_STRATEGIES {
        write!(md, " {s} |")?;
    }
    writeln!(md)?;
    writeln!(md, "|---|{}", "---|".repeat(TABLE2_STRATEGIES.len()))?;
    for g in f["graphs"].as_array().into_iter().flatten() {
        let name = g["graph"].as_str().unwrap_or("?");
        if g["sweep"].is_null() {
            writeln!(
                md,
                "| {name} | failed: {} |{}",
                g["error"].as_str().unwrap_or("?"),
                " |".repeat(TABLE2_STRATEGIES.len() - 1)
            )?;
            continue;
        }
        let paper = paper_table2(name);
        write!(md, "| {name} |")?;
        for st in TABLE2_STRATEGIES {
            let r = ratios(&g["sweep"], st);
            let p = paper.and_then(|p| match *st {
                "ap-sqrtn" => p[0],
                "ap-greedy" => p[1],
                "griewank" => p[2],
                "lp-round" => p[3],
                _ => None,
            });
            let ours = match r.geomean {
                Some(x) => format!(
                    "{x:.2}{} ({}/{})",
                    if r.unproven > 0 { "†" } else { "" },
                    r.used,
                    r.feasible_milp
                ),
                None if r.feasible_milp == 0 => "no MILP plan".into(),
                None => format!("n/a (0/{})", r.feasible_milp),
            };
            let paper_cell = match (p, *st, paper.is_some()) {
                (Some(p), _, _) => format!(" [{p:.2}]"),
                (None, "griewank", true) => " [-]".into(),
                _ => String::new(),
            };
            write!(md, " {ours}{paper_cell} |")?;
        }
        writeln!(md)?;
    }
    writeln!(
        md,
        "\n`n/a`: the strategy had no plan within any of those budgets (griewank applies to chains \
         only; the sqrt(n)/greedy baselines cannot reach the lowest budgets). Differences from the \
         paper: our sweep starts at the least feasible budget of any strategy and includes the \
         checkpoint-all peak (ratio 1 for most strategies there), the paper's budget grid was its \
         own; our baselines get exactly the MILP's budget (the paper's got a smaller one), and our \
         memory accounting is SPEC.md's (frees within a stage, workspace) rather than the released \
         simulator's.\n"
    )?;
    Ok(())
}

fn render_frontiers(md: &mut String, f: Option<&Value>) -> Result<()> {
    writeln!(md, "## 2. Frontiers (paper Figure 5)\n")?;
    let Some(f) = f else {
        return not_run(md, "frontier");
    };
    writeln!(
        md,
        "Compute overhead (plan cost / checkpoint-all cost - 1) versus activation budget, one line \
         per strategy, drawn by `checkmate sweep --svg` in the run of section 1 (strategies: {}). \
         A missing point means the strategy had no plan within that budget. No point costs more \
         than a point of the same strategy with less memory: `milp` and `lp-round` solve the \
         budgets in ascending order, each starting from the plan of the budget below, and any \
         strategy's point that is costlier than a smaller budget's takes that plan (`^` in the \
         tables). Filled markers are proven optimal, hollow ones are not; in the tables, \
         `(not proven)` marks the `milp` and `lp-round` points without a proof.\n",
        f["strategies"].as_str().unwrap_or("?")
    )?;
    for g in f["graphs"].as_array().into_iter().flatten() {
        let name = g["graph"].as_str().unwrap_or("?");
        let Some(sw) = g["sweep"].as_object() else {
            writeln!(
                md,
                "- {name}: sweep failed: {}\n",
                g["error"].as_str().unwrap_or("?")
            )?;
            continue;
        };
        let least = sw["least_feasible_bytes"].as_u64();
        let proven = sw["strategies"].as_array().is_some_and(|a| {
            a.iter()
                .any(|s| s["least_feasible_bytes"].as_u64() == least && s["least_proven"] == true)
        });
        writeln!(
            md,
            "### {name}\n\nleast feasible activation budget {}{}, checkpoint-all peak {}, sweep {:.0} s\n\n![{name} frontier]({})\n",
            gib(least.unwrap_or(0) as f64),
            if proven { " (proven)" } else { " (a plan exists there; not proven least)" },
            gib(sw["checkpoint_all_peak_bytes"].as_f64().unwrap_or(0.0)),
            sw["seconds"].as_f64().unwrap_or(0.0),
            g["svg"].as_str().unwrap_or("")
        )?;
        // The numbers behind the figure.
        let budgets: Vec<u64> = sw["budgets"]
            .as_array()
            .map(|b| b.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let strategies: Vec<String> = sw["strategies"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let proving: Vec<String> = sw["strategies"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|s| s["proves_optimality"].as_bool() == Some(true))
                    .filter_map(|s| s["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        write!(md, "| budget |")?;
        for st in &strategies {
            write!(md, " {st} |")?;
        }
        writeln!(md, "\n|---|{}", "---|".repeat(strategies.len()))?;
        let points = sw["points"].as_array().cloned().unwrap_or_default();
        for b in budgets {
            write!(md, "| {} |", gib(b as f64))?;
            for st in &strategies {
                let p = points
                    .iter()
                    .find(|p| p["budget_bytes"].as_u64() == Some(b) && p["strategy"] == **st);
                let carried = p.is_some_and(|p| !p["carried_from_bytes"].is_null());
                let mark = if carried { "^" } else { "" };
                let cell = match p {
                    None => "?".to_string(),
                    Some(p) => match (p["overhead"].as_f64(), p["status"].as_str()) {
                        (Some(o), Some("optimal")) => format!("{:+.1}%{mark}", 100.0 * o),
                        (Some(o), Some(_)) if proving.contains(st) => {
                            format!("{:+.1}%{mark} (not proven)", 100.0 * o)
                        }
                        (Some(o), Some("feasible") | None) => format!("{:+.1}%{mark}", 100.0 * o),
                        (Some(o), Some(st)) => format!("{:+.1}%{mark} ({st})", 100.0 * o),
                        (None, Some("infeasible" | "no-plan-found")) => "-".into(),
                        (None, Some(st)) => st.to_string(),
                        (None, None) => "?".into(),
                    },
                };
                write!(md, " {cell} |")?;
            }
            writeln!(md)?;
        }
        writeln!(md)?;
    }
    Ok(())
}

fn render_solver(md: &mut String, f: Option<&Value>) -> Result<()> {
    writeln!(md, "## 3. Solve time\n")?;
    let Some(f) = f else {
        writeln!(
            md,
            "See [SOLVER_BENCH.md](SOLVER_BENCH.md) (the solver benchmark's own file).\n"
        )?;
        return not_run(md, "results");
    };
    meta_lines(md, f)?;
    writeln!(
        md,
        "Both MILP formulations (`milp` = our default, `milp --formulation paper`) and `lp-round` \
         per graph and budget, with status, lower bound and seconds, from `cargo xtask bench solver` \
         (xtask/src/bench_solver.rs) as part of this run. Its full-length run with longer limits is \
         [SOLVER_BENCH.md](SOLVER_BENCH.md). The paper: VGG16 in seconds, most budgets within \
         minutes on 24+ cores with Gurobi, ResNet50-size graphs up to an hour.\n"
    )?;
    let text = f["file"]
        .as_str()
        .and_then(|p| std::fs::read_to_string(p).ok());
    match text {
        Some(t) => {
            // Embed it, one heading level down, without its title.
            for line in t.lines().skip_while(|l| !l.starts_with("- ")) {
                if line.starts_with('#') {
                    writeln!(md, "##{line}")?;
                } else {
                    writeln!(md, "{line}")?;
                }
            }
            writeln!(md)?;
        }
        None => writeln!(md, "_The solver benchmark wrote no file._\n")?,
    }
    Ok(())
}

fn render_max_batch(md: &mut String, f: Option<&Value>) -> Result<()> {
    writeln!(md, "## 4. Largest batch (paper Figure 6)\n")?;
    let Some(f) = f else {
        return not_run(md, "max-batch");
    };
    meta_lines(md, f)?;
    writeln!(
        md,
        "Largest batch whose training step (static memory + activation peak, SPEC.md accounting with \
         workspace) fits {} = 16 GiB, with FLOP costs and plans costing at most checkpoint-all plus \
         one forward pass (`checkmate max-batch --memory {} --max-extra-forwards 1 --no-confirm`, \
         solver limit {} s per probe, 1 thread; models at their zoo defaults: 224x224 classifiers, \
         416x608 U-Net, SGD with momentum). `limit (LF)`: the largest batch at which the least \
         activation memory any plan needs (`Graph::min_feasible_activation_bytes`) plus static memory \
         fits, i.e. what no strategy can exceed in our memory model. `w/o workspace`: \
         checkpoint-all's batch and the least-feasible limit if nodes had no workspace (Checkmate's \
         graphs count outputs only), with their ratio: the most any strategy could gain there.\n",
        GPU_MEMORY, GPU_MEMORY, f["time_limit"]
    )?;
    let strategies: Vec<&str> = f["strategies"].as_str().unwrap_or("").split(',').collect();
    write!(md, "| model |")?;
    for st in &strategies {
        write!(md, " {st} |")?;
    }
    writeln!(
        md,
        " best / ckpt-all | limit (LF) | w/o workspace: ckpt-all, LF | paper |"
    )?;
    writeln!(
        md,
        "|---|{}---|---|---|---|",
        "---|".repeat(strategies.len())
    )?;
    for m in f["models"].as_array().into_iter().flatten() {
        let name = m["model"].as_str().unwrap_or("?");
        write!(md, "| {name} |")?;
        let items = m["result"]["strategies"].as_array().cloned();
        let mut all = None;
        let mut best: Option<u64> = None;
        for st in &strategies {
            let cell = match &items {
                None => format!("failed: {}", m["error"].as_str().unwrap_or("?")),
                Some(items) => match items.iter().find(|i| i["strategy"] == *st) {
                    None => "?".into(),
                    Some(i) => match i["max_batch"].as_u64() {
                        Some(b) => {
                            if *st == "checkpoint-all" {
                                all = Some(b);
                            }
                            best = Some(best.map_or(b, |x| x.max(b)));
                            let o = i["overhead"].as_f64().unwrap_or(1.0);
                            format!("{b} ({:+.0}%)", 100.0 * (o - 1.0))
                        }
                        None => i["error"]
                            .as_str()
                            .map(|e| format!("failed: {}", clip(e, 80)))
                            .unwrap_or_else(|| "0".into()),
                    },
                },
            };
            write!(md, " {cell} |")?;
        }
        let ratio = match (best, all) {
            (Some(b), Some(a)) if a > 0 => format!("{:.2}x", b as f64 / a as f64),
            _ => "-".into(),
        };
        let l = &m["limits"];
        let paper = match name {
            "vgg19" => "167 / 197 / 266 / 289 (ckpt-all / chen-sqrtn / chen-greedy / Checkmate)",
            "mobilenet" => "Checkmate 5.1x checkpoint-all",
            "unet" => "61 vs 16 (Checkmate vs ckpt-all)",
            _ => "-",
        };
        writeln!(
            md,
            " {ratio} | {} | {} | {paper} |",
            l["least_feasible_batch"].as_u64().map_or_else(
                || m["limits_error"].as_str().unwrap_or("?").to_string(),
                |x| x.to_string()
            ),
            match (
                l["checkpoint_all_batch_no_workspace"].as_u64(),
                l["least_feasible_batch_no_workspace"].as_u64()
            ) {
                (Some(a), Some(b)) => format!("{a}, {b} ({:.1}x)", b as f64 / a.max(1) as f64),
                _ => "?".into(),
            },
        )?;
    }
    writeln!(
        md,
        "\nCells: largest batch (compute overhead of its plan vs checkpoint-all at that batch). \
         Why our ratios differ from the paper's:\n\n\
         - **Budgets.** The paper's baselines were given a smaller memory budget than its MILP (see \
           the paper notes); here every strategy gets the same 16 GiB, which helps the baselines.\n\
         - **Accounting.** The paper's simulator freed nothing unless a debug flag was set and \
           counted outputs only (4 bytes per float) with parameters and gradients as static memory. \
           SPEC.md counts each node's workspace (im2col buffers, see docs/MODELS.md), the momentum \
           buffer and the input batch, and frees tensors within a stage. Workspace raises the floor \
           that no plan can go below (the `limit (LF)` column: a convolution's input, output and \
           workspace must be live together), so the headroom rematerialization can win, `limit / \
           checkpoint-all`, is smaller than in the paper's accounting.\n\
         - **Graphs.** Our zoo models are built from our layer IR (docs/MODELS.md), not the paper's \
           Keras graphs; the U-Net here is our `unet` at 416x608.\n\
         - **The overhead cap** (one extra forward pass) binds for the heuristics and the MILP alike; \
           the MILP with a {} s limit per probe may return a plan that is not optimal, and a probe \
           that finds no plan in time counts as not fitting.\n",
        f["time_limit"]
    )?;
    Ok(())
}

fn render_train(md: &mut String, f: Option<&Value>) -> Result<()> {
    writeln!(md, "## 5. Real training on this CPU\n")?;
    let Some(f) = f else {
        return not_run(md, "train");
    };
    meta_lines(md, f)?;
    writeln!(
        md,
        "`checkmate train --json` per row (candle CPU kernels, SGD, synthetic data, FLOP costs, solver \
         limit 5 s). Budgets are percentages of the checkpoint-all activation peak (plus static \
         memory). `predicted live` is the simulator's peak of live tensors, `measured live` the \
         executor's register bytes (the executor stops if they ever differ from the simulator's); \
         `heap` is the counting allocator's peak during the steps (including kernel temporaries and \
         static memory), beside `predicted + static`. Step time: median over the plan's steps; \
         overheads relative to the checkpoint-all steps of the same run. `weights equal`: the \
         weights after the plan's steps equal checkpoint-all's bit for bit. Step times were \
         measured while other jobs shared the 2 cores, so single-run overheads are noisy (a \
         checkpoint-all row shows the noise: its ideal overhead is 1.00x).\n"
    )?;
    let mut model = String::new();
    for r in f["runs"].as_array().into_iter().flatten() {
        let label = r["model"].as_str().unwrap_or("?");
        if label != model {
            model = label.to_string();
            writeln!(md, "\n### {label}\n")?;
            writeln!(md, "| budget | strategy | status | predicted live | measured live | predicted + static | heap | median step (s) | predicted overhead | measured overhead | weights equal |")?;
            writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|")?;
        }
        let st = r["strategy"].as_str().unwrap_or("?");
        let b = r["budget"].as_str().unwrap_or("?");
        let v = &r["result"];
        if v.is_null() || v.get("losses").is_none() {
            let why = r["error"]
                .as_str()
                .map(String::from)
                .or_else(|| v["error"].as_str().map(String::from))
                .unwrap_or_else(|| "no result".into());
            writeln!(
                md,
                "| {b} | {st} | failed: {} | | | | | | | | |",
                clip(&why, 160)
            )?;
            continue;
        }
        let mut steps: Vec<f64> = v["step_seconds"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        steps.sort_by(f64::total_cmp);
        let median = steps.get(steps.len() / 2).copied();
        let pp = v["predicted_peak_bytes"].as_f64().unwrap_or(0.0);
        let stat = v["static_bytes"].as_f64().unwrap_or(0.0);
        writeln!(
            md,
            "| {b} | {st} | ok | {} | {} | {} | {} | {} | {} | {} | {} |",
            mib(v["predicted_live_peak_bytes"].as_f64().unwrap_or(0.0)),
            mib(v["measured_peak_bytes"].as_f64().unwrap_or(0.0)),
            mib(pp + stat),
            mib(v["heap_peak_bytes"].as_f64().unwrap_or(0.0)),
            opt_f(median, 3),
            v["predicted_overhead"]
                .as_f64()
                .map_or("-".into(), |o| format!("{o:.2}x")),
            v["measured_overhead"]
                .as_f64()
                .map_or("-".into(), |o| format!("{o:.2}x")),
            match v["params_match_checkpoint_all"].as_bool() {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            }
        )?;
    }
    writeln!(
        md,
        "\n### Largest batch actually trained under a memory cap\n"
    )?;
    writeln!(
        md,
        "`checkmate max-batch` (no overhead cap, solver limit 5 s): the largest batch whose predicted \
         peak plus static memory fits the cap, confirmed by one real training step at that batch \
         (`confirmed`: measured register bytes equal the prediction after every step). `heap` is the \
         whole process's heap peak during that step: it includes candle's kernel temporaries and the \
         optimizer update, which the memory model does not bound, so it can exceed the cap.\n"
    )?;
    writeln!(md, "| model | cap | strategy | max batch | static | predicted live | measured live | predicted total | heap | confirmed | step (s) |")?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for c in f["caps"].as_array().into_iter().flatten() {
        let label = c["model"].as_str().unwrap_or("?");
        let cap = c["memory"].as_str().unwrap_or("?");
        let Some(items) = c["result"]["strategies"].as_array() else {
            writeln!(
                md,
                "| {label} | {cap} | - | failed: {} | | | | | | | |",
                clip(c["error"].as_str().unwrap_or("?"), 160)
            )?;
            continue;
        };
        for i in items {
            writeln!(
                md,
                "| {label} | {cap} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                i["strategy"].as_str().unwrap_or("?"),
                i["max_batch"].as_u64().map_or_else(
                    || i["error"].as_str().unwrap_or("none").to_string(),
                    |b| b.to_string()
                ),
                i["static_bytes"].as_f64().map_or("-".into(), mib),
                i["peak_bytes"].as_f64().map_or("-".into(), mib),
                i["measured_live_peak_bytes"]
                    .as_f64()
                    .map_or("-".into(), mib),
                i["total_bytes"].as_f64().map_or("-".into(), mib),
                i["heap_peak_bytes"].as_f64().map_or("-".into(), mib),
                match i["confirmed"].as_bool() {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "-",
                },
                opt_f(i["step_seconds"].as_f64(), 3),
            )?;
        }
    }
    writeln!(md)?;
    Ok(())
}

fn render_plan(md: &mut String, f: Option<&Value>) -> Result<()> {
    writeln!(
        md,
        "## 6. One plan: memory over time and the R and S matrices\n"
    )?;
    let Some(f) = f else {
        return not_run(md, "plan");
    };
    meta_lines(md, f)?;
    for p in f["plans"].as_array().into_iter().flatten() {
        let v = &p["solve"];
        if v.is_null() || v["status"] == "infeasible" {
            writeln!(
                md,
                "- {} at budget {}: failed: {}",
                p["strategy"].as_str().unwrap_or("?"),
                p["budget"].as_str().unwrap_or("?"),
                p["error"].as_str().unwrap_or("?")
            )?;
            continue;
        }
        writeln!(
            md,
            "- `{}` at total budget {}: status {}, peak {}, cost overhead {:+.1}%, {} computes, solved in {:.1} s",
            p["strategy"].as_str().unwrap_or("?"),
            gib(v["budget_bytes"].as_f64().unwrap_or(0.0)),
            v["status"].as_str().unwrap_or("?"),
            gib(v["peak_bytes"].as_f64().unwrap_or(0.0)),
            100.0 * v["overhead"].as_f64().unwrap_or(0.0),
            v["computes"],
            v["solve_seconds"].as_f64().unwrap_or(0.0),
        )?;
    }
    writeln!(md)?;
    let figs = &f["figures"];
    if let Some(t) = figs["timeline"].as_str() {
        writeln!(
            md,
            "Live activation bytes after every step of the plan (`checkmate simulate --timeline`) for \
             the MILP plan on {} at 30% of the way from the least feasible budget to the \
             checkpoint-all peak, and for checkpoint-all; the dashed line is the MILP's activation \
             budget.\n\n![memory over time]({t})\n",
            f["graph"].as_str().unwrap_or("?")
        )?;
    }
    if let Some(rs) = figs["rs"].as_str() {
        writeln!(
            md,
            "The same MILP plan as the paper draws it: row t is stage t, column i is node i (forward \
             nodes, loss, then backward nodes in topological order). R[t,i] (left): node i is computed \
             in stage t; the diagonal is the frontier, cells left of it are recomputations. S[t,i] \
             (right): tensor i is live when stage t starts. Stages are derived from the plan (stage t \
             ends at the first compute of node t); {} computes in {} stages.\n\n![R and S]({rs})\n",
            figs["recomputed_cells"], figs["stages"]
        )?;
    }
    Ok(())
}
