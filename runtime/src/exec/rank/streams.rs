//! How a rank runs a step: arena mode's stream threads (made once, started
//! together each step, joined at its end) and debug mode's serial loop in
//! list order with one allocation per buffer.

use super::*;

/// What `run_arena` calls after each step: `(step, time, eval)`, `eval(j)`
/// running evaluation batch `j`.
pub type AfterStep<'f> = dyn FnMut(
        u64,
        Duration,
        &mut dyn FnMut(u64) -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError>
    + 'f;

impl<'a> RankEnv<'a> {
    /// Runs one stream's instructions of a pass, in list order (a traced
    /// step's with their spans).
    pub(in crate::exec) fn run_stream(
        &self,
        mem: &Memory,
        k: usize,
        pass: Pass,
    ) -> Result<(), RuntimeError> {
        let res = catch_unwind(AssertUnwindSafe(|| {
            let end = self.pass_end(pass)?;
            let mine = self.prep.streams[k].1.iter().take_while(|&&i| i < end);
            let traced = match pass {
                Pass::Step(step) => self.trace.as_ref().filter(|t| t.traces(step)),
                Pass::Eval(_) => None,
            };
            let (Some(rec), Some(mut spans)) = (traced, traced.and_then(|t| t.stream(k))) else {
                for &i in mine {
                    self.exec(mem, i, pass)?;
                }
                return Ok(());
            };
            for &i in mine {
                let start = rec.now_ns();
                self.exec(mem, i, pass)?;
                rec.push(&mut spans, i, pass.index(), start);
            }
            Ok(())
        }))
        .unwrap_or_else(|p| {
            Err(RuntimeError::RankFailed {
                rank: self.rank,
                reason: format!("panic: {}", panic_text(&*p)),
            })
        });
        if let Err(e) = &res {
            if let RuntimeError::RankFailed { rank, reason } = e {
                if *rank == self.rank {
                    self.world.poison(*rank, reason);
                }
            }
            self.fail(e);
        }
        res
    }

    /// Arena mode: runs the steps of the range `steps` with one thread per
    /// stream, created once; every pass the streams start together and join
    /// at its end. After each step `after_step(step, time, eval)` runs while
    /// no stream does, `time` being the step's wall time on this rank (its
    /// streams' start to their join); `eval(j)` runs evaluation batch `j`
    /// (`Pass::Eval`) on the same threads and returns when it is done. The
    /// stream threads and, once they are started, the calling rank thread
    /// carry the accounting tag `tag` (`account::RankTag`): starting the
    /// threads (their handles, made once per run) is the one allocation of
    /// the run that is not the rank's.
    pub fn run_arena(
        &self,
        mem: &Memory,
        steps: std::ops::Range<u64>,
        tag: Option<usize>,
        after_step: &mut AfterStep,
    ) -> Result<(), RuntimeError> {
        let live = |k: &usize| !self.prep.streams[*k].1.is_empty();
        let is_compute = |k: &usize| self.prep.streams[*k].0 == Stream::Compute;
        let compute = (0..self.prep.streams.len()).find(|k| live(k) && is_compute(k));
        let helpers: SmallVec<[usize; 4]> = (0..self.prep.streams.len())
            .filter(|k| live(k) && !is_compute(k))
            .collect();
        let start = Barrier::new(helpers.len() + 1);
        let end = Barrier::new(helpers.len() + 1);
        let stop = AtomicBool::new(false);
        let current = AtomicU64::new(0);
        let evaluating = AtomicBool::new(false);
        let errors: SmallVec<[Mutex<Option<RuntimeError>>; 4]> =
            helpers.iter().map(|_| Mutex::new(None)).collect();
        let pass_of = |index: u64, eval: bool| {
            if eval {
                Pass::Eval(index)
            } else {
                Pass::Step(index)
            }
        };
        std::thread::scope(|s| {
            for (&k, slot) in helpers.iter().zip(&errors) {
                let (start, end, stop) = (&start, &end, &stop);
                let (current, evaluating) = (&current, &evaluating);
                s.spawn(move || {
                    let _tag = tag.map(RankTag::enter);
                    loop {
                        start.wait();
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        let pass = pass_of(
                            current.load(Ordering::Acquire),
                            evaluating.load(Ordering::Acquire),
                        );
                        if let Err(e) = self.run_stream(mem, k, pass) {
                            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        }
                        end.wait();
                    }
                });
            }
            let _tag = tag.map(RankTag::enter);
            // One pass on every stream, from the start barrier to the end one.
            let run_pass = |pass: Pass| {
                self.events.reset();
                current.store(pass.index(), Ordering::Release);
                evaluating.store(matches!(pass, Pass::Eval(_)), Ordering::Release);
                start.wait();
                let mine = compute.map_or(Ok(()), |k| self.run_stream(mem, k, pass));
                end.wait();
                self.step_result(mine, &errors)
            };
            let mut out = Ok(());
            for step in steps {
                let began = Instant::now();
                let done = run_pass(Pass::Step(step));
                let time = began.elapsed();
                out = done.and_then(|()| after_step(step, time, &mut |j| run_pass(Pass::Eval(j))));
                if out.is_err() {
                    break;
                }
            }
            stop.store(true, Ordering::Release);
            start.wait();
            out
        })
    }

    /// The result of a step from the compute stream's and the helper
    /// streams' outcomes (allocating only when one failed).
    pub(in crate::exec) fn step_result(
        &self,
        mine: Result<(), RuntimeError>,
        errors: &[Mutex<Option<RuntimeError>>],
    ) -> Result<(), RuntimeError> {
        let mut helper_errs = errors
            .iter()
            .filter_map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).take())
            .peekable();
        if mine.is_ok() && helper_errs.peek().is_none() {
            return Ok(());
        }
        let all: Vec<Result<(), RuntimeError>> =
            std::iter::once(mine).chain(helper_errs.map(Err)).collect();
        first_error(all)
    }

    /// Debug mode: every instruction of the pass serially in list order,
    /// each buffer allocated just before its first write and dropped at its
    /// `Free`; after an evaluation prefix, the buffers it left live too.
    pub fn pass_debug(&self, mem: &mut Memory, pass: Pass) -> Result<(), RuntimeError> {
        self.events.reset();
        let rec = match pass {
            Pass::Step(step) => self.trace.as_ref().filter(|t| t.traces(step)),
            Pass::Eval(_) => None,
        };
        let res = catch_unwind(AssertUnwindSafe(|| {
            let end = self.pass_end(pass)?;
            for i in 0..end {
                let start = rec.map(|t| t.now_ns());
                for &b in &self.prep.starts[i] {
                    mem.alloc(b);
                }
                match &self.prep.steps[i] {
                    Step::Free(b) => mem.free(*b),
                    Step::Wait(e) if !self.events.is_recorded(*e) => {
                        return Err(RuntimeError::plan_at(
                            i,
                            format!("waits on event {e}, which is recorded later in list order"),
                        ));
                    }
                    _ => self.exec(mem, i, pass)?,
                }
                if let (Some(t), Some(start)) = (rec, start) {
                    if let Some(mut spans) = t.stream(t.stream_of(i)) {
                        t.push(&mut spans, i, pass.index(), start);
                    }
                }
            }
            for b in self.prep.starts[..end].iter().flatten() {
                mem.free(*b);
            }
            Ok(())
        }))
        .unwrap_or_else(|p| {
            Err(RuntimeError::RankFailed {
                rank: self.rank,
                reason: format!("panic: {}", panic_text(&*p)),
            })
        });
        if let Err(e) = &res {
            self.fail(e);
        }
        res
    }
}
