//! A deterministic, learnable synthetic dataset: one random template per class plus noise.

use candle_core::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result, TensorContext};
use crate::executor::{Batch, Executor};

/// Class templates plus Gaussian-ish noise: example `x = template[label] + noise * u`, with labels
/// and noise drawn from a seed per batch, so batch `k` is the same on every run.
#[derive(Debug, Clone)]
pub struct SyntheticData {
    templates: Vec<Vec<f64>>,
    example_dims: Vec<usize>,
    batch: usize,
    classes: usize,
    noise: f64,
    seed: u64,
}

impl SyntheticData {
    /// A dataset for `exec`'s network ([N, C] predictions), noise amplitude `noise`.
    pub fn new(exec: &Executor, noise: f64, seed: u64) -> Result<SyntheticData> {
        let net = exec.network();
        if net.loss().labels.shape.rank() != 1 {
            return Err(Error::Config(
                "synthetic data supports classification ([N] labels) only so far".into(),
            ));
        }
        if !(noise >= 0.0 && noise.is_finite()) {
            return Err(Error::Config(format!(
                "noise {noise} must be finite and >= 0"
            )));
        }
        let dims = net.input().shape.dims();
        let example_dims = dims[1..].to_vec();
        let per: usize = example_dims.iter().product();
        let classes = exec.classes()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let templates = (0..classes)
            .map(|_| (0..per).map(|_| rng.gen_range(-1.0..1.0)).collect())
            .collect();
        Ok(SyntheticData {
            templates,
            example_dims,
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
        let mut x = Vec::with_capacity(self.batch * per);
        let mut labels = Vec::with_capacity(self.batch);
        for _ in 0..self.batch {
            let c = rng.gen_range(0..self.classes);
            labels.push(c as u32);
            for &t in &self.templates[c] {
                let u: f64 = rng.gen_range(-1.0..1.0);
                x.push(t + self.noise * u);
            }
        }
        let mut dims = vec![self.batch];
        dims.extend_from_slice(&self.example_dims);
        Ok(Batch {
            input: Tensor::from_vec(x, dims, exec.device())
                .and_then(|t| t.to_dtype(exec.dtype()))
                .ctx(|| "synthetic batch".into())?,
            labels: Tensor::from_vec(labels, self.batch, exec.device())
                .ctx(|| "synthetic labels".into())?,
        })
    }
}
