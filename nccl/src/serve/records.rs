//! What each rank of a communicator tells the others at its set-up, through the real NCCL (an
//! all-gather of one [`Record`] per rank): its host, its process and its GPU, and a token naming
//! the communicator within its process. From every rank's record each rank decides the same way
//! whether peerlink serves the communicator ([`decide`]).

use std::hash::{Hash, Hasher};

/// Bytes of one rank's record on the wire.
pub const RECORD_BYTES: usize = 40;

/// One rank of a communicator, as it tells the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// A hash of this boot's id and the host's name: equal for processes of one host.
    pub host: u64,
    pub process: u64,
    pub gpu: u64,
    /// This rank's name for the communicator in its process (its rank 0's names it for all).
    pub token: u64,
    pub rank: u64,
}

impl Record {
    /// This process's record for rank `rank` on `gpu`.
    pub fn mine(rank: usize, gpu: usize, token: u64) -> Record {
        let sysfs = peerlink::topology::sysfs::Sysfs::system();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (sysfs.boot_id(), sysfs.host_name()).hash(&mut hasher);
        Record {
            host: hasher.finish(),
            process: u64::from(std::process::id()),
            gpu: gpu as u64,
            token,
            rank: rank as u64,
        }
    }

    pub fn to_bytes(self) -> [u8; RECORD_BYTES] {
        let mut bytes = [0; RECORD_BYTES];
        for (i, word) in [self.host, self.process, self.gpu, self.token, self.rank]
            .into_iter()
            .enumerate()
        {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    pub fn from_bytes(bytes: &[u8]) -> Record {
        let word = |i: usize| {
            let mut w = [0; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        Record {
            host: word(0),
            process: word(1),
            gpu: word(2),
            token: word(3),
            rank: word(4),
        }
    }
}

/// How peerlink serves a communicator, decided from every rank's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every rank is a thread of this process, on distinct GPUs with P2P between every two:
    /// rank `i` on `gpus[i]`; rank 0's token names the communicator in this process.
    ThisProcess { gpus: Vec<usize>, token: u64 },
    /// Forwarded for good, and why.
    Forward(String),
}

/// The decision every rank reaches from `records` (in rank order): `p2p` says whether GPUs have
/// P2P between every two, `gpu_count` how many GPUs this process sees.
pub fn decide(records: &[Record], gpu_count: usize, p2p: impl Fn(&[usize]) -> bool) -> Decision {
    let first = records[0];
    if records.iter().enumerate().any(|(i, r)| r.rank != i as u64) {
        return Decision::Forward("the ranks' set-up records came back out of order".into());
    }
    if records.iter().any(|r| r.host != first.host) {
        return Decision::Forward("its ranks span hosts: NCCL serves them".into());
    }
    if records.iter().any(|r| r.process != first.process) {
        return Decision::Forward(
            "its ranks are processes of this host: serving ranks in other processes is not done \
             yet in this version"
                .into(),
        );
    }
    let gpus: Vec<usize> = records.iter().map(|r| r.gpu as usize).collect();
    if records.len() > peerlink::backend::collective::MAX_RANKS {
        return Decision::Forward(format!(
            "{} ranks: peerlink's kernels take at most {}",
            records.len(),
            peerlink::backend::collective::MAX_RANKS
        ));
    }
    if let Some(gpu) = gpus.iter().find(|&&g| g >= gpu_count) {
        return Decision::Forward(format!(
            "a rank is on GPU {gpu}, which peerlink does not see ({gpu_count} GPUs)"
        ));
    }
    if (1..gpus.len()).any(|i| gpus[..i].contains(&gpus[i])) {
        return Decision::Forward("two of its ranks share a GPU".into());
    }
    if gpus.len() > 1 && !p2p(&gpus) {
        return Decision::Forward(format!("GPUs {gpus:?} lack P2P between some two"));
    }
    Decision::ThisProcess {
        gpus,
        token: first.token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(specs: &[(u64, u64, u64)]) -> Vec<Record> {
        specs
            .iter()
            .enumerate()
            .map(|(rank, &(host, process, gpu))| Record {
                host,
                process,
                gpu,
                token: 100 + rank as u64,
                rank: rank as u64,
            })
            .collect()
    }

    #[test]
    fn a_record_survives_its_bytes() {
        let record = Record::mine(3, 2, 0xfeed);
        assert_eq!(Record::from_bytes(&record.to_bytes()), record);
        assert_eq!(record.process, u64::from(std::process::id()));
    }

    #[test]
    fn threads_of_this_process_on_gpus_with_p2p_are_served_and_everything_else_forwarded() {
        let all = |_: &[usize]| true;
        assert_eq!(
            decide(&records(&[(1, 7, 0), (1, 7, 1)]), 8, all),
            Decision::ThisProcess {
                gpus: vec![0, 1],
                token: 100
            }
        );
        assert!(matches!(
            decide(&records(&[(1, 7, 0)]), 8, all),
            Decision::ThisProcess { .. }
        ));
        let forwarded =
            |specs: &[(u64, u64, u64)], p2p: bool| match decide(&records(specs), 8, |_| p2p) {
                Decision::Forward(why) => why,
                other => panic!("{other:?}"),
            };
        assert!(forwarded(&[(1, 7, 0), (2, 7, 1)], true).contains("span hosts"));
        assert!(forwarded(&[(1, 7, 0), (1, 8, 1)], true).contains("processes of this host"));
        assert!(forwarded(&[(1, 7, 0), (1, 7, 0)], true).contains("share a GPU"));
        assert!(forwarded(&[(1, 7, 0), (1, 7, 9)], true).contains("does not see"));
        assert!(forwarded(&[(1, 7, 0), (1, 7, 5)], false).contains("lack P2P"));
    }
}
