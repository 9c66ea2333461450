//! One process per GPU on the command line: `peerlink launch` starts the ranks, every verb finds
//! out whether it runs as one of them, and `peerlink ranks` shows the group.
//!
//! Under a launcher (torchrun, srun, mpirun, `peerlink launch`) every process joins the group
//! first, which proves that all ranks can meet. Verbs that work across processes ([`uses_group`])
//! then run on every rank; the others run once, on rank 0, while the other ranks stop at once.

use super::args::{Global, LaunchArgs, RanksArgs, Verb};
use anyhow::Result;
use peerlink::error::GROUP_FAILED;
use peerlink::launch::{self, check, Group, Identity, Launcher};
use peerlink::Error;
use rustix::process::{Pid, Signal};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The most ranks `peerlink launch` starts on one host.
const MAX_PROCESSES: usize = 1024;

/// How long the other ranks get to end by themselves after one failed: they learn of it at once
/// (or within the timeout, for a hung rank) and say so in their own words.
const SETTLE: Duration = Duration::from_secs(1);

/// How long ranks asked to stop (SIGTERM) then get before they are killed.
const GRACE: Duration = Duration::from_secs(3);

/// Marks the ranks `peerlink launch` started, with the launcher's pid: a rank dies with its
/// launcher (a launcher killed by SIGKILL leaves no rank behind).
const LAUNCHER_PID: &str = "PEERLINK_LAUNCHER_PID";

/// How often a rank looks whether its group has failed.
const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether `verb` runs on every rank with the group; the others run on rank 0 alone.
pub fn uses_group(verb: &Verb) -> bool {
    matches!(verb, Verb::Ranks(_) | Verb::Bench(_) | Verb::Workload(_))
}

/// The group of this process, where a launcher started it; `None` for a single-process run.
pub fn join() -> Result<Option<(Launcher, Group)>> {
    let Some((launcher, identity, rendezvous)) = launch::from_env()? else {
        return Ok(None);
    };
    if launcher == Launcher::Peerlink {
        die_with_launcher()?;
    }
    let group = Group::join(identity, &rendezvous)?;
    stop_when_the_group_fails(&group);
    Ok(Some((launcher, group)))
}

/// Ends this rank with status 3 and the group's sentence once the group has failed and the rank
/// has not stopped by itself: a rank inside a long measurement calls no collective until its GPU
/// work is done, which can outlast the timeout by far (27.5 s after a kill, with a 10 s timeout, on
/// the H200 pair). A rank that meets the failure in a collective reports it itself first: the
/// watcher waits a heartbeat interval before it acts.
fn stop_when_the_group_fails(group: &Group) {
    let watch = group.watch();
    let grace = launch::heartbeat_interval(group.timeout());
    std::thread::spawn(move || loop {
        if let Some(sentence) = watch.failed() {
            std::thread::sleep(grace);
            eprintln!(
                "peerlink: error: {} (this rank stopped with its GPU work unfinished)",
                peerlink::echo::one_line(&sentence)
            );
            std::process::exit(GROUP_FAILED);
        }
        std::thread::sleep(WATCH_PERIOD);
    });
}

/// Whether this process runs `verb`: always alone or for a verb that uses the group; otherwise
/// only rank 0 (which says so once).
pub fn this_rank_runs(verb: &Verb, group: Option<&(Launcher, Group)>) -> bool {
    let Some((launcher, group)) = group else {
        return true;
    };
    let Identity { rank, world, .. } = group.identity();
    if uses_group(verb) || world == 1 {
        return true;
    }
    if rank == 0 {
        eprintln!(
            "peerlink: note: {world} ranks ({launcher}) met at the rendezvous; this verb runs in one \
             process, so rank 0 runs it and {} stop{}",
            match world {
                2 => "rank 1".to_string(),
                _ => format!("ranks 1 to {}", world - 1),
            },
            if world == 2 { "s" } else { "" }
        );
    }
    rank == 0
}

/// A rank of `peerlink launch` asks the kernel to kill it when its launcher exits, so that no rank
/// outlives a launcher that was killed.
fn die_with_launcher() -> Result<()> {
    let Some(launcher) = std::env::var(LAUNCHER_PID)
        .ok()
        .and_then(|pid| pid.parse().ok())
    else {
        return Ok(());
    };
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| anyhow::anyhow!("cannot tie this rank to its launcher: {e}"))?;
    // The launcher may have gone before the line above; then nobody waits for this rank.
    if rustix::process::getppid().map(Pid::as_raw_pid) != Some(launcher) {
        return Err(
            Error::Group("the peerlink launch that started this rank is gone".into()).into(),
        );
    }
    Ok(())
}

/// `peerlink launch -n N -- VERB …`: N ranks of peerlink on this host, their output forwarded,
/// the first failure named, the others then stopped.
pub fn run(global: &Global, args: &LaunchArgs) -> Result<()> {
    refuse_global_options(global)?;
    let processes = args.processes;
    if !(1..=MAX_PROCESSES).contains(&processes) {
        return Err(Error::usage(format!(
            "-n {processes}: start 1 to {MAX_PROCESSES} processes"
        ))
        .into());
    }
    let timeout = args
        .timeout
        .as_deref()
        .map(launch::parse_timeout)
        .transpose()?
        .unwrap_or(launch::DEFAULT_TIMEOUT);
    check_command(&args.command)?;
    let port =
        match args.port {
            Some(0) => return Err(Error::usage(
                "--port 0: give rank 0 a port from 1 to 65535, or leave --port out for a free one",
            )
            .into()),
            Some(port) => port,
            None => free_port()?,
        };

    let exe = std::env::current_exe()?;
    let preload = if args.nccl {
        Some(nccl_preload(&exe, std::env::var_os("LD_PRELOAD"))?)
    } else {
        None
    };
    let mut ranks = Vec::with_capacity(processes);
    let mut forwarders = Vec::new();
    for rank in 0..processes {
        let spawned = Command::new(&exe)
            .args(&args.command)
            .envs([
                ("RANK", rank.to_string()),
                ("WORLD_SIZE", processes.to_string()),
                ("LOCAL_RANK", rank.to_string()),
                ("LOCAL_WORLD_SIZE", processes.to_string()),
                ("MASTER_ADDR", "127.0.0.1".to_string()),
                ("MASTER_PORT", port.to_string()),
                ("PEERLINK_PORT", port.to_string()),
                ("PEERLINK_TIMEOUT", timeout.as_secs_f64().to_string()),
                ("PEERLINK_LAUNCHED", "1".to_string()),
                (LAUNCHER_PID, std::process::id().to_string()),
            ])
            .env_remove("PEERLINK_ALONE")
            .envs(preload.iter().map(|value| ("LD_PRELOAD", value)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: Ctrl-C on the terminal reaches the launcher alone, which
            // passes it on once.
            .process_group(0)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                stop(&mut ranks, Signal::KILL);
                return Err(anyhow::anyhow!(
                    "cannot start rank {rank} ({}): {e}",
                    exe.display()
                ));
            }
        };
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        if let Some(stdout) = stdout {
            forwarders.push(match rank {
                0 => thread::spawn(move || pass_through(stdout)),
                _ => thread::spawn(move || labelled(rank, stdout)),
            });
        }
        if let Some(stderr) = stderr {
            forwarders.push(thread::spawn(move || labelled(rank, stderr)));
        }
        ranks.push(Rank {
            child,
            exit: None,
            stopped: false,
        });
    }

    let failure = supervise(&mut ranks);
    for forwarder in forwarders {
        let _ = forwarder.join();
    }
    match failure {
        Some(failure) => Err(failure.into()),
        None => Ok(()),
    }
}

/// The NCCL-API library's file name (the `peerlink-nccl` crate's cdylib).
const NCCL_LIBRARY: &str = "libpeerlink_nccl.so";

/// `--nccl`'s LD_PRELOAD: the NCCL-API library beside `exe` (cargo builds both into one directory),
/// ahead of what LD_PRELOAD held already.
fn nccl_preload(exe: &Path, existing: Option<OsString>) -> peerlink::Result<OsString> {
    let library = exe.with_file_name(NCCL_LIBRARY);
    if !library.is_file() {
        return Err(Error::usage(format!(
            "--nccl: {} is not there: build it with `cargo build --release -p peerlink-nccl`, \
             which puts it beside the peerlink executable",
            library.display()
        )));
    }
    let mut preload = library.into_os_string();
    if let Some(existing) = existing.filter(|value| !value.is_empty()) {
        preload.push(" ");
        preload.push(existing);
    }
    Ok(preload)
}

struct Rank {
    child: Child,
    exit: Option<ExitStatus>,
    /// The launcher asked it to stop (its exit then says nothing about its own health).
    stopped: bool,
}

/// Waits for every rank; the first that fails (another's failure preferred over a rank that only
/// reports it, exit status 3) is named, and the others still running after [`SETTLE`] are
/// stopped: SIGTERM, SIGKILL after [`GRACE`]. Ctrl-C is passed on to every rank.
fn supervise(ranks: &mut [Rank]) -> Option<Error> {
    let world = ranks.len();
    let mut failed: Vec<(usize, ExitStatus)> = Vec::new();
    let mut failed_at: Option<Instant> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut interrupt_passed = false;
    loop {
        for (rank, entry) in ranks.iter_mut().enumerate() {
            if entry.exit.is_some() {
                continue;
            }
            if let Ok(Some(status)) = entry.child.try_wait() {
                entry.exit = Some(status);
                if !status.success() && !entry.stopped && !peerlink::interrupt::requested() {
                    failed.push((rank, status));
                }
            }
        }
        if ranks.iter().all(|entry| entry.exit.is_some()) {
            break;
        }
        if peerlink::interrupt::requested() && !interrupt_passed {
            interrupt_passed = true;
            signal_running(ranks, Signal::INT, false);
        }
        if !failed.is_empty() {
            let failed_at = *failed_at.get_or_insert_with(Instant::now);
            match stopping_since {
                None if failed_at.elapsed() > SETTLE => {
                    stopping_since = Some(Instant::now());
                    signal_running(ranks, Signal::TERM, true);
                }
                Some(since) if since.elapsed() > GRACE => stop(ranks, Signal::KILL),
                _ => {}
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
    let others_stopped = ranks.iter().any(|entry| entry.stopped);
    let (rank, status) = failed
        .iter()
        .find(|(_, status)| status.code() != Some(GROUP_FAILED))
        .or(failed.first())
        .copied()?;
    Some(rank_failed(rank, world, status, others_stopped))
}

fn signal_running(ranks: &mut [Rank], signal: Signal, stopping: bool) {
    for entry in ranks.iter_mut().filter(|entry| entry.exit.is_none()) {
        entry.stopped |= stopping;
        let _ = rustix::process::kill_process(Pid::from_child(&entry.child), signal);
    }
}

fn stop(ranks: &mut [Rank], signal: Signal) {
    for entry in ranks.iter_mut().filter(|entry| entry.exit.is_none()) {
        entry.stopped = true;
        let _ = rustix::process::kill_process(Pid::from_child(&entry.child), signal);
        if signal == Signal::KILL {
            entry.exit = entry.child.wait().ok();
        }
    }
}

/// The launcher's one sentence on a failed rank, and its exit status: the rank's own, or 128 + the
/// signal that killed it, as shells report it.
fn rank_failed(rank: usize, world: usize, status: ExitStatus, others_stopped: bool) -> Error {
    use std::os::unix::process::ExitStatusExt;
    let then = if others_stopped {
        "; the other ranks were stopped"
    } else {
        ""
    };
    let (message, status) = match (status.code(), status.signal()) {
        (Some(GROUP_FAILED), _) => (
            format!(
                "rank {rank} of {world} stopped because another rank failed, hung or never \
                 arrived (exit status {GROUP_FAILED}; its error above names the rank){then}"
            ),
            GROUP_FAILED,
        ),
        (Some(code), _) => (
            format!("rank {rank} of {world} failed (exit status {code}; its error is above){then}"),
            code,
        ),
        (None, Some(signal)) => (
            format!(
                "rank {rank} of {world} was killed by signal {signal}{}{then}",
                signal_name(signal).map_or(String::new(), |name| format!(" ({name})"))
            ),
            128 + signal,
        ),
        (None, None) => (format!("rank {rank} of {world} ended abnormally{then}"), 1),
    };
    Error::RankFailed {
        message,
        status: u8::try_from(status).unwrap_or(1),
    }
}

fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        7 => "SIGBUS",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return None,
    })
}

/// Rank 0's stdout as it is (a JSON document or CSV stays whole for a pipe).
fn pass_through(mut from: impl Read) {
    let mut buffer = [0u8; 8192];
    let mut out = std::io::stdout();
    while let Ok(n @ 1..) = from.read(&mut buffer) {
        // A reader that went away wants no more; the rank carries on.
        let _ = out.write_all(&buffer[..n]).and_then(|()| out.flush());
    }
}

/// Another stream of `rank`'s, on stderr, each line labelled with the rank.
fn labelled(rank: usize, from: impl Read) {
    let mut lines = BufReader::new(from);
    let mut line = Vec::new();
    while let Ok(1..) = lines.read_until(b'\n', &mut line) {
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "[rank {rank}] ").and_then(|()| err.write_all(&line));
        line.clear();
    }
}

/// A port on 127.0.0.1 nobody listens on now, for rank 0.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The ranks' command line must be one peerlink understands, and not another launch.
fn check_command(command: &[String]) -> Result<()> {
    use clap::Parser;
    let parsed = super::args::Cli::try_parse_from(
        std::iter::once("peerlink").chain(command.iter().map(String::as_str)),
    );
    match parsed {
        Ok(cli) if matches!(cli.verb, Verb::Launch(_)) => Err(Error::usage(
            "a launched rank cannot launch ranks itself: give `launch` a verb such as `ranks`",
        )
        .into()),
        Ok(_) => Ok(()),
        Err(e) => {
            let first = e.to_string();
            let first = first
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            Err(Error::usage(format!(
                "the ranks' command line `{}` is not peerlink's: {first}",
                command.join(" ")
            ))
            .into())
        }
    }
}

/// `launch`'s own options are `-n`, `--timeout` and `--port`; the global ones belong to the ranks.
fn refuse_global_options(global: &Global) -> peerlink::Result<()> {
    let given: Vec<&str> = [
        (global.sim.is_some(), "--sim"),
        (global.gpu, "--gpu"),
        (global.json, "--json"),
        (global.devices.is_some(), "--devices"),
        (global.exports.export_json.is_some(), "--export-json"),
        (global.exports.export_csv.is_some(), "--export-csv"),
        (
            global.exports.export_markdown.is_some(),
            "--export-markdown",
        ),
    ]
    .into_iter()
    .filter_map(|(set, name)| set.then_some(name))
    .collect();
    if given.is_empty() {
        return Ok(());
    }
    Err(Error::usage(format!(
        "{} belong{} to the ranks' command line: put {} after `--` (peerlink launch -n 2 -- {} …)",
        given.join(" and "),
        if given.len() == 1 { "s" } else { "" },
        if given.len() == 1 { "it" } else { "them" },
        given.join(" "),
    )))
}

/// `peerlink ranks`: the group end to end — identities gathered, a broadcast, file descriptors
/// passed around each host, barriers timed — printed by rank 0.
pub fn ranks(global: &Global, args: &RanksArgs, group: Option<(Launcher, Group)>) -> Result<()> {
    global.refuse_backend_options("ranks")?;
    if global.json {
        return Err(Error::usage("`ranks` prints text only: leave --json out").into());
    }
    let hold = args
        .hold
        .as_deref()
        .map(launch::parse_timeout)
        .transpose()?;
    let Some((launcher, group)) = group else {
        super::emit(
            "one process: no launcher's variables are set (RANK and WORLD_SIZE, SLURM_PROCID in \
             an srun step, OMPI_COMM_WORLD_RANK); run it under one, or as `peerlink launch -n N \
             -- ranks`\n",
        )?;
        return Ok(());
    };
    let report = check::run(&group)?;
    let is_root = group.identity().rank == 0;
    if is_root {
        super::emit(&check::text(&group, launcher, &report))?;
        if let Some(rank) = report
            .fds
            .iter()
            .position(|verdict| *verdict == Some(false))
        {
            return Err(anyhow::anyhow!(
                "the pipe passed to rank {rank} read back other bytes than were written into it: \
                 file descriptors do not pass right between this host's processes"
            ));
        }
    }
    let held = check::hold(&group, hold)?;
    if is_root && held > 0 {
        super::emit(&format!("held together {held} s, a barrier each second\n"))?;
    }
    Ok(())
}
