//! What the library writes on stderr, every line prefixed `peerlink-nccl:`.

use std::io::Write as _;

/// Writes `lines` on stderr, each prefixed (a failed write is dropped: logging never fails a call).
pub fn write(lines: &[String]) {
    let mut stderr = std::io::stderr().lock();
    for line in lines {
        let _ = writeln!(stderr, "peerlink-nccl: {line}");
    }
}

/// What the API tells of one communicator: as NCCL answers `ncclCommUserRank`, `ncclCommCount` and
/// `ncclCommCuDevice`, else as the creating call said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Communicator {
    pub address: usize,
    pub created_by: &'static str,
    pub rank: Option<i32>,
    pub ranks: Option<i32>,
    pub gpu: Option<i32>,
}

impl Communicator {
    /// One line: `communicator 0x… (ncclCommInitRank): rank 0 of 2, GPU 1; <why forwarded>`.
    pub fn line(&self, why_forwarded: &str) -> String {
        let known = |value: Option<i32>| value.map_or_else(|| "?".to_string(), |v| v.to_string());
        format!(
            "communicator {:#x} ({}): rank {} of {}, GPU {}; {why_forwarded}",
            self.address,
            self.created_by,
            known(self.rank),
            known(self.ranks),
            known(self.gpu)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_communicator_line_names_what_is_known_and_marks_the_rest() {
        let comm = Communicator {
            address: 0x1000,
            created_by: "ncclCommSplit",
            rank: Some(1),
            ranks: Some(2),
            gpu: None,
        };
        assert_eq!(
            comm.line("PEERLINK_NCCL_SERVE=none"),
            "communicator 0x1000 (ncclCommSplit): rank 1 of 2, GPU ?; PEERLINK_NCCL_SERVE=none"
        );
    }
}
