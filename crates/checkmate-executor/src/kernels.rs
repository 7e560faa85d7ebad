//! Forward kernels and hand-written backward rules on candle tensors.
//!
//! Every function works for any float dtype (`f32` for training, `f64` for the finite-difference
//! tests) and never records an autograd graph. Layouts follow `checkmate_models::op`: NCHW
//! activations, `[out, in, kh, kw]` convolution kernels, `[out, in]` dense kernels.

use candle_core::{DType, Device, Result, Tensor, WithDType};

use crate::{conv_cpu, direct_cpu};
use checkmate_models::{Activation, Conv2d, ConvTranspose2d, Pool2d};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Softmax over `axis`.
pub fn softmax(x: &Tensor, axis: usize) -> Result<Tensor> {
    if direct_cpu::applies(x) {
        return direct_cpu::softmax(x, axis);
    }
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
        Activation::Relu6 if direct_cpu::applies(x) => direct_cpu::unary(x, |v| v.clamp(0.0, 6.0)),
        Activation::Relu6 => x.clamp(0f64, 6f64),
        Activation::Softmax => softmax(x, axis),
        Activation::Gelu => x.gelu(),
    }
}

/// ReLU or ReLU6 applied in place to `y` (operator level, docs/OP_GRAPHS.md "In-place ReLU"):
/// the same values as [`activation_forward`], no allocation. `y` must own its storage (a fresh
/// kernel output, not a view of another tensor). Off the CPU, or for other dtypes, an error.
pub fn activation_in_place(y: &Tensor, act: Activation) -> Result<()> {
    struct InPlace(Activation);
    impl candle_core::InplaceOp1 for InPlace {
        fn name(&self) -> &'static str {
            "relu-in-place"
        }

        fn cpu_fwd(
            &self,
            storage: &mut candle_core::CpuStorage,
            layout: &candle_core::Layout,
        ) -> Result<()> {
            use candle_core::CpuStorage;
            let Some((a, b)) = layout.contiguous_offsets() else {
                candle_core::bail!("relu in place: the tensor is not contiguous")
            };
            // As candle's ReLU (`max(v, 0)`) and `activation_forward`'s ReLU6 (a clamp in f64).
            match (storage, self.0) {
                (CpuStorage::F32(v), Activation::Relu) => {
                    v[a..b].iter_mut().for_each(|x| *x = x.max(0f32))
                }
                (CpuStorage::F64(v), Activation::Relu) => {
                    v[a..b].iter_mut().for_each(|x| *x = x.max(0f64))
                }
                (CpuStorage::F32(v), Activation::Relu6) => v[a..b]
                    .iter_mut()
                    .for_each(|x| *x = (*x as f64).clamp(0.0, 6.0) as f32),
                (CpuStorage::F64(v), Activation::Relu6) => {
                    v[a..b].iter_mut().for_each(|x| *x = x.clamp(0.0, 6.0))
                }
                (_, act) => candle_core::bail!(
                    "{} in place: needs f32 or f64 (and ReLU or ReLU6)",
                    act.name()
                ),
            }
            Ok(())
        }
    }
    if !matches!(y.device(), Device::Cpu) {
        candle_core::bail!("relu in place: CPU only")
    }
    y.inplace_op1(&InPlace(act))
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
        Activation::Relu if direct_cpu::applies(g) && g.dims() == y.dims() => {
            direct_cpu::unary_backward(y, g, |y, g| if y > 0.0 { g } else { 0.0 })
        }
        Activation::Relu => g.mul(&y.gt(0f64)?.to_dtype(g.dtype())?),
        Activation::Relu6 if direct_cpu::applies(g) => {
            direct_cpu::unary_backward(y, g, |y, g| if y > 0.0 && y < 6.0 { g } else { 0.0 })
        }
        Activation::Softmax if direct_cpu::applies(g) => direct_cpu::softmax_backward(y, g, axis),
        Activation::Gelu if direct_cpu::applies(g) => {
            let Some(x) = x else {
                candle_core::bail!("the GELU gradient needs the layer input")
            };
            direct_cpu::unary_backward(x, g, |x, g| g * gelu_derivative(x))
        }
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

/// Derivative of the tanh approximation of GELU, `0.5 x (1 + tanh(k (x + 0.044715 x^3)))`.
fn gelu_derivative(x: f64) -> f64 {
    let k = (2.0f64 / std::f64::consts::PI).sqrt();
    let t = (k * (x + 0.044715 * x * x * x)).tanh();
    let dinner = k * (1.0 + 3.0 * 0.044715 * x * x);
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner
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
/// `dx` only when `need_dx`, `dW` only when `need_dw`.
pub fn dense_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    need_dx: bool,
    need_dw: bool,
) -> Result<(Option<Tensor>, Option<Tensor>, Tensor)> {
    let (out, inp) = w.dims2()?;
    let rows = x.elem_count() / inp.max(1);
    let x2 = x.reshape((rows, inp))?;
    let g2 = g.reshape((rows, out))?;
    let dw = if need_dw {
        Some(g2.t()?.matmul(&x2)?)
    } else {
        None
    };
    let db = g2.sum(0)?;
    let dx = if need_dx {
        Some(g2.matmul(w)?.reshape(x.dims())?)
    } else {
        None
    };
    Ok((dx, dw, db))
}

/// The input gradient alone of a dense layer, `g W` shaped as the input (`x_dims`), from the
/// gradient `g` of its pre-activation output: the input itself is not read.
pub fn dense_backward_data(w: &Tensor, g: &Tensor, x_dims: &[usize]) -> Result<Tensor> {
    let (out, _) = w.dims2()?;
    let rows = g.elem_count() / out.max(1);
    g.reshape((rows, out))?.matmul(w)?.reshape(x_dims)
}

/// Pads the two spatial axes of an NCHW tensor with zeros: `[top, bottom, left, right]`.
pub fn pad2d(x: &Tensor, p: [usize; 4]) -> Result<Tensor> {
    if direct_cpu::applies(x) && p.iter().any(|&v| v > 0) {
        return direct_cpu::pad2d(x, p);
    }
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

/// Whether candle's convolution (im2col + gemm) applies: one group, no dilation, square stride.
/// Other convolutions (grouped, depthwise, dilated) run as direct loops.
fn candle_conv(c: &Conv2d) -> bool {
    c.groups == 1 && c.dilation == [1, 1] && c.stride[0] == c.stride[1]
}

/// The geometry of a direct convolution loop.
struct ConvGeom {
    n: usize,
    cin: usize,
    h: usize,
    w: usize,
    cout: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    stride: [usize; 2],
    dilation: [usize; 2],
    top: usize,
    left: usize,
    groups: usize,
}

impl ConvGeom {
    /// The same geometry for [`conv_cpu`].
    fn chunked(&self) -> conv_cpu::Geom {
        self.chunked_within(conv_cpu::CHUNK_BYTES)
    }

    /// [`ConvGeom::chunked`] with chunks of at most `chunk_bytes` of unfolded windows.
    fn chunked_within(&self, chunk_bytes: usize) -> conv_cpu::Geom {
        conv_cpu::Geom {
            n: self.n,
            cin: self.cin,
            h: self.h,
            w: self.w,
            cout: self.cout,
            kh: self.kh,
            kw: self.kw,
            oh: self.oh,
            ow: self.ow,
            stride: self.stride,
            dilation: self.dilation,
            top: self.top,
            left: self.left,
            groups: self.groups,
            chunk_bytes,
        }
    }

    /// [`ConvGeom::new`], checked against the gradient `g` of the convolution's output.
    fn for_grad(x: &Tensor, w: &Tensor, c: &Conv2d, g: &Tensor) -> Result<ConvGeom> {
        let geo = ConvGeom::new(x, w, c)?;
        if g.dims() != [geo.n, geo.cout, geo.oh, geo.ow] {
            candle_core::bail!("conv2d backward: gradient {:?} does not fit", g.dims())
        }
        Ok(geo)
    }

    fn new(x: &Tensor, w: &Tensor, c: &Conv2d) -> Result<ConvGeom> {
        ConvGeom::of_dims(x.dims(), w, c)
    }

    /// The geometry for an NCHW input of `dims`.
    fn of_dims(dims: &[usize], w: &Tensor, c: &Conv2d) -> Result<ConvGeom> {
        let &[n, cin, h, wd] = dims else {
            candle_core::bail!("conv2d needs an NCHW input, got {dims:?}")
        };
        let (cout, cpg, kh, kw) = w.dims4()?;
        if c.groups == 0 || cin % c.groups != 0 || cout % c.groups != 0 || cpg * c.groups != cin {
            candle_core::bail!(
                "conv2d: kernel {:?} and {} groups do not fit input {:?}",
                w.dims(),
                c.groups,
                dims
            )
        }
        let p = c.padding_for([h, wd]);
        let eff = [c.dilation[0] * (kh - 1) + 1, c.dilation[1] * (kw - 1) + 1];
        let (ph, pw) = (h + p[0] + p[1], wd + p[2] + p[3]);
        if ph < eff[0] || pw < eff[1] || c.stride.contains(&0) {
            candle_core::bail!("conv2d: window {eff:?} larger than padded input {ph}x{pw}")
        }
        Ok(ConvGeom {
            n,
            cin,
            h,
            w: wd,
            cout,
            kh,
            kw,
            oh: (ph - eff[0]) / c.stride[0] + 1,
            ow: (pw - eff[1]) / c.stride[1] + 1,
            stride: c.stride,
            dilation: c.dilation,
            top: p[0],
            left: p[2],
            groups: c.groups,
        })
    }

    /// Calls `f(out_index, input_index, kernel_index)` for every multiply-add of the convolution,
    /// in a fixed order.
    fn for_each(&self, mut f: impl FnMut(usize, usize, usize)) {
        let cpg = self.cin / self.groups;
        let opg = self.cout / self.groups;
        for n in 0..self.n {
            for o in 0..self.cout {
                let g = o / opg;
                for oy in 0..self.oh {
                    for ox in 0..self.ow {
                        let oi = ((n * self.cout + o) * self.oh + oy) * self.ow + ox;
                        for ci in 0..cpg {
                            let c = g * cpg + ci;
                            for a in 0..self.kh {
                                let Some(iy) = (oy * self.stride[0] + a * self.dilation[0])
                                    .checked_sub(self.top)
                                else {
                                    continue;
                                };
                                if iy >= self.h {
                                    continue;
                                }
                                for b in 0..self.kw {
                                    let Some(ix) = (ox * self.stride[1] + b * self.dilation[1])
                                        .checked_sub(self.left)
                                    else {
                                        continue;
                                    };
                                    if ix >= self.w {
                                        continue;
                                    }
                                    let xi = ((n * self.cin + c) * self.h + iy) * self.w + ix;
                                    let wi = ((o * cpg + ci) * self.kh + a) * self.kw + b;
                                    f(oi, xi, wi);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn add_channel_bias(z: Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    match b {
        Some(b) => z.broadcast_add(&b.reshape((1, b.elem_count(), 1, 1))?),
        None => Ok(z),
    }
}

/// Convolution before its activation: any padding; grouped, depthwise, dilated and non-square
/// strides run as a direct loop, the rest through candle's im2col convolution.
pub fn conv2d_forward(x: &Tensor, w: &Tensor, b: Option<&Tensor>, c: &Conv2d) -> Result<Tensor> {
    let (_, _, h, wd) = x.dims4()?;
    let p = c.padding_for([h, wd]);
    let z = if conv_cpu::applies(x) {
        return conv_cpu::forward(x, w, b, &ConvGeom::new(x, w, c)?.chunked(), false);
    } else if !candle_conv(c) {
        let geo = ConvGeom::new(x, w, c)?;
        let xv = to_f64_vec(x)?;
        let wv = to_f64_vec(w)?;
        let mut out = vec![0f64; geo.n * geo.cout * geo.oh * geo.ow];
        geo.for_each(|o, i, k| out[o] += xv[i] * wv[k]);
        from_f64_vec(
            out,
            &[geo.n, geo.cout, geo.oh, geo.ow],
            x.dtype(),
            x.device(),
        )?
    } else {
        conv2d_same_stride(x, w, p, c.stride[0])?
    };
    add_channel_bias(z, b)
}

/// A convolution with its activation: on the CPU, ReLU (and no activation) are applied in place
/// by the chunked kernel, so the output is the only activation-sized allocation.
pub fn conv2d_forward_act(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    c: &Conv2d,
    act: Activation,
) -> Result<Tensor> {
    conv2d_forward_act_chunked(x, w, b, c, act, conv_cpu::CHUNK_BYTES)
}

/// [`conv2d_forward_act`] whose CPU kernel unfolds at most `chunk_bytes` of windows per matrix
/// product (`usize::MAX`: a whole sample; the same bits at any bound).
pub fn conv2d_forward_act_chunked(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    c: &Conv2d,
    act: Activation,
    chunk_bytes: usize,
) -> Result<Tensor> {
    if conv_cpu::applies(x) && matches!(act, Activation::Relu | Activation::Linear) {
        let geo = ConvGeom::new(x, w, c)?.chunked_within(chunk_bytes);
        return conv_cpu::forward(x, w, b, &geo, act == Activation::Relu);
    }
    activation_forward(&conv2d_forward(x, w, b, c)?, act, 1)
}

/// Operator level, a convolution with a ReLU fused with the max pooling `p` after it
/// (docs/OP_GRAPHS.md): the ReLU's packed mask and the pooling's winners, without the
/// convolution's output (CPU only).
pub fn conv2d_pool_winners(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    c: &Conv2d,
    p: &Pool2d,
    chunk_bytes: usize,
) -> Result<(Tensor, Tensor)> {
    check_fusable(x, c, p)?;
    let geo = ConvGeom::new(x, w, c)?.chunked_within(chunk_bytes);
    conv_cpu::pool_winners(x, w, b, &geo, p.pool)
}

/// Operator level: the pooled output of [`conv2d_pool_winners`]'s convolution and pooling,
/// the convolution computed at the winners only.
pub fn conv2d_pool_at_winners(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    c: &Conv2d,
    p: &Pool2d,
    winners: &Tensor,
) -> Result<Tensor> {
    check_fusable(x, c, p)?;
    let geo = ConvGeom::new(x, w, c)?.chunked();
    conv_cpu::at_winners(x, w, b, &geo, p.pool, winners)
}

fn check_fusable(x: &Tensor, c: &Conv2d, p: &Pool2d) -> Result<()> {
    if !conv_cpu::applies(x) || c.activation != Activation::Relu || p.pool != p.stride {
        candle_core::bail!(
            "fused convolution and pooling: needs f32/f64 on the CPU, a ReLU and non-overlapping \
             windows (got {:?} on {:?}, {}, pool {:?} stride {:?})",
            x.dtype(),
            x.device(),
            c.activation.name(),
            p.pool,
            p.stride
        )
    }
    Ok(())
}

/// [`conv2d_forward_act`] for a transposed convolution.
pub fn conv_transpose2d_forward_act(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    c: &ConvTranspose2d,
    act: Activation,
) -> Result<Tensor> {
    if conv_cpu::applies(x) && matches!(act, Activation::Relu | Activation::Linear) {
        let geo = transposed_geom(x, w, c, check_transpose(c)?)?;
        return conv_cpu::data_grad(x, w, b, &geo, act == Activation::Relu);
    }
    activation_forward(&conv_transpose2d_forward(x, w, b, c)?, act, 1)
}

/// Output positions up to which [`conv2d_gemm`] beats candle's convolution (measured: candle's
/// is several times slower on small feature maps with many channels, faster on large maps).
const GEMM_MAX_POSITIONS: usize = 64;

/// A one-group, undilated convolution with padding `p` and stride `s`, through
/// [`conv2d_gemm`] on small outputs and candle's convolution otherwise (the choice depends on
/// shapes only, so every plan computes the same bits).
fn conv2d_same_stride(x: &Tensor, w: &Tensor, p: [usize; 4], s: usize) -> Result<Tensor> {
    let (_, _, h, wd) = x.dims4()?;
    let (_, _, kh, kw) = w.dims4()?;
    let (hp, wp) = (h + p[0] + p[1], wd + p[2] + p[3]);
    if hp < kh || wp < kw || s == 0 {
        candle_core::bail!("conv2d: kernel {kh}x{kw} larger than the padded input {hp}x{wp}")
    }
    let positions = ((hp - kh) / s + 1) * ((wp - kw) / s + 1);
    if positions <= GEMM_MAX_POSITIONS {
        conv2d_gemm(&pad2d(x, p)?, w, s)
    } else if p.iter().all(|&v| v == p[0]) {
        x.conv2d(w, p[0], s, 1, 1)
    } else {
        pad2d(x, p)?.conv2d(w, 0, s, 1, 1)
    }
}

/// Gradients of a convolution from the gradient `g` of its pre-activation output:
/// `(dx, dW, db)`, `dx` only when `need_dx`, `dW` only when `need_dw`, `db` only when `bias`.
///
/// The input gradient of a stride-1 convolution is a convolution of the padded `g` with the
/// flipped, transposed kernel; larger strides use candle's transposed convolution. The kernel
/// gradient is a convolution over the batch axis (input channels as the batch, `g` as the kernel,
/// dilated by the stride). Grouped, depthwise and dilated convolutions use one direct loop for
/// both gradients.
pub fn conv2d_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    c: &Conv2d,
    need_dx: bool,
    need_dw: bool,
    bias: bool,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let db = if bias { Some(g.sum((0, 2, 3))?) } else { None };
    if conv_cpu::applies(x) {
        let geo = ConvGeom::for_grad(x, w, c, g)?.chunked();
        let (dx, dw) = conv_cpu::backward(x, w, g, &geo, need_dx, need_dw)?;
        return Ok((dx, dw, db));
    }
    if !candle_conv(c) {
        let geo = ConvGeom::for_grad(x, w, c, g)?;
        let xv = to_f64_vec(x)?;
        let wv = to_f64_vec(w)?;
        let gv = to_f64_vec(g)?;
        let mut dw = vec![0f64; wv.len()];
        let dx = if need_dx {
            let mut dx = vec![0f64; xv.len()];
            geo.for_each(|o, i, k| {
                dx[i] += gv[o] * wv[k];
                dw[k] += gv[o] * xv[i];
            });
            Some(from_f64_vec(dx, x.dims(), x.dtype(), x.device())?)
        } else {
            geo.for_each(|o, i, k| dw[k] += gv[o] * xv[i]);
            None
        };
        let dw = from_f64_vec(dw, w.dims(), w.dtype(), w.device())?;
        return Ok((dx, need_dw.then_some(dw), db));
    }
    let (n, cin, h, wd) = x.dims4()?;
    let (cout, _, kh, kw) = w.dims4()?;
    let (_, _, oh, ow) = g.dims4()?;
    let s = c.stride[0];
    let p = c.padding_for([h, wd]);
    let xp = pad2d(x, p)?;
    let (hp, wp) = (h + p[0] + p[1], wd + p[2] + p[3]);
    let g2 = g
        .permute((0, 2, 3, 1))?
        .contiguous()?
        .reshape((n * oh * ow, cout))?;
    // dW[o, (i,a,b)] = sum_{(n,y,x)} g[n,o,y,x] xp[n,i,s*y+a,s*x+b]: one matrix product with the
    // unfolded input windows (formed only when dW is wanted).
    let dw = if need_dw {
        let cols = unfold(&xp, kh, kw, s, oh, ow)?;
        Some(g2.t()?.matmul(&cols)?.reshape((cout, cin, kh, kw))?)
    } else {
        None
    };
    let dx = if !need_dx {
        None
    } else if s == 1 && kh * kw > 1 && h * wd > GEMM_MAX_POSITIONS {
        // A stride-1 input gradient is a convolution of the padded gradient with the flipped,
        // transposed kernel, padded so that it yields only the unpadded input's positions.
        let wf = w.flip(&[2, 3])?.transpose(0, 1)?.contiguous()?;
        let full = [kh - 1, kh - 1, kw - 1, kw - 1];
        let inner: Option<Vec<usize>> = full.iter().zip(p).map(|(f, p)| f.checked_sub(p)).collect();
        Some(match inner {
            Some(q) => conv2d_same_stride(g, &wf, [q[0], q[1], q[2], q[3]], 1)?,
            None => crop2d(&conv2d_same_stride(g, &wf, full, 1)?, p)?,
        })
    } else {
        // Strided, 1x1 and small maps: the gradient of every window, folded back onto the input.
        let dcols = g2.matmul(&w.reshape((cout, cin * kh * kw))?)?;
        let geo = Fold {
            n,
            c: cin,
            kh,
            kw,
            s,
            oh,
            ow,
            hp,
            wp,
        };
        Some(crop2d(&fold(&dcols, &geo)?, p)?)
    };
    Ok((dx, dw, db))
}

/// [`conv2d_backward`] of a convolution followed by ReLU, from the gradient `g` of the ReLU's
/// output `y`: `(dx, dW, db)`. On the CPU the mask is applied chunk by chunk inside the chunked
/// kernel (no gradient-sized temporary); elsewhere the masked gradient is formed first.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_backward_relu(
    x: &Tensor,
    w: &Tensor,
    y: &Tensor,
    g: &Tensor,
    c: &Conv2d,
    need_dx: bool,
    need_dw: bool,
    bias: bool,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    if conv_cpu::applies(x) && y.dims() == g.dims() && y.dtype() == x.dtype() {
        let geo = ConvGeom::for_grad(x, w, c, g)?.chunked();
        let relu = conv_cpu::ReluMask::Output(y);
        let (dx, dw, db) =
            conv_cpu::gradients(Some(x), w, Some(relu), None, g, &geo, need_dx, need_dw)?;
        return Ok((dx, dw, if bias { db } else { None }));
    }
    let g = activation_backward(Some(x), y, g, Activation::Relu, 1)?;
    conv2d_backward(x, w, &g, c, need_dx, need_dw, bias)
}

/// Operator-level gradients of a convolution (CPU, f32/f64 only): the input gradient when
/// `need_dx` (then `x` may be `None`: `x_dims` gives its shape), the kernel and bias gradients
/// when `need_dw` (`x` needed), from the gradient `g` of the output of its fused ReLU, masked by
/// `relu` (packed bits or the ReLU's output), or of its output when it has no activation. With
/// `pooled`, `g` is the gradient of the max pooling that reads the ReLU's output, expanded chunk
/// by chunk. The kernel unfolds at most `chunk_bytes` of windows per matrix product
/// ([`conv_cpu::CHUNK_BYTES`] by default; the input gradient's bits do not depend on it, the
/// kernel gradient's do).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn conv2d_backward_split(
    x: Option<&Tensor>,
    x_dims: &[usize],
    w: &Tensor,
    relu: Option<conv_cpu::ReluMask<'_>>,
    pooled: Option<conv_cpu::Pooled<'_>>,
    g: &Tensor,
    c: &Conv2d,
    need_dx: bool,
    need_dw: bool,
    chunk_bytes: usize,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    if !conv_cpu::applies(g) {
        candle_core::bail!("operator-level convolution gradients run on the CPU (f32, f64) only")
    }
    let geo = ConvGeom::of_dims(x_dims, w, c)?.chunked_within(chunk_bytes);
    let (dx, dw, db) = conv_cpu::gradients(x, w, relu, pooled, g, &geo, need_dx, need_dw)?;
    // Without a fused ReLU the kernel forms no bias gradient: the gradient's channel sums.
    let db = match db {
        Some(db) => Some(db).filter(|_| c.bias),
        None if c.bias && need_dw => Some(g.sum((0, 2, 3))?),
        None => None,
    };
    Ok((dx, dw, db))
}

/// Window `(a, b)` of every output position: `[N, C, oh, ow]` with element `(y, x)` taken from
/// `xp[.., a + s*y, b + s*x]`. `xp` must have room for `a + s*oh` rows and `b + s*ow` columns.
fn window(xp: &Tensor, a: usize, b: usize, s: usize, oh: usize, ow: usize) -> Result<Tensor> {
    window2(xp, a, b, [s, s], [oh, ow])
}

/// [`window`] with separate row and column strides.
fn window2(xp: &Tensor, a: usize, b: usize, s: [usize; 2], o: [usize; 2]) -> Result<Tensor> {
    if s == [1, 1] {
        return xp.narrow(2, a, o[0])?.narrow(3, b, o[1]);
    }
    let (n, c, _, _) = xp.dims4()?;
    xp.narrow(2, a, s[0] * o[0])?
        .narrow(3, b, s[1] * o[1])?
        .contiguous()?
        .reshape((n, c, o[0], s[0], o[1], s[1]))?
        .narrow(3, 0, 1)?
        .narrow(5, 0, 1)?
        .reshape((n, c, o[0], o[1]))
}

/// The adjoint of [`window2`]: `t` `[N, C, oh, ow]` placed at rows `a + s*y`, columns `b + s*x`
/// of a zero `[N, C, hq, wq]` tensor.
fn place(t: &Tensor, a: usize, b: usize, s: [usize; 2], hq: usize, wq: usize) -> Result<Tensor> {
    let (n, c, oh, ow) = t.dims4()?;
    let spread = if s == [1, 1] {
        t.clone()
    } else {
        t.reshape((n, c, oh, 1, ow, 1))?
            .pad_with_zeros(3, 0, s[0] - 1)?
            .pad_with_zeros(5, 0, s[1] - 1)?
            .reshape((n, c, oh * s[0], ow * s[1]))?
    };
    pad2d(&spread, [a, hq - a - oh * s[0], b, wq - b - ow * s[1]])
}

/// A one-group, undilated convolution of the padded input `xp` with stride `s`: the unfolded
/// windows times the flattened kernel (one matrix product).
pub fn conv2d_gemm(xp: &Tensor, w: &Tensor, s: usize) -> Result<Tensor> {
    let (n, _, hp, wp) = xp.dims4()?;
    let (o, i, kh, kw) = w.dims4()?;
    if hp < kh || wp < kw || s == 0 {
        candle_core::bail!("conv2d: kernel {kh}x{kw} larger than the padded input {hp}x{wp}")
    }
    let (oh, ow) = ((hp - kh) / s + 1, (wp - kw) / s + 1);
    let cols = unfold(xp, kh, kw, s, oh, ow)?;
    cols.matmul(&w.reshape((o, i * kh * kw))?.t()?)?
        .reshape((n, oh, ow, o))?
        .permute((0, 3, 1, 2))?
        .contiguous()
}

/// The input windows of a convolution as a matrix: rows `(n, y, x)`, columns `(i, a, b)`.
fn unfold(xp: &Tensor, kh: usize, kw: usize, s: usize, oh: usize, ow: usize) -> Result<Tensor> {
    let (n, c, hp, wp) = xp.dims4()?;
    if kh * kw == 1 && s == 1 {
        return xp
            .narrow(2, 0, oh)?
            .narrow(3, 0, ow)?
            .permute((0, 2, 3, 1))?
            .contiguous()?
            .reshape((n * oh * ow, c));
    }
    // Room for the strided windows' last (unused) rows and columns.
    let room = pad2d(
        xp,
        [
            0,
            (kh - 1 + s * oh).saturating_sub(hp),
            0,
            (kw - 1 + s * ow).saturating_sub(wp),
        ],
    )?;
    let mut slices = Vec::with_capacity(kh * kw);
    for a in 0..kh {
        for b in 0..kw {
            slices.push(window(&room, a, b, s, oh, ow)?);
        }
    }
    Tensor::stack(&slices, 2)?
        .permute((0, 3, 4, 1, 2))?
        .contiguous()?
        .reshape((n * oh * ow, c * kh * kw))
}

/// The geometry [`fold`] needs.
struct Fold {
    n: usize,
    c: usize,
    kh: usize,
    kw: usize,
    s: usize,
    oh: usize,
    ow: usize,
    hp: usize,
    wp: usize,
}

/// The adjoint of [`unfold`]: sums every window's column back onto a `[N, C, hp, wp]` input,
/// window offsets in a fixed order.
fn fold(cols: &Tensor, f: &Fold) -> Result<Tensor> {
    let k = f.kh * f.kw;
    let t = cols
        .reshape((f.n, f.oh, f.ow, f.c, k))?
        .permute((0, 3, 4, 1, 2))?
        .contiguous()?;
    let (hq, wq) = (
        f.hp.max(f.kh - 1 + f.s * f.oh),
        f.wp.max(f.kw - 1 + f.s * f.ow),
    );
    let mut acc: Option<Tensor> = None;
    for a in 0..f.kh {
        for b in 0..f.kw {
            let slice = t.narrow(2, a * f.kw + b, 1)?.squeeze(2)?;
            let placed = place(&slice, a, b, [f.s, f.s], hq, wq)?;
            acc = Some(add_into(acc, placed)?);
        }
    }
    let Some(acc) = acc else {
        candle_core::bail!("fold of an empty kernel")
    };
    if (hq, wq) == (f.hp, f.wp) {
        Ok(acc)
    } else {
        acc.narrow(2, 0, f.hp)?.narrow(3, 0, f.wp)?.contiguous()
    }
}

fn check_transpose(c: &ConvTranspose2d) -> Result<usize> {
    if c.stride[0] != c.stride[1] || c.stride[0] == 0 {
        candle_core::bail!(
            "conv_transpose2d: stride {:?} not supported (needs a square stride)",
            c.stride
        )
    }
    Ok(c.stride[0])
}

/// Transposed convolution before its activation: the full (valid) output of candle's transposed
/// convolution, cropped by `c.crop_for()`; kernel `[in, out, kh, kw]`.
pub fn conv_transpose2d_forward(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    c: &ConvTranspose2d,
) -> Result<Tensor> {
    let s = check_transpose(c)?;
    if conv_cpu::applies(x) {
        let geo = transposed_geom(x, w, c, s)?;
        return conv_cpu::data_grad(x, w, b, &geo, false);
    }
    let full = x.conv_transpose2d(&w.contiguous()?, 0, 0, s, 1)?;
    add_channel_bias(crop2d(&full, c.crop_for())?, b)
}

/// The convolution a transposed convolution transposes, for [`conv_cpu`]: its input is the
/// cropped output (the crop as padding), its output `x`, its kernel `w` (`[in, out, kh, kw]` is a
/// convolution kernel from `out` to `in` channels).
fn transposed_geom(
    x: &Tensor,
    w: &Tensor,
    c: &ConvTranspose2d,
    s: usize,
) -> Result<conv_cpu::Geom> {
    let (n, cin, h, wd) = x.dims4()?;
    let (win, cout, kh, kw) = w.dims4()?;
    if win != cin {
        candle_core::bail!(
            "conv_transpose2d: kernel {:?} does not fit input {:?}",
            w.dims(),
            x.dims()
        )
    }
    let crop = c.crop_for();
    let full = [(h - 1) * s + kh, (wd - 1) * s + kw];
    if crop[0] + crop[1] >= full[0] || crop[2] + crop[3] >= full[1] {
        candle_core::bail!("conv_transpose2d: crop {crop:?} removes the whole output {full:?}")
    }
    Ok(conv_cpu::Geom {
        n,
        cin: cout,
        h: full[0] - crop[0] - crop[1],
        w: full[1] - crop[2] - crop[3],
        cout: cin,
        kh,
        kw,
        oh: h,
        ow: wd,
        stride: [s, s],
        dilation: [1, 1],
        top: crop[0],
        left: crop[2],
        groups: 1,
        chunk_bytes: conv_cpu::CHUNK_BYTES,
    })
}

/// Gradients of a transposed convolution from the gradient `g` of its pre-activation output:
/// `(dx, dW, db)`, `dx` only when `need_dx`, `dW` only when `need_dw`. The input gradient is a
/// strided convolution of the (uncropped) gradient with the kernel; the kernel gradient a
/// convolution over the batch axis dilated by the stride.
pub fn conv_transpose2d_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    c: &ConvTranspose2d,
    need_dx: bool,
    need_dw: bool,
    bias: bool,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let s = check_transpose(c)?;
    let db = if bias { Some(g.sum((0, 2, 3))?) } else { None };
    if conv_cpu::applies(x) {
        // The transposed convolution's kernel gradient is the transposed-from convolution's,
        // with the roles of input (`g`) and output gradient (`x`) swapped; its input gradient
        // is that convolution's forward pass.
        let geo = transposed_geom(x, w, c, s)?;
        let (_, dw) = conv_cpu::backward(g, w, x, &geo, false, need_dw)?;
        let dx = if need_dx {
            Some(conv_cpu::forward(g, w, None, &geo, false)?)
        } else {
            None
        };
        return Ok((dx, dw, db));
    }
    let g_full = pad2d(g, c.crop_for())?;
    // dW[i,o,a,b] = sum_{n,y,x} x[n,i,y,x] g_full[n,o,s*y+a,s*x+b]
    let dw = if need_dw {
        let gt = g_full.transpose(0, 1)?.contiguous()?;
        let xt = x.transpose(0, 1)?.contiguous()?;
        Some(
            gt.conv2d(&xt, 0, 1, s, 1)?
                .transpose(0, 1)?
                .force_contiguous()?,
        )
    } else {
        None
    };
    let dx = if need_dx {
        Some(g_full.conv2d(&w.contiguous()?, 0, s, 1, 1)?)
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

/// The geometry of a pooling layer on input `[n, c, h, w]`.
struct PoolGeom {
    h: usize,
    w: usize,
    o: [usize; 2],
    k: [usize; 2],
    s: [usize; 2],
    pad: [usize; 4],
    /// Rows and columns of the padded input with room for every strided window.
    room: [usize; 2],
}

impl PoolGeom {
    fn new(x: &Tensor, p: &Pool2d) -> Result<PoolGeom> {
        PoolGeom::of_dims(x.dims(), p)
    }

    /// The geometry for an NCHW input of `dims`.
    fn of_dims(dims: &[usize], p: &Pool2d) -> Result<PoolGeom> {
        let &[_, _, h, w] = dims else {
            candle_core::bail!("pooling needs an NCHW input, got {dims:?}")
        };
        let pad = p.padding_for([h, w]);
        let (hp, wp) = (h + pad[0] + pad[1], w + pad[2] + pad[3]);
        if hp < p.pool[0] || wp < p.pool[1] || p.stride.contains(&0) || p.pool.contains(&0) {
            candle_core::bail!("pool {:?} larger than the padded input {hp}x{wp}", p.pool)
        }
        let o = [
            (hp - p.pool[0]) / p.stride[0] + 1,
            (wp - p.pool[1]) / p.stride[1] + 1,
        ];
        let room = [
            hp.max(p.pool[0] - 1 + p.stride[0] * o[0]),
            wp.max(p.pool[1] - 1 + p.stride[1] * o[1]),
        ];
        Ok(PoolGeom {
            h,
            w,
            o,
            k: p.pool,
            s: p.stride,
            pad,
            room,
        })
    }

    /// `x` padded with `fill` (0 or a huge negative value) to the room size.
    fn padded(&self, x: &Tensor, fill: f64) -> Result<Tensor> {
        let p = [
            self.pad[0],
            self.room[0] - self.h - self.pad[0],
            self.pad[2],
            self.room[1] - self.w - self.pad[2],
        ];
        let xp = pad2d(x, p)?;
        if fill == 0.0 {
            return Ok(xp);
        }
        // 0 inside, `fill` on the border.
        let border = pad2d(&x.ones_like()?, p)?.affine(-fill, fill)?;
        xp.add(&border)
    }

    /// The unpadded input from a room-sized tensor.
    fn unpad(&self, t: &Tensor) -> Result<Tensor> {
        t.narrow(2, self.pad[0], self.h)?
            .narrow(3, self.pad[2], self.w)?
            .contiguous()
    }

    fn offsets(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.k[0]).flat_map(move |a| (0..self.k[1]).map(move |b| (a, b)))
    }

    fn window(&self, xp: &Tensor, a: usize, b: usize) -> Result<Tensor> {
        window2(xp, a, b, self.s, self.o)
    }

    fn place(&self, t: &Tensor, a: usize, b: usize) -> Result<Tensor> {
        place(t, a, b, self.s, self.room[0], self.room[1])
    }

    /// Elementwise maximum over the windows (padded cells hold a huge negative value).
    fn max(&self, xp: &Tensor) -> Result<Tensor> {
        let mut acc: Option<Tensor> = None;
        for (a, b) in self.offsets() {
            let w = self.window(xp, a, b)?;
            acc = Some(match acc {
                None => w.contiguous()?,
                Some(m) => m.maximum(&w)?,
            });
        }
        acc.ok_or_else(|| candle_core::Error::Msg("empty pooling window".into()))
    }

    /// Window sums in offset order, and the number of unpadded cells per window.
    fn sum_and_count(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let xp = self.padded(x, 0.0)?;
        let ones = self.padded(&x.ones_like()?, 0.0)?;
        let mut sum: Option<(Tensor, Tensor)> = None;
        for (a, b) in self.offsets() {
            let (w, c) = (self.window(&xp, a, b)?, self.window(&ones, a, b)?);
            sum = Some(match sum {
                None => (w.contiguous()?, c.contiguous()?),
                Some((s, n)) => (s.add(&w)?, n.add(&c)?),
            });
        }
        sum.ok_or_else(|| candle_core::Error::Msg("empty pooling window".into()))
    }
}

/// The winner of window `(plane, oy, ox)` of an input of `[h, w]` planes: the input index and
/// the row-major window offset of the first cell holding the maximum; `None` when the window is
/// all padding.
fn pool_winner<T: WithDType>(
    xs: &[T],
    geo: &PoolGeom,
    [h, w]: [usize; 2],
    [plane, oy, ox]: [usize; 3],
) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize, T)> = None;
    for a in 0..geo.k[0] {
        let Some(iy) = (oy * geo.s[0] + a).checked_sub(geo.pad[0]) else {
            continue;
        };
        if iy >= h {
            continue;
        }
        for b in 0..geo.k[1] {
            let Some(ix) = (ox * geo.s[1] + b).checked_sub(geo.pad[2]) else {
                continue;
            };
            if ix >= w {
                continue;
            }
            let i = (plane * h + iy) * w + ix;
            if best.map_or(true, |(_, _, v)| xs[i] > v) {
                best = Some((i, a * geo.k[1] + b, xs[i]));
            }
        }
    }
    best.map(|(i, k, _)| (i, k))
}

/// Max pooling on the CPU by direct loops, allocating only the result: the pooled output, or
/// with `g` the input gradient (each window's gradient to the first cell, row-major, holding its
/// maximum; padded cells never win). Same rule as the tensor-op version.
fn max_pool_cpu(x: &Tensor, g: Option<&Tensor>, geo: &PoolGeom) -> Result<Tensor> {
    fn typed<T: WithDType>(x: &Tensor, g: Option<&Tensor>, geo: &PoolGeom) -> Result<Tensor> {
        let (n, c, h, w) = x.dims4()?;
        let [oh, ow] = geo.o;
        let planes = n * c;
        let winner = |xs: &[T], plane: usize, oy: usize, ox: usize| {
            pool_winner(xs, geo, [h, w], [plane, oy, ox]).map(|(i, _)| i)
        };
        conv_cpu::with_slice::<T, _>(x, |xs| match g {
            None => {
                let mut out = vec![T::from_f64(NEG_FILL); planes * oh * ow];
                for plane in 0..planes {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            if let Some(i) = winner(xs, plane, oy, ox) {
                                out[(plane * oh + oy) * ow + ox] = xs[i];
                            }
                        }
                    }
                }
                Tensor::from_vec(out, (n, c, oh, ow), x.device())
            }
            Some(g) => {
                if g.dims() != [n, c, oh, ow] {
                    candle_core::bail!("max pool backward: gradient {:?} does not fit", g.dims())
                }
                let mut dx = vec![T::from_f64(0.0); planes * h * w];
                conv_cpu::with_slice::<T, _>(g, |gs| {
                    for plane in 0..planes {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                if let Some(i) = winner(xs, plane, oy, ox) {
                                    dx[i] += gs[(plane * oh + oy) * ow + ox];
                                }
                            }
                        }
                    }
                    Ok(())
                })?;
                Tensor::from_vec(dx, (n, c, h, w), x.device())
            }
        })
    }
    match x.dtype() {
        DType::F32 => typed::<f32>(x, g, geo),
        DType::F64 => typed::<f64>(x, g, geo),
        other => candle_core::bail!("max pool: dtype {other:?} not supported"),
    }
}

/// Padding value that never wins a max.
const NEG_FILL: f64 = -(f32::MAX as f64);

/// Max pooling (padded cells never win): candle's kernel without padding, else the elementwise
/// maximum of the strided windows.
pub fn max_pool2d_forward(x: &Tensor, p: &Pool2d) -> Result<Tensor> {
    let geo = PoolGeom::new(x, p)?;
    if conv_cpu::applies(x) {
        return max_pool_cpu(x, None, &geo);
    }
    if geo.pad == [0; 4] {
        return x.max_pool2d_with_stride((p.pool[0], p.pool[1]), (p.stride[0], p.stride[1]));
    }
    geo.max(&geo.padded(x, NEG_FILL)?)
}

/// Input gradient of max pooling: each window's gradient goes to the first cell (row-major)
/// holding its maximum (read from the input `x`). Whole-tensor operations per window offset, in a
/// fixed order.
pub fn max_pool2d_backward(x: &Tensor, g: &Tensor, p: &Pool2d) -> Result<Tensor> {
    let geo = PoolGeom::new(x, p)?;
    if conv_cpu::applies(x) {
        return max_pool_cpu(x, Some(g), &geo);
    }
    let xp = geo.padded(x, NEG_FILL)?;
    let y = geo.max(&xp)?;
    let mut taken: Option<Tensor> = None;
    let mut acc: Option<Tensor> = None;
    for (a, b) in geo.offsets() {
        let hit = geo.window(&xp, a, b)?.eq(&y)?.to_dtype(x.dtype())?;
        let first = match &taken {
            None => hit,
            Some(t) => hit.mul(&t.affine(-1.0, 1.0)?)?,
        };
        let placed = geo.place(&first.mul(g)?, a, b)?;
        acc = Some(add_into(acc, placed)?);
        taken = Some(add_into(taken, first)?);
    }
    let Some(acc) = acc else {
        candle_core::bail!("empty pooling window")
    };
    geo.unpad(&acc)
}

/// The winning cell of every max-pooling window (operator-level graphs, docs/OP_GRAPHS.md): a
/// `u8` tensor of the output's shape holding the row-major offset of the first cell that holds
/// the window's maximum, 255 for a window of padding only. CPU, f32/f64 only.
pub fn max_pool2d_indices(x: &Tensor, p: &Pool2d) -> Result<Tensor> {
    fn typed<T: WithDType>(x: &Tensor, geo: &PoolGeom) -> Result<Tensor> {
        let (n, c, h, w) = x.dims4()?;
        let [oh, ow] = geo.o;
        conv_cpu::with_slice::<T, _>(x, |xs| {
            let mut out = vec![u8::MAX; n * c * oh * ow];
            for plane in 0..n * c {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let best = pool_winner(xs, geo, [h, w], [plane, oy, ox]);
                        if let Some((_, k)) = best {
                            out[(plane * oh + oy) * ow + ox] = k as u8;
                        }
                    }
                }
            }
            Tensor::from_vec(out, (n, c, oh, ow), x.device())
        })
    }
    let geo = PoolGeom::new(x, p)?;
    if geo.k[0] * geo.k[1] >= u8::MAX as usize {
        candle_core::bail!("max pool indices: window {:?} has 255 cells or more", geo.k)
    }
    match x.dtype() {
        DType::F32 if conv_cpu::applies(x) => typed::<f32>(x, &geo),
        DType::F64 if conv_cpu::applies(x) => typed::<f64>(x, &geo),
        other => candle_core::bail!(
            "max pool indices: {other:?} on {:?} not supported",
            x.device()
        ),
    }
}

/// Input gradient of max pooling from the winners of [`max_pool2d_indices`] (the input itself
/// is not read): the same sums, in the same order, as [`max_pool2d_backward`].
pub fn max_pool2d_backward_indices(
    indices: &Tensor,
    g: &Tensor,
    input_dims: &[usize],
    p: &Pool2d,
) -> Result<Tensor> {
    fn typed<T: WithDType>(
        idx: &[u8],
        g: &Tensor,
        dims: &[usize],
        geo: &PoolGeom,
    ) -> Result<Tensor> {
        let &[n, c, h, w] = dims else {
            candle_core::bail!("max pool backward needs an NCHW input, got {dims:?}")
        };
        let [oh, ow] = geo.o;
        let mut dx = vec![T::from_f64(0.0); n * c * h * w];
        conv_cpu::with_slice::<T, _>(g, |gs| {
            for plane in 0..n * c {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let o = (plane * oh + oy) * ow + ox;
                        let k = idx[o] as usize;
                        if k == u8::MAX as usize {
                            continue;
                        }
                        let (a, b) = (k / geo.k[1], k % geo.k[1]);
                        let iy = oy * geo.s[0] + a - geo.pad[0];
                        let ix = ox * geo.s[1] + b - geo.pad[2];
                        dx[(plane * h + iy) * w + ix] += gs[o];
                    }
                }
            }
            Ok(())
        })?;
        Tensor::from_vec(dx, dims, g.device())
    }
    let geo = PoolGeom::of_dims(input_dims, p)?;
    if indices.dtype() != DType::U8 || indices.dims() != g.dims() {
        candle_core::bail!(
            "max pool backward: indices {:?} {:?} for a gradient {:?}",
            indices.dtype(),
            indices.dims(),
            g.dims()
        )
    }
    conv_cpu::with_slice::<u8, _>(indices, |idx| match g.dtype() {
        DType::F32 if conv_cpu::applies(g) => typed::<f32>(idx, g, input_dims, &geo),
        DType::F64 if conv_cpu::applies(g) => typed::<f64>(idx, g, input_dims, &geo),
        other => candle_core::bail!(
            "max pool backward: {other:?} on {:?} not supported",
            g.device()
        ),
    })
}

/// `acc + t`, or `t` when nothing is accumulated yet (sums in a fixed order stay bitwise stable).
fn add_into(acc: Option<Tensor>, t: Tensor) -> Result<Tensor> {
    match acc {
        None => Ok(t),
        Some(a) => a.add(&t),
    }
}

/// Average pooling (padded cells not counted).
pub fn avg_pool2d_forward(x: &Tensor, p: &Pool2d) -> Result<Tensor> {
    let geo = PoolGeom::new(x, p)?;
    if conv_cpu::applies(x) {
        return avg_pool_cpu(x, x.dims(), &geo, false);
    }
    let (sum, count) = geo.sum_and_count(x)?;
    sum.div(&count)
}

/// Average pooling on the CPU in one pass, allocating only the result: the forward pass from
/// `t` = the input, or (`backward`) the input gradient of shape `input_dims` from `t` = the output
/// gradient. A window averages its cells inside the input (padding is not counted).
fn avg_pool_cpu(
    t: &Tensor,
    input_dims: &[usize],
    geo: &PoolGeom,
    backward: bool,
) -> Result<Tensor> {
    fn run<T: WithDType>(
        t: &Tensor,
        input_dims: &[usize],
        geo: &PoolGeom,
        backward: bool,
    ) -> Result<Tensor> {
        let &[n, c, h, w] = input_dims else {
            candle_core::bail!("average pooling needs an NCHW input, got {input_dims:?}")
        };
        let [oh, ow] = geo.o;
        let cells = |o: usize, k: usize, s: usize, pad: usize, len: usize| {
            (0..k).filter_map(move |a| (o * s + a).checked_sub(pad).filter(|&i| i < len))
        };
        conv_cpu::with_slice::<T, _>(t, |ts| {
            let len = if backward {
                n * c * h * w
            } else {
                n * c * oh * ow
            };
            let mut out = vec![T::from_f64(0.0); len];
            for plane in 0..n * c {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let rows = || cells(oy, geo.k[0], geo.s[0], geo.pad[0], h);
                        let cols = || cells(ox, geo.k[1], geo.s[1], geo.pad[2], w);
                        let count = (rows().count() * cols().count()).max(1) as f64;
                        let o = (plane * oh + oy) * ow + ox;
                        if backward {
                            let share = ts[o].to_f64() / count;
                            for iy in rows() {
                                for ix in cols() {
                                    let i = (plane * h + iy) * w + ix;
                                    out[i] = T::from_f64(out[i].to_f64() + share);
                                }
                            }
                        } else {
                            let mut sum = 0.0;
                            for iy in rows() {
                                for ix in cols() {
                                    sum += ts[(plane * h + iy) * w + ix].to_f64();
                                }
                            }
                            out[o] = T::from_f64(sum / count);
                        }
                    }
                }
            }
            let dims = if backward {
                [n, c, h, w]
            } else {
                [n, c, oh, ow]
            };
            Tensor::from_vec(out, &dims, t.device())
        })
    }
    direct_cpu::typed!(t, run(t, input_dims, geo, backward))
}

/// Input gradient of average pooling, for an input of `input_dims`.
pub fn avg_pool2d_backward(input_dims: &[usize], g: &Tensor, p: &Pool2d) -> Result<Tensor> {
    let geo = PoolGeom::of_dims(input_dims, p)?;
    if conv_cpu::applies(g) {
        return avg_pool_cpu(g, input_dims, &geo, true);
    }
    let x = Tensor::zeros(input_dims, g.dtype(), g.device())?;
    let (_, count) = geo.sum_and_count(&x)?;
    let share = g.div(&count)?;
    let mut acc: Option<Tensor> = None;
    for (a, b) in geo.offsets() {
        let placed = geo.place(&share, a, b)?;
        acc = Some(add_into(acc, placed)?);
    }
    let Some(acc) = acc else {
        candle_core::bail!("empty pooling window")
    };
    geo.unpad(&acc)
}

/// Per-example cross-entropy of a `[N, C]` prediction against `u32` labels `[N]`: from logits
/// (`logsumexp(z) - z[label]`) or from probabilities (`-ln p[label]`, clamped at 1e-7).
pub fn cross_entropy(pred: &Tensor, labels: &Tensor, from_logits: bool) -> Result<Tensor> {
    cross_entropy_nd(pred, labels, 1, from_logits)
}

/// `pred` with `axis` moved last, as `[rows, C]`, and the permutation used.
fn class_rows(pred: &Tensor, axis: usize) -> Result<(Tensor, Vec<usize>)> {
    let rank = pred.rank();
    if axis == 0 || axis >= rank {
        candle_core::bail!("class axis {axis} out of range for a rank-{rank} prediction")
    }
    let classes = pred.dim(axis)?;
    let mut perm: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
    perm.push(axis);
    let moved = if axis == rank - 1 {
        pred.clone()
    } else {
        pred.permute(perm.clone())?.contiguous()?
    };
    let rows = pred.elem_count() / classes.max(1);
    Ok((moved.reshape((rows, classes))?, perm))
}

fn check_labels(pred: &Tensor, labels: &Tensor, axis: usize) -> Result<()> {
    let mut want = pred.dims().to_vec();
    want.remove(axis);
    if labels.dims() != want.as_slice() || labels.dtype() != DType::U32 {
        candle_core::bail!(
            "labels are {:?} {:?}, the prediction {:?} (class axis {axis}) needs u32 {want:?}",
            labels.dims(),
            labels.dtype(),
            pred.dims()
        )
    }
    Ok(())
}

/// Per-example cross-entropy with the classes on `axis` (1 for `[N, C]` and `[N, C, positions]`,
/// 2 for `[N, T, V]`) against `u32` labels of the prediction's shape without `axis`, averaged over
/// the positions of each example: `[N]`. From logits or from probabilities (clamped at 1e-7).
pub fn cross_entropy_nd(
    pred: &Tensor,
    labels: &Tensor,
    axis: usize,
    from_logits: bool,
) -> Result<Tensor> {
    check_labels(pred, labels, axis)?;
    if direct_cpu::applies(pred) {
        return direct_cpu::cross_entropy(pred, labels, axis, from_logits);
    }
    let n = pred.dim(0)?;
    let (rows, _) = class_rows(pred, axis)?;
    let idx = labels.flatten_all()?.unsqueeze(1)?;
    let per_row = if from_logits {
        let m = rows.max_keepdim(1)?;
        let lse = rows
            .broadcast_sub(&m)?
            .exp()?
            .sum_keepdim(1)?
            .log()?
            .add(&m)?;
        lse.sub(&rows.gather(&idx, 1)?)?
    } else {
        rows.gather(&idx, 1)?.clamp(1e-7f64, 1f64)?.log()?.neg()?
    };
    let positions = per_row.elem_count() / n.max(1);
    per_row.reshape((n, positions))?.mean(1)
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
    cross_entropy_nd_backward(pred, labels, 1, from_logits)
}

/// Gradient of the mean over the batch of [`cross_entropy_nd`] with respect to the softmax's
/// input: `(softmax(z) - onehot) / (N * positions)` with the classes on `axis`.
pub fn cross_entropy_nd_backward(
    pred: &Tensor,
    labels: &Tensor,
    axis: usize,
    from_logits: bool,
) -> Result<Tensor> {
    check_labels(pred, labels, axis)?;
    if direct_cpu::applies(pred) {
        return direct_cpu::cross_entropy_backward(pred, labels, axis, from_logits);
    }
    let (rows, perm) = class_rows(pred, axis)?;
    let (r, c) = rows.dims2()?;
    let p = if from_logits {
        softmax(&rows, 1)?
    } else {
        rows
    };
    let g = ((p - one_hot(&labels.flatten_all()?, c, pred.dtype())?)? / r as f64)?;
    if axis == pred.rank() - 1 {
        return g.reshape(pred.dims());
    }
    let moved: Vec<usize> = perm.iter().map(|&a| pred.dim(a)).collect::<Result<_>>()?;
    let mut inverse = vec![0; perm.len()];
    for (i, &a) in perm.iter().enumerate() {
        inverse[a] = i;
    }
    g.reshape(moved)?.permute(inverse)?.contiguous()
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
pub fn global_avg_pool_backward(input_dims: &[usize], g: &Tensor) -> Result<Tensor> {
    let &[n, c, h, w] = input_dims else {
        candle_core::bail!("global average pooling needs an NCHW input, got {input_dims:?}")
    };
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

/// `[N, C, rest]` view of a batch-norm input `[N, C, ...]`.
fn channels3(x: &Tensor) -> Result<(Tensor, usize)> {
    let dims = x.dims();
    if dims.len() < 2 {
        candle_core::bail!("batch norm needs [N, C, ...], got {dims:?}")
    }
    let (n, c) = (dims[0], dims[1]);
    let rest = x.elem_count() / (n * c).max(1);
    Ok((x.reshape((n, c, rest))?, c))
}

/// Normalized `x` over axes (0, 2) of `[N, C, R]`: `(xhat, 1 / sqrt(var + eps), mean, var)`.
fn bn_normalize(x3: &Tensor, eps: f64) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let mean = x3.mean_keepdim((0, 2))?;
    let xc = x3.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim((0, 2))?;
    let inv = (&var + eps)?.sqrt()?.recip()?;
    Ok((xc.broadcast_mul(&inv)?, inv, mean, var))
}

/// Batch normalization over axis 1 in training mode (batch statistics, biased variance):
/// `(y, batch mean [C], batch variance [C])`.
pub fn batch_norm_forward(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    if direct_cpu::applies(x) {
        return direct_cpu::batch_norm_forward(x, gamma, beta, eps);
    }
    batch_norm_forward_ops(x, gamma, beta, eps)
}

/// [`batch_norm_forward`] as candle tensor ops (any device; one temporary per elementwise step).
pub fn batch_norm_forward_ops(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (x3, c) = channels3(x)?;
    let (xhat, _, mean, var) = bn_normalize(&x3, eps)?;
    let y = xhat
        .broadcast_mul(&gamma.reshape((1, c, 1))?)?
        .broadcast_add(&beta.reshape((1, c, 1))?)?;
    Ok((
        y.reshape(x.dims())?,
        mean.flatten_all()?,
        var.flatten_all()?,
    ))
}

/// Running statistics after one training step (Keras convention): `momentum * running + (1 -
/// momentum) * batch`, the batch variance with Bessel's correction over the `count` values per
/// channel.
pub fn batch_norm_running(
    running_mean: &Tensor,
    running_var: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    momentum: f64,
    count: usize,
) -> Result<(Tensor, Tensor)> {
    let unbias = if count > 1 {
        count as f64 / (count - 1) as f64
    } else {
        1.0
    };
    let m = ((running_mean * momentum)? + (mean * (1.0 - momentum))?)?;
    let v = ((running_var * momentum)? + (var * ((1.0 - momentum) * unbias))?)?;
    Ok((m, v))
}

/// Gradients of training-mode batch normalization from its input and the gradient `g` of its
/// output: `(dx, dgamma, dbeta)` (the statistics are recomputed from `x`).
pub fn batch_norm_backward(
    x: &Tensor,
    gamma: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    if direct_cpu::applies(x) {
        return direct_cpu::batch_norm_backward(x, gamma, g, eps);
    }
    batch_norm_backward_ops(x, gamma, g, eps)
}

/// [`batch_norm_backward`] as candle tensor ops (any device; about seven output-sized
/// temporaries).
pub fn batch_norm_backward_ops(
    x: &Tensor,
    gamma: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (x3, c) = channels3(x)?;
    let g3 = g.reshape(x3.dims())?;
    let (xhat, inv, _, _) = bn_normalize(&x3, eps)?;
    let dbeta = g3.sum((0, 2))?;
    let gx = g3.mul(&xhat)?;
    let dgamma = gx.sum((0, 2))?;
    let gh = g3.broadcast_mul(&gamma.reshape((1, c, 1))?)?;
    let ghx = gx.broadcast_mul(&gamma.reshape((1, c, 1))?)?;
    let dx = gh
        .broadcast_sub(&gh.mean_keepdim((0, 2))?)?
        .sub(&xhat.broadcast_mul(&ghx.mean_keepdim((0, 2))?)?)?
        .broadcast_mul(&inv)?;
    Ok((dx.reshape(x.dims())?, dgamma, dbeta))
}

/// `[rows, C]` view of a layer-norm input `[..., C]`.
fn rows2(x: &Tensor) -> Result<Tensor> {
    let c = *x.dims().last().unwrap_or(&0);
    x.reshape((x.elem_count() / c.max(1), c))
}

fn ln_normalize(x2: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let mean = x2.mean_keepdim(1)?;
    let xc = x2.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(1)?;
    let inv = (var + eps)?.sqrt()?.recip()?;
    Ok((xc.broadcast_mul(&inv)?, inv))
}

/// Layer normalization over the last axis with scale `gamma` and shift `beta`.
pub fn layer_norm_forward(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    if direct_cpu::applies(x) {
        return direct_cpu::layer_norm(x, gamma, beta, eps);
    }
    let (xhat, _) = ln_normalize(&rows2(x)?, eps)?;
    xhat.broadcast_mul(gamma)?
        .broadcast_add(beta)?
        .reshape(x.dims())
}

/// Gradients of layer normalization: `(dx, dgamma, dbeta)`.
pub fn layer_norm_backward(
    x: &Tensor,
    gamma: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    if direct_cpu::applies(x) {
        return direct_cpu::layer_norm_backward(x, gamma, g, eps);
    }
    let x2 = rows2(x)?;
    let g2 = g.reshape(x2.dims())?;
    let (xhat, inv) = ln_normalize(&x2, eps)?;
    let dbeta = g2.sum(0)?;
    let dgamma = g2.mul(&xhat)?.sum(0)?;
    let gh = g2.broadcast_mul(gamma)?;
    let dx = gh
        .broadcast_sub(&gh.mean_keepdim(1)?)?
        .sub(&xhat.broadcast_mul(&gh.mul(&xhat)?.mean_keepdim(1)?)?)?
        .broadcast_mul(&inv)?;
    Ok((dx.reshape(x.dims())?, dgamma, dbeta))
}

/// The seed of a dropout layer's mask in one training step: a mix of the executor's seed, the
/// step counter and the layer index, so a recompute in the same step replays the same mask.
pub fn dropout_seed(seed: u64, step: u64, layer: usize) -> u64 {
    fn mix(mut z: u64) -> u64 {
        // splitmix64's finalizer.
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    mix(mix(mix(seed) ^ step.wrapping_add(0x9e37_79b9_7f4a_7c15)) ^ layer as u64)
}

/// The inverted-dropout mask of `dims`: each element independently 0 with probability `rate`,
/// else `1 / (1 - rate)`, drawn from `seed` (the same seed gives the same mask).
pub fn dropout_mask(
    dims: &[usize],
    rate: f32,
    seed: u64,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    if !(0.0..1.0).contains(&rate) {
        candle_core::bail!("dropout rate {rate} must be in [0, 1)")
    }
    let keep = 1.0 / (1.0 - rate as f64);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let count: usize = dims.iter().product();
    let v: Vec<f64> = (0..count)
        .map(|_| if rng.gen::<f32>() < rate { 0.0 } else { keep })
        .collect();
    from_f64_vec(v, dims, dtype, dev)
}

/// `x` times the inverted-dropout mask of [`dropout_mask`] for `seed`; on the CPU without
/// forming the mask (bitwise the same product).
pub fn dropout_apply(x: &Tensor, rate: f32, seed: u64) -> Result<Tensor> {
    if direct_cpu::applies(x) {
        return direct_cpu::dropout(x, rate, seed);
    }
    let mask = dropout_mask(x.dims(), rate, seed, x.dtype(), x.device())?;
    x.mul(&mask)
}

/// Token embedding: `u32` ids `[N, T]` to rows of `weight` `[vocab, dim]`: `[N, T, dim]`.
pub fn embedding_forward(ids: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let (n, t) = ids.dims2()?;
    let (_, dim) = weight.dims2()?;
    weight
        .index_select(&ids.flatten_all()?, 0)?
        .reshape((n, t, dim))
}

/// Gradient of the embedding table: `g` rows scatter-added at their ids, in order.
pub fn embedding_backward(ids: &Tensor, weight: &Tensor, g: &Tensor) -> Result<Tensor> {
    let (vocab, dim) = weight.dims2()?;
    let rows = ids.elem_count();
    Tensor::zeros((vocab, dim), g.dtype(), g.device())?.index_add(
        &ids.flatten_all()?,
        &g.reshape((rows, dim))?,
        0,
    )
}

/// Adds the first `T` rows of a learned position table `[max_len, C]` to `[N, T, C]`.
pub fn position_embedding_forward(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let (_, t, _) = x.dims3()?;
    x.broadcast_add(&weight.narrow(0, 0, t)?)
}

/// Gradient of the position table (`g` summed over the batch, zero rows past `T`); the input
/// gradient is `g` itself.
pub fn position_embedding_backward(weight: &Tensor, g: &Tensor) -> Result<Tensor> {
    let (max_len, _) = weight.dims2()?;
    let (_, t, _) = g.dims3()?;
    let d = g.sum(0)?;
    if t < max_len {
        d.pad_with_zeros(0, 0, max_len - t)
    } else {
        Ok(d)
    }
}

/// Multi-head self-attention's intermediate tensors (recomputed by the backward rule).
struct Attention {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    att: Tensor,
    o: Tensor,
    scale: f64,
}

fn heads_first(t: &Tensor, n: usize, len: usize, heads: usize, d: usize) -> Result<Tensor> {
    t.reshape((n, len, heads, d))?.transpose(1, 2)?.contiguous()
}

fn heads_last(t: &Tensor, n: usize, len: usize, c: usize) -> Result<Tensor> {
    t.transpose(1, 2)?.contiguous()?.reshape((n, len, c))
}

fn attention_parts(
    x: &Tensor,
    wqkv: &Tensor,
    bqkv: &Tensor,
    heads: usize,
    causal: bool,
) -> Result<Attention> {
    let (n, t, c) = x.dims3()?;
    if heads == 0 || c % heads != 0 {
        candle_core::bail!("{heads} heads do not divide width {c}")
    }
    let d = c / heads;
    let qkv = dense_forward(x, wqkv, Some(bqkv))?;
    let q = heads_first(&qkv.narrow(2, 0, c)?, n, t, heads, d)?;
    let k = heads_first(&qkv.narrow(2, c, c)?, n, t, heads, d)?;
    let v = heads_first(&qkv.narrow(2, 2 * c, c)?, n, t, heads, d)?;
    let scale = 1.0 / (d as f64).sqrt();
    let mut scores = (q.matmul(&k.transpose(2, 3)?.contiguous()?)? * scale)?;
    if causal {
        let mask: Vec<f64> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f64::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = from_f64_vec(mask, &[t, t], x.dtype(), x.device())?;
        scores = scores.broadcast_add(&mask)?;
    }
    let att = softmax(&scores, 3)?;
    let o = heads_last(&att.matmul(&v)?, n, t, c)?;
    Ok(Attention {
        q,
        k,
        v,
        att,
        o,
        scale,
    })
}

/// Multi-head self-attention on `[N, T, C]`: fused QKV projection `[3C, C]` (+ bias), scaled dot
/// products (optionally causal), softmax, weighted values, output projection `[C, C]` (+ bias).
pub fn attention_forward(
    x: &Tensor,
    wqkv: &Tensor,
    bqkv: &Tensor,
    wout: &Tensor,
    bout: &Tensor,
    heads: usize,
    causal: bool,
) -> Result<Tensor> {
    let a = attention_parts(x, wqkv, bqkv, heads, causal)?;
    dense_forward(&a.o, wout, Some(bout))
}

/// Parameter and input gradients of [`attention_forward`] from its input and output gradient
/// `g` (everything else is recomputed).
#[derive(Debug)]
pub struct AttentionGrads {
    /// Input gradient (when asked for).
    pub dx: Option<Tensor>,
    /// QKV kernel gradient `[3C, C]`.
    pub dwqkv: Tensor,
    /// QKV bias gradient `[3C]`.
    pub dbqkv: Tensor,
    /// Output kernel gradient `[C, C]`.
    pub dwout: Tensor,
    /// Output bias gradient `[C]`.
    pub dbout: Tensor,
}

/// The backward rule of [`attention_forward`].
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    x: &Tensor,
    wqkv: &Tensor,
    bqkv: &Tensor,
    wout: &Tensor,
    g: &Tensor,
    heads: usize,
    causal: bool,
    need_dx: bool,
) -> Result<AttentionGrads> {
    let a = attention_parts(x, wqkv, bqkv, heads, causal)?;
    let (n, t, c) = x.dims3()?;
    let d = c / heads;
    let (do_, dwout, dbout) = dense_backward(&a.o, wout, g, true, true)?;
    let (Some(do_), Some(dwout)) = (do_, dwout) else {
        candle_core::bail!("attention: no output-projection gradients")
    };
    let do4 = heads_first(&do_, n, t, heads, d)?;
    let datt = do4.matmul(&a.v.transpose(2, 3)?.contiguous()?)?;
    let dv = a.att.transpose(2, 3)?.contiguous()?.matmul(&do4)?;
    let s = datt.mul(&a.att)?.sum_keepdim(3)?;
    let ds = a.att.mul(&datt.broadcast_sub(&s)?)?;
    let dq = (ds.matmul(&a.k)? * a.scale)?;
    let dk = (ds.transpose(2, 3)?.contiguous()?.matmul(&a.q)? * a.scale)?;
    let dqkv = Tensor::cat(
        &[
            heads_last(&dq, n, t, c)?,
            heads_last(&dk, n, t, c)?,
            heads_last(&dv, n, t, c)?,
        ],
        2,
    )?;
    let (dx, dwqkv, dbqkv) = dense_backward(x, wqkv, &dqkv, need_dx, true)?;
    let Some(dwqkv) = dwqkv else {
        candle_core::bail!("attention: no QKV kernel gradient")
    };
    Ok(AttentionGrads {
        dx,
        dwqkv,
        dbqkv,
        dwout,
        dbout,
    })
}
