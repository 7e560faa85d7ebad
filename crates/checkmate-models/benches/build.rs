//! Building the ResNet50 training graph at batch 256.

use checkmate_models::{build_training_graph, ModelConfig, TrainingConfig};
use criterion::{criterion_group, criterion_main, Criterion};

fn resnet50_training_graph(c: &mut Criterion) {
    let model = ModelConfig::new(256);
    let training = TrainingConfig::default();
    c.bench_function("resnet50_b256_training_graph", |b| {
        b.iter(|| build_training_graph("resnet50", &model, &training).expect("builds"))
    });
}

criterion_group!(benches, resnet50_training_graph);
criterion_main!(benches);
