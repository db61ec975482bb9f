//! Counter-based random numbers for the data sources: every value is a pure
//! function of a key (seed, step, sample, feature...), so any rank can draw
//! exactly the values it needs and every world size sees the same data.
//! Built on the IR's splitmix64 finaliser (`fsdpc_ir::init::mix64`), which
//! parameter initialisation uses; data keys are tuples, hence `hash(&[..])`.

/// One splitmix64 step: the golden-ratio increment, then the finaliser.
#[inline]
pub fn mix(z: u64) -> u64 {
    fsdpc_ir::init::mix64(z.wrapping_add(0x9E37_79B9_7F4A_7C15))
}

/// The state `hash` starts from.
pub const HASH_SEED: u64 = 0x5DEE_CE66_D1CE_4E5B;

/// One counter folded into a hash state.
#[inline]
pub fn hash_step(h: u64, k: u64) -> u64 {
    mix(h ^ mix(k))
}

/// A hash of a sequence of counters.
#[inline]
pub fn hash(keys: &[u64]) -> u64 {
    keys.iter().fold(HASH_SEED, |h, &k| hash_step(h, k))
}

/// A uniform in [0, 1) from a hash (53 bits).
#[inline]
pub fn uniform(h: u64) -> f64 {
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A standard normal from a key (Box-Muller on two derived uniforms).
pub fn normal(keys: &[u64]) -> f64 {
    let h = hash(keys);
    let u1 = uniform(mix(h ^ 1)).max(f64::MIN_POSITIVE);
    let u2 = uniform(mix(h ^ 2));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A uniform integer in `0..n` (`n > 0`) from a key.
pub fn below(keys: &[u64], n: u64) -> u64 {
    ((hash(keys) as u128 * n as u128) >> 64) as u64
}
