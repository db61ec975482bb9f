//! Checkpoint figures for a GPT of about 100 M parameters
//! (`gpt:layers=12,hidden=768,heads=12,seq=128,vocab=32000`): the time and
//! size of saving one checkpoint at 2 ranks (parameter shards and AdamW
//! state, each rank writing its file in its own thread as in training, then
//! the manifest), of loading it back at 2 ranks (verifying every file's
//! blake3, then filling each rank's buffers), and of re-sharding on load a
//! checkpoint written at 4 ranks into 2.
//!
//! The buffers hold a fixed pattern rather than trained values: the
//! figures are file I/O and hashing, which do not depend on the values.
//! Files go to a temporary directory on the disk `TMPDIR` names.
//!
//! Run: `cargo bench --bench checkpoint`

mod common;

use fsdpc_plan::Plan;
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::checkpoint::write::{self, UnitBytes};
use fsdpc_runtime::checkpoint::{Checkpoint, Manifest};
use std::path::Path;
use std::time::Instant;

/// The model at a micro-batch of `batch`.
fn model(batch: u32) -> String {
    format!("gpt:layers=12,hidden=768,heads=12,seq=128,vocab=32000,batch={batch}")
}

fn plan(world: u32, batch: u32) -> Plan {
    let cfg = FsdpConfig {
        check_fits: false,
        ..FsdpConfig::default()
    };
    common::compile(&model(batch), "cpu-local", world, world, &cfg).expect("the GPT compiles")
}

/// One rank's persistent state: per unit, its parameter shard and its
/// optimizer state slots, as f32 bytes.
type RankState = Vec<(Vec<u8>, Vec<Vec<u8>>)>;

/// Rank `rank`'s buffers of `plan`, filled with a pattern (or zeroed).
fn rank_state(plan: &Plan, rank: usize, fill: bool) -> RankState {
    let slots = plan.training.optimizer.state_slots();
    let buf = |seed: usize, n: u64| -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                let v = if fill {
                    ((i as usize * 31 + seed * 7) % 1000) as f32 * 1e-3
                } else {
                    0.0
                };
                v.to_le_bytes()
            })
            .collect()
    };
    plan.units
        .iter()
        .enumerate()
        .map(|(u, unit)| {
            let seed = rank * 1000 + u;
            (
                buf(seed, unit.shard_numel),
                (0..slots)
                    .map(|k| buf(seed + k + 1, unit.shard_numel))
                    .collect(),
            )
        })
        .collect()
}

/// Saves `states` (one per shard position) as the checkpoint after step 1
/// in `dir`; returns seconds and bytes written.
fn save(plan: &Plan, dir: &Path, states: &[RankState]) -> (f64, u64) {
    let t = Instant::now();
    let files = std::thread::scope(|s| {
        let handles: Vec<_> = states
            .iter()
            .enumerate()
            .map(|(pos, st)| {
                s.spawn(move || {
                    let state: Vec<Vec<&[u8]>> = st
                        .iter()
                        .map(|(_, s)| s.iter().map(|b| b.as_slice()).collect())
                        .collect();
                    let units: Vec<UnitBytes<'_>> = st
                        .iter()
                        .zip(&state)
                        .map(|((p, _), s)| UnitBytes {
                            params: p,
                            state: s,
                        })
                        .collect();
                    write::save_rank(dir, 1, (pos as u32, 0, 1), &units, &[])
                        .expect("rank file written")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("saving thread"))
            .collect::<Vec<_>>()
    });
    let bytes = files.iter().map(|f| f.bytes).sum();
    write::commit(dir, &Manifest::new(plan, 1, 0, files)).expect("manifest written");
    (t.elapsed().as_secs_f64(), bytes)
}

/// Opens and verifies the latest checkpoint in `dir`, then fills every rank
/// of `plan` from it, one thread per rank; returns (verify, fill) seconds.
fn load(plan: &Plan, dir: &Path) -> (f64, f64) {
    let world = plan.cluster.world as usize;
    let mut states: Vec<RankState> = (0..world).map(|r| rank_state(plan, r, false)).collect();
    let t = Instant::now();
    let ckpt = Checkpoint::open(dir).expect("the checkpoint verifies");
    ckpt.check_compatible(plan)
        .expect("the checkpoint fits the plan");
    let verify = t.elapsed().as_secs_f64();
    let t = Instant::now();
    std::thread::scope(|s| {
        for (rank, st) in states.iter_mut().enumerate() {
            let ckpt = &ckpt;
            s.spawn(move || {
                let mut units: Vec<(&mut [u8], Vec<&mut [u8]>)> = st
                    .iter_mut()
                    .map(|(p, s)| {
                        (
                            p.as_mut_slice(),
                            s.iter_mut().map(|b| b.as_mut_slice()).collect(),
                        )
                    })
                    .collect();
                ckpt.load_rank(plan, rank, &mut units).expect("rank loads");
            });
        }
    });
    (verify, t.elapsed().as_secs_f64())
}

fn main() {
    common::figures(
        "checkpoint",
        "checkpoint save, load and re-shard",
        "A 12-layer GPT (hidden 768, vocab 32000) with AdamW state: the time and size of saving a sharded checkpoint at 2 ranks, loading it with blake3 verification, and re-sharding a 4-rank checkpoint into 2 ranks on load. Files go to `TMPDIR`.",
    );
    let tmp = tempfile::tempdir().expect("temporary directory");
    let at2 = plan(2, 1);
    println!(
        "model {}: {} parameters ({:.1} M), AdamW",
        at2.model.name,
        at2.model.params,
        at2.model.params as f64 / 1e6
    );

    // Three saves (the first on a cold page cache and writeback): each
    // time is printed, and the median.
    let states: Vec<RankState> = (0..2).map(|r| rank_state(&at2, r, true)).collect();
    let mut times = Vec::new();
    let mut bytes = 0;
    let dir2 = tmp.path().join("at2");
    for i in 0..3 {
        if i > 0 {
            std::fs::remove_dir_all(&dir2).expect("cleanup");
        }
        let (t, b) = save(&at2, &dir2, &states);
        times.push(t);
        bytes = b;
    }
    drop(states);
    let shown: Vec<String> = times.iter().map(|t| format!("{t:.2}")).collect();
    times.sort_by(f64::total_cmp);
    println!(
        "save at 2 ranks: {} s (median {:.2} s), {:.1} MiB in 2 files ({:.0} MiB/s at the median)",
        shown.join(", "),
        times[1],
        common::mib(bytes),
        common::mib(bytes) / times[1]
    );
    let (verify, fill) = load(&at2, &dir2);
    println!(
        "load at 2 ranks: {:.2} s ({verify:.2} s opening and verifying blake3, {fill:.2} s filling the ranks)",
        verify + fill
    );
    std::fs::remove_dir_all(&dir2).expect("cleanup");

    // 4 ranks x batch 1 and 2 ranks x batch 2: the same global batch.
    let at4 = plan(4, 1);
    let to2 = plan(2, 2);
    let dir4 = tmp.path().join("at4");
    let states: Vec<RankState> = (0..4).map(|r| rank_state(&at4, r, true)).collect();
    let (save4, bytes4) = save(&at4, &dir4, &states);
    drop(states);
    println!(
        "save at 4 ranks: {save4:.2} s, {:.1} MiB in 4 files",
        common::mib(bytes4)
    );
    let (verify, fill) = load(&to2, &dir4);
    println!(
        "re-shard on load 4 -> 2 ranks: {:.2} s ({verify:.2} s opening and verifying blake3, {fill:.2} s re-slicing into the ranks)",
        verify + fill
    ); // The rank states the bench holds (up to 4 ranks' parameters and
       // optimizer state) dominate this figure.
    if let Some(rss) = common::peak_rss_bytes() {
        println!("peak RSS of the bench process: {:.0} MiB", common::mib(rss));
    }
}
