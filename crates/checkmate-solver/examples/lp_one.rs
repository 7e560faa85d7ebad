//! One `lp-round` solve, for measuring: `lp_one GRAPH LF_BYTES FRAC [TIME_LIMIT_S]`
//! (budget = LF + FRAC * (checkpoint-all peak - LF), LF `floor`: the largest single-compute need;
//! no time limit: lp-round's default).

use std::time::Duration;

use checkmate_graph::Graph;
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::{solve, strategy_by_name, SolveOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let g = Graph::read(&args[0])?;
    let lf: u64 = match args[1].as_str() {
        "floor" => g.min_feasible_activation_bytes(),
        v => v.parse()?,
    };
    let frac: f64 = args[2].parse()?;
    let options = SolveOptions {
        time_limit: args
            .get(3)
            .map(|s| s.parse().map(Duration::from_secs_f64))
            .transpose()?,
        ..SolveOptions::default()
    };
    let all = CheckpointAll::peak_bytes(&g);
    let budget = lf + ((all - lf) as f64 * frac).round() as u64;
    let s = strategy_by_name("lp-round")?;
    let sol = solve(&g, s.as_ref(), budget, &options)?;
    println!(
        "budget {budget} status {} cost {:?} lb {:?} {:.2}s",
        sol.status,
        sol.cost(),
        sol.lower_bound,
        sol.solve_seconds
    );
    Ok(())
}
