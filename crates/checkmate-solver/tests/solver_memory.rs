//! A solve never takes more memory than it is given: where the exact model would not fit
//! `SolveOptions::memory_limit`, `milp` and `lp-round` do not build it, return the plan of their
//! memory-cheap paths and say which limit they hit. The process's heap is measured by a counting
//! allocator around the system one. Nor does `milp` build a model whose start-up in HiGHS (which
//! does not stop at the time limit) would outlast `SolveOptions::time_limit`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use checkmate_graph::generate::{random_layered, LayeredParams};
use checkmate_graph::Graph;
use checkmate_solver::{solve, strategy_by_name, Limit, SolveOptions};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// One measured solve at a time (the peak is process-wide).
static SERIAL: Mutex<()> = Mutex::new(());

/// What the memory-cheap paths may hold beyond the limit's model: the graph, the baselines'
/// schedules and lp-round's local search (a few bitsets of `n^2` bits), stated per test.
const SLACK: usize = 8 << 20;

fn chain(n: usize) -> Graph {
    checkmate_graph::generate::chain(n, 100).unwrap()
}

/// Solves with a small memory limit and checks the plan, the reason and the heap's peak: at most
/// `limit + slack` (`tight`), or else a tenth of what the model would have taken (on long chains
/// the greedy baselines hold every candidate schedule, `n^2` bits each: 89 MB on a 1000-node
/// chain, which the memory limit does not cover yet).
fn check(g: &Graph, strategy: &str, budget: u64, limit: u64, tight: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let options = SolveOptions {
        time_limit: Some(Duration::from_secs(4)),
        memory_limit: Some(limit),
        ..SolveOptions::default()
    };
    let s = strategy_by_name(strategy).unwrap();
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let sol = solve(g, s.as_ref(), budget, &options).unwrap();
    let grew = PEAK.load(Ordering::Relaxed) - before;
    let what = format!("{strategy} on {} ({} nodes)", g.name(), g.len());
    assert!(sol.plan.is_some(), "{what}: no plan");
    assert!(sol.peak_bytes().unwrap() <= budget, "{what}: over budget");
    let model = match sol.limit {
        Some(Limit::Memory {
            model_bytes,
            limit_bytes,
        }) => {
            assert_eq!(limit_bytes, limit, "{what}");
            assert!(model_bytes > limit, "{what}: {model_bytes}");
            model_bytes
        }
        other => panic!("{what}: limit {other:?}"),
    };
    if tight {
        assert!(
            grew <= limit as usize + SLACK,
            "{what}: the heap grew by {grew} bytes, limit {limit} + slack {SLACK}"
        );
    } else {
        let model = model as usize;
        assert!(
            grew <= model / 10,
            "{what}: the heap grew by {grew} bytes, the model needs {model}"
        );
    }
}

#[test]
fn a_long_chain_is_solved_without_its_model() {
    // The exact model of a 1000-node chain needs gigabytes; 16 MiB is not enough for it.
    let g = chain(1000);
    check(&g, "milp", 1000, 16 << 20, true);
}

#[test]
fn a_random_dag_is_solved_without_its_model() {
    let g = random_layered(&LayeredParams::moccasin(250, 0.3), 5).unwrap();
    let all = checkmate_solver::baselines::CheckpointAll::peak_bytes(&g);
    for strategy in ["milp", "lp-round"] {
        check(&g, strategy, all, 16 << 20, true);
    }
}

/// A 501-node training chain's MILP has about 3.7M non-zeros: HiGHS needs about 15 s on it before
/// it checks its time limit (26 s estimated), so under a 4 s limit `milp` does not build it and
/// returns lp-round's plan, naming the limit. (How long the call takes is measured by
/// `cargo xtask bench solver`, not here.)
#[test]
fn a_model_too_slow_to_start_is_not_built() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = checkmate_graph::generate::with_backward(&chain(250)).unwrap();
    assert_eq!(g.len(), 501);
    let options = SolveOptions {
        time_limit: Some(Duration::from_secs(4)),
        // Memory is not what stops it here.
        memory_limit: Some(1 << 40),
        ..SolveOptions::default()
    };
    let budget = 30 * 100;
    let sol = solve(
        &g,
        strategy_by_name("milp").unwrap().as_ref(),
        budget,
        &options,
    )
    .unwrap();
    assert!(sol.plan.is_some(), "no plan");
    assert!(sol.peak_bytes().unwrap() <= budget, "over budget");
    match sol.limit {
        Some(Limit::Startup {
            startup_seconds,
            limit_seconds,
        }) => {
            assert_eq!(limit_seconds, 4);
            assert!(startup_seconds > 4 + 3, "{startup_seconds}");
        }
        other => panic!("limit {other:?}"),
    }
    // With a limit its start-up fits in, the model is built (and the limit, if any, is time).
    let enough = SolveOptions {
        time_limit: Some(Duration::from_secs(5)),
        ..options
    };
    let small = checkmate_graph::generate::with_backward(&chain(30)).unwrap();
    let sol = solve(
        &small,
        strategy_by_name("milp").unwrap().as_ref(),
        8 * 100,
        &enough,
    )
    .unwrap();
    assert!(
        !matches!(sol.limit, Some(Limit::Startup { .. })),
        "{:?}",
        sol.limit
    );
}
