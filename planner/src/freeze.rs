//! The freeze pass, frozen parameters (`--freeze PATTERN`, PyTorch's
//! `requires_grad_(False)`): picks the parameters whose names match the
//! config's glob patterns and freezes them in the training program
//! (`fsdpc_ir::freeze`: no gradient, the backward nodes only they needed
//! removed), before the units are chosen.
//!
//! Conventions:
//! - A pattern is a shell-style glob over the whole parameter name (`*`
//!   matches any run of characters, dots included; `?` one character;
//!   `[...]` a class): `transformer.h.0.*`, `*.wte.weight`.
//! - Every pattern must match at least one parameter; one that matches none
//!   is an error naming some of the model's parameters (a typo must not
//!   silently train everything).
//! - Tied parameters are frozen together (see `fsdpc_ir::freeze`).
//!
//! What the later passes do with frozen parameters: `flat` lays them out in
//! a segment of their own after the trainable ones, and the schedule gives
//! the frozen segment no flat gradient, no gradient shard, no reduction and
//! no optimizer state (see `flat`).

use crate::error::PlanError;
use fsdpc_ir::{ParamId, TrainingProgram};
use std::collections::BTreeSet;

/// How many parameter names a "matches nothing" error lists.
const SHOWN_NAMES: usize = 8;

/// Splits `--freeze` arguments (each a pattern or a comma-separated list)
/// into patterns, blanks dropped.
pub fn split_patterns(args: &[String]) -> Vec<String> {
    args.iter()
        .flat_map(|a| a.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

/// The parameters `patterns` match, checked: each pattern parses and matches
/// at least one parameter.
pub fn matched(
    program: &TrainingProgram,
    patterns: &[String],
) -> Result<BTreeSet<ParamId>, PlanError> {
    let params = &program.graph.params;
    let mut out = BTreeSet::new();
    for pat in patterns {
        let glob = glob::Pattern::new(pat).map_err(|e| PlanError::BadConfig {
            what: "freeze pattern",
            value: pat.clone(),
            reason: e.to_string(),
        })?;
        let hits: Vec<ParamId> = params
            .iter()
            .enumerate()
            .filter(|(_, p)| glob.matches(&p.name))
            .map(|(i, _)| ParamId(i as u32))
            .collect();
        if hits.is_empty() {
            return Err(PlanError::FreezeMatchesNothing {
                pattern: pat.clone(),
                params: params.len(),
                some_names: params
                    .iter()
                    .take(SHOWN_NAMES)
                    .map(|p| p.name.clone())
                    .collect(),
            });
        }
        out.extend(hits);
    }
    Ok(out)
}

/// `program` with the parameters `patterns` match frozen (unchanged for no
/// patterns).
pub fn apply(program: TrainingProgram, patterns: &[String]) -> Result<TrainingProgram, PlanError> {
    if patterns.is_empty() {
        return Ok(program);
    }
    let frozen = matched(&program, patterns)?;
    let (program, _) = fsdpc_ir::freeze(program, &frozen).map_err(|e| PlanError::Program {
        reason: e.to_string(),
    })?;
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_patterns_takes_commas_and_repeats() {
        let args = vec![
            "a.*, b.weight".to_string(),
            "c".to_string(),
            " ,".to_string(),
        ];
        assert_eq!(split_patterns(&args), vec!["a.*", "b.weight", "c"]);
    }

    #[test]
    fn star_matches_across_dots() {
        let g = glob::Pattern::new("*.wte.weight").expect("pattern");
        assert!(g.matches("transformer.wte.weight"));
        let g = glob::Pattern::new("transformer.h.0.*").expect("pattern");
        assert!(g.matches("transformer.h.0.attn.c_attn.weight"));
        assert!(!g.matches("transformer.h.10.attn.c_attn.weight"));
    }
}
