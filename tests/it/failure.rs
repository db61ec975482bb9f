//! Failure handling of the executor: a rank that errors or panics stops
//! every rank with an error naming it, within the timeout, never a hang.

use crate::support::plan::plan;
use fsdpc_ir::Optimizer;
use fsdpc_plan::{PlanViolation, Strategy};
use fsdpc_runtime::data::{open, DataSource};
use fsdpc_runtime::{
    train, train_with_data, Batch, DataSpec, RuntimeError, TensorMut, TrainOptions,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const GPT: &str = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2";

/// Synthetic data that fails (or panics) for rank 1 at step 2.
struct Faulty {
    inner: Arc<dyn DataSource>,
    panic: bool,
}

impl DataSource for Faulty {
    fn fill(&self, name: &str, batch: Batch, out: TensorMut<'_>) -> Result<(), RuntimeError> {
        if batch.step == 2 && batch.first_sample == 2 {
            if self.panic {
                panic!("injected panic");
            }
            return Err(RuntimeError::data(name, "injected failure"));
        }
        self.inner.fill(name, batch, out)
    }
}

fn run_faulty(world: u32, panic: bool) -> (Result<Vec<f32>, RuntimeError>, Duration) {
    let p = plan(GPT, world, Strategy::FullShard, Optimizer::adamw(1e-2));
    let inner = open(&DataSpec::Synthetic, &p.training.graph, 1).unwrap();
    let opts = TrainOptions {
        steps: 5,
        comm_timeout: Duration::from_secs(20),
        ..TrainOptions::default()
    };
    let start = Instant::now();
    let r = train_with_data(&p, &opts, Arc::new(Faulty { inner, panic }), &mut |_| {});
    (r.map(|r| r.losses), start.elapsed())
}

#[test]
fn failing_rank_stops_every_rank_with_its_error() {
    for world in [2, 4] {
        let (r, took) = run_faulty(world, false);
        assert_eq!(
            r,
            Err(RuntimeError::data("ids", "injected failure")),
            "world {world}"
        );
        assert!(took < Duration::from_secs(5), "took {took:?}");
    }
}

#[test]
fn panicking_rank_is_reported_as_failed() {
    let (r, took) = run_faulty(2, true);
    match r {
        Err(RuntimeError::RankFailed { rank: 1, reason }) => {
            assert!(reason.contains("injected panic"), "{reason}")
        }
        other => panic!("expected rank 1 to fail, got {other:?}"),
    }
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn bad_token_file_is_a_data_error() {
    let dir = std::env::temp_dir().join(format!("fsdpc-rt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("bad.bin");
    let toks: Vec<u8> = (0..100u16)
        .flat_map(|t| (t * 7 % 200).to_le_bytes())
        .collect();
    std::fs::write(&bin, toks).unwrap();
    let p = plan(GPT, 1, Strategy::FullShard, Optimizer::adamw(1e-2));
    let opts = TrainOptions {
        steps: 1,
        data: DataSpec::TokenBin(bin),
        ..TrainOptions::default()
    };
    match train(&p, &opts, &mut |_| {}) {
        Err(RuntimeError::Data { reason, .. }) => {
            assert!(reason.contains("vocabulary of 64"), "{reason}")
        }
        other => panic!("expected a data error, got {other:?}"),
    }
    let missing = TrainOptions {
        data: DataSpec::TextFile(dir.join("nope.txt")),
        ..opts
    };
    assert!(matches!(
        train(&p, &missing, &mut |_| {}),
        Err(RuntimeError::Io { .. })
    ));
}

#[test]
fn bad_plans_are_errors_not_crashes() {
    let p = plan(GPT, 2, Strategy::FullShard, Optimizer::adamw(1e-2));
    let opts = TrainOptions {
        steps: 1,
        ..TrainOptions::default()
    };
    let mut huge = p.clone();
    huge.memory.arena_bytes = 1 << 55;
    assert!(matches!(
        train(&huge, &opts, &mut |_| {}),
        Err(RuntimeError::Plan { .. })
    ));
    // Plans that break invariants are refused by validation, before any
    // rank runs, with every violation.
    let mut outside = p.clone();
    outside.buffers[0].offset = p.memory.arena_bytes;
    let violations = invalid(train(&outside, &opts, &mut |_| {}));
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, PlanViolation::OutsideArena { .. })),
        "{violations:?}"
    );
    let mut slot = p.clone();
    let k = slot.instructions.iter_mut().find_map(|i| match &mut i.op {
        fsdpc_plan::InstrOp::Kernel { outputs, .. } => Some(outputs),
        _ => None,
    });
    k.unwrap()[0].offset = u64::MAX / 2;
    let violations = invalid(train(&slot, &opts, &mut |_| {}));
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, PlanViolation::SlotOutOfBounds { .. })),
        "{violations:?}"
    );
}

/// The violations of an `InvalidPlan` error; fails the test on anything else.
fn invalid<T: std::fmt::Debug>(r: Result<T, RuntimeError>) -> Vec<PlanViolation> {
    match r {
        Err(RuntimeError::InvalidPlan { violations }) => {
            assert!(!violations.is_empty(), "an invalid plan names a violation");
            violations
        }
        other => panic!("expected an invalid-plan error, got {other:?}"),
    }
}

#[test]
fn every_entry_point_validates_the_plan() {
    // A plan without its all-gathers: kernels would read parameters nobody
    // gathered. Both entry points refuse it with every violation listed.
    let mut p = plan(GPT, 2, Strategy::FullShard, Optimizer::adamw(1e-2));
    p.instructions
        .retain(|i| !matches!(i.op, fsdpc_plan::InstrOp::AllGather { .. }));
    let expected = p.validate().expect_err("the plan is broken");
    let opts = TrainOptions {
        steps: 1,
        ..TrainOptions::default()
    };
    assert_eq!(invalid(train(&p, &opts, &mut |_| {})), expected);
    let data = open(&DataSpec::Synthetic, &p.training.graph, 0).unwrap();
    let mut steps = 0;
    let r = train_with_data(&p, &opts, data, &mut |_| steps += 1);
    assert_eq!(invalid(r), expected);
    assert_eq!(steps, 0, "nothing of an invalid plan runs");
    let message = RuntimeError::InvalidPlan {
        violations: expected.clone(),
    }
    .to_string();
    assert!(
        message.contains(&format!("{} violation(s)", expected.len()))
            && message.contains(&expected[0].to_string()),
        "{message}"
    );
}

/// The ranks a collective timeout names as not arriving, from its message
/// (`... no answer from rank(s) 0, 1)`).
fn unanswered(e: &str) -> Vec<&str> {
    e.split("no answer from rank(s) ")
        .nth(1)
        .map(|t| {
            t.split(|c: char| !c.is_ascii_digit() && c != ',' && c != ' ')
                .next()
                .unwrap_or("")
                .split(", ")
                .map(str::trim)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_rank_that_stops_answering_is_named_within_the_timeout() {
    use fsdpc_runtime::fault::{Fault, FaultAction};
    for world in [2, 4] {
        let p = plan(GPT, world, Strategy::FullShard, Optimizer::adamw(1e-2));
        let opts = TrainOptions {
            steps: 5,
            comm_timeout: Duration::from_secs(1),
            fault: Some(Fault {
                rank: 1,
                action: FaultAction::Sleep,
                step: 1,
            }),
            ..TrainOptions::default()
        };
        let mut done = 0;
        // Step 1 is reported once every rank finished it, just before rank
        // 1 stops answering.
        let mut fault_at = Instant::now();
        let r = train(&p, &opts, &mut |_| {
            done += 1;
            fault_at = Instant::now();
        });
        let took = fault_at.elapsed();
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        // The sleeping rank is named. At world 4 a live rank blocked in
        // another stream's collective on it may be named beside it: the
        // timeout sees only who did not arrive.
        assert!(unanswered(&e).contains(&"1"), "world {world}: {e}");
        assert_eq!(done, 2, "the steps up to the fault complete");
        println!("world {world}: a sleeping thread rank stopped every rank {took:?} after the fault ({e})");
        assert!(took < Duration::from_secs(10), "took {took:?}");
    }
}

/// A rank that never returns (`hang`, as one stuck in a kernel would) does
/// not keep `train` waiting: it comes back within the timeout (the others
/// give up) plus one more (the grace for the ranks to stop), naming it.
#[test]
fn a_rank_that_never_returns_is_abandoned_and_named() {
    use fsdpc_runtime::fault::{Fault, FaultAction};
    for world in [2, 4] {
        let p = plan(GPT, world, Strategy::FullShard, Optimizer::adamw(1e-2));
        let opts = TrainOptions {
            steps: 5,
            comm_timeout: Duration::from_secs(1),
            fault: Some(Fault {
                rank: 1,
                action: FaultAction::Hang,
                step: 1,
            }),
            ..TrainOptions::default()
        };
        let mut fault_at = Instant::now();
        let r = train(&p, &opts, &mut |_| fault_at = Instant::now());
        let took = fault_at.elapsed();
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("rank 1 failed: did not stop within 1s"),
            "world {world}: {e}"
        );
        // As above, a live rank blocked on the hung one may be named
        // beside it at world 4.
        assert!(unanswered(&e).contains(&"1"), "world {world}: {e}");
        println!("world {world}: a hung thread rank abandoned {took:?} after the fault ({e})");
        // The timeout and the grace are one second each. The step's report
        // reaches this thread after the live ranks may already have entered
        // the next collective, so under load the clock here starts a little
        // late: the lower bound proves both waits ran, with slack for that.
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
            "took {took:?}"
        );
    }
}
