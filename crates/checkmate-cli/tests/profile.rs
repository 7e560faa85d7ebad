//! End-to-end: `checkmate profile` on a tiny MLP (a second or two in a debug build).

use std::path::PathBuf;

mod common;
use common::run as checkmate;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("checkmate-profile-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const TINY: [&str; 8] = [
    "--model",
    "mlp",
    "--image-size",
    "8",
    "--width",
    "32",
    "--warmup",
    "1",
];

fn last_json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.lines().last().expect("some output")).expect("last line is JSON")
}

#[test]
fn profile_writes_a_cost_table_that_graph_accepts() {
    let dir = temp_dir("table");
    let table = dir.join("costs.json");
    let mut args = vec!["profile"];
    args.extend(TINY);
    args.extend([
        "--batch",
        "4",
        "--repeats",
        "3",
        "-o",
        table.to_str().unwrap(),
        "--json",
    ]);
    let (ok, out, err) = checkmate(&args);
    assert!(ok, "{err}");
    let v = last_json(&out);
    assert_eq!(v["model"], "mlp");
    assert_eq!(v["batch"], 4);
    assert_eq!(v["measured"], true);
    let nodes = v["nodes"].as_u64().unwrap();
    assert!(nodes >= 7, "{v}");
    let total = v["total_seconds"].as_f64().unwrap();
    let parts = v["forward_seconds"].as_f64().unwrap()
        + v["loss_seconds"].as_f64().unwrap()
        + v["backward_seconds"].as_f64().unwrap();
    assert!(total > 0.0 && (total - parts).abs() < 1e-9 * total.max(1.0));
    assert_eq!(v["profiles"][0]["repeats"], 3);
    // The file is checkmate-costs/1 with one positive entry per node.
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    assert_eq!(file["format"], "checkmate-costs/1");
    assert_eq!(file["batch"], 4);
    let entries = file["nodes"].as_array().unwrap();
    assert_eq!(entries.len() as u64, nodes);
    // (Bytes may be 0: the first layer's backward node produces no input gradient.)
    assert!(entries
        .iter()
        .all(|n| n["seconds"].as_f64().unwrap() > 0.0 && n["bytes"].as_u64().is_some()));
    assert!(entries.iter().any(|n| n["bytes"].as_u64().unwrap() > 0));
    // The rest of a step: the update and the batch, and the executor's time per plan step.
    assert!(file["update_seconds"].as_f64().unwrap() > 0.0, "{file}");
    assert!(file["batch_seconds"].as_f64().unwrap() > 0.0, "{file}");
    assert!(file["plan_step_overhead_seconds"].as_f64().unwrap() >= 0.0);
    // `train --costs FILE` predicts the whole step: kernels + executor + update + batch.
    let mut t = vec!["train"];
    t.extend(&TINY[..6]);
    t.extend([
        "--batch",
        "4",
        "--costs",
        table.to_str().unwrap(),
        "--steps",
        "2",
        "--baseline-steps",
        "0",
        "--json",
    ]);
    let (ok, out, err) = checkmate(&t);
    assert!(ok, "{err}");
    let r = last_json(&out);
    let kernels = r["predicted_seconds"].as_f64().unwrap();
    let step = r["predicted_step_seconds"].as_f64().unwrap();
    let parts = kernels
        + r["predicted_interpreter_seconds"].as_f64().unwrap()
        + r["predicted_update_seconds"].as_f64().unwrap()
        + r["predicted_batch_seconds"].as_f64().unwrap();
    assert!((step - parts).abs() <= 1e-12 * step.max(1.0), "{r}");
    assert!(step > kernels, "{r}");
    // `--costs FILE` builds the graph with the measured seconds.
    let graph_file = dir.join("graph.json");
    let mut g = vec!["graph"];
    g.extend(&TINY[..6]);
    g.extend([
        "--batch",
        "4",
        "--costs",
        table.to_str().unwrap(),
        "-o",
        graph_file.to_str().unwrap(),
    ]);
    let (ok, _, err) = checkmate(&g);
    assert!(ok, "{err}");
    let graph: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&graph_file).unwrap()).unwrap();
    assert_eq!(graph["cost_unit"], "s");
    let sum: f64 = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["cost"].as_f64().unwrap())
        .sum();
    assert!((sum - total).abs() < 1e-9, "{sum} vs {total}");
    // At another batch the table is refused with a message naming the batch.
    g[8] = "8";
    let (ok, _, err) = checkmate(&g);
    assert!(!ok);
    assert!(err.contains("batch"), "{err}");
    // A second profile compared with the first reports an agreement object.
    let mut again = vec!["profile"];
    again.extend(TINY);
    again.extend([
        "--batch",
        "4",
        "--repeats",
        "3",
        "--compare",
        table.to_str().unwrap(),
        "--json",
    ]);
    let (ok, out, err) = checkmate(&again);
    assert!(ok, "{err}");
    let cmp = &last_json(&out)["compare"];
    assert!(cmp["total_rel_diff"].as_f64().unwrap() >= 0.0, "{cmp}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fitted_batches_and_plan_checks() {
    let dir = temp_dir("fit");
    let table = dir.join("b3.json");
    let fit = dir.join("fit.json");
    let mut args = vec!["profile"];
    args.extend(TINY);
    args.extend([
        "--batch",
        "3",
        "--batches",
        "2,4",
        "--repeats",
        "3",
        "-o",
        table.to_str().unwrap(),
        "--fit-out",
        fit.to_str().unwrap(),
        "--check-plan",
        "checkpoint-all,checkpoint-last",
        "--check-repeats",
        "2",
        "--json",
    ]);
    let (ok, out, err) = checkmate(&args);
    assert!(ok, "{err}");
    let v = last_json(&out);
    // Batch 3 was not profiled: the table comes from the fit over 2 and 4.
    assert_eq!(v["measured"], false);
    assert_eq!(v["fit"]["batches"], serde_json::json!([2, 4]));
    assert_eq!(v["profiles"].as_array().unwrap().len(), 2);
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    assert_eq!(t["batch"], 3);
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fit).unwrap()).unwrap();
    assert_eq!(
        f["nodes"].as_array().unwrap().len(),
        t["nodes"].as_array().unwrap().len()
    );
    // Both plans ran; checkpoint-last recomputes, so it computes more and predicts more.
    let checks = v["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2);
    let (all, last) = (&checks[0], &checks[1]);
    assert_eq!(all["computes"].as_u64(), v["nodes"].as_u64());
    assert!(last["computes"].as_u64() > all["computes"].as_u64());
    assert!(last["predicted_seconds"].as_f64() > all["predicted_seconds"].as_f64());
    // Relative to checkpoint-all (run in the same rounds): exactly 0 for checkpoint-all itself.
    assert!(all["rel_error_vs_checkpoint_all"].as_f64().unwrap().abs() < 1e-12);
    assert!(last["rel_error_vs_checkpoint_all"]
        .as_f64()
        .unwrap()
        .is_finite());
    for c in checks {
        assert!(c["measured_seconds"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["rel_error"].as_f64().unwrap().is_finite(), "{c}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn human_output_and_bad_arguments() {
    let mut args = vec!["profile"];
    args.extend(TINY);
    args.extend(["--batch", "2", "--repeats", "2", "--top", "3"]);
    let (ok, out, err) = checkmate(&args);
    assert!(ok, "{err}");
    assert!(out.contains("slowest nodes"), "{out}");
    assert!(out.contains("per checkpoint-all step"), "{out}");
    assert!(out.contains("workspace: none"), "{out}");
    let (ok, _, err) = checkmate(&[
        "profile",
        "--model",
        "mlp",
        "--batch",
        "2",
        "--batches",
        "2",
    ]);
    assert!(!ok);
    assert!(err.contains("two or more"), "{err}");
    let (ok, _, err) = checkmate(&[
        "profile",
        "--model",
        "mlp",
        "--batch",
        "2",
        "--repeats",
        "0",
    ]);
    assert!(!ok);
    assert!(err.contains("--repeats"), "{err}");
    let (ok, _, err) = checkmate(&["profile", "--model", "nosuch", "--batch", "2"]);
    assert!(!ok);
    assert!(err.contains("nosuch"), "{err}");
}
