//! File descriptors between ranks of one host: a Unix socket per rank (in the abstract namespace,
//! so nothing is left on disk), connected on first use, descriptors passed with `SCM_RIGHTS`.
//!
//! Each connection opens with the sender's rank (8 bytes); each passing is an 8-byte count with
//! the descriptors attached to it.

use crate::{Error, Result};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::collections::hash_map::{Entry, HashMap};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The most descriptors one message can carry (Linux's `SCM_MAX_FD`).
pub const MAX_FDS: usize = 253;

pub struct FdLinks {
    listener: UnixListener,
    name: String,
    /// Every rank's socket name, by rank.
    peers: Vec<String>,
    to: Mutex<HashMap<usize, UnixStream>>,
    from: Mutex<HashMap<usize, UnixStream>>,
}

impl FdLinks {
    /// Opens this rank's socket, under a name no other process has.
    pub fn bind(rank: usize) -> Result<FdLinks> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos());
        let name = format!("peerlink-fds-{}-{rank}-{nanos}", std::process::id());
        let failed = |e: std::io::Error| {
            Error::Group(format!(
                "rank {rank} cannot open its Unix socket for file descriptors: {e}"
            ))
        };
        let listener = SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|addr| UnixListener::bind_addr(&addr))
            .map_err(failed)?;
        listener.set_nonblocking(true).map_err(failed)?;
        Ok(FdLinks {
            listener,
            name,
            peers: Vec::new(),
            to: Mutex::default(),
            from: Mutex::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same, knowing every rank's socket.
    pub fn with_peers(self, peers: Vec<String>) -> FdLinks {
        FdLinks { peers, ..self }
    }

    pub fn send(&self, me: usize, to: usize, fds: &[BorrowedFd], timeout: Duration) -> Result<()> {
        check_count(fds.len())?;
        let failed = |e: std::io::Error| {
            Error::Group(format!(
                "passing file descriptors to rank {to} failed ({e}): if rank {to} stopped, its \
                 own error says why"
            ))
        };
        let mut links = super::lock(&self.to);
        let stream = match links.entry(to) {
            Entry::Occupied(link) => link.into_mut(),
            Entry::Vacant(link) => {
                let mut stream = SocketAddr::from_abstract_name(self.peers[to].as_bytes())
                    .and_then(|addr| UnixStream::connect_addr(&addr))
                    .map_err(failed)?;
                stream
                    .set_write_timeout(Some(timeout))
                    .and_then(|()| stream.write_all(&(me as u64).to_le_bytes()))
                    .map_err(failed)?;
                link.insert(stream)
            }
        };
        let count = (fds.len() as u64).to_le_bytes();
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(
            control.push(SendAncillaryMessage::ScmRights(fds)),
            "room was made for them"
        );
        let sent = rustix::net::sendmsg(
            &*stream,
            &[IoSlice::new(&count)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .map_err(|e| failed(e.into()))?;
        // The descriptors went with the first byte; the rest of the count follows plainly.
        stream.write_all(&count[sent..]).map_err(failed)
    }

    pub fn recv(
        &self,
        me: usize,
        from: usize,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<OwnedFd>> {
        check_count(count)?;
        let deadline = Instant::now() + timeout;
        let late = || {
            Error::Group(format!(
                "rank {from} passed rank {me} no file descriptors within {} s: rank {from} must \
                 call send_fds to rank {me} (if it stopped, its own error says why)",
                timeout.as_secs_f64()
            ))
        };
        let failed = |e: std::io::Error| {
            Error::Group(format!(
                "taking file descriptors from rank {from} failed ({e}): if rank {from} stopped, \
                 its own error says why"
            ))
        };
        let mut links = super::lock(&self.from);
        while !links.contains_key(&from) {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let mut rank = [0u8; 8];
                    stream
                        .set_nonblocking(false)
                        .and_then(|()| stream.set_read_timeout(Some(timeout)))
                        .and_then(|()| stream.read_exact(&mut rank))
                        .map_err(failed)?;
                    links.insert(u64::from_le_bytes(rank) as usize, stream);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(late());
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(failed(e)),
            }
        }
        let mut stream = &links[&from];
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).map_err(failed)?;
        let mut announced = [0u8; 8];
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(count))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = rustix::net::recvmsg(
            stream,
            &mut [IoSliceMut::new(&mut announced)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .map_err(|e| match std::io::Error::from(e) {
            e if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
            {
                late()
            }
            e => failed(e),
        })?;
        let fds: Vec<OwnedFd> = control
            .drain()
            .flat_map(|message| match message {
                RecvAncillaryMessage::ScmRights(fds) => fds.collect(),
                _ => Vec::new(),
            })
            .collect();
        if received.bytes == 0 {
            return Err(failed(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "its socket closed",
            )));
        }
        stream
            .read_exact(&mut announced[received.bytes..])
            .map_err(failed)?;
        let announced = u64::from_le_bytes(announced) as usize;
        if announced != count || fds.len() != count || received.flags.contains(ReturnFlags::CTRUNC)
        {
            return Err(Error::Group(format!(
                "rank {from} passed {announced} file descriptors where rank {me} takes {count}: \
                 the two sides must agree on how many"
            )));
        }
        Ok(fds)
    }
}

fn check_count(count: usize) -> Result<()> {
    if (1..=MAX_FDS).contains(&count) {
        return Ok(());
    }
    Err(Error::usage(format!(
        "{count} file descriptors in one passing: pass 1 to {MAX_FDS} at a time"
    )))
}
