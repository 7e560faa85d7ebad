//! Operator-level training graphs (docs/OP_GRAPHS.md) train exactly like layer-level ones: the
//! parameters after two steps are bitwise equal to the layer graph's, for checkpoint-all and for
//! plans that recompute, and every node's heap is what the graph models.

use candle_core::{DType, Device};
use checkmate_executor::heap::{self, Counting};
use checkmate_executor::{train, Executor, Optimizer, OptimizerKind, SyntheticData};
use checkmate_graph::{Plan, Step};
use checkmate_models::{
    model_by_name, Conv2d, Dense, Granularity, ImageSize, ModelConfig, Network, NetworkBuilder,
    NodeRole, Op, Pool2d, SavedKind, Shape, TrainingConfig,
};
use checkmate_solver::{solve, strategy_by_name, SolveOptions};

#[global_allocator]
static ALLOC: Counting = Counting;

/// The counter is process-wide: the tests of this file run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn config(granularity: Granularity) -> TrainingConfig {
    TrainingConfig {
        granularity,
        ..TrainingConfig::default()
    }
}

/// Operator level with ReLUs applied in place.
fn in_place() -> TrainingConfig {
    TrainingConfig {
        relu_in_place: true,
        ..config(Granularity::Op)
    }
}

/// conv-relu twice, a residual add, padded max-pool, a ReLU6, conv, flatten, dense-relu, logits.
fn small_cnn() -> Network {
    let mut b = NetworkBuilder::new("cnn", Shape::new([2, 2, 7, 7]));
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
    let mut pool = Pool2d::new(3, 2);
    pool.padding = checkmate_models::Padding::Same;
    let p = b.layer("pool", Op::MaxPool2d(pool), s).unwrap();
    let r6 = b
        .layer(
            "relu6",
            Op::Activation(checkmate_models::Activation::Relu6),
            p,
        )
        .unwrap();
    let c3 = b
        .layer("conv3", Op::Conv2d(Conv2d::new(4, 2).no_bias()), r6)
        .unwrap();
    let f = b.layer("flatten", Op::Flatten, c3).unwrap();
    let h = b
        .layer("hidden", Op::Dense(Dense::new(5).relu()), f)
        .unwrap();
    let d = b.layer("logits", Op::Dense(Dense::new(3)), h).unwrap();
    b.finish(d, 1).unwrap()
}

/// A convolution whose only consumer is a max pooling its gradient kernels expand (7x7 pooled
/// by 2: the last row and column are in no window), twice, as in VGG.
fn pooled_cnn() -> Network {
    let mut b = NetworkBuilder::new("pooled", Shape::new([2, 3, 7, 7]));
    let c1 = b
        .layer(
            "conv1",
            Op::Conv2d(Conv2d::new(4, 3).same().relu()),
            b.input(),
        )
        .unwrap();
    let c2 = b
        .layer("conv2", Op::Conv2d(Conv2d::new(4, 3).same().relu()), c1)
        .unwrap();
    let p = b
        .layer("pool", Op::MaxPool2d(Pool2d::new(2, 2)), c2)
        .unwrap();
    let c3 = b
        .layer("conv3", Op::Conv2d(Conv2d::new(5, 2).relu()), p)
        .unwrap();
    let p2 = b
        .layer("pool2", Op::MaxPool2d(Pool2d::new(2, 2)), c3)
        .unwrap();
    let f = b.layer("flatten", Op::Flatten, p2).unwrap();
    let d = b.layer("logits", Op::Dense(Dense::new(3)), f).unwrap();
    b.finish(d, 1).unwrap()
}

/// A concatenation of two convolutions read by two more (whose gradients sum in each input's
/// slice), large enough that a slice's temporaries exceed the heap check's 1 MiB slack.
fn concat_cnn() -> Network {
    let mut b = NetworkBuilder::new("concat", Shape::new([2, 3, 96, 96]));
    let c1 = b
        .layer(
            "conv1",
            Op::Conv2d(Conv2d::new(16, 3).same().relu()),
            b.input(),
        )
        .unwrap();
    let c2 = b
        .layer("conv2", Op::Conv2d(Conv2d::new(24, 3).same().relu()), c1)
        .unwrap();
    let cat = b.add("cat", Op::Concat { axis: 1 }, &[c1, c2]).unwrap();
    let l = b
        .layer("left", Op::Conv2d(Conv2d::new(2, 3).same()), cat)
        .unwrap();
    let r = b
        .layer("right", Op::Conv2d(Conv2d::new(2, 1)), cat)
        .unwrap();
    let s = b.add("sum", Op::Add, &[l, r]).unwrap();
    let f = b.layer("flatten", Op::Flatten, s).unwrap();
    let d = b.layer("logits", Op::Dense(Dense::new(3)), f).unwrap();
    b.finish(d, 1).unwrap()
}

/// A standalone ReLU read by a convolution and a residual add (two upstream gradients, summed and
/// masked in one pass), large enough that a summed temporary would exceed the heap check's slack.
fn residual_cnn() -> Network {
    let mut b = NetworkBuilder::new("residual", Shape::new([2, 3, 96, 96]));
    let c1 = b
        .layer("conv1", Op::Conv2d(Conv2d::new(24, 3).same()), b.input())
        .unwrap();
    let r = b
        .layer(
            "relu",
            Op::Activation(checkmate_models::Activation::Relu),
            c1,
        )
        .unwrap();
    let c2 = b
        .layer("conv2", Op::Conv2d(Conv2d::new(24, 3).same()), r)
        .unwrap();
    let s = b.add("add", Op::Add, &[r, c2]).unwrap();
    let p = b
        .layer("pool", Op::MaxPool2d(Pool2d::new(8, 8)), s)
        .unwrap();
    let f = b.layer("flatten", Op::Flatten, p).unwrap();
    let d = b.layer("logits", Op::Dense(Dense::new(3)), f).unwrap();
    b.finish(d, 1).unwrap()
}

fn zoo(model: &str, batch: usize, image: usize) -> Network {
    let mut c = ModelConfig::new(batch).with_classes(10);
    c.image_size = Some(ImageSize::square(image));
    if model.starts_with("vgg") {
        c.width = Some(64);
    }
    model_by_name(model, &c).unwrap()
}

fn bits(exec: &Executor) -> Vec<u32> {
    exec.params()
        .iter()
        .flatten()
        .flat_map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .map(f32::to_bits)
        .collect()
}

/// Two SGD steps with `plan` (checkpoint-all when `None`); the parameter bits and the losses.
fn run(net: &Network, granularity: Granularity, plan: Option<&Plan>) -> (Vec<u32>, Vec<f64>) {
    run_with(net, &config(granularity), plan)
}

/// [`run`] with any training configuration.
fn run_with(net: &Network, config: &TrainingConfig, plan: Option<&Plan>) -> (Vec<u32>, Vec<f64>) {
    let mut exec = Executor::new(net.clone(), config, &Device::Cpu, DType::F32, 7).unwrap();
    let all = Plan::new((0..exec.graph().len()).map(Step::Compute).collect());
    let data = SyntheticData::new(&exec, 0.5, 3).unwrap();
    let mut opt = Optimizer::new(OptimizerKind::sgd(0.05)).unwrap();
    let reports = train(&mut exec, plan.unwrap_or(&all), &data, &mut opt, 2).unwrap();
    for r in &reports {
        assert_eq!(r.measured_live, r.predicted_live, "{}", net.name());
    }
    (bits(&exec), reports.iter().map(|r| r.loss).collect())
}

#[test]
fn op_graphs_have_masks_indices_and_split_gradients() {
    let net = small_cnn();
    let tg = net.training_graph(&config(Granularity::Op)).unwrap();
    let layer = net.training_graph(&config(Granularity::Layer)).unwrap();
    let count =
        |f: &dyn Fn(NodeRole) -> bool| (0..tg.graph.len()).filter(|&i| f(tg.role(i))).count();
    // conv1, conv2, relu6, hidden carry masks; the pool its indices.
    assert_eq!(
        count(&|r| matches!(r, NodeRole::Saved(_, SavedKind::ActivationMask))),
        4
    );
    assert_eq!(
        count(&|r| matches!(r, NodeRole::Saved(_, SavedKind::PoolIndex))),
        1
    );
    // conv2, conv3, hidden and logits split (conv1 has no input gradient).
    assert_eq!(count(&|r| matches!(r, NodeRole::WeightGrad(_))), 4);
    assert_eq!(tg.graph.len(), layer.graph.len() + 9);
    assert!(tg.relu_in_place.iter().all(Option::is_none));
    // With `relu_in_place` the ReLU6 overwrites the pooling's output: one node for both layers.
    let ip = net.training_graph(&in_place()).unwrap();
    let pool = net.layer_by_name("pool").unwrap();
    let relu6 = net.layer_by_name("relu6").unwrap();
    assert_eq!(ip.relu_in_place[pool], Some(relu6));
    assert_eq!(ip.forward_node(pool), ip.forward_node(relu6));
    assert_eq!(ip.relu_in_place.iter().flatten().count(), 1);
    assert_eq!(ip.graph.len(), layer.graph.len() + 8);
    // No input-gradient node reads its layer's input; a mask is an eighth of its tensor.
    for i in 0..tg.graph.len() {
        if let NodeRole::Saved(l, SavedKind::ActivationMask) = tg.role(i) {
            let y = tg.graph.node(tg.forward_node(l)).bytes;
            assert_eq!(tg.graph.node(i).bytes, (y / 4).div_ceil(8));
        }
        if let NodeRole::Backward(l) = tg.role(i) {
            if tg.backward[l].as_ref().unwrap().weight_node.is_some() {
                for t in &net.layer(l).inputs {
                    if let checkmate_models::TensorRef::Layer(p) = t {
                        let f = tg.forward_node(*p);
                        assert!(!tg.graph.preds(i).contains(&f), "{}", tg.graph.label(i));
                    }
                }
            }
        }
    }
    // The same work: the split costs no more than the whole (masks and indices are extra).
    assert!(tg.graph.total_cost() >= layer.graph.total_cost());
    // A concatenation read by two layers: one node per input gradient, each summing its slice
    // of the two upstream gradients (two slice-sized temporaries, which the heap test checks).
    let tg = concat_cnn()
        .training_graph(&config(Granularity::Op))
        .unwrap();
    let slices: Vec<usize> = (0..tg.graph.len())
        .filter(|&i| matches!(tg.role(i), NodeRole::InputGrad(..)))
        .collect();
    assert_eq!(slices.len(), 2);
    for i in slices {
        let n = tg.graph.node(i);
        assert_eq!(n.workspace_bytes, 2 * n.bytes, "{}", n.name);
        assert!(n.bytes > 1 << 20, "{}", n.name);
    }
    // A ReLU read by two layers: its gradient sums both and masks them in one pass, no summed
    // temporary beside its output.
    let tg = residual_cnn()
        .training_graph(&config(Granularity::Op))
        .unwrap();
    let relu = tg
        .graph
        .nodes()
        .iter()
        .find(|n| n.name == "relu_backward")
        .unwrap();
    assert_eq!(relu.workspace_bytes, 0);
    assert_eq!(
        tg.graph.preds(relu.id as usize).len(),
        3,
        "mask and two gradients"
    );
    assert!(relu.bytes > 1 << 20);
}

#[test]
fn op_graphs_train_bitwise_like_layer_graphs() {
    let _serial = serial();
    let pooled = pooled_cnn();
    let tg = pooled.training_graph(&config(Granularity::Op)).unwrap();
    assert_eq!(
        tg.backward
            .iter()
            .flatten()
            .filter(|b| b.pooled.is_some())
            .count(),
        2
    );
    let nets = [
        pooled,
        small_cnn(),
        concat_cnn(),
        residual_cnn(),
        zoo("vgg16", 2, 32),
        zoo("resnet50", 2, 32),
        zoo("mobilenet", 2, 32),
        zoo("unet", 1, 64),
    ];
    let mut in_place_relus = 0;
    for net in nets {
        let (want, losses) = run(&net, Granularity::Layer, None);
        let (got, got_losses) = run(&net, Granularity::Op, None);
        assert_eq!(got_losses, losses, "{}: losses differ", net.name());
        assert!(
            got == want,
            "{}: parameters differ from the layer graph's",
            net.name()
        );
        // ReLUs in place compute the same values (candle's `max(v, 0)`).
        in_place_relus += net
            .training_graph(&in_place())
            .unwrap()
            .relu_in_place
            .iter()
            .flatten()
            .count();
        let (got, got_losses) = run_with(&net, &in_place(), None);
        assert_eq!(got_losses, losses, "{}: losses differ in place", net.name());
        assert!(got == want, "{}: parameters differ in place", net.name());
    }
    assert!(in_place_relus > 20, "only {in_place_relus} ReLUs in place");
}

#[test]
fn op_level_plans_that_recompute_train_bitwise_identically() {
    let _serial = serial();
    let mut alternatives = 0;
    for net in [
        small_cnn(),
        pooled_cnn(),
        concat_cnn(),
        residual_cnn(),
        zoo("vgg16", 2, 32),
        zoo("resnet50", 1, 32),
    ] {
        let exec = Executor::new(
            net.clone(),
            &config(Granularity::Op),
            &Device::Cpu,
            DType::F32,
            7,
        )
        .unwrap();
        let g = exec.graph().clone();
        let (want, losses) = run(&net, Granularity::Op, None);
        let mut recomputed = 0;
        for strategy in ["chen-sqrtn", "lp-round"] {
            let plan = tightest_plan(&g, strategy);
            if plan.compute_count() > g.len() {
                recomputed += 1;
            }
            let (got, got_losses) = run(&net, Granularity::Op, Some(&plan));
            assert_eq!(got_losses, losses, "{} {strategy}", net.name());
            assert!(got == want, "{} {strategy}: parameters differ", net.name());
            // The convolutions' whole-sample kernels compute the same bits.
            let whole = with_alternatives(&g, &plan);
            alternatives += usize::from(whole.uses_alternatives());
            let (got, got_losses) = run(&net, Granularity::Op, Some(&whole));
            assert_eq!(got_losses, losses, "{} {strategy} whole-sample", net.name());
            assert!(
                got == want,
                "{} {strategy} whole-sample: parameters differ",
                net.name()
            );
        }
        assert!(
            recomputed > 0,
            "{}: nothing recomputed, the test proves nothing",
            net.name()
        );
    }
    // (At these sizes VGG16 has convolutions whose sample exceeds a chunk.)
    assert!(
        alternatives >= 2,
        "only {alternatives} plans with whole-sample kernels"
    );
}

/// `strategy`'s plan for `g` at the least of 20%, 25%, ... 200% of the checkpoint-all peak it
/// finds one for (5 s per solve).
fn tightest_plan(g: &checkmate_graph::Graph, strategy: &str) -> Plan {
    let all = strategy_by_name("checkpoint-all").unwrap();
    let full = solve(g, all.as_ref(), u64::MAX, &SolveOptions::default())
        .unwrap()
        .peak_bytes()
        .unwrap();
    let s = strategy_by_name(strategy).unwrap();
    let options = SolveOptions {
        time_limit: Some(std::time::Duration::from_secs(5)),
        ..SolveOptions::default()
    };
    (4..=40)
        .map(|k| full * k / 20)
        .find_map(|b| solve(g, s.as_ref(), b, &options).ok().and_then(|s| s.plan))
        .unwrap()
}

/// `plan` for `g` with every node that has a second implementation computing with it.
fn with_alternatives(g: &checkmate_graph::Graph, plan: &Plan) -> Plan {
    let mut p = plan.clone();
    p.implementations = p
        .steps
        .iter()
        .map(|s| match *s {
            Step::Compute(v) if g.node(v).implementation_count() > 1 => 1,
            _ => 0,
        })
        .collect();
    p
}

/// Checkpoint-all of `g` with every second implementation.
fn all_alternatives(g: &checkmate_graph::Graph) -> Plan {
    with_alternatives(g, &Plan::new((0..g.len()).map(Step::Compute).collect()))
}

/// Every node of an operator-level graph allocates what it models, within 1 MiB (gemm's packing
/// and candle's small temporaries), with either implementation of a convolution.
#[test]
fn every_op_node_allocates_what_it_models() {
    let _serial = serial();
    heap::warm_up_cpu().unwrap();
    let mut checked = 0;
    let mut alternatives = 0;
    for net in [
        small_cnn(),
        pooled_cnn(),
        concat_cnn(),
        residual_cnn(),
        zoo("vgg16", 4, 32),
        zoo("resnet50", 2, 32),
        zoo("mobilenet", 2, 32),
        zoo("unet", 1, 64),
    ] {
        let name = net.name().to_string();
        // ResNet50 and MobileNet with their ReLUs in place (no allocation for the ReLU).
        let cfg = if matches!(net.name().split('-').next(), Some("resnet50" | "mobilenet")) {
            in_place()
        } else {
            config(Granularity::Op)
        };
        let mut exec = Executor::new(net, &cfg, &Device::Cpu, DType::F32, 1).unwrap();
        let g = exec.graph().clone();
        let all = Plan::new((0..g.len()).map(Step::Compute).collect());
        // The same steps with every convolution's second kernel (docs/IMPLEMENTATIONS.md).
        let whole = all_alternatives(&g);
        let data = SyntheticData::new(&exec, 0.1, 2).unwrap();
        let mut opt = Optimizer::new(OptimizerKind::sgd(0.01)).unwrap();
        exec.run_plan(&all, &data.batch(&exec, 0).unwrap()).unwrap();
        opt.step(&mut exec).unwrap();
        for plan in [&all, &whole] {
            let report = exec.run_plan(plan, &data.batch(&exec, 1).unwrap()).unwrap();
            for (k, step) in plan.steps.iter().enumerate() {
                let Step::Compute(v) = *step else { continue };
                let seen = report.heap_during_step[k] as i64 + g.static_bytes() as i64;
                let modelled = report.heap_modelled[k] as i64;
                let imp = plan.implementation(k);
                assert!(
                    (seen - modelled).abs() <= 1 << 20,
                    "{name}: {} ({}) allocated {seen}, modelled {modelled} (output {}, workspace {})",
                    g.label(v),
                    g.node(v).implementation_name(imp),
                    g.node(v).bytes,
                    g.node(v).workspace_with(imp)
                );
                checked += 1;
                if imp != 0 {
                    alternatives += 1;
                }
            }
        }
    }
    assert!(checked > 800, "only {checked} nodes checked");
    assert!(
        alternatives >= 20,
        "only {alternatives} alternative kernels checked"
    );
}

fn fused() -> TrainingConfig {
    TrainingConfig {
        fuse_conv_pool: true,
        ..config(Granularity::Op)
    }
}

/// The parameter gradients of one checkpoint-all step from the same weights and batch, tensor by
/// tensor (batch norm's running statistics have none).
fn gradients(net: &Network, config: &TrainingConfig) -> Vec<Vec<f64>> {
    let mut exec = Executor::new(net.clone(), config, &Device::Cpu, DType::F32, 7).unwrap();
    let all = Plan::new((0..exec.graph().len()).map(Step::Compute).collect());
    let data = SyntheticData::new(&exec, 0.5, 3).unwrap();
    exec.run_plan(&all, &data.batch(&exec, 0).unwrap()).unwrap();
    exec.grads()
        .iter()
        .flatten()
        .flatten()
        .map(|g| g.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .map(|v| v.into_iter().map(f64::from).collect())
        .collect()
}

/// `||a - b|| / ||b||` over all tensors together, and the largest per tensor.
fn relative_difference(a: &[Vec<f64>], b: &[Vec<f64>]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let (mut diff, mut norm, mut worst) = (0.0, 0.0, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len());
        let d: f64 = x.iter().zip(y).map(|(p, q)| (p - q) * (p - q)).sum();
        let n: f64 = y.iter().map(|q| q * q).sum();
        if n > 0.0 {
            worst = worst.max((d / n).sqrt());
        }
        diff += d;
        norm += n;
    }
    ((diff / norm).sqrt(), worst)
}

/// A convolution fused with its pooling (`TrainingConfig::fuse_conv_pool`): no saved-state
/// nodes for the pair, the pooling recomputes at the winners; the gradients of a step within 1e-5
/// (relative, L2) of the layer graph's (U-Net at batch 2: at batch 1 its batch norms, over one
/// sample, amplify the rounding to 1.1e-5) (the pooled values are dot products, not the matrix
/// product's sums); plans that recompute train bitwise like the fused graph's checkpoint-all;
/// every node allocates what it models.
#[test]
fn fused_convolution_and_pooling_train_like_the_layer_graph() {
    let _serial = serial();
    heap::warm_up_cpu().unwrap();
    let mut fused_pairs = 0;
    let mut recomputed = 0;
    for net in [pooled_cnn(), zoo("vgg16", 2, 32), zoo("unet", 2, 64)] {
        let name = net.name().to_string();
        let op = net.training_graph(&config(Granularity::Op)).unwrap();
        let tg = net.training_graph(&fused()).unwrap();
        let pairs = tg.fused_with.iter().flatten().count() / 2;
        assert!(pairs > 0, "{name}: nothing fused");
        fused_pairs += pairs;
        // Each pair drops the convolution's output, its mask node and the winners node.
        assert_eq!(tg.graph.len() + 2 * pairs, op.graph.len(), "{name}");
        for (l, other) in tg.fused_with.iter().enumerate() {
            let Some(p) = *other else { continue };
            let node = tg.graph.node(tg.forward_node(l));
            if matches!(net.layer(l).op, Op::Conv2d(_)) {
                let y = net.layer(l).output.shape.elements();
                let pooled = net.layer(p).output.shape.elements();
                assert_eq!(node.bytes, y.div_ceil(8) + pooled, "{name}: {}", node.name);
            } else {
                // The pooling reads the convolution's input and its winners.
                assert!(tg
                    .graph
                    .preds(tg.forward_node(l))
                    .contains(&tg.forward_node(p)));
            }
        }
        // Less memory at the least feasible budget is what the fusion is for.
        let least = |g: &checkmate_graph::Graph| {
            checkmate_solver::milp::least_feasible_budget(g, &SolveOptions::default())
                .unwrap()
                .unwrap()
        };
        assert!(least(&tg.graph) < least(&op.graph), "{name}");

        let exec = Executor::new(net.clone(), &fused(), &Device::Cpu, DType::F32, 7).unwrap();
        let (total, worst) = relative_difference(
            &gradients(&net, &fused()),
            &gradients(&net, &config(Granularity::Layer)),
        );
        eprintln!("{name}: gradients {total:e} from the layer graph's, worst tensor {worst:e}");
        assert!(
            total <= 1e-5,
            "{name}: gradients {total:e} from the layer graph's"
        );
        let (want, losses) = run_with(&net, &fused(), None);
        let g = exec.graph().clone();
        for strategy in ["chen-sqrtn", "lp-round"] {
            let plan = tightest_plan(&g, strategy);
            recomputed += usize::from(plan.compute_count() > g.len());
            let (got, got_losses) = run_with(&net, &fused(), Some(&plan));
            assert_eq!(got_losses, losses, "{name} {strategy}");
            assert!(got == want, "{name} {strategy}: parameters differ");
        }

        let mut exec = Executor::new(net, &fused(), &Device::Cpu, DType::F32, 1).unwrap();
        let plan = Plan::new((0..g.len()).map(Step::Compute).collect());
        let data = SyntheticData::new(&exec, 0.1, 2).unwrap();
        let mut opt = Optimizer::new(OptimizerKind::sgd(0.01)).unwrap();
        exec.run_plan(&plan, &data.batch(&exec, 0).unwrap())
            .unwrap();
        opt.step(&mut exec).unwrap();
        let report = exec
            .run_plan(&plan, &data.batch(&exec, 1).unwrap())
            .unwrap();
        for (k, step) in plan.steps.iter().enumerate() {
            let Step::Compute(v) = *step else { continue };
            let seen = report.heap_during_step[k] as i64 + g.static_bytes() as i64;
            let modelled = report.heap_modelled[k] as i64;
            assert!(
                (seen - modelled).abs() <= 1 << 20,
                "{name}: {} allocated {seen}, modelled {modelled}",
                g.label(v)
            );
        }
    }
    assert!(fused_pairs >= 2 + 5 + 4, "only {fused_pairs} fused pairs");
    assert!(recomputed >= 3, "only {recomputed} plans recompute");
}
