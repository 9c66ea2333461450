//! Every file a command line writes, checked before any work: each destination can be written, and
//! none is a file the command reads or another destination. Files are compared by identity (device
//! and inode; for a file not made yet, its directory's identity and its name), not by spelling, so
//! `./x.json` and `x.json`, a symbolic link or a hard link are one file. A refusal is bad usage
//! (exit 2), a sentence naming both paths.

use super::args::{Cli, Verb};
use peerlink::model::profile::check_destination;
use peerlink::Error;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// One path a command line names, with the flag (or role) that names it.
struct Named<'a> {
    flag: &'static str,
    path: &'a Path,
}

/// What a path refers to on the file system, whatever its spelling.
#[derive(PartialEq)]
enum Identity {
    /// A file (or directory) that exists.
    Existing { dev: u64, ino: u64 },
    /// A file to be made: the directory it goes into, and its name there.
    New { dev: u64, ino: u64, name: OsString },
}

/// The identity of `path`; None where neither it nor its directory exists (the write fails then,
/// and a separate check says so).
fn identity(path: &Path) -> Option<Identity> {
    if let Ok(found) = std::fs::metadata(path) {
        return Some(Identity::Existing {
            dev: found.dev(),
            ino: found.ino(),
        });
    }
    let name = path.file_name()?.to_os_string();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let found = std::fs::metadata(dir).ok()?;
    Some(Identity::New {
        dev: found.dev(),
        ino: found.ino(),
        name,
    })
}

/// The files `cli` reads: a `--sim` preset file, a profile, a baseline, an NCCL dump, documents.
fn inputs<'a>(cli: &'a Cli) -> Vec<Named<'a>> {
    let mut read = Vec::new();
    if let Some(sim) = &cli.global.sim {
        // A preset's name is no file; a file of that name is what --sim reads.
        read.push(Named {
            flag: "--sim",
            path: Path::new(sim.as_str()),
        });
    }
    let optional = |flag, path: &'a Option<std::path::PathBuf>| {
        path.as_deref().map(|path| Named { flag, path })
    };
    match &cli.verb {
        Verb::Plan(args) => read.extend(optional("--profile", &args.profile)),
        Verb::Check(args) => read.extend(optional("--baseline", &args.baseline)),
        Verb::Topo(args) => read.extend(optional("--nccl-xml", &args.nccl_xml)),
        Verb::Compare(args) => {
            read.push(Named {
                flag: "the document",
                path: &args.base,
            });
            read.push(Named {
                flag: "the document",
                path: &args.other,
            });
        }
        Verb::Report(args) => read.extend(args.files.iter().map(|path| Named {
            flag: "the document",
            path,
        })),
        _ => {}
    }
    read
}

/// The files `cli` writes, and the directories it writes into (`report --svg`), by flag.
fn outputs(cli: &Cli) -> (Vec<Named<'_>>, Vec<Named<'_>>) {
    let exports = &cli.global.exports;
    let mut files: Vec<Named> = [
        ("--export-json", &exports.export_json),
        ("--export-csv", &exports.export_csv),
        ("--export-markdown", &exports.export_markdown),
    ]
    .into_iter()
    .filter_map(|(flag, path)| path.as_deref().map(|path| Named { flag, path }))
    .collect();
    let mut dirs = Vec::new();
    match &cli.verb {
        Verb::Tune(args) => {
            files.push(Named {
                flag: "--out",
                path: &args.out,
            });
            if let Some(path) = &args.export_sim {
                files.push(Named {
                    flag: "--export-sim",
                    path,
                });
            }
        }
        Verb::Report(args) => {
            if let Some(path) = &args.out {
                files.push(Named {
                    flag: "--out",
                    path,
                });
            }
            if let Some(path) = &args.svg {
                dirs.push(Named {
                    flag: "--svg",
                    path,
                });
            }
        }
        _ => {}
    }
    (files, dirs)
}

/// Refuses, before any work, a destination of `cli` that cannot be written, that is one of the
/// files it reads, or that is another destination.
pub fn check(cli: &Cli) -> peerlink::Result<()> {
    let read = inputs(cli);
    let (files, dirs) = outputs(cli);
    for file in &files {
        check_destination(file.path, file.flag)?;
    }
    if let Some(dir) = dirs.iter().find(|d| d.path.exists() && !d.path.is_dir()) {
        return Err(Error::usage(format!(
            "{} {}: not a directory; name a directory to write the charts into",
            dir.flag,
            dir.path.display()
        )));
    }
    // A file that does not exist is not read (a --sim preset's name, say): nothing to destroy.
    let read: Vec<_> = read
        .iter()
        .map(|n| (n, identity(n.path)))
        .filter(|(_, id)| matches!(id, Some(Identity::Existing { .. })))
        .collect();
    let written: Vec<_> = files
        .iter()
        .chain(&dirs)
        .map(|n| (n, identity(n.path)))
        .collect();
    for (i, (out, id)) in written.iter().enumerate() {
        let Some(id) = id else { continue };
        if let Some((other, _)) = written[..i].iter().find(|(_, o)| o.as_ref() == Some(id)) {
            return Err(Error::usage(format!(
                "{} {} and {} {} both name one file: one would overwrite the other; give each \
                 its own path",
                other.flag,
                other.path.display(),
                out.flag,
                out.path.display()
            )));
        }
        if let Some((input, _)) = read.iter().find(|(_, r)| r.as_ref() == Some(id)) {
            return Err(Error::usage(format!(
                "{} {} is the file {} {} that this command reads: writing it would destroy it; \
                 choose another path",
                out.flag,
                out.path.display(),
                input.flag,
                input.path.display()
            )));
        }
    }
    Ok(())
}

/// Refuses to run with stdout closed (`>&-`): the Rust runtime then puts /dev/null, opened for
/// reading and writing, in its place, so what the command prints would be lost without a word.
/// A stdout the shell sends to /dev/null (`>/dev/null`) is opened for writing only, and runs; one
/// opened for both on purpose (Python's `subprocess.DEVNULL`) cannot be told from a closed one.
pub fn check_stdout() -> peerlink::Result<()> {
    use std::os::fd::AsFd;
    let closed = || {
        let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().ok()?);
        let (out, null) = (
            stdout.metadata().ok()?,
            std::fs::metadata("/dev/null").ok()?,
        );
        let is_null = out.file_type() == null.file_type() && out.rdev() == null.rdev();
        let fdinfo = std::fs::read_to_string("/proc/self/fdinfo/1").ok()?;
        let flags = fdinfo.lines().find_map(|l| l.strip_prefix("flags:"))?;
        let flags = u32::from_str_radix(flags.trim(), 8).ok()?;
        Some(is_null && flags & libc::O_ACCMODE as u32 == libc::O_RDWR as u32)
    };
    if closed() == Some(true) {
        return Err(Error::usage(
            "stdout is closed (`>&-`, or /dev/null opened for reading and writing, as the runtime \
             puts in place of a closed one): what peerlink prints would be lost; to discard it, \
             send it to /dev/null for writing (`>/dev/null`)",
        ));
    }
    Ok(())
}
