//! Conformance with the ONNX project's backend node tests (onnx 1.22.0,
//! `onnx/backend/test/data/node`): every test whose ops are all in the
//! importer's table is imported with `import_forward`, run with the reference
//! evaluator and its outputs compared with the expected ones (type, shape,
//! values: floats within a tolerance, NaN equal to NaN; integers and bools
//! exactly).
//!
//! `tests/onnx_node_tests.txt` lists the tests that must pass (sorted, one a
//! line): a listed test that fails fails this test, naming it and why; a
//! newly passing test is printed so that the list can grow. The data come
//! from `$FSDPC_ONNX_NODE_TESTS` or `target/onnx-node-tests`
//! (`scripts/onnx-node-tests.sh` fetches them; `scripts/test.sh` always does);
//! without them the test prints why it skips and passes.
//! `FSDPC_ONNX_VERBOSE=1` prints every failure and skip with its reason.

use fsdpc::frontends::onnx::{import_forward, read_tensor_proto, ForwardOptions};
use fsdpc::frontends::FrontendError;
use fsdpc::ir::{DType, TensorData};
use fsdpc::runtime::{eval_graph, init_params, HostTensor, KernelCtx, TensorRef};
use std::collections::{BTreeSet, HashMap};
use std::ops::RangeInclusive;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// The tests expected to pass.
const EXPECTED: &str = include_str!("../onnx_node_tests.txt");

/// Opsets run. Opsets 22–27 changed the mapped ops only by adding element
/// types the IR does not have, so their tests check the same semantics.
const OPSETS: RangeInclusive<i64> = 13..=27;

/// What happened to one node test.
enum Outcome {
    /// Some op is not in the importer's table.
    Unsupported,
    /// Its data use an element type the IR lacks (double, uint8, string, ...).
    Skipped(String),
    Pass,
    Fail(String),
}

fn data_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("FSDPC_ONNX_NODE_TESTS") {
        return Some(PathBuf::from(d));
    }
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/onnx-node-tests");
    d.is_dir().then_some(d)
}

/// The `{prefix}_{i}.pb` files of a data set, in index order.
fn data_files(set: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut files: Vec<(usize, PathBuf)> = std::fs::read_dir(set)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_else(|_| Vec::new())
        .into_iter()
        .filter_map(|p: PathBuf| {
            let stem = p.file_stem()?.to_str()?;
            let i = stem.strip_prefix(prefix)?.strip_prefix('_')?.parse().ok()?;
            (p.extension()? == "pb").then_some((i, p))
        })
        .collect();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

fn read_all(files: &[PathBuf]) -> Result<Vec<(String, TensorData)>, String> {
    files
        .iter()
        .map(|f| read_tensor_proto(f).map_err(|e| e.to_string()))
        .collect()
}

fn run_case(dir: &Path) -> Outcome {
    let set = dir.join("test_data_set_0");
    let inputs = read_all(&data_files(&set, "input"));
    let outputs = read_all(&data_files(&set, "output"));
    let opts = ForwardOptions {
        input_values: inputs
            .iter()
            .flatten()
            .filter(|(n, _)| !n.is_empty())
            .cloned()
            .collect(),
        opsets: OPSETS,
        ..ForwardOptions::default()
    };
    let fwd = match import_forward(&dir.join("model.onnx"), &opts) {
        Err(FrontendError::UnsupportedOps { .. }) => return Outcome::Unsupported,
        r => r,
    };
    let (inputs, outputs) = match (inputs, outputs) {
        (Ok(i), Ok(o)) => (i, o),
        (Err(e), _) | (_, Err(e)) => return Outcome::Skipped(e),
    };
    let fwd = match fwd {
        Ok(f) => f,
        Err(e) => return Outcome::Fail(format!("import: {e}")),
    };
    match evaluate(&fwd, &inputs, &outputs) {
        Ok(()) => Outcome::Pass,
        Err(e) => Outcome::Fail(e),
    }
}

/// Runs the graph on `inputs` and compares its outputs with `expected`.
fn evaluate(
    fwd: &fsdpc::frontends::onnx::OnnxForward,
    inputs: &[(String, TensorData)],
    expected: &[(String, TensorData)],
) -> Result<(), String> {
    let mut feeds = HashMap::new();
    for (i, (name, data)) in inputs.iter().enumerate() {
        let name = match (name.is_empty(), fwd.inputs.get(i)) {
            (true, Some((n, _))) => n.clone(),
            _ => name.clone(),
        };
        let t = HostTensor::from_bytes(data.ty.clone(), &data.bytes).map_err(|e| e.0)?;
        feeds.insert(name, t);
    }
    let params = init_params(&fwd.graph, 0).map_err(|e| e.to_string())?;
    let values = eval_graph(&fwd.graph, &feeds, &params, &KernelCtx::default())
        .map_err(|e| format!("eval: {e}"))?;
    if expected.len() != fwd.outputs.len() {
        return Err(format!(
            "{} outputs expected, the graph has {}",
            expected.len(),
            fwd.outputs.len()
        ));
    }
    for (i, (name, want)) in expected.iter().enumerate() {
        let (oname, v) = fwd
            .outputs
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or(&fwd.outputs[i]);
        let got = values.get(v).ok_or("an output was not computed")?;
        compare(got, want).map_err(|e| format!("output `{oname}`: {e}"))?;
    }
    Ok(())
}

/// `(absolute, relative)` tolerance of a float type.
fn tolerance(dt: DType) -> (f64, f64) {
    match dt {
        DType::F16 => (1e-3, 1e-3),
        DType::Bf16 => (1e-2, 1e-2),
        _ => (1e-4, 1e-4),
    }
}

fn compare(got: &HostTensor, want: &TensorData) -> Result<(), String> {
    if got.ty != want.ty {
        return Err(format!("got {}, expected {}", got.ty, want.ty));
    }
    let w = TensorRef::new(&want.ty, &want.bytes).map_err(|e| e.0)?;
    let g = got.view();
    let (atol, rtol) = tolerance(want.ty.dtype);
    let mut bad = (0..w.numel()).filter(|&i| {
        if want.ty.dtype.is_float() {
            let (a, b) = (g.get_f64(i), w.get_f64(i));
            !(a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= atol + rtol * b.abs())
        } else {
            g.get_i64(i) != w.get_i64(i)
        }
    });
    match bad.next() {
        None => Ok(()),
        Some(i) => Err(format!(
            "{} of {} elements differ; element {i} is {}, expected {}",
            1 + bad.count(),
            w.numel(),
            g.get_f64(i),
            w.get_f64(i)
        )),
    }
}

/// Runs one test, turning a panic into a failure.
fn run_guarded(dir: &Path) -> Outcome {
    catch_unwind(AssertUnwindSafe(|| run_case(dir))).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Outcome::Fail(format!("panicked: {msg}"))
    })
}

/// Every test's outcome, by name, running on a few threads.
fn run_all(dirs: &[PathBuf]) -> Vec<(String, Outcome)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let chunk = dirs.len().div_ceil(threads).max(1);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(|d| run_guarded(d)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a test thread died"))
            .collect::<Vec<_>>()
    });
    std::panic::set_hook(hook);
    dirs.iter()
        .map(|d| {
            d.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        })
        .zip(out)
        .collect()
}

#[test]
fn onnx_node_tests() {
    let Some(dir) = data_dir() else {
        println!(
            "skipped: no ONNX node tests (set FSDPC_ONNX_NODE_TESTS or run scripts/onnx-node-tests.sh)"
        );
        return;
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    dirs.sort();
    let results = run_all(&dirs);
    report(&results, dirs.len());
}

/// Prints the summary and fails if a listed test does not pass.
fn report(results: &[(String, Outcome)], total: usize) {
    let verbose = std::env::var_os("FSDPC_ONNX_VERBOSE").is_some();
    let expected: BTreeSet<&str> = EXPECTED.lines().filter(|l| !l.is_empty()).collect();
    let by_name: HashMap<&str, &Outcome> = results.iter().map(|(n, o)| (n.as_str(), o)).collect();
    let (mut passed, mut attempted, mut supported) = (0, 0, 0);
    for (name, o) in results {
        match o {
            Outcome::Unsupported => continue,
            Outcome::Skipped(r) if verbose => println!("SKIP {name}: {r}"),
            Outcome::Fail(r) if verbose => println!("FAIL {name}: {r}"),
            _ => {}
        }
        supported += 1;
        match o {
            Outcome::Pass => {
                passed += 1;
                attempted += 1;
                if !expected.contains(name.as_str()) {
                    println!("newly passing (add to tests/onnx_node_tests.txt): {name}");
                }
            }
            Outcome::Fail(_) => attempted += 1,
            _ => {}
        }
    }
    println!(
        "{passed} passed of {attempted} attempted ({supported} tests use only supported ops, of {total})"
    );
    let broken: Vec<String> = expected
        .iter()
        .filter_map(|name| match by_name.get(name) {
            Some(Outcome::Pass) => None,
            Some(Outcome::Fail(r)) | Some(Outcome::Skipped(r)) => Some(format!("{name}: {r}")),
            Some(Outcome::Unsupported) => Some(format!("{name}: uses an unmapped op")),
            None => Some(format!("{name}: not in the test data")),
        })
        .collect();
    assert!(
        broken.is_empty(),
        "{} listed ONNX node tests fail:\n{}",
        broken.len(),
        broken.join("\n")
    );
}
