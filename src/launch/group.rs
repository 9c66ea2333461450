//! The group: the rendezvous, the collectives over it, heartbeats and the verdict on failures.
//!
//! Rank 0 is the hub: a thread of its own reads every rank's messages (one reader thread per
//! connection feeds it), gathers each collective's parts, answers when all are in, sends heartbeats
//! and judges failures — a connection closed without a goodbye, a rank silent for the timeout, a
//! collective some ranks did not reach in time — and sends the verdict to every rank. The hub runs
//! beside rank 0's own work, so a verdict never waits for rank 0's next call. The other ranks are
//! spokes: a reader thread takes rank 0's answers and a heartbeat thread keeps rank 0 informed and
//! watches that rank 0 still speaks.

use super::fds::FdLinks;
use super::wire::{self, Message, Op, MAX_MESSAGE};
use super::{Identity, Member, Rendezvous};
use crate::topology::sysfs::Sysfs;
use crate::{Error, Result};
use std::io::ErrorKind;
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often a rank says it is alive: a tenth of the timeout, so that a rank is declared hung only
/// after ten heartbeats are missing; at least every second.
pub fn heartbeat_interval(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// How long rank 0 waits for a connected process to say who it is; a peer says it at once, a
/// stray connection (a port scanner, another program) is dropped after this.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// How often the accept loops look for a new connection.
const POLL: Duration = Duration::from_millis(5);

/// The processes of a run, joined at the rendezvous.
///
/// Collectives (`all_gather`, `broadcast`, `barrier`) must be called by every rank in the same
/// order; they are serialised within a process. Dropping the group says goodbye: the others see a
/// rank that left, not one that died, and fail only if they call a collective after it.
pub struct Group {
    me: Member,
    members: Vec<Member>,
    timeout: Duration,
    link: Link,
    fds: Option<FdLinks>,
    /// The number of the next collective; held for a whole collective, so calls from several
    /// threads of one process do not interleave.
    next_seq: Mutex<u64>,
}

enum Link {
    Alone,
    Hub(Hub),
    Spoke(Spoke),
}

impl Group {
    /// Meets the other ranks at `rendezvous`: rank 0 listens on its address, the others connect
    /// (retrying until rank 0 listens). Returns once all `identity.world` ranks are there; a rank
    /// that does not arrive within the timeout fails every rank, naming it.
    pub fn join(identity: Identity, rendezvous: &Rendezvous) -> Result<Group> {
        check_identity(identity)?;
        let timeout = rendezvous.timeout;
        let me = this_process(identity);
        if identity.world == 1 {
            return Ok(Group {
                members: vec![me.clone()],
                me,
                timeout,
                link: Link::Alone,
                fds: None,
                next_seq: Mutex::new(0),
            });
        }
        let fds = FdLinks::bind(identity.rank)?;
        let fd_socket = fds.name().to_string();
        let (link, members, fd_sockets) = if identity.rank == 0 {
            let (hub, members, sockets) = Hub::open(me.clone(), fd_socket, rendezvous)?;
            (Link::Hub(hub), members, sockets)
        } else {
            let hello = Message::Hello {
                member: me.clone(),
                fd_socket,
            };
            let (spoke, members, sockets) = Spoke::open(&hello, rendezvous)?;
            (Link::Spoke(spoke), members, sockets)
        };
        Ok(Group {
            me,
            members,
            timeout,
            link,
            fds: Some(fds.with_peers(fd_sockets)),
            next_seq: Mutex::new(0),
        })
    }

    /// This process's identity.
    pub fn identity(&self) -> Identity {
        self.me.identity
    }

    /// Every process of the group, in rank order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Whether `rank` runs on this process's host (it can take file descriptors and open CUDA IPC
    /// handles from this process).
    pub fn same_host(&self, rank: usize) -> bool {
        self.members
            .get(rank)
            .is_some_and(|other| other.host_id == self.me.host_id)
    }

    /// How long each call waits for the others.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A handle that tells, from any thread, whether the group has failed: a rank busy in long
    /// GPU work calls no collective until the work is done, yet should stop within the timeout.
    pub fn watch(&self) -> FailureWatch {
        match &self.link {
            Link::Alone => FailureWatch(Failure::default()),
            Link::Hub(Hub { failure, .. }) | Link::Spoke(Spoke { failure, .. }) => {
                FailureWatch(failure.clone())
            }
        }
    }

    /// Every rank's `mine`, in rank order (this rank's too). For identities, the NCCL unique id,
    /// CUDA IPC memory handles, figures to gather: at most [`MAX_MESSAGE`] bytes in all.
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.collective(Op::AllGather, mine)
    }

    /// `root`'s bytes, on every rank: the root passes `Some`, the others `None`.
    pub fn broadcast(&self, root: usize, bytes: Option<&[u8]>) -> Result<Vec<u8>> {
        let world = self.me.identity.world;
        if root >= world {
            return Err(Error::usage(format!(
                "broadcast from rank {root} in a group of {world}: the root must be a rank of \
                 the group"
            )));
        }
        let mine = match (bytes, root == self.me.identity.rank) {
            (Some(bytes), true) => bytes,
            (None, false) => &[],
            (_, is_root) => {
                return Err(Error::usage(format!(
                    "broadcast from rank {root}: the root passes its bytes and only the root \
                     (rank {} passed {})",
                    self.me.identity.rank,
                    if is_root { "none" } else { "some" }
                )))
            }
        };
        let mut parts = self.collective(Op::Broadcast { root }, mine)?;
        Ok(parts.swap_remove(root))
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.collective(Op::Barrier, &[]).map(drop)
    }

    /// Passes `fds` to rank `to` of this host (over a Unix socket, `SCM_RIGHTS`): memory-pool
    /// shareable handles, memfds. Rank `to` takes them with [`Group::recv_fds`]; each side keeps
    /// its own descriptors, open on the same files.
    pub fn send_fds(&self, to: usize, fds: &[BorrowedFd]) -> Result<()> {
        let links = self.fd_links(to, "send file descriptors to")?;
        links.send(self.me.identity.rank, to, fds, self.timeout)
    }

    /// Takes the `count` file descriptors rank `from` of this host sent with [`Group::send_fds`].
    pub fn recv_fds(&self, from: usize, count: usize) -> Result<Vec<OwnedFd>> {
        let links = self.fd_links(from, "take file descriptors from")?;
        links.recv(self.me.identity.rank, from, count, self.timeout)
    }

    fn fd_links(&self, peer: usize, what: &str) -> Result<&FdLinks> {
        let Identity { rank, world, .. } = self.me.identity;
        let refuse = |why: String| Err(Error::usage(format!("cannot {what} rank {peer}: {why}")));
        if peer >= world {
            return refuse(format!("the group has ranks 0 to {}", world - 1));
        }
        if peer == rank {
            return refuse("it is this process".into());
        }
        if !self.same_host(peer) {
            return refuse(format!(
                "it runs on {}, not on this host ({}); file descriptors pass only between \
                 processes of one host",
                self.members[peer].host, self.me.host
            ));
        }
        Ok(self
            .fds
            .as_ref()
            .expect("a group of several ranks has its Unix socket"))
    }

    fn collective(&self, op: Op, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let world = self.me.identity.world;
        // Room for every rank's part and the framing of each.
        if mine.len() > MAX_MESSAGE / world - 64 {
            return Err(Error::usage(format!(
                "{op} of {mine} bytes from each of {world} ranks is more than the rendezvous \
                 carries ({MAX_MESSAGE} bytes in all): it is for handles, ids and figures, not \
                 data",
                mine = mine.len()
            )));
        }
        let mut next_seq = lock(&self.next_seq);
        let seq = *next_seq;
        *next_seq += 1;
        // After a failure every call fails with its sentence, sent nowhere.
        let failed = match &self.link {
            Link::Alone => None,
            Link::Hub(Hub { failure, .. }) | Link::Spoke(Spoke { failure, .. }) => failure.get(),
        };
        if let Some(sentence) = failed {
            return Err(Error::Group(sentence));
        }
        match &self.link {
            Link::Alone => Ok(vec![mine.to_vec()]),
            Link::Hub(hub) => hub.collective(seq, op, mine, self.timeout),
            Link::Spoke(spoke) => spoke.collective(seq, op, mine, self.timeout),
        }
        .map_err(Error::Group)
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("me", &self.me)
            .field("members", &self.members)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        match &mut self.link {
            Link::Alone => {}
            Link::Hub(hub) => hub.leave(),
            Link::Spoke(spoke) => spoke.leave(),
        }
    }
}

fn check_identity(identity: Identity) -> Result<()> {
    let Identity {
        rank,
        world,
        local_rank,
        local_world,
    } = identity;
    if world == 0 || rank >= world || local_world == 0 || local_world > world {
        return Err(Error::usage(format!(
            "rank {rank} of {world} is no place in a group: ranks count from 0 to the world size \
             less one"
        )));
    }
    if local_rank >= local_world {
        return Err(Error::usage(format!(
            "local rank {local_rank} of {local_world} is no place on a host: local ranks count \
             from 0 to the local world size less one"
        )));
    }
    Ok(())
}

/// This process, as the others will know it.
fn this_process(identity: Identity) -> Member {
    let system = Sysfs::system();
    let host = system.host_name().unwrap_or_else(|| "unknown".into());
    let host_id = system.boot_id().unwrap_or_else(|| host.clone());
    Member {
        identity,
        pid: std::process::id(),
        host,
        host_id,
    }
}

/// Whether a group has failed, asked from any thread ([`Group::watch`]).
#[derive(Clone)]
pub struct FailureWatch(Failure);

impl FailureWatch {
    /// The group's failure sentence, once its threads have judged one (a rank that died, hung
    /// or left mid-call): what the next collective would fail with.
    pub fn failed(&self) -> Option<String> {
        self.0.get()
    }
}

/// The first failure of a group, shared by its threads: every later call fails with it.
#[derive(Clone, Default)]
struct Failure(Arc<Mutex<Option<String>>>);

impl Failure {
    /// Records `sentence` unless a failure was recorded before; returns the one that stands.
    fn set(&self, sentence: String) -> String {
        lock(&self.0).get_or_insert(sentence).clone()
    }

    fn get(&self) -> Option<String> {
        lock(&self.0).clone()
    }
}

/// Locks `mutex`, also where a thread panicked holding it (what it guards stays consistent).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn secs(duration: Duration) -> String {
    format!("{} s", duration.as_secs_f64())
}

/// "rank 2", "ranks 2 and 3", "ranks 1, 2 and 5".
fn ranks_text(ranks: &[usize]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        [init @ .., last] => format!(
            "ranks {} and {last}",
            init.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        [] => "no rank".into(),
    }
}

fn closed_sentence(rank: usize, during: &str) -> String {
    format!(
        "rank {rank} left the group {during}: its connection closed without a goodbye (the \
         process exited or was killed); see rank {rank}'s own error, fix it and run again"
    )
}

fn silent_sentence(rank: usize, timeout: Duration) -> String {
    format!(
        "rank {rank} stopped answering: nothing heard from it for {} (the process is stopped, \
         hung or its host unreachable); look at rank {rank}, or give a longer timeout \
         (PEERLINK_TIMEOUT, launch --timeout) if its host is overloaded",
        secs(timeout)
    )
}

// ---------------------------------------------------------------------------------------------
// Rank 0

struct Hub {
    events: Sender<Event>,
    failure: Failure,
    thread: Option<JoinHandle<()>>,
    /// The connections, to shut them down on leaving (which ends the reader threads).
    streams: Vec<TcpStream>,
}

enum Event {
    /// A message from `rank`, or why its connection ended.
    Peer {
        rank: usize,
        message: std::result::Result<Message, String>,
    },
    /// Rank 0's own part of a collective, and where to answer.
    Local {
        seq: u64,
        op: Op,
        bytes: Vec<u8>,
        answer: Sender<std::result::Result<Vec<Vec<u8>>, String>>,
    },
    /// The group is dropped.
    Leave,
}

impl Hub {
    fn open(
        me: Member,
        my_fd_socket: String,
        rendezvous: &Rendezvous,
    ) -> Result<(Hub, Vec<Member>, Vec<String>)> {
        let world = me.identity.world;
        let timeout = rendezvous.timeout;
        let listener = listen(rendezvous.addr)?;
        let deadline = Instant::now() + timeout;
        let mut joined: Vec<Option<(TcpStream, Member, String)>> =
            (0..world).map(|_| None).collect();
        let mut turned_away = Vec::new();
        let interval = heartbeat_interval(timeout);
        let mut next_heartbeat = Instant::now() + interval;
        while joined.iter().skip(1).any(Option::is_none) {
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> =
                    (1..world).filter(|&rank| joined[rank].is_none()).collect();
                let sentence = format!(
                    "{} of {world} did not join the rendezvous at {} within {}: start every rank \
                     with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, or give a longer \
                     timeout{}",
                    ranks_text(&missing),
                    rendezvous.addr,
                    secs(timeout),
                    if turned_away.is_empty() {
                        String::new()
                    } else {
                        format!(" (rank 0 turned away: {})", turned_away.join("; "))
                    }
                );
                for (stream, _, _) in joined.iter().flatten() {
                    let _ = wire::send(stream, &Message::Abort(sentence.clone()));
                }
                return Err(Error::Group(sentence));
            }
            if now >= next_heartbeat {
                // The joined ranks wait for the welcome; silence would make them give up on rank 0.
                for (stream, _, _) in joined.iter().flatten() {
                    let _ = wire::send(stream, &Message::Heartbeat);
                }
                next_heartbeat = now + interval;
            }
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    thread::sleep(POLL);
                    continue;
                }
                Err(e) => {
                    return Err(Error::Group(format!(
                        "rank 0 cannot accept connections at {}: {e}",
                        rendezvous.addr
                    )))
                }
            };
            let Some((member, fd_socket)) = read_hello(&stream, (deadline - now).min(HELLO_WAIT))
            else {
                continue; // not a peer of any group
            };
            let Identity {
                rank,
                world: theirs,
                ..
            } = member.identity;
            let refusal = if theirs != world {
                Some(format!(
                    "a process (pid {} on {}) says rank {rank} of {theirs}, where rank 0 has a \
                     world of {world}: start every rank with the same WORLD_SIZE",
                    member.pid, member.host
                ))
            } else if rank == 0 || rank >= world || joined[rank].is_some() {
                Some(format!(
                    "a process (pid {} on {}) says it is rank {rank}, which {}: give each \
                     process its own rank",
                    member.pid,
                    member.host,
                    if rank == 0 {
                        "this process is"
                    } else {
                        "another process is"
                    }
                ))
            } else {
                None
            };
            match refusal {
                Some(sentence) => {
                    let _ = wire::send(&stream, &Message::Abort(sentence.clone()));
                    turned_away.push(sentence);
                }
                None => joined[rank] = Some((stream, member, fd_socket)),
            }
        }

        let mut members = vec![me];
        let mut fd_sockets = vec![my_fd_socket];
        let mut streams = vec![];
        for (stream, member, fd_socket) in joined.into_iter().flatten() {
            members.push(member);
            fd_sockets.push(fd_socket);
            streams.push(stream);
        }
        let welcome = Message::Welcome {
            members: members.clone(),
            fd_sockets: fd_sockets.clone(),
        };
        for (index, stream) in streams.iter().enumerate() {
            let ready = stream
                .set_read_timeout(None)
                .and_then(|()| stream.set_write_timeout(Some(timeout)))
                .and_then(|()| wire::send(stream, &welcome));
            if let Err(e) = ready {
                let sentence = format!(
                    "rank {} left the rendezvous as it completed: {e}",
                    index + 1
                );
                for stream in &streams {
                    let _ = wire::send(stream, &Message::Abort(sentence.clone()));
                }
                return Err(Error::Group(sentence));
            }
        }

        let (events, inbox) = mpsc::channel();
        let mut readers = Vec::new();
        for (index, stream) in streams.iter().enumerate() {
            let reader = stream
                .try_clone()
                .map_err(|e| Error::Group(format!("rank 0: {e}")))?;
            readers.push(
                reader
                    .try_clone()
                    .map_err(|e| Error::Group(format!("rank 0: {e}")))?,
            );
            let events = events.clone();
            let rank = index + 1;
            thread::spawn(move || read_peer(rank, reader, events));
        }
        let failure = Failure::default();
        let judge = Judge {
            writers: std::iter::once(None)
                .chain(streams.into_iter().map(Some))
                .collect(),
            last_heard: vec![Instant::now(); world],
            left: vec![false; world],
            pending: None,
            next_seq: 0,
            timeout,
            failure: failure.clone(),
        };
        let thread = thread::spawn(move || judge.run(inbox));
        let hub = Hub {
            events,
            failure,
            thread: Some(thread),
            streams: readers,
        };
        Ok((hub, members, fd_sockets))
    }

    fn collective(
        &self,
        seq: u64,
        op: Op,
        mine: &[u8],
        timeout: Duration,
    ) -> std::result::Result<Vec<Vec<u8>>, String> {
        let (answer, answered) = mpsc::channel();
        let local = Event::Local {
            seq,
            op,
            bytes: mine.to_vec(),
            answer,
        };
        if self.events.send(local).is_err() {
            return Err(self
                .failure
                .get()
                .unwrap_or_else(|| "rank 0's hub stopped".into()));
        }
        // The hub answers within the timeout of the first rank's arrival; the margin is for the
        // hub's own tick.
        match answered.recv_timeout(timeout * 2 + Duration::from_secs(1)) {
            Ok(answer) => answer,
            Err(_) => Err(self.failure.set(format!(
                "rank 0 gave itself no answer to {op} within {}: this is a bug in peerlink's \
                 rendezvous; report it",
                secs(timeout * 2)
            ))),
        }
    }

    fn leave(&mut self) {
        let _ = self.events.send(Event::Leave);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for stream in &self.streams {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Listens at `addr`, or on every interface at its port where `addr` is not this host's.
fn listen(addr: SocketAddr) -> Result<TcpListener> {
    let any: SocketAddr = match addr {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, addr.port()).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, addr.port()).into(),
    };
    let listener = match TcpListener::bind(addr) {
        Err(e) if e.kind() == ErrorKind::AddrNotAvailable => TcpListener::bind(any),
        other => other,
    }
    .map_err(|e| {
        Error::usage(format!(
            "rank 0 cannot listen at {addr} for the rendezvous ({e}): set MASTER_PORT (or \
             PEERLINK_PORT) to a free port, and MASTER_ADDR to this host"
        ))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Group(format!("rank 0 cannot listen at {addr}: {e}")))?;
    Ok(listener)
}

/// The hello a new connection sends, where it is a peer's; `None` for anything else.
fn read_hello(stream: &TcpStream, wait: Duration) -> Option<(Member, String)> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(wait.max(POLL))).ok()?;
    match wire::receive(stream) {
        Ok(Some(Message::Hello { member, fd_socket })) => Some((member, fd_socket)),
        _ => None,
    }
}

/// Feeds the hub with what `rank` sends until its connection ends.
fn read_peer(rank: usize, stream: TcpStream, events: Sender<Event>) {
    loop {
        let message = match wire::receive(&stream) {
            Ok(Some(message)) => Ok(message),
            Ok(None) => Err("closed".to_string()),
            Err(e) => Err(e.to_string()),
        };
        let ended = message.is_err();
        if events.send(Event::Peer { rank, message }).is_err() || ended {
            return;
        }
    }
}

/// A collective some ranks have contributed to.
struct Pending {
    seq: u64,
    op: Op,
    /// The first rank's arrival: the collective must be complete one timeout after it.
    started: Instant,
    parts: Vec<Option<Vec<u8>>>,
    answer: Option<Sender<std::result::Result<Vec<Vec<u8>>, String>>>,
}

/// The hub's thread: everything rank 0 knows about the other ranks.
struct Judge {
    /// Index = rank; `None` for rank 0 itself and for ranks whose connection ended.
    writers: Vec<Option<TcpStream>>,
    last_heard: Vec<Instant>,
    left: Vec<bool>,
    pending: Option<Pending>,
    next_seq: u64,
    timeout: Duration,
    failure: Failure,
}

impl Judge {
    fn run(mut self, inbox: Receiver<Event>) {
        let interval = heartbeat_interval(self.timeout);
        let mut next_heartbeat = Instant::now();
        loop {
            let wait = next_heartbeat.saturating_duration_since(Instant::now());
            match inbox.recv_timeout(wait) {
                Ok(Event::Leave) | Err(RecvTimeoutError::Disconnected) => {
                    self.broadcast(&Message::Leave);
                    return;
                }
                Ok(Event::Local {
                    seq,
                    op,
                    bytes,
                    answer,
                }) => match self.failure.get() {
                    Some(sentence) => {
                        let _ = answer.send(Err(sentence));
                    }
                    None => self.contribute(0, seq, op, bytes, Some(answer)),
                },
                Ok(Event::Peer { rank, message }) => self.heard(rank, message),
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.failure.get().is_some() {
                continue; // the verdict is out: nothing left to watch
            }
            let now = Instant::now();
            if now >= next_heartbeat {
                self.broadcast(&Message::Heartbeat);
                next_heartbeat = now + interval;
            }
            self.watch(now);
        }
    }

    fn heard(&mut self, rank: usize, message: std::result::Result<Message, String>) {
        self.last_heard[rank] = Instant::now();
        if self.failure.get().is_some() {
            return;
        }
        match message {
            Ok(Message::Heartbeat) => {}
            Ok(Message::Contribute { seq, op, bytes }) => {
                self.contribute(rank, seq, op, bytes, None)
            }
            Ok(Message::Leave) => {
                self.left[rank] = true;
                if let Some(pending) = &self.pending {
                    if pending.parts[rank].is_none() {
                        let op = pending.op;
                        self.abort(left_sentence(rank, op));
                    }
                }
            }
            Ok(other) => self.abort(format!(
                "rank {rank} sent rank 0 a message out of turn ({other:?}): every rank must run \
                 the same peerlink"
            )),
            Err(_) if self.left[rank] => self.writers[rank] = None,
            Err(why) => {
                self.writers[rank] = None;
                let during = match &self.pending {
                    Some(pending) => format!("during {}", pending.op),
                    None => "between calls".into(),
                };
                let sentence = closed_sentence(rank, &during);
                self.abort(if why == "closed" {
                    sentence
                } else {
                    format!("{sentence} ({why})")
                });
            }
        }
    }

    fn contribute(
        &mut self,
        rank: usize,
        seq: u64,
        op: Op,
        bytes: Vec<u8>,
        answer: Option<Sender<std::result::Result<Vec<Vec<u8>>, String>>>,
    ) {
        let world = self.left.len();
        let pending = self.pending.get_or_insert_with(|| Pending {
            seq,
            op,
            started: Instant::now(),
            parts: vec![None; world],
            answer: None,
        });
        if seq != pending.seq || op != pending.op || pending.parts[rank].is_some() {
            let (their, first) = (pending.op, pending.seq);
            let rank_first = pending.parts.iter().position(Option::is_some).unwrap_or(0);
            return self.abort(format!(
                "rank {rank} called {op} (its call {}) where rank {rank_first} called {their} \
                 (call {}): every rank must make the same group calls in the same order",
                seq + 1,
                first + 1
            ));
        }
        if answer.is_some() {
            pending.answer = answer;
        }
        pending.parts[rank] = Some(bytes);
        if let Some(gone) = (0..world).find(|&r| self.left[r] && pending.parts[r].is_none()) {
            return self.abort(left_sentence(gone, op));
        }
        if pending.parts.iter().all(Option::is_some) {
            let pending = self.pending.take().expect("pending above");
            let parts: Vec<Vec<u8>> = pending.parts.into_iter().flatten().collect();
            self.next_seq = pending.seq + 1;
            self.broadcast(&Message::Gathered {
                seq: pending.seq,
                parts: parts.clone(),
            });
            if let Some(answer) = pending.answer {
                let _ = answer.send(Ok(parts));
            }
        }
    }

    /// Fails the group where a rank fell silent or a collective is overdue.
    fn watch(&mut self, now: Instant) {
        let silent = (1..self.left.len()).find(|&rank| {
            !self.left[rank] && now.duration_since(self.last_heard[rank]) > self.timeout
        });
        if let Some(rank) = silent {
            return self.abort(silent_sentence(rank, self.timeout));
        }
        if let Some(pending) = &self.pending {
            if now.duration_since(pending.started) > self.timeout {
                let missing: Vec<usize> = (0..self.left.len())
                    .filter(|&rank| pending.parts[rank].is_none())
                    .collect();
                let sentence = format!(
                    "{} did not reach {} within {} of the first rank's arrival (the others did): \
                     every rank must make the same group calls in the same order; give a longer \
                     timeout if some ranks have more work before it",
                    ranks_text(&missing),
                    pending.op,
                    secs(self.timeout)
                );
                self.abort(sentence);
            }
        }
    }

    /// Records the verdict and tells every rank, rank 0's own pending call included.
    fn abort(&mut self, sentence: String) {
        let sentence = self.failure.set(sentence);
        self.broadcast(&Message::Abort(sentence.clone()));
        if let Some(answer) = self.pending.take().and_then(|pending| pending.answer) {
            let _ = answer.send(Err(sentence));
        }
    }

    /// Sends `message` to every rank still connected; a rank that cannot take it is dropped (its
    /// reader reports why).
    fn broadcast(&mut self, message: &Message) {
        for writer in self.writers.iter_mut() {
            if let Some(stream) = writer {
                if wire::send(&*stream, message).is_err() {
                    *writer = None;
                }
            }
        }
    }
}

fn left_sentence(rank: usize, op: Op) -> String {
    format!(
        "rank {rank} left the group (it dropped it, done) before {op}: every rank must make the \
         same group calls in the same order"
    )
}

// ---------------------------------------------------------------------------------------------
// Ranks 1 and up

struct Spoke {
    writer: Arc<Mutex<TcpStream>>,
    inbox: Mutex<Receiver<SpokeEvent>>,
    failure: Failure,
    stop_heartbeat: Option<Sender<()>>,
    heartbeat: Option<JoinHandle<()>>,
    /// To shut the connection down on leaving (which ends the reader thread).
    stream: TcpStream,
}

enum SpokeEvent {
    Gathered {
        seq: u64,
        parts: Vec<Vec<u8>>,
    },
    /// The group failed; the sentence is in the spoke's [`Failure`].
    Failed,
}

impl Spoke {
    fn open(hello: &Message, rendezvous: &Rendezvous) -> Result<(Spoke, Vec<Member>, Vec<String>)> {
        let timeout = rendezvous.timeout;
        let stream = connect(rendezvous)?;
        let broken = |e: std::io::Error| {
            Error::Group(format!(
                "rank 0 at {} closed the rendezvous while this rank joined ({e}): see rank 0's \
                 error",
                rendezvous.addr
            ))
        };
        stream
            .set_write_timeout(Some(timeout))
            .and_then(|()| wire::send(&stream, hello))
            .map_err(broken)?;
        // Rank 0 sends heartbeats while it waits for the others: silence means it is gone.
        stream.set_read_timeout(Some(timeout)).map_err(broken)?;
        let (members, fd_sockets) = loop {
            match wire::receive(&stream) {
                Ok(Some(Message::Heartbeat)) => continue,
                Ok(Some(Message::Welcome {
                    members,
                    fd_sockets,
                })) if members.len() == members.first().map_or(0, |m| m.identity.world)
                    && fd_sockets.len() == members.len() =>
                {
                    break (members, fd_sockets)
                }
                Ok(Some(Message::Abort(sentence))) => return Err(Error::Group(sentence)),
                Ok(Some(other)) => {
                    return Err(Error::Group(format!(
                        "rank 0 at {} answered the rendezvous out of turn ({other:?}): every \
                         rank must run the same peerlink",
                        rendezvous.addr
                    )))
                }
                Ok(None) => {
                    return Err(broken(std::io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "closed",
                    )))
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(Error::Group(silent_sentence(0, timeout)))
                }
                Err(e) => return Err(broken(e)),
            }
        };
        stream.set_read_timeout(None).map_err(broken)?;

        let failure = Failure::default();
        let last_heard = Arc::new(Mutex::new(Instant::now()));
        let (events, inbox) = mpsc::channel();
        let reader = stream.try_clone().map_err(broken)?;
        {
            let (failure, last_heard, events) =
                (failure.clone(), last_heard.clone(), events.clone());
            thread::spawn(move || read_rank_zero(reader, failure, last_heard, events));
        }
        let writer = Arc::new(Mutex::new(stream.try_clone().map_err(broken)?));
        let (stop_heartbeat, stopped) = mpsc::channel();
        let heartbeat = {
            let (writer, failure) = (writer.clone(), failure.clone());
            thread::spawn(move || {
                beat(writer, stopped, timeout, failure, last_heard, events);
            })
        };
        let spoke = Spoke {
            writer,
            inbox: Mutex::new(inbox),
            failure,
            stop_heartbeat: Some(stop_heartbeat),
            heartbeat: Some(heartbeat),
            stream,
        };
        Ok((spoke, members, fd_sockets))
    }

    fn collective(
        &self,
        seq: u64,
        op: Op,
        mine: &[u8],
        timeout: Duration,
    ) -> std::result::Result<Vec<Vec<u8>>, String> {
        let inbox = lock(&self.inbox);
        let message = Message::Contribute {
            seq,
            op,
            bytes: mine.to_vec(),
        };
        if let Err(e) = wire::send(&*lock(&self.writer), &message) {
            return Err(self.failure.set(format!(
                "{} ({e})",
                closed_sentence(0, &format!("before {op}"))
            )));
        }
        // Rank 0 judges within the timeout of the first arrival, and says so; waiting twice as
        // long is a backstop that does not come into play while rank 0 speaks.
        let backstop = timeout * 2 + Duration::from_secs(1);
        match inbox.recv_timeout(backstop) {
            Ok(SpokeEvent::Gathered { seq: theirs, parts }) if theirs == seq => Ok(parts),
            Ok(SpokeEvent::Gathered { seq: theirs, .. }) => Err(self.failure.set(format!(
                "rank 0 answered call {} where this rank made call {}: every rank must make the \
                 same group calls in the same order",
                theirs + 1,
                seq + 1
            ))),
            Ok(SpokeEvent::Failed) | Err(RecvTimeoutError::Disconnected) => Err(self
                .failure
                .get()
                .unwrap_or_else(|| closed_sentence(0, &format!("during {op}")))),
            Err(RecvTimeoutError::Timeout) => Err(self.failure.set(format!(
                "rank 0 gave no answer to {op} within {}: look at rank 0",
                secs(backstop)
            ))),
        }
    }

    fn leave(&mut self) {
        self.stop_heartbeat.take();
        if let Some(heartbeat) = self.heartbeat.take() {
            let _ = heartbeat.join();
        }
        let _ = wire::send(&*lock(&self.writer), &Message::Leave);
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// Connects to rank 0, retrying while it is not listening yet, until the timeout.
fn connect(rendezvous: &Rendezvous) -> Result<TcpStream> {
    let deadline = Instant::now() + rendezvous.timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let error = match TcpStream::connect_timeout(
            &rendezvous.addr,
            left.clamp(POLL, Duration::from_secs(1)),
        ) {
            Ok(stream) => return Ok(stream),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(Error::Group(format!(
                "cannot reach rank 0's rendezvous at {} within {} ({error}): start rank 0, check \
                 MASTER_ADDR and MASTER_PORT, or give a longer timeout",
                rendezvous.addr,
                secs(rendezvous.timeout)
            )));
        }
        thread::sleep(Duration::from_millis(50).min(left));
    }
}

/// Takes rank 0's messages until its connection ends.
fn read_rank_zero(
    stream: TcpStream,
    failure: Failure,
    last_heard: Arc<Mutex<Instant>>,
    events: Sender<SpokeEvent>,
) {
    loop {
        let received = wire::receive(&stream);
        *lock(&last_heard) = Instant::now();
        let event = match received {
            Ok(Some(Message::Heartbeat)) => continue,
            Ok(Some(Message::Gathered { seq, parts })) => SpokeEvent::Gathered { seq, parts },
            Ok(Some(Message::Abort(sentence))) => {
                failure.set(sentence);
                SpokeEvent::Failed
            }
            Ok(Some(Message::Leave)) => {
                failure.set(
                    "rank 0 left the group (it dropped it, done) before this rank's call: every \
                     rank must make the same group calls in the same order"
                        .into(),
                );
                SpokeEvent::Failed
            }
            Ok(Some(other)) => {
                failure.set(format!(
                    "rank 0 sent a message out of turn ({other:?}): every rank must run the same \
                     peerlink"
                ));
                SpokeEvent::Failed
            }
            Ok(None) => {
                failure.set(closed_sentence(0, "while this rank ran"));
                let _ = events.send(SpokeEvent::Failed);
                return;
            }
            Err(e) => {
                failure.set(format!(
                    "{} ({e})",
                    closed_sentence(0, "while this rank ran")
                ));
                let _ = events.send(SpokeEvent::Failed);
                return;
            }
        };
        if events.send(event).is_err() {
            return;
        }
    }
}

/// Says "alive" to rank 0 every interval and watches that rank 0 says it too.
fn beat(
    writer: Arc<Mutex<TcpStream>>,
    stopped: Receiver<()>,
    timeout: Duration,
    failure: Failure,
    last_heard: Arc<Mutex<Instant>>,
    events: Sender<SpokeEvent>,
) {
    let interval = heartbeat_interval(timeout);
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
        if failure.get().is_some() {
            return;
        }
        let silent_for = lock(&last_heard).elapsed();
        let sent = wire::send(&*lock(&writer), &Message::Heartbeat);
        let broken = match sent {
            Err(e) => Some(format!(
                "{} ({e})",
                closed_sentence(0, "while this rank ran")
            )),
            Ok(()) if silent_for > timeout => Some(silent_sentence(0, timeout)),
            Ok(()) => None,
        };
        if let Some(sentence) = broken {
            failure.set(sentence);
            let _ = events.send(SpokeEvent::Failed);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_listed_as_a_sentence_says_them() {
        assert_eq!(ranks_text(&[2]), "rank 2");
        assert_eq!(ranks_text(&[2, 3]), "ranks 2 and 3");
        assert_eq!(ranks_text(&[1, 2, 5]), "ranks 1, 2 and 5");
    }

    #[test]
    fn heartbeats_come_ten_times_a_timeout_at_most_each_second() {
        assert_eq!(
            heartbeat_interval(Duration::from_secs(2)),
            Duration::from_millis(200)
        );
        assert_eq!(
            heartbeat_interval(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        assert_eq!(
            heartbeat_interval(Duration::from_millis(20)),
            Duration::from_millis(10)
        );
    }

    #[test]
    fn a_group_of_one_needs_no_rendezvous() {
        let rendezvous = Rendezvous {
            addr: "127.0.0.1:1".parse().unwrap(),
            timeout: Duration::from_millis(10),
        };
        let group = Group::join(Identity::SINGLE, &rendezvous).unwrap();
        assert_eq!(group.all_gather(b"x").unwrap(), vec![b"x".to_vec()]);
        assert_eq!(group.broadcast(0, Some(b"y")).unwrap(), b"y");
        group.barrier().unwrap();
        assert!(matches!(group.send_fds(0, &[]), Err(Error::Usage(_))));
    }

    #[test]
    fn impossible_identities_are_refused() {
        let rendezvous = Rendezvous {
            addr: "127.0.0.1:1".parse().unwrap(),
            timeout: Duration::from_millis(10),
        };
        for identity in [
            Identity {
                rank: 2,
                world: 2,
                local_rank: 0,
                local_world: 1,
            },
            Identity {
                rank: 0,
                world: 0,
                local_rank: 0,
                local_world: 1,
            },
            Identity {
                rank: 0,
                world: 2,
                local_rank: 1,
                local_world: 1,
            },
        ] {
            assert!(
                matches!(Group::join(identity, &rendezvous), Err(Error::Usage(_))),
                "{identity:?}"
            );
        }
    }
}
