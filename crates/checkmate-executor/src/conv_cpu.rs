//! Convolutions on the CPU with bounded scratch: one sample and one group at a time, output
//! positions in chunks whose unfolded windows fit in [`CHUNK_BYTES`], each chunk one `gemm` call
//! that writes straight into the preallocated output (or accumulates into the kernel gradient).
//!
//! candle's own CPU convolution copies the whole input to NHWC, copies the kernel and unfolds a
//! tile per rayon worker on every call, and its kernel gradient goes through a second such
//! convolution with the batch as channels: scratch that scales with the batch and the thread
//! count, and that no plan can see. Here the scratch of one call is one chunk buffer
//! ([`Geom::chunk_elems`] elements) plus gemm's packing buffers (about the kernel's size), the
//! same on every call with the same shapes, so every plan computes the same bits and the
//! training graph can state the workspace exactly (`checkmate_models::Op::forward_workspace`).
//!
//! The three products of a convolution (shapes per sample `n` and group `g`, `K = cpg*kh*kw`
//! window columns, `P = oh*ow` positions):
//! - forward: `y[n, g*opg + o, p] = sum_k col[p, k] W[g*opg + o, k]`;
//! - kernel gradient: `dW[g*opg + o, k] += sum_p dY[n, g*opg + o, p] col[p, k]`;
//! - input gradient: `dcol[p, k] = sum_o dY[n, g*opg + o, p] W[g*opg + o, k]`, folded back onto
//!   `dx` window by window in a fixed order.

use candle_core::{DType, Device, Result, Storage, Tensor, WithDType};
use rayon::prelude::*;

/// Bytes of unfolded windows one gemm call works on (at least one output position); the
/// training graph's workspace uses the same bound (`checkmate_models::conv_chunk_bytes`).
pub const CHUNK_BYTES: usize = checkmate_models::CONV_CHUNK_BYTES;

/// The geometry of one convolution with its padding resolved.
#[derive(Debug, Clone, Copy)]
pub struct Geom {
    /// Samples.
    pub n: usize,
    /// Input channels.
    pub cin: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Row and column stride.
    pub stride: [usize; 2],
    /// Row and column dilation.
    pub dilation: [usize; 2],
    /// Zero rows above the input.
    pub top: usize,
    /// Zero columns left of the input.
    pub left: usize,
    /// Groups (`cin` and `cout` are multiples).
    pub groups: usize,
    /// Bytes of unfolded windows per gemm call ([`CHUNK_BYTES`] by default; at least one output
    /// position, at most one sample's).
    pub chunk_bytes: usize,
}

impl Geom {
    fn cpg(&self) -> usize {
        self.cin / self.groups
    }

    fn opg(&self) -> usize {
        self.cout / self.groups
    }

    /// Window columns per group (`cpg * kh * kw`).
    pub fn window(&self) -> usize {
        self.cpg() * self.kh * self.kw
    }

    /// Output positions per chunk for elements of `elem` bytes.
    pub fn chunk_rows(&self, elem: usize) -> usize {
        checkmate_models::conv_chunk_rows_within(
            self.window(),
            self.oh * self.ow,
            elem,
            self.chunk_bytes,
        )
    }

    /// Elements of the one chunk buffer a call allocates.
    pub fn chunk_elems(&self, elem: usize) -> usize {
        self.chunk_rows(elem) * self.window()
    }

    /// The input row and column (possibly outside the input) of window offset `(0, 0)` at output
    /// position `p`.
    #[inline]
    fn origin(&self, p: usize) -> (isize, isize) {
        let (oy, ox) = (p / self.ow, p % self.ow);
        (
            (oy * self.stride[0]) as isize - self.top as isize,
            (ox * self.stride[1]) as isize - self.left as isize,
        )
    }

    /// Unfolds positions `p0..p0 + rows` of sample `x` (`cin*h*w`), group `g`, into `col`, one
    /// row per position (rows in parallel: a copy, so the bits do not depend on the threads).
    fn unfold<T: WithDType>(&self, x: &[T], g: usize, p0: usize, rows: usize, col: &mut [T]) {
        let k_len = self.window();
        col[..rows * k_len]
            .par_chunks_mut(k_len.max(1))
            .enumerate()
            .for_each(|(r, row)| self.unfold_one(x, g, p0 + r, row));
    }

    /// Unfolds the window of output position `p` of sample `x`, group `g`, into `row`
    /// (`window()` elements: input channel, then kernel row, then kernel column).
    fn unfold_one<T: WithDType>(&self, x: &[T], g: usize, p: usize, row: &mut [T]) {
        let plane = self.h * self.w;
        let xg = &x[g * self.cpg() * plane..(g + 1) * self.cpg() * plane];
        let (h, w) = (self.h as isize, self.w as isize);
        let [dy, dx] = self.dilation.map(|d| d as isize);
        let (y0, x0) = self.origin(p);
        let mut slots = row.iter_mut();
        for src in xg.chunks(plane.max(1)) {
            for a in 0..self.kh as isize {
                let iy = y0 + a * dy;
                let line = (0..h).contains(&iy).then(|| iy as usize * self.w);
                for b in 0..self.kw as isize {
                    let ix = x0 + b * dx;
                    let v = match line {
                        Some(l) if (0..w).contains(&ix) => src[l + ix as usize],
                        _ => T::from_f64(0.0),
                    };
                    if let Some(slot) = slots.next() {
                        *slot = v;
                    }
                }
            }
        }
    }

    /// Adds `dcol` (positions `p0..p0 + rows`, group `g`) back onto sample `dx`: input channels
    /// in parallel (their planes are disjoint), and within a channel position by position, window
    /// offset by offset, so each element sums its parts in one fixed order.
    fn fold<T: WithDType>(&self, dcol: &[T], g: usize, p0: usize, rows: usize, dx: &mut [T]) {
        let k_len = self.window();
        let kk = self.kh * self.kw;
        let plane = self.h * self.w;
        let dxg = &mut dx[g * self.cpg() * plane..(g + 1) * self.cpg() * plane];
        let (h, w) = (self.h as isize, self.w as isize);
        let [dy, ddx] = self.dilation.map(|d| d as isize);
        dxg.par_chunks_mut(plane.max(1))
            .enumerate()
            .for_each(|(ci, dst)| {
                for r in 0..rows {
                    let (y0, x0) = self.origin(p0 + r);
                    let part = &dcol[r * k_len + ci * kk..r * k_len + (ci + 1) * kk];
                    let mut parts = part.iter();
                    for a in 0..self.kh as isize {
                        let iy = y0 + a * dy;
                        let line = (0..h).contains(&iy).then(|| iy as usize * self.w);
                        for b in 0..self.kw as isize {
                            let ix = x0 + b * ddx;
                            let Some(&v) = parts.next() else { continue };
                            if let Some(l) = line {
                                if (0..w).contains(&ix) {
                                    dst[l + ix as usize] += v;
                                }
                            }
                        }
                    }
                }
            });
    }

    /// The input gradient of one chunk, added to sample `dx`: `dcol[p, k] = sum_o dY[o, p]
    /// W_g[o, k]` into `col` (`gy`: group `g`'s upstream gradient from position `p0`, rows
    /// `stride` apart), then folded.
    fn add_input_grad<T: WithDType>(
        &self,
        gy: &[T],
        stride: usize,
        wg: &[T],
        (g, p0, rows): (usize, usize, usize),
        col: &mut [T],
        dx: &mut [T],
    ) {
        let k_len = self.window();
        gemm(
            (rows, k_len, self.opg()),
            col,
            (k_len, 1),
            false,
            gy,
            (1, stride),
            wg,
            (k_len, 1),
        );
        self.fold(col, g, p0, rows, dx);
    }

    /// Every chunk of every sample and group, in order: unfolds the chunk's windows into `col`
    /// and calls `f(sample, group, p0, rows, col, the group's kernel rows)`.
    fn each_chunk<T: WithDType>(
        &self,
        xs: &[T],
        ws: &[T],
        col: &mut [T],
        mut f: impl FnMut(usize, usize, usize, usize, &[T], &[T]),
    ) {
        let (k_len, opg, elem) = (self.window(), self.opg(), T::DTYPE.size_in_bytes());
        let sample = self.cin * self.h * self.w;
        for s in 0..self.n {
            let xn = &xs[s * sample..(s + 1) * sample];
            for g in 0..self.groups {
                let wg = &ws[g * opg * k_len..];
                for (p0, rows) in self.chunks(elem) {
                    self.unfold(xn, g, p0, rows, col);
                    f(s, g, p0, rows, col, wg);
                }
            }
        }
    }

    fn chunks(&self, elem: usize) -> impl Iterator<Item = (usize, usize)> {
        let positions = self.oh * self.ow;
        let rows = self.chunk_rows(elem);
        (0..positions)
            .step_by(rows.max(1))
            .map(move |p0| (p0, rows.min(positions - p0)))
    }
}

/// `dst[m x n] = (accumulate ? dst : 0) + lhs[m x k] rhs[k x n]`, strides in elements
/// (`rs` between rows, `cs` between columns).
#[allow(clippy::too_many_arguments)]
fn gemm<T: WithDType>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
    (dst_rs, dst_cs): (usize, usize),
    accumulate: bool,
    lhs: &[T],
    (lhs_rs, lhs_cs): (usize, usize),
    rhs: &[T],
    (rhs_rs, rhs_cs): (usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rs: usize, cs: usize, r: usize, c: usize| (r - 1) * rs + (c - 1) * cs;
    assert!(
        last(dst_rs, dst_cs, m, n) < dst.len(),
        "gemm: dst too short"
    );
    if k > 0 {
        assert!(
            last(lhs_rs, lhs_cs, m, k) < lhs.len(),
            "gemm: lhs too short"
        );
        assert!(
            last(rhs_rs, rhs_cs, k, n) < rhs.len(),
            "gemm: rhs too short"
        );
    }
    // SAFETY: the asserts above keep every index gemm touches inside the three slices; `dst`
    // is borrowed mutably, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            if accumulate {
                T::from_f64(1.0)
            } else {
                T::from_f64(0.0)
            },
            T::from_f64(1.0),
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

/// Whether the chunked kernels take `t` (CPU, f32 or f64).
pub fn applies(t: &Tensor) -> bool {
    matches!(t.device(), Device::Cpu) && matches!(t.dtype(), DType::F32 | DType::F64)
}

/// Calls `f` with `t`'s elements as a contiguous slice (a copy only when `t` is a strided view).
pub(crate) fn with_slice<T: WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> Result<R>,
) -> Result<R> {
    let t = if t.is_contiguous() {
        t.clone()
    } else {
        t.contiguous()?
    };
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("conv_cpu: tensor is not on the CPU")
    };
    let all = cpu.as_slice::<T>()?;
    let start = layout.start_offset();
    f(&all[start..start + t.elem_count()])
}

fn forward_typed<T: WithDType>(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &Geom,
    relu: bool,
) -> Result<Tensor> {
    let positions = geo.oh * geo.ow;
    let mut out = vec![T::from_f64(0.0); geo.n * geo.cout * positions];
    let (k_len, opg, elem) = (geo.window(), geo.opg(), T::DTYPE.size_in_bytes());
    with_slice::<T, _>(x, |xs| {
        with_slice::<T, _>(w, |ws| {
            let mut col = vec![T::from_f64(0.0); geo.chunk_elems(elem)];
            geo.each_chunk(xs, ws, &mut col, |s, g, p0, rows, col, wg| {
                let at = (s * geo.cout + g * opg) * positions + p0;
                gemm(
                    (rows, opg, k_len),
                    &mut out[at..],
                    (1, positions),
                    false,
                    col,
                    (k_len, 1),
                    wg,
                    (1, k_len),
                );
            });
            Ok(())
        })
    })?;
    epilogue(&mut out, geo.cout, positions, bias, relu)?;
    Tensor::from_vec(out, (geo.n, geo.cout, geo.oh, geo.ow), x.device())
}

/// Adds the per-channel `bias` to `out` (`[n, channels, positions]`) and applies ReLU, in place.
fn epilogue<T: WithDType>(
    out: &mut [T],
    channels: usize,
    positions: usize,
    bias: Option<&Tensor>,
    relu: bool,
) -> Result<()> {
    if let Some(b) = bias {
        with_slice::<T, _>(b, |bs| {
            if bs.len() != channels {
                candle_core::bail!("conv_cpu: bias of {} for {channels} channels", bs.len())
            }
            for (i, plane) in out.chunks_mut(positions.max(1)).enumerate() {
                let v = bs[i % channels];
                plane.iter_mut().for_each(|x| *x += v);
            }
            Ok(())
        })?;
    }
    if relu {
        let zero = T::from_f64(0.0);
        out.iter_mut()
            .filter(|v| **v < zero)
            .for_each(|v| *v = zero);
    }
    Ok(())
}

/// The convolution of `x` with `w` (`[cout, cin/groups, kh, kw]`) plus `bias`, then ReLU when
/// `relu`. Scratch: one chunk buffer and gemm's packing; bias and ReLU are applied in place.
pub fn forward(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &Geom,
    relu: bool,
) -> Result<Tensor> {
    match x.dtype() {
        DType::F32 => forward_typed::<f32>(x, w, bias, geo, relu),
        DType::F64 => forward_typed::<f64>(x, w, bias, geo, relu),
        other => candle_core::bail!("conv_cpu: dtype {other:?} not supported"),
    }
}

/// Where a fused ReLU passes the gradient: from its output (`y > 0`) or from a packed bit mask
/// (operator-level graphs, [`crate::saved_cpu`]).
#[derive(Debug, Clone, Copy)]
pub enum ReluMask<'a> {
    /// The ReLU's output.
    Output(&'a Tensor),
    /// One bit per output element ([`crate::saved_cpu::activation_mask`]).
    Bits(&'a Tensor),
}

/// The gradient of a convolution's output arriving through a max pooling with non-overlapping
/// windows (operator level, docs/OP_GRAPHS.md): the pooled gradient `dy` (the pooling's output
/// shape) and the winners of [`crate::kernels::max_pool2d_indices`]; element `(y, x)` of the
/// convolution's output gets `dy[y / ph, x / pw]` where it won its window, 0 elsewhere, formed
/// chunk by chunk.
#[derive(Debug, Clone, Copy)]
pub struct Pooled<'a> {
    /// The winners, `u8` in the pooling's output shape.
    pub indices: &'a Tensor,
    /// Window (and stride) `[ph, pw]`.
    pub window: [usize; 2],
}

/// A [`ReluMask`]'s elements.
enum MaskSlice<'a, T> {
    Values(&'a [T]),
    Bits(&'a [u8]),
}

impl<T: WithDType> MaskSlice<'_, T> {
    #[inline]
    fn passes(&self, i: usize) -> bool {
        match self {
            MaskSlice::Values(y) => y[i] > T::from_f64(0.0),
            MaskSlice::Bits(b) => crate::saved_cpu::bit(b, i),
        }
    }
}

/// A [`Pooled`] gradient's elements and geometry.
struct PooledSlice<'a> {
    indices: &'a [u8],
    window: [usize; 2],
    /// The pooling's output rows and columns.
    out: [usize; 2],
}

/// Upstream-gradient rows of one chunk of the group whose first output element is `at`: `dY`
/// itself, or `dY` masked by a fused ReLU copied into a buffer of `opg * rows` elements. With
/// `pooled`, `gy` is the pooled gradient and each element is expanded from its window first
/// (`0 + g`, as max pooling's own backward adds it onto zeros).
fn masked_rows<'a, T: WithDType>(
    gy: &'a [T],
    at: usize,
    mask: Option<&MaskSlice<'_, T>>,
    pooled: Option<&PooledSlice<'_>>,
    (opg, positions, p0, rows, ow): (usize, usize, usize, usize, usize),
    buf: &'a mut [T],
) -> (&'a [T], usize) {
    let zero = T::from_f64(0.0);
    if let Some(pl) = pooled {
        let [ph, pw] = pl.window;
        let [poh, pow] = pl.out;
        // `at` is the first element of channel plane `at / positions`.
        let plane0 = at / positions.max(1);
        for o in 0..opg {
            let plane = plane0 + o;
            for (r, slot) in buf[o * rows..(o + 1) * rows].iter_mut().enumerate() {
                let p = p0 + r;
                let (y, x) = (p / ow, p % ow);
                let (py, px) = (y / ph, x / pw);
                let passes = mask.map_or(true, |m| m.passes(at + o * positions + p));
                *slot = if passes && py < poh && px < pow {
                    let q = (plane * poh + py) * pow + px;
                    if pl.indices[q] as usize == (y % ph) * pw + x % pw {
                        zero + gy[q]
                    } else {
                        zero
                    }
                } else {
                    zero
                };
            }
        }
        return (&buf[..opg * rows], rows);
    }
    let Some(m) = mask else {
        return (&gy[at + p0..], positions);
    };
    for o in 0..opg {
        let base = at + o * positions + p0;
        let src = &gy[base..];
        for (r, slot) in buf[o * rows..(o + 1) * rows].iter_mut().enumerate() {
            *slot = if m.passes(base + r) { src[r] } else { zero };
        }
    }
    (&buf[..opg * rows], rows)
}

#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn backward_typed<T: WithDType>(
    x: Option<&Tensor>,
    w: &Tensor,
    dy: &Tensor,
    relu: Option<ReluMask<'_>>,
    pooled: Option<Pooled<'_>>,
    geo: &Geom,
    need_dx: bool,
    need_dw: bool,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let positions = geo.oh * geo.ow;
    let out_dims = [geo.n, geo.cout, geo.oh, geo.ow];
    let pooled_out = match pooled {
        Some(p) => {
            let [ph, pw] = p.window;
            let want = [geo.n, geo.cout, geo.oh / ph.max(1), geo.ow / pw.max(1)];
            if ph == 0 || pw == 0 || dy.dims() != want || p.indices.dims() != want {
                candle_core::bail!(
                    "conv_cpu: pooled gradient {:?} and indices {:?} do not fit output \
                     {out_dims:?} pooled by {:?}",
                    dy.dims(),
                    p.indices.dims(),
                    p.window
                )
            }
            Some([want[2], want[3]])
        }
        None if dy.dims() != out_dims => {
            candle_core::bail!("conv_cpu: gradient {:?} for output {out_dims:?}", dy.dims())
        }
        None => None,
    };
    let (k_len, opg, elem) = (geo.window(), geo.opg(), T::DTYPE.size_in_bytes());
    let x = match x {
        Some(x) => Some(x),
        None if need_dw => candle_core::bail!("conv_cpu: the kernel gradient needs the input"),
        None => None,
    };
    // The bias gradient of a fused ReLU comes with the kernel gradient.
    let need_db = relu.is_some() && need_dw;
    let mut dw = vec![T::from_f64(0.0); if need_dw { geo.cout * k_len } else { 0 }];
    let mut db = vec![T::from_f64(0.0); if need_db { geo.cout } else { 0 }];
    let mut dx = if need_dx {
        vec![T::from_f64(0.0); geo.n * geo.cin * geo.h * geo.w]
    } else {
        Vec::new()
    };
    match relu {
        Some(ReluMask::Output(y)) if y.dims() != out_dims => {
            candle_core::bail!(
                "conv_cpu: ReLU output {:?} for output {out_dims:?}",
                y.dims()
            )
        }
        Some(ReluMask::Bits(m)) => crate::saved_cpu::check_mask(m, out_dims.iter().product())?,
        _ => {}
    }
    let mut body = |xs: Option<&[T]>,
                    ws: &[T],
                    gs: &[T],
                    ys: Option<MaskSlice<'_, T>>,
                    pl: Option<PooledSlice<'_>>| {
        let mut col = vec![T::from_f64(0.0); geo.chunk_elems(elem)];
        let mut gbuf = vec![
            T::from_f64(0.0);
            if ys.is_some() || pl.is_some() {
                masked_elems(geo, elem)
            } else {
                0
            }
        ];
        let sample = geo.cin * geo.h * geo.w;
        for s in 0..geo.n {
            for g in 0..geo.groups {
                let wg = &ws[g * opg * k_len..];
                let at = (s * geo.cout + g * opg) * positions;
                for (p0, rows) in geo.chunks(elem) {
                    let (gy, stride) = masked_rows(
                        gs,
                        at,
                        ys.as_ref(),
                        pl.as_ref(),
                        (opg, positions, p0, rows, geo.ow),
                        &mut gbuf,
                    );
                    if need_db {
                        // Bias gradient of the masked rows, channel by channel in a fixed order.
                        for o in 0..opg {
                            let part = &gy[o * stride..o * stride + rows];
                            db[g * opg + o] += part.iter().fold(T::from_f64(0.0), |a, &v| a + v);
                        }
                    }
                    if let (true, Some(xs)) = (need_dw, xs) {
                        // Kernel gradient: dW_g[o, k] += sum_p dY[o, p] col[p, k].
                        let xn = &xs[s * sample..(s + 1) * sample];
                        geo.unfold(xn, g, p0, rows, &mut col);
                        gemm(
                            (opg, k_len, rows),
                            &mut dw[g * opg * k_len..],
                            (k_len, 1),
                            true,
                            gy,
                            (stride, 1),
                            &col,
                            (k_len, 1),
                        );
                    }
                    if need_dx {
                        // Input gradient, in the same buffer as the windows.
                        let dxn = &mut dx[s * sample..(s + 1) * sample];
                        geo.add_input_grad(gy, stride, wg, (g, p0, rows), &mut col, dxn);
                    }
                }
            }
        }
        Ok(())
    };
    let mut with_pool = |xs: Option<&[T]>, ws: &[T], gs: &[T], ys: Option<MaskSlice<'_, T>>| match (
        pooled, pooled_out,
    ) {
        (Some(p), Some(out)) => with_slice::<u8, _>(p.indices, |indices| {
            let pl = PooledSlice {
                indices,
                window: p.window,
                out,
            };
            body(xs, ws, gs, ys, Some(pl))
        }),
        _ => body(xs, ws, gs, ys, None),
    };
    let mut with_mask = |xs: Option<&[T]>, ws: &[T], gs: &[T]| match relu {
        Some(ReluMask::Output(y)) => {
            with_slice::<T, _>(y, |ys| with_pool(xs, ws, gs, Some(MaskSlice::Values(ys))))
        }
        Some(ReluMask::Bits(m)) => {
            with_slice::<u8, _>(m, |bits| with_pool(xs, ws, gs, Some(MaskSlice::Bits(bits))))
        }
        None => with_pool(xs, ws, gs, None),
    };
    with_slice::<T, _>(w, |ws| {
        with_slice::<T, _>(dy, |gs| match x {
            Some(x) => with_slice::<T, _>(x, |xs| with_mask(Some(xs), ws, gs)),
            None => with_mask(None, ws, gs),
        })
    })?;
    let dev = dy.device();
    let dw = if need_dw {
        Some(Tensor::from_vec(dw, w.dims(), dev)?)
    } else {
        None
    };
    let dx = if need_dx {
        Some(Tensor::from_vec(dx, (geo.n, geo.cin, geo.h, geo.w), dev)?)
    } else {
        None
    };
    let db = if need_db {
        Some(Tensor::from_vec(db, geo.cout, dev)?)
    } else {
        None
    };
    Ok((dx, dw, db))
}

/// Elements of the masked upstream-gradient buffer of [`gradients`]: `opg * rows`.
pub fn masked_elems(geo: &Geom, elem: usize) -> usize {
    geo.opg() * geo.chunk_rows(elem)
}

/// Gradients of the convolution from the gradient `dy` of its output: `(dx, dW)`, `dx` only
/// when `need_dx`, `dW` only when `need_dw` (a recomputed backward node's kernel gradient is
/// not needed again: skipping it saves its allocation and its products). Scratch: one chunk
/// buffer (windows, then their gradients) and gemm's packing.
pub fn backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    geo: &Geom,
    need_dx: bool,
    need_dw: bool,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let (dx, dw, _) = gradients(Some(x), w, None, None, dy, geo, need_dx, need_dw)?;
    Ok((dx, dw))
}

/// [`backward`] in general: `x` is needed only for `dW`; with `relu`, `dy` is the gradient of a
/// fused ReLU's output and its mask (the ReLU's output `y > 0`, or packed bits) is applied chunk
/// by chunk ([`masked_elems`] more scratch, instead of a masked copy of the whole gradient), and
/// the bias gradient of the masked rows comes with `dW` (`(dx, dW, db)`; `db` is `None` without a
/// ReLU); with `pooled` (a ReLU needed), `dy` is the gradient of the max pooling that reads the
/// ReLU's output.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub fn gradients(
    x: Option<&Tensor>,
    w: &Tensor,
    relu: Option<ReluMask<'_>>,
    pooled: Option<Pooled<'_>>,
    dy: &Tensor,
    geo: &Geom,
    need_dx: bool,
    need_dw: bool,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    if pooled.is_some() && relu.is_none() {
        candle_core::bail!("conv_cpu: a pooled gradient needs the convolution's fused ReLU")
    }
    match dy.dtype() {
        DType::F32 => backward_typed::<f32>(x, w, dy, relu, pooled, geo, need_dx, need_dw),
        DType::F64 => backward_typed::<f64>(x, w, dy, relu, pooled, geo, need_dx, need_dw),
        other => candle_core::bail!("conv_cpu: dtype {other:?} not supported"),
    }
}

fn data_grad_typed<T: WithDType>(
    dy: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &Geom,
    relu: bool,
) -> Result<Tensor> {
    let positions = geo.oh * geo.ow;
    let (k_len, opg, elem) = (geo.window(), geo.opg(), T::DTYPE.size_in_bytes());
    let sample = geo.cin * geo.h * geo.w;
    let mut dx = vec![T::from_f64(0.0); geo.n * sample];
    with_slice::<T, _>(w, |ws| {
        with_slice::<T, _>(dy, |gs| {
            let mut col = vec![T::from_f64(0.0); geo.chunk_elems(elem)];
            for s in 0..geo.n {
                for g in 0..geo.groups {
                    let wg = &ws[g * opg * k_len..];
                    let gy = &gs[(s * geo.cout + g * opg) * positions..];
                    for (p0, rows) in geo.chunks(elem) {
                        let dxn = &mut dx[s * sample..(s + 1) * sample];
                        geo.add_input_grad(&gy[p0..], positions, wg, (g, p0, rows), &mut col, dxn);
                    }
                }
            }
            Ok(())
        })
    })?;
    epilogue(&mut dx, geo.cin, geo.h * geo.w, bias, relu)?;
    Tensor::from_vec(dx, (geo.n, geo.cin, geo.h, geo.w), dy.device())
}

/// The input gradient alone, `dx` of a convolution from `dy`: also the forward pass of a
/// transposed convolution (then `geo` describes the convolution it transposes), with `bias` and
/// ReLU applied in place as in [`forward`].
pub fn data_grad(
    dy: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &Geom,
    relu: bool,
) -> Result<Tensor> {
    match dy.dtype() {
        DType::F32 => data_grad_typed::<f32>(dy, w, bias, geo, relu),
        DType::F64 => data_grad_typed::<f64>(dy, w, bias, geo, relu),
        other => candle_core::bail!("conv_cpu: dtype {other:?} not supported"),
    }
}

/// Runs `f` with the bias's elements, if any.
fn with_bias<T: WithDType, R>(
    bias: Option<&Tensor>,
    channels: usize,
    f: impl FnOnce(Option<&[T]>) -> Result<R>,
) -> Result<R> {
    match bias {
        Some(b) => with_slice::<T, _>(b, |bs| {
            if bs.len() != channels {
                candle_core::bail!("conv_cpu: bias of {} for {channels} channels", bs.len())
            }
            f(Some(bs))
        }),
        None => f(None),
    }
}

fn pool_winners_typed<T: WithDType>(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &Geom,
    [ph, pw]: [usize; 2],
) -> Result<(Tensor, Tensor)> {
    let positions = geo.oh * geo.ow;
    let (k_len, opg, elem) = (geo.window(), geo.opg(), T::DTYPE.size_in_bytes());
    let (poh, pow) = (geo.oh / ph, geo.ow / pw);
    let mut bits = vec![0u8; (geo.n * geo.cout * positions).div_ceil(8)];
    let mut winners = vec![u8::MAX; geo.n * geo.cout * poh * pow];
    let zero = T::from_f64(0.0);
    with_bias::<T, _>(bias, geo.cout, |bs| {
        with_slice::<T, _>(x, |xs| {
            with_slice::<T, _>(w, |ws| {
                let mut col = vec![zero; geo.chunk_elems(elem)];
                let mut buf = vec![zero; geo.chunk_rows(elem) * opg];
                // Per channel of the group and window of the current row of windows: the
                // largest value so far and its cell.
                let mut best = vec![zero; opg * pow];
                let mut cell = vec![0u8; opg * pow];
                geo.each_chunk(xs, ws, &mut col, |s, g, p0, rows, col, wg| {
                    gemm(
                        (rows, opg, k_len),
                        &mut buf,
                        (1, rows),
                        false,
                        col,
                        (k_len, 1),
                        wg,
                        (1, k_len),
                    );
                    for o in 0..opg {
                        let ch = g * opg + o;
                        let plane = s * geo.cout + ch;
                        for (r, &raw) in buf[o * rows..(o + 1) * rows].iter().enumerate() {
                            // The layer's epilogue, element by element: bias, then ReLU.
                            let mut v = raw;
                            if let Some(bs) = bs {
                                v += bs[ch];
                            }
                            if v < zero {
                                v = zero;
                            }
                            let p = p0 + r;
                            let i = plane * positions + p;
                            if v > zero {
                                bits[i / 8] |= 1 << (i % 8);
                            }
                            let (y, xx) = (p / geo.ow, p % geo.ow);
                            let (py, px) = (y / ph, xx / pw);
                            if py < poh && px < pow {
                                // Cells arrive in row-major order within a window: the
                                // first maximum wins, as in max pooling.
                                let off = (y % ph) * pw + xx % pw;
                                let slot = o * pow + px;
                                if off == 0 || v > best[slot] {
                                    best[slot] = v;
                                    cell[slot] = off as u8;
                                }
                                if off == ph * pw - 1 {
                                    winners[(plane * poh + py) * pow + px] = cell[slot];
                                }
                            }
                        }
                    }
                });
                Ok(())
            })
        })
    })?;
    let len = bits.len();
    Ok((
        Tensor::from_vec(bits, len, x.device())?,
        Tensor::from_vec(winners, (geo.n, geo.cout, poh, pow), x.device())?,
    ))
}

/// A convolution with a ReLU fused with the max pooling after it (non-overlapping `window`s,
/// no padding), without holding the convolution's output: chunk by chunk, the ReLU's packed
/// mask (as [`crate::saved_cpu::activation_mask`] of the output) and the pooling's winners (as
/// [`crate::kernels::max_pool2d_indices`]), the same bits as from the whole output. Scratch: the
/// chunk of windows, its outputs, and a running maximum per channel and window of one row of
/// windows.
pub fn pool_winners(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &Geom,
    window: [usize; 2],
) -> Result<(Tensor, Tensor)> {
    check_fused(geo, window)?;
    match x.dtype() {
        DType::F32 => pool_winners_typed::<f32>(x, w, bias, geo, window),
        DType::F64 => pool_winners_typed::<f64>(x, w, bias, geo, window),
        other => candle_core::bail!("conv_cpu: dtype {other:?} not supported"),
    }
}

fn check_fused(geo: &Geom, [ph, pw]: [usize; 2]) -> Result<()> {
    if ph == 0 || pw == 0 || ph * pw >= u8::MAX as usize || geo.oh < ph || geo.ow < pw {
        candle_core::bail!(
            "fused pooling: window {ph}x{pw} does not fit a {}x{} output",
            geo.oh,
            geo.ow
        )
    }
    Ok(())
}

/// The dot products of [`at_winners`]: a fixed order for given lengths on a given CPU.
trait Dot: WithDType {
    fn dot(a: &[Self], b: &[Self]) -> Self;
}

/// Eight lanes, summed pairwise at the end.
#[inline]
fn dot_lanes<T: WithDType>(a: &[T], b: &[T]) -> T {
    let zero = T::from_f64(0.0);
    let mut acc = [zero; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += *x * *y;
    }
    s
}

impl Dot for f64 {
    fn dot(a: &[f64], b: &[f64]) -> f64 {
        dot_lanes(a, b)
    }
}

impl Dot for f32 {
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            return unsafe { dot_f32_avx2(a, b) };
        }
        dot_lanes(a, b)
    }
}

/// Four 8-lane fused multiply-add accumulators (what gemm's kernels use on this CPU), then
/// the lanes summed in a fixed order and the tail added.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, s) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_ps(pa.add(i + 8 * j));
            let y = _mm256_loadu_ps(pb.add(i + 8 * j));
            *s = _mm256_fmadd_ps(x, y, *s);
        }
        i += 32;
    }
    while i + 8 <= n {
        let x = _mm256_loadu_ps(pa.add(i));
        let y = _mm256_loadu_ps(pb.add(i));
        acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
        i += 8;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
    let mut s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    while i < n {
        s = a[i].mul_add(b[i], s);
        i += 1;
    }
    s
}

fn at_winners_typed<T: Dot>(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &Geom,
    [ph, pw]: [usize; 2],
    winners: &Tensor,
) -> Result<Tensor> {
    let (k_len, opg) = (geo.window(), geo.opg());
    let (poh, pow) = (geo.oh / ph, geo.ow / pw);
    if winners.dtype() != DType::U8 || winners.dims() != [geo.n, geo.cout, poh, pow] {
        candle_core::bail!(
            "fused pooling: winners {:?} {:?}, expected u8 {:?}",
            winners.dtype(),
            winners.dims(),
            [geo.n, geo.cout, poh, pow]
        )
    }
    let zero = T::from_f64(0.0);
    let mut out = vec![zero; geo.n * geo.cout * poh * pow];
    with_bias::<T, _>(bias, geo.cout, |bs| {
        with_slice::<u8, _>(winners, |idx| {
            with_slice::<T, _>(x, |xs| {
                with_slice::<T, _>(w, |ws| {
                    let sample = geo.cin * geo.h * geo.w;
                    let planes = geo.cout * poh * pow;
                    // Samples in parallel, each with one window's cells unfolded at a time (a
                    // buffer per worker; every element is computed the same way on any thread).
                    out.par_chunks_mut(planes.max(1)).enumerate().try_for_each(
                        |(s, outn)| -> Result<()> {
                            let xn = &xs[s * sample..(s + 1) * sample];
                            let idxn = &idx[s * planes..(s + 1) * planes];
                            let mut col = vec![zero; ph * pw * k_len];
                            for g in 0..geo.groups {
                                for py in 0..poh {
                                    for px in 0..pow {
                                        for a in 0..ph {
                                            for b in 0..pw {
                                                let p = (py * ph + a) * geo.ow + px * pw + b;
                                                let at = (a * pw + b) * k_len;
                                                geo.unfold_one(xn, g, p, &mut col[at..at + k_len]);
                                            }
                                        }
                                        for o in 0..opg {
                                            let ch = g * opg + o;
                                            let q = (ch * poh + py) * pow + px;
                                            let cell = idxn[q] as usize;
                                            if cell >= ph * pw {
                                                candle_core::bail!(
                                                    "fused pooling: winner {cell} outside a \
                                                     {ph}x{pw} window"
                                                )
                                            }
                                            let row = &col[cell * k_len..(cell + 1) * k_len];
                                            let wr = &ws[ch * k_len..(ch + 1) * k_len];
                                            // The bias added after, as the epilogue does.
                                            let mut v = T::dot(row, wr);
                                            if let Some(bs) = bs {
                                                v += bs[ch];
                                            }
                                            outn[q] = if v < zero { zero } else { v };
                                        }
                                    }
                                }
                            }
                            Ok(())
                        },
                    )
                })
            })
        })
    })?;
    Tensor::from_vec(out, (geo.n, geo.cout, poh, pow), x.device())
}

/// The max pooling (non-overlapping `window`s, no padding) of a convolution with a ReLU,
/// computed at each window's winning cell only (the winners of [`pool_winners`]): `1 / window`
/// of the convolution's products. Equal to pooling the convolution's output up to rounding (a
/// dot product per element, fused multiply-adds in eight lanes where the CPU has AVX2 and FMA,
/// instead of a matrix product). Scratch: one window's unfolded cells per worker.
pub fn at_winners(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &Geom,
    window: [usize; 2],
    winners: &Tensor,
) -> Result<Tensor> {
    check_fused(geo, window)?;
    match x.dtype() {
        DType::F32 => at_winners_typed::<f32>(x, w, bias, geo, window, winners),
        DType::F64 => at_winners_typed::<f64>(x, w, bias, geo, window, winners),
        other => candle_core::bail!("conv_cpu: dtype {other:?} not supported"),
    }
}
