//! Simulator throughput: a 1000-node graph and a 100,000-step plan.

use checkmate_graph::generate::{random_layered, LayeredParams};
use checkmate_graph::{simulate, Graph, Plan, Step};
use criterion::{black_box, criterion_group, criterion_main, Criterion};

/// Computes every node in topological order, then frees everything; 50 rounds = 100,000 steps.
fn long_plan(g: &Graph) -> Plan {
    let mut steps = Vec::with_capacity(100_000);
    for _ in 0..50 {
        steps.extend((0..g.len()).map(Step::Compute));
        steps.extend((0..g.len()).rev().map(Step::Free));
    }
    Plan::new(steps)
}

fn bench(c: &mut Criterion) {
    // Our own graph of Moccasin's random layered family at its largest size.
    let g = random_layered(&LayeredParams::moccasin(1000, 0.31), 0).expect("valid parameters");
    let plan = long_plan(&g);
    assert_eq!(plan.steps.len(), 100_000);
    c.bench_function("simulate 1000 nodes, 100k steps", |b| {
        b.iter(|| simulate(black_box(&g), black_box(&plan)).expect("valid plan"))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
