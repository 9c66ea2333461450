//! Outputs never destroy inputs: every destination is checked before any work against every file
//! the command reads and every other destination, by the file's identity, whatever its spelling
//! (`./x`, a symbolic link, a hard link); a path ending in `/` is refused up front; a closed stdout
//! is an error, not a silent exit 0.

mod common;

use common::{peerlink, succeeds};
use std::path::Path;

/// A topology document written into `dir` as `name`: an input to read.
fn document(dir: &Path, name: &str) -> Vec<u8> {
    let out = succeeds(peerlink().args(["--sim", "h200-pair", "--json", "topo"]));
    std::fs::write(dir.join(name), &out.stdout).unwrap();
    out.stdout
}

/// Runs `args` in `dir`, expecting bad usage (exit 2) whose error names every one of `says`.
fn refused(dir: &Path, args: &[&str], says: &[&str]) {
    let out = peerlink().current_dir(dir).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    for said in says {
        assert!(stderr.contains(said), "{args:?}: `{said}` not in {stderr}");
    }
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: one sentence: {stderr}"
    );
}

#[test]
fn report_refuses_to_write_over_its_input_however_spelled() {
    let dir = tempfile::tempdir().unwrap();
    let doc = document(dir.path(), "x.json");
    std::os::unix::fs::symlink("x.json", dir.path().join("link.json")).unwrap();
    std::fs::hard_link(dir.path().join("x.json"), dir.path().join("hard.json")).unwrap();
    for out in ["x.json", "./x.json", "link.json", "hard.json"] {
        refused(
            dir.path(),
            &["report", "x.json", "-o", out],
            &[
                &format!("--out {out}"),
                "the document x.json",
                "that this command reads",
            ],
        );
        assert_eq!(
            std::fs::read(dir.path().join("x.json")).unwrap(),
            doc,
            "{out}"
        );
    }
    // The input spelled through a link and written plainly.
    refused(
        dir.path(),
        &["report", "./link.json", "-o", "x.json"],
        &["--out x.json", "the document ./link.json"],
    );
    assert_eq!(std::fs::read(dir.path().join("x.json")).unwrap(), doc);
}

#[test]
fn exports_refuse_every_file_the_verb_reads() {
    let dir = tempfile::tempdir().unwrap();
    let preset = succeeds(
        peerlink()
            .args(["--sim", "pcie-2gpu-switch", "tune", "--quick"])
            .arg("--out")
            .arg(dir.path().join("profile.json"))
            .arg("--export-sim")
            .arg(dir.path().join("preset.json")),
    );
    assert!(preset.status.success());
    let kept = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    let (profile, preset) = (kept("profile.json"), kept("preset.json"));
    refused(
        dir.path(),
        &[
            "--sim",
            "preset.json",
            "topo",
            "--export-json",
            "./preset.json",
        ],
        &["--export-json ./preset.json", "--sim preset.json"],
    );
    refused(
        dir.path(),
        &[
            "--sim",
            "pcie-2gpu-switch",
            "plan",
            "--src",
            "0",
            "--dst",
            "1",
            "--size",
            "1MiB",
            "--profile",
            "profile.json",
            "--export-markdown",
            "./profile.json",
        ],
        &["--export-markdown ./profile.json", "--profile profile.json"],
    );
    let doc = document(dir.path(), "x.json");
    refused(
        dir.path(),
        &["compare", "x.json", "x.json", "--export-csv", "./x.json"],
        &["--export-csv ./x.json", "the document x.json"],
    );
    assert_eq!(kept("profile.json"), profile);
    assert_eq!(kept("preset.json"), preset);
    assert_eq!(kept("x.json"), doc);
}

#[test]
fn two_destinations_of_one_file_are_refused_before_anything_is_measured() {
    let dir = tempfile::tempdir().unwrap();
    let tune = ["--sim", "dgx-h100", "tune", "--quick"];
    refused(
        dir.path(),
        &[&tune[..], &["--export-json", "X", "--export-sim", "X"]].concat(),
        &["--export-json X and --export-sim X both name one file"],
    );
    refused(
        dir.path(),
        &[&tune[..], &["--out", "p.json", "--export-sim", "./p.json"]].concat(),
        &["--out p.json and --export-sim ./p.json both name one file"],
    );
    document(dir.path(), "x.json");
    refused(
        dir.path(),
        &["report", "x.json", "-o", "X", "--svg", "X"],
        &["--out X and --svg X both name one file"],
    );
    // Nothing was written: not the files, not a temporary one beside them.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["x.json"]);
}

#[test]
fn a_destination_ending_in_a_slash_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["--sim", "h200-pair", "topo", "--export-json", "out/"],
        vec!["--sim", "h200-pair", "topo", "--export-csv", "out/."],
        vec![
            "--sim",
            "dgx-h100",
            "tune",
            "--quick",
            "--export-sim",
            "preset/",
        ],
    ] {
        let path = args.last().unwrap();
        refused(dir.path(), &args, &[&format!("{path}: ends in `/`")]);
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_closed_stdout_is_an_error_and_dev_null_is_not() {
    let bin = env!("CARGO_BIN_EXE_peerlink");
    let run = |redirect: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("\"$0\" --sim h200-pair topo {redirect}"))
            .arg(bin)
            .output()
            .unwrap()
    };
    let closed = run(">&-");
    let stderr = String::from_utf8_lossy(&closed.stderr);
    assert!(
        matches!(closed.status.code(), Some(1 | 2)),
        "exit {:?}: {stderr}",
        closed.status.code()
    );
    assert!(stderr.contains("stdout is closed"), "{stderr}");
    let null = run(">/dev/null");
    assert!(
        null.status.success(),
        "{}",
        String::from_utf8_lossy(&null.stderr)
    );
}
