//! The kernel ABI: everything the host and peerlink's CUDA kernels (`kernels/*.cu`) must agree on,
//! in one place — the program's source, the copy descriptor, the all-reduce's entry points,
//! argument and flag layout, the resident worker's argument, control words and ring slots, and
//! how long a kernel spins. Each layout is asserted at compile time where it can be, and checked
//! against the CUDA source in the tests. The files that launch and drive the kernels (`kernels`,
//! `collective`, `resident`, `batches`) import from here and from nothing of each other's ABI.

use cudarc::driver::DeviceRepr;

use crate::backend::collective::{
    AllReduceKernel, DataType, Reduction, Waiting, FLAG_BYTES, MAX_RANKS, PACKET_MAX_BYTES,
    PEER_TIMEOUT_NS,
};

/// All kernels, compiled as one program (latency.cu, collective.cu and resident.cu use spin.cu's
/// timer helper; resident.cu copies with copy.cu's code).
pub(super) const SOURCE: &str = concat!(
    include_str!("../../../kernels/copy.cu"),
    "\n",
    include_str!("../../../kernels/pattern.cu"),
    "\n",
    include_str!("../../../kernels/spin.cu"),
    "\n",
    include_str!("../../../kernels/latency.cu"),
    "\n",
    include_str!("../../../kernels/collective.cu"),
    "\n",
    include_str!("../../../kernels/resident.cu"),
);

/// How long a gate or a ping-pong wait spins before giving up: long enough for any issue phase,
/// short enough that a forgotten release costs seconds, not a hung GPU.
pub(super) const SPIN_TIMEOUT_NS: u64 = 5_000_000_000;

/// The program's entry points besides the all-reduce's (`entry_point`): the `extern "C"`
/// names `Kernels` loads.
pub(super) mod entry {
    pub const COPY: &str = "copy_bytes";
    pub const BATCH: &str = "copy_batch";
    pub const FILL_PATTERN: &str = "fill_pattern";
    pub const FIND_MISMATCH: &str = "find_mismatch";
    pub const SPIN: &str = "spin_until_released";
    pub const CHASE: &str = "pointer_chase";
    pub const PING: &str = "ping";
    pub const PONG: &str = "pong";
    pub const BUSY: &str = "busy";
    pub const RESIDENT: &str = "resident_worker";
    /// Every one of them, for the tests.
    #[cfg(test)]
    pub const ALL: [&str; 10] = [
        COPY,
        BATCH,
        FILL_PATTERN,
        FIND_MISMATCH,
        SPIN,
        CHASE,
        PING,
        PONG,
        BUSY,
        RESIDENT,
    ];
}

/// Bytes of one copy descriptor of `copy_batch` (struct CopyDescriptor in copy.cu).
pub(super) const DESCRIPTOR_BYTES: usize = 24;

/// One copy of a batch: unified destination and source addresses, and a length, laid out as
/// copy.cu's `CopyDescriptor` (three u64, no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Descriptor {
    pub(super) dst: u64,
    pub(super) src: u64,
    pub(super) len: u64,
}

// The GPU reads the host's bytes as they are: both must agree on the layout and byte order.
const _: () = assert!(std::mem::size_of::<Descriptor>() == DESCRIPTOR_BYTES);
const _: () = assert!(cfg!(target_endian = "little"), "GPUs are little-endian");

// ---- the all-reduce (collective.cu) ----

/// Threads per block of the all-reduce kernels (`ALL_REDUCE_THREADS` in collective.cu).
pub(super) const ALL_REDUCE_THREADS: u32 = 512;
/// The most blocks one all-reduce launch uses: the flag layout holds this many
/// (`ALL_REDUCE_MAX_BLOCKS` in collective.cu).
pub(super) const ALL_REDUCE_MAX_BLOCKS: u32 = 512;
/// Blocks resident per SM (`ALL_REDUCE_BLOCKS_PER_SM`, the kernels' launch bounds).
pub(super) const ALL_REDUCE_BLOCKS_PER_SM: u32 = 2;
/// The two meetings of every call, start and end (`START_PHASE`, `END_PHASE`).
pub(super) const PHASES: usize = 2;

/// Bytes of a flag block the kernels use: one u32 counter per block index, then one u32 slot per
/// phase, block index and rank.
pub(super) const FLAG_BYTES_USED: usize =
    4 * ALL_REDUCE_MAX_BLOCKS as usize * (1 + PHASES * MAX_RANKS);
/// Where the packet kernel's receive area starts in a flag block (`PACKET_AREA_OFFSET`).
pub(super) const PACKET_AREA_OFFSET: usize = 64 * 1024;
/// Calls alternate between two halves of the receive area (`PACKET_PARITIES`).
pub(super) const PACKET_PARITIES: usize = 2;
/// Bytes of the receive area: an 8-byte packet per 4-byte word of the largest payload, per
/// sending rank and parity.
pub(super) const PACKET_AREA_BYTES: usize =
    PACKET_PARITIES * MAX_RANKS * (PACKET_MAX_BYTES / 4) * 8;
const _: () = assert!(
    FLAG_BYTES_USED <= PACKET_AREA_OFFSET && PACKET_AREA_OFFSET + PACKET_AREA_BYTES <= FLAG_BYTES,
    "the flag layout outgrows FLAG_BYTES"
);

// A bounded wait for peers outlasts a gate's longest hold (see `PEER_TIMEOUT_NS`).
const _: () = assert!(PEER_TIMEOUT_NS == 2 * SPIN_TIMEOUT_NS);

/// The entry points, as (kernel, element type); `Kernels` loads them in this order.
pub(super) const ALL_REDUCE_VARIANTS: [(AllReduceKernel, DataType); 9] = [
    (AllReduceKernel::OneShot, DataType::F32),
    (AllReduceKernel::OneShot, DataType::Bf16),
    (AllReduceKernel::OneShot, DataType::F16),
    (AllReduceKernel::TwoShot, DataType::F32),
    (AllReduceKernel::TwoShot, DataType::Bf16),
    (AllReduceKernel::TwoShot, DataType::F16),
    (AllReduceKernel::OneShotPackets, DataType::F32),
    (AllReduceKernel::OneShotPackets, DataType::Bf16),
    (AllReduceKernel::OneShotPackets, DataType::F16),
];

/// The kernel function for one variant in collective.cu.
pub(super) fn entry_point(kernel: AllReduceKernel, dtype: DataType) -> &'static str {
    match (kernel, dtype) {
        (AllReduceKernel::OneShot, DataType::F32) => "all_reduce_one_shot_f32",
        (AllReduceKernel::OneShot, DataType::Bf16) => "all_reduce_one_shot_bf16",
        (AllReduceKernel::TwoShot, DataType::F32) => "all_reduce_two_shot_f32",
        (AllReduceKernel::TwoShot, DataType::Bf16) => "all_reduce_two_shot_bf16",
        (AllReduceKernel::OneShotPackets, DataType::F32) => "all_reduce_one_shot_packets_f32",
        (AllReduceKernel::OneShotPackets, DataType::Bf16) => "all_reduce_one_shot_packets_bf16",
        (AllReduceKernel::OneShot, DataType::F16) => "all_reduce_one_shot_f16",
        (AllReduceKernel::TwoShot, DataType::F16) => "all_reduce_two_shot_f16",
        (AllReduceKernel::OneShotPackets, DataType::F16) => "all_reduce_one_shot_packets_f16",
    }
}

/// One rank's kernel arguments, laid out as collective.cu's `AllReduceArgs` (passed by value).
/// Unused rank slots are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AllReduceArgs {
    inputs: [u64; MAX_RANKS],
    outputs: [u64; MAX_RANKS],
    flags: [u64; MAX_RANKS],
    /// The release word's address (pinned host memory mapped for the GPU), 0 for none.
    release: u64,
    elements: u64,
    /// How long a wait for peers may last before the kernel traps; 0 for as long as it takes
    /// (until the release word is raised).
    timeout_ns: u64,
    rank: u32,
    ranks: u32,
    /// What each f32 sum is multiplied by before its rounding (`Reduction::scale`).
    scale: f32,
    /// Zero: spells out the tail padding to the struct's 8-byte alignment, so every byte the
    /// kernel receives is defined.
    padding: u32,
}

/// Bytes of collective.cu's `AllReduceArgs`: three address arrays, three u64, two u32, an f32 and
/// a u32, no padding.
pub(super) const ARGS_BYTES: usize = 3 * 8 * MAX_RANKS + 3 * 8 + 4 * 4;
const _: () = assert!(std::mem::size_of::<AllReduceArgs>() == ARGS_BYTES);

// SAFETY: plain `repr(C)` data with no padding, laid out as the kernels' argument (checked above
// and against the source in the tests).
unsafe impl DeviceRepr for AllReduceArgs {}

impl AllReduceArgs {
    /// The arguments shared by every rank (`rank` 0): the unified addresses of each rank's input,
    /// output and flag block, in rank order, the element count, `op`'s scale over these ranks,
    /// and how the kernels wait for each other (a release word by its address).
    pub(super) fn shared(
        inputs: &[u64],
        outputs: &[u64],
        flags: &[u64],
        elements: u64,
        op: Reduction,
        waiting: Waiting<u64>,
    ) -> Self {
        let (release, timeout_ns) = match waiting {
            Waiting::Bounded => (0, PEER_TIMEOUT_NS),
            Waiting::Released(address) => (address, 0),
        };
        let table = |addresses: &[u64]| {
            let mut table = [0; MAX_RANKS];
            table[..addresses.len()].copy_from_slice(addresses);
            table
        };
        AllReduceArgs {
            inputs: table(inputs),
            outputs: table(outputs),
            flags: table(flags),
            release,
            elements,
            timeout_ns,
            rank: 0,
            ranks: inputs.len() as u32,
            scale: op.scale(inputs.len()),
            padding: 0,
        }
    }

    pub(super) fn for_rank(self, rank: usize) -> Self {
        AllReduceArgs {
            rank: rank as u32,
            ..self
        }
    }
}

// ---- the resident worker (resident.cu) ----

/// Threads per block of the worker's kernel (`RESIDENT_THREADS` in resident.cu).
pub(super) const RESIDENT_THREADS: u32 = 512;
/// Entries of the board between the dispatcher and the copy blocks (`RESIDENT_BOARD_SLOTS`).
pub(super) const BOARD_SLOTS: usize = 64;
/// Bytes of one board entry (`BoardEntry`).
pub(super) const BOARD_ENTRY_BYTES: usize = 64;
/// The length bits of a slot's last word, and its two flags (`RESIDENT_LEN_MASK`, …).
pub(super) const LEN_MASK: u32 = (1 << 30) - 1;
pub(super) const GATED: u32 = 1 << 30;
pub(super) const BATCH: u32 = 1 << 31;
/// Control words (u64 indices): the GPU writes the first cache line, the host the second.
pub(super) const COMPLETED: usize = 0;
pub(super) const STATE: usize = 1;
/// The dispatcher's times, written at exit on a line of their own (`RESIDENT_RUN_NS` …
/// `RESIDENT_PUBLISH_NS`).
pub(super) const RUN_NS: usize = 16;
pub(super) const STOP: usize = 8;
pub(super) const HEARTBEAT: usize = 9;
pub(super) const CONTROL_WORDS: usize = 24;
/// u64 words per ring slot.
pub(super) const SLOT_WORDS: usize = 4;
/// The worker's states (`RESIDENT_RUNNING`, …); 0 until the kernel has started.
pub(super) const RUNNING: u64 = 1;
pub(super) const STOPPED: u64 = 2;
pub(super) const WATCHDOG: u64 = 3;

/// Addresses a slot can carry: 48 bits, as every x86-64 and ARM64 user address and CUDA's unified
/// addresses are.
pub(super) const ADDRESS_BITS: u32 = 48;

const _: () = assert!(GATED | BATCH | LEN_MASK == u32::MAX);
const _: () = assert!(
    STATE < STOP && STOP * 8 == 64 && HEARTBEAT < RUN_NS && RUN_NS + 7 <= CONTROL_WORDS,
    "the host's control words sit on the cache line after the GPU's"
);
const _: () = assert!(BOARD_ENTRY_BYTES == 8 * 8, "a BoardEntry is eight u64");

/// The kernel's argument, laid out as resident.cu's `ResidentArgs` (passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ResidentArgs {
    pub(super) ring: u64,
    pub(super) doorbells: u64,
    pub(super) control: u64,
    pub(super) board: u64,
    pub(super) progress: u64,
    pub(super) quit: u64,
    pub(super) ring_slots: u64,
    pub(super) watchdog_ns: u64,
}

// SAFETY: plain `repr(C)` data, eight u64 and no padding, laid out as the kernel's argument
// (checked against the source in the tests).
unsafe impl DeviceRepr for ResidentArgs {}

/// The tag of `ticket`'s lap round a ring of `ring_slots` (never 0: zeroed memory is no slot).
pub(super) fn lap_tag(ticket: u64, ring_slots: u64) -> u64 {
    (ticket / ring_slots) % 0xffff_ffff + 1
}

/// The four words of a slot for `ticket`: each carries 32 bits of the descriptor and the lap's tag.
pub(super) fn slot_words(
    ticket: u64,
    ring_slots: u64,
    src: u64,
    dst: u64,
    len_flags: u32,
) -> [u64; 4] {
    let tag = lap_tag(ticket, ring_slots) << 32;
    let low = |address: u64| address & 0xffff_ffff;
    let high = |address: u64| (address >> 32) & 0xffff;
    [
        tag | low(src),
        tag | low(dst),
        tag | high(src) | high(dst) << 16,
        tag | u64::from(len_flags),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_laid_out_as_in_copy_cu() {
        // The host writes descriptors straight into the memory the kernel reads: same offsets.
        assert_eq!(std::mem::offset_of!(Descriptor, dst), 0);
        assert_eq!(std::mem::offset_of!(Descriptor, src), 8);
        assert_eq!(std::mem::offset_of!(Descriptor, len), 16);
        assert_eq!(std::mem::size_of::<[Descriptor; 2]>(), 2 * DESCRIPTOR_BYTES);
        assert!(SOURCE.contains(
            "unsigned long long dst;\n    unsigned long long src;\n    unsigned long long len;"
        ));
    }

    #[test]
    fn constants_match_collective_cu() {
        for line in [
            format!("constexpr unsigned int MAX_RANKS = {MAX_RANKS};"),
            format!("constexpr unsigned int ALL_REDUCE_THREADS = {ALL_REDUCE_THREADS};"),
            format!("constexpr unsigned int ALL_REDUCE_MAX_BLOCKS = {ALL_REDUCE_MAX_BLOCKS};"),
            format!(
                "constexpr unsigned int ALL_REDUCE_BLOCKS_PER_SM = {ALL_REDUCE_BLOCKS_PER_SM};"
            ),
            "constexpr unsigned int START_PHASE = 0;".to_string(),
            format!("constexpr unsigned int END_PHASE = {};", PHASES - 1),
            format!(
                "constexpr unsigned int PACKET_MAX_BYTES = {} * 1024;",
                PACKET_MAX_BYTES / 1024
            ),
            format!(
                "constexpr unsigned long long PACKET_AREA_OFFSET = {} * 1024;",
                PACKET_AREA_OFFSET / 1024
            ),
            format!("constexpr unsigned int PACKET_PARITIES = {PACKET_PARITIES};"),
        ] {
            assert!(SOURCE.contains(&line), "collective.cu lacks `{line}`");
        }
        for (kernel, dtype) in ALL_REDUCE_VARIANTS {
            let name = entry_point(kernel, dtype);
            assert!(SOURCE.contains(&format!("{name}(const __grid_constant__ AllReduceArgs")));
        }
    }

    #[test]
    fn arguments_are_laid_out_as_in_collective_cu() {
        assert_eq!(std::mem::offset_of!(AllReduceArgs, inputs), 0);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, outputs), 64);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, flags), 128);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, release), 192);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, elements), 200);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, timeout_ns), 208);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, rank), 216);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, ranks), 220);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, scale), 224);
        assert_eq!(std::mem::offset_of!(AllReduceArgs, padding), 228);
        assert_eq!(std::mem::size_of::<AllReduceArgs>(), 232);
        assert!(SOURCE.contains(
            "    unsigned long long inputs[MAX_RANKS];\n    unsigned long long outputs[MAX_RANKS];\n    \
             unsigned long long flags[MAX_RANKS];\n    unsigned long long release;\n    unsigned \
             long long elements;\n    unsigned long long timeout_ns;\n    unsigned int rank;\n    unsigned int ranks;\n    float \
             scale;\n    unsigned int padding;\n};"
        ));
    }

    #[test]
    fn every_rank_gets_the_same_tables_and_its_own_index() {
        let shared = AllReduceArgs::shared(
            &[10, 20, 30],
            &[11, 21, 31],
            &[12, 22, 32],
            7,
            Reduction::Average,
            Waiting::Bounded,
        );
        let third = shared.for_rank(2);
        assert_eq!(third.rank, 2);
        assert_eq!(third.ranks, 3);
        assert_eq!(third.inputs, [10, 20, 30, 0, 0, 0, 0, 0]);
        assert_eq!(third.outputs[..3], [11, 21, 31]);
        assert_eq!(third.flags[..3], [12, 22, 32]);
        assert_eq!(third.elements, 7);
        assert_eq!((third.release, third.timeout_ns), (0, 10_000_000_000));
        assert_eq!(third.scale, 1.0 / 3.0);
        assert_eq!(third.padding, 0);
        let sum = AllReduceArgs::shared(
            &[10, 20, 30],
            &[11, 21, 31],
            &[12, 22, 32],
            7,
            Reduction::Sum,
            Waiting::Released(0x7f00_1234_5000),
        );
        assert_eq!(sum.scale, 1.0, "a sum's factor is exactly one");
        assert_eq!(
            (sum.release, sum.timeout_ns),
            (0x7f00_1234_5000, 0),
            "a released wait has no deadline"
        );
        assert_eq!(AllReduceArgs { rank: 0, ..third }, shared);
    }

    #[test]
    fn constants_match_resident_cu() {
        for line in [
            format!("constexpr unsigned int RESIDENT_THREADS = {RESIDENT_THREADS};"),
            format!("constexpr unsigned int RESIDENT_BOARD_SLOTS = {BOARD_SLOTS};"),
            "constexpr unsigned int RESIDENT_LEN_MASK = (1u << 30) - 1;".to_string(),
            "constexpr unsigned int RESIDENT_GATED = 1u << 30;".to_string(),
            "constexpr unsigned int RESIDENT_BATCH = 1u << 31;".to_string(),
            format!("constexpr unsigned int RESIDENT_COMPLETED = {COMPLETED};"),
            format!("constexpr unsigned int RESIDENT_STATE = {STATE};"),
            format!("constexpr unsigned int RESIDENT_STOP = {STOP};"),
            format!("constexpr unsigned int RESIDENT_HEARTBEAT = {HEARTBEAT};"),
            format!("constexpr unsigned long long RESIDENT_RUNNING = {RUNNING};"),
            format!("constexpr unsigned long long RESIDENT_STOPPED = {STOPPED};"),
            format!("constexpr unsigned long long RESIDENT_WATCHDOG = {WATCHDOG};"),
        ] {
            assert!(SOURCE.contains(&line), "resident.cu lacks `{line}`");
        }
    }

    #[test]
    fn arguments_and_board_are_laid_out_as_in_resident_cu() {
        assert_eq!(std::mem::size_of::<ResidentArgs>(), 64);
        assert_eq!(std::mem::offset_of!(ResidentArgs, watchdog_ns), 56);
        assert!(SOURCE.contains(
            "struct ResidentArgs {\n    unsigned long long ring;\n    unsigned long long \
             doorbells;\n    unsigned long long control;\n    unsigned long long board;\n    \
             unsigned long long progress;\n    unsigned long long quit;\n    unsigned long long \
             ring_slots;\n    unsigned long long watchdog_ns;\n};"
        ));
        assert!(SOURCE.contains("    unsigned long long unused[3];\n};"));
    }

    #[test]
    fn slot_words_carry_the_descriptor_and_the_lap_in_every_word() {
        let (src, dst) = (0x7f12_3456_789a, 0x0000_abcd_ef01_2345);
        let words = slot_words(5, 32, src, dst, 4096 | GATED);
        for word in words {
            assert_eq!(
                word >> 32,
                1,
                "ticket 5 of a 32-slot ring is in lap 0, tag 1"
            );
        }
        // Decoded as resident.cu's decode_slot does.
        let low = |w: u64| w & 0xffff_ffff;
        let upper = low(words[2]);
        assert_eq!(low(words[0]) | (upper & 0xffff) << 32, src);
        assert_eq!(low(words[1]) | (upper >> 16) << 32, dst);
        assert_eq!(low(words[3]) as u32 & LEN_MASK, 4096);
        assert_eq!(low(words[3]) as u32 & !LEN_MASK, GATED);
    }

    #[test]
    fn laps_have_distinct_nonzero_tags_and_wrap_without_zero() {
        let slots = 1024;
        assert_eq!(lap_tag(0, slots), 1);
        assert_eq!(lap_tag(1023, slots), 1);
        assert_eq!(lap_tag(1024, slots), 2);
        let last_lap = (0xffff_fffe) * slots;
        assert_eq!(lap_tag(last_lap, slots), 0xffff_ffff);
        assert_eq!(lap_tag(last_lap + slots, slots), 1, "wraps to 1, never 0");
        for lap in [0u64, 1, 77, 0xffff_fffe, 0xffff_ffff, 1 << 40] {
            let (this, next) = (
                lap_tag(lap * slots, slots),
                lap_tag((lap + 1) * slots, slots),
            );
            assert_ne!(
                this, next,
                "a slot's stale words never pass for the next lap's"
            );
            assert_ne!(this, 0);
        }
    }
}
