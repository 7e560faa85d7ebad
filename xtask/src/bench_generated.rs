//! `cargo xtask bench generated`: `lp-round` against `milp` on random layered graphs of our own
//! generator, which nobody tuned either strategy to, written to `docs/GENERATED_BENCH.md`.
//!
//! Graph `k` (seed `k`) has `20 + (k * 7) % 31` nodes (20 to 50) and width factor 0.27 (about 12
//! levels at 40 nodes, the graphs of the report in issue 24); its budget lies a seeded fraction
//! (0.1 to 0.9) of the way from the proven floor (a node, its inputs and its workspace together)
//! to the checkpoint-all peak. Each solve is one `checkmate solve --json` process (HiGHS runs one
//! solve at a time per process), two at a time. `milp` gets `--milp-limit` seconds,
//! `lp-round` its default limit.
//!
//! `--suite families` (docs/FAMILIES_BENCH.md) instead draws training graphs of every
//! [`Family`] (chain, U-Net, residual, transformer, layered, in turn): graph `k` has
//! `10 + (k * 7) % 51` forward nodes, so 21 to 121 nodes with its loss and backward.
//! Options: `--suite layered|families`, `--graphs N` (default 200; 260 for families, whose larger
//! graphs milp proves less often), `--milp-limit SEC` (default 30), `--out FILE`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use checkmate_graph::generate::{random_layered, Family, LayeredParams, Rng};
use checkmate_solver::baselines::CheckpointAll;

struct Args {
    families: bool,
    graphs: usize,
    milp_limit: f64,
    out: PathBuf,
}

/// One strategy's answer at one point, from `checkmate solve --json`.
#[derive(Debug, Clone)]
struct Answer {
    status: String,
    cost: Option<f64>,
    seconds: f64,
}

struct Point {
    family: &'static str,
    seed: u64,
    nodes: usize,
    budget: u64,
    milp: Answer,
    lp: Answer,
}

fn parse(args: &[String]) -> Result<Args> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (mut families, mut graphs, mut milp_limit, mut out) = (false, None, 30.0, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--suite" => {
                families = match value()?.as_str() {
                    "layered" => false,
                    "families" => true,
                    other => bail!("--suite {other}: give layered or families"),
                }
            }
            "--graphs" => graphs = Some(value()?.parse()?),
            "--milp-limit" => milp_limit = value()?.parse()?,
            "--out" => out = Some(PathBuf::from(value()?)),
            other => bail!("unknown option {other}; see xtask/src/bench_generated.rs"),
        }
    }
    let (default_graphs, default_out) = if families {
        (260, "docs/FAMILIES_BENCH.md")
    } else {
        (200, "docs/GENERATED_BENCH.md")
    };
    Ok(Args {
        families,
        graphs: graphs.unwrap_or(default_graphs),
        milp_limit,
        out: out.unwrap_or_else(|| root.join(default_out)),
    })
}

/// Runs `checkmate solve` on one graph file; errors (no plan) are answers too.
fn solve(bin: &Path, graph: &Path, strategy: &str, budget: u64, limit: Option<f64>) -> Answer {
    let mut cmd = Command::new(bin);
    cmd.args(["solve", "--graph"])
        .arg(graph)
        .args(["--strategy", strategy, "--budget", &budget.to_string()])
        .args(["--threads", "1", "--json"]);
    if let Some(l) = limit {
        cmd.args(["--time-limit", &l.to_string()]);
    }
    let t0 = std::time::Instant::now();
    let out = cmd.output();
    let seconds = t0.elapsed().as_secs_f64();
    let parsed = out.ok().and_then(|o| {
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let line = text.lines().last()?.to_string();
        serde_json::from_str::<serde_json::Value>(&line).ok()
    });
    match parsed {
        Some(v) => Answer {
            status: v["status"].as_str().unwrap_or("?").to_string(),
            cost: v["cost"].as_f64(),
            seconds: v["solve_seconds"].as_f64().unwrap_or(seconds),
        },
        None => Answer {
            status: "crashed".into(),
            cost: None,
            seconds,
        },
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
    let dir = std::env::temp_dir().join(format!("checkmate-generated-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut jobs = Vec::new();
    for seed in 0..a.graphs as u64 {
        let (family, g) = if a.families {
            let f = Family::ALL[seed as usize % Family::ALL.len()];
            (f.name(), f.training(10 + (seed as usize * 7) % 51, seed)?)
        } else {
            let nodes = 20 + (seed as usize * 7) % 31;
            (
                "layered",
                random_layered(&LayeredParams::moccasin(nodes, 0.27), seed)?,
            )
        };
        let nodes = g.len();
        let floor = g.min_feasible_activation_bytes();
        let peak = CheckpointAll::peak_bytes(&g);
        let frac = 0.1 + 0.8 * Rng::new(seed ^ 0xb0d9e7).unit();
        let budget = floor + ((peak - floor) as f64 * frac) as u64;
        let path = dir.join(format!("g{seed}.json"));
        g.write(&path)?;
        jobs.push((family, seed, nodes, budget, path));
    }
    let next = AtomicUsize::new(0);
    let points: Mutex<Vec<Point>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                let Some((family, seed, nodes, budget, path)) = jobs.get(k) else {
                    break;
                };
                let milp = solve(&bin, path, "milp", *budget, Some(a.milp_limit));
                let lp = solve(&bin, path, "lp-round", *budget, None);
                eprintln!(
                    "[{}/{}] {family} seed {seed} ({nodes} nodes) at {budget}: milp {} {:?} ({:.1} s), lp-round {} {:?} ({:.1} s)",
                    k + 1,
                    jobs.len(),
                    milp.status,
                    milp.cost,
                    milp.seconds,
                    lp.status,
                    lp.cost,
                    lp.seconds
                );
                points.lock().unwrap().push(Point {
                    family,
                    seed: *seed,
                    nodes: *nodes,
                    budget: *budget,
                    milp,
                    lp,
                });
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    let mut points = points.into_inner().unwrap();
    points.sort_by_key(|p| p.seed);
    write_report(&a, &points)
}

fn write_report(a: &Args, points: &[Point]) -> Result<()> {
    let with_plan = |x: &Answer| x.cost.is_some();
    let milp_plans = points.iter().filter(|p| with_plan(&p.milp)).count();
    let missed: Vec<&Point> = points
        .iter()
        .filter(|p| with_plan(&p.milp) && !with_plan(&p.lp))
        .collect();
    let false_infeasible = points
        .iter()
        .filter(|p| p.lp.status == "infeasible" && with_plan(&p.milp))
        .count();
    let proven: Vec<(&Point, f64)> = points
        .iter()
        .filter(|p| p.milp.status == "optimal")
        .filter_map(|p| Some((p, p.lp.cost? / p.milp.cost?)))
        .collect();
    let worst = proven.iter().map(|(_, r)| *r).fold(1.0, f64::max);
    let geo = (proven.iter().map(|(_, r)| r.ln()).sum::<f64>() / proven.len().max(1) as f64).exp();
    let over5 = proven.iter().filter(|(_, r)| *r > 1.05).count();
    let mut lp_secs: Vec<f64> = points.iter().map(|p| p.lp.seconds).collect();
    lp_secs.sort_by(f64::total_cmp);
    let median = lp_secs.get(lp_secs.len() / 2).copied().unwrap_or(0.0);
    let max = lp_secs.last().copied().unwrap_or(0.0);
    let mut md = String::new();
    writeln!(md, "# lp-round against milp on generated graphs\n")?;
    writeln!(
        md,
        "Generated by `cargo xtask bench generated{}` (xtask/src/bench_generated.rs); do not edit by \
         hand. Run {} on {}. {} {}, one \
         budget each, a seeded fraction 0.1-0.9 of the way from the proven floor to the \
         checkpoint-all peak. `milp`: {} s limit; `lp-round`: its default limit (0.25 s per node, \
         at least 8 s; up to 4 times that, at least 30 s, while it has no plan); one thread each, two solves at a time in separate processes.\n",
        if a.families { " --suite families" } else { "" },
        crate::bench_results::date(),
        crate::bench_results::machine(),
        points.len(),
        if a.families {
            "training graphs of our own generator's families (`checkmate_graph::generate::Family`: \
             chain, U-Net with skips, residual blocks, transformer blocks with Q/K/V fan-out, random \
             layered, in turn; 10-60 forward nodes, so 21-121 with loss and backward; seed = graph \
             number)"
        } else {
            "random layered graphs of our own generator (`checkmate_graph::generate`, width factor \
             0.27, 20-50 nodes, seed = graph number)"
        },
        a.milp_limit
    )?;
    writeln!(md, "## Targets\n")?;
    writeln!(
        md,
        "- **lp-round returns a plan wherever milp does: {}** ({} of {} points where milp has a \
         plan{}).",
        if missed.is_empty() { "met" } else { "missed" },
        milp_plans - missed.len(),
        milp_plans,
        if missed.is_empty() {
            String::new()
        } else {
            format!(
                "; missed at seeds {}",
                missed
                    .iter()
                    .map(|p| p.seed.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    )?;
    writeln!(
        md,
        "- **lp-round never says infeasible where milp has a plan: {}** ({false_infeasible} such \
         points).",
        if false_infeasible == 0 {
            "met"
        } else {
            "missed"
        }
    )?;
    writeln!(
        md,
        "- **lp-round within 5% of the proven optimum: {}** over the {} points milp proved \
         optimal: worst {worst:.3}x, geometric mean {geo:.4}x, {over5} above 1.05x.",
        if over5 == 0 { "met" } else { "missed" },
        proven.len()
    )?;
    writeln!(
        md,
        "- lp-round time: median {median:.1} s, max {max:.1} s (its limit holds: the polish and \
         the restricted MILPs stop at it).\n"
    )?;
    if a.families {
        writeln!(
            md,
            "## Per family\n\n| family | points | nodes | milp optimal | lp-round worst | \
             geometric mean |\n|---|---|---|---|---|---|"
        )?;
        for f in Family::ALL {
            let of: Vec<&Point> = points.iter().filter(|p| p.family == f.name()).collect();
            let ratios: Vec<f64> = proven
                .iter()
                .filter(|(p, _)| p.family == f.name())
                .map(|(_, r)| *r)
                .collect();
            let lo = of.iter().map(|p| p.nodes).min().unwrap_or(0);
            let hi = of.iter().map(|p| p.nodes).max().unwrap_or(0);
            let worst = ratios.iter().copied().fold(1.0, f64::max);
            let geo =
                (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len().max(1) as f64).exp();
            writeln!(
                md,
                "| {} | {} | {lo}-{hi} | {} | {worst:.3}x | {geo:.4}x |",
                f.name(),
                of.len(),
                ratios.len()
            )?;
        }
        writeln!(md)?;
    }
    writeln!(
        md,
        "## Every point\n\n| family | seed | nodes | budget (B) | milp | milp cost | milp s | lp-round | \
         lp-round cost | lp-round s | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    let fmt = |c: Option<f64>| c.map_or("-".into(), |c| format!("{c:.0}"));
    for p in points {
        let ratio = match (p.lp.cost, p.milp.cost) {
            (Some(l), Some(m)) => format!("{:.3}", l / m),
            _ => "-".into(),
        };
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {:.1} | {ratio} |",
            p.family,
            p.seed,
            p.nodes,
            p.budget,
            p.milp.status,
            fmt(p.milp.cost),
            p.milp.seconds,
            p.lp.status,
            fmt(p.lp.cost),
            p.lp.seconds
        )?;
    }
    std::fs::write(&a.out, md).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
