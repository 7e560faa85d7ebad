//! Project automation: `cargo xtask ci | bench | train | profile`.

// The benchmark code links the solver (HiGHS) and the plotting crates; it is behind the `bench`
// feature so that `cargo xtask ci` (and `train`, `profile`) build in seconds. `cargo xtask bench`
// builds the release xtask with that feature and runs it.
#[cfg(feature = "bench")]
mod bench_generated;
#[cfg(feature = "bench")]
mod bench_impl;
#[cfg(feature = "bench")]
mod bench_limits;
#[cfg(feature = "bench")]
mod bench_memory;
#[cfg(feature = "bench")]
mod bench_op;
#[cfg(feature = "bench")]
mod bench_plots;
#[cfg(feature = "bench")]
mod bench_results;
#[cfg(feature = "bench")]
mod bench_scale;
#[cfg(feature = "bench")]
mod bench_solver;
#[cfg(feature = "bench")]
mod bench_targets;
mod prereq;
mod python;

use std::process::Command;

use anyhow::{bail, Context, Result};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  ci                 cargo fmt --check, then cargo test --workspace with clippy -D warnings as the
                     workspace's compiler (what CI runs)
  pytest             build the Python module (crates/checkmate-py) and run its pytest suite (the
                     last step of ci)
  bench [PART]       regenerate benchmark tables in docs/ (parts: simulator, solver [--time-limit SEC]
                     [--only NAME] [--no-paper] [--random] [--random-dir DIR]; generated
                     [--graphs N] (lp-round vs milp on our own random graphs); memory
                     [--models a,b] [--batches 2,4] [--strategies ..] [--budgets 100,80,60,40]
                     (training steps' heap vs budget and prediction, docs/MEMORY_BENCH.md);
                     limits [--limits 10,30] (solves' wall time and peak RSS against their
                     limits, docs/LIMITS_BENCH.md); solver-targets [--random-dir DIR]
                     (families, solver runs A and B and scale in one run, about 70 min:
                     target/bench-targets/TARGETS.md); op [--quick] (operator-level graphs at
                     MONeT's sizes, predicted and trained: section 7 of docs/RESULTS.md);
                     results-solver
                     (the same with short limits, for docs/RESULTS.md), frontier, plan, max-batch,
                     train,
                     results [--quick]: docs/RESULTS.md and docs/figures/; render: rewrite
                     RESULTS.md from stored measurements; no part: results, i.e. all but simulator)
  train [ARGS...]    train a model with a rematerialization plan (release build; defaults: vgg16,
                     batch 32 at 64x64, operator-level graph, 6 steps, budget 75% enforced on the
                     heap, milp)
  prereq             check (and, as root with apt-get, install) cmake, a C++ compiler and libclang;
                     every command above does this first
  profile [ARGS...]  measure per-node costs on this machine (release build; no ARGS: vgg16
                     32x32 batch 2 -> target/profile-vgg16.json, about a minute on 2 cores)";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        println!("{USAGE}");
        return Ok(());
    };
    let rest = &args[1..];
    // Everything but help compiles the workspace, whose HiGHS build needs cmake, a C++ compiler
    // and libclang: check (or install) them before cargo starts, not minutes into the build.
    if matches!(
        cmd.as_str(),
        "ci" | "bench" | "train" | "profile" | "prereq"
    ) {
        if let Err(line) = prereq::ensure() {
            eprintln!("error: {line}");
            std::process::exit(1);
        }
    }
    match cmd.as_str() {
        "prereq" => {
            println!("build prerequisites present (cmake, C++ compiler, libclang)");
            Ok(())
        }
        "ci" => ci(),
        // The Python module's tests alone (the last step of `ci`).
        "pytest" => python::test(&cargo(), &[]),
        "bench" => bench(rest),
        "train" => run_release_cli(cmd, &with_defaults(rest, TRAIN_DEFAULTS)),
        // Defaults that finish in about a minute on 2 cores (VGG16 at 32x32, batch 2).
        "profile" if rest.is_empty() => {
            let defaults = "--model vgg16 --batch 2 --image-size 32 --max-repeats 15 \
                            --max-seconds 40 -o target/profile-vgg16.json";
            let args: Vec<String> = defaults.split_whitespace().map(String::from).collect();
            run_release_cli(cmd, &args)
        }
        "profile" => run_release_cli(cmd, rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown xtask command {other:?}\n\n{USAGE}"),
    }
}

/// `cargo xtask train` defaults: VGG16 (convolutions as Keras', a 512-unit classifier as in the
/// CIFAR variants) at 64x64 and batch 32, where activations are close to half of the step's memory
/// (static 185 MiB; checkpoint-all's activation peak 155 MiB on the layer graph, 99 MiB on the
/// operator-level graph `train` uses by default), under a budget of 75% of the latter, which the
/// layer graph's checkpoint-all misses by about 80 MiB, enforced on the process heap. Under a
/// minute of training on 2 cores (6 plan steps and 2 reference steps of about 4 s).
/// Flags the user gives win.
const TRAIN_DEFAULTS: &[(&str, &str)] = &[
    ("--model", "vgg16"),
    ("--batch", "32"),
    ("--image-size", "64"),
    ("--classes", "10"),
    ("--width", "512"),
    ("--steps", "6"),
    ("--budget", "75%"),
    ("--enforce-budget", "true"),
    ("--strategy", "milp"),
    ("--lr", "0.002"),
    ("--time-limit", "30"),
];

/// How long the first release build takes on this project's 2-core machines (README).
const FIRST_BUILD: &str = "8 minutes";

/// `args` plus every default flag that `args` does not set.
fn with_defaults(args: &[String], defaults: &[(&str, &str)]) -> Vec<String> {
    let mut out = args.to_vec();
    for (flag, value) in defaults {
        let given = args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        if !given {
            out.push(flag.to_string());
            out.push(value.to_string());
        }
    }
    out
}

/// Runs a command from the workspace root, failing on a non-zero exit.
fn run(program: &str, args: &[&str]) -> Result<()> {
    run_with(program, args, &[])
}

/// [`run`] with extra environment variables.
fn run_with(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("$ {}{program} {}", shown.concat(), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// fmt, clippy and the tests in one build. Clippy runs as the rustc of the workspace's crates
/// inside `cargo test` (`RUSTC_WORKSPACE_WRAPPER`, what `cargo clippy` does inside `cargo check`),
/// so the dependencies, HiGHS's 6-9 minutes of C++ among them, are built once, for the tests;
/// a separate `cargo clippy` would check them all again and run HiGHS's build script in its own
/// profile.
fn ci() -> Result<()> {
    let cargo = cargo();
    run(&cargo, &["fmt", "--all", "--check"])?;
    let driver = clippy_driver();
    let lint = [
        ("RUSTC_WORKSPACE_WRAPPER", driver.as_str()),
        (
            "CLIPPY_ARGS",
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
        ),
    ];
    // Every target (benches and examples too) linted and built; then the tests run.
    run_with(
        &cargo,
        &[
            "test",
            "--workspace",
            "--all-targets",
            "--features",
            "xtask/bench",
            "--no-run",
        ],
        &lint,
    )?;
    run_with(
        &cargo,
        &["test", "--workspace", "--features", "xtask/bench"],
        &lint,
    )?;
    // The Python module and its pytest suite (crates/checkmate-py).
    python::test(&cargo, &lint)
}

/// `clippy-driver` of the toolchain that runs this cargo (`rustup component add clippy`).
fn clippy_driver() -> String {
    let cargo = cargo();
    let beside = std::path::Path::new(&cargo).with_file_name("clippy-driver");
    if beside.is_file() {
        beside.display().to_string()
    } else {
        "clippy-driver".into()
    }
}

fn bench(rest: &[String]) -> Result<()> {
    let part = rest.first().map(String::as_str).unwrap_or("all");
    if part == "simulator" {
        return run(
            &cargo(),
            &["bench", "-p", "checkmate-graph", "--bench", "simulator"],
        );
    }
    #[cfg(feature = "bench")]
    if !cfg!(debug_assertions) {
        return bench_parts(part, rest);
    }
    // Solver and training timings are only meaningful in optimized builds. One build of both
    // binaries: building them separately would unify features differently and rebuild the
    // dependencies each time.
    run(
        &cargo(),
        &[
            "build",
            "--release",
            "--quiet",
            "-p",
            "checkmate-cli",
            "-p",
            "xtask",
            "--features",
            "xtask/bench",
        ],
    )?;
    let xtask = workspace_root().join("target/release/xtask");
    let mut args = vec!["bench"];
    args.extend(rest.iter().map(String::as_str));
    run(&xtask.display().to_string(), &args)
}

/// The benchmark parts, in the release build with the `bench` feature.
#[cfg(feature = "bench")]
fn bench_parts(part: &str, rest: &[String]) -> Result<()> {
    match part {
        "solver" => bench_solver::run(&rest[1..]),
        "generated" => bench_generated::run(&rest[1..]),
        "limits" => bench_limits::run(&rest[1..]),
        "op" => bench_op::run(&rest[1..]),
        "impl" => bench_impl::run(&rest[1..]),
        "scale" => bench_scale::run(&rest[1..]),
        "solver-targets" => bench_targets::run(&rest[1..]),
        "memory" => bench_memory::run(&rest[1..]),
        p if bench_results::PARTS.contains(&p) => bench_results::run(p, &rest[1..]),
        "all" => bench_results::run("results", rest),
        p if p.starts_with("--") => bench_results::run("results", rest),
        other => bail!(
            "unknown bench part {other:?}; known: simulator, solver, generated, limits, scale, solver-targets, memory, op, impl, {}",
            bench_results::PARTS.join(", ")
        ),
    }
}

/// `cargo xtask train|profile ...` runs the release `checkmate` binary with that subcommand.
fn run_release_cli(sub: &str, rest: &[String]) -> Result<()> {
    let cargo = cargo();
    // The first build compiles candle and HiGHS (C++) from source: say so, and let cargo show
    // its progress instead of minutes of silence.
    let first = !workspace_root().join("target/release/checkmate").exists();
    if first {
        eprintln!(
            "first build of the release `checkmate` binary: about {FIRST_BUILD} on 2 cores \
             (HiGHS is compiled from source); later runs start at once"
        );
    }
    let mut args = vec!["run", "--release"];
    if !first {
        args.push("--quiet");
    }
    args.extend(["-p", "checkmate-cli", "--", sub]);
    args.extend(rest.iter().map(String::as_str));
    run(&cargo, &args)
}
