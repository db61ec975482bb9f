//! fsdpc-report: the views of a plan. `inspect` summarises it (as data and
//! as the text `fsdpc inspect` prints), `trace` draws its simulated step
//! (and a measured run) as a Perfetto/Chrome trace, `compare` reads a
//! predicted and a measured trace side by side, and `html` writes the
//! self-contained page of `fsdpc report`.
//!
//! Architecture invariant: views read plans and simulate them with the
//! planner's cost model; they decide nothing, and nothing but the CLI
//! depends on them.

pub mod compare;
pub mod html;
pub mod inspect;
pub mod trace;
