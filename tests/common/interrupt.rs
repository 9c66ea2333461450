//! Sending a run SIGINT and timing its end: what `tests/interrupts.rs` (the catalog's long rows)
//! and `tests/fuzz.rs` (generated long commands) share.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the issue asks: the first Ctrl-C ends a run within a second.
pub const BUDGET: Duration = Duration::from_secs(1);
/// What the tests allow, for a loaded CI machine (the figures measured are printed).
pub const LIMIT: Duration = Duration::from_secs(3);
/// A run that outlives this after the signal is killed, and fails.
const GIVE_UP: Duration = Duration::from_secs(30);

/// What a run did once sent SIGINT.
pub struct Stopped {
    /// From the signal to the exit.
    pub took: Duration,
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

/// xorshift64*: enough to spread the moments, and replayable from the seed.
pub fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// `PEERLINK_INTERRUPT_SEED`, else one from the clock.
pub fn seed() -> u64 {
    std::env::var("PEERLINK_INTERRUPT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
        .max(1)
}

/// Runs peerlink with `args`, sends it SIGINT after `delay` and waits for its end; `None` where
/// it ended before the signal.
pub fn interrupt(args: &[String], delay: Duration) -> Option<Stopped> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stdout.read_to_end(&mut bytes).map(|_| bytes)
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).map(|_| text)
    });
    std::thread::sleep(delay);
    if child.try_wait().unwrap().is_some() {
        return None;
    }
    let signalled = Instant::now();
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() > GIVE_UP {
            child.kill().unwrap();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = signalled.elapsed();
    Some(Stopped {
        took,
        code: status.code(),
        stdout: out.join().unwrap().unwrap(),
        stderr: err.join().unwrap().unwrap(),
    })
}

/// Whether what a stopped run printed is what `says` asks: `partial`, one JSON document on stdout
/// marked `"partial": true`; `none`, nothing on stdout and stderr saying it was interrupted;
/// `either`, one or the other.
pub fn check_output(says: &str, stopped: &Stopped) -> Result<(), String> {
    let Stopped { stdout, stderr, .. } = stopped;
    match says {
        "partial" => {
            let doc: serde_json::Value = serde_json::from_slice(stdout)
                .map_err(|e| format!("stdout is not a whole document ({e}); stderr: {stderr}"))?;
            if doc["partial"] != true {
                return Err("the document does not say partial".into());
            }
            Ok(())
        }
        "none" => {
            if !stdout.is_empty() || !stderr.contains("interrupted") {
                return Err(format!(
                    "expected no document and `interrupted` on stderr; stderr: {stderr}"
                ));
            }
            Ok(())
        }
        // A run whose output is whole or nothing (a batch proof): which depends on the moment
        // (a stop heard as the proof ends still prints it, marked partial).
        "either" if stopped.stdout.is_empty() => check_output("none", stopped),
        "either" => check_output("partial", stopped),
        other => Err(format!("unknown `says` `{other}`")),
    }
}

/// What is wrong with a stopped run: past [`LIMIT`], an exit other than 130, or output that is
/// not what `says` asks.
pub fn wrong(says: &str, stopped: &Stopped) -> Vec<String> {
    let mut wrong = Vec::new();
    if stopped.took > LIMIT {
        wrong.push(format!("took {:?} to exit", stopped.took));
    }
    if stopped.code != Some(130) {
        wrong.push(format!("exit {:?}, not 130", stopped.code));
    }
    if let Err(why) = check_output(says, stopped) {
        wrong.push(why);
    }
    wrong
}
