//! Summaries of a plan for people: `fsdpc inspect`.
