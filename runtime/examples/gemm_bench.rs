//! GFLOP/s of the runtime's gemm wrapper on the GPT throughput target's
//! shapes: `cargo run --release -p fsdpc-runtime --example gemm_bench`.

use fsdpc_runtime::cpu::kernels::matmul::{gemm_f32, Mat};
use std::time::Instant;

fn bench(m: usize, k: usize, n: usize, ta: bool, tb: bool) {
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut c = vec![0f32; m * n];
    let iters = (2e9 / (2.0 * (m * k * n) as f64)).max(1.0) as usize;
    let t = Instant::now();
    for _ in 0..iters {
        let am = Mat {
            data: &a,
            rows: m,
            cols: k,
            trans: ta,
        };
        let bm = Mat {
            data: &b,
            rows: k,
            cols: n,
            trans: tb,
        };
        gemm_f32(gemm::Parallelism::None, &mut c, am, bm, 1.0, false).unwrap();
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "{m:5} x {k:5} x {n:5} ta={ta:5} tb={tb:5}: {:6.1} GFLOP/s",
        2.0 * (m * k * n * iters) as f64 / s / 1e9
    );
}

fn main() {
    for (m, k, n) in [
        (1024, 128, 384),
        (1024, 128, 128),
        (1024, 128, 512),
        (1024, 512, 128),
        (1024, 128, 1024),
        (128, 32, 128),
        (128, 128, 32),
    ] {
        bench(m, k, n, false, false);
        bench(m, k, n, true, false);
        bench(m, k, n, false, true);
    }
}
