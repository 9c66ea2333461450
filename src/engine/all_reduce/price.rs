//! The all-reduce's cost model: each kernel's time at a size from the links' costs
//! ([`predict`]), the kernel picked where the sum goes ([`pick`]), and the picks kept (`Picks`,
//! for the engine's calls).

use crate::backend::collective::AllReduceKernel;
use crate::model::{CostModel, Hop, Resource};
use std::collections::HashMap;

/// A flag round trip between two GPUs' kernels: a store into a peer's memory seen by the peer and
/// answered (the H200 pair's GPU-initiated ping-pong: 0.70 µs one way, docs/reference.md). PCIe
/// pairs take longer; the cost model uses it only to rank the kernels, which pay it alike but for
/// how many exchanges each waits for.
pub const FLAG_ROUND_TRIP_US: f64 = 1.4;

/// Where an all-reduce's sum goes, which decides the local copies a kernel makes on top of its
/// own work (each priced with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Into other buffers than the inputs, within one process: no copies.
    Beside,
    /// Into the inputs themselves, within one process (PyTorch's `all_reduce_`, `ncclAllReduce`
    /// with `sendbuff == recvbuff`): a kernel that cannot reduce in place first copies each
    /// rank's input aside (at 1 GiB on the H200 pair that copy made the one-shot kernel 17%
    /// slower than the two-shot, which a pick ignoring it preferred).
    InPlace,
    /// Into each process's own buffer when the ranks are processes
    /// ([`crate::engine::all_reduce::GroupAllReduce`]): the peers reach only memory shared with them, so a
    /// kernel that reads the peers' inputs (one-shot, two-shot) first copies the rank's buffer
    /// into its shared one, and two-shot, which also writes the peers' outputs, copies the sum
    /// back; the packet kernel reads only its own buffer and copies nothing.
    AcrossProcesses,
    /// Symmetric memory across processes, which every rank reaches: summed in place as within
    /// one process ([`Placement::InPlace`]).
    Symmetric,
}

impl Placement {
    /// The local copies of the buffer one call of `kernel` makes on every rank.
    pub fn copies(self, kernel: AllReduceKernel) -> u32 {
        match (self, kernel) {
            (Placement::Beside, _) => 0,
            (Placement::InPlace | Placement::Symmetric, kernel) => u32::from(!kernel.in_place()),
            (Placement::AcrossProcesses, AllReduceKernel::OneShotPackets) => 0,
            (Placement::AcrossProcesses, AllReduceKernel::OneShot) => 1,
            (Placement::AcrossProcesses, AllReduceKernel::TwoShot) => 2,
        }
    }
}

/// Flag round trips a kernel waits for: one-shot meets its peers before reading and after (so
/// that no input is changed while read); two-shot once more between its reduce-scatter and
/// all-gather; the packet kernel meets no one and waits only for its peers' first packets, one
/// way.
fn flag_exchanges(kernel: AllReduceKernel) -> f64 {
    match kernel {
        AllReduceKernel::OneShot => 2.0,
        AllReduceKernel::TwoShot => 3.0,
        AllReduceKernel::OneShotPackets => 0.5,
    }
}

/// Bytes each directed pair (p → r) carries in one all-reduce of `bytes` over `ranks`: one-shot
/// reads every peer's whole input; two-shot reads a slice from each peer and writes a slice to it;
/// the packet kernel pushes every peer its whole input as packets, half of them data.
fn pair_bytes(kernel: AllReduceKernel, bytes: u64, ranks: usize) -> f64 {
    match kernel {
        AllReduceKernel::OneShot => bytes as f64,
        AllReduceKernel::TwoShot => 2.0 * bytes as f64 / ranks as f64,
        AllReduceKernel::OneShotPackets => 2.0 * bytes as f64,
    }
}

/// The cost model's time for `kernel` reducing `bytes` over `devices`, µs: a launch, its flag
/// exchanges, and its bytes through the busiest link (each directed pair at an SM kernel's rate,
/// and what every pair puts on a shared link or switch port together at that resource's rate).
/// One rank's kernel meets no one and reads and writes its own memory: a local copy, whichever
/// kernel. `None` where a pair has no P2P.
pub fn predict(
    model: &CostModel,
    devices: &[usize],
    kernel: AllReduceKernel,
    bytes: u64,
) -> Option<f64> {
    if let [device] = *devices {
        return Some(model.cost(Hop::Local { device })?.time_us(bytes));
    }
    let per_pair = pair_bytes(kernel, bytes, devices.len());
    let mut launch_us: f64 = 0.0;
    let mut link_us: f64 = 0.0;
    let mut shared: HashMap<Resource, f64> = HashMap::new();
    for &r in devices {
        for &p in devices {
            if p == r {
                continue;
            }
            let hop = Hop::PeerSm { src: p, dst: r };
            let cost = model.cost(hop)?;
            launch_us = launch_us.max(cost.alpha_us);
            link_us = link_us.max(per_pair / cost.beta_gbps / 1e3);
            for resource in model.resources(hop) {
                *shared.entry(resource).or_default() += per_pair;
            }
        }
    }
    for (resource, load) in shared {
        link_us = link_us.max(load / model.capacity_gbps(resource) / 1e3);
    }
    Some(launch_us + flag_exchanges(kernel) * FLAG_ROUND_TRIP_US + link_us)
}

/// The kernel the cost model picks for `bytes` over `devices` with the sum `placed` so, among
/// those that take the size (the earlier in `AllReduceKernel::ALL` on a tie), and its predicted
/// time: the kernel's own ([`predict`]) and its copies' (`placed.copies`, the slowest GPU's copy
/// each). `None` where a pair has no P2P.
pub fn pick(
    model: &CostModel,
    devices: &[usize],
    bytes: u64,
    placed: Placement,
) -> Option<(AllReduceKernel, f64)> {
    let mut best: Option<(AllReduceKernel, f64)> = None;
    for kernel in AllReduceKernel::ALL
        .into_iter()
        .filter(|k| takes(*k, bytes))
    {
        let us = copies_us(model, devices, bytes, placed.copies(kernel))?
            + predict(model, devices, kernel, bytes)?;
        if best.is_none_or(|(_, b)| us < b) {
            best = Some((kernel, us));
        }
    }
    best
}

/// `count` local copies of `bytes` on every GPU of `devices`, µs: the slowest GPU's copy each.
fn copies_us(model: &CostModel, devices: &[usize], bytes: u64, count: u32) -> Option<f64> {
    if count == 0 {
        return Some(0.0);
    }
    let copy_us = devices
        .iter()
        .map(|&device| model.cost(Hop::Local { device }).map(|c| c.time_us(bytes)))
        .try_fold(0.0_f64, |slowest, us| Some(slowest.max(us?)))?;
    Some(f64::from(count) * copy_us)
}

/// Whether `kernel` takes an all-reduce of `bytes`.
pub fn takes(kernel: AllReduceKernel, bytes: u64) -> bool {
    usize::try_from(bytes).is_ok_and(|len| len <= kernel.max_len())
}

/// Picks kept per list of GPUs before they start over: sizes without end would grow the table
/// without end (as the engine's plans start over).
const PICKS_KEPT: usize = 4096;

/// The cost model's picks, kept per list of GPUs, size and placement: pricing the kernels is
/// microseconds of CPU that every call of a size would pay again.
#[derive(Debug, Default)]
pub(super) struct Picks(HashMap<Vec<usize>, HashMap<(usize, Placement), AllReduceKernel>>);

impl Picks {
    /// The kernel [`pick`] picks for `len` bytes over `devices` placed so, priced at its first
    /// call; `None` where a pair has no P2P.
    pub(super) fn get(
        &mut self,
        model: &CostModel,
        devices: &[usize],
        len: usize,
        placed: Placement,
    ) -> Option<AllReduceKernel> {
        if let Some(&kernel) = self.0.get(devices).and_then(|s| s.get(&(len, placed))) {
            return Some(kernel);
        }
        let (kernel, _) = pick(model, devices, len as u64, placed)?;
        let sizes = self.0.entry(devices.to_vec()).or_default();
        if sizes.len() >= PICKS_KEPT {
            sizes.clear();
        }
        sizes.insert((len, placed), kernel);
        Some(kernel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::collective::PACKET_MAX_BYTES;
    use crate::model::test_support::{dgx1, nvswitch8};

    #[test]
    fn packets_are_picked_for_small_buffers_and_two_shot_for_large_on_eight_gpus() {
        let model = CostModel::from_topology(&nvswitch8());
        let all: Vec<usize> = (0..8).collect();
        let beside = |bytes| pick(&model, &all, bytes, Placement::Beside).unwrap();
        assert_eq!(beside(4 << 10).0, AllReduceKernel::OneShotPackets);
        assert_eq!(beside(256 << 20).0, AllReduceKernel::TwoShot);
        // The predictions grow with the size, and the pick is the cheapest kernel that takes it.
        for bytes in [4, 64 << 10, (64 << 10) + 4, 64 << 20] {
            let (kernel, us) = beside(bytes);
            for other in AllReduceKernel::ALL
                .into_iter()
                .filter(|&k| takes(k, bytes))
            {
                assert!(
                    predict(&model, &all, other, bytes).unwrap() >= us,
                    "{bytes}: {kernel:?}"
                );
            }
        }
        for kernel in AllReduceKernel::ALL {
            assert!(
                predict(&model, &all, kernel, 64 << 10).unwrap()
                    > predict(&model, &all, kernel, 4).unwrap()
            );
        }
    }

    #[test]
    fn two_gpus_take_packets_up_to_their_limit_then_one_shot_wins_on_flags() {
        let model = CostModel::from_topology(&nvswitch8());
        let limit = PACKET_MAX_BYTES as u64;
        for (bytes, want) in [
            (4, AllReduceKernel::OneShotPackets),
            (limit, AllReduceKernel::OneShotPackets),
            (limit + 4, AllReduceKernel::OneShot),
            (1 << 20, AllReduceKernel::OneShot),
            (1 << 30, AllReduceKernel::OneShot),
        ] {
            let (kernel, _) = pick(&model, &[0, 1], bytes, Placement::Beside).unwrap();
            assert_eq!(kernel, want, "{bytes}");
        }
        // At 4 bytes the packet kernel saves one and a half flag round trips.
        let saved = predict(&model, &[0, 1], AllReduceKernel::OneShot, 4).unwrap()
            - predict(&model, &[0, 1], AllReduceKernel::OneShotPackets, 4).unwrap();
        assert!((saved - 1.5 * FLAG_ROUND_TRIP_US).abs() < 0.01, "{saved}");
    }

    #[test]
    fn in_place_the_one_shot_kernels_copy_aside_is_priced_and_two_shot_wins_large_pairs() {
        let model = CostModel::from_topology(&nvswitch8());
        let pair = [0, 1];
        let gib = 1 << 30;
        // Beside other buffers one-shot wins a pair (one flag exchange fewer, the same bytes)...
        assert_eq!(
            pick(&model, &pair, gib, Placement::Beside).unwrap().0,
            AllReduceKernel::OneShot
        );
        // ...in place it must first copy its input aside, which two-shot need not.
        let (kernel, us) = pick(&model, &pair, gib, Placement::InPlace).unwrap();
        assert_eq!(kernel, AllReduceKernel::TwoShot);
        assert_eq!(
            us,
            predict(&model, &pair, AllReduceKernel::TwoShot, gib).unwrap()
        );
        let copy_us = model.cost(Hop::Local { device: 0 }).unwrap().time_us(gib);
        let one_shot_us = predict(&model, &pair, AllReduceKernel::OneShot, gib).unwrap();
        assert!(
            one_shot_us + copy_us > us,
            "{one_shot_us} + {copy_us} against {us}"
        );
        // Small sums stay with the packet kernel, which reduces in place.
        assert_eq!(
            pick(&model, &pair, 4096, Placement::InPlace).unwrap().0,
            AllReduceKernel::OneShotPackets
        );
        let dgx1 = CostModel::from_topology(&dgx1());
        assert!(pick(&dgx1, &[0, 5], 4096, Placement::InPlace).is_none());
    }

    #[test]
    fn across_processes_the_copies_follow_the_kernel_and_symmetric_memory_spares_them() {
        use AllReduceKernel::*;
        let copies =
            |placed: Placement| [OneShotPackets, OneShot, TwoShot].map(|k| placed.copies(k));
        assert_eq!(copies(Placement::Beside), [0, 0, 0]);
        assert_eq!(copies(Placement::InPlace), [0, 1, 0]);
        assert_eq!(copies(Placement::Symmetric), [0, 1, 0]);
        assert_eq!(copies(Placement::AcrossProcesses), [0, 1, 2]);
        // In symmetric memory two-shot copies nothing, and wins large sums as within a process.
        let model = CostModel::from_topology(&nvswitch8());
        let all: Vec<usize> = (0..8).collect();
        let (symmetric, _) = pick(&model, &all, 256 << 20, Placement::Symmetric).unwrap();
        assert_eq!(symmetric, TwoShot);
    }

    #[test]
    fn one_rank_is_priced_as_a_local_copy_and_copies_nothing_it_need_not() {
        use AllReduceKernel::*;
        let model = CostModel::from_topology(&nvswitch8());
        let copy_us = |bytes| model.cost(Hop::Local { device: 3 }).unwrap().time_us(bytes);
        for kernel in AllReduceKernel::ALL {
            assert_eq!(
                predict(&model, &[3], kernel, 1 << 20),
                Some(copy_us(1 << 20))
            );
        }
        // Across processes: packets (no copy) while they take the size, then one-shot's one copy
        // beats two-shot's two.
        let across = |bytes| pick(&model, &[3], bytes, Placement::AcrossProcesses).unwrap();
        assert_eq!(across(4096).0, OneShotPackets);
        let (kernel, us) = across(64 << 20);
        assert_eq!(kernel, OneShot);
        assert_eq!(us, 2.0 * copy_us(64 << 20));
    }

    #[test]
    fn a_pair_without_p2p_has_no_prediction() {
        let model = CostModel::from_topology(&dgx1());
        // GPUs 0 and 5 of a DGX-1 have no NVLink and no P2P.
        assert!(pick(&model, &[0, 5], 4096, Placement::Beside).is_none());
        assert!(pick(&model, &[0, 1, 2, 3], 4096, Placement::Beside).is_some());
    }

    #[test]
    fn kept_picks_are_the_picks_and_start_over_when_full() {
        let model = CostModel::from_topology(&nvswitch8());
        let mut picks = Picks::default();
        for len in (1..=PICKS_KEPT + 1).map(|i| i * 4) {
            let want = pick(&model, &[0, 1], len as u64, Placement::InPlace).map(|p| p.0);
            assert_eq!(picks.get(&model, &[0, 1], len, Placement::InPlace), want);
        }
        assert_eq!(picks.0[&vec![0, 1]].len(), 1);
        assert!(picks
            .get(
                &CostModel::from_topology(&dgx1()),
                &[0, 5],
                4,
                Placement::Beside
            )
            .is_none());
    }
}
