//! The `peerlink` binary: parses the command line, runs it, and turns an error into one sentence on
//! stderr and an exit code (0 success, 1 a failure while running, 2 bad usage or input, 3 another
//! rank of a multi-process run failed, 130 interrupted: what was measured before is still printed).

mod cli;

use clap::Parser;
use std::process::ExitCode;

/// The exit status of a run stopped by Ctrl-C or SIGTERM (128 + SIGINT, as shells report it).
const INTERRUPTED: u8 = peerlink::error::INTERRUPTED as u8;

fn main() -> ExitCode {
    cli::stop_on_signals();
    let outcome = cli::run(cli::args::Cli::parse());
    let interrupted = peerlink::interrupt::requested();
    match outcome {
        Ok(()) if interrupted => {
            eprintln!("peerlink: interrupted: what is shown is what was measured before the stop");
            abandoned();
            ExitCode::from(INTERRUPTED)
        }
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Paths, names and values the user or a file supplied are in it: one line, nothing a
            // terminal would obey.
            eprintln!(
                "peerlink: error: {}",
                peerlink::echo::one_line(&err.to_string())
            );
            let code = err
                .downcast_ref::<peerlink::Error>()
                .map_or(1, peerlink::Error::exit_code);
            if interrupted {
                abandoned();
            }
            ExitCode::from(if interrupted { INTERRUPTED } else { code as u8 })
        }
    }
}

/// Says so where the stop cut a wait for the GPUs short: the work already queued there was left
/// unfinished (the process's end takes it away).
fn abandoned() {
    if peerlink::interrupt::abandoned() {
        eprintln!(
            "peerlink: the work already queued on the GPUs when the stop came was abandoned \
             unfinished; no figure comes from it"
        );
    }
}
