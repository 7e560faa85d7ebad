//! `cargo xtask ci`'s Python step: builds the `checkmate_rs` extension module (crates/checkmate-py)
//! in the same dev build as the tests, lays the package out under `target/python/`, and runs its
//! pytest suite, the PyTorch tests included, in a virtual environment kept in the user's cache
//! directory (pytest, torch and torchvision from PyPI, installed once per machine and reused by
//! every clone; `CHECKMATE_SKIP_TORCH=1` leaves torch out and its tests are then skipped). Needs
//! Python 3.8+ with `venv`: installed with apt-get when missing and this machine can, else the
//! step stops naming what to install.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{run_with, workspace_root};

fn version_ok(python: &str) -> bool {
    Command::new(python)
        .args([
            "-c",
            "import sys, venv; sys.exit(0 if sys.version_info >= (3, 8) else 1)",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A Python 3.8+ interpreter with `venv`, installing one with apt-get when there is none.
fn python() -> Result<String> {
    if let Ok(p) = std::env::var("PYTHON") {
        return Ok(p);
    }
    for p in ["python3", "python"] {
        if version_ok(p) {
            return Ok(p.into());
        }
    }
    eprintln!("no Python 3.8+ with venv: installing python3 python3-venv python3-pip");
    crate::prereq::apt_install(&["python3", "python3-venv", "python3-pip"]).map_err(|why| {
        anyhow::anyhow!(
            "the Python tests need Python 3.8+ with venv ({why}); install it (Debian/Ubuntu: \
             sudo apt-get install -y python3 python3-venv) or set PYTHON to an interpreter"
        )
    })?;
    if version_ok("python3") {
        Ok("python3".into())
    } else {
        bail!("python3 with venv is still missing after apt-get")
    }
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// The built module's file (`libcheckmate_rs.so`; `.dylib` on macOS).
fn built_module(root: &Path) -> Result<PathBuf> {
    for name in ["libcheckmate_rs.so", "libcheckmate_rs.dylib"] {
        let p = root.join("target/debug").join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("cargo built no target/debug/libcheckmate_rs.so")
}

/// Builds the module and runs `pytest crates/checkmate-py/tests`.
pub fn test(cargo: &str, env: &[(&str, &str)]) -> Result<()> {
    let root = workspace_root();
    let python = python()?;
    // The module, and the CLI whose plans the tests compare with it (`CHECKMATE_BIN`): built
    // here, so that `cargo xtask pytest` works without an earlier `cargo test`.
    run_with(
        cargo,
        &["build", "-p", "checkmate-py", "-p", "checkmate-cli"],
        env,
    )?;
    let pkg = root.join("target/python/checkmate_rs");
    let _ = std::fs::remove_dir_all(&pkg);
    copy_dir(&root.join("crates/checkmate-py/python/checkmate_rs"), &pkg)?;
    std::fs::copy(built_module(&root)?, pkg.join("_native.abi3.so"))
        .context("copying the module")?;
    let venv = venv_dir();
    let vpy = venv.join("bin/python");
    let vpy_s = vpy.display().to_string();
    let imports = |module: &str| {
        Command::new(&vpy)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !imports("pytest") {
        eprintln!("creating the Python test environment in {}", venv.display());
        run_with(&python, &["-m", "venv", &venv.display().to_string()], &[])?;
        run_with(&vpy_s, &["-m", "pip", "install", "--quiet", "pytest"], &[])?;
    }
    let torch = std::env::var_os("CHECKMATE_SKIP_TORCH").is_none();
    if torch && !(imports("torch") && imports("torchvision")) {
        // About 3 GB with the CUDA libraries the PyPI wheel pulls; once per machine (the
        // environment lives outside the checkout, see `venv_dir`).
        eprintln!(
            "installing torch and torchvision into {} (once per machine)",
            venv.display()
        );
        run_with(
            &vpy_s,
            &["-m", "pip", "install", "--quiet", "torch", "torchvision"],
            &[],
        )?;
    }
    let pythonpath = root.join("target/python").display().to_string();
    let bin = root.join("target/debug/checkmate").display().to_string();
    let mut env = vec![
        ("PYTHONPATH", pythonpath.as_str()),
        ("CHECKMATE_BIN", bin.as_str()),
    ];
    if torch {
        env.push(("CHECKMATE_REQUIRE_TORCH", "1"));
        env.push(("CHECKMATE_README_EXAMPLE", "1"));
    }
    run_with(
        &vpy_s,
        &[
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "crates/checkmate-py/tests",
        ],
        &env,
    )
}

/// The test environment: `$CHECKMATE_PY_VENV`, else `checkmate-rs/py-venv` in the user's cache
/// directory (`$XDG_CACHE_HOME`, else `~/.cache`), so that a fresh clone on the same machine reuses
/// torch instead of downloading it again; `target/py-venv` when there is no home directory.
fn venv_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("CHECKMATE_PY_VENV") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    match cache {
        Some(c) => c.join("checkmate-rs/py-venv"),
        None => workspace_root().join("target/py-venv"),
    }
}
