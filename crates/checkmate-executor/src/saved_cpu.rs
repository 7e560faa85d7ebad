//! The compact saved state of operator-level training graphs (docs/OP_GRAPHS.md), on the CPU:
//! a ReLU's mask as bits (`ceil(n / 8)` bytes, the only allocation), and the masked gradient formed
//! from it in one pass. Max-pooling winners are in [`crate::kernels::max_pool2d_indices`].

use candle_core::{DType, Result, Tensor, WithDType};
use checkmate_models::Activation;

use crate::conv_cpu::with_slice;

/// Whether bit `i` of a packed mask is set (bit `i % 8` of byte `i / 8`).
#[inline]
pub fn bit(mask: &[u8], i: usize) -> bool {
    mask[i / 8] >> (i % 8) & 1 == 1
}

/// Where `act` passes its gradient, from its output `y`: `0 < y` for ReLU, `0 < y < 6` for
/// ReLU6. Other activations have no mask.
fn passes(act: Activation) -> Result<fn(f64) -> bool> {
    Ok(match act {
        Activation::Relu => |y| y > 0.0,
        Activation::Relu6 => |y| y > 0.0 && y < 6.0,
        other => candle_core::bail!("no gradient mask for activation {}", other.name()),
    })
}

/// The gradient mask of activation `act` from its output `y`, packed 8 elements to a byte: a
/// one-dimensional `u8` tensor of `ceil(elements / 8)` bytes.
pub fn activation_mask(y: &Tensor, act: Activation) -> Result<Tensor> {
    fn run<T: WithDType>(y: &Tensor, pass: fn(f64) -> bool) -> Result<Tensor> {
        with_slice::<T, _>(y, |ys| {
            let mut bits = vec![0u8; ys.len().div_ceil(8)];
            for (byte, chunk) in bits.iter_mut().zip(ys.chunks(8)) {
                for (j, v) in chunk.iter().enumerate() {
                    if pass(v.to_f64()) {
                        *byte |= 1 << j;
                    }
                }
            }
            let len = bits.len();
            Tensor::from_vec(bits, len, y.device())
        })
    }
    let pass = passes(act)?;
    match y.dtype() {
        DType::F32 => run::<f32>(y, pass),
        DType::F64 => run::<f64>(y, pass),
        other => candle_core::bail!("activation mask: dtype {other:?} not supported"),
    }
}

/// `g` where the mask passes the gradient, 0 elsewhere (the gradient of a ReLU's input from that
/// of its output): the result is the only allocation.
pub fn mask_backward(g: &Tensor, mask: &Tensor) -> Result<Tensor> {
    mask_backward_sum(std::slice::from_ref(g), mask)
}

/// [`mask_backward`] of the sum of `parts` (added in order, as [`crate::kernels::sum_in_order`]
/// does, so the same bits) in one pass: the result is the only allocation.
pub fn mask_backward_sum(parts: &[Tensor], mask: &Tensor) -> Result<Tensor> {
    fn run<T: WithDType>(parts: &[Tensor], mask: &[u8]) -> Result<Tensor> {
        let first = &parts[0];
        let mut out: Vec<T> = with_slice::<T, _>(first, |s| Ok(s.to_vec()))?;
        for p in &parts[1..] {
            with_slice::<T, _>(p, |s| {
                for (o, &v) in out.iter_mut().zip(s) {
                    *o += v;
                }
                Ok(())
            })?;
        }
        let zero = T::from_f64(0.0);
        for (i, o) in out.iter_mut().enumerate() {
            if !bit(mask, i) {
                *o = zero;
            }
        }
        Tensor::from_vec(out, first.dims(), first.device())
    }
    let Some(first) = parts.first() else {
        candle_core::bail!("mask backward of no gradients")
    };
    for p in parts {
        if p.dims() != first.dims() || p.dtype() != first.dtype() {
            candle_core::bail!(
                "mask backward: gradients of shapes {:?} and {:?} ({:?}, {:?})",
                first.dims(),
                p.dims(),
                first.dtype(),
                p.dtype()
            )
        }
    }
    check_mask(mask, first.elem_count())?;
    with_slice::<u8, _>(mask, |bits| match first.dtype() {
        DType::F32 => run::<f32>(parts, bits),
        DType::F64 => run::<f64>(parts, bits),
        other => candle_core::bail!("mask backward: dtype {other:?} not supported"),
    })
}

/// Checks that `mask` is a packed mask with one bit per element of a tensor of `elements`.
pub fn check_mask(mask: &Tensor, elements: usize) -> Result<()> {
    if mask.dtype() != DType::U8 || mask.elem_count() != elements.div_ceil(8) {
        candle_core::bail!(
            "mask of {} {:?} bytes for a tensor of {elements} elements",
            mask.elem_count(),
            mask.dtype(),
        )
    }
    Ok(())
}
