//! The chunked CPU convolution (`conv_cpu`, bounded scratch) against candle's own `conv2d`
//! (whole-input NHWC copy, per-thread tiles), forward and backward, on VGG16 layer shapes at 32x32
//! and batch 16, measured side by side in one run. candle's backward is what its autograd does for
//! conv2d: `conv_transpose2d` of the gradient for dX, a convolution with the batch as channels for
//! dW. Prints the ratio chunked / candle per shape and direction.

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use checkmate_executor::kernels as k;
use checkmate_models::Conv2d;
use criterion::{criterion_group, criterion_main, Criterion};

/// (name, input [n, c, h, w], filters): VGG16's first convolution of blocks 1, 3 and 5.
const SHAPES: [(&str, [usize; 4], usize); 3] = [
    ("block1_conv2", [16, 64, 32, 32], 64),
    ("block3_conv2", [16, 256, 8, 8], 256),
    ("block5_conv2", [16, 512, 2, 2], 512),
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
    let mut group = c.benchmark_group("conv2d_forward");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    for (name, dims, filters) in SHAPES {
        let x = Tensor::randn(0f32, 1.0, dims.to_vec(), &Device::Cpu).unwrap();
        let w = Tensor::randn(0f32, 0.1, (filters, dims[1], 3, 3), &Device::Cpu).unwrap();
        let conv = Conv2d::new(filters, 3).no_bias().same();
        assert_eq!(x.dtype(), DType::F32);
        group.bench_function(format!("{name}/forward/chunked"), |b| {
            b.iter(|| k::conv2d_forward(&x, &w, None, &conv).unwrap())
        });
        group.bench_function(format!("{name}/forward/candle"), |b| {
            b.iter(|| x.conv2d(&w, 1, 1, 1, 1).unwrap())
        });
        let g = Tensor::randn(
            0f32,
            1.0,
            (dims[0], filters, dims[2], dims[3]),
            &Device::Cpu,
        )
        .unwrap();
        let candle_backward = || {
            let dx = g.conv_transpose2d(&w, 1, 0, 1, 1).unwrap();
            let dw = x
                .transpose(0, 1)
                .unwrap()
                .conv2d(&g.transpose(0, 1).unwrap(), 1, 1, 1, 1)
                .unwrap()
                .transpose(0, 1)
                .unwrap();
            (dx, dw)
        };
        let ours_backward = || k::conv2d_backward(&x, &w, &g, &conv, true, true, false).unwrap();
        assert_eq!(candle_backward().1.dims(), w.dims());
        group.bench_function(format!("{name}/backward/chunked"), |b| {
            b.iter(ours_backward)
        });
        group.bench_function(format!("{name}/backward/candle"), |b| {
            b.iter(candle_backward)
        });
        // Interleaved medians, so both see the same machine load.
        let (mut ours, mut theirs, mut ours_b, mut theirs_b) = (vec![], vec![], vec![], vec![]);
        for _ in 0..5 {
            ours.push(median_seconds(
                || drop(k::conv2d_forward(&x, &w, None, &conv).unwrap()),
                3,
            ));
            theirs.push(median_seconds(
                || drop(x.conv2d(&w, 1, 1, 1, 1).unwrap()),
                3,
            ));
            ours_b.push(median_seconds(|| drop(ours_backward()), 3));
            theirs_b.push(median_seconds(|| drop(candle_backward()), 3));
        }
        for (dir, mut a, mut b) in [("forward", ours, theirs), ("backward", ours_b, theirs_b)] {
            a.sort_by(f64::total_cmp);
            b.sort_by(f64::total_cmp);
            println!(
                "{name} {dir}: chunked {:.2} ms, candle {:.2} ms, ratio {:.2}",
                1e3 * a[2],
                1e3 * b[2],
                a[2] / b[2]
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
