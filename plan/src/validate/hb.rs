//! Happens-before between instructions on the plan's streams, by vector
//! clocks. Instruction `a` happens before `b` when `b`'s stream has, by the
//! time it runs `b`, seen `a`'s stream reach `a` (same stream earlier in the
//! list, or through a chain of `Record`/`Wait`).

use crate::instr::{Instr, InstrOp, Stream};

/// Number of streams (`Stream::ALL`): one clock entry each.
const N: usize = Stream::ALL.len();

/// One vector clock per instruction.
#[derive(Clone, Debug)]
pub struct Clocks {
    /// Position of each instruction on its own stream, from 1.
    seq: Vec<u32>,
    /// What each instruction has seen of every stream.
    vc: Vec<[u32; N]>,
    stream: Vec<usize>,
}

impl Clocks {
    /// Clocks of `instrs`. A `Wait` on an event that has not been recorded
    /// earlier in the list (or is out of range) adds no ordering; the
    /// validator reports it.
    pub fn new(instrs: &[Instr], events: u32) -> Clocks {
        let mut now = [[0u32; N]; N];
        let mut event: Vec<Option<[u32; N]>> = vec![None; events as usize];
        let mut seq = Vec::with_capacity(instrs.len());
        let mut vc = Vec::with_capacity(instrs.len());
        let mut stream = Vec::with_capacity(instrs.len());
        for ins in instrs {
            let s = ins.stream.index();
            now[s][s] += 1;
            match ins.op {
                InstrOp::Wait { event: e } => {
                    if let Some(Some(c)) = event.get(e.index()) {
                        for k in 0..N {
                            now[s][k] = now[s][k].max(c[k]);
                        }
                    }
                }
                InstrOp::Record { event: e } => {
                    if let Some(slot) = event.get_mut(e.index()) {
                        *slot = Some(now[s]);
                    }
                }
                _ => {}
            }
            seq.push(now[s][s]);
            vc.push(now[s]);
            stream.push(s);
        }
        Clocks { seq, vc, stream }
    }

    /// True if instruction `a` happens before (or is) instruction `b`.
    pub fn hb(&self, a: usize, b: usize) -> bool {
        a == b || self.vc[b][self.stream[a]] >= self.seq[a]
    }

    /// The stream of instruction `i`.
    pub fn stream(&self, i: usize) -> Stream {
        Stream::ALL[self.stream[i]]
    }
}
