//! A rank other than 0: it connects to rank 0's rendezvous, waits for the welcome, then sends its
//! parts of each collective and its heartbeats, and watches that rank 0 still speaks.

use super::{
    closed_sentence, heartbeat_interval, lock, secs, silent_sentence, Call, Failure, Parts, POLL,
};
use crate::launch::wire::{self, Message};
use crate::launch::{Member, Rendezvous};
use crate::{Error, Result};
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub(super) struct Spoke {
    writer: Arc<Mutex<TcpStream>>,
    inbox: Mutex<Receiver<SpokeEvent>>,
    pub(super) failure: Failure,
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
    /// Joins rank 0's rendezvous with `hello`, then starts the reader and heartbeat threads.
    /// Returns the spoke, every member and every rank's Unix socket, by rank.
    pub(super) fn open(
        hello: &Message,
        rendezvous: &Rendezvous,
    ) -> Result<(Spoke, Vec<Member>, Vec<String>)> {
        let timeout = rendezvous.timeout;
        let stream = connect(rendezvous)?;
        let broken = |e| rendezvous_closed(rendezvous, e);
        stream
            .set_write_timeout(Some(timeout))
            .and_then(|()| wire::send(&stream, hello))
            .map_err(broken)?;
        let (members, fd_sockets) = await_welcome(&stream, rendezvous)?;
        stream.set_read_timeout(None).map_err(broken)?;
        let spoke = Spoke::start(stream, timeout).map_err(broken)?;
        Ok((spoke, members, fd_sockets))
    }

    /// The reader of rank 0's messages and the heartbeat, each a thread of its own.
    fn start(stream: TcpStream, timeout: Duration) -> std::io::Result<Spoke> {
        let failure = Failure::default();
        let last_heard = Arc::new(Mutex::new(Instant::now()));
        let (events, inbox) = mpsc::channel();
        let reader = stream.try_clone()?;
        {
            let (failure, last_heard, events) =
                (failure.clone(), last_heard.clone(), events.clone());
            thread::spawn(move || read_rank_zero(reader, failure, last_heard, events));
        }
        let writer = Arc::new(Mutex::new(stream.try_clone()?));
        let (stop_heartbeat, stopped) = mpsc::channel();
        let heartbeat = {
            let (writer, failure) = (writer.clone(), failure.clone());
            thread::spawn(move || {
                beat(writer, stopped, timeout, failure, last_heard, events);
            })
        };
        Ok(Spoke {
            writer,
            inbox: Mutex::new(inbox),
            failure,
            stop_heartbeat: Some(stop_heartbeat),
            heartbeat: Some(heartbeat),
            stream,
        })
    }

    pub(super) fn collective(&self, call: Call<'_>) -> Parts {
        let inbox = lock(&self.inbox);
        let (seq, op) = (call.seq, call.op);
        let message = Message::Contribute {
            seq,
            op,
            bytes: call.mine.to_vec(),
        };
        if let Err(e) = wire::send(&*lock(&self.writer), &message) {
            return Err(self.failure.set(format!(
                "{} ({e})",
                closed_sentence(0, &format!("before {op}"))
            )));
        }
        let backstop = call.backstop();
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

    pub(super) fn leave(&mut self) {
        self.stop_heartbeat.take();
        if let Some(heartbeat) = self.heartbeat.take() {
            let _ = heartbeat.join();
        }
        let _ = wire::send(&*lock(&self.writer), &Message::Leave);
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The error of a rendezvous rank 0 closed while this rank joined.
fn rendezvous_closed(rendezvous: &Rendezvous, e: std::io::Error) -> Error {
    Error::Group(format!(
        "rank 0 at {} closed the rendezvous while this rank joined ({e}): see rank 0's error",
        rendezvous.addr
    ))
}

/// Rank 0's welcome: every member and every rank's Unix socket. Rank 0 sends heartbeats while
/// it waits for the others: silence for the timeout means it is gone.
fn await_welcome(
    stream: &TcpStream,
    rendezvous: &Rendezvous,
) -> Result<(Vec<Member>, Vec<String>)> {
    let timeout = rendezvous.timeout;
    let broken = |e| rendezvous_closed(rendezvous, e);
    stream.set_read_timeout(Some(timeout)).map_err(broken)?;
    loop {
        match wire::receive(stream) {
            Ok(Some(Message::Heartbeat)) => continue,
            Ok(Some(Message::Welcome {
                members,
                fd_sockets,
            })) if members.len() == members.first().map_or(0, |m| m.identity.world)
                && fd_sockets.len() == members.len() =>
            {
                return Ok((members, fd_sockets))
            }
            Ok(Some(Message::Abort(sentence))) => return Err(Error::Group(sentence)),
            Ok(Some(other)) => {
                return Err(Error::Group(format!(
                    "rank 0 at {} answered the rendezvous out of turn ({other:?}): every rank \
                     must run the same peerlink",
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
