//! The launches of fused attention (`kernels/attention.cu`): a forward
//! pass, and a backward of three kernels (per-query statistics, dq, then
//! dk and dv), with two f32 statistics per query row in private scratch.

use super::device::{Arg, Launch, Ptr};
use super::ops::{Action, Lowered, Operand};

/// Warps (query rows) per block, `WARPS` of the kernels.
const WARPS: u64 = 8;
/// Largest head dimension (8 elements per lane).
const MAX_HEAD: u64 = 256;
/// Shared memory a block may use without opting in, bytes.
const SMEM: u64 = 48 * 1024;

/// `[batch * heads, sq, sk, d, dv]`, checked.
fn dims(q: &Operand, k: &Operand, v: &Operand) -> Result<[u64; 5], String> {
    let (qd, kd, vd) = (&q.ty.shape.0, &k.ty.shape.0, &v.ty.shape.0);
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        return Err(format!(
            "attention needs rank-4 q, k, v; got {qd:?}, {kd:?}, {vd:?}"
        ));
    }
    if qd[..2] != kd[..2] || kd[..3] != vd[..3] || qd[3] != kd[3] {
        return Err(format!(
            "attention: inconsistent q {qd:?}, k {kd:?}, v {vd:?}"
        ));
    }
    if kd[2] == 0 {
        return Err("attention over an empty key sequence".into());
    }
    if q.ty.dtype != k.ty.dtype || k.ty.dtype != v.ty.dtype || !q.ty.dtype.is_float() {
        return Err(format!(
            "attention: q, k, v must share one float dtype ({}, {}, {})",
            q.ty, k.ty, v.ty
        ));
    }
    let (d, dv) = (qd[3] as u64, vd[3] as u64);
    if d > MAX_HEAD || dv > MAX_HEAD {
        return Err(format!(
            "attention: head dimensions {d} and {dv}; the cuda kernel takes at most {MAX_HEAD}"
        ));
    }
    if qd[0] as u64 * qd[1] as u64 > 65_535 {
        return Err("attention: more than 65 535 batch x heads".into());
    }
    Ok([(qd[0] * qd[1]) as u64, qd[2] as u64, kd[2] as u64, d, dv])
}

/// Rows per shared-memory tile when each row holds `floats` f32.
fn tile(floats: u64) -> u64 {
    (SMEM / (4 * floats.max(1))).clamp(1, 32)
}

fn launch(kernel: &'static str, rows: u64, bh: u64, smem: u64, args: Vec<Arg>) -> Action {
    Action::Launch(Launch {
        kernel,
        grid: (rows.div_ceil(WARPS) as u32, bh as u32, 1),
        block: (WARPS * 32) as u32,
        smem: smem as u32,
        args,
    })
}

fn same(x: &Operand, y: &Operand) -> Result<(), String> {
    if x.ty.shape != y.ty.shape {
        return Err(format!("attention: {} and {} differ in shape", x.ty, y.ty));
    }
    Ok(())
}

/// `o = attention(q, k, v)`.
pub fn forward(
    q: &Operand,
    k: &Operand,
    v: &Operand,
    o: &Operand,
    causal: bool,
    scale: f64,
    l: &mut Lowered,
) -> Result<(), String> {
    let [bh, sq, sk, d, dv] = dims(q, k, v)?;
    if o.ty.shape.0 != [q.ty.shape.0[0], q.ty.shape.0[1], sq as usize, dv as usize] {
        return Err(format!(
            "attention output {} does not match q {} and v {}",
            o.ty, q.ty, v.ty
        ));
    }
    if sq == 0 {
        return Ok(());
    }
    let t = tile(d + dv);
    let null = Arg::Ptr(Ptr::Abs(0));
    l.actions.push(launch(
        "attn_fwd",
        sq,
        bh,
        t * (d + dv) * 4,
        vec![
            Arg::Ptr(Ptr::Abs(q.ptr)),
            Arg::Ptr(Ptr::Abs(k.ptr)),
            Arg::Ptr(Ptr::Abs(v.ptr)),
            Arg::I32(dt(q)),
            Arg::Ptr(Ptr::Abs(o.ptr)),
            Arg::I32(dt(o)),
            Arg::I64(sq as i64),
            Arg::I64(sk as i64),
            Arg::I32(d as i32),
            Arg::I32(dv as i32),
            Arg::F32(scale as f32),
            Arg::I32(causal as i32),
            Arg::I32(t as i32),
            null,
            null,
            Arg::I32(0),
            null,
        ],
    ));
    Ok(())
}

fn dt(x: &Operand) -> i32 {
    super::ops::dt_code(x.ty.dtype)
}

/// `(dq, dk, dv)` of attention at `(q, k, v)` with output gradient `dy`.
pub fn backward(
    xs: [&Operand; 4],
    outs: [&Operand; 3],
    causal: bool,
    scale: f64,
    l: &mut Lowered,
) -> Result<(), String> {
    let [q, k, v, dy] = xs;
    let [dq, dk, dvo] = outs;
    let [bh, sq, sk, d, dv] = dims(q, k, v)?;
    same(q, dq)?;
    same(k, dk)?;
    same(v, dvo)?;
    if dy.ty.shape.0 != [q.ty.shape.0[0], q.ty.shape.0[1], sq as usize, dv as usize] {
        return Err(format!(
            "attention_grad: dy {} does not match q {} and v {}",
            dy.ty, q.ty, v.ty
        ));
    }
    if dq.ty.dtype != dk.ty.dtype || dk.ty.dtype != dvo.ty.dtype {
        return Err("attention_grad: dq, dk, dv must share one dtype".into());
    }
    // Scratch: lse then delta, one f32 each per query row.
    let rows = bh * sq;
    let (lse, delta) = (0u64, (4 * rows).div_ceil(256) * 256);
    l.scratch = delta + 4 * rows;
    if sq == 0 {
        l.actions.push(Action::Zero {
            ptr: Ptr::Abs(dk.ptr),
            bytes: dk.ty.bytes(),
        });
        l.actions.push(Action::Zero {
            ptr: Ptr::Abs(dvo.ptr),
            bytes: dvo.ty.bytes(),
        });
        return Ok(());
    }
    let p = |x: &Operand| Arg::Ptr(Ptr::Abs(x.ptr));
    let s = |off: u64| Arg::Ptr(Ptr::Scratch(off));
    let geo = [
        Arg::I64(sq as i64),
        Arg::I64(sk as i64),
        Arg::I32(d as i32),
        Arg::I32(dv as i32),
        Arg::F32(scale as f32),
        Arg::I32(causal as i32),
    ];
    let t = tile(d + dv);
    let mut stats = vec![
        p(q),
        p(k),
        p(v),
        Arg::I32(dt(q)),
        Arg::Ptr(Ptr::Abs(0)),
        Arg::I32(0),
    ];
    stats.extend(geo);
    stats.extend([
        Arg::I32(t as i32),
        s(lse),
        p(dy),
        Arg::I32(dt(dy)),
        s(delta),
    ]);
    l.actions
        .push(launch("attn_fwd", sq, bh, t * (d + dv) * 4, stats));
    let mut dqa = vec![
        p(q),
        p(k),
        p(v),
        Arg::I32(dt(q)),
        p(dy),
        Arg::I32(dt(dy)),
        s(lse),
        s(delta),
        p(dq),
        Arg::I32(dt(dq)),
    ];
    dqa.extend(geo);
    dqa.push(Arg::I32(t as i32));
    l.actions
        .push(launch("attn_bwd_dq", sq, bh, t * (d + dv) * 4, dqa));
    let t2 = tile(d + dv + 2);
    let mut dkv = vec![
        p(q),
        p(k),
        p(v),
        Arg::I32(dt(q)),
        p(dy),
        Arg::I32(dt(dy)),
        s(lse),
        s(delta),
        p(dk),
        p(dvo),
        Arg::I32(dt(dk)),
    ];
    dkv.extend(geo);
    dkv.push(Arg::I32(t2 as i32));
    l.actions
        .push(launch("attn_bwd_dkdv", sk, bh, t2 * (d + dv + 2) * 4, dkv));
    Ok(())
}
