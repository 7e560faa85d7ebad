//! Every benchmark graph the repository holds loads, and its checkpoint-all and checkpoint-last
//! plans simulate with the properties those strategies promise: Checkmate's seven training graphs
//! (data/graphs/checkmate) and our own random layered graphs of Moccasin's family at its four sizes,
//! read back through the node-link importer.

use checkmate_graph::generate::{random_layered, to_layered_node_link, LayeredParams};
use checkmate_graph::{simulate, Graph, NodeKind};
use checkmate_solver::baselines::{CheckpointAll, CheckpointLast};
use checkmate_solver::{solve, strategy_by_name, Error, SolveOptions, Status};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/graphs/checkmate");

/// (file, nodes, forward nodes)
const CHECKMATE: &[(&str, usize, usize)] = &[
    ("VGG16_256_224.json", 45, 22),
    ("VGG19_256_224.json", 51, 25),
    ("vgg_unet_32_416x608.json", 71, 35),
    ("fcn_8_vgg_32_416x608.json", 73, 36),
    ("segnet_32_416x608.json", 77, 38),
    ("MobileNet_512_224.json", 185, 92),
    ("ResNet50_256_224.json", 353, 176),
];

/// Moccasin's four random layered sizes and width factors.
const LAYERED: &[(usize, f64)] = &[(100, 0.27), (250, 0.43), (500, 0.36), (1000, 0.31)];

fn load(file: &str) -> Graph {
    Graph::read(format!("{DATA}/{file}")).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Our random layered graph, written in Moccasin's node-link form and read back.
fn layered(nodes: usize, width: f64) -> Graph {
    let g = random_layered(&LayeredParams::moccasin(nodes, width), 0).unwrap();
    Graph::from_json_str(&to_layered_node_link(&g), "generated").unwrap()
}

#[test]
fn every_graph_loads_and_checkpoint_all_simulates() {
    let mut graphs: Vec<(String, Graph, usize)> = CHECKMATE
        .iter()
        .map(|&(file, nodes, forward)| {
            let g = load(file);
            assert_eq!(g.len(), nodes, "{file}");
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
            (file.to_string(), g, forward)
        })
        .collect();
    for &(n, w) in LAYERED {
        graphs.push((format!("layered n{n}"), layered(n, w), n));
    }
    for (file, g, forward) in &graphs {
        assert_eq!(g.forward_nodes().count(), *forward, "{file}");
        let plan = CheckpointAll::schedule(g).to_plan(g);
        let sim = simulate(g, &plan).unwrap_or_else(|e| panic!("{file}: {e}"));
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
        let sol = solve(g, all.as_ref(), sim.peak_bytes, &SolveOptions::default()).unwrap();
        assert_eq!(sol.status, Status::Optimal);
        assert_eq!(sol.peak_bytes(), Some(sim.peak_bytes));
    }
}

#[test]
fn checkpoint_last_trades_compute_for_memory() {
    for &(file, ..) in CHECKMATE {
        let g = load(file);
        let all = simulate(&g, &CheckpointAll::schedule(&g).to_plan(&g)).unwrap();
        let last = simulate(&g, &CheckpointLast::schedule(&g).to_plan(&g)).unwrap();
        assert!(last.peak_bytes <= all.peak_bytes, "{file}");
        assert!(last.cost > all.cost, "{file}: checkpoint-last recomputes");
    }
}

#[test]
fn a_budget_below_the_strategy_needs_names_the_least_that_works() {
    let g = load("VGG16_256_224.json");
    let peak = CheckpointAll::peak_bytes(&g);
    let all = strategy_by_name("checkpoint-all").unwrap();
    let err = solve(&g, all.as_ref(), peak - 1, &SolveOptions::default()).unwrap_err();
    // Above the proven floor, a baseline's failure is "no plan found", not a proof.
    match &err {
        Error::NoPlanFound {
            least_feasible_bytes,
            budget_bytes,
            proven_floor_bytes,
            ..
        } => {
            assert_eq!(*least_feasible_bytes, Some(peak));
            assert_eq!(*budget_bytes, peak - 1);
            assert!(*proven_floor_bytes < peak);
        }
        other => panic!("expected NoPlanFound, got {other}"),
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
