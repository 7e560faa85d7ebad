//! The simulator enforces every rule of SPEC.md section 2 and measures peak and cost exactly.

use checkmate_graph::{simulate, Graph, NodeKind, NodeSpec, Plan, PlanError, Step};

fn graph() -> Graph {
    // a -> b -> loss; a, b feed the backward nodes; b has 50 bytes of workspace.
    let n = |id, kind, bytes, ws, deps: &[u64]| NodeSpec {
        alternatives: Vec::new(),
        id,
        name: format!("v{id}"),
        kind,
        cost: (id - 9) as f64,
        bytes,
        workspace_bytes: ws,
        deps: deps.to_vec(),
    };
    Graph::new(
        "g",
        "us",
        1000,
        vec![
            n(10, NodeKind::Forward, 100, 0, &[]),
            n(11, NodeKind::Forward, 200, 50, &[10]),
            n(12, NodeKind::Loss, 4, 0, &[11]),
            n(13, NodeKind::Backward, 200, 0, &[11, 12]),
            n(14, NodeKind::Backward, 100, 0, &[10, 13]),
        ],
    )
    .unwrap()
}

use Step::{Compute as C, Free as F};

#[test]
fn peak_counts_inputs_output_and_workspace_at_each_compute() {
    let g = graph();
    let plan = Plan::new(vec![
        C(0),
        C(1),
        C(2),
        C(3),
        F(1),
        F(2),
        C(4),
        F(0),
        F(3),
        F(4),
    ]);
    let s = simulate(&g, &plan).unwrap();
    // After computing 3: 100 + 200 + 4 + 200 = 504; computing 1 with workspace: 300 + 50.
    assert_eq!(s.peak_bytes, 504);
    assert_eq!(s.peak_step, 3);
    assert_eq!(s.cost, 1.0 + 2.0 + 3.0 + 4.0 + 5.0);
    assert_eq!(
        s.live_after_step,
        vec![100, 300, 304, 504, 304, 300, 400, 300, 100, 0]
    );
    assert_eq!(s.computes, 5);
}

#[test]
fn workspace_alone_can_set_the_peak() {
    let g = graph();
    let plan = Plan::new(vec![C(0), C(1), F(0), C(2), C(0), C(3), F(1), F(2), C(4)]);
    let s = simulate(&g, &plan).unwrap();
    assert_eq!(s.peak_bytes, 504);
    let plan = Plan::new(vec![C(0), C(1)]);
    let e = simulate(&g, &plan).unwrap_err();
    assert!(matches!(e, PlanError::NeverComputed { .. }), "{e}");
}

#[test]
fn recomputation_adds_cost() {
    let g = graph();
    let plan = Plan::new(vec![C(0), C(1), F(0), C(2), C(3), F(1), F(2), C(0), C(4)]);
    let s = simulate(&g, &plan).unwrap();
    assert_eq!(s.cost, 15.0 + 1.0);
    assert!((s.overhead(&g) - 1.0 / 15.0).abs() < 1e-12);
}

#[test]
fn every_rule_violation_is_reported_with_step_and_node() {
    let g = graph();
    let cases: Vec<(Vec<Step>, &str)> = vec![
        (vec![C(1)], "step 0: compute 11 (v11) needs input 10 (v10)"),
        (
            vec![C(0), C(0)],
            "step 1: compute 10 (v10), which is already live",
        ),
        (vec![F(0)], "step 0: free 10 (v10), which is not live"),
        (vec![C(0), F(0), F(0)], "step 2: free 10 (v10)"),
        (
            vec![C(0), C(1), C(2), C(3)],
            "node 14 (v14) is never computed",
        ),
        (vec![C(9)], "node index 9 is out of range"),
    ];
    for (steps, expected) in cases {
        let e = simulate(&g, &Plan::new(steps.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(expected), "{steps:?}: {e:?} lacks {expected:?}");
    }
}
