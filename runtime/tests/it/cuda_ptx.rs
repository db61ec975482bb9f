//! Every CUDA kernel file compiles with NVRTC, to PTX for compute_80 and
//! compute_90 and to cubins for sm_80 and sm_90 (NVRTC runs ptxas, so
//! register and shared-memory limits are checked too). Needs NVRTC only,
//! no driver or GPU: `scripts/test.sh` installs pip's `nvidia-cuda-nvrtc`
//! into a venv under `target/` and points `FSDPC_CUDA_LIB_DIR` at it. Skips
//! with the reason when NVRTC is not found, unless `CI` (or
//! `FSDPC_REQUIRE_GPU`) is set: then a missing NVRTC fails.
#![cfg(feature = "cuda")]

use fsdpc_runtime::targets::cuda::nvrtc::{self, Target};
use fsdpc_runtime::targets::cuda::sources::ALL;
use fsdpc_runtime::targets::cuda::CudaError;

#[test]
fn every_kernel_file_compiles_for_sm80_and_sm90() {
    let version = match nvrtc::version() {
        Ok(v) => v,
        Err(e @ CudaError::LibraryMissing { .. })
            if std::env::var_os("CI").is_none()
                && std::env::var_os("FSDPC_REQUIRE_GPU").is_none() =>
        {
            eprintln!("skipping: {e}");
            return;
        }
        Err(e) => panic!("NVRTC is required here (CI is set): {e}"),
    };
    eprintln!("NVRTC {}.{}", version.0, version.1);
    let mut failures = Vec::new();
    for cc in [80, 90] {
        for t in [Target::Ptx(cc), Target::Cubin(cc)] {
            for f in ALL {
                match nvrtc::compile(&f, t) {
                    Ok(out) => {
                        let text = String::from_utf8_lossy(&out);
                        if let Target::Ptx(_) = t {
                            for k in f.kernels {
                                assert!(
                                    text.contains(&format!(".entry {k}(")),
                                    "{} for {}: no entry {k}",
                                    f.name,
                                    t.name()
                                );
                            }
                        }
                    }
                    Err(e) => failures.push(e.to_string()),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
