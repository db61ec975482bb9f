//! Shared-memory collectives: results and rank-order sums at 1..8 ranks, and
//! failure handling (a failed rank makes the others error, no hang).

use fsdpc_ir::DType;
use fsdpc_runtime::{Buf, BufMut, CommConfig, CommError, Communicator, ShmWorld};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn buf(v: &[f32]) -> Buf<'_> {
    Buf {
        dtype: DType::F32,
        bytes: bytemuck::cast_slice(v),
    }
}

fn buf_mut(v: &mut [f32]) -> BufMut<'_> {
    BufMut {
        dtype: DType::F32,
        bytes: bytemuck::cast_slice_mut(v),
    }
}

/// Runs `f(rank, comm)` on `n` thread ranks of one world group.
fn on_ranks<T: Send>(
    n: usize,
    cfg: CommConfig,
    f: impl Fn(usize, &dyn Communicator) -> T + Sync,
) -> Vec<T> {
    let world = ShmWorld::new(n, cfg);
    let ranks: Vec<usize> = (0..n).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (world, ranks, f) = (world.clone(), &ranks, &f);
                s.spawn(move || {
                    let c = world.communicator(ranks, "t", r).unwrap();
                    f(r, &c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Values whose sum depends on the order of addition in f32.
fn vals(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((rank * 7 + i * 13) % 11) as f32 * 0.1 + 1e-7 * (rank as f32 + 1.0) * 1e3)
        .collect()
}

fn ordered_sum(n: usize, len: usize, d: f32) -> Vec<f32> {
    let mut acc = vals(0, len);
    for r in 1..n {
        for (a, v) in acc.iter_mut().zip(vals(r, len)) {
            *a += v;
        }
    }
    acc.iter().map(|a| a / d).collect()
}

#[test]
fn all_gather_reduce_scatter_all_reduce_1_to_8() {
    for n in 1..=8 {
        let len = 4 * n;
        let out = on_ranks(n, CommConfig::default(), |r, c| {
            let mine = vals(r, len);
            let mut gathered = vec![0.0; len * n];
            c.all_gather(buf(&mine), buf_mut(&mut gathered)).unwrap();
            let mut shard = vec![0.0; len / n];
            c.reduce_scatter(buf(&mine), buf_mut(&mut shard), n as u32)
                .unwrap();
            let mut all = mine.clone();
            c.all_reduce(buf_mut(&mut all), n as u32).unwrap();
            c.barrier().unwrap();
            (gathered, shard, all)
        });
        let want = ordered_sum(n, len, n as f32);
        for (r, (g, shard, all)) in out.into_iter().enumerate() {
            let expect_g: Vec<f32> = (0..n).flat_map(|q| vals(q, len)).collect();
            assert_eq!(g, expect_g);
            assert_eq!(all, want, "all_reduce n={n}");
            let s = len / n;
            assert_eq!(
                shard,
                want[r * s..(r + 1) * s].to_vec(),
                "reduce_scatter n={n}"
            );
        }
    }
}

#[test]
fn all_gather_casts_to_bf16() {
    let out = on_ranks(2, CommConfig::default(), |r, c| {
        let mine = vec![r as f32 + 0.5; 2];
        let mut g = vec![0u8; 8];
        c.all_gather(
            buf(&mine),
            BufMut {
                dtype: DType::Bf16,
                bytes: &mut g,
            },
        )
        .unwrap();
        g
    });
    let vals: Vec<f32> = out[0]
        .chunks(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    assert_eq!(vals, vec![0.5, 0.5, 1.5, 1.5]);
}

#[test]
fn broadcast_copies_root() {
    let out = on_ranks(3, CommConfig::default(), |r, c| {
        let mut v = vec![r as f32; 3];
        c.broadcast(buf_mut(&mut v), 1).unwrap();
        v
    });
    assert!(out.iter().all(|v| v == &vec![1.0; 3]));
}

#[test]
fn failed_rank_makes_others_error_without_hanging() {
    let world = ShmWorld::new(
        4,
        CommConfig {
            timeout: Duration::from_secs(30),
        },
    );
    let ranks: Vec<usize> = (0..4).collect();
    let start = Instant::now();
    let errs: Vec<Option<CommError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let (world, ranks) = (world.clone(), &ranks);
                s.spawn(move || {
                    let c = world.communicator(ranks, "t", r).unwrap();
                    if r == 2 {
                        std::thread::sleep(Duration::from_millis(50));
                        world.poison(2, "boom");
                        return None;
                    }
                    let mut v = vec![1.0f32; 4];
                    c.all_reduce(buf_mut(&mut v), 1).err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    for (r, e) in errs.iter().enumerate() {
        if r != 2 {
            assert_eq!(
                e,
                &Some(CommError::RankFailed {
                    rank: 2,
                    reason: "boom".into()
                })
            );
        }
    }
}

#[test]
fn missing_rank_times_out() {
    let world = ShmWorld::new(
        2,
        CommConfig {
            timeout: Duration::from_millis(200),
        },
    );
    let c = world.communicator(&[0, 1], "t", 0).unwrap();
    let start = Instant::now();
    let e = c.barrier().unwrap_err();
    assert!(matches!(e, CommError::Timeout { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(2));
    // The world is poisoned: the next collective fails at once.
    assert!(matches!(
        c.barrier(),
        Err(CommError::RankFailed { rank: 0, .. })
    ));
    let _ = Arc::strong_count(&world);
}

#[test]
fn mismatched_lengths_are_an_error() {
    let out = on_ranks(2, CommConfig::default(), |r, c| {
        let mine = vec![1.0f32; 2 + r];
        let mut g = vec![0.0; 4];
        c.all_gather(buf(&mine), buf_mut(&mut g)).err()
    });
    assert!(out
        .iter()
        .all(|e| matches!(e, Some(CommError::Mismatch { .. }))));
}
