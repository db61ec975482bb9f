//! Counter-based random numbers: parameter initialisation and dropout masks.
//!
//! Every value is a pure function of `(seed, key, counter)`, hashed with a
//! splitmix64 step, so rank `r` can make exactly its shard of a parameter and
//! the result is bit-identical to making the whole tensor and slicing it, for
//! every sharding factor. A parameter's key is a stable hash of its *name*
//! (FNV-1a, then the splitmix64 finaliser), not its id, so adding a parameter
//! does not change the others' values.
//!
//! Element `i` of a `Normal { std }` parameter is `std · z`, with `z` from
//! Box-Muller on the uniforms of counters `2i` and `2i + 1`; element `i` of a
//! `Uniform { low, high }` parameter is `low + (high - low) · u` with `u` from
//! counter `i`. Values are computed in f64 and rounded once to f32 (the
//! transcendental functions are the platform's, so two different libm
//! implementations could in rare cases differ in the last bit).

use crate::error::IrError;
use crate::param::{Init, ParamSpec};

/// The golden-ratio increment of splitmix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Separates the dropout stream from parameter streams.
const DROPOUT_DOMAIN: u64 = 0xD50F_D50F_D50F_D50F;

/// The splitmix64 finaliser: a bijection of `u64` with full avalanche.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stable key of a parameter: FNV-1a of its name's bytes, mixed.
pub fn param_key(name: &str) -> u64 {
    let fnv = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    });
    mix64(fnv)
}

/// The `counter`-th output of the splitmix64 stream seeded by `(seed, key)`.
pub fn hash(seed: u64, key: u64, counter: u64) -> u64 {
    let base = mix64(mix64(seed ^ GOLDEN) ^ key);
    mix64(base.wrapping_add(counter.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A uniform double in the open interval (0, 1) from 53 bits of `h`.
pub fn unit_open(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

/// Element `i` of the standard normal stream of `(seed, key)` (Box-Muller).
pub fn normal(seed: u64, key: u64, i: u64) -> f64 {
    let u1 = unit_open(hash(seed, key, i.wrapping_mul(2)));
    let u2 = unit_open(hash(seed, key, i.wrapping_mul(2).wrapping_add(1)));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Element `i` of the uniform (0, 1) stream of `(seed, key)`.
pub fn uniform(seed: u64, key: u64, i: u64) -> f64 {
    unit_open(hash(seed, key, i))
}

/// Whether element `element` survives a dropout with probability `p` at
/// training step `step`: `keep` iff a uniform (0, 1) draw keyed by
/// `(seed, step, element)` is at least `p`. The `Dropout` kernel and its
/// gradient use this, so the backward mask equals the forward one.
pub fn dropout_keep(seed: u64, step: u64, element: u64, p: f64) -> bool {
    let key = mix64(step ^ DROPOUT_DOMAIN);
    unit_open(hash(seed, key, element)) >= p
}

/// Fills `out` with elements `[start, start + out.len())` (row-major) of the
/// initial value of the parameter `spec` under run seed `seed`. Fails if the
/// range runs past the parameter or `Init::Data` does not hold enough bytes.
pub fn fill_f32(spec: &ParamSpec, seed: u64, start: u64, out: &mut [f32]) -> Result<(), IrError> {
    let numel = spec.ty.numel();
    let end = start.checked_add(out.len() as u64);
    if end.is_none_or(|e| e > numel) {
        return Err(IrError::Invalid(format!(
            "parameter `{}` has {numel} elements; cannot fill [{start}, {start} + {})",
            spec.name,
            out.len()
        )));
    }
    let key = param_key(&spec.name);
    let at = |j: usize| start + j as u64;
    match &spec.init {
        Init::Normal { std } => fill(out, |j| std * normal(seed, key, at(j))),
        Init::Uniform { low, high } => {
            fill(out, |j| low + (high - low) * uniform(seed, key, at(j)))
        }
        Init::Zeros => out.fill(0.0),
        Init::Ones => out.fill(1.0),
        Init::Constant { value } => out.fill(*value as f32),
        Init::File { path, tensor, .. } => {
            return Err(IrError::Invalid(format!(
                "parameter `{}` is tensor `{tensor}` of `{path}`, which the runtime reads",
                spec.name
            )));
        }
        Init::Data { data } => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = data.get_f64(at(j)).ok_or_else(|| {
                    IrError::Invalid(format!(
                        "parameter `{}`: init data of type {} has no element {}",
                        spec.name,
                        data.ty,
                        at(j)
                    ))
                })? as f32;
            }
        }
    }
    Ok(())
}

/// Elements `[start, start + out.len())` of member `member`'s part of
/// `spec` (`ParamSpec::tp`), each run of them read by `fill_run(whole,
/// whole start, out)` from the whole parameter; `fill_run` is `fill_f32`
/// or a reader of the file the whole lies in. An unsplit parameter is one
/// run.
pub fn fill_part<E>(
    spec: &ParamSpec,
    member: u32,
    start: u64,
    out: &mut [f32],
    mut fill_run: impl FnMut(&ParamSpec, u64, &mut [f32]) -> Result<(), E>,
) -> Result<(), E> {
    let Some(tp) = &spec.tp else {
        return fill_run(spec, start, out);
    };
    let whole = spec.whole();
    let end = start + out.len() as u64;
    for (local, full, n) in tp.runs(&spec.ty.shape.0, member) {
        let (lo, hi) = (local.max(start), (local + n).min(end));
        if lo >= hi {
            continue;
        }
        let dst = &mut out[(lo - start) as usize..(hi - start) as usize];
        fill_run(&whole, full + (lo - local), dst)?;
    }
    Ok(())
}

fn fill(out: &mut [f32], f: impl Fn(usize) -> f64) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = f(j) as f32;
    }
}
