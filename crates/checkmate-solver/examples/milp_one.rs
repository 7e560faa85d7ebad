//! One MILP solve, for measuring formulation changes:
//! `milp_one GRAPH LF_BYTES FRAC [fast|paper] [TIME_LIMIT_S]`
//! (budget = LF + FRAC * (checkpoint-all peak - LF); LF_BYTES 0 computes it).

use std::time::{Duration, Instant};

use checkmate_graph::Graph;
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::{milp, solve, Formulation, SolveOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let g = Graph::read(&args[0])?;
    let mut lf: u64 = args[1].parse()?;
    let frac: f64 = args[2].parse()?;
    let formulation = match args.get(3).map(String::as_str) {
        Some("paper") => Formulation::Paper,
        _ => Formulation::Fast,
    };
    let limit: f64 = args.get(4).map_or(Ok(60.0), |s| s.parse())?;
    let options = SolveOptions {
        time_limit: Some(Duration::from_secs_f64(limit)),
        formulation,
        ..SolveOptions::default()
    };
    if lf == 0 {
        let t0 = Instant::now();
        let r = milp::least_feasible(&g, &options)?;
        println!(
            "LF {} lower bound {} proven {} in {:.2}s",
            r.bytes,
            r.lower_bound,
            r.proven(),
            t0.elapsed().as_secs_f64()
        );
        lf = r.bytes;
    }
    let all = CheckpointAll::peak_bytes(&g);
    let budget = lf + ((all - lf) as f64 * frac).round() as u64;
    let sol = solve(&g, &milp::Milp, budget, &options)?;
    println!(
        "budget {budget} {:?} status {} cost {:?} lb {:?} {:.2}s",
        formulation,
        sol.status,
        sol.cost(),
        sol.lower_bound,
        sol.solve_seconds
    );
    Ok(())
}
