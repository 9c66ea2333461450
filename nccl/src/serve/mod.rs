//! Serving `ncclAllReduce` with peerlink's kernels, where asked: the decision per call (a lookup)
//! and the dispatch, in safe Rust over the backend seam; the C layer ([`crate::ffi`]) calls in
//! and gives the real NCCL as a [`Real`].
//!
//! - **What is served**: all-reduce, sum and avg, of f32, bf16 and f16, any count, in
//!   place or not, on communicators whose ranks are on distinct GPUs of this host with P2P
//!   between every two — all threads of this process (nccl-tests `-g N`), or each a process of
//!   its own (torchrun) — or, under `all` only, of one rank (its kernel sums with no one).
//!   Everything else is forwarded.
//! - **Set-up**, once per communicator at its first call peerlink would serve (a collective
//!   moment): every rank's host, process and GPU are all-gathered through the real communicator
//!   ([`records`]) and every rank decides alike; a communicator peerlink cannot serve is
//!   forwarded for good. Ranks in several processes then meet at rank 0's loopback port, told
//!   in its record, as a [`peerlink::launch::Group`], and share their buffers by CUDA IPC.
//! - **A lone call** runs this rank's kernel on the caller's stream and returns at once
//!   ([`GroupAllReduce`] over thread ranks). **A group** (`ncclGroupStart` … `ncclGroupEnd`) is
//!   held from its first all-reduce; a call of another kind first forwards what was held, in
//!   order, and the rest of the group goes to NCCL as it comes. At the group's end, one
//!   all-reduce, or one per rank of one communicator (one thread driving every GPU, as
//!   nccl-tests `-g N`: [`LocalAllReduce`], all ranks at once), is served; any other group is
//!   forwarded whole, in order, inside a group of the real NCCL.

mod comm;
mod group;
mod lifeline;
pub mod records;
pub mod table;
mod windows;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use peerlink::backend::collective::{AllReduceKernel, BufferRange, DataType, Reduction};
use peerlink::backend::{Backend, Choice};
use peerlink::engine::all_reduce::price::{pick, Placement};
use peerlink::engine::all_reduce::{
    LocalAllReduce, LocalRank, ProcessRanks, ThreadMeeting, ThreadRanks,
};
use peerlink::launch::{Group, Identity, Rendezvous, DEFAULT_TIMEOUT};
use peerlink::model::CostModel;

use crate::log;
use crate::stats::{size_class, Call, Route};
use crate::switches::{Debug, Serve, Switches, PROFILE_VARIABLE, SIM_VARIABLE};
use comm::{join_reduce, sum_range, Clique, Comm, Peers, Reduce, State};
use lifeline::Lifeline;
use records::{decide, Decision, Record, Seen, RECORD_BYTES};
use table::Table;

pub use group::{all_reduce, group_end, group_simulate_end, group_start, in_group, other_call};
pub use windows::{window_registered, Window};

/// `ncclResult_t` values this module answers with.
const SUCCESS: i32 = 0;
const INTERNAL_ERROR: i32 = 3;
/// ncclRemoteError: a peer is lost.
pub const REMOTE_ERROR: i32 = 6;
/// `ncclDataType_t` and `ncclRedOp_t` values it reads.
const NCCL_FLOAT16: i32 = 6;
const NCCL_FLOAT32: i32 = 7;
const NCCL_BFLOAT16: i32 = 9;
const NCCL_SUM: i32 = 0;
const NCCL_AVG: i32 = 4;

/// What the set-up and a forwarded group need of the real NCCL (the C layer's, or a test's).
pub trait Real {
    /// `ncclAllGather` of `bytes` bytes (as ncclUint8) from `send` into `recv` on `stream`.
    fn all_gather(&self, send: u64, recv: u64, bytes: usize, comm: usize, stream: u64) -> i32;
    fn group_start(&self) -> i32;
    fn group_end(&self) -> i32;
    /// The communicator's rank, size and CUDA device, as NCCL answers them.
    fn describe(&self, comm: usize) -> Result<(usize, usize, usize), i32>;
}

/// One `ncclAllReduce`, its pointers and handles as integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllReduce {
    pub send: u64,
    pub recv: u64,
    pub count: usize,
    pub datatype: i32,
    pub op: i32,
    pub comm: usize,
    pub stream: u64,
}

impl AllReduce {
    fn dtype(&self) -> Option<DataType> {
        match self.datatype {
            NCCL_FLOAT16 => Some(DataType::F16),
            NCCL_FLOAT32 => Some(DataType::F32),
            NCCL_BFLOAT16 => Some(DataType::Bf16),
            _ => None,
        }
    }

    /// The reduction of a candidate (sum or average).
    fn reduction(&self) -> Reduction {
        if self.op == NCCL_AVG {
            Reduction::Average
        } else {
            Reduction::Sum
        }
    }

    fn bytes(&self) -> usize {
        self.dtype()
            .map_or(0, |d| d.size().saturating_mul(self.count))
    }

    fn count_as(&self, route: Route) {
        crate::ffi::COUNTERS.count(
            Call::AllReduce,
            size_class(self.count, self.datatype),
            route,
        );
    }
}

/// The serving side of the library: the switches' decision, the backend, and every
/// communicator's and clique's state.
pub struct Server {
    serve: Serve,
    debug: Debug,
    sim: Option<String>,
    /// Where `auto` decides by, or why it forwards everything.
    table: Result<Table, String>,
    backend: OnceLock<Result<Arc<dyn Backend>, String>>,
    /// The `tune` profile the kernels are picked by, where one is named, and the model made.
    profile: Option<std::path::PathBuf>,
    model: OnceLock<CostModel>,
    comms: Mutex<HashMap<usize, Arc<Mutex<Comm>>>>,
    /// The served communicators' lifelines, reachable while a call holds a communicator's lock.
    lifelines: Mutex<HashMap<usize, Arc<Lifeline>>>,
    cliques: Mutex<HashMap<u64, Weak<Clique>>>,
    tokens: AtomicU64,
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// The server, made with the switches at first use.
pub fn server() -> &'static Server {
    SERVER.get_or_init(|| Server::new(crate::ffi::switches()))
}

impl Server {
    fn new(switches: &Switches) -> Server {
        let table = match (&switches.table, switches.serve) {
            (_, Serve::None | Serve::All) => Err(String::new()),
            (None, Serve::Auto) => Err(format!(
                "PEERLINK_NCCL_SERVE=auto and no {} names a `peerlink workload all-reduce --json` \
                 measurement of this host to compare NCCL against, so every call is forwarded",
                table::TABLE_VARIABLE
            )),
            (Some(path), Serve::Auto) => Table::read(path, switches.sim.is_some()).map_err(|why| {
                format!("{}: {why}; every call is forwarded", table::TABLE_VARIABLE)
            }),
        };
        Server {
            serve: switches.serve,
            debug: switches.debug,
            sim: switches.sim.clone(),
            table,
            backend: OnceLock::new(),
            profile: switches.profile.clone(),
            model: OnceLock::new(),
            comms: Mutex::new(HashMap::new()),
            lifelines: Mutex::new(HashMap::new()),
            cliques: Mutex::new(HashMap::new()),
            tokens: AtomicU64::new(1),
        }
    }

    /// Why no communicator's calls can be served at all (the switch, `auto` without a table),
    /// or `None` where calls are decided at each communicator's first all-reduce.
    pub fn why_none(&self) -> Option<String> {
        match (self.serve, &self.table) {
            (Serve::None, _) => Some("PEERLINK_NCCL_SERVE=none".into()),
            (Serve::Auto, Err(why)) => Some(why.clone()),
            _ => None,
        }
    }

    /// What a communicator's line says before its set-up.
    pub fn why_forwarded(&self) -> String {
        self.why_none().unwrap_or_else(|| {
            format!(
                "PEERLINK_NCCL_SERVE={}: decided at its first all-reduce peerlink would serve",
                self.serve.name()
            )
        })
    }

    /// Whether peerlink would serve `call` by its arguments alone (the communicator's set-up
    /// decides the rest): sum or avg of f32, bf16 or f16, at least one element, and under `auto` a
    /// size where the measurement saw peerlink win.
    fn candidate(&self, call: &AllReduce) -> bool {
        let Some(dtype) = call.dtype() else {
            return false;
        };
        let taken = call.count > 0 && (call.op == NCCL_SUM || call.op == NCCL_AVG);
        taken
            && match (self.serve, &self.table) {
                (Serve::All, _) => true,
                (Serve::Auto, Ok(table)) => {
                    table.peerlink_faster(dtype.name(), call.bytes() as u64)
                }
                _ => false,
            }
    }

    /// The backend the kernels run on, opened at the first call peerlink would serve (or a
    /// test's first look at the simulator's memory): the GPUs, or the simulator
    /// `PEERLINK_NCCL_SIM` names (said once on stderr).
    pub fn backend(&self) -> Option<&Arc<dyn Backend>> {
        let opened = self.backend.get_or_init(|| {
            let choice = self.sim.clone().map_or(Choice::Gpu, Choice::Sim);
            let opened = peerlink::backend::open(&choice)
                .map(|opened| Arc::<dyn Backend>::from(opened.backend))
                .map_err(|e| format!("peerlink's backend could not be opened ({e}): every call is forwarded"));
            match (&opened, &self.sim) {
                (Err(why), _) => log::write(std::slice::from_ref(why)),
                (Ok(_), Some(preset)) => log::write(&[format!(
                    "serving on the SIMULATED `{preset}` host ({SIM_VARIABLE}, for tests and for \
                     trying the library without a GPU): the kernels' sums are real bytes, no GPU runs"
                )]),
                (Ok(_), None) => {}
            }
            opened
        });
        opened.as_ref().ok()
    }

    /// The cost model the kernels are picked by, once the backend is open (see [`Server::model`]).
    pub fn cost_model(&self) -> Option<&CostModel> {
        self.backend().map(|backend| self.model(backend))
    }

    /// The cost model of `backend`'s host the kernels are picked by: from the `peerlink tune`
    /// profile `PEERLINK_NCCL_PROFILE` names, else (or where it is refused: said once on stderr)
    /// the topology's defaults.
    fn model(&self, backend: &Arc<dyn Backend>) -> &CostModel {
        self.model.get_or_init(|| {
            let topology = backend.topology();
            let Some(path) = &self.profile else {
                return CostModel::from_topology(topology);
            };
            let measured = CostModel::from_profile_file(topology, path).map(|(model, partial)| {
                if let Some(note) = partial {
                    log::write(&[note]);
                }
                model
            });
            let model = measured.unwrap_or_else(|e| {
                log::write(&[format!(
                    "{PROFILE_VARIABLE}: {e}; the kernels are picked by the topology's defaults"
                )]);
                CostModel::from_topology(topology)
            });
            if self.debug >= Debug::Info {
                log::write(&[format!("the kernels are picked by the {}", model.origin())]);
            }
            model
        })
    }

    /// Peerlink's state of `comm`, made at its first use from what NCCL answers of it.
    fn comm(&self, real: &dyn Real, comm: usize) -> Option<Arc<Mutex<Comm>>> {
        let mut comms = self.comms.lock().ok()?;
        if let Some(found) = comms.get(&comm) {
            return Some(found.clone());
        }
        let described = real.describe(comm).ok()?;
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let made = Arc::new(Mutex::new(Comm::new(comm, described, token)));
        comms.insert(comm, made.clone());
        Some(made)
    }

    /// Forgets a communicator (ncclCommDestroy): its all-reduce waits for its calls and meets
    /// the other ranks' ends, unless a peer is lost (its kernels are released then).
    pub fn forget(&self, comm: usize) {
        let lifeline = self
            .lifelines
            .lock()
            .ok()
            .and_then(|mut lifelines| lifelines.remove(&comm));
        if let Some(lifeline) = &lifeline {
            lifeline.lost_peer();
        }
        let gone = self
            .comms
            .lock()
            .ok()
            .and_then(|mut comms| comms.remove(&comm));
        drop(gone);
    }

    /// Aborts a communicator (ncclCommAbort): its kernels waiting for peers are released, then
    /// it is forgotten.
    pub fn abort(&self, comm: usize) {
        let lifeline = self
            .lifelines
            .lock()
            .ok()
            .and_then(|lifelines| lifelines.get(&comm).cloned());
        if let Some(lifeline) = lifeline {
            lifeline.release();
        }
        self.forget(comm);
    }

    /// ncclCommGetAsyncError's answer where peerlink knows better than NCCL: `REMOTE_ERROR`
    /// once a peer of a served communicator is lost (its waiting kernels released), said once on
    /// stderr; `None` to ask NCCL.
    pub fn async_error(&self, comm: usize) -> Option<i32> {
        let lifeline = self.lifelines.lock().ok()?.get(&comm).cloned()?;
        let first = !lifeline.is_released();
        let why = lifeline.lost_peer()?;
        if first {
            log::write(&[format!(
                "communicator {comm:#x}: a peer is lost ({why}); its served calls are released \
                 and fail with ncclRemoteError"
            )]);
        }
        Some(REMOTE_ERROR)
    }

    /// A lone `ncclAllReduce`: served (its result code) or `None` to forward.
    fn serve_lone(&self, real: &dyn Real, call: &AllReduce) -> Option<i32> {
        if !self.candidate(call) {
            return None;
        }
        let backend = self.backend()?;
        let comm = self.comm(real, call.comm)?;
        let mut comm = comm.lock().ok()?;
        let captured = capturing(backend, &mut comm, call.stream);
        if matches!(comm.state, State::Pending) {
            // A set-up waits for its all-gather on the host, which no capture allows.
            if captured {
                return None;
            }
            self.set_up(backend, real, &mut [&mut comm], &[call.stream]);
        }
        let peers = comm.served_peers()?;
        if captured && !capturable(backend, &mut comm, call) {
            return None;
        }
        Some(self.result(
            call,
            run_lone(backend, self.model(backend), &mut comm, peers, call),
        ))
    }

    /// The result code of a served call (its kernel counted), its failure said on stderr:
    /// ncclRemoteError where its peers are lost (the launch group failed), ncclInternalError
    /// otherwise.
    fn result(&self, call: &AllReduce, outcome: peerlink::Result<AllReduceKernel>) -> i32 {
        call.count_as(Route::Served);
        match outcome {
            Ok(kernel) => {
                crate::ffi::COUNTERS.count_kernel(kernel);
                SUCCESS
            }
            Err(e) => {
                log::write(&[format!(
                    "peerlink's all-reduce of communicator {:#x} failed: {e}",
                    call.comm
                )]);
                match e {
                    peerlink::Error::Group(_) => REMOTE_ERROR,
                    _ => INTERNAL_ERROR,
                }
            }
        }
    }

    /// Sets up a communicator of one rank, which sums with no one: NCCL's call is then a copy
    /// (or nothing, in place), which peerlink's kernel cannot beat, so `auto` forwards it;
    /// `all` runs the kernel all the same (the served path, exercised on one GPU).
    fn set_up_alone(&self, comm: &mut Comm) {
        if self.serve == Serve::All {
            comm.state = State::Served(Peers::Alone);
            self.log_decision(
                comm,
                "served by peerlink (one rank: its kernel sums with no one)",
            );
        } else {
            let why = "one rank: NCCL's copy is all its all-reduce does (PEERLINK_NCCL_SERVE=all \
                       runs peerlink's kernel for it)";
            comm.state = State::Forwarded(why.to_string());
            self.log_decision(comm, &format!("forwarded to NCCL: {why}"));
        }
    }

    /// Sets up `comms` (each pending, `streams[i]` the stream of its first call): one all-gather
    /// of every rank's [`Record`] each, through the real NCCL (in one group where several), then
    /// each decides from the records. Where anything fails, the communicator is forwarded.
    fn set_up(
        &self,
        backend: &Arc<dyn Backend>,
        real: &dyn Real,
        comms: &mut [&mut Comm],
        streams: &[u64],
    ) {
        let mut gathers = Vec::new();
        for (comm, &stream) in comms.iter_mut().zip(streams) {
            if comm.ranks == 1 {
                self.set_up_alone(comm);
                continue;
            }
            match Gather::start(backend, comm, stream) {
                Ok(gather) => gathers.push((gather, &mut **comm)),
                Err(e) => comm.state = State::Forwarded(format!("its set-up failed ({e})")),
            }
        }
        let grouped = gathers.len() > 1;
        let mut code = if grouped { real.group_start() } else { SUCCESS };
        for (gather, comm) in &gathers {
            if code == SUCCESS {
                code = real.all_gather(
                    gather.send,
                    gather.recv,
                    RECORD_BYTES,
                    comm.address,
                    gather.stream,
                );
            }
        }
        if grouped {
            let ended = real.group_end();
            code = if code == SUCCESS { ended } else { code };
        }
        let mut finished: Vec<_> = gathers
            .into_iter()
            .map(|(mut gather, comm)| {
                let listener = gather.listener.take();
                (gather.finish(backend, code), listener, comm)
            })
            .collect();
        // Ranks that are processes meet at set-up, each communicator's in turn: every process
        // takes its communicators in their meeting order.
        for (records, _, comm) in &mut finished {
            let first = records.as_ref().ok().and_then(|r| r.first());
            comm.meeting_order = first.map(|r| (r.process, r.token));
        }
        finished.sort_by_key(|(_, _, comm)| comm.meeting_order);
        for (records, listener, comm) in finished {
            comm.state = match records {
                Ok(records) => self.decided(backend, comm, &records, listener),
                Err(why) => State::Forwarded(why),
            };
            if let (Some(lifeline), Ok(mut lifelines)) = (&comm.lifeline, self.lifelines.lock()) {
                lifelines.insert(comm.address, lifeline.clone());
            }
            let line = match &comm.state {
                State::Forwarded(why) => format!("forwarded to NCCL: {why}"),
                State::Served(Peers::Processes) => format!(
                    "served by peerlink ({} ranks, a process each on this host)",
                    comm.ranks
                ),
                _ => format!(
                    "served by peerlink ({} ranks, threads of this process)",
                    comm.ranks
                ),
            };
            self.log_decision(comm, &line);
        }
    }

    /// The state the records decide for `comm`: its clique, found or made, or its processes
    /// met (rank 0 at `listener`), where served.
    fn decided(
        &self,
        backend: &Arc<dyn Backend>,
        comm: &mut Comm,
        records: &[Record],
        listener: Option<TcpListener>,
    ) -> State {
        let model = self.model(backend);
        let p2p = |gpus: &[usize], one_process: bool| {
            let placement = if one_process {
                Placement::Beside
            } else {
                Placement::AcrossProcesses
            };
            pick(model, gpus, 4, placement).is_some()
        };
        let seen = Seen {
            buses: backend
                .topology()
                .devices
                .iter()
                .map(|d| records::hash(&d.pci_bus_id))
                .collect(),
            p2p: &p2p,
        };
        let decision = decide(records, &seen);
        if let Some(why) = self.unmeasured(&decision, comm.ranks) {
            return State::Forwarded(why);
        }
        match decision {
            Decision::Forward(why) => State::Forwarded(why),
            Decision::ThisHost { gpus, port } => {
                let met = meet_processes(backend, model, comm, gpus, (port, listener));
                match met {
                    Ok((reduce, lifeline)) => {
                        comm.reduce = Some(reduce);
                        comm.lifeline = Some(lifeline);
                        State::Served(Peers::Processes)
                    }
                    Err(e) => State::Forwarded(format!("its ranks could not meet ({e})")),
                }
            }
            Decision::ThisProcess { gpus, token } => match self.clique(backend, gpus, token) {
                Ok(clique) => {
                    comm.lifeline = Some(clique.lifeline.clone());
                    State::Served(Peers::Threads(clique))
                }
                Err(why) => State::Forwarded(why),
            },
        }
    }

    /// The clique of this process's threads named `token` (its ranks on `gpus`), found or made
    /// with its release word; why not, where it cannot be.
    fn clique(
        &self,
        backend: &Arc<dyn Backend>,
        gpus: Vec<usize>,
        token: u64,
    ) -> Result<Arc<Clique>, String> {
        let mut cliques = self
            .cliques
            .lock()
            .map_err(|_| "a thread panicked during a set-up".to_string())?;
        cliques.retain(|_, clique| clique.strong_count() > 0);
        if let Some(found) = cliques.get(&token).and_then(Weak::upgrade) {
            return Ok(found);
        }
        let lifeline =
            Lifeline::new(backend, None).map_err(|e| format!("its set-up failed ({e})"))?;
        let devices: Vec<usize> = (0..backend.topology().devices.len()).collect();
        let mut local = LocalAllReduce::new(backend.clone(), self.model(backend).clone(), &devices);
        local.set_waiting(lifeline.waiting());
        let made = Arc::new(Clique {
            meeting: ThreadMeeting::new(&gpus),
            local: Mutex::new(local),
            gpus,
            lifeline,
        });
        cliques.insert(token, Arc::downgrade(&made));
        Ok(made)
    }

    /// Under `auto`, why the measurement cannot decide a communicator of `ranks` ranks laid out
    /// as `decision` found them (another count, or threads where it measured processes or back).
    fn unmeasured(&self, decision: &Decision, ranks: usize) -> Option<String> {
        let (Serve::Auto, Ok(table)) = (self.serve, &self.table) else {
            return None;
        };
        match decision {
            Decision::Forward(_) => None,
            Decision::ThisHost { .. } => table.differs_from(ranks, true),
            Decision::ThisProcess { .. } => table.differs_from(ranks, false),
        }
    }

    fn log_decision(&self, comm: &Comm, what: &str) {
        if self.debug >= Debug::Info {
            log::write(&[format!(
                "communicator {:#x}: rank {} of {}, GPU {}; {what}",
                comm.address, comm.rank, comm.ranks, comm.gpu
            )]);
        }
    }
}

/// Whether the call's stream is capturing a graph (or cannot be told): such a call is served
/// only where it only queues work — a lone call on an all-reduce joined before
/// ([`capturable`]), or a group of one thread driving every rank, set up and ready
/// (`run_clique`) — and forwarded otherwise.
fn capturing(backend: &Arc<dyn Backend>, comm: &mut Comm, stream: u64) -> bool {
    comm.stream(backend, stream)
        .and_then(|stream| backend.is_capturing(stream))
        .unwrap_or(true)
}

/// Whether a lone call on a capturing stream may be served into the graph: its communicator's
/// all-reduce joined by an earlier call, no peer lost, and the call one that only queues work
/// (`GroupAllReduce::queues_only`: shared buffers large enough, the same stream as the last
/// call), so that each replay meets the other ranks' replays through the flags alone.
fn capturable(backend: &Arc<dyn Backend>, comm: &mut Comm, call: &AllReduce) -> bool {
    let len = call.bytes();
    let Ok(stream) = comm.stream(backend, call.stream) else {
        return false;
    };
    let Ok((_, recv)) = comm.buffers(backend, call.send, call.recv, len) else {
        return false;
    };
    comm.lost().is_none()
        && comm.reduce.as_mut().is_some_and(|reduce| {
            let range = sum_range(reduce, call.recv, recv, len);
            reduce.queues_only(range, stream)
        })
}

/// One rank's all-gather of the set-up records: its own record in `send`, every rank's into
/// `recv`, both device memory of its GPU; rank 0's rendezvous listener, bound before (its port
/// is in its record) and used only where the ranks turn out to be processes.
struct Gather {
    listener: Option<TcpListener>,
    send_buffer: peerlink::backend::BufferId,
    recv_buffer: peerlink::backend::BufferId,
    send: u64,
    recv: u64,
    stream: u64,
    gpu: usize,
    ranks: usize,
}

impl Gather {
    fn start(backend: &Arc<dyn Backend>, comm: &Comm, stream: u64) -> peerlink::Result<Gather> {
        use peerlink::backend::Memory;
        let listener = if comm.rank == 0 {
            // Loopback: the ranks it serves are all of this host.
            TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).ok()
        } else {
            None
        };
        let port = listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or(0, |a| a.port());
        let devices = &backend.topology().devices;
        let bus = devices.get(comm.gpu).map_or("", |d| d.pci_bus_id.as_str());
        let record = Record::mine(comm.rank, (comm.gpu, bus), comm.token, port);
        let send_buffer = backend.alloc(Memory::Device(comm.gpu), RECORD_BYTES)?;
        let recv_buffer = match backend.alloc(Memory::Device(comm.gpu), RECORD_BYTES * comm.ranks) {
            Ok(buffer) => buffer,
            Err(e) => {
                let _ = backend.free(send_buffer);
                return Err(e);
            }
        };
        let gather = Gather {
            listener,
            send_buffer,
            recv_buffer,
            send: backend.sharing().device_address(send_buffer)?,
            recv: backend.sharing().device_address(recv_buffer)?,
            stream,
            gpu: comm.gpu,
            ranks: comm.ranks,
        };
        backend.write(send_buffer, 0, &record.to_bytes())?;
        Ok(gather)
    }

    /// Every rank's record, once the all-gather (result `code`) is done on the stream.
    fn finish(self, backend: &Arc<dyn Backend>, code: i32) -> Result<Vec<Record>, String> {
        let read = || -> peerlink::Result<Vec<u8>> {
            let stream = backend.borrow_stream(self.gpu, self.stream)?;
            let synchronized = backend.synchronize(stream);
            let _ = backend.destroy_stream(stream);
            synchronized?;
            let mut bytes = vec![0; RECORD_BYTES * self.ranks];
            backend.read(self.recv_buffer, 0, &mut bytes)?;
            Ok(bytes)
        };
        let bytes = if code == SUCCESS {
            read().map_err(|e| format!("its set-up could not read the ranks' records ({e})"))
        } else {
            Err(format!("its set-up's ncclAllGather returned {code}"))
        };
        let _ = backend.free(self.send_buffer);
        let _ = backend.free(self.recv_buffer);
        Ok(bytes?
            .chunks(RECORD_BYTES)
            .map(Record::from_bytes)
            .collect())
    }
}

/// A lone call (or a group's one) on a served communicator: its input summed into its output
/// with the other ranks (one rank: by its kernel alone). Returns the kernel that summed.
fn run_lone(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    comm: &mut Comm,
    peers: Peers,
    call: &AllReduce,
) -> peerlink::Result<AllReduceKernel> {
    let _kept = backend.keep_thread_context()?;
    if let Some(why) = comm.lost() {
        return Err(peerlink::Error::Group(format!(
            "not queued: its peers' waits were released, {why}"
        )));
    }
    let len = call.bytes();
    let dtype = call.dtype().expect("a candidate's type is peerlink's");
    let stream = comm.stream(backend, call.stream)?;
    let (send, recv) = comm.buffers(backend, call.send, call.recv, len)?;
    let reduce = joined(backend, model, comm, peers)?;
    let range = sum_range(reduce, call.recv, recv, len);
    // Out of place, the kernels read the input where it is (no copy into the output first).
    let input = if send == recv {
        range
    } else {
        BufferRange {
            buffer: send,
            offset: 0,
            len,
        }
    };
    reduce.all_reduce_from(input, range, stream, dtype, call.reduction())
}

/// The all-reduce of `comm`'s rank with its `peers`, joined at its first use where its ranks
/// are threads (every thread rank's, a collective) or it has one rank (a meeting of one, whose
/// kernel meets no one and so never waits).
fn joined<'c>(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    comm: &'c mut Comm,
    peers: Peers,
) -> peerlink::Result<&'c mut Reduce> {
    match (&comm.reduce, peers) {
        (None, Peers::Alone) => {
            let alone = ThreadRanks::new(ThreadMeeting::new(&[comm.gpu]), 0);
            comm.reduce = Some(join_reduce(backend, alone, model)?);
        }
        (None, Peers::Threads(clique)) => {
            let ranks = ThreadRanks::new(clique.meeting.clone(), comm.rank);
            let mut joined = join_reduce(backend, ranks, model)?;
            joined.set_waiting(clique.lifeline.waiting());
            comm.reduce = Some(joined);
        }
        _ => {}
    }
    comm.reduce.as_mut().ok_or_else(|| {
        peerlink::Error::Group("a served communicator of processes lost its all-reduce".into())
    })
}

/// Rank `comm.rank` of ranks that are each a process of this host meets the others (rank 0 at
/// its `listener`, the others at its `port` on loopback) and joins their all-reduce, whose kernels
/// wait on the lifeline returned with it (watching the other processes): every rank calls it at
/// the set-up, and where one fails, all do.
fn meet_processes(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    comm: &Comm,
    gpus: Vec<usize>,
    (port, listener): (u16, Option<TcpListener>),
) -> peerlink::Result<(Reduce, Arc<Lifeline>)> {
    let _kept = backend.keep_thread_context()?;
    let identity = Identity {
        rank: comm.rank,
        world: comm.ranks,
        local_rank: comm.rank,
        local_world: comm.ranks,
    };
    let group = match listener {
        Some(listener) => Group::join_listening(identity, listener, DEFAULT_TIMEOUT)?,
        None => {
            let addr = (std::net::Ipv4Addr::LOCALHOST, port).into();
            let rendezvous = Rendezvous {
                addr,
                timeout: DEFAULT_TIMEOUT,
            };
            Group::join(identity, &rendezvous)?
        }
    };
    let ranks = ProcessRanks::new(group, gpus)?;
    let lifeline = Lifeline::new(backend, Some(ranks.watch()))?;
    let mut reduce = join_reduce(backend, ranks, model)?;
    reduce.set_waiting(lifeline.waiting());
    Ok((reduce, lifeline))
}

/// One all-reduce per rank of `clique`, all from this thread (`calls[i]` on `comms[i]`): every
/// rank's kernel queued at once on its stream. Into a CUDA graph (`captured`) only where that
/// queues work alone (`LocalAllReduce::queues_only`: made and ordered by earlier calls, as
/// nccl-tests' warm-up makes them); `None` to forward the calls.
fn run_clique(
    backend: &Arc<dyn Backend>,
    clique: &Clique,
    comms: &mut [&mut Comm],
    calls: &[AllReduce],
    captured: bool,
) -> Option<peerlink::Result<AllReduceKernel>> {
    let _kept = match backend.keep_thread_context() {
        Ok(kept) => kept,
        Err(e) => return Some(Err(e)),
    };
    if clique.lifeline.is_released() {
        return Some(Err(peerlink::Error::Group(
            "not queued: its ranks' waits were released, it was aborted".into(),
        )));
    }
    let len = calls[0].bytes();
    let dtype = calls[0].dtype().expect("a candidate's type is peerlink's");
    let ranks = match clique_ranks(backend, comms, calls, len) {
        Ok(ranks) => ranks,
        Err(e) => return Some(Err(e)),
    };
    let Ok(mut local) = clique.local.lock() else {
        return Some(Err(peerlink::Error::Group(
            "a thread panicked in an all-reduce".into(),
        )));
    };
    if captured && !local.queues_only(&ranks, len, dtype) {
        return None;
    }
    Some(local.all_reduce(&ranks, len, dtype, calls[0].reduction()))
}

/// The ranks of one call each on `comms` (`calls[i]` on `comms[i]`), their buffers and streams
/// borrowed, in rank order.
fn clique_ranks(
    backend: &Arc<dyn Backend>,
    comms: &mut [&mut Comm],
    calls: &[AllReduce],
    len: usize,
) -> peerlink::Result<Vec<LocalRank>> {
    let mut ranks = Vec::with_capacity(calls.len());
    for (comm, call) in comms.iter_mut().zip(calls) {
        let (input, output) = comm.buffers(backend, call.send, call.recv, len)?;
        let rank = LocalRank {
            device: comm.gpu,
            stream: comm.stream(backend, call.stream)?,
            input,
            output,
        };
        ranks.push((comm.rank, rank));
    }
    ranks.sort_by_key(|(rank, _)| *rank);
    Ok(ranks.into_iter().map(|(_, rank)| rank).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switches(serve: Serve, table: Option<&str>) -> Switches {
        Switches {
            serve,
            debug: Debug::Warn,
            refused: Vec::new(),
            sim: None,
            table: table.map(std::path::PathBuf::from),
            profile: None,
        }
    }

    fn server(serve: Serve, table: Option<&str>) -> Server {
        Server::new(&switches(serve, table))
    }

    /// A server of every call on the simulated `dgx-h100`, its kernels picked by the profile at
    /// `profile`, if any.
    fn on_dgx_h100(profile: Option<&std::path::Path>) -> Server {
        Server::new(&Switches {
            sim: Some("dgx-h100".into()),
            profile: profile.map(std::path::Path::to_path_buf),
            ..switches(Serve::All, None)
        })
    }

    #[test]
    fn the_kernels_are_picked_by_a_named_profile_of_this_host_else_by_the_topology() {
        use peerlink::model::profile::Measured;
        use peerlink::model::{Cost, Hop, Profile};
        let host = |preset: &str| {
            peerlink::backend::sim::Preset::load(preset)
                .unwrap()
                .topology()
        };
        let hop = Hop::PeerSm { src: 0, dst: 1 };
        let measured = Cost {
            alpha_us: 3.5,
            beta_gbps: 123.0,
        };
        let dir = tempfile::tempdir().unwrap();
        let (this_host, other_host) = (dir.path().join("here.json"), dir.path().join("there.json"));
        for (preset, path) in [("dgx-h100", &this_host), ("h200-pair", &other_host)] {
            let mut profile = Profile::for_host(&host(preset));
            profile.hops.push(Measured {
                hop,
                cost: measured,
            });
            profile.save(path).unwrap();
        }

        let calibrated = on_dgx_h100(Some(&this_host));
        let model = calibrated.cost_model().unwrap();
        assert!(
            model.origin().starts_with("measured profile"),
            "{}",
            model.origin()
        );
        assert_eq!(model.cost(hop), Some(measured));
        // Another host's profile is refused (said on stderr), as is none named.
        for server in [on_dgx_h100(Some(&other_host)), on_dgx_h100(None)] {
            let model = server.cost_model().unwrap();
            assert!(
                model.origin().starts_with("topology defaults"),
                "{}",
                model.origin()
            );
            assert_ne!(model.cost(hop), Some(measured));
        }
    }

    fn call(datatype: i32, op: i32, count: usize) -> AllReduce {
        AllReduce {
            send: 0x1000,
            recv: 0x2000,
            count,
            datatype,
            op,
            comm: 0xc0,
            stream: 0,
        }
    }

    #[test]
    fn auto_without_a_measurement_forwards_everything_and_says_why() {
        let auto = server(Serve::Auto, None);
        assert!(!auto.candidate(&call(NCCL_FLOAT32, NCCL_SUM, 1024)));
        let why = auto.why_none().unwrap();
        assert!(why.contains("no PEERLINK_NCCL_TABLE names"), "{why}");
        let unreadable = server(Serve::Auto, Some("/nowhere/table.json"));
        let why = unreadable.why_none().unwrap();
        assert!(why.starts_with("PEERLINK_NCCL_TABLE: "), "{why}");
        assert!(why.contains("/nowhere/table.json"), "{why}");
        assert!(why.ends_with("every call is forwarded"), "{why}");
        assert_eq!(
            server(Serve::None, None).why_none().unwrap(),
            "PEERLINK_NCCL_SERVE=none"
        );
        assert_eq!(server(Serve::All, None).why_none(), None);
    }

    #[test]
    fn candidates_are_sums_or_averages_of_f32_bf16_or_f16_of_at_least_one_element() {
        let all = server(Serve::All, None);
        for (datatype, op, count, served) in [
            (NCCL_FLOAT32, NCCL_SUM, 1, true),
            (NCCL_BFLOAT16, NCCL_AVG, 3, true),
            (NCCL_FLOAT32, NCCL_SUM, 0, false),
            (NCCL_FLOAT16, NCCL_SUM, 8, true),
            (8, NCCL_SUM, 8, false),
            (NCCL_FLOAT32, 2, 8, false),
        ] {
            assert_eq!(
                all.candidate(&call(datatype, op, count)),
                served,
                "{datatype} {op} {count}"
            );
        }
        assert!(!server(Serve::None, None).candidate(&call(NCCL_FLOAT32, NCCL_SUM, 1)));
    }
}
