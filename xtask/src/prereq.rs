//! Build prerequisites of HiGHS (built from source by `highs-sys`): cmake, a C++ compiler, and a
//! libclang that bindgen can load. Every xtask entry point that compiles the workspace calls
//! [`ensure`] first, so that a fresh machine gets one line (or an install) instead of a build
//! script panic several minutes into the build.
//!
//! The libclang search follows what `clang-sys` (bindgen's loader, runtime linking) looks for on
//! Linux: only `LIBCLANG_PATH` when it is set, else `llvm-config --prefix`'s lib directories,
//! `LD_LIBRARY_PATH`, `LIBRARY_PATH` and the system library directories; file names
//! `libclang.so`, `libclang-*.so`, `libclang.so.*` and `libclang-*.so.*`, never `libclang-cpp`
//! (the C++ library, which bindgen cannot use).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One missing prerequisite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// The `cmake` program.
    Cmake,
    /// A C++ compiler (`$CXX`, `c++`, `g++` or `clang++`).
    Cxx,
    /// A libclang shared library that bindgen can load.
    Libclang,
}

/// What a prerequisite is, and its package on Debian/Ubuntu, Fedora and Arch.
struct Names {
    what: &'static str,
    debian: &'static str,
    fedora: &'static str,
    arch: &'static str,
}

impl Missing {
    fn names(self) -> Names {
        let (what, debian, fedora, arch) = match self {
            Missing::Cmake => ("cmake", "cmake", "cmake", "cmake"),
            Missing::Cxx => ("a C++ compiler", "g++", "gcc-c++", "gcc"),
            Missing::Libclang => (
                "libclang (for bindgen; libclang-cpp is not it)",
                "libclang-dev",
                "clang-devel",
                "clang",
            ),
        };
        Names {
            what,
            debian,
            fedora,
            arch,
        }
    }
}

/// What is missing on this machine, in a fixed order.
pub fn missing() -> Vec<Missing> {
    let mut out = Vec::new();
    if !runs("cmake", &["--version"]) {
        out.push(Missing::Cmake);
    }
    if !has_cxx() {
        out.push(Missing::Cxx);
    }
    if find_libclang().is_none() {
        out.push(Missing::Libclang);
    }
    out
}

/// Checks the prerequisites; installs the missing ones with apt-get when this machine has it and
/// we are root or have non-interactive sudo (printing the command), else returns the one-line
/// message that names what is missing and how to install it.
pub fn ensure() -> Result<(), String> {
    if std::env::var_os("CHECKMATE_SKIP_PREREQ").is_some() {
        return Ok(());
    }
    let need = missing();
    if need.is_empty() {
        return Ok(());
    }
    let packages: Vec<&str> = need.iter().map(|m| m.names().debian).collect();
    if let Err(why) = apt_privilege() {
        return Err(message(&need, why));
    }
    eprintln!(
        "installing build prerequisites ({}): apt-get install {}",
        describe(&need),
        packages.join(" ")
    );
    let _ = apt_install(&packages);
    let still = missing();
    if still.is_empty() {
        Ok(())
    } else {
        Err(message(&still, "apt-get did not install them"))
    }
}

fn describe(need: &[Missing]) -> String {
    need.iter()
        .map(|m| m.names().what)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The one line: what is missing, the Debian/Ubuntu command, and the package names elsewhere.
pub fn message(need: &[Missing], why: &str) -> String {
    let join = |f: fn(&Names) -> &'static str| {
        need.iter()
            .map(|m| f(&m.names()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "missing build prerequisites: {} ({why}); install with `sudo apt-get install -y {}` on \
         Debian/Ubuntu (Fedora: dnf install {}; Arch: pacman -S {}; or point LIBCLANG_PATH at a \
         directory holding libclang.so), then run the command again",
        describe(need),
        join(|n| n.debian),
        join(|n| n.fedora),
        join(|n| n.arch),
    )
}

/// Installs Debian packages with apt-get (as root or with passwordless sudo), printing the command;
/// else says why it cannot.
pub fn apt_install(packages: &[&str]) -> Result<(), String> {
    let prefix = apt_privilege().map_err(String::from)?;
    let apt_get: Vec<&str> = prefix.iter().copied().chain(["apt-get"]).collect();
    let update: Vec<&str> = apt_get.iter().copied().chain(["update", "-qq"]).collect();
    let install: Vec<&str> = apt_get
        .iter()
        .copied()
        .chain(["install", "-y", "-qq", "--no-install-recommends"])
        .chain(packages.iter().copied())
        .collect();
    if apt(&update) && apt(&install) {
        Ok(())
    } else {
        Err(format!("`{}` failed", install.join(" ")))
    }
}

/// The prefix that lets us run apt-get non-interactively: `[]` as root, `["sudo", "-n"]` with
/// passwordless sudo; else why we cannot.
fn apt_privilege() -> Result<Vec<&'static str>, &'static str> {
    if !runs("apt-get", &["--version"]) {
        return Err("not installed automatically: no apt-get here");
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        Ok(vec![])
    } else if runs("sudo", &["-n", "true"]) {
        Ok(vec!["sudo", "-n"])
    } else {
        Err("not installed automatically: not root and no passwordless sudo")
    }
}

/// Runs an apt-get command line, its progress output discarded (errors still reach stderr).
fn apt(args: &[&str]) -> bool {
    eprintln!("$ {}", args.join(" "));
    Command::new(args[0])
        .args(&args[1..])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `program args` starts and exits with success (output discarded).
fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `$CXX` (its first word) or one of the usual compiler names, as the `cc` crate looks for.
fn has_cxx() -> bool {
    if let Ok(cxx) = std::env::var("CXX") {
        if let Some(prog) = cxx.split_whitespace().next() {
            return runs(prog, &["--version"]);
        }
    }
    ["c++", "g++", "clang++"]
        .iter()
        .any(|p| runs(p, &["--version"]))
}

/// The first libclang that bindgen (clang-sys) would load, if any.
pub fn find_libclang() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LIBCLANG_PATH") {
        let path = PathBuf::from(path);
        if path.is_file()
            && path
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(is_libclang)
        {
            return Some(path);
        }
        return libclang_in(&path);
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("llvm-config")
        .arg("--prefix")
        .stderr(Stdio::null())
        .output()
    {
        if out.status.success() {
            let prefix = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            dirs.extend(["bin", "lib", "lib64"].map(|d| prefix.join(d)));
        }
    }
    for var in ["LD_LIBRARY_PATH", "LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    for pattern in [
        "/usr/local/llvm*/lib*",
        "/usr/local/lib*/*/*",
        "/usr/local/lib*/*",
        "/usr/local/lib*",
        "/usr/lib*/*/*",
        "/usr/lib*/*",
        "/usr/lib*",
    ] {
        dirs.extend(expand(pattern));
    }
    dirs.iter().find_map(|d| libclang_in(d))
}

fn libclang_in(dir: &Path) -> Option<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(is_libclang))
        .map(|e| e.path())
        .collect();
    names.sort();
    names.into_iter().next()
}

/// `libclang.so`, `libclang-*.so`, `libclang.so.*`, `libclang-*.so.*`, but not libclang-cpp.
pub fn is_libclang(name: &str) -> bool {
    if name.contains("-cpp.") {
        return false;
    }
    name == "libclang.so"
        || name.starts_with("libclang.so.")
        || (name.starts_with("libclang-") && (name.ends_with(".so") || name.contains(".so.")))
}

/// Directories matching a pattern whose segments may end in `*` (a prefix) or be `*` (any).
fn expand(pattern: &str) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::from("/")];
    for seg in pattern.split('/').filter(|s| !s.is_empty()) {
        let mut next = Vec::new();
        for dir in &current {
            if let Some(prefix) = seg.strip_suffix('*') {
                let Ok(rd) = std::fs::read_dir(dir) else {
                    continue;
                };
                let mut found: Vec<PathBuf> = rd
                    .filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_str()
                            .is_some_and(|n| n.starts_with(prefix))
                    })
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.path())
                    .collect();
                found.sort();
                next.extend(found);
            } else {
                let p = dir.join(seg);
                if p.is_dir() {
                    next.push(p);
                }
            }
        }
        current = next;
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libclang_names_are_what_bindgen_loads() {
        for ok in [
            "libclang.so",
            "libclang.so.1",
            "libclang-14.so",
            "libclang-14.so.1",
            "libclang-14.0.6.so.14",
        ] {
            assert!(is_libclang(ok), "{ok}");
        }
        for bad in [
            "libclang-cpp.so.14",
            "libclang-cpp.so",
            "libclangBasic.a",
            "libclang.a",
        ] {
            assert!(!is_libclang(bad), "{bad}");
        }
    }

    #[test]
    fn message_is_one_line_with_the_command() {
        let m = message(&[Missing::Cmake, Missing::Libclang], "test");
        assert!(!m.contains('\n'));
        assert!(
            m.contains("sudo apt-get install -y cmake libclang-dev"),
            "{m}"
        );
        assert!(m.contains("clang-devel"), "{m}");
    }

    #[test]
    fn libclang_path_directory_is_the_only_place_searched() {
        let dir = std::env::temp_dir().join(format!("checkmate-prereq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libclang-cpp.so.14"), b"").unwrap();
        assert_eq!(libclang_in(&dir), None);
        std::fs::write(dir.join("libclang.so.1"), b"").unwrap();
        assert_eq!(libclang_in(&dir), Some(dir.join("libclang.so.1")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
