//! The named rewrite rules (`Rule`), each with the egg rewrites that
//! grow a term's e-graph with its form, and the sets of rules a compile
//! enables (`Rules`, `--rewrites all|none|RULE,RULE`).

use super::lang::{Coll, Payloads};
use crate::error::PlanError;
use egg::{rewrite, Rewrite};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// A named rewrite rule.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    CastBeforeGather,
    HierarchicalAllGather,
    HierarchicalReduceScatter,
    AllReduceAsReduceScatterAllGather,
    BucketAllGathers,
}

impl Rule {
    pub const ALL: [Rule; 5] = [
        Rule::CastBeforeGather,
        Rule::HierarchicalAllGather,
        Rule::HierarchicalReduceScatter,
        Rule::AllReduceAsReduceScatterAllGather,
        Rule::BucketAllGathers,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rule::CastBeforeGather => "cast-before-gather",
            Rule::HierarchicalAllGather => "hierarchical-all-gather",
            Rule::HierarchicalReduceScatter => "hierarchical-reduce-scatter",
            Rule::AllReduceAsReduceScatterAllGather => "all-reduce-as-reduce-scatter-all-gather",
            Rule::BucketAllGathers => "bucket-all-gathers",
        }
    }

    pub(super) fn rewrites(self) -> Vec<Rewrite<Coll, Payloads>> {
        match self {
            Rule::CastBeforeGather => {
                vec![rewrite!("cast-before-gather"; "(recv ?d (ag ?x))" => "(ag (cast ?d ?x))")]
            }
            Rule::HierarchicalAllGather => {
                vec![rewrite!("hierarchical-all-gather"; "(ag ?x)" => "(hag ?x)")]
            }
            Rule::HierarchicalReduceScatter => {
                vec![rewrite!("hierarchical-reduce-scatter"; "(rs ?x)" => "(hrs ?x)")]
            }
            Rule::AllReduceAsReduceScatterAllGather => {
                vec![
                    rewrite!("all-reduce-as-reduce-scatter-all-gather"; "(ar ?x)" => "(ag (rs ?x))"),
                ]
            }
            // The run is right-nested: the last two members, or the first
            // two of a longer rest. Every contiguous grouping is reachable.
            Rule::BucketAllGathers => vec![
                rewrite!("bucket-all-gathers"; "(then (ag ?x) (ag ?y))" => "(ag (cat ?x ?y))"),
                rewrite!("bucket-all-gathers-rest";
                    "(then (ag ?x) (then (ag ?y) ?z))" => "(then (ag (cat ?x ?y)) ?z)"),
            ],
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The rules a compile may use (`--rewrites all|none|RULE,RULE`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rules(pub BTreeSet<Rule>);

impl Default for Rules {
    fn default() -> Rules {
        Rules(Rule::ALL.into_iter().collect())
    }
}

impl Rules {
    pub fn none() -> Rules {
        Rules(BTreeSet::new())
    }

    pub fn has(&self, r: Rule) -> bool {
        self.0.contains(&r)
    }

    /// `all`, `none`, or rule names separated by commas.
    pub fn parse(s: &str) -> Result<Rules, PlanError> {
        match s.trim() {
            "all" => return Ok(Rules::default()),
            "none" | "" => return Ok(Rules::none()),
            _ => {}
        }
        let mut out = BTreeSet::new();
        for name in s.split(',').map(str::trim) {
            let r = Rule::ALL
                .into_iter()
                .find(|r| r.name() == name)
                .ok_or_else(|| PlanError::BadConfig {
                    what: "rewrites",
                    value: s.to_string(),
                    reason: format!(
                        "no rewrite rule `{name}`; the rules: all, none, {}",
                        Rule::ALL.map(Rule::name).join(", ")
                    ),
                })?;
            out.insert(r);
        }
        Ok(Rules(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_parse_and_round_trip() {
        assert_eq!(Rules::parse("all").unwrap(), Rules::default());
        assert_eq!(Rules::parse("none").unwrap(), Rules::none());
        let r = Rules::parse("cast-before-gather, hierarchical-all-gather").unwrap();
        assert!(r.has(Rule::CastBeforeGather) && r.has(Rule::HierarchicalAllGather));
        assert!(!r.has(Rule::HierarchicalReduceScatter));
        let e = Rules::parse("bucket").unwrap_err().to_string();
        assert!(
            e.contains("no rewrite rule `bucket`") && e.contains("cast-before-gather"),
            "{e}"
        );
    }
}
