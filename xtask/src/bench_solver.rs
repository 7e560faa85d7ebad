//! `cargo xtask bench solver`: every strategy on the seven Checkmate graphs at three budgets,
//! single-threaded, written to `docs/SOLVER_BENCH.md`.
//!
//! Budgets are the least feasible activation budget plus 10%, 30% and 50% of the way to the
//! checkpoint-all peak. The least feasible budget is the MILP's proven minimum peak when it is
//! found within the time limit, otherwise the least peak of the heuristics (marked `~`).
//! Options: `--time-limit SEC` (per MILP solve, default 300), `--out FILE`, `--graphs DIR`,
//! `--only SUBSTRING` (graphs whose file name contains it), `--no-paper`, `--random` (also run
//! `lp-round` on the random layered graphs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use checkmate_graph::Graph;
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::{
    milp, solve, strategy_by_name, Error, Formulation, SolveOptions, Status, STRATEGY_NAMES,
};

struct Args {
    time_limit: Duration,
    out: PathBuf,
    graphs: PathBuf,
    only: Option<String>,
    paper: bool,
    random: bool,
}

fn parse(args: &[String]) -> Result<Args> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut a = Args {
        time_limit: Duration::from_secs(300),
        out: root.join("docs/SOLVER_BENCH.md"),
        graphs: root.join("../shared/graphs/checkmate"),
        only: None,
        paper: true,
        random: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--time-limit" => a.time_limit = Duration::from_secs_f64(value()?.parse()?),
            "--out" => a.out = PathBuf::from(value()?),
            "--graphs" => a.graphs = PathBuf::from(value()?),
            "--only" => a.only = Some(value()?.clone()),
            "--no-paper" => a.paper = false,
            "--random" => a.random = true,
            other => bail!("unknown option {other}; see xtask/src/bench_solver.rs"),
        }
    }
    Ok(a)
}

struct Row {
    strategy: String,
    status: String,
    cost: Option<f64>,
    lower_bound: Option<f64>,
    seconds: f64,
}

fn run_one(g: &Graph, name: &str, budget: u64, options: &SolveOptions, label: &str) -> Result<Row> {
    let s = strategy_by_name(name)?;
    let t0 = Instant::now();
    let row = match solve(g, s.as_ref(), budget, options) {
        Ok(sol) => Row {
            strategy: label.to_string(),
            status: sol.status.to_string(),
            cost: sol.cost(),
            lower_bound: sol.lower_bound,
            seconds: sol.solve_seconds,
        },
        Err(Error::BudgetTooSmall { .. }) => Row {
            strategy: label.to_string(),
            status: "no plan".into(),
            cost: None,
            lower_bound: None,
            seconds: t0.elapsed().as_secs_f64(),
        },
        Err(Error::NotApplicable { .. }) => Row {
            strategy: label.to_string(),
            status: "n/a".into(),
            cost: None,
            lower_bound: None,
            seconds: t0.elapsed().as_secs_f64(),
        },
        Err(e) => Row {
            strategy: label.to_string(),
            status: format!("error: {e}"),
            cost: None,
            lower_bound: None,
            seconds: t0.elapsed().as_secs_f64(),
        },
    };
    eprintln!(
        "  {label:<16} {:<10} cost {:>14} lb {:>14} {:>8.2}s",
        row.status,
        row.cost.map_or("-".into(), |c| format!("{c:.1}")),
        row.lower_bound.map_or("-".into(), |c| format!("{c:.1}")),
        row.seconds
    );
    Ok(row)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cores} cores available (runs single-threaded)")
}

fn today() -> String {
    std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Runs the solver benchmark (see the module docs).
pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&a.graphs)
        .with_context(|| format!("reading {}", a.graphs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| {
            a.only.as_ref().is_none_or(|o| {
                p.file_name()
                    .is_some_and(|f| f.to_string_lossy().contains(o))
            })
        })
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0));
    let options = SolveOptions {
        time_limit: Some(a.time_limit),
        threads: 1,
        ..SolveOptions::default()
    };
    let mut md = String::new();
    let mut speedups: Vec<f64> = Vec::new();
    let mut lp_ratios: Vec<f64> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    writeln!(md, "# Solver benchmark\n")?;
    writeln!(md, "- machine: {}", machine())?;
    writeln!(md, "- date: {}", today())?;
    writeln!(
        md,
        "- command: `cargo xtask bench solver {}` (release build of xtask)",
        args.join(" ")
    )?;
    writeln!(
        md,
        "- time limit per MILP solve: {} s; mip gap {}; threads 1",
        a.time_limit.as_secs_f64(),
        options.mip_gap
    )?;
    writeln!(
        md,
        "- budgets: least feasible activation budget (LF) plus 10/30/50% of the way to the checkpoint-all peak\n"
    )?;
    let mut tables = String::new();
    for path in &files {
        let g = Graph::read(path).with_context(|| format!("reading {}", path.display()))?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        eprintln!("{stem}: {} nodes", g.len());
        let all = CheckpointAll::peak_bytes(&g);
        let t0 = Instant::now();
        let proven = milp::least_feasible_budget(&g, &options)?;
        let lf_seconds = t0.elapsed().as_secs_f64();
        let (lf, mark) = match proven {
            Some(b) => (b, ""),
            None => {
                // The least peak among the heuristics that fit at the checkpoint-all peak.
                let mut least = all;
                for &name in STRATEGY_NAMES {
                    if name == "milp" || name == "lp-round" {
                        continue;
                    }
                    if let Ok(sol) = solve(&g, strategy_by_name(name)?.as_ref(), all, &options) {
                        least = least.min(sol.peak_bytes().unwrap_or(all));
                    }
                }
                (least, "~")
            }
        };
        writeln!(
            tables,
            "## {stem} ({} nodes)\n\ncheckpoint-all peak {} B; least feasible {mark}{} B ({:.1} s to {})\n",
            g.len(),
            all,
            lf,
            lf_seconds,
            if proven.is_some() { "prove" } else { "fail to prove; heuristic value" }
        )?;
        writeln!(
            tables,
            "| budget | strategy | status | cost | cost / optimal | lower bound | seconds |\n|---|---|---|---|---|---|---|"
        )?;
        for frac in [0.1, 0.3, 0.5] {
            let budget = lf + ((all.saturating_sub(lf)) as f64 * frac).round() as u64;
            eprintln!(" budget LF+{:.0}% = {budget}", frac * 100.0);
            let mut rows = Vec::new();
            for &name in STRATEGY_NAMES {
                rows.push(run_one(&g, name, budget, &options, name)?);
            }
            if a.paper {
                let paper = SolveOptions {
                    formulation: Formulation::Paper,
                    ..options.clone()
                };
                rows.push(run_one(
                    &g,
                    "milp",
                    budget,
                    &paper,
                    "milp --formulation paper",
                )?);
            }
            let optimal = rows
                .iter()
                .filter(|r| r.strategy.starts_with("milp") && r.status == Status::Optimal.as_str())
                .filter_map(|r| r.cost)
                .fold(None, |acc: Option<f64>, c| {
                    Some(acc.map_or(c, |a| a.min(c)))
                });
            let fast = rows.iter().find(|r| r.strategy == "milp");
            let paper = rows
                .iter()
                .find(|r| r.strategy == "milp --formulation paper");
            if let (Some(f), Some(p)) = (fast, paper) {
                if f.status == "optimal" {
                    speedups.push(p.seconds / f.seconds.max(1e-3));
                    if p.status != "optimal" {
                        notes.push(format!(
                            "{stem} LF+{:.0}%: paper formulation hit the time limit; its speedup counted at the limit (a lower bound)",
                            frac * 100.0
                        ));
                    }
                } else {
                    notes.push(format!(
                        "{stem} LF+{:.0}%: default milp did not prove optimality in {} s ({})",
                        frac * 100.0,
                        a.time_limit.as_secs(),
                        f.status
                    ));
                }
            }
            for r in &rows {
                let ratio = match (r.cost, optimal) {
                    (Some(c), Some(o)) if o > 0.0 => format!("{:.3}", c / o),
                    _ => "-".into(),
                };
                if r.strategy == "lp-round" {
                    match (r.cost, optimal) {
                        (Some(c), Some(o)) if o > 0.0 => lp_ratios.push(c / o),
                        (None, Some(_)) => notes.push(format!(
                            "{stem} LF+{:.0}%: lp-round found no plan",
                            frac * 100.0
                        )),
                        _ => {}
                    }
                }
                writeln!(
                    tables,
                    "| LF+{:.0}% ({budget}) | {} | {} | {} | {ratio} | {} | {:.2} |",
                    frac * 100.0,
                    r.strategy,
                    r.status,
                    r.cost.map_or("-".into(), |c| format!("{c:.1}")),
                    r.lower_bound.map_or("-".into(), |c| format!("{c:.1}")),
                    r.seconds
                )?;
            }
        }
        writeln!(tables)?;
    }
    if a.random {
        let dir = a.graphs.join("../random_layered");
        writeln!(tables, "## lp-round on the random layered graphs\n")?;
        writeln!(
            tables,
            "Budget: halfway between the largest single-node need and the checkpoint-all peak.\n\n| graph | nodes | budget | status | cost | seconds |\n|---|---|---|---|---|---|"
        )?;
        let mut rfiles: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        rfiles.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0));
        for path in rfiles {
            let g = Graph::read(&path)?;
            let all = CheckpointAll::peak_bytes(&g);
            let lo = g.min_feasible_activation_bytes();
            let budget = lo + (all.saturating_sub(lo)) / 2;
            let row = run_one(
                &g,
                "lp-round",
                budget,
                &SolveOptions {
                    time_limit: None,
                    ..options.clone()
                },
                "lp-round",
            )?;
            writeln!(
                tables,
                "| {} | {} | {budget} | {} | {} | {:.2} |",
                path.file_stem()
                    .map(|s| s.to_string_lossy().to_string())
                    .unwrap_or_default(),
                g.len(),
                row.status,
                row.cost.map_or("-".into(), |c| format!("{c:.1}")),
                row.seconds
            )?;
        }
        writeln!(tables)?;
    }
    let geo = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
        }
    };
    writeln!(md, "## Summary\n")?;
    writeln!(
        md,
        "- default `milp` vs `--formulation paper`: geometric-mean speedup {:.1}x over {} instances where the default proved optimality",
        geo(&speedups),
        speedups.len()
    )?;
    writeln!(
        md,
        "- `lp-round` cost / optimal: geometric mean {:.3}, worst {:.3} over {} instances",
        geo(&lp_ratios),
        lp_ratios.iter().cloned().fold(f64::NAN, f64::max),
        lp_ratios.len()
    )?;
    for n in &notes {
        writeln!(md, "- {n}")?;
    }
    writeln!(md)?;
    md.push_str(&tables);
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, md).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
