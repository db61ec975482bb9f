//! Running the `fsdpc` binary from the end-to-end tests: the output, the
//! stdout of a command that must succeed, the refusal of one that must fail,
//! and a scratch directory per test binary and name.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `fsdpc ARGS`.
pub fn fsdpc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

/// The stdout of `fsdpc ARGS`, which must succeed.
pub fn ok(args: &[&str]) -> String {
    let o = fsdpc(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `fsdpc ARGS` must fail, without a panic, saying `needle`.
pub fn check_error(args: &[&str], needle: &str) {
    let o = fsdpc(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(err.contains(needle), "{args:?}: `{err}` lacks `{needle}`");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

/// A fresh-named scratch directory for this test binary, process and `name`.
pub fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "fsdpc-{}-{}-{name}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// `p` as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}
