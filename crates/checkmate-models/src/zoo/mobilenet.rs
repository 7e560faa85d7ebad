//! MobileNet v1 (Keras `applications.MobileNet`, alpha 1, depth multiplier 1, with top).

use crate::error::Result;
use crate::network::{NetworkBuilder, TensorRef};
use crate::op::{Activation, BatchNorm, Conv2d, Op};
use crate::shape::{ImageSize, Shape};
use crate::{ModelConfig, Network};

use super::{config_err, network_name};

fn bn_relu6(b: &mut NetworkBuilder, name: &str, x: TensorRef) -> Result<TensorRef> {
    let x = b.layer(format!("{name}_bn"), Op::BatchNorm(BatchNorm::default()), x)?;
    b.layer(format!("{name}_relu"), Op::Activation(Activation::Relu6), x)
}

/// MobileNet v1, alpha 1: 4,253,864 parameters at 1000 classes (21,888 of them batch-norm running
/// statistics). ReLU6 activations, `conv_pad_*` before strided depthwise convolutions, a 1x1
/// convolution as classifier, as in Keras.
pub fn mobilenet(config: &ModelConfig) -> Result<Network> {
    config.check_batch("mobilenet")?;
    let size = config.image(ImageSize::square(224));
    if size.height < 32 || size.width < 32 {
        return Err(config_err(
            "mobilenet",
            format!("image size {size} is below the minimum 32"),
        ));
    }
    let shape = Shape::new([
        config.batch,
        config.channels.unwrap_or(3),
        size.height,
        size.width,
    ]);
    let mut b = NetworkBuilder::new(network_name("mobilenet", config.batch, size), shape);
    let pad = |b: &mut NetworkBuilder, name: String, x| {
        b.layer(
            name,
            Op::ZeroPadding2d {
                padding: [0, 1, 0, 1],
            },
            x,
        )
    };
    let x = pad(&mut b, "conv1_pad".into(), TensorRef::Input)?;
    let x = b.layer(
        "conv1",
        Op::Conv2d(Conv2d::new(32, 3).stride(2).no_bias()),
        x,
    )?;
    let mut x = bn_relu6(&mut b, "conv1", x)?;
    let blocks: [(usize, usize); 13] = [
        (64, 1),
        (128, 2),
        (128, 1),
        (256, 2),
        (256, 1),
        (512, 2),
        (512, 1),
        (512, 1),
        (512, 1),
        (512, 1),
        (512, 1),
        (1024, 2),
        (1024, 1),
    ];
    for (i, &(filters, stride)) in blocks.iter().enumerate() {
        let id = i + 1;
        let channels = b.shape(x).expect("x is in the network").dim(1);
        let mut dw = Conv2d::depthwise(channels, 1, 3).stride(stride);
        if stride == 1 {
            dw = dw.same();
        } else {
            x = pad(&mut b, format!("conv_pad_{id}"), x)?;
        }
        x = b.layer(format!("conv_dw_{id}"), Op::Conv2d(dw), x)?;
        x = bn_relu6(&mut b, &format!("conv_dw_{id}"), x)?;
        let pw = Conv2d::new(filters, 1).same().no_bias();
        x = b.layer(format!("conv_pw_{id}"), Op::Conv2d(pw), x)?;
        x = bn_relu6(&mut b, &format!("conv_pw_{id}"), x)?;
    }
    let x = b.layer("global_average_pooling2d", Op::GlobalAvgPool2d, x)?;
    let x = b.layer(
        "reshape_1",
        Op::Reshape {
            dims: vec![1024, 1, 1],
        },
        x,
    )?;
    let x = b.layer("dropout", Op::Dropout { rate: 1e-3 }, x)?;
    let classes = config.classes.unwrap_or(1000);
    let x = b.layer("conv_preds", Op::Conv2d(Conv2d::new(classes, 1).same()), x)?;
    let x = b.layer(
        "reshape_2",
        Op::Reshape {
            dims: vec![classes],
        },
        x,
    )?;
    let x = b.layer("act_softmax", Op::Activation(Activation::Softmax), x)?;
    b.finish(x, 1)
}
