//! VGG16, VGG19 (Keras applications) and a multi-layer perceptron.

use crate::error::Result;
use crate::network::{NetworkBuilder, TensorRef};
use crate::op::{Conv2d, Dense, Op, Pool2d};
use crate::shape::{ImageSize, Shape};
use crate::{ModelConfig, Network};

use super::{config_err, network_name};

/// Adds Keras VGG blocks `block1..=blocks` (`convs[b]` 3x3 ReLU convolutions and a 2x2 max pool
/// each) and returns every block's pooled output.
pub(crate) fn vgg_blocks(b: &mut NetworkBuilder, convs: &[usize]) -> Result<Vec<TensorRef>> {
    const FILTERS: [usize; 5] = [64, 128, 256, 512, 512];
    let mut x = b.input();
    let mut levels = Vec::new();
    for (i, &n) in convs.iter().enumerate() {
        for j in 1..=n {
            let conv = Conv2d::new(FILTERS[i], 3).same().relu();
            x = b.layer(format!("block{}_conv{j}", i + 1), Op::Conv2d(conv), x)?;
        }
        x = b.layer(
            format!("block{}_pool", i + 1),
            Op::MaxPool2d(Pool2d::new(2, 2)),
            x,
        )?;
        levels.push(x);
    }
    Ok(levels)
}

fn vgg(model: &str, convs: [usize; 5], config: &ModelConfig) -> Result<Network> {
    config.check_batch(model)?;
    let size = config.image(ImageSize::square(224));
    if size.height < 32 || size.width < 32 {
        return Err(config_err(
            model,
            format!("image size {size} is below the minimum 32"),
        ));
    }
    let shape = Shape::new([
        config.batch,
        config.channels.unwrap_or(3),
        size.height,
        size.width,
    ]);
    let mut b = NetworkBuilder::new(network_name(model, config.batch, size), shape);
    let levels = vgg_blocks(&mut b, &convs)?;
    let x = b.layer("flatten", Op::Flatten, levels[4])?;
    let fc = config.width.unwrap_or(4096);
    if fc == 0 {
        return Err(config_err(
            model,
            "width (fc1/fc2 units) must be at least 1",
        ));
    }
    let x = b.layer("fc1", Op::Dense(Dense::new(fc).relu()), x)?;
    let x = b.layer("fc2", Op::Dense(Dense::new(fc).relu()), x)?;
    let classes = config.classes.unwrap_or(1000);
    let x = b.layer("predictions", Op::Dense(Dense::new(classes).softmax()), x)?;
    b.finish(x, 1)
}

/// VGG16 (Keras `applications.VGG16`, with top): 138,357,544 parameters at 1000 classes.
pub fn vgg16(config: &ModelConfig) -> Result<Network> {
    vgg("vgg16", [2, 2, 3, 3, 3], config)
}

/// VGG19 (Keras `applications.VGG19`, with top): 143,667,240 parameters at 1000 classes.
pub fn vgg19(config: &ModelConfig) -> Result<Network> {
    vgg("vgg19", [2, 2, 4, 4, 4], config)
}

/// A multi-layer perceptron on flattened images: `depth` hidden ReLU layers of `width`, then a
/// softmax classifier. Defaults: 28x28x1 input, 2 x 512 hidden, 10 classes (669,706 parameters).
pub fn mlp(config: &ModelConfig) -> Result<Network> {
    config.check_batch("mlp")?;
    let size = config.image(ImageSize::square(28));
    let depth = config.depth.unwrap_or(2);
    let width = config.width.unwrap_or(512);
    if width == 0 {
        return Err(config_err("mlp", "width must be at least 1"));
    }
    let shape = Shape::new([
        config.batch,
        config.channels.unwrap_or(1),
        size.height,
        size.width,
    ]);
    let mut b = NetworkBuilder::new(network_name("mlp", config.batch, size), shape);
    let mut x = b.layer("flatten", Op::Flatten, b.input())?;
    for i in 1..=depth {
        x = b.layer(format!("fc{i}"), Op::Dense(Dense::new(width).relu()), x)?;
    }
    let classes = config.classes.unwrap_or(10);
    let x = b.layer("predictions", Op::Dense(Dense::new(classes).softmax()), x)?;
    b.finish(x, 1)
}
