//! The group: the rendezvous, the collectives over it, heartbeats and the verdict on failures.
//!
//! Rank 0 is the hub: a thread of its own reads every rank's messages (one reader thread per
//! connection feeds it), gathers each collective's parts, answers when all are in, sends heartbeats
//! and judges failures — a connection closed without a goodbye, a rank silent for the timeout, a
//! collective some ranks did not reach in time — and sends the verdict to every rank. The hub runs
//! beside rank 0's own work, so a verdict never waits for rank 0's next call. The other ranks are
//! spokes: a reader thread takes rank 0's answers and a heartbeat thread keeps rank 0 informed and
//! watches that rank 0 still speaks.

mod hub;
mod judge;
mod spoke;

use super::fds::FdLinks;
use super::wire::{Message, Op, MAX_MESSAGE};
use super::{lock, Identity, Member, Rendezvous};
use crate::topology::sysfs::Sysfs;
use crate::{Error, Result};
use hub::Hub;
use spoke::Spoke;
use std::net::TcpListener;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
        Group::join_with(identity, rendezvous, None)
    }

    /// Rank 0's [`Group::join`] at a listener it bound itself, where the others learn its port
    /// another way (an NCCL-API library tells them through the job's own communicator).
    pub fn join_listening(
        identity: Identity,
        listener: TcpListener,
        timeout: Duration,
    ) -> Result<Group> {
        if identity.rank != 0 {
            return Err(Error::Group(format!(
                "rank {} offered a listener for the rendezvous, which rank 0 holds",
                identity.rank
            )));
        }
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Group(format!("rank 0's rendezvous socket: {e}")))?;
        Group::join_with(identity, &Rendezvous { addr, timeout }, Some(listener))
    }

    fn join_with(
        identity: Identity,
        rendezvous: &Rendezvous,
        listener: Option<TcpListener>,
    ) -> Result<Group> {
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
            let (hub, members, sockets) = Hub::open(me.clone(), fd_socket, rendezvous, listener)?;
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
        let call = Call {
            seq,
            op,
            mine,
            timeout: self.timeout,
        };
        match &self.link {
            Link::Alone => Ok(vec![mine.to_vec()]),
            Link::Hub(hub) => hub.collective(call),
            Link::Spoke(spoke) => spoke.collective(call),
        }
        .map_err(Error::Group)
    }
}

/// One collective as this rank makes it: its number, what it is, this rank's part, and the group's
/// timeout.
#[derive(Clone, Copy)]
struct Call<'a> {
    seq: u64,
    op: Op,
    mine: &'a [u8],
    timeout: Duration,
}

impl Call<'_> {
    /// How long a rank waits for rank 0's answer: rank 0 judges within the timeout of the first
    /// arrival, and says so; waiting twice as long is a backstop that does not come into play
    /// while rank 0 speaks (the margin is for the hub's own tick).
    fn backstop(&self) -> Duration {
        self.timeout * 2 + Duration::from_secs(1)
    }
}

/// Every rank's part of a collective, or the sentence saying why it failed.
type Parts = std::result::Result<Vec<Vec<u8>>, String>;

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
