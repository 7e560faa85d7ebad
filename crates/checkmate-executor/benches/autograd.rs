//! One checkpoint-all training step through `Executor::run_plan` (hand-written gradients) versus
//! a plain candle autograd step (`Var` + `backward()`) of the same small VGG-like model, with the
//! same forward kernels, batch and SGD update, measured side by side in one run. Prints the ratio
//! (target: at most 1.10).

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor, Var};
use checkmate_executor::kernels as k;
use checkmate_executor::{Batch, Executor};
use checkmate_graph::{Plan, Step};
use checkmate_models::{
    Conv2d, Dense, Network, NetworkBuilder, Op, Pool2d, Shape, TensorRef, TrainingConfig,
};
use criterion::{criterion_group, criterion_main, Criterion};

const LR: f64 = 0.01;

/// Two VGG blocks (two 3x3 ReLU convolutions and a 2x2 max pool each), then two dense layers.
fn vgg_like() -> Network {
    let mut b = NetworkBuilder::new("vgg-like", Shape::new([8, 3, 32, 32]));
    let mut x = b.input();
    for (block, filters) in [(1, 16), (2, 32)] {
        for i in 1..=2 {
            let conv = Conv2d::new(filters, 3).same().relu();
            x = b
                .layer(format!("block{block}_conv{i}"), Op::Conv2d(conv), x)
                .unwrap();
        }
        x = b
            .layer(
                format!("block{block}_pool"),
                Op::MaxPool2d(Pool2d::new(2, 2)),
                x,
            )
            .unwrap();
    }
    let x = b.layer("flatten", Op::Flatten, x).unwrap();
    let x = b.layer("fc1", Op::Dense(Dense::new(64).relu()), x).unwrap();
    let x = b
        .layer("predictions", Op::Dense(Dense::new(10).softmax()), x)
        .unwrap();
    b.finish(x, 1).unwrap()
}

/// Plain SGD on every parameter that has a gradient.
fn sgd_executor(exec: &mut Executor) {
    let grads = exec.grads().to_vec();
    for (l, gs) in grads.iter().enumerate() {
        for (i, g) in gs.iter().enumerate() {
            if let Some(g) = g {
                let p = &exec.params()[l][i];
                let np = (p - (g * LR).unwrap()).unwrap();
                exec.params_mut()[l][i] = np;
            }
        }
    }
}

fn executor_step(exec: &mut Executor, plan: &Plan, batch: &Batch) -> f64 {
    let r = exec.run_plan(plan, batch).unwrap();
    sgd_executor(exec);
    r.loss
}

/// The same model's forward pass on candle `Var`s, through the executor's forward kernels.
fn autograd_forward(net: &Network, vars: &[Vec<Var>], input: &Tensor) -> Tensor {
    let mut outs: Vec<Tensor> = Vec::with_capacity(net.layers().len());
    for (l, layer) in net.layers().iter().enumerate() {
        let x = match layer.inputs[0] {
            TensorRef::Input => input,
            TensorRef::Layer(p) => &outs[p],
        };
        let ps: Vec<&Tensor> = vars[l].iter().map(|v| v.as_tensor()).collect();
        let y = match &layer.op {
            Op::Conv2d(c) => {
                let z = k::conv2d_forward(x, ps[0], ps.get(1).copied(), c).unwrap();
                k::activation_forward(&z, c.activation, 1).unwrap()
            }
            Op::Dense(d) => {
                let z = k::dense_forward(x, ps[0], ps.get(1).copied()).unwrap();
                k::activation_forward(&z, d.activation, 1).unwrap()
            }
            Op::MaxPool2d(p) => k::max_pool2d_forward(x, p).unwrap(),
            Op::Flatten => x.reshape(layer.output.shape.dims()).unwrap(),
            other => panic!("the bench model has no {}", other.kind()),
        };
        outs.push(y);
    }
    outs.pop().unwrap()
}

fn autograd_step(net: &Network, vars: &[Vec<Var>], batch: &Batch) -> f64 {
    let probs = autograd_forward(net, vars, &batch.input);
    let loss = k::cross_entropy_nd(&probs, &batch.labels, 1, false)
        .unwrap()
        .mean_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    for v in vars.iter().flatten() {
        if let Some(g) = grads.get(v.as_tensor()) {
            let np = (v.as_tensor() - (g * LR).unwrap()).unwrap();
            v.set(&np).unwrap();
        }
    }
    loss.to_scalar::<f32>().unwrap() as f64
}

struct Setup {
    net: Network,
    exec: Executor,
    plan: Plan,
    batch: Batch,
    vars: Vec<Vec<Var>>,
}

fn setup() -> Setup {
    let net = vgg_like();
    let config = TrainingConfig {
        workspace: false,
        ..TrainingConfig::default()
    };
    let exec = Executor::new(net.clone(), &config, &Device::Cpu, DType::F32, 1).unwrap();
    let plan = Plan::new((0..exec.graph().len()).map(Step::Compute).collect());
    let batch = exec.random_batch(3).unwrap();
    let vars = exec
        .params()
        .iter()
        .map(|ps| ps.iter().map(|p| Var::from_tensor(p).unwrap()).collect())
        .collect();
    Setup {
        net,
        exec,
        plan,
        batch,
        vars,
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn bench(c: &mut Criterion) {
    let mut s = setup();
    // Same start, same gradients up to float rounding: the first losses agree.
    let a = executor_step(&mut s.exec, &s.plan, &s.batch);
    let b = autograd_step(&s.net, &s.vars, &s.batch);
    assert!((a - b).abs() < 1e-4, "losses differ: {a} vs {b}");

    let mut group = c.benchmark_group("training_step_vgg_like_b8_32");
    group.sample_size(20);
    group.bench_function("executor_checkpoint_all", |bn| {
        bn.iter(|| executor_step(&mut s.exec, &s.plan, &s.batch))
    });
    group.bench_function("candle_autograd", |bn| {
        bn.iter(|| autograd_step(&s.net, &s.vars, &s.batch))
    });
    group.finish();

    // Interleaved, so both see the same machine load.
    let (mut te, mut ta) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let t = Instant::now();
        executor_step(&mut s.exec, &s.plan, &s.batch);
        te.push(t.elapsed());
        let t = Instant::now();
        autograd_step(&s.net, &s.vars, &s.batch);
        ta.push(t.elapsed());
    }
    let (me, ma) = (median(te), median(ta));
    println!(
        "checkpoint-all step {me:?}, candle autograd step {ma:?}: ratio {:.3} (target <= 1.10)",
        me.as_secs_f64() / ma.as_secs_f64()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
