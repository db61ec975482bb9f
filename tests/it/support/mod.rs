//! Helpers shared by the integration tests that train plans of zoo models.

#![allow(dead_code)]

pub mod plan;
