//! The unit-selector grammar that `--wrap`, `--activation-checkpointing`
//! and `--cpu-offload` share: a word (`all`, `blocks`, `none`), `every:K`,
//! `size:N`, `paths:a,b` or `kind:ModuleClass`. Each flag accepts some of
//! these forms and maps them to its own policy.

use crate::error::ConfigError;

/// One parsed selector, before a flag maps it to its policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// A bare word, lowercased (the empty string is the bare flag).
    Word(String),
    /// `every:K`, K >= 1.
    Every(u32),
    /// `size:N`, N >= 1 (underscores allowed: `size:1_000_000`).
    Size(u64),
    /// `paths:a,b`: comma-separated module paths, blanks dropped, at least one.
    Paths(Vec<String>),
    /// `kind:GPT2Block`.
    Kind(String),
}

/// Parses `s` as one selector for the flag that configures `what`.
/// `accepts` lists the forms the flag takes: its words and the heads
/// (`every`, `size`, `paths`, `kind`) it understands; anything else is
/// refused with `allowed`, the flag's own list of forms.
pub fn parse(
    s: &str,
    what: &'static str,
    allowed: &str,
    accepts: &[&str],
) -> Result<Selector, ConfigError> {
    let s = s.trim();
    let bad = |reason: String| ConfigError {
        what,
        value: s.to_string(),
        reason,
    };
    let (head, arg) = match s.split_once(':') {
        Some((h, a)) => (h.trim().to_ascii_lowercase(), Some(a.trim())),
        None => (s.to_ascii_lowercase(), None),
    };
    if !accepts.contains(&head.as_str()) {
        return Err(bad(format!("allowed forms: {allowed}")));
    }
    let positive = |k: &str| {
        k.replace('_', "")
            .parse::<u64>()
            .ok()
            .filter(|&k| k > 0)
            .ok_or_else(|| bad(format!("`{k}` is not a positive whole number")))
    };
    let takes_arg = matches!(head.as_str(), "every" | "size" | "paths" | "kind");
    match (head.as_str(), arg) {
        (_, None) if !takes_arg => Ok(Selector::Word(head)),
        ("every", Some(k)) => {
            let k = positive(k)?;
            u32::try_from(k)
                .map(Selector::Every)
                .map_err(|_| bad(format!("`{k}` is not a positive whole number")))
        }
        ("size", Some(n)) => positive(n).map(Selector::Size),
        ("kind", Some(k)) if !k.is_empty() => Ok(Selector::Kind(k.to_string())),
        ("paths", Some(p)) => {
            let paths: Vec<String> = p
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            if paths.is_empty() {
                return Err(bad("give at least one module path".into()));
            }
            Ok(Selector::Paths(paths))
        }
        _ => Err(bad(format!("allowed forms: {allowed}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[&str] = &["", "all", "every", "size", "paths", "kind"];

    #[test]
    fn forms() {
        let p = |s| parse(s, "x", "..", ALL);
        assert_eq!(p(" ALL "), Ok(Selector::Word("all".into())));
        assert_eq!(p(""), Ok(Selector::Word(String::new())));
        assert_eq!(p("every:2"), Ok(Selector::Every(2)));
        assert_eq!(p("size:1_000"), Ok(Selector::Size(1000)));
        assert_eq!(
            p("paths: a, ,b"),
            Ok(Selector::Paths(vec!["a".into(), "b".into()]))
        );
        assert_eq!(p("kind:Block"), Ok(Selector::Kind("Block".into())));
        let reason = |s| p(s).err().map(|e| e.reason).unwrap_or_default();
        assert_eq!(reason("every:0"), "`0` is not a positive whole number");
        assert_eq!(reason("paths:,"), "give at least one module path");
        assert_eq!(reason("kind:"), "allowed forms: ..");
        assert_eq!(
            reason("every"),
            "allowed forms: ..",
            "a head without its value"
        );
        assert_eq!(
            reason("blocks"),
            "allowed forms: ..",
            "a word the flag does not take"
        );
    }
}
