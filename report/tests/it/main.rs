//! The views' integration tests (`inspect` text, the HTML report), in one
//! test binary (`cargo test -p fsdpc-report --test it`). `common` builds zoo
//! programs and plans them.

mod common;

mod inspect;
mod report;
