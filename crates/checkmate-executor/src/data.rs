//! A deterministic, learnable synthetic dataset for every loss the zoo has: class templates plus
//! noise (classification), colored region masks (segmentation), token maps (language models).

use candle_core::Tensor;
use checkmate_models::TensorRef;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result, TensorContext};
use crate::executor::{Batch, Executor};

/// What the dataset generates, following the network's input and labels.
#[derive(Debug, Clone)]
enum Task {
    /// `[N]` labels: one random input template per class.
    Classes { templates: Vec<Vec<f64>> },
    /// `[N, positions]` labels on an image: each example is split into four rectangles of random
    /// classes at a random point; every input pixel carries its class's random color (one value
    /// per input channel) plus noise; the label of an output position is the class of the input
    /// region under it (`out_hw` is the prediction's spatial grid).
    Segmentation {
        /// Per input channel, per class.
        colors: Vec<Vec<f64>>,
        out_hw: [usize; 2],
    },
    /// `u32` token input `[N, T]`: random tokens, the label of each position is a fixed random
    /// function of its token.
    Tokens { vocab: usize, map: Vec<u32> },
}

/// A deterministic synthetic dataset: batch `k` is the same on every run, and the labels are a
/// learnable function of the inputs (the loss visibly falls).
///
/// - classification (`[N]` labels): `x = template[label] + noise * u`;
/// - segmentation (`[N, positions]` labels on images): rectangles of class colors plus noise,
///   labels the class of each output position's region;
/// - token inputs (`u32 [N, T]`): random tokens, label `map[token]` per position.
#[derive(Debug, Clone)]
pub struct SyntheticData {
    task: Task,
    example_dims: Vec<usize>,
    label_dims: Vec<usize>,
    batch: usize,
    classes: usize,
    noise: f64,
    seed: u64,
}

/// The spatial grid `[h, w]` of a `[N, C, positions]` prediction: the last rank-4 layer output
/// on its input chain with `h * w == positions` (`[1, positions]` when there is none).
fn prediction_grid(exec: &Executor, positions: usize) -> [usize; 2] {
    let net = exec.network();
    let mut l = net.loss().input;
    loop {
        let layer = net.layer(l);
        if let [_, _, h, w] = *layer.output.shape.dims() {
            if h * w == positions {
                return [h, w];
            }
        }
        match layer.inputs.first() {
            Some(TensorRef::Layer(p)) => l = *p,
            _ => return [1, positions],
        }
    }
}

impl SyntheticData {
    /// A dataset for `exec`'s network, noise amplitude `noise`, drawn from `seed`.
    pub fn new(exec: &Executor, noise: f64, seed: u64) -> Result<SyntheticData> {
        let net = exec.network();
        if !(noise >= 0.0 && noise.is_finite()) {
            return Err(Error::Config(format!(
                "noise {noise} must be finite and >= 0"
            )));
        }
        let dims = net.input().shape.dims();
        let example_dims = dims[1..].to_vec();
        let per: usize = example_dims.iter().product();
        let label_dims = net.loss().labels.shape.dims().to_vec();
        let classes = exec.classes()?;
        if classes == 0 {
            return Err(Error::Config("the loss has no classes".into()));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let task = if let Some(vocab) = exec.input_vocab() {
            if label_dims != dims {
                return Err(Error::Config(format!(
                    "token input {dims:?} needs labels of the same shape, the loss has {label_dims:?}"
                )));
            }
            Task::Tokens {
                vocab,
                map: (0..vocab)
                    .map(|_| rng.gen_range(0..classes as u32))
                    .collect(),
            }
        } else if label_dims.len() == 1 {
            Task::Classes {
                templates: (0..classes)
                    .map(|_| (0..per).map(|_| rng.gen_range(-1.0..1.0)).collect())
                    .collect(),
            }
        } else if label_dims.len() == 2 && dims.len() == 4 {
            Task::Segmentation {
                colors: (0..dims[1])
                    .map(|_| (0..classes).map(|_| rng.gen_range(-1.0..1.0)).collect())
                    .collect(),
                out_hw: prediction_grid(exec, label_dims[1]),
            }
        } else {
            return Err(Error::Config(format!(
                "synthetic data supports [N] labels, [N, positions] labels on [N, C, H, W] images and token inputs; this network has input {dims:?} and labels {label_dims:?}"
            )));
        };
        Ok(SyntheticData {
            task,
            example_dims,
            label_dims,
            batch: dims[0],
            classes,
            noise,
            seed,
        })
    }

    /// Batch number `k` on `exec`'s device and dtype.
    pub fn batch(&self, exec: &Executor, k: u64) -> Result<Batch> {
        let mut rng = ChaCha8Rng::seed_from_u64(
            self.seed ^ (k.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let per: usize = self.example_dims.iter().product();
        let mut dims = vec![self.batch];
        dims.extend_from_slice(&self.example_dims);
        let label_count: usize = self.label_dims.iter().product();
        let mut labels = Vec::with_capacity(label_count);
        let floats = |x: Vec<f64>| {
            Tensor::from_vec(x, dims.clone(), exec.device())
                .and_then(|t| t.to_dtype(exec.dtype()))
                .ctx(|| "synthetic batch".into())
        };
        let input = match &self.task {
            Task::Classes { templates } => {
                let mut x = Vec::with_capacity(self.batch * per);
                for _ in 0..self.batch {
                    let c = rng.gen_range(0..self.classes);
                    labels.push(c as u32);
                    for &t in &templates[c] {
                        let u: f64 = rng.gen_range(-1.0..1.0);
                        x.push(t + self.noise * u);
                    }
                }
                floats(x)?
            }
            Task::Segmentation { colors, out_hw } => {
                let (ch, h, w) = (dims[1], dims[2], dims[3]);
                let mut x = Vec::with_capacity(self.batch * per);
                for _ in 0..self.batch {
                    let split: [f64; 2] = [rng.gen_range(0.25..0.75), rng.gen_range(0.25..0.75)];
                    let quads: [usize; 4] = std::array::from_fn(|_| rng.gen_range(0..self.classes));
                    let class_at = |fy: f64, fx: f64| {
                        quads[usize::from(fy >= split[0]) * 2 + usize::from(fx >= split[1])]
                    };
                    let mut classes = Vec::with_capacity(h * w);
                    for iy in 0..h {
                        for ix in 0..w {
                            classes.push(class_at(
                                (iy as f64 + 0.5) / h as f64,
                                (ix as f64 + 0.5) / w as f64,
                            ));
                        }
                    }
                    for plane in colors.iter().take(ch) {
                        for &cls in &classes {
                            let u: f64 = rng.gen_range(-1.0..1.0);
                            x.push(plane[cls] + self.noise * u);
                        }
                    }
                    let [oh, ow] = *out_hw;
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let cls = class_at(
                                (oy as f64 + 0.5) / oh as f64,
                                (ox as f64 + 0.5) / ow as f64,
                            );
                            labels.push(cls as u32);
                        }
                    }
                }
                floats(x)?
            }
            Task::Tokens { vocab, map } => {
                let ids: Vec<u32> = (0..self.batch * per)
                    .map(|_| rng.gen_range(0..*vocab as u32))
                    .collect();
                labels.extend(ids.iter().map(|&t| map[t as usize]));
                Tensor::from_vec(ids, dims.clone(), exec.device())
                    .ctx(|| "synthetic tokens".into())?
            }
        };
        Ok(Batch {
            input,
            labels: Tensor::from_vec(labels, self.label_dims.clone(), exec.device())
                .ctx(|| "synthetic labels".into())?,
        })
    }
}
