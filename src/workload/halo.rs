//! Halo exchange: each GPU holds one domain of a decomposed grid (row-major f32 cells with a
//! one-cell halo) and, every step, sends its boundary faces to each neighbour and receives theirs
//! into its halo, in both directions at once.
//!
//! - 1-D: the GPUs in a ring; a domain is `face / 4` cells wide and two interior rows high, and
//!   exchanges its first and last interior rows (contiguous) with the GPUs before and after it.
//! - 2-D: the GPUs as a `px × py` torus, as square as `n` factors (`px ≥ py`); a domain is a square
//!   of `face / 4` cells a side, and exchanges rows (contiguous) up and down and columns (one cell
//!   per row: strided) left and right. A dimension one GPU wide is not split, so it exchanges
//!   nothing. Faces whose square domain would pass [`MAX_DOMAIN_BYTES`] are left out (on the
//!   simulator, those whose domain would pass the 1-D domain of the sweep's largest face).
//!
//! peerlink moves rows with copy-engine copies and a GPU's columns with one copy kernel of one
//! message per cell, storing straight into the neighbours' halos (a copy-engine batch where a pair
//! has no P2P). NCCL's side packs the columns into contiguous staging with a copy kernel, sends and
//! receives every face in one group, and unpacks. The sweep's size is one face's bytes; a step's
//! time is the slowest GPU's, and a face's bandwidth is its bytes over the step.

use super::kinds::{Contender, IssueMode, Variant, Workload};
use super::resources::{
    check_memory, enable_peers, footprint, ids, length, nccl, streams_on, Communicator,
};
use super::rows::{row, Measured};
use super::settings::{Counts, Settings};
use super::timing::{measure, Operation};
use crate::backend::collective::{BufferRange, PeerTransfer};
use crate::backend::{Backend, BufferCopy, BufferId, CopyMethod, Memory, Owned, StreamId};
use crate::bench::footprint::Footprint;
use crate::bench::progress::Progress;
use crate::pattern;
use crate::units::format_bytes;
use crate::workload::rows::Row;
use crate::{Error, Result};

/// Bytes of one cell (f32).
pub const CELL: usize = 4;

/// The largest 2-D domain on real GPUs: a square with 64 KiB faces (1.07 GB) fits, the next face
/// of a 4× sweep (256 KiB: 17 GB per GPU, and as much to fill and check on the host) does not.
pub const MAX_DOMAIN_BYTES: usize = 2 << 30;

/// The `px × py` grid of `ranks` GPUs: `py` the largest divisor of `ranks` no larger than its
/// square root, so the grid is as square as it can be, and `px ≥ py`.
pub fn grid(ranks: usize) -> (usize, usize) {
    let py = (1..=ranks)
        .take_while(|d| d * d <= ranks)
        .filter(|d| ranks.is_multiple_of(*d))
        .last()
        .unwrap_or(1);
    (ranks / py, py)
}

/// Cells of a domain: a run of one row, or of one column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    Row {
        row: usize,
        first: usize,
        cells: usize,
    },
    Column {
        col: usize,
        first: usize,
        cells: usize,
    },
}

impl Region {
    /// Whether its cells are one contiguous run.
    pub fn contiguous(self) -> bool {
        matches!(self, Region::Row { .. })
    }

    /// Its runs of contiguous bytes, (offset, length), in a domain `cols` cells wide.
    pub fn runs(self, cols: usize) -> Vec<(usize, usize)> {
        match self {
            Region::Row { row, first, cells } => vec![((row * cols + first) * CELL, cells * CELL)],
            Region::Column { col, first, cells } => (first..first + cells)
                .map(|row| ((row * cols + col) * CELL, CELL))
                .collect(),
        }
    }

    /// Its bytes, in order.
    pub fn bytes(self) -> usize {
        match self {
            Region::Row { cells, .. } | Region::Column { cells, .. } => cells * CELL,
        }
    }
}

/// One face moved each step: rank `from`'s `src` cells into rank `to`'s `dst` halo cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Face {
    pub from: usize,
    pub to: usize,
    pub src: Region,
    pub dst: Region,
}

/// A decomposition at one face size: every domain's shape and every face of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Cells per row, halo included.
    pub cols: usize,
    pub rows: usize,
    pub faces: Vec<Face>,
}

impl Layout {
    /// The decomposition `variant` of `ranks` GPUs with faces of `cells` cells.
    pub fn new(variant: Variant, ranks: usize, cells: usize) -> Layout {
        let row = |row, first| Region::Row { row, first, cells };
        let column = |col, first| Region::Column { col, first, cells };
        let mut faces = Vec::new();
        if variant == Variant::TwoD {
            let (px, py) = grid(ranks);
            let m = cells;
            let at = |x: usize, y: usize| (y % py) * px + x % px;
            for r in 0..ranks {
                let (x, y) = (r % px, r / px);
                if py > 1 {
                    faces.push(face(r, at(x, y + py - 1), row(1, 1), row(m + 1, 1)));
                    faces.push(face(r, at(x, y + 1), row(m, 1), row(0, 1)));
                }
                if px > 1 {
                    faces.push(face(r, at(x + px - 1, y), column(1, 1), column(m + 1, 1)));
                    faces.push(face(r, at(x + 1, y), column(m, 1), column(0, 1)));
                }
            }
            return Layout {
                cols: m + 2,
                rows: m + 2,
                faces,
            };
        }
        for r in 0..ranks {
            faces.push(face(r, (r + ranks - 1) % ranks, row(1, 0), row(3, 0)));
            faces.push(face(r, (r + 1) % ranks, row(2, 0), row(0, 0)));
        }
        Layout {
            cols: cells,
            rows: 4,
            faces,
        }
    }

    /// Bytes of one domain.
    pub fn domain_bytes(&self) -> usize {
        // Saturates: a 2-D domain of a huge face is only compared with a limit, and left out.
        self.cols.saturating_mul(self.rows).saturating_mul(CELL)
    }

    /// What domain `rank` holds after a step, from what every domain held before (`domains`).
    pub fn after_step(&self, rank: usize, domains: &[Vec<u8>]) -> Vec<u8> {
        let mut out = domains[rank].clone();
        for f in self.faces.iter().filter(|f| f.to == rank) {
            let src = &domains[f.from];
            for ((s, len), (d, _)) in f.src.runs(self.cols).into_iter().zip(f.dst.runs(self.cols)) {
                out[d..d + len].copy_from_slice(&src[s..s + len]);
            }
        }
        out
    }

    /// Domain `rank`'s bytes with every byte a step writes inverted: a missed face cannot pass.
    pub fn poisoned(&self, rank: usize, after: &[u8]) -> Vec<u8> {
        let mut out = after.to_vec();
        for f in self.faces.iter().filter(|f| f.to == rank) {
            for (d, len) in f.dst.runs(self.cols) {
                out[d..d + len].iter_mut().for_each(|b| *b = !*b);
            }
        }
        out
    }
}

fn face(from: usize, to: usize, src: Region, dst: Region) -> Face {
    Face { from, to, src, dst }
}

/// A face's runs as copies from `src` into `dst` (message by message).
fn face_copies(layout: &Layout, f: &Face, src: BufferId, dst: BufferId) -> Vec<BufferCopy> {
    f.src
        .runs(layout.cols)
        .into_iter()
        .zip(f.dst.runs(layout.cols))
        .map(|((s, len), (d, _))| BufferCopy {
            dst,
            dst_offset: d,
            src,
            src_offset: s,
            len,
        })
        .collect()
}

/// What each GPU queues in a step, on its own stream.
#[derive(Default)]
struct Queued {
    /// Copy-engine copies, one each.
    copies: Vec<BufferCopy>,
    /// One copy kernel (before the group, for NCCL's packing).
    kernel: Vec<BufferCopy>,
    /// One copy-engine batch (columns to a peer without P2P).
    engine_batch: Vec<BufferCopy>,
    /// One copy kernel after the group (NCCL's unpacking).
    after: Vec<BufferCopy>,
}

struct Exchange<'a> {
    backend: &'a dyn Backend,
    streams: &'a [StreamId],
    per_rank: Vec<Queued>,
    /// NCCL's group of sends and receives, between the packing and the unpacking.
    nccl: Option<(&'a Communicator<'a>, Vec<PeerTransfer>)>,
}

impl Exchange<'_> {
    /// peerlink's way of moving the faces, in words.
    fn describe(&self) -> String {
        let any = |f: fn(&Queued) -> bool| self.per_rank.iter().any(f);
        let mut ways = Vec::new();
        if any(|q| !q.copies.is_empty()) {
            ways.push("rows: copy engine");
        }
        if any(|q| !q.kernel.is_empty()) {
            ways.push("columns: one copy kernel per GPU");
        }
        if any(|q| !q.engine_batch.is_empty()) {
            ways.push("columns to GPUs without P2P: one copy-engine batch");
        }
        if ways == ["rows: copy engine"] {
            return "copy-engine copies".into();
        }
        ways.join("; ")
    }
}

impl Operation for Exchange<'_> {
    fn queue(&mut self, _step: u64) -> Result<()> {
        let backend = self.backend;
        for (q, &stream) in self.per_rank.iter().zip(self.streams) {
            for copy in &q.copies {
                backend.copy(stream, CopyMethod::CopyEngine, copy)?;
            }
            backend.copy_batch(stream, &q.kernel)?;
            backend.memcpy_batch(stream, &q.engine_batch)?;
        }
        if let Some((comm, transfers)) = &self.nccl {
            comm.nccl.send_recv(comm.id, self.streams, transfers)?;
        }
        for (q, &stream) in self.per_rank.iter().zip(self.streams) {
            backend.copy_batch(stream, &q.after)?;
        }
        Ok(())
    }
}

/// peerlink's step on `devices` (by rank): rows by copy engine, each GPU's columns by one kernel.
fn peerlink_step<'a>(
    backend: &'a dyn Backend,
    streams: &'a [StreamId],
    devices: &[usize],
    layout: &Layout,
    domains: &[BufferId],
) -> Exchange<'a> {
    let mut per_rank: Vec<Queued> = streams.iter().map(|_| Queued::default()).collect();
    for f in &layout.faces {
        let copies = face_copies(layout, f, domains[f.from], domains[f.to]);
        let q = &mut per_rank[f.from];
        if f.src.contiguous() {
            q.copies.extend(copies);
        } else if p2p(backend, devices[f.from], devices[f.to]) {
            q.kernel.extend(copies);
        } else {
            q.engine_batch.extend(copies);
        }
    }
    Exchange {
        backend,
        streams,
        per_rank,
        nccl: None,
    }
}

/// Whether GPUs `a` and `b` have P2P.
fn p2p(backend: &dyn Backend, a: usize, b: usize) -> bool {
    backend.topology().pair(a, b).is_some_and(|p| p.p2p)
}

/// NCCL's step: columns packed into `staging` (each GPU's send slots, then its receive slots, a
/// face each), every face in one group, columns unpacked.
fn nccl_step<'a>(
    backend: &'a dyn Backend,
    streams: &'a [StreamId],
    comm: &'a Communicator<'a>,
    layout: &Layout,
    domains: &[BufferId],
    staging: &[BufferId],
) -> Exchange<'a> {
    let mut per_rank: Vec<Queued> = streams.iter().map(|_| Queued::default()).collect();
    let mut used = vec![0usize; streams.len()];
    let mut transfers = Vec::new();
    for f in &layout.faces {
        let range = |buffer, offset, len| BufferRange {
            buffer,
            offset,
            len,
        };
        if f.src.contiguous() {
            let ((s, len), (d, _)) = (f.src.runs(layout.cols)[0], f.dst.runs(layout.cols)[0]);
            transfers.push(PeerTransfer {
                from: f.from,
                to: f.to,
                src: range(domains[f.from], s, len),
                dst: range(domains[f.to], d, len),
            });
            continue;
        }
        let bytes = f.src.bytes();
        let sent = used[f.from];
        used[f.from] += bytes;
        let received = used[f.to];
        used[f.to] += bytes;
        let packed = |region: Region, at: usize, domain, stage| {
            region
                .runs(layout.cols)
                .into_iter()
                .enumerate()
                .map(move |(k, (offset, len))| (offset, at + k * CELL, len, domain, stage))
        };
        for (offset, at, len, domain, stage) in
            packed(f.src, sent, domains[f.from], staging[f.from])
        {
            per_rank[f.from].kernel.push(BufferCopy {
                dst: stage,
                dst_offset: at,
                src: domain,
                src_offset: offset,
                len,
            });
        }
        for (offset, at, len, domain, stage) in
            packed(f.dst, received, domains[f.to], staging[f.to])
        {
            per_rank[f.to].after.push(BufferCopy {
                dst: domain,
                dst_offset: offset,
                src: stage,
                src_offset: at,
                len,
            });
        }
        transfers.push(PeerTransfer {
            from: f.from,
            to: f.to,
            src: range(staging[f.from], sent, bytes),
            dst: range(staging[f.to], received, bytes),
        });
    }
    Exchange {
        backend,
        streams,
        per_rank,
        nccl: Some((comm, transfers)),
    }
}

/// Staging bytes each GPU needs for NCCL's packed columns: a slot for every face it sends or
/// receives strided (neighbours are always other GPUs).
fn staging_bytes(layout: &Layout, rank: usize) -> usize {
    layout
        .faces
        .iter()
        .filter(|f| !f.src.contiguous() && (f.from == rank || f.to == rank))
        .map(|f| f.src.bytes())
        .sum()
}

/// Runs the halo sweep for each of `variants`.
pub fn run(
    backend: &dyn Backend,
    settings: &mut Settings,
    variants: &[Variant],
    progress: &dyn Progress,
) -> Result<Vec<Row>> {
    if let Some(bad) = settings.sizes.iter().find(|&&s| s % CELL as u64 != 0) {
        return Err(Error::usage(format!(
            "halo faces are whole f32 cells: {bad} bytes is not a multiple of {CELL}"
        )));
    }
    let devices = settings.devices.clone();
    let n = devices.len();
    let domain_limit = domain_limit(settings)?;
    for &variant in variants {
        let largest = length(settings.largest())?;
        let held = domains_footprint(
            &devices,
            variant,
            &Layout::new(variant, n, largest / CELL),
            domain_limit,
        );
        check_memory(backend, Workload::Halo, settings, &held)?;
    }
    enable_peers(backend, &devices)?;
    let streams = streams_on(backend, &devices)?;
    let stream_ids = ids(&streams);
    let comm = nccl(backend, &mut settings.notices)
        .map(|nccl| Communicator::new(nccl, &devices))
        .transpose()?;
    let issue = settings.issue.clone();
    let halo = Halo {
        backend,
        devices: &devices,
        streams: &stream_ids,
        comm: comm.as_ref(),
        issue: &issue,
        simulated: settings.simulated,
    };
    let mut rows = Vec::new();
    progress.start("halo", (variants.len() * settings.sizes.len()) as u64);
    for &variant in variants {
        let mut left_out = Vec::new();
        for bytes in settings.sizes_to_run() {
            let layout = Layout::new(variant, n, length(bytes)? / CELL);
            if variant == Variant::TwoD && layout.domain_bytes() > domain_limit {
                left_out.push(bytes);
            } else {
                let measured = halo.size(variant, bytes, &layout, settings.counts(bytes));
                match crate::interrupt::unless_stopped(measured)? {
                    Some(measured) => rows.extend(measured),
                    None => break,
                }
            }
            progress.step();
        }
        if let Some(first) = left_out.first() {
            settings.notices.push(format!(
                "{variant} halo: faces from {} up are left out: a square domain of that face \
                 would need more than {} per GPU",
                format_bytes(*first),
                format_bytes(domain_limit as u64)
            ));
        }
    }
    progress.finish();
    Ok(rows)
}

/// What one face size of `variant` holds at `layout` (a 2-D domain past `domain_limit` is left
/// out, so never more): a domain and its staging on each GPU; on the host every domain before a
/// step and after it.
fn domains_footprint(
    devices: &[usize],
    variant: Variant,
    layout: &Layout,
    domain_limit: usize,
) -> Footprint {
    let mut domain = layout.domain_bytes();
    if variant == Variant::TwoD {
        domain = domain.min(domain_limit);
    }
    let domain = domain as u64;
    let staging = |rank: usize| staging_bytes(layout, rank) as u64;
    footprint(
        devices,
        |rank| domain.saturating_add(staging(rank)),
        domain.saturating_mul(2 * devices.len() as u64),
    )
}

/// The largest domain a face may need. A 2-D domain grows with the square of its face. The
/// simulator copies on the CPU: there it may use what the 1-D domain of the sweep's largest face
/// uses, and no more.
fn domain_limit(settings: &Settings) -> Result<usize> {
    Ok(if settings.simulated {
        let n = settings.devices.len();
        Layout::new(Variant::OneD, n, length(settings.largest())? / CELL).domain_bytes()
    } else {
        MAX_DOMAIN_BYTES
    })
}

/// The GPUs, their streams and NCCL's communicator, ready to time one face size after another.
struct Halo<'a> {
    backend: &'a dyn Backend,
    devices: &'a [usize],
    streams: &'a [StreamId],
    comm: Option<&'a Communicator<'a>>,
    issue: &'a [IssueMode],
    simulated: bool,
}

/// One face size of one variant: the domains, and what each holds after a step.
struct Domains<'a> {
    variant: Variant,
    bytes: u64,
    layout: &'a Layout,
    counts: Counts,
    ids: &'a [BufferId],
    after: &'a [Vec<u8>],
}

impl Halo<'_> {
    /// One face size: a row per issue mode for peerlink, and for NCCL where it is there.
    fn size(
        &self,
        variant: Variant,
        bytes: u64,
        layout: &Layout,
        counts: Counts,
    ) -> Result<Vec<Row>> {
        let (backend, devices) = (self.backend, self.devices);
        let domain_bytes = layout.domain_bytes();
        let domains = owned_on(backend, devices, |_| domain_bytes)?;
        let staged = owned_on(backend, devices, |r| staging_bytes(layout, r).max(1))?;
        let (domain_ids, staging_ids) = (ids(&domains), ids(&staged));
        // What each domain holds after a step; what it held before is not kept (at 1 GiB faces a
        // 1-D domain is 4 GiB).
        let after: Vec<Vec<u8>> = {
            let before: Vec<Vec<u8>> = (0..devices.len())
                .map(|r| pattern::bytes(pattern::seed(&[bytes, r as u64]), domain_bytes))
                .collect();
            (0..devices.len())
                .map(|r| layout.after_step(r, &before))
                .collect()
        };
        let at = Domains {
            variant,
            bytes,
            layout,
            counts,
            ids: &domain_ids,
            after: &after,
        };
        let mut rows = Vec::new();
        for &issue in self.issue {
            let mut op = peerlink_step(backend, self.streams, devices, layout, &domain_ids);
            let algorithm = op.describe();
            rows.push(self.row(&at, Contender::Peerlink, &algorithm, issue, &mut op)?);
        }
        if let Some(comm) = self.comm {
            let algorithm = match variant {
                Variant::TwoD => "columns packed by a copy kernel; grouped ncclSend/ncclRecv",
                _ => "grouped ncclSend/ncclRecv",
            };
            for &issue in self.issue {
                let mut op = nccl_step(
                    backend,
                    self.streams,
                    comm,
                    layout,
                    &domain_ids,
                    &staging_ids,
                );
                rows.push(self.row(&at, Contender::Nccl, algorithm, issue, &mut op)?);
            }
        }
        Ok(rows)
    }

    /// The step time of `op`, every domain poisoned before one more step and checked after it.
    fn row(
        &self,
        at: &Domains<'_>,
        contender: Contender,
        algorithm: &str,
        issue: IssueMode,
        op: &mut Exchange<'_>,
    ) -> Result<Row> {
        let (backend, devices) = (self.backend, self.devices);
        let Domains {
            variant,
            bytes,
            layout,
            ids,
            after,
            ..
        } = *at;
        let poison = || {
            (0..devices.len())
                .try_for_each(|r| backend.write(ids[r], 0, &layout.poisoned(r, &after[r])))
        };
        let check = || {
            let mut found = vec![0; layout.domain_bytes()];
            (0..devices.len()).try_for_each(|r| {
                backend.read(ids[r], 0, &mut found)?;
                let senders = layout.faces.iter().filter(|f| f.to == r);
                let from = senders
                    .map(|f| devices[f.from])
                    .next()
                    .unwrap_or(devices[r]);
                Error::check_bytes(
                    format!("halo {variant} {algorithm} {}", format_bytes(bytes)),
                    from,
                    devices[r],
                    &after[r],
                    &found,
                )
            })
        };
        let time_us = measure(backend, self.streams, issue, at.counts, op, poison, check)?;
        let m = Measured {
            variant: Some(variant),
            bytes,
            contender,
            algorithm: algorithm.to_string(),
            issue,
            iters: at.counts.iters,
            time_us,
        };
        Ok(row(Workload::Halo, devices.len(), self.simulated, None, m))
    }
}

/// A buffer on each GPU of `devices`, `bytes(rank)` long.
fn owned_on<'b>(
    backend: &'b dyn Backend,
    devices: &[usize],
    bytes: impl Fn(usize) -> usize,
) -> Result<Vec<Owned<'b, BufferId>>> {
    devices
        .iter()
        .enumerate()
        .map(|(r, &d)| {
            Ok(Owned::new(
                backend,
                backend.alloc(Memory::Device(d), bytes(r))?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_as_square_as_the_count_factors() {
        assert_eq!(grid(2), (2, 1));
        assert_eq!(grid(3), (3, 1));
        assert_eq!(grid(4), (2, 2));
        assert_eq!(grid(6), (3, 2));
        assert_eq!(grid(8), (4, 2));
        assert_eq!(grid(9), (3, 3));
    }

    /// Every halo cell a layout's faces write, per rank, counted.
    fn writes(layout: &Layout, ranks: usize) -> Vec<Vec<usize>> {
        let mut count = vec![vec![0; layout.cols * layout.rows]; ranks];
        for f in &layout.faces {
            assert_eq!(f.src.bytes(), f.dst.bytes());
            for (offset, len) in f.dst.runs(layout.cols) {
                for cell in &mut count[f.to][offset / CELL..(offset + len) / CELL] {
                    *cell += 1;
                }
            }
        }
        count
    }

    #[test]
    fn every_halo_cell_is_written_once_and_no_interior_cell_is() {
        for (variant, ranks, halo_cells) in [
            (Variant::OneD, 2, 2 * 5),
            (Variant::OneD, 3, 2 * 5),
            (Variant::TwoD, 2, 2 * 5),
            (Variant::TwoD, 4, 4 * 5),
            (Variant::TwoD, 8, 4 * 5),
        ] {
            let layout = Layout::new(variant, ranks, 5);
            for (rank, count) in writes(&layout, ranks).iter().enumerate() {
                assert!(
                    count.iter().all(|&c| c <= 1),
                    "{variant} {ranks}: {count:?}"
                );
                let written = count.iter().filter(|&&c| c == 1).count();
                assert_eq!(written, halo_cells, "{variant} {ranks} rank {rank}");
            }
        }
    }

    #[test]
    fn columns_are_strided_and_rows_contiguous() {
        let layout = Layout::new(Variant::TwoD, 4, 3);
        assert_eq!((layout.cols, layout.rows), (5, 5));
        let column = Region::Column {
            col: 1,
            first: 1,
            cells: 3,
        };
        assert_eq!(column.runs(5), [(24, 4), (44, 4), (64, 4)]);
        let row = Region::Row {
            row: 1,
            first: 1,
            cells: 3,
        };
        assert_eq!(row.runs(5), [(24, 12)]);
        // A 2×2 torus: every GPU exchanges rows with the one above and below (the same GPU) and
        // columns with the one left and right.
        let from0: Vec<usize> = layout
            .faces
            .iter()
            .filter(|f| f.from == 0)
            .map(|f| f.to)
            .collect();
        assert_eq!(from0, [2, 2, 1, 1]);
    }

    #[test]
    fn a_step_moves_each_face_and_the_poison_differs_where_it_lands() {
        let layout = Layout::new(Variant::OneD, 2, 2);
        let before: Vec<Vec<u8>> = (0..2).map(|r| vec![r as u8 + 1; 32]).collect();
        let after = layout.after_step(0, &before);
        // Rank 0's top halo (row 0) and bottom halo (row 3) come from rank 1; its interior stays.
        assert_eq!(after[..8], [2; 8]);
        assert_eq!(after[8..24], [1; 16]);
        assert_eq!(after[24..], [2; 8]);
        let poisoned = layout.poisoned(0, &after);
        assert!(poisoned[..8].iter().all(|&b| b == !2));
        assert_eq!(poisoned[8..24], after[8..24]);
    }
}
