//! The hub's thread: it hears every rank, gathers each collective's parts, answers when all are
//! in, sends heartbeats, and judges failures (a connection closed without a goodbye, a rank
//! silent for the timeout, a collective some ranks did not reach in time), sending the verdict to
//! every rank.

use super::{closed_sentence, heartbeat_interval, ranks_text, secs, silent_sentence, Failure};
use crate::launch::wire::{self, Message, Op};
use std::net::TcpStream;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// What the judge's thread hears.
pub(super) enum Event {
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

/// A collective some ranks have contributed to.
pub(super) struct Pending {
    seq: u64,
    op: Op,
    /// The first rank's arrival: the collective must be complete one timeout after it.
    started: Instant,
    parts: Vec<Option<Vec<u8>>>,
    answer: Option<Sender<std::result::Result<Vec<Vec<u8>>, String>>>,
}

/// The hub's thread: everything rank 0 knows about the other ranks.
pub(super) struct Judge {
    /// Index = rank; `None` for rank 0 itself and for ranks whose connection ended.
    pub(super) writers: Vec<Option<TcpStream>>,
    pub(super) last_heard: Vec<Instant>,
    pub(super) left: Vec<bool>,
    pub(super) pending: Option<Pending>,
    pub(super) next_seq: u64,
    pub(super) timeout: Duration,
    pub(super) failure: Failure,
}

impl Judge {
    pub(super) fn run(mut self, inbox: Receiver<Event>) {
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
