//! Our forward graphs against the seven training graphs of Checkmate's paper
//! (`data/graphs/checkmate`): output bytes in topological order, names and forward edges.

use std::collections::BTreeSet;

use checkmate_graph::{Graph, NodeKind};
use checkmate_models::{model_by_name, ImageSize, ModelConfig, TrainingConfig};

fn reference(file: &str) -> Graph {
    let path = format!(
        "{}/../../data/graphs/checkmate/{file}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    Graph::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn ours(model: &str, config: &ModelConfig) -> Graph {
    model_by_name(model, config)
        .and_then(|n| n.training_graph(&TrainingConfig::default()))
        .unwrap_or_else(|e| panic!("{model}: {e}"))
        .graph
}

fn forward(g: &Graph) -> Vec<usize> {
    g.forward_nodes().collect()
}

/// Forward bytes in topological order must be equal; returns the forward positions.
fn assert_forward_bytes(model: &str, ours: &Graph, theirs: &Graph) {
    let (fo, ft) = (forward(ours), forward(theirs));
    let ob: Vec<u64> = fo.iter().map(|&i| ours.node(i).bytes).collect();
    let tb: Vec<u64> = ft.iter().map(|&i| theirs.node(i).bytes).collect();
    assert_eq!(ob.len(), tb.len(), "{model}: forward node count");
    for (k, (a, b)) in ob.iter().zip(&tb).enumerate() {
        assert_eq!(
            a,
            b,
            "{model}: forward node #{k} ours {} vs Checkmate's {}",
            ours.node(fo[k]).name,
            theirs.node(ft[k]).name
        );
    }
    // The loss outputs one f32 per example in both.
    let loss = |g: &Graph| {
        g.nodes()
            .iter()
            .find(|n| n.kind == NodeKind::Loss)
            .map(|n| n.bytes)
    };
    assert_eq!(loss(ours), loss(theirs), "{model}: loss bytes");
}

/// Forward-to-forward edges, by position among forward nodes.
fn forward_edges(g: &Graph) -> BTreeSet<(usize, usize)> {
    let f = forward(g);
    let pos = |i: usize| f.iter().position(|&x| x == i);
    let mut e = BTreeSet::new();
    for (k, &i) in f.iter().enumerate() {
        for &p in g.preds(i) {
            if let Some(pk) = pos(p) {
                e.insert((pk, k));
            }
        }
    }
    e
}

fn assert_names(model: &str, ours: &Graph, theirs: &Graph) {
    let names =
        |g: &Graph| -> Vec<String> { forward(g).iter().map(|&i| g.node(i).name.clone()).collect() };
    assert_eq!(names(ours), names(theirs), "{model}: forward layer names");
}

#[test]
fn vgg16_matches_checkmate() {
    let (o, t) = (
        ours("vgg16", &ModelConfig::new(256)),
        reference("VGG16_256_224"),
    );
    assert_forward_bytes("vgg16", &o, &t);
    assert_names("vgg16", &o, &t);
    assert_eq!(forward_edges(&o), forward_edges(&t));
}

#[test]
fn vgg19_matches_checkmate() {
    let (o, t) = (
        ours("vgg19", &ModelConfig::new(256)),
        reference("VGG19_256_224"),
    );
    assert_forward_bytes("vgg19", &o, &t);
    assert_names("vgg19", &o, &t);
    assert_eq!(forward_edges(&o), forward_edges(&t));
}

#[test]
fn mobilenet_matches_checkmate() {
    let (o, t) = (
        ours("mobilenet", &ModelConfig::new(512)),
        reference("MobileNet_512_224"),
    );
    assert_forward_bytes("mobilenet", &o, &t);
    assert_names("mobilenet", &o, &t);
    assert_eq!(forward_edges(&o), forward_edges(&t));
}

#[test]
fn resnet50_matches_checkmate() {
    let (o, t) = (
        ours("resnet50", &ModelConfig::new(256)),
        reference("ResNet50_256_224"),
    );
    assert_forward_bytes("resnet50", &o, &t);
    assert_names("resnet50", &o, &t);
    assert_eq!(forward_edges(&o), forward_edges(&t));
}

fn segmentation(model: &str, file: &str, same_names: bool) {
    let config = ModelConfig::new(32)
        .with_image_size(ImageSize::new(416, 608))
        .with_classes(19);
    let (o, t) = (ours(model, &config), reference(file));
    assert_forward_bytes(model, &o, &t);
    if same_names {
        assert_names(model, &o, &t);
    }
    assert_eq!(
        forward_edges(&o),
        forward_edges(&t),
        "{model}: forward edges"
    );
}

#[test]
fn unet_matches_checkmate() {
    segmentation("unet", "vgg_unet_32_416x608", true);
}

#[test]
fn fcn8_matches_checkmate() {
    // Names differ only by Keras' session-global counters (conv2d_5 there, conv2d here).
    segmentation("fcn8", "fcn_8_vgg_32_416x608", false);
}

#[test]
fn segnet_matches_checkmate() {
    segmentation("segnet", "segnet_32_416x608", false);
}

/// Checkmate's FCN8 graph carries FLOP costs that count one per multiply-add; ours count two, plus
/// one per output for the bias and one for the fused ReLU.
#[test]
fn fcn8_conv_flops_are_twice_checkmates_macs_plus_bias_and_relu() {
    let config = ModelConfig::new(32).with_classes(19);
    let (o, t) = (ours("fcn8", &config), reference("fcn_8_vgg_32_416x608"));
    let mut checked = 0;
    for (&i, &j) in forward(&o).iter().zip(&forward(&t)) {
        let name = &o.node(i).name;
        if name.starts_with("block") && name.contains("conv") {
            let elems = o.node(i).bytes as f64 / 4.0;
            assert_eq!(o.node(i).cost, 2.0 * t.node(j).cost + 2.0 * elems, "{name}");
            checked += 1;
        }
    }
    assert_eq!(checked, 13);
}

/// Node counts: equal to Checkmate's, except that layers with nothing to differentiate (a padding
/// of the input image) get no backward node here.
#[test]
fn node_counts_against_checkmate() {
    let seg = ModelConfig::new(32).with_classes(19);
    for (model, config, file, missing) in [
        ("vgg16", ModelConfig::new(256), "VGG16_256_224", 0),
        ("vgg19", ModelConfig::new(256), "VGG19_256_224", 0),
        ("mobilenet", ModelConfig::new(512), "MobileNet_512_224", 1),
        ("resnet50", ModelConfig::new(256), "ResNet50_256_224", 1),
        ("unet", seg.clone(), "vgg_unet_32_416x608", 0),
        ("fcn8", seg.clone(), "fcn_8_vgg_32_416x608", 0),
        ("segnet", seg.clone(), "segnet_32_416x608", 1),
    ] {
        assert_eq!(
            ours(model, &config).len() + missing,
            reference(file).len(),
            "{model}"
        );
    }
}
