//! The `peerlink` binary: parses the command line, runs it, and turns an error into one sentence on
//! stderr and an exit code (0 success, 1 a failure while running, 2 bad usage or input).

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    match cli::run(cli::args::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("peerlink: error: {err}");
            let code = err
                .downcast_ref::<peerlink::Error>()
                .map_or(1, peerlink::Error::exit_code);
            ExitCode::from(code as u8)
        }
    }
}
