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
    pub fn step(&mut self, exec: &mut Executor) -> Result<()> {
        self.steps += 1;
        let grads: Vec<Vec<Option<Tensor>>> = exec.grads().to_vec();
        if self.first.len() != grads.len() {
            self.first = grads.iter().map(|g| vec![None; g.len()]).collect();
            self.second = self.first.clone();
        }
        let t = self.steps as i32;
        for (l, layer_grads) in grads.iter().enumerate() {
            for (i, g) in layer_grads.iter().enumerate() {
                let Some(g) = g else { continue };
                let p = &exec.params()[l][i];
                let ctx = || format!("optimizer update of layer #{l} parameter #{i}");
                let new_p = match self.kind {
                    OptimizerKind::SgdMomentum { lr, momentum } => {
                        let v = match self.first[l][i].take() {
                            Some(v) => ((v * momentum).ctx(ctx)? + g).ctx(ctx)?,
                            None => g.clone(),
                        };
                        let np = (p - (&v * lr).ctx(ctx)?).ctx(ctx)?;
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
                            Some(m) => {
                                ((m * beta1).ctx(ctx)? + (g * (1.0 - beta1)).ctx(ctx)?).ctx(ctx)?
                            }
                            None => (g * (1.0 - beta1)).ctx(ctx)?,
                        };
                        let g2 = g.sqr().ctx(ctx)?;
                        let v = match self.second[l][i].take() {
                            Some(v) => {
                                ((v * beta2).ctx(ctx)? + (g2 * (1.0 - beta2)).ctx(ctx)?).ctx(ctx)?
                            }
                            None => (g2 * (1.0 - beta2)).ctx(ctx)?,
                        };
                        let mhat = (&m / (1.0 - beta1.powi(t))).ctx(ctx)?;
                        let vhat = (&v / (1.0 - beta2.powi(t))).ctx(ctx)?;
                        let upd = mhat
                            .div(&(vhat.sqrt().ctx(ctx)? + eps).ctx(ctx)?)
                            .ctx(ctx)?;
                        self.first[l][i] = Some(m);
                        self.second[l][i] = Some(v);
                        (p - (upd * lr).ctx(ctx)?).ctx(ctx)?
                    }
                };
                exec.params_mut()[l][i] = new_p;
            }
        }
        Ok(())
    }
}
