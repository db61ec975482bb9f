//! How a rank runs a step: arena mode's stream threads (made once, started
//! together each step, joined at its end) and debug mode's serial loop in
//! list order with one allocation per buffer.

use super::*;

impl<'a> RankEnv<'a> {
    /// Runs one stream's instructions of a step, in list order.
    pub(in crate::exec) fn run_stream(
        &self,
        mem: &Memory,
        k: usize,
        step: u64,
    ) -> Result<(), RuntimeError> {
        let res = catch_unwind(AssertUnwindSafe(|| {
            let rec = self.trace.as_ref().filter(|t| t.traces(step));
            let (Some(rec), Some(mut spans)) = (rec, rec.and_then(|t| t.stream(k))) else {
                for &i in &self.prep.streams[k].1 {
                    self.exec(mem, i, step)?;
                }
                return Ok(());
            };
            for &i in &self.prep.streams[k].1 {
                let start = rec.now_ns();
                self.exec(mem, i, step)?;
                rec.push(&mut spans, i, step, start);
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

    /// Arena mode: runs the steps of the range `steps` with one thread per stream, created
    /// once; every step the streams start together and join at its end,
    /// then `after_step(step, time)` runs while no stream does, `time` being
    /// the step's wall time on this rank (its streams' start to their join). The stream threads
    /// and, once they are started, the calling rank thread carry the
    /// accounting tag `tag` (`account::RankTag`): starting the threads (their
    /// handles, made once per run) is the one allocation of the run that is
    /// not the rank's.
    pub fn run_arena(
        &self,
        mem: &Memory,
        steps: std::ops::Range<u64>,
        tag: Option<usize>,
        after_step: &mut dyn FnMut(u64, Duration) -> Result<(), RuntimeError>,
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
        let errors: SmallVec<[Mutex<Option<RuntimeError>>; 4]> =
            helpers.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for (&k, slot) in helpers.iter().zip(&errors) {
                let (start, end, stop, current) = (&start, &end, &stop, &current);
                s.spawn(move || {
                    let _tag = tag.map(RankTag::enter);
                    loop {
                        start.wait();
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        if let Err(e) = self.run_stream(mem, k, current.load(Ordering::Acquire)) {
                            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        }
                        end.wait();
                    }
                });
            }
            let _tag = tag.map(RankTag::enter);
            let mut out = Ok(());
            for step in steps {
                self.events.reset();
                current.store(step, Ordering::Release);
                let began = Instant::now();
                start.wait();
                let mine = compute.map_or(Ok(()), |k| self.run_stream(mem, k, step));
                end.wait();
                let time = began.elapsed();
                out = self
                    .step_result(mine, &errors)
                    .and_then(|()| after_step(step, time));
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

    /// Debug mode: every instruction serially in list order, each buffer
    /// allocated just before its first write and dropped at its `Free`.
    pub fn step_debug(&self, mem: &mut Memory, step: u64) -> Result<(), RuntimeError> {
        self.events.reset();
        let rec = self.trace.as_ref().filter(|t| t.traces(step));
        let res = catch_unwind(AssertUnwindSafe(|| {
            for i in 0..self.prep.steps.len() {
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
                    _ => self.exec(mem, i, step)?,
                }
                if let (Some(t), Some(start)) = (rec, start) {
                    if let Some(mut spans) = t.stream(t.stream_of(i)) {
                        t.push(&mut spans, i, step, start);
                    }
                }
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
