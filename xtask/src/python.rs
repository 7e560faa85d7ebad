//! `cargo xtask ci`'s Python step: builds the `checkmate_rs` extension module (crates/checkmate-py)
//! in the same dev build as the tests, lays the package out under `target/python/`, and runs its
//! pytest suite with a virtual environment in `target/py-venv` (pytest from PyPI, once; pip's cache
//! makes later ones offline). Needs Python 3.8+ with `venv`: installed with apt-get when missing
//! and this machine can, else the step stops naming what to install.

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
    run_with(cargo, &["build", "-p", "checkmate-py"], env)?;
    let pkg = root.join("target/python/checkmate_rs");
    let _ = std::fs::remove_dir_all(&pkg);
    copy_dir(&root.join("crates/checkmate-py/python/checkmate_rs"), &pkg)?;
    std::fs::copy(built_module(&root)?, pkg.join("_native.abi3.so"))
        .context("copying the module")?;
    let venv = root.join("target/py-venv");
    let vpy = venv.join("bin/python");
    let has_pytest = || {
        Command::new(&vpy)
            .args(["-c", "import pytest"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has_pytest() {
        let venv_s = venv.display().to_string();
        run_with(&python, &["-m", "venv", &venv_s], &[])?;
        run_with(
            &vpy.display().to_string(),
            &["-m", "pip", "install", "--quiet", "pytest"],
            &[],
        )?;
    }
    let pythonpath = root.join("target/python").display().to_string();
    let bin = root.join("target/debug/checkmate").display().to_string();
    run_with(
        &vpy.display().to_string(),
        &["-m", "pytest", "-q", "crates/checkmate-py/tests"],
        &[("PYTHONPATH", &pythonpath), ("CHECKMATE_BIN", &bin)],
    )
}
