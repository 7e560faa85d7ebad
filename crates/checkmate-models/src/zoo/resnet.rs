//! ResNet50 (Keras `applications.ResNet50`, `resnet_common` layer names, with top).

use crate::error::Result;
use crate::network::{NetworkBuilder, TensorRef};
use crate::op::{Activation, BatchNorm, Conv2d, Dense, Op, Pool2d};
use crate::shape::{ImageSize, Shape};
use crate::{ModelConfig, Network};

use super::{config_err, network_name};

const BN: BatchNorm = BatchNorm {
    epsilon: 1.001e-5,
    momentum: 0.99,
};

fn conv_bn(b: &mut NetworkBuilder, name: &str, conv: Conv2d, x: TensorRef) -> Result<TensorRef> {
    let x = b.layer(format!("{name}_conv"), Op::Conv2d(conv), x)?;
    b.layer(format!("{name}_bn"), Op::BatchNorm(BN), x)
}

fn relu(b: &mut NetworkBuilder, name: String, x: TensorRef) -> Result<TensorRef> {
    b.layer(name, Op::Activation(Activation::Relu), x)
}

/// Bottleneck block `name` (Keras `block1`). Layers are added in the order of Checkmate's graph
/// (Keras' depth order): the projection shortcut's conv and BN are interleaved with `_3_*`.
fn block(
    b: &mut NetworkBuilder,
    name: &str,
    x: TensorRef,
    filters: usize,
    stride: usize,
    project: bool,
) -> Result<TensorRef> {
    let y = conv_bn(
        b,
        &format!("{name}_1"),
        Conv2d::new(filters, 1).stride(stride),
        x,
    )?;
    let y = relu(b, format!("{name}_1_relu"), y)?;
    let y = conv_bn(b, &format!("{name}_2"), Conv2d::new(filters, 3).same(), y)?;
    let y = relu(b, format!("{name}_2_relu"), y)?;
    let (shortcut, y) = if project {
        let s = b.layer(
            format!("{name}_0_conv"),
            Op::Conv2d(Conv2d::new(4 * filters, 1).stride(stride)),
            x,
        )?;
        let y = b.layer(
            format!("{name}_3_conv"),
            Op::Conv2d(Conv2d::new(4 * filters, 1)),
            y,
        )?;
        let s = b.layer(format!("{name}_0_bn"), Op::BatchNorm(BN), s)?;
        let y = b.layer(format!("{name}_3_bn"), Op::BatchNorm(BN), y)?;
        (s, y)
    } else {
        (
            x,
            conv_bn(b, &format!("{name}_3"), Conv2d::new(4 * filters, 1), y)?,
        )
    };
    let y = b.add(format!("{name}_add"), Op::Add, &[shortcut, y])?;
    relu(b, format!("{name}_out"), y)
}

/// ResNet50: 25,636,712 parameters at 1000 classes (53,120 of them batch-norm running statistics).
pub fn resnet50(config: &ModelConfig) -> Result<Network> {
    config.check_batch("resnet50")?;
    let size = config.image(ImageSize::square(224));
    if size.height < 32 || size.width < 32 {
        return Err(config_err(
            "resnet50",
            format!("image size {size} is below the minimum 32"),
        ));
    }
    let shape = Shape::new([
        config.batch,
        config.channels.unwrap_or(3),
        size.height,
        size.width,
    ]);
    let mut b = NetworkBuilder::new(network_name("resnet50", config.batch, size), shape);
    let x = b.layer(
        "conv1_pad",
        Op::ZeroPadding2d { padding: [3; 4] },
        b.input(),
    )?;
    let x = conv_bn(&mut b, "conv1", Conv2d::new(64, 7).stride(2), x)?;
    let x = relu(&mut b, "conv1_relu".into(), x)?;
    let x = b.layer("pool1_pad", Op::ZeroPadding2d { padding: [1; 4] }, x)?;
    let mut x = b.layer("pool1_pool", Op::MaxPool2d(Pool2d::new(3, 2)), x)?;
    for (stage, filters, blocks, stride) in [
        (2, 64, 3, 1),
        (3, 128, 4, 2),
        (4, 256, 6, 2),
        (5, 512, 3, 2),
    ] {
        for i in 1..=blocks {
            let s = if i == 1 { stride } else { 1 };
            x = block(
                &mut b,
                &format!("conv{stage}_block{i}"),
                x,
                filters,
                s,
                i == 1,
            )?;
        }
    }
    let x = b.layer("avg_pool", Op::GlobalAvgPool2d, x)?;
    let classes = config.classes.unwrap_or(1000);
    let x = b.layer("probs", Op::Dense(Dense::new(classes).softmax()), x)?;
    b.finish(x, 1)
}
