//! One process per GPU on the command line: `peerlink launch`, and ranks started as torchrun starts
//! them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), on 127.0.0.1 with ports the kernel picks, and
//! what the others do when one is killed, stopped or never comes.

mod common;

use common::{peerlink, succeeds};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// stderr's lines that are peerlink's errors.
fn errors(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|line| line.contains("error:"))
        .map(String::from)
        .collect()
}

#[test]
fn launch_runs_a_group_and_rank_zero_prints_it() {
    let out = succeeds(
        peerlink()
            .args(["launch", "-n", "3", "--timeout", "20", "--", "ranks"])
            .timeout(Duration::from_secs(60)),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("3 ranks (peerlink launch) met at the rendezvous; timeout 20 s"),
        "{stdout}"
    );
    for rank in 0..3 {
        let row = stdout
            .lines()
            .find(|line| line.starts_with(&format!("{rank}  ")))
            .unwrap_or_else(|| panic!("a row for rank {rank}: {stdout}"));
        assert!(
            row.contains(&format!("{rank}/3")) && row.ends_with("ok"),
            "{row}"
        );
    }
}

#[test]
fn a_verb_of_one_process_runs_once_on_rank_zero() {
    let out = succeeds(
        peerlink()
            .args([
                "launch",
                "-n",
                "2",
                "--",
                "--sim",
                "pcie-2gpu-switch",
                "--json",
                "topo",
            ])
            .timeout(Duration::from_secs(60)),
    );
    // Rank 0's stdout passes whole: exactly one document.
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["schema"], "peerlink.topo/1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[rank 0] peerlink: note: 2 ranks (peerlink launch) met"),
        "{stderr}"
    );
}

#[test]
fn a_rank_that_fails_is_named_with_its_exit_status() {
    let out = peerlink()
        .args(["launch", "-n", "2", "--", "--sim", "no-such-preset", "topo"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let errors = errors(&out.stderr);
    let last = errors.last().expect("the launcher's sentence");
    assert_eq!(
        last,
        "peerlink: error: rank 0 of 2 failed (exit status 2; its error is above)"
    );
    assert!(
        errors[0].starts_with("[rank 0] peerlink: error: "),
        "{errors:?}"
    );
}

#[test]
fn launch_refuses_what_it_cannot_run() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["launch", "-n", "0", "--", "ranks"],
            "-n 0: start 1 to 1024 processes",
        ),
        (
            &["--sim", "dgx-h100", "launch", "-n", "2", "--", "topo"],
            "--sim belongs to the ranks' command line",
        ),
        (
            &["launch", "-n", "2", "--", "no-such-verb"],
            "the ranks' command line `no-such-verb` is not peerlink's",
        ),
        (
            &[
                "launch", "-n", "2", "--", "launch", "-n", "2", "--", "ranks",
            ],
            "cannot launch ranks itself",
        ),
        (
            &["launch", "-n", "2", "--timeout", "0", "--", "ranks"],
            "is not a timeout",
        ),
        (
            &["launch", "-n", "2", "--port", "0", "--", "ranks"],
            "--port 0",
        ),
    ];
    for (args, expected) in cases {
        let out = peerlink().args(*args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one sentence: {stderr}");
    }
}

/// Ranks started by hand as torchrun starts them, holding the group `hold` seconds.
struct Ranks {
    children: Vec<Child>,
}

impl Ranks {
    fn start(world: usize, started: &[usize], timeout: &str, hold: &str) -> Ranks {
        let port = free_port().to_string();
        let children = started
            .iter()
            .map(|rank| {
                Command::new(env!("CARGO_BIN_EXE_peerlink"))
                    .args(["ranks", "--hold", hold])
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", world.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", &port)
                    .env("PEERLINK_TIMEOUT", timeout)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        Ranks { children }
    }

    /// Waits until rank 0 has printed the group (every rank is then past the checks, holding).
    fn wait_until_held(&mut self) {
        let stdout = self.children[0].stdout.as_mut().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let found = lines.any(|line| line.unwrap().starts_with("barrier:"));
        assert!(found, "rank 0 printed the group");
    }

    fn signal(&self, rank: usize, signal: &str) {
        let pid = self.children[rank].id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success());
    }

    /// Rank `rank`'s exit code, its error lines and how long it took to end.
    fn end_of(&mut self, rank: usize, limit: Duration) -> (Option<i32>, Vec<String>, Duration) {
        let start = Instant::now();
        let child = &mut self.children[rank];
        while child.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < limit,
                "rank {rank} still runs after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output_ref();
        (out.0, errors(&out.1), start.elapsed())
    }
}

trait WaitRef {
    fn wait_with_output_ref(&mut self) -> (Option<i32>, Vec<u8>);
}

impl WaitRef for Child {
    fn wait_with_output_ref(&mut self) -> (Option<i32>, Vec<u8>) {
        use std::io::Read;
        let mut stderr = Vec::new();
        self.stderr
            .take()
            .unwrap()
            .read_to_end(&mut stderr)
            .unwrap();
        (self.wait().unwrap().code(), stderr)
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_rank_killed_mid_run_makes_the_others_exit_naming_it() {
    let mut ranks = Ranks::start(3, &[0, 1, 2], "3", "60");
    ranks.wait_until_held();
    ranks.signal(1, "-KILL");
    for rank in [0, 2] {
        let (code, errors, took) = ranks.end_of(rank, Duration::from_secs(6));
        assert_eq!(code, Some(3), "rank {rank}: {errors:?}");
        assert_eq!(errors.len(), 1, "one sentence: {errors:?}");
        assert!(
            errors[0].starts_with("peerlink: error: rank 1 left the group"),
            "rank {rank}: {errors:?}"
        );
        assert!(took < Duration::from_secs(4), "rank {rank} took {took:?}");
    }
}

#[test]
fn a_stopped_rank_is_taken_for_hung_within_the_timeout() {
    let mut ranks = Ranks::start(2, &[0, 1], "2", "60");
    ranks.wait_until_held();
    ranks.signal(1, "-STOP");
    let (code, errors, took) = ranks.end_of(0, Duration::from_secs(8));
    assert_eq!(code, Some(3), "{errors:?}");
    assert_eq!(errors.len(), 1, "one sentence: {errors:?}");
    assert!(
        errors[0].starts_with(
            "peerlink: error: rank 1 stopped answering: nothing heard from it for 2 s"
        ),
        "{errors:?}"
    );
    // Within the timeout of the stop, and a heartbeat or two beside it.
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[test]
fn a_rank_that_never_comes_is_named_within_the_timeout() {
    let mut ranks = Ranks::start(2, &[0], "1", "0");
    let (code, errors, took) = ranks.end_of(0, Duration::from_secs(6));
    assert_eq!(code, Some(3), "{errors:?}");
    assert!(
        errors[0]
            .starts_with("peerlink: error: rank 1 of 2 did not join the rendezvous at 127.0.0.1:"),
        "{errors:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// `peerlink launch -n 2 --timeout SECS -- ranks --hold 60`, once rank 0 has printed the group
/// (both ranks then hold it): the launcher, and the pids of its ranks from rank 0's table.
fn launch_two_holding(timeout: &str) -> (Child, Vec<String>) {
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(["launch", "-n", "2", "--timeout", timeout, "--"])
        .args(["ranks", "--hold", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = launcher.stdout.take().unwrap();
    let mut pids = Vec::new();
    for line in BufReader::new(stdout).lines().map(Result::unwrap) {
        if line.starts_with("barrier:") {
            return (launcher, pids);
        }
        if line.starts_with("0  ") || line.starts_with("1  ") {
            pids.extend(line.split_whitespace().nth(3).map(String::from));
        }
    }
    let _ = launcher.kill();
    let _ = launcher.wait();
    panic!("rank 0 did not print the group")
}

#[test]
fn launch_names_a_killed_rank_and_stops_the_others() {
    let (mut launcher, pids) = launch_two_holding("3");
    let pid = &pids[1];
    let start = Instant::now();
    assert!(Command::new("kill")
        .args(["-KILL", pid])
        .status()
        .unwrap()
        .success());
    let (code, stderr) = launcher.wait_with_output_ref();
    let errors = errors(&stderr);
    assert_eq!(code, Some(128 + 9), "{errors:?}");
    // Rank 0 ends by itself once it calls the group again, or is stopped (a second after).
    let last = errors.last().unwrap();
    assert!(
        [
            "peerlink: error: rank 1 of 2 was killed by signal 9 (SIGKILL)",
            "peerlink: error: rank 1 of 2 was killed by signal 9 (SIGKILL); the other ranks were \
             stopped"
        ]
        .contains(&last.as_str()),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("[rank 0] peerlink: error: rank 1 left the group")),
        "{errors:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn ctrl_c_reaches_every_rank_once_and_the_launcher_exits_130() {
    let (mut launcher, _) = launch_two_holding("5");
    let start = Instant::now();
    let pid = launcher.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let (code, stderr) = launcher.wait_with_output_ref();
    let stderr = String::from_utf8_lossy(&stderr);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("peerlink: interrupted"),
        "{stderr}"
    );
    // Each rank was asked once (a second request would have quit it at once, without a word).
    for rank in 0..2 {
        let asked = format!("[rank {rank}] peerlink: stopping now, keeping what was measured");
        assert_eq!(stderr.matches(&asked).count(), 1, "{stderr}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn launch_nccl_preloads_the_nccl_api_library_in_every_rank() {
    // A copy of peerlink alone in a directory: --nccl looks for the library beside it.
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("peerlink");
    std::fs::copy(assert_cmd::cargo::cargo_bin("peerlink"), &exe).unwrap();
    let launch = |preload: &str| {
        Command::new(&exe)
            .args([
                "launch",
                "-n",
                "2",
                "--timeout",
                "20",
                "--nccl",
                "--",
                "ranks",
            ])
            .env("LD_PRELOAD", preload)
            .output()
            .unwrap()
    };
    let library = dir.path().join("libpeerlink_nccl.so");
    let out = launch("");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        errors(&out.stderr),
        [format!(
            "peerlink: error: --nccl: {} is not there: build it with `cargo build --release -p \
             peerlink-nccl`, which puts it beside the peerlink executable",
            library.display()
        )]
    );
    // Not a library: the dynamic loader of each rank says it cannot preload it, and so shows
    // that LD_PRELOAD names it there, ahead of what it held.
    std::fs::write(&library, b"").unwrap();
    let out = launch("libnot-there.so");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for rank in 0..2 {
        let line = format!(
            "[rank {rank}] ERROR: ld.so: object '{}' from LD_PRELOAD",
            library.display()
        );
        assert!(stderr.contains(&line), "{line:?} missing: {stderr}");
        let line = format!("[rank {rank}] ERROR: ld.so: object 'libnot-there.so' from LD_PRELOAD");
        assert!(stderr.contains(&line), "{line:?} missing: {stderr}");
    }
}
