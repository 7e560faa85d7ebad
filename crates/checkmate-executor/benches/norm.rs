//! Batch normalization's direct CPU kernels (`direct_cpu`: the output only, statistics in f64)
//! against the candle tensor-op rules they replaced (one temporary per elementwise step), forward
//! and backward, on ResNet50 shapes at batch 8, measured side by side in one run. Prints the
//! ratio direct / tensor ops per shape and direction.

use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use checkmate_executor::kernels as k;
use criterion::{criterion_group, criterion_main, Criterion};

/// (name, input [n, c, h, w]): ResNet50's batch norms at 224x224 in stages 1, 3 and 5, batch 8.
const SHAPES: [(&str, [usize; 4]); 3] = [
    ("conv2_block1_1_bn", [8, 64, 56, 56]),
    ("conv4_block1_1_bn", [8, 256, 14, 14]),
    ("conv5_block1_3_bn", [8, 2048, 7, 7]),
];

fn median_seconds(mut f: impl FnMut(), reps: usize) -> f64 {
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[reps / 2]
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_norm");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2));
    let mut ratios = Vec::new();
    for (name, dims) in SHAPES {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, dims.to_vec(), &dev).unwrap();
        let g = Tensor::randn(0f32, 1.0, dims.to_vec(), &dev).unwrap();
        let gamma = Tensor::randn(1f32, 0.1, dims[1], &dev).unwrap();
        let beta = Tensor::randn(0f32, 0.1, dims[1], &dev).unwrap();
        let fwd_direct = || k::batch_norm_forward(&x, &gamma, &beta, 1e-3).unwrap();
        let fwd_ops = || k::batch_norm_forward_ops(&x, &gamma, &beta, 1e-3).unwrap();
        let bwd_direct = || k::batch_norm_backward(&x, &gamma, &g, 1e-3).unwrap();
        let bwd_ops = || k::batch_norm_backward_ops(&x, &gamma, &g, 1e-3).unwrap();
        group.bench_function(format!("{name}/forward/direct"), |b| b.iter(fwd_direct));
        group.bench_function(format!("{name}/forward/tensor-ops"), |b| b.iter(fwd_ops));
        group.bench_function(format!("{name}/backward/direct"), |b| b.iter(bwd_direct));
        group.bench_function(format!("{name}/backward/tensor-ops"), |b| b.iter(bwd_ops));
        // Interleaved: each repetition runs both, so load from other processes hits both alike.
        let (mut fd, mut fo, mut bd, mut bo) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..15 {
            fd.push(median_seconds(|| drop(fwd_direct()), 1));
            fo.push(median_seconds(|| drop(fwd_ops()), 1));
            bd.push(median_seconds(|| drop(bwd_direct()), 1));
            bo.push(median_seconds(|| drop(bwd_ops()), 1));
        }
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        ratios.push((name, med(fd) / med(fo), med(bd) / med(bo)));
    }
    group.finish();
    for (name, f, b) in ratios {
        println!("{name}: direct / tensor ops  forward {f:.2}  backward {b:.2}");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
