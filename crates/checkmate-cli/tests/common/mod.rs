//! Shared by the end-to-end tests: running the `checkmate` binary.

use std::process::Command;

/// Runs `checkmate args`: whether it exited successfully, its stdout and its stderr.
pub fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_checkmate"))
        .args(args)
        .output()
        .expect("binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The JSON object `--json` prints on stdout's last line (`null` when there is none).
#[allow(dead_code)] // not every test file reads JSON
pub fn last_json(stdout: &str) -> serde_json::Value {
    let last = stdout.lines().last().unwrap_or("null");
    serde_json::from_str(last).unwrap_or(serde_json::Value::Null)
}
