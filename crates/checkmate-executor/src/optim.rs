//! Optimizers: SGD with momentum and Adam, applied once per step after the plan ran.

use candle_core::Tensor;

use crate::error::{Error, Result, TensorContext};
use crate::executor::Executor;

/// Which update rule [`Optimizer::new`] builds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    /// `v = momentum * v + g; p -= lr * v` (PyTorch's SGD).
    SgdMomentum {
        /// Learning rate.
        lr: f64,
        /// Momentum factor in `[0, 1)`.
        momentum: f64,
    },
    /// Adam with bias correction.
    Adam {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
    },
}

impl OptimizerKind {
    /// SGD with momentum 0.9.
    pub fn sgd(lr: f64) -> OptimizerKind {
        OptimizerKind::SgdMomentum { lr, momentum: 0.9 }
    }

    /// Adam with the usual betas (0.9, 0.999) and eps 1e-8.
    pub fn adam(lr: f64) -> OptimizerKind {
        OptimizerKind::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// An optimizer with its state (momentum or Adam moments) per trainable parameter.
#[derive(Debug)]
pub struct Optimizer {
    kind: OptimizerKind,
    first: Vec<Vec<Option<Tensor>>>,
    second: Vec<Vec<Option<Tensor>>>,
    steps: u64,
}

impl Optimizer {
    /// A fresh optimizer; fails on a non-positive learning rate or out-of-range factors.
    pub fn new(kind: OptimizerKind) -> Result<Optimizer> {
        let ok = match kind {
            OptimizerKind::SgdMomentum { lr, momentum } => {
                lr > 0.0 && lr.is_finite() && (0.0..1.0).contains(&momentum)
            }
            OptimizerKind::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                lr > 0.0
                    && lr.is_finite()
                    && (0.0..1.0).contains(&beta1)
                    && (0.0..1.0).contains(&beta2)
                    && eps > 0.0
            }
        };
        if !ok {
            return Err(Error::Config(format!("invalid optimizer {kind:?}")));
        }
        Ok(Optimizer {
            kind,
            first: Vec::new(),
            second: Vec::new(),
            steps: 0,
        })
    }

    /// Updates every parameter that has a gradient from the last [`Executor::run_plan`].
    ///
    /// On the CPU (f32, f64) the update is fused and in place: one pass over parameter,
    /// gradient and state, allocating nothing but the state on the first step, so the update
    /// adds no parameter-sized temporaries to the step's peak. Elsewhere it runs as tensor ops.
    pub fn step(&mut self, exec: &mut Executor) -> Result<()> {
        self.steps += 1;
        let layers = exec.grads().len();
        if self.first.len() != layers {
            self.first = exec.grads().iter().map(|g| vec![None; g.len()]).collect();
            self.second = self.first.clone();
        }
        let t = self.steps as i32;
        for l in 0..layers {
            for i in 0..exec.grads()[l].len() {
                let Some(g) = exec.grads()[l][i].clone() else {
                    continue;
                };
                let ctx = || format!("optimizer update of layer #{l} parameter #{i}");
                let p = exec.params()[l][i].clone();
                if fused::applies(&p, &g) {
                    let state = |slot: &mut Option<Tensor>| -> Result<Tensor> {
                        if slot.is_none() {
                            *slot = Some(p.zeros_like().ctx(ctx)?);
                        }
                        Ok(slot.clone().expect("state set above"))
                    };
                    match self.kind {
                        OptimizerKind::SgdMomentum { lr, momentum } => {
                            let v = state(&mut self.first[l][i])?;
                            fused::sgd(&p, &v, &g, lr, momentum).ctx(ctx)?;
                        }
                        OptimizerKind::Adam {
                            lr,
                            beta1,
                            beta2,
                            eps,
                        } => {
                            let m = state(&mut self.first[l][i])?;
                            let v = state(&mut self.second[l][i])?;
                            let c1 = 1.0 - beta1.powi(t);
                            let c2 = 1.0 - beta2.powi(t);
                            fused::adam(&p, &m, &v, &g, [lr, beta1, beta2, eps, c1, c2])
                                .ctx(ctx)?;
                        }
                    }
                    continue;
                }
                let new_p = self.unfused(l, i, &p, &g, t).ctx(ctx)?;
                exec.params_mut()[l][i] = new_p;
            }
        }
        Ok(())
    }

    /// The update as tensor ops (devices without the fused kernel): a new parameter tensor.
    fn unfused(
        &mut self,
        l: usize,
        i: usize,
        p: &Tensor,
        g: &Tensor,
        t: i32,
    ) -> candle_core::Result<Tensor> {
        Ok(match self.kind {
            OptimizerKind::SgdMomentum { lr, momentum } => {
                let v = match self.first[l][i].take() {
                    Some(v) => ((v * momentum)? + g)?,
                    None => g.clone(),
                };
                let np = (p - (&v * lr)?)?;
                self.first[l][i] = Some(v);
                np
            }
            OptimizerKind::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                let m = match self.first[l][i].take() {
                    Some(m) => ((m * beta1)? + (g * (1.0 - beta1))?)?,
                    None => (g * (1.0 - beta1))?,
                };
                let g2 = g.sqr()?;
                let v = match self.second[l][i].take() {
                    Some(v) => ((v * beta2)? + (g2 * (1.0 - beta2))?)?,
                    None => (g2 * (1.0 - beta2))?,
                };
                let mhat = (&m / (1.0 - beta1.powi(t)))?;
                let vhat = (&v / (1.0 - beta2.powi(t)))?;
                let upd = mhat.div(&(vhat.sqrt()? + eps)?)?;
                self.first[l][i] = Some(m);
                self.second[l][i] = Some(v);
                (p - (upd * lr)?)?
            }
        })
    }
}

/// The fused in-place updates (CPU): candle `InplaceOp3` kernels that write the state and then
/// the parameter element by element, in the parameter's dtype.
mod fused {
    use candle_core::{CpuStorage, DType, Device, InplaceOp3, Layout, Result, Tensor, WithDType};

    /// Whether the fused kernels take this parameter and gradient.
    pub fn applies(p: &Tensor, g: &Tensor) -> bool {
        matches!(p.device(), Device::Cpu)
            && matches!(p.dtype(), DType::F32 | DType::F64)
            && p.dtype() == g.dtype()
            && p.dims() == g.dims()
            && p.is_contiguous()
            && g.is_contiguous()
    }

    fn span<'a, T>(v: &'a [T], l: &Layout) -> Result<&'a [T]> {
        match l.contiguous_offsets() {
            Some((a, b)) => Ok(&v[a..b]),
            None => candle_core::bail!("fused optimizer: operand is not contiguous"),
        }
    }

    fn span_mut<'a, T>(v: &'a mut [T], l: &Layout) -> Result<&'a mut [T]> {
        match l.contiguous_offsets() {
            Some((a, b)) => Ok(&mut v[a..b]),
            None => candle_core::bail!("fused optimizer: operand is not contiguous"),
        }
    }

    /// `v = momentum * v + g` (in place on `v`, the destination).
    struct Momentum(f64);

    /// `p -= lr * v` (in place on `p`); the third operand is unused (the gradient, for shape).
    struct Descend(f64);

    /// `m = b1 m + (1 - b1) g` on `m` (`.0 = b1`), or `v = b2 v + (1 - b2) g^2` on `v`
    /// (`.1 = true`).
    struct Moment(f64, bool);

    /// `p -= lr * (m / c1) / (sqrt(v / c2) + eps)`: `[lr, eps, c1, c2]`.
    struct AdamStep([f64; 4]);

    fn apply<T: WithDType>(
        name: &str,
        dst: &mut [T],
        a: &[T],
        b: &[T],
        f: impl Fn(T, T, T) -> T,
    ) -> Result<()> {
        if dst.len() != a.len() || dst.len() != b.len() {
            candle_core::bail!(
                "{name}: operands of {} {} {} elements",
                dst.len(),
                a.len(),
                b.len()
            )
        }
        for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
            *d = f(*d, x, y);
        }
        Ok(())
    }

    macro_rules! cpu_op3 {
        ($ty:ty, $name:literal, |$s:ident, $d:ident, $a:ident, $b:ident| $body:expr) => {
            impl InplaceOp3 for $ty {
                fn name(&self) -> &'static str {
                    $name
                }

                fn cpu_fwd(
                    &self,
                    s1: &mut CpuStorage,
                    l1: &Layout,
                    s2: &CpuStorage,
                    l2: &Layout,
                    s3: &CpuStorage,
                    l3: &Layout,
                ) -> Result<()> {
                    fn typed<T: WithDType>(
                        $s: &$ty,
                        dst: &mut [T],
                        a: &[T],
                        b: &[T],
                    ) -> Result<()> {
                        apply($name, dst, a, b, |$d: T, $a: T, $b: T| $body)
                    }
                    match (s1, s2, s3) {
                        (CpuStorage::F32(d), CpuStorage::F32(a), CpuStorage::F32(b)) => {
                            typed(self, span_mut(d, l1)?, span(a, l2)?, span(b, l3)?)
                        }
                        (CpuStorage::F64(d), CpuStorage::F64(a), CpuStorage::F64(b)) => {
                            typed(self, span_mut(d, l1)?, span(a, l2)?, span(b, l3)?)
                        }
                        _ => {
                            candle_core::bail!("{}: needs f32 or f64 operands of one dtype", $name)
                        }
                    }
                }
            }
        };
    }

    cpu_op3!(Momentum, "sgd-momentum", |s, v, g, _unused| {
        T::from_f64(s.0) * v + g
    });
    cpu_op3!(Descend, "sgd-descend", |s, p, v, _unused| p - T::from_f64(
        s.0
    ) * v);
    cpu_op3!(Moment, "adam-moment", |s, m, g, _unused| {
        let b = T::from_f64(s.0);
        let keep = T::from_f64(1.0 - s.0);
        if s.1 {
            b * m + keep * (g * g)
        } else {
            b * m + keep * g
        }
    });
    cpu_op3!(AdamStep, "adam-step", |s, p, m, v| {
        let [lr, eps, c1, c2] = s.0;
        let mhat = m.to_f64() / c1;
        let vhat = v.to_f64() / c2;
        p - T::from_f64(lr * mhat / (vhat.sqrt() + eps))
    });

    /// SGD with momentum in place: `v = momentum v + g`, then `p -= lr v`.
    pub fn sgd(p: &Tensor, v: &Tensor, g: &Tensor, lr: f64, momentum: f64) -> Result<()> {
        v.inplace_op3(g, g, &Momentum(momentum))?;
        p.inplace_op3(v, g, &Descend(lr))
    }

    /// Adam in place: both moments, then the parameter; `k = [lr, beta1, beta2, eps, c1, c2]`
    /// with the bias corrections `c1 = 1 - beta1^t`, `c2 = 1 - beta2^t`.
    pub fn adam(p: &Tensor, m: &Tensor, v: &Tensor, g: &Tensor, k: [f64; 6]) -> Result<()> {
        let [lr, beta1, beta2, eps, c1, c2] = k;
        m.inplace_op3(g, g, &Moment(beta1, false))?;
        v.inplace_op3(g, g, &Moment(beta2, true))?;
        p.inplace_op3(m, v, &AdamStep([lr, eps, c1, c2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(v: &[f64]) -> Tensor {
        Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap()
    }

    fn close(a: &Tensor, b: &[f64]) {
        let a = a.to_vec1::<f64>().unwrap();
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn fused_sgd_and_adam_follow_their_formulas_in_place() {
        let (p0, g) = ([1.0, -2.0, 0.5], [0.1, 0.3, -0.2]);
        let (p, v) = (t(&p0), t(&[0.5, 0.0, -1.0]));
        fused::sgd(&p, &v, &t(&g), 0.1, 0.9).unwrap();
        let want_v = [0.9 * 0.5 + 0.1, 0.3, -0.9 - 0.2];
        close(&v, &want_v);
        let want_p: Vec<f64> = p0.iter().zip(want_v).map(|(p, v)| p - 0.1 * v).collect();
        close(&p, &want_p);

        let (p, m, v) = (t(&p0), t(&[0.0; 3]), t(&[0.0; 3]));
        let (lr, b1, b2, eps) = (0.01, 0.9, 0.999, 1e-8);
        let (c1, c2) = (1.0 - b1, 1.0 - b2);
        fused::adam(&p, &m, &v, &t(&g), [lr, b1, b2, eps, c1, c2]).unwrap();
        let want_m: Vec<f64> = g.iter().map(|g| (1.0 - b1) * g).collect();
        let want_v: Vec<f64> = g.iter().map(|g| (1.0 - b2) * g * g).collect();
        close(&m, &want_m);
        close(&v, &want_v);
        let want_p: Vec<f64> = (0..3)
            .map(|i| p0[i] - lr * (want_m[i] / c1) / ((want_v[i] / c2).sqrt() + eps))
            .collect();
        close(&p, &want_p);
    }
}
