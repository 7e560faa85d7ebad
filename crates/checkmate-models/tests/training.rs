//! Training-graph invariants, per-layer gradient dependencies, static memory and cost tables.

use std::collections::HashSet;

use checkmate_graph::{simulate, Graph, NodeKind, Plan, Step};
use checkmate_models::{
    build_training_graph, model_by_name, CostTable, Costs, Error, GradSource, Granularity,
    ImageSize, ModelConfig, NodeCost, NodeRole, Optimizer, SavedKind, TensorRef, TrainingConfig,
    TrainingGraph, MODEL_NAMES,
};

fn small(model: &str) -> ModelConfig {
    let mut c = ModelConfig::new(2);
    if model == "transformer" {
        c.depth = Some(2);
        c.seq_len = Some(16);
    }
    c
}

fn tg(model: &str, config: &ModelConfig) -> TrainingGraph {
    model_by_name(model, config)
        .and_then(|n| n.training_graph(&TrainingConfig::default()))
        .unwrap_or_else(|e| panic!("{model}: {e}"))
}

fn deps(g: &Graph, name: &str) -> HashSet<String> {
    let i = g
        .nodes()
        .iter()
        .position(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"));
    g.preds(i).iter().map(|&p| g.node(p).name.clone()).collect()
}

fn set(names: &[&str]) -> HashSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn node<'a>(g: &'a Graph, name: &str) -> &'a checkmate_graph::Node {
    g.nodes()
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

#[test]
fn invariants_hold_for_every_model() {
    for &m in MODEL_NAMES {
        let net = model_by_name(m, &small(m)).unwrap();
        let t = net.training_graph(&TrainingConfig::default()).unwrap();
        let g = &t.graph;
        let layers = net.layers().len();
        assert_eq!(g.forward_nodes().count(), layers, "{m}");
        let loss = t.loss_node;
        assert_eq!(g.node(loss).kind, NodeKind::Loss, "{m}");
        assert_eq!(
            g.nodes()
                .iter()
                .filter(|n| n.kind == NodeKind::Loss)
                .count(),
            1
        );
        let needs = net.needs_gradient();
        let backward = g
            .nodes()
            .iter()
            .filter(|n| n.kind == NodeKind::Backward)
            .count();
        assert_eq!(backward, needs.iter().filter(|&&x| x).count(), "{m}");
        let mut names = HashSet::new();
        for (i, n) in g.nodes().iter().enumerate() {
            assert!(
                names.insert(n.name.clone()),
                "{m}: duplicate name {}",
                n.name
            );
            assert_eq!(n.id, i as u64);
            match t.role(i) {
                NodeRole::Forward(l) => {
                    assert_eq!(n.kind, NodeKind::Forward);
                    assert!(i < loss);
                    assert_eq!(n.name, net.layer(l).name);
                    assert_eq!(n.bytes, net.layer(l).output.bytes());
                }
                NodeRole::Loss => assert_eq!(i, loss),
                NodeRole::Backward(l) => {
                    assert_eq!(n.kind, NodeKind::Backward);
                    assert!(i > loss, "{m}: backward node {} before the loss", n.name);
                    assert_eq!(n.name, format!("{}_backward", net.layer(l).name));
                    // Every backward node gets a gradient: from the loss or a later backward node.
                    assert!(
                        g.preds(i)
                            .iter()
                            .any(|&p| p == loss || g.node(p).kind == NodeKind::Backward),
                        "{m}: {} has no upstream gradient",
                        n.name
                    );
                }
                r @ (NodeRole::Saved(..) | NodeRole::WeightGrad(_) | NodeRole::InputGrad(..)) => {
                    panic!("{m}: {r:?} in a layer-level graph")
                }
            }
            for &p in g.preds(i) {
                assert!(p < i);
            }
        }
        // Every node reaches the loss or is reached from it: checkpoint-all is a valid plan.
        let plan = Plan::new((0..g.len()).map(Step::Compute).collect());
        let sim = simulate(g, &plan).unwrap_or_else(|e| panic!("{m}: {e}"));
        assert_eq!(sim.cost, g.total_cost());
        // The graph round-trips through checkmate-graph/1.
        let back = Graph::from_json_str(&g.to_json(), m).unwrap();
        assert_eq!(back.len(), g.len());
        assert_eq!(back.static_bytes(), g.static_bytes());
    }
}

#[test]
fn vgg16_backward_dependencies() {
    let g = tg("vgg16", &ModelConfig::new(4)).graph;
    assert_eq!(g.len(), 45);
    // Conv + ReLU: its input (for dW), its output (ReLU mask), its consumer's gradient.
    assert_eq!(
        deps(&g, "block1_conv2_backward"),
        set(&["block1_conv1", "block1_conv2", "block1_pool_backward"])
    );
    // The first layer reads the image (static): only its output and the upstream gradient.
    assert_eq!(
        deps(&g, "block1_conv1_backward"),
        set(&["block1_conv1", "block1_conv2_backward"])
    );
    // No gradient for the image.
    assert_eq!(node(&g, "block1_conv1_backward").bytes, 0);
    assert_eq!(
        node(&g, "block1_conv2_backward").bytes,
        node(&g, "block1_conv1").bytes
    );
    // Max pool: input and output.
    assert_eq!(
        deps(&g, "block1_pool_backward"),
        set(&["block1_conv2", "block1_pool", "block2_conv1_backward"])
    );
    // Flatten: nothing but the upstream gradient.
    assert_eq!(deps(&g, "flatten_backward"), set(&["fc1_backward"]));
    // The prediction (dense + softmax) forms the loss gradient from its output and the labels.
    assert_eq!(
        deps(&g, "predictions_backward"),
        set(&["fc2", "predictions", "Loss"])
    );
    assert_eq!(deps(&g, "Loss"), set(&["predictions"]));
    assert_eq!(node(&g, "Loss").bytes, 4 * 4);
}

#[test]
fn resnet50_backward_dependencies() {
    let t = tg("resnet50", &ModelConfig::new(2));
    let g = &t.graph;
    // The padding of the image needs no gradient: no backward node.
    assert!(g.nodes().iter().all(|n| n.name != "conv1_pad_backward"));
    // 176 layers, the loss, 175 backward nodes (none for conv1_pad).
    assert_eq!(g.len(), 176 + 1 + 175);
    assert_eq!(node(g, "conv1_conv_backward").bytes, 0);
    // ReLU with fan-out: its output, both consumers' gradients (summed in a workspace).
    assert_eq!(
        deps(g, "conv2_block1_out_backward"),
        set(&[
            "conv2_block1_out",
            "conv2_block2_1_conv_backward",
            "conv2_block2_add_backward"
        ])
    );
    let out = node(g, "conv2_block1_out");
    assert_eq!(
        node(g, "conv2_block1_out_backward").workspace_bytes,
        out.bytes
    );
    // Add: only the upstream gradient; one gradient tensor shared by both inputs.
    assert_eq!(
        deps(g, "conv2_block1_add_backward"),
        set(&["conv2_block1_out_backward"])
    );
    assert_eq!(
        node(g, "conv2_block1_add_backward").bytes,
        node(g, "conv2_block1_add").bytes
    );
    // Batch norm: its input. Convolution without activation: its input.
    assert_eq!(
        deps(g, "conv2_block1_3_bn_backward"),
        set(&["conv2_block1_3_conv", "conv2_block1_add_backward"])
    );
    assert_eq!(
        deps(g, "conv2_block1_3_conv_backward"),
        set(&["conv2_block1_2_relu", "conv2_block1_3_bn_backward"])
    );
    // Global average pooling: nothing saved.
    assert_eq!(deps(g, "avg_pool_backward"), set(&["probs_backward"]));
    // The pooling's input receives gradients from two branches (shortcut conv and 1_conv).
    assert_eq!(
        deps(g, "pool1_pool_backward"),
        set(&[
            "pool1_pad",
            "pool1_pool",
            "conv2_block1_1_conv_backward",
            "conv2_block1_0_conv_backward"
        ])
    );
    let b = t.backward[net_layer(&t, "conv2_block1_add")]
        .as_ref()
        .unwrap();
    assert_eq!(b.input_grads, vec![true, true]);
    assert!(b.reads.is_empty());
}

fn net_layer(t: &TrainingGraph, name: &str) -> usize {
    let i = t.graph.nodes().iter().position(|n| n.name == name).unwrap();
    match t.role(i) {
        NodeRole::Forward(l) => l,
        r => panic!("{name} is {r:?}"),
    }
}

#[test]
fn concat_and_multi_input_gradients() {
    let net = model_by_name("unet", &ModelConfig::new(1).with_classes(3)).unwrap();
    let t = net.training_graph(&TrainingConfig::default()).unwrap();
    let g = &t.graph;
    let cat = node(g, "concatenate");
    // Both inputs' gradients, together as large as the output.
    assert_eq!(node(g, "concatenate_backward").bytes, cat.bytes);
    // block3_pool feeds block4_conv1 and the concatenation.
    let l = net.layer_by_name("block3_pool").unwrap();
    let b = t.backward[l].as_ref().unwrap();
    assert_eq!(b.upstream.len(), 2);
    let cat_id = net.layer_by_name("concatenate").unwrap();
    assert!(b.upstream.contains(&GradSource::Layer {
        layer: cat_id,
        slot: 1
    }));
    assert_eq!(b.reads, vec![TensorRef::Layer(l - 1), TensorRef::Layer(l)]);
}

#[test]
fn transformer_backward_dependencies() {
    let mut c = ModelConfig::new(2);
    c.depth = Some(1);
    c.seq_len = Some(8);
    let g = tg("transformer", &c).graph;
    // GELU reads its input; layer norm reads its input; attention reads its input.
    assert_eq!(
        deps(&g, "h0_gelu_backward"),
        set(&["h0_fc", "h0_proj_backward"])
    );
    assert_eq!(
        deps(&g, "h0_ln2_backward"),
        set(&["h0_add1", "h0_fc_backward"])
    );
    assert_eq!(
        deps(&g, "h0_attn_backward"),
        set(&["h0_ln1", "h0_add1_backward"])
    );
    // The logits head forms softmax - labels from its output.
    assert_eq!(
        deps(&g, "lm_head_backward"),
        set(&["ln_f", "lm_head", "Loss"])
    );
    // The embedding's input is the token batch (static): it needs only the upstream gradient.
    assert_eq!(deps(&g, "wte_backward"), set(&["wpe_backward"]));
    assert_eq!(node(&g, "wte_backward").bytes, 0);
    assert!(node(&g, "h0_attn").workspace_bytes > 0);
}

#[test]
fn static_memory_counts_parameters_gradients_optimizer_input_and_labels() {
    let net = model_by_name("vgg16", &ModelConfig::new(256)).unwrap();
    let p = 138_357_544u64 * 4;
    let io = 256 * 3 * 224 * 224 * 4 + 256 * 4;
    for (opt, k) in [
        (Optimizer::Sgd, 2),
        (Optimizer::SgdMomentum, 3),
        (Optimizer::Adam, 4),
    ] {
        let config = TrainingConfig {
            optimizer: opt,
            ..TrainingConfig::default()
        };
        let t = net.training_graph(&config).unwrap();
        assert_eq!(t.graph.static_bytes(), k * p + io, "{opt:?}");
        assert_eq!(t.static_memory.total(), t.graph.static_bytes());
    }
    // Batch-norm running statistics are stored but have no gradient or optimizer state.
    let net = model_by_name("resnet50", &ModelConfig::new(1)).unwrap();
    let t = net.training_graph(&TrainingConfig::default()).unwrap();
    assert_eq!(t.static_memory.params, 25_636_712 * 4);
    assert_eq!(t.static_memory.param_grads, 25_583_592 * 4);
    assert_eq!(t.static_memory.optimizer_state, 25_583_592 * 4);
}

#[test]
fn workspace_can_be_turned_off() {
    let config = TrainingConfig {
        workspace: false,
        ..TrainingConfig::default()
    };
    let g = build_training_graph("resnet50", &ModelConfig::new(2), &config).unwrap();
    assert!(g.nodes().iter().all(|n| n.workspace_bytes == 0));
    let g =
        build_training_graph("resnet50", &ModelConfig::new(2), &TrainingConfig::default()).unwrap();
    assert!(g.nodes().iter().any(|n| n.workspace_bytes > 0));
    assert_eq!(g.cost_unit(), "flops");
}

fn table_for(g: &Graph) -> CostTable {
    let nodes = g
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| NodeCost {
            name: n.name.clone(),
            seconds: 0.001 * (i + 1) as f64,
            bytes: n.bytes,
            alternatives: Vec::new(),
        })
        .collect();
    CostTable::new("cpu", "vgg16", 2, nodes)
}

#[test]
fn measured_costs_apply_by_name() {
    let model = ModelConfig::new(2);
    let flops = build_training_graph("vgg16", &model, &TrainingConfig::default()).unwrap();
    let mut table = table_for(&flops);
    table.nodes.reverse(); // order does not matter
    let text = table.to_json();
    let parsed = CostTable::from_json_str(&text, "test").unwrap();
    assert_eq!(parsed.nodes.len(), table.nodes.len());
    for (a, b) in parsed.nodes.iter().zip(&table.nodes) {
        assert_eq!((&a.name, a.bytes), (&b.name, b.bytes));
        assert!((a.seconds - b.seconds).abs() <= 1e-15, "{}", a.name);
    }
    let config = TrainingConfig {
        costs: Costs::Measured(parsed),
        ..TrainingConfig::default()
    };
    let g = build_training_graph("vgg16", &model, &config).unwrap();
    assert_eq!(g.cost_unit(), "s");
    for (i, n) in g.nodes().iter().enumerate() {
        assert!(
            (n.cost - 0.001 * (i + 1) as f64).abs() <= 1e-15,
            "{}",
            n.name
        );
        assert_eq!(n.bytes, flops.node(i).bytes);
    }
    // Through a file and the CLI's `--costs` parser.
    let path = std::env::temp_dir().join(format!(
        "checkmate-models-costs-{}.json",
        std::process::id()
    ));
    table.write(&path).unwrap();
    assert!(matches!(
        Costs::from_arg(path.to_str().unwrap()).unwrap(),
        Costs::Measured(_)
    ));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(Costs::from_arg("flops").unwrap(), Costs::Flops);
    assert!(matches!(
        Costs::from_arg("/nonexistent/costs.json"),
        Err(Error::Io { .. })
    ));
}

#[test]
fn cost_table_mismatches_are_errors_naming_the_node() {
    let model = ModelConfig::new(2);
    let flops = build_training_graph("vgg16", &model, &TrainingConfig::default()).unwrap();
    let build = |t: CostTable| {
        let config = TrainingConfig {
            costs: Costs::Measured(t),
            ..TrainingConfig::default()
        };
        build_training_graph("vgg16", &model, &config)
            .unwrap_err()
            .to_string()
    };
    let mut t = table_for(&flops);
    t.nodes.retain(|n| n.name != "fc2_backward");
    assert!(build(t).contains("`fc2_backward`"));
    let mut t = table_for(&flops);
    t.nodes.push(NodeCost {
        name: "conv_extra".into(),
        seconds: 1.0,
        bytes: 4,
        alternatives: Vec::new(),
    });
    assert!(build(t).contains("conv_extra"));
    let mut t = table_for(&flops);
    t.nodes[3].bytes += 1;
    let e = build(t);
    assert!(
        e.contains(&format!("`{}`", flops.node(3).name)) && e.contains("bytes"),
        "{e}"
    );
    let mut t = table_for(&flops);
    t.batch = 8;
    assert!(build(t).contains("batch 8"));
    let mut t = table_for(&flops);
    t.nodes[0].seconds = f64::NAN;
    assert!(build(t).contains("block1_conv1"));
    let mut t = table_for(&flops);
    let dup = t.nodes[1].clone();
    t.nodes.push(dup);
    assert!(build(t).contains("twice"));
    let e = CostTable::from_json_str(
        r#"{"format":"checkmate-graph/1","batch":1,"nodes":[]}"#,
        "x",
    )
    .unwrap_err();
    assert!(e.to_string().contains("checkmate-costs/1"), "{e}");
    assert!(matches!(
        CostTable::from_json_str("{", "x"),
        Err(Error::Json { .. })
    ));
}

#[test]
fn op_level_invariants_hold_for_every_model() {
    let plain = TrainingConfig {
        granularity: Granularity::Op,
        ..TrainingConfig::default()
    };
    let in_place = TrainingConfig {
        relu_in_place: true,
        ..plain.clone()
    };
    let mut relus_in_place = 0;
    for (op, m) in [&plain, &in_place]
        .into_iter()
        .flat_map(|c| MODEL_NAMES.iter().map(move |m| (c, *m)))
    {
        let net = model_by_name(m, &small(m)).unwrap();
        let layer = net.training_graph(&TrainingConfig::default()).unwrap();
        let t = net.training_graph(op).unwrap();
        let g = &t.graph;
        assert_eq!(t.granularity, Granularity::Op);
        assert_eq!(g.static_bytes(), layer.graph.static_bytes(), "{m}");
        let mut saved = 0;
        for (i, n) in g.nodes().iter().enumerate() {
            assert_eq!(n.id, i as u64);
            assert!(g.preds(i).iter().all(|&p| p < i), "{m}: {}", n.name);
            match t.role(i) {
                NodeRole::Forward(l) => {
                    assert_eq!(t.forward_node(l), i);
                    assert_eq!(n.name, net.layer(l).name);
                }
                NodeRole::Saved(l, kind) => {
                    saved += 1;
                    assert_eq!(n.kind, NodeKind::Forward);
                    let elems = net.layer(l).output.shape.elements() as u64;
                    let want = match kind {
                        SavedKind::ActivationMask => elems.div_ceil(8),
                        SavedKind::PoolIndex => elems,
                    };
                    assert_eq!(n.bytes, want, "{m}: {}", n.name);
                    match &t.backward[l] {
                        Some(b) => assert_eq!(b.saved, Some((i, kind))),
                        // A pooling whose gradient its convolution forms.
                        None => assert!(
                            t.backward
                                .iter()
                                .flatten()
                                .any(|b| b.pooled == Some((l, i, 0))),
                            "{m}: {} read by nobody",
                            n.name
                        ),
                    }
                }
                NodeRole::WeightGrad(l) => {
                    let b = t.backward[l].as_ref().unwrap();
                    assert_eq!(b.weight_node, Some(i));
                    assert_eq!(b.node, i + 1, "{m}: parameter gradients just before dX");
                    assert_eq!(n.bytes, 0);
                }
                NodeRole::Loss => assert_eq!(i, t.loss_node),
                NodeRole::Backward(l) => assert_eq!(t.backward_node(l), Some(i)),
                NodeRole::InputGrad(l, slot) => {
                    // A concatenation's input gradients: each node holds its input's slice and
                    // is what that input's backward reads.
                    let b = t.backward[l].as_ref().unwrap();
                    assert_eq!(b.input_nodes[slot], Some(i));
                    assert_eq!(b.input_grad(slot, false), (i, 0));
                    let input = &net.layer(l).inputs[slot];
                    let TensorRef::Layer(p) = *input else {
                        panic!("{m}: {} is the gradient of the network input", n.name)
                    };
                    assert_eq!(n.bytes, net.layer(p).output.bytes(), "{m}: {}", n.name);
                    if let Some(pb) = t.backward_node(p) {
                        assert!(g.preds(pb).contains(&i), "{m}: {} not read", n.name);
                    }
                }
            }
        }
        // A ReLU applied in place shares its input's forward node.
        let in_place = t.relu_in_place.iter().flatten().count();
        assert!(op.relu_in_place || in_place == 0, "{m}");
        relus_in_place += in_place;
        for (p, r) in t.relu_in_place.iter().enumerate() {
            if let Some(r) = *r {
                assert_eq!(t.forward_node(p), t.forward_node(r), "{m}");
                assert_eq!(net.consumers(p), &[(r, 0)], "{m}");
            }
        }
        assert_eq!(
            g.forward_nodes().count() + in_place,
            net.layers().len() + saved,
            "{m}"
        );
        let plan = Plan::new((0..g.len()).map(Step::Compute).collect());
        let sim = simulate(g, &plan).unwrap_or_else(|e| panic!("{m}: {e}"));
        assert_eq!(sim.cost, g.total_cost());
    }
    // ResNet50's conv-BN-ReLU and add-ReLU, MobileNet's BN-ReLU6.
    assert!(relus_in_place > 20, "only {relus_in_place} ReLUs in place");
}

#[test]
fn vgg16_op_level_dependencies() {
    let op = TrainingConfig {
        granularity: Granularity::Op,
        ..TrainingConfig::default()
    };
    let g = build_training_graph("vgg16", &ModelConfig::new(4), &op).unwrap();
    // The input gradient reads the 1-bit mask and, through the pooling it expands itself, the
    // pooling's winners (a byte per window) and upstream gradient: no full-size tensor.
    assert_eq!(
        deps(&g, "block1_conv2_backward"),
        set(&[
            "block1_conv2_mask",
            "block1_pool_indices",
            "block2_conv1_backward"
        ])
    );
    // The kernel gradient also reads the layer's input.
    assert_eq!(
        deps(&g, "block1_conv2_backward_weight"),
        set(&[
            "block1_conv1",
            "block1_conv2_mask",
            "block1_pool_indices",
            "block2_conv1_backward"
        ])
    );
    assert!(g.nodes().iter().all(|n| n.name != "block1_pool_backward"));
    assert_eq!(deps(&g, "block1_pool_indices"), set(&["block1_conv2"]));

    assert_eq!(deps(&g, "block1_conv2_mask"), set(&["block1_conv2"]));
    let y = node(&g, "block1_conv2").bytes;
    assert_eq!(node(&g, "block1_conv2_mask").bytes, y / 32);
    assert_eq!(node(&g, "block1_pool_indices").bytes, y / 16);
    // Without the fusion (the pooling's input also feeds another layer) the pooling's gradient
    // reads its winners, not its input.
    let mut b =
        checkmate_models::NetworkBuilder::new("pool", checkmate_models::Shape::new([2, 3, 8, 8]));
    let c = b
        .layer(
            "conv",
            checkmate_models::Op::Conv2d(checkmate_models::Conv2d::new(4, 3).same().relu()),
            b.input(),
        )
        .unwrap();
    let p = b
        .layer(
            "pool",
            checkmate_models::Op::MaxPool2d(checkmate_models::Pool2d::new(2, 2)),
            c,
        )
        .unwrap();
    let s = b
        .layer(
            "skip",
            checkmate_models::Op::UpSampling2d { scale: [2, 2] },
            p,
        )
        .unwrap();
    let sum = b.add("sum", checkmate_models::Op::Add, &[c, s]).unwrap();
    let f = b.layer("flat", checkmate_models::Op::Flatten, sum).unwrap();
    let d = b
        .layer(
            "logits",
            checkmate_models::Op::Dense(checkmate_models::Dense::new(3)),
            f,
        )
        .unwrap();
    let net = b.finish(d, 1).unwrap();
    let g = net.training_graph(&op).unwrap().graph;
    assert_eq!(
        deps(&g, "pool_backward"),
        set(&["pool_indices", "skip_backward"])
    );
}

#[test]
fn a_cost_table_knows_the_granularity_it_was_measured_at() {
    let model = ModelConfig::new(2);
    for (name, granularity) in [
        ("vgg16", Granularity::Layer),
        ("vgg16", Granularity::Op),
        ("resnet50", Granularity::Op),
        ("mlp", Granularity::Op),
    ] {
        let config = TrainingConfig {
            granularity,
            ..TrainingConfig::default()
        };
        let g = build_training_graph(name, &model, &config).unwrap();
        assert_eq!(table_for(&g).granularity(), granularity, "{name}");
        // A table applies to the graph of its own granularity only.
        let other = TrainingConfig {
            granularity: match granularity {
                Granularity::Op => Granularity::Layer,
                Granularity::Layer => Granularity::Op,
            },
            costs: Costs::Measured(table_for(&g)),
            ..TrainingConfig::default()
        };
        let err = build_training_graph(name, &model, &other).unwrap_err();
        assert!(err.to_string().contains("--granularity"), "{err}");
    }
}

#[test]
fn unet_op_level_concatenation_gradients_are_split() {
    let op = TrainingConfig {
        granularity: Granularity::Op,
        ..TrainingConfig::default()
    };
    let c = ModelConfig::new(2).with_image_size(ImageSize::square(64));
    let g = build_training_graph("unet", &c, &op).unwrap();
    // The skip connection's gradient: only the block1_pool slice of the concatenation's
    // gradient, which the convolution (expanding the pooling) reads instead of the whole.
    assert!(g.nodes().iter().all(|n| n.name != "concatenate_2_backward"));
    assert_eq!(
        deps(&g, "concatenate_2_backward_0"),
        set(&["zero_padding2d_3_backward"])
    );
    assert_eq!(
        deps(&g, "concatenate_2_backward_1"),
        set(&["zero_padding2d_3_backward"])
    );
    assert_eq!(
        node(&g, "concatenate_2_backward_0").bytes,
        node(&g, "up_sampling2d_2").bytes
    );
    assert_eq!(
        node(&g, "concatenate_2_backward_1").bytes,
        node(&g, "block1_pool").bytes
    );
    assert_eq!(
        deps(&g, "up_sampling2d_2_backward"),
        set(&["concatenate_2_backward_0"])
    );
    assert_eq!(
        deps(&g, "block1_conv2_backward"),
        set(&[
            "block1_conv2_mask",
            "block1_pool_indices",
            "concatenate_2_backward_1",
            "block2_conv1_backward"
        ])
    );
    // At layer level the concatenation keeps one backward node.
    let layer = build_training_graph("unet", &c, &TrainingConfig::default()).unwrap();
    assert!(layer
        .nodes()
        .iter()
        .any(|n| n.name == "concatenate_2_backward"));
}

#[test]
fn fused_convolution_and_pooling_replace_the_pair_only() {
    let op = TrainingConfig {
        granularity: Granularity::Op,
        ..TrainingConfig::default()
    };
    let fused = TrainingConfig {
        fuse_conv_pool: true,
        ..op.clone()
    };
    for &m in MODEL_NAMES {
        let net = model_by_name(m, &small(m)).unwrap();
        let t = net.training_graph(&op).unwrap();
        let f = net.training_graph(&fused).unwrap();
        // Every convolution whose pooling gradient its kernels form is fused, nothing else.
        let pooled: Vec<(usize, usize)> = t
            .backward
            .iter()
            .flatten()
            .filter_map(|b| b.pooled.map(|(p, _, _)| (b.layer, p)))
            .collect();
        let pairs: Vec<(usize, usize)> = f
            .fused_with
            .iter()
            .enumerate()
            .filter_map(|(l, o)| {
                o.filter(|_| matches!(net.layer(l).op, checkmate_models::Op::Conv2d(_)))
                    .map(|p| (l, p))
            })
            .collect();
        assert_eq!(pairs, pooled, "{m}");
        assert_eq!(f.graph.len() + 2 * pairs.len(), t.graph.len(), "{m}");
        if pairs.is_empty() {
            assert_eq!(
                f.graph.to_json(),
                t.graph.to_json(),
                "{m}: nothing to fuse, the same graph"
            );
            continue;
        }
        for &(c, p) in &pairs {
            assert_eq!(f.fused_with[p], Some(c));
            let (cv, pv) = (f.forward_node(c), f.forward_node(p));
            let b = f.backward[c].as_ref().unwrap();
            // The convolution's backward reads its mask and the winners from its forward node.
            assert_eq!(b.saved, Some((cv, SavedKind::ActivationMask)), "{m}");
            assert_eq!(b.pooled, Some((p, cv, 1)), "{m}");
            // The pooling reads the convolution's input and the winners, at 1 / window the
            // convolution's cost.
            assert!(f.graph.preds(pv).contains(&cv), "{m}");
            let conv_cost = t.graph.node(t.forward_node(c)).cost;
            assert!(f.graph.node(pv).cost < conv_cost / 3.0, "{m}");
            assert_eq!(
                f.graph.node(pv).bytes,
                t.graph.node(t.forward_node(p)).bytes
            );
            // Nothing else reads the convolution's forward node.
            for i in 0..f.graph.len() {
                if f.graph.preds(i).contains(&cv) {
                    assert!(
                        i == pv || Some(i) == b.weight_node || i == b.node,
                        "{m}: {} reads {}",
                        f.graph.label(i),
                        f.graph.label(cv)
                    );
                }
            }
        }
    }
}
