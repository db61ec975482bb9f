//! Low-precision collectives: the wire formats of all-gathers and
//! reduce-scatters (`--allgather-wire`, `--reduce-scatter-wire`), the exact
//! semantics every runtime implements, and the byte layout of their
//! scratch buffers. The planner's `quantize` pass puts them on a
//! schedule's collectives.
//!
//! Semantics (the runtime, `fsdpc_runtime::comm::codec`, implements exactly
//! this; the tests compare with an independent reference bit for bit):
//!
//! - **`Fp8E4m3 { scale: PerUnit }` all-gather** (FSDP2's float8 all-gather,
//!   torchao's dynamic scaling with an amax all-reduce): each member takes
//!   the amax of its shard, `max |x|` over its *finite* elements (read in
//!   the shard's dtype, widened to f32; 0 when none is finite); the members'
//!   amaxes are all-gathered (4 bytes each) and the unit's amax is their
//!   maximum, so every member uses one scale, `scale = 448 / max(amax,
//!   1e-12)` in f32 (torchao's `EPS`). Each element becomes `e4m3(x *
//!   scale)`: OCP E4M3FN (bias 7, no infinity, largest finite 448), round to
//!   nearest with ties to even, saturating (`|v| > 448` becomes `±448`). A
//!   NaN or infinite element becomes the NaN code `0x7f` (with its sign
//!   bit): e4m3fn has no infinity, and NaN must propagate, so an overflow
//!   upstream is not hidden as 448. The codes are gathered as bytes; each
//!   member's code `c` lands as `decode(c) / scale` (f32 arithmetic, then
//!   rounded to nearest into the gathered dtype).
//! - **`Int8Block { block }` all-gather** (ZeRO++ qwZ): each member cuts its
//!   shard into blocks of `block` elements (the last one shorter), per block
//!   `s = absmax / 127` (f32) and `q = clamp(round_ties_even(x / s), -127,
//!   127)` (`q = 0` where `s = 0`). A block holding a NaN or an infinity
//!   gets `s = NaN`: int8 has no NaN code, so the whole block lands as NaN
//!   (NaN propagates). The payload, scales then codes, is gathered as bytes;
//!   each code lands as `q as f32 * s`, rounded into the gathered dtype.
//! - **`Int8Block { block }` reduce-scatter** (ZeRO++ qgZ): each member cuts
//!   its flat gradient into the members' slices (slice p for position p),
//!   quantizes each slice blockwise as above (blocks start at the slice's
//!   first element) and sends slice p to member p (an all-to-all of the
//!   payloads). Member p dequantizes each member's payload and sums them
//!   element by element **in group position order in f32**,
//!   `((d_0 + d_1) + d_2) + ...`, divides by the instruction's divisor and
//!   rounds once into the gradient shard's dtype: deterministic, whatever
//!   the timing of the ranks, and the same on thread and process ranks.
//!
//! Only gathers from the parameter shard over `Group::Shard` take the
//! all-gather wire (a gather from a resharded slice, `Group::Reshard`,
//! stays native: its source is already a dequantized copy); only
//! reduce-scatters take the reduce-scatter wire (all-reduces, under
//! `no_shard` or across hybrid replicas, stay native). fp8 gradients are
//! refused (`FsdpConfig::check`): e4m3's range is too narrow for them
//! without per-tensor loss scaling.
//!
//! Scratch (`BufferKind::Wire`, dtype `bool`: raw bytes, one a byte): a
//! quantized collective's payloads live in a buffer of their own, written
//! by the collective and freed right after it on its stream, so the memory
//! plan, the validator and the counting allocator see them. Layouts, with
//! S the shard's elements, T the flat gradient's, F the group size and
//! `P(n) = 4 * ceil(n / block) + n` an int8 payload of n elements:
//! - fp8 all-gather: `[own amax: 4 | F amaxes: 4F | own codes: S | F x
//!   codes: F S]`, `(4 + S)(1 + F)` bytes;
//! - int8 all-gather: `[own payload: P(S) | F payloads: F P(S)]`;
//! - int8 reduce-scatter: `[F payloads sent: F P(T/F) | F received: F
//!   P(T/F)]` (slot p of the first half goes to member p; slot q of the
//!   second came from member q).

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// How a collective's payload travels (see the module header).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "format", rename_all = "snake_case")]
pub enum Wire {
    /// The instruction's dtype, as the plan has always done.
    #[default]
    Native,
    /// fp8 e4m3 codes with a scale (all-gathers only).
    Fp8E4m3 { scale: Fp8Scale },
    /// int8 codes with an f32 scale per block of `block` elements.
    Int8Block { block: u32 },
}

/// Which elements share one fp8 scale.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fp8Scale {
    /// One scale for the whole unit, from the group's largest amax.
    #[default]
    PerUnit,
}

/// The block size `--wire-block` defaults to.
pub const DEFAULT_BLOCK: u32 = 256;

/// The largest block size accepted.
pub const MAX_BLOCK: u32 = 1 << 20;

/// Largest finite e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;

/// The smallest amax the fp8 scale divides by (torchao's `EPS`).
pub const AMAX_EPS: f32 = 1e-12;

impl Wire {
    /// The values `Wire::parse` accepts.
    pub const ALLOWED: &'static str = "native, fp8 (e4m3, per-unit scale), int8 (block-quantized)";

    /// True for `Native` (the serde default).
    pub fn is_native(&self) -> bool {
        *self == Wire::Native
    }

    /// Parses `native`, `fp8` (`fp8_e4m3`, `e4m3`) or `int8`
    /// (`int8_block`); `block` is the int8 block size.
    pub fn parse(s: &str, block: u32) -> Result<Wire, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "native" | "none" => Ok(Wire::Native),
            "fp8" | "fp8_e4m3" | "e4m3" => Ok(Wire::Fp8E4m3 {
                scale: Fp8Scale::PerUnit,
            }),
            "int8" | "int8_block" => Ok(Wire::Int8Block { block }),
            _ => Err(ConfigError {
                what: "wire format",
                value: s.to_string(),
                reason: format!("allowed values: {}", Wire::ALLOWED),
            }),
        }
    }

    /// The format as `parse` accepts it, with the block size (`int8/256`).
    pub fn name(&self) -> String {
        match self {
            Wire::Native => "native".into(),
            Wire::Fp8E4m3 { .. } => "fp8".into(),
            Wire::Int8Block { block } => format!("int8/{block}"),
        }
    }

    /// Bytes of one int8 payload of `n` elements: the blocks' f32 scales,
    /// then one code a byte (0 for the other formats).
    pub fn int8_payload(&self, n: u64) -> u64 {
        match self {
            Wire::Int8Block { block } => 4 * n.div_ceil(u64::from((*block).max(1))) + n,
            _ => 0,
        }
    }

    /// Bytes of the scratch of an all-gather of `shard` elements per member
    /// over `f` members (see the module header; 0 for `Native`).
    pub fn gather_scratch_bytes(&self, shard: u64, f: u64) -> u64 {
        match self {
            Wire::Native => 0,
            Wire::Fp8E4m3 { .. } => (4 + shard) * (1 + f),
            Wire::Int8Block { .. } => self.int8_payload(shard) * (1 + f),
        }
    }

    /// Bytes of the scratch of a reduce-scatter of a flat gradient of
    /// `flat` elements over `f` members (0 for `Native`).
    pub fn reduce_scratch_bytes(&self, flat: u64, f: u64) -> u64 {
        match self {
            Wire::Int8Block { .. } => 2 * f * self.int8_payload(flat / f.max(1)),
            _ => 0,
        }
    }

    /// Bytes the whole group's payloads of an all-gather come to (what the
    /// alpha-beta model charges as the gathered size): F payloads (fp8:
    /// the codes; its amax exchange is `fp8_amax_bytes`).
    pub fn gathered_bytes(&self, shard: u64, f: u64) -> u64 {
        match self {
            Wire::Native => 0,
            Wire::Fp8E4m3 { .. } => shard * f,
            Wire::Int8Block { .. } => self.int8_payload(shard) * f,
        }
    }

    /// Bytes of all the payloads of a reduce-scatter (what one member sends
    /// and receives in all: F slices' payloads).
    pub fn scattered_bytes(&self, flat: u64, f: u64) -> u64 {
        f * self.int8_payload(flat / f.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_add_up() {
        let fp8 = Wire::Fp8E4m3 {
            scale: Fp8Scale::PerUnit,
        };
        assert_eq!(fp8.gather_scratch_bytes(100, 4), (4 + 100) * 5);
        let int8 = Wire::Int8Block { block: 32 };
        // 100 elements: 4 blocks, 16 bytes of scales.
        assert_eq!(int8.int8_payload(100), 116);
        assert_eq!(int8.gather_scratch_bytes(100, 4), 116 * 5);
        // 400 elements over 4: slices of 100.
        assert_eq!(int8.reduce_scratch_bytes(400, 4), 2 * 4 * 116);
        assert_eq!(Wire::Native.gather_scratch_bytes(100, 4), 0);
    }

    #[test]
    fn parse() {
        assert_eq!(
            Wire::parse("INT8", 64).ok(),
            Some(Wire::Int8Block { block: 64 })
        );
        assert!(matches!(Wire::parse("fp8", 1), Ok(Wire::Fp8E4m3 { .. })));
        assert!(matches!(
            Wire::parse("fp4", 1),
            Err(ConfigError {
                what: "wire format",
                ..
            })
        ));
    }
}
