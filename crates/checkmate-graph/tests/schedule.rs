//! Algorithms 1 and 2 on random DAGs: every schedule they build is valid, and its plan simulates
//! with the schedule's cost.

use checkmate_graph::{simulate, Graph, NodeKind, NodeSpec, Schedule};
use fixedbitset::FixedBitSet;
use proptest::prelude::*;

/// A random DAG of `n` nodes: node i depends on a random subset of earlier nodes (at most 3).
fn dag() -> impl Strategy<Value = Graph> {
    (2usize..12)
        .prop_flat_map(|n| {
            (
                Just(n),
                proptest::collection::vec(
                    (
                        1u64..100,
                        0.0f64..10.0,
                        proptest::collection::vec(any::<u16>(), 0..3),
                    ),
                    n,
                ),
            )
        })
        .prop_map(|(n, raw)| {
            let specs = (0..n)
                .map(|i| {
                    let (bytes, cost, picks) = &raw[i];
                    let mut deps: Vec<u64> = if i == 0 {
                        vec![]
                    } else {
                        picks.iter().map(|p| (*p as usize % i) as u64).collect()
                    };
                    if i > 0 && deps.is_empty() {
                        deps.push(i as u64 - 1);
                    }
                    NodeSpec {
                        alternatives: Vec::new(),
                        id: i as u64,
                        name: format!("n{i}"),
                        kind: NodeKind::Forward,
                        cost: *cost,
                        bytes: *bytes,
                        workspace_bytes: 0,
                        deps,
                    }
                })
                .collect();
            Graph::new("random", "unit", 0, specs).unwrap()
        })
}

proptest! {
    /// The solver relies on this (bound.rs, evict.rs): repeated deps in a file (this generator
    /// repeats them) give each input and consumer once, in topological order.
    #[test]
    fn inputs_and_consumers_are_distinct_and_ascending(g in dag()) {
        for v in 0..g.len() {
            prop_assert!(g.preds(v).windows(2).all(|w| w[0] < w[1]));
            prop_assert!(g.preds(v).iter().all(|&p| p < v));
            prop_assert!(g.succs(v).windows(2).all(|w| w[0] < w[1]));
            prop_assert!(g.succs(v).iter().all(|&s| s > v && g.preds(s).contains(&v)));
        }
    }

    #[test]
    fn cheapest_given_any_keeps_is_valid_and_simulates(g in dag(), bits in proptest::collection::vec(any::<bool>(), 144)) {
        let n = g.len();
        let keep: Vec<FixedBitSet> = (0..n)
            .map(|t| {
                let mut row = FixedBitSet::with_capacity(n);
                for i in 0..t {
                    if bits[(t * 12 + i) % bits.len()] {
                        row.insert(i);
                    }
                }
                row
            })
            .collect();
        let s = Schedule::cheapest_given_keeps(&g, keep).unwrap();
        s.validate(&g).unwrap();
        let plan = s.to_plan(&g);
        let sim = simulate(&g, &plan).unwrap();
        // No node is both kept and recomputed by Algorithm 2, so the plan runs every compute of R.
        prop_assert!((sim.cost - s.cost(&g)).abs() < 1e-9);
        // Nothing is left live at the end.
        prop_assert_eq!(*sim.live_after_step.last().unwrap(), 0);
        // Every node is computed in its own stage at least.
        prop_assert!(sim.computes >= n);
    }

    #[test]
    fn dropping_a_keep_never_makes_recomputation_cheaper(g in dag(), t in 1usize..12, i in 0usize..12) {
        let n = g.len();
        let all: Vec<FixedBitSet> = (0..n)
            .map(|t| { let mut r = FixedBitSet::with_capacity(n); r.insert_range(0..t); r })
            .collect();
        let full = Schedule::cheapest_given_keeps(&g, all.clone()).unwrap();
        prop_assert!((full.cost(&g) - g.total_cost()).abs() < 1e-9);
        let (t, i) = (t % n, i % n);
        let mut fewer = all;
        if i < t { fewer[t].set(i, false); }
        let s = Schedule::cheapest_given_keeps(&g, fewer).unwrap();
        prop_assert!(s.cost(&g) >= full.cost(&g) - 1e-9);
    }
}

#[test]
fn validate_rejects_broken_schedules() {
    let n = |id: u64, deps: &[u64]| NodeSpec {
        alternatives: Vec::new(),
        id,
        name: format!("n{id}"),
        kind: NodeKind::Forward,
        cost: 1.0,
        bytes: 1,
        workspace_bytes: 0,
        deps: deps.to_vec(),
    };
    // A chain 0 -> 1 -> 2.
    let g = Graph::new("c", "u", 0, vec![n(0, &[]), n(1, &[0]), n(2, &[1])]).unwrap();
    let mut s = Schedule::empty(3);
    let e = s.validate(&g).unwrap_err().to_string();
    assert!(e.contains("stage 0 does not compute 0 (n0)"), "{e}");
    for t in 0..3 {
        s.set_compute(t, t, true);
    }
    let e = s.validate(&g).unwrap_err().to_string();
    assert!(
        e.contains("stage 1 computes 1 (n1) but its input 0 (n0) is neither kept nor computed"),
        "{e}"
    );
    s.set_keep(1, 0, true);
    s.set_keep(2, 1, true);
    s.validate(&g).unwrap();
    assert_eq!(s.to_plan(&g).compute_count(), 3);
    s.set_compute(1, 2, true);
    let e = s.validate(&g).unwrap_err().to_string();
    assert!(
        e.contains("stage 1 computes 2 (n2), which is after it"),
        "{e}"
    );
    s.set_compute(1, 2, false);
    s.set_keep(1, 1, true);
    let e = s.validate(&g).unwrap_err().to_string();
    assert!(
        e.contains("stage 1 keeps 1 (n1), which is not before it"),
        "{e}"
    );
    // Keeping into stage 2 a tensor that stage 1 neither computed nor kept.
    let mut s = Schedule::empty(3);
    for t in 0..3 {
        s.set_compute(t, t, true);
    }
    s.set_compute(2, 1, true);
    s.set_keep(1, 0, true);
    s.set_keep(2, 0, true);
    s.validate(&g).unwrap();
    let mut broken = s.clone();
    broken.set_keep(1, 0, false);
    broken.set_compute(1, 0, true);
    broken.validate(&g).unwrap();
    let g2 = Graph::new("d", "u", 0, vec![n(0, &[]), n(1, &[]), n(2, &[0])]).unwrap();
    let mut t = Schedule::empty(3);
    for k in 0..3 {
        t.set_compute(k, k, true);
    }
    t.set_keep(2, 0, true);
    let e = t.validate(&g2).unwrap_err().to_string();
    assert!(
        e.contains("stage 2 keeps 0 (n0), which stage 1 neither computed nor kept"),
        "{e}"
    );
}
