//! The `fsdpc` binary.

use clap::Parser;

/// Counts every heap byte per rank, so `fsdpc train` reports the measured
/// peak next to the planned one.
#[global_allocator]
static ALLOC: fsdpc_runtime::account::CountingAlloc = fsdpc_runtime::account::CountingAlloc;

fn main() {
    let cli = fsdpc::cli::Cli::parse();
    if let Err(e) = fsdpc::cli::run(cli) {
        if !e.is_quiet() {
            eprintln!("error: {e}");
        }
        std::process::exit(e.exit_code());
    }
}
