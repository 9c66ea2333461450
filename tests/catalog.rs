//! Issue 13's catalog of hostile inputs, run as CLI tests: every row of `tests/catalog/bad-inputs.tsv`
//! is one command line, with the exit code that is right for it and a phrase its error must hold.
//!
//! What a row asserts:
//! - it ends within the timeout (a hang is a failure), never by a signal, never with exit 101 (a
//!   panic) or 134 (an abort), and nothing on stderr says `panicked`;
//! - its exit code is the row's: 0 where the input is legitimate, 2 for bad input, 1 for a failure
//!   while running (no GPU where `--gpu` asks for one);
//! - a refusal (exit 1 or 2) is one sentence on stderr, and the row's phrase is in it. "One sentence"
//!   means one line `peerlink: error: …` and nothing else on stderr (under `peerlink launch`: that
//!   line from every rank alike, each prefixed `[rank R] `, then the launcher's line naming the rank
//!   that failed); or, for what clap refuses before
//!   peerlink runs, one line `error: …` followed only by clap's fixed trailer (indented lines that
//!   list what is missing or give a tip, `Usage: peerlink …`, `For more information, try
//!   '--help'.`, blank lines). A phrase `<help>` stands for clap's help text (peerlink run bare);
//! - with exit 0, the row's phrase (if any) is in stdout.
//!
//! Placeholders in a row's arguments: `F/<name>` is a file made by `catalog/files.rs` (its name says
//! what it holds: `F/prof-zero.json` a profile with a zero rate; `F/missing.json` none at all),
//! `DIR` a directory, `OUT/<name>` a path in an empty directory for outputs, `FIFO/<name>` a named
//! pipe with no writer, `OVERCAP/<name>` a sparse file one byte over the 64 MiB that peerlink reads
//! from an input file.
//!
//! The `run` column says when a row runs:
//! - `ci`: in every `cargo test` (under half a minute in `--release`, a few minutes in debug);
//! - `no-gpu`: likewise, on hosts without an NVIDIA GPU (where it expects exit 1); skipped, saying so,
//!   on a host with one;
//! - `interrupt`: long runs that Ctrl-C must end within a second (exit 130), run by
//!   `tests/interrupts.rs`; their `says` is `partial` (stdout holds the document, marked partial)
//!   or `none` (nothing finished to show; stderr says interrupted), or `either` (a run whose
//!   output is whole or nothing: which depends on the moment);
//! - `long`: rows that are slow by nature (a 1000-GPU bench, 200 MB files, GiB buffers), run by
//!   `cargo test --release --test catalog -- --ignored long`;
//! - `known: <why>`: rows that fail today for a reason outside the command line (the simulator backs
//!   simulated GPU memory with host memory, and takes a preset's figures unbounded), skipped with their reason printed; run them with
//!   `cargo test --release --test catalog -- --ignored known` (they are expected to fail until the
//!   simulator is fixed: then move them to `ci`).
//!
//! `PEERLINK_CATALOG=J23,J54 cargo test --test catalog ci_rows -- --nocapture` runs the rows named,
//! whatever their `run`; `PEERLINK_CATALOG_TIMEOUT=<seconds>` changes the timeout of a row (120 s for
//! `ci` rows, 900 s for the others).

#[path = "catalog/files.rs"]
mod files;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CATALOG: &str = include_str!("catalog/bad-inputs.tsv");

/// Seconds a `ci` row may run (the slowest takes ~35 s in a debug build, ~13 s in release).
const TIMEOUT_S: u64 = 120;
/// Seconds a `long` or `known` row may run (a 1000-GPU `plan --concurrent` takes minutes).
const LONG_TIMEOUT_S: u64 = 900;

/// When a row runs.
#[derive(Clone, Debug, PartialEq)]
enum Run {
    Ci,
    NoGpu,
    Long,
    /// Run by `tests/interrupts.rs`: Ctrl-C at a random moment must end the run within a second.
    Interrupt,
    Known(String),
}

#[derive(Clone, Debug)]
struct Row {
    id: String,
    run: Run,
    exit: i32,
    says: String,
    args: Vec<String>,
}

/// The catalog's rows, in its order.
fn rows() -> Vec<Row> {
    CATALOG
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let [id, run, exit, says, args] = fields[..] else {
                panic!("a catalog row has 5 tab-separated fields: {line}")
            };
            let run = match run {
                "ci" => Run::Ci,
                "no-gpu" => Run::NoGpu,
                "long" => Run::Long,
                "interrupt" => Run::Interrupt,
                known => Run::Known(
                    known
                        .strip_prefix("known: ")
                        .unwrap_or_else(|| panic!("{id}: unknown run `{known}`"))
                        .to_string(),
                ),
            };
            Row {
                id: id.to_string(),
                run,
                exit: exit
                    .parse()
                    .unwrap_or_else(|_| panic!("{id}: exit `{exit}`")),
                says: says.to_string(),
                args: split_args(args),
            }
        })
        .collect()
}

/// Splits a row's arguments at spaces; `'…'` quotes one argument (`''` is the empty one).
fn split_args(text: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (arg, after) = match rest.strip_prefix('\'') {
            Some(quoted) => {
                let end = quoted.find('\'').expect("a closing quote");
                (&quoted[..end], &quoted[end + 1..])
            }
            None => rest.split_at(rest.find(' ').unwrap_or(rest.len())),
        };
        args.push(arg.to_string());
        rest = after.trim_start();
    }
    args
}

/// What one run of peerlink did.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

/// Runs peerlink with `args`, killing it after `timeout`.
fn run(args: &[String], scratch: &Path, timeout: Duration) -> Outcome {
    let (out_path, err_path) = (scratch.join("stdout"), scratch.join("stderr"));
    let file = |p: &Path| Stdio::from(std::fs::File::create(p).unwrap());
    let mut child = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(args)
        .current_dir(scratch)
        .stdin(Stdio::null())
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        .spawn()
        .expect("peerlink starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > timeout {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).to_string();
    Outcome {
        code: status.and_then(|s| s.code()),
        stdout: read(&out_path),
        stderr: read(&err_path),
        timed_out: status.is_none(),
    }
}

/// Ok where `outcome` is what `row` asks for, else what is wrong.
fn check(row: &Row, outcome: &Outcome, timeout: Duration) -> Result<(), String> {
    let first = outcome.stderr.lines().next().unwrap_or_default();
    if outcome.timed_out {
        return Err(format!("did not end within {timeout:?} (a hang?)"));
    }
    if outcome.stderr.contains("panicked") {
        return Err(format!("panicked: {}", outcome.stderr.trim()));
    }
    let Some(code) = outcome.code else {
        return Err(format!("killed by a signal; stderr: {first}"));
    };
    if code != row.exit {
        return Err(format!("exit {code}, not {}; stderr: {first}", row.exit));
    }
    if row.exit == 0 {
        return match row.says.is_empty() || outcome.stdout.contains(&row.says) {
            true => Ok(()),
            false => Err(format!("stdout does not say `{}`", row.says)),
        };
    }
    one_sentence(&outcome.stderr)?;
    let holds = match row.says.as_str() {
        "<help>" => outcome.stderr.contains("Usage: peerlink"),
        says => first.contains(says),
    };
    match holds {
        true => Ok(()),
        false => Err(format!("stderr does not say `{}`: {first}", row.says)),
    }
}

/// Ok where `stderr` is one sentence as the module's doc defines it (or clap's help text).
fn one_sentence(stderr: &str) -> Result<(), String> {
    let mut lines = stderr.lines();
    let first = lines.next().unwrap_or_default();
    let rest: Vec<&str> = lines.collect();
    let extra = if first.starts_with("[rank ") {
        return every_rank_one_sentence(stderr);
    } else if first.starts_with("peerlink: error: ") {
        rest.iter().find(|l| !l.trim().is_empty())
    } else if first.starts_with("error: ") {
        rest.iter().find(|l| !is_clap_trailer(l))
    } else if stderr.contains("Usage: peerlink") && stderr.contains("Commands:") {
        None // help, for peerlink run bare
    } else {
        return Err(format!("stderr does not start with an error: {first:?}"));
    };
    match extra {
        None => Ok(()),
        Some(line) => Err(format!(
            "more than one sentence on stderr: {first} / {line}"
        )),
    }
}

/// Under `peerlink launch`: each rank's one sentence, prefixed `[rank R] `, the same on every rank,
/// then the launcher's one line naming the rank that failed.
fn every_rank_one_sentence(stderr: &str) -> Result<(), String> {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let Some((last, ranks)) = lines.split_last() else {
        return Err("nothing on stderr".into());
    };
    let sentences: Vec<&str> = ranks
        .iter()
        .map(|l| l.split_once("] peerlink: error: ").map_or(*l, |(_, s)| s))
        .collect();
    if ranks.iter().any(|l| !l.starts_with("[rank ")) || sentences.windows(2).any(|w| w[0] != w[1])
    {
        return Err(format!(
            "the ranks do not say one sentence alike: {ranks:?}"
        ));
    }
    match last.starts_with("peerlink: error: rank ") && last.contains(" failed") {
        true => Ok(()),
        false => Err(format!(
            "the launcher's last line does not name the rank: {last}"
        )),
    }
}

/// A line clap adds after its error: what is missing or a tip (indented), usage, a pointer to help.
fn is_clap_trailer(line: &str) -> bool {
    line.is_empty()
        || line.starts_with("  ")
        || line.starts_with("Usage: peerlink")
        || line == "For more information, try '--help'."
}

/// Whether this host has an NVIDIA GPU (so `--gpu` rows that expect none are skipped).
fn has_gpu() -> bool {
    Path::new("/dev/nvidiactl").exists()
}

/// The arguments of `row` with its placeholders made real.
fn concrete_args(row: &Row, files: &files::Files, dir: &Path, out: &Path) -> Vec<String> {
    row.args
        .iter()
        .map(|arg| {
            let path: PathBuf = if arg == "DIR" {
                dir.to_path_buf()
            } else if let Some(name) = arg.strip_prefix("F/") {
                files.make(name)
            } else if let Some(name) = arg.strip_prefix("OUT/") {
                out.join(name)
            } else if let Some(name) = arg.strip_prefix("FIFO/") {
                fifo(&dir.join(name))
            } else if let Some(name) = arg.strip_prefix("OVERCAP/") {
                over_cap(&dir.join(name))
            } else {
                return arg.clone();
            };
            path.to_str().unwrap().to_string()
        })
        .collect()
}

/// A named pipe at `path` (made once: rows share it), which nothing writes to.
fn fifo(path: &Path) -> PathBuf {
    if !path.exists() {
        // Another row may make it at the same moment: only the pipe's existence matters.
        let _ = Command::new("mkfifo").arg(path).status();
    }
    assert!(path.exists(), "mkfifo made {}", path.display());
    path.to_path_buf()
}

/// A sparse file one byte over peerlink's input cap (`peerlink::files::MAX_INPUT_BYTES`).
fn over_cap(path: &Path) -> PathBuf {
    if !path.exists() {
        let file = std::fs::File::create(path).expect("a file in the catalog's directory");
        file.set_len(peerlink::files::MAX_INPUT_BYTES + 1).unwrap();
    }
    path.to_path_buf()
}

/// Writes a line where `cargo test` shows it even for a passing test (the harness captures only
/// `print!` and `eprint!`): skipped rows are said, never silent.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "catalog: {line}");
}

/// Runs `rows`, each killed after `seconds` unless `PEERLINK_CATALOG_TIMEOUT` says otherwise, and
/// fails with every row that went wrong. Quick rows run several at once; slow ones (`at_once`
/// false) one after another, since each may take GiBs of memory.
fn run_rows(rows: &[Row], seconds: u64, at_once: bool) {
    let timeout = Duration::from_secs(
        std::env::var("PEERLINK_CATALOG_TIMEOUT")
            .map(|s| s.parse().expect("PEERLINK_CATALOG_TIMEOUT is seconds"))
            .unwrap_or(seconds),
    );
    let temp = tempfile::tempdir().unwrap();
    let (inputs, dir, out) = (
        temp.path().join("files"),
        temp.path().join("a-directory"),
        temp.path().join("out"),
    );
    for d in [&inputs, &dir, &out] {
        std::fs::create_dir(d).unwrap();
    }
    let files = files::Files::new(&inputs);
    let started = Instant::now();
    let jobs: Vec<(&Row, Vec<String>)> = rows
        .iter()
        .map(|row| (row, concrete_args(row, &files, &dir, &out)))
        .collect();
    say(&format!(
        "{} rows, their files made in {:.1?}",
        jobs.len(),
        started.elapsed()
    ));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let workers = match at_once {
        true => std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
        false => 1,
    };
    std::thread::scope(|scope| {
        for worker in 0..workers {
            let (jobs, next, failures) = (&jobs, &next, &failures);
            let scratch = temp.path().join(format!("worker{worker}"));
            std::fs::create_dir(&scratch).unwrap();
            scope.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((row, args)) = jobs.get(i) else {
                    break;
                };
                let began = Instant::now();
                let outcome = run(args, &scratch, timeout);
                if let Err(why) = check(row, &outcome, timeout) {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("{} {:?}: {why}", row.id, row.args));
                }
                if began.elapsed() > Duration::from_secs(10) {
                    say(&format!("{} took {:.1?}", row.id, began.elapsed()));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    say(&format!(
        "{} of {} rows right in {:.1?}",
        jobs.len() - failures.len(),
        jobs.len(),
        started.elapsed()
    ));
    assert!(
        failures.is_empty(),
        "{} rows went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The rows `PEERLINK_CATALOG` names (ids, comma-separated), if it is set.
fn named_rows() -> Option<Vec<Row>> {
    let names = std::env::var("PEERLINK_CATALOG").ok()?;
    let names: Vec<&str> = names.split(',').map(str::trim).collect();
    let all = rows();
    for name in &names {
        assert!(all.iter().any(|r| r.id == *name), "no catalog row {name}");
    }
    Some(
        all.into_iter()
            .filter(|r| names.contains(&r.id.as_str()))
            .collect(),
    )
}

#[test]
fn ci_rows() {
    if let Some(named) = named_rows() {
        return run_rows(&named, LONG_TIMEOUT_S, false);
    }
    let gpu = has_gpu();
    let mut selected = Vec::new();
    for row in rows() {
        match &row.run {
            Run::Ci => selected.push(row),
            Run::NoGpu if !gpu => selected.push(row),
            Run::NoGpu => say(&format!(
                "skipped {}: it expects a host without a GPU",
                row.id
            )),
            Run::Long => say(&format!(
                "skipped {} (long): run it with -- --ignored long",
                row.id
            )),
            Run::Interrupt => {}
            Run::Known(why) => say(&format!(
                "skipped {} (known to fail: {why}): run it with -- --ignored known",
                row.id
            )),
        }
    }
    run_rows(&selected, TIMEOUT_S, true);
}

#[test]
#[ignore = "slow by nature (1000 GPUs, 200 MB files, GiB buffers): cargo test --release --test catalog -- --ignored long"]
fn long_rows() {
    let long: Vec<Row> = rows().into_iter().filter(|r| r.run == Run::Long).collect();
    run_rows(&long, LONG_TIMEOUT_S, false);
}

#[test]
#[ignore = "rows known to fail for a reason outside the command line (none today): each row says why"]
fn known_rows() {
    let known: Vec<Row> = rows()
        .into_iter()
        .filter(|r| matches!(r.run, Run::Known(_)))
        .collect();
    run_rows(&known, LONG_TIMEOUT_S, false);
}

#[test]
fn the_catalog_is_well_formed() {
    let rows = rows();
    let mut ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), before, "every row's id is its own");
    for row in &rows {
        let interrupted = row.run == Run::Interrupt && row.exit == 130;
        assert!(
            [0, 1, 2].contains(&row.exit) || interrupted,
            "{}: exit {}",
            row.id,
            row.exit
        );
        assert!(
            row.exit == 0 || !row.says.is_empty(),
            "{}: a refusal says what it must hold",
            row.id
        );
    }
    assert_eq!(
        split_args("--sim x --out '' 'a b'"),
        ["--sim", "x", "--out", "", "a b"]
    );
}
