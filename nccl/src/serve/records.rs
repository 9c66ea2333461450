//! What each rank of a communicator tells the others at its set-up, through the real NCCL (an
//! all-gather of one [`Record`] per rank): its host, its process and its GPU, a token naming
//! the communicator within its process, and (rank 0) the port where the ranks of several
//! processes meet. From every rank's record each rank decides the same way
//! whether peerlink serves the communicator ([`decide`]).

use std::hash::{Hash, Hasher};

/// Bytes of one rank's record on the wire.
pub const RECORD_BYTES: usize = 56;

/// One rank of a communicator, as it tells the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// A hash of this boot's id and the host's name: equal for processes of one host.
    pub host: u64,
    pub process: u64,
    pub gpu: u64,
    /// A hash of the GPU's PCI bus id: processes that number GPUs alike agree on every rank's.
    pub bus: u64,
    /// This rank's name for the communicator in its process (its rank 0's names it for all).
    pub token: u64,
    pub rank: u64,
    /// Rank 0's rendezvous port on this host's loopback for ranks of several processes (0 for
    /// other ranks).
    pub port: u64,
}

impl Record {
    /// This process's record for rank `rank` on `gpu` (PCI bus id `bus_id`), with rank 0's
    /// rendezvous `port`.
    pub fn mine(rank: usize, (gpu, bus_id): (usize, &str), token: u64, port: u16) -> Record {
        let sysfs = peerlink::topology::sysfs::Sysfs::system();
        Record {
            host: hash(&(sysfs.boot_id(), sysfs.host_name())),
            process: u64::from(std::process::id()),
            gpu: gpu as u64,
            bus: hash(bus_id),
            token,
            rank: rank as u64,
            port: u64::from(port),
        }
    }

    fn words(self) -> [u64; RECORD_BYTES / 8] {
        let Record {
            host,
            process,
            gpu,
            bus,
            token,
            rank,
            port,
        } = self;
        [host, process, gpu, bus, token, rank, port]
    }

    pub fn to_bytes(self) -> [u8; RECORD_BYTES] {
        let mut bytes = [0; RECORD_BYTES];
        for (i, word) in self.words().into_iter().enumerate() {
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
            bus: word(3),
            token: word(4),
            rank: word(5),
            port: word(6),
        }
    }
}

/// A hash that is the same in every process of this build (the standard one's keys are fixed).
pub fn hash<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// How peerlink serves a communicator, decided from every rank's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every rank is a thread of this process, on distinct GPUs with P2P between every two:
    /// rank `i` on `gpus[i]`; rank 0's token names the communicator in this process.
    ThisProcess { gpus: Vec<usize>, token: u64 },
    /// Every rank is a process of this host of its own (as torchrun starts them), on distinct
    /// GPUs with P2P between every two: rank `i` on `gpus[i]`; they meet at rank 0's `port`.
    ThisHost { gpus: Vec<usize>, port: u16 },
    /// Forwarded for good, and why.
    Forward(String),
}

/// What this process sees of the host's GPUs: each one's [`hash`] of its PCI bus id, by CUDA
/// ordinal, and whether a set of them has P2P between every two (for ranks in one process, or
/// in several).
pub struct Seen<'a> {
    pub buses: Vec<u64>,
    pub p2p: &'a dyn Fn(&[usize], bool) -> bool,
}

/// The decision every rank reaches from `records` (in rank order) and what its process sees.
pub fn decide(records: &[Record], seen: &Seen<'_>) -> Decision {
    let first = records[0];
    if records.iter().enumerate().any(|(i, r)| r.rank != i as u64) {
        return Decision::Forward("the ranks' set-up records came back out of order".into());
    }
    if records.iter().any(|r| r.host != first.host) {
        return Decision::Forward("its ranks span hosts: NCCL serves them".into());
    }
    let one_process = records.iter().all(|r| r.process == first.process);
    let processes: Vec<u64> = records.iter().map(|r| r.process).collect();
    if !one_process && (1..processes.len()).any(|i| processes[..i].contains(&processes[i])) {
        return Decision::Forward(
            "its ranks are processes of this host that drive several GPUs each: peerlink serves              ranks that are all threads of one process, or each a process of its own"
                .into(),
        );
    }
    let gpus: Vec<usize> = records.iter().map(|r| r.gpu as usize).collect();
    if let Some(why) = gpus_refused(records, &gpus, seen, one_process) {
        return Decision::Forward(why);
    }
    if one_process {
        Decision::ThisProcess {
            gpus,
            token: first.token,
        }
    } else {
        match u16::try_from(first.port) {
            Ok(port) if port != 0 => Decision::ThisHost { gpus, port },
            _ => Decision::Forward("rank 0 could not open a rendezvous port".into()),
        }
    }
}

/// Why the ranks' GPUs cannot run peerlink's all-reduce, if they cannot.
fn gpus_refused(
    records: &[Record],
    gpus: &[usize],
    seen: &Seen<'_>,
    one_process: bool,
) -> Option<String> {
    let count = seen.buses.len();
    if records.len() > peerlink::backend::collective::MAX_RANKS {
        return Some(format!(
            "{} ranks: peerlink's kernels take at most {}",
            records.len(),
            peerlink::backend::collective::MAX_RANKS
        ));
    }
    if let Some(gpu) = gpus.iter().find(|&&g| g >= count) {
        return Some(format!(
            "a rank is on GPU {gpu}, which peerlink does not see ({count} GPUs)"
        ));
    }
    // Ranks of other processes name GPUs by their own ordinals: only where every process numbers
    // them alike (no CUDA_VISIBLE_DEVICES of its own) do the names agree.
    if let Some(r) = records.iter().find(|r| seen.buses[r.gpu as usize] != r.bus) {
        return Some(format!(
            "rank {}'s GPU {} is another GPU in this process's numbering (a CUDA_VISIBLE_DEVICES              of its own?): peerlink serves ranks that number the host's GPUs alike",
            r.rank, r.gpu
        ));
    }
    if (1..gpus.len()).any(|i| gpus[..i].contains(&gpus[i])) {
        return Some("two of its ranks share a GPU".into());
    }
    if gpus.len() > 1 && !(seen.p2p)(gpus, one_process) {
        return Some(format!("GPUs {gpus:?} lack P2P between some two"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of (host, process, gpu) per rank, each GPU's bus as `Seen` below numbers it.
    fn records(specs: &[(u64, u64, u64)]) -> Vec<Record> {
        specs
            .iter()
            .enumerate()
            .map(|(rank, &(host, process, gpu))| Record {
                host,
                process,
                gpu,
                bus: 1000 + gpu,
                token: 100 + rank as u64,
                rank: rank as u64,
                port: if rank == 0 { 4242 } else { 0 },
            })
            .collect()
    }

    fn seen(p2p: &dyn Fn(&[usize], bool) -> bool) -> Seen<'_> {
        Seen {
            buses: (0..8).map(|g| 1000 + g).collect(),
            p2p,
        }
    }

    #[test]
    fn a_record_survives_its_bytes() {
        let record = Record::mine(3, (2, "00000000:18:00.0"), 0xfeed, 77);
        assert_eq!(Record::from_bytes(&record.to_bytes()), record);
        assert_eq!(record.process, u64::from(std::process::id()));
        assert_eq!((record.port, record.bus), (77, hash("00000000:18:00.0")));
    }

    #[test]
    fn threads_of_this_process_or_a_process_each_on_gpus_with_p2p_are_served() {
        let all = |_: &[usize], _: bool| true;
        assert_eq!(
            decide(&records(&[(1, 7, 0), (1, 7, 1)]), &seen(&all)),
            Decision::ThisProcess {
                gpus: vec![0, 1],
                token: 100
            }
        );
        assert!(matches!(
            decide(&records(&[(1, 7, 0)]), &seen(&all)),
            Decision::ThisProcess { .. }
        ));
        assert_eq!(
            decide(&records(&[(1, 7, 2), (1, 8, 0), (1, 9, 1)]), &seen(&all)),
            Decision::ThisHost {
                gpus: vec![2, 0, 1],
                port: 4242
            }
        );
        // P2P is asked for the layout the ranks are in.
        let threads_only = |_: &[usize], one_process: bool| one_process;
        assert!(matches!(
            decide(&records(&[(1, 7, 0), (1, 8, 1)]), &seen(&threads_only)),
            Decision::Forward(_)
        ));
    }

    #[test]
    fn everything_else_is_forwarded_and_says_why() {
        let forwarded = |records: &[Record], p2p: bool| {
            let p2p = move |_: &[usize], _: bool| p2p;
            match decide(records, &seen(&p2p)) {
                Decision::Forward(why) => why,
                other => panic!("{other:?}"),
            }
        };
        let of = |specs: &[(u64, u64, u64)]| records(specs);
        assert!(forwarded(&of(&[(1, 7, 0), (2, 7, 1)]), true).contains("span hosts"));
        assert!(forwarded(&of(&[(1, 7, 0), (1, 7, 0)]), true).contains("share a GPU"));
        assert!(forwarded(&of(&[(1, 7, 0), (1, 8, 0)]), true).contains("share a GPU"));
        assert!(forwarded(&of(&[(1, 7, 0), (1, 7, 9)]), true).contains("does not see"));
        assert!(forwarded(&of(&[(1, 7, 0), (1, 7, 5)]), false).contains("lack P2P"));
        let mixed = of(&[(1, 7, 0), (1, 7, 1), (1, 8, 2), (1, 8, 3)]);
        assert!(forwarded(&mixed, true).contains("several GPUs each"));
        // A process with a CUDA_VISIBLE_DEVICES of its own names another GPU "GPU 0".
        let mut renumbered = of(&[(1, 7, 0), (1, 8, 1)]);
        renumbered[1].bus = 1000;
        assert!(forwarded(&renumbered, true).contains("numbering"));
        let mut portless = of(&[(1, 7, 0), (1, 8, 1)]);
        portless[0].port = 0;
        assert!(forwarded(&portless, true).contains("rendezvous port"));
        let mut shuffled = of(&[(1, 7, 0), (1, 7, 1)]);
        shuffled.swap(0, 1);
        assert!(forwarded(&shuffled, true).contains("out of order"));
    }
}
