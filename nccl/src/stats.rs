//! How many calls of each kind and size class were served by peerlink and how many forwarded to
//! NCCL, and which of peerlink's kernels the served ones ran: counted on every call (one relaxed
//! atomic add), printed at exit under `PEERLINK_NCCL_DEBUG=INFO`.

use std::sync::atomic::{AtomicU64, Ordering};

use peerlink::backend::collective::AllReduceKernel;

/// The calls counted: NCCL's collectives and point-to-point calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    AllReduce,
    Broadcast,
    Bcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

const CALLS: [Call; 11] = [
    Call::AllReduce,
    Call::Broadcast,
    Call::Bcast,
    Call::Reduce,
    Call::AllGather,
    Call::ReduceScatter,
    Call::AlltoAll,
    Call::Gather,
    Call::Scatter,
    Call::Send,
    Call::Recv,
];

impl Call {
    /// The C function's name.
    pub fn name(self) -> &'static str {
        match self {
            Call::AllReduce => "ncclAllReduce",
            Call::Broadcast => "ncclBroadcast",
            Call::Bcast => "ncclBcast",
            Call::Reduce => "ncclReduce",
            Call::AllGather => "ncclAllGather",
            Call::ReduceScatter => "ncclReduceScatter",
            Call::AlltoAll => "ncclAlltoAll",
            Call::Gather => "ncclGather",
            Call::Scatter => "ncclScatter",
            Call::Send => "ncclSend",
            Call::Recv => "ncclRecv",
        }
    }
}

/// Whether a call was served by peerlink or forwarded to NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Served,
    Forwarded,
}

/// Size classes: 0 bytes, then one per power of two (≤ 1 B, ≤ 2 B, ≤ 4 B, … ≤ 2⁶⁴ B), then calls
/// whose element type this library does not know.
const CLASSES: usize = 67;
const UNKNOWN_SIZE: usize = CLASSES - 1;

/// The bytes of one element of an `ncclDataType_t` (int8, uint8, int32, uint32, int64, uint64,
/// float16, float32, float64, bfloat16, float8 e4m3, float8 e5m2), or `None` for a type this
/// library does not know.
pub fn element_bytes(datatype: i32) -> Option<u64> {
    const SIZES: [u64; 12] = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];
    usize::try_from(datatype)
        .ok()
        .and_then(|index| SIZES.get(index).copied())
}

/// The size class of `count` elements of `datatype`: the bytes the call names, rounded up to a
/// power of two.
pub fn size_class(count: usize, datatype: i32) -> usize {
    match element_bytes(datatype).and_then(|bytes| bytes.checked_mul(count as u64)) {
        None => UNKNOWN_SIZE,
        Some(0) => 0,
        Some(bytes) => 1 + bytes.next_power_of_two().trailing_zeros() as usize,
    }
}

/// The class's bound as people write it: `≤ 4 KiB`.
fn class_label(class: usize) -> String {
    match class {
        0 => "0 B".to_string(),
        UNKNOWN_SIZE => "unknown size".to_string(),
        _ => {
            let exponent = class - 1;
            let (unit, shift) = [
                ("EiB", 60),
                ("PiB", 50),
                ("TiB", 40),
                ("GiB", 30),
                ("MiB", 20),
            ]
            .into_iter()
            .chain([("KiB", 10), ("B", 0)])
            .find(|(_, shift)| exponent >= *shift)
            .unwrap_or(("B", 0));
            format!("≤ {} {unit}", 1u64 << (exponent - shift))
        }
    }
}

/// The counters: per call, size class and route; and the served calls per kernel (in the order
/// of `AllReduceKernel::ALL`).
pub struct Counters {
    counts: [[[AtomicU64; 2]; CLASSES]; CALLS.len()],
    kernels: [AtomicU64; AllReduceKernel::ALL.len()],
}

impl Default for Counters {
    fn default() -> Self {
        Self::new()
    }
}

impl Counters {
    pub const fn new() -> Counters {
        Counters {
            counts: [const { [const { [const { AtomicU64::new(0) }; 2] }; CLASSES] }; CALLS.len()],
            kernels: [const { AtomicU64::new(0) }; AllReduceKernel::ALL.len()],
        }
    }

    /// Counts one call.
    pub fn count(&self, call: Call, class: usize, route: Route) {
        self.counts[call as usize][class.min(UNKNOWN_SIZE)][route as usize]
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one served call's kernel.
    pub fn count_kernel(&self, kernel: AllReduceKernel) {
        let index = AllReduceKernel::ALL.iter().position(|&k| k == kernel);
        if let Some(counter) = index.and_then(|i| self.kernels.get(i)) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The summary: a line of totals, then one line per call and size class that saw calls,
    /// then, where calls were served, how many each kernel summed.
    pub fn summary(&self) -> Vec<String> {
        let read = |call: Call, class: usize, route: Route| {
            self.counts[call as usize][class][route as usize].load(Ordering::Relaxed)
        };
        let mut lines = Vec::new();
        let (mut served, mut forwarded) = (0, 0);
        for call in CALLS {
            for class in 0..CLASSES {
                let (s, f) = (
                    read(call, class, Route::Served),
                    read(call, class, Route::Forwarded),
                );
                if s + f > 0 {
                    lines.push(format!(
                        "  {:<18} {:>12}: {s} served, {f} forwarded",
                        call.name(),
                        class_label(class)
                    ));
                }
                served += s;
                forwarded += f;
            }
        }
        lines.insert(
            0,
            format!("calls at exit: {served} served by peerlink, {forwarded} forwarded to NCCL"),
        );
        if served > 0 {
            let kernels: Vec<String> = AllReduceKernel::ALL
                .iter()
                .zip(&self.kernels)
                .map(|(kernel, count)| {
                    format!("{} {}", kernel.name(), count.load(Ordering::Relaxed))
                })
                .collect();
            lines.push(format!(
                "  served calls by peerlink's kernel: {}",
                kernels.join(", ")
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_powers_of_two_of_the_bytes_named() {
        assert_eq!(class_label(size_class(1, 7)), "≤ 4 B");
        assert_eq!(class_label(size_class(3, 7)), "≤ 16 B");
        assert_eq!(class_label(size_class(1024, 9)), "≤ 2 KiB");
        assert_eq!(class_label(size_class(256 << 20, 7)), "≤ 1 GiB");
        assert_eq!(class_label(size_class(0, 7)), "0 B");
        assert_eq!(class_label(size_class(5, 99)), "unknown size");
        assert_eq!(class_label(size_class(usize::MAX, 8)), "unknown size");
    }

    #[test]
    fn the_summary_counts_each_call_class_and_route() {
        let counters = Counters::new();
        for _ in 0..3 {
            counters.count(Call::AllReduce, size_class(1, 7), Route::Forwarded);
        }
        counters.count(Call::AllReduce, size_class(4096, 7), Route::Served);
        counters.count_kernel(AllReduceKernel::OneShotPackets);
        assert_eq!(
            counters.summary(),
            [
                "calls at exit: 1 served by peerlink, 3 forwarded to NCCL",
                "  ncclAllReduce             ≤ 4 B: 0 served, 3 forwarded",
                "  ncclAllReduce          ≤ 16 KiB: 1 served, 0 forwarded",
                "  served calls by peerlink's kernel: one-shot 0, two-shot 0, one-shot-packets 1",
            ]
        );
    }
}
