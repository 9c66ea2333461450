//! Rank 0's side of the group: the rendezvous it holds (the ranks accepted, a stray or mistaken
//! process turned away, the welcome), then the hub its own collectives go through, beside the
//! judge's thread.

use super::judge::{Event, Judge};
use super::{heartbeat_interval, ranks_text, secs, Call, Failure, Parts, HELLO_WAIT, POLL};
use crate::launch::wire::{self, Message};
use crate::launch::{Identity, Member, Rendezvous};
use crate::{Error, Result};
use std::io::ErrorKind;
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub(super) struct Hub {
    events: Sender<Event>,
    pub(super) failure: Failure,
    thread: Option<JoinHandle<()>>,
    /// The connections, to shut them down on leaving (which ends the reader threads).
    streams: Vec<TcpStream>,
}

/// A rank that connected and said hello: its connection, who it is, its Unix socket's name.
type Joined = (TcpStream, Member, String);

impl Hub {
    /// Holds the rendezvous for rank `me` (0): accepts every other rank, welcomes them all, and
    /// starts the judge. Returns the hub, every member and every rank's Unix socket, by rank.
    /// `listener` is one bound already (at a port the others were told another way), else the
    /// rendezvous address is listened at.
    pub(super) fn open(
        me: Member,
        my_fd_socket: String,
        rendezvous: &Rendezvous,
        listener: Option<TcpListener>,
    ) -> Result<(Hub, Vec<Member>, Vec<String>)> {
        let timeout = rendezvous.timeout;
        let listener = match listener {
            Some(bound) => bound,
            None => listen(rendezvous.addr)?,
        };
        let joined = accept_ranks(me.identity.world, listener, rendezvous)?;
        let mut members = vec![me];
        let mut fd_sockets = vec![my_fd_socket];
        let mut streams = vec![];
        for (stream, member, fd_socket) in joined {
            members.push(member);
            fd_sockets.push(fd_socket);
            streams.push(stream);
        }
        welcome(&streams, &members, &fd_sockets, timeout)?;
        let hub = Hub::start(streams, timeout)?;
        Ok((hub, members, fd_sockets))
    }

    /// A reader thread per connection feeding the judge's thread, which takes the writers.
    fn start(streams: Vec<TcpStream>, timeout: Duration) -> Result<Hub> {
        let world = streams.len() + 1;
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
        Ok(Hub {
            events,
            failure,
            thread: Some(thread),
            streams: readers,
        })
    }

    pub(super) fn collective(&self, call: Call<'_>) -> Parts {
        let (answer, answered) = mpsc::channel();
        let op = call.op;
        let local = Event::Local {
            seq: call.seq,
            op,
            bytes: call.mine.to_vec(),
            answer,
        };
        if self.events.send(local).is_err() {
            return Err(self
                .failure
                .get()
                .unwrap_or_else(|| "rank 0's hub stopped".into()));
        }
        // The hub answers within the timeout of the first rank's arrival.
        match answered.recv_timeout(call.backstop()) {
            Ok(answer) => answer,
            Err(_) => Err(self.failure.set(format!(
                "rank 0 gave itself no answer to {op} within {}: this is a bug in peerlink's \
                 rendezvous; report it",
                secs(call.timeout * 2)
            ))),
        }
    }

    pub(super) fn leave(&mut self) {
        let _ = self.events.send(Event::Leave);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for stream in &self.streams {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Accepts ranks 1 to `world - 1` at the rendezvous, each once, heartbeating to those waiting
/// meanwhile; a process that says another world or a taken rank is turned away. Fails every
/// rank joined so far where some rank is missing at the timeout.
fn accept_ranks(
    world: usize,
    listener: TcpListener,
    rendezvous: &Rendezvous,
) -> Result<Vec<Joined>> {
    let timeout = rendezvous.timeout;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Group(format!("rank 0 cannot listen at {}: {e}", rendezvous.addr)))?;
    let deadline = Instant::now() + timeout;
    let mut joined: Vec<Option<Joined>> = (0..world).map(|_| None).collect();
    let mut turned_away = Vec::new();
    let interval = heartbeat_interval(timeout);
    let mut next_heartbeat = Instant::now() + interval;
    while joined.iter().skip(1).any(Option::is_none) {
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<usize> = (1..world).filter(|&rank| joined[rank].is_none()).collect();
            let sentence = missing_sentence(&missing, world, rendezvous, &turned_away);
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
        match refusal(&member, world, &joined) {
            Some(sentence) => {
                let _ = wire::send(&stream, &Message::Abort(sentence.clone()));
                turned_away.push(sentence);
            }
            None => {
                let rank = member.identity.rank;
                joined[rank] = Some((stream, member, fd_socket));
            }
        }
    }
    Ok(joined.into_iter().flatten().collect())
}

/// Why rank 0 turns `member` away, if it does: another world size, or a rank taken.
fn refusal(member: &Member, world: usize, joined: &[Option<Joined>]) -> Option<String> {
    let Identity {
        rank,
        world: theirs,
        ..
    } = member.identity;
    if theirs != world {
        Some(format!(
            "a process (pid {} on {}) says rank {rank} of {theirs}, where rank 0 has a world of \
             {world}: start every rank with the same WORLD_SIZE",
            member.pid, member.host
        ))
    } else if rank == 0 || rank >= world || joined[rank].is_some() {
        Some(format!(
            "a process (pid {} on {}) says it is rank {rank}, which {}: give each process its \
             own rank",
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
    }
}

/// The verdict on ranks `missing` at the rendezvous' timeout.
fn missing_sentence(
    missing: &[usize],
    world: usize,
    rendezvous: &Rendezvous,
    turned_away: &[String],
) -> String {
    format!(
        "{} of {world} did not join the rendezvous at {} within {}: start every rank with the \
         same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, or give a longer timeout{}",
        ranks_text(missing),
        rendezvous.addr,
        secs(rendezvous.timeout),
        if turned_away.is_empty() {
            String::new()
        } else {
            format!(" (rank 0 turned away: {})", turned_away.join("; "))
        }
    )
}

/// Sends every joined rank the members and their Unix sockets; where one cannot take it, every
/// rank is told why.
fn welcome(
    streams: &[TcpStream],
    members: &[Member],
    fd_sockets: &[String],
    timeout: Duration,
) -> Result<()> {
    let welcome = Message::Welcome {
        members: members.to_vec(),
        fd_sockets: fd_sockets.to_vec(),
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
            for stream in streams {
                let _ = wire::send(stream, &Message::Abort(sentence.clone()));
            }
            return Err(Error::Group(sentence));
        }
    }
    Ok(())
}

/// Listens at `addr`, or on every interface at its port where `addr` is not this host's.
fn listen(addr: SocketAddr) -> Result<TcpListener> {
    let any: SocketAddr = match addr {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, addr.port()).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, addr.port()).into(),
    };
    match TcpListener::bind(addr) {
        Err(e) if e.kind() == ErrorKind::AddrNotAvailable => TcpListener::bind(any),
        other => other,
    }
    .map_err(|e| {
        Error::usage(format!(
            "rank 0 cannot listen at {addr} for the rendezvous ({e}): set MASTER_PORT (or \
             PEERLINK_PORT) to a free port, and MASTER_ADDR to this host"
        ))
    })
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
