//! Per-node heap against the model: `cargo run --release -p checkmate-executor --example
//! heap_probe -- MODEL BATCH IMAGE [min MiB]`. Runs checkpoint-all (or the plan in the file
//! `$PLAN`) twice (the first step is the
//! warm-up, followed by one SGD update) and prints every compute whose heap high-water mark differs from static + live +
//! workspace by more than `min` MiB (default 0.05), with its output bytes for comparison.

use candle_core::{DType, Device};
use checkmate_executor::heap::{self, Counting};
use checkmate_executor::{Executor, Optimizer, OptimizerKind, SyntheticData};
use checkmate_graph::{Plan, Step};
use checkmate_models::{model_by_name, ImageSize, ModelConfig, TrainingConfig};

#[global_allocator]
static ALLOC: Counting = Counting;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().map(String::as_str).unwrap_or("resnet50");
    let batch: usize = args.get(1).map_or(Ok(2), |s| s.parse())?;
    let image: usize = args.get(2).map_or(Ok(32), |s| s.parse())?;
    let min_mib: f64 = args.get(3).map_or(Ok(0.05), |s| s.parse())?;
    heap::warm_up_cpu()?;
    let base = heap::current();
    let mut c = ModelConfig::new(batch).with_classes(10);
    c.image_size = Some(ImageSize::square(image));
    // Sequence models: `SEQ_LEN` overrides the default length.
    c.seq_len = std::env::var("SEQ_LEN").ok().and_then(|v| v.parse().ok());
    let net = model_by_name(model, &c)?;
    let mut exec = Executor::new(net, &TrainingConfig::default(), &Device::Cpu, DType::F32, 1)?;
    let g = exec.graph().clone();
    // `PLAN=file` runs that plan (checkmate-plan/1 of this graph) instead of checkpoint-all.
    let all = match std::env::var("PLAN") {
        Ok(path) => checkmate_graph::PlanFile::read(&path, &g)?.plan,
        Err(_) => Plan::new((0..g.len()).map(Step::Compute).collect()),
    };
    let data = SyntheticData::new(&exec, 0.1, 2)?;
    let mut opt = Optimizer::new(OptimizerKind::sgd(0.01))?;
    let mib = |b: i64| b as f64 / (1 << 20) as f64;
    for step in 0..2 {
        let b = data.batch(&exec, step)?;
        let r = exec.run_plan(&all, &b)?;
        if step == 0 {
            // The first update allocates the momentum (static memory from then on).
            opt.step(&mut exec)?;
            continue;
        }
        let start = (r.heap_at_start - base) as i64;
        let mut worst = 0i64;
        for (k, s) in all.steps.iter().enumerate() {
            let Step::Compute(v) = *s else { continue };
            // Above the step's start, which held static memory (and a little of the program's
            // own structures, not the node's): as `tests/heap.rs` compares.
            let seen = r.heap_during_step[k] as i64 + g.static_bytes() as i64;
            let diff = seen - r.heap_modelled[k] as i64;
            worst = worst.max(diff);
            if mib(diff.abs()) >= min_mib {
                let n = g.node(v);
                println!(
                    "{:<40} unmodelled {:>8.3} MiB  output {:>8.3} MiB  workspace {:>8.3} MiB",
                    g.label(v),
                    mib(diff),
                    mib(n.bytes as i64),
                    mib(n.workspace_bytes as i64)
                );
            }
        }
        println!(
            "{model} batch {batch} {image}x{image}: worst unmodelled {:.3} MiB; heap at start {:.3} MiB, static {:.3} MiB",
            mib(worst),
            mib(start),
            mib(g.static_bytes() as i64)
        );
    }
    Ok(())
}
