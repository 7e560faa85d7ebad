//! Every shared benchmark graph loads, and its checkpoint-all and checkpoint-last plans simulate with
//! the properties those strategies promise.

use checkmate_graph::{simulate, Graph, NodeKind};
use checkmate_solver::baselines::{CheckpointAll, CheckpointLast};
use checkmate_solver::{solve, strategy_by_name, Error, SolveOptions, Status};

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/graphs");

/// (file, nodes, forward nodes)
const GRAPHS: &[(&str, usize, usize)] = &[
    ("checkmate/VGG16_256_224.json", 45, 22),
    ("checkmate/VGG19_256_224.json", 51, 25),
    ("checkmate/vgg_unet_32_416x608.json", 71, 35),
    ("checkmate/fcn_8_vgg_32_416x608.json", 73, 36),
    ("checkmate/segnet_32_416x608.json", 77, 38),
    ("checkmate/MobileNet_512_224.json", 185, 92),
    ("checkmate/ResNet50_256_224.json", 353, 176),
    (
        "random_layered/random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json",
        100,
        100,
    ),
    (
        "random_layered/random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json",
        250,
        250,
    ),
    (
        "random_layered/random_layered_n500_w0.36_nlv0.75_ed0.2_scd0.14.json",
        500,
        500,
    ),
    (
        "random_layered/random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json",
        1000,
        1000,
    ),
];

fn load(file: &str) -> Graph {
    Graph::read(format!("{SHARED}/{file}")).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn every_shared_graph_loads_and_checkpoint_all_simulates() {
    for &(file, nodes, forward) in GRAPHS {
        let g = load(file);
        assert_eq!(g.len(), nodes, "{file}");
        assert_eq!(g.forward_nodes().count(), forward, "{file}");
        if file.starts_with("checkmate/") {
            assert_eq!(
                g.nodes()
                    .iter()
                    .filter(|n| n.kind == NodeKind::Loss)
                    .count(),
                1,
                "{file}"
            );
            assert_eq!(
                g.node(forward).name,
                "Loss",
                "{file}: the loss follows the forward pass"
            );
        }
        let plan = CheckpointAll::schedule(&g).to_plan(&g);
        let sim = simulate(&g, &plan).unwrap_or_else(|e| panic!("{file}: {e}"));
        // No recomputation: each node once, cost = the sum of costs.
        assert_eq!(sim.computes, g.len(), "{file}");
        assert!(
            (sim.cost - g.total_cost()).abs() <= 1e-9 * g.total_cost(),
            "{file}"
        );
        assert!(
            sim.peak_bytes >= g.min_feasible_activation_bytes(),
            "{file}"
        );
        assert_eq!(
            *sim.live_after_step.last().unwrap(),
            0,
            "{file}: nothing live at the end"
        );
        // The same through the strategy interface, at exactly its peak.
        let all = strategy_by_name("checkpoint-all").unwrap();
        let sol = solve(&g, all.as_ref(), sim.peak_bytes, &SolveOptions::default()).unwrap();
        assert_eq!(sol.status, Status::Optimal);
        assert_eq!(sol.peak_bytes(), Some(sim.peak_bytes));
    }
}

#[test]
fn checkpoint_last_trades_compute_for_memory() {
    for &(file, ..) in &GRAPHS[..7] {
        let g = load(file);
        let all = simulate(&g, &CheckpointAll::schedule(&g).to_plan(&g)).unwrap();
        let last = simulate(&g, &CheckpointLast::schedule(&g).to_plan(&g)).unwrap();
        assert!(last.peak_bytes <= all.peak_bytes, "{file}");
        assert!(last.cost > all.cost, "{file}: checkpoint-last recomputes");
    }
}

#[test]
fn a_budget_below_the_strategy_needs_names_the_least_that_works() {
    let g = load("checkmate/VGG16_256_224.json");
    let peak = CheckpointAll::peak_bytes(&g);
    let all = strategy_by_name("checkpoint-all").unwrap();
    let err = solve(&g, all.as_ref(), peak - 1, &SolveOptions::default()).unwrap_err();
    match &err {
        Error::BudgetTooSmall {
            least_feasible_bytes,
            budget_bytes,
            ..
        } => {
            assert_eq!(*least_feasible_bytes, Some(peak));
            assert_eq!(*budget_bytes, peak - 1);
        }
        other => panic!("expected BudgetTooSmall, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&peak.to_string()) && msg.contains("checkpoint-all"),
        "{msg}"
    );
}

#[test]
fn unknown_strategy_lists_the_known_ones() {
    let msg = strategy_by_name("magic").err().unwrap().to_string();
    assert!(
        msg.contains("\"magic\"") && msg.contains("checkpoint-all"),
        "{msg}"
    );
}
