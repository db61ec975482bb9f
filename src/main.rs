//! The `fsdpc` binary.

use clap::Parser;

fn main() {
    let cli = fsdpc::cli::Cli::parse();
    if let Err(e) = fsdpc::cli::run(cli) {
        eprintln!("error: {e}");
        std::process::exit(e.exit_code());
    }
}
