//! Every zoo model, small: after two training steps the parameters (batch-norm running statistics
//! included) are bitwise equal between the checkpoint-all plan and the plans of `milp`, `lp-round`
//! and `chen-sqrtn` at a budget that forces recomputation, and the registers hold exactly the
//! simulator's bytes after every step (so the measured live peak is the predicted peak).

use std::time::Duration;

use candle_core::{DType, Device};
use checkmate_executor::{train, Executor, Optimizer, OptimizerKind, SyntheticData};
use checkmate_graph::Plan;
use checkmate_models::{model_by_name, ImageSize, ModelConfig, Network, TrainingConfig};
use checkmate_solver::{solve, strategy_by_name, SolveOptions};

fn config() -> TrainingConfig {
    // Without workspace the simulator's peak is the peak of live register bytes.
    TrainingConfig {
        workspace: false,
        ..TrainingConfig::default()
    }
}

/// A small version of zoo model `name`: batch 2, 3 classes, the smallest image the model takes.
fn small(name: &str) -> Network {
    let mut c = ModelConfig::new(2).with_classes(3);
    match name {
        "mlp" => {
            c.image_size = Some(ImageSize::square(4));
            c.width = Some(6);
            c.depth = Some(3);
        }
        "transformer" => {
            c.classes = Some(7);
            c.width = Some(8);
            c.heads = Some(2);
            c.depth = Some(2);
            c.seq_len = Some(5);
        }
        // The 4096-unit classifier layers dominate these models' parameters; keep them small.
        "vgg16" | "vgg19" | "fcn8" => {
            c.image_size = Some(ImageSize::square(32));
            c.width = Some(32);
        }
        _ => c.image_size = Some(ImageSize::square(32)),
    }
    model_by_name(name, &c).unwrap()
}

fn options() -> SolveOptions {
    SolveOptions {
        time_limit: Some(Duration::from_secs(1)),
        threads: 1,
        ..SolveOptions::default()
    }
}

/// `strategy`'s plan at activation budget `budget`, if it finds one that recomputes something.
fn plan_at(exec: &Executor, strategy: &str, budget: u64) -> Option<Plan> {
    let s = strategy_by_name(strategy).unwrap();
    let sol = solve(exec.graph(), s.as_ref(), budget, &options()).ok()?;
    let plan = sol.plan?;
    (plan.compute_count() > exec.graph().len()).then_some(plan)
}

fn bits(exec: &Executor) -> Vec<u32> {
    exec.params()
        .iter()
        .flatten()
        .flat_map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .map(f32::to_bits)
        .collect()
}

/// Trains two SGD steps with `plan` from `init`'s parameters on the same data; returns the
/// parameter bits and the losses, after checking the measured memory against the simulator.
fn run(init: &Executor, plan: &Plan) -> (Vec<u32>, Vec<f64>) {
    let mut exec = init.try_clone().unwrap();
    let data = SyntheticData::new(&exec, 0.5, 3).unwrap();
    let mut opt = Optimizer::new(OptimizerKind::sgd(0.01)).unwrap();
    let reports = train(&mut exec, plan, &data, &mut opt, 2).unwrap();
    for r in &reports {
        assert_eq!(r.measured_live, r.predicted_live);
        assert_eq!(r.measured_peak, r.predicted_peak);
        assert!(r.loss.is_finite(), "loss {}", r.loss);
    }
    (bits(&exec), reports.iter().map(|r| r.loss).collect())
}

/// The lowest of `pcts` (percent of `full`) where `strategy` returns a recomputing plan.
fn tightest(exec: &Executor, strategy: &str, full: u64, pcts: &[u64]) -> Option<(u64, Plan)> {
    pcts.iter()
        .find_map(|&p| plan_at(exec, strategy, full * p / 100).map(|plan| (p, plan)))
}

fn check_model(name: &str) {
    let t0 = std::time::Instant::now();
    let exec = Executor::new(small(name), &config(), &Device::Cpu, DType::F32, 42).unwrap();
    let n = exec.graph().len();
    let all = strategy_by_name("checkpoint-all").unwrap();
    let sol = solve(exec.graph(), all.as_ref(), u64::MAX, &options()).unwrap();
    let full_peak = sol.peak_bytes().unwrap();
    let reference = sol.plan.unwrap();
    assert_eq!(reference.compute_count(), n);
    let (want, losses) = run(&exec, &reference);
    eprintln!(
        "{name}: {n} nodes, checkpoint-all trained in {:?}",
        t0.elapsed()
    );
    // Budgets below checkpoint-all's peak, in 5% steps. chen-sqrtn has one plan: the tightest
    // budget it fits (it always recomputes; on branchy graphs its peak can exceed checkpoint-all's).
    // milp and lp-round start where chen-greedy first fits, so their warm start is feasible.
    let below: Vec<u64> = (10..100).step_by(5).collect();
    let sqrtn = strategy_by_name("chen-sqrtn").unwrap();
    let sqrtn_budget = sqrtn
        .least_feasible_budget(exec.graph(), &options())
        .unwrap()
        .unwrap();
    let (start, _) = tightest(&exec, "chen-greedy", full_peak, &below)
        .unwrap_or_else(|| panic!("{name}: chen-greedy never recomputes below the full peak"));
    let from: Vec<u64> = below.iter().copied().filter(|&p| p >= start).collect();
    for strategy in ["chen-sqrtn", "milp", "lp-round"] {
        let (pct, plan) = if strategy == "chen-sqrtn" {
            let plan = plan_at(&exec, strategy, sqrtn_budget)
                .unwrap_or_else(|| panic!("{name}: chen-sqrtn does not recompute"));
            (sqrtn_budget * 100 / full_peak, plan)
        } else {
            tightest(&exec, strategy, full_peak, &from)
                .unwrap_or_else(|| panic!("{name}: {strategy} finds no recomputing plan"))
        };
        assert!(
            plan.compute_count() > n,
            "{name}/{strategy}: no recomputation"
        );
        let (got, got_losses) = run(&exec, &plan);
        assert_eq!(
            got_losses, losses,
            "{name}/{strategy} at {pct}%: losses differ"
        );
        assert!(
            got == want,
            "{name}/{strategy} at {pct}%: parameters differ from checkpoint-all"
        );
        eprintln!(
            "{name}: {strategy} at {pct}% of the checkpoint-all peak recomputes {} nodes ({:?})",
            plan.compute_count() - n,
            t0.elapsed()
        );
    }
}

#[test]
fn vgg16_plans_train_bitwise_identically() {
    check_model("vgg16");
}

#[test]
fn vgg19_plans_train_bitwise_identically() {
    check_model("vgg19");
}

#[test]
fn mobilenet_plans_train_bitwise_identically() {
    check_model("mobilenet");
}

#[test]
fn resnet50_plans_train_bitwise_identically() {
    check_model("resnet50");
}

#[test]
fn unet_plans_train_bitwise_identically() {
    check_model("unet");
}

#[test]
fn fcn8_plans_train_bitwise_identically() {
    check_model("fcn8");
}

#[test]
fn segnet_plans_train_bitwise_identically() {
    check_model("segnet");
}

#[test]
fn mlp_plans_train_bitwise_identically() {
    check_model("mlp");
}

#[test]
fn transformer_plans_train_bitwise_identically() {
    check_model("transformer");
}
