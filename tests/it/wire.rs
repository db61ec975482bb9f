//! Low-precision collectives (`--allgather-wire fp8|int8`,
//! `--reduce-scatter-wire int8`; `fsdpc_planner::wire`).
//!
//! - The collectives on thread ranks equal a reference written here from
//!   the specification alone (an e4m3 table built from the format's
//!   definition and a nearest-value search; int8 blocks by the formula),
//!   bit for bit, at F = 2 and 4, for f32 and bf16 sources and
//!   destinations, with zeros, all-equal shards, shards of very different
//!   magnitudes (the per-unit scale is agreed), NaN and infinity (NaN
//!   propagates), short last blocks and two segments.
//! - Plans: the scratch is planned (a `Wire` buffer per quantized
//!   collective, freed after it), the validator rejects a collective
//!   without its scratch, the bytes the cost model charges shrink, bad
//!   configurations are refused.
//! - Training: bf16 sharded training with each wire format at F = 2 and 4
//!   trains (the loss falls) and stays within a stated bound of the
//!   native bf16 run over the test's steps. The bound: with AdamW a
//!   parameter moves at most about lr per step whatever its gradient, so
//!   quantization noise changes parameters by at most 2 x lr x steps;
//!   the loss differences measured (printed with --nocapture) are a few
//!   times below the bound stated here.

use crate::common;

use crate::common::{plan_with, train};
use fsdpc_ir::DType;
use fsdpc_plan::Collective;
use fsdpc_plan::ConfigError;
use fsdpc_plan::{BufferKind, InstrOp, Strategy, Wire};
use fsdpc_planner::{FsdpConfig, PlanError};
use fsdpc_runtime::comm::codec;
use fsdpc_runtime::{Buf, BufMut, CommConfig, Communicator, ExecMode, ShmWorld};
use half::bf16;

// ---------------------------------------------------------------------
// The reference, from the definitions.

/// Every finite non-negative e4m3fn value with its code: exponent field e
/// (bias 7), mantissa m; e = 0 subnormal (m / 8 x 2^-6); code 0x7f is NaN.
fn e4m3_table() -> Vec<(u8, f64)> {
    (0u8..0x7f)
        .map(|c| {
            let (e, m) = (i32::from(c >> 3), f64::from(c & 7));
            let v = if e == 0 {
                m / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            (c, v)
        })
        .collect()
}

/// The e4m3 value nearest `v` (ties to the even code), saturating at 448;
/// NaN for a non-finite `v`.
fn ref_e4m3(v: f32, table: &[(u8, f64)]) -> f32 {
    if !v.is_finite() {
        return f32::NAN;
    }
    let a = f64::from(v.abs());
    let mut best = (0u8, 0f64, f64::INFINITY);
    for &(c, x) in table {
        let d = (x - a).abs();
        if d < best.2 || (d == best.2 && c % 2 == 0) {
            best = (c, x, d);
        }
    }
    (best.1 as f32).copysign(v)
}

/// The reference fp8 gather of the members' shards: one scale from the
/// largest finite magnitude of all of them.
fn ref_fp8(shards: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let table = e4m3_table();
    let amax = shards
        .iter()
        .flatten()
        .filter(|x| x.is_finite())
        .fold(0f32, |m, x| m.max(x.abs()));
    let scale = 448.0f32 / amax.max(1e-12);
    shards
        .iter()
        .map(|s| {
            s.iter()
                .map(|&x| ref_e4m3(x * scale, &table) / scale)
                .collect()
        })
        .collect()
}

/// The reference int8 quantization of one payload, blocks from its start.
fn ref_int8(xs: &[f32], block: usize) -> Vec<f32> {
    xs.chunks(block)
        .flat_map(|b| {
            let s = if b.iter().all(|x| x.is_finite()) {
                b.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0
            } else {
                f32::NAN
            };
            b.iter().map(move |&x| {
                // The code is an integer (no negative zero).
                let q: i8 = if s == 0.0 || s.is_nan() {
                    0
                } else {
                    (x / s).round_ties_even().clamp(-127.0, 127.0) as i8
                };
                f32::from(q) * s
            })
        })
        .collect()
}

// ---------------------------------------------------------------------
// Running the collectives on thread ranks.

fn bytes_of(xs: &[f32], dt: DType) -> Vec<u8> {
    match dt {
        DType::Bf16 => xs
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => xs.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn floats_of(b: &[u8], dt: DType) -> Vec<f32> {
    match dt {
        DType::Bf16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

/// Runs `body(comm, rank)` on `n` thread ranks of one shared-memory group
/// and returns their results in rank order.
fn on_ranks<T: Send>(n: usize, body: impl Fn(&dyn Communicator, usize) -> T + Sync) -> Vec<T> {
    let world = ShmWorld::new(n, CommConfig::default());
    let ranks: Vec<usize> = (0..n).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (world, ranks, body) = (&world, &ranks, &body);
                s.spawn(move || {
                    let c = world.communicator(ranks, "wire", r).expect("communicator");
                    body(&c, r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// Gathers the members' shards (each two segments: `split` elements, then
/// the rest) with `wire` from `sdt` into `ddt`; returns what every rank
/// received, as f32 values.
fn gather(wire: Wire, shards: &[Vec<f32>], split: usize, sdt: DType, ddt: DType) -> Vec<Vec<f32>> {
    let f = shards.len();
    let s = shards[0].len();
    // The flat layout: [segment 0 of every member | segment 1 of every member].
    let parts = [(0, 0, split), (split, split * f, s - split)];
    on_ranks(f, |comm, r| {
        let shard = bytes_of(&shards[r], sdt);
        let mut out = vec![0u8; f * s * ddt.size()];
        let mut scratch = vec![0u8; wire.gather_scratch_bytes(s as u64, f as u64) as usize];
        codec::all_gather(
            comm,
            wire,
            Buf {
                dtype: sdt,
                bytes: &shard,
            },
            &parts,
            BufMut {
                dtype: ddt,
                bytes: &mut out,
            },
            &mut scratch,
        )
        .expect("gathers");
        floats_of(&out, ddt)
    })
}

/// Where the reference puts member q's element k of a two-segment shard.
fn flat_index(q: usize, k: usize, split: usize, s: usize, f: usize) -> usize {
    if k < split {
        q * split + k
    } else {
        split * f + q * (s - split) + (k - split)
    }
}

/// The reference's gathered buffer, rounded to `ddt`, from the members'
/// dequantized values.
fn lay_out(deq: &[Vec<f32>], split: usize, ddt: DType) -> Vec<f32> {
    let (f, s) = (deq.len(), deq[0].len());
    let mut flat = vec![0f32; f * s];
    for (q, d) in deq.iter().enumerate() {
        for (k, &v) in d.iter().enumerate() {
            flat[flat_index(q, k, split, s, f)] = v;
        }
    }
    floats_of(&bytes_of(&flat, ddt), ddt)
}

fn same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
            "{what}: element {i}: {x} vs reference {y}"
        );
    }
}

/// Deterministic test values: a mix of signs and magnitudes.
fn values(n: usize, seed: u32, magnitude: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed)
                .wrapping_mul(2654435761)
                .rotate_left(13)
                .wrapping_mul(40503);
            let u = (h >> 8) as f32 / (1u32 << 24) as f32; // [0, 1)
            let e = ((h & 0xff) % 24) as i32 - 16; // wide spread of exponents
            (u - 0.5) * 2f32.powi(e) * magnitude
        })
        .collect()
}

/// The shard sets every gather is checked on.
fn shard_cases(f: usize, s: usize) -> Vec<(&'static str, Vec<Vec<f32>>)> {
    let mut nan = values(s, 3, 1.0);
    nan[1] = f32::NAN;
    let mut inf = values(s, 4, 1.0);
    inf[s - 1] = f32::INFINITY;
    inf[0] = f32::NEG_INFINITY;
    vec![
        ("mixed", (0..f).map(|r| values(s, r as u32, 1.0)).collect()),
        (
            "magnitudes differ by rank",
            (0..f)
                .map(|r| values(s, 10 + r as u32, 1e-4 * 1e3f32.powi(r as i32)))
                .collect(),
        ),
        ("zeros", vec![vec![0.0; s]; f]),
        ("all equal", vec![vec![0.3; s]; f]),
        (
            "nan and inf",
            (0..f)
                .map(|r| match r {
                    0 => nan.clone(),
                    1 => inf.clone(),
                    _ => values(s, r as u32, 1.0),
                })
                .collect(),
        ),
    ]
}

#[test]
fn fp8_all_gather_equals_the_reference() {
    let wire = Wire::parse("fp8", 0).expect("fp8");
    for f in [2, 4] {
        let (s, split) = (37, 30);
        for (name, shards) in shard_cases(f, s) {
            for (sdt, ddt) in [(DType::F32, DType::F32), (DType::F32, DType::Bf16)] {
                let got = gather(wire, &shards, split, sdt, ddt);
                let want = lay_out(&ref_fp8(&shards), split, ddt);
                for (r, g) in got.iter().enumerate() {
                    same_bits(g, &want, &format!("fp8 F={f} {name} {sdt}->{ddt} rank {r}"));
                }
            }
        }
    }
}

#[test]
fn fp8_propagates_nan_and_saturates_nothing_finite() {
    let wire = Wire::parse("fp8", 0).expect("fp8");
    let mut a = vec![1.0f32, -2.0, 0.5, 4.0];
    a[2] = f32::INFINITY;
    let got = gather(
        wire,
        &[a, vec![8.0, 0.0, -8.0, 1.0]],
        4,
        DType::F32,
        DType::F32,
    );
    // The infinity lands as NaN; the largest finite magnitude (8) maps to
    // 448 and back exactly.
    assert!(got[0][2].is_nan());
    assert_eq!(got[0][4], 8.0);
    assert_eq!(got[0][6], -8.0);
    assert_eq!(got[0][1], -2.0);
}

#[test]
fn int8_all_gather_equals_the_reference() {
    for block in [1usize, 8, 64] {
        let wire = Wire::parse("int8", block as u32).expect("int8");
        for f in [2, 4] {
            let (s, split) = (37, 30);
            for (name, shards) in shard_cases(f, s) {
                for (sdt, ddt) in [(DType::F32, DType::F32), (DType::Bf16, DType::Bf16)] {
                    let got = gather(wire, &shards, split, sdt, ddt);
                    // The source as the collective reads it (in `sdt`).
                    let read: Vec<Vec<f32>> = shards
                        .iter()
                        .map(|x| floats_of(&bytes_of(x, sdt), sdt))
                        .collect();
                    let deq: Vec<Vec<f32>> = read.iter().map(|x| ref_int8(x, block)).collect();
                    let want = lay_out(&deq, split, ddt);
                    for (r, g) in got.iter().enumerate() {
                        same_bits(
                            g,
                            &want,
                            &format!("int8/{block} F={f} {name} {sdt}->{ddt} rank {r}"),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn int8_reduce_scatter_equals_the_reference() {
    for (block, f, slice) in [(16usize, 2usize, 40usize), (7, 4, 23), (64, 4, 64)] {
        let t = f * slice;
        let grads: Vec<Vec<f32>> = (0..f)
            .map(|r| {
                let mut g = values(t, 100 + r as u32, 1.0);
                if r == 1 {
                    g[5] = f32::NAN; // member 0's slice, block 0
                }
                g
            })
            .collect();
        let divide = 8u32;
        for (sdt, ddt) in [(DType::F32, DType::F32), (DType::Bf16, DType::F32)] {
            let got = on_ranks(f, |comm, r| {
                let src = bytes_of(&grads[r], sdt);
                let mut out = vec![0u8; slice * ddt.size()];
                let wire = Wire::Int8Block {
                    block: block as u32,
                };
                let mut scratch = vec![0u8; wire.reduce_scratch_bytes(t as u64, f as u64) as usize];
                codec::reduce_scatter(
                    comm,
                    block,
                    Buf {
                        dtype: sdt,
                        bytes: &src,
                    },
                    BufMut {
                        dtype: ddt,
                        bytes: &mut out,
                    },
                    &mut scratch,
                    divide,
                )
                .expect("reduce-scatters");
                floats_of(&out, ddt)
            });
            for (p, g) in got.iter().enumerate() {
                // Each member's slice p, dequantized, summed in member
                // order in f32, divided.
                let deq: Vec<Vec<f32>> = grads
                    .iter()
                    .map(|x| {
                        let read = floats_of(&bytes_of(x, sdt), sdt);
                        ref_int8(&read[p * slice..(p + 1) * slice], block)
                    })
                    .collect();
                let want: Vec<f32> = (0..slice)
                    .map(|k| {
                        let mut acc = deq[0][k];
                        for d in &deq[1..] {
                            acc += d[k];
                        }
                        acc / divide as f32
                    })
                    .collect();
                let want = floats_of(&bytes_of(&want, ddt), ddt);
                same_bits(
                    g,
                    &want,
                    &format!("int8/{block} reduce-scatter F={f} rank {p}"),
                );
                if p == 0 {
                    assert!(
                        g[..block.min(slice)].iter().all(|x| x.is_nan()),
                        "NaN propagates"
                    );
                }
            }
        }
    }
}

#[test]
fn a_scratch_of_the_wrong_size_is_an_error() {
    let wire = Wire::parse("int8", 4).expect("int8");
    let errs = on_ranks(2, |comm, _| {
        let shard = bytes_of(&[1.0; 8], DType::F32);
        let mut out = vec![0u8; 16 * 4];
        let mut scratch = vec![0u8; 3];
        codec::all_gather(
            comm,
            wire,
            Buf {
                dtype: DType::F32,
                bytes: &shard,
            },
            &[(0, 0, 8)],
            BufMut {
                dtype: DType::F32,
                bytes: &mut out,
            },
            &mut scratch,
        )
    });
    for e in errs {
        let e = e.expect_err("refused");
        assert!(e.to_string().contains("scratch of 3"), "{e}");
    }
}

// ---------------------------------------------------------------------
// Plans.

const GPT: &str = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64";

fn bf16_with(ag: &str, rs: &str, block: u32) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: DType::Bf16,
            reduce_dtype: DType::Bf16,
            buffer_dtype: DType::Bf16,
            allgather_wire: Wire::parse(ag, block).expect("wire"),
            reduce_scatter_wire: Wire::parse(rs, block).expect("wire"),
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

#[test]
fn quantized_plans_plan_their_scratch_and_charge_fewer_bytes() {
    let spec = format!("{GPT},batch=2");
    let native = plan_with(&spec, 4, &bf16_with("native", "native", 64));
    for (ag, rs) in [
        ("fp8", "native"),
        ("int8", "native"),
        ("native", "int8"),
        ("fp8", "int8"),
    ] {
        let plan = plan_with(&spec, 4, &bf16_with(ag, rs, 64));
        let mut quantized = 0;
        for (i, ins) in plan.instructions.iter().enumerate() {
            let (wire, scratch) = match &ins.op {
                InstrOp::AllGather {
                    c:
                        Collective {
                            wire, wire_buffer, ..
                        },
                    ..
                }
                | InstrOp::ReduceScatter {
                    c:
                        Collective {
                            wire, wire_buffer, ..
                        },
                } => (*wire, *wire_buffer),
                _ => continue,
            };
            assert_eq!(wire.is_native(), scratch.is_none(), "{ag}/{rs} instr {i}");
            if let Some(b) = scratch {
                quantized += 1;
                let buf = &plan.buffers[b.index()];
                assert_eq!(buf.kind, BufferKind::Wire);
                // Freed right after its collective, on its stream.
                let next = &plan.instructions[i + 1];
                assert_eq!(next.stream, ins.stream);
                assert!(matches!(next.op, InstrOp::Free { buffer } if buffer == b));
                assert_eq!(buf.start as usize, i);
                assert_eq!(buf.end, Some(i as u32 + 1));
            }
        }
        assert!(quantized > 0, "{ag}/{rs}");
        assert!(
            plan.estimates.comm_bytes_per_step < native.estimates.comm_bytes_per_step,
            "{ag}/{rs}: {} bytes vs native {}",
            plan.estimates.comm_bytes_per_step,
            native.estimates.comm_bytes_per_step
        );
        eprintln!(
            "{ag}/{rs}: {} bytes sent per step (native bf16: {})",
            plan.estimates.comm_bytes_per_step, native.estimates.comm_bytes_per_step
        );
        // A plan loads back with its wire formats.
        let back =
            fsdpc_plan::Plan::from_json(&plan.to_json_pretty().expect("json")).expect("reloads");
        assert_eq!(back.config.allgather_wire, plan.config.allgather_wire);
    }
}

#[test]
fn the_validator_rejects_a_quantized_gather_without_scratch() {
    let plan = plan_with(
        &format!("{GPT},batch=2"),
        2,
        &bf16_with("int8", "native", 64),
    );
    let mut bad = plan.clone();
    let i = bad
        .instructions
        .iter()
        .position(|x| {
            matches!(
                x.op,
                InstrOp::AllGather {
                    c: Collective {
                        wire_buffer: Some(_),
                        ..
                    },
                    ..
                }
            )
        })
        .expect("a quantized gather");
    if let InstrOp::AllGather {
        c: Collective { wire_buffer, .. },
        ..
    } = &mut bad.instructions[i].op
    {
        *wire_buffer = None;
    }
    let errs = bad.validate().expect_err("invalid");
    assert!(
        errs.iter()
            .any(|e| e.to_string().contains("has no scratch")),
        "{errs:?}"
    );
    // The runtime refuses it too, with an error, not a panic.
    let err = fsdpc_runtime::train(&bad, &Default::default(), &mut |_| {});
    assert!(err.is_err());
}

#[test]
fn bad_wire_configurations_are_refused() {
    let spec = format!("{GPT},batch=2");
    let compile = |cfg: &FsdpConfig| common::compile_on(&spec, "cpu-local", 2, 2, cfg);
    let refused = |cfg: FsdpConfig, what: &str| match compile(&cfg) {
        Err(PlanError::BadConfig { what: w, .. }) => assert_eq!(w, what),
        other => panic!("{what}: expected a refusal, got {:?}", other.map(|_| ())),
    };
    refused(bf16_with("native", "fp8", 64), "reduce_scatter_wire");
    refused(bf16_with("int8", "native", 0), "allgather_wire");
    refused(
        FsdpConfig {
            settings: fsdpc_plan::Settings {
                strategy: Strategy::NoShard,
                ..(bf16_with("fp8", "native", 64)).settings
            },
            ..bf16_with("fp8", "native", 64)
        },
        "allgather_wire",
    );
    assert!(matches!(
        Wire::parse("fp4", 1),
        Err(ConfigError {
            what: "wire format",
            ..
        })
    ));
}

// ---------------------------------------------------------------------
// Training.

const STEPS: u64 = 12;

/// The largest relative loss difference allowed against native bf16 over
/// `STEPS` steps (measured: see the printed figures).
const LOSS_BOUND: f32 = 0.02;

#[test]
fn sharded_training_with_each_wire_trains_close_to_native_bf16() {
    for f in [2u32, 4] {
        let spec = format!("{GPT},batch={}", 8 / f);
        let native = train(
            &plan_with(&spec, f, &bf16_with("native", "native", 64)),
            STEPS,
            ExecMode::Arena,
        );
        for (ag, rs) in [("fp8", "native"), ("int8", "native"), ("native", "int8")] {
            let plan = plan_with(&spec, f, &bf16_with(ag, rs, 64));
            let r = train(&plan, STEPS, ExecMode::Arena);
            let (first, last) = (r.losses[0], r.losses[STEPS as usize - 1]);
            assert!(
                r.losses.iter().all(|l| l.is_finite()) && last < first,
                "{ag}/{rs} F={f}: loss does not fall: {:?}",
                r.losses
            );
            let rel = common::max_loss_rel_diff(&native, &r);
            let (p, _) = common::max_param_diff(&native, &r);
            eprintln!(
                "{ag}/{rs} F={f}: loss {first:.4} -> {last:.4}; vs native bf16: max loss rel \
                 diff {rel:.2e}, max param abs diff {p:.2e}"
            );
            assert!(rel < LOSS_BOUND, "{ag}/{rs} F={f}: {rel}");
            // AdamW moves a parameter by about lr (1e-3) a step at most.
            assert!(p <= 2.0 * 1e-3 * STEPS as f32, "{ag}/{rs} F={f}: {p}");
            // Debug mode (list order, one allocation per buffer) gives the
            // same bits: the quantized collectives do not depend on timing.
            if f == 4 {
                let d = train(&plan, 3, ExecMode::DebugAlloc);
                assert_eq!(
                    common::bits(&d).0,
                    common::bits(&r).0[..3].to_vec(),
                    "{ag}/{rs}"
                );
            }
        }
    }
}

/// `compile --allgather-wire fp8 --reduce-scatter-wire int8 --wire-block
/// 64` writes a plan that `inspect` describes and `train` runs; a format
/// the collective cannot take is refused with the flag's name.
#[test]
fn cli_flags() {
    use crate::common::cli::{check_error, dir, ok, s};
    let d = dir("wire");
    let path = d.join("plan.json");
    let model = format!("{GPT},batch=2");
    let base = [
        "compile",
        &model,
        "--world",
        "2",
        "--preset",
        "cpu-local",
        "--mixed-precision",
        "bf16",
    ];
    let mut args = base.to_vec();
    args.extend([
        "--allgather-wire",
        "fp8",
        "--reduce-scatter-wire",
        "int8",
        "--wire-block",
        "64",
        "-o",
        s(&path),
    ]);
    ok(&args);
    let text = ok(&["inspect", s(&path)]);
    assert!(
        text.contains("wire      all-gathers fp8 e4m3 (one scale per unit")
            && text.contains("reduce-scatters int8 (blocks of 64"),
        "{text}"
    );
    ok(&["train", s(&path), "--steps", "2"]);
    let mut bad = base.to_vec();
    bad.extend(["--reduce-scatter-wire", "fp8", "-o", s(&path)]);
    check_error(&bad, "reduce_scatter_wire");
    let mut bad = base.to_vec();
    bad.extend(["--allgather-wire", "fp4", "-o", s(&path)]);
    check_error(&bad, "fp4");
    let _ = std::fs::remove_dir_all(&d);
}
