//! Finding the CUDA libraries. cudarc loads each library by name through
//! the system loader (`LD_LIBRARY_PATH`, the loader cache) and panics when
//! it is missing, so before any cudarc call `ensure` checks each library
//! with cudarc's own `is_culib_present` and, when the loader does not find
//! it, looks in these places, in order:
//!
//! 1. `FSDPC_CUDA_LIB_DIR`: directories (`:`-separated) holding the CUDA
//!    libraries; for NCCL, `FSDPC_NCCL_LIB`: the library file itself;
//! 2. where pip puts NVIDIA's wheels in the active Python's site-packages
//!    (`$VIRTUAL_ENV`, then `python3 -c 'import site; ...'`; `FSDPC_PYTHON`
//!    names another interpreter): `nvidia/cu13/lib` (nvrtc, cublas) and
//!    `nvidia/nccl/lib`.
//!
//! A library found there is loaded once by its full path; the loader then
//! knows it by its soname, which is one of the names cudarc asks for
//! (`libnvrtc.so.13`, `libcublas.so.13`). Not so NCCL: pip's file is
//! `libnccl.so.2` and cudarc asks for `libnccl.so`, which only a directory
//! on the loader's path can provide: `ensure` then makes a `libnccl.so`
//! link in `nccl_link_dir()` and says to put that directory on
//! `LD_LIBRARY_PATH` (the loader reads it once, at process start).
//! Absence is one `CudaError::LibraryMissing` naming the library, where
//! fsdpc looked and what to set.

use super::error::CudaError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A library the backend loads.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Library {
    /// The CUDA driver (`libcuda.so.1`, installed with the NVIDIA driver).
    Driver,
    /// The run-time compiler.
    Nvrtc,
    /// Dense linear algebra (needs `libcublasLt` beside it).
    Cublas,
    /// The collectives.
    Nccl,
}

impl Library {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Library::Driver => "libcuda (the NVIDIA driver)",
            Library::Nvrtc => "libnvrtc",
            Library::Cublas => "libcublas",
            Library::Nccl => "libnccl",
        }
    }

    /// File names to look for in a directory, preferred first.
    fn files(self) -> &'static [&'static str] {
        match self {
            Library::Driver => &["libcuda.so.1", "libcuda.so"],
            Library::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so"],
            Library::Cublas => &["libcublas.so.13", "libcublas.so"],
            Library::Nccl => &["libnccl.so.2", "libnccl.so"],
        }
    }

    /// Libraries to load by path before this one (its dependencies that the
    /// loader would not find from its directory).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by `ensure`
    fn companions(self) -> &'static [&'static str] {
        match self {
            Library::Cublas => &["libcublasLt.so.13"],
            _ => &[],
        }
    }

    /// The directory under site-packages where pip puts it.
    fn pip_dir(self) -> Option<&'static str> {
        match self {
            Library::Driver => None,
            Library::Nvrtc | Library::Cublas => Some("nvidia/cu13/lib"),
            Library::Nccl => Some("nvidia/nccl/lib"),
        }
    }

    /// What to tell the user when it is missing.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by `ensure`
    fn hint(self) -> String {
        match self {
            Library::Driver => "install the NVIDIA driver, or run on a machine with a GPU".into(),
            Library::Nvrtc => "pip install nvidia-cuda-nvrtc (CUDA 13), or set FSDPC_CUDA_LIB_DIR to the directory holding libnvrtc.so.13".into(),
            Library::Cublas => "pip install nvidia-cublas (CUDA 13), or set FSDPC_CUDA_LIB_DIR to the directory holding libcublas.so.13".into(),
            Library::Nccl => "pip install nvidia-nccl-cu13, or set FSDPC_NCCL_LIB to the libnccl.so.2 file".into(),
        }
    }
}

/// Directories of `FSDPC_CUDA_LIB_DIR`.
fn override_dirs() -> Vec<PathBuf> {
    std::env::var_os("FSDPC_CUDA_LIB_DIR")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default()
}

/// The site-packages directories of the active Python (computed once).
pub fn site_packages() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let mut dirs = Vec::new();
        if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
            let lib = Path::new(&venv).join("lib");
            if let Ok(entries) = std::fs::read_dir(&lib) {
                for e in entries.flatten() {
                    let p = e.path().join("site-packages");
                    if e.file_name().to_string_lossy().starts_with("python") && p.is_dir() {
                        dirs.push(p);
                    }
                }
            }
        }
        let python = std::env::var("FSDPC_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = "import site, sys\nfor p in site.getsitepackages() + [site.getusersitepackages()] + sys.path: print(p)";
        if let Ok(out) = std::process::Command::new(python)
            .args(["-c", script])
            .stderr(std::process::Stdio::null())
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let p = PathBuf::from(line.trim());
                if !line.trim().is_empty() && p.is_dir() && !dirs.contains(&p) {
                    dirs.push(p);
                }
            }
        }
        dirs
    })
}

/// The directories searched for `lib`, in order (existing or not).
pub fn search_dirs(lib: Library) -> Vec<PathBuf> {
    let mut dirs = override_dirs();
    if let Some(sub) = lib.pip_dir() {
        dirs.extend(site_packages().iter().map(|s| s.join(sub)));
    }
    dirs
}

/// The file of `lib` found outside the loader's path, if any.
pub fn find(lib: Library) -> Option<PathBuf> {
    if lib == Library::Nccl {
        if let Some(p) = std::env::var_os("FSDPC_NCCL_LIB").map(PathBuf::from) {
            return p.is_file().then_some(p);
        }
    }
    search_dirs(lib)
        .into_iter()
        .flat_map(|d| lib.files().iter().map(move |f| d.join(f)))
        .find(|p| p.is_file())
}

/// Where `ensure` links pip's `libnccl.so.2` as `libnccl.so`:
/// `FSDPC_CUDA_LINK_DIR`, else `fsdpc-cuda-libs` in the temporary
/// directory.
pub fn nccl_link_dir() -> PathBuf {
    std::env::var_os("FSDPC_CUDA_LINK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("fsdpc-cuda-libs"))
}

/// `LibraryMissing` for `lib`, naming where fsdpc looked.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by `ensure`
fn missing(lib: Library, hint: String) -> CudaError {
    let mut looked_in: Vec<String> = vec!["the loader's search path (LD_LIBRARY_PATH)".into()];
    looked_in.extend(search_dirs(lib).iter().map(|d| d.display().to_string()));
    if lib == Library::Nccl {
        looked_in.push("FSDPC_NCCL_LIB".into());
    }
    CudaError::LibraryMissing {
        library: lib.name(),
        looked_in,
        hint,
    }
}

/// Makes sure cudarc will find `lib`: Ok when its loader does, or once the
/// library found by `find` is loaded by path; else `LibraryMissing`.
#[cfg(feature = "cuda")]
pub fn ensure(lib: Library) -> Result<(), CudaError> {
    static DONE: OnceLock<std::sync::Mutex<Vec<Library>>> = OnceLock::new();
    let done = DONE.get_or_init(Default::default);
    let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
    if done.contains(&lib) {
        return Ok(());
    }
    if !present(lib) {
        let Some(path) = find(lib) else {
            return Err(missing(lib, lib.hint()));
        };
        if lib == Library::Nccl {
            return Err(missing(lib, nccl_link_hint(&path)));
        }
        preload(lib, &path)?;
        if !present(lib) {
            return Err(missing(
                lib,
                format!(
                    "{} was loaded but cudarc still does not find it under the names it asks for; put {} on LD_LIBRARY_PATH",
                    path.display(),
                    path.parent().map_or_else(String::new, |d| d.display().to_string())
                ),
            ));
        }
    }
    done.push(lib);
    Ok(())
}

/// Whether cudarc's loader finds `lib` by name.
#[cfg(feature = "cuda")]
fn present(lib: Library) -> bool {
    // SAFETY: each only tries to open the library by its candidate names.
    unsafe {
        match lib {
            Library::Driver => cudarc::driver::sys::is_culib_present(),
            Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
            Library::Cublas => cudarc::cublas::sys::is_culib_present(),
            Library::Nccl => cudarc::nccl::sys::is_culib_present(),
        }
    }
}

/// Loads `path` (and its companions from the same directory) for the rest
/// of the process.
#[cfg(feature = "cuda")]
fn preload(lib: Library, path: &Path) -> Result<(), CudaError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let files = lib
        .companions()
        .iter()
        .map(|c| dir.join(c))
        .filter(|p| p.is_file())
        .chain(std::iter::once(path.to_path_buf()));
    for f in files {
        // SAFETY: loading a shared library runs its initialisers; these are
        // NVIDIA's CUDA libraries, loaded as cudarc would load them.
        match unsafe { libloading::Library::new(&f) } {
            // Kept loaded for the process: cudarc's handles refer to it.
            Ok(l) => std::mem::forget(l),
            Err(e) => {
                return Err(missing(
                    lib,
                    format!("{} exists but does not load: {e}", f.display()),
                ))
            }
        }
    }
    Ok(())
}

/// Links pip's NCCL as `libnccl.so` in `nccl_link_dir()` and says how to
/// use it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by `ensure`
fn nccl_link_hint(path: &Path) -> String {
    let dir = nccl_link_dir();
    let link = dir.join("libnccl.so");
    let made = std::fs::create_dir_all(&dir).is_ok()
        && (std::fs::read_link(&link).ok().as_deref() == Some(path) || {
            let _ = std::fs::remove_file(&link);
            make_link(path, &link)
        });
    if made {
        format!(
            "found {}, which cudarc only loads as libnccl.so from the loader's path: fsdpc linked {} to it; run with LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH",
            path.display(),
            link.display(),
            dir.display()
        )
    } else {
        format!(
            "found {}, which cudarc only loads as libnccl.so from the loader's path: link it as libnccl.so in a directory and put that directory on LD_LIBRARY_PATH",
            path.display()
        )
    }
}

#[cfg(unix)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by `ensure`
fn make_link(target: &Path, link: &Path) -> bool {
    std::os::unix::fs::symlink(target, link).is_ok()
}

#[cfg(not(unix))]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by `ensure`
fn make_link(_target: &Path, _link: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_library_names_its_pip_directory_and_a_hint() {
        assert_eq!(Library::Nvrtc.pip_dir(), Some("nvidia/cu13/lib"));
        assert_eq!(Library::Nccl.pip_dir(), Some("nvidia/nccl/lib"));
        assert!(Library::Nccl.files().contains(&"libnccl.so.2"));
        for l in [
            Library::Driver,
            Library::Nvrtc,
            Library::Cublas,
            Library::Nccl,
        ] {
            let e = missing(l, l.hint()).to_string();
            assert!(e.starts_with(l.name()), "{e}");
            assert!(e.contains("LD_LIBRARY_PATH"), "{e}");
        }
    }
}
