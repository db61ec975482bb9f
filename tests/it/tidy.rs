//! The house rules, checked on every `cargo test`: every source file says
//! what it is for (a `//!` header); every path ARCHITECTURE.md names
//! exists; every subcommand is listed where the CLI documents them (the
//! CLI module's header and README.md's command table); and the crate
//! arrows point one way: the plan depends on the IR and serde only, the
//! runtime on the IR and the plan, never on the planner.

use clap::CommandFactory;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The `.rs` files under `dir` (relative to the repository), skipping
/// build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_source_file_starts_with_its_purpose() {
    let mut files = Vec::new();
    for dir in [
        "src",
        "ir",
        "frontends",
        "plan",
        "planner",
        "report",
        "runtime",
        "tests",
        "benches",
        "examples",
        "fuzz",
        "python",
    ] {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 100, "found only {} files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            !text.starts_with("//!")
        })
        .map(|p| p.strip_prefix(root()).unwrap_or(p).display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a `//!` header on their first line: {missing:?}"
    );
}

/// The paths ARCHITECTURE.md names in backticks: words with a `/` that
/// name a file or folder of this repository (crate paths like
/// `fsdpc_plan::Plan` and commands are not paths).
fn architecture_paths() -> Vec<String> {
    let text = read("ARCHITECTURE.md");
    let mut out = Vec::new();
    for (i, chunk) in text.split('`').enumerate() {
        let w = chunk.trim();
        let looks_like_path = i % 2 == 1
            && w.contains('/')
            && !w.contains(' ')
            && !w.contains("::")
            && !w.starts_with("fsdpc.")
            && !w.contains('<');
        if looks_like_path {
            out.push(w.trim_end_matches('/').to_string());
        }
    }
    out
}

#[test]
fn every_path_architecture_names_exists() {
    let paths = architecture_paths();
    assert!(
        paths.len() > 30,
        "only {} paths found: {paths:?}",
        paths.len()
    );
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| {
            // `kernels/*.cu`: the folder exists and holds such files.
            let p = p.split('*').next().unwrap_or(p).trim_end_matches('/');
            !root().join(p).exists()
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn every_subcommand_is_documented() {
    let cli = fsdpc::cli::Cli::command();
    let names: Vec<String> = cli
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .filter(|n| n != "help")
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    let header: String = read("src/cli/mod.rs")
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let readme = read("README.md");
    let table: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `fsdpc "))
        .collect();
    for name in &names {
        assert!(
            header.contains(&format!("`{name}`")),
            "src/cli/mod.rs's header does not list `{name}`"
        );
        assert!(
            table
                .iter()
                .any(|row| row.starts_with(&format!("| `fsdpc {name}"))),
            "README.md's command table has no row for `fsdpc {name}`"
        );
        assert!(
            cli.find_subcommand(name)
                .and_then(|c| c.get_about())
                .is_some(),
            "`fsdpc {name}` has no help line"
        );
    }
}

/// The `[dependencies]` (and `[dev-dependencies]`) names of a crate's
/// manifest that are this workspace's crates or of interest.
fn dependencies(manifest: &str) -> Vec<String> {
    let text = read(manifest);
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l.ends_with("dependencies]");
            continue;
        }
        if in_deps {
            if let Some(name) = l.split(['=', '.']).next().filter(|n| !n.is_empty()) {
                if !name.starts_with('#') {
                    out.push(name.trim().to_string());
                }
            }
        }
    }
    out
}

#[test]
fn the_crate_arrows_point_one_way() {
    let plan = dependencies("plan/Cargo.toml");
    assert!(
        plan.iter()
            .all(|d| ["fsdpc-ir", "serde", "serde_json", "thiserror"].contains(&d.as_str())),
        "the plan depends on the IR and serde only: {plan:?}"
    );
    let runtime = dependencies("runtime/Cargo.toml");
    for banned in ["fsdpc-planner", "fsdpc-frontends", "fsdpc-report", "egg"] {
        assert!(
            !runtime.iter().any(|d| d == banned),
            "the runtime depends on {banned}: {runtime:?}"
        );
    }
    let mut files = Vec::new();
    rust_files(&root().join("runtime"), &mut files);
    rust_files(&root().join("plan"), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for banned in ["fsdpc_planner", "fsdpc_frontends", "fsdpc_report"] {
            assert!(!text.contains(banned), "{} names {banned}", f.display());
        }
    }
    let python = dependencies("python/Cargo.toml");
    assert!(
        python
            .iter()
            .all(|d| ["fsdpc", "pyo3", "serde_json"].contains(&d.as_str())),
        "the Python module depends on the fsdpc facade only: {python:?}"
    );
    for (krate, banned) in [
        ("ir/Cargo.toml", "fsdpc-"),
        ("planner/Cargo.toml", "fsdpc-runtime"),
        ("planner/Cargo.toml", "fsdpc-report"),
        ("report/Cargo.toml", "fsdpc-runtime"),
        ("frontends/Cargo.toml", "fsdpc-plan"),
    ] {
        let deps = dependencies(krate);
        let bad: Vec<&String> = deps
            .iter()
            .filter(|d| d.starts_with(banned) && !(krate.starts_with("ir") && *d == "fsdpc-ir"))
            .collect();
        assert!(bad.is_empty(), "{krate} depends on {bad:?}");
    }
}

#[test]
fn each_crate_has_one_integration_test_binary() {
    for krate in [
        ".",
        "ir",
        "frontends",
        "plan",
        "planner",
        "report",
        "runtime",
        "python",
    ] {
        let dir = root().join(krate).join("tests");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let loose: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "rs"))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            loose.is_empty(),
            "{}: integration tests are modules of tests/it/main.rs (one binary per crate), \
             not files of their own: {loose:?}",
            dir.display()
        );
    }
}
