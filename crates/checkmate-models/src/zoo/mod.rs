//! The model zoo: Keras-applications and keras_segmentation networks with their exact layer
//! structure and parameter counts, plus an MLP and a small GPT-style transformer.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::network::Network;
use crate::shape::ImageSize;

mod classic;
mod mobilenet;
mod resnet;
mod segmentation;
mod sequence;

pub use classic::{mlp, vgg16, vgg19};
pub use mobilenet::mobilenet;
pub use resnet::resnet50;
pub use segmentation::{fcn8, segnet, unet};
pub use sequence::transformer;

/// Names accepted by [`model_by_name`].
pub const MODEL_NAMES: &[&str] = &[
    "vgg16",
    "vgg19",
    "mobilenet",
    "resnet50",
    "unet",
    "fcn8",
    "segnet",
    "mlp",
    "transformer",
];

/// Size parameters of a zoo model. `None` takes the model's default (see the field docs
/// and docs/MODELS.md); fields a model does not use are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// Examples per batch.
    pub batch: usize,
    /// Input image size (image models). Defaults: 224 (classifiers), 416x608 (segmentation), 28
    /// (mlp).
    pub image_size: Option<ImageSize>,
    /// Input channels (image models). Default 3 (mlp: 1).
    pub channels: Option<usize>,
    /// Classes (vocabulary for the transformer). Defaults: 1000 (classifiers), 19 (segmentation,
    /// as Checkmate's graphs), 10 (mlp), 65 (transformer).
    pub classes: Option<usize>,
    /// Hidden layers (mlp, default 2) or transformer blocks (default 6).
    pub depth: Option<usize>,
    /// Hidden width (mlp, default 512), model width (transformer, default 384), units of fc1/fc2
    /// (vgg16/vgg19, default 4096) or filters of fc6/fc7 (fcn8, default 4096); for small test
    /// and CPU versions of those models.
    pub width: Option<usize>,
    /// Attention heads (transformer, default 6).
    pub heads: Option<usize>,
    /// Sequence length (transformer, default 256).
    pub seq_len: Option<usize>,
}

impl ModelConfig {
    /// Defaults for everything but the batch size.
    pub fn new(batch: usize) -> ModelConfig {
        ModelConfig {
            batch,
            image_size: None,
            channels: None,
            classes: None,
            depth: None,
            width: None,
            heads: None,
            seq_len: None,
        }
    }

    /// Sets the image size.
    pub fn with_image_size(mut self, size: ImageSize) -> ModelConfig {
        self.image_size = Some(size);
        self
    }

    /// Sets the number of classes.
    pub fn with_classes(mut self, classes: usize) -> ModelConfig {
        self.classes = Some(classes);
        self
    }

    pub(crate) fn check_batch(&self, model: &str) -> Result<()> {
        if self.batch == 0 {
            return Err(config_err(model, "batch must be at least 1"));
        }
        if let Some(0) = self.classes {
            return Err(config_err(model, "classes must be at least 1"));
        }
        Ok(())
    }

    pub(crate) fn image(&self, default: ImageSize) -> ImageSize {
        self.image_size.unwrap_or(default)
    }
}

pub(crate) fn config_err(model: &str, message: impl Into<String>) -> Error {
    Error::Config {
        model: model.into(),
        message: message.into(),
    }
}

/// The network name the zoo gives: `model-bBATCH-SIZE`.
pub(crate) fn network_name(model: &str, batch: usize, size: impl std::fmt::Display) -> String {
    format!("{model}-b{batch}-{size}")
}

/// Builds a zoo model by name (one of [`MODEL_NAMES`]).
pub fn model_by_name(name: &str, config: &ModelConfig) -> Result<Network> {
    match name {
        "vgg16" => vgg16(config),
        "vgg19" => vgg19(config),
        "mobilenet" => mobilenet(config),
        "resnet50" => resnet50(config),
        "unet" => unet(config),
        "fcn8" => fcn8(config),
        "segnet" => segnet(config),
        "mlp" => mlp(config),
        "transformer" => transformer(config),
        _ => Err(Error::UnknownModel {
            name: name.into(),
            known: MODEL_NAMES.join(", "),
        }),
    }
}

/// Keras-style automatic layer names: `conv2d`, `conv2d_1`, `conv2d_2`, ...
#[derive(Debug, Default)]
pub(crate) struct Namer(HashMap<&'static str, usize>);

impl Namer {
    pub(crate) fn next(&mut self, base: &'static str) -> String {
        let n = self.0.entry(base).or_insert(0);
        let name = if *n == 0 {
            base.to_string()
        } else {
            format!("{base}_{n}")
        };
        *n += 1;
        name
    }
}
