//! The library's exports and declarations against NCCL's own: the export table always (against
//! this crate's list), and an installed NCCL 2.28.9 (`nccl.h` and `libnccl.so.2`) wherever one is
//! found: named by `PEERLINK_NCCL_REFERENCE` (a directory holding `include/nccl.h` and
//! `lib/libnccl.so.2`, as pip's nvidia-nccl-cu13 wheel lays them out under `nvidia/nccl`), or the
//! wheel in this machine's Python installs. Where none is found, one line says so.

mod common;

use common::library;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use peerlink_nccl::exports::NAMES;
use peerlink_nccl::ffi::typed::SIGNATURES;

const REFERENCE_VARIABLE: &str = "PEERLINK_NCCL_REFERENCE";
const VERSION_CODE: &str = "22809";

/// The dynamic symbols a library defines, by `nm -D --defined-only`; `None` without nm.
fn defined_symbols(library: &Path) -> Option<BTreeSet<String>> {
    let output = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(library)
        .output()
        .ok()?;
    assert!(
        output.status.success(),
        "nm {}: {output:?}",
        library.display()
    );
    let text = String::from_utf8(output.stdout).unwrap();
    Some(
        text.lines()
            .filter_map(|line| line.split_whitespace().nth(2))
            .map(str::to_string)
            .collect(),
    )
}

#[test]
fn the_library_exports_its_table_and_the_marker_and_nothing_else() {
    let Some(ours) = defined_symbols(&library()) else {
        eprintln!("skipped: no nm to read the library's exports");
        return;
    };
    let mut expected: BTreeSet<String> = NAMES.iter().map(|name| name.to_string()).collect();
    expected.insert(peerlink::backend::cuda::NCCL_FORWARDER_MARKER.to_string());
    assert_eq!(ours, expected);
}

/// An NCCL of the version this library mirrors: its `nvidia/nccl`-style directory.
fn reference() -> Option<PathBuf> {
    let named = std::env::var_os(REFERENCE_VARIABLE).map(PathBuf::from);
    let wheels = peerlink::backend::cuda::nccl_search_candidates()
        .into_iter()
        .filter(|candidate| candidate.is_absolute())
        .filter_map(|library| Some(library.parent()?.parent()?.to_path_buf()));
    named.into_iter().chain(wheels).find(|dir| {
        std::fs::read_to_string(dir.join("include/nccl.h")).is_ok_and(|header| {
            header.contains(&format!("#define NCCL_VERSION_CODE {VERSION_CODE}"))
        }) && dir.join("lib/libnccl.so.2").is_file()
    })
}

#[test]
fn the_exports_match_nccl_2_28_9s() {
    let Some(dir) = reference() else {
        eprintln!("skipped: no NCCL 2.28.9 found (set {REFERENCE_VARIABLE} to a directory with include/nccl.h and lib/libnccl.so.2)");
        return;
    };
    let Some(theirs) = defined_symbols(&dir.join("lib/libnccl.so.2")) else {
        eprintln!("skipped: no nm to read NCCL's exports");
        return;
    };
    let ours: BTreeSet<String> = NAMES.iter().map(|name| name.to_string()).collect();
    assert_eq!(ours, theirs, "against {}", dir.display());
}

#[test]
fn the_declarations_match_nccl_2_28_9s_header() {
    let Some(dir) = reference() else {
        eprintln!("skipped: no NCCL 2.28.9 found (set {REFERENCE_VARIABLE} to a directory with include/nccl.h and lib/libnccl.so.2)");
        return;
    };
    let header = declarations(&std::fs::read_to_string(dir.join("include/nccl.h")).unwrap());
    for (name, parameters, result) in SIGNATURES {
        let ours: Vec<String> = parameters.iter().map(|rust| c_type(rust)).collect();
        let Some((their_result, theirs)) = header
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, r, p)| (r, p))
        else {
            panic!("{name} is not declared in {}", dir.display());
        };
        assert_eq!(&ours, theirs, "{name}'s parameters");
        assert_eq!(&c_type(result), their_result, "{name}'s result");
    }
}

/// A Rust type as `stringify!` writes it, in C: `* const c_void` → `const void*`.
fn c_type(rust: &str) -> String {
    let rust = rust.replace(' ', "");
    if let Some(pointee) = rust.strip_prefix("*const") {
        return format!("const {}*", c_type(pointee));
    }
    if let Some(pointee) = rust.strip_prefix("*mut") {
        return format!("{}*", c_type(pointee));
    }
    match rust.as_str() {
        "c_void" => "void".into(),
        "c_int" => "int".into(),
        "c_char" => "char".into(),
        other => other.into(),
    }
}

/// Every `ncclResult_t` or `const char*` function nccl.h declares: its name, its result and its
/// parameters' types (names dropped, a `const` on a parameter passed by value dropped: it is no
/// part of the function's type).
fn declarations(header: &str) -> Vec<(String, String, Vec<String>)> {
    let mut text = String::new();
    let mut rest = header;
    while let Some(start) = rest.find("/*") {
        text.push_str(&rest[..start]);
        rest = rest[start..]
            .find("*/")
            .map_or("", |end| &rest[start + end + 2..]);
    }
    text.push_str(rest);
    let text: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| line.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join(" ");
    let mut found = Vec::new();
    for statement in text.split(';') {
        let statement = statement.split('{').next_back().unwrap_or("").trim();
        let Some((head, parameters)) = statement.split_once('(') else {
            continue;
        };
        let tokens = type_tokens(head);
        let Some((name, result)) = tokens.split_last() else {
            continue;
        };
        if !name.starts_with("nccl")
            || !(result == ["ncclResult_t"] || result == ["const", "char", "*"])
        {
            continue;
        }
        let parameters = parameters.trim_end_matches(')').trim();
        let parameters = if parameters.is_empty() || parameters == "void" {
            Vec::new()
        } else {
            parameters.split(',').map(parameter_type).collect()
        };
        found.push((name.clone(), render(result), parameters));
    }
    found
}

fn type_tokens(text: &str) -> Vec<String> {
    text.replace('*', " * ")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn parameter_type(parameter: &str) -> String {
    let mut tokens = type_tokens(parameter);
    if tokens.len() > 1 && tokens.last().is_some_and(|last| last != "*") {
        tokens.pop();
    }
    if tokens.first().is_some_and(|first| first == "const") && !tokens.contains(&"*".to_string()) {
        tokens.remove(0);
    }
    render(&tokens)
}

/// Tokens back to C, stars against the type: `const void*`.
fn render(tokens: &[String]) -> String {
    tokens.iter().fold(String::new(), |mut out, token| {
        if token != "*" && !out.is_empty() && !out.ends_with(' ') {
            out.push(' ');
        }
        out.push_str(token);
        out
    })
}

#[test]
fn declarations_are_read_as_c_writes_them() {
    let header = "/* a comment; with ( */\nncclResult_t  ncclCommCount(const ncclComm_t comm, int* count);\n\
                  const char*  ncclGetLastError(ncclComm_t comm);\nncclResult_t  ncclGroupStart();\n\
                  typedef struct { int x; } ncclConfig_t;";
    assert_eq!(
        declarations(header),
        [
            (
                "ncclCommCount".to_string(),
                "ncclResult_t".to_string(),
                vec!["ncclComm_t".to_string(), "int*".to_string()]
            ),
            (
                "ncclGetLastError".to_string(),
                "const char*".to_string(),
                vec!["ncclComm_t".to_string()]
            ),
            (
                "ncclGroupStart".to_string(),
                "ncclResult_t".to_string(),
                vec![]
            ),
        ]
    );
    assert_eq!(c_type("* const c_void"), "const void*");
    assert_eq!(c_type("* mut * mut c_void"), "void**");
}
