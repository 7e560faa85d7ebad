//! keras_segmentation's `vgg_unet`, `fcn_8_vgg` and `segnet` (vanilla encoder).
//!
//! Unnamed layers get Keras' automatic names from a fresh session (`conv2d`, `conv2d_1`, ...).
//! Every model ends like `get_segmentation_model`: a reshape to `[N, classes, positions]` and a
//! softmax over the classes, with a per-pixel cross-entropy loss at the output resolution.

use crate::error::Result;
use crate::network::{NetworkBuilder, TensorRef};
use crate::op::{Activation, BatchNorm, Conv2d, ConvTranspose2d, Op, Pool2d};
use crate::shape::{ImageSize, Shape};
use crate::{ModelConfig, Network};

use super::classic::vgg_blocks;
use super::{config_err, network_name, Namer};

/// Default classes of the segmentation models: 19, as in Checkmate's graphs.
const SEGMENTATION_CLASSES: usize = 19;

fn start(model: &str, config: &ModelConfig) -> Result<(NetworkBuilder, usize)> {
    config.check_batch(model)?;
    let size = config.image(ImageSize::new(416, 608));
    if size.height % 32 != 0 || size.width % 32 != 0 {
        return Err(config_err(
            model,
            format!(
                "image size {size}: height and width must be multiples of 32 (keras_segmentation)"
            ),
        ));
    }
    let shape = Shape::new([
        config.batch,
        config.channels.unwrap_or(3),
        size.height,
        size.width,
    ]);
    let b = NetworkBuilder::new(network_name(model, config.batch, size), shape);
    Ok((b, config.classes.unwrap_or(SEGMENTATION_CLASSES)))
}

/// Reshape to `[N, classes, H*W]`, softmax over the classes, loss.
fn segmentation_head(mut b: NetworkBuilder, names: &mut Namer, o: TensorRef) -> Result<Network> {
    let dims = b.shape(o).expect("o is in the network").dims().to_vec();
    let o = b.layer(
        names.next("reshape"),
        Op::Reshape {
            dims: vec![dims[1], dims[2] * dims[3]],
        },
        o,
    )?;
    let o = b.layer(
        names.next("activation"),
        Op::Activation(Activation::Softmax),
        o,
    )?;
    b.finish(o, 1)
}

fn pad1(b: &mut NetworkBuilder, names: &mut Namer, x: TensorRef) -> Result<TensorRef> {
    b.layer(
        names.next("zero_padding2d"),
        Op::ZeroPadding2d { padding: [1; 4] },
        x,
    )
}

fn bn(b: &mut NetworkBuilder, names: &mut Namer, x: TensorRef) -> Result<TensorRef> {
    b.layer(
        names.next("batch_normalization"),
        Op::BatchNorm(BatchNorm::default()),
        x,
    )
}

fn up2(b: &mut NetworkBuilder, names: &mut Namer, x: TensorRef) -> Result<TensorRef> {
    b.layer(
        names.next("up_sampling2d"),
        Op::UpSampling2d { scale: [2, 2] },
        x,
    )
}

fn conv(b: &mut NetworkBuilder, names: &mut Namer, c: Conv2d, x: TensorRef) -> Result<TensorRef> {
    b.layer(names.next("conv2d"), Op::Conv2d(c), x)
}

/// keras_segmentation `vgg_unet`: the VGG16 encoder up to `block4_pool` (block 5 does not reach the
/// output, so Keras drops it), three upsampling stages with skip connections to `block3_pool`,
/// `block2_pool`, `block1_pool`, output at half the input resolution. Decoder convolutions are
/// `valid` after a 1-pixel zero padding, with ReLU, each followed by batch norm.
pub fn unet(config: &ModelConfig) -> Result<Network> {
    let (mut b, classes) = start("unet", config)?;
    let mut names = Namer::default();
    let levels = vgg_blocks(&mut b, &[2, 2, 3, 3])?;
    let mut o = levels[3];
    for (filters, skip) in [
        (512, None),
        (256, Some(levels[2])),
        (128, Some(levels[1])),
        (64, Some(levels[0])),
    ] {
        if let Some(skip) = skip {
            o = up2(&mut b, &mut names, o)?;
            o = b.add(
                names.next("concatenate"),
                Op::Concat { axis: 1 },
                &[o, skip],
            )?;
        }
        o = pad1(&mut b, &mut names, o)?;
        o = conv(&mut b, &mut names, Conv2d::new(filters, 3).relu(), o)?;
        o = bn(&mut b, &mut names, o)?;
    }
    let o = conv(&mut b, &mut names, Conv2d::new(classes, 3).same(), o)?;
    segmentation_head(b, &mut names, o)
}

/// keras_segmentation `fcn_8_vgg`: the VGG16 encoder, 7x7 and 1x1 4096-channel ReLU convolutions
/// with dropout 0.5, class scores upsampled by transposed convolutions (4x4 stride 2, 4x4 stride
/// 2, 16x16 stride 8, no bias), cropped (`Cropping2D`, width then height) to the 1x1 class-score
/// convolutions of `block4_pool` and `block3_pool` and added. The output is larger than the input
/// (424x616 for 416x608), as in keras_segmentation.
pub fn fcn8(config: &ModelConfig) -> Result<Network> {
    let (mut b, classes) = start("fcn8", config)?;
    let mut names = Namer::default();
    let levels = vgg_blocks(&mut b, &[2, 2, 3, 3, 3])?;
    let mut o = levels[4];
    let fc = config.width.unwrap_or(4096);
    if fc == 0 {
        return Err(config_err(
            "fcn8",
            "width (fc6/fc7 filters) must be at least 1",
        ));
    }
    o = conv(&mut b, &mut names, Conv2d::new(fc, 7).same().relu(), o)?;
    o = b.layer(names.next("dropout"), Op::Dropout { rate: 0.5 }, o)?;
    o = conv(&mut b, &mut names, Conv2d::new(fc, 1).same().relu(), o)?;
    o = b.layer(names.next("dropout"), Op::Dropout { rate: 0.5 }, o)?;
    o = conv(&mut b, &mut names, Conv2d::new(classes, 1), o)?;
    let up = |b: &mut NetworkBuilder, names: &mut Namer, k, s, o| {
        b.layer(
            names.next("conv2d_transpose"),
            Op::ConvTranspose2d(ConvTranspose2d::new(classes, k, s).no_bias()),
            o,
        )
    };
    // Crops `o` to the spatial size of `skip` (the upsampled scores are always the larger).
    let crop =
        |b: &mut NetworkBuilder, names: &mut Namer, o: TensorRef, skip: TensorRef, axis: usize| {
            let have = b.shape(o).expect("in the network").dim(axis);
            let want = b.shape(skip).expect("in the network").dim(axis);
            if have < want {
                return Err(config_err(
                    "fcn8",
                    "upsampled scores smaller than the skip connection",
                ));
            }
            let mut cropping = [0; 4];
            cropping[if axis == 3 { 3 } else { 1 }] = have - want;
            b.layer(names.next("cropping2d"), Op::Cropping2d { cropping }, o)
        };
    // Stage 1 (Checkmate's order: both crops, then the skip's 1x1 convolution).
    o = up(&mut b, &mut names, 4, 2, o)?;
    o = crop(&mut b, &mut names, o, levels[3], 3)?;
    o = crop(&mut b, &mut names, o, levels[3], 2)?;
    let s = conv(&mut b, &mut names, Conv2d::new(classes, 1), levels[3])?;
    o = b.add(names.next("add"), Op::Add, &[o, s])?;
    // Stage 2 (Checkmate's order: width crop, the skip's convolution, height crop).
    o = up(&mut b, &mut names, 4, 2, o)?;
    o = crop(&mut b, &mut names, o, levels[2], 3)?;
    let s = conv(&mut b, &mut names, Conv2d::new(classes, 1), levels[2])?;
    o = crop(&mut b, &mut names, o, levels[2], 2)?;
    o = b.add(names.next("add"), Op::Add, &[s, o])?;
    o = up(&mut b, &mut names, 16, 8, o)?;
    segmentation_head(b, &mut names, o)
}

/// keras_segmentation `segnet` with its vanilla encoder (1-pixel zero padding, `valid` 3x3
/// convolution, batch norm, ReLU, 2x2 max pool; 64, 128, 256, 256 channels up to encoder level 3),
/// and the SegNet decoder (512, 256, 128, 64 channels, linear convolutions with batch norm),
/// output at half the input resolution.
pub fn segnet(config: &ModelConfig) -> Result<Network> {
    let (mut b, classes) = start("segnet", config)?;
    let mut names = Namer::default();
    let mut o = b.input();
    for filters in [64, 128, 256, 256] {
        o = pad1(&mut b, &mut names, o)?;
        o = conv(&mut b, &mut names, Conv2d::new(filters, 3), o)?;
        o = bn(&mut b, &mut names, o)?;
        o = b.layer(
            names.next("activation"),
            Op::Activation(Activation::Relu),
            o,
        )?;
        o = b.layer(
            names.next("max_pooling2d"),
            Op::MaxPool2d(Pool2d::new(2, 2)),
            o,
        )?;
    }
    for (i, filters) in [512, 256, 128, 64].into_iter().enumerate() {
        if i > 0 {
            o = up2(&mut b, &mut names, o)?;
        }
        o = pad1(&mut b, &mut names, o)?;
        o = conv(&mut b, &mut names, Conv2d::new(filters, 3), o)?;
        o = bn(&mut b, &mut names, o)?;
    }
    let o = conv(&mut b, &mut names, Conv2d::new(classes, 3).same(), o)?;
    segmentation_head(b, &mut names, o)
}
