//! The op table: every ONNX op the importer maps, each converted by a function
//! in the file of its family (one file per family, each naming the ONNX spec
//! section and opsets it covers). `registry` is the only place ops are listed.

mod cast;
pub(crate) mod conv;
mod elementwise;
mod gather;
mod generators;
mod logic;
mod loss;
mod matmul;
mod nll;
mod norm;
mod reduce;
mod sequence;
mod shape;
mod slice;

use super::context::NodeCx;
use std::collections::HashMap;

/// Converts one ONNX node: reads its inputs and attributes, adds IR nodes or
/// folds constants, and defines its outputs. The error is a reason; the caller
/// adds the node.
pub(crate) type Convert = fn(&mut NodeCx<'_>) -> Result<(), String>;

/// Every mapped default-domain op type and its converter.
pub(crate) fn registry() -> HashMap<&'static str, Convert> {
    [
        cast::OPS,
        conv::OPS,
        elementwise::OPS,
        gather::OPS,
        generators::OPS,
        logic::OPS,
        loss::OPS,
        matmul::OPS,
        norm::OPS,
        reduce::OPS,
        sequence::OPS,
        shape::OPS,
        slice::OPS,
    ]
    .into_iter()
    .flatten()
    .copied()
    .collect()
}

#[cfg(test)]
mod tests;
