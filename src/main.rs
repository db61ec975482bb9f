//! The `fsdpc` binary.

/// Counts every heap byte per rank, so `fsdpc train` reports the measured
/// peak next to the planned one.
#[global_allocator]
static ALLOC: fsdpc_runtime::account::CountingAlloc = fsdpc_runtime::account::CountingAlloc;

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let status = fsdpc::cli::embed::main(&args);
    if status != 0 {
        std::process::exit(status);
    }
}
