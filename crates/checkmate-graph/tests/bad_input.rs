//! Every malformed graph, plan or budget gets an error that names what is wrong; never a panic.

use checkmate_graph::{Graph, PlanFile};

fn err(json: &str) -> String {
    Graph::from_json_str(json, "test.json")
        .unwrap_err()
        .to_string()
}

fn native(nodes: &str) -> String {
    format!(
        r#"{{"format": "checkmate-graph/1", "name": "t", "cost_unit": "us", "static_bytes": 0, "nodes": [{nodes}]}}"#
    )
}

const A: &str = r#"{"id": 0, "name": "a", "kind": "forward", "cost": 1, "bytes": 8, "deps": []}"#;

/// (case, graph JSON, fragments the message must contain)
fn cases() -> Vec<(&'static str, String, Vec<&'static str>)> {
    vec![
        (
            "malformed json",
            "{\"format\": ".into(),
            vec!["test.json", "malformed JSON"],
        ),
        ("not an object", "[1, 2]".into(), vec!["JSON object"]),
        (
            "unknown format",
            r#"{"format": "checkmate-graph/9", "nodes": []}"#.into(),
            vec!["checkmate-graph/9", "checkmate-graph/1"],
        ),
        (
            "no format, no links",
            r#"{"nodes": []}"#.into(),
            vec!["unknown", "node-link"],
        ),
        (
            "cycle",
            native(
                r#"{"id": 0, "name": "a", "kind": "forward", "cost": 1, "bytes": 8, "deps": [2]},
                   {"id": 1, "name": "b", "kind": "forward", "cost": 1, "bytes": 8, "deps": [0]},
                   {"id": 2, "name": "c", "kind": "forward", "cost": 1, "bytes": 8, "deps": [1]}"#,
            ),
            vec!["cycle", "0 (a)", "1 (b)", "2 (c)"],
        ),
        (
            "self loop",
            native(
                r#"{"id": 5, "name": "s", "kind": "forward", "cost": 1, "bytes": 8, "deps": [5]}"#,
            ),
            vec!["cycle", "5 (s)"],
        ),
        (
            "dangling dep",
            native(&format!(
                r#"{A}, {{"id": 1, "name": "b", "kind": "backward", "cost": 1, "bytes": 8, "deps": [7]}}"#
            )),
            vec!["node 1", "\"b\"", "id 7"],
        ),
        (
            "duplicate id",
            native(&format!(
                r#"{A}, {{"id": 0, "name": "b", "kind": "forward", "cost": 1, "bytes": 8, "deps": []}}"#
            )),
            vec!["duplicate node id 0", "\"a\"", "\"b\""],
        ),
        (
            "negative cost",
            native(
                r#"{"id": 3, "name": "neg", "kind": "forward", "cost": -1, "bytes": 8, "deps": []}"#,
            ),
            vec!["node 3 (neg)", "cost", "-1", "non-negative"],
        ),
        (
            "non-finite cost",
            native(
                r#"{"id": 3, "name": "big", "kind": "forward", "cost": 1e999, "bytes": 8, "deps": []}"#,
            ),
            vec!["malformed JSON"],
        ),
        (
            "string cost",
            native(
                r#"{"id": 3, "name": "str", "kind": "forward", "cost": "fast", "bytes": 8, "deps": []}"#,
            ),
            vec!["node 3 (str)", "cost", "finite"],
        ),
        (
            "missing bytes",
            native(r#"{"id": 3, "name": "nob", "kind": "forward", "cost": 1, "deps": []}"#),
            vec!["node 3 (nob)", "missing field `bytes`"],
        ),
        (
            "missing deps",
            native(r#"{"id": 3, "name": "nod", "kind": "forward", "cost": 1, "bytes": 8}"#),
            vec!["node 3 (nod)", "missing field `deps`"],
        ),
        (
            "fractional bytes",
            native(
                r#"{"id": 3, "name": "frac", "kind": "forward", "cost": 1, "bytes": 8.5, "deps": []}"#,
            ),
            vec!["node 3 (frac)", "bytes", "8.5", "integer"],
        ),
        (
            "bad kind",
            native(
                r#"{"id": 3, "name": "k", "kind": "sideways", "cost": 1, "bytes": 8, "deps": []}"#,
            ),
            vec!["node 3 (k)", "kind", "sideways", "forward"],
        ),
        ("no nodes", native(""), vec!["nodes", "at least one node"]),
        (
            "missing name",
            r#"{"format": "checkmate-graph/1", "nodes": []}"#.into(),
            vec!["missing field `name`"],
        ),
        (
            "networkx missing cost_ram",
            r#"{"nodes": [{"id": 0, "name": "x", "backward": false, "cost_cpu": 1}], "links": []}"#
                .into(),
            vec!["node 0 (x)", "cost_ram"],
        ),
        (
            "networkx dangling link",
            r#"{"nodes": [{"id": 0, "name": "x", "backward": false, "cost_cpu": 1, "cost_ram": 4}],
                "links": [{"source": 0, "target": 9}]}"#
                .into(),
            vec!["links[0]", "target", "9"],
        ),
        (
            "random layered negative duration",
            r#"{"nodes": [{"name": 0, "duration": -2, "out_cost": 4}], "links": []}"#.into(),
            vec!["node 0", "duration"],
        ),
    ]
}

#[test]
fn every_bad_graph_gets_a_message_naming_the_problem() {
    for (case, json, fragments) in cases() {
        let msg = err(&json);
        for f in fragments {
            assert!(msg.contains(f), "{case}: message {msg:?} lacks {f:?}");
        }
    }
}

#[test]
fn missing_file_names_the_path() {
    let msg = Graph::read("/nonexistent/dir/g.json")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("/nonexistent/dir/g.json"), "{msg}");
}

fn tiny() -> Graph {
    Graph::from_json_str(
        &native(&format!(
            r#"{A}, {{"id": 1, "name": "b", "kind": "loss", "cost": 1, "bytes": 8, "deps": [0]}}"#
        )),
        "t",
    )
    .unwrap()
}

#[test]
fn bad_plans_name_the_step_and_node() {
    let g = tiny();
    let plan = |steps: &str| {
        format!(
            r#"{{"format": "checkmate-plan/1", "graph": "t", "strategy": "x", "budget_bytes": null, "steps": [{steps}]}}"#
        )
    };
    let e = PlanFile::from_json_str(&plan(r#"{"compute": 42}"#), &g, "p.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("step 0") && e.contains("42"), "{e}");
    let e = PlanFile::from_json_str(&plan(r#"{"compute": 0}, {"jump": 1}"#), &g, "p.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("steps[1]") && e.contains("compute"), "{e}");
    let e = PlanFile::from_json_str(
        r#"{"format": "checkmate-plan/2", "graph": "t", "strategy": "x", "steps": []}"#,
        &g,
        "p.json",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("checkmate-plan/1"), "{e}");
}
