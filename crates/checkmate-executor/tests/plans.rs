//! Recomputation does not change training: after two SGD steps, parameters are bitwise equal between
//! checkpoint-all and plans that recompute, and the registers hold exactly the simulator's bytes
//! after every step.

use candle_core::{DType, Device, Tensor};
use checkmate_executor::{train, Error, Executor, Optimizer, OptimizerKind, SyntheticData};
use checkmate_graph::{Plan, Step};
use checkmate_models::{
    Conv2d, ConvTranspose2d, Dense, ImageSize, ModelConfig, Network, NetworkBuilder, Op, Pool2d,
    Shape, TrainingConfig,
};
use checkmate_solver::{solve, strategy_by_name, SolveOptions};

fn config() -> TrainingConfig {
    // Without workspace the simulator's peak is the peak of live register bytes.
    TrainingConfig {
        workspace: false,
        ..TrainingConfig::default()
    }
}

fn small_mlp() -> Network {
    let mut c = ModelConfig::new(4)
        .with_classes(3)
        .with_image_size(ImageSize::square(4));
    c.width = Some(6);
    c.depth = Some(3);
    checkmate_models::mlp(&c).unwrap()
}

/// conv-relu, a residual add, max-pool, conv, flatten, dense logits.
fn small_cnn() -> Network {
    let mut b = NetworkBuilder::new("cnn", Shape::new([2, 2, 6, 6]));
    let c1 = b
        .layer(
            "conv1",
            Op::Conv2d(Conv2d::new(3, 3).same().relu()),
            b.input(),
        )
        .unwrap();
    let c2 = b
        .layer("conv2", Op::Conv2d(Conv2d::new(3, 3).same().relu()), c1)
        .unwrap();
    let s = b.add("add", Op::Add, &[c1, c2]).unwrap();
    let p = b
        .layer("pool", Op::MaxPool2d(Pool2d::new(2, 2)), s)
        .unwrap();
    let c3 = b
        .layer("conv3", Op::Conv2d(Conv2d::new(4, 2).stride(1).relu()), p)
        .unwrap();
    let f = b.layer("flatten", Op::Flatten, c3).unwrap();
    let d = b.layer("logits", Op::Dense(Dense::new(3)), f).unwrap();
    b.finish(d, 1).unwrap()
}

/// The plan of `strategy` at the smallest activation budget (in 5% steps of checkpoint-all's
/// peak) where it finds one.
fn tight_plan(exec: &Executor, strategy: &str) -> Plan {
    let g = exec.graph();
    let all = strategy_by_name("checkpoint-all").unwrap();
    let full = solve(g, all.as_ref(), u64::MAX, &SolveOptions::default())
        .unwrap()
        .peak_bytes()
        .unwrap();
    let s = strategy_by_name(strategy).unwrap();
    for pct in (5..=100).step_by(5) {
        let budget = full * pct / 100;
        if let Ok(sol) = solve(g, s.as_ref(), budget, &SolveOptions::default()) {
            if let Some(plan) = sol.plan {
                return plan;
            }
        }
    }
    panic!("{strategy} found no plan up to checkpoint-all's peak");
}

fn bits(exec: &Executor) -> Vec<u32> {
    exec.params()
        .iter()
        .flatten()
        .flat_map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .map(f32::to_bits)
        .collect()
}

/// Trains two steps with `plan`; returns the parameter bits and the losses.
fn run(net: &Network, plan: &Plan) -> (Vec<u32>, Vec<f64>, usize) {
    let mut exec = Executor::new(net.clone(), &config(), &Device::Cpu, DType::F32, 42).unwrap();
    let data = SyntheticData::new(&exec, 0.5, 3).unwrap();
    let mut opt = Optimizer::new(OptimizerKind::sgd(0.05)).unwrap();
    let reports = train(&mut exec, plan, &data, &mut opt, 2).unwrap();
    for r in &reports {
        assert_eq!(r.measured_live, r.predicted_live);
        assert_eq!(r.measured_peak, r.predicted_peak);
    }
    (
        bits(&exec),
        reports.iter().map(|r| r.loss).collect(),
        reports[0].computes,
    )
}

fn check_network(net: Network) {
    let exec = Executor::new(net.clone(), &config(), &Device::Cpu, DType::F32, 42).unwrap();
    let n = exec.graph().len();
    let reference = tight_plan(&exec, "checkpoint-all");
    assert_eq!(reference.compute_count(), n);
    let (want, losses, _) = run(&net, &reference);
    assert!(losses.iter().all(|l| l.is_finite()));
    let mut recomputed = false;
    for strategy in ["checkpoint-last", "chen-sqrtn", "chen-greedy"] {
        let plan = tight_plan(&exec, strategy);
        let (got, got_losses, computes) = run(&net, &plan);
        recomputed |= computes > n;
        assert_eq!(got_losses, losses, "{strategy}: losses differ");
        assert!(
            got == want,
            "{strategy}: parameters differ from checkpoint-all"
        );
    }
    assert!(
        recomputed,
        "no plan recomputed anything: the test proves nothing"
    );
}

#[test]
fn mlp_plans_train_bitwise_identically() {
    check_network(small_mlp());
}

#[test]
fn cnn_plans_train_bitwise_identically() {
    check_network(small_cnn());
}

#[test]
fn recomputing_a_backward_node_sets_gradients_once() {
    let net = small_mlp();
    let mut exec = Executor::new(net, &config(), &Device::Cpu, DType::F32, 1).unwrap();
    let g = exec.graph().clone();
    let n = g.len();
    let batch = exec.random_batch(5).unwrap();
    let all = Plan::new((0..n).map(Step::Compute).collect());
    exec.run_plan(&all, &batch).unwrap();
    let want: Vec<Vec<Option<Tensor>>> = exec.grads().to_vec();
    // Compute everything, then free and recompute the first backward node whose output is
    // non-empty.
    let first_bwd = (0..n)
        .find(|&v| g.node(v).kind == checkmate_graph::NodeKind::Backward && g.node(v).bytes > 0)
        .unwrap();
    let mut steps: Vec<Step> = (0..n).map(Step::Compute).collect();
    steps.push(Step::Free(first_bwd));
    steps.push(Step::Compute(first_bwd));
    let report = exec.run_plan(&Plan::new(steps), &batch).unwrap();
    assert_eq!(report.computes, n + 1);
    for (a, b) in want.iter().flatten().zip(exec.grads().iter().flatten()) {
        match (a, b) {
            (Some(a), Some(b)) => assert_eq!(
                a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                b.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            ),
            (None, None) => {}
            _ => panic!("gradient presence differs"),
        }
    }
}

#[test]
fn loss_falls_with_sgd_and_adam() {
    for kind in [OptimizerKind::sgd(0.01), OptimizerKind::adam(0.01)] {
        let mut exec = Executor::new(small_cnn(), &config(), &Device::Cpu, DType::F32, 7).unwrap();
        let n = exec.graph().len();
        let plan = Plan::new((0..n).map(Step::Compute).collect());
        let data = SyntheticData::new(&exec, 0.3, 11).unwrap();
        let mut opt = Optimizer::new(kind).unwrap();
        let losses: Vec<f64> = train(&mut exec, &plan, &data, &mut opt, 30)
            .unwrap()
            .iter()
            .map(|r| r.loss)
            .collect();
        let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
        let last: f64 = losses[25..].iter().sum::<f64>() / 5.0;
        assert!(last < 0.5 * first, "{kind:?}: loss {first} -> {last}");
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let mut exec = Executor::new(small_mlp(), &config(), &Device::Cpu, DType::F32, 1).unwrap();
    let batch = exec.random_batch(1).unwrap();
    // A plan that computes a node before its input.
    let bad = Plan::new(vec![Step::Compute(1)]);
    assert!(matches!(exec.run_plan(&bad, &batch), Err(Error::Plan(_))));
    // A batch of the wrong shape.
    let wrong = checkmate_executor::Batch {
        input: Tensor::zeros((3, 16), DType::F32, &Device::Cpu).unwrap(),
        labels: batch.labels.clone(),
    };
    let n = exec.graph().len();
    let plan = Plan::new((0..n).map(Step::Compute).collect());
    assert!(matches!(exec.run_plan(&plan, &wrong), Err(Error::Batch(_))));
    assert!(Optimizer::new(OptimizerKind::sgd(-1.0)).is_err());
}

#[test]
fn unsupported_layers_are_reported_by_name() {
    let mut b = NetworkBuilder::new("upsample", Shape::new([2, 2, 3, 3]));
    let mut c = ConvTranspose2d::new(2, 2, 1);
    c.stride = [1, 2];
    let x = b.layer("up", Op::ConvTranspose2d(c), b.input()).unwrap();
    let f = b.layer("flatten", Op::Flatten, x).unwrap();
    let y = b.layer("out", Op::Dense(Dense::new(2)), f).unwrap();
    let net = b.finish(y, 1).unwrap();
    let mut exec = Executor::new(net, &config(), &Device::Cpu, DType::F32, 1).unwrap();
    let batch = exec.random_batch(1).unwrap();
    let n = exec.graph().len();
    let plan = Plan::new((0..n).map(Step::Compute).collect());
    match exec.run_plan(&plan, &batch) {
        Err(Error::Unsupported { layer, .. }) => assert_eq!(layer, "up"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// conv, batch norm, ReLU, dropout, conv to 3 classes per pixel, softmax over the classes: a tiny
/// segmentation network.
fn small_segmenter() -> Network {
    let mut b = NetworkBuilder::new("seg", Shape::new([2, 2, 4, 4]));
    let x = b
        .layer("conv1", Op::Conv2d(Conv2d::new(4, 3).same()), b.input())
        .unwrap();
    let x = b
        .layer(
            "bn",
            Op::BatchNorm(checkmate_models::BatchNorm::default()),
            x,
        )
        .unwrap();
    let x = b
        .layer(
            "relu",
            Op::Activation(checkmate_models::Activation::Relu),
            x,
        )
        .unwrap();
    let x = b.layer("drop", Op::Dropout { rate: 0.3 }, x).unwrap();
    let x = b.layer("conv2", Op::Conv2d(Conv2d::new(3, 1)), x).unwrap();
    let x = b
        .layer("reshape", Op::Reshape { dims: vec![3, 16] }, x)
        .unwrap();
    let x = b
        .layer(
            "softmax",
            Op::Activation(checkmate_models::Activation::Softmax),
            x,
        )
        .unwrap();
    b.finish(x, 1).unwrap()
}

#[test]
fn recomputing_batch_norm_and_dropout_changes_nothing() {
    let net = small_segmenter();
    let mut exec = Executor::new(net, &config(), &Device::Cpu, DType::F32, 3).unwrap();
    let g = exec.graph().clone();
    let n = g.len();
    let data = SyntheticData::new(&exec, 0.2, 4).unwrap();
    let batch = data.batch(&exec, 0).unwrap();
    let base = exec.try_clone().unwrap();
    let all = Plan::new((0..n).map(Step::Compute).collect());
    let report = exec.run_plan(&all, &batch).unwrap();
    // Running statistics moved once: mean = 0.01 * batch mean from zero.
    let bn = exec.network().layer_by_name("bn").unwrap();
    let running_mean = exec.params()[bn][2].to_vec1::<f32>().unwrap();
    assert!(running_mean.iter().any(|&m| m != 0.0));
    let want: Vec<Vec<f32>> = exec
        .params()
        .iter()
        .flatten()
        .chain(exec.grads().iter().flatten().flatten())
        .map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect();
    // Recompute batch norm and dropout twice each before the backward pass needs them.
    let (bn_node, drop_node) = (bn, exec.network().layer_by_name("drop").unwrap());
    let loss = exec.training_graph().loss_node;
    let mut steps: Vec<Step> = (0..=loss).map(Step::Compute).collect();
    for v in [drop_node, bn_node] {
        // Free everything downstream that reads v first, so the recompute is legal.
        steps.push(Step::Free(v));
        steps.push(Step::Compute(v));
        steps.push(Step::Free(v));
        steps.push(Step::Compute(v));
    }
    steps.extend((loss + 1..n).map(Step::Compute));
    let mut again = base;
    let r2 = again.run_plan(&Plan::new(steps), &batch).unwrap();
    assert_eq!(r2.loss, report.loss);
    assert_eq!(r2.computes, n + 4);
    let got: Vec<Vec<f32>> = again
        .params()
        .iter()
        .flatten()
        .chain(again.grads().iter().flatten().flatten())
        .map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect();
    assert_eq!(got, want, "recomputation changed parameters or gradients");
    // The next step draws a new dropout mask (same batch, same weights, other loss).
    let r3 = again.run_plan(&all, &batch).unwrap();
    assert_ne!(r3.loss, r2.loss);
}

#[test]
fn segmentation_and_token_losses_fall_on_synthetic_data() {
    let mut c = ModelConfig::new(4).with_classes(5);
    c.width = Some(16);
    c.heads = Some(2);
    c.depth = Some(1);
    c.seq_len = Some(6);
    let transformer = checkmate_models::transformer(&c).unwrap();
    for (net, lr) in [(small_segmenter(), 0.05), (transformer, 0.01)] {
        let name = net.name().to_string();
        let mut exec = Executor::new(net, &config(), &Device::Cpu, DType::F32, 5).unwrap();
        let n = exec.graph().len();
        let plan = Plan::new((0..n).map(Step::Compute).collect());
        let data = SyntheticData::new(&exec, 0.2, 6).unwrap();
        let mut opt = Optimizer::new(OptimizerKind::adam(lr)).unwrap();
        let losses: Vec<f64> = train(&mut exec, &plan, &data, &mut opt, 40)
            .unwrap()
            .iter()
            .map(|r| r.loss)
            .collect();
        let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
        let last: f64 = losses[35..].iter().sum::<f64>() / 5.0;
        assert!(last < 0.6 * first, "{name}: loss {first} -> {last}");
    }
}
