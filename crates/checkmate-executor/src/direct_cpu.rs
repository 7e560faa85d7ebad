//! Direct CPU kernels that allocate only their result (plus per-channel or per-row statistics):
//! batch and layer normalization, softmax, elementwise activations and their gradients (ReLU,
//! ReLU6, GELU), dropout, zero padding and the cross-entropy loss. candle's tensor-op versions of
//! these allocate one temporary per elementwise step (batch-norm backward: about seven
//! output-sized tensors), which the training graph does not model.
//!
//! f32 and f64 only ([`applies`]); statistics are accumulated in f64 in one fixed order, so the
//! results do not depend on the thread count. Other dtypes and devices use the tensor-op kernels
//! of [`crate::kernels`].

use candle_core::{Result, Tensor, WithDType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::conv_cpu::with_slice;

/// Whether these kernels take `t` (CPU, f32 or f64): the same test as the chunked convolution.
pub fn applies(t: &Tensor) -> bool {
    crate::conv_cpu::applies(t)
}

/// Runs `f` with the element type of `t` (f32 or f64).
macro_rules! typed {
    ($t:expr, $f:ident ( $($arg:expr),* )) => {
        match $t.dtype() {
            candle_core::DType::F32 => $f::<f32>($($arg),*),
            candle_core::DType::F64 => $f::<f64>($($arg),*),
            other => candle_core::bail!("direct kernel: dtype {other:?} not supported"),
        }
    };
}
pub(crate) use typed;

/// `[outer, len, inner]` of `dims` around `axis`.
fn around(dims: &[usize], axis: usize) -> Result<(usize, usize, usize)> {
    if axis >= dims.len() {
        candle_core::bail!("axis {axis} out of range for {dims:?}")
    }
    let outer = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product();
    Ok((outer, dims[axis], inner))
}

/// `f(src, g)` elementwise: the gradient of an elementwise activation from its input or output
/// `src` and the upstream gradient `g`, in one pass (the result is the only allocation).
pub fn unary_backward(src: &Tensor, g: &Tensor, f: fn(f64, f64) -> f64) -> Result<Tensor> {
    fn run<T: WithDType>(src: &Tensor, g: &Tensor, f: fn(f64, f64) -> f64) -> Result<Tensor> {
        with_slice::<T, _>(src, |s| {
            with_slice::<T, _>(g, |gs| {
                let out: Vec<T> = s
                    .par_iter()
                    .zip(gs.par_iter())
                    .map(|(&a, &b)| T::from_f64(f(a.to_f64(), b.to_f64())))
                    .collect();
                Tensor::from_vec(out, g.dims(), g.device())
            })
        })
    }
    if src.dims() != g.dims() {
        candle_core::bail!("unary_backward: {:?} vs {:?}", src.dims(), g.dims())
    }
    typed!(g, run(src, g, f))
}

/// Softmax over `axis`, in two passes per row (maximum and sum, then the quotients).
pub fn softmax(x: &Tensor, axis: usize) -> Result<Tensor> {
    fn run<T: WithDType>(x: &Tensor, axis: usize) -> Result<Tensor> {
        let (outer, len, inner) = around(x.dims(), axis)?;
        with_slice::<T, _>(x, |xs| {
            let mut out = vec![T::from_f64(0.0); xs.len()];
            out.par_chunks_mut((len * inner).max(1))
                .zip(xs.par_chunks((len * inner).max(1)))
                .for_each(|(o, x)| {
                    for i in 0..inner {
                        let at = |k: usize| k * inner + i;
                        let m = (0..len).map(|k| x[at(k)].to_f64()).fold(f64::MIN, f64::max);
                        let mut sum = 0.0;
                        for k in 0..len {
                            let e = (x[at(k)].to_f64() - m).exp();
                            sum += e;
                            o[at(k)] = T::from_f64(e);
                        }
                        for k in 0..len {
                            o[at(k)] = T::from_f64(o[at(k)].to_f64() / sum);
                        }
                    }
                });
            debug_assert_eq!(out.len(), outer * len * inner);
            Tensor::from_vec(out, x.dims(), x.device())
        })
    }
    typed!(x, run(x, axis))
}

/// Gradient of softmax over `axis` from its output `y`: `y * (g - sum(g * y))`.
pub fn softmax_backward(y: &Tensor, g: &Tensor, axis: usize) -> Result<Tensor> {
    fn run<T: WithDType>(y: &Tensor, g: &Tensor, axis: usize) -> Result<Tensor> {
        let (_, len, inner) = around(y.dims(), axis)?;
        let row = (len * inner).max(1);
        with_slice::<T, _>(y, |ys| {
            with_slice::<T, _>(g, |gs| {
                let mut out = vec![T::from_f64(0.0); ys.len()];
                out.par_chunks_mut(row)
                    .zip(ys.par_chunks(row).zip(gs.par_chunks(row)))
                    .for_each(|(o, (y, g))| {
                        for i in 0..inner {
                            let at = |k: usize| k * inner + i;
                            let s: f64 = (0..len)
                                .map(|k| g[at(k)].to_f64() * y[at(k)].to_f64())
                                .sum();
                            for k in 0..len {
                                let v = y[at(k)].to_f64() * (g[at(k)].to_f64() - s);
                                o[at(k)] = T::from_f64(v);
                            }
                        }
                    });
                Tensor::from_vec(out, g.dims(), g.device())
            })
        })
    }
    if y.dims() != g.dims() {
        candle_core::bail!("softmax_backward: {:?} vs {:?}", y.dims(), g.dims())
    }
    typed!(g, run(y, g, axis))
}

/// `[N, C, R]` of a batch-norm input `[N, C, ...]`.
fn ncr(dims: &[usize]) -> Result<(usize, usize, usize)> {
    if dims.len() < 2 {
        candle_core::bail!("batch norm needs [N, C, ...], got {dims:?}")
    }
    Ok((dims[0], dims[1], dims[2..].iter().product()))
}

/// Per-channel batch mean and biased variance of `[N, C, R]` data, in f64, channels in parallel.
fn channel_stats<T: WithDType>(xs: &[T], (n, c, r): (usize, usize, usize)) -> Vec<(f64, f64)> {
    let count = (n * r).max(1) as f64;
    (0..c)
        .into_par_iter()
        .map(|ch| {
            let planes = || (0..n).map(move |s| &xs[(s * c + ch) * r..(s * c + ch + 1) * r]);
            let mean = planes().flatten().map(|v| v.to_f64()).sum::<f64>() / count;
            let var = planes()
                .flatten()
                .map(|v| (v.to_f64() - mean).powi(2))
                .sum::<f64>()
                / count;
            (mean, var)
        })
        .collect()
}

/// A per-channel (or per-column) parameter such as `gamma` as f64, checked to have `c` entries
/// (`what` names it in the error, e.g. "batch norm gamma").
fn per_entry<T: WithDType>(t: &Tensor, c: usize, what: &str) -> Result<Vec<f64>> {
    let v: Vec<f64> = with_slice::<T, _>(t, |s| Ok(s.iter().map(|v| v.to_f64()).collect()))?;
    if v.len() != c {
        candle_core::bail!("{what}: {} entries for {c} channels", v.len())
    }
    Ok(v)
}

/// Batch normalization over axis 1 in training mode: `(y, batch mean [C], biased batch variance
/// [C])`. Allocates the output and the two statistics.
pub fn batch_norm_forward(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    fn run<T: WithDType>(
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let shape = ncr(x.dims())?;
        let (_, c, r) = shape;
        let gm = per_entry::<T>(gamma, c, "batch norm gamma")?;
        let bt = per_entry::<T>(beta, c, "batch norm beta")?;
        with_slice::<T, _>(x, |xs| {
            let stats = channel_stats(xs, shape);
            let mut out = vec![T::from_f64(0.0); xs.len()];
            out.par_chunks_mut(r.max(1))
                .zip(xs.par_chunks(r.max(1)))
                .enumerate()
                .for_each(|(plane, (o, x))| {
                    let ch = plane % c;
                    let (mean, var) = stats[ch];
                    let scale = gm[ch] / (var + eps).sqrt();
                    for (o, &x) in o.iter_mut().zip(x) {
                        *o = T::from_f64((x.to_f64() - mean) * scale + bt[ch]);
                    }
                });
            let dev = x.device();
            let mean: Vec<T> = stats.iter().map(|s| T::from_f64(s.0)).collect();
            let var: Vec<T> = stats.iter().map(|s| T::from_f64(s.1)).collect();
            Ok((
                Tensor::from_vec(out, x.dims(), dev)?,
                Tensor::from_vec(mean, c, dev)?,
                Tensor::from_vec(var, c, dev)?,
            ))
        })
    }
    typed!(x, run(x, gamma, beta, eps))
}

/// Gradients of training-mode batch normalization from its input and the gradient `g` of its
/// output (statistics recomputed from `x`): `(dx, dgamma, dbeta)`, with
/// `dx = gamma / sigma * (g - mean(g) - xhat * mean(g * xhat))`. Allocates `dx` and three
/// per-channel vectors.
pub fn batch_norm_backward(
    x: &Tensor,
    gamma: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    fn run<T: WithDType>(
        x: &Tensor,
        gamma: &Tensor,
        g: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let shape = ncr(x.dims())?;
        let (n, c, r) = shape;
        let gm = per_entry::<T>(gamma, c, "batch norm gamma")?;
        with_slice::<T, _>(x, |xs| {
            with_slice::<T, _>(g, |gs| {
                let stats = channel_stats(xs, shape);
                // Per channel: (sum g, sum g * xhat), each in one fixed order.
                let sums: Vec<(f64, f64)> = (0..c)
                    .into_par_iter()
                    .map(|ch| {
                        let (mean, var) = stats[ch];
                        let inv = 1.0 / (var + eps).sqrt();
                        let (mut sg, mut sgx) = (0.0, 0.0);
                        for s in 0..n {
                            let at = (s * c + ch) * r;
                            for (&x, &g) in xs[at..at + r].iter().zip(&gs[at..at + r]) {
                                let g = g.to_f64();
                                sg += g;
                                sgx += g * (x.to_f64() - mean) * inv;
                            }
                        }
                        (sg, sgx)
                    })
                    .collect();
                let count = (n * r).max(1) as f64;
                let mut dx = vec![T::from_f64(0.0); xs.len()];
                dx.par_chunks_mut(r.max(1))
                    .zip(xs.par_chunks(r.max(1)).zip(gs.par_chunks(r.max(1))))
                    .enumerate()
                    .for_each(|(plane, (d, (x, g)))| {
                        let ch = plane % c;
                        let (mean, var) = stats[ch];
                        let inv = 1.0 / (var + eps).sqrt();
                        let (mg, mgx) = (sums[ch].0 / count, sums[ch].1 / count);
                        let k = gm[ch] * inv;
                        for (d, (&x, &g)) in d.iter_mut().zip(x.iter().zip(g)) {
                            let xhat = (x.to_f64() - mean) * inv;
                            *d = T::from_f64(k * (g.to_f64() - mg - xhat * mgx));
                        }
                    });
                let dev = x.device();
                let dgamma: Vec<T> = sums.iter().map(|s| T::from_f64(s.1)).collect();
                let dbeta: Vec<T> = sums.iter().map(|s| T::from_f64(s.0)).collect();
                Ok((
                    Tensor::from_vec(dx, x.dims(), dev)?,
                    Tensor::from_vec(dgamma, c, dev)?,
                    Tensor::from_vec(dbeta, c, dev)?,
                ))
            })
        })
    }
    if x.dims() != g.dims() {
        candle_core::bail!("batch_norm_backward: {:?} vs {:?}", x.dims(), g.dims())
    }
    typed!(x, run(x, gamma, g, eps))
}

/// Zero padding of the two spatial axes of NCHW `x` by `[top, bottom, left, right]`: one
/// allocation, the output.
pub fn pad2d(x: &Tensor, p: [usize; 4]) -> Result<Tensor> {
    fn run<T: WithDType>(x: &Tensor, p: [usize; 4]) -> Result<Tensor> {
        let (n, c, h, w) = x.dims4()?;
        let (hp, wp) = (h + p[0] + p[1], w + p[2] + p[3]);
        with_slice::<T, _>(x, |xs| {
            let mut out = vec![T::from_f64(0.0); n * c * hp * wp];
            out.par_chunks_mut((hp * wp).max(1))
                .zip(xs.par_chunks((h * w).max(1)))
                .for_each(|(o, x)| {
                    for y in 0..h {
                        let at = (y + p[0]) * wp + p[2];
                        o[at..at + w].copy_from_slice(&x[y * w..(y + 1) * w]);
                    }
                });
            Tensor::from_vec(out, (n, c, hp, wp), x.device())
        })
    }
    typed!(x, run(x, p))
}

/// `x` times the inverted-dropout mask that [`crate::kernels::dropout_mask`] draws from `seed`
/// (the same stream, element by element), without forming the mask: each product is the one
/// `x * mask` computes, bit for bit.
pub fn dropout(x: &Tensor, rate: f32, seed: u64) -> Result<Tensor> {
    fn run<T: WithDType>(x: &Tensor, rate: f32, seed: u64) -> Result<Tensor> {
        let keep = T::from_f64(1.0 / (1.0 - rate as f64)).to_f64();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        with_slice::<T, _>(x, |xs| {
            let out: Vec<T> = xs
                .iter()
                .map(|&v| {
                    let m = if rng.gen::<f32>() < rate { 0.0 } else { keep };
                    T::from_f64(v.to_f64() * m)
                })
                .collect();
            Tensor::from_vec(out, x.dims(), x.device())
        })
    }
    if !(0.0..1.0).contains(&rate) {
        candle_core::bail!("dropout rate {rate} must be in [0, 1)")
    }
    typed!(x, run(x, rate, seed))
}

/// The maximum of `len` values `v(0..len)` and the sum of `exp(v - max)`: the parts of a
/// numerically stable softmax or log-sum-exp, in one fixed order.
fn max_and_exp_sum(len: usize, v: impl Fn(usize) -> f64) -> (f64, f64) {
    let m = (0..len).map(&v).fold(f64::MIN, f64::max);
    (m, (0..len).map(|k| (v(k) - m).exp()).sum())
}

/// Runs `f` on the `u32` labels in place, after checking that each is a class index (below
/// `classes`). No copy: the labels were a per-pixel `usize` vector, twice their own size, that the
/// loss nodes' memory did not model (0.34 MiB for FCN8 at 64x64, batch 4).
fn with_labels<R>(
    labels: &Tensor,
    classes: usize,
    f: impl FnOnce(&[u32]) -> Result<R>,
) -> Result<R> {
    with_slice::<u32, _>(labels, |l| {
        if let Some(&c) = l.iter().find(|&&c| c as usize >= classes) {
            candle_core::bail!("label {c} out of range for {classes} classes")
        }
        f(l)
    })
}

/// Per-example cross-entropy of [`crate::kernels::cross_entropy_nd`] (classes on `axis`, mean
/// over each example's positions) read in place, without moving the classes last: allocates the
/// `[N]` result only.
pub fn cross_entropy(
    pred: &Tensor,
    labels: &Tensor,
    axis: usize,
    from_logits: bool,
) -> Result<Tensor> {
    fn run<T: WithDType>(
        pred: &Tensor,
        labels: &[u32],
        axis: usize,
        from_logits: bool,
    ) -> Result<Tensor> {
        let (outer, len, inner) = around(pred.dims(), axis)?;
        let n = pred.dim(0)?.max(1);
        let per_example = outer / n * inner;
        with_slice::<T, _>(pred, |ps| {
            let loss: Vec<T> = (0..n)
                .map(|e| {
                    let mut sum = 0.0;
                    for o in e * outer / n..(e + 1) * outer / n {
                        for i in 0..inner {
                            let at = |k: usize| (o * len + k) * inner + i;
                            let label = labels[o * inner + i] as usize;
                            sum += if from_logits {
                                let (m, s) = max_and_exp_sum(len, |k| ps[at(k)].to_f64());
                                s.ln() + m - ps[at(label)].to_f64()
                            } else {
                                -ps[at(label)].to_f64().clamp(1e-7, 1.0).ln()
                            };
                        }
                    }
                    T::from_f64(sum / per_example.max(1) as f64)
                })
                .collect();
            Tensor::from_vec(loss, n, pred.device())
        })
    }
    with_labels(labels, pred.dim(axis)?, |labels| {
        typed!(pred, run(pred, labels, axis, from_logits))
    })
}

/// Gradient of the batch mean of [`cross_entropy`] with respect to the softmax's input,
/// `(p - onehot) / rows` in `pred`'s own layout (`p` = softmax of `pred` when `from_logits`, else
/// `pred`): allocates the result only.
pub fn cross_entropy_backward(
    pred: &Tensor,
    labels: &Tensor,
    axis: usize,
    from_logits: bool,
) -> Result<Tensor> {
    fn run<T: WithDType>(
        pred: &Tensor,
        labels: &[u32],
        axis: usize,
        from_logits: bool,
    ) -> Result<Tensor> {
        let (outer, len, inner) = around(pred.dims(), axis)?;
        let rows = (outer * inner).max(1) as f64;
        let block = (len * inner).max(1);
        with_slice::<T, _>(pred, |ps| {
            let mut out = vec![T::from_f64(0.0); ps.len()];
            out.par_chunks_mut(block)
                .zip(ps.par_chunks(block))
                .enumerate()
                .for_each(|(o, (g, p))| {
                    for i in 0..inner {
                        let at = |k: usize| k * inner + i;
                        let label = labels[o * inner + i] as usize;
                        let (m, s) = if from_logits {
                            max_and_exp_sum(len, |k| p[at(k)].to_f64())
                        } else {
                            (0.0, 1.0)
                        };
                        for k in 0..len {
                            let v = p[at(k)].to_f64();
                            let prob = if from_logits { (v - m).exp() / s } else { v };
                            let hot = if k == label { 1.0 } else { 0.0 };
                            g[at(k)] = T::from_f64((prob - hot) / rows);
                        }
                    }
                });
            Tensor::from_vec(out, pred.dims(), pred.device())
        })
    }
    with_labels(labels, pred.dim(axis)?, |labels| {
        typed!(pred, run(pred, labels, axis, from_logits))
    })
}

/// An elementwise activation `f(x)` in one pass (candle's `clamp`, for ReLU6, forms a
/// temporary).
pub fn unary(x: &Tensor, f: fn(f64) -> f64) -> Result<Tensor> {
    fn run<T: WithDType>(x: &Tensor, f: fn(f64) -> f64) -> Result<Tensor> {
        with_slice::<T, _>(x, |xs| {
            let out: Vec<T> = xs.par_iter().map(|&v| T::from_f64(f(v.to_f64()))).collect();
            Tensor::from_vec(out, x.dims(), x.device())
        })
    }
    typed!(x, run(x, f))
}

/// Mean and `1 / sqrt(var + eps)` of one row, in f64.
fn row_stats<T: WithDType>(row: &[T], eps: f64) -> (f64, f64) {
    let len = row.len().max(1) as f64;
    let mean = row.iter().map(|v| v.to_f64()).sum::<f64>() / len;
    let var = row.iter().map(|v| (v.to_f64() - mean).powi(2)).sum::<f64>() / len;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Layer normalization over the last axis with scale `gamma` and shift `beta`, rows in
/// parallel: allocates the output only.
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    fn run<T: WithDType>(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
        let c = *x.dims().last().unwrap_or(&1);
        let gm = per_entry::<T>(gamma, c, "layer norm gamma")?;
        let bt = per_entry::<T>(beta, c, "layer norm beta")?;
        with_slice::<T, _>(x, |xs| {
            let mut out = vec![T::from_f64(0.0); xs.len()];
            out.par_chunks_mut(c.max(1))
                .zip(xs.par_chunks(c.max(1)))
                .for_each(|(o, x)| {
                    let (mean, inv) = row_stats(x, eps);
                    for (j, (o, &x)) in o.iter_mut().zip(x).enumerate() {
                        *o = T::from_f64((x.to_f64() - mean) * inv * gm[j] + bt[j]);
                    }
                });
            Tensor::from_vec(out, x.dims(), x.device())
        })
    }
    typed!(x, run(x, gamma, beta, eps))
}

/// Gradients of [`layer_norm`]: `(dx, dgamma, dbeta)`, `dx` rows in parallel, the parameter
/// gradients summed over rows in order. Allocates `dx`, two `[C]` vectors and the rows' mean and
/// `1/sigma` (16 bytes per row).
pub fn layer_norm_backward(
    x: &Tensor,
    gamma: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    fn run<T: WithDType>(
        x: &Tensor,
        gamma: &Tensor,
        g: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let c = *x.dims().last().unwrap_or(&1);
        let gm = per_entry::<T>(gamma, c, "layer norm gamma")?;
        with_slice::<T, _>(x, |xs| {
            with_slice::<T, _>(g, |gs| {
                // Mean and 1/sigma of every row, once for dx and for the parameter gradients.
                let stats: Vec<(f64, f64)> =
                    xs.par_chunks(c.max(1)).map(|x| row_stats(x, eps)).collect();
                let mut dx = vec![T::from_f64(0.0); xs.len()];
                dx.par_chunks_mut(c.max(1))
                    .zip(xs.par_chunks(c.max(1)).zip(gs.par_chunks(c.max(1))))
                    .zip(&stats)
                    .for_each(|((d, (x, g)), &(mean, inv))| {
                        let len = c.max(1) as f64;
                        let (mut mgh, mut mghx) = (0.0, 0.0);
                        for j in 0..c {
                            let gh = g[j].to_f64() * gm[j];
                            mgh += gh;
                            mghx += gh * (x[j].to_f64() - mean) * inv;
                        }
                        let (mgh, mghx) = (mgh / len, mghx / len);
                        for j in 0..c {
                            let xhat = (x[j].to_f64() - mean) * inv;
                            let gh = g[j].to_f64() * gm[j];
                            d[j] = T::from_f64(inv * (gh - mgh - xhat * mghx));
                        }
                    });
                let (mut dgamma, mut dbeta) = (vec![0f64; c], vec![0f64; c]);
                for ((x, g), &(mean, inv)) in
                    xs.chunks(c.max(1)).zip(gs.chunks(c.max(1))).zip(&stats)
                {
                    for j in 0..c {
                        let gv = g[j].to_f64();
                        dbeta[j] += gv;
                        dgamma[j] += gv * (x[j].to_f64() - mean) * inv;
                    }
                }
                let dev = x.device();
                let cast = |v: Vec<f64>| v.into_iter().map(T::from_f64).collect::<Vec<T>>();
                Ok((
                    Tensor::from_vec(dx, x.dims(), dev)?,
                    Tensor::from_vec(cast(dgamma), c, dev)?,
                    Tensor::from_vec(cast(dbeta), c, dev)?,
                ))
            })
        })
    }
    if x.dims() != g.dims() {
        candle_core::bail!("layer_norm_backward: {:?} vs {:?}", x.dims(), g.dims())
    }
    typed!(x, run(x, gamma, g, eps))
}
