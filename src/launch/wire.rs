//! The rendezvous' messages and how they travel: a 4-byte little-endian length, then the message.
//! Only small control messages travel here (identities, ids, handles, gathered figures): a message
//! longer than [`MAX_MESSAGE`] is refused, so that the sockets never carry data.

use super::{Identity, Member};
use std::io::{self, Read, Write};

/// The longest message: far above any handle table, far below any data a transfer would move.
pub const MAX_MESSAGE: usize = 16 << 20;

/// What a joining rank sends first, so that rank 0 can tell a peer of this group from a stray
/// connection or a rank of another job.
const MAGIC: &[u8] = b"peerlink-rendezvous/1";

/// The collective a contribution belongs to; every rank must make the same calls in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    AllGather,
    Broadcast { root: usize },
    Barrier,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::AllGather => write!(f, "all_gather"),
            Op::Broadcast { root } => write!(f, "broadcast from rank {root}"),
            Op::Barrier => write!(f, "barrier"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// A joining rank to rank 0: who it is, where it is, and the name of its Unix socket.
    Hello { member: Member, fd_socket: String },
    /// Rank 0 to every rank once all have joined: everyone, in rank order, with their sockets.
    Welcome {
        members: Vec<Member>,
        fd_sockets: Vec<String>,
    },
    /// A rank's part of the `seq`-th collective.
    Contribute { seq: u64, op: Op, bytes: Vec<u8> },
    /// Rank 0 to every rank: every rank's part of the `seq`-th collective, in rank order.
    Gathered { seq: u64, parts: Vec<Vec<u8>> },
    /// The group failed; the sentence says why. Every rank's next or pending call fails with it.
    Abort(String),
    /// Still alive (sent every [`super::group::heartbeat_interval`]).
    Heartbeat,
    /// The sender dropped its group on purpose (not a crash).
    Leave,
}

impl Message {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Encoder(Vec::new());
        match self {
            Message::Hello { member, fd_socket } => {
                out.tag(0);
                out.bytes(MAGIC);
                out.member(member);
                out.str(fd_socket);
            }
            Message::Welcome {
                members,
                fd_sockets,
            } => {
                out.tag(1);
                out.u64(members.len() as u64);
                for (member, socket) in members.iter().zip(fd_sockets) {
                    out.member(member);
                    out.str(socket);
                }
            }
            Message::Contribute { seq, op, bytes } => {
                out.tag(2);
                out.u64(*seq);
                let (code, root) = match op {
                    Op::AllGather => (0, 0),
                    Op::Broadcast { root } => (1, *root),
                    Op::Barrier => (2, 0),
                };
                out.u64(code);
                out.u64(root as u64);
                out.bytes(bytes);
            }
            Message::Gathered { seq, parts } => {
                out.tag(3);
                out.u64(*seq);
                out.u64(parts.len() as u64);
                for part in parts {
                    out.bytes(part);
                }
            }
            Message::Abort(sentence) => {
                out.tag(4);
                out.str(sentence);
            }
            Message::Heartbeat => out.tag(5),
            Message::Leave => out.tag(6),
        }
        out.0
    }

    /// The message in `bytes`, or what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Message, String> {
        let mut input = Decoder(bytes);
        let message = match input.u8()? {
            0 => {
                if input.bytes()? != MAGIC {
                    return Err("not a peerlink rendezvous message".into());
                }
                Message::Hello {
                    member: input.member()?,
                    fd_socket: input.str()?,
                }
            }
            1 => {
                let count = input.len()?;
                let (mut members, mut fd_sockets) = (Vec::new(), Vec::new());
                for _ in 0..count {
                    members.push(input.member()?);
                    fd_sockets.push(input.str()?);
                }
                Message::Welcome {
                    members,
                    fd_sockets,
                }
            }
            2 => {
                let seq = input.u64()?;
                let op = match (input.u64()?, input.len()?) {
                    (0, _) => Op::AllGather,
                    (1, root) => Op::Broadcast { root },
                    (2, _) => Op::Barrier,
                    (code, _) => return Err(format!("unknown collective {code}")),
                };
                Message::Contribute {
                    seq,
                    op,
                    bytes: input.bytes()?.to_vec(),
                }
            }
            3 => {
                let seq = input.u64()?;
                let count = input.len()?;
                let parts = (0..count)
                    .map(|_| input.bytes().map(<[u8]>::to_vec))
                    .collect::<Result<_, _>>()?;
                Message::Gathered { seq, parts }
            }
            4 => Message::Abort(input.str()?),
            5 => Message::Heartbeat,
            6 => Message::Leave,
            tag => return Err(format!("unknown message {tag}")),
        };
        match input.0.len() {
            0 => Ok(message),
            extra => Err(format!("{extra} bytes after the message")),
        }
    }
}

/// Writes one message.
pub fn send(mut to: impl Write, message: &Message) -> io::Result<()> {
    let body = message.encode();
    if body.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a {} byte message is too long for the rendezvous (at most {MAX_MESSAGE}): it \
                 carries control messages, not data",
                body.len()
            ),
        ));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    to.write_all(&frame)?;
    to.flush()
}

/// Reads one message: `Ok(None)` where the connection closed cleanly before one began.
pub fn receive(mut from: impl Read) -> io::Result<Option<Message>> {
    let mut len = [0u8; 4];
    match from.read_exact(&mut len) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {len} bytes announced, more than a rendezvous message can be"),
        ));
    }
    let mut body = vec![0; len];
    from.read_exact(&mut body)?;
    Message::decode(&body)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

struct Encoder(Vec<u8>);

impl Encoder {
    fn tag(&mut self, tag: u8) {
        self.0.push(tag);
    }
    fn u64(&mut self, value: u64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }
    fn bytes(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }
    fn str(&mut self, text: &str) {
        self.bytes(text.as_bytes());
    }
    fn member(&mut self, member: &Member) {
        let Identity {
            rank,
            world,
            local_rank,
            local_world,
        } = member.identity;
        for value in [rank, world, local_rank, local_world] {
            self.u64(value as u64);
        }
        self.u64(u64::from(member.pid));
        self.str(&member.host);
        self.str(&member.host_id);
    }
}

struct Decoder<'a>(&'a [u8]);

impl<'a> Decoder<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("the message ends early".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, String> {
        let bytes = self.take(8)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }
    /// A count or an index, which must fit in what is left of the message to be believed.
    fn len(&mut self) -> Result<usize, String> {
        let value = self.u64()?;
        usize::try_from(value)
            .ok()
            .filter(|&n| n <= MAX_MESSAGE)
            .ok_or_else(|| format!("a count of {value} in a rendezvous message"))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.len()?;
        self.take(len)
    }
    fn str(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "text that is not UTF-8".into())
    }
    fn member(&mut self) -> Result<Member, String> {
        let mut numbers = [0usize; 4];
        for number in &mut numbers {
            *number = self.len()?;
        }
        let [rank, world, local_rank, local_world] = numbers;
        let pid = u32::try_from(self.u64()?).map_err(|_| "a process id beyond u32")?;
        Ok(Member {
            identity: Identity {
                rank,
                world,
                local_rank,
                local_world,
            },
            pid,
            host: self.str()?,
            host_id: self.str()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(rank: usize) -> Member {
        Member {
            identity: Identity {
                rank,
                world: 3,
                local_rank: rank,
                local_world: 3,
            },
            pid: 4242 + rank as u32,
            host: "node1".into(),
            host_id: "boot-id".into(),
        }
    }

    #[test]
    fn every_message_round_trips() {
        let messages = [
            Message::Hello {
                member: member(2),
                fd_socket: "peerlink-fds-1".into(),
            },
            Message::Welcome {
                members: (0..3).map(member).collect(),
                fd_sockets: vec!["a".into(), "b".into(), "c".into()],
            },
            Message::Contribute {
                seq: 7,
                op: Op::Broadcast { root: 2 },
                bytes: vec![1, 2, 3],
            },
            Message::Contribute {
                seq: 8,
                op: Op::Barrier,
                bytes: vec![],
            },
            Message::Gathered {
                seq: 7,
                parts: vec![vec![], vec![9; 64], vec![0]],
            },
            Message::Abort("rank 1 left".into()),
            Message::Heartbeat,
            Message::Leave,
        ];
        for message in messages {
            let mut wire = Vec::new();
            send(&mut wire, &message).unwrap();
            let back = receive(wire.as_slice()).unwrap();
            assert_eq!(back, Some(message));
        }
    }

    #[test]
    fn garbage_and_oversized_messages_are_refused() {
        assert_eq!(receive([].as_slice()).unwrap(), None);
        let huge = ((MAX_MESSAGE + 1) as u32).to_le_bytes();
        assert!(receive(huge.as_slice()).is_err());
        let mut wire = Vec::new();
        wire.extend_from_slice(&3u32.to_le_bytes());
        wire.extend_from_slice(&[0, 1, 2]);
        assert!(receive(wire.as_slice()).is_err());
        // An HTTP request to the port is not a hello.
        assert!(Message::decode(b"GET / HTTP/1.1\r\n").is_err());
        let too_long = Message::Contribute {
            seq: 0,
            op: Op::AllGather,
            bytes: vec![0; MAX_MESSAGE],
        };
        let err = send(Vec::new(), &too_long).unwrap_err();
        assert!(err.to_string().contains("not data"), "{err}");
    }
}
