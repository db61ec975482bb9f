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
    normal_of(hash(keys))
}

/// The standard normal of a key whose hash is `h`: `normal(keys) ==
/// normal_of(hash(keys))`, and `hash(&[a, .., k]) == hash_step(hash(&[a, ..]),
/// k)`, so a source drawing many values under one key prefix hashes the
/// prefix once.
#[inline]
pub fn normal_of(h: u64) -> f64 {
    let u1 = uniform(mix(h ^ 1)).max(f64::MIN_POSITIVE);
    let u2 = uniform(mix(h ^ 2));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A uniform integer in `0..n` (`n > 0`) from a key.
pub fn below(keys: &[u64], n: u64) -> u64 {
    ((hash(keys) as u128 * n as u128) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hashing a key prefix once and folding the last key gives the value
    /// of the whole key (what the data sources rely on).
    #[test]
    fn prefix_hash_gives_the_same_normals() {
        for sample in 0..50u64 {
            let prefix = hash(&[7, 3, sample, 0xF1EA_7E00]);
            for f in 0..40u64 {
                let whole = normal(&[7, 3, sample, 0xF1EA_7E00, f]);
                assert_eq!(whole.to_bits(), normal_of(hash_step(prefix, f)).to_bits());
            }
        }
    }
}
