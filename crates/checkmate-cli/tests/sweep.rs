//! End-to-end: `checkmate sweep` on the shared VGG16 graph (table, JSON, SVG).

const VGG16: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/graphs/checkmate/VGG16_256_224.json"
);

mod common;
use common::run as checkmate;

#[test]
fn sweep_json_and_svg_cover_every_point() {
    let dir = std::env::temp_dir().join(format!("checkmate-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("frontier.svg");
    let (ok, out, err) = checkmate(&[
        "sweep",
        "--graph",
        VGG16,
        "--strategies",
        "checkpoint-all,chen-greedy,ap-sqrtn,griewank",
        "--points",
        "3",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["budgets"].as_array().unwrap().len(), 3);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 12);
    let peak = v["checkpoint_all_peak_bytes"].as_u64().unwrap();
    for p in points {
        let budget = p["budget_bytes"].as_u64().unwrap();
        match p["status"].as_str().unwrap() {
            "feasible" | "optimal" => {
                assert!(p["peak_bytes"].as_u64().unwrap() <= budget, "{p}");
                assert!(p["overhead"].as_f64().unwrap() >= 0.0, "{p}");
            }
            "infeasible" => {
                assert!(p["cost"].is_null(), "{p}");
                assert!(p["error"].as_str().unwrap().contains("too small"), "{p}");
            }
            "no-plan-found" => {
                assert!(p["cost"].is_null(), "{p}");
                assert!(
                    p["error"].as_str().unwrap().contains("found no plan"),
                    "{p}"
                );
            }
            other => panic!("unexpected status {other}: {p}"),
        }
        if p["strategy"] == "checkpoint-all" {
            assert_eq!(p["status"] == "no-plan-found", budget < peak, "{p}");
        }
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    for label in [
        "activation budget (GiB)",
        "compute overhead (%)",
        "chen-greedy",
        "griewank",
    ] {
        assert!(text.contains(label), "svg lacks {label}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sweep_table_has_a_row_per_budget_and_rejects_unknown_strategies() {
    let (ok, out, err) = checkmate(&[
        "sweep",
        "--graph",
        VGG16,
        "--strategies",
        "chen-sqrtn,ap-greedy",
        "--points",
        "4",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("chen-sqrtn") && out.contains("ap-greedy"),
        "{out}"
    );
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("GiB") && l.contains('%'))
            .count(),
        4,
        "{out}"
    );
    let (ok, _, err) = checkmate(&["sweep", "--graph", VGG16, "--strategies", "nope"]);
    assert!(!ok);
    assert!(err.contains("unknown strategy"), "{err}");
}
