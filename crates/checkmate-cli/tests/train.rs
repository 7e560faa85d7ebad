//! End-to-end: `checkmate train` and `checkmate max-batch` on small zoo models.

mod common;

/// Runs `checkmate`: success, the `--json` object, stdout and stderr together.
fn checkmate(args: &[&str]) -> (bool, serde_json::Value, String) {
    let (ok, stdout, stderr) = common::run(args);
    (
        ok,
        common::last_json(&stdout),
        format!("{stdout}\n{stderr}"),
    )
}

fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

const MLP: &[&str] = &[
    "--model",
    "mlp",
    "--batch",
    "16",
    "--depth",
    "4",
    "--granularity",
    "layer",
];

#[test]
fn train_with_recomputation_matches_checkpoint_all_and_the_prediction() {
    // Find the least budget at which the MILP plans this graph, then train there.
    let mut args = vec!["solve"];
    args.extend_from_slice(MLP);
    args.extend_from_slice(&["--budget", "100%", "--strategy", "checkpoint-all", "--json"]);
    let (ok, all, out) = checkmate(&args);
    assert!(ok, "{out}");
    let one_byte = (u(&all, "static_bytes") + 1).to_string();
    let mut args = vec!["solve"];
    args.extend_from_slice(MLP);
    args.extend_from_slice(&["--budget", &one_byte, "--strategy", "milp", "--json"]);
    let (ok, infeasible, out) = checkmate(&args);
    assert!(!ok, "a 1-byte budget must fail: {out}");
    let least = u(&infeasible, "least_feasible_budget_bytes").to_string();

    let mut args = vec!["train"];
    args.extend_from_slice(MLP);
    args.extend_from_slice(&[
        "--steps",
        "4",
        "--budget",
        &least,
        "--strategy",
        "milp",
        "--baseline-steps",
        "4",
        // The plan must be the tight one `solve` found: no heap reserve taken from the budget.
        "--enforce-budget",
        "false",
        "--json",
    ]);
    let (ok, r, out) = checkmate(&args);
    assert!(ok, "{out}");
    assert_eq!(r["steps"], 4);
    let losses = r["losses"].as_array().unwrap();
    assert_eq!(losses.len(), 4);
    assert!(
        losses[3].as_f64().unwrap() < losses[0].as_f64().unwrap(),
        "loss falls: {losses:?}"
    );
    assert_eq!(r["step_seconds"].as_array().unwrap().len(), 4);
    // The plan recomputes (tight budget) and still trains bitwise like checkpoint-all.
    assert!(u(&r, "computes") > u(&r, "nodes"), "{r}");
    assert_eq!(r["params_match_checkpoint_all"], true, "{r}");
    assert_eq!(
        u(&r, "measured_peak_bytes"),
        u(&r, "predicted_live_peak_bytes")
    );
    assert!(u(&r, "predicted_peak_bytes") < u(&r, "checkpoint_all_peak_bytes"));
    assert!(u(&r, "predicted_peak_bytes") + u(&r, "static_bytes") <= u(&r, "budget_bytes"));
    // The heap holds at least the static memory and the registers.
    assert!(u(&r, "heap_peak_bytes") >= u(&r, "static_bytes") + u(&r, "measured_peak_bytes"));
    assert_eq!(r["params_checksum"].as_str().unwrap().len(), 16);
}

#[test]
fn same_seed_same_weights_different_seed_different_weights() {
    let run = |seed: &str| {
        let mut args = vec!["train"];
        args.extend_from_slice(MLP);
        args.extend_from_slice(&[
            "--steps",
            "2",
            "--strategy",
            "chen-sqrtn",
            "--budget",
            "100%",
            "--baseline-steps",
            "0",
            "--seed",
            seed,
            "--json",
        ]);
        let (ok, r, out) = checkmate(&args);
        assert!(ok, "{out}");
        r["params_checksum"].as_str().unwrap().to_string()
    };
    assert_eq!(run("3"), run("3"));
    assert_ne!(run("3"), run("4"));
}

#[test]
fn a_budget_below_static_memory_fails_before_training() {
    let mut args = vec!["train"];
    args.extend_from_slice(MLP);
    args.extend_from_slice(&["--steps", "1", "--budget", "1KiB"]);
    let (ok, _, out) = checkmate(&args);
    assert!(!ok);
    assert!(out.contains("static memory"), "{out}");
    assert!(!out.contains("step    0"), "no step ran: {out}");
}

#[test]
fn bad_training_input_is_a_clear_error() {
    let (ok, _, out) = checkmate(&["train", "--model", "nosuchnet", "--batch", "2"]);
    assert!(!ok);
    assert!(out.contains("nosuchnet"), "{out}");
    let mut args = vec!["train"];
    args.extend_from_slice(MLP);
    args.extend_from_slice(&["--data", "/nonexistent/data.bin"]);
    let (ok, _, out) = checkmate(&args);
    assert!(!ok);
    assert!(out.contains("no such file"), "{out}");
    let mut args = vec!["train"];
    args.extend_from_slice(MLP);
    args.extend_from_slice(&["--device", "tpu:0"]);
    let (ok, _, out) = checkmate(&args);
    assert!(!ok);
    assert!(out.contains("cpu or cuda:0"), "{out}");
}

#[test]
fn trains_on_npy_arrays() {
    // 40 examples of 1x28x28 (the mlp's default input), labels 0..9, written as .npy.
    let dir = std::env::temp_dir().join(format!("checkmate-npy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let npy = |shape: &str, descr: &str, data: Vec<u8>| {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (11 + header.len()) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend(data);
        out
    };
    let m = 40;
    let x: Vec<u8> = (0..m * 28 * 28)
        .flat_map(|i| (((i / 784) % 10) as f32 / 10.0 + (i % 7) as f32 * 0.01).to_le_bytes())
        .collect();
    let y: Vec<u8> = (0..m)
        .flat_map(|i| ((i % 10) as i64).to_le_bytes())
        .collect();
    std::fs::write(dir.join("inputs.npy"), npy("(40, 1, 28, 28)", "<f4", x)).unwrap();
    std::fs::write(dir.join("labels.npy"), npy("(40,)", "<i8", y)).unwrap();
    let d = dir.to_str().unwrap();
    let mut args = vec!["train"];
    args.extend_from_slice(MLP);
    args.extend_from_slice(&["--steps", "3", "--data", d, "--json"]);
    let (ok, r, out) = checkmate(&args);
    assert!(ok, "{out}");
    assert_eq!(r["losses"].as_array().unwrap().len(), 3);
    // Labels beyond the model's classes are refused by name.
    let mut args = vec!["train"];
    args.extend_from_slice(MLP);
    args.extend_from_slice(&["--classes", "5", "--data", d]);
    let (ok, _, out) = checkmate(&args);
    assert!(!ok);
    assert!(
        out.contains("label 5") && out.contains("--classes"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn max_batch_grows_with_recomputation_and_is_confirmed_by_a_real_step() {
    let (ok, r, out) = checkmate(&[
        "max-batch",
        "--model",
        "mlp",
        "--depth",
        "4",
        "--width",
        "64",
        "--memory",
        "4MiB",
        "--strategies",
        "checkpoint-all,chen-sqrtn,milp",
        "--limit",
        "512",
        "--time-limit",
        "10",
        "--json",
    ]);
    assert!(ok, "{out}");
    let rows = r["strategies"].as_array().unwrap();
    let batch = |name: &str| {
        rows.iter()
            .find(|s| s["strategy"] == name)
            .and_then(|s| s["max_batch"].as_u64())
            .unwrap_or(0)
    };
    assert!(batch("checkpoint-all") >= 1, "{r}");
    // Operator level by default, with the layer graph's checkpoint-all as the reference.
    assert!(batch("checkpoint-all (layer graph)") >= 1, "{r}");
    assert!(batch("milp") > batch("checkpoint-all (layer graph)"), "{r}");
    // Recomputation fits a larger batch in the same memory.
    assert!(batch("milp") > batch("checkpoint-all"), "{r}");
    assert!(batch("milp") >= batch("chen-sqrtn"), "{r}");
    for s in rows {
        assert_eq!(s["confirmed"], true, "{s}");
        assert!(u(s, "total_bytes") <= 4 * 1024 * 1024, "{s}");
        assert!(u(s, "heap_peak_bytes") > 0, "{s}");
    }
    let (ok, _, out) = checkmate(&["max-batch", "--model", "mlp", "--memory", "50%"]);
    assert!(!ok);
    assert!(out.contains("not a percentage"), "{out}");
}

#[test]
fn operator_level_training_holds_less_than_layer_checkpoint_all_with_equal_weights() {
    let net = [
        "--model",
        "vgg16",
        "--batch",
        "16",
        "--image-size",
        "32",
        "--width",
        "64",
        "--classes",
        "10",
    ];
    // The layer graph's checkpoint-all total: the memory training without any of this takes.
    let mut args = vec!["solve"];
    args.extend_from_slice(&net);
    args.extend_from_slice(&["--budget", "100%", "--strategy", "checkpoint-all", "--json"]);
    let (ok, layer, out) = checkmate(&args);
    assert!(ok, "{out}");
    let (reference, fixed) = (u(&layer, "total_peak_bytes"), u(&layer, "static_bytes"));
    // Static memory and 75% of its activation peak (the operator graph's own checkpoint-all
    // needs less).
    let budget = (fixed + (reference - fixed) * 3 / 4).to_string();
    let mut args = vec!["train"];
    args.extend_from_slice(&net);
    args.extend_from_slice(&[
        "--steps",
        "2",
        "--baseline-steps",
        "2",
        "--budget",
        &budget,
        "--strategy",
        "lp-round",
        "--time-limit",
        "5",
        "--json",
    ]);
    let (ok, r, out) = checkmate(&args);
    assert!(ok, "{out}");
    assert_eq!(r["granularity"], "op", "{r}");
    assert_eq!(r["baseline_granularity"], "layer", "{r}");
    assert_eq!(r["params_match_checkpoint_all"], true, "{r}");
    assert_eq!(
        u(&r, "measured_peak_bytes"),
        u(&r, "predicted_live_peak_bytes")
    );
    // The process holds less than the layer graph's checkpoint-all did, within the budget.
    assert!(
        u(&r, "heap_peak_with_update_bytes") < u(&r, "baseline_heap_peak_bytes"),
        "{r}"
    );
    assert!(
        u(&r, "heap_peak_with_update_bytes") <= u(&r, "budget_bytes"),
        "{r}"
    );
    let (ok, _, out) = checkmate(&[
        "graph",
        "--model",
        "mlp",
        "--batch",
        "2",
        "--granularity",
        "ops",
        "-o",
        "x.json",
    ]);
    assert!(!ok);
    assert!(out.contains("unknown granularity `ops`"), "{out}");
}
