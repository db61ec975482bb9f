//! Scaled dot-product attention (`Attention`, `AttentionGrad`) over
//! `q: [batch, heads, sq, d]`, `k: [batch, heads, sk, d]`,
//! `v: [batch, heads, sk, dv]`, one (batch, head) at a time: `S = scale * Q
//! K^T` and `O = P V` through gemm, a causal mask (`j <= i`, top-left aligned
//! as PyTorch's `is_causal`), and a max-subtracted softmax. The backward pass
//! recomputes `P` rather than storing it. Workspace: two `sq x sk` f32 tiles.

use super::fastmath::exp;
use super::matmul::{gemm_f32, Mat};
use super::simd;
use crate::backend::Workspace;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use gemm::Parallelism;

/// Shapes of one attention call.
#[derive(Copy, Clone, Debug)]
struct Dims {
    heads: usize,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
}

fn dims(q: &TensorRef, k: &TensorRef, v: &TensorRef) -> KResult<Dims> {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        crate::kbail!("attention needs rank-4 q, k, v; got {qd:?}, {kd:?}, {vd:?}");
    }
    if qd[..2] != kd[..2] || kd[..3] != vd[..3] || qd[3] != kd[3] {
        crate::kbail!("attention: inconsistent q {qd:?}, k {kd:?}, v {vd:?}");
    }
    if kd[2] == 0 {
        crate::kbail!("attention over an empty key sequence");
    }
    Ok(Dims {
        heads: qd[0] * qd[1],
        sq: qd[2],
        sk: kd[2],
        d: qd[3],
        dv: vd[3],
    })
}

/// The attention probabilities of one head into `p` (`sq x sk`).
fn probs(
    par: Parallelism,
    q: &[f32],
    k: &[f32],
    s: Dims,
    causal: bool,
    scale: f32,
    p: &mut [f32],
) -> KResult<()> {
    let qm = Mat {
        data: q,
        rows: s.sq,
        cols: s.d,
        trans: false,
    };
    let km = Mat {
        data: k,
        rows: s.d,
        cols: s.sk,
        trans: true,
    };
    gemm_f32(par, p, qm, km, scale, false)?;
    mask_softmax(p, s, causal);
    Ok(())
}

crate::multiversion! {
    /// Row softmax of the scores in place, masked positions set to 0.
    fn mask_softmax(p: &mut [f32], s: Dims, causal: bool) {
        for (i, row) in p.chunks_exact_mut(s.sk).take(s.sq).enumerate() {
            let valid = if causal { (i + 1).min(s.sk) } else { s.sk };
            let (live, masked) = row.split_at_mut(valid);
            let m = simd::max(live);
            for v in live.iter_mut() {
                *v = exp(*v - m);
            }
            let inv = 1.0 / simd::sum(live);
            simd::scale(live, inv);
            masked.fill(0.0);
        }
    }
}

crate::multiversion! {
    /// `dS = P * (dP - rowsum(P * dP))`, in `dp`.
    fn softmax_backward_rows(p: &[f32], dp: &mut [f32], sk: usize) {
        for (pr, dr) in p.chunks_exact(sk).zip(dp.chunks_exact_mut(sk)) {
            let dot = simd::dot(pr, dr);
            for j in 0..sk {
                dr[j] = pr[j] * (dr[j] - dot);
            }
        }
    }
}

/// `Attention { causal, scale }`.
pub fn forward(
    par: Parallelism,
    causal: bool,
    scale: f64,
    ins: [&TensorRef; 3],
    y: &mut TensorMut,
    ws: &mut Workspace,
) -> KResult<()> {
    let [q, k, v] = ins;
    let s = dims(q, k, v)?;
    let (qs, ks, vs, ys) = (q.f32()?, k.f32()?, v.f32()?, y.f32_mut()?);
    if ys.len() != s.heads * s.sq * s.dv {
        crate::kbail!("attention output {} does not match q and v", y.ty);
    }
    let p = ws.f32s(s.sq * s.sk)?;
    for h in 0..s.heads {
        let qh = &qs[h * s.sq * s.d..(h + 1) * s.sq * s.d];
        let kh = &ks[h * s.sk * s.d..(h + 1) * s.sk * s.d];
        let vh = &vs[h * s.sk * s.dv..(h + 1) * s.sk * s.dv];
        probs(par, qh, kh, s, causal, scale as f32, p)?;
        let pm = Mat {
            data: p,
            rows: s.sq,
            cols: s.sk,
            trans: false,
        };
        let vm = Mat {
            data: vh,
            rows: s.sk,
            cols: s.dv,
            trans: false,
        };
        gemm_f32(
            par,
            &mut ys[h * s.sq * s.dv..(h + 1) * s.sq * s.dv],
            pm,
            vm,
            1.0,
            false,
        )?;
    }
    Ok(())
}

/// `AttentionGrad { causal, scale }`: `(q, k, v, dy) -> (dq, dk, dv)`.
pub fn backward(
    par: Parallelism,
    causal: bool,
    scale: f64,
    ins: [&TensorRef; 4],
    outs: &mut [TensorMut],
    ws: &mut Workspace,
) -> KResult<()> {
    let [q, k, v, dy] = ins;
    let s = dims(q, k, v)?;
    let (qs, ks, vs, dys) = (q.f32()?, k.f32()?, v.f32()?, dy.f32()?);
    let [dq, dk, dv, ..] = outs else {
        crate::kbail!("attention_grad needs three outputs");
    };
    let (dqs, dks, dvs) = (dq.f32_mut()?, dk.f32_mut()?, dv.f32_mut()?);
    if dys.len() != s.heads * s.sq * s.dv
        || dqs.len() != qs.len()
        || dks.len() != ks.len()
        || dvs.len() != vs.len()
    {
        crate::kbail!("attention_grad: gradient shapes do not match q, k, v");
    }
    let tiles = ws.f32s(2 * s.sq * s.sk)?;
    let (p, dp) = tiles.split_at_mut(s.sq * s.sk);
    let scale = scale as f32;
    for h in 0..s.heads {
        let (qo, ko, vo, yo) = (
            h * s.sq * s.d,
            h * s.sk * s.d,
            h * s.sk * s.dv,
            h * s.sq * s.dv,
        );
        let qh = &qs[qo..qo + s.sq * s.d];
        let kh = &ks[ko..ko + s.sk * s.d];
        let vh = &vs[vo..vo + s.sk * s.dv];
        let dyh = &dys[yo..yo + s.sq * s.dv];
        probs(par, qh, kh, s, causal, scale, p)?;
        // dV = P^T dY
        let pt = Mat {
            data: p,
            rows: s.sk,
            cols: s.sq,
            trans: true,
        };
        let dym = Mat {
            data: dyh,
            rows: s.sq,
            cols: s.dv,
            trans: false,
        };
        gemm_f32(par, &mut dvs[vo..vo + s.sk * s.dv], pt, dym, 1.0, false)?;
        // dP = dY V^T, then dS = P * (dP - rowsum(P * dP)) in dp.
        let vt = Mat {
            data: vh,
            rows: s.dv,
            cols: s.sk,
            trans: true,
        };
        gemm_f32(par, dp, dym, vt, 1.0, false)?;
        softmax_backward_rows(p, dp, s.sk);
        // dQ = scale dS K; dK = scale dS^T Q.
        let ds = Mat {
            data: dp,
            rows: s.sq,
            cols: s.sk,
            trans: false,
        };
        let km = Mat {
            data: kh,
            rows: s.sk,
            cols: s.d,
            trans: false,
        };
        gemm_f32(par, &mut dqs[qo..qo + s.sq * s.d], ds, km, scale, false)?;
        let dst = Mat {
            data: dp,
            rows: s.sk,
            cols: s.sq,
            trans: true,
        };
        let qm = Mat {
            data: qh,
            rows: s.sq,
            cols: s.d,
            trans: false,
        };
        gemm_f32(par, &mut dks[ko..ko + s.sk * s.d], dst, qm, scale, false)?;
    }
    Ok(())
}
