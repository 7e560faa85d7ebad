//! The process heap during a plan, measured by the counting allocator, against what the training
//! graph models: the registers plus the computing node's workspace. Convolutions (chunked windows),
//! ReLU, max pooling and the optimizer update allocate only what the graph states; the slack
//! covers gemm's packing buffers and candle's small temporaries of the other layers.

use candle_core::{DType, Device};
use checkmate_executor::heap::{self, Counting};
use checkmate_executor::{Executor, HeapLimit, Optimizer, OptimizerKind, SyntheticData};
use checkmate_graph::{simulate, Plan, Step};
use checkmate_models::{model_by_name, ImageSize, ModelConfig, TrainingConfig};

#[global_allocator]
static ALLOC: Counting = Counting;

/// 1 MiB plus 3% of the modelled bytes.
fn slack(modelled: u64) -> u64 {
    (1 << 20) + modelled * 3 / 100
}

fn vgg(batch: usize) -> Executor {
    let mut c = ModelConfig::new(batch).with_classes(10);
    c.image_size = Some(ImageSize::square(32));
    c.width = Some(64);
    let net = model_by_name("vgg16", &c).unwrap();
    Executor::new(net, &TrainingConfig::default(), &Device::Cpu, DType::F32, 1).unwrap()
}

#[test]
fn the_heap_of_every_step_stays_within_the_model() {
    let mut exec = vgg(8);
    let g = exec.graph().clone();
    let all = Plan::new((0..g.len()).map(Step::Compute).collect());
    let sim = simulate(&g, &all).unwrap();
    let data = SyntheticData::new(&exec, 0.1, 2).unwrap();
    let mut opt = Optimizer::new(OptimizerKind::sgd(0.01)).unwrap();
    // Parameter gradients are static memory but appear during the step: allow them.
    let grads: u64 = exec.param_bytes();
    for step in 0..3 {
        let batch = data.batch(&exec, step).unwrap();
        let report = exec.run_plan(&all, &batch).unwrap();
        // The first step also allocates what stays for the process's life (gemm's per-thread
        // cache slabs, rayon's workers): the baseline, not the step.
        if step == 0 {
            opt.step(&mut exec).unwrap();
            continue;
        }
        assert_eq!(report.heap_during_step.len(), all.steps.len());
        for (k, &seen) in report.heap_during_step.iter().enumerate() {
            let Step::Compute(v) = all.steps[k] else {
                continue;
            };
            let modelled = sim.live_after_step[k] + g.node(v).workspace_bytes + grads;
            assert!(
                seen <= modelled + slack(modelled),
                "step {step}, {}: heap {seen} above the start, modelled {modelled}",
                g.label(v)
            );
            // The input's register is the batch, allocated before the step started.
            let input = (batch.input.elem_count() * 4) as u64;
            assert!(
                seen + input >= sim.live_after_step[k],
                "{}: heap {seen} + input {input} below the registers {}",
                g.label(v),
                sim.live_after_step[k]
            );
        }
        // The fused update allocated the momentum in step 0; now it allocates nothing.
        let before = heap::current();
        heap::reset_peak();
        opt.step(&mut exec).unwrap();
        let update = heap::peak() - before;
        let allowed = 1 << 20;
        assert!(
            update <= allowed,
            "step {step}: the optimizer update took {update} bytes"
        );
    }
}

#[test]
fn a_heap_limit_below_what_the_step_needs_stops_training_with_the_node() {
    let mut exec = vgg(2);
    let g = exec.graph().clone();
    let all = Plan::new((0..g.len()).map(Step::Compute).collect());
    let data = SyntheticData::new(&exec, 0.1, 2).unwrap();
    let batch = data.batch(&exec, 0).unwrap();
    exec.set_heap_limit(Some(HeapLimit {
        base: heap::current(),
        limit: 1 << 16,
    }))
    .unwrap();
    let err = exec.run_plan(&all, &batch).unwrap_err().to_string();
    assert!(err.contains("over the limit of 65536"), "{err}");
    assert!(err.contains("step 0 ("), "{err}");
    exec.set_heap_limit(None).unwrap();
    exec.run_plan(&all, &batch).unwrap();
}
