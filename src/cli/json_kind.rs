//! What a `.json` argument holds, told from its top-level fields before any
//! loader reads it: a plan (`schema: "fsdpc.plan/..."`), an fsdpc IR model (a
//! graph with `nodes`, or a program with `graph` and `grads`), or neither.
//! Each command then gives the message that fits ("compile it first", "this
//! is not an fsdpc file") instead of the error of the wrong loader.

use super::CliError;
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::path::Path;

/// The schema prefix every plan version carries.
const PLAN_SCHEMA_PREFIX: &str = "fsdpc.plan/";

/// What a JSON file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonKind {
    /// A plan written by `fsdpc compile` (any schema version; the plan
    /// loader says whether it reads that version).
    Plan,
    /// An fsdpc IR model: a forward graph or a training program.
    Model,
}

/// The top-level fields that tell the kinds apart; the rest is skipped.
#[derive(Deserialize)]
struct Probe {
    schema: Option<serde_json::Value>,
    nodes: Option<IgnoredAny>,
    graph: Option<IgnoredAny>,
    grads: Option<IgnoredAny>,
}

/// Whether `model` names a `.json` file (any case).
pub(crate) fn is_json(model: &str) -> bool {
    Path::new(model)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Tells what `text`, the contents of `path`, holds; JSON that is not an
/// object, or an object that is neither kind, is a usage error saying so.
pub(crate) fn sniff(path: &Path, text: &str) -> Result<JsonKind, CliError> {
    let shown = path.display();
    let not_json = |e: serde_json::Error| CliError::Usage(format!("{shown}: not valid JSON: {e}"));
    if !text.trim_start().starts_with('{') {
        serde_json::from_str::<IgnoredAny>(text).map_err(not_json)?;
        return Err(CliError::Usage(format!(
            "{shown}: the JSON is not an object, so neither an fsdpc plan nor an fsdpc IR model"
        )));
    }
    match serde_json::from_str::<Probe>(text) {
        Ok(probe) => kind(&probe).ok_or_else(|| neither(path)),
        // Valid JSON of another shape (a duplicate field, say).
        Err(e) if e.is_data() => Err(neither(path)),
        Err(e) => Err(not_json(e)),
    }
}

/// The kind `probe` shows, if any.
fn kind(probe: &Probe) -> Option<JsonKind> {
    if let Some(schema) = &probe.schema {
        let plan = schema
            .as_str()
            .is_some_and(|s| s.starts_with(PLAN_SCHEMA_PREFIX));
        return plan.then_some(JsonKind::Plan);
    }
    let model = probe.nodes.is_some() || (probe.graph.is_some() && probe.grads.is_some());
    model.then_some(JsonKind::Model)
}

/// The error for a JSON object that is neither a plan nor an IR model.
fn neither(path: &Path) -> CliError {
    CliError::Usage(format!(
        "{}: neither an fsdpc plan (a `schema` of {PLAN_SCHEMA_PREFIX}...) nor an fsdpc IR model \
         (a graph with `nodes`, or a program with `graph` and `grads`)",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<JsonKind, String> {
        sniff(Path::new("x.json"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn kinds() {
        assert_eq!(
            check(r#"{"schema": "fsdpc.plan/v1", "units": []}"#),
            Ok(JsonKind::Plan)
        );
        assert_eq!(check(r#"{"schema": "fsdpc.plan/v9"}"#), Ok(JsonKind::Plan));
        assert_eq!(
            check(r#"{"nodes": [], "outputs": []}"#),
            Ok(JsonKind::Model)
        );
        assert_eq!(
            check(r#"{"graph": {}, "loss": 0, "grads": []}"#),
            Ok(JsonKind::Model)
        );
    }

    #[test]
    fn neither_kind_says_so() {
        for text in [
            r#"{"name": "bert", "layers": 12}"#,
            r#"{"schema": "something/else"}"#,
            r#"{"schema": 3}"#,
            r#"{"graph": {}}"#,
        ] {
            let e = check(text).expect_err(text);
            assert!(e.contains("neither an fsdpc plan"), "{text}: {e}");
        }
        for text in ["[1, 2]", r#"["fsdpc.plan/v1", 1, 2, 3]"#, "3"] {
            let e = check(text).expect_err(text);
            assert!(e.contains("not an object"), "{text}: {e}");
        }
        let e = check("").expect_err("empty");
        assert!(e.starts_with("x.json: not valid JSON"), "{e}");
        let e = check(r#"{"schema": "#).expect_err("truncated");
        assert!(e.starts_with("x.json: not valid JSON"), "{e}");
    }
}
