//! The exact 0/1 knapsack with HiGHS: the problem PyTorch's `activation_memory_budget` solves
//! (which of the candidate activations to save, each with a memory and a recompute runtime, so
//! that the saved memory stays within a budget and the runtime saved is largest). PyTorch ships a
//! quantized dynamic program, a greedy rule and a SciPy ILP; this is the exact one without SciPy,
//! exposed to Python as `checkmate_rs.knapsack` and used by `checkmate_rs.torch.KnapsackSolver`.

use std::time::{Duration, Instant};

use highs::{HighsModelStatus, HighsSolutionStatus, RowProblem, Sense};

use crate::error::{Error, Result};

/// What [`solve`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Knapsack {
    /// `chosen[i]`: item `i` is in the knapsack (saved).
    pub chosen: Vec<bool>,
    /// Total value of the chosen items.
    pub value: f64,
    /// Total weight of the chosen items (at most the capacity).
    pub weight: f64,
    /// Proven optimal (within HiGHS's default relative gap of 1e-9 used here); `false` when the
    /// time limit stopped the search (the items are then the best found).
    pub optimal: bool,
}

const NAME: &str = "knapsack";

fn invalid(message: String) -> Error {
    crate::milp::run::solver_error(NAME, message)
}

/// Chooses items maximizing the total of `values` with the total of `weights` at most
/// `capacity`. Values and weights must be finite and non-negative and of equal length; the
/// capacity finite and non-negative. Items heavier than the capacity are never chosen.
pub fn solve(
    values: &[f64],
    weights: &[f64],
    capacity: f64,
    time_limit: Option<Duration>,
) -> Result<Knapsack> {
    let start = Instant::now();
    if values.len() != weights.len() {
        return Err(invalid(format!(
            "{} values but {} weights: give one of each per item",
            values.len(),
            weights.len()
        )));
    }
    for (what, xs) in [("value", values), ("weight", weights)] {
        if let Some((i, x)) = xs
            .iter()
            .enumerate()
            .find(|(_, x)| !x.is_finite() || **x < 0.0)
        {
            return Err(invalid(format!(
                "item {i}'s {what} is {x}: values and weights must be finite and non-negative"
            )));
        }
    }
    if !capacity.is_finite() || capacity < 0.0 {
        return Err(invalid(format!(
            "capacity {capacity} must be finite and non-negative"
        )));
    }
    let fits: Vec<usize> = (0..values.len())
        .filter(|&i| weights[i] <= capacity && values[i] > 0.0)
        .collect();
    let mut chosen = vec![false; values.len()];
    // Items of no weight are free; the rest go to HiGHS.
    let (free, rest): (Vec<usize>, Vec<usize>) = fits.iter().partition(|&&i| weights[i] == 0.0);
    for &i in &free {
        chosen[i] = true;
    }
    let mut optimal = true;
    if rest.iter().map(|&i| weights[i]).sum::<f64>() <= capacity {
        for &i in &rest {
            chosen[i] = true;
        }
    } else {
        let _guard = crate::milp::run::highs_lock(None);
        // Scaled so that HiGHS sees values and weights of order one.
        let vmax = rest.iter().map(|&i| values[i]).fold(0.0, f64::max);
        let mut pb = RowProblem::default();
        let cols: Vec<highs::Col> = rest
            .iter()
            .map(|&i| pb.add_integer_column(values[i] / vmax, 0.0..=1.0))
            .collect();
        let row: Vec<(highs::Col, f64)> = cols
            .iter()
            .zip(&rest)
            .map(|(&c, &i)| (c, weights[i] / capacity))
            .collect();
        pb.add_row(..=1.0, &row);
        let mut hm = pb
            .try_optimise(Sense::Maximise)
            .map_err(|e| invalid(format!("HiGHS rejected the model: {e:?}")))?;
        use crate::milp::run::set_option;
        set_option(&mut hm, NAME, "threads", 1)?;
        set_option(&mut hm, NAME, "mip_rel_gap", 1e-9)?;
        if let Some(limit) = time_limit {
            let left = limit.saturating_sub(start.elapsed()).as_secs_f64();
            set_option(&mut hm, NAME, "time_limit", left.max(0.01))?;
        }
        let solved = hm
            .try_solve()
            .map_err(|e| invalid(format!("HiGHS failed: {e:?}")))?;
        optimal = solved.status() == HighsModelStatus::Optimal;
        if solved.primal_solution_status() == HighsSolutionStatus::Feasible {
            for (&i, &x) in rest.iter().zip(solved.get_solution().columns()) {
                chosen[i] = x > 0.5;
            }
        }
        // A rounding of HiGHS's integral values must still fit.
        let mut weight: f64 = rest
            .iter()
            .filter(|&&i| chosen[i])
            .map(|&i| weights[i])
            .sum();
        if weight > capacity {
            let mut by_ratio: Vec<usize> = rest.iter().copied().filter(|&i| chosen[i]).collect();
            by_ratio
                .sort_by(|&a, &b| (values[a] / weights[a]).total_cmp(&(values[b] / weights[b])));
            for i in by_ratio {
                if weight <= capacity {
                    break;
                }
                chosen[i] = false;
                weight -= weights[i];
            }
        }
    }
    let value = (0..values.len())
        .filter(|&i| chosen[i])
        .map(|i| values[i])
        .sum();
    let weight = (0..values.len())
        .filter(|&i| chosen[i])
        .map(|i| weights[i])
        .sum();
    Ok(Knapsack {
        chosen,
        value,
        weight,
        optimal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exhaustive search over every subset.
    fn brute(values: &[f64], weights: &[f64], capacity: f64) -> f64 {
        let n = values.len();
        (0u32..1 << n)
            .filter_map(|m| {
                let w: f64 = (0..n).filter(|i| m >> i & 1 == 1).map(|i| weights[i]).sum();
                (w <= capacity).then(|| (0..n).filter(|i| m >> i & 1 == 1).map(|i| values[i]).sum())
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn equals_exhaustive_search_on_random_instances() {
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 1000) as f64
        };
        for n in 1..=12 {
            let values: Vec<f64> = (0..n).map(|_| next()).collect();
            let weights: Vec<f64> = (0..n).map(|_| next() / 10.0).collect();
            let capacity = weights.iter().sum::<f64>() * 0.4;
            let k = solve(&values, &weights, capacity, None).unwrap();
            assert!(k.weight <= capacity + 1e-9);
            assert!(k.optimal);
            let best = brute(&values, &weights, capacity);
            assert!(
                (k.value - best).abs() <= 1e-6 * best.max(1.0),
                "n={n}: {} vs exhaustive {best}",
                k.value
            );
        }
    }

    #[test]
    fn rejects_bad_input_with_the_item_named() {
        let e = solve(&[1.0, -2.0], &[1.0, 1.0], 1.0, None).unwrap_err();
        assert!(e.to_string().contains("item 1's value is -2"), "{e}");
        let e = solve(&[1.0], &[1.0, 1.0], 1.0, None).unwrap_err();
        assert!(e.to_string().contains("1 values but 2 weights"), "{e}");
        assert!(solve(&[1.0], &[1.0], f64::NAN, None).is_err());
    }

    #[test]
    fn everything_fits_and_nothing_fits() {
        let k = solve(&[1.0, 2.0], &[1.0, 1.0], 5.0, None).unwrap();
        assert_eq!(k.chosen, vec![true, true]);
        let k = solve(&[1.0, 2.0], &[3.0, 4.0], 2.0, None).unwrap();
        assert_eq!(k.chosen, vec![false, false]);
        assert_eq!(k.value, 0.0);
    }
}
