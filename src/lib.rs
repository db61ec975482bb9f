//! fsdpc facade
