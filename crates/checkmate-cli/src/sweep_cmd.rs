//! `checkmate sweep`: every strategy's cost at evenly spaced budgets, as a table, JSON or an SVG
//! frontier.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use checkmate_graph::{byte_unit, format_bytes};
use checkmate_solver::sweep::{sweep, PointStatus, Sweep, SweepOptions, SweepPoint};
use checkmate_solver::{strategy_by_name, Strategy, STRATEGY_NAMES};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::common::{print_json, GraphArgs, SolverArgs};

/// Arguments of `checkmate sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub graph: GraphArgs,
    /// Comma-separated strategies (default: every strategy except milp).
    #[arg(long, short = 's', value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// Number of budgets from the least feasible budget to the checkpoint-all peak.
    #[arg(long, short = 'n', default_value_t = 10)]
    pub points: usize,
    #[command(flatten)]
    pub solver: SolverArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Draw the frontier (compute overhead versus activation budget) to this SVG file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

impl SweepArgs {
    /// The strategies to run, in the order given (or [`STRATEGY_NAMES`] without `milp`).
    fn strategies(&self) -> Result<Vec<Box<dyn Strategy>>> {
        let names: Vec<String> = if self.strategies.is_empty() {
            STRATEGY_NAMES
                .iter()
                .filter(|&&n| n != "milp")
                .map(|n| n.to_string())
                .collect()
        } else {
            self.strategies
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let mut out: Vec<Box<dyn Strategy>> = Vec::with_capacity(names.len());
        for n in &names {
            if out.iter().any(|s| s.name() == n) {
                continue;
            }
            out.push(strategy_by_name(n)?);
        }
        anyhow::ensure!(!out.is_empty(), "--strategies: name at least one strategy");
        Ok(out)
    }

    fn options(&self) -> Result<SweepOptions> {
        anyhow::ensure!(self.points >= 1, "--points must be at least 1");
        Ok(SweepOptions {
            points: self.points,
            solve: self.solver.options(0)?,
        })
    }
}

/// Runs `checkmate sweep`.
pub fn run(args: SweepArgs) -> Result<()> {
    let graph = args.graph.load()?;
    let strategies = args.strategies()?;
    let options = args.options()?;
    let total = (args.points * strategies.len()) as u64;
    // Hidden at first; shown on stderr once the sweep takes longer than a moment.
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{spinner} sweep [{bar:30}] {pos}/{len} points {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let start = Instant::now();
    let shown = std::sync::atomic::AtomicBool::new(false);
    let result = sweep(&graph, &strategies, &options, &|_p: &SweepPoint| {
        if start.elapsed() > Duration::from_millis(500)
            && !shown.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    if let Some(path) = &args.svg {
        draw_frontier(&result, path).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        print_json(&to_json(&result));
    } else {
        print_table(&result);
        if let Some(path) = &args.svg {
            println!("frontier     {}", path.display());
        }
    }
    Ok(())
}

fn to_json(s: &Sweep) -> serde_json::Value {
    json!({
        "graph": s.graph,
        "cost_unit": s.cost_unit,
        "static_bytes": s.static_bytes,
        "base_cost": s.base_cost,
        "checkpoint_all_peak_bytes": s.checkpoint_all_peak,
        "least_feasible_bytes": s.least_feasible_bytes,
        "seconds": s.seconds,
        "strategies": s.bounds.iter().map(|b| json!({
            "name": b.strategy,
            "least_feasible_bytes": b.least_feasible_bytes,
            "proves_optimality": b.proves_optimality,
        })).collect::<Vec<_>>(),
        "budgets": s.budgets,
        "points": s.points.iter().map(|p| json!({
            "budget_bytes": p.budget_bytes,
            "total_budget_bytes": p.budget_bytes + s.static_bytes,
            "strategy": p.strategy,
            "status": p.status.as_str(),
            "cost": p.cost,
            "overhead": p.overhead,
            "peak_bytes": p.peak_bytes,
            "seconds": p.seconds,
            "error": p.error,
            "lower_bound": p.lower_bound,
            "proven_optimal": p.proven_optimal(),
            "carried_from_bytes": p.carried_from,
        })).collect::<Vec<_>>(),
    })
}

/// One table cell: the overhead, or why there is none; `*`: not proven optimal (strategies that
/// can prove it, `proves`), followed by the proven bound in brackets when there is one, as an
/// overhead over `base` (the sweep's cost of one compute per node); `^`: the plan of a smaller
/// budget.
fn cell(p: Option<&SweepPoint>, proves: bool, base: f64) -> String {
    match p {
        None => "?".into(),
        Some(p) => match (p.status, p.overhead) {
            (PointStatus::Solved(_), Some(o)) => format!(
                "{:+.1}%{}{}",
                100.0 * o,
                if p.carried_from.is_some() { "^" } else { "" },
                if proves && !p.proven_optimal() {
                    match p.lower_bound {
                        Some(lb) if base > 0.0 => format!("* [{:+.1}%]", 100.0 * (lb / base - 1.0)),
                        _ => "*".into(),
                    }
                } else {
                    String::new()
                }
            ),
            (PointStatus::Solved(st), None) => st.as_str().into(),
            (PointStatus::Infeasible | PointStatus::NoPlanFound, _) => "-".into(),
            (PointStatus::NotApplicable, _) => "n/a".into(),
            (PointStatus::Failed, _) => "failed".into(),
        },
    }
}

fn print_table(s: &Sweep) {
    println!(
        "graph {}: checkpoint-all peak {}, static {}, sweeping {} budgets from {}",
        s.graph,
        format_bytes(s.checkpoint_all_peak),
        format_bytes(s.static_bytes),
        s.budgets.len(),
        format_bytes(s.least_feasible_bytes)
    );
    println!("compute overhead vs one compute per node ('-': no plan within budget, n/a: not applicable)");
    let proving: Vec<&str> = s
        .bounds
        .iter()
        .filter(|b| b.proves_optimality)
        .map(|b| b.strategy.as_str())
        .collect();
    if !proving.is_empty() {
        println!(
            "{}: proven optimal unless marked '*' (then '[..]': the proven lower bound, when known); '^': the plan of a smaller budget (none cheaper found)",
            proving.join(", ")
        );
    } else {
        println!("'^': the plan of a smaller budget (none cheaper found)");
    }
    let names: Vec<&str> = s.bounds.iter().map(|b| b.strategy.as_str()).collect();
    let cells: Vec<Vec<String>> = (0..s.budgets.len())
        .map(|b| {
            s.bounds
                .iter()
                .map(|bound| {
                    cell(
                        s.point(b, &bound.strategy),
                        bound.proves_optimality,
                        s.base_cost,
                    )
                })
                .collect()
        })
        .collect();
    let width = names
        .iter()
        .map(|n| n.len())
        .chain(cells.iter().flatten().map(|c| c.chars().count()))
        .max()
        .unwrap_or(8)
        .max(9);
    let mut header = format!("{:>12} {:>6}", "budget", "%all");
    for n in &names {
        header.push_str(&format!(" {n:>width$}"));
    }
    println!("{header}");
    for (b, &budget) in s.budgets.iter().enumerate() {
        let mut row = format!(
            "{:>12} {:>5.1}%",
            format_bytes(budget),
            100.0 * budget as f64 / s.checkpoint_all_peak.max(1) as f64
        );
        for c in &cells[b] {
            row.push_str(&format!(" {c:>width$}"));
        }
        println!("{row}");
    }
    let mut least = format!("{:>19}", "least feasible");
    for b in &s.bounds {
        let v = match b.least_feasible_bytes {
            Some(l) if b.least_proven => format_bytes(l),
            Some(l) => format!("{}*", format_bytes(l)),
            None => "?".into(),
        };
        least.push_str(&format!(" {v:>width$}"));
    }
    println!("{least}");
    if s.bounds
        .iter()
        .any(|b| b.least_feasible_bytes.is_some() && !b.least_proven)
    {
        println!("least feasible '*': a plan exists there, a smaller budget is not ruled out");
    }
    println!(
        "budgets are activation memory (add static memory for the total); {:.2} s",
        s.seconds
    );
}

/// One point of a drawn series: budget (in the plot's unit), overhead (%), proven optimal.
type Marker = (f64, f64, bool);

/// Draws overhead (%) versus activation budget (in the unit the table uses for the largest
/// budget), one line per strategy with a plan somewhere. Filled markers are proven optimal,
/// hollow ones are not; the legend sits beside the plot, never on the data.
fn draw_frontier(s: &Sweep, path: &Path) -> Result<()> {
    use plotters::prelude::*;

    let (unit, scale) = byte_unit(s.checkpoint_all_peak);
    let series: Vec<(String, Vec<Marker>)> = s
        .bounds
        .iter()
        .map(|b| {
            let pts: Vec<Marker> = s
                .points
                .iter()
                .filter(|p| p.strategy == b.strategy)
                .filter_map(|p| {
                    p.overhead
                        .map(|o| (p.budget_bytes as f64 / scale, 100.0 * o, p.proven_optimal()))
                })
                .collect();
            (b.strategy.clone(), pts)
        })
        .filter(|(_, pts)| !pts.is_empty())
        .collect();
    let x_lo = s.budgets.first().copied().unwrap_or(0) as f64 / scale;
    let x_hi = s.budgets.last().copied().unwrap_or(0) as f64 / scale;
    let (x_lo, x_hi) = if x_hi > x_lo {
        let pad = 0.03 * (x_hi - x_lo);
        (x_lo - pad, x_hi + pad)
    } else {
        (x_lo * 0.9, x_lo * 1.1 + 1e-9)
    };
    let y_max = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let y_hi = if y_max > 0.0 { y_max * 1.08 } else { 1.0 };
    let draw_err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing the frontier: {e}");

    let root = SVGBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(&e))?;
    let root = root
        .titled(
            &format!("{}: compute overhead vs activation budget", s.graph),
            ("sans-serif", 22),
        )
        .map_err(|e| draw_err(&e))?;
    let (plot, side) = root.split_horizontally(860);
    let mut chart = ChartBuilder::on(&plot)
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x_lo..x_hi, 0.0..y_hi)
        .map_err(|e| draw_err(&e))?;
    chart
        .configure_mesh()
        .x_desc(format!("activation budget ({unit})"))
        .y_desc("compute overhead (%)")
        .draw()
        .map_err(|e| draw_err(&e))?;
    let font = ("sans-serif", 15).into_font();
    for (k, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|&(x, y, _)| (x, y)),
                color.stroke_width(2),
            ))
            .map_err(|e| draw_err(&e))?;
        chart
            .draw_series(pts.iter().map(|&(x, y, proven)| {
                let style = if proven {
                    color.filled()
                } else {
                    WHITE.filled()
                };
                EmptyElement::at((x, y))
                    + Circle::new((0, 0), 4, style)
                    + Circle::new((0, 0), 4, color.stroke_width(2))
            }))
            .map_err(|e| draw_err(&e))?;
        // The legend entry, beside the plot.
        let y = 40 + 26 * k as i32;
        side.draw(&PathElement::new(
            vec![(10, y), (40, y)],
            color.stroke_width(2),
        ))
        .map_err(|e| draw_err(&e))?;
        side.draw(&Circle::new((25, y), 4, color.filled()))
            .map_err(|e| draw_err(&e))?;
        side.draw(&Text::new(name.clone(), (48, y - 8), font.clone()))
            .map_err(|e| draw_err(&e))?;
    }
    let y = 40 + 26 * series.len() as i32 + 14;
    for (k, (proven, text)) in [(true, "proven optimal"), (false, "not proven optimal")]
        .into_iter()
        .enumerate()
    {
        let y = y + 24 * k as i32;
        let style = if proven {
            BLACK.filled()
        } else {
            WHITE.filled()
        };
        side.draw(&Circle::new((25, y), 4, style))
            .map_err(|e| draw_err(&e))?;
        side.draw(&Circle::new((25, y), 4, BLACK.stroke_width(2)))
            .map_err(|e| draw_err(&e))?;
        side.draw(&Text::new(text, (48, y - 8), font.clone()))
            .map_err(|e| draw_err(&e))?;
    }
    root.present().map_err(|e| draw_err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkmate_solver::Status;

    fn point(status: Status, cost: f64, base: f64, lower_bound: Option<f64>) -> SweepPoint {
        SweepPoint {
            budget_bytes: 100,
            strategy: "milp".into(),
            status: PointStatus::Solved(status),
            cost: Some(cost),
            overhead: Some(cost / base - 1.0),
            peak_bytes: Some(90),
            seconds: 1.0,
            error: None,
            lower_bound,
            carried_from: None,
        }
    }

    #[test]
    fn cells_not_proven_optimal_show_their_bound() {
        let p = point(Status::Feasible, 150.0, 100.0, Some(110.0));
        assert_eq!(cell(Some(&p), true, 100.0), "+50.0%* [+10.0%]");
        let p = point(Status::Feasible, 150.0, 100.0, None);
        assert_eq!(cell(Some(&p), true, 100.0), "+50.0%*");
        let p = point(Status::Optimal, 150.0, 100.0, Some(150.0));
        assert_eq!(cell(Some(&p), true, 100.0), "+50.0%");
        // Strategies that cannot prove optimality get no mark and no bound.
        let p = point(Status::Feasible, 150.0, 100.0, Some(110.0));
        assert_eq!(cell(Some(&p), false, 100.0), "+50.0%");
    }
}
