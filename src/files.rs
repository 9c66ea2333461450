//! Bounded reads of the input files users name: `--sim` presets, `--profile`, `check --baseline`,
//! `topo --nccl-xml`, and the documents of `compare` and `report`. Every such file is read here,
//! and only here.
//!
//! Only a regular file is read (a symbolic link to one is followed). A named pipe (FIFO), a
//! device, a socket or a directory is refused before a byte is read, without waiting: a FIFO is
//! opened with `O_NONBLOCK`, so a pipe with no writer never blocks the open, and what was opened is
//! checked again (by `fstat`), so a file swapped after the first look is refused as well. A file
//! larger than [`MAX_INPUT_BYTES`] (64 MiB) is refused as well: a peerlink document, preset,
//! profile or NCCL topology dump is far smaller, and `/dev/zero` or a runaway file must not fill
//! the memory. Every refusal is bad input (exit 2), one sentence that says what the file is and
//! what to do.

use crate::units::format_bytes;
use crate::{Error, Result};
use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The most bytes read from one input file: 64 MiB, some hundred times the largest document
/// peerlink writes (a bench document of eight GPUs' sweeps is under 1 MiB).
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// The text of a file the user named (a document, a profile, a preset, a dump), or bad input
/// (exit 2) that starts with its name and says why it cannot be read (see [`read_text`]).
pub fn read_input(path: &Path) -> Result<String> {
    read_text(path).map_err(|why| Error::usage(format!("{} {why}", path.display())))
}

/// The text of a regular file of at most [`MAX_INPUT_BYTES`], or why it has none, as the end of a
/// sentence that starts with its name (`is a named pipe (FIFO), not a regular file: …`). A
/// byte-order mark that some editors put first is left out: it is not JSON, and RFC 8259 lets a
/// reader ignore it.
pub fn read_text(path: &Path) -> std::result::Result<String, String> {
    let bytes = read_bytes(path)?;
    let text =
        String::from_utf8(bytes).map_err(|_| "is not UTF-8 text, so not JSON".to_string())?;
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    })
}

/// The bytes of a regular file of at most [`MAX_INPUT_BYTES`], or why not (as [`read_text`]).
fn read_bytes(path: &Path) -> std::result::Result<Vec<u8>, String> {
    let cannot = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => "does not exist".to_string(),
        _ => format!("cannot be read: {e}"),
    };
    // A first look, before opening: a device is never opened at all.
    regular(&std::fs::metadata(path).map_err(cannot)?)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(cannot)?;
    // What was opened, which may not be what was looked at.
    regular(&file.metadata().map_err(cannot)?)?;
    read_capped(file).map_err(|e| match e {
        Capped::Io(e) => cannot(e),
        Capped::TooLarge => too_large(None),
    })
}

/// Ok for a regular file no larger than the cap; otherwise what the file is, and what to do.
fn regular(metadata: &Metadata) -> std::result::Result<(), String> {
    let kind = metadata.file_type();
    let what = if kind.is_file() {
        if metadata.len() > MAX_INPUT_BYTES {
            return Err(too_large(Some(metadata.len())));
        }
        return Ok(());
    } else if kind.is_dir() {
        return Err("is a directory, not a file: name a file in it".to_string());
    } else if kind.is_fifo() {
        "a named pipe (FIFO)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(format!(
        "is {what}, not a regular file: peerlink reads its inputs from regular files only; save \
         the input to a file and name that file"
    ))
}

/// The sentence for a file over the cap (its size where known).
fn too_large(bytes: Option<u64>) -> String {
    let size = bytes.map_or("longer".to_string(), |b| {
        format!("{} long", format_bytes(b))
    });
    format!(
        "is {size}, more than the {} peerlink reads from an input file: name the \
         document, preset, profile or dump itself (each is far smaller)",
        format_bytes(MAX_INPUT_BYTES)
    )
}

enum Capped {
    Io(std::io::Error),
    TooLarge,
}

/// Reads to the end, never more than the cap (a file may grow after it was looked at).
fn read_capped(file: File) -> std::result::Result<Vec<u8>, Capped> {
    let mut bytes = Vec::new();
    file.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(Capped::Io)?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(Capped::TooLarge);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn refused(path: &Path, says: &str) {
        let err = read_input(path).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        let said = err.to_string();
        assert!(said.starts_with(&path.display().to_string()), "{said}");
        assert!(said.contains(says), "{said}");
    }

    #[test]
    fn a_file_that_cannot_be_read_is_bad_input_in_one_sentence() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let binary = dir.path().join("binary.json");
        std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x80]).unwrap();
        refused(&missing, "does not exist");
        refused(dir.path(), "is a directory");
        refused(&binary, "not UTF-8");
        let good = dir.path().join("good.json");
        std::fs::write(&good, "{}").unwrap();
        assert_eq!(read_input(&good).unwrap(), "{}");
        let marked = dir.path().join("marked.json");
        std::fs::write(&marked, "\u{feff}{}").unwrap();
        assert_eq!(
            read_input(&marked).unwrap(),
            "{}",
            "the byte-order mark is left out"
        );
    }

    #[test]
    fn a_fifo_is_refused_at_once_even_with_no_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success(), "mkfifo makes a FIFO");
        let start = Instant::now();
        refused(&fifo, "is a named pipe (FIFO), not a regular file");
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn devices_are_refused_before_a_byte_is_read() {
        refused(Path::new("/dev/zero"), "is a character device");
        refused(Path::new("/dev/null"), "is a character device");
    }

    #[test]
    fn a_file_over_the_cap_is_refused_with_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.json");
        let file = File::create(&big).unwrap();
        // Sparse: no disk is used.
        file.set_len(MAX_INPUT_BYTES + 1).unwrap();
        refused(
            &big,
            "more than the 64 MiB peerlink reads from an input file",
        );
        let at_cap = dir.path().join("at-cap.json");
        File::create(&at_cap)
            .unwrap()
            .set_len(MAX_INPUT_BYTES)
            .unwrap();
        assert_eq!(read_text(&at_cap).unwrap().len() as u64, MAX_INPUT_BYTES);
    }

    #[test]
    fn a_file_growing_past_the_cap_after_the_look_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("growing.json");
        File::create(&path)
            .unwrap()
            .set_len(MAX_INPUT_BYTES + 10)
            .unwrap();
        let file = File::open(&path).unwrap();
        assert!(matches!(read_capped(file), Err(Capped::TooLarge)));
    }
}
