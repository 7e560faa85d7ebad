//! A small GPT-style transformer.

use crate::error::Result;
use crate::network::NetworkBuilder;
use crate::op::{Activation, Dense, Op, SelfAttention};
use crate::shape::{DType, Shape, TensorType};
use crate::{ModelConfig, Network};

use super::config_err;

/// A GPT-style decoder on `u32` token ids `[N, T]`: token and learned position embeddings, `depth`
/// pre-norm blocks (layer norm, causal multi-head self-attention, residual add, layer norm, 4x
/// GELU MLP, residual add), a final layer norm and an untied linear head to `classes` logits;
/// per-token cross-entropy. Defaults (nanoGPT's character-level Shakespeare model): depth 6, width
/// 384, 6 heads, 256 tokens, 65 classes.
pub fn transformer(config: &ModelConfig) -> Result<Network> {
    config.check_batch("transformer")?;
    let depth = config.depth.unwrap_or(6);
    let width = config.width.unwrap_or(384);
    let heads = config.heads.unwrap_or(6);
    let seq_len = config.seq_len.unwrap_or(256);
    let vocab = config.classes.unwrap_or(65);
    if width == 0 || heads == 0 || seq_len == 0 || width % heads != 0 {
        return Err(config_err(
            "transformer",
            format!("width {width}, heads {heads}, seq_len {seq_len}: all must be positive and heads must divide width"),
        ));
    }
    let input = TensorType {
        shape: Shape::new([config.batch, seq_len]),
        dtype: DType::U32,
    };
    let name = format!("transformer-b{}-t{seq_len}-d{depth}-w{width}", config.batch);
    let mut b = NetworkBuilder::with_input(name, input);
    let ln = || Op::LayerNorm { epsilon: 1e-5 };
    let x = b.layer("wte", Op::Embedding { vocab, dim: width }, b.input())?;
    let mut x = b.layer("wpe", Op::PositionEmbedding { max_len: seq_len }, x)?;
    for i in 0..depth {
        let h = b.layer(format!("h{i}_ln1"), ln(), x)?;
        let h = b.layer(
            format!("h{i}_attn"),
            Op::SelfAttention(SelfAttention {
                heads,
                causal: true,
            }),
            h,
        )?;
        x = b.add(format!("h{i}_add1"), Op::Add, &[x, h])?;
        let h = b.layer(format!("h{i}_ln2"), ln(), x)?;
        let h = b.layer(format!("h{i}_fc"), Op::Dense(Dense::new(4 * width)), h)?;
        let h = b.layer(format!("h{i}_gelu"), Op::Activation(Activation::Gelu), h)?;
        let h = b.layer(format!("h{i}_proj"), Op::Dense(Dense::new(width)), h)?;
        x = b.add(format!("h{i}_add2"), Op::Add, &[x, h])?;
    }
    let x = b.layer("ln_f", ln(), x)?;
    let head = Dense {
        units: vocab,
        bias: false,
        activation: Activation::Linear,
    };
    let x = b.layer("lm_head", Op::Dense(head), x)?;
    b.finish(x, 2)
}
