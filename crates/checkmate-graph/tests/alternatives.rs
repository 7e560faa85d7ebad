//! Nodes with several implementations: the format extension, plan files and the simulator.

use checkmate_graph::{choose_implementations, simulate, Graph, Plan, PlanError, PlanFile, Step};

/// A chain a -> b -> loss -> db -> da; `b` has a faster implementation with a larger workspace
/// and a slower one with none.
const GRAPH: &str = r#"{
  "format": "checkmate-graph/1", "name": "alt", "cost_unit": "us", "static_bytes": 0,
  "nodes": [
    {"id": 0, "name": "a", "kind": "forward", "cost": 1, "bytes": 10, "deps": []},
    {"id": 1, "name": "b", "kind": "forward", "cost": 4, "bytes": 10, "deps": [0],
     "workspace_bytes": 20,
     "alternatives": [{"name": "wide", "cost": 2, "workspace_bytes": 50},
                      {"name": "lean", "cost": 6}]},
    {"id": 2, "name": "loss", "kind": "loss", "cost": 1, "bytes": 1, "deps": [1]},
    {"id": 3, "name": "db", "kind": "backward", "cost": 1, "bytes": 10, "deps": [0, 1, 2]},
    {"id": 4, "name": "da", "kind": "backward", "cost": 1, "bytes": 10, "deps": [3]}
  ]
}"#;

fn graph() -> Graph {
    Graph::from_json_str(GRAPH, "test").unwrap()
}

fn plan(implementation_of_b: u16) -> Plan {
    use Step::*;
    let steps = vec![
        Compute(0),
        Compute(1),
        Compute(2),
        Compute(3),
        Free(2),
        Free(1),
        Free(0),
        Compute(4),
    ];
    let mut implementations = vec![0u16; steps.len()];
    implementations[1] = implementation_of_b;
    Plan {
        steps,
        implementations,
    }
}

#[test]
fn reads_alternatives_and_round_trips_them() {
    let g = graph();
    let b = g.node(1);
    assert_eq!(b.implementation_count(), 3);
    assert_eq!(b.implementation_name(1), "wide");
    assert_eq!((b.cost_with(2), b.workspace_with(2)), (6.0, 0));
    assert_eq!(b.least_workspace(), 0);
    assert_eq!(b.least_cost(), 2.0);
    assert_eq!(b.leanest_implementation(), 2);
    assert!(g.has_alternatives());
    let again = Graph::from_json_str(&g.to_json(), "again").unwrap();
    assert_eq!(again.nodes(), g.nodes());
    // The least feasible budget counts the leanest implementation: b with a (10 + 10 + 0), not 40.
    assert_eq!(g.min_feasible_activation_bytes(), 31);
    let lean = g.leanest();
    assert!(!lean.has_alternatives());
    assert_eq!((lean.node(1).cost, lean.node(1).workspace_bytes), (6.0, 0));
}

#[test]
fn a_graph_without_alternatives_reads_as_before() {
    let g = graph();
    let text = g.leanest().to_json();
    assert!(!text.contains("alternatives"));
}

#[test]
fn the_simulator_charges_the_chosen_implementation() {
    let g = graph();
    let by_default = simulate(&g, &plan(0)).unwrap();
    let wide = simulate(&g, &plan(1)).unwrap();
    let lean = simulate(&g, &plan(2)).unwrap();
    // After computing b: a and b live (20 bytes) plus the workspace.
    assert_eq!(by_default.peak_bytes, 40);
    assert_eq!(wide.peak_bytes, 70);
    assert_eq!(lean.peak_bytes, 31); // db with a, b, loss live
    assert_eq!(wide.cost, by_default.cost - 2.0);
    assert_eq!(lean.cost, by_default.cost + 2.0);
    // No implementation list at all means the defaults.
    assert_eq!(simulate(&g, &Plan::new(plan(0).steps)).unwrap(), by_default);
}

#[test]
fn bad_implementations_are_rejected_with_the_step() {
    let g = graph();
    let err = simulate(&g, &plan(3)).unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::UnknownImplementation {
                step: 1,
                implementation: 3,
                count: 3,
                ..
            }
        ),
        "{err}"
    );
    let mut on_a = plan(0);
    on_a.implementations[0] = 1;
    assert!(matches!(
        simulate(&g, &on_a).unwrap_err(),
        PlanError::UnknownImplementation { step: 0, .. }
    ));
    let mut on_free = plan(0);
    on_free.implementations[4] = 1;
    assert!(simulate(&g, &on_free).is_err());
    let mut short = plan(0);
    short.implementations.pop();
    let err = simulate(&g, &short).unwrap_err();
    assert!(err.to_string().contains("one per step"), "{err}");
}

#[test]
fn plan_files_name_implementations() {
    let g = graph();
    let file = PlanFile {
        graph: "alt".into(),
        strategy: "test".into(),
        budget_bytes: None,
        predicted: None,
        plan: plan(1),
    };
    let text = file.to_json(&g);
    assert!(text.contains(r#"{"compute": 1, "impl": "wide"}"#), "{text}");
    assert_eq!(text.matches("impl").count(), 1);
    let back = PlanFile::from_json_str(&text, &g, "test").unwrap();
    assert_eq!(back.plan, plan(1));
    // A plan with only defaults keeps no list.
    let plain = PlanFile {
        plan: Plan::new(plan(0).steps),
        ..file.clone()
    };
    let back = PlanFile::from_json_str(&plain.to_json(&g), &g, "test").unwrap();
    assert!(back.plan.implementations.is_empty());
    // Unknown names are errors that list the node's implementations.
    let bad = text.replace("\"wide\"", "\"fast\"");
    let err = PlanFile::from_json_str(&bad, &g, "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"default\", \"wide\", \"lean\""), "{err}");
}

#[test]
fn malformed_alternatives_are_errors_naming_the_node() {
    let dup = GRAPH.replace("\"lean\"", "\"wide\"");
    let err = Graph::from_json_str(&dup, "test").unwrap_err().to_string();
    assert!(err.contains("1 (b)") && err.contains("unique"), "{err}");
    let named_default = GRAPH.replace("\"lean\"", "\"default\"");
    assert!(Graph::from_json_str(&named_default, "test").is_err());
    let negative = GRAPH.replace("\"cost\": 6", "\"cost\": -6");
    let err = Graph::from_json_str(&negative, "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("cost"), "{err}");
    let not_a_list = GRAPH.replace(
        r#"[{"name": "wide", "cost": 2, "workspace_bytes": 50},
                      {"name": "lean", "cost": 6}]"#,
        "3",
    );
    assert!(Graph::from_json_str(&not_a_list, "test").is_err());
}

#[test]
fn choosing_implementations_takes_the_cheapest_that_fits() {
    let g = graph();
    let steps = plan(0).steps;
    // Room for the wide one: cheapest.
    let wide = choose_implementations(&g, &Plan::new(steps.clone()), Some(70));
    assert_eq!(wide.implementation(1), 1);
    assert_eq!(simulate(&g, &wide).unwrap().peak_bytes, 70);
    // Room for the default only.
    let default = choose_implementations(&g, &Plan::new(steps.clone()), Some(45));
    assert_eq!(default.implementation(1), 0);
    assert!(default.implementations.is_empty());
    // Room for nothing but the lean one; below it, still the lean one (least workspace).
    for limit in [35, 10] {
        let lean = choose_implementations(&g, &Plan::new(steps.clone()), Some(limit));
        assert_eq!(lean.implementation(1), 2);
    }
    // No limit: never above the lean peak (31).
    let free = choose_implementations(&g, &Plan::new(steps.clone()), None);
    assert_eq!(simulate(&g, &free).unwrap().peak_bytes, 31);
    assert_eq!(g.least_total_cost(), g.total_cost() - 2.0);
}
