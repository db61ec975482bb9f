//! Tests of the lowering on the host: a few kernels and cuBLAS's gemm
//! emulated on a byte array (their C and cuBLAS's column-major contract
//! transcribed, not the GPU's code), run on what `ops::lower` produced,
//! and compared with the CPU backend. No GPU is needed, so the address
//! arithmetic of the data-movement ops, the reductions' descriptors, the
//! broadcasting and the matrix-product mapping (transposes, leading
//! dimensions, batch strides) are checked in every `cargo test --features
//! cuda`; `conv` does the same for convolution and pooling, in f32 and
//! bf16. The GPU tests (`tests/it/cuda.rs` of the root crate) check the
//! kernels themselves.
#![cfg(feature = "cuda")]
#![allow(clippy::cloned_ref_to_slice_refs)]

use fsdpc_ir::{BinaryFn, DType, Op, ReduceFn, TensorType};
use fsdpc_runtime::targets::cuda::blas::Gemm;
use fsdpc_runtime::targets::cuda::device::{Arg, Launch, Ptr};
use fsdpc_runtime::targets::cuda::geometry::{Geo, RGeo};
use fsdpc_runtime::targets::cuda::ops::{lower, Action, Operand};
use fsdpc_runtime::HostTensor;

mod conv;

/// Where the emulated device memory starts (a null pointer stays invalid).
const BASE: u64 = 1 << 20;

/// Operands from `BASE`, then the scratch (placed at `SCRATCH`).
struct Mem(Vec<u8>, Vec<u8>);

impl Mem {
    fn slot(&mut self, p: u64, len: usize) -> &mut [u8] {
        if p >= SCRATCH {
            let a = (p - SCRATCH) as usize;
            &mut self.1[a..a + len]
        } else {
            let a = (p - BASE) as usize;
            &mut self.0[a..a + len]
        }
    }
    fn at(&self, p: u64) -> usize {
        (p - BASE) as usize
    }
    fn f32(&mut self, p: u64, i: i64) -> f32 {
        f32::from_le_bytes(self.slot(p + 4 * i as u64, 4).try_into().unwrap())
    }
    fn i64(&mut self, p: u64, i: i64) -> i64 {
        i64::from_le_bytes(self.slot(p + 8 * i as u64, 8).try_into().unwrap())
    }
    fn set_f32(&mut self, p: u64, i: i64, v: f32) {
        self.slot(p + 4 * i as u64, 4)
            .copy_from_slice(&v.to_le_bytes());
    }
    /// Element `i` of a float buffer of `dt`, as f32 (`ldf`).
    fn ld(&mut self, p: u64, dt: DType, i: i64) -> f32 {
        match dt {
            DType::F32 => self.f32(p, i),
            DType::Bf16 | DType::F16 => {
                let b = u16::from_le_bytes(self.slot(p + 2 * i as u64, 2).try_into().unwrap());
                if dt == DType::Bf16 {
                    half::bf16::from_bits(b).to_f32()
                } else {
                    half::f16::from_bits(b).to_f32()
                }
            }
            other => panic!("not emulated for {other:?}"),
        }
    }
    /// Stores `v` rounded to `dt` at element `i` (`stf`).
    fn st(&mut self, p: u64, dt: DType, i: i64, v: f32) {
        let bits = match dt {
            DType::F32 => return self.set_f32(p, i, v),
            DType::Bf16 => half::bf16::from_f32(v).to_bits(),
            DType::F16 => half::f16::from_f32(v).to_bits(),
            other => panic!("not emulated for {other:?}"),
        };
        self.slot(p + 2 * i as u64, 2)
            .copy_from_slice(&bits.to_le_bytes());
    }
}

/// The emulated scratch's address (`Ptr::Scratch` offsets add to it).
const SCRATCH: u64 = 1 << 40;

fn ptr(a: &Arg) -> u64 {
    match a {
        Arg::Ptr(Ptr::Abs(p)) => *p,
        Arg::Ptr(Ptr::Scratch(off)) => SCRATCH + off,
        other => panic!("not a pointer: {other:?}"),
    }
}
fn int(a: &Arg) -> i64 {
    match a {
        Arg::I64(v) => *v,
        Arg::I32(v) => i64::from(*v),
        other => panic!("not an integer: {other:?}"),
    }
}
fn geo(a: &Arg) -> Geo {
    match a {
        Arg::Geo(g) => *g,
        other => panic!("not a Geo: {other:?}"),
    }
}
fn rgeo(a: &Arg) -> RGeo {
    match a {
        Arg::RGeo(g) => *g,
        other => panic!("not an RGeo: {other:?}"),
    }
}

/// `offsets` of kernels/common.cuh.
fn offsets(g: &Geo, mut o: i64, n: usize) -> Vec<i64> {
    let mut off = vec![0; n];
    for d in (0..g.nd as usize).rev() {
        let c = o % g.dims[d];
        o /= g.dims[d];
        for (k, x) in off.iter_mut().enumerate() {
            *x += c * g.st[k][d];
        }
    }
    off
}

/// `kept_offset` and `reduced_offset` of kernels/reduce.cu.
fn roff(dims: &[i64], st: &[i64], n: i32, mut o: i64) -> i64 {
    let mut off = 0;
    for d in (0..n as usize).rev() {
        off += (o % dims[d]) * st[d];
        o /= dims[d];
    }
    off
}

/// One f32 launch (the kernels below, f32 operands only).
fn launch(m: &mut Mem, l: &Launch) {
    let a = &l.args;
    match l.kernel {
        "strided_copy" => {
            let (src, sbase, dst, dbase, es, n, g) = (
                ptr(&a[0]),
                int(&a[1]),
                ptr(&a[2]),
                int(&a[3]),
                int(&a[4]) as usize,
                int(&a[5]),
                geo(&a[6]),
            );
            for i in 0..n {
                let off = offsets(&g, i, 2);
                let (s, d) = (
                    m.at(src) + (sbase + off[0]) as usize * es,
                    m.at(dst) + (dbase + off[1]) as usize * es,
                );
                let v = m.0[s..s + es].to_vec();
                m.0[d..d + es].copy_from_slice(&v);
            }
        }
        "fill" => {
            assert_eq!(int(&a[1]), 0, "emulated for f32");
            let v = match a[3] {
                Arg::F64(v) => v as f32,
                _ => panic!("fill value"),
            };
            for i in 0..int(&a[2]) {
                m.set_f32(ptr(&a[0]), i, v);
            }
        }
        "binary_f" => {
            let (x, z, y, n, f, g) = (
                ptr(&a[0]),
                ptr(&a[2]),
                ptr(&a[4]),
                int(&a[6]),
                int(&a[7]),
                geo(&a[8]),
            );
            for i in 0..n {
                let off = offsets(&g, i, 2);
                let (p, q) = (m.f32(x, off[0]), m.f32(z, off[1]));
                let r = match f {
                    0 => p + q,
                    1 => p - q,
                    2 => p * q,
                    3 => p / q,
                    5 => p.max(q),
                    6 => p.min(q),
                    _ => p.powf(q),
                };
                m.set_f32(y, i, r);
            }
        }
        "vocab_lookup_fwd" | "vocab_lookup_bwd" => {
            // f32 rows, i64 indices and offset (kernels/vocab.cu).
            let fwd = l.kernel == "vocab_lookup_fwd";
            let (idx, off) = if fwd {
                (ptr(&a[1]), m.i64(ptr(&a[3]), 0))
            } else {
                (ptr(&a[0]), m.i64(ptr(&a[2]), 0))
            };
            let (n, whole, inner, nidx) = (int(&a[7]), int(&a[8]), int(&a[9]), int(&a[10]));
            for o in 0..nidx * inner {
                let (c, i) = (o % inner, o / inner);
                let r = m.i64(idx, i);
                let r = if r < 0 { r + whole } else { r } - off;
                let held = (0..n).contains(&r);
                if fwd {
                    let v = if held {
                        m.f32(ptr(&a[0]), r * inner + c)
                    } else {
                        0.0
                    };
                    m.set_f32(ptr(&a[5]), o, v);
                } else if held {
                    let (acc, dy) = (ptr(&a[6]), ptr(&a[4]));
                    let v = m.f32(acc, r * inner + c) + m.f32(dy, o);
                    m.set_f32(acc, r * inner + c, v);
                }
            }
        }
        "vocab_stats" | "vocab_stats_bwd" => {
            let (x, labels, off) = (ptr(&a[0]), ptr(&a[2]), m.i64(ptr(&a[4]), 0));
            let bwd = l.kernel == "vocab_stats_bwd";
            let k = if bwd { 10 } else { 6 };
            let (rows, c, whole, has_ignore, ignore) = (
                int(&a[k]),
                int(&a[k + 1]),
                int(&a[k + 2]),
                int(&a[k + 3]),
                int(&a[k + 4]),
            );
            // A padded vocabulary's columns past `whole` are left out.
            let held = (whole - off).clamp(0, c);
            for r in 0..rows {
                let row: Vec<f32> = (0..held).map(|j| m.f32(x, r * c + j)).collect();
                let l = m.i64(labels, r);
                let t = if has_ignore != 0 && l == ignore {
                    -1
                } else {
                    l - off
                };
                let t = if (0..held).contains(&t) { t } else { -1 };
                if bwd {
                    let (st, ds, dx) = (ptr(&a[6]), ptr(&a[7]), ptr(&a[8]));
                    let (mx, sum) = (m.f32(st, 3 * r), m.f32(st, 3 * r + 1));
                    let (dm, dsum, dt) =
                        (m.f32(ds, 3 * r), m.f32(ds, 3 * r + 1), m.f32(ds, 3 * r + 2));
                    let first = row.iter().position(|&v| v == mx).map_or(-1, |j| j as i64);
                    for (j, &v) in row.iter().enumerate() {
                        let j = j as i64;
                        let mut g = dsum * (v - mx).exp();
                        if j == first {
                            g += dm - dsum * sum;
                        }
                        if j == t {
                            g += dt;
                        }
                        m.set_f32(dx, r * c + j, g);
                    }
                    for j in held..c {
                        m.set_f32(dx, r * c + j, 0.0);
                    }
                } else {
                    let y = ptr(&a[11]);
                    let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let sum: f32 = row.iter().map(|v| (v - mx).exp()).sum();
                    m.set_f32(y, 3 * r, mx);
                    m.set_f32(y, 3 * r + 1, sum);
                    m.set_f32(y, 3 * r + 2, if t < 0 { 0.0 } else { row[t as usize] });
                }
            }
        }
        "reduce_to" => {
            let (x, y, n, f, g) = (ptr(&a[0]), ptr(&a[2]), int(&a[4]), int(&a[5]), rgeo(&a[6]));
            for o in 0..n {
                let base = roff(&g.kdims, &g.kst, g.nk, o);
                let mut acc = if f == 2 { f32::NEG_INFINITY } else { 0.0 };
                for r in 0..g.count {
                    let v = m.f32(x, base + roff(&g.rdims, &g.rst, g.nr, r));
                    acc = if f == 2 { acc.max(v) } else { acc + v };
                }
                if f == 1 && g.count > 0 {
                    acc /= g.count as f32;
                }
                m.set_f32(y, o, acc);
            }
        }
        "reduce_partial" => {
            let (x, part, n, f, g) = (ptr(&a[0]), ptr(&a[2]), int(&a[3]), int(&a[4]), rgeo(&a[5]));
            let chunks = l.grid.1 as i64;
            let per = (g.count + chunks - 1) / chunks;
            for c in 0..chunks {
                let (r0, r1) = (c * per, ((c + 1) * per).min(g.count));
                for o in 0..n {
                    let base = roff(&g.kdims, &g.kst, g.nk, o);
                    let mut acc = if f == 2 { f32::NEG_INFINITY } else { 0.0 };
                    for r in r0..r1 {
                        let v = m.f32(x, base + roff(&g.rdims, &g.rst, g.nr, r));
                        acc = if f == 2 { acc.max(v) } else { acc + v };
                    }
                    m.set_f32(part, c * n + o, acc);
                }
            }
        }
        "reduce_finish" => {
            let (part, chunks, y, n, f, count) = (
                ptr(&a[0]),
                int(&a[1]),
                ptr(&a[2]),
                int(&a[4]),
                int(&a[5]),
                int(&a[6]),
            );
            for o in 0..n {
                let mut acc = if f == 2 { f32::NEG_INFINITY } else { 0.0 };
                for c in 0..chunks {
                    let v = m.f32(part, c * n + o);
                    acc = if f == 2 { acc.max(v) } else { acc + v };
                }
                if f == 1 && count > 0 {
                    acc /= count as f32;
                }
                m.set_f32(y, o, acc);
            }
        }
        "attn_fwd" | "attn_bwd_dq" | "attn_bwd_dkdv" => attention(m, l),
        "norm_bwd_dx" => {
            let (x, g, dy, dx) = (ptr(&a[0]), ptr(&a[2]), ptr(&a[4]), ptr(&a[6]));
            let (rows, d, eps, rms, stats) = (
                int(&a[8]),
                int(&a[9]),
                float(&a[10]),
                int(&a[11]) != 0,
                ptr(&a[12]),
            );
            for r in 0..rows {
                let b = r * d;
                let xs: Vec<f32> = (0..d).map(|j| m.f32(x, b + j)).collect();
                let mean = if rms {
                    0.0
                } else {
                    xs.iter().sum::<f32>() / d as f32
                };
                let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
                let scale = 1.0 / (var + eps).sqrt();
                let gy: Vec<f32> = (0..d).map(|j| m.f32(dy, b + j) * m.f32(g, j)).collect();
                let mg = gy.iter().sum::<f32>() / d as f32;
                let mgx = (0..d as usize)
                    .map(|j| gy[j] * if rms { xs[j] } else { (xs[j] - mean) * scale })
                    .sum::<f32>()
                    / d as f32;
                for j in 0..d as usize {
                    let v = if rms {
                        scale * gy[j] - xs[j] * (scale * scale * scale * mgx)
                    } else {
                        scale * (gy[j] - mg - (xs[j] - mean) * scale * mgx)
                    };
                    m.set_f32(dx, b + j as i64, v);
                }
                m.set_f32(stats, 2 * r, mean);
                m.set_f32(stats, 2 * r + 1, scale);
            }
        }
        "norm_bwd_params_partial" => {
            let (x, dy, rows, d, stats, part, has_beta) = (
                ptr(&a[0]),
                ptr(&a[2]),
                int(&a[4]),
                int(&a[5]),
                ptr(&a[6]),
                ptr(&a[7]),
                int(&a[8]) != 0,
            );
            let chunks = l.grid.1 as i64;
            let per = (rows + chunks - 1) / chunks;
            for c in 0..chunks {
                for j in 0..d {
                    let (mut sg, mut sb) = (0f32, 0f32);
                    for r in c * per..((c + 1) * per).min(rows) {
                        let gv = m.f32(dy, r * d + j);
                        sg += gv
                            * ((m.f32(x, r * d + j) - m.f32(stats, 2 * r))
                                * m.f32(stats, 2 * r + 1));
                        sb += gv;
                    }
                    m.set_f32(part, c * d + j, sg);
                    if has_beta {
                        m.set_f32(part, (chunks + c) * d + j, sb);
                    }
                }
            }
        }
        "norm_bwd_params_finish" => {
            let (part, chunks, d, dg, db) = (
                ptr(&a[0]),
                int(&a[1]),
                int(&a[2]),
                ptr(&a[3]),
                nullable(&a[5]),
            );
            for j in 0..d {
                let sg: f32 = (0..chunks).map(|c| m.f32(part, c * d + j)).sum();
                m.set_f32(dg, j, sg);
                if let Some(db) = db {
                    let sb: f32 = (0..chunks).map(|c| m.f32(part, (chunks + c) * d + j)).sum();
                    m.set_f32(db, j, sb);
                }
            }
        }
        k => assert!(conv::launch(m, l), "kernel {k} is not emulated"),
    }
}

fn float(a: &Arg) -> f32 {
    match a {
        Arg::F32(v) => *v,
        other => panic!("not an f32: {other:?}"),
    }
}

fn nullable(a: &Arg) -> Option<u64> {
    match a {
        Arg::Ptr(Ptr::Abs(0)) => None,
        other => Some(ptr(other)),
    }
}

/// The three attention kernels of kernels/attention.cu, block by block
/// and tile by tile as they run (the warp of each row, its causal key
/// range, the block's tile bounds), lanes folded into plain loops.
fn attention(m: &mut Mem, l: &Launch) {
    const WARPS: i64 = 8;
    let a = &l.args;
    let (q, k, v) = (ptr(&a[0]), ptr(&a[1]), ptr(&a[2]));
    let dot = |m: &mut Mem, x: u64, xi: i64, y: u64, yi: i64, w: i64| {
        (0..w)
            .map(|e| m.f32(x, xi + e) * m.f32(y, yi + e))
            .sum::<f32>()
    };
    let (gx, bh_n) = (l.grid.0 as i64, l.grid.1 as i64);
    match l.kernel {
        "attn_fwd" => {
            let (o, sq, sk, d, dv, scale, causal, t) = (
                nullable(&a[4]),
                int(&a[6]),
                int(&a[7]),
                int(&a[8]),
                int(&a[9]),
                float(&a[10]),
                int(&a[11]) != 0,
                int(&a[12]),
            );
            let (lse, dy, delta) = (nullable(&a[13]), nullable(&a[14]), nullable(&a[16]));
            for bh in 0..bh_n {
                for bx in 0..gx {
                    let last_row = (bx * WARPS + WARPS - 1).min(sq - 1);
                    let kend = if causal { (last_row + 1).min(sk) } else { sk };
                    for warp in 0..WARPS {
                        let row = bx * WARPS + warp;
                        if row >= sq {
                            continue;
                        }
                        let (mut mx, mut sum, mut acc) =
                            (f32::NEG_INFINITY, 0f32, vec![0f32; dv as usize]);
                        let mut j0 = 0;
                        while j0 < kend {
                            let mut jend = (j0 + t).min(sk);
                            if causal && jend > row + 1 {
                                jend = row + 1;
                            }
                            for j in j0..jend {
                                let s =
                                    dot(m, q, (bh * sq + row) * d, k, (bh * sk + j) * d, d) * scale;
                                let mn = mx.max(s);
                                let (corr, p) = ((mx - mn).exp(), (s - mn).exp());
                                sum = sum * corr + p;
                                for (e, x) in acc.iter_mut().enumerate() {
                                    *x = *x * corr + p * m.f32(v, (bh * sk + j) * dv + e as i64);
                                }
                                mx = mn;
                            }
                            j0 += t;
                        }
                        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                        let r = bh * sq + row;
                        if let Some(o) = o {
                            for (e, x) in acc.iter().enumerate() {
                                m.set_f32(o, r * dv + e as i64, x * inv);
                            }
                        }
                        if let Some(lse) = lse {
                            m.set_f32(lse, r, mx + sum.ln());
                        }
                        if let (Some(delta), Some(dy)) = (delta, dy) {
                            let s: f32 = acc
                                .iter()
                                .enumerate()
                                .map(|(e, x)| m.f32(dy, r * dv + e as i64) * x * inv)
                                .sum();
                            m.set_f32(delta, r, s);
                        }
                    }
                }
            }
        }
        "attn_bwd_dq" => {
            let (dy, lse, delta, dq) = (ptr(&a[4]), ptr(&a[6]), ptr(&a[7]), ptr(&a[8]));
            let (sq, sk, d, dv, scale, causal, t) = (
                int(&a[10]),
                int(&a[11]),
                int(&a[12]),
                int(&a[13]),
                float(&a[14]),
                int(&a[15]) != 0,
                int(&a[16]),
            );
            for bh in 0..bh_n {
                for bx in 0..gx {
                    let last_row = (bx * WARPS + WARPS - 1).min(sq - 1);
                    let kend = if causal { (last_row + 1).min(sk) } else { sk };
                    for warp in 0..WARPS {
                        let row = bx * WARPS + warp;
                        if row >= sq {
                            continue;
                        }
                        let r = bh * sq + row;
                        let (li, di) = (m.f32(lse, r), m.f32(delta, r));
                        let mut acc = vec![0f32; d as usize];
                        let mut j0 = 0;
                        while j0 < kend {
                            let mut jend = (j0 + t).min(sk);
                            if causal && jend > row + 1 {
                                jend = row + 1;
                            }
                            for j in j0..jend {
                                let p =
                                    (dot(m, q, r * d, k, (bh * sk + j) * d, d) * scale - li).exp();
                                let ds = p * (dot(m, dy, r * dv, v, (bh * sk + j) * dv, dv) - di);
                                for (e, x) in acc.iter_mut().enumerate() {
                                    *x += ds * m.f32(k, (bh * sk + j) * d + e as i64);
                                }
                            }
                            j0 += t;
                        }
                        for (e, x) in acc.iter().enumerate() {
                            m.set_f32(dq, r * d + e as i64, x * scale);
                        }
                    }
                }
            }
        }
        _ => {
            let (dy, lse, delta, dk, dvo) =
                (ptr(&a[4]), ptr(&a[6]), ptr(&a[7]), ptr(&a[8]), ptr(&a[9]));
            let (sq, sk, d, dv, scale, causal, t) = (
                int(&a[11]),
                int(&a[12]),
                int(&a[13]),
                int(&a[14]),
                float(&a[15]),
                int(&a[16]) != 0,
                int(&a[17]),
            );
            for bh in 0..bh_n {
                for bx in 0..gx {
                    let first = if causal { bx * WARPS } else { 0 };
                    for warp in 0..WARPS {
                        let col = bx * WARPS + warp;
                        if col >= sk {
                            continue;
                        }
                        let (mut dka, mut dva) = (vec![0f32; d as usize], vec![0f32; dv as usize]);
                        let mut i0 = first;
                        while i0 < sq {
                            let istart = if causal { i0.max(col) } else { i0 };
                            let iend = (i0 + t).min(sq);
                            for i in istart..iend {
                                let r = bh * sq + i;
                                let p = (dot(m, k, (bh * sk + col) * d, q, r * d, d) * scale
                                    - m.f32(lse, r))
                                .exp();
                                let ds = p
                                    * (dot(m, v, (bh * sk + col) * dv, dy, r * dv, dv)
                                        - m.f32(delta, r));
                                for (e, x) in dva.iter_mut().enumerate() {
                                    *x += p * m.f32(dy, r * dv + e as i64);
                                }
                                for (e, x) in dka.iter_mut().enumerate() {
                                    *x += ds * m.f32(q, r * d + e as i64);
                                }
                            }
                            i0 += t;
                        }
                        let c = bh * sk + col;
                        for (e, x) in dka.iter().enumerate() {
                            m.set_f32(dk, c * d + e as i64, x * scale);
                        }
                        for (e, x) in dva.iter().enumerate() {
                            m.set_f32(dvo, c * dv + e as i64, *x);
                        }
                    }
                }
            }
        }
    }
}

/// cuBLAS's column-major `C = op1(X1) op2(X2)` (`C += ...` when
/// accumulating), batch by batch, summed in f32 and rounded into C's type.
fn gemm(m: &mut Mem, g: &Gemm) {
    let el = |mem: &mut Mem,
              (p, ld, _): (u64, i32, i64),
              b: i32,
              stride: i64,
              t: bool,
              i: i64,
              j: i64| {
        let (r, c) = if t { (j, i) } else { (i, j) };
        mem.ld(p, g.dtype.0, b as i64 * stride + r + c * ld as i64)
    };
    for b in 0..g.batch {
        for i in 0..g.m as i64 {
            for j in 0..g.n as i64 {
                let at = b as i64 * g.c.2 + i + j * g.c.1 as i64;
                let mut s = 0f32;
                for k in 0..g.k as i64 {
                    let u = el(m, g.x1, b, g.x1.2, g.trans1, i, k);
                    s += u * el(m, g.x2, b, g.x2.2, g.trans2, k, j);
                }
                if g.accumulate {
                    s += m.ld(g.c.0, g.dtype.1, at);
                }
                m.st(g.c.0, g.dtype.1, at, s);
            }
        }
    }
}

/// Runs `op` lowered for the GPU on the emulator and on the CPU backend,
/// each with the workspace the planner's rule gives the kernel.
fn both(op: Op, ins: &[HostTensor], outs: &[TensorType]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut at = BASE;
    let mut place = |b: u64| {
        let p = at;
        at += b.div_ceil(256) * 256 + 256;
        p
    };
    let ip: Vec<u64> = ins.iter().map(|t| place(t.ty.bytes())).collect();
    let op_: Vec<u64> = outs.iter().map(|t| place(t.bytes())).collect();
    let in_types: Vec<&TensorType> = ins.iter().map(|t| &t.ty).collect();
    let ws_bytes = fsdpc_plan::workspace::kernel_workspace(&op, &in_types, outs);
    let ws = (ws_bytes > 0).then(|| (place(ws_bytes), ws_bytes));
    let mut mem = Mem(vec![0xAB; (at - BASE) as usize], Vec::new());
    for (t, p) in ins.iter().zip(&ip) {
        let a = mem.at(*p);
        mem.0[a..a + t.bytes().len()].copy_from_slice(t.bytes());
    }
    let xs: Vec<Operand> = ins
        .iter()
        .zip(&ip)
        .map(|(t, p)| Operand { ptr: *p, ty: &t.ty })
        .collect();
    let ys: Vec<Operand> = outs
        .iter()
        .zip(&op_)
        .map(|(t, p)| Operand { ptr: *p, ty: t })
        .collect();
    let l = lower(&op, &xs, &ys, ws, 0, 0).unwrap();
    mem.1 = vec![0xCD; l.scratch as usize];
    for a in &l.actions {
        match a {
            Action::Launch(x) => launch(&mut mem, x),
            Action::Gemm(g) => gemm(&mut mem, g),
            Action::Zero {
                ptr: Ptr::Abs(p),
                bytes,
            } => {
                let s = mem.at(*p);
                mem.0[s..s + *bytes as usize].fill(0);
            }
            Action::Copy { src, dst, bytes } => {
                let (s, d) = (mem.at(*src), mem.at(*dst));
                let v = mem.0[s..s + *bytes as usize].to_vec();
                mem.0[d..d + *bytes as usize].copy_from_slice(&v);
            }
            other => panic!("not emulated: {other:?}"),
        }
    }
    let got = outs
        .iter()
        .zip(&op_)
        .map(|(t, p)| {
            (0..t.numel() as i64)
                .map(|i| mem.ld(*p, t.dtype, i))
                .collect()
        })
        .collect();
    let want = crate::support::run_cpu(op, ins, outs).expect("the CPU kernel runs");
    (got, want.iter().map(|t| t.to_f32()).collect())
}

fn t(shape: &[usize], seed: u32) -> HostTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761u32) ^ seed) % 1000) as f32 / 100.0 - 5.0)
        .collect();
    HostTensor::from_f32(shape, &v).unwrap()
}

fn ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn same(op: Op, ins: &[HostTensor], outs: &[TensorType]) {
    let name = op.name();
    let (g, c) = both(op, ins, outs);
    for (a, b) in g.iter().zip(&c) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "{name} [{i}]: lowered {x}, cpu {y}"
            );
        }
    }
}

#[test]
fn data_movement_lowers_to_the_cpus_copies() {
    let x = t(&[2, 3, 4], 1);
    for perm in [vec![2, 0, 1], vec![0, 2, 1], vec![1, 0, 2], vec![0, 1, 2]] {
        let out: Vec<usize> = perm.iter().map(|&p| [2, 3, 4][p]).collect();
        same(Op::Transpose { perm }, &[x.clone()], &[ty(&out)]);
    }
    same(
        Op::Slice {
            axis: 2,
            start: 1,
            end: 9,
            step: 2,
        },
        &[x.clone()],
        &[ty(&[2, 3, 2])],
    );
    same(
        Op::Slice {
            axis: 0,
            start: 1,
            end: 2,
            step: 1,
        },
        &[x.clone()],
        &[ty(&[1, 3, 4])],
    );
    same(
        Op::SliceGrad {
            axis: 1,
            start: 0,
            end: 3,
            step: 2,
            input_shape: vec![2, 3, 4],
        },
        &[t(&[2, 2, 4], 2)],
        &[ty(&[2, 3, 4])],
    );
    same(
        Op::Concat { axis: 1 },
        &[x.clone(), t(&[2, 1, 4], 3), t(&[2, 2, 4], 4)],
        &[ty(&[2, 6, 4])],
    );
    same(
        Op::Concat { axis: 2 },
        &[x.clone(), t(&[2, 3, 1], 5)],
        &[ty(&[2, 3, 5])],
    );
    same(
        Op::Expand {
            shape: vec![3, 2, 5, 4],
        },
        &[t(&[2, 1, 4], 6)],
        &[ty(&[3, 2, 5, 4])],
    );
    // The Llama family's grouped-query repeat and rotary halves.
    same(
        Op::Expand {
            shape: vec![2, 2, 3, 3, 4],
        },
        &[t(&[2, 2, 1, 3, 4], 11)],
        &[ty(&[2, 2, 3, 3, 4])],
    );
    same(
        Op::Concat { axis: 3 },
        &[t(&[2, 2, 3, 2], 12), t(&[2, 2, 3, 2], 13)],
        &[ty(&[2, 2, 3, 4])],
    );
    same(
        Op::Slice {
            axis: 3,
            start: 2,
            end: 4,
            step: 1,
        },
        &[t(&[2, 2, 3, 4], 14)],
        &[ty(&[2, 2, 3, 2])],
    );
    same(
        Op::Pad {
            pads: vec![(0, 1), (2, 0), (1, 1)],
            value: 3.0,
        },
        &[x.clone()],
        &[ty(&[3, 5, 6])],
    );
    same(Op::Reshape { shape: vec![6, 4] }, &[x], &[ty(&[6, 4])]);
}

#[test]
fn reductions_and_broadcasts_lower_to_the_cpus_results() {
    let x = t(&[3, 4, 5], 7);
    for (axes, keep) in [
        (vec![1usize], vec![3, 1, 5]),
        (vec![0, 2], vec![1, 4, 1]),
        (vec![], vec![1, 1, 1]),
        (vec![0, 1], vec![1, 1, 5]),
    ] {
        for f in [ReduceFn::Sum, ReduceFn::Mean, ReduceFn::Max] {
            same(
                Op::Reduce {
                    f,
                    axes: axes.clone(),
                    keepdims: true,
                },
                &[x.clone()],
                &[ty(&keep)],
            );
        }
    }
    same(
        Op::SumTo { shape: vec![4, 1] },
        &[x.clone()],
        &[ty(&[4, 1])],
    );
    same(Op::SumTo { shape: vec![5] }, &[x.clone()], &[ty(&[5])]);
    // Long enough for the chunked form.
    let long = t(&[4100, 3], 10);
    same(Op::SumTo { shape: vec![3] }, &[long.clone()], &[ty(&[3])]);
    for f in [ReduceFn::Sum, ReduceFn::Mean, ReduceFn::Max] {
        same(
            Op::Reduce {
                f,
                axes: vec![0],
                keepdims: false,
            },
            &[long.clone()],
            &[ty(&[3])],
        );
    }
    for (a, b) in [
        (vec![3, 4, 5], vec![4, 1]),
        (vec![1, 5], vec![3, 4, 5]),
        (vec![3, 1, 5], vec![1, 4, 1]),
        (vec![5], vec![5]),
    ] {
        let out: Vec<usize> = (0..a.len().max(b.len()))
            .map(|i| {
                let pick = |v: &Vec<usize>| {
                    v.len()
                        .checked_sub(a.len().max(b.len()) - i)
                        .map_or(1, |j| v[j])
                };
                pick(&a).max(pick(&b))
            })
            .collect();
        for f in [BinaryFn::Add, BinaryFn::Sub, BinaryFn::Div, BinaryFn::Max] {
            same(Op::Binary { f }, &[t(&a, 8), t(&b, 9)], &[ty(&out)]);
        }
    }
}

#[test]
fn fused_attention_tiles_and_causal_bounds_give_the_cpus_attention() {
    // (batch, heads, sq, sk, d, dv, causal): rows and keys not multiples
    // of the 8-row blocks or of the tiles; sq > sk and sq < sk.
    for (b, h, sq, sk, d, dv, causal) in [
        (1, 2, 19, 19, 8, 8, true),
        (2, 1, 40, 40, 16, 12, true),
        (1, 1, 9, 33, 8, 4, false),
        (1, 1, 30, 12, 8, 8, true),
        (1, 1, 70, 70, 200, 200, true),
    ] {
        let scale = 1.0 / (d as f64).sqrt();
        let (q, k, v, dy) = (
            t(&[b, h, sq, d], 1),
            t(&[b, h, sk, d], 2),
            t(&[b, h, sk, dv], 3),
            t(&[b, h, sq, dv], 4),
        );
        let small = |x: HostTensor| {
            HostTensor::from_f32(
                &x.ty.shape.0,
                &x.to_f32().iter().map(|v| v / 5.0).collect::<Vec<_>>(),
            )
            .unwrap()
        };
        let (q, k, v, dy) = (small(q), small(k), small(v), small(dy));
        same(
            Op::Attention { causal, scale },
            &[q.clone(), k.clone(), v.clone()],
            &[ty(&[b, h, sq, dv])],
        );
        same(
            Op::AttentionGrad { causal, scale },
            &[q, k, v, dy],
            &[ty(&[b, h, sq, d]), ty(&[b, h, sk, d]), ty(&[b, h, sk, dv])],
        );
    }
}

#[test]
fn norm_gradients_and_their_chunked_parameter_sums_give_the_cpus() {
    for (rows, d) in [(3usize, 5usize), (70, 8), (130, 3)] {
        let (x, g, dy) = (t(&[rows, d], 11), t(&[d], 12), t(&[rows, d], 13));
        let (tx, tp) = (ty(&[rows, d]), ty(&[d]));
        same(
            Op::LayerNormGrad {
                eps: 1e-5,
                has_beta: true,
            },
            &[x.clone(), g.clone(), dy.clone()],
            &[tx.clone(), tp.clone(), tp.clone()],
        );
        same(
            Op::LayerNormGrad {
                eps: 1e-5,
                has_beta: false,
            },
            &[x.clone(), g.clone(), dy.clone()],
            &[tx.clone(), tp.clone()],
        );
        same(Op::RmsNormGrad { eps: 1e-6 }, &[x, g, dy], &[tx, tp]);
    }
}

#[test]
fn matrix_products_map_onto_cublas_column_major_calls() {
    type Product = (
        &'static [usize],
        &'static [usize],
        bool,
        bool,
        &'static [usize],
    );
    let cases: [Product; 9] = [
        (&[7, 5], &[5, 3], false, false, &[7, 3]),
        (&[5, 7], &[5, 3], true, false, &[7, 3]),
        (&[7, 5], &[3, 5], false, true, &[7, 3]),
        (&[5, 7], &[3, 5], true, true, &[7, 3]),
        (&[2, 7, 5], &[5, 3], false, false, &[2, 7, 3]),
        (&[2, 7, 5], &[2, 5, 3], false, false, &[2, 7, 3]),
        (&[5, 3], &[2, 3, 4], false, false, &[2, 5, 4]),
        (&[2, 1, 7, 5], &[1, 3, 5, 4], false, false, &[2, 3, 7, 4]),
        (&[5], &[5, 3], false, false, &[3]),
    ];
    for (k, (a, b, ta, tb, out)) in cases.iter().enumerate() {
        same(
            Op::MatMul {
                trans_a: *ta,
                trans_b: *tb,
            },
            &[t(a, k as u32), t(b, 100 + k as u32)],
            &[ty(out)],
        );
    }
}

/// Vocabulary parallelism's lookups and logit statistics, with their
/// gradients: the lowering's arguments against the CPU kernels, on a
/// vocabulary of 8 split in two and on one of 7 padded to two parts of 4
/// (member 1's last column padding, left out of the statistics).
#[test]
fn vocabulary_parallel_kernels_lower_to_the_cpus_results() {
    let ints = |shape: &[usize], v: &[i64]| HostTensor::from_i64(shape, v).unwrap();
    for (vocab, idx, labels) in [
        (None, [0, 7, 3, -1, 4], [0, 7, -100, 3, 5]),
        (Some(7), [0, 6, 3, -1, 4], [0, 6, -100, 3, 5]),
    ] {
        let idx = ints(&[5], &idx);
        let labels = ints(&[5], &labels);
        for member in 0..2i64 {
            let off = ints(&[1, 1], &[4 * member]);
            same(
                Op::TpLookup { parts: 2, vocab },
                &[t(&[4, 3], 21), idx.clone(), off.clone()],
                &[ty(&[5, 3])],
            );
            same(
                Op::TpLookupGrad {
                    parts: 2,
                    table_shape: vec![4, 3],
                    vocab,
                },
                &[idx.clone(), off.clone(), t(&[5, 3], 22)],
                &[ty(&[4, 3])],
            );
            let op = Op::TpLogitStats {
                ignore_index: Some(-100),
                parts: 2,
                vocab,
            };
            let logits = t(&[5, 4], 23);
            let (stats, _) = both(
                op.clone(),
                &[logits.clone(), labels.clone(), off.clone()],
                &[ty(&[1, 5, 3])],
            );
            same(
                op,
                &[logits.clone(), labels.clone(), off.clone()],
                &[ty(&[1, 5, 3])],
            );
            let stats = HostTensor::from_f32(&[1, 5, 3], &stats[0]).unwrap();
            let (dx, _) = both(
                Op::TpLogitStatsGrad {
                    ignore_index: Some(-100),
                    parts: 2,
                    vocab,
                },
                &[
                    logits.clone(),
                    labels.clone(),
                    off.clone(),
                    stats.clone(),
                    t(&[1, 5, 3], 24),
                ],
                &[ty(&[5, 4])],
            );
            if vocab.is_some() && member == 1 {
                assert!(
                    dx[0].chunks(4).all(|row| row[3] == 0.0),
                    "padding's gradient"
                );
            }
            same(
                Op::TpLogitStatsGrad {
                    ignore_index: Some(-100),
                    parts: 2,
                    vocab,
                },
                &[logits, labels.clone(), off, stats, t(&[1, 5, 3], 24)],
                &[ty(&[5, 4])],
            );
        }
    }
}
