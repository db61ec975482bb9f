//! The list of passes in code is the one ARCHITECTURE.md shows: its
//! table under the heading about the planner's passes names every pass,
//! in order, with its stage and what it decides.

use fsdpc_planner::{passes, PassInfo};

/// The rows of the first markdown table under the first `##` heading that
/// mentions passes, each as its trimmed cells (header and rule dropped).
fn pass_table(doc: &str) -> Vec<Vec<String>> {
    let mut lines = doc.lines();
    lines
        .by_ref()
        .find(|l| l.starts_with("## ") && l.to_lowercase().contains("passes"))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no `## ...passes` heading"));
    lines
        .take_while(|l| !l.starts_with("## "))
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The table row `p` should have.
fn row(p: &PassInfo) -> Vec<String> {
    vec![
        format!("`{}`", p.name),
        p.stage.name().to_string(),
        p.decides.to_string(),
    ]
}

#[test]
fn architecture_lists_the_passes_in_code_in_order() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../ARCHITECTURE.md");
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let table = pass_table(&doc);
    let names: Vec<String> = table
        .iter()
        .map(|r| r[0].trim_matches('`').to_string())
        .collect();
    let code: Vec<PassInfo> = passes();
    let expected: Vec<String> = code.iter().map(|p| p.name.to_string()).collect();
    let rows: Vec<String> = code
        .iter()
        .map(|p| format!("| {} |", row(p).join(" | ")))
        .collect();
    assert_eq!(
        names,
        expected,
        "the pass table of ARCHITECTURE.md; the rows in code:\n{}",
        rows.join("\n")
    );
    for (got, p) in table.iter().zip(&code) {
        assert_eq!(*got, row(p), "the row of pass `{}`", p.name);
    }
}

#[test]
fn pass_names_are_distinct_and_say_what_they_decide() {
    let all = passes();
    let mut names: Vec<&str> = all.iter().map(|p| p.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len(), "{names:?}");
    for p in &all {
        assert!(!p.decides.is_empty() && !p.decides.contains('|'), "{p:?}");
    }
}
