//! The `serde` defaults and skip predicates of the schema's optional
//! fields: what an absent field means.

pub(crate) fn is_zero(x: &u64) -> bool {
    *x == 0
}

pub(crate) fn is_zero_u32(x: &u32) -> bool {
    *x == 0
}

pub(crate) fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

pub(crate) fn is_false(x: &bool) -> bool {
    !*x
}

pub(crate) fn yes() -> bool {
    true
}

pub(crate) fn is_yes(x: &bool) -> bool {
    *x
}

pub(crate) fn one() -> u32 {
    1
}

/// The dtype of fields absent in plans written before mixed precision.
pub(crate) fn f32() -> fsdpc_ir::DType {
    fsdpc_ir::DType::F32
}

pub(crate) fn is_one(v: &u32) -> bool {
    *v == 1
}
