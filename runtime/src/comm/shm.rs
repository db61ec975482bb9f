//! Shared-memory collectives for ranks that are threads of one process.
//!
//! Protocol of one collective on a group of n members:
//! 1. **post** — each member publishes the address and length of its buffers
//!    and waits until all n have posted (barrier A);
//! 2. **work** — each member reads the other members' buffers directly and
//!    writes only memory no other member touches during this phase (its own
//!    receive buffer, or — for all-reduce — its own `1/n` chunk of every
//!    member's buffer);
//! 3. **done** — each member waits until all n have finished reading
//!    (barrier B), so no buffer is reused while another member reads it.
//!
//! Failure: a rank that fails poisons the world (`ShmWorld::poison`). A member
//! waiting in barrier A withdraws and returns `RankFailed` naming the first
//! failed rank, within one poll interval; a wait longer than the timeout
//! withdraws, poisons the world and returns `Timeout`. Barrier B is only ever
//! waited for by members that all passed barrier A and whose work phase
//! cannot block (a panic in it is caught), so it completes; its timeout is a
//! safety net. Withdrawal happens under the group lock, so a member either
//! leaves before the barrier completes (and nobody reads its buffers) or
//! takes part in the whole collective.

use super::{Buf, BufMut, Communicator, GatherCalls, World};
use crate::error::CommError;
use crate::tensor::{load_f64, store_f64};
use fsdpc_ir::DType;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a blocked member re-checks for a failed rank.
const POLL: Duration = Duration::from_millis(20);

/// Settings of the shared-memory communicators.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CommConfig {
    /// How long a member waits for the others before giving up.
    pub timeout: Duration,
}

impl Default for CommConfig {
    fn default() -> CommConfig {
        CommConfig {
            timeout: Duration::from_secs(60),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A group's member ranks and tag.
type GroupKey = (Vec<usize>, String);

/// All ranks of one process: the poison flag and the groups.
#[derive(Debug)]
pub struct ShmWorld {
    world: usize,
    cfg: CommConfig,
    poisoned: AtomicBool,
    failure: Mutex<Option<(usize, String)>>,
    groups: Mutex<HashMap<GroupKey, Arc<Group>>>,
}

impl ShmWorld {
    /// A world of `world` ranks.
    pub fn new(world: usize, cfg: CommConfig) -> Arc<ShmWorld> {
        Arc::new(ShmWorld {
            world,
            cfg,
            poisoned: AtomicBool::new(false),
            failure: Mutex::new(None),
            groups: Mutex::new(HashMap::new()),
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The settings.
    pub fn config(&self) -> CommConfig {
        self.cfg
    }

    /// The communicator of `rank` on the group `ranks` (in position order),
    /// one per `tag` (e.g. one per stream) so collectives with different tags
    /// can run concurrently.
    pub fn communicator(
        self: &Arc<Self>,
        ranks: &[usize],
        tag: &str,
        rank: usize,
    ) -> Result<ShmComm, CommError> {
        let pos = ranks
            .iter()
            .position(|&r| r == rank)
            .ok_or_else(|| CommError::Mismatch {
                op: "communicator".into(),
                reason: format!("rank {rank} is not in group {ranks:?}"),
            })?;
        if ranks.iter().any(|&r| r >= self.world) {
            return Err(CommError::Mismatch {
                op: "communicator".into(),
                reason: format!(
                    "group {ranks:?} names a rank outside a world of {}",
                    self.world
                ),
            });
        }
        // The group table is every member's: no rank is charged for it
        // (the first to arrive would be, at random).
        let group = {
            let _shared = crate::account::RankTag::none();
            lock(&self.groups)
                .entry((ranks.to_vec(), tag.to_string()))
                .or_insert_with(|| Arc::new(Group::new(ranks.len())))
                .clone()
        };
        let posts = Mutex::new(Vec::with_capacity(ranks.len()));
        Ok(ShmComm {
            world: self.clone(),
            group,
            pos,
            rank,
            ranks: ranks.to_vec(),
            posts,
        })
    }

    /// Marks `rank` as failed; the first failure is the one reported.
    pub fn poison(&self, rank: usize, reason: &str) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some((rank, reason.to_string()));
        }
        self.poisoned.store(true, Ordering::SeqCst);
    }

    /// The first failure, if any.
    pub fn failure(&self) -> Option<(usize, String)> {
        if !self.poisoned.load(Ordering::SeqCst) {
            return None;
        }
        lock(&self.failure).clone()
    }

    fn failed_err(&self) -> Option<CommError> {
        self.failure()
            .map(|(rank, reason)| CommError::RankFailed { rank, reason })
    }
}

/// One member's published buffers (addresses as integers so they can be
/// shared; only dereferenced between barriers A and B).
#[derive(Copy, Clone, Debug)]
struct Post {
    op: &'static str,
    send: usize,
    send_len: usize,
    send_dt: DType,
    recv: usize,
    recv_len: usize,
    recv_dt: DType,
}

impl Post {
    fn new(op: &'static str) -> Post {
        Post {
            op,
            send: 0,
            send_len: 0,
            send_dt: DType::F32,
            recv: 0,
            recv_len: 0,
            recv_dt: DType::F32,
        }
    }
}

#[derive(Debug)]
struct GroupState {
    gen: u64,
    arrived: usize,
    /// Which members are waiting in the current barrier.
    present: Vec<bool>,
    posts: Vec<Post>,
    broken: Option<String>,
}

/// The shared state of one group.
#[derive(Debug)]
pub struct Group {
    n: usize,
    state: Mutex<GroupState>,
    cv: Condvar,
}

impl Group {
    fn new(n: usize) -> Group {
        Group {
            n,
            state: Mutex::new(GroupState {
                gen: 0,
                arrived: 0,
                present: vec![false; n],
                posts: vec![Post::new(""); n],
                broken: None,
            }),
            cv: Condvar::new(),
        }
    }
}

/// A rank's handle on one group.
#[derive(Debug)]
pub struct ShmComm {
    world: Arc<ShmWorld>,
    group: Arc<Group>,
    pos: usize,
    rank: usize,
    /// World ranks of the members, in position order.
    ranks: Vec<usize>,
    /// The members' posts of the current collective, copied out of the
    /// group (room for every member, made once: a collective allocates
    /// nothing).
    posts: Mutex<Vec<Post>>,
}

/// Which barrier a member waits in.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Phase {
    Post,
    Done,
}

impl ShmComm {
    /// Arrives at a barrier (publishing `post` in phase A) and waits for the
    /// other members. Copies the posts of the completed generation into
    /// `out`, when given.
    fn barrier_wait(
        &self,
        post: Post,
        phase: Phase,
        out: Option<&mut Vec<Post>>,
    ) -> Result<(), CommError> {
        let copy = |posts: &[Post], out: Option<&mut Vec<Post>>| {
            if let Some(o) = out {
                o.clear();
                o.extend_from_slice(posts);
            }
        };
        let g = &self.group;
        let mut st = lock(&g.state);
        if phase == Phase::Post {
            if let Some(e) = self.world.failed_err() {
                return Err(e);
            }
            if let Some(b) = &st.broken {
                return Err(CommError::RankFailed {
                    rank: self.rank,
                    reason: b.clone(),
                });
            }
            st.posts[self.pos] = post;
        }
        let my_gen = st.gen;
        st.arrived += 1;
        st.present[self.pos] = true;
        if st.arrived == g.n {
            st.arrived = 0;
            st.present.fill(false);
            st.gen += 1;
            g.cv.notify_all();
            copy(&st.posts, out);
            return Ok(());
        }
        let start = Instant::now();
        loop {
            let left = self.world.cfg.timeout.saturating_sub(start.elapsed());
            st =
                g.cv.wait_timeout(st, left.min(POLL))
                    .map(|r| r.0)
                    .unwrap_or_else(|e| e.into_inner().0);
            if st.gen != my_gen {
                copy(&st.posts, out);
                return Ok(());
            }
            let failed = if phase == Phase::Post {
                self.world.failed_err()
            } else {
                None
            };
            let timed_out = start.elapsed() >= self.world.cfg.timeout;
            if failed.is_some() || timed_out {
                st.arrived -= 1;
                st.present[self.pos] = false;
                let missing = (0..g.n)
                    .filter(|&q| q != self.pos && !st.present[q])
                    .map(|q| self.ranks[q])
                    .collect();
                let err = failed.unwrap_or_else(|| CommError::Timeout {
                    op: post.op.to_string(),
                    waited: start.elapsed(),
                    missing,
                });
                st.broken = Some(err.to_string());
                drop(st);
                if timed_out {
                    self.world.poison(self.rank, &err.to_string());
                }
                return Err(err);
            }
        }
    }

    /// Runs one collective: post, work (panics caught), done.
    fn collective(
        &self,
        post: Post,
        work: impl FnOnce(&[Post]) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let mut posts = lock(&self.posts);
        self.barrier_wait(post, Phase::Post, Some(&mut posts))?;
        let res = if posts.iter().any(|p| p.op != post.op) {
            Err(mismatch(
                post.op,
                format!(
                    "members called different collectives: {:?}",
                    posts.iter().map(|p| p.op).collect::<Vec<_>>()
                ),
            ))
        } else {
            catch_unwind(AssertUnwindSafe(|| work(&posts)))
                .unwrap_or_else(|_| Err(mismatch(post.op, "the collective panicked".into())))
        };
        self.barrier_wait(Post::new(post.op), Phase::Done, None)?;
        res
    }
}

fn mismatch(op: &str, reason: String) -> CommError {
    CommError::Mismatch {
        op: op.to_string(),
        reason,
    }
}

/// The bytes member `p` posted to send.
///
/// SAFETY (for this and `recv_of`): called only in the work phase, between
/// barriers A and B, while every member is blocked inside this collective and
/// so keeps its posted buffers alive and untouched; writes go only to memory
/// that no other member accesses during the phase (see the module header).
unsafe fn send_of<'a>(p: &Post) -> &'a [u8] {
    std::slice::from_raw_parts(p.send as *const u8, p.send_len * p.send_dt.size())
}

/// Elements `start..start + len` of member `p`'s receive buffer, writable.
unsafe fn recv_of<'a>(p: &Post, start: usize, len: usize) -> &'a mut [u8] {
    let es = p.recv_dt.size();
    std::slice::from_raw_parts_mut((p.recv as *mut u8).add(start * es), len * es)
}

/// The post of an in-place collective: `buf` is both what is sent and where
/// the result lands.
fn in_place_post(op: &'static str, buf: &BufMut<'_>) -> Post {
    let addr = buf.bytes.as_ptr() as usize;
    Post {
        op,
        send: addr,
        send_len: buf.len(),
        send_dt: buf.dtype,
        recv: addr,
        recv_len: buf.len(),
        recv_dt: buf.dtype,
    }
}

fn send_post(
    op: &'static str,
    send: &Buf<'_>,
    recv_addr: usize,
    recv_len: usize,
    recv_dt: DType,
) -> Post {
    Post {
        op,
        send: send.bytes.as_ptr() as usize,
        send_len: send.len(),
        send_dt: send.dtype,
        recv: recv_addr,
        recv_len,
        recv_dt,
    }
}

/// Copies `src` (dtype `sdt`) into `dst` (dtype `ddt`), converting.
pub(super) fn convert(src: &[u8], sdt: DType, dst: &mut [u8], ddt: DType) {
    if sdt == ddt {
        dst.copy_from_slice(src);
        return;
    }
    if crate::cpu::kernels::cast::convert_floats(src, sdt, dst, ddt) {
        return;
    }
    for i in 0..dst.len() / ddt.size() {
        store_f64(ddt, dst, i, load_f64(sdt, src, i));
    }
}

/// `dst[i] = (((x0[i] + x1[i]) + x2[i]) + ...) / d` in f32, where `x0` is
/// `first`, or `dst` itself when `first` is `None`, and `x1..` are
/// `rest(0..n_rest)` (a function, so a collective collects no list).
pub(super) fn reduce_into<'a>(
    first: Option<(&[u8], DType)>,
    n_rest: usize,
    rest: impl Fn(usize) -> (&'a [u8], DType),
    dst: &mut [u8],
    ddt: DType,
    d: u32,
) {
    let f32s = |b: &'a [u8], t: DType| {
        (t == DType::F32)
            .then(|| bytemuck::try_cast_slice::<u8, f32>(b).ok())
            .flatten()
    };
    let all_f32 = ddt == DType::F32
        && first.is_none_or(|f| f.1 == DType::F32)
        && (0..n_rest).all(|k| {
            let (b, t) = rest(k);
            f32s(b, t).is_some()
        });
    if all_f32 {
        if let Ok(out) = bytemuck::try_cast_slice_mut::<u8, f32>(dst) {
            if let Some(f) = first {
                bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(f.0);
            }
            for k in 0..n_rest {
                let (b, t) = rest(k);
                if let Some(x) = f32s(b, t) {
                    add_f32(out, x);
                }
            }
            divide_f32(out, d);
            return;
        }
    }
    // Mixed dtypes: the same sums in the same order, a chunk of elements
    // widened to f32 at a time.
    const CHUNK: usize = 1024;
    let n = dst.len() / ddt.size();
    let (mut acc, mut part) = ([0f32; CHUNK], [0f32; CHUNK]);
    for start in (0..n).step_by(CHUNK) {
        let len = CHUNK.min(n - start);
        let acc = &mut acc[..len];
        match first {
            Some((b, t)) => widen_into(b, t, start, acc),
            None => widen_into(dst, ddt, start, acc),
        }
        for k in 0..n_rest {
            let (b, t) = rest(k);
            let part = &mut part[..len];
            widen_into(b, t, start, part);
            acc.iter_mut().zip(part.iter()).for_each(|(a, x)| *a += x);
        }
        acc.iter_mut().for_each(|a| *a /= d as f32);
        let es = ddt.size();
        let out = &mut dst[start * es..(start + len) * es];
        convert(bytemuck::cast_slice(acc), DType::F32, out, ddt);
    }
}

/// Elements `start..start + out.len()` of `bytes` (dtype `dt`) as f32.
fn widen_into(bytes: &[u8], dt: DType, start: usize, out: &mut [f32]) {
    let es = dt.size();
    let src = &bytes[start * es..(start + out.len()) * es];
    convert(src, dt, bytemuck::cast_slice_mut(out), DType::F32);
}

fn add_f32(out: &mut [f32], x: &[f32]) {
    for (o, &v) in out.iter_mut().zip(x.iter()) {
        *o += v;
    }
}

fn divide_f32(out: &mut [f32], d: u32) {
    if d != 1 {
        let df = d as f32;
        for o in out.iter_mut() {
            *o /= df;
        }
    }
}

impl World for Arc<ShmWorld> {
    fn size(&self) -> usize {
        self.world
    }

    fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    fn communicator(
        &self,
        ranks: &[usize],
        tag: &str,
        rank: usize,
    ) -> Result<Box<dyn Communicator>, CommError> {
        ShmWorld::communicator(self, ranks, tag, rank).map(|c| Box::new(c) as Box<dyn Communicator>)
    }

    fn poison(&self, rank: usize, reason: &str) {
        ShmWorld::poison(self, rank, reason)
    }

    fn failure(&self) -> Option<(usize, String)> {
        ShmWorld::failure(self)
    }
}

impl Communicator for ShmComm {
    fn size(&self) -> usize {
        self.group.n
    }

    fn position(&self) -> usize {
        self.pos
    }

    /// A group of one pair (`all_gather_group`).
    fn all_gather(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<(), CommError> {
        self.all_gather_group(smallvec::smallvec![(send, recv)])
    }

    /// One rendezvous for every pair: each member posts the address of
    /// its list of pairs, and the work phase gathers pair c of every
    /// member into its own pair c's receive buffer (a plain `all_gather`
    /// is a list of one).
    fn all_gather_group(&self, calls: GatherCalls<'_>) -> Result<(), CommError> {
        let n = self.group.n;
        let items: SmallVec<[Post; 8]> = calls
            .iter()
            .map(|(send, recv)| {
                send_post(
                    "all_gather",
                    send,
                    recv.bytes.as_ptr() as usize,
                    recv.len(),
                    recv.dtype,
                )
            })
            .collect();
        let post = Post {
            send: items.as_ptr() as usize,
            send_len: items.len(),
            ..Post::new("all_gather")
        };
        let res = self.collective(post, |posts| {
            // SAFETY: each member's list lives until its call returns,
            // after barrier B.
            let lists: SmallVec<[&[Post]; 8]> = posts
                .iter()
                .map(|p| unsafe { std::slice::from_raw_parts(p.send as *const Post, p.send_len) })
                .collect();
            if lists.iter().any(|l| l.len() != items.len()) {
                return Err(mismatch(
                    "all_gather",
                    format!(
                        "members grouped {:?} gathers",
                        lists.iter().map(|l| l.len()).collect::<Vec<_>>()
                    ),
                ));
            }
            for (c, own) in items.iter().enumerate() {
                let s = lists[0][c].send_len;
                if lists.iter().any(|l| l[c].send_len != s) || own.recv_len != n * s {
                    return Err(mismatch(
                        "all_gather",
                        format!(
                            "gather {c}: send lengths {:?} do not fill a receive buffer of {}",
                            lists.iter().map(|l| l[c].send_len).collect::<Vec<_>>(),
                            own.recv_len
                        ),
                    ));
                }
                for (q, l) in lists.iter().enumerate() {
                    // SAFETY: see `send_of`; the receive range is this
                    // member's own.
                    let (src, dst) = unsafe { (send_of(&l[c]), recv_of(own, q * s, s)) };
                    convert(src, l[c].send_dt, dst, own.recv_dt);
                }
            }
            Ok(())
        });
        drop(calls);
        res
    }

    fn reduce_scatter(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        divide_by: u32,
    ) -> Result<(), CommError> {
        let n = self.group.n;
        let post = send_post(
            "reduce_scatter",
            &send,
            recv.bytes.as_mut_ptr() as usize,
            recv.len(),
            recv.dtype,
        );
        let me = self.pos;
        self.collective(post, |posts| {
            let t = posts[0].send_len;
            if posts.iter().any(|p| p.send_len != t) || t % n != 0 || post.recv_len != t / n {
                return Err(mismatch(
                    "reduce_scatter",
                    format!(
                        "send lengths {:?} and receive length {} are inconsistent for {n} members",
                        posts.iter().map(|p| p.send_len).collect::<Vec<_>>(),
                        post.recv_len
                    ),
                ));
            }
            let s = t / n;
            // SAFETY: see `send_of`; only the receive buffer (this member's) is written.
            let chunk = |p: &Post| unsafe {
                (
                    &send_of(p)[me * s * p.send_dt.size()..(me + 1) * s * p.send_dt.size()],
                    p.send_dt,
                )
            };
            let dst = unsafe { recv_of(&post, 0, s) };
            reduce_into(
                Some(chunk(&posts[0])),
                posts.len() - 1,
                |k| chunk(&posts[k + 1]),
                dst,
                post.recv_dt,
                divide_by,
            );
            Ok(())
        })
    }

    fn all_reduce(&self, buf: BufMut<'_>, divide_by: u32) -> Result<(), CommError> {
        let n = self.group.n;
        let post = in_place_post("all_reduce", &buf);
        let me = self.pos;
        self.collective(post, |posts| {
            let t = posts[0].recv_len;
            if posts
                .iter()
                .any(|p| p.recv_len != t || p.recv_dt != post.recv_dt)
            {
                return Err(mismatch(
                    "all_reduce",
                    "members' buffers differ in length or dtype".into(),
                ));
            }
            let (lo, hi) = (me * t / n, (me + 1) * t / n);
            // SAFETY: this member is the only one touching elements lo..hi of
            // any member's buffer during the work phase. Member 0's chunk is
            // the accumulator; it is read as a source before being written.
            let acc = unsafe { recv_of(&posts[0], lo, hi - lo) };
            let other = |k: usize| {
                let p = &posts[k + 1];
                unsafe { (&*recv_of(p, lo, hi - lo), p.recv_dt) }
            };
            reduce_into(None, posts.len() - 1, other, acc, post.recv_dt, divide_by);
            for p in &posts[1..] {
                let dst = unsafe { recv_of(p, lo, hi - lo) };
                dst.copy_from_slice(acc);
            }
            Ok(())
        })
    }

    fn all_to_all(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<(), CommError> {
        let n = self.group.n;
        let post = send_post(
            "all_to_all",
            &send,
            recv.bytes.as_mut_ptr() as usize,
            recv.len(),
            recv.dtype,
        );
        let me = self.pos;
        self.collective(post, |posts| {
            let t = posts[0].send_len;
            if posts
                .iter()
                .any(|p| p.send_len != t || p.send_dt != post.send_dt)
                || t % n != 0
                || post.recv_len != t
                || post.recv_dt != post.send_dt
            {
                return Err(mismatch(
                    "all_to_all",
                    format!(
                        "send lengths {:?} and receive length {} are inconsistent for {n} members",
                        posts.iter().map(|p| p.send_len).collect::<Vec<_>>(),
                        post.recv_len
                    ),
                ));
            }
            let (c, es) = (t / n, post.send_dt.size());
            for (q, p) in posts.iter().enumerate() {
                // SAFETY: see `send_of`; the receive range is this member's own.
                let (src, dst) = unsafe { (send_of(p), recv_of(&post, q * c, c)) };
                dst.copy_from_slice(&src[me * c * es..(me + 1) * c * es]);
            }
            Ok(())
        })
    }

    fn broadcast(&self, buf: BufMut<'_>, root: usize) -> Result<(), CommError> {
        let post = in_place_post("broadcast", &buf);
        let me = self.pos;
        self.collective(post, |posts| {
            let Some(r) = posts.get(root) else {
                return Err(mismatch(
                    "broadcast",
                    format!("root {root} is not a member"),
                ));
            };
            if r.send_len != post.recv_len || r.send_dt != post.recv_dt {
                return Err(mismatch(
                    "broadcast",
                    "buffers differ in length or dtype".into(),
                ));
            }
            if me != root {
                // SAFETY: the root's buffer is only read; this member writes its own.
                let (src, dst) = unsafe { (send_of(r), recv_of(&post, 0, post.recv_len)) };
                dst.copy_from_slice(src);
            }
            Ok(())
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.barrier_wait(Post::new("barrier"), Phase::Post, None)
    }
}
