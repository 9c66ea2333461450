//! The library in front of a stand-in NCCL (tests/c/standin.c, built here with `cc`), called by a C
//! program and a Rust one in the three ways jobs load NCCL: preloaded, by path, and first on
//! LD_LIBRARY_PATH as libnccl.so.2. Every call must reach the stand-in with its arguments intact
//! and every result code come back; with no NCCL but this library, every call fails with a clear
//! sentence, never a crash or a hang.

mod common;

use common::library;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The stand-in, the clients and a copy of the library named libnccl.so.2, in a fresh directory.
struct Fixture {
    dir: tempfile::TempDir,
}

fn cc(args: &[&str], dir: &Path) -> bool {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let status = Command::new("cc")
        .current_dir(dir)
        .args(
            args.iter()
                .map(|arg| arg.replace("{c}", source.to_str().unwrap())),
        )
        .status();
    matches!(status, Ok(status) if status.success())
}

impl Fixture {
    /// `None` (and one line said) where there is no C compiler.
    fn new() -> Option<Fixture> {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["standin", "link", "ours"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let shared = [
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnccl.so.2",
            "{c}/standin.c",
        ];
        let built = cc(
            &[&shared[..], &["-o", "standin/libnccl.so.2"]].concat(),
            dir.path(),
        ) && cc(
            &[&shared[..], &["-DLINK_ONLY", "-o", "link/libnccl.so.2"]].concat(),
            dir.path(),
        ) && cc(
            &["-o", "client", "{c}/client.c", "-Llink", "-l:libnccl.so.2"],
            dir.path(),
        ) && cc(
            &["-DBY_PATH", "-o", "client_path", "{c}/client.c", "-ldl"],
            dir.path(),
        );
        if !built {
            eprintln!("skipped: no C compiler (cc) to build the stand-in NCCL");
            return None;
        }
        std::os::unix::fs::symlink("libnccl.so.2", dir.path().join("standin/libnccl.so")).unwrap();
        std::fs::copy(library(), dir.path().join("ours/libnccl.so.2")).unwrap();
        Some(Fixture { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `program` with `env` (and no NCCL of the machine in sight), and returns its stdout,
    /// its stderr and what reached the stand-in.
    fn run(&self, program: &[&str], env: &[(&str, String)]) -> (String, String, String) {
        let log = self.path("standin.log");
        let _ = std::fs::remove_file(&log);
        let empty = self.path("no-python");
        let mut command = Command::new("timeout");
        command
            .arg("20")
            .args(program)
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("STANDIN_LOG", &log)
            .env("HOME", &empty)
            .envs(env.iter().map(|(key, value)| (key, value)));
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{program:?} {output:?}");
        (
            String::from_utf8(output.stdout).unwrap(),
            String::from_utf8(output.stderr).unwrap(),
            std::fs::read_to_string(&log).unwrap_or_default(),
        )
    }
}

/// What the C client prints when every call answers `code`.
fn client_output(code: i32) -> String {
    let (comm, comms) = ("0xc0", "0xd0 0xd1");
    format!(
        "ncclGetVersion 0 22809\n\
         ncclGetUniqueId {code} 42 7\n\
         ncclCommInitRank {code} {comm}\n\
         ncclCommInitAll {code} {comms}\n\
         ncclGroupStart {code}\n\
         ncclAllReduce {code}\n\
         ncclBroadcast {code}\n\
         ncclReduce {code}\n\
         ncclSend {code}\n\
         ncclRecv {code}\n\
         ncclGroupEnd {code}\n\
         ncclCommRegister {code} 0xfeed\n\
         ncclRedOpCreatePreMulSum {code} 5\n\
         ncclMemAlloc {code} 0xa110c\n\
         ncclCommShrink 5\n\
         ncclGetErrorString stand-in error string\n\
         ncclGetLastError stand-in last error\n\
         ncclCommDestroy {code}\n"
    )
}

/// What reaches the stand-in from the C client: every argument as the client passed it.
const STANDIN_LOG: &str = "ncclGetVersion
ncclGetUniqueId
ncclCommInitRank 2 id[0]=42 id[127]=7 rank=1
ncclCommInitAll 2 devlist[1]=6
ncclGroupStart
ncclAllReduce 0x5e00 0x4e00 1000003 9 4 0xc0 0x57
ncclBroadcast 0x5e00 0x4e00 17 7 1 0xc0 0x57
ncclReduce 0x5e00 0x4e00 8589934592 8 2 1 0xc0 0x57
ncclSend 0x5e00 5 0 1 0xc0 0x57
ncclRecv 0x4e00 6 1 0 0xc0 0x57
ncclGroupEnd
ncclCommRegister 0xc0 0x4e00 4096
ncclRedOpCreatePreMulSum 0x5e00 7 1 0xc0
ncclMemAlloc 1048576
ncclGetErrorString 3
ncclGetLastError 0xc0
ncclCommDestroy 0xc0
";

const MISSING: &str = "has no ncclCommShrink: the call returns ncclInvalidUsage";

#[test]
fn preloaded_every_call_arrives_intact_and_every_result_comes_back() {
    let Some(fixture) = Fixture::new() else {
        return;
    };
    let env = [
        ("LD_PRELOAD", library().display().to_string()),
        ("LD_LIBRARY_PATH", "standin".to_string()),
        ("STANDIN_RESULT", "6".to_string()),
        ("PEERLINK_NCCL_DEBUG", "INFO".to_string()),
    ];
    let (stdout, stderr, log) = fixture.run(&["./client"], &env);
    assert_eq!(stdout, client_output(6));
    // ncclGetVersion once more: the library asks it for the log's first line.
    assert_eq!(log, format!("ncclGetVersion\n{STANDIN_LOG}"));
    assert!(
        stderr.contains("the libnccl.so.2 this process had loaded"),
        "{stderr}"
    );
    assert!(stderr.contains(MISSING), "{stderr}");
    assert!(
        stderr.contains("calls at exit: 0 served by peerlink, 5 forwarded to NCCL"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ncclReduce             ≤ 64 GiB: 0 served, 1 forwarded"),
        "{stderr}"
    );
}

#[test]
fn loaded_by_path_it_finds_nccl_by_peerlinks_search() {
    let Some(fixture) = Fixture::new() else {
        return;
    };
    let env = [
        ("LD_LIBRARY_PATH", "standin".to_string()),
        ("STANDIN_RESULT", "3".to_string()),
    ];
    let (stdout, stderr, log) = fixture.run(&["./client_path", library().to_str().unwrap()], &env);
    assert_eq!(stdout, client_output(3));
    assert_eq!(log, STANDIN_LOG);
    // Without PEERLINK_NCCL_DEBUG, only what went wrong is said.
    assert_eq!(
        stderr.trim(),
        format!("peerlink-nccl: the NCCL forwarded to (standin/libnccl.so.2) {MISSING}")
    );
}

#[test]
fn as_libnccl_so_2_it_skips_itself_and_logs_each_communicator() {
    let Some(fixture) = Fixture::new() else {
        return;
    };
    let env = [
        ("LD_LIBRARY_PATH", "ours:standin".to_string()),
        ("PEERLINK_NCCL_DEBUG", "info".to_string()),
        ("PEERLINK_NCCL_SERVE", "none".to_string()),
    ];
    let (stdout, stderr, log) = fixture.run(&["./client"], &env);
    assert_eq!(stdout, client_output(0));
    assert!(
        log.ends_with(STANDIN_LOG.split_once("ncclGroupStart").unwrap().1),
        "{log}"
    );
    assert!(
        stderr.contains("found by peerlink's search as libnccl.so;"),
        "{stderr}"
    );
    for line in [
        "communicator 0xc0 (ncclCommInitRank): rank 1 of 2, GPU 3; PEERLINK_NCCL_SERVE=none",
        "communicator 0xd1 (ncclCommInitAll): rank 1 of 2, GPU 3; PEERLINK_NCCL_SERVE=none",
    ] {
        assert!(stderr.contains(line), "{line:?} missing: {stderr}");
    }
}

#[test]
fn a_rust_program_calls_through_it_by_path() {
    let Some(fixture) = Fixture::new() else {
        return;
    };
    let client = library().parent().unwrap().join("examples/rust_client");
    let client = if client.is_file() {
        client
    } else {
        library()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("examples/rust_client")
    };
    let env = [
        (
            "PEERLINK_NCCL_LIB",
            fixture.path("standin/libnccl.so.2").display().to_string(),
        ),
        ("STANDIN_RESULT", "4".to_string()),
    ];
    let (stdout, _, log) = fixture.run(
        &[client.to_str().unwrap(), library().to_str().unwrap()],
        &env,
    );
    assert_eq!(
        stdout,
        "ncclGetVersion 0 22809\nncclGroupStart 4\nncclAllReduce 4\nncclGroupEnd 4\n"
    );
    assert_eq!(log, "ncclGetVersion\nncclGroupStart\nncclAllReduce 0x5e00 0x4e00 123456789 9 1 0xc0 0x57\nncclGroupEnd\n");
}

#[test]
fn as_the_only_libnccl_so_2_every_call_fails_with_a_sentence() {
    let Some(fixture) = Fixture::new() else {
        return;
    };
    let env = [("LD_LIBRARY_PATH", "ours".to_string())];
    let started = std::time::Instant::now();
    let (stdout, stderr, log) = fixture.run(&["./client"], &env);
    assert!(started.elapsed() < Duration::from_secs(10));
    if stderr.contains("forwarding to NCCL") || !log.is_empty() {
        eprintln!("skipped: this machine has an NCCL the search finds");
        return;
    }
    assert!(
        stdout.starts_with("ncclGetVersion 2 0\nncclGetUniqueId 2 0 0\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ncclAllReduce 2\n") && stdout.contains("ncclCommShrink 2\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ncclGetLastError no NCCL to forward to"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ncclGetErrorString internal error"),
        "{stdout}"
    );
    assert!(
        stderr.starts_with("peerlink-nccl: no NCCL to forward to"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "set PEERLINK_NCCL_LIB=/path/to/libnccl.so.2; every NCCL call returns ncclSystemError"
        ),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "said once: {stderr}");
}

#[test]
fn naming_this_library_as_nccl_is_refused() {
    let Some(fixture) = Fixture::new() else {
        return;
    };
    let ours = fixture.path("ours/libnccl.so.2").display().to_string();
    let env = [
        ("PEERLINK_NCCL_LIB", ours.clone()),
        ("PEERLINK_NCCL_SERVE", "yes".to_string()),
    ];
    let (stdout, stderr, _) = fixture.run(&["./client_path", &ours], &env);
    assert!(stdout.contains("ncclAllReduce 2\n"), "{stdout}");
    assert!(
        stderr.contains("PEERLINK_NCCL_SERVE=\"yes\" is not none, auto or all"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "PEERLINK_NCCL_LIB={ours} is peerlink's NCCL-API library, not NCCL"
        )),
        "{stderr}"
    );
}
