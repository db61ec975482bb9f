//! `fsdpc._fsdpc`: the native half of the `fsdpc` Python package. It holds
//! plans and runs the commands (`fsdpc::cli::embed`); the Python half
//! (`python/fsdpc/`) turns keyword arguments into flags and JSON into
//! objects.
//!
//! Every call that plans or simulates releases the interpreter while it
//! runs, and every failure is an `FsdpcError` carrying the command line's
//! one-line message.

use fsdpc::cli::embed::{self, FlagKind};
use fsdpc::cli::CliError;
use fsdpc::plan::Plan;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::path::PathBuf;

/// Counts every heap byte per rank, as the `fsdpc` binary does, so `fsdpc
/// train` run from the wheel reports the measured peak beside the planned.
#[global_allocator]
static ALLOC: fsdpc::runtime::account::CountingAlloc = fsdpc::runtime::account::CountingAlloc;

create_exception!(
    _fsdpc,
    FsdpcError,
    PyException,
    "An fsdpc failure: bad input (model, flag, file) or a plan that cannot be made; \
     the message is the command line's."
);

fn error(e: CliError) -> PyErr {
    FsdpcError::new_err(e.to_string())
}

/// A compiled plan (`fsdpc compile`'s JSON), held natively.
#[pyclass(module = "fsdpc._fsdpc", name = "NativePlan", frozen)]
struct NativePlan {
    plan: Plan,
}

#[pymethods]
impl NativePlan {
    /// Reads a plan file as `fsdpc inspect` does: parsed, validated, and a
    /// model or other JSON named as what it is.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<NativePlan> {
        py.detach(|| embed::load_plan(&path))
            .map(|plan| NativePlan { plan })
            .map_err(error)
    }

    /// Parses and validates a plan's JSON.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: String) -> PyResult<NativePlan> {
        py.detach(|| Plan::from_json(&text))
            .map(|plan| NativePlan { plan })
            .map_err(|e| FsdpcError::new_err(e.to_string()))
    }

    /// The plan as the JSON `fsdpc compile` writes.
    fn to_json(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.plan.to_json_pretty())
            .map_err(|e| FsdpcError::new_err(e.to_string()))
    }

    /// `fsdpc inspect`'s text.
    fn summary(&self, py: Python<'_>) -> String {
        py.detach(|| fsdpc::report::inspect::render_text(&self.plan))
    }

    /// `fsdpc inspect --json`.
    fn summary_json(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| serde_json::to_string(&fsdpc::report::inspect::summary(&self.plan)))
            .map_err(|e| FsdpcError::new_err(e.to_string()))
    }

    /// `fsdpc simulate [--cluster C] [--kernels K]`: (the simulation as
    /// JSON, its text).
    #[pyo3(signature = (cluster=None, kernels=None))]
    fn simulate(
        &self,
        py: Python<'_>,
        cluster: Option<String>,
        kernels: Option<String>,
    ) -> PyResult<(String, String)> {
        let (sim, text) = py
            .detach(|| embed::simulate(&self.plan, cluster.as_deref(), kernels.as_deref()))
            .map_err(error)?;
        let json = serde_json::to_string(&sim).map_err(|e| FsdpcError::new_err(e.to_string()))?;
        Ok((json, text))
    }

    /// `fsdpc report [--cluster C] [--measured TRACE]`: the HTML page.
    #[pyo3(signature = (cluster=None, measured=None))]
    fn report(
        &self,
        py: Python<'_>,
        cluster: Option<String>,
        measured: Option<PathBuf>,
    ) -> PyResult<String> {
        py.detach(|| embed::report(&self.plan, cluster.as_deref(), measured.as_deref()))
            .map_err(error)
    }
}

/// `fsdpc compile ARGS...` without `-o`: (the plan, the `--auto` table or
/// None, the `--auto` search as JSON or None).
#[pyfunction]
fn compile(
    py: Python<'_>,
    args: Vec<String>,
) -> PyResult<(NativePlan, Option<String>, Option<String>)> {
    let compiled = py.detach(|| embed::compile(&args)).map_err(error)?;
    let (text, json) = match compiled.search {
        Some(s) => (Some(s.text), Some(s.json.to_string())),
        None => (None, None),
    };
    Ok((
        NativePlan {
            plan: compiled.plan,
        },
        text,
        json,
    ))
}

/// The flags of `fsdpc COMMAND`: (long name, kind, first help line), kind
/// one of `switch`, `value`, `optional_value`, `repeated`.
#[pyfunction]
fn flags(command: &str) -> PyResult<Vec<(String, &'static str, String)>> {
    let flags = embed::flags(command)
        .ok_or_else(|| FsdpcError::new_err(format!("no command `{command}`")))?;
    Ok(flags
        .into_iter()
        .map(|f| {
            let kind = match f.kind {
                FlagKind::Switch => "switch",
                FlagKind::Value => "value",
                FlagKind::OptionalValue => "optional_value",
                FlagKind::Repeated => "repeated",
            };
            (f.long, kind, f.help)
        })
        .collect())
}

/// Runs `fsdpc ARGS...` as the binary does; returns its exit status.
#[pyfunction]
fn main(py: Python<'_>, args: Vec<String>) -> i32 {
    py.detach(|| embed::main(&args))
}

#[pymodule]
fn _fsdpc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FsdpcError", m.py().get_type::<FsdpcError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<NativePlan>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(flags, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    Ok(())
}
