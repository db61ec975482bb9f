//! Compiling the kernel files with NVRTC: to PTX for a virtual
//! architecture (`compute_90`) or to a cubin for a real one (`sm_90`; NVRTC
//! runs ptxas itself, so register and shared-memory limits are checked).
//! NVRTC needs no driver and no GPU. The executor loads cubins for the
//! device's own architecture, compiled once per process and file
//! (`cubin_cached`), so the driver never JIT-compiles PTX newer than it
//! understands.

use super::error::CudaError;
use super::libs::{self, Library};
use super::sources::KernelFile;
use cudarc::nvrtc::{result, sys};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// What to compile for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// PTX for `compute_<cc>` (cc = 10 * major + minor).
    Ptx(u32),
    /// A cubin for `sm_<cc>`.
    Cubin(u32),
}

impl Target {
    fn option(self) -> String {
        match self {
            Target::Ptx(cc) => format!("--gpu-architecture=compute_{cc}"),
            Target::Cubin(cc) => format!("--gpu-architecture=sm_{cc}"),
        }
    }

    /// `compute_90` / `sm_90`.
    pub fn name(self) -> String {
        match self {
            Target::Ptx(cc) => format!("compute_{cc}"),
            Target::Cubin(cc) => format!("sm_{cc}"),
        }
    }
}

/// NVRTC's version, loading the library first (`libs::ensure`).
pub fn version() -> Result<(i32, i32), CudaError> {
    libs::ensure(Library::Nvrtc)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program`, destroyed once. A failure to
        // free compiler memory is not worth a panic.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// Compiles `file` for `target`: the PTX text or the cubin bytes.
pub fn compile(file: &KernelFile, target: Target) -> Result<Vec<u8>, CudaError> {
    libs::ensure(Library::Nvrtc)?;
    let bad = |what: &str| CudaError::Compile {
        file: file.name.into(),
        arch: target.name(),
        log: what.into(),
    };
    let src = CString::new(file.source()).map_err(|_| bad("the source holds a NUL byte"))?;
    let name = CString::new(file.name).map_err(|_| bad("the file name holds a NUL byte"))?;
    let prog = Program(result::create_program(&src, Some(&name))?);
    let opts = [target.option(), "--std=c++14".to_string()];
    // SAFETY: `prog` is live; the options are plain ASCII.
    if let Err(e) = unsafe { result::compile_program(prog.0, &opts) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| text(&l))
            .unwrap_or_else(|_| format!("{e} (no log)"));
        return Err(bad(&log));
    }
    match target {
        // SAFETY: compiled above.
        Target::Ptx(_) => Ok(unsafe { result::get_ptx(prog.0) }?
            .into_iter()
            .map(|c| c as u8)
            .collect()),
        Target::Cubin(_) => {
            let mut size = 0usize;
            // SAFETY: compiled above; the buffer is `size` bytes.
            unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }.result()?;
            let mut out = vec![0u8; size];
            unsafe { sys::nvrtcGetCUBIN(prog.0, out.as_mut_ptr() as *mut c_char) }.result()?;
            Ok(out)
        }
    }
}

/// The cubin of `file` for `sm_<cc>`, compiled once per process.
pub fn cubin_cached(file: &KernelFile, cc: u32) -> Result<Arc<Vec<u8>>, CudaError> {
    type Cache = Mutex<HashMap<(&'static str, u32), Arc<Vec<u8>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(file.name, cc))
    {
        return Ok(c.clone());
    }
    let bin = Arc::new(compile(file, Target::Cubin(cc))?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((file.name, cc), bin.clone());
    Ok(bin)
}

/// A NUL-terminated C string buffer as text.
fn text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}
