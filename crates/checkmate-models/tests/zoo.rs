//! Parameter counts of the zoo, configuration handling and shape-inference errors.

use checkmate_models::{
    model_by_name, Conv2d, Dense, Error, ImageSize, ModelConfig, NetworkBuilder, Op, Pool2d, Shape,
    MODEL_NAMES,
};

fn params(model: &str, config: &ModelConfig) -> u64 {
    model_by_name(model, config)
        .unwrap_or_else(|e| panic!("{model}: {e}"))
        .param_count()
}

/// Keras parameter count of a convolution.
fn conv(cin: u64, cout: u64, k: u64) -> u64 {
    cin * cout * k * k + cout
}

/// Keras parameter count of a batch norm (gamma, beta, moving mean and variance).
fn bn(c: u64) -> u64 {
    4 * c
}

fn vgg16_encoder() -> u64 {
    conv(3, 64, 3)
        + conv(64, 64, 3)
        + conv(64, 128, 3)
        + conv(128, 128, 3)
        + conv(128, 256, 3)
        + 2 * conv(256, 256, 3)
        + conv(256, 512, 3)
        + 2 * conv(512, 512, 3)
}

#[test]
fn keras_applications_parameter_counts() {
    let c = ModelConfig::new(1);
    assert_eq!(params("vgg16", &c), 138_357_544);
    assert_eq!(params("vgg19", &c), 143_667_240);
    assert_eq!(params("mobilenet", &c), 4_253_864);
    assert_eq!(params("resnet50", &c), 25_636_712);
    let trainable = |m| model_by_name(m, &c).unwrap().trainable_param_count();
    assert_eq!(trainable("mobilenet"), 4_231_976);
    assert_eq!(trainable("resnet50"), 25_583_592);
}

#[test]
fn parameter_counts_do_not_depend_on_batch_but_on_classes() {
    let c = ModelConfig::new(7).with_classes(10);
    assert_eq!(params("vgg16", &c), 138_357_544 - 4097 * 990);
    assert_eq!(params("resnet50", &c), 25_636_712 - 2049 * 990);
}

#[test]
fn keras_segmentation_parameter_counts() {
    let k = 19u64;
    let c = ModelConfig::new(2).with_classes(19);
    let unet = vgg16_encoder()
        + conv(512, 512, 3)
        + bn(512)
        + conv(768, 256, 3)
        + bn(256)
        + conv(384, 128, 3)
        + bn(128)
        + conv(192, 64, 3)
        + bn(64)
        + conv(64, k, 3);
    assert_eq!(params("unet", &c), unet);
    let fcn8 = vgg16_encoder()
        + 3 * conv(512, 512, 3)
        + conv(512, 4096, 7)
        + conv(4096, 4096, 1)
        + conv(4096, k, 1)
        + k * k * 16
        + conv(512, k, 1)
        + k * k * 16
        + conv(256, k, 1)
        + k * k * 256;
    assert_eq!(params("fcn8", &c), fcn8);
    let segnet = conv(3, 64, 3)
        + bn(64)
        + conv(64, 128, 3)
        + bn(128)
        + conv(128, 256, 3)
        + bn(256)
        + conv(256, 256, 3)
        + bn(256)
        + conv(256, 512, 3)
        + bn(512)
        + conv(512, 256, 3)
        + bn(256)
        + conv(256, 128, 3)
        + bn(128)
        + conv(128, 64, 3)
        + bn(64)
        + conv(64, k, 3);
    assert_eq!(params("segnet", &c), segnet);
}

#[test]
fn mlp_and_transformer_parameter_counts() {
    assert_eq!(params("mlp", &ModelConfig::new(4)), 669_706);
    let (v, t, w, d) = (65u64, 256u64, 384u64, 6u64);
    let block =
        2 * w + (3 * w * w + 3 * w) + (w * w + w) + 2 * w + (w * 4 * w + 4 * w) + (4 * w * w + w);
    let expected = v * w + t * w + d * block + 2 * w + w * v;
    assert_eq!(params("transformer", &ModelConfig::new(4)), expected);
    let mut c = ModelConfig::new(2);
    c.depth = Some(2);
    c.width = Some(64);
    c.heads = Some(4);
    c.seq_len = Some(32);
    let net = model_by_name("transformer", &c).unwrap();
    assert_eq!(
        net.layers().last().unwrap().output.shape,
        Shape::new([2, 32, 65])
    );
    assert_eq!(net.loss().labels.shape, Shape::new([2, 32]));
    assert!(net.loss().from_logits);
}

#[test]
fn every_model_builds_with_defaults() {
    for &m in MODEL_NAMES {
        let net = model_by_name(m, &ModelConfig::new(2)).unwrap_or_else(|e| panic!("{m}: {e}"));
        assert!(net.name().starts_with(m));
        assert_eq!(net.batch(), 2);
    }
}

#[test]
fn segmentation_outputs_and_labels() {
    let c = ModelConfig::new(2).with_classes(5);
    let unet = model_by_name("unet", &c).unwrap();
    assert_eq!(unet.loss().labels.shape, Shape::new([2, 208 * 304]));
    assert!(!unet.loss().from_logits);
    let fcn8 = model_by_name("fcn8", &c).unwrap();
    assert_eq!(fcn8.loss().labels.shape, Shape::new([2, 424 * 616]));
    let segnet = model_by_name("segnet", &c.with_image_size(ImageSize::square(224))).unwrap();
    assert_eq!(segnet.loss().labels.shape, Shape::new([2, 112 * 112]));
}

#[test]
fn configuration_errors_are_clear() {
    let e = model_by_name("alexnet", &ModelConfig::new(1)).unwrap_err();
    assert!(matches!(e, Error::UnknownModel { .. }));
    assert!(e.to_string().contains("vgg16, vgg19"), "{e}");
    let e = model_by_name(
        "unet",
        &ModelConfig::new(1).with_image_size(ImageSize::square(100)),
    )
    .unwrap_err();
    assert!(e.to_string().contains("multiples of 32"), "{e}");
    let e = model_by_name("vgg16", &ModelConfig::new(0)).unwrap_err();
    assert!(e.to_string().contains("batch"), "{e}");
    let mut c = ModelConfig::new(1);
    c.heads = Some(5);
    let e = model_by_name("transformer", &c).unwrap_err();
    assert!(e.to_string().contains("heads"), "{e}");
    assert_eq!(
        "416x608".parse::<ImageSize>().unwrap(),
        ImageSize::new(416, 608)
    );
    assert_eq!("224".parse::<ImageSize>().unwrap(), ImageSize::square(224));
    assert!("0x3".parse::<ImageSize>().is_err());
}

fn builder() -> NetworkBuilder {
    NetworkBuilder::new("t", Shape::new([2, 3, 8, 8]))
}

#[test]
fn shape_errors_name_the_layer() {
    let mut b = builder();
    let e = b
        .layer("big_kernel", Op::Conv2d(Conv2d::new(4, 11)), b.input())
        .unwrap_err();
    assert!(
        matches!(&e, Error::Shape { layer, .. } if layer == "big_kernel"),
        "{e}"
    );
    assert!(e.to_string().contains("`big_kernel`"), "{e}");

    let mut b = builder();
    let x = b
        .layer("a", Op::Conv2d(Conv2d::new(4, 3).same()), b.input())
        .unwrap();
    let y = b
        .layer("b", Op::Conv2d(Conv2d::new(5, 3).same()), b.input())
        .unwrap();
    let e = b.add("sum", Op::Add, &[x, y]).unwrap_err();
    assert!(
        e.to_string().contains("`sum`") && e.to_string().contains("[2, 5, 8, 8]"),
        "{e}"
    );
    let p = b
        .layer("pool", Op::MaxPool2d(Pool2d::new(2, 2)), x)
        .unwrap();
    let e = b.add("cat", Op::Concat { axis: 1 }, &[x, p]).unwrap_err();
    assert!(e.to_string().contains("`cat`"), "{e}");
    let e = b
        .layer("grouped", Op::Conv2d(Conv2d::new(6, 3).groups(3)), x)
        .unwrap_err();
    assert!(
        e.to_string().contains("`grouped`") && e.to_string().contains("groups"),
        "{e}"
    );
    let e = b
        .layer("emb", Op::Embedding { vocab: 3, dim: 4 }, x)
        .unwrap_err();
    assert!(e.to_string().contains("`emb`"), "{e}");
    let e = b.layer("rs", Op::Reshape { dims: vec![7] }, x).unwrap_err();
    assert!(e.to_string().contains("`rs`"), "{e}");
    let e = b.layer("drop", Op::Dropout { rate: 1.0 }, x).unwrap_err();
    assert!(
        matches!(&e, Error::Hyperparameter { layer, .. } if layer == "drop"),
        "{e}"
    );
    let e = b.layer("a", Op::Flatten, x).unwrap_err();
    assert!(matches!(&e, Error::DuplicateLayer(n) if n == "a"), "{e}");
}

#[test]
fn unused_layers_and_bad_losses_are_rejected() {
    let mut b = builder();
    let x = b.layer("flatten", Op::Flatten, b.input()).unwrap();
    b.layer("dead", Op::Dense(Dense::new(3)), x).unwrap();
    let y = b
        .layer("out", Op::Dense(Dense::new(3).softmax()), x)
        .unwrap();
    let e = b.finish(y, 1).unwrap_err();
    assert!(matches!(&e, Error::Unused(n) if n == "dead"), "{e}");

    let mut b = builder();
    let x = b
        .layer("conv", Op::Conv2d(Conv2d::new(4, 3).relu()), b.input())
        .unwrap();
    let e = b.finish(x, 1).unwrap_err();
    assert!(e.to_string().contains("relu"), "{e}");
}

#[test]
fn same_padding_follows_keras() {
    // Stride 2 on an even input pads only at the bottom/right, as TensorFlow does.
    let c = Conv2d::new(8, 3).stride(2).same();
    assert_eq!(c.padding_for([224, 224]), [0, 1, 0, 1]);
    assert_eq!(Conv2d::new(8, 3).same().padding_for([7, 7]), [1, 1, 1, 1]);
    let mut b = builder();
    let x = b.layer("c", Op::Conv2d(c.clone()), b.input()).unwrap();
    assert_eq!(b.shape(x).unwrap(), &Shape::new([2, 8, 4, 4]));
    let d = b
        .layer("d", Op::Conv2d(Conv2d::new(8, 3).dilation(2).same()), x)
        .unwrap();
    assert_eq!(b.shape(d).unwrap(), &Shape::new([2, 8, 4, 4]));
}

#[test]
fn width_sets_the_classifier_layers_of_vgg_and_fcn8() {
    let mut c = ModelConfig::new(2)
        .with_classes(10)
        .with_image_size(ImageSize::square(32));
    let full = params("vgg16", &c);
    c.width = Some(64);
    // At 32x32 the flattened features are 512: fc1 512->64, fc2 64->64, predictions 64->10.
    let convs = full - (512 * 4096 + 4096) - (4096 * 4096 + 4096) - (4096 * 10 + 10);
    assert_eq!(
        params("vgg16", &c),
        convs + (512 * 64 + 64) + (64 * 64 + 64) + (64 * 10 + 10)
    );
    let fcn_full = params(
        "fcn8",
        &ModelConfig::new(2).with_image_size(ImageSize::square(32)),
    );
    let mut f = ModelConfig::new(2).with_image_size(ImageSize::square(32));
    f.width = Some(64);
    // fc6: 7x7x512 -> 4096 vs -> 64; fc7: 1x1 4096 -> 4096 vs 64 -> 64; the score layer reads it.
    let classes = 19;
    let saved = (7 * 7 * 512 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * classes)
        - ((7 * 7 * 512 * 64 + 64) + (64 * 64 + 64) + (64 * classes));
    assert_eq!(params("fcn8", &f), fcn_full - saved);
    f.width = Some(0);
    assert!(model_by_name("fcn8", &f).is_err());
}
