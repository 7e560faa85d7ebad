//! End-to-end: the `checkmate` binary on the shared VGG16 graph.

const VGG16: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/graphs/checkmate/VGG16_256_224.json"
);

mod common;

/// Runs `checkmate`: success, the `--json` object, stderr.
fn checkmate(args: &[&str]) -> (bool, serde_json::Value, String) {
    let (ok, stdout, stderr) = common::run(args);
    (ok, common::last_json(&stdout), stderr)
}

#[test]
fn solve_writes_a_plan_that_simulate_accepts_with_the_same_numbers() {
    let dir = std::env::temp_dir().join(format!("checkmate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("p.json");
    let plan_s = plan.to_str().unwrap();
    let (ok, solved, err) = checkmate(&[
        "solve",
        "--graph",
        VGG16,
        "--strategy",
        "checkpoint-all",
        "--budget",
        "100%",
        "--json",
        "--plan-out",
        plan_s,
    ]);
    assert!(ok, "{err}");
    for key in [
        "strategy",
        "status",
        "cost",
        "lower_bound",
        "peak_bytes",
        "budget_bytes",
        "solve_seconds",
    ] {
        assert!(
            solved.get(key).is_some(),
            "solve --json lacks {key}: {solved}"
        );
    }
    assert_eq!(solved["status"], "optimal");
    let (ok, sim, err) = checkmate(&["simulate", "--graph", VGG16, "--plan", plan_s, "--json"]);
    assert!(ok, "{err}");
    assert_eq!(sim["valid"], true);
    assert_eq!(sim["peak_bytes"], solved["peak_bytes"]);
    assert_eq!(sim["cost"], solved["cost"]);
    assert_eq!(sim["within_budget"], true);
    assert_eq!(sim["matches_prediction"], true);
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs `checkmate`: its exit code, the `--json` object, stderr.
fn checkmate_code(args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_checkmate"))
        .args(args)
        .output()
        .expect("binary runs");
    (
        out.status.code(),
        common::last_json(&String::from_utf8_lossy(&out.stdout)),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn too_small_budget_fails_naming_the_least_feasible_budget() {
    let (_, full, _) = checkmate(&[
        "solve",
        "--graph",
        VGG16,
        "--strategy",
        "checkpoint-all",
        "--budget",
        "100%",
        "--json",
    ]);
    let peak = full["peak_bytes"].as_u64().unwrap();
    let solve_at = |strategy: &str, budget: u64| {
        checkmate_code(&[
            "solve",
            "--graph",
            VGG16,
            "--strategy",
            strategy,
            "--budget",
            &budget.to_string(),
            "--json",
        ])
    };
    // Above the proven floor, checkpoint-all's failure proves nothing: "no plan found", exit 3.
    let (code, out, err) = solve_at("checkpoint-all", peak - 1);
    assert_eq!(code, Some(3), "{err}");
    assert_eq!(out["status"], "no-plan-found");
    assert_eq!(out["least_feasible_budget_bytes"].as_u64(), Some(peak));
    let floor = out["proven_lower_bound_bytes"].as_u64().unwrap();
    assert!(floor < peak - 1, "{out}");
    assert!(
        err.contains(&peak.to_string()) && err.contains("found no plan"),
        "{err}"
    );
    assert!(!err.contains("too small"), "{err}");
    // Below it, every strategy's answer is proven: "infeasible", exit 2, naming the floor.
    for strategy in ["checkpoint-all", "lp-round"] {
        let (code, out, err) = solve_at(strategy, floor - 1);
        assert_eq!(code, Some(2), "{strategy}: {err}");
        assert_eq!(out["status"], "infeasible", "{strategy}");
        assert_eq!(out["proven_lower_bound_bytes"].as_u64(), Some(floor));
        assert!(err.contains(&format!("less than {floor}")), "{err}");
    }
}

#[test]
fn bad_input_gets_a_clear_error_and_no_panic() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "solve",
                "--graph",
                "/no/such/graph.json",
                "--budget",
                "1GiB",
                "--strategy",
                "checkpoint-all",
            ],
            "/no/such/graph.json",
        ),
        (
            &[
                "solve",
                "--graph",
                VGG16,
                "--budget",
                "12 parsecs",
                "--strategy",
                "checkpoint-all",
            ],
            "cannot parse budget",
        ),
        (
            &[
                "solve",
                "--graph",
                VGG16,
                "--budget",
                "50%",
                "--strategy",
                "magic",
            ],
            "unknown strategy",
        ),
        (
            &["simulate", "--graph", VGG16, "--plan", "/no/such/plan.json"],
            "/no/such/plan.json",
        ),
    ];
    for (args, expected) in cases {
        let (ok, _, err) = checkmate(args);
        assert!(!ok, "{args:?} should fail");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn graph_exports_a_zoo_model_whose_forward_bytes_match_checkmate_vgg16() {
    let out = std::env::temp_dir().join(format!("checkmate-vgg16-{}.json", std::process::id()));
    let out_s = out.to_str().unwrap();
    let (ok, summary, err) = checkmate(&[
        "graph",
        "--model",
        "vgg16",
        "--batch",
        "256",
        "--image-size",
        "224",
        "-o",
        out_s,
        "--json",
    ]);
    assert!(ok, "{err}");
    assert_eq!(summary["nodes"], 45);
    let ours: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(VGG16).unwrap()).unwrap();
    let fwd_ours: Vec<u64> = ours["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["kind"] == "forward")
        .map(|n| n["bytes"].as_u64().unwrap())
        .collect();
    let fwd_ref: Vec<u64> = reference["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["backward"] == false)
        .map(|n| n["cost_ram"].as_u64().unwrap())
        .collect();
    assert_eq!(fwd_ours, fwd_ref);
    // The exported file is a graph every other command reads.
    let (ok, _, err) = checkmate(&[
        "solve",
        "--graph",
        out_s,
        "--strategy",
        "checkpoint-all",
        "--budget",
        "100%",
        "--json",
    ]);
    assert!(ok, "{err}");
    std::fs::remove_file(&out).ok();
}

#[test]
fn model_is_accepted_wherever_graph_is() {
    let (ok, solved, err) = checkmate(&[
        "solve",
        "--model",
        "mlp",
        "--batch",
        "8",
        "--strategy",
        "checkpoint-all",
        "--budget",
        "100%",
        "--json",
    ]);
    assert!(ok, "{err}");
    assert_eq!(solved["status"], "optimal");
    let (ok, _, err) = checkmate(&["solve", "--model", "vgg16", "--budget", "50%"]);
    assert!(!ok);
    assert!(err.contains("--batch"), "{err}");
    let (ok, _, err) = checkmate(&[
        "solve", "--model", "alexnet", "--batch", "2", "--budget", "50%",
    ]);
    assert!(!ok);
    assert!(
        err.contains("unknown model") && err.contains("vgg16"),
        "{err}"
    );
}

/// A graph with implementation alternatives: `solve` writes the chosen kernels into the plan file
/// and `simulate` reads them back with the same peak and cost (docs/IMPLEMENTATIONS.md).
#[test]
fn plans_name_the_implementations_they_use() {
    let dir = std::env::temp_dir().join(format!("checkmate-cli-alt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let graph = dir.join("g.json");
    std::fs::write(
        &graph,
        r#"{"format": "checkmate-graph/1", "name": "alt", "cost_unit": "us", "static_bytes": 0,
  "nodes": [
    {"id": 0, "name": "a", "kind": "forward", "cost": 1, "bytes": 10, "deps": []},
    {"id": 1, "name": "b", "kind": "forward", "cost": 5, "bytes": 10, "deps": [0],
     "alternatives": [{"name": "fast", "cost": 1, "workspace_bytes": 40}]},
    {"id": 2, "name": "loss", "kind": "loss", "cost": 1, "bytes": 1, "deps": [1]},
    {"id": 3, "name": "db", "kind": "backward", "cost": 1, "bytes": 10, "deps": [0, 1, 2]},
    {"id": 4, "name": "da", "kind": "backward", "cost": 1, "bytes": 10, "deps": [3]}
  ]}"#,
    )
    .unwrap();
    let (g, plan) = (graph.to_str().unwrap(), dir.join("p.json"));
    let plan_s = plan.to_str().unwrap();
    for (strategy, budget, fast) in [
        ("milp", "100", true),
        ("milp", "35", false),
        ("chen-sqrtn", "100", true),
    ] {
        let (ok, solved, err) = checkmate(&[
            "solve",
            "--graph",
            g,
            "--strategy",
            strategy,
            "--budget",
            budget,
            "--json",
            "--plan-out",
            plan_s,
        ]);
        assert!(ok, "{strategy} at {budget}: {err}");
        let text = std::fs::read_to_string(&plan).unwrap();
        assert_eq!(
            text.contains(r#""impl": "fast""#),
            fast,
            "{strategy} at {budget}: {text}"
        );
        let (ok, sim, err) = checkmate(&["simulate", "--graph", g, "--plan", plan_s, "--json"]);
        assert!(ok, "{err}");
        assert_eq!(sim["peak_bytes"], solved["peak_bytes"]);
        assert_eq!(sim["cost"], solved["cost"]);
        assert_eq!(sim["matches_prediction"], true);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn solve_prints_its_bound_with_the_gap_left() {
    let (ok, out, err) = common::run(&[
        "solve",
        "--graph",
        VGG16,
        "--strategy",
        "milp",
        "--budget",
        "95%",
        "--threads",
        "1",
    ]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("lower bound"))
        .unwrap_or_else(|| panic!("no bound line: {out}"));
    // Proven optimal: the bound is the plan's cost, and no gap is left.
    assert!(out.contains("status       optimal"), "{out}");
    assert!(
        line.contains("vs no recomputation; the plan is at most 0.00% above the optimum"),
        "{line}"
    );
}
