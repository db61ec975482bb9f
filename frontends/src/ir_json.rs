//! Loading fsdpc IR JSON files: a forward `Graph` (whose first output is the
//! scalar loss) or a whole `TrainingProgram`, as fsdpc-ir's serde writes them.
//! Errors name the file and serde's line and column; a file that parses is
//! checked by the IR's verifier, and every problem it finds is reported.

use crate::error::FrontendError;
use fsdpc_ir::{Graph, TrainingProgram, ValueId};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Deserialize;
use std::path::Path;

/// What an fsdpc IR JSON file holds.
#[derive(Debug)]
pub enum JsonModel {
    /// A forward graph and its loss (`graph.outputs[0]`).
    Graph {
        /// The forward graph.
        graph: Graph,
        /// The scalar loss.
        loss: ValueId,
    },
    /// A complete training program.
    Program(TrainingProgram),
}

/// Just enough of a file to tell a program (`graph`, `loss`, `grads`) from a
/// graph (`nodes`).
#[derive(Deserialize)]
struct Probe {
    graph: Option<IgnoredAny>,
    grads: Option<IgnoredAny>,
}

/// Loads a file holding either a graph or a training program.
pub fn load_json(path: impl AsRef<Path>) -> Result<JsonModel, FrontendError> {
    let path = path.as_ref();
    let text = read(path)?;
    let probe: Probe = parse(path, &text)?;
    if probe.graph.is_some() && probe.grads.is_some() {
        Ok(JsonModel::Program(program_from_str(path, &text)?))
    } else {
        let (graph, loss) = graph_from_str(path, &text)?;
        Ok(JsonModel::Graph { graph, loss })
    }
}

/// Loads a forward graph whose first output is the scalar loss; returns the
/// graph and that loss.
pub fn load_graph(path: impl AsRef<Path>) -> Result<(Graph, ValueId), FrontendError> {
    let path = path.as_ref();
    graph_from_str(path, &read(path)?)
}

/// Loads a training program.
pub fn load_program(path: impl AsRef<Path>) -> Result<TrainingProgram, FrontendError> {
    let path = path.as_ref();
    program_from_str(path, &read(path)?)
}

fn read(path: &Path) -> Result<String, FrontendError> {
    std::fs::read_to_string(path).map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, FrontendError> {
    serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        // serde_json appends " at line L column C"; the fields carry it instead.
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        FrontendError::Json {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            reason: full.strip_suffix(&suffix).unwrap_or(&full).to_string(),
        }
    })
}

fn graph_from_str(path: &Path, text: &str) -> Result<(Graph, ValueId), FrontendError> {
    let graph: Graph = parse(path, text)?;
    let mut problems = ir_problems(fsdpc_ir::validate(&graph));
    match graph.outputs.first() {
        None => {
            problems.push("the graph has no outputs; outputs[0] must be the scalar loss".into())
        }
        Some(&loss) => problems.extend(loss_problem(&graph, loss, "outputs[0]")),
    }
    finish(path, problems)?;
    let loss = graph.outputs[0];
    Ok((graph, loss))
}

fn program_from_str(path: &Path, text: &str) -> Result<TrainingProgram, FrontendError> {
    let program: TrainingProgram = parse(path, text)?;
    let problems = ir_problems(program.validate());
    finish(path, problems)?;
    Ok(program)
}

fn finish(path: &Path, problems: Vec<String>) -> Result<(), FrontendError> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(FrontendError::BadGraph {
            path: path.to_path_buf(),
            problems,
        })
    }
}

/// The verifier's problems as strings.
fn ir_problems(r: Result<(), fsdpc_ir::Problems>) -> Vec<String> {
    r.err()
        .map(|p| p.0.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

fn value_exists(g: &Graph, v: ValueId) -> bool {
    g.try_node(v.node)
        .is_some_and(|n| (v.slot as usize) < n.outputs.len())
}

/// A problem with `loss` (named `what`), if it is not a floating-point scalar.
fn loss_problem(g: &Graph, loss: ValueId, what: &str) -> Option<String> {
    if !value_exists(g, loss) {
        return Some(format!("{what} ({loss}) does not exist"));
    }
    let ty = g.value_type(loss);
    if ty.shape.rank() != 0 || !ty.dtype.is_float() {
        return Some(format!(
            "{what} ({loss}, {ty}) must be a floating-point scalar: the loss"
        ));
    }
    None
}
