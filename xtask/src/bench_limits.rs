//! `cargo xtask bench limits`: does a solve keep to the time and memory it is given? Every point
//! is one `checkmate solve --json` process (the release binary) with `--threads 1` and the
//! default memory limit: its wall time measured here, its peak resident memory as it reports it
//! (`peak_resident_bytes`, the whole process), the status and the limit that stopped it. Written
//! to `docs/LIMITS_BENCH.md`.
//!
//! Graphs: the 3000-node chain (forward only, 10 bytes a node, budget 1000 bytes), training
//! chains of 1001 and 3001 nodes (10 bytes a node; budgets of 30 and 100 tensors), our random layered
//! graph of 1000 nodes (seed 0) at 90% of its checkpoint-all peak, and Checkmate's ResNet50 at
//! 50%. Strategies `milp` and `lp-round`, time limits 10 s and 30 s.
//! Options: `--limits 10,30`, `--out FILE`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use checkmate_graph::generate::{random_layered, with_backward, LayeredParams};
use checkmate_graph::Graph;

/// How far past its time limit a solve may end and still count as keeping to it.
const OVERRUN_ALLOWED: f64 = 5.0;

/// The report's line on the time-limit target, given the most any solve ended past its limit.
pub(crate) fn overrun_target(worst_over: f64) -> String {
    format!(
        "- **Every solve ends within {OVERRUN_ALLOWED:.0} s of its time limit: {}** (the most any ended after it: {:.1} s).\n",
        if worst_over <= OVERRUN_ALLOWED { "met" } else { "missed" },
        worst_over.max(0.0)
    )
}
/// What the 3000-node chain may take (resident) and how long (seconds).
const CHAIN_RSS: u64 = 2 << 30;
const CHAIN_SECONDS: f64 = 35.0;

struct Args {
    limits: Vec<u64>,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<Args> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut a = Args {
        limits: vec![10, 30],
        out: root.join("docs/LIMITS_BENCH.md"),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--limits" => {
                a.limits = value()?
                    .split(',')
                    .map(|v| v.parse().context("--limits wants seconds, e.g. 10,30"))
                    .collect::<Result<_>>()?
            }
            "--out" => a.out = PathBuf::from(value()?),
            other => bail!("unknown option {other}; see xtask/src/bench_limits.rs"),
        }
    }
    Ok(a)
}

/// A forward chain of `n` nodes, 10 bytes and cost 1 each.
fn chain(n: usize) -> Result<Graph> {
    Ok(checkmate_graph::generate::chain(n, 10)?)
}

/// What one `checkmate solve --json` process did.
pub(crate) struct Answer {
    pub(crate) status: String,
    pub(crate) limit: String,
    pub(crate) cost: Option<f64>,
    /// The proven lower bound on the cost, when the solve has one.
    pub(crate) lower_bound: Option<f64>,
    /// The cost beyond one compute of every node, relative to it.
    pub(crate) overhead: Option<f64>,
    /// Refused budgets: the least budget with a known plan and who has it (total bytes).
    pub(crate) known_plan: Option<(u64, String)>,
    /// The proven floor on a refused budget (total bytes).
    pub(crate) proven_floor: Option<u64>,
    pub(crate) wall: f64,
    pub(crate) rss: Option<u64>,
}

/// Runs `checkmate solve --json` once (one thread, `limit` seconds) and reads its answer.
pub(crate) fn solve(
    bin: &Path,
    graph: &Path,
    strategy: &str,
    budget: &str,
    limit: u64,
) -> Result<Answer> {
    let t0 = Instant::now();
    let out = Command::new(bin)
        .args(["solve", "--graph"])
        .arg(graph)
        .args(["--strategy", strategy, "--budget", budget])
        .args([
            "--time-limit",
            &limit.to_string(),
            "--threads",
            "1",
            "--json",
        ])
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let wall = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(last).unwrap_or(serde_json::Value::Null);
    let status = v["status"].as_str().map(String::from).unwrap_or_else(|| {
        let err = String::from_utf8_lossy(&out.stderr);
        format!(
            "exit {:?}: {}",
            out.status.code(),
            err.lines().last().unwrap_or("")
        )
    });
    let limit = match v["limit"]["kind"].as_str() {
        Some("memory") => format!(
            "memory (model {:.1} GiB)",
            v["limit"]["model_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64
        ),
        Some("startup") => format!(
            "start-up (about {} s)",
            v["limit"]["startup_seconds"].as_u64().unwrap_or(0)
        ),
        Some(k) => k.to_string(),
        None => "-".into(),
    };
    Ok(Answer {
        status,
        limit,
        cost: v["cost"].as_f64(),
        lower_bound: v["lower_bound"].as_f64(),
        overhead: v["overhead"].as_f64(),
        known_plan: v["known_plan_bytes"]
            .as_u64()
            .map(|b| (b, v["known_plan_by"].as_str().unwrap_or("?").to_string())),
        proven_floor: v["proven_lower_bound_bytes"].as_u64(),
        wall,
        rss: v["peak_resident_bytes"].as_u64(),
    })
}

/// Runs the benchmark and writes its report.
pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = root.join("target/release/checkmate");
    let dir = root.join("target/bench-limits");
    std::fs::create_dir_all(&dir)?;
    let write = |g: &Graph, name: &str| -> Result<PathBuf> {
        let p = dir.join(name);
        g.write(&p)?;
        Ok(p)
    };
    let fwd3000 = chain(3000)?;
    let graphs: Vec<(String, PathBuf, String)> = vec![
        (
            "chain, 3000 nodes (the issue's)".into(),
            write(&fwd3000, "chain3000.json")?,
            "1000".into(),
        ),
        (
            "training chain, 1001 nodes".into(),
            write(&with_backward(&chain(500)?)?, "tchain1001.json")?,
            "300".into(),
        ),
        (
            "training chain, 3001 nodes".into(),
            write(&with_backward(&chain(1500)?)?, "tchain3001.json")?,
            "1000".into(),
        ),
        (
            "random layered, 1000 nodes (seed 0)".into(),
            write(
                &random_layered(&LayeredParams::moccasin(1000, 0.31), 0)?,
                "layered1000.json",
            )?,
            "90%".into(),
        ),
        (
            "ResNet50 (Checkmate)".into(),
            root.join("data/graphs/checkmate/ResNet50_256_224.json"),
            "50%".into(),
        ),
    ];
    let mut table = String::new();
    let mut worst_over = f64::NEG_INFINITY;
    let mut chain_ok = true;
    let mut chain_line = String::new();
    for (name, path, budget) in &graphs {
        for &limit in &a.limits {
            for strategy in ["milp", "lp-round"] {
                let r = solve(&bin, path, strategy, budget, limit)?;
                eprintln!(
                    "{name} {strategy} {limit} s: {} in {:.1} s, {} MiB, {}",
                    r.status,
                    r.wall,
                    r.rss.map_or(0, |b| b >> 20),
                    r.limit
                );
                worst_over = worst_over.max(r.wall - limit as f64);
                if name.contains("issue") && strategy == "milp" && limit == 30 {
                    let ok = r.cost.is_some()
                        && r.wall <= CHAIN_SECONDS
                        && r.rss.is_some_and(|b| b < CHAIN_RSS)
                        && r.limit != "-";
                    chain_ok &= ok;
                    chain_line = format!(
                        "`milp`, `--time-limit 30`: {} in {:.1} s, {} MiB resident, stopped by {}",
                        r.status,
                        r.wall,
                        r.rss.map_or(0, |b| b >> 20),
                        r.limit
                    );
                }
                writeln!(
                    table,
                    "| {name} | {budget} | {strategy} | {limit} | {} | {} | {:.1} | {} | {} |",
                    r.status,
                    r.cost.map_or("-".into(), |c| format!("{c:.0}")),
                    r.wall,
                    crate::bench_solver::rss_cell(r.rss),
                    r.limit
                )?;
            }
        }
    }
    let mut md = String::new();
    writeln!(
        md,
        "# Solves within their time and memory limits\n\nGenerated by `cargo xtask bench limits` \
         (xtask/src/bench_limits.rs); do not edit by hand. Run {} on {}. Each row is one \
         `checkmate solve --json` process, `--threads 1`, the default `--solver-memory` (half the \
         memory the OS reports available); wall time measured around the process, peak resident \
         memory as the process reports it (`peak_resident_bytes`).\n",
        crate::bench_results::date(),
        crate::bench_results::machine()
    )?;
    writeln!(md, "## Targets\n")?;
    writeln!(
        md,
        "- **The 3000-node chain returns a plan within {CHAIN_SECONDS:.0} s and under 2 GiB, naming the limit it hit: {}** ({chain_line}).",
        if chain_ok { "met" } else { "missed" }
    )?;
    writeln!(md, "{}", overrun_target(worst_over))?;
    writeln!(
        md,
        "## Every solve\n\n| graph | budget | strategy | limit (s) | status | cost | wall (s) | peak RSS (MiB) | stopped by |\n|---|---|---|---|---|---|---|---|---|\n{table}"
    )?;
    std::fs::write(&a.out, md).with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
