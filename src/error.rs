//! The library's one error type.
//!
//! Every message says what was wrong and, where there is something to do, what to do. The CLI maps
//! [`Error::exit_code`] onto the process exit status: 2 for anything the user typed or supplied, 1 for
//! failures while running (a CUDA error, a transfer that failed verification), 3 for a process of
//! a multi-process run stopped because another process failed.

use crate::units::format_bytes;
use std::path::PathBuf;

/// The exit status of a process whose group failed because of another rank (it died, hung or
/// never arrived), so that a launcher can tell the rank at fault from the ranks it stopped.
pub const GROUP_FAILED: i32 = 3;

/// The exit status of a run stopped by Ctrl-C or SIGTERM (128 + SIGINT, as shells report it).
pub const INTERRUPTED: i32 = 130;

/// Result alias used throughout the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command-line input: a value out of range, an unknown name, a malformed size.
    #[error("{0}")]
    Usage(String),

    /// A simulator preset (embedded or a user's JSON file) that cannot be used.
    #[error("simulator preset {origin}: {message}")]
    Preset { origin: String, message: String },

    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Real GPUs were required but none can be used.
    #[error("no NVIDIA GPU can be used: {0}")]
    NoGpu(String),

    /// A CUDA driver, NVRTC or NVML call failed.
    #[error("{call} failed: {message}")]
    Cuda { call: String, message: String },

    /// Peer access between two devices could not be enabled.
    #[error("cannot enable peer access from GPU {src} to GPU {dst}: {message}")]
    PeerAccess {
        src: usize,
        dst: usize,
        message: String,
    },

    /// A transfer delivered wrong bytes.
    #[error(
        "verification failed in {test} (GPU {src} -> GPU {dst}): first wrong byte at offset {offset} \
         (expected {expected:#04x}, found {found:#04x})"
    )]
    Verification {
        test: String,
        src: usize,
        dst: usize,
        offset: usize,
        expected: u8,
        found: u8,
    },

    /// An allocation found too little memory free while running: a GPU's, or the host's (which also
    /// holds the simulator's GPUs). What a run needs is checked before it starts where it can be
    /// counted, as a usage error; this is what is left.
    #[error(
        "out of memory on {place}: {} asked, {} free; ask for less, or free memory first",
        format_bytes(*.asked),
        format_bytes(*.free)
    )]
    OutOfMemory {
        place: String,
        asked: u64,
        free: u64,
    },

    /// The backend was asked for something it does not have (a freed buffer, an unknown stream).
    #[error("{0}")]
    InvalidHandle(String),

    /// A chart of the HTML report could not be drawn.
    #[error("cannot draw {0}")]
    Draw(String),

    /// A process of a multi-process run failed because another one did: it died, hung or never
    /// arrived (the sentence names it). Exit status 3, so that launchers can tell the rank at
    /// fault from the ranks it stopped.
    #[error("{0}")]
    Group(String),

    /// A rank started by `peerlink launch` failed; the launcher exits with `status`, the rank's
    /// own exit status (128 + the signal where a signal killed it).
    #[error("{message}")]
    RankFailed { message: String, status: u8 },

    /// A stop was requested ([`crate::interrupt`]) while this was being measured: it was dropped.
    #[error("interrupted: the run was stopped during this measurement")]
    Interrupted,
}

impl Error {
    /// The process exit status for this error: 2 for bad input, 1 for failures while running, 3
    /// where another rank of the group failed (a launched rank's own status from `peerlink
    /// launch`).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Preset { .. } => 2,
            Error::Io { .. }
            | Error::NoGpu(_)
            | Error::Cuda { .. }
            | Error::PeerAccess { .. }
            | Error::Verification { .. }
            | Error::OutOfMemory { .. }
            | Error::InvalidHandle(_)
            | Error::Draw(_) => 1,
            Error::Group(_) => GROUP_FAILED,
            Error::RankFailed { status, .. } => i32::from(*status),
            Error::Interrupted => INTERRUPTED,
        }
    }

    /// Bad usage or input (exit code 2), said in one sentence.
    pub fn usage(message: impl Into<String>) -> Self {
        Error::Usage(message.into())
    }

    /// Ok where `found` holds `expected` byte for byte (over the shorter of the two), else
    /// [`Error::Verification`] at the first byte that differs.
    pub(crate) fn check_bytes(
        test: impl Into<String>,
        src: usize,
        dst: usize,
        expected: &[u8],
        found: &[u8],
    ) -> Result<(), Error> {
        match expected.iter().zip(found).position(|(e, f)| e != f) {
            None => Ok(()),
            Some(offset) => Err(Error::Verification {
                test: test.into(),
                src,
                dst,
                offset,
                expected: expected[offset],
                found: found[offset],
            }),
        }
    }

    /// The same failure `at` bytes further on: a check of one piece of a buffer, reported for
    /// the whole buffer.
    pub(crate) fn shifted(self, at: usize) -> Self {
        match self {
            Error::Verification {
                test,
                src,
                dst,
                offset,
                expected,
                found,
            } => Error::Verification {
                test,
                src,
                dst,
                offset: at + offset,
                expected,
                found,
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_checked_alone_is_reported_at_its_offset_in_the_whole() {
        let piece = Error::check_bytes("t", 0, 1, &[1, 2, 3], &[1, 9, 3]).unwrap_err();
        match piece.shifted(16 << 20) {
            Error::Verification {
                offset,
                expected,
                found,
                ..
            } => assert_eq!((offset, expected, found), ((16 << 20) + 1, 2, 9)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Error::usage("x").shifted(5),
            Error::Usage(why) if why == "x"
        ));
    }

    #[test]
    fn bad_input_exits_2_and_runtime_failures_exit_1() {
        assert_eq!(Error::usage("x").exit_code(), 2);
        let preset = Error::Preset {
            origin: "a.json".into(),
            message: "m".into(),
        };
        assert_eq!(preset.exit_code(), 2);
        assert_eq!(Error::NoGpu("none".into()).exit_code(), 1);
        let cuda = Error::Cuda {
            call: "cuInit".into(),
            message: "m".into(),
        };
        assert_eq!(cuda.exit_code(), 1);
        let oom = Error::OutOfMemory {
            place: "GPU 0".into(),
            asked: 80 << 30,
            free: 60 << 30,
        };
        assert_eq!(oom.exit_code(), 1);
        assert_eq!(
            oom.to_string(),
            "out of memory on GPU 0: 80 GiB asked, 60 GiB free; ask for less, or free memory first"
        );
    }

    #[test]
    fn verification_message_names_test_pair_and_offset() {
        let e = Error::Verification {
            test: "ce-write".into(),
            src: 0,
            dst: 3,
            offset: 4096,
            expected: 0x12,
            found: 0x00,
        };
        let text = e.to_string();
        assert!(text.contains("ce-write"), "{text}");
        assert!(text.contains("GPU 0 -> GPU 3"), "{text}");
        assert!(text.contains("offset 4096"), "{text}");
    }
}
