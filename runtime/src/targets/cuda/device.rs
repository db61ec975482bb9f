//! One GPU: its context, the kernels loaded from NVRTC cubins for its
//! architecture, and the way a kernel is launched (`Launch`: a function
//! name, a grid, and arguments that are plain values or pointers).

use super::error::CudaError;
use super::geometry::{Geo, RGeo, Win};
use super::libs::{self, Library};
use super::nvrtc;
use super::sources::ALL;
use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

// SAFETY: `Geo`, `RGeo` and `Win` are `repr(C)` with the layout of the C
// structs of the same names; a kernel receives them by value.
unsafe impl DeviceRepr for Geo {}
unsafe impl DeviceRepr for RGeo {}
unsafe impl DeviceRepr for Win {}

/// An opened GPU with every kernel loaded.
pub struct Device {
    /// The device's primary context.
    pub ctx: Arc<CudaContext>,
    /// Compute capability, `10 * major + minor`.
    pub cc: u32,
    /// The device's name.
    pub name: String,
    funcs: HashMap<&'static str, CudaFunction>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({}, sm_{})", self.name, self.cc)
    }
}

/// How many GPUs the driver sees (an error when the driver is missing).
pub fn device_count() -> Result<usize, CudaError> {
    libs::ensure(Library::Driver)?;
    result::init().map_err(|e| CudaError::NoDevice {
        reason: format!("cuInit failed: {e}"),
    })?;
    let n = result::device::get_count()?;
    Ok(n.max(0) as usize)
}

impl Device {
    /// Opens GPU `ordinal`, compiles (once per process) and loads every
    /// kernel file for its architecture.
    pub fn open(ordinal: usize) -> Result<Device, CudaError> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(CudaError::NoDevice {
                reason: format!("device {ordinal} asked for, the driver sees {n}"),
            });
        }
        let ctx = CudaContext::new(ordinal)?;
        // The plan orders every access through its events; cudarc's own
        // per-allocation tracking would only add waits.
        // SAFETY: no cudarc-tracked allocation exists yet.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability()?;
        let cc = (major * 10 + minor) as u32;
        let name = ctx.name()?;
        // NVRTC compiles the files in parallel (the first device of the
        // process; later ones reuse the cubins).
        let bins: Vec<_> = ALL
            .par_iter()
            .map(|f| nvrtc::cubin_cached(f, cc))
            .collect::<Result<_, _>>()?;
        let mut funcs = HashMap::new();
        for (f, bin) in ALL.iter().zip(bins) {
            let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bin.to_vec()))?;
            for k in f.kernels {
                funcs.insert(*k, module.load_function(k)?);
            }
        }
        Ok(Device {
            ctx,
            cc,
            name,
            funcs,
        })
    }

    /// The kernel `name`.
    pub fn func(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.funcs.get(name).ok_or_else(|| CudaError::Kernel {
            node: "-".into(),
            op: name.into(),
            reason: "no such kernel is loaded".into(),
        })
    }

    /// Free and total device memory, bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Device memory in use (by this process and any other), bytes.
    pub fn used_bytes(&self) -> Result<u64, CudaError> {
        let (free, total) = self.mem_info()?;
        Ok((total - free) as u64)
    }

    /// Launches `l` on `stream`, resolving its pointers with `ptr`.
    pub fn launch(
        &self,
        stream: &CudaStream,
        l: &Launch,
        ptr: &dyn Fn(Ptr) -> u64,
    ) -> Result<(), CudaError> {
        let f = self.func(l.kernel)?;
        // Resolved first so the builder can borrow them.
        let vals: Vec<Val> = l
            .args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => Val::U64(ptr(p)),
                Arg::I64(v) => Val::I64(v),
                Arg::I32(v) => Val::I32(v),
                Arg::U64(v) => Val::U64(v),
                Arg::F32(v) => Val::F32(v),
                Arg::F64(v) => Val::F64(v),
                Arg::Geo(g) => Val::Geo(g),
                Arg::RGeo(g) => Val::RGeo(g),
                Arg::Win(g) => Val::Win(g),
            })
            .collect();
        let mut b = stream.launch_builder(f);
        for v in &vals {
            match v {
                Val::U64(x) => b.arg(x),
                Val::I64(x) => b.arg(x),
                Val::I32(x) => b.arg(x),
                Val::F32(x) => b.arg(x),
                Val::F64(x) => b.arg(x),
                Val::Geo(x) => b.arg(x),
                Val::RGeo(x) => b.arg(x),
                Val::Win(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: (l.block, 1, 1),
            shared_mem_bytes: l.smem,
        };
        // SAFETY: every launch is built by `ops` for the kernel it names,
        // its arguments in the kernel's order and types, its pointers inside
        // regions `resolve` checked against the arena.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

/// A device address a launch refers to, resolved when it is issued.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Ptr {
    /// An absolute device address (0: a null pointer).
    Abs(u64),
    /// `off` bytes into the issuing stream's private scratch.
    Scratch(u64),
    /// The issuing stream's error word.
    Err,
}

/// One kernel argument.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Arg {
    /// A pointer.
    Ptr(Ptr),
    /// `long long`.
    I64(i64),
    /// `int`.
    I32(i32),
    /// `unsigned long long`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// A `Geo` by value.
    Geo(Geo),
    /// An `RGeo` by value.
    RGeo(RGeo),
    /// A `Win` by value.
    Win(Win),
}

enum Val {
    U64(u64),
    I64(i64),
    I32(i32),
    F32(f32),
    F64(f64),
    Geo(Geo),
    RGeo(RGeo),
    Win(Win),
}

/// A kernel launch, fully decided before the first step.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The kernel's name.
    pub kernel: &'static str,
    /// Blocks.
    pub grid: (u32, u32, u32),
    /// Threads per block (one dimension).
    pub block: u32,
    /// Dynamic shared memory, bytes.
    pub smem: u32,
    /// Arguments in the kernel's order.
    pub args: Vec<Arg>,
}

/// Threads per block of the element-wise kernels.
pub const THREADS: u32 = 256;

/// Blocks for a grid-stride loop over `n` elements (capped: each thread
/// then loops).
pub fn blocks_for(n: u64) -> u32 {
    n.div_ceil(THREADS as u64).clamp(1, 65_535 * 16) as u32
}

/// `blocks_for(n)`, or 0 (no launch) when there are no elements.
pub fn grid_for(n: u64) -> u32 {
    if n == 0 {
        0
    } else {
        blocks_for(n)
    }
}

/// The device address of `bytes` free memory of the driver's view,
/// allocated once with `cuMemAlloc` and freed on drop.
pub struct DeviceAlloc {
    /// Its base address.
    pub ptr: u64,
    /// Its size in bytes.
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceAlloc {
    /// One allocation of `bytes` (at least 1) on `ctx`'s device.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceAlloc, CudaError> {
        ctx.bind_to_thread()?;
        // SAFETY: a plain allocation; freed once in `drop`.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }?;
        Ok(DeviceAlloc {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `new`; the owner synchronised the device.
            let _ = unsafe { result::free_sync(self.ptr as sys::CUdeviceptr) };
        }
    }
}
