//! Nothing peerlink prints holds a control character or a bidirectional override (issue 34, class
//! 6): a preset's texts are refused with the field named and the character's code point, never
//! printed; a document's names (`compare`, `report`, `check --baseline`) and the paths in messages
//! are echoed without them.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// Runs peerlink in `dir`: (exit code, stdout, stderr).
fn peerlink(args: &[&str], dir: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (
        out.status.code().unwrap(),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// Fails where `text` holds what a terminal would obey.
fn assert_safe(what: &str, text: &str) {
    let found = text.chars().find(|&c| peerlink::echo::is_unsafe(c));
    assert!(found.is_none(), "{what} holds {found:?}: {text:?}");
}

/// Hostile texts: an escape that clears the screen, an OSC title, C1's CSI, a right-to-left
/// override and an isolate.
const HOSTILE: &str = "\u{1b}[2J\u{1b}]0;t\u{7}\u{9b}31mA\u{202e}B\u{2066}C";

#[test]
fn a_documents_names_are_echoed_without_controls() {
    let dir = tempfile::tempdir().unwrap();
    let (code, bench, _) = peerlink(
        &[
            "--sim",
            "pcie-2gpu-switch",
            "bench",
            "--tests",
            "ce-write",
            "--size",
            "4K",
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(code, 0);
    let mut doc: Value = serde_json::from_str(&bench).unwrap();
    doc["host"] = json!(HOSTILE);
    doc["host_gpus"][0]["name"] = json!(HOSTILE);
    doc["source"] = json!(format!("sim:{HOSTILE}"));
    std::fs::write(dir.path().join("hostile.json"), doc.to_string()).unwrap();
    std::fs::write(dir.path().join("plain.json"), &bench).unwrap();
    for args in [
        &["compare", "plain.json", "hostile.json"][..],
        &["compare", "hostile.json", "plain.json", "--json"],
        &[
            "compare",
            "hostile.json",
            "plain.json",
            "--export-markdown",
            "c.md",
        ],
        &["report", "hostile.json", "-o", "r.html"],
        &[
            "--sim",
            "pcie-2gpu-switch",
            "check",
            "--baseline",
            "hostile.json",
        ],
    ] {
        let (code, stdout, stderr) = peerlink(args, dir.path());
        assert!(code <= 2, "{args:?}: {code} {stderr}");
        assert_safe(&format!("{args:?}'s stdout"), &stdout);
        assert_safe(&format!("{args:?}'s stderr"), &stderr);
    }
    for written in ["c.md", "r.html"] {
        let text = std::fs::read_to_string(dir.path().join(written)).unwrap();
        assert_safe(written, &text);
    }
    let page = std::fs::read_to_string(dir.path().join("r.html")).unwrap();
    assert!(
        page.contains("[2J]0;t31mABC"),
        "the page keeps the printable rest"
    );
}

#[test]
fn a_presets_texts_are_refused_naming_the_field_and_paths_are_echoed_safely() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile");
    for (fixture, says) in [
        (
            "name-escapes.json",
            "name holds a control character or a bidirectional override (U+001B, character 1)",
        ),
        (
            "gpu-name-bidi.json",
            "gpu.name holds a control character or a bidirectional override (U+202E",
        ),
    ] {
        let path = fixtures.join(fixture);
        let (code, stdout, stderr) =
            peerlink(&["--sim", path.to_str().unwrap(), "topo"], dir.path());
        assert_eq!(code, 2, "{fixture}: {stderr}");
        assert!(
            stdout.is_empty() && stderr.contains(says),
            "{fixture}: {stderr}"
        );
        assert_safe(fixture, &stderr);
        assert_eq!(stderr.lines().count(), 1, "one sentence: {stderr}");
    }
    let missing = format!("{HOSTILE}\nsecond line.json");
    let (code, _, stderr) = peerlink(&["--sim", &missing, "topo"], dir.path());
    assert_eq!(code, 2, "{stderr}");
    assert_safe("the error naming a hostile path", &stderr);
    assert_eq!(
        stderr.lines().count(),
        1,
        "one line even for a path with a newline: {stderr}"
    );
}
