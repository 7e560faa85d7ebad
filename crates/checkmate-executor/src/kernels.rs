//! Forward kernels and hand-written backward rules on candle tensors.
//!
//! Every function works for any float dtype (`f32` for training, `f64` for the finite-difference
//! tests) and never records an autograd graph. Layouts follow `checkmate_models::op`: NCHW
//! activations, `[out, in, kh, kw]` convolution kernels, `[out, in]` dense kernels.

use candle_core::{DType, Device, Result, Tensor};
use checkmate_models::{Activation, Conv2d, Pool2d};

/// Softmax over `axis`.
pub fn softmax(x: &Tensor, axis: usize) -> Result<Tensor> {
    let m = x.max_keepdim(axis)?;
    let e = x.broadcast_sub(&m)?.exp()?;
    let s = e.sum_keepdim(axis)?;
    e.broadcast_div(&s)
}

/// Applies an activation; `axis` is the softmax axis.
pub fn activation_forward(x: &Tensor, act: Activation, axis: usize) -> Result<Tensor> {
    match act {
        Activation::Linear => Ok(x.clone()),
        Activation::Relu => x.relu(),
        Activation::Relu6 => x.clamp(0f64, 6f64),
        Activation::Softmax => softmax(x, axis),
        Activation::Gelu => x.gelu(),
    }
}

/// Gradient of an activation's input from its output `y` (or input `x` for GELU) and the gradient
/// `g` of its output.
pub fn activation_backward(
    x: Option<&Tensor>,
    y: &Tensor,
    g: &Tensor,
    act: Activation,
    axis: usize,
) -> Result<Tensor> {
    match act {
        Activation::Linear => Ok(g.clone()),
        Activation::Relu => g.mul(&y.gt(0f64)?.to_dtype(g.dtype())?),
        Activation::Relu6 => {
            let inside = y.gt(0f64)?.mul(&y.lt(6f64)?)?;
            g.mul(&inside.to_dtype(g.dtype())?)
        }
        Activation::Softmax => {
            // dx = y * (g - sum(g * y))
            let s = g.mul(y)?.sum_keepdim(axis)?;
            y.mul(&g.broadcast_sub(&s)?)
        }
        Activation::Gelu => {
            let Some(x) = x else {
                candle_core::bail!("the GELU gradient needs the layer input")
            };
            // tanh approximation: 0.5 x (1 + tanh(k (x + 0.044715 x^3)))
            let k = (2.0f64 / std::f64::consts::PI).sqrt();
            let x2 = x.sqr()?;
            let inner = ((x.mul(&x2)? * 0.044715)? + x)?.affine(k, 0.0)?;
            let t = inner.tanh()?;
            let dinner = ((x2 * (3.0 * 0.044715))? + 1.0)?.affine(k, 0.0)?;
            let sech2 = (t.sqr()?.neg()? + 1.0)?;
            let d = (((t + 1.0)? * 0.5)? + (x.mul(&sech2)?.mul(&dinner)? * 0.5)?)?;
            g.mul(&d)
        }
    }
}

/// Dense layer on the last axis before its activation: `x W^T + b`.
pub fn dense_forward(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let inp = *dims.last().unwrap_or(&0);
    let rows = x.elem_count() / inp.max(1);
    let z = x.reshape((rows, inp))?.matmul(&w.t()?)?;
    let z = match b {
        Some(b) => z.broadcast_add(b)?,
        None => z,
    };
    let mut out = dims;
    if let Some(l) = out.last_mut() {
        *l = w.dim(0)?;
    }
    z.reshape(out)
}

/// Gradients of a dense layer from the gradient `g` of its pre-activation output: `(dx, dW, db)`,
/// `dx` only when `need_dx`.
pub fn dense_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    let (out, inp) = w.dims2()?;
    let rows = x.elem_count() / inp.max(1);
    let x2 = x.reshape((rows, inp))?;
    let g2 = g.reshape((rows, out))?;
    let dw = g2.t()?.matmul(&x2)?;
    let db = g2.sum(0)?;
    let dx = if need_dx {
        Some(g2.matmul(w)?.reshape(x.dims())?)
    } else {
        None
    };
    Ok((dx, dw, db))
}

/// Pads the two spatial axes of an NCHW tensor with zeros: `[top, bottom, left, right]`.
pub fn pad2d(x: &Tensor, p: [usize; 4]) -> Result<Tensor> {
    let x = if p[0] + p[1] > 0 {
        x.pad_with_zeros(2, p[0], p[1])?
    } else {
        x.clone()
    };
    if p[2] + p[3] > 0 {
        x.pad_with_zeros(3, p[2], p[3])
    } else {
        Ok(x)
    }
}

/// Removes `[top, bottom, left, right]` rows and columns of an NCHW tensor (a copy).
pub fn crop2d(x: &Tensor, p: [usize; 4]) -> Result<Tensor> {
    let (_, _, h, w) = x.dims4()?;
    x.narrow(2, p[0], h - p[0] - p[1])?
        .narrow(3, p[2], w - p[2] - p[3])?
        .force_contiguous()
}

fn check_conv(c: &Conv2d) -> Result<()> {
    if c.groups != 1 || c.dilation != [1, 1] || c.stride[0] != c.stride[1] {
        candle_core::bail!(
            "conv2d: groups {} / dilation {:?} / stride {:?} not supported yet (needs groups 1, dilation 1, square stride)",
            c.groups,
            c.dilation,
            c.stride
        )
    }
    Ok(())
}

/// Convolution before its activation (groups 1, dilation 1, square stride; any padding).
pub fn conv2d_forward(x: &Tensor, w: &Tensor, b: Option<&Tensor>, c: &Conv2d) -> Result<Tensor> {
    check_conv(c)?;
    let (_, _, h, wd) = x.dims4()?;
    let p = c.padding_for([h, wd]);
    let z = if p.iter().all(|&v| v == p[0]) {
        x.conv2d(w, p[0], c.stride[0], 1, 1)?
    } else {
        pad2d(x, p)?.conv2d(w, 0, c.stride[0], 1, 1)?
    };
    match b {
        Some(b) => z.broadcast_add(&b.reshape((1, b.elem_count(), 1, 1))?),
        None => Ok(z),
    }
}

/// Gradients of a convolution from the gradient `g` of its pre-activation output:
/// `(dx, dW, db)`, `dx` only when `need_dx`, `db` only when `bias`.
///
/// The input gradient of a stride-1 convolution is a convolution of the padded `g` with the
/// flipped, transposed kernel; larger strides use candle's transposed convolution. The kernel
/// gradient is a convolution over the batch axis (input channels as the batch, `g` as the kernel,
/// dilated by the stride).
pub fn conv2d_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    c: &Conv2d,
    need_dx: bool,
    bias: bool,
) -> Result<(Option<Tensor>, Tensor, Option<Tensor>)> {
    check_conv(c)?;
    let (_, _, h, wd) = x.dims4()?;
    let (_, _, kh, kw) = w.dims4()?;
    let (_, _, oh, ow) = g.dims4()?;
    let s = c.stride[0];
    let p = c.padding_for([h, wd]);
    let xp = pad2d(x, p)?;
    let (hp, wp) = (h + p[0] + p[1], wd + p[2] + p[3]);
    // dW[o,i,a,b] = sum_{n,y,x} g[n,o,y,x] xp[n,i,s*y+a,s*x+b]
    let xt = xp.transpose(0, 1)?.contiguous()?;
    let gt = g.transpose(0, 1)?.contiguous()?;
    let r = xt.conv2d(&gt, 0, 1, s, 1)?; // [in, out, hp - s(oh-1), wp - s(ow-1)]
    let dw = r
        .narrow(2, 0, kh)?
        .narrow(3, 0, kw)?
        .transpose(0, 1)?
        .force_contiguous()?;
    let db = if bias { Some(g.sum((0, 2, 3))?) } else { None };
    let dx = if need_dx {
        let dxp = if s == 1 {
            let wf = w.flip(&[2, 3])?.transpose(0, 1)?.contiguous()?;
            pad2d(g, [kh - 1, kh - 1, kw - 1, kw - 1])?.conv2d(&wf, 0, 1, 1, 1)?
        } else {
            let full = g.conv_transpose2d(&w.contiguous()?, 0, 0, s, 1)?;
            let (fh, fw) = ((oh - 1) * s + kh, (ow - 1) * s + kw);
            pad2d(&full, [0, hp - fh, 0, wp - fw])?
        };
        Some(crop2d(&dxp, p)?)
    } else {
        None
    };
    Ok((dx, dw, db))
}

fn to_f64_vec(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

fn from_f64_vec(v: Vec<f64>, dims: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::from_vec(v, dims, dev)?.to_dtype(dtype)
}

/// The window geometry of a pooling layer on input `[n, c, h, w]`.
struct Window {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    k: [usize; 2],
    s: [usize; 2],
    top: usize,
    left: usize,
}

impl Window {
    fn new(x: &Tensor, p: &Pool2d) -> Result<Window> {
        let (n, c, h, w) = x.dims4()?;
        let pad = p.padding_for([h, w]);
        let oh = (h + pad[0] + pad[1] - p.pool[0]) / p.stride[0] + 1;
        let ow = (w + pad[2] + pad[3] - p.pool[1]) / p.stride[1] + 1;
        Ok(Window {
            n,
            c,
            h,
            w,
            oh,
            ow,
            k: p.pool,
            s: p.stride,
            top: pad[0],
            left: pad[2],
        })
    }

    /// Calls `f(out_index, in_index)` for every valid (unpadded) cell of every window, in row-major
    /// window order.
    fn for_each(&self, mut f: impl FnMut(usize, usize)) {
        for plane in 0..self.n * self.c {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let o = (plane * self.oh + oy) * self.ow + ox;
                    for a in 0..self.k[0] {
                        let Some(iy) = (oy * self.s[0] + a).checked_sub(self.top) else {
                            continue;
                        };
                        if iy >= self.h {
                            continue;
                        }
                        for b in 0..self.k[1] {
                            let Some(ix) = (ox * self.s[1] + b).checked_sub(self.left) else {
                                continue;
                            };
                            if ix >= self.w {
                                continue;
                            }
                            f(o, (plane * self.h + iy) * self.w + ix);
                        }
                    }
                }
            }
        }
    }
}

/// Max pooling (padded cells never win).
pub fn max_pool2d_forward(x: &Tensor, p: &Pool2d) -> Result<Tensor> {
    let win = Window::new(x, p)?;
    let pad = p.padding_for([win.h, win.w]);
    if pad == [0; 4] {
        return x.max_pool2d_with_stride((p.pool[0], p.pool[1]), (p.stride[0], p.stride[1]));
    }
    let xv = to_f64_vec(x)?;
    let mut out = vec![f64::NEG_INFINITY; win.n * win.c * win.oh * win.ow];
    win.for_each(|o, i| {
        if xv[i] > out[o] {
            out[o] = xv[i];
        }
    });
    from_f64_vec(out, &[win.n, win.c, win.oh, win.ow], x.dtype(), x.device())
}

/// Input gradient of max pooling: each window's gradient goes to the first cell holding its
/// maximum (read from the input `x`).
pub fn max_pool2d_backward(x: &Tensor, g: &Tensor, p: &Pool2d) -> Result<Tensor> {
    let win = Window::new(x, p)?;
    let xv = to_f64_vec(x)?;
    let gv = to_f64_vec(g)?;
    let outs = win.n * win.c * win.oh * win.ow;
    let mut best = vec![f64::NEG_INFINITY; outs];
    let mut arg = vec![usize::MAX; outs];
    win.for_each(|o, i| {
        if xv[i] > best[o] {
            best[o] = xv[i];
            arg[o] = i;
        }
    });
    let mut dx = vec![0f64; xv.len()];
    for (o, &i) in arg.iter().enumerate() {
        if i != usize::MAX {
            dx[i] += gv[o];
        }
    }
    from_f64_vec(dx, x.dims(), x.dtype(), x.device())
}

/// Average pooling (padded cells not counted).
pub fn avg_pool2d_forward(x: &Tensor, p: &Pool2d) -> Result<Tensor> {
    let win = Window::new(x, p)?;
    let xv = to_f64_vec(x)?;
    let outs = win.n * win.c * win.oh * win.ow;
    let mut sum = vec![0f64; outs];
    let mut count = vec![0f64; outs];
    win.for_each(|o, i| {
        sum[o] += xv[i];
        count[o] += 1.0;
    });
    let out = sum.iter().zip(&count).map(|(s, c)| s / c).collect();
    from_f64_vec(out, &[win.n, win.c, win.oh, win.ow], x.dtype(), x.device())
}

/// Input gradient of average pooling.
pub fn avg_pool2d_backward(x: &Tensor, g: &Tensor, p: &Pool2d) -> Result<Tensor> {
    let win = Window::new(x, p)?;
    let gv = to_f64_vec(g)?;
    let outs = win.n * win.c * win.oh * win.ow;
    let mut count = vec![0f64; outs];
    win.for_each(|o, _| count[o] += 1.0);
    let mut dx = vec![0f64; x.elem_count()];
    win.for_each(|o, i| dx[i] += gv[o] / count[o]);
    from_f64_vec(dx, x.dims(), x.dtype(), x.device())
}

/// Per-example cross-entropy of a `[N, C]` prediction against `u32` labels `[N]`: from logits
/// (`logsumexp(z) - z[label]`) or from probabilities (`-ln p[label]`, clamped at 1e-7).
pub fn cross_entropy(pred: &Tensor, labels: &Tensor, from_logits: bool) -> Result<Tensor> {
    let idx = labels.unsqueeze(1)?;
    if from_logits {
        let m = pred.max_keepdim(1)?;
        let lse = pred
            .broadcast_sub(&m)?
            .exp()?
            .sum_keepdim(1)?
            .log()?
            .add(&m)?;
        lse.sub(&pred.gather(&idx, 1)?)?.squeeze(1)
    } else {
        pred.gather(&idx, 1)?
            .clamp(1e-7f64, 1f64)?
            .log()?
            .neg()?
            .squeeze(1)
    }
}

/// One-hot `[N, C]` of `u32` labels, in `dtype`.
pub fn one_hot(labels: &Tensor, classes: usize, dtype: DType) -> Result<Tensor> {
    let l = labels.to_vec1::<u32>()?;
    let mut v = vec![0f64; l.len() * classes];
    for (n, &c) in l.iter().enumerate() {
        let c = c as usize;
        if c >= classes {
            candle_core::bail!("label {c} out of range for {classes} classes")
        }
        v[n * classes + c] = 1.0;
    }
    from_f64_vec(v, &[l.len(), classes], dtype, labels.device())
}

/// Gradient of the mean (over the batch) cross-entropy with respect to the softmax's input:
/// `(softmax(z) - onehot) / N`. `pred` is the logits when `from_logits`, else the probabilities.
pub fn cross_entropy_backward(pred: &Tensor, labels: &Tensor, from_logits: bool) -> Result<Tensor> {
    let (n, c) = pred.dims2()?;
    let p = if from_logits {
        softmax(pred, 1)?
    } else {
        pred.clone()
    };
    (p - one_hot(labels, c, pred.dtype())?)? / n as f64
}

/// Sums tensors in the given order (the order fixes the floating-point result).
pub fn sum_in_order(ts: &[Tensor]) -> Result<Tensor> {
    let Some(first) = ts.first() else {
        candle_core::bail!("sum of no tensors")
    };
    let mut acc = first.clone();
    for t in &ts[1..] {
        acc = acc.add(t)?;
    }
    Ok(acc)
}

/// Mean over the spatial axes: `[N, C, H, W] -> [N, C]`.
pub fn global_avg_pool_forward(x: &Tensor) -> Result<Tensor> {
    x.mean((2, 3))
}

/// Input gradient of global average pooling.
pub fn global_avg_pool_backward(x: &Tensor, g: &Tensor) -> Result<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    (g.reshape((n, c, 1, 1))?.broadcast_as((n, c, h, w))? / (h * w) as f64)?.force_contiguous()
}

/// Softmax axis of an op's activation: the last axis for dense layers, 1 otherwise.
pub(crate) fn softmax_axis_for(dense: bool, rank: usize) -> usize {
    if dense {
        rank - 1
    } else {
        1
    }
}
