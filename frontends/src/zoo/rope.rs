//! Rotary position embeddings (Su et al. 2021) as `transformers` computes
//! them: inverse frequencies `1 / theta^(2j / d)` for `j < d / 2`, optionally
//! rescaled (linear position interpolation, Llama 3.1's band-wise scaling,
//! YaRN as Qwen uses it), then `cos` and `sin` of `position * inv_freq`,
//! both halves of the head repeating the same frequencies, times YaRN's
//! attention factor. Everything is f32 as in `transformers`, so the tables
//! are the reference's to the last bits of `cos` and `sin`.

use fsdpc_ir::{DType, TensorData, TensorType};

/// A rotary embedding's base and scaling.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// The base wavelength (`rope_theta`).
    pub theta: f64,
    pub scaling: Scaling,
}

/// How the inverse frequencies are rescaled (`rope_scaling.rope_type`).
#[derive(Clone, Debug, PartialEq)]
pub enum Scaling {
    /// None (`default`).
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1: low frequencies divided by `factor`, high ones kept, a
    /// smooth ramp between, the bands set by `original` context positions.
    Llama3 {
        factor: f64,
        low: f64,
        high: f64,
        original: usize,
    },
    /// YaRN (Peng et al. 2023) with `transformers`' defaults: beta_fast 32,
    /// beta_slow 1, truncated correction range, attention factor
    /// `0.1 ln(factor) + 1`.
    Yarn { factor: f64, original: usize },
}

impl Rope {
    /// Unscaled rotary embeddings of base `theta`.
    pub fn plain(theta: f64) -> Rope {
        Rope {
            theta,
            scaling: Scaling::None,
        }
    }

    /// The name `transformers` gives the scaling (`rope_type`).
    pub fn kind(&self) -> &'static str {
        match self.scaling {
            Scaling::None => "default",
            Scaling::Linear { .. } => "linear",
            Scaling::Llama3 { .. } => "llama3",
            Scaling::Yarn { .. } => "yarn",
        }
    }

    /// The inverse frequencies of a head of width `d` (`d / 2` of them) and
    /// the factor `cos` and `sin` are multiplied by.
    pub fn inv_freq(&self, d: usize) -> (Vec<f32>, f32) {
        let base = self.theta as f32;
        let pos_freqs: Vec<f32> = (0..d / 2)
            .map(|j| base.powf((2 * j) as f32 / d as f32))
            .collect();
        let plain: Vec<f32> = pos_freqs.iter().map(|p| 1.0 / p).collect();
        match self.scaling {
            Scaling::None => (plain, 1.0),
            Scaling::Linear { factor } => (plain.iter().map(|f| f / factor as f32).collect(), 1.0),
            Scaling::Llama3 {
                factor,
                low,
                high,
                original,
            } => {
                let low_wavelen = original as f64 / low;
                let high_wavelen = original as f64 / high;
                let scaled = plain.iter().map(|&f| {
                    let wavelen = std::f64::consts::TAU / f as f64;
                    let f = f as f64;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (original as f64 / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                });
                (scaled.map(|f| f as f32).collect(), 1.0)
            }
            Scaling::Yarn { factor, original } => {
                let dim = d as f64;
                let correction = |rotations: f64| {
                    dim * (original as f64 / (rotations * std::f64::consts::TAU)).ln()
                        / (2.0 * self.theta.ln())
                };
                let lo = correction(32.0).floor().max(0.0);
                let mut hi = correction(1.0).ceil().min(dim - 1.0);
                if lo == hi {
                    hi += 0.001;
                }
                let inv: Vec<f32> = pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(j, &p)| {
                        let ramp = ((j as f32 - lo as f32) / (hi - lo) as f32).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        let interpolation = 1.0 / (factor as f32 * p);
                        interpolation * (1.0 - extrapolation) + (1.0 / p) * extrapolation
                    })
                    .collect();
                let attention = if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * factor.ln() + 1.0
                };
                (inv, attention as f32)
            }
        }
    }
}

/// A rope from spec values: `kind` (default: the base's kind when no
/// scaling value is given, `default` otherwise) and its parameters
/// `[factor, low, high]` and `original`, each falling back to the base's.
pub(crate) fn from_parts(
    theta: f64,
    kind: Option<&str>,
    [factor, low, high]: [Option<f64>; 3],
    original: Option<usize>,
    base: &Rope,
) -> Result<Rope, String> {
    let (b_factor, b_low, b_high, b_orig) = match base.scaling {
        Scaling::None => (None, None, None, None),
        Scaling::Linear { factor } => (Some(factor), None, None, None),
        Scaling::Llama3 {
            factor,
            low,
            high,
            original,
        } => (Some(factor), Some(low), Some(high), Some(original)),
        Scaling::Yarn { factor, original } => (Some(factor), None, None, Some(original)),
    };
    let factor = factor.or(b_factor);
    let need = |what: &str, v: Option<f64>| {
        v.ok_or_else(|| format!("rope={} needs rope_{what}=", kind.unwrap_or(base.kind())))
    };
    let original_or = |v: Option<usize>| {
        v.or(b_orig).ok_or_else(|| {
            format!(
                "rope={} needs rope_orig= (the context it was trained at)",
                kind.unwrap_or(base.kind())
            )
        })
    };
    let scaling = match kind.unwrap_or(base.kind()) {
        "default" => Scaling::None,
        "linear" => Scaling::Linear {
            factor: need("factor", factor)?,
        },
        "llama3" => Scaling::Llama3 {
            factor: need("factor", factor)?,
            low: need("low", low.or(b_low))?,
            high: need("high", high.or(b_high))?,
            original: original_or(original)?,
        },
        "yarn" => Scaling::Yarn {
            factor: need("factor", factor)?,
            original: original_or(original)?,
        },
        other => return Err(format!("unknown rope scaling `{other}`")),
    };
    if let Scaling::Llama3 { low, high, .. } = scaling {
        if low >= high {
            return Err(format!(
                "rope_low={low} must be below rope_high={high} (Llama 3.1 uses 1 and 4)"
            ));
        }
    }
    Ok(Rope { theta, scaling })
}

/// The `cos` and `sin` tables `[seq, d]` (f32) for positions `0..seq`.
pub(crate) fn tables(rope: &Rope, d: usize, seq: usize) -> (TensorData, TensorData) {
    let (inv, attention) = rope.inv_freq(d);
    let mut cos = Vec::with_capacity(seq * d * 4);
    let mut sin = Vec::with_capacity(seq * d * 4);
    for p in 0..seq {
        for j in 0..d {
            let angle = p as f32 * inv[j % (d / 2)];
            cos.extend_from_slice(&(angle.cos() * attention).to_le_bytes());
            sin.extend_from_slice(&(angle.sin() * attention).to_le_bytes());
        }
    }
    let ty = TensorType::new(DType::F32, [seq, d]);
    (
        TensorData {
            ty: ty.clone(),
            bytes: cos,
        },
        TensorData { ty, bytes: sin },
    )
}
